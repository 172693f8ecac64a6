#!/usr/bin/env python3
"""The benchmarks of the GPU machine: tandem's CLI (a build of this tree, --build) beside the
Python reference loops (benchmarks/reference_loops.py) and PyTorch's own recipes, in the same call
so that both numbers come from one card. Each phase writes its result files into --out (the names
benchmarks/results/ and docs/results.md use), its log lines into OUT/gpu-check.log, and its runs'
own files into OUT/raw.tar.gz. The build, the tests and compute-sanitizer are
scripts/gpu-check.sh's (run it first: it builds build-gpu/).

  python3 benchmarks/gpu_check.py seg --out OUT                   one phase
  python3 benchmarks/gpu_check.py run --out OUT --phases seg cls  several, in the order below
  python3 benchmarks/gpu_check.py ab --out OUT --old-tree .ref/old
  python3 benchmarks/gpu_check.py PHASE --help                    a phase's options

The phases are the commands listed below, in the order `run` runs them whatever order they are
named in (the default of `run --phases`: seg cls augment graphs sweep).

Relative paths (--build, --old-tree, --debs, ...) are the repository root's, where the phases run;
--out is the caller's. List options take their values separated by spaces or commas. Exit status:
0 every run succeeded, 1 something failed (the log says what), 2 bad command-line input; `ab` alone
also 3: every run done, some cell below --ab-min-ratio.
"""
import argparse
import collections
import contextlib
import fnmatch
import glob
import gzip
import hashlib
import inspect
import io
import json
import os
import re
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent  # the repository: the phases run from there, as their commands' paths assume
sys.path.insert(0, str(HERE))
import compare  # noqa: E402  (the merges of every phase's result live there)

PROG = "benchmarks/gpu_check.py"  # as recorded in the results' "command"
LOOPS = "benchmarks/reference_loops.py"  # the Python reference loops
PYTHON = sys.executable  # the Python running this driver (python3 with torch on the GPU machine)
T0 = time.monotonic()  # the budget of `ab` counts from here


class Fatal(Exception):
    """A phase cannot run at all: the driver stops (exit status 1)."""


# ----------------------------------------------------------------------------------------------
# Options


class Words(argparse.Action):
    """A list option: values separated by spaces or commas, in one argument or several
    ("--bench-bs 8 32", "--bench-bs 8,32" and "--bench-bs '8 32'" alike); replaces the default.
    kind converts each value (ValueError: the value is refused, naming the option); allowed, when
    given, lists the accepted values."""

    def __init__(self, option_strings, dest, kind=str, allowed=None, **kw):
        super().__init__(option_strings, dest, nargs="+", **kw)
        self.kind, self.allowed = kind, allowed

    def __call__(self, parser, namespace, values, option_string=None):
        items = [w for v in values for w in re.split(r"[,\s]+", v) if w]
        if not items:
            parser.error(f"{option_string}: expected at least one value")
        converted = []
        for w in items:
            if self.allowed and w not in self.allowed:
                parser.error(f"{option_string} '{w}': expected one of {', '.join(self.allowed)}")
            try:
                converted.append(self.kind(w))
            except ValueError as e:  # its message, naming the value where it does not
                named = str(e) if f"'{w}'" in str(e) else f"'{w}': {e}"
                parser.error(f"{option_string} {named}")
        setattr(namespace, self.dest, converted)


# The converters of option values: each raises ValueError saying what it expected.

def count(text):
    """A whole number >= 0."""
    if not re.fullmatch(r"[0-9]+", text):
        raise ValueError("expected a whole number >= 0")
    return int(text)


def positive(text):
    """A whole number > 0."""
    if not re.fullmatch(r"[0-9]+", text) or int(text) == 0:
        raise ValueError("expected a whole number > 0")
    return int(text)


def number(text):
    """A number (a ratio, megabytes), as a float."""
    try:
        return float(text)
    except ValueError:
        raise ValueError("expected a number, e.g. 0.97") from None


def fraction(text):
    """A number 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number 0 to 1, e.g. 0.25") from None
    if not 0 <= value <= 1:
        raise ValueError("expected a number 0 to 1, e.g. 0.25")
    return value


def share(text):
    """The JPEG engines' share of a batch: auto (the run's controller) or a number 0 to 1, kept as
    written."""
    if text == "auto":
        return text
    try:
        fraction(text)
    except ValueError:
        raise ValueError("expected auto or a share 0 to 1, e.g. 0.6") from None
    return text


def nice(text):
    """The loader workers' nice value: a whole number from 0 to 19."""
    if not re.fullmatch(r"[0-9]+", text) or int(text) > 19:
        raise ValueError("expected a nice value from 0 to 19")
    return int(text)


def key_value(text):
    """A workload setting KEY=VALUE, kept as written."""
    if not re.fullmatch(r"[a-z_]+=[^\s=]+", text):
        raise ValueError("expected KEY=VALUE, e.g. worker_nice=5")
    return text


def megabytes(text):
    """A positive number of megabytes, kept as written (it is passed on as text)."""
    if number(text) <= 0:
        raise ValueError("expected a number of megabytes > 0")
    return text


def sides(text):
    """A photo folder's side range, MIN-MAX in pixels."""
    if not re.fullmatch(r"[0-9]+-[0-9]+", text):
        raise ValueError("expected MIN-MAX in pixels, e.g. 320-640")
    return text


def cell(text):
    """An A/B cell JOB:BATCH:MODE, as (job, batch size, mode)."""
    return compare.parse_cell(text)


def environment(text):
    """Space-separated VAR=VALUE settings."""
    if not text.split() or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w)
                                   for w in text.split()):
        raise ValueError("expected VAR=VALUE settings separated by spaces, e.g. NCCL_ALGO=Ring")
    return text


def typed(kind):
    """argparse's type= for a converter: the bad value and what was expected, not argparse's
    "invalid value"."""
    def convert(text):
        try:
            return kind(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"'{text}': {e}") from None
    convert.__name__ = kind.__name__
    return convert


# A metavar per converter, where the option does not name its own.
METAVARS = {count: "N", positive: "N", number: "X", megabytes: "MB", sides: "MIN-MAX",
            cell: "JOB:BATCH:MODE"}


def words(group, flag, default, help, kind=str, allowed=None, metavar=None):
    shown = " ".join(str(x) if not isinstance(x, tuple) else ":".join(map(str, x))
                     for x in default) or "none"
    group.add_argument(flag, action=Words, kind=kind, allowed=allowed, default=list(default),
                       metavar=metavar or METAVARS.get(kind, "WORD"),
                       help=f"{help} (default: {shown})")


def toggle(group, flag, default, help):
    group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                       help=f"{help} (default: {'on' if default else 'off'})")


def value(group, flag, default, help, kind=str, metavar=None, default_text=None, **kw):
    shown = default_text or (default if default not in (None, "") else "none")
    group.add_argument(flag, default=default, type=typed(kind) if kind is not str else str,
                       metavar=metavar or METAVARS.get(kind, "TEXT"),
                       help=f"{help} (default: {shown})", **kw)


def common_options(p):
    g = p.add_argument_group("where")
    g.add_argument("--out", required=True, metavar="OUT",
                   help="the folder for the results, gpu-check.log and raw.tar.gz (made if absent)")
    value(g, "--build", "build-gpu", "the build of this tree whose `tandem` runs "
          "(scripts/gpu-check.sh's)", metavar="DIR")
    value(g, "--debs", ".ref/debs", "the .debs and wheels scripts/fetch-gpu-debs.sh downloaded "
          "(Fashion-MNIST, pytest) for a machine without a registry", metavar="DIR")


def sizes_options(p):
    g = p.add_argument_group("batch sizes of the reference workloads (and the floors measured "
                             "for them in one reference_loops.py floor run)")
    words(g, "--bench-bs", [8, 32, 128], "seg's batch sizes", positive)
    words(g, "--cls-bs", [32, 128], "cls's and augment's batch sizes", positive)
    words(g, "--launch-bs", [1, 2], "seg's launch-bound regime (phase graphs)", positive)


def seg_options(p):
    g = p.add_argument_group("seg")
    toggle(g, "--variants", False, "also seg pipelined without cuDNN autotuning and with a "
           "normal-priority train lane, for the log (not in seg.json)")


def mlp_options(p):
    g = p.add_argument_group("mlp (also part of graphs)")
    value(g, "--mlp-rounds", 3, "rounds of tandem's mlp modes and reference_loops.py mlp, "
          "alternating (medians compared)", count)


def graphs_options(p):
    g = p.add_argument_group("graphs")
    value(g, "--launch-rounds", 3, "rounds of seg at --launch-bs, tandem and Python alternating "
          "(Python's serial loop varies by up to 25%% between calls at these sizes)", count)


