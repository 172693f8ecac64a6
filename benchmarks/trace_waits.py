"""What the host threads and the GPU's streams waited on, read from a Chrome trace of LibTorch's
profiler (`tandem bench --kernels N --kernel-trace FILE`, torch.profiler's export): for each host
thread its costliest CUDA API calls and the streams it queued work on; for each stream how long
its work waited between being queued and starting (launch to start); and the longest host waits
with the GPU work whose end released them.

A stream whose work waits far longer than its neighbours' for the same kind of work shares a
hardware queue with a busy one (CUDA_DEVICE_MAX_CONNECTIONS) or waits on an event; a host thread
that waits on such work waits for it. The threads are told apart by the trace's own ids (the
resource id of each CUPTI record), which are right where a summary keyed by the profiler's
thread id is not.

    python3 benchmarks/trace_waits.py TRACE[.gz] [--top 6] [--waits 8] [--json OUT]
"""
import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict

HOST = ("cuda_runtime", "cuda_driver")
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
WAITS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize",
         "cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize")


def load(path):
    """The trace's events (a .gz is read as gzip)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def streams_text(streams):
    """'31-44, 48' for {31, ..., 44, 48}."""
    out, run = [], []
    for s in sorted(streams):
        if run and s != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(s)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def analyse(events, top=6, waits=8, release_us=300.0):
    """The summary as a dict: threads, streams, waits (times in ms)."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in HOST]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE]
    by_correlation = {e.get("args", {}).get("correlation"): e for e in host}
    t0 = min((e["ts"] for e in host + device), default=0.0)

    threads = defaultdict(lambda: {"calls": defaultdict(lambda: [0, 0.0, 0.0]), "streams": set()})
    for e in host:
        c = threads[e["tid"]]["calls"][e["name"]]
        c[0] += 1
        c[1] += e["dur"]
        c[2] = max(c[2], e["dur"])

    lags = defaultdict(list)  # stream -> launch-to-start (us) of its work
    kinds = defaultdict(lambda: defaultdict(int))  # stream -> work name -> count
    for e in device:
        kinds[e["tid"]][e["name"]] += 1
        launch = by_correlation.get(e.get("args", {}).get("correlation"))
        if launch is not None:
            lags[e["tid"]].append(e["ts"] - launch["ts"])
            threads[launch["tid"]]["streams"].add(e["tid"])

    out = {"threads": [], "streams": [], "waits": []}
    for tid, t in sorted(threads.items(), key=lambda kv: -sum(c[1] for c in kv[1]["calls"].values())):
        calls = sorted(t["calls"].items(), key=lambda kv: -kv[1][1])[:top]
        out["threads"].append({
            "thread": tid, "streams": sorted(t["streams"]),
            "calls": [{"name": n, "count": c, "total_ms": tot / 1e3, "longest_ms": mx / 1e3}
                      for n, (c, tot, mx) in calls]})
    for stream in sorted(kinds):
        v = sorted(lags.get(stream, []))
        row = {"stream": stream, "work": sum(kinds[stream].values()),
               "most": max(kinds[stream].items(), key=lambda kv: kv[1])[0]}
        if v:
            row.update(lag_median_ms=statistics.median(v) / 1e3, lag_p90_ms=percentile(v, 0.9) / 1e3,
                       lag_max_ms=v[-1] / 1e3)
        out["streams"].append(row)
    ends = sorted(device, key=lambda e: e["ts"] + e["dur"])
    long_waits = sorted((e for e in host if e["name"] in WAITS), key=lambda e: -e["dur"])[:waits]
    for w in sorted(long_waits, key=lambda e: e["ts"]):
        end = w["ts"] + w["dur"]
        released = [e for e in ends if end - release_us <= e["ts"] + e["dur"] <= end + 5.0]
        row = {"thread": w["tid"], "name": w["name"], "at_ms": (w["ts"] - t0) / 1e3,
               "ms": w["dur"] / 1e3, "released_by": []}
        for e in released[-3:]:
            launch = by_correlation.get(e.get("args", {}).get("correlation"))
            row["released_by"].append({
                "stream": e["tid"], "name": e["name"],
                "lag_ms": (e["ts"] - launch["ts"]) / 1e3 if launch else None})
        out["waits"].append(row)
    return out


def render(s):
    lines = ["host threads (by the trace's ids): costliest CUDA API calls, the streams they queued "
             "work on"]
    for t in s["threads"]:
        lines.append(f"  thread {t['thread']}: streams {streams_text(t['streams']) or '-'}")
        for c in t["calls"]:
            lines.append(f"    {c['total_ms']:9.2f} ms  {c['count']:6d} calls  longest "
                         f"{c['longest_ms']:8.2f} ms  {c['name']}")
    lines.append("streams: work queued, launch to start (median / p90 / max ms), the commonest work")
    for r in s["streams"]:
        lag = (f"{r['lag_median_ms']:7.2f} / {r['lag_p90_ms']:7.2f} / {r['lag_max_ms']:7.2f}"
               if "lag_median_ms" in r else "      -")
        lines.append(f"  stream {r['stream']:>4}: {r['work']:6d}  {lag}  {r['most'][:70]}")
    lines.append("longest host waits, and the GPU work that ended as they did")
    for w in s["waits"]:
        lines.append(f"  {w['at_ms']:9.2f} ms  thread {w['thread']}  {w['name']} {w['ms']:.2f} ms")
        for r in w["released_by"]:
            lag = (f" (started {r['lag_ms']:.2f} ms after its launch)"
                   if r["lag_ms"] is not None else "")
            lines.append(f"      stream {r['stream']}: {r['name'][:60]}{lag}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a Chrome trace (.json or .json.gz)")
    p.add_argument("--top", type=int, default=6, help="API calls shown per thread (default 6)")
    p.add_argument("--waits", type=int, default=8, help="longest host waits shown (default 8)")
    p.add_argument("--json", help="also write the summary here")
    a = p.parse_args(argv)
    try:
        events = load(a.trace)
    except (OSError, ValueError, KeyError) as e:
        print(f"trace_waits.py: cannot read {a.trace} as a Chrome trace: {e}", file=sys.stderr)
        return 2
    s = analyse(events, a.top, a.waits)
    print(render(s))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(s, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
