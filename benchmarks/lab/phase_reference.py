"""The reference workloads' phases: seg, cls, augment, mlp, sweep, pair, graphs, profile and
profile-mlp. tandem bench, sweep and augment-bench run beside benchmarks/reference_loops.py in the
same call; compare.py merges them."""
import os
import re

from lab.check import LOOPS, PROG, PYTHON, device_name, joined, phase
from lab.options import (graphs_options, mlp_options, pair_options, profile_options, seg_options,
                         sizes_options, sweep_options)


def bench_scenario(c, scenario, runs, py_modes, sizes):
    """tandem bench at each batch size and run, then the Python loops and the floor, then
    compare.py (which pairs them: its PYTHON_TO_TANDEM). A run is a mode, optionally with
    workload parameters after colons: "serial:augment=cpu" is --mode serial --param augment=cpu."""
    c.need_reference()
    bs_csv, py_csv = joined(sizes), joined(py_modes)
    c.say(f"tandem bench --workload {scenario}, runs {' '.join(runs)}, bs {bs_csv}")
    for bs in sizes:
        for run in runs:
            mode, *params = run.split(":")
            tag = re.sub(r"[:=+]", "_", run)  # serial:augment=cpu -> serial_augment_cpu
            c.run([c.tandem, "bench", "--workload", scenario, "--mode", mode,
                   *[x for kv in params for x in ("--param", kv)], "--batch-size", bs,
                   "--steps", 100, "--warmup", 10, "--workers", 8,
                   "--json", c.raw_path(f"tandem-{scenario}-{tag}-{bs}.json")], log_all=True)
    c.say(f"python reference_loops.py {scenario} --bs {bs_csv} --modes {py_csv}")
    c.run([PYTHON, LOOPS, scenario, "--bs", bs_csv, "--modes", py_csv,
           "--json", c.raw_path(f"python-{scenario}.json")], log_all=True)
    floor = c.floor()
    shown = ",".join(" --param ".join(run.split(":")) for run in runs)
    c.say(f"compare {scenario}")
    c.compare("--scenario", scenario, "--tandem", *c.glob(f"tandem-{scenario}-*.json"),
              "--python", c.raw_path(f"python-{scenario}.json"), "--floor", floor,
              "--command", f"{PROG} {scenario} --out OUT (tandem bench --workload {scenario} "
              f"--mode {{{shown}}} --batch-size {{{bs_csv}}} --steps 100 --warmup 10 --workers 8; "
              f"reference_loops.py {scenario} --bs {bs_csv} --modes {py_csv}; "
              f"reference_loops.py floor)",
              "--out", c.out_path(f"{scenario}.json"))


@phase("seg", sizes_options, seg_options)
def phase_seg(c, a):
    """tandem bench serial and pipelined at --bench-bs beside reference_loops.py seg and the
    floors: seg.json"""
    bench_scenario(c, "seg", ["serial", "pipelined"], ["serial", "pipelined"], a.bench_bs)
    if a.variants:
        c.say("tandem bench seg pipelined, variants for comparison (not in seg.json)")
        for bs in a.bench_bs:
            for flags, name, note in ((["--no-cudnn-benchmark"], "nocudnnbench",
                                       "no cuDNN autotuning"),
                                      (["--train-priority", "normal"], "normalprio",
                                       "train lane normal priority")):
                c.run([c.tandem, "bench", "--workload", "seg", "--mode", "pipelined",
                       "--batch-size", bs, *flags, "--workers", 8,
                       "--json", c.raw_path(f"variant-{name}-{bs}.json")],
                      show=r"^seg +[a-z]", tail=1, suffix=f"  ({note})", fail=False)


@phase("cls", sizes_options)
def phase_cls(c, a):
    """tandem's serial mode (augmenting on the loader's workers, and on the GPU) and pipelined at
    --cls-bs beside Python's cpu_aug, gpu_aug and pipelined loops: cls.json"""
    # Python's cpu_aug and gpu_aug loops beside tandem's serial mode, augmenting on the loader's
    # workers (--param augment=cpu) and on the GPU (the default).
    bench_scenario(c, "cls", ["serial:augment=cpu", "serial", "pipelined"],
                   ["cpu_aug", "gpu_aug", "pipelined"], a.cls_bs)


