// Runner: composes a workload's stages into the pipeline of a mode. The workload says what a
// step does; everything about lanes, threads, graphs, warm-up and fallbacks is decided here,
// once for every workload.
#include "tandem/runner.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "graphed_k_stage.h"
#include "graphed_stage.h"
#include "loss_log.h"
#include "pipeline.h"
#include "tandem/error.h"
#include "tandem/loader.h"
#include "tandem/sampler.h"

namespace tandem {

std::string cpu_graph_note(Mode mode) {
  return std::string("CUDA graphs need a CUDA device: mode ") + to_string(mode) +
         " ran eagerly on the CPU";
}

namespace {

// The loss log's least capacity: runs up to this many steps keep it (and the graphs that append
// to it) from one prepare() to the next; 256 KiB of float32.
constexpr int64_t kKeptLossLogCapacity = int64_t{1} << 16;

// One piece of a step as the runner composes it: a feed, or the train step (zero_grad, forward
// and loss, backward, optimizer step, loss appended to the log), with its fields by name.
struct Unit {
  std::string name, lane, what;
  std::vector<std::string> inputs, outputs;
  GraphedStage::Work work;
  std::vector<at::Generator> generators;
  Capture capture = Capture::kAllowed;
};

// Consecutive units run as one pipeline stage (and, where captured, as one graph).
struct Group {
  std::vector<const Unit*> units;
  std::string name, lane;
  std::vector<std::string> inputs;   // fields it reads that an earlier stage or the data provide
  std::vector<std::string> outputs;  // fields it produces that a later group reads
  std::vector<std::string> drops;    // fields no later group reads: erased after it
  bool captured = false;
  bool train = false;  // holds the train step
};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

void add_unique(std::vector<std::string>& v, const std::string& s) {
  if (!contains(v, s)) v.push_back(s);
}

// Runs a group's units in order over named tensors: `in` holds group.inputs.
Tensors run_units(const Group& g, const Tensors& in) {
  std::vector<std::pair<std::string, at::Tensor>> env;
  env.reserve(g.inputs.size() + 4);
  for (size_t i = 0; i < g.inputs.size(); ++i) env.emplace_back(g.inputs[i], in[i]);
  auto find = [&](const std::string& name) -> at::Tensor& {
    for (auto it = env.rbegin(); it != env.rend(); ++it)
      if (it->first == name) return it->second;
    throw Error("field '" + name + "' missing inside stage " + g.name);  // validate() prevents it
  };
  for (const Unit* u : g.units) {
    Tensors args;
    args.reserve(u->inputs.size());
    for (const auto& name : u->inputs) args.push_back(find(name));
    Tensors out = u->work(args);
    for (size_t i = 0; i < u->outputs.size(); ++i) env.emplace_back(u->outputs[i], out[i]);
  }
  Tensors out;
  out.reserve(g.outputs.size());
  for (const auto& name : g.outputs) out.push_back(find(name));
  return out;
}

std::string describe_units(const Group& g) {
  std::string out;
  for (const Unit* u : g.units) {
    if (!out.empty()) out += "; ";
    out += u->name;
    if (!u->what.empty()) out += ": " + u->what;
  }
  return out;
}

// The loader settings a run's options and its data source imply (the source's order and
// drop_last are added where the loader is opened).
LoaderOptions loader_options(const RunOptions& o, const DataSource& source) {
  LoaderOptions lo;
  lo.worker_nice = source.worker_nice();
  lo.batch_size = o.batch_size;
  lo.workers = o.workers;
  lo.depth = o.loader_depth > 0 ? o.loader_depth : ring_slots_for(o.workers);
  lo.trace = o.trace;
  lo.skip_bad = o.skip_bad;
  lo.cancel = o.stop;
  return lo;
}

// The stages of a mode: one group per unit, except where the serial graphed modes merge
// consecutive capturable units into one graph; each with the fields that cross its boundary.
std::vector<Group> compose_groups(const std::vector<Unit>& units, Mode mode) {
  std::vector<Group> groups;
  const bool merge = mode == Mode::kGraphed || mode == Mode::kGraphedK;
  for (const Unit& u : units) {
    const bool capturable = captures_graphs(mode) && u.capture == Capture::kAllowed;
    if (merge && capturable && !groups.empty() && groups.back().captured) {
      groups.back().units.push_back(&u);
      continue;
    }
    Group g;
    g.units.push_back(&u);
    g.captured = capturable;
    groups.push_back(std::move(g));
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    Group& g = groups[gi];
    std::vector<std::string> produced;
    for (const Unit* u : g.units) {
      for (const auto& in : u->inputs)
        if (!contains(produced, in)) add_unique(g.inputs, in);
      for (const auto& out : u->outputs) add_unique(produced, out);
    }
    std::vector<std::string> read_later;
    for (size_t later = gi + 1; later < groups.size(); ++later)
      for (const Unit* u : groups[later].units)
        for (const auto& in : u->inputs) add_unique(read_later, in);
    for (const auto& p : produced)
      if (contains(read_later, p)) g.outputs.push_back(p);
    for (const auto& in : g.inputs)
      if (!contains(read_later, in) && !contains(produced, in)) g.drops.push_back(in);
    g.train = g.units.back() == &units.back();
    if (g.units.size() == 1) {
      g.name = g.units[0]->name;
      g.lane = g.units[0]->lane;
    } else {
      g.name = g.units.size() == units.size() ? "step" : "";
      if (g.name.empty())
        for (const Unit* u : g.units) g.name += (g.name.empty() ? "" : "+") + u->name;
      g.lane = g.units.back()->lane;
    }
  }
  return groups;
}

}  // namespace

struct Runner::Impl {
  // Built once from the workload.
  std::vector<Unit> units;
  int64_t batch_size = 0;  // for messages: the host batch, or a resident batch's first dim

