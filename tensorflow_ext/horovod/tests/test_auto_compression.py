"""compression="auto" under `horovodrun --gloo -np 2`: every rank makes the same choice, the results are the chosen
method's bit for bit, a slow link (the measured bandwidth scaled down) picks a 16-bit method or Top-K, a fast one
plain, and a restarted job measures again and restores the Top-K residuals whatever it chooses."""

import os
import re
import subprocess
import sys
import textwrap

from tensorflow_ext.horovod.tests.test_horovod import HERE
from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

WORKER = os.path.join(HERE, "auto_compression_worker.py")


def _choices(out, ranks):
    """{case: [rank 0's choice line, rank 1's, ...]}."""
    found = {}
    for r in range(ranks):
        for case, line in re.findall(r"RANK %d CHOICE (\w+) (.*)" % r, out):
            found.setdefault(case, []).append(line)
    return found


def test_auto_picks_by_the_link_and_ranks_agree(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_EXT_HVD_AUTO_LINK_SCALE", "0.001")
    code, out = horovodrun(2, WORKER, "slow", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in range(2):
        for what in ("DENSE", "TOPK"):
            assert "RANK %d %s OK" % (r, what) in out, (what, out[-8000:])
    choices = _choices(out, 2)
    assert set(choices) == {"dense", "topk"}, choices
    for case, lines in choices.items():
        assert len(lines) == 2 and lines[0] == lines[1], (case, lines)
    assert "compression auto: buffer" in out and "chose topk" in out, out[-8000:]

    # A fresh job on a link 1000x faster: plain everywhere, and the Top-K run's residuals restored and sent.
    monkeypatch.setenv("TF_EXT_HVD_AUTO_LINK_SCALE", "1000")
    code, out = horovodrun(2, WORKER, "fast", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in range(2):
        assert "RANK %d FAST OK" % r in out, out[-8000:]
        assert "RANK %d RESTORE OK" % r in out, out[-8000:]
    choices = _choices(out, 2)
    assert len(choices["fast"]) == 2 and choices["fast"][0] == choices["fast"][1], choices


def test_ranks_with_and_without_auto_are_refused_naming_it(tmp_path):
    """Rank 1 alone overrides compression to none: rank 0 (measuring) and rank 1 (at its first step) both fail
    naming the difference instead of waiting for each other's collectives."""
    code, out = horovodrun(2, WORKER, "mismatch", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in range(2):
        assert "RANK %d REFUSED compression differs across ranks: rank 0: auto, rank 1: none" % r in out, out[-8000:]


def test_auto_settings_are_checked():
    """auto with the 2D allreduce and a bad link scale are refused, naming the setting."""
    code = textwrap.dedent(
        """
        import os
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import auto_compression
        tfe_hvd.init()
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        D = tfe_hvd.DistributedOptimizer
        try:
            D(opt, compression="auto", hierarchical=True)
        except ValueError as e:
            print("ValueError", e)
        print(D(opt, compression=tfe_hvd.Compression.auto).allreduce_config.compression.name)
        os.environ["TF_EXT_HVD_COMPRESSION"] = "auto"
        print(D(opt).allreduce_config.accelerated)
        os.environ["TF_EXT_HVD_AUTO_LINK_SCALE"] = "-2"
        try:
            auto_compression._link_scale()
        except ValueError as e:
            print("ValueError", e)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    out = r.stdout.splitlines()
    assert out[0].startswith("ValueError compression='auto' chooses among the flat reductions"), out[0]
    assert out[1] == "auto" and out[2] == "True", out
    assert out[3] == (
        "ValueError TF_EXT_HVD_AUTO_LINK_SCALE must be a positive number (the factor applied to the measured link "
        "bandwidth), got '-2'"
    ), out[3]