def sweep_options(p):
    g = p.add_argument_group("sweep")
    words(g, "--sweep-bs", [8, 32, 128], "the sweeps' batch sizes", positive)
    value(g, "--sweep-rounds", 1, "each sweep point's median over this many runs", positive)
    words(g, "--sweep-scenarios", ["seg", "cls"], "the workloads swept", metavar="WORKLOAD")


def pair_options(p):
    g = p.add_argument_group("pair")
    value(g, "--pair-scenario", "seg", "the workload", metavar="WORKLOAD")
    value(g, "--pair-bs", 8, "its batch size", positive)
    value(g, "--pair-rounds", 3, "rounds", count)
    words(g, "--pair-variants", ["bench", "nobench", "normalprio"], "bench (cuDNN autotuning), "
          "nobench (--no-cudnn-benchmark), normalprio (--train-priority normal), streamprio "
          "(CUDA_GRAPHS_USE_NODE_PRIORITY=0: graphs at their stream's priority)",
          allowed=compare.PAIR_VARIANTS, metavar="VARIANT")
    toggle(g, "--pair-ncu", False, "also each mode's kernels under ncu, one at a time: names, "
           "counts and GPU times (pair-kernels.txt)")


def one_option(title, *args, **kw):
    """An option group of one option: value()'s arguments."""
    def add(p):
        value(p.add_argument_group(title), *args, **kw)
    return add


profile_options = one_option("profile", "--profile-sampling", "auto", "the augment kernel's "
                             "sampling profiled (augment-bench --sampling)", metavar="SAMPLING")


def folder_options(p):
    g = p.add_argument_group("the generated JPEG ImageFolder (data, train, ddp, decode)")
    value(g, "--data-dir", "/tmp/tandem-imagefolder", "where it is; made there first where it "
          "does not exist (scripts/make_image_folder.py), kept otherwise", metavar="DIR")
    value(g, "--data-count", 6000, "images made", positive)


fashion_options = one_option(
    "Fashion-MNIST (train, python)", "--fashion-mnist", "/usr/share/datasets/fashion-mnist",
    "its IDX files' folder; without them, the dataset-fashion-mnist .deb in --debs is unpacked "
    "beside the build", metavar="DIR")


def data_options(p):
    g = p.add_argument_group("data")
    words(g, "--data-bs", [64, 256], "batch sizes", positive)
    words(g, "--data-models", ["r50_frozen_head", "r18_full"], "models",
          allowed=("r50_frozen_head", "r18_full", "r50_full"), metavar="MODEL")
    value(g, "--data-steps", 60, "timed steps per run", positive)
    value(g, "--data-mode", "pipelined+graphed", "tandem data-bench's mode", metavar="MODE")
    words(g, "--data-decode", ["cpu", "gpu"], "where tandem decodes, one run each",
          allowed=("cpu", "gpu", "auto"), metavar="WHERE")
    value(g, "--data-py-workers", 8, "data_bench.py's DataLoader workers", positive)


def train_options(p):
    g = p.add_argument_group("train")
    words(g, "--train-jobs", ["fmnist", "images"], "fmnist (the small CNN on Fashion-MNIST), "
          "images (ResNets on the generated JPEG folder), seg (an FCN on generated image + mask "
          "pairs: train-seg.json)", allowed=("fmnist", "images", "seg"), metavar="JOB")
    value(g, "--fmnist-epochs", 10, "Fashion-MNIST's epochs", positive)
    value(g, "--train-epochs", 4, "the image jobs' epochs", positive)
    words(g, "--train-precisions", ["fp32", "bf16"], "precisions", allowed=("fp32", "bf16"),
          metavar="PRECISION")
    value(g, "--train-bs", 256, "the image jobs' batch size", positive)
    words(g, "--train-layouts", ["channels_last"], "layouts", allowed=("nchw", "channels_last"),
          metavar="LAYOUT")
    words(g, "--train-models", ["r50_frozen_head", "r18_full"], "the image jobs' models",
          allowed=("r50_frozen_head", "r18_full", "r50_full"), metavar="MODEL")
    toggle(g, "--train-python", True, "train_bench.py's torchvision loops beside the image jobs")
    value(g, "--seg-dir", "/tmp/tandem-segpairs", "job seg's image + mask pairs, made there "
          "where absent (scripts/make_seg_pairs.py)", metavar="DIR")
    value(g, "--seg-count", 2000, "pairs made", positive)
    value(g, "--seg-epochs", 8, "job seg's epochs", positive)


def photos_options(p):
    g = p.add_argument_group("photos")
    words(g, "--photos-sides", ["320-640", "1000-2000"], "the generated folders' photo sides "
          "(each /tmp/tandem-photos-SIDES)", sides)
    value(g, "--photos-count", 3000, "photos per folder", positive)
    words(g, "--photos-models", ["r18_full", "r50_full"], "models",
          allowed=("r18_full", "r50_full"), metavar="MODEL")
    words(g, "--photos-crops", ["region", "whole"], "tandem train --crop values",
          allowed=("region", "whole"), metavar="CROP")
    value(g, "--photos-epochs", 3, "epochs", positive)
    value(g, "--photos-val-count", 2000, "photos of a held-out folder of their own (FOLDER-val, "
          "other photos of the same sides) that tandem train evaluates each epoch: more than the "
          "evaluation's ring holds decoded ahead (512), so its rate includes the decode; 0: "
          "--val-split 0.1 of the folder", count)
    value(g, "--photos-progressive", 0.0, "share of the generated photos written as progressive "
          "JPEGs (folders /tmp/tandem-photos-SIDES-pSHARE): the workers keep them, and tandem "
          "shrink makes them baseline", fraction)
    toggle(g, "--photos-python", True, "train_bench.py's torchvision loop beside them")
    toggle(g, "--photos-split", True, "also the region runs with decode auto: each batch split "
           "between the CPU workers and the JPEG engines")
    toggle(g, "--photos-shrink", False, "also each folder written again by tandem shrink "
           "(FOLDER-shrunk), and the bench's runs from it beside the original's")
    toggle(g, "--photos-train", True, "tandem train per crop and decode, with its evaluations "
           "(off: the bench's rates from the files and from resident data only, the longer runs "
           "left for another call)")


def ddp_options(p):
    g = p.add_argument_group("ddp (world 2 needs two GPUs: the nvidia-h200-x2 kind)")
    words(g, "--ddp-worlds", [1, 2], "worlds", positive)
    words(g, "--ddp-scenarios", ["seg", "cls"], "workloads", allowed=("seg", "cls"),
          metavar="WORKLOAD")
    words(g, "--ddp-seg-bs", [8, 32], "seg's batch sizes per GPU", positive)
    words(g, "--ddp-cls-bs", [32, 128], "cls's batch sizes per GPU", positive)
    words(g, "--ddp-modes", ["pipelined", "pipelined+graphed"], "modes (the all-reduce eager, "
          "then captured)", metavar="MODE")
    toggle(g, "--ddp-python", True, "ddp_reference.py (PyTorch DDP under torchrun) beside them")
    toggle(g, "--ddp-allreduced", True, "at world > 1, pipelined+graphed also with "
           "--no-gathered-grad (rows with gathered_grad false)")
    value(g, "--ddp-bucket-mb", None, "every tandem run's --bucket-cap-mb", megabytes,
          default_text="tandem's own")
    g.add_argument("--ddp-nccl-variants", action="append", default=[], metavar="VAR=VALUE...",
                   type=typed(environment),
                   help="an NCCL setting (space-separated VAR=VALUE) for one extra run of seg "
                        "pipelined+graphed at the first --ddp-seg-bs, world > 1, for the log; "
                        "repeatable (default: none)")
    words(g, "--ddp-floor-mb", ["179", "25", "1"], "allreduce_floor.py's message sizes, MB",
          megabytes)
    toggle(g, "--ddp-train", True, "tandem train --nproc W (ResNet-18) on the generated folder")
    value(g, "--ddp-train-epochs", 2, "its epochs", positive)
    value(g, "--ddp-train-bs", 128, "its batch size per rank", positive)


def decode_options(p):
    g = p.add_argument_group("decode")
    value(g, "--decode-rounds", 5, "rounds", positive)
    value(g, "--decode-images", 1000, "files decoded by each side, spread over the classes",
          positive)
    value(g, "--decode-core", 2, "the core both are pinned to (taskset -c)", count)


def enginetrace_options(p):
    g = p.add_argument_group("enginetrace")
    value(g, "--enginetrace-photos", "/tmp/tandem-photos-1000-2000", "the photos' folder; made "
          "there first where it does not exist (--enginetrace-count photos of 1000-2000 px)",
          metavar="DIR")
    value(g, "--enginetrace-count", 1500, "photos made for --enginetrace-photos", positive)
    words(g, "--enginetrace-models", ["r18_full", "r50_full"], "the models trained beside the "
          "decode", allowed=("r18_full", "r50_full"), metavar="MODEL")
    value(g, "--enginetrace-steps", 5, "profiled steps (after 40 timed ones)", positive)
    value(g, "--enginetrace-workers", 15, "loader workers", positive)


