#!/usr/bin/env python3
"""Merges tandem's and the Python reference's measurements from one GPU run into the committed
result format (bench/results/<name>.json), prints a side-by-side table and the acceptance checks
of the issues. Usage:
  compare.py --scenario seg|cls --tandem t1.json ... --python ref.json --floor floor.json \\
             --command "..." --out seg.json
  compare.py --scenario augment --tandem augment-bench.json --floor floor.json --out augment.json
  compare.py --scenario mlp --tandem tandem-mlp-*.json --python-rounds python-mlp-*.json --out graphs.json
  compare.py --scenario graphs --tandem (mlp and seg bs 1, 2 runs) --python-rounds ... \
             --python seg.json --floor floor.json --sweep sweep-seg.json sweep-cls.json --out graphs.json
  compare.py --scenario auto --sweep sweep-seg.json sweep-cls.json --out auto.json
(--workload is --scenario's other name.) Any input may also be a committed result
(bench/results/<name>.json): its rows (and floors) are read, so the checks can be re-run on it.
Mode names are the CLI's since the workload API: cls's serial mode runs the augmentation on the
GPU, or on the loader's workers with params {"augment": "cpu"}; inputs from before it (commit
d529f74) are read with their old names as aliases: cls gpu_aug and cpu_aug, mlp eager.
"""
import argparse
import datetime
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        text = f.read()
    return json.loads(text) if text.strip() else []


def fmt(v, w, p=1):
    return f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"


# The tandem CLI's mode names before the workload API (commit d529f74), read as aliases: the
# new mode and the parameters it implies.
OLD_MODES = {("cls", "cpu_aug"): ("serial", {"augment": "cpu"}),
             ("cls", "gpu_aug"): ("serial", {}),
             ("mlp", "eager"): ("serial", {})}
# A workload parameter at its default is dropped from a row's params (absent means default).
PARAM_DEFAULTS = {"cls": {"augment": "gpu", "task": "random"}}
# The reference loops' modes (bench/python/reference_loops.py) and the tandem runs they are compared
# with, as labels (see label()); a Python mode not listed here is compared with tandem's of its
# name.
PYTHON_TO_TANDEM = {("cls", "cpu_aug"): "serial augment=cpu",
                    ("cls", "gpu_aug"): "serial",
                    ("mlp", "eager"): "serial"}
MODE_ORDER = ["serial", "cpu_aug", "gpu_aug", "pipelined", "graphed", "pipelined+graphed",
              "graphed_k", "auto"]


def canonical(scenario, mode, params=None):
    """(mode, params) of a tandem run under the current names, defaults dropped."""
    new_mode, implied = OLD_MODES.get((scenario, mode), (mode, {}))
    merged = {**implied, **(params or {})}
    defaults = PARAM_DEFAULTS.get(scenario, {})
    return new_mode, {k: v for k, v in sorted(merged.items()) if defaults.get(k) != v}


def label(row):
    """What a row is compared by: its mode, then any non-default params ("serial augment=cpu")."""
    return " ".join([row["mode"]] + [f"{k}={v}" for k, v in sorted(row.get("params", {}).items())])


def tandem_row(r, **fields):
    """A tandem row (from a run's JSON, a sweep's or a committed result's rows) under the current
    mode names; params only where not all default."""
    mode, params = canonical(r["scenario"], r["mode"], r.get("params"))
    row = {"impl": "tandem", "scenario": r["scenario"], "mode": mode}
    if params:
        row["params"] = params
    row.update(fields)
    if row.get("picked"):  # auto's pick, by its current name too
        picked, picked_params = canonical(r["scenario"], row["picked"])
        row["picked"] = label({"mode": picked, "params": picked_params})
    return row


def mode_rank(name):
    first = name.split(" ")[0]
    return (MODE_ORDER.index(first) if first in MODE_ORDER else len(MODE_ORDER), name)


def steps_per_s(rows, impl, scenario, mode, bs):
    """The median rate of the rows with these keys (one per round), or None; `mode` is a label
    (a mode and any non-default params, see label())."""
    rates = [r["steps_per_s"] for r in rows
             if (r["impl"], r["scenario"], label(r), r["batch_size"]) == (impl, scenario, mode, bs)
             and r.get("steps_per_s") is not None]
    return statistics.median(rates) if rates else None


