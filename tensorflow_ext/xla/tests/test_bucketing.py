"""compile_bucketed: the same results as plain TF, gradients only from real examples, one compilation per bucket."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

tf.compat.v1.disable_v2_behavior()


def _model(compiled, buckets=(8, 32, 128)):
    """A dynamic embedding lookup (not compiled) feeding a 2-layer MLP (compiled or not); returns fetches."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    emb = tf_ext.get_dynamic_embedding("e", 4, initializer=tf.compat.v1.random_normal_initializer(0, 0.3, seed=1))
    x = tf.reshape(tf_ext.embedding_lookup(emb, ids), [-1, 12])

    def mlp(x):
        h = tf.compat.v1.layers.dense(
            x, 16, tf.nn.relu, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2), name="h"
        )
        return tf.squeeze(
            tf.compat.v1.layers.dense(h, 1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=3)), 1
        )

    logits = tf_ext.xla.compile_bucketed(mlp, [x], buckets=buckets) if compiled else mlp(x)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    return ids, labels, logits, loss, train, emb


def _train(compiled, sizes):
    rng = np.random.RandomState(0)
    with tf.Graph().as_default():
        ids, labels, logits, loss, train, emb = _model(compiled)
        out = []
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for n in sizes:
                feed = {ids: rng.randint(0, 50, size=[n, 3]), labels: rng.randint(0, 2, size=[n]).astype(np.float32)}
                lg, l, _ = sess.run([logits, loss, train], feed)
                assert lg.shape == (n,)
                out.append(l)
            e = sess.run(emb.export(with_slots=True))
            kernel = sess.run(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "h/kernel")[0])
    return np.array(out), dict(zip(e.keys.tolist(), e.values)), kernel


def test_trains_like_plain_tf_on_ragged_batches():
    sizes = [5, 8, 9, 31, 100, 3, 129, 7]  # inside buckets, on their edges, and past the last one
    got_losses, got_rows, got_kernel = _train(True, sizes)
    want_losses, want_rows, want_kernel = _train(False, sizes)
    np.testing.assert_allclose(got_losses, want_losses, rtol=2e-5, atol=1e-6)
    assert sorted(got_rows) == sorted(want_rows)
    for k in want_rows:
        np.testing.assert_allclose(got_rows[k], want_rows[k], rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(got_kernel, want_kernel, rtol=2e-5, atol=1e-6)


COUNT = textwrap.dedent(
    """
    import sys, numpy as np, tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext
    bucketed = sys.argv[1] == "bucketed"
    x = tf.compat.v1.placeholder(tf.float32, [None, 32])
    w = tf.compat.v1.get_variable("w", [32, 64], use_resource=True)
    def mlp(x):
        return tf.reduce_sum(tf.nn.relu(tf.matmul(x, w)), axis=1)
    if bucketed:
        y = tf_ext.xla.compile_bucketed(mlp, [x], buckets=[64, 128, 256, 512])
    else:
        with tf.xla.experimental.jit_scope():
            y = mlp(x)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(tf.reduce_mean(y))
    hook = tf_ext.xla.CompileStatsHook()
    sizes = np.random.RandomState(0).randint(1, 500, size=60)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as sess:
        for n in sizes:
            sess.run(train, {x: np.ones([n, 32], np.float32)})
    print("HOOK", sum(hook.compiles.values()), len(set(sizes)))
    """
)


def _compiles(mode):
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        TF_CPP_MIN_LOG_LEVEL="0",
        TF_CPP_VMODULE="device_compiler=1",
        TF_XLA_FLAGS="--tf_xla_enable_lazy_compilation=false",
    )
    r = subprocess.run([sys.executable, "-c", COUNT, mode], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    # TF's own count: one log line per compilation request; real compilations take more than a millisecond.
    times = re.findall(r"Compilation of XLA executable time: ([\d.]+) (us|ms|s)\b", r.stderr)
    compiled = sum(1 for t, unit in times if unit != "us" and float(t) > 0)
    hook_count, distinct = map(int, re.search(r"HOOK (\d+) (\d+)", r.stdout).groups())
    return compiled, hook_count, distinct


def test_one_compilation_per_bucket_where_plain_xla_compiles_per_size():
    compiled, hook_count, distinct = _compiles("bucketed")
    assert hook_count == 4  # sizes 1..499 fall into the 4 buckets
    assert 1 <= compiled <= 4 * 2, compiled  # at most forward and backward per bucket
    plain, _, _ = _compiles("plain")
    assert plain > 2 * compiled, (plain, compiled, distinct)


def test_switch_off_and_bad_arguments():
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        with pytest.raises(ValueError, match="strictly increasing"):
            tf_ext.xla.compile_bucketed(lambda t: t, [x], buckets=[8, 4])
        with pytest.raises(ValueError, match="positive ints"):
            tf_ext.xla.compile_bucketed(lambda t: t, [x], buckets=[0, 4])
        with pytest.raises(ValueError, match="needs at least one input"):
            tf_ext.xla.compile_bucketed(lambda: x, [])
        with pytest.raises(ValueError, match="batch as its first dimension"):
            tf_ext.xla.compile_bucketed(lambda t: tf.reduce_sum(t), [x])
    os.environ["TF_EXT_XLA"] = "0"
    try:
        with tf.Graph().as_default() as g:
            x = tf.compat.v1.placeholder(tf.float32, [None, 2])
            tf_ext.xla.compile_bucketed(lambda t: t * 2.0, [x])
            assert not any(op.get_attr("_XlaCompile") for op in g.get_operations() if "_XlaCompile" in op.node_def.attr)
            assert not g.get_collection(tf_ext.xla.BUCKETS_COLLECTION)
    finally:
        del os.environ["TF_EXT_XLA"]
    os.environ["TF_EXT_XLA_BUCKETS"] = "4,x"
    try:
        with pytest.raises(ValueError, match="TF_EXT_XLA_BUCKETS"):
            tf_ext.xla.default_buckets()
    finally:
        del os.environ["TF_EXT_XLA_BUCKETS"]
