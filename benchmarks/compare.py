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
import collections
import csv
import datetime
import glob
import io
import json
import os
import re
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
# The reference loops' modes (benchmarks/reference_loops.py) and the tandem runs they are compared
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
    # (files without requested_sampling: its first row, as gpu_check.py asks for auto first); other
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


# The merges of one gpu_check.py phase's scratch folder (RAW): each reads the files the phase's
# runs wrote there, by their names, and writes its result file in its own schema.

def utc_now(timespec="auto"):
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec=timespec)


def engine_share(report):
    """The JPEG engines' share of each batch a split run's notes state (the share it ended at),
    or None where the run made no split."""
    for note in report.get("notes") or []:
        m = re.search(r"the JPEG engines decode ([0-9.]+) of each batch", note)
        if m:
            return float(m.group(1))
    return None


def split_rates(report):
    """The two sides' rates a split run's notes state, as a dict {cpu_images_per_s,
    engine_images_per_s} (what each side decoded over its own busy time, so their sum is the
    run's decode capacity), or None where the run made no split or measured no rates."""
    for note in report.get("notes") or []:
        m = re.search(r"CPU crop regions ([0-9.]+) img/s on [0-9]+ workers, engines ([0-9.]+) "
                      r"img/s", note)
        if m and "the JPEG engines decode" in note:
            return {"cpu_images_per_s": float(m.group(1)),
                    "engine_images_per_s": float(m.group(2))}
    return None


def threads_on_cores(report):
    """How much of a core a split run's threads had, as its notes state it: a dict with
    workers_on_core and worker_switches_per_s (the loader's workers: CPU time over their time on
    the samples, the scheduler's switches a second), engines_thread_on_core and
    engines_thread_switches_per_s (the engines' feed thread over its decode time), each side only
    where stated; None where the run said neither."""
    for note in report.get("notes") or []:
        if "the JPEG engines decode" not in note:
            continue
        found = {}
        m = re.search(r"the workers ([0-9.]+) of their time \(([0-9]+) switches/s\)", note)
        if m:
            found["workers_on_core"] = float(m.group(1))
            found["worker_switches_per_s"] = float(m.group(2))
        m = re.search(r"the engines' thread ([0-9.]+) of its decode time \(([0-9]+) switches/s\)",
                      note)
        if m:
            found["engines_thread_on_core"] = float(m.group(1))
            found["engines_thread_switches_per_s"] = float(m.group(2))
        return found or None
    return None


def load_or_skip(path, result):
    """A run's JSON, or None after saying why (a failed run leaves none, or half of one: the
    result is written without it)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"{result}: skipping {path}: {e}")
        return None


def raw_files(raw, pattern):
    return sorted(glob.glob(os.path.join(raw, pattern)))


def readable(paths, result):
    """(path, document) of each of paths that holds one; the others skipped, saying why."""
    for path in paths:
        d = load_or_skip(path, result)
        if d:
            yield path, d


def data(a):
    """data.json: data_bench.py's rows (decode, training jobs, its loader rows), then every
    `tandem data-bench` run's."""
    rows, loader, device, commands = [], [], None, []
    paths = [os.path.join(a.raw, "data-python.json")] + raw_files(a.raw, "data-tandem-*.json")
    for path, d in readable(paths, "data.json"):
        device = device or d.get("device")
        commands.append(d.get("command", path))
        rows += d.get("rows", [])
        loader += d.get("loader", [])
    with open(a.out, "w") as f:
        json.dump({"device": device, "date": utc_now("seconds"), "command": " ; ".join(commands),
                   "rows": rows, "loader": loader}, f, indent=2)
    print(f"wrote {a.out}: {len(rows)} rows")


def samples_per_s(doc):
    """A `tandem bench --json` document's rate (its first run's, where it holds several)."""
    d = doc["runs"][0] if "runs" in doc else doc
    return d.get("samples_per_s")


