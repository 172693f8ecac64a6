"""benchmarks/mlperf_table.py without a GPU: the rows of one call's resident, photo and
torchvision-loop files, ResNet-50 against MLPerf's rate for the card, photo rows against the
resident step, and a second run appended to the first."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import mlperf_table  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def write(logs, name, doc):
    (logs / name).write_text(json.dumps(doc))


def a_call(logs):
    write(logs, "mlperf-resident.json", {"rows": [
        {"impl": "tandem-cpp", "job": "r50_full", "batch_size": 256, "images_per_s": 5900.0},
        {"impl": "compile", "job": "r50_full", "batch_size": 256, "images_per_s": 5100.0},
        {"impl": "eager", "job": "r50_full", "batch_size": 256, "images_per_s": None,
         "error": "timed out after 600 s"},
        {"impl": "tandem-cpp", "job": "r18_full", "batch_size": 256, "images_per_s": 18000.0}]})
    write(logs, "mlperf-files-320-640-r50_full.json",
          {"batch_size": 256, "samples_per_s": 5310.0, "mode": "pipelined+graphed"})
    write(logs, "mlperf-files-1000-2000-r18_full.json",
          {"batch_size": 256, "samples_per_s": 9000.0})
    write(logs, "mlperf-python-320-640.json", {"rows": [
        {"impl": "python", "job": "r50_full", "batch_size": 256, "images_per_s": 590.0}]})
    (logs / "mlperf-files-notes.txt").write_text("not a row")


def test_one_call_makes_every_row_against_mlperf_and_the_resident_step(tmp_path):
    a_call(tmp_path)
    doc = mlperf_table.table(str(tmp_path), H100, "the command")
    assert doc["runs"][0]["mlperf_images_per_s"] == 7160
    rows = {(r["impl"], r["job"], r["source"]): r for r in doc["rows"]}
    assert len(rows) == 7
    r50 = rows[("tandem-cpp", "r50_full", "resident")]
    assert abs(r50["mlperf_fraction"] - 5900.0 / 7160) < 1e-12 and r50["run"] == 1
    assert rows[("torch.compile", "r50_full", "resident")]["images_per_s"] == 5100.0
    assert rows[("eager", "r50_full", "resident")]["error"] == "timed out after 600 s"
    assert rows[("tandem-cpp", "r18_full", "resident")]["mlperf_fraction"] is None  # R50's rate
    photos = rows[("tandem-cpp", "r50_full", "photos-320-640")]
    assert abs(photos["of_resident"] - 5310.0 / 5900.0) < 1e-12
    assert abs(photos["mlperf_fraction"] - 5310.0 / 7160) < 1e-12
    loop = rows[("torchvision-loop", "r50_full", "photos-320-640")]
    assert abs(loop["of_resident"] - 590.0 / 5900.0) < 1e-12  # against tandem's resident step
    assert rows[("tandem-cpp", "r18_full", "photos-1000-2000")]["of_resident"] == 0.5
    assert "torchvision-loop" in mlperf_table.lines(doc)


def test_a_second_run_is_appended_and_numbered(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    a_call(first)
    write(second, "mlperf-resident.json", {"rows": [
        {"impl": "tandem-cpp", "job": "r50_full", "batch_size": 256, "images_per_s": 6600.0}]})
    doc = mlperf_table.table(str(first), H100, "one")
    doc = mlperf_table.table(str(second), "NVIDIA H200", "two", existing=doc)
    assert [r["run"] for r in doc["runs"]] == [1, 2]
    assert doc["runs"][1]["mlperf_images_per_s"] == 7950
    last = [r for r in doc["rows"] if r["run"] == 2]
    assert len(last) == 1 and abs(last[0]["mlperf_fraction"] - 6600.0 / 7950) < 1e-12
    assert len(doc["rows"]) == 8


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from plain_runner import run_tests  # noqa: E402
    sys.exit(run_tests(globals(), "mlperf-table-test-"))
