"""tandem.Trainer: your modules, your data, tandem's runner.

    enc.requires_grad_(False).eval().cuda(); dec.train().cuda()
    trainer = tandem.Trainer(
        model=dec, loss_fn=torch.nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(dec.parameters(), lr=1e-3),
        data=tandem.data.Random(100_000, image=((3, 256, 256), torch.uint8),
                                mask=((256, 256), torch.int64, 10)),
        feed=[lambda x: enc(x.float())],          # frozen stages before the model, no grad
        batch_size=32)                             # mode="auto": timed trials pick the mode
    result = trainer.fit(steps=1000)               # result.losses, print(result)

A step is: the batch's input field through `augment` (tandem's fused GPU augmentation) and each
`feed` stage in order, all without gradients; then ``loss_fn(model(x), target)``, backward and
``optimizer.step()``. Every mode computes the plain loop's losses:

    serial              the plain loop, on one CUDA stream
    pipelined           each stage on its own stream and thread: step n+1's feeds beside step n
    graphed             the whole step captured into one CUDA graph, replayed
    pipelined+graphed   pipelined, each stage replaying its own graph
    graphed_k           graphed, K steps per graph
    auto                short timed trials of the modes that could win, then the fastest: in
                        fit, on the fit's own steps (they train); in choose_mode() and
                        benchmark(), on copies

Eager modes call your Python code from tandem's stage threads (under the GIL). The graphed
modes call it while they warm up and capture, then replay CUDA graphs from C++ with no Python
and no GIL: so code in your modules that must run every step on the host (printing, counters,
random choices made in Python) runs only during capture there. Python optimizers are
capturable when every param group has ``capturable=True`` (torch.optim.Adam/AdamW) or for
torch.optim.SGD (its float lr is baked into the graph); tandem.optim's always are.

A run folder: ``Trainer(..., out="runs/x", evaluate=fn)`` makes ``fit(epochs=N)`` the training
loop `tandem train` runs — ``fn(model)``'s metrics after every epoch, metrics.jsonl and .csv,
atomic checkpoints, the final weights in model.safetensors — and ``fit(epochs=N, resume=True)``
continues it from its newest checkpoint exactly (the same losses as a run never stopped).
Ctrl-C stops it at the next step with a checkpoint.

Many GPUs: run the script under torchrun (``torchrun --nproc-per-node 8 train.py``), with the
model on ``tandem.distributed.local_device()``, and each process trains as one rank of a
data-parallel job — see tandem.distributed.
"""
import contextlib
import copy
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch

from . import _C, _conv_plans, distributed
from ._checks import rank_shard, whole
from ._compile import _compiled_step, _is_compiled, _prime_dynamo
from ._fit_result import FitResult
from ._modes import _GRAPHED, MODES
from ._state import _captured_state, _set_lr, _tensors_of
from ._trials import _TrialsThatTrain
from .augment import AugmentSpec
from .data import Dataset, TorchDataset
from .optim import _TandemOptimizer


def _device_of(optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    raise ValueError("the optimizer has no parameters: expected the model's trainable ones")


# The run layer's mode_problem ends its messages with what a Python user can do.
_CAPTURABLE_ADVICE = ("create it with capturable=True (torch.optim.Adam, AdamW), or use "
                      "torch.optim.SGD or tandem.optim.SGD/Adam/AdamW")
_LR_ADVICE = ("use tandem.optim.SGD/Adam/AdamW, or give the optimizer lr=torch.tensor(lr, "
              "device='cuda') (with capturable=True)")


def _capturable(optimizer) -> bool:
    if isinstance(optimizer, _TandemOptimizer):
        return True
    if type(optimizer) is torch.optim.SGD:
        return True  # no host-side state but its lr, constant unless you change it
    return all(g.get("capturable", False) for g in optimizer.param_groups)


def _optimizer_name(optimizer) -> str:
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def _stage_name(fn, taken) -> str:
    base = getattr(fn, "__name__", None) or type(fn).__name__
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_").lower()
    base = base or "feed"
    if base in ("lambda", "function"):
        base = "feed"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}{n}", n + 1
    return name