def is_result(data):
    """A committed result (or a sweep's JSON): an object with rows, not one run or a list."""
    return isinstance(data, dict) and isinstance(data.get("rows"), list)


def load_all(paths):
    """The rows of several reference_loops.py --json outputs (rounds), concatenated; a committed
    result contributes its Python rows, as records of reference_loops.py's form."""
    rows = []
    for path in paths or []:
        data = load(path)
        if is_result(data):
            for r in data["rows"]:
                if r.get("impl") != "python":
                    continue
                rec = {"exp": r["scenario"], "mode": r["mode"], "bs": r["batch_size"],
                       "steps_s": r["steps_per_s"]}
                if "ms_per_step" in r:
                    rec["ms_per_step"] = r["ms_per_step"]
                rows.append(rec)
        else:
            rows += data
    return rows


def load_floors(path, scenario):
    """reference_loops.py floor's records, or a committed result's floors (already in the output's
    form, returned as such in the second list)."""
    data = load(path)
    if is_result(data):
        return [], [f for f in data.get("floors", []) if f.get("scenario") == scenario]
    return data, []


class Checks:
    def __init__(self):
        self.items = []

    def at_least(self, name, value, target):
        ok = value is not None and target is not None and value >= target
        self.items.append({"check": name, "value": value, "target": target, "pass": ok})

    def print(self):
        for c in self.items:
            v = f"{c['value']:.2f}" if c["value"] is not None else "-"
            t = f"{c['target']:.2f}" if c["target"] is not None else "-"
            print(f"{'PASS' if c['pass'] else 'MISS'}  {c['check']}: {v} vs {t}")


