"""benchmarks/gpu_check.py and benchmarks/compare.py without a GPU: every command's options and
their defaults, the merges of compare.py on small made-up inputs, the A/B's medians and ratios,
and two phases end to end against a stand-in `tandem` (a script writing the JSON the CLI writes).

    python3 -m pytest benchmarks/tests        or        python3 benchmarks/tests/test_gpu_check.py
"""
import contextlib
import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
sys.path.insert(0, str(BENCHMARKS))
import compare  # noqa: E402
import gpu_check  # noqa: E402
from lab import check, phase_ab  # noqa: E402  (the driver's shared steps, the A/B phase)

DRIVER = BENCHMARKS / "gpu_check.py"


def write_json(path, doc):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return str(path)


def read_json(path):
    return json.loads(Path(path).read_text())


def quietly(fn, *args):
    """fn(*args), what it prints captured: (its value, the text)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        result = fn(*args)
    return result, buf.getvalue()


# ---------------------------------------------------------------------------------------------
# gpu_check.py's command line

# The defaults the shell script had, as its environment variables gave them.
SHELL_DEFAULTS = {
    "build": "build-gpu", "debs": ".ref/debs", "bench_bs": [8, 32, 128], "cls_bs": [32, 128],
    "launch_bs": [1, 2], "launch_rounds": 3, "mlp_rounds": 3, "variants": False,
    "sweep_bs": [8, 32, 128], "sweep_rounds": 1, "sweep_scenarios": ["seg", "cls"],
    "pair_scenario": "seg", "pair_bs": 8, "pair_rounds": 3,
    "pair_variants": ["bench", "nobench", "normalprio"], "pair_ncu": False,
    "profile_sampling": "auto", "data_dir": "/tmp/tandem-imagefolder", "data_count": 6000,
    "data_bs": [64, 256], "data_models": ["r50_frozen_head", "r18_full"], "data_steps": 60,
    "data_mode": "pipelined+graphed", "data_decode": ["cpu", "gpu"], "data_py_workers": 8,
    "fashion_mnist": "/usr/share/datasets/fashion-mnist", "fmnist_epochs": 10, "train_epochs": 4,
    "train_jobs": ["fmnist", "images"], "train_precisions": ["fp32", "bf16"], "train_bs": 256,
    "train_layouts": ["channels_last"], "train_models": ["r50_frozen_head", "r18_full"],
    "train_python": True, "seg_dir": "/tmp/tandem-segpairs", "seg_count": 2000, "seg_epochs": 8,
    "photos_sides": ["320-640", "1000-2000"], "photos_count": 3000,
    "photos_models": ["r18_full", "r50_full"], "photos_crops": ["region", "whole"],
    "photos_epochs": 3, "photos_val_count": 2000, "photos_progressive": 0.0, "photos_python": True, "photos_split": True, "photos_train": True, "photos_shrink": False,
    "ddp_worlds": [1, 2],
    "ddp_seg_bs": [8, 32], "ddp_cls_bs": [32, 128], "ddp_modes": ["pipelined", "pipelined+graphed"],
    "ddp_python": True, "ddp_scenarios": ["seg", "cls"], "ddp_allreduced": True,
    "ddp_bucket_mb": None, "ddp_nccl_variants": [], "ddp_floor_mb": ["179", "25", "1"],
    "ddp_train": True, "ddp_train_epochs": 2, "ddp_train_bs": 128, "decode_rounds": 5,
    "decode_images": 1000, "decode_core": 2, "py_seg_bs": [8, 32], "py_cls_bs": [32, 128],
    "py_scenarios": ["seg", "cls"], "compile_jobs": ["r18_full", "r50_full", "r50_frozen_head"],
    "compile_bs": [32, 256],
    "compile_impls": ["eager", "compile", "compile_ro", "tandem-py", "tandem-py-compiled"],
    "compile_steps": 100, "compile_profile": "", "compile_mode": "auto", "old_tree": ".ref/old",
    "trainer_ab_rounds": 3, "trainer_ab_cells": ["seg:8", "cls:32"],
    # the A/B's (its AB_* variables)
    "ab_phase": "all", "ab_rebuild": False, "ab_rounds": 3, "ab_steps": 100, "ab_warmup": 10,
    "ab_workers": 8, "ab_timeout": 120, "ab_budget_s": 540, "ab_min_ratio": 0.97,
    "ab_old_commit": "d529f74", "ab_jobs": 16, "ab_new_build": "build-ab",
    "ab_old_build": "build-ab-old", "cmake": "cmake", "torch_prefix": None,
    "phases": ["seg", "cls", "augment", "graphs", "sweep"],
}
COMMANDS = [p.name for p in gpu_check.PHASES] + ["run"]


def test_every_command_parses_with_the_shell_defaults(tmp_path):
    for command in COMMANDS:
        a = gpu_check.parse([command, "--out", str(tmp_path)])
        assert a.command == command
        for key, expected in SHELL_DEFAULTS.items():
            assert getattr(a, key) == expected, (command, key, getattr(a, key))
    cells = gpu_check.parse(["ab", "--out", str(tmp_path)]).ab_cells
    assert cells[0] == ("seg", 8, "pipelined") and cells[-1] == ("mlp", 640, "graphed")
    assert len(cells) == 11


def test_every_command_has_help():
    for command in COMMANDS:
        _, text = quietly(lambda: _exit_code(gpu_check.parser().parse_args, [command, "--help"]))
        assert "--out" in text, command
    top = subprocess.run([sys.executable, str(DRIVER), "--help"], capture_output=True, text=True)
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout


def _exit_code(fn, *args):
    try:
        fn(*args)
    except SystemExit as e:
        return e.code
    return None


def test_list_options_take_spaces_and_commas(tmp_path):
    out = ["--out", str(tmp_path)]
    assert gpu_check.parse(["seg", *out, "--bench-bs", "8,16", "32"]).bench_bs == [8, 16, 32]
    assert gpu_check.parse(["seg", *out, "--bench-bs", "8 16"]).bench_bs == [8, 16]
    a = gpu_check.parse(["ab", *out, "--ab-cells", "seg:8:pipelined,augment:32:auto"])
    assert a.ab_cells == [("seg", 8, "pipelined"), ("augment", 32, "auto")]
    a = gpu_check.parse(["ddp", *out, "--ddp-nccl-variants", "NCCL_ALGO=Ring NCCL_PROTO=LL",
                         "--ddp-nccl-variants", "NCCL_ALGO=Tree"])
    assert a.ddp_nccl_variants == ["NCCL_ALGO=Ring NCCL_PROTO=LL", "NCCL_ALGO=Tree"]
    assert gpu_check.parse(["train", *out, "--no-train-python"]).train_python is False


def test_bad_values_name_themselves():
    cases = [(["seg", "--bench-bs", "8,x"], "'x'"), (["pair", "--pair-bs", "0"], "'0'"),
             (["ab", "--ab-cells", "seg:8"], "'seg:8'"),
             (["run", "--phases", "seg", "nosuch"], "'nosuch'"),
             (["photos", "--photos-sides", "320"], "MIN-MAX"),
             (["photos", "--photos-progressive", "2"], "0 to 1"),
             (["train", "--train-jobs", "bogus"], "fmnist, images, seg")]
    for argv, named in cases:
        code, text = quietly(_exit_code, gpu_check.parse, [*argv, "--out", "/tmp"])
        assert code == 2 and named in text, (argv, text)


def test_phases_run_in_the_table_order():
    names = [gpu_check.phase_list(n) for n in ("graphs", "bench", "sweep", "mlp", "redesign")]
    assert [p.name for p in gpu_check.schedule(set(names))] == ["seg", "sweep", "graphs", "ab"]
    assert [p.name for p in gpu_check.schedule({"mlp"})] == ["mlp"]


def test_a_phase_reads_options_of_its_neighbours(tmp_path):
    # The floor of the seg phase measures cls's batch sizes too.
    a = gpu_check.parse(["seg", "--out", str(tmp_path)])
    assert a.cls_bs == [32, 128] and a.launch_bs == [1, 2] and a.data_dir


# ---------------------------------------------------------------------------------------------
# The driver's runs


@contextlib.contextmanager
def make_check(tmp_path, phases=("seg",)):
    a = gpu_check.parse(["run", "--out", str(tmp_path)])
    a.out = str(tmp_path)
    c = gpu_check.Check(a, set(phases))
    try:
        yield c
    finally:
        shutil.rmtree(c.raw, ignore_errors=True)


def test_run_routes_its_output(tmp_path):
    with make_check(tmp_path) as c:
        run_routes_its_output(c, tmp_path)


def run_routes_its_output(c, tmp_path):
    script = ["sh", "-c", "echo one; echo two; echo three; exit 3"]
    saved = tmp_path / "saved.txt"
    rc, printed = quietly(lambda: c.run(script, show="t", tail=1, suffix=" (x)", save=saved))
    assert rc == 3 and c.status == 1
    assert printed == "three (x)\n"
    assert saved.read_text() == "one\ntwo\nthree\n"
    assert (tmp_path / "gpu-check.log").read_text() == "three (x)\n"
    c.status = 0
    _, printed = quietly(lambda: c.run(["sh", "-c", "echo a; echo b"], log_all=True, show="b",
                                       fail=False))
    assert printed == "b\n" and c.status == 0
    assert (tmp_path / "gpu-check.log").read_text().endswith("a\nb\n")
    rc, printed = quietly(lambda: c.run(["/nonexistent/tandem"], show=True))
    assert rc == 127 and "/nonexistent/tandem" in printed


def test_compare_failure_is_logged_not_raised(tmp_path):
    with make_check(tmp_path) as c:
        quietly(lambda: c.compare("--scenario", "data", "--raw", str(tmp_path / "nosuch"),
                                  "--out", str(tmp_path / "x.json")))
        assert c.status == 1
    assert "is not one" in (tmp_path / "gpu-check.log").read_text()


def test_source_hash_is_the_shell_pipelines(tmp_path):
    for name in ("src/a.cpp", "src/b.h", "CMakeLists.txt", "cmake/x.cmake", "tools/t.in",
                 "notes.txt", "build-gpu/skip.cpp", "build.cmake", ".git/skip.h", ".ref/s.cpp",
                 "sub/build/kept.cpp"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    if shutil.which("sha1sum"):
        shell = subprocess.run(
            "find . \\( -path ./.git -o -path './build*' -o -path ./.ref -o -path ./.whl \\) "
            "-prune -o -type f \\( -name '*.cpp' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' "
            "-o -name '*.cuh' -o -name CMakeLists.txt -o -name '*.cmake' -o -name '*.in' \\) "
            "-print | LC_ALL=C sort | xargs -d '\\n' sha1sum | sha1sum | cut -c1-12",
            shell=True, cwd=tmp_path, capture_output=True, text=True).stdout.strip()
        assert phase_ab.source_sha1(str(tmp_path)) == shell
    before = phase_ab.source_sha1(str(tmp_path))
    (tmp_path / "build-gpu/skip.cpp").write_text("changed")
    assert phase_ab.source_sha1(str(tmp_path)) == before
    (tmp_path / "sub/build/kept.cpp").write_text("changed")
    assert phase_ab.source_sha1(str(tmp_path)) != before


def test_find_bin_looks_three_levels_down(tmp_path):
    deep = tmp_path / "a" / "b" / "tandem"
    deep.parent.mkdir(parents=True)
    deep.write_text("#!/bin/sh\n")
    deep.chmod(0o755)
    assert phase_ab.find_bin(str(tmp_path)) == str(deep)
    assert phase_ab.find_bin(str(tmp_path / "a" / "b" / "nosuch")) is None
    (tmp_path / "tandem").write_text("")
    (tmp_path / "tandem").chmod(0o755)
    assert phase_ab.find_bin(str(tmp_path)) == str(tmp_path / "tandem")


class Recording(gpu_check.Check):
    """A Check that records the commands and compare.py calls instead of running them."""

    def __init__(self, *args):
        super().__init__(*args)
        self.commands, self.compared = [], []

    def run(self, cmd, **kw):
        self.commands.append([str(x) for x in cmd])
        return 0

    def compare(self, *argv, **kw):
        self.compared.append([str(x) for x in argv])


def record(tmp_path, name, *options):
    """The phase's commands with its defaults and these options; its build (and the folders
    beside it that phases replace: BUILD-py, BUILD-deps) in tmp_path."""
    a = gpu_check.parse([name, "--out", str(tmp_path), "--build", str(tmp_path / "build-gpu"),
                         *options])
    c = Recording(a, {name})
    try:
        _, printed = quietly(REGISTERED[name].fn, c, a)
    finally:
        shutil.rmtree(c.raw, ignore_errors=True)
    return c, printed


REGISTERED = gpu_check.REGISTERED


def test_every_phase_builds_its_commands(tmp_path):
    # ab and runsh run for real elsewhere (ab end to end below; runsh copies the whole tree).
    # trainer-ab needs an old tree (any folder will do: its build is recorded, not run).
    extra = {"trainer-ab": ("--old-tree", str(tmp_path))}
    for name in gpu_check.ORDER:
        if name not in ("ab", "runsh"):
            c, _ = record(tmp_path, name, *extra.get(name, ()))
            assert c.commands or c.compared, name


def tandem_runs(c, subcommand="bench"):
    return [cmd for cmd in c.commands if cmd[:2] == [c.tandem, subcommand]
            or cmd[2:4] == [c.tandem, subcommand]]  # behind `timeout N`


def test_seg_and_cls_run_the_shell_commands(tmp_path):
    c, _ = record(tmp_path, "seg")
    first = c.commands[0]
    assert first[:-1] == [c.tandem, "bench", "--workload", "seg", "--mode", "serial",
                          "--batch-size", "8", "--steps", "100", "--warmup", "10",
                          "--workers", "8", "--json"]
    assert first[-1].endswith("/tandem-seg-serial-8.json")
    assert len(tandem_runs(c)) == 6
    floor = [cmd for cmd in c.commands if cmd[1:3] == [check.LOOPS, "floor"]]
    assert floor[0][3:5] == ["--bs", "8,32,128"]  # seg's and cls's sizes, once each
    assert c.compared[0][:2] == ["--scenario", "seg"]
    c, _ = record(tmp_path, "cls", "--cls-bs", "32")
    assert [cmd[4:8] for cmd in tandem_runs(c)] == [
        ["--mode", "serial", "--param", "augment=cpu"], ["--mode", "serial", "--batch-size", "32"],
        ["--mode", "pipelined", "--batch-size", "32"]]
    assert tandem_runs(c)[0][-1].endswith("/tandem-cls-serial_augment_cpu-32.json")
    command = c.compared[0][c.compared[0].index("--command") + 1]
    assert "--mode {serial --param augment=cpu,serial,pipelined}" in command


def test_ddp_and_decode_run_counts(tmp_path):
    c, _ = record(tmp_path, "ddp", "--no-ddp-train", "--no-ddp-python")
    runs = tandem_runs(c)
    assert len(runs) == 2 * 2 * 2 * 2 + 2 * 2  # worlds x workloads x sizes x modes + all-reduced
    assert sum("--no-gathered-grad" in r for r in runs) == 4
    floors = [cmd for cmd in c.commands if "benchmarks/allreduce_floor.py" in cmd]
    assert len(floors) == 1 and floors[0][-5:-2] == ["179", "25", "1"]
    c, _ = record(tmp_path, "decode", "--decode-rounds", "2", "--decode-core", "0")
    pinned = [cmd for cmd in c.commands if cmd[:3] == ["taskset", "-c", "0"]]
    assert len(pinned) == 4 and pinned[1][3:5] == [check.PYTHON, "benchmarks/data_bench.py"]


def test_train_models_and_layouts(tmp_path):
    c, _ = record(tmp_path, "train", "--train-jobs", "images", "--train-models",
                  "r50_frozen_head,r50_full", "--train-layouts", "nchw", "--train-precisions",
                  "bf16", "--no-train-python")
    trains = tandem_runs(c, "train")
    assert [t[4:8] for t in trains] == [["--model", "resnet50", "--freeze", "backbone"],
                                        ["--model", "resnet50", "--optimizer", "sgd"]]
    assert all("--no-channels-last" in t for t in trains)
    assert c.compared == [["--scenario", "train", "--raw", c.raw, "--out",
                           str(tmp_path / "train.json")]]


# ---------------------------------------------------------------------------------------------
# compare.py: the merges


def merge(scenario, raw, out, *extra):
    rc, text = quietly(compare.main, ["--scenario", scenario, "--raw", str(raw), "--out", str(out),
                                      *extra])
    assert rc == 0
    return text


def test_data_merges_python_then_tandem_and_skips_broken_files(tmp_path):
    write_json(tmp_path / "data-python.json", {"device": "GPU", "command": "data_bench.py",
                                               "rows": [{"impl": "python", "job": "decode"}],
                                               "loader": [{"workers": 8}]})
    write_json(tmp_path / "data-tandem-r18_full-64-cpu.json",
               {"device": "GPU", "command": "tandem data-bench", "rows": [{"impl": "tandem"}]})
    (tmp_path / "data-tandem-r18_full-64-gpu.json").write_text("{half")
    text = merge("data", tmp_path, tmp_path / "data.json")
    d = read_json(tmp_path / "data.json")
    assert [r["impl"] for r in d["rows"]] == ["python", "tandem"]
    assert d["loader"] == [{"workers": 8}] and d["device"] == "GPU"
    assert d["command"] == "data_bench.py ; tandem data-bench"
    assert "skipping" in text and "wrote" in text


def test_photos_without_train_runs_only_the_benches(tmp_path):
    c, _ = record(tmp_path, "photos", "--photos-sides", "1000-2000", "--photos-crops", "region",
                  "--no-photos-train", "--no-photos-python", "--photos-models", "r18_full")
    assert tandem_runs(c, "train") == []
    benches = [cmd for cmd in tandem_runs(c) if "source=files" in cmd]
    assert [("decode=auto" in cmd) for cmd in benches] == [False, True]
    table = [cmd for cmd in c.commands if any("photos_table.py" in str(w) for w in cmd)]
    assert table and "--no-photos-train" in table[0][-1]
    assert tandem_runs(c, "shrink") == []


def test_photos_train_runs_evaluate_a_held_out_folder_larger_than_the_ring(tmp_path):
    c, _ = record(tmp_path, "photos", "--photos-sides", "1000-2000", "--photos-crops", "region",
                  "--no-photos-split", "--no-photos-python", "--photos-models", "r18_full")
    made = [cmd for cmd in c.commands if "scripts/make_image_folder.py" in cmd]
    val = [cmd for cmd in made if "/tmp/tandem-photos-1000-2000-val" in cmd]
    assert len(val) == 1 and val[0][val[0].index("--count") + 1] == "2000"
    assert val[0][val[0].index("--seed") + 1] == "1"  # other photos than the training folder's
    [train] = tandem_runs(c, "train")
    assert train[train.index("--val") + 1] == "/tmp/tandem-photos-1000-2000-val"
    assert "--val-split" not in train
    c, _ = record(tmp_path, "photos", "--photos-sides", "1000-2000", "--photos-crops", "region",
                  "--no-photos-split", "--no-photos-python", "--photos-models", "r18_full",
                  "--photos-val-count", "0")
    [train] = tandem_runs(c, "train")
    assert train[train.index("--val-split") + 1] == "0.1" and "--val" not in train
    assert not any("/tmp/tandem-photos-1000-2000-val" in cmd for cmd in c.commands)


def test_photos_progressive_makes_folders_of_their_own_with_that_share(tmp_path):
    c, _ = record(tmp_path, "photos", "--photos-sides", "320-640", "--photos-crops", "region",
                  "--no-photos-split", "--no-photos-python", "--photos-models", "r18_full",
                  "--photos-progressive", "0.25")
    made = [cmd for cmd in c.commands if "scripts/make_image_folder.py" in cmd]
    assert [cmd[2] for cmd in made] == ["/tmp/tandem-photos-320-640-p0.25",
                                        "/tmp/tandem-photos-320-640-p0.25-val"]
    assert all(cmd[cmd.index("--progressive-fraction") + 1] == "0.25" for cmd in made)
    [train] = tandem_runs(c, "train")
    assert train[train.index("--data") + 1] == "/tmp/tandem-photos-320-640-p0.25"
    table = [cmd for cmd in c.commands if any("photos_table.py" in str(w) for w in cmd)]
    assert "--photos-progressive 0.25" in table[0][-1]
    c, _ = record(tmp_path, "photos", "--photos-sides", "320-640", "--photos-crops", "region",
                  "--no-photos-train", "--no-photos-python", "--photos-models", "r18_full")
    assert not any("--progressive-fraction" in cmd for cmd in c.commands)


def test_photos_shrink_benches_the_shrunk_folder_beside_the_original(tmp_path):
    c, _ = record(tmp_path, "photos", "--photos-sides", "1000-2000", "--photos-crops", "region",
                  "--no-photos-train", "--no-photos-python", "--photos-models", "r50_full",
                  "--photos-shrink")
    [shrink] = tandem_runs(c, "shrink")
    assert shrink[shrink.index("--out") + 1] == "/tmp/tandem-photos-1000-2000-shrunk"
    datas = [cmd[cmd.index("--data") + 1] for cmd in tandem_runs(c) if "source=files" in cmd]
    assert datas == ["/tmp/tandem-photos-1000-2000", "/tmp/tandem-photos-1000-2000-shrunk"] * 2


def test_photos_table_rows_with_and_without_train_runs_and_the_split_capacity(tmp_path):
    import photos_table
    raw = tmp_path / "raw"
    split_note = ("the JPEG engines decode 0.4 of each batch, the CPU workers the rest (in the "
                  "run: CPU crop regions 3000 img/s on 15 workers, engines 5000 img/s)")
    write_json(raw / "photos-resident-r18_full.json", {"samples_per_s": 19000})
    # ResNet-18: a bench from the files, split and not, no train run.
    write_json(raw / "photos-files-1000-2000-r18_full-region.json",
               {"device": "GPU", "runs": [{"samples_per_s": 3500, "notes": []}]})
    on_cores = ("; on a core: the workers 0.95 of their time (8 switches/s), the engines' thread "
                "0.42 of its decode time (410 switches/s))")
    write_json(raw / "photos-files-1000-2000-r18_full-region-auto.json",
               {"runs": [{"samples_per_s": 7600,
                          "notes": [split_note.replace(" img/s)", " img/s" + on_cores)]}]})
    # ResNet-50: a train run with its bench beside it.
    write_json(raw / "photos-resident-r50_full.json", {"samples_per_s": 6800})
    write_json(raw / "photos-train-1000-2000-r50_full-region-auto.json",
               {"device": "GPU", "precision": "bf16", "batch_size": 256, "images_per_s": 6500,
                "eval_images_per_s": 9000, "notes": [split_note]})
    write_json(raw / "photos-files-1000-2000-r50_full-region-auto.json",
               {"runs": [{"samples_per_s": 6100, "notes": [split_note]}]})
    # And ResNet-18 from the shrunk folder, split.
    write_json(raw / "photos-files-1000-2000-r18_full-region-shrunk-auto.json",
               {"runs": [{"samples_per_s": 12000, "notes": [split_note]}]})
    write_json(raw / "photos-shrink-1000-2000.json", {"files": 1500, "shrunk": 1400,
                                                      "bytes_in": 400, "bytes_out": 150})
    _, text = quietly(photos_table.main, str(raw), str(tmp_path / "photos.json"), "cmd")
    doc = read_json(tmp_path / "photos.json")
    shrunk = [r for r in doc["rows"] if r.get("folder") == "shrunk"]
    assert [(r["job"], r["decode"], r["images_per_s"]) for r in shrunk] == [
        ("r18_full", "auto", 12000)]
    assert doc["shrink"]["1000-2000"]["bytes_out"] == 150
    rows = {(r["job"], r["decode"]): r for r in doc["rows"] if r.get("folder") == "original"}
    assert set(rows) == {("r18_full", "cpu"), ("r18_full", "auto"), ("r50_full", "auto")}
    r18 = rows[("r18_full", "auto")]
    assert r18["images_per_s"] == 7600 and r18["eval_images_per_s"] is None
    assert r18["cpu_share"] == 0.6 and r18["decode_capacity_images_per_s"] == 8000
    assert (r18["cpu_images_per_s"], r18["engine_images_per_s"]) == (3000, 5000)
    assert r18["of_bound"] == 0.95  # 7600 / min(19000, 8000)
    assert (r18["engines_thread_on_core"], r18["engines_thread_switches_per_s"]) == (0.42, 410)
    assert (r18["workers_on_core"], r18["worker_switches_per_s"]) == (0.95, 8)
    assert rows[("r18_full", "cpu")]["of_bound"] == round(3500 / 19000, 3)  # no capacity
    r50 = rows[("r50_full", "auto")]
    assert r50["images_per_s"] == 6100 and r50["eval_images_per_s"] == 9000
    assert r50["of_bound"] == round(6100 / 6800, 3) and "wrote" in text


def test_train_splits_classifiers_and_segmentation(tmp_path):
    run = {"command": "tandem train", "device": "H", "precision": "fp32", "batch_size": 256,
           "images_per_s": 1000.0, "accuracy": 0.9, "epochs": 4}
    write_json(tmp_path / "train-tandem-fmnist.json", run | {"batch_size": 64})
    write_json(tmp_path / "train-tandem-r18_full-fp32-channels_last.json", run)
    write_json(tmp_path / "resident-r18_full-fp32-channels_last.json",
               {"runs": [{"samples_per_s": 1500.0}]})
    write_json(tmp_path / "train-tandem-seg_fcn_r18-bf16-channels_last.json",
               run | {"precision": "bf16", "accuracy": 0.6, "command": "tandem train seg"})
    write_json(tmp_path / "train-python-images.json",
               {"command": "train_bench.py", "rows": [{"impl": "python", "job": "r18_full"}]})
    merge("train", tmp_path, tmp_path / "train.json")
    d = read_json(tmp_path / "train.json")
    fm, r18, py = d["rows"]
    assert (fm["job"], fm["resident_images_per_s"], fm["layout"]) == ("fashion_mnist", None, None)
    assert (r18["job"], r18["resident_images_per_s"], r18["layout"]) == \
        ("r18_full", 1500.0, "channels_last")
    assert py == {"impl": "python", "job": "r18_full"}
    assert d["command"] == "tandem train ; tandem train ; train_bench.py"
    seg = read_json(tmp_path / "train-seg.json")
    assert seg["rows"] == [{"impl": "tandem", "job": "seg_fcn_r18", "precision": "bf16",
                            "batch_size": 256, "images_per_s": 1000.0, "miou": 0.6, "epochs": 4,
                            "layout": "channels_last"}]
    assert seg["command"] == "tandem train seg"


def test_ddp_rows_worlds_and_the_gathered_comparison(tmp_path):
    def run(rate, slowest):
        return {"device_name": "NVIDIA H200", "steps_per_s": rate,
                "data_parallel": {"steps_per_s_slowest_rank": slowest, "backend": "nccl"}}
    write_json(tmp_path / "ddp-tandem-seg-pipelined+graphed-8-w1.json", run(100.0, 100.0))
    write_json(tmp_path / "ddp-tandem-seg-pipelined+graphed-8-w2.json", run(95.0, 94.0))
    write_json(tmp_path / "ddp-tandem-seg-pipelined+graphed-8-w2-allreduced.json", run(80.0, 79.0))
    write_json(tmp_path / "ddp-python.json", {"command": "ddp_reference.py", "rows": [
        {"impl": "python", "scenario": "seg", "mode": "serial", "batch_size_per_gpu": 8,
         "world": 2, "steps_per_s_per_gpu": 50.0}]})
    text = merge("ddp", tmp_path, tmp_path / "ddp.json", "--command", "gpu_check.py ddp")
    d = read_json(tmp_path / "ddp.json")
    assert d["device"] == "2x NVIDIA H200 (one host)"
    assert d["command"].startswith("gpu_check.py ddp: tandem bench --workload seg")
    assert d["command"].count("--no-gathered-grad") == 1
    tandem = [r for r in d["rows"] if r["impl"] == "tandem"]
    assert [(r["world"], r["gathered_grad"], r["steps_per_s_slowest_rank"]) for r in tandem] == \
        [(1, None, 100.0), (2, False, 79.0), (2, True, 94.0)]  # in the files' name order
    assert "scaling 0.950" in text and "vs python 1.90x" in text
    assert "95.00 vs 80.00 steps/s/GPU (1.188x)" in text


def test_decode_medians_and_ratios_per_round(tmp_path):
    def rows(**rates):
        return {"rows": [{"job": "decode", "decode": "cpu", "decoder": k,
                          "images_per_s_per_core": v} for k, v in rates.items()]
                + [{"job": "decode", "decode": "gpu", "decoder": "nvjpeg",
                    "images_per_s_per_core": 1.0}]}
    write_json(tmp_path / "decode-tandem-1.json", rows(turbojpeg_scaled=300.0))
    write_json(tmp_path / "decode-python-1.json", rows(pil=100.0, tandem_scaled=250.0))
    write_json(tmp_path / "decode-tandem-2.json", rows(turbojpeg_scaled=500.0))
    write_json(tmp_path / "decode-python-2.json", rows(pil=200.0, tandem_scaled=300.0))
    merge("decode", tmp_path, tmp_path / "decode.json", "--device", "host CPU",
          "--command", "gpu_check.py decode")
    d = read_json(tmp_path / "decode.json")
    s = d["summary"]
    assert s["pil"] == 150.0 and s["turbojpeg_scaled"] == 400.0
    assert s["cli_scaled_over_pil_per_round"] == [3.0, 2.5]
    assert s["cli_scaled_over_pil_median"] == 2.75
    assert s["interleaved_scaled_over_pil_per_round"] == [2.5, 1.5]
    assert s["interleaved_full_over_pil_median"] is None
    assert len(d["rows"]) == 6 and {r["round"] for r in d["rows"]} == {1, 2}
    assert d["device"] == "host CPU" and d["command"] == "gpu_check.py decode"


def test_pair_medians_and_ratio(tmp_path):
    def run(rate):
        return {"steps_per_s": rate, "gpu_utilization": 0.9,
                "stages": [{"name": "train", "device_ms_per_step": 2.5},
                           {"name": "load", "device_ms_per_step": None}]}
    for rnd, (eager, graphed) in enumerate([(100.0, 105.0), (110.0, 121.0), (90.0, 113.0)], 1):
        write_json(tmp_path / f"pair-bench-pipelined-{rnd}.json", run(eager))
        write_json(tmp_path / f"pair-bench-pipelined+graphed-{rnd}.json", run(graphed))
    merge("pair", tmp_path, tmp_path / "pair.txt")
    text = (tmp_path / "pair.txt").read_text()
    assert "bench      median pipelined 100.00, pipelined+graphed 113.00: ratio 1.130" in text
    assert "device ms/step: train 2.500  util 0.9" in text
    assert len(text.splitlines()) == 7


def test_pair_kernels_from_ncu_csv(tmp_path):
    header = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'

    def csv_text(rows):
        return "==PROF== the program's output\n" + header + "".join(
            f'"{i}","{k}","gpu__time_duration.sum","{u}","{v}"\n' for i, (k, u, v) in
            enumerate(rows))
    (tmp_path / "ncu-pair-pipelined.csv").write_text(
        csv_text([("gemm", "us", "10"), ("gemm", "ns", "12,000"), ("relu", "us", "1")]))
    (tmp_path / "ncu-pair-pipelined+graphed.csv").write_text(
        csv_text([("gemm", "us", "9"), ("copy", "ms", "0.002")]))
    merge("pair-kernels", tmp_path, tmp_path / "pair-kernels.txt")
    lines = (tmp_path / "pair-kernels.txt").read_text().splitlines()
    assert lines[0] == "kernels profiled: pipelined 3, pipelined+graphed 2"
    gemm = lines[2].split()
    assert gemm == ["gemm", "2", "11.00", "1", "9.00"]
    assert lines[-1] == "mean us per launch: pipelined 7.67, pipelined+graphed 5.50"


def test_seg_checks_against_the_floor(tmp_path):
    def tandem(mode, rate):
        return write_json(tmp_path / f"t-{mode}.json", {
            "scenario": "seg", "mode": mode, "batch_size": 8, "steps_per_s": rate,
            "first_loss": 2.0, "last_loss": 1.0, "device_name": "GPU", "torch": "2.11"})
    runs = [tandem("serial", 300.0), tandem("pipelined", 380.0)]
    python = write_json(tmp_path / "py.json", [
        {"exp": "seg", "bs": 8, "mode": "pipelined", "steps_s": 150.0}])
    floor = write_json(tmp_path / "floor.json", [
        {"exp": "seg_floor", "bs": 8, "floor_ms": 2.5, "serial_step_graph_ms": 3.5}])
    quietly(compare.main, ["--scenario", "seg", "--tandem", *runs, "--python", python,
                           "--floor", floor, "--out", str(tmp_path / "seg.json")])
    checks = {c["check"]: (round(c["value"], 3), c["pass"])
              for c in read_json(tmp_path / "seg.json")["checks"]}
    assert checks["bs 8: tandem pipelined / python pipelined >= 2.0"] == (2.533, True)
    assert checks["bs 8: tandem pipelined / floor rate >= 0.9"] == (0.95, True)
    assert checks["bs 8: tandem pipelined >= tandem serial"] == (380.0, True)


# ---------------------------------------------------------------------------------------------
# compare.py: the A/B


def test_parse_cell():
    assert compare.parse_cell("seg:8:pipelined+graphed") == ("seg", 8, "pipelined+graphed")
    for bad in ("seg:8", "seg:x:pipelined", "Seg:8:serial", "seg:8:serial:x"):
        try:
            compare.parse_cell(bad)
        except ValueError as e:
            assert bad in str(e)
        else:
            raise AssertionError(f"{bad} parsed")


def ab_run(tmp_path, rnd, side, job, bs, mode, rate=None, rc=0, losses=(2.0, 1.0)):
    stem = tmp_path / f"{side}-{job}-{bs}-{mode}-{rnd}"
    Path(f"{stem}.out").write_text(f"{job} {mode} line\nlast words\n")
    if rate is not None:
        if job == "augment":
            write_json(f"{stem}.json", [{"batch_size": bs, "requested_sampling": "staged",
                                         "steps_per_s": 1.0},
                                        {"batch_size": bs, "requested_sampling": mode,
                                         "steps_per_s": rate}])
        else:
            write_json(f"{stem}.json", {"scenario": job, "mode": mode, "batch_size": bs,
                                        "steps_per_s": rate, "first_loss": losses[0],
                                        "last_loss": losses[1]})
    return {"round": rnd, "side": side, "job": job, "mode": mode, "batch_size": bs, "rc": rc,
            "json": f"{stem}.json", "out": f"{stem}.out"}


META = {"device": "GPU", "date": "2026-12-03T00:00:00Z", "command": "gpu_check.py ab",
        "old_commit": "d529f74", "rounds": 3, "min_ratio": 0.97, "timeout_s": 120,
        "stopped": None, "builds": {}}


def test_ab_medians_ratios_and_verdicts(tmp_path):
    seg, aug, mlp = ("seg", 8, "pipelined"), ("augment", 32, "auto"), ("mlp", 640, "graphed")
    runs = []
    for rnd, old, new in ((1, 100.0, 99.0), (2, 90.0, 105.0), (3, 110.0, 97.0)):
        runs += [ab_run(tmp_path, rnd, "old", *seg, rate=old),
                 ab_run(tmp_path, rnd, "new", *seg, rate=new)]
    for rnd, old, new in ((1, 1000.0, 900.0), (2, 1000.0, 950.0)):
        runs += [ab_run(tmp_path, rnd, "old", *aug, rate=old),
                 ab_run(tmp_path, rnd, "new", *aug, rate=new)]
    runs += [ab_run(tmp_path, 1, "old", *mlp, rate=50.0),
             ab_run(tmp_path, 1, "new", *mlp, rc=124)]
    result = compare.ab_result(META, runs, [seg, aug, mlp])
    rows = {r["job"]: r for r in result["rows"]}
    r = rows["seg"]
    assert (r["old"], r["new"], r["ratio"], r["pass"], r["same_losses"]) == \
        (100.0, 99.0, 0.99, True, True)
    assert r["old_runs"] == [100.0, 90.0, 110.0] and "errors" not in r
    r = rows["augment"]
    assert (r["old"], r["new"], r["ratio"], r["pass"], r["same_losses"]) == \
        (1000.0, 925.0, 0.925, False, None)
    r = rows["mlp"]
    assert (r["new"], r["ratio"], r["new_runs"]) == (None, None, [None])
    assert r["errors"][0]["error"].startswith("timed out after 120 s (exit 124)\n")
    assert result["counts"] == {"failed": 1, "missing": 1, "below": 1}
    assert result["rounds_run"] == 3
    assert set(result) - {"counts"} == {"device", "date", "command", "old_commit", "rounds",
                                        "rounds_run", "min_ratio", "stopped", "builds", "rows"}
    code, text = quietly(compare.print_ab, result)
    assert code == 1 and "1 of 3 cells PASS; 1 failed run(s); 1 cell(s) without a ratio" in text
    compare.write_ab(tmp_path / "ab.json", result)
    assert "counts" not in read_json(tmp_path / "ab.json")


def test_ab_train_cells_rate_tandem_trains_steady_images_per_s_in_steps(tmp_path):
    cell = ("train", 256, "pipelined+graphed")
    runs = []
    for rnd, side, ips in ((1, "old", 5120.0), (1, "new", 5376.0)):
        run = ab_run(tmp_path, rnd, side, *cell)
        write_json(run["json"], {"mode": "pipelined+graphed", "batch_size": 256,
                                 "images_per_s": ips, "rows": [{"train_loss": 2.3},
                                                               {"train_loss": 1.9}]})
        runs.append(run)
    wrong = ab_run(tmp_path, 2, "new", *cell)
    write_json(wrong["json"], {"mode": "pipelined", "batch_size": 256, "images_per_s": 1.0})
    [row] = compare.ab_result(META, runs + [wrong], [cell])["rows"]
    assert (row["old"], row["new"], row["ratio"], row["same_losses"]) == (20.0, 21.0, 1.05, True)
    assert "the JSON says ('train', 'pipelined', 256)" in row["errors"][0]["error"]


def test_ab_photos_cells_run_workload_images_from_the_photos_and_compare_no_losses(tmp_path):
    cell = ("photos_r50", 256, "pipelined+graphed")
    assert compare.parse_cell("photos_r50:256:pipelined+graphed") == cell
    a = gpu_check.parse(["ab", "--out", str(tmp_path), "--ab-photos", "/data/photos",
                         "--ab-cells", "photos_r50:256:pipelined+graphed"])
    command = [str(x) for x in phase_ab.ab_command(*cell[:1], cell[2], cell[1], a, "r.json")]
    assert command[:5] == ["bench", "--workload", "images", "--data", "/data/photos"]
    for param in ("source=files", "decode=auto", "model=r50_full", "precision=bf16",
                  "layout=channels_last"):
        assert param in command, param
    assert command[command.index("--batch-size") + 1] == "256"
    assert command[command.index("--mode") + 1] == "pipelined+graphed"
    assert "worker_nice=5" not in command
    nice = gpu_check.parse(["ab", "--out", str(tmp_path), "--ab-photos-params", "worker_nice=5"])
    command = [str(x) for x in phase_ab.ab_command(*cell[:1], cell[2], cell[1], nice, "r.json")]
    assert command[command.index("worker_nice=5") - 1] == "--param"
    bad = drive("ab", "--out", tmp_path, "--ab-photos-params", "worker_nice")
    assert bad.returncode == 2 and "'worker_nice': expected KEY=VALUE" in bad.stderr, bad.stderr
    runs = []
    for rnd, side, rate, first in ((1, "old", 16.0, 2.3), (1, "new", 17.0, 2.4)):
        run = ab_run(tmp_path, rnd, side, *cell)
        write_json(run["json"], {"scenario": "images",
                                 "params": {"model": "r50_full", "decode": "auto"},
                                 "mode": "pipelined+graphed", "batch_size": 256,
                                 "steps_per_s": rate, "first_loss": first, "last_loss": 2.0})
        runs.append(run)
    r18 = ab_run(tmp_path, 2, "new", *cell)
    write_json(r18["json"], {"scenario": "images",
                             "params": {"model": "r18_full", "decode": "auto"},
                             "mode": "pipelined+graphed", "batch_size": 256, "steps_per_s": 30.0})
    [row] = compare.ab_result(META, runs + [r18], [cell])["rows"]
    assert (row["old"], row["new"], row["ratio"]) == (16.0, 17.0, 1.0625)
    assert row["same_losses"] is None, "a split that follows the rates decodes by timing"
    assert "the JSON says ('images (r18_full, decode auto)'" in row["errors"][0]["error"]


def test_ab_photos_cpu_cells_decode_on_the_workers_alone(tmp_path):
    cell = ("photos_r18_cpu", 256, "pipelined+graphed")
    a = gpu_check.parse(["ab", "--out", str(tmp_path), "--ab-photos", "/data/photos",
                         "--ab-cells", "photos_r18_cpu:256:pipelined+graphed"])
    command = [str(x) for x in phase_ab.ab_command(*cell[:1], cell[2], cell[1], a, "r.json")]
    assert "decode=cpu" in command and "model=r18_full" in command
    assert "decode=auto" not in command
    runs = []
    for rnd, side, decode in ((1, "old", "cpu"), (1, "new", "cpu"), (2, "new", "auto")):
        run = ab_run(tmp_path, rnd, side, *cell)
        write_json(run["json"], {"scenario": "images",
                                 "params": {"model": "r18_full", "decode": decode},
                                 "mode": "pipelined+graphed", "batch_size": 256,
                                 "steps_per_s": 10.0 if decode == "cpu" else 30.0})
        runs.append(run)
    [row] = compare.ab_result(META, runs, [cell])["rows"]
    assert (row["old"], row["new"]) == (10.0, 10.0), "the auto run is not the cell's"
    assert "decode auto" in row["errors"][0]["error"]


def test_ab_exit_status(tmp_path):
    cell = ("cls", 32, "pipelined+graphed")
    runs = [ab_run(tmp_path, 1, "old", *cell, rate=100.0),
            ab_run(tmp_path, 1, "new", *cell, rate=96.0, losses=(2.0, 1.5))]
    result = compare.ab_result(META, runs, [cell])
    assert result["rows"][0]["same_losses"] is False
    assert quietly(compare.print_ab, result)[0] == 3  # every run done, below the ratio
    assert quietly(compare.print_ab, compare.ab_result(META | {"min_ratio": 0.95}, runs,
                                                       [cell]))[0] == 0
    assert quietly(compare.print_ab, compare.ab_result(META | {"min_ratio": 0.95,
                                                               "stopped": "budget"},
                                                       runs, [cell]))[0] == 1
    wrong = [ab_run(tmp_path, 1, "old", *cell, rate=100.0),
             ab_run(tmp_path, 1, "new", "cls", 32, "pipelined", rate=100.0)]
    wrong[1]["mode"] = "pipelined+graphed"  # the JSON says another mode than the one asked for
    result = compare.ab_result(META, wrong, [cell])
    assert "the JSON says" in result["rows"][0]["errors"][0]["error"]


# ---------------------------------------------------------------------------------------------
# Phases end to end against a stand-in tandem

FAKE_TANDEM = '''\
#!{python}
"""Writes what `tandem bench` and `tandem augment-bench` write with --json; the rate is RATE
in this script's folder name (build-RATE)."""
import json, os, sys
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
rate = float(os.path.basename(os.path.dirname(os.path.abspath(__file__))).split("-")[-1])
if args[0] == "bench":
    job = opt("--workload") or opt("--scenario")
    mode, bs = opt("--mode"), int(opt("--batch-size", "8"))
    if mode == "pipelined+graphed":
        rate *= 1.1
    doc = {{"scenario": job, "mode": mode, "batch_size": bs, "steps_per_s": rate,
            "first_loss": 2.0, "last_loss": 1.0, "gpu_utilization": 0.9,
            "stages": [{{"name": "train", "device_ms_per_step": 1000.0 / rate}}]}}
    print(f"{{job}}  {{mode}}  bs {{bs}}  {{rate:.1f}} steps/s")
    params = dict(x.split("=", 1) for x in args if "=" in x)
    if job == "images" and params.get("decode") == "auto":  # a split run: its share in its notes
        share = float(params.get("engine_share", "0.5"))
        nice = int(params.get("worker_nice", "0"))
        waits = 1.02 if opt("--cuda-wait") == "block" else 1
        doc["samples_per_s"] = rate * bs * (0.5 + share) * (1 + nice / 100) * waits
        doc["notes"] = [f"engines: the JPEG engines decode {{share}} of each batch, the CPU "
                        "workers the rest (in the run: CPU crop regions 3000 img/s on 15 workers, "
                        f"engines 5000 img/s; on a core: the workers 0.9 of their time (12 "
                        f"switches/s), the engines' thread {{0.5 + nice / 20}} of its decode time "
                        f"(300 switches/s))"]
        doc["stages"] = [{{"name": "load", "host_ms_per_step": 10.0}},
                         {{"name": "engines", "host_ms_per_step": 100 * share}}]
        doc["device_name"] = "Fake GPU"
    if opt("--kernel-trace"):
        doc["params"] = dict(x.split("=", 1) for x in args if "=" in x)
        print("CUDA API calls over the same steps, by host thread")
        print("     40.000       1.0      52.000                 7  cudaStreamSynchronize")
        with open(opt("--kernel-trace"), "w") as f:
            json.dump({{"traceEvents": []}}, f)
