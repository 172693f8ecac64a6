// The engines' share of a run's samples: see engine_share.h.
#include "tandem/data/engine_share.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "tandem/data/image_folder.h"
#include "tandem/error.h"

namespace tandem::data {

namespace {
// Whole 1/1024ths, as decodes_on_engines counts them.
double in_1024ths(double share) { return std::round(std::clamp(share, 0.0, 1.0) * 1024) / 1024; }

// An adaptive share keeps at least this much on the engines, so their rate is still measured
// and the share can come back when the CPU side slows.
constexpr double kLeastAdaptiveShare = 8.0 / 1024;

void add_usage(ThreadUsage& sum, const ThreadUsage& used) {
  sum.cpu_seconds += used.cpu_seconds;
  sum.preemptions += used.preemptions;
}
// `used` over `seconds` of wall time: the fraction on a core and the switches a second (0, 0
// where nothing was measured).
std::pair<double, double> per_second(const ThreadUsage& used, double seconds) {
  if (seconds <= 0 || (used.cpu_seconds <= 0 && used.preemptions == 0)) return {0, 0};
  return {used.cpu_seconds / seconds, static_cast<double>(used.preemptions) / seconds};
}

// "; on a core: the workers 0.93 of their time (12 switches/s), the engines' thread 0.41 of its
// decode time (310 switches/s)", the measured sides only; empty where neither was.
std::string threads_on_cores(const EngineShare::Rates& r) {
  const auto two_places = [](double v) { return std::round(v * 100) / 100; };
  std::string out;
  if (r.workers_on_core > 0)
    out += detail::concat("the workers ", two_places(r.workers_on_core), " of their time (",
                          static_cast<int64_t>(r.worker_preemptions_per_s), " switches/s)");
  if (r.engines_thread_on_core > 0)
    out += detail::concat(out.empty() ? "" : ", ", "the engines' thread ",
                          two_places(r.engines_thread_on_core), " of its decode time (",
                          static_cast<int64_t>(r.engines_thread_preemptions_per_s), " switches/s)");
  return out.empty() ? out : "; on a core: " + out;
}
}  // namespace

EngineShare::EngineShare(double share, bool adaptive) : adaptive_(adaptive) {
  TANDEM_CHECK_ARG(share >= 0 && share <= 1, "engine share ", share,
                   " is not valid: expected 0 to 1");
  schedule_.push_back({0, in_1024ths(share)});
}

bool engines_take_costliest(double share, uint64_t position, const CpuCostKey& cpu_cost) {
  const uint64_t first = position / kEngineBlock * kEngineBlock;
  int64_t taken = 0, costlier = 0;
  const double cost = cpu_cost(position);
  for (uint64_t p = first; p < first + kEngineBlock; ++p) {
    taken += decodes_on_engines(share, p) ? 1 : 0;
    if (p == position) continue;
    const double c = cpu_cost(p);
    costlier += c > cost || (c == cost && p < position) ? 1 : 0;
  }
  return costlier < taken;
}

double first_balanced_share(double engine_rate, double cpu_rate,
                            const std::vector<double>& seconds_per_file,
                            const CpuCostKey& cpu_cost) {
  if (engine_rate <= 0 || cpu_rate <= 0) return 0;
  double share = engine_rate / (engine_rate + cpu_rate);
  double all_seconds = 0;
  int64_t timed = 0;
  for (const double t : seconds_per_file) {
    if (t <= 0) continue;
    all_seconds += t;
    ++timed;
  }
  if (!cpu_cost || timed == 0) return share;
  const double mean_all = all_seconds / static_cast<double>(timed);
  for (int round = 0; round < 8; ++round) {
    double kept_seconds = 0;
    int64_t kept = 0;
    for (size_t i = 0; i < seconds_per_file.size(); ++i) {
      if (seconds_per_file[i] <= 0 || engines_take_costliest(share, i, cpu_cost)) continue;
      kept_seconds += seconds_per_file[i];
      ++kept;
    }
    if (kept == 0) break;  // the engines take every timed crop: nothing to scale by
    const double cpu_at_share = cpu_rate * mean_all / (kept_seconds / static_cast<double>(kept));
    const double next = engine_rate / (engine_rate + cpu_at_share);
    if (std::abs(next - share) < 1.0 / 1024) return next;
    share = next;
  }
  return share;
}

bool EngineShare::on_engines(uint64_t position, const CpuCostKey& cpu_cost) {
  double share = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next_unasked_ = std::max(next_unasked_, position + 1);
    // The last change at or before `position` (the schedule is short: search from its end).
    auto it = schedule_.rbegin();
    while (it->from_position > position) ++it;
    share = it->share;
  }
  return cpu_cost ? engines_take_costliest(share, position, cpu_cost)
                  : decodes_on_engines(share, position);
}

double EngineShare::share() const {
  std::lock_guard<std::mutex> lock(mu_);
  return schedule_.back().share;
}

std::vector<EngineShare::Change> EngineShare::schedule() const {
  std::lock_guard<std::mutex> lock(mu_);
  return schedule_;
}