def shares_options(p):
    g = p.add_argument_group("shares")
    value(g, "--shares-photos", "/tmp/tandem-photos-1000-2000", "the photos' folder; made there "
          "first where it does not exist (--shares-count photos of 1000-2000 px)", metavar="DIR")
    value(g, "--shares-count", 1500, "photos made for --shares-photos", positive)
    words(g, "--shares-models", ["r50_full"], "the models trained from the photos",
          allowed=("r18_full", "r50_full"), metavar="MODEL")
    words(g, "--shares", ["auto", "0.5", "0.6", "0.7"], "the engines' shares of each batch: auto "
          "(the run's controller) or fixed ones (--param engine_share)", share, metavar="SHARE")
    value(g, "--shares-rounds", 2, "rounds, each running every share once (odd rounds in the "
          "order given, even ones reversed)", positive)
    value(g, "--shares-steps", 80, "timed steps per run (after 10 warm-up steps)", positive)
    value(g, "--shares-workers", 15, "loader workers", positive)
    words(g, "--shares-nice", [0], "the loader workers' nice values (--param worker_nice, 0-19): "
          "each share runs at each; the ratios are to auto at the first", nice, metavar="NICE")
    words(g, "--shares-cuda-wait", ["auto"], "how the runs' threads wait for the GPU (--cuda-wait): "
          "each share and nice value runs with each; the ratios are to auto at the first",
          allowed=("auto", "spin", "yield", "block"), metavar="WAIT")


def pybench_options(p):
    g = p.add_argument_group("pybench")
    words(g, "--py-seg-bs", [8, 32], "seg's batch sizes", positive)
    words(g, "--py-cls-bs", [32, 128], "cls's batch sizes", positive)
    words(g, "--py-scenarios", ["seg", "cls"], "workloads", allowed=("seg", "cls"),
          metavar="WORKLOAD")


def compile_options(p):
    g = p.add_argument_group("compile")
    words(g, "--compile-jobs", ["r18_full", "r50_full", "r50_frozen_head"], "jobs", metavar="JOB")
    words(g, "--compile-bs", [32, 256], "batch sizes", positive)
    words(g, "--compile-impls", ["eager", "compile", "compile_ro", "tandem-py",
                                 "tandem-py-compiled"], "implementations", metavar="IMPL")
    value(g, "--compile-steps", 100, "timed steps", positive)
    value(g, "--compile-profile", "", "those rows' kernel lists",
          metavar="JOB:BS:IMPL[,IMPL...][;...]")
    value(g, "--compile-mode", "auto", "tandem's mode for the tandem-py rows", metavar="MODE")


old_tree_options = one_option(
    "the old tree (ab, trainer-ab)", "--old-tree", ".ref/old", "the old source tree (e.g. `git "
    "archive REV` unpacked; carry it to the GPU machine)", metavar="DIR")


def trainer_ab_options(p):
    g = p.add_argument_group("trainer-ab")
    value(g, "--trainer-ab-rounds", 3, "rounds", positive)
    words(g, "--trainer-ab-cells", ["seg:8", "cls:32"], "JOB:BS cells", metavar="JOB:BS")


DEFAULT_CELLS = ["seg:8:pipelined", "seg:8:pipelined+graphed", "seg:32:pipelined",
                 "seg:32:pipelined+graphed", "seg:128:pipelined", "seg:128:pipelined+graphed",
                 "cls:32:pipelined", "cls:32:pipelined+graphed", "cls:128:pipelined",
                 "cls:128:pipelined+graphed", "mlp:640:graphed"]


def ab_options(p):
    g = p.add_argument_group("ab")
    value(g, "--ab-phase", "all", "build (the builds only), run (the runs only, on kept "
          "builds) or all: the builds and the runs can be separate calls",
          choices=("build", "run", "all"), metavar="build|run|all")
    toggle(g, "--ab-rebuild", False, "build even where a tree's binary exists (else that build "
           "is kept, with a warning when its sources changed)")
    value(g, "--ab-rounds", 3, "rounds; odd rounds run each cell old then new, even ones new "
          "first", count)
    words(g, "--ab-cells", [compare.parse_cell(c) for c in DEFAULT_CELLS],
          "JOB:BATCH:MODE cells: JOB a workload of tandem bench (MODE its mode), augment "
          "(tandem augment-bench, MODE its sampling), train (tandem train, ResNet-18 bf16 "
          "from the generated JPEG folder for --train-epochs, MODE its mode) or photos_r18 / "
          "photos_r50 (tandem bench --workload images, ResNet-18 / -50 bf16 channels-last from "
          "--ab-photos' files, decode auto: the workers and the JPEG engines; photos_r18_cpu / "
          "photos_r50_cpu: the workers alone)", cell)
    value(g, "--ab-photos", "/tmp/tandem-photos-1000-2000", "the photos cells' folder; made "
          "there first where it does not exist (--ab-photos-count photos of 1000-2000 px)",
          metavar="DIR")
    value(g, "--ab-photos-count", 1500, "photos made for --ab-photos", positive)
    words(g, "--ab-photos-params", [], "workload images settings both trees' photos runs take "
          "(--param KEY=VALUE each, e.g. worker_nice=5; the old tree must know them too)",
          key_value, metavar="KEY=VALUE")
    value(g, "--ab-steps", 100, "timed steps per run", positive)
    value(g, "--ab-warmup", 10, "warm-up steps per run", count)
    value(g, "--ab-workers", 8, "loader workers per run", positive)
    value(g, "--ab-repeats", 100, "augment cells: augment-bench --repeats", positive)
    value(g, "--ab-timeout", 120, "seconds a run may take before it is stopped", positive)
    value(g, "--ab-budget-s", 540, "no run starts that might end later than this many seconds "
          "after the driver started (a device call is stopped at 600 s); the rest is reported",
          count)
    value(g, "--ab-min-ratio", 0.97, "a cell passes at new / old >= this", number)
    value(g, "--ab-old-commit", "d529f74", "the old tree's commit, for the record",
          metavar="COMMIT")
    value(g, "--ab-jobs", 16, "build jobs", positive)
    value(g, "--ab-new-build", "build-ab", "this tree's build folder", metavar="DIR")
    value(g, "--ab-old-build", "build-ab-old", "the old tree's build folder (not inside "
          "--old-tree: a device call that carries the tree replaces it, build too)",
          metavar="DIR")
    value(g, "--cmake", "cmake", "the CMake both builds use", metavar="PROGRAM")
    value(g, "--torch-prefix", None, "LibTorch's CMake prefix", metavar="DIR",
          default_text="python3's torch.utils.cmake_prefix_path")


# ----------------------------------------------------------------------------------------------
# The driver: logging, runs, shared steps


def joined(items, sep=","):
    return sep.join(str(x) for x in items)


