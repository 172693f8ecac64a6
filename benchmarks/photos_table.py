#!/usr/bin/env python3
"""Merges one photos run (benchmarks/gpu_check.py's photos phase) into photos.json and prints it.

Inputs, all in RAW (the phase's scratch folder), SIDES being "320-640" or "1000-2000":
  photos-train-SIDES-MODEL-CROP.json
                                  `tandem train --json --decode cpu` (MODEL r18_full | r50_full,
                                  CROP whole | region): images_per_s, eval_images_per_s, accuracy
  photos-train-SIDES-MODEL-region-auto.json
                                  the same with --decode auto (the engines' share in its notes)
  photos-files-SIDES-MODEL-CROP.json
                                  `tandem bench --workload images --param source=files`: the
                                  training rate from the JPEGs with the loader running on across
                                  epochs (no evaluation, no checkpoint): the row's images_per_s
  photos-files-SIDES-MODEL-region-auto.json
                                  the same with decode=auto: each batch split between the CPU
                                  workers and the JPEG engines (a row with decode "auto" and the
                                  workers' share, read from the run's notes)
  photos-resident-MODEL.json      `tandem bench --workload images --param source=resident`
  photos-databench-SIDES.json     `tandem data-bench --steps 0`: the decode rows (CPU per core,
                                  whole-image and crop-region; nvJPEG from one thread)
  photos-python-SIDES.json        benchmarks/train_bench.py's image rows (torchvision's loop)

photos.json: {device, date, command, rows: [{impl: "tandem"|"python", job, sides, precision,
batch_size, decode: "cpu", crop, images_per_s, eval_images_per_s, resident_images_per_s,
cpu_share, of_resident, train_images_per_s, of_bound}]} and, per folder, the decode rows under
"decode". A split row (decode "auto") also holds the two sides' rates in the run
(cpu_images_per_s, engine_images_per_s: each side's images over its own busy time) and their sum,
decode_capacity_images_per_s; of_bound is the rate over min(resident, that capacity); where the
run said, how much of a core each side's threads had (workers_on_core, worker_switches_per_s,
engines_thread_on_core, engines_thread_switches_per_s: compare.threads_on_cores). A bench
run without a train run beside it (--no-photos-train) is a row of its own, without evaluation;
with --photos-shrink, the runs from the folder `tandem shrink` wrote
(photos-files-SIDES-MODEL-CROP-shrunk[-auto].json) are rows with folder "shrunk" (the others
"original"), and each folder's shrink summary (photos-shrink-SIDES.json) is under "shrink".
images_per_s is the bench rate where there is one (else `tandem train`'s); train_images_per_s
is `tandem train`'s steady epoch rate, which a folder whose epoch fits in the loader's ring
overstates (the ring fills during each epoch end's evaluation and checkpoint).
Usage: photos_table.py RAW OUT_JSON COMMAND
"""
import datetime
import glob
import json
import os
import sys

from compare import (engine_share, load_or_skip, split_rates,  # benchmarks/compare.py's readers
                     threads_on_cores)


def load(path):
    return load_or_skip(path, "photos")


def rate(doc):
    if not doc:
        return None
    d = doc["runs"][0] if "runs" in doc else doc
    return d.get("samples_per_s")


def cpu_share(doc):
    """The CPU workers' share of a split run: 1 - the engines' share its notes state."""
    share = engine_share(doc["runs"][0] if "runs" in doc else doc)
    # No split happened (no engines): the workers decoded everything.
    return 1.0 if share is None else round(1 - share, 4)


def capacity(doc):
    """A split run's two sides' rates in the run and their sum, the decode capacity, and how
    much of a core each side's threads had where the run said (fields for its row); {} where it
    made no split."""
    run = (doc["runs"][0] if "runs" in doc else doc) if doc else None
    rates = split_rates(run) if run else None
    if not rates:
        return {}
    return rates | (threads_on_cores(run) or {}) | {
        "decode_capacity_images_per_s": rates["cpu_images_per_s"] + rates["engine_images_per_s"]}


def of_bound(row):
    """The row's rate over what bounds it: min(resident rate, decode capacity) where both are
    known, else the resident rate."""
    bound = [v for v in (row.get("resident_images_per_s"),
                         row.get("decode_capacity_images_per_s")) if v]
    img = row.get("images_per_s")
    return round(img / min(bound), 3) if img and bound else None


