"""The main job's dense-gradient flags: `python -m tensorflow_ext.examples.ctr --distributed ... --compression
--topk_ratio --node_size` reach DistributedOptimizer (2 ranks under horovodrun on loopback), are refused without
--distributed, and --untimed_steps leaves the warm-up out of the throughput."""

import math
import os
import re
import types

import pytest

from tensorflow_ext.examples.ctr import flags
from tensorflow_ext.examples.ctr import progress
from tensorflow_ext.horovod.tests.test_ctr_distributed import _summary
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

FLAGS = ["--quick", "--fresh", "--steps", "8", "--batch_size", "128", "--eval_steps", "1", "--log_every", "4"]


def _op_types(model_dir):
    """The op types of the training graph the Estimator wrote (graph.pbtxt)."""
    with open(os.path.join(model_dir, "graph.pbtxt")) as f:
        return set(re.findall(r'^\s*op: "(\w+)"', f.read(), re.M))


def test_fp16_topk_flags_reach_the_optimizer(tmp_path):
    model_dir = str(tmp_path / "m")
    code, text = horovodrun(
        2, "-m", "tensorflow_ext.examples.ctr", "--distributed", "data_parallel", "--model_dir", model_dir, *FLAGS,
        "--no_export", "--untimed_steps", "2", "--compression", "fp16", "--topk_ratio", "0.01",
    )  # fmt: skip
    assert code == 0, text[-6000:]
    s = _summary(text, "[0]<stdout>:")
    assert s["ranks"] == 2 and s["global_step"] == 8 and s["untimed_steps"] == 2
    assert (s["compression"], s["topk_ratio"], s["node_size"], s["compression_choices"]) == ("fp16", 0.01, None, None)
    assert math.isfinite(s["auc"]) and 0.0 <= s["auc"] <= 1.0 and math.isfinite(s["logloss"])
    assert s["examples_per_sec"] > 0
    # Rank 0's first line says how the dense gradients are reduced.
    assert "batch per rank, dense gradients: compression=fp16 topk_ratio=0.01)" in text, text[-4000:]
    # The training graph has Top-K's selection and scatter-add and the 16-bit pack; a run without the flags (the
    # plain allreduce) has none of them.
    ops = _op_types(model_dir)
    assert {"TfExtHvdTopKSelect", "TfExtHvdScatterAdd", "TfExtHvdPack", "TfExtHvdUnpack"} <= ops, sorted(ops)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--compression", "fp16"], "--compression describe how --distributed reduces gradients"),
        (["--topk_ratio", "0.1", "--node_size", "2"], "--topk_ratio, --node_size describe how --distributed"),
        (["--distributed", "data_parallel", "--topk_ratio", "0"], r"--topk_ratio must be in \(0, 1\], got 0.0"),
        (["--distributed", "data_parallel", "--topk_ratio", "1.5"], r"--topk_ratio must be in \(0, 1\], got 1.5"),
        (["--distributed", "data_parallel", "--node_size", "0"], "--node_size must be >= 1"),
        (["--distributed", "data_parallel", "--compression", "auto", "--node_size", "2"], "not with --node_size"),
        (["--distributed", "data_parallel", "--compression", "gzip"], "invalid choice: 'gzip'"),
        (["--untimed_steps", "0"], "--untimed_steps must be >= 1"),
    ],
)
def test_refused_flags(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        flags.parse_args(argv)
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_defaults_leave_the_library_settings():
    a = flags.parse_args(["--distributed", "model_parallel"])
    assert (a.compression, a.topk_ratio, a.node_size, a.untimed_steps) == (None, None, None, 1)


def test_untimed_steps_are_left_out_of_the_throughput(monkeypatch):
    # When each step ends: the second step takes 10 s (warm-up), then 1 s per step.
    clock = iter([10.0, 20.0, 21.0, 22.0, 23.0, 24.0])
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    hook = progress.ProgressHook(None, None, None, None, 100, 64, show=False, untimed_steps=2)
    hook.begin()
    results = types.SimpleNamespace(results={"loss": 0.5, "step": 0})
    for i in range(6):
        hook.after_run(None, results)
        # The clock starts at the end of the second step: no throughput before a timed step.
        assert (hook.steps_per_sec() is None) == (i < 2)
    assert hook.steps_per_sec() == pytest.approx(1.0)  # steps 3-6 over the 4 s since step 2 ended
    default = progress.ProgressHook(None, None, None, None, 100, 64, show=False)
    clock = iter([10.0, 20.0, 21.0])
    default.begin()
    for _ in range(3):
        default.after_run(None, results)
    assert default.steps_per_sec() == pytest.approx(2 / 11.0)  # only the first step is warm-up
