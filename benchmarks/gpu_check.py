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
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # lab/: the phases, their options and what they share
# Each phase module registers its phases as it is imported.
from lab import (phase_ab, phase_data, phase_ddp, phase_package, phase_photos,  # noqa: E402,F401
                 phase_reference)
from lab.check import REGISTERED, ROOT, Check, Fatal  # noqa: E402
from lab.options import common_options, words  # noqa: E402


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
                ab_status = phase_ab.phase_ab(c, a)  # alone: its own exit status
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
