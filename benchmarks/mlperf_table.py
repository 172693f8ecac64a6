"""ResNet-50 and ResNet-18 against NVIDIA's MLPerf Training v4.0 per-GPU rate: the rows of
benchmarks/results/mlperf.json from one GPU call's outputs (benchmarks/bundle_check.sh's mlperf
phase writes them into LOGS):

    mlperf-resident.json          compile_bench.py on device-resident batches: tandem's C++ step
                                  (tandem-cpp), torch.compile of the same step, eager
    mlperf-files-SIDES-MODEL.json `tandem bench --workload images --param source=files` from the
                                  generated photo folder of SIDES (320-640, 1000-2000 px): the
                                  loader, decoders and step `tandem train` runs, without its epoch
                                  ends
    mlperf-python-SIDES.json      train_bench.py on that folder: torchvision's loop (DataLoader,
                                  pinned memory, bf16 autocast, channels_last)

Rows {impl, job, batch_size, precision (bf16, fp16), source: resident|photos-320-640|
photos-1000-2000, images_per_s, mlperf_fraction (ResNet-50 only: over 7,160 img/s on an H100, 7,950
on an H200), of_resident (photo rows: over the same impl's resident rate in the same precision where
it has one; torchvision's loop, bf16, over tandem's resident rate in the precision tandem's photo
rows ran), error}. A new run is appended to an existing OUT (--append), its rows tagged with the
run's number, so runs of several calls sit in one file and are compared within a run only.

    python3 benchmarks/mlperf_table.py LOGS OUT.json [--append] [--card NAME] [--command TEXT]
"""
import argparse
import datetime
import glob
import json
import os
import re

from resnet_ab_table import card_name, mlperf_rate

IMPL_NAMES = {"tandem-cpp": "tandem-cpp", "compile": "torch.compile", "eager": "eager"}
FILES = re.compile(r"mlperf-files-(?P<sides>\d+-\d+)-(?P<model>[a-z0-9_]+)\.json$")
PYTHON = re.compile(r"mlperf-python-(?P<sides>\d+-\d+)\.json$")


def load(path):
    with open(path) as f:
        return json.load(f)


def row(impl, job, batch_size, source, rate, mlperf, error=None, precision="bf16"):
    return dict(impl=impl, job=job, batch_size=batch_size, precision=precision, source=source,
                images_per_s=rate,
                mlperf_fraction=rate / mlperf if rate and mlperf and job == "r50_full" else None,
                of_resident=None, error=error)


def rows_of(logs, mlperf):
    """Every row the files in `logs` hold, resident rows first."""
    rows = []
    resident = os.path.join(logs, "mlperf-resident.json")
    if os.path.exists(resident):
        for r in load(resident).get("rows", []):
            rows.append(row(IMPL_NAMES.get(r["impl"], r["impl"]), r["job"], r["batch_size"],
                            "resident", r.get("images_per_s"), mlperf, r.get("error"),
                            r.get("precision", "bf16")))
    for path in sorted(glob.glob(os.path.join(logs, "mlperf-files-*.json"))):
        m = FILES.search(os.path.basename(path))
        if not m:
            continue
        j = load(path)
        rows.append(row("tandem-cpp", m["model"], j.get("batch_size"), f"photos-{m['sides']}",
                        j.get("samples_per_s"), mlperf,
                        precision=j.get("params", {}).get("precision", "bf16")))
    for path in sorted(glob.glob(os.path.join(logs, "mlperf-python-*.json"))):
        m = PYTHON.search(os.path.basename(path))
        if not m:
            continue
        for r in load(path).get("rows", []):
            rows.append(row("torchvision-loop", r["job"], r["batch_size"], f"photos-{m['sides']}",
                            r.get("images_per_s"), mlperf, r.get("error")))
    for r in rows:
        if r["source"] == "resident" or not r["images_per_s"]:
            continue
        # torchvision's loop against tandem's resident step: what a user's model could run at
        base_impl, precision = r["impl"], r["precision"]
        if r["impl"] == "torchvision-loop":
            base_impl = "tandem-cpp"
            precision = next((t["precision"] for t in rows if t["impl"] == "tandem-cpp"
                              and t["source"] == r["source"] and t["job"] == r["job"]),
                             precision)
        base = next((b["images_per_s"] for b in rows if b["source"] == "resident"
                     and b["impl"] == base_impl and b["job"] == r["job"]
                     and b["batch_size"] == r["batch_size"] and b["precision"] == precision
                     and b["images_per_s"]), None)
        r["of_resident"] = r["images_per_s"] / base if base else None
    return rows


def table(logs, card, command, existing=None):
    """The result document: `existing`'s runs and rows (if any), then this run's."""
    doc = existing or dict(
        what="ResNet-50 and ResNet-18, bf16 or fp16, channels-last, against NVIDIA's MLPerf "
             "Training v4.0 per-GPU rate (ResNet-50: 7,160 img/s an H100, 7,950 an H200): "
             "tandem's C++ step, torch.compile and eager on resident batches; tandem's loader "
             "and step and torchvision's loop from generated photo folders. Compare rows of one "
             "run only.",
        runs=[], rows=[])
    run = 1 + max((r["run"] for r in doc["runs"]), default=0)
    doc["runs"].append(dict(run=run, card=card, mlperf_images_per_s=mlperf_rate(card),
                            date=datetime.datetime.now(datetime.timezone.utc)
                            .isoformat(timespec="seconds"), command=command))
    doc["rows"] += [dict(r, run=run) for r in rows_of(logs, mlperf_rate(card))]
    return doc


def lines(doc):
    run = doc["runs"][-1]["run"]
    out = [f"{'impl':18s} {'job':9s} {'bs':>4s} {'prec':4s} {'source':17s} {'img/s':>8s} "
           f"{'of MLPerf':>9s} "
           f"{'of resident':>11s}"]
    for r in (r for r in doc["rows"] if r["run"] == run):
        def f(v, spec):
            return format(v, spec) if v is not None else "-"
        out.append(f"{r['impl']:18s} {r['job']:9s} {r['batch_size'] or 0:4d} "
                   f"{r.get('precision', 'bf16'):4s} {r['source']:17s} "
                   f"{f(r['images_per_s'], '8.0f'):>8s} {f(r['mlperf_fraction'], '.3f'):>9s} "
                   f"{f(r['of_resident'], '.3f'):>11s}" + (f"  {r['error']}" if r["error"] else ""))
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs")
    p.add_argument("out")
    p.add_argument("--append", action="store_true", help="add this run to OUT's runs")
    p.add_argument("--card", default=None, help="the card's name (default: nvidia-smi's)")
    p.add_argument("--command", default="", help="the command the run's numbers came from")
    a = p.parse_args()
    existing = load(a.out) if a.append and os.path.exists(a.out) else None
    doc = table(a.logs, a.card if a.card is not None else card_name(), a.command, existing)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(lines(doc))


if __name__ == "__main__":
    main()
