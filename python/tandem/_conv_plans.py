"""The Trainer's convolutions on cuDNN plans timed once and kept (tandem._C.tuned_conv2d); on by
default, ``TANDEM_TUNED_CONV=0`` turns it off (LibTorch's convolutions and cudnn.benchmark).

PyTorch's cudnn.benchmark times each convolution shape's cuDNN candidates on the thread that runs
it, keeps the pick for that thread alone and forgets it with the process: a training step's
first call pays seconds of timing in every process and again on every thread a mode runs its
stages on. While a fit runs, the Trainer's ``torch.nn.Conv2d`` modules (exactly that class:
subclasses keep their own forward) run ``tuned_conv2d``: the same values, gradients and autocast,
each shape's plans timed once for the process and written to a plans file beside mode auto's
decisions, from which a later process rebuilds them without timing — before the fit's first
step, on several threads, the plans the file notes as used by the same convolutions (``job_of``;
``TANDEM_CONV_PREBUILD=0``: each where first used instead). Their class is restored when the fit
returns.

Where it applies: CUDA, cuDNN's benchmark mode on (the Trainer's default), no ``compile=``
(torch.compile chooses its own kernels), half or bfloat16 operands after autocast, grouped and
depthwise convolutions too (``TANDEM_TUNED_CONV_GROUPS=0`` leaves those to LibTorch: their
fastest cuDNN engines compile their kernels at run time, which a first fit pays once and the
plans file keeps with the compiled code, so a later process restores them instead of compiling:
docs/notes/wall-clock.md); everything else is ``F.conv2d``. ``TANDEM_MODE_CACHE=off`` keeps
nothing across processes (the plans are still shared by the process's threads); a plans file
that cannot be trusted is ignored with a warning.
"""
import contextlib
import hashlib
import os
import threading
import warnings
from typing import Iterable, Optional

import torch

from . import _C, _env, _mode_cache

FILE_NAME = "cudnn-plans.json"


class TunedConv2d(torch.nn.Conv2d):
    """A torch.nn.Conv2d whose convolution runs tandem._C.tuned_conv2d (see the module's
    docstring); the same parameters, state_dict and repr."""

    # What it stands for where a module's structure is described (mode auto's kept decisions).
    stands_for = torch.nn.Conv2d
    # Whether grouped convolutions take the plans too: read from the environment as a fit
    # swaps the modules in (in_use), not at every call.
    grouped = False

    def _conv_forward(self, input, weight, bias):
        if (self.padding_mode == "zeros" and not isinstance(self.padding, str)
                and input.is_cuda and input.dim() == 4 and (self.groups == 1 or self.grouped)):
            return _C.tuned_conv2d(input, weight, bias, self.stride, self.padding,
                                   self.dilation, self.groups)
        return super()._conv_forward(input, weight, bias)


_lock = threading.Lock()
_loaded = set()  # the plans files read in this process


def plans_path() -> Optional[str]:
    """The plans file, or None where the cache is off."""
    folder = _mode_cache.folder()
    return None if folder is None else os.path.join(folder, FILE_NAME)


def _load_once(path: str):
    with _lock:
        if path in _loaded:
            return
        _loaded.add(path)
    _, note = _C.load_conv_plans(path)
    if note:
        warnings.warn(f"tandem: the convolution plans file was not used: {note}", stacklevel=3)


def _save(path: str):
    try:
        _C.save_conv_plans(path)
    except RuntimeError as e:
        warnings.warn(f"tandem: the convolution plans could not be kept: {e}", stacklevel=3)


def applies(device: torch.device, compiled: bool, cudnn_benchmark: Optional[bool]) -> bool:
    return (device.type == "cuda" and not compiled and cudnn_benchmark is not False
            and hasattr(_C, "tuned_conv2d") and _env.switch("TANDEM_TUNED_CONV", True))


_depth = threading.local()


def job_of(convolutions) -> str:
    """What decides which plans a fit's convolutions meet, beside the batches' shapes (which the
    plans' keys carry): each convolution's channels, kernel, stride, padding, dilation, groups
    and bias, in order, as a short digest."""
    parts = [f"{m.in_channels},{m.out_channels},{m.kernel_size},{m.stride},{m.padding},"
             f"{m.dilation},{m.groups},{m.bias is not None}" for m in convolutions]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]


def _threads() -> int:
    """The threads a prebuild takes: ``TANDEM_CONV_PREBUILD_THREADS`` where set, else the cores
    this process may run on, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return _env.count("TANDEM_CONV_PREBUILD_THREADS", max(1, min(8, cores)), high=64)


@contextlib.contextmanager
def in_use(modules: Iterable, on: bool, device: Optional[torch.device] = None):
    """While the block runs, the plain torch.nn.Conv2d modules under `modules` are TunedConv2d
    (when `on`); the plans file is read first (once a process), the plans it notes as these
    convolutions' (job_of) built on several threads before the block on `device`'s GPU, unless
    ``TANDEM_CONV_PREBUILD=0`` (else each where first used), and the file is written after where
    the block timed new plans or used kept ones for another job. Yields a dict that holds, after
    the block, what the plans cost in it."""
    summary = {}
    if not on or getattr(_depth, "n", 0) > 0:  # nested: the outer block swaps and saves
        yield summary
        return
    path = plans_path()
    if path is not None:
        _load_once(path)
    TunedConv2d.grouped = _env.switch("TANDEM_TUNED_CONV_GROUPS", True)
    swapped = []
    seen = set()
    for root in modules:
        if not isinstance(root, torch.nn.Module):
            continue
        for m in root.modules():
            if type(m) is torch.nn.Conv2d and id(m) not in seen:
                seen.add(id(m))
                m.__class__ = TunedConv2d
                swapped.append(m)
    before = _C.conv_plans_summary()
    job = job_of(swapped) if path is not None and swapped else ""
    _C.set_conv_plans_job(job)
    if (job and device is not None and device.type == "cuda"
            and _env.switch("TANDEM_CONV_PREBUILD", True)):
        with torch.cuda.device(device):
            _C.prebuild_conv_plans(job, _threads())
    _depth.n = 1
    try:
        yield summary
    finally:
        _depth.n = 0
        _C.set_conv_plans_job("")
        for m in swapped:
            m.__class__ = torch.nn.Conv2d
        after = _C.conv_plans_summary()
        summary.update({k: after[k] - before[k] for k in after})
        summary["convolutions"] = len(swapped)
        if path is not None and _C.conv_plans_unsaved():
            _save(path)