def training(a, checks):
    rows, device, torch = [], None, None
    for path in a.tandem:
        r = load(path)
        if is_result(r):  # a committed result: its tandem rows of this scenario
            device, torch = r.get("device") or device, r.get("torch") or torch
            rows += [tandem_row(x, **{k: v for k, v in x.items()
                                      if k not in ("impl", "scenario", "mode", "params")})
                     for x in r["rows"] if x.get("impl") == "tandem"
                     and x.get("scenario") == a.scenario and x.get("source") is None]
            continue
        if r.get("scenario") != a.scenario:
            continue
        device, torch = r["device_name"], r["torch"]
        extra = {"picked": r["picked"]} if "picked" in r else {}
        rows.append(tandem_row(r, batch_size=r["batch_size"], steps_per_s=r["steps_per_s"],
                               first_loss=r["first_loss"], last_loss=r["last_loss"],
                               gpu_utilization=r.get("gpu_utilization"), **extra))
    for r in load_all(a.python):
        if r.get("exp") == a.scenario and "steps_s" in r:
            rows.append({"impl": "python", "scenario": a.scenario, "mode": r["mode"],
                         "batch_size": r["bs"], "steps_per_s": r["steps_s"]})
    records, floors = load_floors(a.floor, a.scenario)
    for r in records:
        if r.get("exp") != f"{a.scenario}_floor":
            continue
        stages = {k: v for k, v in r.items() if k.endswith("_ms") and k != "floor_ms"}
        if a.scenario == "seg":
            floor_ms, serial = r["floor_ms"], r.get("serial_step_graph_ms")
        else:  # cls: the model's train step on GPU-resident data, as a graph replay
            floor_ms, serial = r["step_graph_ms"], None
        floors.append({"scenario": a.scenario, "batch_size": r["bs"], "floor_ms": floor_ms,
                       "serial_gpu_ms": serial, "stages": stages,
                       "measured_by": "python (reference_loops.py floor)"})

    def rate(impl, mode, bs):
        return steps_per_s(rows, impl, a.scenario, mode, bs)

    # Columns: each Python mode beside the tandem run it is compared with, then tandem's others.
    pairs = [(m, PYTHON_TO_TANDEM.get((a.scenario, m), m))
             for m in sorted({r["mode"] for r in rows if r["impl"] == "python"}, key=mode_rank)]
    paired = {t for _, t in pairs}
    pairs += [(None, t) for t in sorted({label(r) for r in rows if r["impl"] == "tandem"},
                                        key=mode_rank) if t not in paired]
    widths = [max(13, len(f"py {p}") if p else 0, len(f"t {t}")) for p, t in pairs]
    header = f"{'bs':>4} " + " ".join(f"{'py ' + p if p else '':>{w}} {'t ' + t:>{w}}"
                                      for (p, t), w in zip(pairs, widths))
    print(header + f" {'floor/s':>8} {'t pipe/floor':>12}")
    for f in sorted(floors, key=lambda f: f["batch_size"]):
        bs = f["batch_size"]
        floor_rate = 1000.0 / f["floor_ms"]
        cells = " ".join(f"{fmt(rate('python', p, bs) if p else None, w)} {fmt(rate('tandem', t, bs), w)}"
                         for (p, t), w in zip(pairs, widths))
        tp = rate("tandem", "pipelined", bs)
        print(f"{bs:>4} {cells} {fmt(floor_rate, 8)} {fmt(tp / floor_rate if tp else None, 12, 2)}")
        pp = rate("python", "pipelined", bs)
        if a.scenario == "seg":
            ts = rate("tandem", "serial", bs)
            serial_rate = 1000.0 / f["serial_gpu_ms"] if f["serial_gpu_ms"] else None
            if bs <= 8:
                checks.at_least(f"bs {bs}: tandem pipelined / python pipelined >= 2.0",
                                tp / pp if tp and pp else None, 2.0)
                checks.at_least(f"bs {bs}: tandem pipelined / floor rate >= 0.9",
                                tp / floor_rate if tp else None, 0.9)
            else:
                checks.at_least(f"bs {bs}: tandem pipelined >= serial GPU rate", tp, serial_rate)
            checks.at_least(f"bs {bs}: tandem pipelined >= tandem serial", tp, ts)
        elif a.scenario == "cls" and bs in (32, 128):
            need = 2.5 if bs == 32 else 3.0
            checks.at_least(f"bs {bs}: tandem pipelined / python pipelined >= {need}",
                            tp / pp if tp and pp else None, need)
            checks.at_least(f"bs {bs}: tandem pipelined / floor rate >= 0.85",
                            tp / floor_rate if tp else None, 0.85)
            cpu = PYTHON_TO_TANDEM[("cls", "cpu_aug")]
            tc, pc = rate("tandem", cpu, bs), rate("python", "cpu_aug", bs)
            checks.at_least(f"bs {bs}: tandem {cpu} / python cpu_aug >= 2.0",
                            tc / pc if tc and pc else None, 2.0)
    return {"device": device, "torch": torch, "rows": rows, "floors": floors}


def augment(a, checks):
    rows, tv = [], {}
    for r in load(a.floor):
        if r.get("exp") == "cls_floor":
            tv[r["bs"]] = r["tv_gpu_aug_ms"]
    mine = load(a.tandem[0])
    if is_result(mine):  # a committed result: torchvision's rows give its times
        tv.update({r["batch_size"]: r["ms_per_batch"] for r in mine["rows"]
                   if r.get("impl") == "torchvision" and r["batch_size"] not in tv})
        mine = [r for r in mine["rows"] if r.get("impl") == "tandem"]
    print(f"{'bs':>4} {'sampling':>8} {'tandem img/s':>13} {'tv img/s':>10} {'ratio':>8} {'GB/s':>8}"
          f" {'copy GB/s':>10} {'ratio incl. draw':>17}")
    # The checks apply to the kernel's default sampling: a batch size's row that asked for "auto"
    # (files without requested_sampling: its first row, as gpu-check asks for auto first); other
    # rows (e.g. the staged window beside texture gathers) are for the record.
    def default_first(r):
        return (r["batch_size"], r.get("requested_sampling", "auto") != "auto")
    checked = set()
    for r in sorted(mine, key=default_first):
        rows.append(r)
        bs = r["batch_size"]
        if bs not in tv:
            continue
        bytes_ = bs * 3 * 256 * 256 * (1 + 4)
        t = {"impl": "torchvision", "scenario": "augment", "mode": "gpu", "batch_size": bs,
             "ms_per_batch": tv[bs], "steps_per_s": 1000.0 / tv[bs],
             "images_per_s": 1000.0 / tv[bs] * bs, "gb_per_s": bytes_ / (tv[bs] * 1e-3) / 1e9,
             "copy_gb_per_s": r["copy_gb_per_s"]}
        if bs not in checked:
            rows.append(t)
        ratio = r["steps_per_s"] / t["steps_per_s"]
        print(f"{bs:>4} {r.get('sampling', '-'):>8} {r['images_per_s']:>13.0f} "
              f"{t['images_per_s']:>10.0f} {ratio:>8.1f} "
              f"{r['gb_per_s']:>8.1f} {r['copy_gb_per_s']:>10.1f} "
              f"{tv[bs] / r.get('ms_per_batch_with_draw', float('nan')):>17.1f}")
        if bs in (32, 128) and bs not in checked:
            checked.add(bs)
            checks.at_least(f"bs {bs}: tandem / torchvision throughput >= 100", ratio, 100.0)
            checks.at_least(f"bs {bs}: gb_per_s / copy_gb_per_s >= 0.4",
                            r["gb_per_s"] / r["copy_gb_per_s"], 0.4)
    return {"rows": rows}


