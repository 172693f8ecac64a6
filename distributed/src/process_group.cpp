// ProcessGroup (process_group.h): the join over c10d's TCPStore, the device collectives, host
// reductions, the heartbeat watchdog and a clean leave.
#include "tandem/distributed/process_group.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "collectives.h"

namespace tandem::distributed {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

/// A token no other process will pick: the join tells two processes of one rank apart.
std::string process_token() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::random_device rd;
  return detail::concat(host, ":", getpid(), ":", rd());
}

/// Ends the process at once with one line: a peer is gone and this rank cannot go on without
/// it (a collective would wait forever). _Exit: no destructor may block on the dead peer.
[[noreturn]] void die(int rank, int world_size, const std::string& why) {
  std::fprintf(stderr, "%standem: error: %s; stopping this rank\n",
               rank_prefix(rank, world_size).c_str(), why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace

struct ProcessGroup::Impl {
  LaunchEnv env;
  c10::Device device = c10::Device(c10::kCPU);
  ProcessGroupOptions options;
  std::string prefix;  // "tandem/<attempt>/": keys of this attempt (see connect)
  int attempt = 1;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<StoreExchange> exchange;
  std::unique_ptr<DeviceCollectives> collectives;
  std::thread watchdog;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> stop{false};
  bool finished = false;

  std::string key(const std::string& k) const { return prefix + k; }
  std::string store_name() const {
    return detail::concat(env.master_addr, ":", env.master_port,
                          env.agent_store ? " (torchrun's agent)" : " (rank 0)");
  }

  void start_watchdog() {
    watchdog = std::thread([this] { watch(); });
  }
  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }

  // Beats every second and reads the others' beats; see the header for what it ends on.
  void watch() {
    const int W = env.world_size, r = env.rank;
    c10::intrusive_ptr<c10d::Store> s;
    try {
      s = store->clone();  // a connection of its own: the main thread may block in a read
      s->setTimeout(std::chrono::seconds(5));
    } catch (const std::exception& e) {
      die(r, W,
          "the watchdog could not connect to the store at " + store_name() + ": " +
              first_line(e.what()));
    }
    std::vector<int64_t> last(W, -1);
    std::vector<Clock::time_point> seen(W, Clock::now());
    std::vector<bool> done(W, false);
    while (!stop.load()) {
      try {
        s->add(key("hb/" + std::to_string(r)), 1);
        const auto now = Clock::now();
        for (int p = 0; p < W; ++p) {
          if (p == r || done[p]) continue;
          if (s->check({key("done/" + std::to_string(p))})) {
            done[p] = true;
            continue;
          }
          const int64_t beat = s->add(key("hb/" + std::to_string(p)), 0);
          if (beat != last[p]) {
            last[p] = beat;
            seen[p] = now;
          } else if (std::chrono::duration<double>(now - seen[p]).count() > options.dead_after_s &&
                     !stop.load()) {
            die(r, W,
                detail::concat("rank ", p, " of ", W, " stopped responding (no heartbeat for ",
                               options.dead_after_s, " s): it has died or hung"));
          }
        }
      } catch (const std::exception& e) {
        if (stop.load()) break;
        die(r, W,
            "lost the rendezvous store at " + store_name() +
                ": the rank or launcher hosting it has exited (" + first_line(e.what()) + ")");
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(1), [this] { return stop.load(); });
    }
  }

  /// Polls `counter` until it reaches `target` or `timeout` passes; false on timeout.
  bool wait_count(const std::string& counter, int64_t target, std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (store->add(key(counter), 0) < target) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  void join() {
    const int W = env.world_size, r = env.rank;
    const std::string mine = detail::concat(W, " ", process_token());
    const std::string got =
        string_of(store->compareSet(key("join/" + std::to_string(r)), {}, bytes_of(mine)));
    if (got != mine)
      throw EnvironmentError(detail::concat("rank ", r, " has joined the store at ", store_name(),
                                            " twice: two processes were started with RANK=", r,
                                            " (expected one process per rank)"));
    // Wait for every rank, checking each one's world size as it arrives (a mismatch fails
    // every rank at once, not after the timeout) and naming the missing ones on timeout.
    const auto deadline = Clock::now() + options.join_timeout;
    std::vector<bool> seen(W, false);
    seen[r] = true;
    int missing = W - 1;
    while (missing > 0) {
      for (int p = 0; p < W; ++p) {
        const std::string k = key("join/" + std::to_string(p));
        if (seen[p] || !store->check({k})) continue;
        seen[p] = true;
        --missing;
        const int their_world = std::atoi(string_of(store->get(k)).c_str());
        if (their_world != W)
          throw EnvironmentError(detail::concat(
              "rank ", p, " was started with WORLD_SIZE=", their_world, " and rank ", r,
              " with WORLD_SIZE=", W, ": expected the same world size on every rank"));
      }
      if (missing == 0) break;
      if (Clock::now() > deadline) {
        std::string who;
        for (int p = 0; p < W; ++p)
          if (!seen[p]) who += (who.empty() ? "" : ", ") + std::to_string(p);
        throw Error(detail::concat("rank ", r, " waited ", options.join_timeout.count(),
                                   " s at the store ", store_name(), " for rank(s) ", who,
                                   " of WORLD_SIZE=", W, " to join: are they started?"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
};

namespace {
/// `name`'s value in seconds, or nullopt when unset; EnvironmentError unless a number > 0.
std::optional<double> seconds_from_environment(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (errno || end == v || *end != '\0' || !(x > 0) || x > 1e7)
    throw EnvironmentError(
        detail::concat(name, "='", v, "' is not valid: expected a number of seconds > 0"));
  return x;
}

std::chrono::seconds whole_seconds(double s) {
  return std::chrono::seconds(static_cast<int64_t>(std::ceil(s)));
}
}  // namespace

ProcessGroupOptions options_from_environment(ProcessGroupOptions o) {
  if (auto s = seconds_from_environment("TANDEM_JOIN_TIMEOUT")) o.join_timeout = whole_seconds(*s);
  if (auto s = seconds_from_environment("TANDEM_HEARTBEAT_TIMEOUT")) o.dead_after_s = *s;
  if (auto s = seconds_from_environment("TANDEM_COLLECTIVE_TIMEOUT"))
    o.collective_timeout = whole_seconds(*s);
  return o;
}

ProcessGroupOptions options_with_timeouts(double join_s, double heartbeat_s) {
  ProcessGroupOptions o = options_from_environment();
  if (join_s > 0) o.join_timeout = whole_seconds(join_s);
  if (heartbeat_s > 0) o.dead_after_s = heartbeat_s;
  return o;
}

std::shared_ptr<ProcessGroup> ProcessGroup::connect(const LaunchEnv& env, c10::Device device,
                                                    ProcessGroupOptions options) {
  auto im = std::make_unique<Impl>();
  im->env = env;
  im->device = device;
  im->options = options;
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.isServer = env.rank == 0 && !env.agent_store;
  so.waitWorkers = false;  // the join below waits, and names who is missing
  so.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options.join_timeout);
  try {
    im->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    const std::string what = first_line(e.what());
    if (so.isServer)
      throw EnvironmentError(detail::concat(
          "rank 0 cannot host the store on ", env.master_addr, ":", env.master_port, " (", what,
          "): is MASTER_PORT in use? expected a free port (tandem --nproc picks one)"));
    throw EnvironmentError(
        detail::concat("rank ", env.rank, " cannot reach the store at ", im->store_name(), " (",
                       what, "): expected MASTER_ADDR:MASTER_PORT of a running rank 0"));
  }
  // The keys of this attempt of the job. Under torchrun the agent's store outlives a restart of
  // the workers, and TORCHELASTIC_RESTART_COUNT is each node's own (a node whose worker failed
  // counts the restart; the others, restarted because it rejoined, do not): each rank counts its
  // own joins in the store instead, and every rank of a restarted group is at the same count. A
  // store of tandem's own (rank 0's) lives as long as one attempt.
  if (env.agent_store)
    im->attempt = static_cast<int>(im->store->add(detail::concat("tandem/joins/", env.rank), 1));
  im->prefix = env.agent_store ? detail::concat("tandem/a", im->attempt, "/")
                               : detail::concat("tandem/", env.restart, "/");
  im->join();
  im->store->setTimeout(options.collective_timeout);  // the join's deadline was its own
  im->exchange = std::make_shared<StoreExchange>(im->store, im->prefix + "x/", env.rank,
                                                 env.world_size, im->store_name());
  if (device.is_cuda() && !options.force_store_collectives)
    im->collectives =
        make_nccl_collectives(*im->store, im->key("nccl_id"), env.rank, env.world_size, device);
  else
    im->collectives = make_store_collectives(im->exchange);
  im->start_watchdog();
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(im)));
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() {
  // Not finished: a failed run. Leave without waiting for anyone (the others see this rank's
  // heartbeat stop, or its store go, and stop too).
  if (!impl_->finished) {
    impl_->stop_watchdog();
    try {
      if (impl_->collectives) impl_->collectives->shutdown(/*abort=*/true);
    } catch (...) {
    }
  }
}

int ProcessGroup::rank() const { return impl_->env.rank; }
int ProcessGroup::world_size() const { return impl_->env.world_size; }
c10::Device ProcessGroup::device() const { return impl_->device; }
const LaunchEnv& ProcessGroup::env() const { return impl_->env; }
int ProcessGroup::attempt() const { return impl_->attempt; }
std::string ProcessGroup::backend() const { return impl_->collectives->name(); }

void ProcessGroup::all_reduce_mean_(const std::vector<at::Tensor>& tensors) {
  if (impl_->env.world_size == 1 || tensors.empty()) return;
  for (const auto& t : tensors)  // a mean of integers: neither backend has one
    TANDEM_CHECK_ARG(at::isFloatingType(t.scalar_type()), "all_reduce_mean_: a ", t.scalar_type(),
                     " tensor: expected floating point");
  impl_->collectives->all_reduce_mean_(tensors);
}

void ProcessGroup::broadcast_(const std::vector<at::Tensor>& tensors, int root) {
  TANDEM_CHECK_ARG(root >= 0 && root < impl_->env.world_size, "broadcast root ", root,
                   " is not valid: expected 0 .. ", impl_->env.world_size - 1);
  if (impl_->env.world_size == 1 || tensors.empty()) return;
  impl_->collectives->broadcast_(tensors, root);
}

void ProcessGroup::all_gather_(const std::vector<at::Tensor>& inputs,
                               const std::vector<at::Tensor>& outputs) {
  TANDEM_CHECK_ARG(inputs.size() == outputs.size(), "all_gather_: ", inputs.size(), " inputs and ",
                   outputs.size(), " outputs: expected one output per input");
  const int world = impl_->env.world_size;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor &in = inputs[i], &out = outputs[i];
    TANDEM_CHECK_ARG(in.dim() >= 1 && in.is_contiguous() && out.is_contiguous(),
                     "all_gather_: tensor ", i, " of shape ", in.sizes(),
                     ": expected contiguous tensors of at least one dimension");
    std::vector<int64_t> expected = in.sizes().vec();
    expected[0] *= world;
    TANDEM_CHECK_ARG(out.sizes() == at::IntArrayRef(expected) &&
                         out.scalar_type() == in.scalar_type() && out.device() == in.device(),
                     "all_gather_: output ", i, " is ", out.scalar_type(), out.sizes(), " on ",
                     out.device(), ": expected ", in.scalar_type(), at::IntArrayRef(expected),
                     " on ", in.device());
  }
  if (inputs.empty()) return;
  if (world == 1) {
    for (size_t i = 0; i < inputs.size(); ++i) outputs[i].copy_(inputs[i]);
    return;
  }
  impl_->collectives->all_gather_(inputs, outputs);
}

std::vector<double> ProcessGroup::all_reduce_host(const std::vector<double>& values, HostOp op) {
  std::vector<uint8_t> mine(values.size() * sizeof(double));
  if (!values.empty()) std::memcpy(mine.data(), values.data(), mine.size());
  const auto all = impl_->exchange->exchange(mine);
  std::vector<double> out(values.size(), op == HostOp::kMax ? -HUGE_VAL : 0.0);
  for (const auto& b : all) {  // in rank order: the same sum on every rank
    TORCH_CHECK(b.size() == mine.size(), "all_reduce_host: rank sent ", b.size() / sizeof(double),
                " values, this rank ", values.size(), ": expected the same count on every rank");
    const double* v = reinterpret_cast<const double*>(b.data());
    for (size_t i = 0; i < values.size(); ++i)
      out[i] = op == HostOp::kMax ? std::max(out[i], v[i]) : out[i] + v[i];
  }
  if (op == HostOp::kMean)
    for (double& x : out) x /= impl_->env.world_size;
  return out;
}

std::vector<std::vector<uint8_t>> ProcessGroup::all_gather_host(const std::vector<uint8_t>& bytes) {
  return impl_->exchange->exchange(bytes);
}

void ProcessGroup::barrier() { impl_->exchange->exchange({}); }

void ProcessGroup::finish() {
  Impl& im = *impl_;
  if (im.finished) return;
  im.finished = true;
  const int W = im.env.world_size;
  // Phase 1: done, then wait for every rank (the watchdog still runs: a rank that dies now is
  // still reported).
  im.store->set(im.key("done/" + std::to_string(im.env.rank)), bytes_of("1"));
  im.store->add(im.key("exit"), 1);
  if (!im.wait_count("exit", W, im.options.join_timeout))
    throw Error(detail::concat("rank ", im.env.rank, " waited ", im.options.join_timeout.count(),
                               " s for the other ranks to finish"));
  im.stop_watchdog();
  if (im.collectives) im.collectives->shutdown(/*abort=*/false);
  // Phase 2: rank 0, when it hosts the store, keeps it up until every rank is done with it.
  im.store->add(im.key("exit2"), 1);
  if (im.env.rank == 0 && !im.env.agent_store) im.wait_count("exit2", W, std::chrono::seconds(30));
}

// ---- StoreExchange

StoreExchange::StoreExchange(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank,
                             int world, std::string where)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      world_(world),
      where_(std::move(where)) {}

std::vector<std::vector<uint8_t>> StoreExchange::exchange(const std::vector<uint8_t>& mine) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = round_++;
  const std::string round = prefix_ + std::to_string(n) + "/";
  // A value travels in chunks: the store refuses messages over 8 MiB. Key r holds the chunk
  // count, r/i chunk i.
  const size_t chunks = (mine.size() + kChunkBytes - 1) / kChunkBytes;
  std::vector<std::vector<uint8_t>> all(world_);
  int waiting_for = -1;
  try {
    const std::string me = round + std::to_string(rank_);
    for (size_t i = 0; i < chunks; ++i) {
      const size_t from = i * kChunkBytes, to = std::min(mine.size(), from + kChunkBytes);
      store_->set(me + "/" + std::to_string(i),
                  std::vector<uint8_t>(mine.begin() + from, mine.begin() + to));
    }
    const std::string count = std::to_string(chunks);
    store_->set(me, std::vector<uint8_t>(count.begin(), count.end()));  // last: it says "ready"
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) {
        all[p] = mine;
        continue;
      }
      waiting_for = p;
      const std::string theirs = round + std::to_string(p);
      const std::vector<uint8_t> c = store_->get(theirs);
      const size_t their_chunks = std::stoul(std::string(c.begin(), c.end()));
      for (size_t i = 0; i < their_chunks; ++i) {
        const std::vector<uint8_t> part = store_->get(theirs + "/" + std::to_string(i));
        all[p].insert(all[p].end(), part.begin(), part.end());
      }
    }
    if (n >= 2) {  // round n-2's keys of this rank: every rank has read them (see the header)
      const std::string old = prefix_ + std::to_string(n - 2) + "/" + std::to_string(rank_);
      for (size_t i = 0; i < chunks_sent_[(n - 2) % 2]; ++i)
        store_->deleteKey(old + "/" + std::to_string(i));
      store_->deleteKey(old);
    }
    chunks_sent_[n % 2] = chunks;
  } catch (const c10::Error& e) {
    // The store's own message ("Connection reset by peer", a timeout) says nothing of who.
    throw Error(detail::concat(
        "data parallel: lost the rendezvous store at ", where_, " in a collective",
        waiting_for >= 0 ? detail::concat(" (waiting for rank ", waiting_for, ")") : std::string(),
        ": the process hosting it has exited, or a rank stopped (", first_line(e.what()), ")"));
  }
  return all;
}

std::vector<uint8_t> StoreExchange::broadcast(const std::vector<uint8_t>& mine, int root) {
  // An exchange where only root's bytes travel: the others send nothing.
  auto all = exchange(rank_ == root ? mine : std::vector<uint8_t>{});
  return std::move(all[root]);
}

}  // namespace tandem::distributed
