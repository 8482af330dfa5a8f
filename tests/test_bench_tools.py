"""The benchmark tools (tools/bench_*.py) run end to end at tiny sizes, and their shared helpers behave."""

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


def _run(tool, *args, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, os.path.join(TOOLS, tool)] + list(args),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, "%s failed:\n%s\n%s" % (tool, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


@pytest.fixture(scope="module")
def bc():
    sys.path.insert(0, TOOLS)
    try:
        import bench_common  # pylint: disable=import-outside-toplevel

        yield bench_common
    finally:
        sys.path.remove(TOOLS)


def test_interleaved_visits_every_item_once_per_round_in_varying_order(bc):
    seen = list(bc.interleaved(["a", "b", "c", "d"], 6, seed=3))
    assert [r for r, _ in seen] == [r for r in range(6) for _ in range(4)]
    rounds = [tuple(x for r, x in seen if r == k) for k in range(6)]
    assert all(sorted(order) == ["a", "b", "c", "d"] for order in rounds)
    assert len(set(rounds)) > 1  # reshuffled


def test_summary_ms(bc):
    s = bc.summary_ms([0.001 * i for i in range(1, 12)])
    assert s == {"median_ms": pytest.approx(6.0), "p10_ms": pytest.approx(2.0), "p90_ms": pytest.approx(10.0), "n": 11}


def test_available_skips_with_the_reason(bc, capsys):
    class Ok(object):
        label = "ok label"

        @classmethod
        def unavailable_reason(cls):
            return None

    class Missing(Ok):
        @classmethod
        def unavailable_reason(cls):
            return "not installed"

    classes, skipped, labels = bc.available({"ok": Ok, "missing": Missing}, ["missing", "ok"])
    assert classes == [Ok] and skipped == {"missing": "not installed"} and labels == {"ok": "ok label"}
    assert "skipping missing: not installed" in capsys.readouterr().out


def test_bench_table_quick(tmp_path):
    out = tmp_path / "t.json"
    _run("bench_table.py", "--quick", "--dims", "8", "--backends", "dense", "ours", "--json", str(out))
    res = json.loads(out.read_text())["results"]["8"]
    assert set(res) == {"dense", "ours"}
    assert res["ours"]["size"] == 1 << 18 and res["ours"]["memory_bytes"] > 0
    assert res["ours"]["find"]["n"] == 10 and res["ours"]["find"]["mkeys_s"] > 0


def test_bench_table_memory_tiny(tmp_path):
    out = tmp_path / "m.json"
    _run(
        "bench_table_memory.py",
        "--keys",
        "4096",
        "--chunk",
        "1024",
        "--slots",
        "1",
        "--backends",
        "ours",
        "--json",
        str(out),
    )
    r = json.loads(out.read_text())["results"]["ours"]["1"]
    assert r["size"] == 4096 and r["op_bytes_per_key"] >= r["raw_bytes_per_key"]


def test_bench_ctr_quick_speed_and_quality(tmp_path):
    out = tmp_path / "c.json"
    _run(
        "bench_ctr_speed.py",
        "--quick",
        "--vocab",
        "5000",
        "--buckets",
        "4096",
        "--variants",
        "static",
        "ours",
        "--json",
        str(out),
    )
    res = json.loads(out.read_text())["results"]["adagrad"]
    assert res["ours"]["n"] == 10 and res["ours"]["global_step"] == 13 and res["ours"]["table_bytes"] > 0
    out = tmp_path / "q.json"
    _run(
        "bench_ctr_quality.py",
        "--quick",
        "--vocab",
        "5000",
        "--quality_seeds",
        "1",
        "--quality_budgets",
        "1024",
        "--quality_steps",
        "6",
        "--eval_batches",
        "1",
        "--json",
        str(out),
    )
    budget = json.loads(out.read_text())["results"]["budgets"]["rows_1024"]
    assert 0.0 <= budget["dynamic_auc_mean"] <= 1.0


def test_bench_compact_rows_and_small_model_tiny(tmp_path):
    out = tmp_path / "m.json"
    configs = ("fp32_adagrad", "bf16_rowwise", "frozen_fp32", "frozen_int8")
    _run(
        "bench_compact_rows.py",
        "memory",
        "--keys",
        "4096",
        "--chunk",
        "1024",
        "--configs",
        *configs,
        "--json",
        str(out),
    )
    res = json.loads(out.read_text())["results"]
    assert set(res) == set(configs) and all(r["size"] == 4096 for r in res.values())
    # bf16 rows + one float32 accumulator per row hold less than float32 rows + a float32 accumulator per column;
    # int8 serving rows less than float32 ones.
    assert res["bf16_rowwise"]["op_bytes_per_key"] < res["fp32_adagrad"]["op_bytes_per_key"] - 16 * 4
    assert res["frozen_int8"]["op_bytes_per_key"] < res["frozen_fp32"]["op_bytes_per_key"] - 16 * 2
    out = tmp_path / "s.json"
    _run(
        "bench_small_model.py",
        "--rounds",
        "2",
        "--steps",
        "5",
        "--variants",
        "ours_fp32",
        "ours_bf16_rowwise",
        "static",
        "--json",
        str(out),
    )
    res = json.loads(out.read_text())["results"]
    assert set(res) == {"ours_fp32", "ours_bf16_rowwise", "static"}
    assert all(len(r["rounds_s"]) == 2 and r["loss_last_50_steps"] > 0 for r in res.values())
    assert res["ours_bf16_rowwise"]["table_bytes"] < res["ours_fp32"]["table_bytes"]


def test_bench_mixed_precision_tiny():
    text = _run(
        "bench_mixed_precision.py",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--rounds",
        "1",
        "--batch",
        "8",
        "--width",
        "4",
        "--inputs",
        "4",
    )
    assert "| float32 |" in text and "| switching, in float32 branch |" in text


def test_bench_horovod_quick_two_ranks(tmp_path):
    out = tmp_path / "hvd.json"
    _run("bench_horovod.py", "--ranks", "2", "--quick", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    by = {r["variant"]: r for r in results}
    assert set(by) == {"tfext_model", "tfext_data", "hvd_static"}
    # Model-parallel: each rank holds part of the keys; the replica holds them all; all ranks hold every key once.
    assert by["tfext_model"]["table_bytes_per_rank"] < by["tfext_data"]["table_bytes_per_rank"]
    assert all(r["step_ms"] > 0 and r["payload_bytes_per_rank"] > 0 for r in results)


def test_bench_graph_passes_quick_losses_identical(tmp_path):
    """The CTR model's step with TensorFlow's op chain, one op per feature, and the graph passes: the tool runs,
    the passes fuse, and the three train on the same batches to identical losses."""
    out = tmp_path / "g.json"
    _run(
        "bench_graph_passes.py",
        "--quick",
        "--variants",
        "chain",
        "off",
        "all",
        "--steps",
        "3",
        "--warmup",
        "2",
        "--json",
        str(out),
    )
    data = json.loads(out.read_text())
    res = data["results"]
    assert data["meta"]["losses_identical"] is True
    assert res["chain"]["lookups_fused"] == 0 and res["off"]["lookups_fused"] == 0
    assert res["all"]["lookups_fused"] == 26 and res["all"]["applies_fused"] == 26
    assert all(res[v]["median_ms"] > 0 for v in res)


def test_bench_saver_build_tiny():
    start = time.monotonic()
    out = _run("bench_saver_build.py", "--tables", "2", "--repeats", "1")
    wall_s = time.monotonic() - start
    result = json.loads(out.strip().splitlines()[-1])
    # A time in seconds, and part of the tool's run (not milliseconds, not an absolute bound a busy machine could miss).
    assert result["tables"] == 2 and 0 < result["saver_build_s_median"] < wall_s, (result, wall_s)


def test_bench_compression_quick(tmp_path):
    """The compression-cost tool runs both implementations of every method and the 2-rank reductions (a small
    model, no busy processes)."""
    out = tmp_path / "compression.json"
    _run("bench_compression.py", "--quick", "--load", "0", "--collectives", "--json", str(out))
    results = json.loads(out.read_text())["results"]
    methods = [r for r in results if "method" in r]
    assert [r["method"] for r in methods] == ["fp16", "bf16", "topk1", "topk1_fp16"]
    assert all(r["tf_ms"] > 0 and r["fused_ms"] > 0 and r["load_processes"] == 0 for r in methods)
    collectives = [r["collective"] for r in results if "collective" in r]
    assert collectives == ["plain_fp32", "horovod_fp16", "fp16", "bf16", "topk1"], results
    assert all(r["ms"] > 0 for r in results if "collective" in r)
