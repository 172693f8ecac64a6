"""tandem.Trainer, old package against new: the reference workloads' Trainer examples
(python/examples/seg_trainer.py and cls_trainer.py) timed with each of two builds of the Python
package, alternating old and new for --rounds rounds, each run in a process of its own, in one
fixed mode: benchmark() after warm-up (--call benchmark), or fit() as a user calls it (--call
fit: a first fit of --warmup steps, then a fit of --steps timed by the wall clock between two
device synchronizations — its pipeline set up and its graphs captured again, as every fit's
are). Writes {device, date, command, call, rows: [{job, mode, batch_size, old, new, ratio,
old_runs, new_runs}]}: old/new the median samples/s.

    python3 benchmarks/trainer_ab.py --old OLD/py --new NEW/py --out trainer_ab.json
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "python", "examples")
JOBS = {"seg": "seg_trainer", "cls": "cls_trainer"}

ONE_RUN = {"benchmark": """
import sys, torch
sys.path.insert(0, {examples!r})
from {module} import make_trainer
r = make_trainer({bs}, {mode!r}).benchmark(steps={steps}, warmup={warmup}, mode={mode!r})
print("RATE", r.samples_per_s)
""", "fit": """
import sys, time, torch
sys.path.insert(0, {examples!r})
from {module} import make_trainer
t = make_trainer({bs}, {mode!r})
t.fit(steps={warmup}, progress=False)
torch.cuda.synchronize()
start = time.perf_counter()
t.fit(steps={steps}, progress=False)
torch.cuda.synchronize()
print("RATE", {steps} * {bs} / (time.perf_counter() - start))
"""}


def one_run(package, job, bs, mode, steps, warmup, call):
    code = ONE_RUN[call].format(examples=EXAMPLES, module=JOBS[job], bs=bs, mode=mode,
                                steps=steps, warmup=warmup)
    env = dict(os.environ, PYTHONPATH=package)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    rates = [float(l.split()[1]) for l in out.stdout.splitlines() if l.startswith("RATE ")]
    if not rates:
        raise RuntimeError(f"{job} bs {bs} with {package}: exit {out.returncode}\n"
                           f"{out.stderr[-2000:]}")
    return rates[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--old", required=True, help="the old package's folder (on PYTHONPATH)")
    p.add_argument("--new", required=True, help="the new package's folder")
    p.add_argument("--cells", default="seg:8,cls:32", help="JOB:BS, comma-separated (seg, cls)")
    p.add_argument("--mode", default="pipelined+graphed")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--call", default="benchmark", choices=sorted(ONE_RUN),
                   help="what is timed: benchmark() on copies, or fit() on the modules")
    p.add_argument("--out", default="trainer_ab.json")
    a = p.parse_args()
    import torch
    rows = []
    for cell in a.cells.split(","):
        job, bs = cell.split(":")
        if job not in JOBS:
            p.error(f"--cells {cell!r}: job {job!r} is not one of {', '.join(JOBS)}")
        runs = {"old": [], "new": []}
        for r in range(a.rounds):  # alternate, and swap who goes first each round
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                runs[side].append(one_run(getattr(a, side), job, int(bs), a.mode, a.steps,
                                          a.warmup, a.call))
                print(f"{job} bs {bs} round {r + 1} {side}: {runs[side][-1]:.0f} samples/s",
                      file=sys.stderr, flush=True)
        old, new = statistics.median(runs["old"]), statistics.median(runs["new"])
        rows.append(dict(job=job, mode=a.mode, batch_size=int(bs), old=round(old),
                         new=round(new), ratio=round(new / old, 3),
                         old_runs=[round(x) for x in runs["old"]],
                         new_runs=[round(x) for x in runs["new"]]))
        print(f"{job:4s} bs {bs:>4s} old {old:8.0f}  new {new:8.0f}  new/old {new / old:.3f}")
    with open(a.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                       command="python3 benchmarks/trainer_ab.py " + " ".join(sys.argv[1:]),
                       call=a.call, rows=rows), f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
