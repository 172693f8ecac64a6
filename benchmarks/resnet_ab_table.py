"""The ResNets' training step, one build against another, from the `tandem bench --json` files
benchmarks/bundle_check.sh's resnet_ab phase writes (resnet-MODEL-new|old-ROUND.json in LOGS):
each run's img/s, the best of each build's rounds, new over old, and ResNet-50's rate against
NVIDIA's MLPerf Training v4.0 per-GPU rate for the card (about 7,160 img/s an H100, 7,950 an
H200).

    python3 benchmarks/resnet_ab_table.py LOGS OUT.json [--card NAME]
"""
import argparse
import glob
import json
import os
import re
import subprocess

# MLPerf Training v4.0, NVIDIA's ResNet-50 submissions, images per second per GPU.
MLPERF_IMAGES_PER_S = {"H100": 7160, "H200": 7950}
FILE = re.compile(r"resnet-(?P<model>.+)-(?P<build>new|old)-(?P<round>\d+)\.json$")


def card_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def mlperf_rate(card: str):
    return next((rate for name, rate in MLPERF_IMAGES_PER_S.items() if name in card), None)


def table(logs: str, card: str) -> dict:
    mlperf = mlperf_rate(card)
    rows = []
    for path in sorted(glob.glob(os.path.join(logs, "resnet-*.json"))):
        m = FILE.search(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            rate = json.load(f).get("samples_per_s")
        fraction = rate / mlperf if rate and mlperf and m["model"] == "r50_full" else None
        rows.append(dict(model=m["model"], build=m["build"], round=int(m["round"]),
                         images_per_s=rate, mlperf_fraction=fraction))
    summary = {}
    for model in sorted({r["model"] for r in rows}):
        best = {b: max((r["images_per_s"] or 0.0 for r in rows
                        if r["model"] == model and r["build"] == b), default=0.0)
                for b in ("new", "old")}
        summary[model] = dict(new=best["new"], old=best["old"],
                              new_over_old=best["new"] / best["old"] if best["old"] else None)
    return dict(card=card, mlperf_images_per_s=mlperf, rows=rows, summary=summary)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs")
    p.add_argument("out")
    p.add_argument("--card", default=None, help="the card's name (default: nvidia-smi's)")
    a = p.parse_args()
    t = table(a.logs, card_name() if a.card is None else a.card)
    with open(a.out, "w") as f:
        json.dump(t, f, indent=1)
    for model, s in t["summary"].items():
        ratio = f"{s['new_over_old']:.3f}" if s["new_over_old"] else "-"
        print(f"resnet_ab {model}: new {s['new']:.0f} img/s, old {s['old']:.0f}, new/old {ratio}")


if __name__ == "__main__":
    main()