  // Kept from one prepare() to the next while the runs succeed (`keep`), so a later run
  // replays the graphs an earlier one captured; in this order of destruction: graphs before
  // the log their replays append to (its address is in them).
  std::unique_ptr<LossLog> log;
  std::vector<Group> groups;                           // their units' work is in the graphs
  std::vector<std::unique_ptr<GraphedStage>> graphed;  // per group; null where eager
  std::shared_ptr<WarmupBarrier> barrier;              // the kept stages' (one in warm-up)
  bool keep = false;  // the last run succeeded: the next prepare() keeps the above
  // Rebuilt by each prepare(): graphed_k's graphs are made for one run's length.
  std::unique_ptr<GraphedKStage> graphed_k;
  std::unique_ptr<Pipeline> pipeline;
  int64_t num_steps = 0;
  double prepare_seconds = 0;

  // RunOptions::record_generator_states: per group with generators, their states before each
  // recent item (by item), written by the group's stage thread, read by the last stage's hook.
  struct GeneratorSnapshots {
    std::vector<at::Generator> generators;  // the group's, in generators() order
    std::vector<size_t> positions;          // where each sits in generators()
    mutable std::mutex mutex;
    std::map<int64_t, std::vector<at::Tensor>> by_item;
  };
  std::vector<std::unique_ptr<GeneratorSnapshots>> snapshots;  // per group; null: none

  // Host data: the current epoch's loader.
  std::shared_ptr<const Dataset> run_dataset;
  std::unique_ptr<Loader> loader;  // replaced by the load stage alone, under loader_mutex
  std::mutex loader_mutex;         // pause_loading() against that replacement
  bool loading_paused = false;     // under loader_mutex; a new loader starts paused too
  int64_t epoch = 0, taken_in_epoch = 0;
  int64_t draw_position = 0;           // the next loader's first sample in the run's draw stream
  std::vector<SkippedSample> skipped;  // by the previous epochs' loaders (skip_bad)

