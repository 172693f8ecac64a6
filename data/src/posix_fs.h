// The few file-system queries the folder datasets need, on POSIX calls. Not std::filesystem:
// the PyPI libtorch.so exports its own copies of std::filesystem's free functions (status,
// canonical, remove_all, ...), built against another libstdc++, and the dynamic linker binds
// ours to them — remove_all crashes through a null pointer. Plain POSIX has no such clash.
#pragma once

#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "tandem/error.h"

namespace tandem::data::detail {

inline std::string errno_text(int code) {
  return std::error_code(code, std::generic_category()).message();
}

/// What stat() (following symlinks) says about a path.
struct PathStatus {
  bool exists = false;
  bool is_directory = false;
  int error = 0;  ///< errno when !exists
};

inline PathStatus path_status(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {false, false, errno};
  return {true, S_ISDIR(st.st_mode), 0};
}

/// os.path.join(a, b) for a relative b.
inline std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

/// The name without its last extension, as Python's Path.stem: "a.b.png" -> "a.b",
/// ".hidden" -> ".hidden".
inline std::string stem_of(const std::string& name) {
  const size_t dot = name.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? name : name.substr(0, dot);
}

/// realpath(3); throws tandem::Error naming `path` on failure.
inline std::string real_path(const std::string& path, const char* who) {
  std::unique_ptr<char, void (*)(void*)> resolved(::realpath(path.c_str(), nullptr), std::free);
  if (!resolved)
    throw Error(std::string(who) + ": cannot resolve '" + path + "': " + errno_text(errno));
  return resolved.get();
}

struct DirEntry {
  std::string name;
  bool is_directory = false;  ///< following symlinks; a broken symlink is not a directory
};

/// The entries of `dir` except . and .., unsorted. Throws tandem::Error naming `dir` when it
/// cannot be listed.
inline std::vector<DirEntry> list_dir(const std::string& dir, const char* who) {
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), ::closedir);
  if (!handle)
    throw Error(std::string(who) + ": cannot list folder '" + dir + "': " + errno_text(errno));
  std::vector<DirEntry> entries;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(handle.get());
    if (entry == nullptr) {
      if (errno != 0)
        throw Error(std::string(who) + ": cannot list folder '" + dir + "': " + errno_text(errno));
      break;
    }
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    entries.push_back({name, path_status(join_path(dir, name)).is_directory});
  }
  return entries;
}

}  // namespace tandem::data::detail