def _check_arguments(model, loss_fn, optimizer, mode, augment, lr_schedule, compile, out,
                     evaluate, checkpoint_every, keep_checkpoints):
    """TypeError / ValueError naming the first of the Trainer's arguments that cannot work."""
    if not callable(model):
        raise TypeError(f"model is a {type(model).__name__}: expected a module or callable")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn is a {type(loss_fn).__name__}: expected a callable "
                        "such as torch.nn.CrossEntropyLoss()")
    if not (isinstance(optimizer, (torch.optim.Optimizer, _TandemOptimizer))
            or (hasattr(optimizer, "step") and hasattr(optimizer, "param_groups"))):
        raise TypeError(f"optimizer is a {type(optimizer).__name__}: expected a "
                        "torch.optim optimizer or a tandem.optim one")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not valid: expected one of {', '.join(MODES)}")
    if augment is not None and not isinstance(augment, AugmentSpec):
        raise TypeError(f"augment is a {type(augment).__name__}: expected a "
                        "tandem.AugmentSpec or None")
    if lr_schedule is not None and not callable(lr_schedule):
        raise TypeError(f"lr_schedule is a {type(lr_schedule).__name__}: expected a "
                        "function of the step (0, 1, ...) returning the learning rate")
    if not isinstance(compile, (bool, dict)):
        raise TypeError(f"compile is a {type(compile).__name__}: expected True, False or a "
                        "dict of torch.compile options")
    if evaluate is not None and not callable(evaluate):
        raise TypeError(f"evaluate is a {type(evaluate).__name__}: expected a function of "
                        "the model returning a dict of metrics")
    if evaluate is not None and out is None:
        raise ValueError("evaluate runs after each epoch of a run folder's training: give "
                         "out='runs/NAME' too")
    if out is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model is a {type(model).__name__}: a run folder saves the model's "
                        "state_dict, expected a torch.nn.Module")
    whole("checkpoint_every", checkpoint_every, 0)
    whole("keep_checkpoints", keep_checkpoints, 1)


def _named_feeds(feed) -> List[Tuple[str, Callable]]:
    """The feed stages as (name, callable): each named by its ``(name, fn)`` pair or after its
    function or class, unique, none of the runner's own stage names."""
    feeds = []
    taken = {"augment", "train", "copy", "load"}
    for item in feed:
        name, fn = item if isinstance(item, tuple) else (None, item)
        if not callable(fn):
            raise TypeError(f"feed item {item!r} is not callable: expected a module, a "
                            "function, or a (name, callable) pair")
        name = name or _stage_name(fn, taken)
        if name in taken:
            raise ValueError(f"feed stage name {name!r} is used twice (or reserved): "
                             "give each stage its own name")
        taken.add(name)
        feeds.append((name, fn))
    return feeds


@contextlib.contextmanager
def _sigterm_stops_the_fit():
    """SIGTERM — what SLURM and Kubernetes send before they kill — stops a fit as Ctrl-C does
    (at the next step; a run folder's fit writes its checkpoint, every rank at the same step),
    then raises SystemExit(143), the exit status of a process SIGTERM ended. Only where SIGTERM
    has Python's default action and on the main thread (where Python runs handlers); a handler
    of your own is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _evaluation(evaluate, model):
    """``evaluate(model)`` as the training loop calls it: the model's modules in eval mode and
    no gradients, each module's own flag put back after; returns (metrics, samples scored)."""
    def run():
        flags = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                result = evaluate(model)
        finally:
            for m, training in flags:
                m.training = training
        metrics, samples = result if isinstance(result, tuple) else (result, 0)
        if not isinstance(metrics, dict) or not metrics:
            raise TypeError(f"evaluate returned {result!r}: expected a dict of metrics, e.g. "
                            "{'accuracy': 0.91}, or (metrics, samples scored)")
        out = {}
        for k, v in metrics.items():
            try:
                out[str(k)] = float(v)
            except (TypeError, ValueError):
                raise TypeError(f"evaluate's metric {k!r} is {v!r}: expected a number") from None
        return out, int(samples)
    return run


