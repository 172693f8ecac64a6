#!/usr/bin/env python3
"""Merges tandem's and the Python reference's measurements from one GPU run into the committed
result format (bench/results/<scenario>.json), prints a side-by-side table and the acceptance
checks of the seg issue. Usage:
  compare.py --scenario seg --tandem t1.json t2.json ... --python ref.json --floor floor.json \
             --command "..." --out seg.json
"""
import argparse
import datetime
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="seg")
    ap.add_argument("--tandem", nargs="+", required=True, help="tandem bench --json outputs")
    ap.add_argument("--python", required=True, help="seed_reference.py --json output")
    ap.add_argument("--floor", required=True, help="seed_reference.py floor --json output")
    ap.add_argument("--command", default="", help="the command that produced the inputs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    rows, device, torch = [], None, None
    for path in a.tandem:
        r = load(path)
        device, torch = r["device_name"], r["torch"]
        rows.append({"impl": "tandem", "scenario": r["scenario"], "mode": r["mode"],
                     "batch_size": r["batch_size"], "steps_per_s": r["steps_per_s"],
                     "first_loss": r["first_loss"], "last_loss": r["last_loss"]})
    for r in load(a.python):
        if r.get("exp") == a.scenario and "steps_s" in r:
            rows.append({"impl": "python", "scenario": a.scenario, "mode": r["mode"],
                         "batch_size": r["bs"], "steps_per_s": r["steps_s"]})
    floors = []
    for r in load(a.floor):
        if r.get("exp") == f"{a.scenario}_floor":
            stages = {k: v for k, v in r.items() if k.endswith("_ms") and k != "floor_ms"}
            floors.append({"scenario": a.scenario, "batch_size": r["bs"],
                           "floor_ms": r["floor_ms"],
                           "serial_gpu_ms": r.get("serial_step_graph_ms"),
                           "stages": stages, "measured_by": "python (seed_reference.py floor)"})

    def rate(impl, mode, bs):
        for r in rows:
            if (r["impl"], r["mode"], r["batch_size"]) == (impl, mode, bs):
                return r["steps_per_s"]
        return None

    checks = []

    def check(name, value, target):
        ok = value is not None and target is not None and value >= target
        checks.append({"check": name, "value": value, "target": target, "pass": ok})

    print(f"{'bs':>4} {'py serial':>10} {'py pipe':>9} {'t serial':>9} {'t pipe':>9} "
          f"{'t/py pipe':>9} {'floor/s':>8} {'eff':>6} {'serialGPU/s':>11}")
    for f in sorted(floors, key=lambda f: f["batch_size"]):
        bs = f["batch_size"]
        ps, pp = rate("python", "serial", bs), rate("python", "pipelined", bs)
        ts, tp = rate("tandem", "serial", bs), rate("tandem", "pipelined", bs)
        floor_rate = 1000.0 / f["floor_ms"]
        serial_rate = 1000.0 / f["serial_gpu_ms"] if f["serial_gpu_ms"] else None
        fmt = lambda v, w, p=1: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"
        print(f"{bs:>4} {fmt(ps,10)} {fmt(pp,9)} {fmt(ts,9)} {fmt(tp,9)} "
              f"{fmt(tp / pp if tp and pp else None, 9, 2)} {fmt(floor_rate, 8)} "
              f"{fmt(tp / floor_rate if tp else None, 6, 2)} {fmt(serial_rate, 11)}")
        if a.scenario == "seg":
            if bs <= 8:
                check(f"bs {bs}: tandem pipelined >= 2.0x python pipelined", tp,
                      2.0 * pp if pp else None)
                check(f"bs {bs}: tandem pipelined >= 0.9x floor rate", tp, 0.9 * floor_rate)
            else:
                check(f"bs {bs}: tandem pipelined >= serial GPU rate", tp, serial_rate)
            check(f"bs {bs}: tandem pipelined >= tandem serial", tp, ts)
    for c in checks:
        v = f"{c['value']:.1f}" if c["value"] is not None else "-"
        t = f"{c['target']:.1f}" if c["target"] is not None else "-"
        print(f"{'PASS' if c['pass'] else 'MISS'}  {c['check']}: {v} vs {t}")

    out = {"device": device, "date": datetime.date.today().isoformat(), "torch": torch,
           "command": a.command, "rows": rows, "floors": floors, "checks": checks}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    sys.exit(main())
