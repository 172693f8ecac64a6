"""The phases on folders of large photos: photos (tandem train per crop and decode, the bench's
rates, torchvision's loop), enginetrace (the JPEG engines' batched call under the profiler) and
shares (the engines' share of a batch against the rate). photos_bench is also the ab phase's
photos cells' command."""
import gzip
import json
import os
import shutil
import statistics
import time

from lab.check import PROG, PYTHON, cpu_count, joined, phase
from lab.compare.merges import engine_share, threads_on_cores
from lab.options import enginetrace_options, photos_options, shares_options


@phase("photos", photos_options)
def phase_photos(c, a):
    """photo folders of --photos-sides: tandem train per crop and decode, the bench's rates,
    data-bench's decode rows, torchvision's loop: photos.json

    ResNets trained in bf16, channels-last, bs 256: `tandem train` with each --crop (region: only
    the drawn box, at its scale; whole: the whole image decoded at the scale 224 needs) with its
    evaluation's rate, the bench's rate from the files and from resident data, data-bench's decode
    rows, and torchvision's loop (train_bench.py) beside them, merged by
    benchmarks/photos_table.py."""
    workers = min(cpu_count() - 1, 15)
    for side_range in a.photos_sides:
        low, high = side_range.split("-")
        mixed = f"-p{a.photos_progressive:g}" if a.photos_progressive else ""
        folder = c.photo_folder(f"/tmp/tandem-photos-{side_range}{mixed}", a.photos_count, low,
                                high, progressive=a.photos_progressive)
        # A held-out folder larger than the evaluation's ring (which fills while training runs)
        # times the evaluation's decode, not only its scoring of batches decoded ahead.
        val = (["--val", c.photo_folder(f"{folder}-val", a.photos_val_count, low, high, seed=1,
                                         progressive=a.photos_progressive)]
               if a.photos_val_count and a.photos_train else ["--val-split", 0.1])
        c.say(f"photos {side_range}: tandem data-bench decode rows")
        c.run([c.tandem, "data-bench", "--data", folder, "--steps", 0, "--images", 500,
               "--json", c.raw_path(f"photos-databench-{side_range}.json")], show="^decode")
        shrunk = None
        if a.photos_shrink:
            shrunk = f"{folder}-shrunk"
            c.say(f"photos {side_range}: tandem shrink into {shrunk}")
            c.run([c.tandem, "shrink", "--quiet", "--data", folder, "--out", shrunk,
                   "--json", c.raw_path(f"photos-shrink-{side_range}.json")], show=True)
        for model in a.photos_models:
            net = "resnet50" if model == "r50_full" else "resnet18"
            step = ["--param", f"model={model}", "--param", "precision=bf16", "--param",
                    "layout=channels_last", "--batch-size", 256, "--mode", "pipelined+graphed"]
            for crop in a.photos_crops:
                # Region runs also with decode auto (--photos-split): each batch split between the
                # workers and the JPEG engines.
                decodes = ["cpu", "auto"] if crop == "region" and a.photos_split else ["cpu"]
                for where in decodes if a.photos_train else []:
                    name = f"{side_range}-{model}-{crop}" + ("-auto" if where == "auto" else "")
                    c.say(f"photos {side_range}: tandem train {net} bf16 --crop {crop} "
                          f"--decode {where}")
                    c.run([c.tandem, "train", "--data", folder, "--model", net, "--precision",
                           "bf16", "--channels-last", "--batch-size", 256, "--optimizer", "sgd",
                           "--lr", 0.1, "--epochs", a.photos_epochs, *val,
                           "--crop", crop, "--decode", where, "--workers", workers, "--quiet",
                           "--out", c.raw_path(f"run-photos-{name}"),
                           "--json", c.raw_path(f"photos-train-{name}.json")],
                          show="^speed|^evaluation|rror" if where == "cpu" else
                          "^speed|^evaluation|decode auto|JPEG engines|rror")
                for where in decodes:
                    name = f"{side_range}-{model}-{crop}" + ("-auto" if where == "auto" else "")
                    photos_files_bench(c, folder, name, crop, where, step, workers)
                    if shrunk:  # the same run from the folder `tandem shrink` wrote
                        photos_files_bench(c, shrunk, f"{side_range}-{model}-{crop}-shrunk" +
                                           ("-auto" if where == "auto" else ""), crop, where,
                                           step, workers)
            if not os.path.exists(c.raw_path(f"photos-resident-{model}.json")):
                c.run([c.tandem, "bench", "--workload", "images", "--param", "source=resident",
                       *step, "--steps", 40, "--warmup", 10,
                       "--json", c.raw_path(f"photos-resident-{model}.json")], show="^images")
        if a.photos_python:
            c.say(f"photos {side_range}: train_bench.py (torchvision's loop, bf16, channels-last)")
            c.run([PYTHON, "benchmarks/train_bench.py", "--jobs", joined(a.photos_models),
                   "--data", folder, "--precision", "bf16", "--channels-last", "--batch-sizes", 256,
                   "--steps", 30, "--workers", workers,
                   "--out", c.raw_path(f"photos-python-{side_range}.json")], show=True, tail=4)
    c.run([PYTHON, "benchmarks/photos_table.py", c.raw, c.out_path("photos.json"),
           f"{PROG} photos --out OUT --photos-sides '{' '.join(a.photos_sides)}' "
           f"--photos-models '{' '.join(a.photos_models)}' --photos-crops "
           f"'{' '.join(a.photos_crops)}' --photos-epochs {a.photos_epochs} "
           f"--photos-val-count {a.photos_val_count}"
           + (f" --photos-progressive {a.photos_progressive:g}" if a.photos_progressive else "")
           + ("" if a.photos_train else " --no-photos-train")
           + (" --photos-shrink" if a.photos_shrink else "")],
          show=True)


