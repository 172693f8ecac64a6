"""The Python package's benchmark: the reference workloads' seg and cls loops written with
tandem.Trainer (python/examples/seg_trainer.py, cls_trainer.py) beside the C++ CLI running the same
workloads and the Python reference loops (benchmarks/reference_loops.py), all on this GPU in one
process tree; then tandem.augment beside torchvision's batch transform (the reference loops'
gpu_aug pipeline). Every rate is the reference method: warm-up steps, then timed steps between
device synchronizations. Writes benchmarks/results/python.json's schema:
{device, date, command, rows: [{impl, scenario, mode, batch_size, steps_per_s}]}.

    PYTHONPATH=<tandem package> python3 benchmarks/python_bench.py --tandem build/tandem \\
        --out python.json"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "python", "examples")
PY_MODES = {"seg": "serial,pipelined", "cls": "gpu_aug,pipelined"}  # the reference loops on the GPU


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def tandem_py(scenario, bs, steps, warmup, mode):
    module = __import__(f"{scenario}_trainer")
    trainer = module.make_trainer(bs, mode)
    t0 = time.perf_counter()
    mode = trainer.choose_mode(steps)
    trial_s = time.perf_counter() - t0
    r = trainer.benchmark(steps=steps, warmup=warmup)
    trials = {t["mode"]: t["steps_per_s"] for t in (trainer.trials or {}).get("trials", [])}
    log(f"tandem-py {scenario} bs {bs}: {r.steps_per_s:.1f} steps/s in {mode} "
        f"(trials {trial_s:.0f} s: {trials}); floor {r.report['floor_ms']:.3f} ms "
        f"({r.report['floor_stage']}), efficiency {r.report['efficiency']:.2f}")
    del trainer
    torch.cuda.empty_cache()
    return dict(impl="tandem-py", scenario=scenario, mode=mode, batch_size=bs,
                steps_per_s=r.steps_per_s, trials=trials, floor_ms=r.report["floor_ms"],
                stages=r.report["stages"])


def tandem_cpp(binary, scenario, bs, steps, warmup, mode):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "bench", "--workload", scenario, "--batch-size", str(bs),
                        "--mode", mode, "--steps", str(steps), "--warmup", str(warmup),
                        "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        j = json.load(open(f.name))
    mode = j.get("picked", j["mode"])  # --mode auto: the mode its trials picked
    log(f"tandem-cpp {scenario} bs {bs}: {j['steps_per_s']:.1f} steps/s in {mode}")
    return dict(impl="tandem-cpp", scenario=scenario, mode=mode, batch_size=bs,
                steps_per_s=j["steps_per_s"])


def python_loops(scenario, sizes):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, os.path.join(HERE, "reference_loops.py"), scenario,
                        "--bs", ",".join(map(str, sizes)), "--modes", PY_MODES[scenario],
                        "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        measured = json.load(open(f.name))
    rows = []
    for bs in sizes:  # the best reference loop at this batch size: the strongest baseline
        mine = [m for m in measured if m.get("bs") == bs and "steps_s" in m]
        best = max(mine, key=lambda m: m["steps_s"])
        log(f"python {scenario} bs {bs}: {best['steps_s']:.1f} steps/s in {best['mode']} "
            f"({ {m['mode']: round(m['steps_s'], 1) for m in mine} })")
        rows.append(dict(impl="python", scenario=scenario, mode=best["mode"], batch_size=bs,
                         steps_per_s=best["steps_s"],
                         all_modes={m["mode"]: m["steps_s"] for m in mine}))
    return rows


def time_cuda(fn, iters=50, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return iters / (time.perf_counter() - t0)


def augment_rows(sizes):
    import tandem
    import reference_loops
    spec = tandem.AugmentSpec(crop=(128, 128), out=(256, 256), max_rotation_deg=45.0,
                              blur_kernel=7, mean=(0, 0, 0), std=(1, 1, 1))
    tv = reference_loops.gpu_augmentation()
    rows = []
    for bs in sizes:
        u8 = torch.randint(0, 256, (bs, 3, 256, 256), dtype=torch.uint8, device="cuda")
        ours = time_cuda(lambda: tandem.augment(u8, spec))
        theirs = time_cuda(lambda: tv(u8), iters=20)
        log(f"augment bs {bs}: tandem.augment {ours:.1f} batches/s, torchvision {theirs:.1f} "
            f"({ours / theirs:.1f}x)")
        rows.append(dict(impl="tandem-py", scenario="augment", mode="op", batch_size=bs,
                         steps_per_s=ours, images_per_s=ours * bs))
        rows.append(dict(impl="python", scenario="augment", mode="torchvision", batch_size=bs,
                         steps_per_s=theirs, images_per_s=theirs * bs))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tandem", required=True, help="the tandem CLI binary")
    ap.add_argument("--seg-bs", default="8,32")
    ap.add_argument("--cls-bs", default="32,128")
    ap.add_argument("--scenarios", default="seg,cls")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--mode", default="pipelined+graphed",
                    help="tandem's mode, the same for the Trainer and the CLI (auto: each "
                         "runs its own trials)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sys.path[:0] = [EXAMPLES, HERE]
    rows = []

    def save():  # after every measurement: a run cut short keeps what it measured
        out = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                   command=" ".join(sys.argv), rows=rows)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    for scenario in a.scenarios.split(","):
        sizes = [int(b) for b in (a.seg_bs if scenario == "seg" else a.cls_bs).split(",")]
        for bs in sizes:
            rows.append(tandem_py(scenario, bs, a.steps, a.warmup, a.mode))
            rows.append(tandem_cpp(a.tandem, scenario, bs, a.steps, a.warmup, a.mode))
            save()
        rows += python_loops(scenario, sizes)
        save()
    rows += augment_rows([int(b) for b in a.cls_bs.split(",")])
    for r in rows:
        if r["impl"] != "tandem-py" or r["scenario"] == "augment":
            continue
        same = {x["impl"]: x["steps_per_s"] for x in rows
                if x["scenario"] == r["scenario"] and x["batch_size"] == r["batch_size"]}
        r["vs_python"] = r["steps_per_s"] / same["python"]
        r["vs_cpp"] = r["steps_per_s"] / same["tandem-cpp"]
        log(f"{r['scenario']} bs {r['batch_size']}: tandem-py {r['vs_python']:.2f}x the reference "
            f"Python loop, {r['vs_cpp']:.2f}x the C++ CLI")
    save()


if __name__ == "__main__":
    main()