@phase("augment", sizes_options)
def phase_augment(c, a):
    """tandem augment-bench (sampling auto, staged) at --cls-bs beside torchvision's GPU batch
    transform: augment.json"""
    c.need_reference()
    bs_csv = joined(a.cls_bs)
    c.say(f"tandem augment-bench --batch-sizes {bs_csv} --sampling auto,staged")
    c.run([c.tandem, "augment-bench", "--batch-sizes", bs_csv, "--sampling", "auto,staged",
           "--json", c.raw_path("augment-bench.json")], show=True)
    floor = c.floor()
    c.say("compare augment (torchvision's GPU batch transform from reference_loops.py floor)")
    c.compare("--scenario", "augment", "--tandem", c.raw_path("augment-bench.json"),
              "--floor", floor, "--device", device_name(),
              "--command", f"{PROG} augment --out OUT (tandem augment-bench --batch-sizes "
              f"{bs_csv} --sampling auto,staged; reference_loops.py floor)",
              "--out", c.out_path("augment.json"))


MLP_MODES = ["serial", "pipelined", "graphed", "graphed_k", "pipelined+graphed"]


def mlp_rounds(c, a):
    """Rounds of tandem's mlp modes and reference_loops.py mlp; returns what they ran, for the
    record. serial is compared with Python's eager loop, the graphed modes with its graph
    replay; pipelined is for the record."""
    c.say(f"tandem bench mlp ({' '.join(MLP_MODES)}; 1000 steps) and reference_loops.py mlp, "
          f"{a.mlp_rounds} rounds")
    for rnd in range(1, a.mlp_rounds + 1):
        for mode in MLP_MODES:
            c.run([c.tandem, "bench", "--workload", "mlp", "--mode", mode, "--steps", 1000,
                   "--warmup", 100,
                   "--json", c.raw_path(f"tandem-mlp-{mode.replace('+', '_')}-{rnd}.json")],
                  log_all=True)
        c.run([PYTHON, LOOPS, "mlp", "--json", c.raw_path(f"python-mlp-{rnd}.json")],
              log_all=True)
        # The graphed runs again without the NVML reader thread: what it costs, for the log only
        # (not in graphs.json).
        for mode in ("graphed", "pipelined+graphed"):
            c.run([c.tandem, "bench", "--workload", "mlp", "--mode", mode, "--steps", 1000,
                   "--warmup", 100, "--no-gpu-monitor"], show="^mlp ",
                  suffix="  (--no-gpu-monitor)", fail=False)
    return (f"{a.mlp_rounds} rounds of: tandem bench --workload mlp --mode {{{joined(MLP_MODES)}}} "
            f"--steps 1000 --warmup 100; reference_loops.py mlp")


@phase("mlp", mlp_options)
def phase_mlp(c, a):
    """mlp's modes beside reference_loops.py mlp, in rounds: graphs.json (graphs includes it;
    `run` skips it when graphs runs)"""
    c.need_reference()
    command = mlp_rounds(c, a)
    c.compare("--scenario", "mlp", "--tandem", *c.glob("tandem-mlp-*.json"),
              "--python-rounds", *c.glob("python-mlp-*.json"),
              "--command", f"{PROG} mlp --out OUT ({command})", "--out", c.out_path("graphs.json"))


def sweeps(c):
    return [p for p in (c.raw_path("sweep-seg.json"), c.raw_path("sweep-cls.json"))
            if os.path.exists(p)]


