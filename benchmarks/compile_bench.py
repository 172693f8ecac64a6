"""torch.compile beside tandem.Trainer: the best PyTorch recipe (bf16 autocast, channels_last,
SGD with momentum 0.9, batches already on the device) against tandem's Python Trainer, plain and
with ``compile=True``, on torchvision models at a launch-bound and a compute-bound batch size.

Each row runs in a process of its own (compiled code, autotuning and the allocator start clean),
times ``--steps`` steps after ``--warmup`` untimed ones (compilation, capture and cuDNN's autotuning
happen there), synchronizing the device around the clock. Rows:

    eager               the plain loop
    compile             the plain loop, forward + loss as one torch.compile region (default mode),
                        backward and the optimizer as PyTorch runs them
    compile_ro          the same region with mode="reduce-overhead" (an error is a row too)
    tandem-py           tandem.Trainer(model, loss, optimizer, data=batches).benchmark(), in
                        --mode (default auto, as a user gets it: the row keeps every mode's
                        trial rate)
    tandem-py-compiled  the same with compile=True
    tandem-py-model-compiled  tandem.Trainer(torch.compile(model), ...): the user compiles the
                        model by hand (what the Trainer offered before compile=)
    tandem-cpp          tandem's C++ step, no Python at run time: `tandem bench --workload images
                        --param source=resident` (tandem::models' ResNets, the same recipe:
                        bf16 autocast, channels_last, SGD momentum 0.9, 1000 classes; the frozen
                        backbone folded, the trained ResNets' batch norms fused with their ReLU
                        and add) in --mode; needs --tandem-cli (or TANDEM_CLI)
    tandem-cpp-module   the same with LibTorch's modules instead (backbone=module, bn=module):
                        the A/B of tandem's fused paths
    compile_frozen      r50_frozen_head only: the backbone compiled alone with inductor's
                        freezing (its weights constants: batch norm folded into the
                        convolutions, as for inference), the head + loss compiled as a region
    aoti                r50_frozen_head only: the backbone exported (bf16 weights, channels_last)
                        and compiled ahead of time by AOTInductor with freezing
                        (torch._inductor.aoti_compile_and_package), loaded with aoti_load_package
                        (the C++ AOTIModelPackageLoader a C++ feed stage would use): the route a
                        package for C++ takes, timed from Python; the head eager

Jobs: r18_full / r50_full (torchvision ResNet-18/50, every weight trained), r50_frozen_head (a
frozen ResNet-50 backbone in eval mode as a feed stage, a linear head trained), and two non-ResNet
families: vit_b16_full (ViT-B/16) and mnv3_full (MobileNetV3-Large, depthwise convolutions).
Writes {device, date, command, rows: [{impl, job, batch_size, precision, layout, images_per_s,
error, ...}]}.

    PYTHONPATH=<tandem package> python3 benchmarks/compile_bench.py --out compile.json
    ... --profile "r18_full:256:compile,tandem-py-compiled;mnv3_full:256:eager"  # kernel lists

The JSON is rewritten after every row, so a run cut short keeps the rows it finished.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = ("r18_full", "r50_full", "r50_frozen_head", "vit_b16_full", "mnv3_full")
PROFILE_STEPS = 10  # steps a profiled row lists the kernels of (after its timed ones)
IMPLS = ("eager", "compile", "compile_ro", "tandem-py", "tandem-py-compiled",
         "tandem-py-model-compiled", "tandem-cpp", "tandem-cpp-module", "compile_frozen", "aoti")
FROZEN_IMPLS = ("compile_frozen", "aoti")  # rows of r50_frozen_head only
CPP_JOBS = ("r18_full", "r50_full", "r50_frozen_head")  # the jobs tandem-cpp has


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- one row (in a process of its own) --------------------------------------------------------
def build(job, bs, batches, torch, device, precision="bf16"):
    """(feed or None, model, loss_fn, optimizer, data [(x, y)]) for a job: `precision`'s autocast
    (bf16 or fp16) inside the modules' forward, channels_last weights and inputs."""
    import torchvision
    cl = torch.channels_last
    torch.manual_seed(0)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]

    class Autocast(torch.nn.Module):  # what a user writes to train under autocast in any loop
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            with torch.autocast("cuda", dtype=dtype):
                return self.net(x)

    size = 224
    if job in ("r18_full", "r50_full", "vit_b16_full", "mnv3_full"):
        ctor = {"r18_full": torchvision.models.resnet18, "r50_full": torchvision.models.resnet50,
                "vit_b16_full": torchvision.models.vit_b_16,
                "mnv3_full": torchvision.models.mobilenet_v3_large}[job]
        net = ctor(num_classes=1000).to(device, memory_format=cl)
        feed, model, params = None, Autocast(net).train(), net.parameters()
    elif job == "r50_frozen_head":
        backbone = torchvision.models.resnet50()
        backbone.fc = torch.nn.Identity()
        backbone = backbone.to(device, memory_format=cl).eval().requires_grad_(False)
        feed = Autocast(backbone)
        head = torch.nn.Linear(2048, 1000).to(device)
        model, params = Autocast(head).train(), head.parameters()
    else:
        raise ValueError(f"job {job!r} is not known: expected one of {', '.join(JOBS)}")
    g = torch.Generator(device).manual_seed(1)
    data = [(torch.randn(bs, 3, size, size, device=device, generator=g).contiguous(memory_format=cl),
             torch.randint(0, 1000, (bs,), device=device, generator=g)) for _ in range(batches)]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return feed, model, torch.nn.CrossEntropyLoss(), optimizer, data


