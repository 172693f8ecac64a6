"""The data-parallel phases: ddp (tandem bench and tandem train --nproc W beside PyTorch DDP and
the all-reduce floor) and gathercost (GatheredGrad's weight-gradient GEMM at the worlds one GPU
cannot run)."""
import json

from lab.check import PROG, PYTHON, joined, phase
from lab.options import ddp_options, folder_options


def ddp_tandem_run(c, a, scen, mode, bs, world, flag):
    """One `tandem bench --nproc` run of the ddp phase; flag: [] or ["--no-gathered-grad"]."""
    run = f"ddp-tandem-{scen}-{mode}-{bs}-w{world}" + ("-allreduced" if flag else "")
    c.say(f"tandem bench --nproc {world} {scen} {mode} bs {bs} {' '.join(flag)}")
    c.run(["timeout", 180, c.tandem, "bench", "--workload", scen, "--mode", mode,
           "--batch-size", bs, "--workers", 8, "--nproc", world, *flag,
           *(["--bucket-cap-mb", a.ddp_bucket_mb] if a.ddp_bucket_mb else []),
           "--json", c.raw_path(f"{run}.json")],
          save=c.raw_path(f"{run}.log"), show=f"^{scen} +[a-z]|^data parallel:|error")


@phase("ddp", folder_options, ddp_options)
def phase_ddp(c, a):
    """tandem bench --nproc W beside PyTorch DDP (ddp_reference.py), the all-reduce floor, tandem
    train --nproc W: ddp.json

    On the reference loops, every world of --ddp-worlds in this call (ddp_reference.py under
    torchrun)."""
    def batch_sizes(scen):
        return a.ddp_seg_bs if scen == "seg" else a.ddp_cls_bs

    for world in a.ddp_worlds:
        for scen in a.ddp_scenarios:
            for bs in batch_sizes(scen):
                for mode in a.ddp_modes:
                    # A run as configured, and at world > 1 in pipelined+graphed the
                    # GatheredGrad layers all-reduced instead (suffix -allreduced).
                    variants = [[]]
                    if world > 1 and mode == "pipelined+graphed" and a.ddp_allreduced:
                        variants.append(["--no-gathered-grad"])
                    for flag in variants:
                        ddp_tandem_run(c, a, scen, mode, bs, world, flag)
        if a.ddp_python:
            for scen in a.ddp_scenarios:
                c.say(f"python ddp_reference.py --scenario {scen} world {world}")
                c.run(["timeout", 300, "torchrun", "--nproc-per-node", world,
                       "benchmarks/ddp_reference.py", "--scenario", scen,
                       "--bs", joined(batch_sizes(scen)), "--json", c.raw_path("ddp-python.json"),
                       "--append"], save=c.raw_path(f"ddp-python-{scen}-w{world}.log"),
                      show=r"^\{|error", tail=6)
        # Each NCCL setting: one extra run of seg at the first batch size, pipelined+graphed (not
        # in ddp.json; for tuning).
        if world > 1:
            for setting in a.ddp_nccl_variants:
                bs = a.ddp_seg_bs[0]
                c.say(f"variant {setting}: tandem bench --nproc {world} seg pipelined+graphed "
                      f"bs {bs}")
                c.run(["timeout", 180, c.tandem, "bench", "--workload", "seg", "--mode",
                       "pipelined+graphed", "--batch-size", bs, "--workers", 8, "--nproc", world],
                      env=dict(kv.split("=", 1) for kv in setting.split()),
                      show=r"^seg +[a-z]|error", fail=False)
            c.say(f"allreduce_floor.py: one NCCL all-reduce of the workloads' gradient bytes, "
                  f"world {world}")
            c.run(["timeout", 120, "torchrun", "--nproc-per-node", world,
                   "benchmarks/allreduce_floor.py", "--mb", *a.ddp_floor_mb,
                   "--json", c.raw_path(f"allreduce-floor-w{world}.json")], show=r"^\{",
                  fail=False)
    # tandem train --nproc W on the generated ImageFolder (ResNet-18, the loader's default
    # threads: shared by the ranks of this machine): the CLI's data parallel on real data.
    if a.ddp_train:
        folder = c.image_folder()
        for world in a.ddp_worlds:
            c.say(f"tandem train --nproc {world} resnet18 on {folder}, bs {a.ddp_train_bs} "
                  f"per rank")
            result = c.raw_path(f"ddp-train-w{world}.json")
            c.run(["timeout", 300, c.tandem, "train", "--data", folder, "--model", "resnet18",
                   "--optimizer", "sgd", "--lr", 0.1, "--batch-size", a.ddp_train_bs,
                   "--epochs", a.ddp_train_epochs, "--val-split", 0.1, "--nproc", world,
                   "--out", c.raw_path(f"ddp-train-w{world}"), "--json", result],
                  save=c.raw_path(f"ddp-train-w{world}.log"),
                  show=lambda line: "step" not in line, tail=8)
            try:
                with open(result) as f:
                    d = json.load(f)
                keys = ("images_per_s", "accuracy", "epochs", "batch_size")
                c.emit(f"ddp-train world {world} { {k: d.get(k) for k in keys} }")
            except (OSError, ValueError) as e:
                c.emit(f"ddp-train world {world}: no result ({e})")
    c.compare("--scenario", "ddp", "--raw", c.raw, "--command", f"{PROG} ddp --out OUT",
              "--out", c.out_path("ddp.json"), fail=False)


@phase("gathercost")
def phase_gathercost(c, a):
    """GatheredGrad's weight-gradient GEMM at worlds 1, 2, 4, 8 on one GPU (the worlds it cannot
    run): gathered-cost.json, gathered-cost.log"""
    c.say("gathercost: benchmarks/gathered_grad_cost.py, worlds 1 2 4 8")
    c.run([PYTHON, "benchmarks/gathered_grad_cost.py", "--json", c.out_path("gathered-cost.json")],
          save=c.out_path("gathered-cost.log"), show=True)