elif args[0] == "augment-bench":
    doc = [{{"batch_size": int(opt("--batch-sizes")), "requested_sampling": opt("--sampling"),
             "steps_per_s": rate}}]
    print(f"gpu {{rate}}")
else:
    sys.exit(f"unknown command {{args[0]}}")
with open(opt("--json"), "w") as f:
    json.dump(doc, f)
'''


def fake_build(folder, rate):
    build = Path(folder) / f"build-{rate}"
    build.mkdir(parents=True)
    tandem = build / "tandem"
    tandem.write_text(FAKE_TANDEM.format(python=sys.executable))
    tandem.chmod(0o755)
    return build


def drive(*argv):
    return subprocess.run([sys.executable, str(DRIVER), *map(str, argv)], capture_output=True,
                          text=True, timeout=300)


def test_pair_phase_end_to_end(tmp_path):
    build = fake_build(tmp_path, 100)
    out = tmp_path / "out"
    r = drive("pair", "--out", out, "--build", build, "--pair-rounds", 2,
              "--pair-variants", "bench,streamprio")
    assert r.returncode == 0, r.stdout + r.stderr
    text = (out / "pair.txt").read_text()
    assert "bench      median pipelined 100.00, pipelined+graphed 110.00: ratio 1.100" in text
    assert "streamprio median" in text
    assert (out / "raw.tar.gz").is_file()
    log = (out / "gpu-check.log").read_text()
    assert "pair: seg bs 8, pipelined vs pipelined+graphed, 2 rounds of: bench streamprio" in log
    assert log.rstrip().endswith("done, status 0")


def test_ab_end_to_end(tmp_path):
    old_tree = tmp_path / "old"
    old_tree.mkdir()
    (old_tree / "CMakeLists.txt").write_text("project(old)\n")
    old, new = fake_build(tmp_path, 100), fake_build(tmp_path, 102)
    out = tmp_path / "out"
    common = ["--out", out, "--old-tree", old_tree, "--ab-phase", "run", "--ab-old-build", old,
              "--ab-new-build", new, "--ab-rounds", 2, "--ab-cells",
              "seg:8:pipelined,augment:32:auto", "--ab-steps", 2, "--ab-warmup", 1]
    r = drive("ab", *common)
    assert r.returncode == 0, r.stdout + r.stderr
    d = read_json(out / "redesign.json")
    assert d["rounds_run"] == 2 and d["stopped"] is None and d["old_commit"] == "d529f74"
    assert [(x["job"], x["old"], x["new"], x["ratio"], x["pass"]) for x in d["rows"]] == \
        [("seg", 100.0, 102.0, 1.02, True), ("augment", 100.0, 102.0, 1.02, True)]
    assert d["builds"]["old"]["binary"] == str(old / "tandem")
    assert "--scenario S" in d["command"]
    assert (out / "redesign-runs.tar.gz").is_file()
    assert "2 of 2 cells PASS" in (out / "redesign-ab.log").read_text()
    # Below the ratio: a result (exit 3); no budget for a run: stopped (exit 1).
    assert drive("ab", *common, "--ab-min-ratio", 1.05).returncode == 3
    r = drive("ab", *common, "--ab-budget-s", 0)
    assert r.returncode == 1
    d = read_json(out / "redesign.json")
    assert d["stopped"].startswith("budget: 0 s from the start") and d["rounds_run"] == 0
    # The same A/B among other phases: exit 3 is not a failure there.
    r = drive("run", *common, "--phases", "redesign", "--ab-min-ratio", 1.05)
    assert r.returncode == 0 and "some cells below the ratio" in r.stdout


FAKE_CMAKE = """#!/bin/sh
echo "$@" >>"{log}"
if [ "$1" = "--build" ]; then mkdir -p "$2"; printf '#!/bin/sh\\n' >"$2/tandem"; chmod +x "$2/tandem"; fi
"""


def test_ab_builds_name_the_unpacked_jpeg_libraries_release_variable_too(tmp_path):
    # Where the machine has no TurboJPEG, the A/B builds take the .debs unpacked beside the
    # build; FindJPEG's imported target prefers JPEG_LIBRARY_RELEASE, so it is named as well.
    build = tmp_path / "build-gpu"
    deps = tmp_path / "build-gpu-deps" / "usr" / "include"
    deps.mkdir(parents=True)
    for header in ("turbojpeg.h", "jpeglib.h"):
        (deps / header).write_text("")
    log, cmake = tmp_path / "cmake.log", tmp_path / "cmake"
    cmake.write_text(FAKE_CMAKE.format(log=log))
    cmake.chmod(0o755)
    old_tree = tmp_path / "old"
    old_tree.mkdir()
    (old_tree / "CMakeLists.txt").write_text("project(old)\n")
    r = drive("ab", "--out", tmp_path / "out", "--build", build, "--old-tree", old_tree,
              "--ab-phase", "build", "--cmake", cmake, "--torch-prefix", tmp_path,
              "--ab-old-build", tmp_path / "b-old", "--ab-new-build", tmp_path / "b-new")
    assert r.returncode == 0, r.stdout + r.stderr
    configures = [line for line in log.read_text().splitlines() if line.startswith("-S")]
    assert len(configures) == 2, configures
    lib = tmp_path / "build-gpu-deps/usr/lib/x86_64-linux-gnu"
    for line in configures:
        for option in (f"-DTURBOJPEG_LIBRARY_RELEASE={lib}/libturbojpeg.so",
                       f"-DJPEG_LIBRARY_RELEASE={lib}/libjpeg.so",
                       f"-DJPEG_INCLUDE_DIR={tmp_path}/build-gpu-deps/usr/include"):
            assert option in line.split(), (option, line)


def test_enginetrace_profiles_each_model_from_the_photos_and_keeps_the_traces(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()  # present: not generated
    out = tmp_path / "out"
    r = drive("enginetrace", "--out", out, "--build", fake_build(tmp_path, 20),
              "--enginetrace-photos", photos, "--enginetrace-steps", 3)
    assert r.returncode == 0, r.stdout + r.stderr
    for model in ("r18_full", "r50_full"):
        report = read_json(out / f"enginetrace-{model}.json")
        assert report["params"]["model"] == model and report["params"]["decode"] == "auto"
        with gzip.open(out / f"enginetrace-{model}.trace.json.gz") as f:
            assert json.load(f) == {"traceEvents": []}
    assert "cudaStreamSynchronize" in r.stdout, "the longest API calls are shown"
    assert "longest host waits" in r.stdout, "trace_waits.py read each trace"


def drive_shares(tmp_path, *args):
    """The shares phase against a fake build at 20 steps/s, on a photos folder that exists (not
    generated), 3 steps a run: its result, its shares.json and the OUT folder."""
    photos = tmp_path / "photos"
    photos.mkdir()
    out = tmp_path / "out"
    r = drive("shares", "--out", out, "--build", fake_build(tmp_path, 20), "--shares-photos",
              photos, "--shares-steps", 3, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, read_json(out / "shares.json"), out


def test_shares_runs_each_share_in_alternating_rounds_and_compares_it_with_auto(tmp_path):
    r, d, out = drive_shares(tmp_path, "--shares", "auto,0.6", "--shares-rounds", 2)
    assert d["device"] == "Fake GPU" and "--param model=MODEL" in d["command"]
    # Round 1 in the order given, round 2 reversed.
    assert [(x["share"], x["round"]) for x in d["rows"]] == \
        [("auto", 1), ("0.6", 1), ("0.6", 2), ("auto", 2)]
    six = next(x for x in d["rows"] if x["share"] == "0.6")
    assert six["engine_share_end"] == 0.6 and six["engines_host_ms"] == 60.0
    assert six["load_host_ms"] == 10.0
    summary = {x["share"]: x for x in d["summary"]}
    assert summary["auto"]["median_images_per_s"] == 20 * 1.1 * 256  # pipelined+graphed: 1.1x
    assert abs(summary["0.6"]["ratio_to_auto"] - 1.1) < 1e-9
    assert "share   0.6: median 6,195 img/s, 1.100 of auto" in r.stdout
    assert six["engines_thread_on_core"] == 0.5 and six["worker_switches_per_s"] == 12
    assert six["worker_nice"] == 0 and six["workers_on_core"] == 0.9
    # A share outside 0 to 1 is refused, naming it.
    bad = drive("shares", "--out", out, "--shares", "1.5")
    assert bad.returncode == 2 and "--shares '1.5': expected auto or a share 0 to 1" in bad.stderr


def test_shares_runs_each_share_at_each_nice_value_against_auto_at_the_first(tmp_path):
    r, d, out = drive_shares(tmp_path, "--shares", "auto", "--shares-nice", "0,5",
                             "--shares-rounds", 2)
    assert [(x["worker_nice"], x["round"]) for x in d["rows"]] == [(0, 1), (5, 1), (5, 2), (0, 2)]
    assert "[--param worker_nice=NICE]" in d["command"]
    summary = {x["worker_nice"]: x for x in d["summary"]}
    assert abs(summary[5]["ratio_to_auto"] - 1.05) < 1e-9, "to auto at the first nice value"
    five = next(x for x in d["rows"] if x["worker_nice"] == 5)
    assert five["engines_thread_on_core"] == 0.75
    assert "share  auto nice  5: median" in r.stdout
    bad = drive("shares", "--out", out, "--shares-nice", "20")
    assert bad.returncode == 2 and "'20': expected a nice value from 0 to 19" in bad.stderr


def test_shares_runs_each_cell_with_each_way_of_waiting_against_auto_at_the_first(tmp_path):
    r, d, out = drive_shares(tmp_path, "--shares", "auto", "--shares-cuda-wait", "auto,block",
                             "--shares-rounds", 1)
    assert [x["cuda_wait"] for x in d["rows"]] == ["auto", "block"]
    assert "[--cuda-wait WAIT]" in d["command"]
    summary = {x["cuda_wait"]: x for x in d["summary"]}
    assert abs(summary["block"]["ratio_to_auto"] - 1.02) < 1e-9, "block passed as --cuda-wait"
    assert summary["auto"]["ratio_to_auto"] == 1
    assert "share  auto waits block: median" in r.stdout
    bad = drive("shares", "--out", out, "--shares-cuda-wait", "nap")
    assert bad.returncode == 2 and "nap" in bad.stderr, bad.stderr


def _x(cat, name, tid, ts, dur, corr, pid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def test_trace_waits_finds_the_stream_whose_work_waited_and_the_wait_it_held(tmp_path):
    import trace_waits
    events = [
        # thread 7 queues a kernel on each of streams 31 and 32; 32's starts 40 ms late, and
        # thread 7's event wait ends as it does
        _x("cuda_runtime", "cudaLaunchKernel", 7, 0, 5, 1),
        _x("cuda_runtime", "cudaLaunchKernel", 7, 10, 5, 2),
        _x("cuda_runtime", "cudaEventSynchronize", 7, 20, 40_000, 3),
        _x("kernel", "rgba2rgb", 31, 100, 10, 1, pid=0),
        _x("kernel", "rgba2rgb", 32, 40_000, 15, 2, pid=0),
        # thread 9 launches the training's graph on stream 48
        _x("cuda_runtime", "cudaGraphLaunch", 9, 0, 2_000, 4),
        _x("kernel", "conv", 48, 2_100, 37_000, 4, pid=0),
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 31, "args": {"name": "stream 31"}},
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = trace_waits.analyse(trace_waits.load(path))
    by_thread = {t["thread"]: t for t in s["threads"]}
    assert by_thread[7]["streams"] == [31, 32] and by_thread[9]["streams"] == [48]
    assert by_thread[7]["calls"][0]["name"] == "cudaEventSynchronize"
    lag = {r["stream"]: r["lag_max_ms"] for r in s["streams"]}
    assert abs(lag[32] - 39.99) < 1e-6 and abs(lag[31] - 0.1) < 1e-6
    (wait,) = s["waits"]
    assert wait["thread"] == 7 and wait["ms"] == 40.0
    assert [r["stream"] for r in wait["released_by"]] == [32]
    assert trace_waits.streams_text([31, 32, 33, 48]) == "31-33, 48"
    assert "stream   32" in trace_waits.render(s)
    out = tmp_path / "s.json"
    assert trace_waits.main([str(path), "--json", str(out)]) == 0 and read_json(out)["waits"]
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert trace_waits.main([str(bad)]) == 2


def test_ab_refuses_a_tree_that_is_not_one(tmp_path):
    r = drive("ab", "--out", tmp_path / "out", "--old-tree", tmp_path / "nosuch")
    assert r.returncode == 2 and "is not a source tree" in r.stdout


if __name__ == "__main__":
    from plain_runner import run_tests  # noqa: E402
    sys.exit(run_tests(globals(), "gpu-check-test-"))
