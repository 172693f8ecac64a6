#!/usr/bin/env python3
"""PyTorch DistributedDataParallel reference for the seeds' loops: the peer that tandem's own
data-parallel benchmark is measured against on a multi-GPU machine (e.g. 2 x H200), so both
numbers come from one run on one host.

Scenarios, each the seeds' single-GPU baseline loop (shared/reference/seed_reference.py) made
data-parallel the usual way, with the seeds' models, fake datasets and augmentation imported
from the reference dir (not copied):
  seg  frozen Encoder (not wrapped, run under no_grad) + trainable Decoder wrapped in DDP;
       SegFake 256x256 uint8 images with 10-class masks; the seeds' "serial" loop.
  cls  the seeds' classifier wrapped in DDP; ClsFake uint8 batches moved to the GPU, augmented
       there by the seeds' gpu_batch_transform, then trained; the seeds' "gpu_aug" loop (what
       tandem's cls workload does in its serial mode).
Same optimizer (torch.optim.SGD with its defaults) and loss (CrossEntropyLoss) as the seeds.
Each rank reads its own DistributedSampler shard of a DataLoader(--workers, pin_memory on CUDA)
and seeds its data RNGs with its rank, so ranks see different data. --warmup steps, then
--steps timed steps between two (synchronize + barrier) points; steps/s per GPU is rank 0's
value, and the slowest rank's (all_reduce MIN) is recorded beside it.

Usage (one process per GPU; W = 1 works too):
  torchrun --nproc-per-node W bench/python/ddp_reference.py --scenario seg --bs 8,32 --json OUT.json
  torchrun --nproc-per-node W bench/python/ddp_reference.py --scenario cls --bs 32,128 \\
      --json OUT.json --append
CPU smoke test (gloo):
  torchrun --nproc-per-node 2 bench/python/ddp_reference.py --device cpu --scenario seg --bs 2 \\
      --steps 3 --warmup 1 --json /tmp/ddp.json
Rank 0 prints one JSON row per measurement; --json FILE writes {device, date, command, rows},
and --append merges the rows into FILE (a row with the same scenario, batch size and world
replaces the old one). cls needs torchvision (the seeds' augmentation uses it).
"""
import argparse
import datetime
import functools
import json
import os
import random
import shlex
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

DEFAULT_BS = {"seg": "8,32", "cls": "32,128"}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", required=True, choices=["seg", "cls"])
    ap.add_argument("--bs", default=None, help="comma-separated batch sizes per GPU "
                    "(default seg 8,32; cls 32,128)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader workers per rank (default 8 on CUDA, 0 on CPU)")
    ap.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                    help="pin the loader's batches (default: on with CUDA)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--image-size", type=int, default=256,
                    help="seg: a multiple of 256; cls: 256 only (see check below)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference-dir", default=None, help="dir holding seed_reference.py "
                    "(default: $TANDEM_REFERENCE_DIR, ../shared/reference, shared/reference)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--append", action="store_true", help="merge the rows into --json's file")
    a = ap.parse_args()
    try:
        a.bs = [int(b) for b in (a.bs or DEFAULT_BS[a.scenario]).split(",")]
    except ValueError:
        ap.error(f"--bs: expected comma-separated integers, got {a.bs!r}")
    if any(b < 1 for b in a.bs):
        ap.error(f"--bs: batch sizes must be >= 1, got {a.bs}")
    if a.warmup < 0 or a.steps < 1:
        ap.error(f"--warmup must be >= 0 and --steps >= 1 (got {a.warmup}, {a.steps})")
    if a.workers is None:
        a.workers = 8 if a.device == "cuda" else 0
    if a.workers < 0:
        ap.error(f"--workers must be >= 0, got {a.workers}")
    if a.pin_memory is None:
        a.pin_memory = a.device == "cuda"
    # The seeds' models fix the image size: seg's Encoder is 8 stride-2 convs of kernel 2 (256 ->
    # 1x1; below 256 the last convs get an empty input) and its Decoder mirrors it back; cls's
    # net ends in Linear(4096, 10), which only a 256 input flattens to. So no tiny smoke size.
    if a.scenario == "seg" and (a.image_size < 256 or a.image_size % 256):
        ap.error(f"--image-size: seg's encoder needs a multiple of 256, got {a.image_size}")
    if a.scenario == "cls" and a.image_size != 256:
        ap.error(f"--image-size: cls's classifier ends in Linear(4096) and needs 256, "
                 f"got {a.image_size}")
    if a.append and not a.json:
        ap.error("--append needs --json FILE")
    if a.append and os.path.exists(a.json):  # checked now, not after minutes of measuring
        try:
            with open(a.json) as f:
                assert isinstance(json.load(f).get("rows"), list)
        except Exception:
            ap.error(f"--append: {a.json} is not a {{device, date, command, rows}} JSON file")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available (use --device cpu for a smoke test)")
    a.reference_dir = find_reference_dir(ap, a.reference_dir)
    return a


def find_reference_dir(ap, flag):
    candidates = [flag] if flag else [os.environ.get("TANDEM_REFERENCE_DIR"), "../shared/reference",
                                      "shared/reference", os.path.join(REPO_ROOT, "shared/reference"),
                                      os.path.join(REPO_ROOT, "../shared/reference")]
    for d in filter(None, candidates):
        if os.path.isfile(os.path.join(d, "seed_reference.py")):
            return os.path.abspath(d)
    ap.error(f"no seed_reference.py in {[c for c in candidates if c]}; pass --reference-dir")