def mlp(a, checks):
    """Several rounds, tandem's modes and the Python loop alternating (the GPU's clock and
    temperature drift over a minute by more than the differences measured): medians compared.
    Python's eager loop is compared with tandem's serial mode, its graph replay with tandem's
    graphed modes."""
    rows, device, torch = [], None, None
    for path in a.tandem:
        r = load(path)
        if is_result(r):  # a committed result: its tandem mlp rows
            device, torch = r.get("device") or device, r.get("torch") or torch
            rows += [tandem_row(x, batch_size=x["batch_size"], steps_per_s=x["steps_per_s"],
                                ms_per_step=x["ms_per_step"], notes=x.get("notes", []))
                     for x in r["rows"] if (x.get("impl"), x.get("scenario")) == ("tandem", "mlp")]
            continue
        if r.get("scenario") != "mlp":
            continue
        device, torch = r["device_name"], r["torch"]
        rows.append(tandem_row(r, batch_size=r["batch_size"], steps_per_s=r["steps_per_s"],
                               ms_per_step=r["ms_per_step"], notes=r.get("notes", [])))
    for path in a.python_rounds or a.python or []:
        data = load(path)
        if is_result(data):  # a committed result: its Python mlp rows, as they are
            rows += [dict(x) for x in data["rows"]
                     if (x.get("impl"), x.get("scenario")) == ("python", "mlp")]
            continue
        for r in data:
            if r.get("exp") == "mlp":
                for mode, key in (("eager", "eager_ms"), ("graphed", "graph_ms"),
                                  ("graphed_k", "graph_k_ms")):
                    if key not in r:
                        continue  # graph_k_ms: only when reference_loops.py ran mode graph_k
                    rows.append({"impl": "python", "scenario": "mlp", "mode": mode,
                                 "batch_size": 640, "ms_per_step": r[key],
                                 "steps_per_s": 1000.0 / r[key]})
    runs = {}
    for r in rows:
        # Python's modes under the tandem mode they are compared with (eager: serial).
        mode = PYTHON_TO_TANDEM.get(("mlp", r["mode"]), r["mode"]) if r["impl"] == "python" \
            else label(r)
        runs.setdefault((r["impl"], mode), []).append(r["ms_per_step"])
    ms = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{'mode':>18} {'tandem ms':>10} {'python ms':>10}   (medians of {len(runs.get(('python', 'graphed'), []))} rounds;"
          f" python's eager loop beside tandem's serial mode)")
    graphed_modes = ("graphed", "graphed_k", "pipelined+graphed")
    for mode in ("serial", "pipelined") + graphed_modes:
        if mode == "pipelined" and ("tandem", mode) not in ms:
            continue  # runs from before mlp had a pipelined mode
        print(f"{mode:>18} {fmt(ms.get(('tandem', mode)), 10, 3)} {fmt(ms.get(('python', mode)), 10, 3)}")
    p = ms.get(("python", "graphed"))
    # "graphed ms/step <= the Python graph replay's": as a ratio python / tandem >= 1, for
    # tandem's fastest graphed mode (each mode's ratio printed too).
    timed = [(ms[("tandem", m)], m) for m in graphed_modes if ("tandem", m) in ms]
    for t, mode in timed:
        if p:
            print(f"python graph ms / tandem {mode} ms = {p / t:.4f}")
    t, best = min(timed) if timed else (None, None)
    checks.at_least(f"mlp: python graph ms / tandem's fastest graphed mode ({best}) ms >= 1 (medians)",
                    p / t if p and t else None, 1.0)
    te = ms.get(("tandem", "serial"))
    for tg, mode in timed:
        if te:
            print(f"tandem {mode} gain over tandem serial: {100 * (te - tg) / te:.1f}%")
    return {"device": device, "torch": torch, "rows": rows}


