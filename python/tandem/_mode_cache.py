"""Mode auto's decisions kept across processes: a small JSON file per job under the user's cache
folder, so a second process training the same job starts in the mode the first one's trials
picked, without trials.

A job is keyed by what decides the pick — the modules' structure (module types, parameter and
buffer shapes, dtypes, requires_grad, train/eval flags), the feed functions, the loss and the
optimizer's kind, the data's fields and shapes, batch size, workers, augmentation, compile
options, the GPU's name and the versions of torch and tandem — never by object identities or
weight values. A file that does not parse, or holds another job's key, or a mode this job cannot
run, is ignored with a warning naming it, and the trials run (and write it again).

    TANDEM_MODE_CACHE   unset: ~/.cache/tandem/modes (XDG_CACHE_HOME respected); "off" (or 0):
                        no cache; anything else: that folder
"""
import hashlib
import json
import os
import tempfile
import time
import warnings
from typing import Optional

import torch

from . import _env

VERSION = 1  # of the files' layout


def folder() -> Optional[str]:
    """Where decisions are kept, or None when the cache is off."""
    value = os.environ.get("TANDEM_MODE_CACHE", "")
    if value.lower() in _env.OFF:
        return None
    if value:
        return value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tandem", "modes")


def _class_name(m) -> str:
    """A module's class as the user made it (not the stand-in a fit swaps in for a while)."""
    cls = getattr(type(m), "stands_for", type(m))
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe_callable(fn):
    """A callable's identity across processes: a module's structure, a function's name and
    code."""
    if isinstance(fn, torch.nn.Module):
        return dict(
            modules=[_class_name(m) for m in fn.modules()],
            training=[m.training for m in fn.modules()],
            params=[(n, list(p.shape), str(p.dtype), p.requires_grad)
                    for n, p in fn.named_parameters()],
            buffers=[(n, list(b.shape), str(b.dtype)) for n, b in fn.named_buffers()])
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return dict(callable=f"{getattr(fn, '__module__', '')}.{name}",
                code=hashlib.sha256(code.co_code).hexdigest() if code is not None else None)


def _describe_data(data):
    if isinstance(data, list):  # resident batches: the first one's fields
        return dict(batches=len(data), fields=[(k, list(t.shape), str(t.dtype))
                                               for k, t in data[0].items()])
    return dict(dataset=type(data).__name__, samples=len(data), fields=list(data.fields))


def job_key(trainer, candidates) -> str:
    """The hash of everything that decides mode auto's pick for `trainer` (see the module)."""
    opt = trainer.optimizer
    groups = getattr(opt, "param_groups", [])
    device = trainer.device
    description = dict(
        layout=VERSION, torch=torch.__version__,
        tandem=__import__("tandem").__version__,
        gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        model=_describe_callable(trainer.model), loss=_describe_callable(trainer.loss_fn),
        feeds=[(name, _describe_callable(f)) for name, f in trainer._feeds],
        optimizer=f"{type(opt).__module__}.{type(opt).__qualname__}",
        optimizer_options=sorted(k for g in groups for k in g if k != "params"),
        data=_describe_data(trainer._data), input=trainer.input, target=trainer.target,
        batch_size=trainer.batch_size, workers=trainer.workers,
        augment=None if trainer.augment is None else repr(trainer.augment),
        compile=trainer._compile, lr_schedule=trainer.lr_schedule is not None,
        cudnn_benchmark=trainer.cudnn_benchmark, candidates=list(candidates))
    text = json.dumps(description, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> Optional[str]:
    where = folder()
    return None if where is None else os.path.join(where, key[:32] + ".json")


def load(key: str, candidates) -> Optional[dict]:
    """The decision kept for `key`, or None: none kept, the cache off, or a file that cannot be
    trusted (a warning names it and why)."""
    path = _path(key)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            entry = json.load(f)
        if not isinstance(entry, dict) or entry.get("key") != key:
            raise ValueError("it holds another job's decision")
        decision = entry["decision"]
        if decision["mode"] not in candidates:
            raise ValueError(f"its mode {decision['mode']!r} is not one this job can run")
        if not isinstance(decision.get("trials"), list) or not isinstance(decision["reason"], str):
            raise ValueError("its trials or reason are missing")
    except (OSError, ValueError, KeyError, TypeError) as e:
        warnings.warn(f"tandem: ignoring the kept mode decision {path} ({e}); mode auto tries "
                      "the modes again", stacklevel=4)
        return None
    return dict(decision, reason=f"{decision['reason']} (kept from an earlier process: {path})",
                seconds=0.0, cached=path)


def save(key: str, decision: dict) -> None:
    """Keeps `decision` for `key` (written whole: a reader never sees half a file). A folder
    that cannot be written is passed over with a warning: the run goes on."""
    path = _path(key)
    if path is None:
        return
    entry = dict(key=key, written=time.strftime("%Y-%m-%dT%H:%M:%S"),
                 decision={k: v for k, v in decision.items() if k not in ("cached", "seconds")})
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1, default=str)
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"tandem: could not keep the mode decision in {path} ({e})", stacklevel=4)
