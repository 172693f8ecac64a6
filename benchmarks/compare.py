#!/usr/bin/env python3
"""Merges tandem's and the Python reference's measurements from one GPU run into the committed
result format (benchmarks/results/<name>.json), prints a side-by-side table and the acceptance
checks. benchmarks/gpu_check.py calls it for every phase that writes a result; it runs on its own
too. Usage:
  compare.py --scenario seg|cls --tandem t1.json ... --python ref.json --floor floor.json \\
             --command "..." --out seg.json
  compare.py --scenario augment --tandem augment-bench.json --floor floor.json --out augment.json
  compare.py --scenario mlp --tandem tandem-mlp-*.json --python-rounds python-mlp-*.json --out graphs.json
  compare.py --scenario graphs --tandem (mlp and seg bs 1, 2 runs) --python-rounds ... \\
             --python seg.json --floor floor.json --sweep sweep-seg.json sweep-cls.json --out graphs.json
  compare.py --scenario auto --sweep sweep-seg.json sweep-cls.json --out auto.json
(--workload is --scenario's other name.) Any input may also be a committed result
(benchmarks/results/<name>.json): its rows (and floors) are read, so the checks can be re-run on it.
Mode names are the CLI's since the workload API: cls's serial mode runs the augmentation on the
GPU, or on the loader's workers with params {"augment": "cpu"}; inputs from before it (commit
d529f74) are read with their old names as aliases: cls gpu_aug and cpu_aug, mlp eager.

The merges of a gpu_check.py phase's scratch folder (--raw: its runs' files, named as gpu_check.py
names them), each writing its own schema:
  compare.py --scenario data --raw RAW --out data.json       data_bench.py's and data-bench's rows
  compare.py --scenario train --raw RAW --out train.json     also train-seg.json beside it
  compare.py --scenario ddp --raw RAW --command "..." --out ddp.json
  compare.py --scenario decode --raw RAW --device "..." --command "..." --out decode.json
  compare.py --scenario pair --raw RAW --out pair.txt        pipelined vs pipelined+graphed runs
  compare.py --scenario pair-kernels --raw RAW --out pair-kernels.txt   their ncu kernel lists
and the A/B of two builds (gpu_check.py ab): parse_cell(), ab_result(), print_ab().
"""
import argparse
import datetime
import json
import os
import sys

from lab.compare.checked import augment, auto, graphs, mlp, training
from lab.compare.merges import data, ddp, decode, pair, pair_kernels, train
from lab.compare.rows import Checks
# Read from here by other scripts: the A/B (gpu_check.py's tests) and a split run's notes
# (benchmarks/photos_table.py).
from lab.compare.ab import ab_result, parse_cell, print_ab, write_ab  # noqa: F401
from lab.compare.merges import (engine_share, load_or_skip, split_rates,  # noqa: F401
                                threads_on_cores)


CHECKED = {"seg": training, "cls": training, "augment": augment, "mlp": mlp, "graphs": graphs,
           "auto": auto}
MERGES = {"data": data, "train": train, "ddp": ddp, "decode": decode, "pair": pair,
          "pair-kernels": pair_kernels}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", "--workload", dest="scenario", default="seg",
                    choices=list(CHECKED) + list(MERGES),
                    help="which result: a workload's comparison with its checks, or a phase's "
                         "merge (default seg)")
    ap.add_argument("--tandem", nargs="+", default=[], help="tandem --json outputs")
    ap.add_argument("--python", nargs="+", help="reference_loops.py --json outputs (seg, cls; "
                    "several rounds: medians compared)")
    ap.add_argument("--sweep", nargs="+", help="graphs, auto: tandem sweep --json outputs")
    ap.add_argument("--python-rounds", nargs="+", help="mlp: one reference_loops.py mlp output per round")
    ap.add_argument("--floor", default="/dev/null", help="reference_loops.py floor --json output")
    ap.add_argument("--raw", help="data, train, ddp, decode, pair, pair-kernels: the phase's "
                                  "scratch folder, holding its runs' files")
    ap.add_argument("--device", default=None, help="device name, where the inputs lack it")
    ap.add_argument("--command", default="", help="the command that produced the inputs (ddp: "
                    "followed by each run's)")
    ap.add_argument("--out", required=True, help="the result file to write")
    a = ap.parse_args(argv)
    if a.scenario in MERGES:
        if not a.raw or not os.path.isdir(a.raw):
            ap.error(f"--scenario {a.scenario} reads a scratch folder: --raw {a.raw!r} is not one")
        MERGES[a.scenario](a)
        return 0
    checks = Checks()
    body = CHECKED[a.scenario](a, checks)
    checks.print()
    out = {"device": body.get("device") or a.device, "date": datetime.date.today().isoformat(),
           "torch": body.get("torch"), "command": a.command, "rows": body["rows"]}
    if "floors" in body:
        out["floors"] = body["floors"]
    out["checks"] = checks.items
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