  // prepare()'s steps, in its order.
  void reset(int64_t steps, const RunOptions& o, c10::Device device);
  void open_run_dataset(const DataSource& data, const RunOptions& o);
  Stage load_stage(const DataSource& data, const RunOptions& o, c10::Device device);
  void open_next_loader(const DataSource& source, const RunOptions& o);
  void keep_generator_snapshots(bool record);
  Stage group_stage(size_t gi, const Workload& w, const RunOptions& o);
};

void Runner::Impl::reset(int64_t steps, const RunOptions& o, c10::Device device) {
  // The previous run's graphs (unless kept) go before the log their replays append to, and
  // before its loader. Safe with replays in flight: CUDA frees an executable graph once its
  // launches end.
  pipeline.reset();
  graphed_k.reset();
  if (!keep || !log || log->capacity() < steps) {
    graphed.clear();
    groups.clear();
    barrier.reset();
    log.reset();
    log = std::make_unique<LossLog>(std::max(steps, kKeptLossLogCapacity), device);
  } else {
    log->reset();  // ordered before the run's lanes by the pipeline (they wait for the caller)
  }
  keep = false;  // until this run succeeds
  loader.reset();
  skipped.clear();
  num_steps = steps;
  epoch = taken_in_epoch = 0;
  draw_position = o.first_step * o.batch_size;
}

void Runner::Impl::open_run_dataset(const DataSource& data, const RunOptions& o) {
  if (data.kind() == DataSource::Kind::kSizedToRun) {
    const int64_t b = o.batch_size, last = o.last_batch_size;
    const int64_t samples = num_steps <= 0 ? 0
                            : last == 0    ? num_steps * b
                                           : (num_steps - 1) * b + last;
    run_dataset = data.factory()(samples);
  } else if (data.kind() == DataSource::Kind::kDataset) {
    run_dataset = data.dataset();
  }
}

// The next loader of the run (the first, or the next epoch's), replacing the one before.
void Runner::Impl::open_next_loader(const DataSource& source, const RunOptions& o) {
  LoaderOptions lo = loader_options(o, source);
  if (source.kind() == DataSource::Kind::kDataset) {
    // PyTorch's DistributedSampler order: shuffled per epoch from seed + epoch, this rank's
    // shard. A run from a later global step (o.first_step) starts that many batches in.
    const int64_t n = run_dataset->size();
    const DistributedSampler sampler(n, o.world_size, o.rank, source.shuffle(), o.seed);
    const int64_t batches = source.batches_per_epoch(o.batch_size, o.world_size);
    const int64_t skip_batches = batches > 0 ? o.first_step % batches : 0;
    const bool first_loader = !loader;
    if (first_loader && batches > 0) epoch = o.first_step / batches;
    if (source.drop_last() && batches > 0) {
      // Every epoch of the run in one loader, each epoch's full batches back to back: the
      // workers run on across epoch boundaries. (A loader per epoch starts cold: its first
      // batch costs a whole batch of decodes while the device waits — a stall per epoch.)
      const int64_t per_epoch = batches * o.batch_size;
      const int64_t wanted = num_steps * o.batch_size;
      for (int64_t e = epoch; static_cast<int64_t>(lo.indices.size()) < wanted; ++e) {
        const std::vector<int64_t> order = sampler.indices(e);
        const int64_t from = e == epoch ? skip_batches * o.batch_size : 0;
        lo.indices.insert(lo.indices.end(), order.begin() + from, order.begin() + per_epoch);
      }
      lo.indices.resize(wanted);
    } else {
      lo.indices = sampler.indices(epoch);
      if (first_loader)
        lo.indices.erase(
            lo.indices.begin(),
            lo.indices.begin() + std::min<int64_t>(skip_batches * o.batch_size,
                                                   static_cast<int64_t>(lo.indices.size())));
    }
  }
  lo.drop_last = source.drop_last();
  // Per-sample draws (a crop chosen before decoding): keyed by the sample's place in this
  // rank's stream of the run, so a resumed run (first_step) draws what the whole run would.
  lo.draw_seed = o.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(o.rank + 1));
  lo.first_position = draw_position;
  draw_position +=
      lo.indices.empty() ? run_dataset->size() : static_cast<int64_t>(lo.indices.size());
  // The previous epoch's workers have filled every batch by now (the last one was taken), so
  // this joins at once; its pinned slots return to LibTorch's caching host allocator, which
  // does not hand them out again before the copies that read them have completed.
  if (loader) {
    std::vector<SkippedSample> done = loader->skipped();
    skipped.insert(skipped.end(), done.begin(), done.end());
  }
  {
    std::lock_guard<std::mutex> lock(loader_mutex);
    loader.reset();
    loader = std::make_unique<Loader>(run_dataset, lo);
    if (loading_paused) loader->pause();
  }
  taken_in_epoch = 0;
  TANDEM_CHECK_ARG(loader->num_batches() > 0, "the dataset's ", run_dataset->size(),
                   " samples make no batch of ", o.batch_size,
                   " (drop_last): expected at least one full batch per epoch");
}