class Trainer(_TrialsThatTrain):
    """Trains ``model`` on ``data`` with tandem's runner (see the module's help).

    Args:
        model: the trainable module (any callable of the input).
        loss_fn: ``loss_fn(output, target)``, or ``loss_fn(output)`` when ``target=None``;
            returns one value that requires grad.
        optimizer: a torch.optim optimizer over the model's parameters, or a tandem.optim one.
        data: a tandem.data dataset (ImageFolder, ImageMaskPairs, Idx, Random), read by C++
            workers into pinned memory and copied to the device; your own map-style torch
            Dataset (its __getitem__ called by those workers under the GIL:
            tandem.data.TorchDataset); or a list of batches already on the device, each a tuple
            ``(input, target)`` or a dict of named tensors (step i trains on batch i % len).
        feed: callables (frozen modules, conversions) applied to the input in order, without
            gradients, each a stage of its own; ``(name, fn)`` names one.
        augment: an AugmentSpec applied to the (B, C, H, W) uint8 input first.
        mode: one of MODES; "auto" (default) picks the fastest by short timed trials on CUDA,
            serial on the CPU: a fit (without a run folder, in one process) tries the modes on
            its own first steps, which train as any others (see fit); a run folder's fit,
            choose_mode() and benchmark() time copies of your modules.
        batch_size: samples per step from a dataset.
        input / target: the data's field names (default: its first two).
        workers: loader threads (default, as the CLI's: on CUDA the cores less one, at most 15,
            shared by this machine's ranks; 2 on the CPU).
        shuffle / drop_last / seed: the dataset's order per epoch (PyTorch's DistributedSampler
            order), augmentation's generator.
        skip_bad: leave samples that fail to load out and report them.
        device: default the optimizer's parameters' device.
        cudnn_benchmark: cuDNN's autotuner during the run (default on CUDA: as the CLI); your
            setting is put back afterwards.
        lr_schedule: step -> learning rate, applied before every step (the global step: a
            second fit goes on from the first's last): tandem.optim's set_lr, or every param
            group's lr of a torch.optim optimizer — in the graphed modes on CUDA that lr must be
            a tensor on the device (``lr=torch.tensor(0.1, device="cuda")``, capturable=True),
            which is updated in place.
        compile: False (default); True, or a dict of torch.compile options (e.g. ``{"mode":
            "max-autotune-no-cudagraphs"}``), compiles each feed stage and the model's forward
            with the loss as one region, once, before the run's warm-up; graphed modes then
            capture the compiled kernels into tandem's CUDA graphs. Pass your modules
            uncompiled. Compiled code is traced on the first steps (and on each copy that mode
            auto's trials and benchmark() make).
        out: a run folder (made when missing): fit(epochs=N) then runs the training loop of
            `tandem train` into it — metrics.jsonl and .csv (a row per epoch), checkpoints/
            (atomic; the model's and optimizer's state_dicts, the random generators, the
            epoch's running sums), config.json, and model.safetensors at the end — and
            fit(epochs=N, resume=True) continues it exactly. An existing non-empty folder is
            refused without resume=True: nothing is overwritten. Needs a dataset (not a list
            of batches) with drop_last=True, a torch.nn.Module model, and a mode other than
            graphed_k.
        evaluate: with out, ``evaluate(model)`` after every epoch, in eval mode and without
            gradients (your modules' train/eval flags are put back), on the training's CUDA
            stream: returns a dict of metrics (numbers, e.g.
            ``{"accuracy": 0.91}``), or ``(metrics, samples_scored)`` to report eval img/s.
        checkpoint_every: with out, steps between checkpoints (0: at each epoch's end only).
        keep_checkpoints: with out, how many checkpoints to keep (the newest).
    """

    def __init__(self, model: Callable, loss_fn: Callable, optimizer: Any,
                 data: Union[Dataset, Sequence], *, feed: Sequence = (),
                 augment: Optional[AugmentSpec] = None, mode: str = "auto",
                 batch_size: Optional[int] = None, input: Optional[str] = None,
                 target: Union[str, None, type(...)] = ..., workers: Optional[int] = None,
                 shuffle: bool = True, drop_last: bool = True, seed: int = 0,
                 skip_bad: bool = False, device: Union[str, torch.device, None] = None,
                 cudnn_benchmark: Optional[bool] = None,
                 lr_schedule: Optional[Callable[[int], float]] = None,
                 compile: Union[bool, dict] = False, out: Union[str, os.PathLike, None] = None,
                 evaluate: Optional[Callable] = None, checkpoint_every: int = 0,
                 keep_checkpoints: int = 3):
        _check_arguments(model, loss_fn, optimizer, mode, augment, lr_schedule, compile, out,
                         evaluate, checkpoint_every, keep_checkpoints)
        self.out = None if out is None else os.fspath(out)
        self.evaluate = evaluate
        self.checkpoint_every, self.keep_checkpoints = int(checkpoint_every), int(keep_checkpoints)
        self._compile = ({} if compile is True else dict(compile)) if compile else None
        self._compiled = None  # the compiled step of the user's own modules, made once
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.lr_schedule = lr_schedule
        self.device = torch.device(device) if device is not None else _device_of(optimizer)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.augment, self.mode, self.seed = augment, mode, whole("seed", seed, 0)
        self.name = getattr(model, "__name__", None) or type(model).__name__  # in reports
        self.shuffle, self.drop_last, self.skip_bad = shuffle, drop_last, skip_bad
        # None: the run layer's default (on with CUDA), resolved with the rest of the request.
        self.cudnn_benchmark = None if cudnn_benchmark is None else bool(cudnn_benchmark)
        # Under torchrun: this process is one rank (tandem.distributed); data parallel.
        self.rank, self.world_size = distributed.rank(), distributed.world_size()
        if self.world_size > 1:
            distributed._check_device(self.device)
        self.workers = (whole("workers", workers, 1) if workers is not None
                        else _C.default_loader_workers(str(self.device)))

        self._feeds = _named_feeds(feed)

        self._data, fields = self._read_data(data, batch_size)
        if self.out is not None and not isinstance(self._data, _C.Dataset):
            raise ValueError("a run folder (out=) trains epochs over a dataset: expected a "
                             "tandem.data dataset or a map-style torch Dataset, not a list of "
                             "batches")
        if self.out is not None and not drop_last:
            raise ValueError("a run folder (out=) trains whole batches: expected "
                             "drop_last=True")
        self.input = input or fields[0]
        if self.input not in fields:
            raise ValueError(f"input {self.input!r} is not a field of the data: its fields are "
                             f"{', '.join(fields)}")
        if target is ...:
            rest = [f for f in fields if f != self.input]
            target = rest[0] if rest else None
        if target is not None and target not in fields:
            raise ValueError(f"target {target!r} is not a field of the data: its fields are "
                             f"{', '.join(fields)}")
        self.target = target
        self._trials: Optional[dict] = None
        # The training loops kept between fits (see fit), by mode: (session, what it was built
        # from and, in a graphed mode, what its graphs were captured against, as of the last
        # fit's end). One mode's once auto has decided; each tried one's while its trials run.
        self._sessions = {}
        # Mode auto's trials on the fits' own steps while they go on (_fit_trying_modes).
        self._trying: Optional[dict] = None
        self._trials_train_on_cpu = False  # tests: the trials' machinery on the CPU
        # Fits continue each other: the data order, the augmentation's draws and lr_schedule's
        # step go on from where the last completed fit stopped.
        self.steps_done = 0
        self._augment_generator = None
        if augment is not None:  # each rank draws its own, as the CLI's workloads do
            self._augment_generator = torch.Generator(self.device).manual_seed(
                _C.data_seed(self.seed, self.rank))

    # ---- data ----
    def _read_data(self, data, batch_size):
        if batch_size is not None:
            batch_size = whole("batch_size", batch_size, 1)
        if isinstance(data, _C.Dataset):  # tandem.data's classes derive from it
            if batch_size is None:
                raise ValueError("batch_size None is not valid for a dataset: expected the "
                                 "samples per step, >= 1")
            # A rank's shard (DistributedSampler's): every world_size-th sample.
            shard = rank_shard(len(data), self.world_size, batch_size, self.drop_last)
            self.batch_size = int(batch_size)
            self.steps_per_epoch = (shard // batch_size if self.drop_last
                                    else math.ceil(shard / batch_size))
            return data, list(data.fields)
        if isinstance(data, torch.utils.data.IterableDataset):
            raise TypeError("data is a torch IterableDataset: expected a map-style dataset "
                            "(len and indexing), a tandem.data dataset, or a list of batches "
                            "on the device, e.g. [(x.cuda(), y.cuda()) for x, y in loader]")
        if isinstance(data, torch.utils.data.Dataset):  # your own: read through the GIL
            return self._read_data(TorchDataset(data), batch_size)
        if not isinstance(data, (list, tuple)) or not data:
            what = "an empty list" if isinstance(data, (list, tuple)) else \
                f"a {type(data).__name__}"
            raise TypeError(f"data is {what}: expected a tandem.data dataset, a map-style "
                            "torch Dataset (len and indexing), or a non-empty list of batches "
                            "on the device")
        batches = []
        for i, b in enumerate(data):
            if isinstance(b, dict):
                named = dict(b)
            elif isinstance(b, (tuple, list)) and len(b) in (1, 2):
                named = dict(zip(("input", "target"), b))
            else:
                raise TypeError(f"batch {i} is a {type(b).__name__}: expected (input, target), "
                                "(input,) or a dict of tensors")
            for k, t in named.items():
                if not isinstance(t, torch.Tensor):
                    # A list of samples such as torchvision's (image, label) is the likely
                    # mistake: a list is read as batches already made.
                    hint = ("; a list is read as batches already made: a list of samples "
                            "such as (image, label) goes in a torch Dataset, with batch_size"
                            if isinstance(t, (int, float)) else "")
                    raise TypeError(f"batch {i} field {k!r} is a {type(t).__name__}: "
                                    f"expected a torch.Tensor{hint}")
                if t.device != self.device:
                    raise ValueError(f"batch {i} field {k!r} is on {t.device}: expected "
                                     f"{self.device} (list batches must already be there)")
            if batches and named.keys() != batches[0].keys():
                raise ValueError(f"batch {i} has fields {sorted(named)}, batch 0 "
                                 f"{sorted(batches[0])}: expected the same in every batch")
            batches.append(named)
        first = next(iter(batches[0].values()))
        self.batch_size = first.shape[0] if first.dim() > 0 else 1
        if batch_size is not None and batch_size != self.batch_size:
            raise ValueError(f"batch_size {batch_size} differs from the batches' own size "
                             f"{self.batch_size}: leave it out for a list of batches")
        self.steps_per_epoch = len(batches)
        return batches, list(batches[0].keys())

    # ---- runs ----
    def _instance(self, copies: bool):
        feeds, model, loss_fn, opt = self._feeds, self.model, self.loss_fn, self.optimizer
        if copies:
            names = [n for n, _ in feeds]
            fns, model, loss_fn, opt = copy.deepcopy(([f for _, f in feeds], model, loss_fn,
                                                      opt))
            feeds = list(zip(names, fns))
        if self._compile is not None:
            if copies:  # a copy's compiled code is its own
                feeds, model, loss_fn = _compiled_step(feeds, model, loss_fn, self._compile)
            else:  # successive fits replay what the first compiled
                if self._compiled is None:
                    self._compiled = _compiled_step(feeds, model, loss_fn, self._compile)
                feeds, model, loss_fn = self._compiled
        impl = opt._impl if isinstance(opt, _TandemOptimizer) else opt
        return (feeds, model, loss_fn, impl, _capturable(opt), _optimizer_name(opt),
                self._lr_setter(opt))

    def _lr_setter(self, opt):
        """step -> None, setting lr_schedule(step) on `opt` (called on the train lane)."""
        schedule = self.lr_schedule
        if schedule is None:
            return None
        if isinstance(opt, _TandemOptimizer):
            return lambda step: opt.set_lr(float(schedule(step)))  # enqueued on the lane
        return lambda step: _set_lr(opt, float(schedule(step)))  # on the lane, before the step

    def _config(self, mode, steps, warmup, copies, progress=False, trace=None,
                gpu_monitor=True, data_parallel=False, ruled_out=None) -> "_C.RunConfig":
        """The run's typed config: this trainer's objects and data, and the run layer's
        request (what it leaves unset, the run layer's resolve() fills)."""
        if self._compile is not None or any(
                _is_compiled(f) for f in (self.model, self.loss_fn, *(f for _, f in self._feeds))):
            _prime_dynamo()  # on this thread, before the run's lane threads compile
        c = _C.RunConfig()
        c.name, c.instance, c.copy, c.data = self.name, self._instance, copies, self._data
        c.input, c.target = self.input, self.target
        c.augment = None if self.augment is None else dataclasses.asdict(self.augment)
        c.augment_generator = None if copies else self._augment_generator
        c.shuffle, c.drop_last = self.shuffle, self.drop_last
        c.lr_schedule, c.data_parallel = self.lr_schedule is not None, data_parallel
        r = c.request
        r.device, r.mode, r.batch_size = str(self.device), mode, self.batch_size
        r.steps, r.warmup, r.workers = int(steps), int(warmup), self.workers
        r.seed, r.skip_bad = self.seed, self.skip_bad
        r.first_step = 0 if copies else self.steps_done
        r.trace_path = "" if trace is None else os.fspath(trace)
        r.progress, r.cudnn_benchmark, r.gpu_monitor = progress, self.cudnn_benchmark, gpu_monitor
        r.ruled_out = dict(ruled_out or {})
        r.stages_to_overlap = self._stages_to_overlap()
        return c

    def _stages_to_overlap(self) -> bool:
        """Whether the step has stages a pipeline overlaps: a feed, or a dataset whose samples
        are loaded (and augmented) on the host. Batches already on the device are one stage."""
        return bool(self._feeds) or not isinstance(self._data, list)

    def _mode_problem(self, mode) -> Optional[str]:
        """Why `mode` cannot run this trainer's optimizer and schedule, or None: the run
        layer's rule (_C.mode_problem), given what only Python can tell of the optimizer."""
        on_host = (self.lr_schedule is not None and not isinstance(self.optimizer, _TandemOptimizer)
                   and not all(isinstance(g["lr"], torch.Tensor)
                               for g in self.optimizer.param_groups))
        return _C.mode_problem(
            mode, run_folder=self.out is not None, cuda=self.device.type == "cuda",
            capturable=_capturable(self.optimizer), lr_schedule_on_host=on_host,
            optimizer=_optimizer_name(self.optimizer), capturable_advice=_CAPTURABLE_ADVICE,
            lr_advice=_LR_ADVICE) or None

    def _check_mode(self, mode):
        problem = self._mode_problem(mode)
        if problem:
            raise ValueError(problem)

    def choose_mode(self, steps: int = 300) -> str:
        """Mode auto's choice, made once and kept: on the CPU, serial (no streams or graphs to
        gain from); on CUDA, short timed trials on deep copies of your modules and optimizer
        (yours are untouched) of the modes whose trial could change the pick (see fit) — the
        fastest, unless a simpler mode is within the trials' noise of it (the spread of each
        mode's two runs, 0.5% to 1.5%). ``trials`` holds every mode's rate, or why it was not
        timed, and the reason. A fit that finds the mode undecided decides it on its
        own steps instead (no copies: see fit)."""
        if self.mode != "auto":
            return self.mode
        self._kept_decision()
        if self._trials is None:
            if self.device.type != "cuda":  # the run layer's rule: nothing to time there
                self._trials = dict(**_C.mode_by_device(str(self.device)), trials=[],
                                    seconds=0.0)
            else:
                watched = _tensors_of([self.model, *[f for _, f in self._feeds]])
                versions = [t._version for t in watched]
                # The run layer's mode auto: the modes this optimizer and schedule cannot take
                # are not tried (their reason is their trial's error); under a launch each rank
                # times the modes alone, then every rank takes rank 0's pick.
                ruled_out = {m: p for m in MODES[1:] if (p := self._mode_problem(m))}
                with self._tuned_convolutions():
                    self._trials = _C.trials(self._config(
                        "serial", steps, 5, copies=True, gpu_monitor=False,
                        data_parallel=self._joined(), ruled_out=ruled_out))
                if [t._version for t in watched] != versions:
                    raise RuntimeError(
                        "mode auto's trials changed your modules' tensors: a model or feed "
                        "reaches modules that deepcopy does not copy (a closure?). Pass an "
                        "explicit mode instead of 'auto'")
                self._keep_decision(self._decision_key())
        return self._trials["mode"]

    def _joined(self) -> bool:
        """Under torchrun: joins the job (once per process); False for one process."""
        return self.world_size > 1 and distributed._join(self.device) is not None

    @property
    def trials(self) -> Optional[dict]:
        return self._trials

    def _steps_for(self, steps, epochs) -> int:
        if (steps is None) == (epochs is None):
            raise ValueError("give steps or epochs (one of them)")
        if epochs is not None:
            return whole("epochs", epochs, 1) * self.steps_per_epoch
        return whole("steps", steps, 1)

    def _result(self, report: dict, mode: str, trials_s: Optional[float] = None) -> FitResult:
        setup = report.pop("setup", None)
        return FitResult(losses=list(report.pop("losses")), mode=mode, steps=report["steps"],
                         seconds=report["seconds"], steps_per_s=report["steps_per_s"],
                         samples_per_s=report["samples_per_s"], table=report.pop("table"),
                         report=report, trials=self._trials,
                         setup=None if setup is None else dict(trials_s=trials_s, **setup))

    def _timed_mode(self, steps: int) -> Tuple[str, float]:
        """choose_mode(steps) and the seconds it took here (its trials; ~0 once decided)."""
        started = time.perf_counter()
        mode = self.choose_mode(steps)
        return mode, time.perf_counter() - started

    def fit(self, steps: Optional[int] = None, epochs: Optional[int] = None, *,
            resume: bool = False, progress: bool = True,
            trace: Optional[str] = None) -> FitResult:
        """Trains your modules for ``steps`` steps or ``epochs`` passes over the data and
        returns every step's loss and the run's report. A fit continues the last one: the data
        order, the augmentation's random draws and lr_schedule's step go on from
        ``steps_done``, so two fits of 5 steps train as one of 10. ``progress``: a progress line
        on a terminal's stderr. ``trace``: write a Chrome-trace timeline (chrome://tracing,
        Perfetto) of the run to this file. Ctrl-C stops the run at its next step and raises
        KeyboardInterrupt (SIGTERM: SystemExit(143)); an exception in your code stops every
        stage and is raised here with its traceback; a NaN or infinite loss raises a
        RuntimeError naming its step. Every fit runs the training loop of `tandem train`.

        Mode auto, not yet decided: the fit's first steps are the trials. The modes the
        optimizer and schedule allow whose trial could change the pick (the run layer's rule:
        pipelined+graphed first, graphed beside it only on a step under 1 ms (on longer ones it ran within the noise of graphed or faster, its stages overlapped); serial and pipelined only where their graphed counterparts fail (a replayed graph runs the same kernels without host launches), no pipelined mode for batches already on the device without a feed (one stage: nothing to overlap), graphed_k only beside a graphed step under 1 ms) each train a few steps to warm up (cuDNN's tuning, a graphed
        mode's capture), then two timed windows of about 0.3 s (one, when the first ran 10%
        below the fastest or no other mode is left to time), on your modules — the fit's own steps, computing the plain loop's
        losses as every mode does; the simplest mode within the windows' noise of the fastest
        is picked, and the rest of the fit and every later one train in it, on the graphs its
        trial captured. A fit too short for every
        trial leaves the rest to the next fit. A mode that fails its trial is rolled back to
        where its trial began (weights, optimizer state, random generators) and left out;
        ``trials`` says why. ``result.report["parts"]`` lists the fit's runs. The decision is
        kept under the user's cache folder, keyed by the job (modules' structure, data shapes,
        batch size, GPU, versions): a later process of the same job starts in the picked mode
        without trials (``TANDEM_MODE_CACHE=off`` turns it off; a folder there moves it; a
        kept file that cannot be trusted is ignored with a warning).

        A fit keeps what it built for the next: the training loop's threads (with what they
        autotuned), and in the graphed modes the CUDA graphs it captured, so a later fit
        replays from its first step. They are kept while nothing they were built from changed
        since the last fit ended: the model, loss_fn, optimizer, feed and data objects and the
        Trainer's settings, and for the graphs each parameter's, buffer's and optimizer-state
        tensor (changes made in place, as ``model.load_state_dict`` makes them, are read;
        a replaced tensor — ``optimizer.load_state_dict``, a new Parameter — is not), the
        modules' train/eval flags and requires_grad, and the optimizer's hyper-parameters
        (a float lr is part of the graph). A change of any of these makes the next fit build
        and capture anew; other Python state your modules read in a graphed mode was frozen
        at capture: call ``reset()`` after changing it. A fit that fails keeps nothing.

        On CUDA without ``compile=``, the fit's ``torch.nn.Conv2d`` modules run on cuDNN plans
        timed once a shape for the process (all its threads) and kept beside the mode
        decisions for the next process, which rebuilds them untimed; their class is put back
        when the fit returns. ``result.setup["conv_plans"]`` counts them;
        ``TANDEM_TUNED_CONV=0`` in the environment leaves the convolutions to LibTorch.

        With a run folder (``out``): ``epochs`` is the run's length, ``resume=True`` continues
        the folder's run from its newest checkpoint (or starts it when it has none; a worker
        torchrun restarted does so without it), Ctrl-C writes a checkpoint before
        KeyboardInterrupt is raised (SIGTERM: SystemExit(143)), and the result holds every
        epoch's record (``result.epochs``) and the weights' file; ``progress`` also prints
        each epoch's line."""
        if not hasattr(_C, "train"):
            raise RuntimeError("this tandem was built without its training loop (its data "
                               "layer's libpng or zlib was missing where it was built): fit "
                               "cannot run; install libpng and zlib's development files and "
                               "build it again")
        with _sigterm_stops_the_fit(), self._tuned_convolutions() as plans:
            result = self._fit(steps, epochs, resume, progress, trace)
        if result.setup is not None:
            result.setup["conv_plans"] = plans
        return result

    def _tuned_convolutions(self):
        """The fit's torch.nn.Conv2d modules on cuDNN plans timed once and kept across
        processes (tandem/_conv_plans.py), where that applies."""
        return _conv_plans.in_use(
            [self.model, self.loss_fn, *(f for _, f in self._feeds)],
            _conv_plans.applies(self.device, self._compile is not None, self.cudnn_benchmark),
            self.device)

    def _fit(self, steps, epochs, resume, progress, trace) -> FitResult:
        if self.out is not None:
            return self._fit_run_folder(steps, epochs, resume, progress, trace)
        if resume:
            raise ValueError("resume=True continues a run folder's run: give the Trainer "
                             "out='runs/NAME'")
        n = self._steps_for(steps, epochs)
        self._kept_decision()
        if self._trials_train():
            return self._fit_trying_modes(n, progress, trace)
        mode, trials_s = self._timed_mode(min(n, 300))
        report = self._fit_part(mode, n, progress, trace)
        return self._result(report, mode, trials_s)

    def _fit_part(self, mode, n, progress, trace) -> dict:
        """n steps from steps_done in `mode` on its kept training loop; the loop's report."""
        self._check_mode(mode)
        config = self._config(mode, n, 0, copies=False, progress=progress, trace=trace,
                              data_parallel=self._joined())
        # The training loop's run without a folder: n steps back to back from steps_done.
        loop = self._loop_config(steps=n, epochs=0, out=None, resume=False, evaluate=None)
        config.lr_schedule = False  # the loop sets it: schedule(step), then the optimizer's
        session = self._kept_session(mode)
        try:
            report = session.fit(config, loop)
        except BaseException:
            self._sessions.pop(mode, None)  # a fit that failed keeps nothing
            raise
        self.steps_done += n
        # As this fit leaves the modules and optimizer: the next fit compares against it.
        self._sessions[mode] = (session, self._key_of(mode))
        return report


    def _key_of(self, mode) -> list:
        """What the kept training loop was built from: the objects, the settings, and in a
        graphed mode on CUDA what its graphs were captured against (_captured_state)."""
        key = [mode, id(self.model), id(self.loss_fn), id(self.optimizer),
               [id(f) for _, f in self._feeds], id(self._data), self.batch_size, self.workers,
               self.seed, self.skip_bad, str(self.device), self.augment, self.input,
               self.target, self.shuffle, self.drop_last, self.cudnn_benchmark,
               self.lr_schedule is None, self._compile, self.world_size]
        if mode in _GRAPHED and self.device.type == "cuda":
            key.append(_captured_state([self.model, self.loss_fn, *(f for _, f in self._feeds)],
                                       self.optimizer))
        return key

    def _kept_session(self, mode):
        """The training loop `mode` last ran on if nothing it was built from changed since that
        fit ended, else a new one (the old one's graphs and memory let go first)."""
        kept = self._sessions.pop(mode, None)
        if kept is not None and kept[1] == self._key_of(mode):
            self._sessions[mode] = kept
            return kept[0]
        session = _C.FitSession()
        self._sessions[mode] = (session, None)
        return session

    def reset(self):
        """Lets go of what fits keep (the training loops' CUDA graphs and memory): the next fit
        builds and captures anew. Mode auto's decision is kept. Call it after changing Python
        state your modules read that a captured graph froze (see fit)."""
        self._sessions.clear()

    def _loop_config(self, steps, epochs, out, resume, evaluate) -> "_C.LoopConfig":
        """What the training loop (_C.train) takes beyond the run's config."""
        loop = _C.LoopConfig()
        loop.model, loop.evaluate, loop.lr_schedule = self.model, evaluate, self.lr_schedule
        loop.config = self._run_config() if out is not None else "{}"
        loop.steps, loop.epochs, loop.out, loop.resume = int(steps), int(epochs), out, bool(resume)
        loop.checkpoint_every, loop.keep_checkpoints = self.checkpoint_every, self.keep_checkpoints
        return loop

    def _run_config(self) -> str:
        """What must match for a resume (the C++ loop adds batch size, epochs, seed and the
        ranks), as JSON: the model, optimizer, data (a folder by its content), stages."""
        data = getattr(self._data, "source", None) or type(self._data).__name__
        spec = dataclasses.asdict(self.augment) if self.augment is not None else None
        return json.dumps(dict(
            model=self.name, optimizer=_optimizer_name(self.optimizer), data=data,
            samples=len(self._data), input=self.input, target=self.target,
            feeds=[n for n, _ in self._feeds], augment=spec, shuffle=self.shuffle,
            compile=self._compile, lr_schedule=self.lr_schedule is not None))

    def _fit_run_folder(self, steps, epochs, resume, progress, trace) -> FitResult:
        if steps is not None or epochs is None:
            raise ValueError("a run folder's fit is counted in epochs: give fit(epochs=N) "
                             "(the run's whole length; resume=True continues it)")
        n = self._steps_for(None, epochs)
        if trace is not None:
            raise ValueError("trace= times a run without a run folder: use fit(steps=...) on a "
                             "Trainer without out, or benchmark(trace=...)")
        self._joined()  # under torchrun: the job's own count of its attempts
        if distributed.restarted() and not resume:
            # A worker torchrun restarted continues the run its folder holds, as resume=True:
            # the same run's checkpoints (or none yet); another run's is refused.
            resume = True
            if self.rank == 0:
                print(f"restarted by torchrun: continuing the run in {self.out}, as "
                      "resume=True", file=sys.stderr, flush=True)
        mode, trials_s = self._timed_mode(min(n, 300))
        self._check_mode(mode)
        config = self._config(mode, n, 0, copies=False,
                              progress=progress, data_parallel=self._joined())
        evaluate = None
        if self.evaluate is not None:
            evaluate = _evaluation(self.evaluate, self.model)
        loop = self._loop_config(steps=0, epochs=epochs, out=self.out, resume=resume,
                                 evaluate=evaluate)
        config.lr_schedule = False  # the loop sets it: schedule(step), then the optimizer's
        self.reset()  # a run folder's fit is a loop of its own: the kept ones' memory goes first
        report = _C.train(config, loop)
        self.steps_done = report["steps"]
        start = max(report["resumed_from"], 0)
        ran = [e for e in report["epochs"] if e["step"] > start]
        seconds = sum(e["train_seconds"] for e in ran)
        rate = report.pop("images_per_s")
        setup = dict(trials_s=trials_s, **report.pop("setup"))
        return FitResult(losses=list(report.pop("losses")), mode=mode,
                         steps=report["steps"] - start, seconds=seconds,
                         steps_per_s=rate / self.batch_size / self.world_size,
                         samples_per_s=rate, table=report.pop("table"), report=report,
                         trials=self._trials, epochs=report["epochs"],
                         weights=report["weights"] or None,
                         checkpoint=report["last_checkpoint"] or None, setup=setup)

    def benchmark(self, steps: int = 100, warmup: int = 10, mode: Optional[str] = None,
                  trace: Optional[str] = None) -> FitResult:
        """Times ``steps`` steps after ``warmup`` untimed ones, as ``tandem bench`` does, on
        deep copies of your modules and optimizer (yours are not trained)."""
        steps, warmup = whole("steps", steps, 1), whole("warmup", warmup, 0)
        mode = mode or self.choose_mode(steps)
        if mode not in MODES or mode == "auto":
            raise ValueError(f"mode {mode!r} is not valid: expected one of {', '.join(MODES[1:])}")
        self._check_mode(mode)
        with self._tuned_convolutions():
            report = _C.run(self._config(mode, steps, warmup, copies=True, progress=False,
                                         trace=trace, data_parallel=self._joined()))
        return self._result(report, mode)