def set_seed_globals(image_size, worker_id=None):
    # SegFake reads seed_reference.SEG_IMG when it makes a sample, in the loader's workers. Forked
    # workers inherit the value set in main(); spawned/forkserver ones re-import the module, so
    # every worker sets it again (the dataset, unpickled first, has already imported it).
    sys.modules["seed_reference"].SEG_IMG = image_size


def build_seg(seeds, device, ddp_kw):
    enc, dec = seeds.seg_models()
    enc.requires_grad_(False)
    enc.eval().to(device)  # frozen: no gradients, so nothing for DDP to all-reduce; not wrapped
    dec = DistributedDataParallel(dec.train().to(device), **ddp_kw)
    crit, opt = nn.CrossEntropyLoss(), torch.optim.SGD(dec.parameters())

    def step(data):  # seed_reference.seg_run's "serial" body
        x = data[0].to(device, non_blocking=True).float()
        y = data[1].to(device, non_blocking=True)
        opt.zero_grad()
        with torch.no_grad():
            f = enc(x)
        loss = crit(dec(f), y)
        loss.backward()
        opt.step()
    return seeds.SegFake(), step


def build_cls(seeds, device, ddp_kw):
    model = DistributedDataParallel(seeds.cls_model().train().to(device), **ddp_kw)
    crit, opt = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters())
    augment = seeds.gpu_batch_transform()

    def step(data):  # seed_reference.cls_run's "gpu_aug" body
        x = augment(data[0].to(device, non_blocking=True))
        # squeeze(1), not the seeds' squeeze(): the same for bs > 1, and bs 1 keeps a batch dim
        y = data[1].to(device, non_blocking=True).squeeze(1)
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
    return seeds.ClsFake(None), step


def measure(a, seeds, bs, device, rank, world):
    torch.manual_seed(a.seed)  # identical initial weights on every rank (DDP broadcasts rank 0's)
    ddp_kw = {"device_ids": [device.index]} if device.type == "cuda" else {}
    dataset, step = (build_seg if a.scenario == "seg" else build_cls)(seeds, device, ddp_kw)
    # Then per-rank data: the fake datasets draw from the global RNGs (the loader derives its
    # workers' seeds from them) and the rotation angle comes from `random`.
    torch.manual_seed(a.seed + 1 + rank)
    random.seed(a.seed + 1 + rank)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(dataset, batch_size=bs, sampler=sampler, num_workers=a.workers,
                        pin_memory=a.pin_memory,
                        worker_init_fn=functools.partial(set_seed_globals, a.image_size))
    barrier_kw = {"device_ids": [device.index]} if device.type == "cuda" else {}

    def sync():  # the device's queue drained, then every rank at the same point
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(**barrier_kw)

    batches = iter(loader)
    for _ in range(a.warmup):  # includes the workers' start-up, as the seeds' warm-up does
        step(next(batches))
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):  # loading stays inside the clock, as in the seeds' timed_loop
        step(next(batches))
    sync()
    rate = a.steps / (time.perf_counter() - t0)
    del batches  # stops this measurement's loader workers before the next one starts
    slowest = torch.tensor([rate], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MIN)
    return rate, slowest.item()


def write_json(path, rows, append, device_name, command):
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc = {"device": device_name, "date": now, "command": command, "rows": []}
    if append and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("device") not in (None, device_name):
            print(f"warning: {path} holds rows from {old['device']}, appending {device_name}'s",
                  file=sys.stderr)
        doc["rows"] = old.get("rows", [])
        if old.get("command") and old["command"] != command:
            doc["command"] = old["command"] + " ; " + command
    key = lambda r: (r["impl"], r["scenario"], r["mode"], r["batch_size_per_gpu"], r["world"])
    new_keys = {key(r) for r in rows}
    doc["rows"] = [r for r in doc["rows"] if key(r) not in new_keys] + rows
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main():
    a = parse_args()
    # Launched by plain `python` rather than torchrun: run as a world of one.
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(k, v)
    local_rank = int(os.environ["LOCAL_RANK"])
    if a.device == "cuda":
        if local_rank >= torch.cuda.device_count():
            sys.exit(f"error: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        device_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        device_name = "cpu"
    rank, world = dist.get_rank(), dist.get_world_size()
    sys.path.insert(0, a.reference_dir)
    import seed_reference as seeds
    # seed_reference.DEV is torch.device("cuda") at import. None of what is reused here reads it
    # (only its own loops do, and they are not called: they time one process with no barrier), but
    # point it at this rank's device so that nothing reused could land on GPU 0 or fail on a CPU.
    seeds.DEV = device
    set_seed_globals(a.image_size)
    if rank == 0:
        print(f"# torch {torch.__version__} {device_name} world {world} workers/rank {a.workers} "
              f"reference {a.reference_dir}", file=sys.stderr, flush=True)
    launcher = f"torchrun --nproc-per-node {os.environ['LOCAL_WORLD_SIZE']} " \
        if "TORCHELASTIC_RUN_ID" in os.environ else "python3 "
    command = launcher + shlex.join(sys.argv)
    rows = []
    try:
        for bs in a.bs:
            rate, slowest = measure(a, seeds, bs, device, rank, world)
            row = {"impl": "python", "scenario": a.scenario, "mode": "ddp",
                   "batch_size_per_gpu": bs, "world": world, "steps_per_s_per_gpu": rate,
                   "steps_per_s_per_gpu_min_rank": slowest, "workers": a.workers}
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if rank == 0 and a.json:
            write_json(a.json, rows, a.append, device_name, command)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