@phase("sweep", sweep_options)
def phase_sweep(c, a):
    """tandem sweep of every mode and auto per workload: auto.json, sweep-WORKLOAD.svg; two Chrome
    traces into raw.tar.gz

    One sweep per workload: every mode and auto at each batch size, in one process (serial, the
    baseline, first). It serves the graphs comparison (pipelined+graphed vs pipelined) and auto.json
    (auto vs the best mode)."""
    bs_csv = joined(a.sweep_bs)
    for scenario in a.sweep_scenarios:
        c.say(f"tandem sweep --workload {scenario} --batch-sizes {bs_csv} --rounds "
              f"{a.sweep_rounds} (every mode, then auto)")
        c.run(["timeout", 540, c.tandem, "sweep", "--workload", scenario, "--batch-sizes", bs_csv,
               "--modes", "all,auto", "--rounds", a.sweep_rounds, "--workers", 8,
               "--json", c.raw_path(f"sweep-{scenario}.json"),
               "--csv", c.raw_path(f"sweep-{scenario}.csv"),
               "--svg", c.out_path(f"sweep-{scenario}.svg")],
              env={"TANDEM_DEBUG": "1", "TORCH_SHOW_CPP_STACKTRACES": "1"}, log_all=True,
              show=lambda line: not line.startswith("  done:"), head=40)
    c.say("compare auto")
    c.compare("--scenario", "auto", "--sweep", *sweeps(c), "--device", device_name(),
              "--command", f"{PROG} sweep --out OUT (tandem sweep --workload "
              f"{{{' '.join(a.sweep_scenarios)}}} --batch-sizes {bs_csv} --modes all,auto "
              f"--rounds {a.sweep_rounds} --workers 8)", "--out", c.out_path("auto.json"))
    c.say("a Chrome trace of seg pipelined+graphed, bs 8 (in raw.tar.gz)")
    c.run([c.tandem, "bench", "--workload", "seg", "--mode", "pipelined+graphed", "--batch-size", 8,
           "--steps", 20, "--warmup", 10, "--trace",
           c.raw_path("trace-seg-pipelined-graphed-8.json")], log_all=True)
    c.run([c.tandem, "bench", "--workload", "cls", "--mode", "pipelined", "--batch-size", 32,
           "--steps", 20, "--warmup", 10, "--trace", c.raw_path("trace-cls-pipelined-32.json")],
          log_all=True)


# The pair's variants: their flags and environments. streamprio: graphs run at the priority of
# the stream they are launched into, not their nodes' (how the fix was measured before it was
# made; since commit 902ddb2 GraphedStep instantiates graphs so).
PAIR_FLAGS = {"nobench": ["--no-cudnn-benchmark"], "normalprio": ["--train-priority", "normal"]}
PAIR_ENV = {"streamprio": {"CUDA_GRAPHS_USE_NODE_PRIORITY": "0"}}


@phase("pair", pair_options)
def phase_pair(c, a):
    """pipelined vs pipelined+graphed of one workload and batch size, alternating, in variants:
    pair.txt (pair-kernels.txt with --pair-ncu)

    The two modes alternate on fresh instances, in each variant: pair.txt holds each run's stage
    device times and the medians."""
    c.say(f"pair: {a.pair_scenario} bs {a.pair_bs}, pipelined vs pipelined+graphed, "
          f"{a.pair_rounds} rounds of: {' '.join(a.pair_variants)}")
    for rnd in range(1, a.pair_rounds + 1):
        for variant in a.pair_variants:
            for mode in ("pipelined", "pipelined+graphed"):
                c.run([c.tandem, "bench", "--workload", a.pair_scenario, "--mode", mode,
                       "--batch-size", a.pair_bs, "--steps", 300, "--warmup", 20, "--workers", 8,
                       *PAIR_FLAGS.get(variant, []),
                       "--json", c.raw_path(f"pair-{variant}-{mode}-{rnd}.json")],
                      env=PAIR_ENV.get(variant), log_all=True)
    if a.pair_ncu:
        # Kernel by kernel, serialized by ncu: does a replayed step run the kernels its eager twin
        # runs, for as long? 40 steps in, 4 steps' worth of launches (about 150 per step).
        for mode in ("pipelined", "pipelined+graphed"):
            c.say(f"ncu: {a.pair_scenario} {mode} bs {a.pair_bs}, per-kernel GPU time")
            c.run(["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
                   "--launch-skip", 6000, "--launch-count", 600, "--csv", c.tandem, "bench",
                   "--workload", a.pair_scenario, "--mode", mode, "--batch-size", a.pair_bs,
                   "--steps", 100, "--warmup", 20, "--workers", 8, "--no-gpu-monitor"],
                  save=c.raw_path(f"ncu-pair-{mode}.csv"))
        c.compare("--scenario", "pair-kernels", "--raw", c.raw,
                  "--out", c.out_path("pair-kernels.txt"), tail=40, fail=False)
    c.compare("--scenario", "pair", "--raw", c.raw, "--out", c.out_path("pair.txt"), fail=False)


