"""The ab phase: this tree's tandem against an old source tree's, built alike and run alternately,
cell by cell, in one call (rates drift between calls: the same-call ratio is what counts). The
builds, the runs and their commands live here; compare/ab.py judges the runs."""
import fnmatch
import glob
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time

from lab.check import PROG, PYTHON, ROOT, T0, device_name, phase
from lab.compare.ab import PHOTO_JOBS, ab_result, print_ab, write_ab
from lab.options import ab_options, folder_options, old_tree_options, train_options
from lab.phase_data import TRAIN_MODELS
from lab.phase_photos import photos_bench

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
    if job in PHOTO_JOBS:
        model, decode = PHOTO_JOBS[job]
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
                      if any(j in PHOTO_JOBS for j, _, _ in cells) else "")
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
    if any(job in PHOTO_JOBS for job, _, _ in cells):
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
                        job, "^images +[a-z]" if job in PHOTO_JOBS else f"^{job} +[a-z]")
                    row = [line for line in output if re.search(first, line)]
                    c.emit(f"round {rnd} {side} {took}s: {row[-1] if row else ''}")
                else:
                    c.emit(f"round {rnd} {side} {job} {mode} bs {bs}: FAILED (exit {run['rc']}, "
                           f"{took}s): {' '.join(output[-3:])[:300]}")
        write_ab(result_path, ab_result(meta, runs, cells))
        if meta["stopped"]:
            c.say(f"STOPPED: {meta['stopped']}")
            break
    result = ab_result(meta, runs, cells)
    write_ab(result_path, result)
    status, _ = c.captured(print_ab, result)
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