class Check:
    """One invocation: OUT, the scratch folder RAW, the log, the exit status, and the steps the
    phases share."""

    def __init__(self, a, phases):
        self.a, self.phases, self.status = a, phases, 0
        self.out = a.out
        self.raw = tempfile.mkdtemp(prefix="tandem-gpu-check-")
        self.logs = [open(os.path.join(self.out, "gpu-check.log"), "a")]
        self.build = Path(a.build)  # relative: the repository root's
        self.tandem = str(self.build / "tandem")
        self.build_abs = ROOT / self.build

    # -- output

    def emit(self, line, log=True):
        print(line, flush=True)
        if log:
            self.log_only(line)

    def log_only(self, line):
        for f in self.logs:
            f.write(line + "\n")
            f.flush()

    def say(self, msg):
        self.emit(f"== {time.strftime('%H:%M:%S')} {msg}")

    def show_tail(self, path, n):
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError as e:
            lines = [f"(no {path}: {e})"]
        for line in lines[-n:]:
            self.emit(line)

    def run(self, cmd, *, show=None, log_all=False, save=None, append=False, tail=None,
            head=None, suffix="", env=None, fail=True):
        """Runs cmd, its output and errors as one stream, and returns its exit status (127 where
        it cannot start; 1 sets the driver's status unless fail=False). The stream goes:
        whole into the file save (appended with append), whole into the log with log_all, and
        the lines show selects (True: all; a regex searched for; a predicate) onto the console
        and into the log; tail keeps only the last such lines, head the first, suffix is
        appended to each."""
        keep = (lambda _: False) if show is None else (lambda _: True) if show is True else \
            (lambda line: re.search(show, line) is not None) if isinstance(show, str) else show
        picked = collections.deque(maxlen=tail) if tail else None
        shown = 0

        def pick(line):
            nonlocal shown
            if save_file:
                save_file.write(line + "\n")
            if log_all:
                self.log_only(line)
            if not keep(line):
                return
            if picked is not None:
                picked.append(line)
            elif head is None or shown < head:
                shown += 1
                self.emit(line + suffix, log=not log_all)

        cmd = [str(c) for c in cmd]
        with open(save, "a" if append else "w") if save else contextlib.nullcontext() as save_file:
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        env=None if env is None else {**os.environ, **env})
            except OSError as e:
                pick(f"{cmd[0]}: {e.strerror}")
                rc = 127
            else:
                for raw in proc.stdout:
                    pick(raw.decode(errors="replace").rstrip("\n"))
                rc = proc.wait()
        for line in picked or []:
            self.emit(line + suffix, log=not log_all)
        if rc and fail:
            self.status = 1
        return rc

    def captured(self, fn, *args, tail=None):
        """fn(*args) with what it prints onto the console and into the log (its last tail lines);
        returns (its value, or None where it raised or exited, whether it failed)."""
        buf, result, failed = io.StringIO(), None, False
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                result = fn(*args)
            except SystemExit as e:
                failed = e.code not in (None, 0)
                if isinstance(e.code, str):
                    print(e.code)
            except Exception:  # a merge's bug must not cost the phases after it
                traceback.print_exc()
                failed = True
        lines = buf.getvalue().splitlines()
        for line in lines[-tail:] if tail else lines:
            self.emit(line)
        return result, failed

    def compare(self, *argv, fail=True, tail=None):
        """compare.py with these arguments (its merge and checks), in this process."""
        rc, failed = self.captured(compare.main, [str(x) for x in argv], tail=tail)
        if (failed or rc) and fail:
            self.status = 1

    def glob(self, *patterns):
        """The RAW files matching each pattern, sorted; a pattern matching none stays as it is
        (as the shell passed it), so the reader names the missing input."""
        found = []
        for p in patterns:
            found += sorted(glob.glob(os.path.join(self.raw, p))) or [os.path.join(self.raw, p)]
        return found

    def raw_path(self, name):
        return os.path.join(self.raw, name)

    def out_path(self, name):
        return os.path.join(self.out, name)

    # -- shared steps

    def need_reference(self):
        if not (ROOT / LOOPS).is_file():
            self.say(f"no {LOOPS}: the Python reference loops")
            raise Fatal(LOOPS)

    def floor(self):
        """One reference_loops.py floor run serves every phase: seg's and cls's floors at every
        batch size they run at."""
        path = self.raw_path("python-floor.json")
        if os.path.exists(path):
            return path
        sizes = self.a.bench_bs + self.a.cls_bs + (self.a.launch_bs if "graphs" in self.phases
                                                   else [])
        every = joined(sorted(set(sizes)))
        self.say(f"python reference_loops.py floor --bs {every}")
        self.run([PYTHON, LOOPS, "floor", "--bs", every, "--json", path], log_all=True)
        return path

    def image_folder(self):
        """The generated JPEG ImageFolder, made first where it does not exist."""
        folder = self.a.data_dir
        if not os.path.isdir(folder):
            self.say(f"make_image_folder.py {folder} --count {self.a.data_count}")
            self.run([PYTHON, "scripts/make_image_folder.py", folder, "--count",
                      self.a.data_count, "--classes", 10], show=True, tail=3, fail=False)
        return folder

    def photo_folder(self, folder, count, low, high, seed=0, progressive=0.0):
        """A generated folder of `count` photos of `low`-`high` px a side (make_image_folder.py's
        `seed`: another seed, other photos; `progressive`: the share written as progressive
        JPEGs), made first where it does not exist."""
        if not os.path.isdir(folder):
            self.say(f"make_image_folder.py {folder}: {count} photos of {low}-{high} px")
            self.run([PYTHON, "scripts/make_image_folder.py", folder, "--count", count,
                      "--classes", 10, "--min-side", low, "--max-side", high, "--seed", seed,
                      *(["--progressive-fraction", progressive] if progressive else [])],
                     show=True, tail=1, fail=False)
        return folder

    def fashion_mnist_dir(self):
        """--fashion-mnist, or the carried .deb's copy unpacked beside the build (the GPU machine
        has no registry)."""
        fm = self.a.fashion_mnist
        if not os.path.isfile(os.path.join(fm, "train-images-idx3-ubyte.gz")):
            debs = sorted(glob.glob(os.path.join(self.a.debs, "dataset-fashion-mnist_*.deb")))
            if debs:
                deps = f"{self.build_abs}-deps"
                os.makedirs(deps, exist_ok=True)
                self.run(["dpkg", "-x", debs[0], deps], fail=False)
                fm = f"{deps}/usr/share/datasets/fashion-mnist"
                self.say(f"Fashion-MNIST from {debs[0]}")
        return fm

    def unpack_jpeg_debs(self):
        """The JPEG libraries' carried .debs (--debs) unpacked beside the build, as
        scripts/gpu-check.sh build does, where the machine has no TurboJPEG and nothing unpacked
        them yet: the A/B builds may run without that script's build. Returns the prefix (usr)."""
        deps = f"{self.build_abs}-deps"
        if not os.path.isfile("/usr/include/turbojpeg.h"):
            for pattern, header in (("libturbojpeg0*.deb", "turbojpeg.h"),
                                    ("libjpeg62-turbo*.deb", "jpeglib.h")):
                if os.path.isfile(f"{deps}/usr/include/{header}"):
                    continue
                for deb in sorted(glob.glob(os.path.join(self.a.debs, pattern))):
                    os.makedirs(deps, exist_ok=True)
                    self.run(["dpkg", "-x", deb, deps], fail=False)
            arch_conf = f"{deps}/usr/include/x86_64-linux-gnu/jconfig.h"
            if os.path.isfile(arch_conf) and not os.path.isfile(f"{deps}/usr/include/jconfig.h"):
                shutil.copy(arch_conf, f"{deps}/usr/include/")  # beside jpeglib.h
        return f"{deps}/usr"

    def export_deps_lib(self):
        """TurboJPEG unpacked from a .deb next to the build (scripts/gpu-check.sh build) is
        outside the loader's path: the Python package's phases need it on LD_LIBRARY_PATH."""
        lib = f"{self.build_abs}-deps/usr/lib/x86_64-linux-gnu"
        current = os.environ.get("LD_LIBRARY_PATH", "")
        if os.path.isdir(lib) and lib not in current.split(":"):
            os.environ["LD_LIBRARY_PATH"] = lib + (f":{current}" if current else "")

    def py_package(self, tree, dest, log):
        """That source tree's Python package in one command (pip builds and bundles the C++
        libraries it needs) into DEST/py; returns pip's exit status."""
        shutil.rmtree(os.path.join(dest, "py"), ignore_errors=True)
        return self.run([PYTHON, "-m", "pip", "install", "-q", "--no-build-isolation",
                         "--no-deps", "--target", f"{dest}/py", f"{tree}/python",
                         "-C", f"build-dir={dest}/build"], save=log, fail=False)

    def package_path(self, suffix="py"):
        return f"{self.build_abs}-py/{suffix}"

    def archive(self):
        """RAW into OUT/raw.tar.gz, then RAW gone; run folders' checkpoints (hundreds of MB for
        the ResNets) stay out."""
        subprocess.run(["tar", "-C", self.raw, "--exclude=./run-*/checkpoints", "-czf",
                        self.out_path("raw.tar.gz"), "."], stderr=subprocess.DEVNULL)
        shutil.rmtree(self.raw, ignore_errors=True)


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout
    except OSError:
        return ""
    return out.splitlines()[0].strip() if out.strip() else ""