// Host data: a loader per epoch (the first made here, so its workers start filling now).
Stage Runner::Impl::load_stage(const DataSource& data, const RunOptions& o, c10::Device device) {
  if (num_steps > 0) open_next_loader(data, o);
  const int64_t steps = num_steps;
  return {"load", Lane::create("copy", device),
          [this, source = &data, o, steps](Batch& b, const Lane& lane) {
            load_next_batch(*loader, b, lane);
            // An epoch's last batch taken: start the next epoch's workers now, so they fill its
            // first batches while this one trains, instead of at the next step (a stall).
            if (++taken_in_epoch == loader->num_batches() && b.index + 1 < steps) {
              ++epoch;
              open_next_loader(*source, o);
            }
          }};
}

void Runner::Impl::keep_generator_snapshots(bool record) {
  snapshots.clear();
  snapshots.resize(groups.size());
  if (!record) return;
  size_t position = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (const Unit* u : groups[gi].units)
      for (const auto& gen : u->generators) {
        if (!gen.defined()) continue;
        if (!snapshots[gi]) snapshots[gi] = std::make_unique<GeneratorSnapshots>();
        snapshots[gi]->generators.push_back(gen);
        snapshots[gi]->positions.push_back(position);
        ++position;
      }
}

// Group gi's stage: its units run eagerly, as a graph replayed per step, or (graphed_k) as
// graphs of several steps; with a resident source, the first group reads the step's batch.
Stage Runner::Impl::group_stage(size_t gi, const Workload& w, const RunOptions& o) {
  const Mode mode = o.mode;
  const bool pipelined = runs_pipelined(mode);
  const Group* g = &groups[gi];
  GraphOptions go;
  go.name = w.name + " " + g->name;
  for (const Unit* u : g->units)
    for (const auto& gen : u->generators)
      if (gen.defined() && gen.device().is_cuda()) go.generators.push_back(gen);
  auto work = [g](const Tensors& in) { return run_units(*g, in); };
  std::function<Tensors(const Lane&, int64_t, const Tensors&)> run;
  if (g->captured && mode == Mode::kGraphedK) {
    TANDEM_CHECK_ARG(g->outputs.empty(), "mode graphed_k needs one graph per step");
    graphed_k = std::make_unique<GraphedKStage>(go, work, o.steps_per_graph, o.graph_warmup_steps,
                                                num_steps);
    GraphedKStage* k = graphed_k.get();
    run = [k](const Lane& lane, int64_t item, const Tensors& in) {
      k->run(lane, item, in);
      return Tensors{};
    };
  } else if (g->captured) {
    // Outputs handed to another lane are cloned after each replay (the next replay rewrites
    // the graph's own while the consumer may still read them); on one lane stream order
    // suffices. Graphs that replay concurrently keep private pools (the default).
    const GraphOutputs outputs =
        pipelined && !g->outputs.empty() ? GraphOutputs::kCloned : GraphOutputs::kStatic;
    if (!graphed[gi])  // else kept from an earlier run of this runner: it replays at once
      graphed[gi] =
          std::make_unique<GraphedStage>(go, work, outputs, barrier, o.graph_warmup_steps);
    graphed[gi]->begin_run();
    GraphedStage* s = graphed[gi].get();
    run = [s](const Lane& lane, int64_t item, const Tensors& in) { return s->run(lane, item, in); };
  } else {
    run = [work](const Lane&, int64_t, const Tensors& in) { return work(in); };
  }
  const DataSource* resident = !w.data.on_host() && gi == 0 ? &w.data : nullptr;
  GeneratorSnapshots* snap = snapshots[gi].get();
  const int64_t first_step = o.first_step;
  auto fn = [g, run, resident, snap, first_step](Batch& b, const Lane& lane) {
    if (resident) {  // step i reads resident batch i % n: no loader, no copy
      const int64_t step = first_step + b.index;
      const auto& src = resident->batches()[step % resident->batches().size()];
      for (const auto& [name, t] : src.tensors()) b.set(name, t);
    }
    if (snap) {  // the states this item's draws start from; a few dozen items are kept
      std::vector<at::Tensor> states;
      for (const auto& gen : snap->generators) states.push_back(gen.get_state());
      std::lock_guard<std::mutex> lock(snap->mutex);
      snap->by_item[b.index] = std::move(states);
      while (!snap->by_item.empty() && snap->by_item.begin()->first < b.index - 64)
        snap->by_item.erase(snap->by_item.begin());
    }
    Tensors in;
    in.reserve(g->inputs.size());
    for (const auto& name : g->inputs) in.push_back(b.get(name));
    Tensors out = run(lane, b.index, in);
    for (size_t i = 0; i < g->outputs.size(); ++i) b.set(g->outputs[i], std::move(out[i]));
    for (const auto& name : g->drops) b.erase(name);
  };
  const LanePriority priority = g->train ? o.train_priority : o.input_priority;
  return {g->name, Lane::create(g->lane, w.device, priority), fn};
}

