"""gpu_check.py's command-line options: the list action and the value converters (each refuses a
bad value by name), the helpers that add an option with its default in its help, and every phase's
option groups (in one place: several phases share groups, and a phase reads its neighbours')."""
import argparse
import re

from lab.compare.ab import parse_cell
from lab.compare.merges import PAIR_VARIANTS


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
    return parse_cell(text)


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
          allowed=PAIR_VARIANTS, metavar="VARIANT")
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
    words(g, "--ab-cells", [parse_cell(c) for c in DEFAULT_CELLS],
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