def sweep_rows(paths):
    """The measured tandem rows of `tandem sweep --json` outputs, under the current mode names; a
    committed result whose rows say where they came from (graphs.json) gives its sweep rows."""
    rows = []
    for path in paths or []:
        data = load(path)
        mine = [r for r in data["rows"] if r.get("impl", "tandem") == "tandem"
                and r.get("steps_per_s") is not None]
        if any("source" in r for r in mine):
            mine = [r for r in mine if r.get("source") == "sweep"]
        rows += [tandem_row(r, **{k: v for k, v in r.items()
                                  if k not in ("impl", "scenario", "mode", "params")})
                 for r in mine]
    return rows


def graphs(a, checks):
    """CUDA graphs: mlp (see mlp()), seg's launch-bound regime at batch sizes 1 and 2, and
    pipelined+graphed against pipelined at 8/32/128 from the sweeps of the same run."""
    body = mlp(a, checks)
    rows = body["rows"]
    for path in a.tandem:
        r = load(path)
        runs = ([x for x in r["rows"] if (x.get("impl"), x.get("scenario")) == ("tandem", "seg")
                 and x.get("source") is None] if is_result(r) else [r])
        for x in runs:
            if x.get("scenario") == "seg":
                rows.append(tandem_row(x, batch_size=x["batch_size"], steps_per_s=x["steps_per_s"],
                                       ms_per_step=x["ms_per_step"], notes=x.get("notes", []),
                                       first_loss=x.get("first_loss"), last_loss=x.get("last_loss")))
    for r in load_all(a.python):
        if r.get("exp") == "seg" and "steps_s" in r:
            rows.append({"impl": "python", "scenario": "seg", "mode": r["mode"],
                         "batch_size": r["bs"], "steps_per_s": r["steps_s"]})
    records, floors = load_floors(a.floor, "seg")
    for r in records:
        if r.get("exp") == "seg_floor":
            floors.append({"scenario": "seg", "batch_size": r["bs"], "floor_ms": r["floor_ms"],
                           "measured_by": "python (reference_loops.py floor)"})

    def rate(impl, scenario, mode, bs, among=rows):
        return steps_per_s(among, impl, scenario, mode, bs)

    rounds = sum(1 for r in rows if (r["impl"], r["scenario"], r["mode"], r["batch_size"])
                 == ("python", "seg", "serial", 1))
    print(f"\nseg's launch-bound regime (medians of {rounds} round(s))")
    print(f"{'seg bs':>6} {'py serial':>10} {'t pipelined':>12} {'t pipe+graph':>13} {'floor/s':>8}"
          f" {'x py serial':>11} {'of floor':>9} {'gain':>7}")
    for f in sorted(floors, key=lambda f: f["batch_size"]):
        bs = f["batch_size"]
        if bs > 2:
            continue
        fr = 1000.0 / f["floor_ms"]
        py, tp, tg = (rate("python", "seg", "serial", bs), rate("tandem", "seg", "pipelined", bs),
                      rate("tandem", "seg", "pipelined+graphed", bs))
        x = tg / py if tg and py else None
        gain = (tg - tp) / tp if tg and tp else None
        print(f"{bs:>6} {fmt(py, 10)} {fmt(tp, 12)} {fmt(tg, 13)} {fmt(fr, 8)} {fmt(x, 11, 2)}"
              f" {fmt(tg / fr if tg else None, 9, 2)} {fmt(100 * gain if gain is not None else None, 6)}%")
        checks.at_least(f"seg bs {bs}: tandem pipelined+graphed / python serial >= 2.5", x, 2.5)
        checks.at_least(f"seg bs {bs}: tandem pipelined+graphed / floor rate >= 0.85",
                        tg / fr if tg else None, 0.85)
    swept = sweep_rows(a.sweep)
    print(f"\n{'scenario':>8} {'bs':>4} {'pipelined':>10} {'pipe+graph':>11} {'ratio':>6}")
    for scenario in ("seg", "cls"):
        for bs in sorted({r["batch_size"] for r in swept if r["scenario"] == scenario}):
            tp = rate("tandem", scenario, "pipelined", bs, swept)
            tg = rate("tandem", scenario, "pipelined+graphed", bs, swept)
            print(f"{scenario:>8} {bs:>4} {fmt(tp, 10)} {fmt(tg, 11)} {fmt(tg / tp if tg and tp else None, 6, 3)}")
            if bs in (8, 32, 128):
                checks.at_least(f"{scenario} bs {bs}: pipelined+graphed / pipelined >= 0.98",
                                tg / tp if tg and tp else None, 0.98)
                rows += [dict(r, source="sweep") for r in swept if r["scenario"] == scenario
                         and r["batch_size"] == bs and r["mode"] in ("pipelined", "pipelined+graphed")]
    body["floors"] = floors
    return body


