"""compare.py's merges of one gpu_check.py phase's scratch folder (RAW): each reads the files the
phase's runs wrote there, by their names, and writes its result file in its own schema (data,
train, ddp, decode, pair, pair-kernels); also the readers of a split run's notes that
benchmarks/photos_table.py and the shares phase use."""
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

from lab.compare.rows import load


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

