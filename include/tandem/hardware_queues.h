// CUDA feeds a process's streams to the GPU through a fixed number of hardware work queues
// (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless the environment says otherwise, read when the process's
// first CUDA context is created). Streams that share a queue run in the order their work was
// queued, whatever their streams: a pipeline's lanes plus nvJPEG's 14 internal streams for the
// JPEG engines are more than 8, and an engine's image that lands in the training lane's queue
// waits behind a whole queued step (a graph replay queues one at once), and the host behind it.
// Measured on an H200, ResNet-50 from 1000–2000 px photos: 4,137–4,148 img/s with 8 queues,
// 4,900–5,188 with 32; ResNet-18 5,466 and 5,792.
//
// More queues are not free for every run: the seg workload's eager pipelined mode at batch size
// 8 (a step of ~3 ms, launch-bound) ran ~4% slower with 32 (medians 2,646 and 2,755 img/s over
// six runs each); graphed modes and larger batches did not move. So the queues are asked for
// where the engines may decode, by the caller, before the program's first CUDA call — the CLI
// does for its runs that may decode an image folder on the engines — and never over a value the
// user set.
#pragma once

namespace tandem {

/// What the JPEG engines' runs ask for: CUDA's maximum.
constexpr int kHardwareQueues = 32;
/// Fewer than this and the JPEG engines' streams share queues with the pipeline's lanes.
constexpr int kHardwareQueuesForEngines = 16;

/// Sets CUDA_DEVICE_MAX_CONNECTIONS to kHardwareQueues where the environment names no value;
/// returns whether it did. It applies only if no CUDA context exists yet in this process.
bool ask_for_hardware_queues();

/// The number of hardware queues the environment asks CUDA for (8 where it names none or a
/// value that is not a positive number, as CUDA does).
int hardware_queues();

}  // namespace tandem