namespace {

/// Checks the options against the workload (InvalidArgument naming the first bad one), and
/// the stages' capture against the mode: the train stage's optimizer must be capturable where
/// the mode captures it, and graphed_k captures every stage.
void check_run(const Workload& w, const RunOptions& o) {
  TANDEM_CHECK_ARG(o.graph_warmup_steps >= 0, "graph warm-up step count ", o.graph_warmup_steps,
                   " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(o.steps_per_graph >= 1, "steps per graph ", o.steps_per_graph,
                   " is not valid: expected >= 1");
  TANDEM_CHECK_ARG(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "rank ", o.rank,
                   " of world size ", o.world_size,
                   " is not valid: expected a world size >= 1 and 0 <= rank < world size");
  TANDEM_CHECK_ARG(o.first_step >= 0, "first step ", o.first_step, " is not valid: expected >= 0");
  TANDEM_CHECK_ARG(o.first_step == 0 || w.data.kind() != DataSource::Kind::kSizedToRun,
                   "first step ", o.first_step, " is not valid for workload ", w.name,
                   ": its data is made for each run, expected 0");
  if (w.data.on_host()) {
    TANDEM_CHECK_ARG(o.batch_size > 0, "batch size ", o.batch_size,
                     " is not valid: expected a positive number of samples");
    TANDEM_CHECK_ARG(o.last_batch_size >= 0 && o.last_batch_size < o.batch_size, "last batch size ",
                     o.last_batch_size,
                     " is not valid: expected 0 (every batch full) or a size below the batch "
                     "size ",
                     o.batch_size);
    check_loader_options(loader_options(o, w.data), w.data.host_sample_bytes());
  } else {
    TANDEM_CHECK_ARG(o.last_batch_size == 0, "last batch size ", o.last_batch_size,
                     " is not valid for workload ", w.name,
                     ": its batches are resident device tensors, expected 0");
  }
  const TrainStage& train = w.train;
  if (captures_graphs(o.mode) && train.capture == Capture::kAllowed)
    TANDEM_CHECK_ARG(train.optimizer->capturable(), "mode ", to_string(o.mode),
                     " captures train stage '", train.name,
                     "' into a CUDA graph, but its optimizer (", train.optimizer->name(),
                     ") keeps host-side state a graph would freeze: use tandem::optim::Sgd, "
                     "Adam or AdamW, mark the stage Capture::kNever, or run serial or pipelined");
  if (o.mode == Mode::kGraphedK) {
    for (const auto& f : w.feeds)
      TANDEM_CHECK_ARG(f.capture == Capture::kAllowed,
                       "mode graphed_k captures every stage of a step, but feed stage '", f.name,
                       "' is Capture::kNever: expected graphed, which runs it eagerly between "
                       "graphs");
    TANDEM_CHECK_ARG(train.capture == Capture::kAllowed,
                     "mode graphed_k captures every stage of a step, but train stage '", train.name,
                     "' is Capture::kNever");
  }
}

/// A feed stage as a unit: its function under no-grad, its output count checked.
Unit feed_unit(const FeedStage& f) {
  Unit u;
  u.name = f.name;
  u.lane = f.lane.empty() ? f.name : f.lane;
  u.what = f.what;
  u.inputs = f.inputs;
  u.outputs = f.outputs;
  u.generators = f.generators;
  u.capture = f.capture;
  const StageFn fn = f.fn;
  const size_t n_out = f.outputs.size();
  const std::string name = f.name;
  u.work = [fn, n_out, name](const Tensors& in) {
    at::NoGradGuard no_grad;
    Tensors out = fn(in);
    TANDEM_CHECK_ARG(out.size() == n_out, "feed stage '", name, "' returned ", out.size(),
                     " tensors: expected ", n_out, ", one per output name");
    return out;
  };
  return u;
}

/// The train stage as a unit: the forward and loss (in the gradient sync's scope), backward,
/// the optimizer's step, the loss recorded into `*log` — read at call time: each prepare()
/// makes a new log.
Unit train_unit(const TrainStage& train, const std::unique_ptr<LossLog>* log) {
  Unit t;
  t.name = train.name;
  t.lane = train.lane;
  t.what = (train.what.empty() ? std::string("forward, loss") : train.what) + ", backward, " +
           train.optimizer->name() + " step";
  t.inputs = train.inputs;
  t.generators = train.generators;
  t.capture = train.capture;
  const auto loss_fn = train.loss;
  const auto optimizer = train.optimizer;
  const std::string train_name = train.name;
  const std::shared_ptr<GradientSync> sync = train.gradient_sync;
  const std::shared_ptr<LossScale> scale = train.loss_scale;
  if (scale) optimizer->skip_steps_where(scale->found_inf());  // names an optimizer that cannot
  // The parameters whose gradients the scale unscales: the optimizer's, fixed once it is made.
  const std::vector<at::Tensor> scaled =
      scale ? optimizer->parameters() : std::vector<at::Tensor>{};
  t.work = [log, loss_fn, optimizer, train_name, sync, scale, scaled](const Tensors& in) {
    optimizer->zero_grad();  // set to none: backward writes fresh gradients (see GraphedStep)
    at::Tensor loss;
    {
      GradientSync::Scope scope(sync.get());  // for GatheredGrad layers in the forward
      loss = loss_fn(in);
    }
    TANDEM_CHECK_ARG(
        loss.defined() && loss.numel() == 1 && loss.requires_grad(), "train stage '", train_name,
        "' returned ",
        loss.defined() ? "a loss that is not one element requiring grad" : "an undefined loss",
        ": expected the scalar loss of the forward pass");
    if (sync) sync->before_backward();
    (scale ? scale->scaled(loss) : loss).backward();
    if (sync) sync->after_backward();
    if (scale) scale->unscale(scaled);
    optimizer->step();
    if (scale) scale->update();
    (*log)->record(loss.scalar_type() == at::kFloat ? loss.detach() : loss.detach().to(at::kFloat));
    return Tensors{};
  };
  return t;
}

}  // namespace

