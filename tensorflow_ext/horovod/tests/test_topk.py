"""tensorflow_ext.horovod.topk: Top-K's momentum correction, local clipping, ratio warm-up and flushes against a numpy
simulation of 2 ranks, its state across a checkpoint, and the steps a mixed-precision optimizer skips (see
topk_worker.py for the checks)."""

import os
import subprocess
import sys
import textwrap

from tensorflow_ext.horovod.tests.test_horovod import HERE
from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

WORKER = os.path.join(HERE, "topk_worker.py")


def test_update_rules_match_numpy_and_survive_a_restore(tmp_path):
    code, out = horovodrun(2, WORKER, "reference", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in range(2):
        for case in ("off", "off_explicit", "momentum", "clip", "ratio_warmup", "all"):
            assert "RANK %d CASE %s OK" % (r, case) in out, (case, out[-8000:])
        assert "RANK %d RESTORE OK" % r in out, out[-8000:]


def test_a_skipped_mixed_precision_step_keeps_the_state():
    code, out = horovodrun(2, WORKER, "skip")
    assert code == 0, out[-8000:]
    for r in range(2):
        assert "RANK %d SKIP OK" % r in out, out[-8000:]
        # The negative control: without the guard, the skipped step changes all 3 residuals and 3 velocities.
        assert "RANK %d UNGUARDED CHANGED 6" % r in out, out[-8000:]


def test_settings_and_their_environment_overrides():
    code = textwrap.dedent(
        """
        import os
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import topk
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        D = tfe_hvd.DistributedOptimizer

        def err(*a, env=None, **k):
            os.environ.update(env or {})
            try:
                D(opt, *a, **k)
            except ValueError as e:
                print("ValueError", e)
            else:
                print("NO ERROR")
            for name in env or {}:
                del os.environ[name]

        err(topk_momentum=1.0)
        err(topk_momentum=-0.1)
        err(env={"TF_EXT_HVD_TOPK_MOMENTUM": "fast"})
        err(topk_clip_norm=0)
        err(env={"TF_EXT_HVD_TOPK_CLIP_NORM": "-1"})
        err(topk_ratio_warmup_steps=-1)
        err(env={"TF_EXT_HVD_TOPK_FLUSH_STEPS": "x"})
        tfe_hvd.init()
        c = D(opt, topk_ratio=0.01, topk_momentum=0.9, topk_clip_norm=2, topk_ratio_warmup_steps=30).allreduce_config
        print(c.topk_momentum, c.topk_clip_norm, c.topk_ratio_warmup_steps, c.topk_flush_steps)
        os.environ.update(TF_EXT_HVD_TOPK_MOMENTUM="0.5", TF_EXT_HVD_TOPK_CLIP_NORM="none",
                          TF_EXT_HVD_TOPK_RATIO_WARMUP_STEPS="0", TF_EXT_HVD_TOPK_FLUSH_STEPS="50")
        c = D(opt, topk_ratio=0.01, topk_momentum=0.9, topk_clip_norm=2, topk_ratio_warmup_steps=30).allreduce_config
        print(c.topk_momentum, c.topk_clip_norm, c.topk_ratio_warmup_steps, c.topk_flush_steps)
        print(topk.ratio_schedule(0.01, 10), topk.ratio_schedule(0.01, 0), topk.ratio_schedule(0.5, 10))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    out = r.stdout.splitlines()
    assert out[0] == "ValueError topk_momentum must be a number in [0, 1), got 1.0", out[0]
    assert out[1] == "ValueError topk_momentum must be a number in [0, 1), got -0.1", out[1]
    assert out[2] == "ValueError TF_EXT_HVD_TOPK_MOMENTUM must be a number in [0, 1), got 'fast'", out[2]
    assert out[3] == "ValueError topk_clip_norm must be a number > 0 or None, got 0", out[3]
    assert out[4] == "ValueError TF_EXT_HVD_TOPK_CLIP_NORM must be a number > 0 or None, got '-1'", out[4]
    assert out[5] == "ValueError topk_ratio_warmup_steps must be an integer >= 0, got -1", out[5]
    assert out[6] == "ValueError TF_EXT_HVD_TOPK_FLUSH_STEPS must be an integer >= 0, got 'x'", out[6]
    assert out[7] == "0.9 2.0 30 0", out[7]
    assert out[8] == "0.5 None 0 50", out[8]
    assert out[9] == "[0.25, 0.0625, 0.015625, 0.01] [0.01] [0.5]", out[9]