def train(a):
    """train.json: `tandem train` (train-tandem-TAG.json, TAG "fmnist" or MODEL-PRECISION-LAYOUT)
    with the same step on device-resident data (resident-TAG.json) beside train_bench.py's rows;
    the segmentation runs (MODEL seg_fcn_r18) go to train-seg.json beside it, since train.json's
    jobs are classifiers."""
    rows, commands, device = [], [], None
    seg_rows, seg_commands = [], []

    def resident(tag):
        d = load_or_skip(os.path.join(a.raw, f"resident-{tag}.json"), "train.json")
        return samples_per_s(d) if d else None

    for path, d in readable(raw_files(a.raw, "train-tandem-*.json"), "train.json"):
        device = device or d.get("device")
        tag = os.path.basename(path)[len("train-tandem-"):-len(".json")]
        job = "fashion_mnist" if tag == "fmnist" else tag.split("-")[0]
        layout = None if tag == "fmnist" else tag.split("-")[2]
        row = {"impl": "tandem", "job": job, "precision": d["precision"],
               "batch_size": d["batch_size"], "images_per_s": d["images_per_s"]}
        if job == "seg_fcn_r18":
            seg_rows.append(row | {"miou": d.get("accuracy"),  # tandem train's headline metric
                                   "epochs": d["epochs"], "layout": layout})
            seg_commands.append(d["command"])
            continue
        commands.append(d["command"])
        rows.append(row | {"resident_images_per_s":
                           None if job == "fashion_mnist" else resident(tag),
                           "accuracy": d.get("accuracy"), "epochs": d["epochs"], "layout": layout})
    for path, d in readable(raw_files(a.raw, "train-python-*.json"), "train.json"):
        commands.append(d.get("command", path))
        device = d.get("device") or device
        rows += d.get("rows", [])
    now = utc_now()
    if rows:
        with open(a.out, "w") as f:
            json.dump({"device": device, "date": now, "command": " ; ".join(commands),
                       "rows": rows}, f, indent=2)
        print(f"wrote {a.out}: {len(rows)} rows")
    if seg_rows:
        seg_out = os.path.join(os.path.dirname(a.out), "train-seg.json")
        with open(seg_out, "w") as f:
            json.dump({"device": device, "date": now, "command": " ; ".join(seg_commands),
                       "rows": seg_rows}, f, indent=2)
        print(f"wrote {seg_out}: {len(seg_rows)} rows")
    for r in rows + seg_rows:
        print(r)


DDP_RUN = re.compile(r"ddp-tandem-(\w+)-(.+)-(\d+)-w(\d+)(-allreduced)?\.json")


def ddp(a):
    """ddp.json: `tandem bench --nproc W` runs (ddp-tandem-SCENARIO-MODE-BS-wW[-allreduced].json)
    and ddp_reference.py's rows (ddp-python.json); then per scenario, batch size and world the
    best mode's steps/s per GPU, its scaling over world 1 and its ratio to PyTorch DDP, and the
    gathered GatheredGrad layers against the all-reduced ones."""
    rows, commands, device = [], [], None
    for path in raw_files(a.raw, "ddp-tandem-*.json"):
        d = load(path)
        m = DDP_RUN.match(os.path.basename(path))
        scen, mode, bs, world = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        gathered = m.group(5) is None
        device = device or d.get("device_name") or d.get("device")
        dp = d.get("data_parallel") or {}
        rate = d["steps_per_s"]
        rows.append({"impl": "tandem", "scenario": scen, "mode": mode, "batch_size_per_gpu": bs,
                     "world": world, "steps_per_s_per_gpu": rate,
                     "steps_per_s_slowest_rank": dp.get("steps_per_s_slowest_rank", rate),
                     "backend": dp.get("backend"),
                     "gathered_grad": gathered if world > 1 else None})
        commands.append(f"tandem bench --workload {scen} --mode {mode} --batch-size {bs} "
                        f"--workers 8 --nproc {world}"
                        + ("" if gathered else " --no-gathered-grad"))
    py = os.path.join(a.raw, "ddp-python.json")
    if os.path.exists(py):
        d = load(py)
        rows += d["rows"]
        commands.append(d.get("command", "ddp_reference.py"))
    worlds = max([r["world"] for r in rows] or [1])
    if device and worlds > 1:
        device = f"{worlds}x {device} (one host)"
    with open(a.out, "w") as f:
        json.dump({"device": device, "date": utc_now(),
                   "command": f"{a.command}: " + " ; ".join(commands), "rows": rows}, f, indent=2)
    print(f"wrote {a.out}: {len(rows)} rows")
    best = {}
    for r in rows:
        if r.get("gathered_grad") is False:
            continue  # the comparison runs, printed below
        k = (r["impl"], r["scenario"], r["batch_size_per_gpu"], r["world"])
        best[k] = max(best.get(k, 0), r["steps_per_s_per_gpu"])
    for (impl, scen, bs, world), v in sorted(best.items()):
        w1 = best.get((impl, scen, bs, 1))
        py2 = best.get(("python", scen, bs, world))
        print(f"{impl:7s} {scen} bs {bs:4d} world {world}: {v:8.2f} steps/s/GPU"
              + (f"  scaling {v / w1:.3f}" if w1 and world > 1 else "")
              + (f"  vs python {v / py2:.2f}x" if impl == "tandem" and py2 else ""))
    for r in rows:
        if r.get("gathered_grad") is not False:
            continue
        same = ("scenario", "mode", "batch_size_per_gpu", "world")
        g = [x for x in rows if x.get("gathered_grad") and all(x[k] == r[k] for k in same)]
        if g:
            print(f"gathered vs all-reduced: {r['scenario']} bs {r['batch_size_per_gpu']} world "
                  f"{r['world']} {r['mode']}: {g[0]['steps_per_s_per_gpu']:.2f} vs "
                  f"{r['steps_per_s_per_gpu']:.2f} steps/s/GPU "
                  f"({g[0]['steps_per_s_per_gpu'] / r['steps_per_s_per_gpu']:.3f}x)")


