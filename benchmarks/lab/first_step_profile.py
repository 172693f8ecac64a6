"""Where a first fit's seconds go, call by call: one job's Trainer fit(steps=1) under
torch.profiler (the CUDA runtime and driver calls of every thread, with their durations), in a
process of its own, as wallclock.py builds the job. Run it twice on one cache folder to see a
first process beside a second (the kept plans and mode decision read back):

    TANDEM_MODE_CACHE=/tmp/fsp python3 benchmarks/lab/first_step_profile.py --label cold OUT
    TANDEM_MODE_CACHE=/tmp/fsp python3 benchmarks/lab/first_step_profile.py --label warm OUT

Writes OUT/first-step-LABEL.json: the fit's wall clock (the profiler's own cost in it), the
runtime calls grouped by name (count, total and longest milliseconds) and the longest single
calls, each with its thread, and the fit's setup report; OUT/first-step-LABEL.trace.json.gz is
the whole trace (chrome://tracing, Perfetto)."""
import argparse
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def runtime_calls(trace):
    """The trace's CUDA runtime and driver calls: [(name, ms, tid, start_us)]."""
    out = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver"):
            out.append((e["name"], e.get("dur", 0) / 1e3, e.get("tid"), e.get("ts", 0)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the JSON and the trace")
    p.add_argument("--label", required=True, help="names the files: e.g. cold, warm")
    p.add_argument("--job", default="r18_full")
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--batches", type=int, default=4)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)

    import torch
    import torchvision  # noqa: F401 - out of the clock, as in wallclock.py
    import compile_bench
    import tandem
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    feed, model, loss_fn, optimizer, data = compile_bench.build(a.job, a.bs, a.batches, torch,
                                                                device)
    torch.cuda.synchronize()
    trainer = tandem.Trainer(model=model, loss_fn=loss_fn, optimizer=optimizer, data=data,
                             feed=[] if feed is None else [("backbone", feed)],
                             batch_size=a.bs, mode="auto")
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    raw = os.path.join(a.out, f"first-step-{a.label}.trace.json")
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        r = trainer.fit(steps=1, progress=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src:
        text = src.read()
    os.remove(raw)
    with gzip.open(raw + ".gz", "wb") as dst:
        dst.write(text)
    trace = json.loads(text)

    calls = runtime_calls(trace)
    by_name = {}
    for name, ms, _, _ in calls:
        n, total, longest = by_name.get(name, (0, 0.0, 0.0))
        by_name[name] = (n + 1, total + ms, max(longest, ms))
    grouped = sorted(({"name": k, "count": v[0], "total_ms": round(v[1], 3),
                       "longest_ms": round(v[2], 3)} for k, v in by_name.items()),
                     key=lambda g: -g["total_ms"])
    t_first = min((c[3] for c in calls), default=0)
    longest = sorted(calls, key=lambda c: -c[1])[:60]
    result = {
        "device": torch.cuda.get_device_name(), "job": a.job, "batch_size": a.bs,
        "label": a.label, "fit_wall_s": round(wall, 4), "mode": r.mode,
        "setup": getattr(r, "setup", None),
        "runtime_ms_total": round(sum(c[1] for c in calls), 3),
        "runtime_calls": grouped[:40],
        "longest_calls": [{"name": n, "ms": round(ms, 3), "tid": tid,
                           "at_ms": round((ts - t_first) / 1e3, 3)}
                          for n, ms, tid, ts in longest],
    }
    path = os.path.join(a.out, f"first-step-{a.label}.json")
    json.dump(result, open(path, "w"), indent=1)
    print(f"{a.label}: fit {wall:.3f} s (profiled), runtime calls {result['runtime_ms_total']:.0f}"
          f" ms; top: " + ", ".join(f"{g['name']} {g['count']}x {g['total_ms']:.0f} ms"
                                    for g in grouped[:8]))


if __name__ == "__main__":
    main()
