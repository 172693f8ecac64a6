#!/usr/bin/env python3
"""The floor of data parallel's communication: how long one NCCL all-reduce of a workload's
gradient bytes takes on this machine's GPUs (torch.distributed, fp32, in place), so a measured
data-parallel step can be split into compute, hidden communication and exposed communication.

Usage: torchrun --nproc-per-node 2 benchmarks/allreduce_floor.py --mb 179 [--iters 50]
                [--json FILE]
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, nargs="+", default=[179.0], help="message sizes, MB")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", help="rank 0 writes the rows here")
    a = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rows = []
    for mb in a.mb:
        x = torch.ones(int(mb * 1e6 / 4), device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / a.iters * 1e3
        row = {"mb": mb, "world": dist.get_world_size(), "ms": ms,
               "algbw_gb_per_s": mb / 1e3 / (ms / 1e3)}
        rows.append(row)
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
    if a.json and dist.get_rank() == 0:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
