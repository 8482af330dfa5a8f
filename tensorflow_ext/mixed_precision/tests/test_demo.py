"""The demo's reduced run: JSON shape, half loses, auto within tolerance, switch
record, health check and summaries."""

import glob
import json
import os

import tensorflow as tf

from tensorflow_ext.mixed_precision import demo

# Reduced run (300 steps): auto within 15% of float32 (the full 1000-step run
# is within 5%; see docs/mixed_precision.md).
TOLERANCE = 0.15


def _tags(directory):
    tags = set()
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        for e in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in e.summary.value)
    return tags


def test_demo_reduced_json(capsys, tmp_path):
    # In-process (same code path as `python -m tensorflow_ext.mixed_precision.demo
    # --reduced`, without a second TensorFlow import on a busy machine). The
    # dashed --half-dtype is the flag's earlier spelling, still accepted.
    model_dir = str(tmp_path / "model")
    demo.main(["--reduced", "--half-dtype", "float16", "--model_dir", model_dir, "--log_every", "50"])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) == {"metric", "higher_is_better", "fp32", "half", "auto", "half_fraction", "switches"}
    assert result["metric"] == "test_mse" and result["higher_is_better"] is False
    assert result["auto"] <= result["fp32"] * (1 + TOLERANCE)
    assert result["half"] > 10 * result["fp32"]  # pure float16 never learns
    assert result["half_fraction"] > 0.5 and result["switches"] >= 1
    assert lines[0] == "model_dir: %s" % model_dir

    # Progress: step, precision, loss scale and loss every 50 steps of each run.
    progress = [l for l in lines if l.startswith("auto ") and "step=" in l]
    assert len(progress) == 6
    assert all("precision=" in l and "loss_scale=" in l and "loss=" in l for l in progress)

    # The switch record: printed when it happens and kept in results.json.
    with open(os.path.join(model_dir, "results.json")) as f:
        runs = json.load(f)["runs"]
    assert runs["auto"]["stopped"] is None and runs["float32"]["switch_record"] == []
    record = runs["auto"]["switch_record"]
    assert len(record) == result["switches"]
    assert record[0]["from"] == "float16" and record[0]["to"] == "float32"
    assert record[0]["reason"] == "overflow" and record[0]["step"] > 0
    assert record[1] == {
        "step": record[0]["step"] + 100,
        "from": "float32",
        "to": "float16",
        "reason": "stable",
    }  # after the 100-step dwell
    for r in record:
        assert (
            "auto    mixed_precision: switch after step %d: %s -> %s (%s)"
            % (r["step"], r["from"], r["to"], r["reason"])
        ) in lines

    # The health check stops pure float16, which skips every step.
    half = runs["half"]
    assert half["applied_steps"] == 0 and half["steps_run"] == demo.MAX_SKIPPED_STEPS
    assert "no training step applied in the last 50 steps" in half["stopped"]
    assert any(l.startswith("half    stopped by the health check") for l in lines)
    assert runs["auto"]["steps_run"] == runs["float32"]["steps_run"] == demo.REDUCED_STEPS

    # TensorBoard summaries of every run.
    expected = {
        "loss",
        "mixed_precision/precision",
        "mixed_precision/loss_scale",
        "mixed_precision/num_switches",
        "mixed_precision/half_fraction",
        "mixed_precision/applied_step_ratio",
        "mixed_precision/skipped_streak",
    }
    for mode in demo.MODES:
        assert expected <= _tags(os.path.join(model_dir, mode)), mode


def test_demo_rejects_bad_flags(capsys):
    import pytest

    with pytest.raises(SystemExit):
        demo.main(["--batch_size", "0"])
    assert "--batch_size must be >= 1" in capsys.readouterr().err