DECODERS = ("turbojpeg_scaled", "turbojpeg_region", "turbojpeg_center", "turbojpeg_full", "pil",
            "torchvision.io", "tandem_scaled", "tandem_full")


def decode(a):
    """decode.json: per round N, `tandem data-bench`'s CPU decode rows (decode-tandem-N.json) and
    data_bench.py's (decode-python-N.json), every row kept with its round; each decoder's median
    img/s over the rounds and, per round and as a median, the ratios to PIL (one round's ratio
    holds on a host whose speed drifts between rounds)."""
    rows, per_round = [], []
    for t in raw_files(a.raw, "decode-tandem-*.json"):
        n = t.rsplit("-", 1)[1].split(".")[0]
        rates = {}
        for path in (t, os.path.join(a.raw, f"decode-python-{n}.json")):
            for r in load(path)["rows"]:
                if r.get("job") == "decode" and r.get("decode") == "cpu":
                    r["round"] = int(n)
                    rows.append(r)
                    rates[r["decoder"]] = r["images_per_s_per_core"]
        per_round.append(rates)
    summary = {}
    for d in DECODERS:
        vals = [r[d] for r in per_round if d in r]
        if vals:
            summary[d] = statistics.median(vals)
    for name, num in (("cli_scaled_over_pil", "turbojpeg_scaled"),
                      ("interleaved_scaled_over_pil", "tandem_scaled"),
                      ("interleaved_full_over_pil", "tandem_full")):
        ratios = [r[num] / r["pil"] for r in per_round if num in r and "pil" in r]
        summary[name + "_per_round"] = ratios
        summary[name + "_median"] = statistics.median(ratios) if ratios else None
    with open(a.out, "w") as f:
        json.dump({"device": a.device, "date": utc_now("seconds"), "command": a.command,
                   "summary": summary, "rows": rows}, f, indent=2)
    print("decode medians (img/s on one core):",
          {k: round(v, 2) for k, v in summary.items() if isinstance(v, float)})
    for k, v in summary.items():
        if k.endswith("_per_round"):
            print(k, [round(x, 3) for x in v])


class TextOut:
    """Lines printed and kept, then written to --out as well (pair's and pair-kernels' result is
    the text itself)."""

    def __init__(self, path):
        self.path, self.lines = path, []

    def print(self, line):
        print(line)
        self.lines.append(line)

    def close(self):
        with open(self.path, "w") as f:
            f.write("".join(line + "\n" for line in self.lines))


