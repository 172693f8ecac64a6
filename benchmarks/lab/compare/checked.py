"""compare.py's comparisons of the reference workloads, each with its acceptance checks: seg and
cls (training), augment, mlp, graphs and auto. Each returns its result's body; compare.py writes it
with the checks."""
import statistics

from lab.compare.rows import (PYTHON_TO_TANDEM, fmt, is_result, label, load, load_all,
                              load_floors, mode_rank, steps_per_s, tandem_row)


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