Runner::Runner(const Workload& workload, RunOptions options)
    : workload_(workload), options_(options), impl_(std::make_unique<Impl>()) {
  workload_.validate();
  check_run(workload_, options_);
  if (workload_.data.on_host()) {
    impl_->batch_size = options_.batch_size;
  } else {
    const auto& t = workload_.data.batches().front().tensors().front().second;
    impl_->batch_size = t.dim() > 0 ? t.size(0) : 1;
  }
  // Units: feeds under no-grad, then the train step.
  for (const auto& f : workload_.feeds) impl_->units.push_back(feed_unit(f));
  impl_->units.push_back(train_unit(workload_.train, &impl_->log));
}

Runner::~Runner() = default;

namespace {
Pipeline& prepared(const std::unique_ptr<Pipeline>& pipeline, const char* who) {
  TORCH_CHECK(pipeline, "Runner::", who, "(): prepare() first");
  return *pipeline;
}
}  // namespace

int Runner::num_stages() const { return prepared(impl_->pipeline, "num_stages").num_stages(); }

int Runner::step_start_stage() const {
  const Pipeline& p = prepared(impl_->pipeline, "step_start_stage");
  return p.mode() == PipelineMode::kSerial ? 0 : p.num_stages() - 1;
}

const Lane& Runner::train_lane() const {
  const Pipeline& p = prepared(impl_->pipeline, "train_lane");
  return p.lane_of(p.num_stages() - 1);
}

