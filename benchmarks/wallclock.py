"""What a user's training call costs by the wall clock, not only the steady rate: the plain
PyTorch loop, torch.compile, and tandem.Trainer (plain and with ``compile=True``), each timed
over successive calls of N and 4N steps from the moment the user starts it.

The recipe is compile_bench.py's (its build(): bf16 autocast, channels_last, SGD with momentum
0.9, device-resident 224 px batches), on its jobs at one batch size each (a --cells entry):

    eager               the plain loop; a call is a loop of k steps, then a device synchronize
    compile             the plain loop with forward + loss as one torch.compile region, as
                        compile_bench.py's "compile" row runs it
    tandem-py           tandem.Trainer(model, loss_fn, optimizer, data=batches, feed=...) with
                        its defaults (mode auto: timed trials of the modes that could win, in its first fit,
                        as long as that fit, at most 300 steps); a call is fit(steps=k)
    tandem-py-compiled  the same with compile=True

Each row runs in a process of its own. After the job's modules and batches are built the clock
starts (t0); then four calls, each followed by a device synchronize:

    first   the Trainer's construction and fit(steps=M) (M: --fit-steps-first, default N) /
            the loop's first M steps: compilation, cuDNN's autotuning, mode auto's trials,
            capture, all in it
    second  4N steps
    a       N steps
    b       4N steps

    first_call_s         the first call's wall clock (construction included)
    steady_images_per_s  3N * bs / (b - a): the rate once the fixed cost of a call cancels out
    per_call_s           a - N * bs / steady: the fixed cost of one later call (setup, capture,
                         the pipeline's fill and drain); about 0 for the plain loops
    wall_images_per_s    4N * bs / b: a later 4N call's rate as its caller sees it
    first_fixed_s        first_call_s - M * bs / steady: what the first call costs beyond its
                         steps
    first_images_per_s   M * bs / first_call_s: e.g. with --fit-steps-first 300, a 300-step
                         first fit's rate against the plain loop's 300 steps with its warm-up
    first_trained_step_s the plain loops only: t0 to the first step's end (a synchronize there)
    mode, trials_s       tandem: the mode the first fit ran and mode auto's trials' seconds
    fits                 tandem: each call's wall clock beside its FitResult's seconds and the
                         report's other timing fields; a fit of mode auto's trials lists its
                         parts (mode, steps, seconds, timed)
    compile_s            compiled rows: torch._dynamo's compile timings by part (COMPILE_PARTS),
                         one entry per region compiled

Each row's process gets an empty TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR and tandem's
TANDEM_MODE_CACHE inside it) of its own under --cache-dir, so compilation and mode auto start
cold; --warm-process adds, after each tandem
row, a second process on the same cache folder (impl suffixed "-warm"): the start of a user's
second run (warm_starts: each such pair's first call and its fixed cost, cold over warm).
Writes {device, date, command, rows: [{impl, job, batch_size, first_call_s,
per_call_s, steady_images_per_s, wall_images_per_s, steps, first_fixed_s, mode, trials_s,
error, ...}]}, rewritten after every row so a run cut short keeps the rows it finished; a row
that fails is a row with its error.

    PYTHONPATH=<tandem package> python3 benchmarks/wallclock.py --out wallclock.json
    ... --cells r18_full:32 --fit-steps-first 300 --warm-process --cache-dir /tmp/wc-cache
"""
import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compile_bench  # noqa: E402 - its build() and plain loop; torch is imported in the rows only

IMPLS = ("eager", "compile", "tandem-py", "tandem-py-compiled")
TANDEM_IMPLS = ("tandem-py", "tandem-py-compiled")
CELLS = "r18_full:256,r18_full:32,r50_frozen_head:256,r50_frozen_head:32,mnv3_full:256," \
        "vit_b16_full:256"
WARM = "-warm"  # the suffix of a row run on the cache folder of the row before it
OLD = "@old"  # the suffix of a row run on --old-package
# torch._dynamo's timed functions a compiled row reports (compile_s): a region's whole
# compilation, dynamo's trace, the backend (AOT autograd + inductor), inductor's code generation
# and the wait for its kernels' compilation.
COMPILE_PARTS = ("_compile.compile_inner", "bytecode_tracing", "OutputGraph.call_user_compiler",
                 "create_aot_dispatcher_function", "compile_fx_inner", "GraphLowering.codegen",
                 "async_compile.wait")