def main(raw, out, command):
    rows, decode, device = [], {}, None
    resident = {os.path.basename(p)[len("photos-resident-"):-5]: rate(load(p))
                for p in glob.glob(f"{raw}/photos-resident-*.json")}
    for p in sorted(glob.glob(f"{raw}/photos-train-*.json")):
        d = load(p)
        if not d:
            continue
        # photos-train-320-640-r18_full-whole.json, photos-train-320-640-r18_full-region-auto.json:
        # the sides hold a dash of their own; "-auto": the decode split with the JPEG engines
        stem = os.path.basename(p)[len("photos-train-"):-5]
        parts = stem.split("-")
        sides, job, crop = f"{parts[0]}-{parts[1]}", parts[2], parts[3]
        split = len(parts) > 4 and parts[4] == "auto"
        device = device or d.get("device")
        res = resident.get(job)
        files_path = f"{raw}/photos-files-{stem}.json"
        files = load(files_path) if os.path.exists(files_path) else None
        img = rate(files) or d.get("images_per_s")
        rows.append({"impl": "tandem", "job": job, "sides": sides, "precision": d.get("precision"),
                     "batch_size": d.get("batch_size"), "decode": "auto" if split else "cpu",
                     "crop": crop, "folder": "original", "images_per_s": img,
                     "eval_images_per_s": d.get("eval_images_per_s"),
                     "resident_images_per_s": res,
                     "cpu_share": cpu_share(files or d) if split else 1.0,
                     "train_cpu_share": cpu_share(d) if split else None,
                     "accuracy": d.get("accuracy"),
                     "train_images_per_s": d.get("images_per_s"),
                     "of_resident": img / res if res and img else None}
                    | (capacity(files or d) if split else {}))
    trained = {(r["sides"], r["job"], r["crop"], r["decode"]) for r in rows}
    # The bench's runs without a train run beside them (the phase's --no-photos-train): a row of
    # their own, with no evaluation.
    for p in sorted(glob.glob(f"{raw}/photos-files-*.json")):
        d = load(p)
        if not d:
            continue
        parts = os.path.basename(p)[len("photos-files-"):-5].split("-")
        sides, job, crop, flags = f"{parts[0]}-{parts[1]}", parts[2], parts[3], parts[4:]
        split, shrunk = "auto" in flags, "shrunk" in flags
        if not shrunk and (sides, job, crop, "auto" if split else "cpu") in trained:
            continue  # its row is the train run's, with this rate
        device = device or d.get("device")
        res, img = resident.get(job), rate(d)
        rows.append({"impl": "tandem", "job": job, "sides": sides, "precision": "bf16",
                     "batch_size": 256, "decode": "auto" if split else "cpu", "crop": crop,
                     "folder": "shrunk" if shrunk else "original",
                     "images_per_s": img, "eval_images_per_s": None,
                     "resident_images_per_s": res, "cpu_share": cpu_share(d) if split else 1.0,
                     "of_resident": img / res if res and img else None}
                    | (capacity(d) if split else {}))
    for r in rows:
        r["of_bound"] = of_bound(r)
    for p in sorted(glob.glob(f"{raw}/photos-python-*.json")):
        d = load(p)
        if not d:
            continue
        sides = os.path.basename(p)[len("photos-python-"):-5]
        for r in d.get("rows", []):
            if r.get("job") in ("r18_full", "r50_full", "r50_frozen_head"):
                rows.append({"impl": "python", "job": r["job"], "sides": sides,
                             "precision": r.get("precision"), "batch_size": r.get("batch_size"),
                             "decode": "cpu", "crop": "torchvision", "layout": r.get("layout"),
                             "images_per_s": r.get("images_per_s"), "eval_images_per_s": None,
                             "resident_images_per_s": r.get("resident_images_per_s"),
                             "cpu_share": 1.0})
    for p in sorted(glob.glob(f"{raw}/photos-databench-*.json")):
        d = load(p)
        if d:
            decode[os.path.basename(p)[len("photos-databench-"):-5]] = [
                r for r in d.get("rows", []) if r.get("job") == "decode"]
    shrink = {}
    for p in sorted(glob.glob(f"{raw}/photos-shrink-*.json")):
        d = load(p)
        if d:
            shrink[os.path.basename(p)[len("photos-shrink-"):-5]] = {
                k: d.get(k) for k in ("files", "shrunk", "kept", "bytes_in", "bytes_out",
                                      "seconds", "min_area")}
    doc = {"device": device, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": command, "rows": rows, "decode": decode}
    if shrink:
        doc["shrink"] = shrink
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    fmt = "{:6s} {:9s} {:9s} {:13s} {:6s} {:>9s} {:>9s} {:>9s} {:>6s} {:>9s} {:>6s} {:>9s}"
    print(fmt.format("impl", "job", "sides", "crop", "decode", "img/s", "eval", "resident",
                     "of res", "capacity", "of cap", "train cli"))
    for r in rows:
        num = lambda v: f"{v:.0f}" if v else "-"  # noqa: E731
        ratio = lambda v: f"{v:.2f}" if v else "-"  # noqa: E731
        cap = r.get("decode_capacity_images_per_s")
        crop = r["crop"] + ("+shrunk" if r.get("folder") == "shrunk" else "")
        print(fmt.format(r["impl"], r["job"], r["sides"], crop, r["decode"],
                         num(r["images_per_s"]),
                         num(r["eval_images_per_s"]), num(r["resident_images_per_s"]),
                         ratio(r.get("of_resident")), num(cap),
                         ratio(r["images_per_s"] / cap if cap and r["images_per_s"] else None),
                         num(r.get("train_images_per_s"))))
    for sides, decode_rows in decode.items():
        for r in decode_rows:
            print(f"decode {sides:9s} {r.get('decoder', ''):18s} {r.get('images_per_s', 0):8.0f} img/s")
    print(f"wrote {out}: {len(rows)} rows")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
