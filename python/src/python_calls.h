// Calling Python from tandem's C++ threads: the loader's workers and the runner's lane threads
// run without the GIL, so every Python object they keep is held through PyRef (its last owner
// may drop it on any thread: the deleter takes the GIL), and every call into Python goes
// through PythonCalls::call, which takes the GIL, and turns a Python exception into a C++ one
// for the runner while keeping the original — traceback included — for the caller to re-raise.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "tandem/error.h"

namespace tandem::python {

namespace py = pybind11;

/// A Python object any thread may copy or drop: copying a shared_ptr touches no Python
/// reference count; the object itself is released under the GIL.
using PyRef = std::shared_ptr<const py::object>;
inline PyRef hold(py::object object) {
  return PyRef(new py::object(std::move(object)), [](const py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}
/// hold(), with None as no object (an empty PyRef), and back: an optional Python argument.
inline PyRef hold_unless_none(const py::object& o) { return o.is_none() ? PyRef() : hold(o); }
inline py::object held_or_none(const PyRef& r) { return r ? *r : py::none(); }

/// "<what> raised <Type>: <message>", the first line of `e`'s text: how the runner and the
/// loader name a Python exception in their one-line errors.
inline std::string raised(const std::string& what, const py::error_already_set& e) {
  const std::string message = e.what();
  return what + " raised " + message.substr(0, message.find('\n'));
}

/// The first Python exception raised by any call of a run, kept to be raised again, unchanged,
/// in the thread that started the run.
class __attribute__((visibility("hidden"))) PythonCalls {
 public:
  /// Runs `f` (which calls Python) under the GIL. A Python exception is kept, if it is the run's
  /// first, and re-thrown as tandem::Error("<what> raised <Type>: <message>") for the runner.
  template <typename F>
  auto call(const std::string& what, F&& f) -> decltype(f()) {
    py::gil_scoped_acquire gil;
    try {
      return f();
    } catch (py::error_already_set& e) {
      throw kept(what, std::move(e));
    } catch (py::builtin_exception& e) {  // raised by the C++ side of a call (a bad result)
      e.set_error();
      throw kept(what, py::error_already_set());
    }
  }
  /// Keeps `e` (if first) and returns the runner's error for it. Call with the GIL.
  Error kept(const std::string& what, py::error_already_set e) {
    Error error(raised(what, e));
    keep(std::move(e));
    return error;
  }
  /// Keeps `e` unless an exception is kept already. Call with the GIL.
  void keep(py::error_already_set e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!first_) first_ = std::move(e);
  }
  /// The kept exception, if any (and forgets it). Call with the GIL.
  std::optional<py::error_already_set> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::optional<py::error_already_set> out = std::move(first_);
    first_.reset();
    return out;
  }

 private:
  std::mutex mutex_;
  std::optional<py::error_already_set> first_;
};

}  // namespace tandem::python
