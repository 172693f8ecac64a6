// How a training run reads to a person (report.h).
#include "tandem/train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tandem::train {

namespace {

// snprintf into a std::string (the lines are short; 256 bytes holds any of them).
template <typename... Args>
std::string format(const char* pattern, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, pattern, args...);
  return buf;
}

}  // namespace

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return format("%.0fs", s);
  if (s < 3600) return format("%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return format("%dh%02dm", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
}

bool metric_is_fraction(const std::string& metric) {
  return metric.find("loss") == std::string::npos;
}

std::string progress_line(const TrainOptions::Progress& p, int64_t batch_size,
                          double elapsed_seconds) {
  const double eta =
      p.images_per_s > 0
          ? static_cast<double>((p.total_steps - p.step) * batch_size) / p.images_per_s
          : NAN;
  const int width = 24;
  const int filled =
      static_cast<int>(width * p.step_in_epoch / std::max<int64_t>(1, p.steps_per_epoch));
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(width - filled), '.');
  return format("epoch %lld/%lld [%s] step %lld/%lld  loss %.4f  %.0f img/s  elapsed %s  ETA %s",
                static_cast<long long>(p.epoch + 1), static_cast<long long>(p.epochs), bar.c_str(),
                static_cast<long long>(p.step_in_epoch), static_cast<long long>(p.steps_per_epoch),
                p.loss, p.images_per_s, format_duration(elapsed_seconds).c_str(),
                format_duration(eta).c_str());
}

std::string resume_line(int64_t start_step, int64_t steps_per_epoch) {
  const int64_t spe = std::max<int64_t>(1, steps_per_epoch);
  return format("resuming at step %lld (epoch %lld, step %lld of it)",
                static_cast<long long>(start_step), static_cast<long long>(start_step / spe + 1),
                static_cast<long long>(start_step % spe));
}

std::string epoch_line(const EpochRecord& r, int64_t epochs) {
  std::string metrics;
  for (const auto& [k, v] : r.metrics)
    metrics += metric_is_fraction(k) ? format("  %s %.2f%%", k.c_str(), 100 * v)
                                     : format("  %s %.4f", k.c_str(), v);
  const std::string eval =
      r.eval_images_per_s > 0 ? format("  eval %.0f img/s", r.eval_images_per_s) : "";
  return format("epoch %lld/%lld  train_loss %.4f", static_cast<long long>(r.epoch),
                static_cast<long long>(epochs), r.train_loss) +
         metrics + format("  %.0f img/s", r.images_per_s) + eval + format("  lr %.3g", r.lr);
}

SteadyMean steady_mean(const std::vector<double>& rates) {
  SteadyMean m;
  m.first_left_out = rates.size() >= 2;
  const size_t from = m.first_left_out ? 1 : 0;
  double sum = 0;
  for (size_t i = from; i < rates.size(); ++i) sum += rates[i];
  if (rates.size() > from) m.value = sum / static_cast<double>(rates.size() - from);
  return m;
}

EpochsReport describe_epochs(const TrainResult& r, int64_t spe) {
  std::vector<std::string> metric_names;  // every metric any epoch reported, in name order
  for (const auto& e : r.epochs)
    for (const auto& [k, v] : e.metrics)
      if (std::find(metric_names.begin(), metric_names.end(), k) == metric_names.end())
        metric_names.push_back(k);
  std::sort(metric_names.begin(), metric_names.end());
  std::string t = format("%6s %12s", "epoch", "train_loss");
  for (const auto& k : metric_names) t += format(" %14s", k.c_str());
  t += format(" %12s %12s %10s\n", "img/s", "eval img/s", "seconds");
  std::vector<double> run_ips;       // this run's epochs' img/s (not a resumed run's earlier)
  std::vector<double> run_eval_ips;  // and their evaluations' img/s, where measured
  EpochsReport out;
  for (const auto& e : r.epochs) {
    t += format("%6lld %12.4f", static_cast<long long>(e.epoch), e.train_loss);
    for (const auto& k : metric_names) {
      if (!e.metrics.count(k))
        t += format(" %14s", "-");
      else if (metric_is_fraction(k))
        t += format(" %13.2f%%", 100 * e.metrics.at(k));
      else
        t += format(" %14.4f", e.metrics.at(k));
    }
    t += format(" %12.0f", e.images_per_s);
    t += e.eval_images_per_s > 0 ? format(" %12.0f", e.eval_images_per_s) : format(" %12s", "-");
    t += format(" %10.1f\n", e.train_seconds + e.eval_seconds);
    if (e.step - spe >= std::max<int64_t>(r.resumed_from, 0)) {
      if (run_ips.empty()) {  // this run's first epoch
        out.first_epoch_images_per_s = e.epoch_images_per_s;
        out.first_eval_images_per_s = e.eval_images_per_s;
      }
      run_ips.push_back(e.images_per_s);
      if (e.eval_images_per_s > 0) run_eval_ips.push_back(e.eval_images_per_s);
    }
  }
  out.images_per_s = steady_mean(run_ips);
  out.eval_images_per_s = steady_mean(run_eval_ips);
  if (!run_ips.empty())
    t += format("speed      %.0f img/s (training, mean over %s)\n", out.images_per_s.value,
                out.images_per_s.first_left_out ? "the epochs after the first" : "the run");
  if (out.eval_images_per_s.value > 0)
    t += format(
        "evaluation %.0f img/s (mean over %s)\n", out.eval_images_per_s.value,
        out.eval_images_per_s.first_left_out ? "the evaluations after the first" : "the run");
  // What a run pays besides its steady steps, apart: before its first step, then in its first
  // epoch (the steady rates above leave both out).
  if (!run_ips.empty()) {
    t += format("setup      %.2f s before the first step, captures %.2f s", r.setup.prepare_seconds,
                r.setup.capture_seconds);
    if (r.evaluation_prepare_seconds > 0)
      t += format(", the evaluation's kernels %.2f s", r.evaluation_prepare_seconds);
    t += "\n";
  }
  if (run_ips.size() >= 2) {
    t += format("first      epoch %.0f img/s from its first step", out.first_epoch_images_per_s);
    if (out.first_eval_images_per_s > 0)
      t += format(", its evaluation %.0f img/s", out.first_eval_images_per_s);
    t += "\n";
  }
  for (const auto& note : r.notes) t += "note: " + note + "\n";
  if (!r.skipped.empty()) {
    t += format("skipped %zu bad samples:\n", r.skipped.size());
    for (size_t i = 0; i < std::min<size_t>(10, r.skipped.size()); ++i)
      t += format("  sample %lld: ", static_cast<long long>(r.skipped[i].index)) +
           r.skipped[i].reason + "\n";
  }
  out.text = t;
  return out;
}

}  // namespace tandem::train
