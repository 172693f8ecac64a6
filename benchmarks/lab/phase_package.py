"""The phases of the Python package, each run with the unpacked .deb libraries on
LD_LIBRARY_PATH: package, python, decode, pybench, compile, trainer-ab and runsh."""
import os
import re
import shutil
import subprocess
import tempfile

from lab.check import PROG, PYTHON, ROOT, device_name, joined, phase
from lab.options import (compile_options, decode_options, fashion_options, folder_options,
                         old_tree_options, pybench_options, trainer_ab_options)


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