def cpu_count():
    return len(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------------------------
# The phases


class Phase:
    """A phase: its function, its option groups, and its help (the docstring's first paragraph;
    the whole docstring is its command's description)."""

    def __init__(self, name, fn, options, package_env):
        self.name, self.fn, self.options = name, fn, options
        self.description = inspect.cleandoc(fn.__doc__)
        self.help = " ".join(self.description.split("\n\n")[0].split())
        self.package_env = package_env  # runs with the .deb libraries on LD_LIBRARY_PATH


REGISTERED = {}


def phase(name, *options, package_env=False):
    """Registers the decorated function as the phase `name` with these option groups."""
    def register(fn):
        REGISTERED[name] = Phase(name, fn, list(options), package_env)
        return fn
    return register


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


@phase("data", folder_options, data_options)
def phase_data(c, a):
    """the generated JPEG ImageFolder through data_bench.py (torchvision's pipeline) and tandem
    data-bench: data.json

    The Python reference is torchvision's ImageFolder + DataLoader with PIL / torchvision.io decode;
    both run in one call, and data.json merges them."""
    folder = c.image_folder()
    jobs = joined(["decode", *a.data_models])
    bs_csv = joined(a.data_bs)
    c.say(f"python data_bench.py --jobs {jobs} --batch-sizes {bs_csv}")
    # --decode-files 1000: the 1000 files data-bench's --images 1000 decodes
    c.run([PYTHON, "benchmarks/data_bench.py", "--data", folder, "--jobs", jobs, "--batch-sizes",
           bs_csv, "--workers", a.data_py_workers, "--steps", a.data_steps, "--decode-files", 1000,
           "--out", c.raw_path("data-python.json")], show=True)
    for model in a.data_models:
        for bs in a.data_bs:
            for where in a.data_decode:
                c.say(f"tandem data-bench --model {model} --batch-size {bs} --decode {where}")
                c.run([c.tandem, "data-bench", "--data", folder, "--model", model, "--batch-size",
                       bs, "--mode", a.data_mode, "--steps", a.data_steps, "--warmup", 10,
                       "--decode", where, "--images", 1000,
                       "--json", c.raw_path(f"data-tandem-{model}-{bs}-{where}.json")], show=True)
    c.compare("--scenario", "data", "--raw", c.raw, "--out", c.out_path("data.json"), fail=False)


# The image jobs' models as `tandem train` arguments.
TRAIN_MODELS = {"r50_frozen_head": ["--model", "resnet50", "--freeze", "backbone"],
                "r18_full": ["--model", "resnet18"], "r50_full": ["--model", "resnet50"]}


@phase("train", folder_options, fashion_options, train_options)
def phase_train(c, a):
    """tandem train on Fashion-MNIST and on the generated JPEG folder beside the resident step and
    train_bench.py: train.json (job seg: train-seg.json)

    Fashion-MNIST with the small CNN (accuracy), then the generated JPEG folder with a frozen
    ResNet-50 + head and a full ResNet-18 beside the same step on device-resident data and beside
    the Python loops; Python loads the exported ResNet-18 weights into torchvision's model
    (scripts/check_export.py)."""
    fm = c.fashion_mnist_dir()
    if "fmnist" in a.train_jobs:
        c.say(f"tandem train: small CNN on Fashion-MNIST, {a.fmnist_epochs} epochs")
        c.run([c.tandem, "train", "--data", fm, "--model", "small_cnn", "--epochs",
               a.fmnist_epochs, "--out", c.raw_path("run-fmnist"),
               "--json", c.raw_path("train-tandem-fmnist.json")], show=True)
        c.say("python train_bench.py --jobs fashion_mnist")
        c.run([PYTHON, "benchmarks/train_bench.py", "--jobs", "fashion_mnist", "--fashion-dir", fm,
               "--precision", "fp32", "--epochs", a.fmnist_epochs,
               "--out", c.raw_path("train-python-fmnist.json")], show=True)
    if "images" in a.train_jobs:
        folder = c.image_folder()
        bs = a.train_bs
        for model in a.train_models:
            for prec in a.train_precisions:
                for layout in a.train_layouts:
                    tag = f"{model}-{prec}-{layout}"
                    c.say(f"tandem train {model} {prec} {layout} bs {bs}, {a.train_epochs} epochs")
                    c.run([c.tandem, "train", "--data", folder, *TRAIN_MODELS[model],
                           "--optimizer", "sgd", "--lr", 0.1,
                           "--no-channels-last" if layout == "nchw" else "--channels-last",
                           "--batch-size", bs, "--precision", prec, "--epochs", a.train_epochs,
                           "--val-split", 0.1, "--val-subset", 512,
                           "--out", c.raw_path(f"run-{tag}"),
                           "--json", c.raw_path(f"train-tandem-{tag}.json")],
                          show=lambda line: not line.startswith("epoch"))
                    c.say(f"tandem bench images resident {model} {prec} {layout}")
                    c.run([c.tandem, "bench", "--workload", "images", "--param", "source=resident",
                           "--param", f"model={model}", "--param", f"precision={prec}",
                           "--param", f"layout={layout}", "--batch-size", bs,
                           "--mode", "pipelined+graphed", "--steps", 60, "--warmup", 10,
                           "--json", c.raw_path(f"resident-{tag}.json")],
                          show="^images|efficiency")
        if a.train_python:
            c.say("python train_bench.py --jobs r50_frozen_head,r18_full")
            c.run([PYTHON, "benchmarks/train_bench.py", "--jobs", "r50_frozen_head,r18_full",
                   "--data", folder, "--precision", joined(a.train_precisions),
                   "--batch-sizes", bs, "--steps", 60,
                   "--out", c.raw_path("train-python-images.json")], show=True)
        exported = sorted(glob.glob(c.raw_path("run-r18_full-fp32-*")))
        if exported:
            c.say("check_export.py: torchvision loads tandem's ResNet-18 weights")
            c.run([PYTHON, "scripts/check_export.py", "--weights",
                   f"{exported[0]}/model.safetensors", "--arch", "resnet18", "--num-classes", 10],
                  show=True)
    if "seg" in a.train_jobs:
        if not os.path.isdir(os.path.join(a.seg_dir, "masks")):
            c.say(f"make_seg_pairs.py {a.seg_dir} --count {a.seg_count}")
            c.run([PYTHON, "scripts/make_seg_pairs.py", a.seg_dir, "--count", a.seg_count,
                   "--classes", 6], show=True, tail=4, fail=False)
        for prec in a.train_precisions:
            c.say(f"tandem train fcn_resnet18 (segmentation) {prec}, {a.seg_epochs} epochs")
            c.run([c.tandem, "train", "--data", a.seg_dir, "--model", "fcn_resnet18",
                   "--classes", 6, "--ignore-index", 255, "--optimizer", "sgd", "--lr", 0.02,
                   "--epochs", a.seg_epochs, "--batch-size", 32, "--precision", prec,
                   "--val-split", 0.1, "--out", c.raw_path(f"run-seg-{prec}"),
                   "--json", c.raw_path(f"train-tandem-seg_fcn_r18-{prec}-channels_last.json")],
                  show=lambda line: not re.search(r"^epoch [0-9]*/.*step", line), tail=16)
    c.compare("--scenario", "train", "--raw", c.raw, "--out", c.out_path("train.json"),
              fail=False)


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
            "engine_share_end": compare.engine_share(report),
            "engines_host_ms": host.get("engines"), "load_host_ms": host.get("load"),
            **(compare.threads_on_cores(report) or {})}


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


@phase("package", package_env=True)
def phase_package(c, a):
    """the Python package in one pip command into BUILD-py/py (for compile, pybench, trainer-ab)

    pip builds and bundles the C++ libraries it needs: the package for the phases that use it when
    phase python (against the full build) is not run."""
    c.say("package: pip install --no-build-isolation --no-deps ./python (one command, bundled)")
    log = c.raw_path("py-package.log")
    if c.py_package(ROOT, f"{c.build_abs}-py", log):
        c.show_tail(log, 30)
        c.status = 1


@phase("python", fashion_options, package_env=True)
def phase_python(c, a):
    """the Python package against this build, python/tests (CUDA included; pytest.log) and
    python/examples/plain_loop.py on CUDA"""
    c.say("python: install tandem, pip install --no-build-isolation ./python")
    prefix = f"{c.build_abs}-py"
    pip_log = c.raw_path("py-pip.log")
    shutil.rmtree(prefix, ignore_errors=True)
    if (c.run(["cmake", "--install", c.build, "--prefix", f"{prefix}/usr"],
              save=c.raw_path("py-install.log"), fail=False)
            or c.run([PYTHON, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                      "--target", f"{prefix}/py", "./python",
                      "-C", f"cmake.define.CMAKE_PREFIX_PATH={prefix}/usr",
                      "-C", f"build-dir={prefix}/build"], save=pip_log, fail=False)):
        c.show_tail(pip_log, 30)
        c.status = 1
    path = f"{prefix}/py"
    if subprocess.run([PYTHON, "-c", "import pytest"], capture_output=True).returncode:
        # offline: the wheels scripts/fetch-gpu-debs.sh fetched
        if c.run([PYTHON, "-m", "pip", "install", "-q", "--no-index", "--find-links",
                  f"{a.debs}/wheels", "--target", f"{prefix}/pytest", "pytest"],
                 save=pip_log, append=True, fail=False):
            c.say("no pytest to install")
        path += f":{prefix}/pytest"
    c.say("python: pytest python/tests")
    pytest_log = c.out_path("pytest.log")
    c.run([PYTHON, "-m", "pytest", "-q", "python/tests", "-p", "no:cacheprovider"],
          env={"PYTHONPATH": path}, save=pytest_log)
    c.show_tail(pytest_log, 15)
    fm = c.fashion_mnist_dir()
    if os.path.isfile(f"{fm}/train-images-idx3-ubyte.gz"):
        c.say("python: examples/plain_loop.py on CUDA, 2 epochs")
        c.run([PYTHON, "python/examples/plain_loop.py", f"{fm}/train-images-idx3-ubyte.gz",
               f"{fm}/train-labels-idx1-ubyte.gz", "--device", "cuda", "--epochs", 2],
              env={"PYTHONPATH": f"{prefix}/py"}, show=True, tail=3)


