// How a training run reads to a person: the progress line while an epoch runs, one line per
// epoch, and the table of every epoch at the end — the same for `tandem train` and Python's
// tandem.Trainer.fit(out=...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/train/trainer.h"

namespace tandem::train {

/// "42s", "3m07s", "1h05m"; "?" for a negative or non-finite time.
std::string format_duration(double seconds);

/// Whether a metric is a fraction, shown as a percentage (accuracy, miou, pixel_accuracy), or a
/// loss, shown as it is.
bool metric_is_fraction(const std::string& metric);

/// "epoch 2/10 [########.......] step 40/120  loss 0.4321  5120 img/s  elapsed 12s  ETA 1m03s"
/// (no line end: redraw it in place with "\r\033[K").
std::string progress_line(const TrainOptions::Progress& progress, int64_t batch_size,
                          double elapsed_seconds);

/// "epoch 2/10  train_loss 0.4321  accuracy 91.20%  5120 img/s  eval 20000 img/s  lr 0.05".
std::string epoch_line(const EpochRecord& record, int64_t epochs);

/// "resuming at step 240 (epoch 3, step 40 of it)": what a resumed Trainer starts from.
std::string resume_line(int64_t start_step, int64_t steps_per_epoch);

/// The mean of a run's per-epoch rates, the first left out when there are two or more: the
/// first epoch also pays for the warm-up steps, graph capture and cuDNN's autotuning, and the
/// first evaluation for its loader's start and the autotuning of a short last batch.
struct SteadyMean {
  double value = 0;
  bool first_left_out = false;
};
SteadyMean steady_mean(const std::vector<double>& rates);

/// The table of every epoch in `result` (a resumed run's earlier ones included), then the
/// steady training and evaluation rates of this run's epochs, what it paid before its first
/// step and its first epoch's rates apart, its notes and the samples it skipped.
struct EpochsReport {
  std::string text;
  SteadyMean images_per_s, eval_images_per_s;  ///< over this run's epochs (not a resume's earlier)
  /// This run's first epoch by the wall clock from its first step (warm-up, captures and cuDNN's
  /// tuning in it), and its evaluation's rate; 0 where there is none.
  double first_epoch_images_per_s = 0, first_eval_images_per_s = 0;
};
EpochsReport describe_epochs(const TrainResult& result, int64_t steps_per_epoch);

}  // namespace tandem::train