ROW_KEYS = ("impl", "job", "batch_size", "first_call_s", "per_call_s", "steady_images_per_s",
            "wall_images_per_s", "steps", "first_fixed_s", "mode", "trials_s", "error")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- the arithmetic ----------------------------------------------------------------------------
def call_costs(first_s, second_s, a_s, b_s, n, bs, first_steps=None):
    """The row's numbers from its four calls' wall clocks: the first (first_steps steps, default
    n), the second (4n), a (n) and b (4n). Steady is None when b is not longer than a (the
    difference is noise), and so are the numbers derived from it."""
    m = n if first_steps is None else first_steps
    steady = 3 * n * bs / (b_s - a_s) if b_s > a_s else None
    return dict(
        first_call_s=first_s,
        second_call_s=second_s,
        per_call_s=a_s - n * bs / steady if steady else None,
        steady_images_per_s=steady,
        wall_images_per_s=4 * n * bs / b_s if b_s > 0 else None,
        first_fixed_s=first_s - m * bs / steady if steady else None,
        first_images_per_s=m * bs / first_s if first_s > 0 else None)


def rounded(values, digits=4):
    """`values` with every float rounded (seconds to 0.1 ms, rates to 0.1 image/s)."""
    out = {}
    for k, v in values.items():
        if isinstance(v, float):
            v = round(v, 1 if k.endswith("images_per_s") else digits)
        out[k] = v
    return out


