"""What every gpu_check.py phase shares: the invocation's Check (OUT, the scratch folder, the log,
the exit status, runs and compare.py calls, the folders several phases make), the registry the
phase modules add their phases to, and the paths and programs their commands name."""
import collections
import contextlib
import glob
import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import compare  # benchmarks/compare.py: the merges of every phase's result

# The repository: the phases run from there, as their commands' paths assume.
ROOT = Path(__file__).resolve().parents[2]
PROG = "benchmarks/gpu_check.py"  # as recorded in the results' "command"
LOOPS = "benchmarks/reference_loops.py"  # the Python reference loops
PYTHON = sys.executable  # the Python running this driver (python3 with torch on the GPU machine)
T0 = time.monotonic()  # the budget of `ab` counts from here


class Fatal(Exception):
    """A phase cannot run at all: the driver stops (exit status 1)."""


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