void EngineShare::restore(const std::vector<Change>& schedule) {
  TANDEM_CHECK_ARG(!schedule.empty() && schedule.front().from_position == 0,
                   "engine share schedule: expected a first share from position 0");
  for (size_t i = 0; i < schedule.size(); ++i) {
    TANDEM_CHECK_ARG(schedule[i].share >= 0 && schedule[i].share <= 1,
                     "engine share schedule: share ", schedule[i].share, " at position ",
                     schedule[i].from_position, " is not valid: expected 0 to 1");
    TANDEM_CHECK_ARG(i == 0 || schedule[i].from_position > schedule[i - 1].from_position,
                     "engine share schedule: positions must rise (", schedule[i].from_position,
                     " after ", schedule[i - 1].from_position, ")");
  }
  std::lock_guard<std::mutex> lock(mu_);
  schedule_ = schedule;
  next_unasked_ = std::max(next_unasked_, schedule.back().from_position);
}

void EngineShare::set(double share) {
  TANDEM_CHECK_ARG(share >= 0 && share <= 1, "engine share ", share,
                   " is not valid: expected 0 to 1");
  const double s = in_1024ths(share);
  std::lock_guard<std::mutex> lock(mu_);
  if (schedule_.back().share == s) return;
  if (schedule_.back().from_position >= next_unasked_)  // nobody asked under the last change
    schedule_.back().share = s;
  else
    schedule_.push_back({next_unasked_, s});
}

void EngineShare::record_cpu(int64_t samples, double seconds, const ThreadUsage& used) {
  std::lock_guard<std::mutex> lock(mu_);
  cpu_samples_ += samples;
  cpu_seconds_ += seconds;
  add_usage(cpu_used_, used);
}

void EngineShare::record_engines(int64_t samples, double decode_seconds, const ThreadUsage& used) {
  std::lock_guard<std::mutex> lock(mu_);
  if (warmup_calls_left_ > 0) {
    --warmup_calls_left_;
    return;
  }
  engine_samples_ += samples;
  engine_seconds_ += decode_seconds;
  add_usage(engine_used_, used);
  ++engine_calls_;
}

EngineShare::Rates EngineShare::rates(int workers) const {
  std::lock_guard<std::mutex> lock(mu_);
  Rates r;
  r.cpu_samples = cpu_samples_;
  r.engine_samples = engine_samples_;
  if (cpu_samples_ > 0 && cpu_seconds_ > 0)
    r.cpu_images_per_s = static_cast<double>(cpu_samples_) * workers / cpu_seconds_;
  if (engine_samples_ > 0 && engine_seconds_ > 0)
    r.engine_images_per_s = static_cast<double>(engine_samples_) / engine_seconds_;
  std::tie(r.workers_on_core, r.worker_preemptions_per_s) = per_second(cpu_used_, cpu_seconds_);
  std::tie(r.engines_thread_on_core, r.engines_thread_preemptions_per_s) =
      per_second(engine_used_, engine_seconds_);
  return r;
}

bool EngineShare::rebalance(int workers, int64_t batch_size) {
  if (!adaptive_) return false;
  const Rates r = rates(workers);
  std::lock_guard<std::mutex> lock(mu_);
  if (cpu_samples_ < kWindowBatches * std::max<int64_t>(1, batch_size) / 2 ||
      engine_calls_ < kWindowBatches || r.cpu_images_per_s <= 0 || r.engine_images_per_s <= 0)
    return false;
  const double now = schedule_.back().share;
  // The share at which both sides take the same time for their parts of a batch.
  const double balanced = r.engine_images_per_s / (r.engine_images_per_s + r.cpu_images_per_s);
  last_rates_ = r;
  cpu_samples_ = engine_samples_ = engine_calls_ = 0;
  cpu_seconds_ = engine_seconds_ = 0;
  cpu_used_ = engine_used_ = ThreadUsage{};
  // Half way, so that one noisy window does not swing it.
  const double target = in_1024ths(std::max(kLeastAdaptiveShare, now + (balanced - now) / 2));
  if (std::abs(target - now) < 1.0 / 128) return false;
  // From the first position no worker has asked about: every position asked keeps its side.
  const uint64_t from = std::max(next_unasked_, schedule_.back().from_position + 1);
  schedule_.push_back({from, target});
  return true;
}

std::string EngineShare::report(int workers) const {
  Rates r = rates(workers);
  std::lock_guard<std::mutex> lock(mu_);
  if (r.cpu_samples == 0 || r.engine_samples == 0) r = last_rates_;
  std::string out = detail::concat("the JPEG engines decode ", schedule_.back().share,
                                   " of each batch, the CPU workers the rest");
  if (r.cpu_images_per_s > 0 && r.engine_images_per_s > 0)
    out += detail::concat(" (in the run: CPU crop regions ",
                          static_cast<int64_t>(r.cpu_images_per_s), " img/s on ", workers,
                          " workers, engines ", static_cast<int64_t>(r.engine_images_per_s),
                          " img/s", threads_on_cores(r), ")");
  if (adaptive_)
    out += schedule_.size() > 1
               ? detail::concat("; following both sides' rates, the share moved from ",
                                schedule_.front().share, " in ", schedule_.size() - 1, " change(s)")
               : std::string("; following both sides' rates, the share did not move");
  else if (schedule_.size() > 1)  // a resumed fixed share
    out += detail::concat("; from ", schedule_.front().share, " in ", schedule_.size() - 1,
                          " change(s)");
  return out;
}

}  // namespace tandem::data