@phase("decode", folder_options, decode_options, package_env=True)
def phase_decode(c, a):
    """CPU decode per core, rounds pinned to one core: tandem data-bench beside PIL, torchvision.io
    and tandem.data.decode_image: decode.json

    Both read the same files of the generated folder; data_bench.py's decoders take turns per 25
    files in one process (tandem.data.decode_image with phase python's package), so their ratios
    hold on a host whose speed drifts. decode.json holds every round and the medians."""
    folder = c.image_folder()
    core, images = str(a.decode_core), a.decode_images
    for rnd in range(1, a.decode_rounds + 1):
        c.say(f"decode round {rnd} on core {core}: tandem data-bench --steps 0, then "
              f"data_bench.py --jobs decode")
        c.run(["taskset", "-c", core, c.tandem, "data-bench", "--data", folder, "--decode", "cpu",
               "--steps", 0, "--images", images, "--workers", 1,
               "--json", c.raw_path(f"decode-tandem-{rnd}.json")], log_all=True)
        c.run(["taskset", "-c", core, PYTHON, "benchmarks/data_bench.py", "--data", folder,
               "--jobs", "decode", "--decode-files", images,
               "--out", c.raw_path(f"decode-python-{rnd}.json")],
              env={"PYTHONPATH": c.package_path()}, log_all=True)
    host = " ".join(filter(None, [device_name(), "host CPU, one pinned core"]))
    c.compare("--scenario", "decode", "--raw", c.raw, "--device", host,
              "--command", f"{PROG} decode --out OUT (rounds of: taskset -c CORE tandem data-bench "
              f"--decode cpu --steps 0 --images N --workers 1; taskset -c CORE python3 "
              f"benchmarks/data_bench.py --jobs decode --decode-files N), N = {images}",
              "--out", c.out_path("decode.json"), fail=False)


@phase("pybench", pybench_options, package_env=True)
def phase_pybench(c, a):
    """tandem.Trainer's loops beside the CLI and the reference loops, tandem.augment beside
    torchvision: python.json (needs package or python)

    The reference workloads' loops written with the Trainer (python/examples/*_trainer.py), and
    tandem.augment beside torchvision's batch transform."""
    seg_bs, cls_bs = joined(a.py_seg_bs), joined(a.py_cls_bs)
    c.say(f"pybench: benchmarks/python_bench.py (seg bs {seg_bs}, cls bs {cls_bs})")
    c.run([PYTHON, "benchmarks/python_bench.py", "--tandem", c.tandem, "--seg-bs", seg_bs,
           "--cls-bs", cls_bs, "--scenarios", joined(a.py_scenarios),
           "--out", c.out_path("python.json")], env={"PYTHONPATH": c.package_path()}, show=True)


@phase("compile", compile_options, package_env=True)
def phase_compile(c, a):
    """torch.compile beside tandem.Trainer and tandem's C++ step on torchvision models: compile.json
    (needs package)

    The Trainer plain and with compile=True, the C++ step as impls tandem-cpp and tandem-cpp-module;
    bf16 + channels_last, device-resident batches."""
    jobs, bs = joined(a.compile_jobs), joined(a.compile_bs)
    c.say(f"compile: benchmarks/compile_bench.py ({jobs} at bs {bs})")
    c.run([PYTHON, "benchmarks/compile_bench.py", "--jobs", jobs, "--bs", bs,
           "--impls", joined(a.compile_impls), "--steps", a.compile_steps,
           "--mode", a.compile_mode, "--profile", a.compile_profile,
           "--tandem-cli", c.build_abs / "tandem", "--out", c.out_path("compile.json")],
          env={"PYTHONPATH": c.package_path()}, show=True)


@phase("trainer-ab", old_tree_options, trainer_ab_options, package_env=True)
def phase_trainer_ab(c, a):
    """tandem.Trainer's examples, this tree's package against --old-tree's, alternating rounds:
    trainer_ab.json (needs package)"""
    c.say(f"trainer-ab: tandem.Trainer, this tree against {a.old_tree}")
    if not os.path.isdir(a.old_tree):
        c.say(f"trainer-ab: --old-tree '{a.old_tree}' is not a folder")
        c.status = 1
        return
    log = c.raw_path("py-old.log")
    old = f"{c.build_abs}-py-old"
    if c.py_package(os.path.abspath(a.old_tree), old, log):
        c.show_tail(log, 30)
        c.status = 1
        return
    c.run([PYTHON, "benchmarks/trainer_ab.py", "--old", f"{old}/py", "--new", c.package_path(),
           "--rounds", a.trainer_ab_rounds, "--cells", joined(a.trainer_ab_cells),
           "--out", c.out_path("trainer_ab.json")], show=True)