def timing_fields(report):
    """The numeric timing fields of a FitResult's report: seconds, *_s, *_ms, setup, warm-up,
    capture, compile (rates left out)."""
    out = {}
    for k, v in (report or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or "per_s" in k:
            continue
        if (k == "seconds" or k.endswith(("_s", "_ms", "_seconds", "_ms_per_step"))
                or any(w in k for w in ("setup", "warmup", "capture", "compile", "trial"))):
            out[k] = round(v, 4) if isinstance(v, float) else v
    return out


# ---- the command line's lists ------------------------------------------------------------------
def parse_cells(text):
    """'JOB:BS,JOB:BS' -> [(job, bs)]; ValueError naming the first entry that is not one."""
    cells = []
    for cell in (c.strip() for c in text.split(",")):
        if not cell:
            continue
        job, sep, bs = cell.partition(":")
        job, bs = job.strip(), bs.strip()
        if not sep or job not in compile_bench.JOBS or not bs.isdigit() or int(bs) < 1:
            raise ValueError(f"cell {cell!r} is not valid: expected JOB:BS, JOB one of "
                             f"{', '.join(compile_bench.JOBS)} and BS a batch size >= 1")
        cells.append((job, int(bs)))
    if not cells:
        raise ValueError(f"no cells in {text!r}: expected JOB:BS[,JOB:BS...]")
    return cells


def parse_impls(text):
    impls = [i.strip() for i in text.split(",") if i.strip()]
    for impl in impls:
        if impl not in IMPLS:
            raise ValueError(f"impl {impl!r} is not valid: expected some of {', '.join(IMPLS)}")
    if not impls:
        raise ValueError(f"no impls in {text!r}: expected some of {', '.join(IMPLS)}")
    return impls


def plan_rows(cells, impls, cache_root, warm=False, old_package=None, old_env=None):
    """Every row to run, in order: {impl, base, job, bs, cache_dir, package, env}. Each row gets
    a fresh empty cache folder under cache_root; with `warm`, each tandem row is followed by its
    "-warm" row on the same folder; with `old_package` or `old_env` (environment settings), each
    tandem row is preceded by the same row on that package and/or with those settings (impl
    suffixed OLD), for an A/B in one call."""
    rows = []
    for job, bs in cells:
        for impl in impls:
            variants = [(impl, None, {})]
            if (old_package or old_env) and impl in TANDEM_IMPLS:
                variants.insert(0, (impl + OLD, old_package, dict(old_env or {})))
            for name, package, env in variants:
                cache = tempfile.mkdtemp(prefix=f"{job}-{bs}-{name}-", dir=cache_root)
                rows.append(dict(impl=name, base=impl, job=job, bs=bs, cache_dir=cache,
                                 package=package, env=env))
                if warm and impl in TANDEM_IMPLS:
                    rows.append(dict(impl=name + WARM, base=impl, job=job, bs=bs,
                                     cache_dir=cache, package=package, env=env))
    return rows


# ---- the rows' output --------------------------------------------------------------------------
def blank_row(impl, job, bs, **extra):
    row = dict.fromkeys(ROW_KEYS)
    row.update(impl=impl, job=job, batch_size=bs, **extra)
    return row


def row_from_output(stdout, stderr, returncode, impl, job, bs):
    """The row a row process printed (its last "ROW " line), or an error row naming its exit."""
    lines = [line for line in stdout.splitlines() if line.startswith("ROW ")]
    if lines:
        try:
            return json.loads(lines[-1][4:])
        except ValueError as e:
            return blank_row(impl, job, bs, error=f"its ROW line is not JSON: {e}")
    last = (stderr.strip().splitlines() or [""])[-1]
    return blank_row(impl, job, bs, error=f"exit {returncode}, no ROW line: {last}"[:300])


def write_result(path, rows, command, extra=None):
    """The result JSON with every row so far (written whole, then renamed over `path`)."""
    device = next((r["device"] for r in rows if r.get("device")), None)
    torch_version = next((r["torch"] for r in rows if r.get("torch")), None)
    doc = dict(device=device, torch=torch_version,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command=command, **(extra or {}), rows=rows)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return doc


def run_rows(plan, run_one, out, command, extra=None, on_row=None):
    """run_one(planned) -> row for each planned row, the JSON at `out` rewritten after each; a
    run_one that raises gives an error row, and the rows go on."""
    rows = []
    for planned in plan:
        try:
            row = run_one(planned)
        except Exception as e:  # noqa: BLE001 - an error is a row of the table
            row = blank_row(planned["impl"], planned["job"], planned["bs"],
                            error=f"{type(e).__name__}: {e}"[:300])
        for k in ROW_KEYS:
            row.setdefault(k, None)
        rows.append(row)
        if on_row:
            on_row(row)
        write_result(out, rows, command, extra)
    return rows


def warm_starts(rows):
    """Each "-warm" row beside the row whose cache folder it reused (the same impl, job and batch
    size without the suffix): the first call's wall clock and its fixed cost (first_fixed_s:
    what the first call costs beyond its steps — mode auto's trials, compilation, capture), cold
    over warm. A pair with a missing or failed side has None ratios."""
    pairs = []
    for r in rows:
        if not r["impl"].endswith(WARM):
            continue
        cold = next((c for c in rows if c["impl"] == r["impl"][:-len(WARM)]
                     and c["job"] == r["job"] and c["batch_size"] == r["batch_size"]), {})

        def ratio(key):
            a, b = cold.get(key), r.get(key)
            return round(a / b, 3) if a and b and b > 0 else None

        pairs.append(dict(impl=r["impl"][:-len(WARM)], job=r["job"], batch_size=r["batch_size"],
                          cold_first_call_s=cold.get("first_call_s"),
                          warm_first_call_s=r.get("first_call_s"),
                          cold_first_fixed_s=cold.get("first_fixed_s"),
                          warm_first_fixed_s=r.get("first_fixed_s"),
                          first_call_cold_over_warm=ratio("first_call_s"),
                          first_fixed_cold_over_warm=ratio("first_fixed_s"),
                          cold_conv_plans=first_fit_conv_plans(cold),
                          warm_conv_plans=first_fit_conv_plans(r)))
    return pairs


def first_fit_conv_plans(row):
    """The first fit's convolution plans (its setup's conv_plans: how many were timed or rebuilt
    from the plans file and the seconds of each, by part), or None where it had none."""
    fits = row.get("fits") or [{}]
    return ((fits[0] or {}).get("setup") or {}).get("conv_plans") or None


def conv_plans_line(plans):
    """One process's convolution plans in a line: timed and rebuilt, their seconds by part."""
    if not plans:
        return "-"
    return (f"{plans.get('tuned', 0)} timed in {plans.get('tuning_s', 0):.3f} s, "
            f"{plans.get('from_file', 0)} rebuilt in {plans.get('rebuilding_s', 0):.3f} s "
            f"(listing {plans.get('listing_s', 0):.3f} of it graphs {plans.get('graph_s', 0):.3f}, "
            f"building {plans.get('building_s', 0):.3f}; "
            f"{plans.get('runtime_compiled', 0)} compiled here, "
            f"{plans.get('from_compiled', 0)} restored compiled, "
            f"{plans.get('configured', 0)} configured without the lists, "
            f"{plans.get('prebuilt', 0)} built ahead)")


def fmt(v, width, digits=0):
    return f"{'-' if v is None else f'{v:.{digits}f}':>{width}s}"


def table(rows):
    """The fixed-width table: each row's wall-clock numbers and its first call's rate against
    the eager row's of the same cell."""
    head = (f"{'job':16s} {'bs':>4s} {'impl':24s} {'mode':18s} {'first s':>8s} {'fixed s':>8s} "
            f"{'call s':>7s} {'steady/s':>9s} {'wall/s':>9s} {'first/s':>9s} {'x eager':>7s} "
            f"{'trials s':>8s}")
    lines = [head]
    for r in rows:
        eager = next((e.get("first_images_per_s") for e in rows if e["impl"] == "eager"
                      and e["job"] == r["job"] and e["batch_size"] == r["batch_size"]), None)
        first = r.get("first_images_per_s")
        line = (f"{r['job']:16s} {r['batch_size']:4d} {r['impl']:24s} {r.get('mode') or '-':18s} "
                f"{fmt(r.get('first_call_s'), 8, 2)} {fmt(r.get('first_fixed_s'), 8, 2)} "
                f"{fmt(r.get('per_call_s'), 7, 3)} {fmt(r.get('steady_images_per_s'), 9)} "
                f"{fmt(r.get('wall_images_per_s'), 9)} {fmt(first, 9)} "
                f"{fmt(first / eager if first and eager else None, 7, 2)} "
                f"{fmt(r.get('trials_s'), 8, 1)}")
        if r.get("error"):
            line += f"  error: {r['error']}"
        lines.append(line)
    return "\n".join(lines)


# ---- one row (in a process of its own) ---------------------------------------------------------
def measure(a, row):
    """Fills `row` with the job's four calls' wall clocks and what follows from them."""
    t = time.perf_counter()
    import torch
    import torchvision  # noqa: F401 - imported here to keep it out of the clock
    device = torch.device("cuda")
    row.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    torch.backends.cudnn.benchmark = True
    tandem = None
    if a.base in TANDEM_IMPLS:
        import tandem
    row["import_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    feed, model, loss_fn, optimizer, data = compile_bench.build(a.job, a.bs, a.batches, torch,
                                                                device)
    torch.cuda.synchronize()
    row["build_s"] = round(time.perf_counter() - t, 3)
    n, m = a.n, a.fit_steps_first or a.n
    walls = []

    if tandem is not None:
        fits = []

        def call(steps, trainer):
            t0 = time.perf_counter()
            r = trainer.fit(steps=steps, progress=False)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            parts = [dict(p, seconds=round(p["seconds"], 4)) for p in r.report.get("parts", [])]
            fits.append(dict(steps=steps, wall_s=round(wall, 4), **timing_fields(r.report),
                             setup=getattr(r, "setup", None), parts=parts or None))
            return wall, r

        t0 = time.perf_counter()
        trainer = tandem.Trainer(model=model, loss_fn=loss_fn, optimizer=optimizer, data=data,
                                 feed=[] if feed is None else [("backbone", feed)],
                                 batch_size=a.bs, mode="auto",
                                 compile=a.base == "tandem-py-compiled")
        construct = time.perf_counter() - t0
        first_wall, first = call(m, trainer)
        walls.append(construct + first_wall)
        fits[0]["construct_s"] = round(construct, 4)
        row["report_keys"] = sorted(first.report)
        log(f"report keys: {', '.join(row['report_keys'])}")
        row["mode"] = first.mode
        trials = trainer.trials
        if trials:
            row["trials_s"] = trials.get("seconds")
            row["trials_reason"] = trials.get("reason")
            row["trials"] = {tr["mode"]: round(tr["steps_per_s"] * a.bs) if tr.get("steps_per_s")
                             else tr.get("error") for tr in trials.get("trials", [])}
        row["fits"] = fits
        for steps in (4 * n, n, 4 * n):
            wall, r = call(steps, trainer)
            walls.append(wall)
            if r.mode != row["mode"]:
                row["mode"] = f"{row['mode']}/{r.mode}"
    else:
        done = [0]

        def loop(steps, step):
            for _ in range(steps):
                step(done[0])
                done[0] += 1
            torch.cuda.synchronize()

        t0 = time.perf_counter()
        step = compile_bench.plain_loop(a.base, feed, model, loss_fn, optimizer, data, torch)
        loop(1, step)  # the first step, synchronized: when the first trained step is done
        row["first_trained_step_s"] = round(time.perf_counter() - t0, 4)
        loop(m - 1, step)
        walls.append(time.perf_counter() - t0)
        for steps in (4 * n, n, 4 * n):
            t0 = time.perf_counter()
            loop(steps, step)
            walls.append(time.perf_counter() - t0)
    row["calls_s"] = [round(w, 4) for w in walls]
    row.update(rounded(call_costs(*walls, n, a.bs, first_steps=m)))
    if row["steady_images_per_s"] is None:
        row["note"] = "the 4N call was not longer than the N call: no steady rate"


def run_row(a):
    row = blank_row(a.impl, a.job, a.bs, steps=a.n, first_steps=a.fit_steps_first or a.n,
                    cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    try:
        measure(a, row)
        try:
            from torch._dynamo.utils import compilation_time_metrics, counters
            row["dynamo"] = {g: {str(k): v for k, v in counters[g].items()}
                             for g in ("recompiles", "graph_break") if counters.get(g)} or None
            # Where compilation's seconds went: each region's compile, its AOT autograd and
            # inductor parts (one entry per compilation).
            row["compile_s"] = {k: [round(v, 3) for v in compilation_time_metrics[k]]
                                for k in COMPILE_PARTS if compilation_time_metrics.get(k)} or None
        except ImportError:
            pass
    except Exception as e:  # noqa: BLE001 - an error is a row of the table
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return row


# ---- the driver --------------------------------------------------------------------------------
def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default=CELLS,
                   help=f"JOB:BS entries, comma-separated; JOB of {', '.join(compile_bench.JOBS)}"
                        f"\n(default {CELLS})")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"of {', '.join(IMPLS)} (default all)")
    p.add_argument("--n", type=int, default=20, help="N: the later calls are N and 4N steps")
    p.add_argument("--fit-steps-first", type=int, default=None, metavar="M",
                   help="the first call's steps (default N)")
    p.add_argument("--batches", type=int, default=4, help="distinct device-resident batches")
    p.add_argument("--timeout", type=int, default=1200, help="seconds per row's process")
    p.add_argument("--cache-dir", default=None,
                   help="where each row's empty TORCHINDUCTOR_CACHE_DIR is made (default: a new "
                        "folder under the system's temp folder)")
    p.add_argument("--warm-process", action="store_true",
                   help="after each tandem row, a second process on its cache folder (-warm)")
    p.add_argument("--old-package", default=None, metavar="DIR",
                   help="another tandem package (a folder holding tandem/): each tandem row also "
                        f"runs on it first, as impl{OLD} (an A/B in one call)")
    p.add_argument("--old-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment setting of the old rows (repeatable); without "
                        f"--old-package, each tandem row also runs on this package with it, as "
                        f"impl{OLD} (e.g. TANDEM_TUNED_CONV=0)")
    p.add_argument("--out", default="wallclock.json")
    p.add_argument("--row", action="store_true", help=argparse.SUPPRESS)  # one row, JSON on stdout
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--bs", type=int, help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    p.add_argument("--base", help=argparse.SUPPRESS)
    return p