PAIR_RUN = re.compile(r"pair-(\w+)-(.+)-(\d+)\.json")
PAIR_VARIANTS = ("bench", "nobench", "normalprio", "streamprio")


def pair(a):
    """pair.txt: each pair run (pair-VARIANT-MODE-ROUND.json) with its stages' device times, then
    per variant the median steps/s of pipelined and pipelined+graphed and their ratio."""
    out, runs = TextOut(a.out), {}
    for path in raw_files(a.raw, "pair-*.json"):
        variant, mode, rnd = PAIR_RUN.match(os.path.basename(path)).groups()
        r = load(path)
        runs.setdefault((variant, mode), []).append(r)
        stages = "  ".join(f"{s['name']} {s['device_ms_per_step']:.3f}" for s in r["stages"]
                           if s["device_ms_per_step"] is not None)
        out.print(f"{variant:10s} {mode:18s} round {rnd}: {r['steps_per_s']:8.2f} steps/s  "
                  f"device ms/step: {stages}  util {r['gpu_utilization']}")
    for variant in PAIR_VARIANTS:
        eager, graphed = runs.get((variant, "pipelined")), runs.get((variant, "pipelined+graphed"))
        if eager and graphed:
            me = statistics.median(x["steps_per_s"] for x in eager)
            mg = statistics.median(x["steps_per_s"] for x in graphed)
            out.print(f"{variant:10s} median pipelined {me:.2f}, pipelined+graphed {mg:.2f}: "
                      f"ratio {mg / me:.3f}")
    out.close()


NCU_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def ncu_kernels(path):
    """Per kernel (name cut to 90 characters) of an `ncu --csv --metrics gpu__time_duration.sum`
    output: [launches, total µs]; and the launches in all."""
    with open(path) as f:
        text = f.read()
    start = text.find('"ID"')  # ncu prints the program's own output before its CSV
    stats = collections.defaultdict(lambda: [0, 0.0])
    for r in csv.DictReader(io.StringIO(text[start:])) if start >= 0 else []:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "")
        if unit not in NCU_US:
            sys.exit(f"{path}: ncu reported gpu__time_duration in '{unit}': expected ns, us or ms")
        key = r["Kernel Name"][:90]
        stats[key][0] += 1
        stats[key][1] += float(r["Metric Value"].replace(",", "")) * NCU_US[unit]
    return stats, sum(s[0] for s in stats.values())


def pair_kernels(a):
    """pair-kernels.txt: the kernels of pipelined (ncu-pair-pipelined.csv) beside those of
    pipelined+graphed (ncu-pair-pipelined+graphed.csv): launches and µs per launch each."""
    out = TextOut(a.out)
    eager, ne = ncu_kernels(os.path.join(a.raw, "ncu-pair-pipelined.csv"))
    graphed, ng = ncu_kernels(os.path.join(a.raw, "ncu-pair-pipelined+graphed.csv"))
    out.print(f"kernels profiled: pipelined {ne}, pipelined+graphed {ng}")
    out.print(f"{'kernel':90s} {'n eager':>8s} {'us/launch':>10s} {'n graph':>8s} "
              f"{'us/launch':>10s}")
    none = [0, 0.0]
    for k in sorted(set(eager) | set(graphed),
                    key=lambda k: -(eager.get(k, none)[1] + graphed.get(k, none)[1])):
        ce, te = eager.get(k, none)
        cg, tg = graphed.get(k, none)
        out.print(f"{k:90s} {ce:8d} {te / ce if ce else 0:10.2f} {cg:8d} "
                  f"{tg / cg if cg else 0:10.2f}")
    te = sum(s[1] for s in eager.values()) / max(ne, 1)
    tg = sum(s[1] for s in graphed.values()) / max(ng, 1)
    out.print(f"mean us per launch: pipelined {te:.2f}, pipelined+graphed {tg:.2f}")
    out.close()