def photos_files_bench(c, folder, name, crop, where, step, workers):
    """The photos phase's training rate from `folder`'s JPEGs (photos-files-NAME.json), without
    epoch ends: the loader runs on across epochs, so no ring filled behind an evaluation or a
    checkpoint flatters it (small folders have epochs shorter than the ring)."""
    c.run([c.tandem, "bench", "--workload", "images", "--data", folder,
           "--param", "source=files", "--param", f"crop={crop}",
           *(["--param", "decode=auto"] if where == "auto" else []), *step,
           "--steps", 60, "--warmup", 10, "--workers", workers,
           "--json", c.raw_path(f"photos-files-{name}.json")],
          show="^images|rror" if where == "cpu" else "^images|decode=auto|JPEG engines|rror")


def photos_bench(folder, model, json_path, *, steps, warmup, workers, decode="auto",
                 mode="pipelined+graphed", batch_size=256, extra=()):
    """`tandem bench`'s arguments (the program not included) for a ResNet trained in bf16,
    channels last, from a folder of photos: the enginetrace, shares and ab phases' runs. `extra`:
    more arguments (an engine share, a profiler)."""
    return ["bench", "--workload", "images", "--data", folder, "--param", "source=files",
            "--param", f"decode={decode}", "--param", f"model={model}", "--param",
            "precision=bf16", "--param", "layout=channels_last", *extra, "--batch-size",
            batch_size, "--mode", mode, "--steps", steps, "--warmup", warmup, "--workers", workers,
            "--no-gpu-monitor", "--json", json_path]


