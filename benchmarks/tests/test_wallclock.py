"""benchmarks/wallclock.py without a GPU: the arithmetic of its calls, the --cells list, the
rows' plan and output, and the result JSON rewritten after every row (an error row kept).

    python3 -m pytest benchmarks/tests/test_wallclock.py   or   python3 benchmarks/tests/test_wallclock.py
"""
import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
sys.path.insert(0, str(BENCHMARKS))
import wallclock  # noqa: E402

DRIVER = BENCHMARKS / "wallclock.py"


def close(a, b, tol=1e-9):
    return a is not None and math.isclose(a, b, rel_tol=tol, abs_tol=tol)


# ---------------------------------------------------------------------------------------------
# the arithmetic

def test_call_costs_recover_a_known_steady_rate_and_fixed_cost():
    n, bs, steady, fixed = 20, 32, 1000.0, 0.5  # a call: 0.5 s, then 1000 images/s
    a = fixed + n * bs / steady
    b = fixed + 4 * n * bs / steady
    first = 10.0 + n * bs / steady  # 10 s of compilation and trials before its steps
    c = wallclock.call_costs(first, b, a, b, n, bs)
    assert close(c["steady_images_per_s"], steady)
    assert close(c["per_call_s"], fixed)
    assert close(c["wall_images_per_s"], 4 * n * bs / b)
    assert close(c["first_call_s"], first) and close(c["second_call_s"], b)
    assert close(c["first_fixed_s"], 10.0)
    assert close(c["first_images_per_s"], n * bs / first)


def test_a_longer_first_call_counts_its_own_steps():
    n, bs, steady = 20, 256, 2000.0
    a, b = n * bs / steady, 4 * n * bs / steady  # the plain loop: no fixed cost per call
    first = 30.0 + 300 * bs / steady
    c = wallclock.call_costs(first, b, a, b, n, bs, first_steps=300)
    assert close(c["steady_images_per_s"], steady)
    assert abs(c["per_call_s"]) < 1e-9
    assert close(c["first_fixed_s"], 30.0)
    assert close(c["first_images_per_s"], 300 * bs / first)


def test_no_steady_rate_when_the_long_call_is_not_longer():
    c = wallclock.call_costs(5.0, 1.0, 1.0, 0.9, 20, 32)
    assert c["steady_images_per_s"] is None
    assert c["per_call_s"] is None and c["first_fixed_s"] is None
    assert close(c["wall_images_per_s"], 4 * 20 * 32 / 0.9)


def test_rounded_and_timing_fields():
    r = wallclock.rounded(dict(first_call_s=1.234567, steady_images_per_s=1234.5678, mode="x"))
    assert r == dict(first_call_s=1.2346, steady_images_per_s=1234.6, mode="x")
    report = dict(seconds=1.5, steps_per_s=10.0, samples_per_s=320.0, ms_per_step=100.0,
                  warmup=0, floor_ms=3.0, setup_seconds=0.25, steps=20, mode="graphed",
                  cudnn_benchmark=True, notes=["captured"])
    assert wallclock.timing_fields(report) == dict(seconds=1.5, warmup=0, floor_ms=3.0,
                                                   setup_seconds=0.25)
    assert wallclock.timing_fields(None) == {}


# ---------------------------------------------------------------------------------------------
# the command line's lists

def test_cells_parse_and_the_default_is_the_six():
    cells = wallclock.parse_cells(wallclock.CELLS)
    assert cells == [("r18_full", 256), ("r18_full", 32), ("r50_frozen_head", 256),
                     ("r50_frozen_head", 32), ("mnv3_full", 256), ("vit_b16_full", 256)]
    assert wallclock.parse_cells(" r18_full:32 , mnv3_full:8,") == [("r18_full", 32),
                                                                     ("mnv3_full", 8)]


def test_a_bad_cell_is_named():
    for text, bad in (("r18_full:32,nosuch:32", "'nosuch:32'"), ("r18_full", "'r18_full'"),
                      ("r18_full:x", "'r18_full:x'"), ("r18_full:0", "'r18_full:0'"),
                      ("r18_full:32,r50_full:-1", "'r50_full:-1'")):
        try:
            wallclock.parse_cells(text)
        except ValueError as e:
            assert bad in str(e), (text, str(e))
            assert "r18_full" in str(e)  # the jobs it takes
        else:
            raise AssertionError(f"{text!r} parsed")
    try:
        wallclock.parse_cells(" , ")
    except ValueError as e:
        assert "no cells" in str(e)
    else:
        raise AssertionError("an empty list parsed")


def test_impls_parse_and_a_bad_one_is_named():
    assert wallclock.parse_impls("eager, tandem-py") == ["eager", "tandem-py"]
    try:
        wallclock.parse_impls("eager,compile_ro")
    except ValueError as e:
        assert "'compile_ro'" in str(e)
    else:
        raise AssertionError("compile_ro parsed")


