// run_local_ranks (launcher.h): fork + exec of this executable per rank, then supervision.
// Hand-written because torchrun is Python and a C++ user's program should not need it for one
// machine; its contract (the environment variables, stop-all-on-failure) is torchrun's.
#include "tandem/distributed/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "tandem/error.h"

namespace tandem::distributed {

namespace {

volatile std::sig_atomic_t g_signal = 0;
void remember_signal(int sig) { g_signal = sig; }

/// A TCP port free on the loopback now (bound to port 0, read back, released): rank 0 binds it
/// a moment later. The race with another program taking it is the one torchrun accepts too.
int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(std::string("socket(): ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    close(fd);
    throw Error(std::string("finding a free loopback port: ") + std::strerror(e));
  }
  close(fd);
  return ntohs(a.sin_port);
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return detail::concat("was killed by signal ", WTERMSIG(status), " (",
                          strsignal(WTERMSIG(status)), ")");
  return detail::concat("exited with code ", WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

}  // namespace

std::vector<std::string> without_flag(const std::vector<std::string>& argv,
                                      const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == flag) {
      ++i;  // and its value
      continue;
    }
    if (argv[i].rfind(flag + "=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

int run_local_ranks(int nproc, const std::vector<std::string>& argv) {
  TANDEM_CHECK_ARG(nproc >= 1 && nproc <= 1024, "--nproc ", nproc,
                   " is not valid: expected 1 .. 1024 local ranks");
  const int port = free_loopback_port();
  std::vector<char*> args;
  for (size_t i = 1; i < argv.size(); ++i) args.push_back(const_cast<char*>(argv[i].c_str()));
  std::string self = "tandem";
  args.insert(args.begin(), self.data());
  args.push_back(nullptr);

  struct sigaction sa {};
  sa.sa_handler = remember_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(nproc, -1);
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw Error(std::string("fork(): ") + std::strerror(errno));
    if (pid == 0) {
      // A process group of the ranks' own: a terminal's Ctrl-C reaches the launcher alone, which
      // passes it on once (twice would kill a rank whose first SIGINT starts a clean stop).
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // a launcher killed outright takes its ranks along
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      execv("/proc/self/exe", args.data());
      std::fprintf(stderr, "tandem: error: rank %d: exec /proc/self/exe failed: %s\n", r,
                   std::strerror(errno));
      std::_Exit(127);
    }
    pids[r] = pid;
  }

  int result = 0, alive = nproc;
  bool stopping = false;
  std::chrono::steady_clock::time_point kill_at{};
  int forwarded = 0;
  while (alive > 0) {
    if (g_signal && g_signal != forwarded) {  // Ctrl-C or a TERM to the launcher: to every rank
      forwarded = g_signal;
      for (pid_t p : pids)
        if (p > 0) kill(p, forwarded);
    }
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      int r = 0;
      while (r < nproc && pids[r] != done) ++r;
      if (r == nproc) continue;
      pids[r] = -1;
      --alive;
      const int code = exit_code_of(status);
      if (code != 0 && result == 0) {
        result = code;
        if (alive > 0 && !forwarded) {
          std::fprintf(stderr, "tandem: rank %d of %d %s; stopping the other ranks\n", r, nproc,
                       describe_status(status).c_str());
          std::fflush(stderr);
          for (pid_t p : pids)
            if (p > 0) kill(p, SIGTERM);
          stopping = true;
          kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        }
      }
      continue;
    }
    if (stopping && std::chrono::steady_clock::now() > kill_at) {
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      stopping = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace tandem::distributed
