// tandem._C's side of data parallel from Python (tandem/distributed.py): read the launch
// environment torchrun sets, join the job once per process (rank 0's weights, NCCL on CUDA or
// the store on the CPU: the CLI's own join, run/data_parallel.h), and leave the job when the
// interpreter exits. tandem.Trainer's runs then go as this rank (trainer_bindings.cpp:
// apply_data_parallel, resolve_mode_as_rank, reduce_over_ranks).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mutex>
#include <string>

#include "job.h"
#include "tandem/distributed/launch_env.h"
#include "tandem/run/data_parallel.h"

namespace py = pybind11;

namespace tandem::python {
namespace {

std::mutex job_mutex;
std::shared_ptr<distributed::ProcessGroup> job;  // guarded by job_mutex
bool job_abandoned = false;                      // guarded by job_mutex

py::dict describe(const distributed::LaunchEnv& env) {
  py::dict d;
  d["rank"] = env.rank;
  d["world_size"] = env.world_size;
  d["local_rank"] = env.local_rank;
  d["local_world_size"] = env.local_world_size;
  d["restart"] = env.restart;
  return d;
}

py::dict describe(const distributed::ProcessGroup& g) {
  py::dict d = describe(g.env());
  d["attempt"] = g.attempt();
  d["restarted"] = g.restarted();
  d["device"] = g.device().str();
  d["backend"] = g.backend();
  return d;
}

}  // namespace

std::shared_ptr<distributed::ProcessGroup> current_job() {
  std::lock_guard<std::mutex> lock(job_mutex);
  return job;
}

void abandon_job() {
  std::shared_ptr<distributed::ProcessGroup> g;
  {
    std::lock_guard<std::mutex> lock(job_mutex);
    g.swap(job);
    job_abandoned = job_abandoned || g != nullptr;
  }
  g.reset();  // ~ProcessGroup when g was the last: stops the watchdog, leaves the others
}

}  // namespace tandem::python

void bind_job(py::module_& m) {
  using namespace tandem;
  using tandem::python::job;
  using tandem::python::job_abandoned;
  using tandem::python::job_mutex;
  m.def(
      "launch_env",
      []() -> py::object {
        const std::optional<distributed::LaunchEnv> env =
            distributed::launch_env_from_environment();
        if (!env) return py::none();
        return tandem::python::describe(*env);
      },
      "The launch this process is one rank of (RANK, WORLD_SIZE, LOCAL_RANK, "
      "LOCAL_WORLD_SIZE), or None; ValueError naming a bad variable");
  m.def(
      "join_job",
      [](const std::string& device, double join_s, double heartbeat_s) -> py::object {
        std::shared_ptr<distributed::ProcessGroup> joined;
        {
          std::lock_guard<std::mutex> lock(job_mutex);
          if (job_abandoned)
            throw Error(
                "this rank left its data-parallel job after a failed run, and a job cannot be "
                "joined twice: start the job (torchrun) again");
          joined = job;
        }
        if (joined) {
          TANDEM_CHECK_ARG((device == "cpu") == joined->device().is_cpu(),
                           "this process joined its job on ", joined->device().str(),
                           ", and a run now asks for ", device,
                           ": expected every tandem.Trainer of a rank on the same device");
          return tandem::python::describe(*joined);
        }
        {
          py::gil_scoped_release no_gil;  // the other ranks may take a while to arrive
          joined = run::join_data_parallel(device,
                                           distributed::options_with_timeouts(join_s, heartbeat_s));
        }
        if (!joined) return py::none();
        std::lock_guard<std::mutex> lock(job_mutex);
        job = joined;
        return tandem::python::describe(*joined);
      },
      py::arg("device"), py::arg("join_timeout") = 0.0, py::arg("heartbeat_timeout") = 0.0,
      "Joins the job the environment describes (once per process; later calls return the same) "
      "on `device` ('cpu', or 'cuda': cuda:LOCAL_RANK), with these timeouts in seconds (0: the "
      "environment's, else the defaults); None when there is no job of more than one rank");
  m.def("abandon_job", &tandem::python::abandon_job, py::call_guard<py::gil_scoped_release>(),
        "Drops the job without finishing it (a failed run; an uncaught exception): the other "
        "ranks see this one stop");
  m.def(
      "leave_job",
      [] {
        std::shared_ptr<distributed::ProcessGroup> g;
        {
          std::lock_guard<std::mutex> lock(job_mutex);
          g.swap(job);
        }
        if (!g) return;
        py::gil_scoped_release no_gil;
        g->finish();
      },
      "Leaves the job (waits for the other ranks to leave too); at interpreter exit");
}
