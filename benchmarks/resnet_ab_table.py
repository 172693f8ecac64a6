"""The ResNets' training step, one build against another, from the `tandem bench --json` files
benchmarks/bundle_check.sh's resnet_ab phase writes (resnet-MODEL-new|old|tuned|tuned2-ROUND.json in
LOGS, each process's wall seconds beside in .wall): each run's img/s, the best of each build's
rounds, new over old (and each tuned variant over new), the median process's wall seconds, and ResNet-50's
rate against NVIDIA's MLPerf Training v4.0 per-GPU rate for the card (about 7,160 img/s an H100,
7,950 an H200).

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
FILE = re.compile(r"resnet-(?P<model>.+)-(?P<build>new|old|tuned2|tuned)-(?P<round>\d+)\.json$")
BUILDS = ("new", "old", "tuned", "tuned2")  # the new build with RESNET_AB_TUNED(2)'s flags


def card_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def mlperf_rate(card: str):
    return next((rate for name, rate in MLPERF_IMAGES_PER_S.items() if name in card), None)


def process_seconds(path: str):
    """A run's process wall seconds, as the phase wrote them beside its JSON; None without."""
    try:
        with open(path) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


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
                         images_per_s=rate, mlperf_fraction=fraction,
                         wall_s=process_seconds(path[:-len(".json")] + ".wall")))
    summary = {}
    for model in sorted({r["model"] for r in rows}):
        ran = [b for b in BUILDS if any(r["model"] == model and r["build"] == b for r in rows)]
        best = {b: max((r["images_per_s"] or 0.0 for r in rows
                        if r["model"] == model and r["build"] == b), default=0.0)
                for b in ran}
        s = dict(new=best.get("new", 0.0), old=best.get("old", 0.0))
        s["new_over_old"] = s["new"] / s["old"] if s["old"] else None
        for variant in ("tuned", "tuned2"):
            if variant in best:
                s[variant] = best[variant]
                s[f"{variant}_over_new"] = best[variant] / s["new"] if s["new"] else None
        for b in ran:  # the median process's wall seconds, each build's
            walls = sorted(r["wall_s"] for r in rows
                           if r["model"] == model and r["build"] == b and r["wall_s"] is not None)
            s[f"{b}_wall_s"] = walls[len(walls) // 2] if walls else None
        summary[model] = s
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
        line = f"resnet_ab {model}: new {s['new']:.0f} img/s, old {s['old']:.0f}, new/old {ratio}"
        for variant in ("tuned", "tuned2"):
            if variant in s:
                ratio = f"{s[f'{variant}_over_new']:.3f}" if s[f"{variant}_over_new"] else "-"
                line += f", {variant} {s[variant]:.0f} ({variant}/new {ratio})"
        walls = ", ".join(f"{b} {s[f'{b}_wall_s']:.1f} s" for b in BUILDS
                          if s.get(f"{b}_wall_s") is not None)
        print(line + (f"; process wall: {walls}" if walls else ""))


if __name__ == "__main__":
    main()