def run_process(a, planned):
    """One row's process: the row it printed, or an error row (its exit, or the timeout)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--row", "--job", planned["job"],
           "--bs", str(planned["bs"]), "--impl", planned["impl"], "--base", planned["base"],
           "--n", str(a.n), "--batches", str(a.batches)]
    if a.fit_steps_first:
        cmd += ["--fit-steps-first", str(a.fit_steps_first)]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=planned["cache_dir"],
               TRITON_CACHE_DIR=os.path.join(planned["cache_dir"], "triton"),
               TANDEM_MODE_CACHE=os.path.join(planned["cache_dir"], "tandem-modes"))
    env.update(planned.get("env") or {})
    if planned.get("package"):  # the A/B's old tandem in place of this one's
        env["PYTHONPATH"] = os.pathsep.join([planned["package"]] + [
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=a.timeout)
        row = row_from_output(stdout, stderr, proc.returncode, planned["impl"], planned["job"],
                              planned["bs"])
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the row's process and its compile workers
        except ProcessLookupError:
            pass
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", ""
        row = blank_row(planned["impl"], planned["job"], planned["bs"],
                        error=f"timed out after {a.timeout} s")
    if row.get("error"):
        log(stderr[-3000:])
    row["process_s"] = round(time.perf_counter() - t0, 1)
    row["cache_dir"] = planned["cache_dir"]
    return row


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    if a.row:
        a.base = a.base or a.impl
        print("ROW " + json.dumps(run_row(a)), flush=True)
        return
    try:
        cells, impls = parse_cells(a.cells), parse_impls(a.impls)
    except ValueError as e:
        p.error(str(e))
    if a.n < 1 or (a.fit_steps_first is not None and a.fit_steps_first < 1):
        p.error(f"--n {a.n} / --fit-steps-first {a.fit_steps_first}: expected >= 1")
    if a.cache_dir:
        os.makedirs(a.cache_dir, exist_ok=True)
        cache_root = a.cache_dir
    else:
        cache_root = tempfile.mkdtemp(prefix="wallclock-cache-")
    old_env = {}
    for setting in a.old_env:
        name, eq, value = setting.partition("=")
        if not eq or not name:
            p.error(f"--old-env {setting!r}: expected NAME=VALUE")
        old_env[name] = value
    plan = plan_rows(cells, impls, cache_root, warm=a.warm_process, old_package=a.old_package,
                     old_env=old_env)
    m = a.fit_steps_first or a.n
    command = "python3 benchmarks/wallclock.py " + shlex.join(sys.argv[1:] if argv is None
                                                              else argv)
    print(f"wallclock: {len(plan)} rows, each in a process of its own\n"
          f"  cells       {', '.join(f'{j}:{b}' for j, b in cells)}\n"
          f"  impls       {', '.join(impls)}"
          f"{' (+ -warm rows of the tandem impls)' if a.warm_process else ''}\n"
          f"  calls       first {m} steps, then {4 * a.n}, {a.n}, {4 * a.n} (N = {a.n})\n"
          f"  batches     {a.batches} device-resident, 224 px, bf16 autocast, channels_last\n"
          f"  cache       {cache_root} (an empty folder per row"
          f"{', shared by its -warm row' if a.warm_process else ''})\n"
          f"  timeout     {a.timeout} s per row\n"
          f"  out         {a.out}\n"
          f"  python      {sys.executable}; PYTHONPATH {os.environ.get('PYTHONPATH', '')}",
          flush=True)
    meta = {}

    def on_row(row):
        keys = row.pop("report_keys", None)
        if keys and "report_keys" not in meta:
            meta["report_keys"] = keys
            log(f"FitResult.report's keys: {', '.join(keys)}")
        log(f"{row['job']:16s} bs {row['batch_size']:4d} {row['impl']:24s} "
            + (f"first {row['first_call_s']:.2f} s, steady {row['steady_images_per_s'] or 0:.0f}"
               f" img/s, wall {row['wall_images_per_s'] or 0:.0f} img/s"
               if row.get("first_call_s") is not None and not row.get("error")
               else f"ERROR {row.get('error')}")
            + f"  ({row.get('process_s')} s{', ' + row['mode'] if row.get('mode') else ''})")

    rows = run_rows(plan, lambda planned: run_process(a, planned), a.out, command, meta, on_row)
    print()
    print(table(rows))
    warm = warm_starts(rows)
    if warm:  # the second process of a job against its first, on the same cache folder
        meta["warm_starts"] = warm
        write_result(a.out, rows, command, meta)
        print("\nwarm start (a second process on the first one's cache folder), cold / warm:")
        for w in warm:
            print(f"  {w['job']:16s} {w['batch_size']:4d} {w['impl']:20s} first call "
                  f"{fmt(w['cold_first_call_s'], 7, 2)} / {fmt(w['warm_first_call_s'], 7, 2)} s "
                  f"({fmt(w['first_call_cold_over_warm'], 5, 2)}x), its fixed cost "
                  f"{fmt(w['cold_first_fixed_s'], 7, 2)} / {fmt(w['warm_first_fixed_s'], 7, 2)} s "
                  f"({fmt(w['first_fixed_cold_over_warm'], 5, 2)}x)")
            if w["cold_conv_plans"] or w["warm_conv_plans"]:
                print(f"    convolution plans, cold: {conv_plans_line(w['cold_conv_plans'])}; "
                      f"warm: {conv_plans_line(w['warm_conv_plans'])}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