def auto(a, checks):
    """Mode auto: per (scenario, batch size), every mode's rate and auto's, from sweeps that ran
    them all in one process (auto's rate excludes its trials)."""
    rows, device = sweep_rows(a.sweep), None
    print(f"{'scenario':>8} {'bs':>4} {'best mode':>18} {'best':>8} {'auto picked':>18} {'auto':>8} {'ratio':>6}")
    for scenario in sorted({r["scenario"] for r in rows}):
        for bs in sorted({r["batch_size"] for r in rows if r["scenario"] == scenario}):
            mine = [r for r in rows if (r["scenario"], r["batch_size"]) == (scenario, bs)]
            modes = [r for r in mine if r["mode"] != "auto"]
            autos = [r for r in mine if r["mode"] == "auto"]
            if not modes or not autos:
                continue
            best = max(modes, key=lambda r: r["steps_per_s"])
            au = autos[0]
            ratio = au["steps_per_s"] / best["steps_per_s"]
            print(f"{scenario:>8} {bs:>4} {label(best):>18} {best['steps_per_s']:>8.1f} "
                  f"{au.get('picked', '?'):>18} {au['steps_per_s']:>8.1f} {ratio:>6.3f}")
            checks.at_least(f"{scenario} bs {bs}: auto ({au.get('picked')}) / best ({label(best)}) >= 0.97",
                            ratio, 0.97)
    return {"device": a.device, "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", "--workload", dest="scenario", default="seg",
                    choices=["seg", "cls", "augment", "mlp", "graphs", "auto"])
    ap.add_argument("--tandem", nargs="+", default=[], help="tandem --json outputs")
    ap.add_argument("--python", nargs="+", help="reference_loops.py --json outputs (seg, cls; "
                    "several rounds: medians compared)")
    ap.add_argument("--sweep", nargs="+", help="graphs, auto: tandem sweep --json outputs")
    ap.add_argument("--python-rounds", nargs="+", help="mlp: one reference_loops.py mlp output per round")
    ap.add_argument("--floor", default="/dev/null", help="reference_loops.py floor --json output")
    ap.add_argument("--device", default=None, help="device name, where the inputs lack it")
    ap.add_argument("--command", default="", help="the command that produced the inputs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    checks = Checks()
    body = {"augment": augment, "mlp": mlp, "graphs": graphs, "auto": auto}.get(
        a.scenario, training)(a, checks)
    checks.print()
    out = {"device": body.get("device") or a.device, "date": datetime.date.today().isoformat(),
           "torch": body.get("torch"), "command": a.command, "rows": body["rows"]}
    if "floors" in body:
        out["floors"] = body["floors"]
    out["checks"] = checks.items
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    sys.exit(main())