# The A/B of two builds (gpu_check.py ab): a cell is JOB:BATCH:MODE, JOB a workload of
# `tandem bench` (MODE its mode), augment (`tandem augment-bench`, MODE its sampling), train
# (`tandem train`) or one of PHOTO_JOBS.
CELL = re.compile(r"^([a-z0-9_]+):([0-9]+):([a-z_+]+)$")
# A/B jobs of workload images from a folder of large photos: (the model each trains, where its
# JPEGs are decoded): auto (the CPU workers and the JPEG engines) or cpu (the workers alone).
PHOTO_JOBS = {"photos_r18": ("r18_full", "auto"), "photos_r50": ("r50_full", "auto"),
              "photos_r18_cpu": ("r18_full", "cpu"), "photos_r50_cpu": ("r50_full", "cpu")}


def parse_cell(text):
    """("seg", 8, "pipelined") from "seg:8:pipelined"; ValueError naming the text otherwise."""
    m = CELL.match(text)
    if not m:
        raise ValueError(f"cell '{text}': expected JOB:BATCH:MODE, e.g. seg:8:pipelined")
    return m.group(1), int(m.group(2)), m.group(3)


def tail_text(path, lines=12, chars=1500):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        return f"(no output: {e})"
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def ab_measurement(run, timeout_s):
    """(steps/s, error, (first loss, last loss)) of one A/B run, a dict with its round, side,
    job, mode, batch_size, rc (exit status), json and out (its output) paths; the rate is None
    where the run failed, and the error says why."""
    job, mode, bs, rc = run["job"], run["mode"], run["batch_size"], run["rc"]
    if rc in (124, 137):
        return None, f"timed out after {timeout_s} s (exit {rc})", None
    if rc != 0:
        return None, f"exit {rc}", None
    try:
        r = load(run["json"])
        if job == "augment":  # augment-bench's rows: the batch size's, in the asked sampling
            mine = [x for x in r if x.get("batch_size") == bs
                    and x.get("requested_sampling", x.get("sampling")) == mode]
            if not mine:
                return None, f"no row of batch size {bs}, sampling {mode}", None
            r, got = mine[0], (job, mode, bs)
        elif job == "train":  # tandem train's report: the epochs' steady img/s, its losses
            got = ("train", r.get("mode"), r.get("batch_size"))
            rows = r.get("rows") or [{}]
            r = {"steps_per_s": (r.get("images_per_s") or 0) / bs,
                 "first_loss": rows[0].get("train_loss"), "last_loss": rows[-1].get("train_loss")}
        elif job in PHOTO_JOBS:  # tandem bench --workload images --param model=... decode=...
            params = r.get("params") or {}
            model, decode = params.get("model"), params.get("decode")
            got = (job if r.get("scenario") == "images" and (model, decode) == PHOTO_JOBS[job]
                   else f"{r.get('scenario')} ({model}, decode {decode})", r.get("mode"),
                   r.get("batch_size"))
        else:
            got = (r.get("scenario", r.get("workload")), r.get("mode"), r.get("batch_size"))
        if got != (job, mode, bs):
            return None, f"asked for {(job, mode, bs)}, the JSON says {got}", None
        if not r.get("steps_per_s") or r["steps_per_s"] <= 0:
            return None, f"steps_per_s is {r.get('steps_per_s')!r}", None
        # A split that follows both sides' rates decodes by timing: its losses are not compared.
        losses = (None if job == "augment" or job in PHOTO_JOBS
                  else (r.get("first_loss"), r.get("last_loss")))
        return float(r["steps_per_s"]), None, losses
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"exit 0 but no result in {os.path.basename(run['json'])}: {e}", None


