"""benchmarks/resnet_ab_table.py without a GPU: the rows of `tandem bench --json` files named as
bundle_check.sh's resnet_ab phase names them, each build's best round, new over old, and
ResNet-50's fraction of MLPerf's rate for the card (and none for an unknown card)."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import resnet_ab_table  # noqa: E402


def write(logs, name, rate):
    (logs / name).write_text(json.dumps({"samples_per_s": rate, "mode": "pipelined+graphed"}))


def test_each_builds_best_round_and_resnet50_against_mlperf(tmp_path):
    write(tmp_path, "resnet-r50_full-new-1.json", 6000.0)
    write(tmp_path, "resnet-r50_full-new-2.json", 6200.0)
    write(tmp_path, "resnet-r50_full-old-1.json", 5800.0)
    write(tmp_path, "resnet-r50_full-old-2.json", 5700.0)
    write(tmp_path, "resnet-r18_full-new-1.json", 16000.0)
    write(tmp_path, "resnet-r18_full-old-1.json", 16000.0)
    (tmp_path / "resnet-r50_full-new-1.txt").write_text("not a row")
    t = resnet_ab_table.table(str(tmp_path), "NVIDIA H100 80GB HBM3")
    assert t["mlperf_images_per_s"] == 7160
    assert len(t["rows"]) == 6
    r50 = t["summary"]["r50_full"]
    assert r50["new"] == 6200.0 and r50["old"] == 5800.0
    assert abs(r50["new_over_old"] - 6200.0 / 5800.0) < 1e-12
    assert t["summary"]["r18_full"]["new_over_old"] == 1.0
    fractions = {(r["model"], r["build"], r["round"]): r["mlperf_fraction"] for r in t["rows"]}
    assert abs(fractions[("r50_full", "new", 2)] - 6200.0 / 7160) < 1e-12
    assert fractions[("r18_full", "new", 1)] is None  # MLPerf's rate is ResNet-50's


def test_a_tuned_variant_against_the_new_build_and_each_builds_process_seconds(tmp_path):
    write(tmp_path, "resnet-r50_full-new-1.json", 6000.0)
    write(tmp_path, "resnet-r50_full-old-1.json", 5900.0)
    write(tmp_path, "resnet-r50_full-tuned-1.json", 6300.0)
    write(tmp_path, "resnet-r50_full-tuned-2.json", 6100.0)
    (tmp_path / "resnet-r50_full-tuned-1.wall").write_text("31.5\n")
    (tmp_path / "resnet-r50_full-tuned-2.wall").write_text("29.0\n")
    (tmp_path / "resnet-r50_full-new-1.wall").write_text("not seconds")
    s = resnet_ab_table.table(str(tmp_path), "NVIDIA H200")["summary"]["r50_full"]
    assert s["tuned"] == 6300.0 and abs(s["tuned_over_new"] - 1.05) < 1e-12
    assert s["tuned_wall_s"] == 31.5  # the upper median of two
    assert s["new_wall_s"] is None and s["old_wall_s"] is None


def test_an_unknown_card_has_no_mlperf_fraction(tmp_path):
    write(tmp_path, "resnet-r50_full-new-1.json", 6000.0)
    t = resnet_ab_table.table(str(tmp_path), "")
    assert t["mlperf_images_per_s"] is None and t["rows"][0]["mlperf_fraction"] is None
    assert t["summary"]["r50_full"]["new_over_old"] is None  # no old build ran
    assert resnet_ab_table.mlperf_rate("NVIDIA H200") == 7950


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from plain_runner import run_tests  # noqa: E402
    sys.exit(run_tests(globals(), "resnet-ab-table-test-"))
