"""tensorflow_ext.horovod.wire16: the 16-bit reductions (fp16 by Horovod's ring or as bytes, bf16 as bytes) against
numpy on 2 and 4 local ranks (see wire16_worker.py), and the setting that picks the fp16 way."""

import os

import pytest

from tensorflow_ext.horovod.tests.test_helpers import run
from tensorflow_ext.horovod.tests.test_horovod import HERE
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

WORKER = os.path.join(HERE, "wire16_worker.py")


@pytest.mark.parametrize("ranks", [2, 4])
def test_16bit_reductions_match_numpy(ranks):
    code, out = horovodrun(ranks, WORKER, "check")
    assert code == 0, out[-8000:]
    for r in range(ranks):
        for what in ("VS NUMPY", "SPECIAL"):
            assert "RANK %d %s OK" % (r, what) in out, (what, out[-8000:])


def test_ranks_with_different_fp16_ways_are_refused_before_the_exchange():
    code, out = horovodrun(2, WORKER, "settings")
    assert code == 0, out[-8000:]
    for r in range(2):
        refused = [line for line in out.splitlines() if "RANK %d CASE mismatch REFUSED" % r in line]
        assert refused, out[-8000:]
        assert "fp16 reduction differs across ranks: rank 0: ring, rank 1: bytes" in refused[0], refused[0]
        assert "RANK %d CASE same TRAINED" % r in out, out[-8000:]


def test_fp16_way_setting():
    out = run(
        """
        import os
        import tensorflow as tf
        from tensorflow_ext.horovod import wire16
        print(wire16.fp16_reduction() == wire16.default_fp16_reduction())
        os.environ["TF_EXT_HVD_FP16_REDUCTION"] = " Ring "
        print(wire16.fp16_reduction(), wire16.reduced_as_bytes(tf.float16, tf.float32))
        print(wire16.reduced_as_bytes(tf.bfloat16, tf.float32), wire16.reduced_as_bytes(tf.bfloat16, tf.int32))
        print(wire16.reduced_as_bytes(None, tf.float32))
        print([wire16.gloo_sums_fp16_vectorised(v) for v in
               ("0.28.1", "0.28.1+tfext.f16c", "0.28.1+tfext.f16c.0a1b2c3d4e5f", "0.28.1+tfext.f16cx", "0.28.1+local")])
        os.environ["TF_EXT_HVD_FP16_REDUCTION"] = "bytes"
        print(wire16.reduced_as_bytes(tf.float16, tf.float32))
        os.environ["TF_EXT_HVD_FP16_REDUCTION"] = "tree"
        try:
            wire16.fp16_reduction()
        except ValueError as e:
            print(e)
    """
    ).splitlines()
    assert out == [
        "True",
        "ring False",
        "True False",
        "False",
        "[False, True, True, False, False]",
        "True",
        "environment variable TF_EXT_HVD_FP16_REDUCTION='tree': expected one of ring, bytes",
    ], out
