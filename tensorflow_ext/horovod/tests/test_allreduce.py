"""tensorflow_ext.horovod.allreduce: compression, 2D allreduce and Top-K under `horovodrun --gloo -np 4`, the four
local ranks treated as 2 nodes x 2 (see allreduce_worker.py for the checks of each launch)."""

import json
import os
import subprocess
import sys
import textwrap

from tensorflow_ext.horovod.tests.test_horovod import HERE
from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

WORKER = os.path.join(HERE, "allreduce_worker.py")


def test_2d_compression_topk_and_checkpoint_restart(tmp_path):
    """One job checks everything that needs 4 ranks and saves per-rank checkpoints; a fresh job restores them."""
    code, out = horovodrun(4, WORKER, "main", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in range(4):
        for what in ("2D", "COMPRESSION", "TOPK RATIO 1", "TOPK RESIDUAL", "TOPK FP16"):
            assert "RANK %d %s OK" % (r, what) in out, (what, out[-8000:])
        assert "RANK %d ERROR node_size" % r in out, out[-8000:]
    code, out = horovodrun(4, WORKER, "restore", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in range(4):
        assert "RANK %d RESTORE OK" % r in out, out[-8000:]
        assert "RANK %d ERROR unregistered" % r in out, out[-8000:]


def test_bad_settings_are_named():
    """Arguments and environment variables out of range fail when the optimizer is built, naming the setting."""
    code = textwrap.dedent(
        """
        import os
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        def err(f, *a, env=None, **k):
            os.environ.update(env or {})
            try:
                f(*a, **k)
            except (TypeError, ValueError) as e:
                print(type(e).__name__, e)
            else:
                print("NO ERROR")
            for name in env or {}:
                del os.environ[name]
        D = tfe_hvd.DistributedOptimizer
        err(D, opt, topk_ratio=0)
        err(D, opt, topk_ratio=1.5)
        err(D, opt, topk_ratio="x")
        err(D, opt, env={"TF_EXT_HVD_TOPK_RATIO": "1.5"})
        err(D, opt, compression="zip")
        err(D, opt, env={"TF_EXT_HVD_COMPRESSION": "int8"})
        err(D, opt, fusion_bytes=-1)
        err(D, opt, env={"TF_EXT_HVD_NODE_SIZE": "two"})
        err(D, opt, topk_min_elements=0)
        err(tfe_hvd.init, node_size=3, env={"HOROVOD_SIZE": "4"})
        os.environ.pop("HOROVOD_SIZE", None)
        tfe_hvd.init()
        print(D(opt).allreduce_config.accelerated, D(opt, compression=tfe_hvd.Compression.fp16).allreduce_config)
        os.environ["TF_EXT_HVD_TOPK_RATIO"] = "0.01"
        os.environ["TF_EXT_HVD_FUSION_BYTES"] = "1024"
        print(D(opt, topk_ratio=0.5, fusion_bytes=7).allreduce_config)
    """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    out = r.stdout.splitlines()
    assert out[0] == (
        "ValueError topk_ratio must be in (0, 1] (the fraction of each gradient's entries that every rank sends), "
        "got 0.0"
    ), out[0]
    assert out[1].startswith("ValueError topk_ratio must be in (0, 1]") and out[1].endswith("got 1.5"), out[1]
    assert out[2] == "ValueError topk_ratio must be a number in (0, 1] or 'none', got 'x'", out[2]
    assert out[3].startswith("ValueError TF_EXT_HVD_TOPK_RATIO must be in (0, 1]"), out[3]
    assert out[4].startswith("ValueError compression must be tensorflow_ext.horovod.Compression.none"), out[4]
    assert out[5] == "ValueError TF_EXT_HVD_COMPRESSION must be one of none, fp16, bf16, auto, got 'int8'", out[5]
    assert out[6] == "ValueError fusion_bytes must be an integer >= 0, got -1", out[6]
    assert out[7] == "ValueError TF_EXT_HVD_NODE_SIZE must be an integer >= 1, got 'two'", out[7]
    assert out[8] == "ValueError topk_min_elements must be an integer >= 1, got 0", out[8]
    assert out[9].startswith("ValueError init: node_size=3 does not divide the number of ranks 4"), out[9]
    assert out[10] == (
        "False Config(compression=fp16, hierarchical=False, node_size=None, topk_ratio=None, "
        "topk_min_elements=1024, topk_warmup_steps=0, topk_momentum=0.0, topk_clip_norm=None, "
        "topk_ratio_warmup_steps=0, topk_flush_steps=0, fusion_bytes=67108864, intra_node=auto)"
    ), out[10]
    assert out[11] == (
        "Config(compression=none, hierarchical=False, node_size=None, topk_ratio=0.01, topk_min_elements=1024, "
        "topk_warmup_steps=0, topk_momentum=0.0, topk_clip_norm=None, topk_ratio_warmup_steps=0, "
        "topk_flush_steps=0, fusion_bytes=1024, intra_node=auto)"
    ), out[11]


def test_malformed_launch_variables_are_named():
    """A rank-layout variable that is not an int: the error names it and its value (not "start with horovodrun").
    One process for the cases: init checks the variables before it starts Horovod."""
    cases = [
        ({"HOROVOD_SIZE": "abc"}, None),
        ({"HOROVOD_SIZE": "abc"}, 2),
        ({"HOROVOD_SIZE": "2", "HOROVOD_RANK": "-1"}, 2),
    ]
    code = textwrap.dedent(
        """
        import json
        import os
        import sys
        import tensorflow_ext.horovod as tfe_hvd
        for env, node_size in json.loads(sys.argv[1]):
            for name in ("HOROVOD_SIZE", "HOROVOD_RANK"):
                os.environ.pop(name, None)
            os.environ.update(env)
            try:
                tfe_hvd.init(node_size=node_size)
            except ValueError as e:
                print("ValueError", e)
            else:
                print("NO ERROR")
        """
    )
    env = {k: v for k, v in _env().items() if k not in ("HOROVOD_SIZE", "HOROVOD_RANK")}
    r = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cases)], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    lines = r.stdout.splitlines()
    assert len(lines) == len(cases), r.stdout
    for (case_env, _), line in zip(cases, lines):
        name, value = list(case_env.items())[-1]
        assert line.startswith("ValueError environment variable %s=%r is not an int" % (name, value)), line
        assert "start the job with horovodrun" not in line, line


COMPRESSION_WORKER = os.path.join(HERE, "compression_worker.py")


def test_fused_kernels_reduce_like_the_tensorflow_chain_on_2_ranks():
    """DenseReducer (pack, Horovod, unpack; Top-K select, allgather, scatter-add) gives the bits of the pure
    TensorFlow + Horovod chain it replaced: none/fp16/bf16, Average with and without a predivide factor, Sum, fused
    and unfused buckets, Top-K residuals over 3 steps."""
    code, out = horovodrun(2, COMPRESSION_WORKER, "reference")
    assert code == 0, out[-8000:]
    for r in range(2):
        assert "RANK %d REFERENCE OK" % r in out, out[-8000:]


def test_ranks_with_different_compression_settings_are_refused_before_the_first_exchange():
    """Rank 1 alone gets a TF_EXT_HVD_* override: the first step fails on both ranks naming the setting and both
    values, with the variables untouched; also when only the gradients are run. Equal overrides train alike."""
    code, out = horovodrun(2, COMPRESSION_WORKER, "settings")
    assert code == 0, out[-8000:]
    prefix = "DistributedOptimizer 'DistributedGradientDescentOptimizer': "
    expected = {
        "compression": ["compression differs across ranks: rank 0: none, rank 1: fp16"],
        "compression kinds": ["compression differs across ranks: rank 0: bf16, rank 1: fp16"],
        "topk_ratio": ["topk_ratio differs across ranks: rank 0: 0.01, rank 1: 0.02"],
        "hierarchical": [
            "hierarchical differs across ranks: rank 0: False, rank 1: True",
            "node_size differs across ranks: rank 0: None, rank 1: 2",
        ],
        "node_size": ["node_size differs across ranks: rank 0: 2, rank 1: 1"],
        "fusion_bytes": ["fusion_bytes differs across ranks: rank 0: 67108864, rank 1: 1024"],
        "gradients only": ["topk_ratio differs across ranks: rank 0: None, rank 1: 0.5"],
    }
    for r in range(2):
        for case, parts in expected.items():
            lines = [line for line in out.splitlines() if "RANK %d CASE %s REFUSED:" % (r, case) in line]
            assert len(lines) == 1, (r, case, out[-8000:])
            for part in parts:
                assert prefix + part in lines[0], (r, case, part, lines[0])
    digests = [line.rsplit(" ", 1)[1] for line in out.splitlines() if "CASE same TRAINED" in line]
    assert len(digests) == 2 and digests[0] == digests[1], out[-8000:]


def test_ranks_started_with_different_node_sizes_are_refused_at_init():
    """TF_EXT_HVD_NODE_SIZE on one rank of 4: its process sets differ from the others'. Horovod refuses them on one
    rank, which names its 2D settings and the fix; no rank starts training (none hangs)."""
    code, out = horovodrun(4, COMPRESSION_WORKER, "init")
    assert code != 0, out[-8000:]
    assert "STARTED" not in out, out[-8000:]
    assert "init: Horovod did not start" in out, out[-8000:]
    assert "start every rank with the same node_size, TF_EXT_HVD_NODE_SIZE and TF_EXT_HVD_HIERARCHICAL" in out
