"""Many GPUs from Python: run your script under torchrun, and tandem.Trainer trains as one rank.

    # torchrun --nproc-per-node 8 train.py
    import torch, tandem
    device = tandem.distributed.local_device()         # cuda:LOCAL_RANK (the CPU without GPUs)
    model = Net().to(device)
    trainer = tandem.Trainer(model=model, loss_fn=torch.nn.CrossEntropyLoss(),
                             optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                             data=tandem.data.ImageFolder("train/", ...), batch_size=128)
    result = trainer.fit(epochs=10)                    # batch_size is per rank
    if tandem.distributed.rank() == 0:
        torch.save(model.state_dict(), "model.pt")     # the same weights on every rank

What a fit does on each rank, in every mode: the job is joined once (NCCL between GPUs, tandem's
store collectives on the CPU); rank 0's trainable weights are copied to every rank; a dataset is
sharded per rank as PyTorch's DistributedSampler does (the order reshuffled per epoch from the
seed); the gradients are averaged over the ranks during backward, in buckets on a communication
lane that overlaps the backward (inside the train step's CUDA graph in the graphed modes); the
FitResult's losses are the mean over the ranks (the global batch's loss), and
``result.report["data_parallel"]`` holds every rank's rate. The CLI's jobs do the same
(`tandem bench|train --nproc N`, or torchrun).

What stays yours: frozen ``feed`` modules are not copied between ranks (load or seed them alike
on every rank); buffers such as BatchNorm's running statistics stay each rank's own (DDP's
broadcast_buffers=False); the augmentation draws differ per rank (its generator is seeded from
``seed`` and the rank). Mode auto times the modes on every rank alone and uses rank 0's pick.
Without a launcher (no RANK / WORLD_SIZE in the environment) everything here says "one process".
"""
import atexit
import sys
from typing import Optional

import torch

from . import _C


def _env() -> Optional[dict]:
    """The launch (rank, world_size, local_rank, local_world_size), or None; ValueError names
    a variable torchrun's contract does not allow."""
    return _C.launch_env()


def _of_launch(key: str, alone: int) -> int:
    """The launch's `key`, or `alone` (one process) without a launcher."""
    env = _env()
    return env[key] if env else alone


def launched() -> bool:
    """True when this process is one rank of a job of more than one."""
    return world_size() > 1


def rank() -> int:
    """This process's rank in its job (RANK), 0 without a launcher."""
    return _of_launch("rank", 0)


def world_size() -> int:
    """The ranks of the job (WORLD_SIZE), 1 without a launcher."""
    return _of_launch("world_size", 1)


def local_rank() -> int:
    """This process's rank on its machine (LOCAL_RANK): the GPU it trains on."""
    return _of_launch("local_rank", 0)


def local_world_size() -> int:
    """The ranks on this machine (LOCAL_WORLD_SIZE), 1 without a launcher."""
    return _of_launch("local_world_size", 1)


def restarted() -> bool:
    """Whether torchrun's elastic agent restarted this job's workers (--max-restarts): this
    node's TORCHELASTIC_RESTART_COUNT, or, once the job is joined, the job's own count of its
    attempts — the same on every rank, where each node's restart count is its own (a node
    whose worker failed counts the restart; the others do not). A run folder's fit in a
    restarted job continues its run (see tandem.Trainer.fit)."""
    return _of_launch("restart", 0) > 0 or bool(_job and _job.get("restarted"))


def local_device() -> torch.device:
    """The device this rank trains on: cuda:LOCAL_RANK where CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


_left_at_exit = False
_timeouts = {}  # set_timeouts: the job's, before it is joined
_job: Optional[dict] = None  # the joined job (_join)


def set_timeouts(join: Optional[float] = None, heartbeat: Optional[float] = None) -> None:
    """The job's timeouts, in seconds, before the first fit joins it: ``join``, how long a rank
    waits for the others to join (and to leave at the end; default 120, or the
    TANDEM_JOIN_TIMEOUT environment variable); ``heartbeat``, how long a rank may stay silent
    before it is declared dead and every rank stops (default 10, or TANDEM_HEARTBEAT_TIMEOUT) —
    across machines, raise it above the network's hiccups. None keeps the default."""
    for name, value in (("join", join), ("heartbeat", heartbeat)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} timeout {value!r} is not valid: expected a number of "
                             "seconds > 0, or None for the default")
    if _job is not None:
        raise RuntimeError("set_timeouts after the job was joined (the first fit joins it): "
                           "call it before")
    _timeouts.update({k: float(v) for k, v in (("join", join), ("heartbeat", heartbeat))
                      if v is not None})


def _check_device(device: torch.device) -> None:
    """Under a launch: ValueError unless `device` is this rank's (cuda:LOCAL_RANK, or the CPU)."""
    if device.type == "cuda" and device.index != local_rank():
        raise ValueError(
            f"rank {rank()} (LOCAL_RANK={local_rank()}) trains on {device}: under data parallel "
            f"each rank trains on cuda:LOCAL_RANK; move the model and optimizer there "
            "(tandem.distributed.local_device())")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"device {device}: data parallel runs on CUDA or the CPU")


def _join(device: torch.device) -> Optional[dict]:
    """Joins the job on `device` (once per process; the Trainer calls it before a run) and
    returns it as a dict (rank, world_size, device, backend), or None without one."""
    global _left_at_exit
    if not launched():
        return None
    _check_device(device)
    global _job
    job = _job = _C.join_job("cpu" if device.type == "cpu" else "cuda",
                             _timeouts.get("join", 0.0), _timeouts.get("heartbeat", 0.0))
    if not _left_at_exit:
        _left_at_exit = True
        # A clean exit leaves the job (the others wait for this rank to leave, not die); an
        # uncaught exception drops it first, so the others stop at once instead of waiting.
        atexit.register(_C.leave_job)
        previous_hook = sys.excepthook

        def abandon_then_report(*exc_info):
            _C.abandon_job()
            previous_hook(*exc_info)
        sys.excepthook = abandon_then_report
    return job