@phase("enginetrace", enginetrace_options)
def phase_enginetrace(c, a):
    """what the JPEG engines' batched call waits on: ResNets trained from large photos with decode
    auto, a few steps under LibTorch's profiler — the host threads' longest CUDA API calls in the
    log and enginetrace-MODEL.json, each run's Chrome trace in enginetrace-MODEL.trace.json.gz
    and trace_waits.py's reading of it in the log (each stream's launch-to-start waits, the
    longest host waits and the work that released them)

    Open a trace in ui.perfetto.dev: the augment thread's calls and nvJPEG's kernels on their
    streams beside the training lane's."""
    folder = c.photo_folder(a.enginetrace_photos, a.enginetrace_count, 1000, 2000)
    for model in a.enginetrace_models:
        trace = c.raw_path(f"enginetrace-{model}.trace.json")
        c.say(f"enginetrace: {model} from {folder}, decode auto, {a.enginetrace_steps} profiled "
              f"steps")
        c.run([c.tandem, *photos_bench(folder, model, c.out_path(f"enginetrace-{model}.json"),
                                       steps=40, warmup=10, workers=a.enginetrace_workers,
                                       extra=["--kernels", a.enginetrace_steps, "--kernel-trace",
                                              trace])],
              show=r"^images +[a-z]|CUDA API calls|^ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+  cu|JPEG "
                   r"engines|decode auto|rror", log_all=True)
        if os.path.isfile(trace):
            kept = c.out_path(f"enginetrace-{model}.trace.json.gz")
            with open(trace, "rb") as src, gzip.open(kept, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(trace)
            # Which stream's work waited, and which host wait it held: the threads by the
            # trace's own ids.
            c.run([PYTHON, "benchmarks/trace_waits.py", kept], show=True)


def share_run_row(report):
    """What a shares run's --json says of the split: the rate, the share the engines ended at,
    the engines' and load stages' host time a step (None where absent), and how much of a core
    each side's threads had (compare.threads_on_cores; absent where the run did not say)."""
    host = {s["name"]: s.get("host_ms_per_step") for s in report.get("stages", [])}
    return {"images_per_s": report.get("samples_per_s"),
            "engine_share_end": engine_share(report),
            "engines_host_ms": host.get("engines"), "load_host_ms": host.get("load"),
            **(threads_on_cores(report) or {})}


@phase("shares", shares_options)
def phase_shares(c, a):
    """the JPEG engines' share of each batch against the training's rate: ResNets from large
    photos with decode auto, the run's controller (auto) beside fixed shares, each at the loader
    workers' nice values (--shares-nice) and with each way of waiting for the GPU
    (--shares-cuda-wait), rounds alternating the order; shares.json (per run the rate, the share it
    ended at, the engines' and load stages' host ms a step, how much of a core each side's threads
    had; per model, share, nice value and wait the median rate and its ratio to auto's at the
    first nice value and wait) and a table in the log. Where a fixed share beats auto, the
    controller settles short of it; where a higher nice value or blocking waits beat the first,
    the workers took cores the run's own threads needed.""" 
    folder = c.photo_folder(a.shares_photos, a.shares_count, 1000, 2000)
    command = (f"tandem bench --workload images --data {folder} --param source=files --param "
               "decode=auto [--param engine_share=SHARE] --param model=MODEL --param "
               "precision=bf16 --param layout=channels_last --batch-size 256 --mode "
               f"pipelined+graphed --steps {a.shares_steps} --warmup 10 --workers "
               f"{a.shares_workers} [--param worker_nice=NICE] [--cuda-wait WAIT]")
    doc = {"device": None, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": command, "rows": [], "summary": []}
    cells = [(s, n, w) for s in a.shares for n in a.shares_nice for w in a.shares_cuda_wait]
    for rnd in range(1, a.shares_rounds + 1):
        order = cells if rnd % 2 == 1 else list(reversed(cells))
        for model in a.shares_models:
            for s, n, w in order:
                name = f"shares-{model}-{s}-nice{n}-{w}-r{rnd}.json"
                report_path = c.raw_path(name)
                extra = [] if s == "auto" else ["--param", f"engine_share={s}"]
                if n:
                    extra += ["--param", f"worker_nice={n}"]
                if w != "auto":
                    extra += ["--cuda-wait", w]
                c.say(f"shares: round {rnd}, {model}, share {s}, nice {n}, waits {w}")
                rc = c.run([c.tandem, *photos_bench(folder, model, report_path,
                                                    steps=a.shares_steps, warmup=10,
                                                    workers=a.shares_workers, extra=extra)],
                           show=r"^images +[a-z]|JPEG engines decode|rror", log_all=True)
                row = {"model": model, "share": s, "worker_nice": n, "cuda_wait": w,
                       "round": rnd}
                if rc == 0 and os.path.isfile(report_path):
                    with open(report_path) as f:
                        report = json.load(f)
                    doc["device"] = doc["device"] or report.get("device_name")
                    row.update(share_run_row(report))
                else:
                    row["error"] = f"exit {rc}"
                doc["rows"].append(row)
                with open(c.out_path("shares.json"), "w") as f:  # after every run: kept if cut
                    json.dump(doc, f, indent=1)
    for model in a.shares_models:
        def median(s, n, w):
            rates = [r["images_per_s"] for r in doc["rows"] if r["model"] == model and
                     r["share"] == s and r["worker_nice"] == n and r["cuda_wait"] == w and
                     r.get("images_per_s")]
            return statistics.median(rates) if rates else None
        auto = (median("auto", a.shares_nice[0], a.shares_cuda_wait[0]) if "auto" in a.shares
                else None)
        for s, n, w in cells:
            m = median(s, n, w)
            ratio = m / auto if m and auto else None
            doc["summary"].append({"model": model, "share": s, "worker_nice": n, "cuda_wait": w,
                                   "median_images_per_s": m, "ratio_to_auto": ratio})
            c.say(f"shares: {model} share {s:>5}"
                  + (f" nice {n:>2}" if len(a.shares_nice) > 1 else "")
                  + (f" waits {w:>5}" if len(a.shares_cuda_wait) > 1 else "") + ": median "
                  + (f"{m:,.0f} img/s" if m else "no rate")
                  + (f", {ratio:.3f} of auto" if ratio else ""))
    with open(c.out_path("shares.json"), "w") as f:
        json.dump(doc, f, indent=1)
