"""The A/B of two builds (gpu_check.py ab), judged: its cells, each run's measurement, each cell's
medians and new / old ratio, the result document, its table and exit status."""
import json
import os
import re
import statistics

from lab.compare.rows import fmt, load


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

