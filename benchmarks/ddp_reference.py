#!/usr/bin/env python3
"""PyTorch DistributedDataParallel reference for the Python reference loops: the peer that
tandem's own data-parallel benchmark is measured against on a multi-GPU machine (e.g. 2 x H200),
so both numbers come from one run on one host.

Scenarios, each a single-GPU reference loop (benchmarks/reference_loops.py) made
data-parallel the usual way, with its networks, random datasets and augmentation imported from
reference_loops.py (not copied):
  seg  frozen encoder (not wrapped, run under no_grad) + trainable decoder wrapped in DDP;
       SegSamples 256x256 uint8 images with 10-class masks; the reference "serial" loop.
  cls  the reference classifier wrapped in DDP; ClsSamples uint8 batches moved to the GPU,
       augmented there by torchvision's batch transform (gpu_augmentation), then trained; the
       reference "gpu_aug" loop (what tandem's cls workload does in its serial mode).
Same optimizer (torch.optim.SGD with its defaults) and loss (CrossEntropyLoss) as the reference
loops.
Each rank reads its own DistributedSampler shard of a DataLoader(--workers, pin_memory on CUDA)
and seeds its data RNGs with its rank, so ranks see different data. --warmup steps, then
--steps timed steps between two (synchronize + barrier) points; steps/s per GPU is rank 0's
value, and the slowest rank's (all_reduce MIN) is recorded beside it.

Usage (one process per GPU; W = 1 works too):
  torchrun --nproc-per-node W benchmarks/ddp_reference.py --scenario seg --bs 8,32 --json OUT.json
  torchrun --nproc-per-node W benchmarks/ddp_reference.py --scenario cls --bs 32,128 \\
      --json OUT.json --append
CPU smoke test (gloo):
  torchrun --nproc-per-node 2 benchmarks/ddp_reference.py --device cpu --scenario seg --bs 2 \\
      --steps 3 --warmup 1 --json /tmp/ddp.json
Rank 0 prints one JSON row per measurement; --json FILE writes {device, date, command, rows},
and --append merges the rows into FILE (a row with the same scenario, batch size and world
replaces the old one). cls needs torchvision (the reference augmentation uses it).
"""
import argparse
import datetime
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
HERE = os.path.dirname(os.path.abspath(__file__))


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
    # The reference networks fix the image size: seg's Encoder is 8 stride-2 convs of kernel 2 (256
    # -> 1x1; below 256 the last convs get an empty input) and its Decoder mirrors it back; cls's
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
    return a


def build_seg(loops, device, ddp_kw, image_size):
    enc, dec = loops.seg_networks()
    enc.requires_grad_(False)
    enc.eval().to(device)  # frozen: no gradients, so nothing for DDP to all-reduce; not wrapped
    dec = DistributedDataParallel(dec.train().to(device), **ddp_kw)
    crit, opt = nn.CrossEntropyLoss(), torch.optim.SGD(dec.parameters())

    def step(data):  # reference_loops.seg_steps_per_s's "serial" step
        x = data[0].to(device, non_blocking=True).float()
        y = data[1].to(device, non_blocking=True)
        opt.zero_grad()
        with torch.no_grad():
            f = enc(x)
        loss = crit(dec(f), y)
        loss.backward()
        opt.step()
    return loops.SegSamples(image_size), step


def build_cls(loops, device, ddp_kw, image_size):
    model = DistributedDataParallel(loops.cls_network().train().to(device), **ddp_kw)
    crit, opt = nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters())
    augment = loops.gpu_augmentation()

    def step(data):  # reference_loops.cls_steps_per_s's "gpu_aug" step
        x = augment(data[0].to(device, non_blocking=True))
        # squeeze(1), not the reference loop's squeeze(): the same for bs > 1, and bs 1 keeps a
        # batch dim
        y = data[1].to(device, non_blocking=True).squeeze(1)
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
    return loops.ClsSamples(), step


def measure(a, loops, bs, device, rank, world):
    torch.manual_seed(a.seed)  # identical initial weights on every rank (DDP broadcasts rank 0's)
    ddp_kw = {"device_ids": [device.index]} if device.type == "cuda" else {}
    dataset, step = (build_seg if a.scenario == "seg" else build_cls)(loops, device, ddp_kw,
                                                                      a.image_size)
    # Then per-rank data: the fake datasets draw from the global RNGs (the loader derives its
    # workers' seeds from them) and the rotation angle comes from `random`.
    torch.manual_seed(a.seed + 1 + rank)
    random.seed(a.seed + 1 + rank)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(dataset, batch_size=bs, sampler=sampler, num_workers=a.workers,
                        pin_memory=a.pin_memory)
    barrier_kw = {"device_ids": [device.index]} if device.type == "cuda" else {}

    def sync():  # the device's queue drained, then every rank at the same point
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(**barrier_kw)

    batches = iter(loader)
    for _ in range(a.warmup):  # includes the workers' start-up, as the reference warm-up does
        step(next(batches))
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):  # loading stays inside the clock, as in the reference loops
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
    sys.path.insert(0, HERE)
    import reference_loops as loops
    if rank == 0:
        print(f"# torch {torch.__version__} {device_name} world {world} workers/rank {a.workers}",
              file=sys.stderr, flush=True)
    launcher = f"torchrun --nproc-per-node {os.environ['LOCAL_WORLD_SIZE']} " \
        if "TORCHELASTIC_RUN_ID" in os.environ else "python3 "
    command = launcher + shlex.join(sys.argv)
    rows = []
    try:
        for bs in a.bs:
            rate, slowest = measure(a, loops, bs, device, rank, world)
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