def ab_rows(runs, cells, min_ratio, timeout_s):
    """Per cell (in the order given): each side's median steps/s over its good runs, new / old,
    PASS at ratio >= min_ratio, and whether every run's first and last loss agree (the same
    computation on both sides: for the record, not part of PASS). Returns (rows, failed runs,
    cells without a ratio, cells below the ratio)."""
    by_cell, failed = {}, 0
    for run in runs:
        value, error, losses = ab_measurement(run, timeout_s)
        if error:
            failed += 1
            error += "\n" + tail_text(run["out"])
        by_cell.setdefault((run["job"], run["batch_size"], run["mode"], run["side"]), []).append(
            {"round": run["round"], "steps_per_s": value, "error": error, "losses": losses})
    rows, missing, below = [], 0, 0
    for job, bs, mode in cells:
        row = {"job": job, "mode": mode, "batch_size": bs}
        errors, losses = [], {}
        for side in ("old", "new"):
            mine = sorted(by_cell.get((job, bs, mode, side), []), key=lambda x: x["round"])
            values = [x["steps_per_s"] for x in mine]
            good = [v for v in values if v is not None]
            row[side] = statistics.median(good) if good else None
            row[f"{side}_runs"] = values
            errors += [{"side": side, "round": x["round"], "error": x["error"]}
                       for x in mine if x["error"]]
            losses[side] = {x["losses"] for x in mine if x["losses"]}
        old, new = row["old"], row["new"]
        row["ratio"] = round(new / old, 4) if old and new else None
        row["pass"] = row["ratio"] is not None and row["ratio"] >= min_ratio
        if row["ratio"] is None:
            missing += 1
        elif not row["pass"]:
            below += 1
        row["same_losses"] = (len(losses["old"] | losses["new"]) == 1
                              if losses["old"] and losses["new"] else None)
        ordered = {k: row[k] for k in ("job", "mode", "batch_size", "old", "new", "ratio",
                                       "old_runs", "new_runs", "pass", "same_losses")}
        rows.append(ordered | ({"errors": errors} if errors else {}))
    return rows, failed, missing, below


def ab_result(meta, runs, cells):
    """The A/B's result document: meta's device, date, command, old_commit, rounds, min_ratio,
    timeout_s, stopped and builds, the rows of ab_rows(), and the counts print_ab() judges by
    (under "counts", left out of the written file)."""
    rows, failed, missing, below = ab_rows(runs, cells, meta["min_ratio"], meta["timeout_s"])
    return {"device": meta["device"], "date": meta["date"], "command": meta["command"],
            "old_commit": meta["old_commit"], "rounds": meta["rounds"],
            "rounds_run": len({r["round"] for r in runs}), "min_ratio": meta["min_ratio"],
            "stopped": meta.get("stopped") or None, "builds": meta["builds"], "rows": rows,
            "counts": {"failed": failed, "missing": missing, "below": below}}


def write_ab(path, result):
    with open(path, "w") as f:
        json.dump({k: v for k, v in result.items() if k != "counts"}, f, indent=1)
        f.write("\n")


def print_ab(result):
    """The A/B's table; returns its exit status: 0 every run done and every cell PASS, 3 every
    run done and some cell below the ratio, 1 a run failed, a cell has no ratio or the budget
    stopped the runs."""
    rows, counts = result["rows"], result["counts"]
    print(f"\nA/B on {result['device']}: new / old ({result['old_commit']}) steps/s, medians of "
          f"{result['rounds_run']} of {result['rounds']} round(s); PASS at ratio >= "
          f"{result['min_ratio']}")
    print(f"{'job':<8} {'mode':<18} {'batch':>5} {'old steps/s':>11} {'new steps/s':>11} "
          f"{'ratio':>6}  {'verdict':<7} {'runs old/new':>12}  same losses")
    for r in rows:
        verdict = "PASS" if r["pass"] else ("FAIL" if r["ratio"] is not None else "MISSING")
        counted = " ".join(f"{sum(v is not None for v in r[s])}/{len(r[s])}"
                           for s in ("old_runs", "new_runs"))
        same = {True: "yes", False: "NO", None: "-"}[r["same_losses"]]
        print(f"{r['job']:<8} {r['mode']:<18} {r['batch_size']:>5} {fmt(r['old'], 11, 2)} "
              f"{fmt(r['new'], 11, 2)} {fmt(r['ratio'], 6, 3)}  {verdict:<7} {counted:>12}  {same}")
    for r in rows:
        for e in r.get("errors", []):
            print(f"failed: {r['job']} {r['mode']} bs {r['batch_size']} {e['side']} round "
                  f"{e['round']}: {e['error'].splitlines()[0]}")
    if result["stopped"]:
        print(f"stopped early: {result['stopped']}")
    print(f"{sum(r['pass'] for r in rows)} of {len(rows)} cells PASS; {counts['failed']} failed "
          f"run(s); {counts['missing']} cell(s) without a ratio")
    if counts["failed"] or counts["missing"] or result["stopped"]:
        return 1
    return 3 if counts["below"] else 0


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