def test_the_command_line_names_a_bad_cell():
    r = subprocess.run([sys.executable, str(DRIVER), "--cells", "r18_full:32,bogus:8"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "'bogus:8'" in r.stderr, r.stderr


def test_help_runs_without_torch():
    r = subprocess.run([sys.executable, str(DRIVER), "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for option in ("--cells", "--impls", "--n", "--fit-steps-first", "--cache-dir",
                   "--warm-process", "--old-package", "--timeout", "--out"):
        assert option in r.stdout, option


# ---------------------------------------------------------------------------------------------
# the rows

def test_each_row_has_a_fresh_cache_folder_and_a_warm_row_shares_its_first(tmp_path):
    plan = wallclock.plan_rows([("r18_full", 32)], list(wallclock.IMPLS), str(tmp_path),
                               warm=True)
    assert [r["impl"] for r in plan] == ["eager", "compile", "tandem-py", "tandem-py-warm",
                                         "tandem-py-compiled", "tandem-py-compiled-warm"]
    by = {r["impl"]: r for r in plan}
    assert by["tandem-py-warm"]["cache_dir"] == by["tandem-py"]["cache_dir"]
    assert by["tandem-py-warm"]["base"] == "tandem-py"
    assert by["tandem-py-compiled-warm"]["cache_dir"] == by["tandem-py-compiled"]["cache_dir"]
    cold = [r["cache_dir"] for r in plan if not r["impl"].endswith("-warm")]
    assert len(set(cold)) == len(cold)
    for d in cold:
        assert Path(d).parent == tmp_path and os.listdir(d) == []
    plain = wallclock.plan_rows([("r18_full", 32)], ["tandem-py"], str(tmp_path))
    assert [r["impl"] for r in plain] == ["tandem-py"]
    assert plain[0]["package"] is None


def test_a_warm_row_is_set_against_the_row_whose_cache_it_reused():
    rows = [wallclock.blank_row("tandem-py", "r18_full", 32, first_call_s=8.0, first_fixed_s=6.0),
            wallclock.blank_row("tandem-py-warm", "r18_full", 32, first_call_s=4.0,
                                first_fixed_s=2.0),
            wallclock.blank_row("tandem-py-warm", "r50_frozen_head", 256, first_call_s=3.0),
            wallclock.blank_row("eager", "r18_full", 32, first_call_s=5.0)]
    pairs = wallclock.warm_starts(rows)
    assert [(p["impl"], p["job"]) for p in pairs] == [("tandem-py", "r18_full"),
                                                      ("tandem-py", "r50_frozen_head")]
    assert pairs[0]["first_call_cold_over_warm"] == 2.0
    assert pairs[0]["first_fixed_cold_over_warm"] == 3.0
    # no cold row for it: no ratio, the warm numbers kept
    assert pairs[1]["first_call_cold_over_warm"] is None
    assert pairs[1]["warm_first_call_s"] == 3.0
    assert pairs[0]["cold_conv_plans"] is None  # rows without fits: none


def test_a_warm_pair_carries_each_first_fits_convolution_plans():
    timed = dict(tuned=32, from_file=0, tuning_s=0.37, rebuilding_s=0.0, listing_s=0.1,
                 building_s=0.2)
    rebuilt = dict(tuned=0, from_file=32, tuning_s=0.0, rebuilding_s=0.2, listing_s=0.15,
                   building_s=0.04)
    rows = [wallclock.blank_row("tandem-py", "r18_full", 32, first_call_s=2.0,
                                fits=[dict(setup=dict(conv_plans=timed))]),
            wallclock.blank_row("tandem-py-warm", "r18_full", 32, first_call_s=1.0,
                                fits=[dict(setup=dict(conv_plans=rebuilt)), dict(setup={})])]
    (pair,) = wallclock.warm_starts(rows)
    assert pair["cold_conv_plans"] == timed and pair["warm_conv_plans"] == rebuilt
    line = wallclock.conv_plans_line(rebuilt)
    assert "32 rebuilt in 0.200 s" in line and "listing 0.150" in line
    assert wallclock.conv_plans_line(None) == "-"


def test_an_old_package_runs_each_tandem_row_before_this_one(tmp_path):
    plan = wallclock.plan_rows([("r18_full", 32)], ["eager", "tandem-py"], str(tmp_path),
                               warm=True, old_package="/old/py")
    assert [r["impl"] for r in plan] == ["eager", "tandem-py@old", "tandem-py@old-warm",
                                         "tandem-py", "tandem-py-warm"]
    by = {r["impl"]: r for r in plan}
    assert by["tandem-py@old"]["base"] == "tandem-py"
    assert by["tandem-py@old"]["package"] == by["tandem-py@old-warm"]["package"] == "/old/py"
    assert by["tandem-py"]["package"] is None and by["eager"]["package"] is None
    assert by["tandem-py@old-warm"]["cache_dir"] == by["tandem-py@old"]["cache_dir"]
    assert by["tandem-py@old"]["cache_dir"] != by["tandem-py"]["cache_dir"]


def test_old_env_runs_each_tandem_row_first_on_this_package_with_the_settings(tmp_path):
    plan = wallclock.plan_rows([("r18_full", 32)], ["eager", "tandem-py"], str(tmp_path),
                               warm=True, old_env={"TANDEM_TUNED_CONV": "0"})
    assert [r["impl"] for r in plan] == ["eager", "tandem-py@old", "tandem-py@old-warm",
                                         "tandem-py", "tandem-py-warm"]
    by = {r["impl"]: r for r in plan}
    assert by["tandem-py@old"]["package"] is None
    assert by["tandem-py@old-warm"]["env"] == {"TANDEM_TUNED_CONV": "0"}
    assert by["tandem-py"]["env"] == {} and by["eager"]["env"] == {}


def test_a_malformed_old_env_is_refused():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            wallclock.main(["--old-env", "TANDEM_TUNED_CONV", "--out", "/dev/null"])
        raise AssertionError("a setting without '=' was taken")
    except SystemExit as e:
        assert e.code == 2
    assert "NAME=VALUE" in err.getvalue()


def test_a_row_process_output_is_its_row_line_or_an_error():
    row = dict(impl="eager", job="r18_full", batch_size=32, first_call_s=1.0)
    out = "noise\nROW " + json.dumps(dict(row, first_call_s=0.5)) + "\nROW " + json.dumps(row)
    assert wallclock.row_from_output(out, "", 0, "eager", "r18_full", 32) == row
    bad = wallclock.row_from_output("nothing\n", "a\nSegmentation fault\n", -11, "compile",
                                    "r18_full", 32)
    assert bad["impl"] == "compile" and bad["batch_size"] == 32
    assert "exit -11" in bad["error"] and "Segmentation fault" in bad["error"]
    assert set(wallclock.ROW_KEYS) <= set(bad)


def test_the_json_is_rewritten_after_each_row_and_an_error_row_is_kept(tmp_path):
    out = tmp_path / "wallclock.json"
    plan = wallclock.plan_rows([("r18_full", 32)], ["eager", "compile", "tandem-py"],
                               str(tmp_path))
    seen = []  # the rows in the file when each row starts

    def run_one(planned):
        seen.append([r["impl"] for r in json.loads(out.read_text())["rows"]]
                    if out.exists() else None)
        if planned["impl"] == "compile":
            raise RuntimeError("the row's process could not start")
        if planned["impl"] == "tandem-py":
            return wallclock.blank_row("tandem-py", "r18_full", 32, error="exit 1: boom")
        return dict(impl="eager", job="r18_full", batch_size=32, first_call_s=2.0,
                    device="GPU X", torch="2.x")

    rows = wallclock.run_rows(plan, run_one, str(out), "python3 benchmarks/wallclock.py")
    assert seen == [None, ["eager"], ["eager", "compile"]]
    doc = json.loads(out.read_text())
    assert doc["rows"] == rows and len(rows) == 3
    assert doc["device"] == "GPU X" and doc["command"] == "python3 benchmarks/wallclock.py"
    assert doc["date"] and doc["torch"] == "2.x"
    eager, compiled, tandem = doc["rows"]
    assert eager["error"] is None and eager["first_call_s"] == 2.0
    assert compiled["impl"] == "compile" and "could not start" in compiled["error"]
    assert tandem["error"] == "exit 1: boom"
    for r in doc["rows"]:
        assert set(wallclock.ROW_KEYS) <= set(r)
    assert not (tmp_path / "wallclock.json.tmp").exists()


def test_the_table_shows_every_row_and_errors():
    rows = [dict(wallclock.blank_row("eager", "r18_full", 32), first_call_s=3.0,
                 first_images_per_s=1000.0, steady_images_per_s=2000.0),
            dict(wallclock.blank_row("tandem-py", "r18_full", 32), first_call_s=6.0,
                 first_images_per_s=500.0, mode="pipelined+graphed", trials_s=4.2),
            wallclock.blank_row("compile", "r18_full", 32, error="timed out after 9 s")]
    text = wallclock.table(rows)
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("job")
    assert "pipelined+graphed" in lines[2] and "0.50" in lines[2]  # first img/s x eager
    assert "error: timed out after 9 s" in lines[3]


if __name__ == "__main__":
    from plain_runner import run_tests  # noqa: E402
    sys.exit(run_tests(globals(), "wallclock-test-"))