@phase("runsh", package_env=True)
def phase_runsh(c, a):
    """bash scripts/run.sh in a fresh copy of the tree with an empty HOME, as a newcomer runs it:
    runsh.log

    The README's main job: a copy of the tracked tree, a HOME that never ran the bootstrap
    (generated IDX files where Fashion-MNIST is absent)."""
    c.say("runsh: bash scripts/run.sh in a fresh copy with an empty HOME")
    fresh = tempfile.mkdtemp(prefix="tandem-runsh-")
    pack = subprocess.Popen(["tar", "--exclude=./build*", "--exclude=./.git", "--exclude=./.ref",
                             "-cf", "-", "."], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-C", fresh, "-xf", "-"], stdin=pack.stdout)
    pack.stdout.close()
    pack.wait()
    log = c.out_path("runsh.log")
    rc = c.run(["bash", "-c", 'cd "$0" && exec timeout 900 bash scripts/run.sh --epochs 2', fresh],
               env={"HOME": tempfile.mkdtemp(prefix="tandem-home-")}, save=log)
    c.say("runsh: exit 0" if rc == 0 else f"runsh: FAILED (exit {rc})")
    with open(log, errors="replace") as f:
        lines = [line.rstrip("\n") for line in f
                 if re.search(r"^ +[0-9]+ |accuracy|speed|no Fashion|GPU found|error|Error", line)]
    for line in lines[-15:]:
        c.emit(line)


# ----------------------------------------------------------------------------------------------
# ab: this tree's tandem against an old source tree's, built alike and run alternately, cell by
# cell, in one call (rates drift between calls: the same-call ratio is what counts).

SOURCE_NAMES = ("*.cpp", "*.h", "*.hpp", "*.cu", "*.cuh", "CMakeLists.txt", "*.cmake", "*.in")
SOURCE_SKIPPED = (".git", ".ref", ".whl")  # and build*: at the top of a tree


def source_sha1(tree):
    """The files a build reads, hashed (as `sha1sum` of each, in byte order of their ./paths,
    then of that list): a binary kept from an earlier call is stale when this changed."""
    names = []
    for dirpath, dirnames, filenames in os.walk(tree):
        rel = os.path.relpath(dirpath, tree)
        if rel == ".":
            dirnames[:] = [d for d in dirnames
                           if d not in SOURCE_SKIPPED and not d.startswith("build")]
            filenames = [f for f in filenames if not f.startswith("build")]
        for f in filenames:
            path = os.path.join(dirpath, f)
            if any(fnmatch.fnmatchcase(f, n) for n in SOURCE_NAMES) and os.path.isfile(path) \
                    and not os.path.islink(path):
                names.append("./" + os.path.normpath(os.path.join(rel, f)))
    listing = ""
    for name in sorted(names, key=os.fsencode):
        with open(os.path.join(tree, name), "rb") as f:
            listing += f"{hashlib.sha1(f.read()).hexdigest()}  {name}\n"
    return hashlib.sha1(listing.encode()).hexdigest()[:12]


def find_bin(build):
    """The CLI binary of a build folder (OUTPUT_NAME tandem of target tandem_cli), or None."""
    def executable(path):
        return os.path.isfile(path) and os.stat(path).st_mode & stat.S_IXUSR

    if executable(os.path.join(build, "tandem")):
        return os.path.join(build, "tandem")
    for dirpath, dirnames, filenames in os.walk(build):
        depth = 0 if dirpath == build else os.path.relpath(dirpath, build).count(os.sep) + 1
        if depth >= 2:
            dirnames[:] = []  # files three levels down at most, as find -maxdepth 3
        if "tandem" in filenames and executable(os.path.join(dirpath, "tandem")):
            return os.path.join(dirpath, "tandem")
    return None


def built_from(build):
    try:
        with open(os.path.join(build, ".ab-source-sha1")) as f:
            return f.read().strip()
    except OSError:
        return ""


def check_fresh(c, name, build, sha):
    """Warns when a kept binary was built from other sources."""
    built = built_from(build)
    if not built:
        c.emit(f"WARNING: {name}: {build} has no record of the sources it was built from "
               f"(not built by gpu_check.py ab)")
    elif built != sha:
        c.emit(f"WARNING: {name}: the binary in {build} is STALE: built from sources {built}, "
               f"the tree is now {sha}; --ab-rebuild rebuilds")


def torch_prefix(a):
    if a.torch_prefix:
        return a.torch_prefix
    r = subprocess.run([PYTHON, "-c", "import torch;print(torch.utils.cmake_prefix_path)"],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def build_tree(c, a, name, tree, build, build_log):
    """Both trees' cmake invocation; TANDEM_BUILD_EXAMPLES is passed only to a tree that knows
    it (d529f74 does not). Returns whether there is a binary to run."""
    binary, sha = find_bin(build), source_sha1(tree)
    if binary and not a.ab_rebuild:
        c.emit(f"{name}: {binary} exists: not rebuilt (--ab-rebuild rebuilds)")
        check_fresh(c, name, build, sha)
        return True
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.isfile(cache):  # a build folder configured from another source tree
        with open(cache, errors="replace") as f:
            home = next((line.split("=", 1)[1].strip() for line in f
                         if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL=")), "")
        if os.path.realpath(home) != os.path.realpath(tree):
            c.emit(f"{name}: {build} was configured from {home}: removed")
            shutil.rmtree(build)
    opts = ["-DTANDEM_BUILD_TESTS=OFF"]
    knows_examples = False
    for path in [os.path.join(tree, "CMakeLists.txt")] + glob.glob(os.path.join(tree, "cmake",
                                                                                "*.cmake")):
        with open(path, errors="replace") as f:
            knows_examples = knows_examples or "TANDEM_BUILD_EXAMPLES" in f.read()
    if knows_examples:
        opts.append("-DTANDEM_BUILD_EXAMPLES=OFF")
    # The JPEG libraries unpacked beside the build, where the machine has none: the data layer
    # (train and photos cells, tandem train) is built with them.
    deps = c.unpack_jpeg_debs()
    for name_, header, lib in (("TURBOJPEG", "turbojpeg.h", "libturbojpeg.so"),
                               ("JPEG", "jpeglib.h", "libjpeg.so")):
        if os.path.isfile(f"{deps}/include/{header}"):
            # FindJPEG's imported target prefers JPEG_LIBRARY_RELEASE: named too, so a cache
            # from a configure without the .debs cannot keep the machine's other libjpeg.
            opts += [f"-D{name_}_INCLUDE_DIR={deps}/include",
                     f"-D{name_}_LIBRARY={deps}/lib/x86_64-linux-gnu/{lib}",
                     f"-D{name_}_LIBRARY_RELEASE={deps}/lib/x86_64-linux-gnu/{lib}"]
    prefix = torch_prefix(a)
    if not prefix:
        c.emit(f"{name}: python3 has no torch (--torch-prefix names LibTorch's CMake prefix)")
        return False
    c.say(f"build {name}: {tree} -> {build} ({' '.join(opts)}, target tandem_cli, -j {a.ab_jobs})")
    start = time.monotonic()
    with open(build_log, "a") as f:
        f.write(f"== {name}: {tree}\n")
    if (c.run([a.cmake, "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
               f"-DCMAKE_PREFIX_PATH={prefix}", *opts], save=build_log, append=True, fail=False)
            or c.run([a.cmake, "--build", build, "-j", a.ab_jobs, "--target", "tandem_cli"],
                     save=build_log, append=True, fail=False)):
        c.show_tail(build_log, 40)
        c.say(f"BUILD FAILED: {name} (redesign-build.log)")
        return False
    binary = find_bin(build)
    if not binary:
        c.say(f"BUILD FAILED: {name}: no tandem binary under {build}")
        return False
    with open(os.path.join(build, ".ab-source-sha1"), "w") as f:
        f.write(sha + "\n")
    c.emit(f"{name} built in {int(time.monotonic() - start)} s: {binary} (sources {sha})")
    return True


def ab_device():
    name = device_name()
    if not name:
        r = subprocess.run([PYTHON, "-c", "import torch;print(torch.cuda.get_device_name())"],
                           capture_output=True, text=True)
        name = r.stdout.strip() if r.returncode == 0 else ""
    return name or "unknown"


def ab_command(job, mode, bs, a, json_path):
    """One A/B run's command (without its timeout)."""
    if job == "augment":
        return ["augment-bench", "--batch-sizes", bs, "--sampling", mode, "--repeats",
                a.ab_repeats, "--json", json_path]
    if job == "train":  # tandem train, ResNet-18 bf16 from the generated JPEG folder
        return ["train", "--data", a.data_dir, *TRAIN_MODELS["r18_full"], "--optimizer", "sgd",
                "--lr", 0.1, "--channels-last", "--precision", "bf16", "--batch-size", bs,
                "--mode", mode, "--epochs", a.train_epochs, "--workers", a.ab_workers,
                "--quiet", "--out", json_path[:-len(".json")] + "-run", "--json", json_path]
    if job in compare.PHOTO_JOBS:
        model, decode = compare.PHOTO_JOBS[job]
        return photos_bench(a.ab_photos, model, json_path, steps=a.ab_steps, warmup=a.ab_warmup,
                            workers=a.ab_workers, decode=decode, mode=mode, batch_size=bs,
                            extra=[x for kv in a.ab_photos_params for x in ("--param", kv)])
    return ["bench", "--scenario", job, "--mode", mode, "--batch-size", bs, "--steps", a.ab_steps,
            "--warmup", a.ab_warmup, "--workers", a.ab_workers, "--no-gpu-monitor",
            "--json", json_path]


def phase_ab(c, a):
    """Returns 0 every run done and every cell PASS; 3 every run done, some cell below
    --ab-min-ratio; 1 a build or a run failed, or the budget stopped the runs; 2 bad input."""
    old_tree = os.path.realpath(a.old_tree)
    if not os.path.isfile(os.path.join(old_tree, "CMakeLists.txt")):
        c.say(f"ab: --old-tree '{a.old_tree}' is not a source tree (no CMakeLists.txt)")
        return 2
    if old_tree == str(ROOT):
        c.say(f"ab: --old-tree '{a.old_tree}' is this tree")
        return 2
    if not a.ab_cells:
        c.say("ab: --ab-cells is empty")
        return 2
    new_build, old_build = str(ROOT / a.ab_new_build), str(ROOT / a.ab_old_build)
    build_log = c.out_path("redesign-build.log")
    ab_log = open(c.out_path("redesign-ab.log"), "a")
    c.logs.append(ab_log)
    try:
        c.say(f"A/B: new = {ROOT}, old = {old_tree} ({a.ab_old_commit}); phase {a.ab_phase}")
        if a.ab_phase != "run":
            start = time.monotonic()
            if not (build_tree(c, a, "old", old_tree, old_build, build_log)
                    and build_tree(c, a, "new", str(ROOT), new_build, build_log)):
                return 1
            c.say(f"phase build: {int(time.monotonic() - start)} s")
        if a.ab_phase == "build":
            return 0
        return ab_runs(c, a, old_tree, old_build, new_build)
    finally:
        c.logs.remove(ab_log)
        ab_log.close()


def ab_runs(c, a, old_tree, old_build, new_build):
    c.export_deps_lib()  # the unpacked TurboJPEG the builds linked, where the machine has none
    bins = {"old": find_bin(old_build), "new": find_bin(new_build)}
    if not bins["old"] or not bins["new"]:
        c.say(f"no binary in {old_build} or {new_build}: run --ab-phase build (or all) first")
        return 1
    shas = {"old": source_sha1(old_tree), "new": source_sha1(ROOT)}
    builds = {"old": old_build, "new": new_build}
    if a.ab_phase == "run":
        for side in ("old", "new"):
            check_fresh(c, side, builds[side], shas[side])
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="tandem-ab-")
    cells = a.ab_cells
    cell_text = " ".join(f"{j}:{b}:{m}" for j, b, m in cells)
    meta = {
        "device": ab_device(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": f"{PROG} ab --out OUT --old-tree {a.old_tree} (--ab-rounds {a.ab_rounds} "
                   f"--ab-cells '{cell_text}'; each run: timeout {a.ab_timeout} tandem bench "
                   f"--scenario S --mode M --batch-size B --steps {a.ab_steps} --warmup "
                   f"{a.ab_warmup} --workers {a.ab_workers} --no-gpu-monitor --json FILE, or "
                   f"tandem augment-bench --batch-sizes B --sampling M --repeats {a.ab_repeats}"
                   + (f", or (photos cells) tandem bench --workload images --data {a.ab_photos} "
                      f"--param source=files --param decode=auto|cpu (photos_*_cpu) --param "
                      f"model=MODEL --param precision=bf16 --param layout=channels_last"
                      if any(j in compare.PHOTO_JOBS for j, _, _ in cells) else "")
                   + f"; old = {a.ab_old_commit} built from {a.old_tree}, new = this tree, "
                   f"both cmake -G Ninja Release TANDEM_BUILD_TESTS=OFF, target tandem_cli; odd "
                   f"rounds old first, even rounds new first)",
        "old_commit": a.ab_old_commit, "rounds": a.ab_rounds, "min_ratio": a.ab_min_ratio,
        "timeout_s": a.ab_timeout, "stopped": None,
        # Which sources each binary was built from, and the trees' now (they differ: a stale
        # binary).
        "builds": {side: {"binary": bins[side], "built_from_sources": built_from(builds[side]),
                          "sources_now": shas[side]} for side in ("old", "new")}}
    c.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,temperature.gpu",
           "--format=csv,noheader"], log_all=True, fail=False)
    c.log_only(f"old: {bins['old']}")
    c.log_only(f"new: {bins['new']}")
    c.say(f"runs: {len(cells)} cells x 2 builds x {a.ab_rounds} rounds, {a.ab_steps} timed + "
          f"{a.ab_warmup} warm-up steps, {a.ab_workers} workers, budget {a.ab_budget_s} s from "
          f"the start")
    if any(job == "train" for job, _, _ in cells):
        c.image_folder()
    if any(job in compare.PHOTO_JOBS for job, _, _ in cells):
        c.photo_folder(a.ab_photos, a.ab_photos_count, 1000, 2000)
    result_path = c.out_path("redesign.json")
    runs, longest = [], 0

    def elapsed():
        return int(time.monotonic() - T0)

    for rnd in range(1, a.ab_rounds + 1):
        order = ("old", "new") if rnd % 2 == 1 else ("new", "old")
        c.say(f"round {rnd} of {a.ab_rounds} ({order[0]} first), {elapsed()} s elapsed")
        for job, bs, mode in cells:
            # Both runs of a cell or neither, so its medians stay paired.
            need = longest + 5 if longest > 15 else 20
            if elapsed() + 2 * need > a.ab_budget_s:
                meta["stopped"] = (f"budget: {a.ab_budget_s} s from the start; stopped at "
                                   f"{elapsed()} s before round {rnd}, cell {job}:{bs}:{mode} "
                                   f"(the longest run took {longest} s)")
                break
            for side in order:
                tag = f"{side}-{job}-{mode.replace('+', '_')}-{bs}-r{rnd}"
                run = {"round": rnd, "side": side, "job": job, "mode": mode, "batch_size": bs,
                       "json": os.path.join(work, f"{tag}.json"),
                       "out": os.path.join(work, f"{tag}.out")}
                began = time.monotonic()
                run["rc"] = c.run(["timeout", "-k", 10, a.ab_timeout, bins[side],
                                   *ab_command(job, mode, bs, a, run["json"])],
                                  save=run["out"], fail=False)
                took = int(time.monotonic() - began)
                longest = max(longest, took)
                runs.append(run)
                with open(run["out"], errors="replace") as f:
                    output = f.read().splitlines()
                if run["rc"] == 0:
                    first = {"augment": "^gpu ", "train": "^speed "}.get(
                        job, "^images +[a-z]" if job in compare.PHOTO_JOBS else f"^{job} +[a-z]")
                    row = [line for line in output if re.search(first, line)]
                    c.emit(f"round {rnd} {side} {took}s: {row[-1] if row else ''}")
                else:
                    c.emit(f"round {rnd} {side} {job} {mode} bs {bs}: FAILED (exit {run['rc']}, "
                           f"{took}s): {' '.join(output[-3:])[:300]}")
        compare.write_ab(result_path, compare.ab_result(meta, runs, cells))
        if meta["stopped"]:
            c.say(f"STOPPED: {meta['stopped']}")
            break
    result = compare.ab_result(meta, runs, cells)
    compare.write_ab(result_path, result)
    status, _ = c.captured(compare.print_ab, result)
    subprocess.run(["tar", "-C", work, "-czf", c.out_path("redesign-runs.tar.gz"), "."],
                   stderr=subprocess.DEVNULL)
    shutil.rmtree(work, ignore_errors=True)
    c.say(f"phase run: {int(time.monotonic() - start)} s; total {elapsed()} s; wrote "
          f"{result_path} (exit {status})")
    return 1 if status is None else status


@phase("ab", old_tree_options, ab_options, folder_options, train_options)
def phase_ab_in_run(c, a):
    """this tree's tandem against --old-tree's, both built alike (build-ab, build-ab-old),
    alternating rounds: per cell each side's median and new / old, redesign.json after every round;
    redesign-ab.log, redesign-build.log, redesign-runs.tar.gz

    Rates drift between calls: the same-call ratio is what counts. Among other phases, exit 3 (some
    cell below the ratio) is a result, not a failure."""
    rc = phase_ab(c, a)
    if rc == 0:
        c.say("ab: every cell PASS")
    elif rc == 3:
        c.say("ab: some cells below the ratio (redesign.json)")
    else:
        c.say(f"ab FAILED (exit {rc}; redesign-ab.log)")
        c.status = 1


# ----------------------------------------------------------------------------------------------
# The phase table and the command line


# The order `run` runs them in.
ORDER = ["seg", "cls", "augment", "mlp", "sweep", "pair", "graphs", "profile", "profile-mlp", "ab",
         "data", "train", "photos", "enginetrace", "shares", "ddp", "gathercost", "package",
         "python", "decode", "pybench", "compile", "trainer-ab", "runsh"]
PHASES = [REGISTERED[name] for name in ORDER]
BY_NAME = {p.name: p for p in PHASES}
ALIASES = {"bench": "seg", "redesign": "ab"}  # the shell script's other names
DEFAULT_PHASES = ["seg", "cls", "augment", "graphs", "sweep"]


def phase_list(text):
    name = ALIASES.get(text, text)
    if name not in BY_NAME:
        raise ValueError(f"unknown phase; expected one of {', '.join(BY_NAME)}")
    return name


def parser():
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="PHASE|run",
                            title="commands (each with --help)")
    for ph in PHASES:
        p = sub.add_parser(ph.name, help=ph.help, description=ph.description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        common_options(p)
        for add in ph.options:
            add(p)
    p = sub.add_parser("run", help="several phases in one invocation (--phases), in the order "
                                   "above", description="Several phases in one invocation, in "
                                   "the order of `gpu_check.py --help` whatever order they are "
                                   "named in; every phase's options.")
    common_options(p)
    words(p, "--phases", DEFAULT_PHASES, "the phases (bench is seg's other name, redesign ab's)",
          phase_list, metavar="PHASE")
    seen = set()
    for ph in PHASES:
        for add in ph.options:
            if add not in seen:
                seen.add(add)
                add(p)
    return ap


def every_default():
    """Every option's default: a phase reads options its own subcommand does not list (the floor
    measures every workload's batch sizes)."""
    return vars(parser().parse_args(["run", "--out", "."]))


def parse(argv):
    a = parser().parse_args(argv)
    for key, default in every_default().items():
        if not hasattr(a, key):
            setattr(a, key, default)
    return a


def schedule(names):
    """The phases to run, in the table's order; mlp not where graphs runs (graphs runs its
    rounds)."""
    return [p for p in PHASES if p.name in names and not (p.name == "mlp" and "graphs" in names)]


def main(argv=None):
    a = parse(argv)
    phases = a.phases if a.command == "run" else [a.command]
    os.makedirs(a.out, exist_ok=True)
    a.out = os.path.abspath(a.out)  # the phases run from the repository root
    os.chdir(ROOT)
    os.environ["PYTHONUNBUFFERED"] = "1"
    c = Check(a, set(phases))
    ab_status = None
    try:
        for step in schedule(c.phases):
            if step.package_env:
                c.export_deps_lib()
            if step.name == "ab" and a.command == "ab":
                ab_status = phase_ab(c, a)  # alone: its own exit status
            else:
                step.fn(c, a)
    except Fatal:
        c.status = 1
    finally:
        c.archive()
        c.say(f"done, status {ab_status if ab_status is not None else c.status}")
    return ab_status if ab_status is not None else c.status


if __name__ == "__main__":
    sys.exit(main())