@phase("graphs", sizes_options, graphs_options, mlp_options)
def phase_graphs(c, a):
    """seg's launch-bound regime (--launch-bs) and mlp, in rounds beside Python, and the sweeps'
    pipelined+graphed vs pipelined (run sweep first): graphs.json"""
    c.need_reference()
    launch_csv = joined(a.launch_bs)
    # Python's serial loop at these sizes varies by up to 25% between calls: rounds, alternating
    # tandem and Python, and medians (compare.py).
    c.say(f"seg at bs {launch_csv}, {a.launch_rounds} rounds: tandem serial, pipelined, "
          f"pipelined+graphed; python serial")
    for rnd in range(1, a.launch_rounds + 1):
        for bs in a.launch_bs:
            for mode in ("serial", "pipelined", "pipelined+graphed"):
                c.run([c.tandem, "bench", "--workload", "seg", "--mode", mode, "--batch-size", bs,
                       "--steps", 300, "--warmup", 20, "--workers", 8,
                       "--json", c.raw_path(f"tandem-seg-{mode}-{bs}-{rnd}.json")], log_all=True)
        c.run([PYTHON, LOOPS, "seg", "--bs", launch_csv, "--modes", "serial",
               "--json", c.raw_path(f"python-seg-launch-{rnd}.json")], log_all=True)
    floor = c.floor()
    mlp_command = mlp_rounds(c, a)
    c.say("compare graphs")
    swept = sweeps(c)
    c.compare("--scenario", "graphs",
              "--tandem", *c.glob("tandem-mlp-*.json", "tandem-seg-*.json"),
              "--python-rounds", *c.glob("python-mlp-*.json"),
              "--python", *c.glob("python-seg-launch-*.json"), "--floor", floor,
              *(["--sweep", *swept] if swept else []),
              "--command", f"{PROG} run --out OUT --phases sweep graphs ({mlp_command}; "
              f"{a.launch_rounds} rounds of: tandem bench --workload seg --mode "
              f"{{serial,pipelined,pipelined+graphed}} --batch-size {{{launch_csv}}} --steps 300 "
              f"--warmup 20, reference_loops.py seg --bs {launch_csv} --modes serial; "
              f"reference_loops.py floor; the sweeps of the sweep phase)",
              "--out", c.out_path("graphs.json"))


@phase("profile", profile_options)
def phase_profile(c, a):
    """ncu of the augment kernel (full set, source counters): profile-augment.txt"""
    c.need_reference()
    c.say("ncu: augment kernel, batch 32 (--set full, source counters)")
    report = c.raw_path("augment")
    c.run(["ncu", "--clock-control", "none", "--kernel-name", "regex:augment_kernel",
           "--launch-skip", 3, "--launch-count", 1, "--set", "full", "--import-source", "yes",
           "-o", report, "-f", c.tandem, "augment-bench", "--batch-sizes", 32, "--repeats", 2,
           "--sampling", a.profile_sampling], log_all=True)
    text = c.out_path("profile-augment.txt")
    c.run(["ncu", "-i", f"{report}.ncu-rep", "--print-details", "all"], save=text, fail=False)
    c.run(["ncu", "-i", f"{report}.ncu-rep", "--page", "source", "--print-source", "sass",
           "--csv"], save=text, append=True, fail=False)


@phase("profile-mlp")
def phase_profile_mlp(c, a):
    """per-kernel GPU times of the mlp step, tandem beside Python: profile-mlp.txt"""
    c.need_reference()
    c.say("ncu: per-kernel GPU time of mlp steps (tandem serial, Python eager), 60 launches each")
    ncu = ["ncu", "--clock-control", "none", "--metrics", "gpu__time_duration.sum",
           "--launch-skip", 3000, "--launch-count", 60, "--csv"]
    text = c.out_path("profile-mlp.txt")
    c.run([*ncu, c.tandem, "bench", "--workload", "mlp", "--mode", "serial", "--steps", 400,
           "--warmup", 10, "--no-gpu-monitor"], save=text)
    c.run([*ncu, PYTHON, LOOPS, "mlp"], save=text, append=True)
    c.say("mlp timing without the GPU monitor, tandem graphed beside Python, 2 rounds")
    for _ in range(2):
        c.run([c.tandem, "bench", "--workload", "mlp", "--mode", "graphed", "--steps", 1000,
               "--warmup", 100, "--no-gpu-monitor"], show="^mlp ", fail=False)
        c.run([PYTHON, LOOPS, "mlp"], show=True, tail=2, fail=False)