int Runner::depth() const { return prepared(impl_->pipeline, "depth").depth(); }

void Runner::set_timing(int64_t first_timed_step, int64_t device_timing_every) {
  prepared(impl_->pipeline, "set_timing").set_timing(first_timed_step, device_timing_every);
}

StageTiming Runner::timing() const { return prepared(impl_->pipeline, "timing").timing(); }

void Runner::prepare(int64_t num_steps) {
  TANDEM_CHECK_ARG(num_steps >= 0, "step count ", num_steps, " is not valid: expected >= 0");
  const auto started = std::chrono::steady_clock::now();
  Impl& im = *impl_;
  const Mode mode = options_.mode;
  const c10::Device dev = workload_.device;
  im.reset(num_steps, options_, dev);
  const DataSource& data = workload_.data;
  im.open_run_dataset(data, options_);
  const bool later_run = !im.groups.empty();  // kept, with the graphs that run their units
  if (!later_run) {
    im.groups = compose_groups(im.units, mode);
    im.barrier = std::make_shared<WarmupBarrier>();
  }
  std::vector<Stage> stages;
  if (data.on_host()) stages.push_back(im.load_stage(data, options_, dev));
  im.graphed.resize(im.groups.size());
  im.keep_generator_snapshots(options_.record_generator_states);
  for (size_t gi = 0; gi < im.groups.size(); ++gi)
    stages.push_back(im.group_stage(gi, workload_, options_));
  im.pipeline = std::make_unique<Pipeline>(
      std::move(stages), runs_pipelined(mode) ? PipelineMode::kPipelined : PipelineMode::kSerial,
      Lane::create("serial", dev));
  std::shared_ptr<WarmupBarrier> barrier = im.barrier;
  im.pipeline->set_on_error([barrier] { barrier->cancel(); });  // the run fails: nothing kept
  im.pipeline->set_trace(options_.trace);
  // The first item alone is for the libraries that tune themselves on it (Pipeline): a later
  // run's stages run on the kept threads that tuned on the first, so it need not wait.
  im.pipeline->set_first_item_alone(!later_run);
  im.prepare_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

RunSetup Runner::setup() const {
  const Impl& im = *impl_;
  RunSetup s;
  s.prepare_seconds = im.prepare_seconds;
  auto add = [&s](double seconds, bool captured) {
    s.capture_seconds += seconds;
    s.graphs += captured ? 1 : 0;
  };
  for (const auto& g : im.graphed)
    if (g && g->kept())
      ++s.graphs_kept;
    else if (g)
      add(g->capture_seconds(), g->captured());
  if (im.graphed_k) add(im.graphed_k->capture_seconds(), im.graphed_k->captured());
  return s;
}

void Runner::set_first_step(int64_t first_step) {
  RunOptions o = options_;
  o.first_step = first_step;
  check_run(workload_, o);
  options_ = o;
}

void Runner::set_trace(Trace* trace) { options_.trace = trace; }

void Runner::set_stop(const std::atomic<int>* stop) { options_.stop = stop; }

void Runner::run(const StepHook& on_step) {
  Pipeline& p = prepared(impl_->pipeline, "run");
  try {
    p.run(impl_->num_steps, on_step);
    impl_->keep = true;  // a failed run keeps nothing: a graph may be half made, its barrier
                         // cancelled
  } catch (const StageError& e) {
    throw RunError(detail::concat("stage '", e.stage(), "' (lane ", e.lane(), ") failed at step ",
                                  e.item(), " in mode ", to_string(options_.mode),
                                  " at batch size ", impl_->batch_size, ": ", e.cause()));
  }
}

std::vector<float> Runner::train(int64_t num_steps) {
  prepare(num_steps);
  run();
  return losses();
}

void Runner::pause_loading(bool paused) {
  std::lock_guard<std::mutex> lock(impl_->loader_mutex);
  impl_->loading_paused = paused;
  if (!impl_->loader) return;
  if (paused)
    impl_->loader->pause();
  else
    impl_->loader->resume();
}

std::vector<SkippedSample> Runner::skipped() const {
  std::vector<SkippedSample> out = impl_->skipped;
  if (impl_->loader) {
    std::vector<SkippedSample> current = impl_->loader->skipped();
    out.insert(out.end(), current.begin(), current.end());
  }
  return out;
}

std::vector<at::Generator> Runner::generators() const {
  std::vector<at::Generator> out;
  for (const Unit& u : impl_->units)
    for (const auto& gen : u.generators)
      if (gen.defined()) out.push_back(gen);
  return out;
}

std::vector<at::Tensor> Runner::generator_states_before(int64_t item) const {
  TANDEM_CHECK_ARG(options_.record_generator_states,
                   "generator_states_before: set RunOptions::record_generator_states first");
  const std::vector<at::Generator> gens = generators();
  std::vector<at::Tensor> out(gens.size());
  for (const auto& snap : impl_->snapshots) {
    if (!snap) continue;
    std::lock_guard<std::mutex> lock(snap->mutex);
    const auto it = snap->by_item.find(item);
    const bool started = it != snap->by_item.end();
    // Not started yet: no draw of this item has happened (the stage records before it draws,
    // under this lock), so the current state is the one it will start from.
    TANDEM_CHECK_ARG(started || snap->by_item.empty() || snap->by_item.rbegin()->first < item,
                     "generator states before item ", item, " are no longer kept");
    for (size_t i = 0; i < snap->generators.size(); ++i)
      out[snap->positions[i]] = started ? it->second[i] : snap->generators[i].get_state();
  }
  return out;
}

std::vector<float> Runner::losses() const {
  return impl_->log ? impl_->log->values() : std::vector<float>{};
}

std::vector<std::string> Runner::notes() const {
  const Impl& im = *impl_;
  const Mode mode = options_.mode;
  std::vector<std::string> out;
  if (workload_.train.gradient_sync) out.push_back(workload_.train.gradient_sync->what());
  for (const FeedStage& f : workload_.feeds)
    if (f.report) {
      std::string said = f.report();
      if (!said.empty()) out.push_back(f.name + ": " + said);
    }
  if (!captures_graphs(mode) || !im.pipeline) return out;
  if (!workload_.device.is_cuda()) {
    out.push_back(cpu_graph_note(mode));
    return out;
  }
  const bool host = workload_.data.on_host();
  bool any = false;
  for (size_t gi = 0; gi < im.groups.size(); ++gi) {
    const Group& g = im.groups[gi];
    if (!g.captured) {
      out.push_back(detail::concat(g.name, " ran eagerly (", describe_units(g),
                                   "): its stage is Capture::kNever"));
      continue;
    }
    const GraphedStage* s = im.graphed[gi].get();
    if (s && s->captured()) {
      any = true;
      const std::string lane = runs_pipelined(mode) ? " on lane " + g.lane : std::string();
      out.push_back(s->kept() ? detail::concat("replayed: ", g.name, " (", describe_units(g),
                                               ") as the graph ",
                                               "an earlier run of this runner captured", lane, "; ",
                                               s->run_replays(), " replays")
                              : detail::concat("captured: ", g.name, " (", describe_units(g),
                                               ") as one graph", lane, " after ", s->warmup_steps(),
                                               " eager warm-up steps on a side lane; ",
                                               s->run_replays(), " replays"));
    }
    if (s)
      for (auto& note : s->notes()) out.push_back(note);
  }
  if (im.graphed_k) {
    any = any || im.graphed_k->captured();
    if (im.graphed_k->captured())
      out.push_back(detail::concat(
          "captured: ", im.graphed_k->steps_per_graph(), " steps (",
          describe_units(im.groups.back()), ") per graph after ", im.graphed_k->warmup_steps(),
          " eager warm-up steps on a side lane; ", im.graphed_k->replays(), " replays"));
    for (auto& note : im.graphed_k->notes()) out.push_back(note);
  }
  if (any && host) out.push_back("load (loader and H2D copy) stays eager");
  return out;
}

}  // namespace tandem