def plain_loop(impl, feed, model, loss_fn, optimizer, data, torch, precision="bf16"):
    """step(i) of the plain loop for eager / compile / compile_ro; in fp16 with torch's
    GradScaler, as its recipe for half precision has it."""
    def forward_loss(x, y):
        if feed is not None:
            with torch.no_grad():
                x = feed(x)
        return loss_fn(model(x), y)

    if impl in FROZEN_IMPLS:
        if feed is None:
            raise ValueError(f"{impl} rows need a frozen backbone (job r50_frozen_head)")
        head_loss = torch.compile(lambda x, y: loss_fn(model(x), y))
        backbone = frozen_backbone(impl, feed, data[0][0], torch)

        def forward_loss(x, y):  # noqa: F811 - the frozen rows' own
            with torch.no_grad():
                x = backbone(x)
            return head_loss(x, y)
    elif impl == "compile":
        forward_loss = torch.compile(forward_loss)
    elif impl == "compile_ro":
        forward_loss = torch.compile(forward_loss, mode="reduce-overhead")

    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def step(i):
        x, y = data[i % len(data)]
        loss = forward_loss(x, y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def frozen_backbone(impl, feed, example, torch):
    """The frozen backbone for compile_frozen (torch.compile with freezing) or aoti (an
    AOTInductor package with freezing, bf16 weights, loaded back): x -> float features."""
    import torch._inductor.config as inductor_config
    if impl == "compile_frozen":
        inductor_config.freezing = True
        return torch.compile(feed)
    import tempfile
    net = feed.net.to(torch.bfloat16)  # the bf16 weights autocast would cast to per step
    with torch.no_grad():
        ep = torch.export.export(net, (example.to(torch.bfloat16),))
        path = os.path.join(tempfile.mkdtemp(), "backbone.pt2")
        t0 = time.perf_counter()
        torch._inductor.aoti_compile_and_package(ep, package_path=path,
                                                 inductor_configs={"freezing": True})
        log(f"aoti: compiled {path} in {time.perf_counter() - t0:.0f} s")
    runner = torch._inductor.aoti_load_package(path)
    return lambda x: runner(x.to(torch.bfloat16)).float()


def run_cpp_row(a):
    """A tandem-cpp row: the CLI's bench of the same job on one resident batch, in --mode."""
    row = dict(impl=a.impl, job=a.job, batch_size=a.bs, precision=a.precision,
               layout="channels_last", images_per_s=None, error=None)
    if a.job not in CPP_JOBS:
        row["error"] = f"tandem-cpp has no {a.job} (its jobs: {', '.join(CPP_JOBS)})"
        return row
    cli = a.tandem_cli or os.environ.get("TANDEM_CLI")
    if not cli or not os.path.exists(cli):
        row["error"] = f"no tandem CLI at {cli!r}: give --tandem-cli PATH or TANDEM_CLI"
        return row
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [cli, "bench", "--workload", "images", "--param", f"model={a.job}",
               "--param", "source=resident", "--param", f"precision={a.precision}",
               "--param", "layout=channels_last", "--param", "classes=1000",
               "--param", "lr=0.01", "--batch-size", str(a.bs), "--mode", a.mode,
               "--steps", str(a.steps), "--warmup", str(a.warmup)]
        module = a.impl == "tandem-cpp-module"
        if a.job == "r50_frozen_head":
            cmd += ["--param", "backbone=" + ("module" if module else "folded")]
        else:
            cmd += ["--param", "bn=" + ("module" if module else "fused")]
        if a.profile:
            cmd += ["--kernels", str(PROFILE_STEPS)]
        row["call"] = "tandem " + " ".join(cmd[1:])
        cmd += ["--json", out]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        row["setup_s"] = round(time.perf_counter() - t0, 1)
        if r.returncode != 0 or not os.path.exists(out):
            row["error"] = f"exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1]}"
            log(r.stdout[-2000:] + r.stderr[-3000:])
            return row
        with open(out) as f:
            j = json.load(f)
    row.update(images_per_s=j["samples_per_s"], mode=j.get("picked", j.get("mode")))
    if j.get("kernels"):  # the CLI's --kernels: the same listing as profiled()'s
        rows = [{"name": k["name"][:120], "count": k["count"], "total_ms": round(k["total_ms"], 3)}
                for k in j["kernels"]["kernels"]]
        row["kernels"] = {"total_ms": round(j["kernels"]["total_ms"], 3), "top": rows[:40],
                          "kernel_kinds": len(rows)}
    if j.get("trials"):
        row["trials"] = {t["mode"]: round(t["steps_per_s"] * a.bs) if t["steps_per_s"]
                         else t.get("error") for t in j["trials"]}
    return row


def run_row(a):
    if a.impl.startswith("tandem-cpp"):
        return run_cpp_row(a)
    import torch
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    row = dict(impl=a.impl, job=a.job, batch_size=a.bs, precision=a.precision,
               layout="channels_last", images_per_s=None, error=None)
    if a.precision != "bf16" and a.impl not in ("eager", "compile", "compile_ro"):
        row["error"] = (f"{a.impl} rows run bf16 only "
                        "(fp16: eager, compile, compile_ro, tandem-cpp)")
        return row
    feed, model, loss_fn, optimizer, data = build(a.job, a.bs, a.batches, torch, device,
                                                  a.precision)
    profile_rows = None
    t_setup = time.perf_counter()
    if a.impl.startswith("tandem-py"):
        import tandem
        if a.impl == "tandem-py-model-compiled":
            model = torch.compile(model)
        trainer = tandem.Trainer(model, loss_fn, optimizer, data=data,
                                 feed=[] if feed is None else [("backbone", feed)],
                                 mode=a.mode, compile=a.impl == "tandem-py-compiled")
        if a.profile:  # a fit on the Trainer's own modules, then a profiled one (graphs replayed)
            trainer.fit(steps=a.warmup, progress=False)
            torch.cuda.synchronize()
            profile_rows = profiled(lambda: trainer.fit(steps=PROFILE_STEPS, progress=False),
                                    torch)
        r = trainer.benchmark(steps=a.steps, warmup=a.warmup)
        row.update(images_per_s=r.samples_per_s, mode=r.mode,
                   setup_s=round(time.perf_counter() - t_setup, 1))
        if trainer.trials and trainer.trials.get("trials"):  # mode auto: each mode's trial
            row["trials"] = {t["mode"]: round(t["steps_per_s"] * a.bs) if t["steps_per_s"]
                             else t.get("error") for t in trainer.trials["trials"]}
    else:
        step = plain_loop(a.impl, feed, model, loss_fn, optimizer, data, torch, a.precision)
        for i in range(a.warmup):
            step(i)
        torch.cuda.synchronize()
        row["setup_s"] = round(time.perf_counter() - t_setup, 1)
        t0 = time.perf_counter()
        for i in range(a.steps):
            step(i)
        torch.cuda.synchronize()
        row["images_per_s"] = a.steps * a.bs / (time.perf_counter() - t0)
        if a.profile:
            profile_rows = profiled(lambda: [step(i) for i in range(PROFILE_STEPS)], torch)
    counters = dynamo_counters()
    if counters:
        row["dynamo"] = counters
    if profile_rows is not None:
        row["kernels"] = profile_rows
    return row


def dynamo_counters():
    """Recompilations, graph breaks and frames compiled: what says compiled code ran as meant."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    out = {}
    for group in ("stats", "recompiles", "graph_break", "frames"):
        if counters.get(group):
            out[group] = {str(k): v for k, v in counters[group].items()}
    return out


def profiled(fn, torch):
    """The GPU kernels `fn` runs: [{name, count, total_ms}] by total time, and the sum."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.device_time / 1000.0
    rows = sorted(({"name": n[:120], "count": c, "total_ms": round(t, 3)}
                   for n, (c, t) in kernels.items()), key=lambda r: -r["total_ms"])
    return {"total_ms": round(sum(r["total_ms"] for r in rows), 3), "top": rows[:40],
            "kernel_kinds": len(rows)}


# ---- the driver ---------------------------------------------------------------------------------
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", default="r18_full,r50_full,r50_frozen_head",
                   help=f"comma-separated, of {', '.join(JOBS)}")
    p.add_argument("--bs", default="32,256", help="batch sizes, comma-separated")
    p.add_argument("--impls", default=",".join(IMPLS[:5]), help=f"of {', '.join(IMPLS)}")
    p.add_argument("--steps", type=int, default=100, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=15,
                   help="untimed steps first (compilation, capture, autotuning)")
    p.add_argument("--batches", type=int, default=4, help="distinct device-resident batches")
    p.add_argument("--mode", default="auto",
                   help="tandem.Trainer's mode for tandem rows (auto: trials of every mode)")
    p.add_argument("--profile", default="",
                   help="JOB:BS:IMPL[,IMPL...], several separated by ';': also list those "
                        f"rows' GPU kernels over {PROFILE_STEPS} steps (in the rows)")
    p.add_argument("--precision", default="bf16",
                   help="bf16 or fp16 (autocast; fp16 with torch's GradScaler in the plain "
                        "loops, tandem's loss scale in tandem-cpp), comma-separated for both")
    p.add_argument("--timeout", type=int, default=600, help="seconds per row")
    p.add_argument("--tandem-cli", default=os.environ.get("TANDEM_CLI"),
                   help="the tandem executable, for tandem-cpp rows [env TANDEM_CLI]")
    p.add_argument("--out", default="compile.json")
    p.add_argument("--row", action="store_true", help=argparse.SUPPRESS)  # one row, JSON on stdout
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.row:
        a.bs = int(a.bs)
        a.profile = a.profile == "1"
        try:
            row = run_row(a)
        except Exception as e:  # noqa: BLE001 - an error is a row of the table
            traceback.print_exc()
            row = dict(impl=a.impl, job=a.job, batch_size=a.bs, precision=a.precision,
                       layout="channels_last", images_per_s=None,
                       error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        print("ROW " + json.dumps(row), flush=True)
        return

    profiled_rows = set()  # (job, bs, impl)
    for spec in filter(None, a.profile.split(";")):
        try:
            job, bs, impls = spec.split(":")
            profiled_rows.update((job, int(bs), impl) for impl in impls.split(","))
        except ValueError:
            p.error(f"--profile {spec!r} is not valid: expected JOB:BS:IMPL[,IMPL...]")
    import torch
    rows = []

    def write():
        result = dict(device=torch.cuda.get_device_name(),
                      date=datetime.date.today().isoformat(), torch=torch.__version__,
                      command="python3 benchmarks/compile_bench.py " + " ".join(sys.argv[1:]),
                      rows=rows)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    for job in a.jobs.split(","):
        for bs in (int(b) for b in a.bs.split(",")):
            for precision in a.precision.split(","):
                for impl in a.impls.split(","):
                    if impl in FROZEN_IMPLS and job != "r50_frozen_head":
                        continue
                    prof = (job, bs, impl) in profiled_rows
                    cmd = [sys.executable, __file__, "--row", "--job", job, "--bs", str(bs),
                           "--impl", impl, "--steps", str(a.steps), "--warmup", str(a.warmup),
                           "--batches", str(a.batches), "--mode", a.mode,
                           "--profile", "1" if prof else "0", "--precision", precision]
                    if a.tandem_cli:
                        cmd += ["--tandem-cli", a.tandem_cli]
                    t0 = time.perf_counter()
                    try:
                        out = subprocess.run(cmd, capture_output=True, text=True,
                                             timeout=a.timeout)
                        lines = [l for l in out.stdout.splitlines() if l.startswith("ROW ")]
                        row = json.loads(lines[-1][4:]) if lines else dict(
                            impl=impl, job=job, batch_size=bs, images_per_s=None,
                            error=f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
                        if row.get("error"):
                            log(out.stderr[-3000:])
                    except subprocess.TimeoutExpired:
                        row = dict(impl=impl, job=job, batch_size=bs, images_per_s=None,
                                   error=f"timed out after {a.timeout} s")
                    row.setdefault("precision", precision)
                    row.setdefault("layout", "channels_last")
                    row["wall_s"] = round(time.perf_counter() - t0, 1)
                    ips = row.get("images_per_s")
                    log(f"{job:16s} bs {bs:4d} {precision} {impl:19s} "
                        + (f"{ips:9.0f} img/s" if ips else f"ERROR {row.get('error')}")
                        + f"  ({row['wall_s']} s{', ' + row['mode'] if row.get('mode') else ''})")
                    rows.append(row)
                    write()
    write()
    # The table: each job and batch size, every impl's rate and its ratio to compile.
    print(f"\n{'job':16s} {'bs':>4s} " + " ".join(f"{i:>19s}" for i in a.impls.split(",")))
    for job in a.jobs.split(","):
        for bs in (int(b) for b in a.bs.split(",")):
            for precision in a.precision.split(","):
                cells = {r["impl"]: r.get("images_per_s") for r in rows if r["job"] == job
                         and r["batch_size"] == bs and r["precision"] == precision}
                ref = cells.get("compile")
                line = f"{job:16s} {bs:4d} {precision} "
                for impl in a.impls.split(","):
                    v = cells.get(impl)
                    cell = "error" if not v else f"{v:.0f}" + (f" ({v / ref:.2f}x)" if ref else "")
                    line += f"{cell:>19s} "
                print(line)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
