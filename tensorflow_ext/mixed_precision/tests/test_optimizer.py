"""Optimizer wrapper: loss scaling (dense and IndexedSlices), skipped steps."""

import numpy as np
import tensorflow as tf

from tensorflow_ext import mixed_precision as mp


def _embedding_model(table):
    def fn(ids, x):
        emb = mp.cast_compute(tf.nn.embedding_lookup(table, ids))  # float32 table
        w = tf.compat.v1.get_variable("w", [3, 1])
        return tf.reduce_sum(tf.matmul(emb * x, w))

    return fn


def test_sparse_and_dense_gradients_unscaled_in_both_precisions():
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(0)
        amp = mp.MixedPrecision(loss_scale=mp.LossScaleConfig(initial_scale=1024.0))
        table = tf.compat.v1.get_variable("table", [6, 3], use_resource=True)  # stays float32
        ids = tf.constant([0, 3, 3, 5])
        x = tf.constant(np.full((4, 3), 0.5, np.float32))
        loss = amp.build(_embedding_model(table), ids, x)
        opt = amp.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        gvs = opt.compute_gradients(loss)
        by_name = {v.op.name: gr for gr, v in gvs}
        assert isinstance(by_name["table"], tf.IndexedSlices)
        assert by_name["table"].values.dtype == tf.float32
        ref = tf.gradients(loss, [table, tf.compat.v1.trainable_variables()[1]])
        ref[0] = tf.convert_to_tensor(ref[0])
        dense = [tf.convert_to_tensor(by_name["table"]), by_name["w"]]
        set_full = amp.policy.variables["precision"].assign(mp.FULL)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            half_scale = sess.run(amp.effective_loss_scale)
            got_half, want_half = sess.run([dense, ref])
            sess.run(set_full)
            assert sess.run(amp.effective_loss_scale) == 1.0
            got_full, want_full = sess.run([dense, ref])
    assert half_scale == 1024.0
    for got, want in ((got_half, want_half), (got_full, want_full)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=1e-3)
    np.testing.assert_allclose(got_half[0], got_full[0], rtol=2e-3, atol=1e-3)


def test_non_finite_step_is_skipped_without_global_step():
    g = tf.Graph()
    with g.as_default():
        amp = mp.MixedPrecision(mode="half", loss_scale=mp.LossScaleConfig(initial_scale=256.0, hysteresis=1))
        poison = tf.compat.v1.placeholder(tf.float32, [])
        w0 = np.array([[1.0], [2.0]], np.float32)

        def fn(x):
            w = tf.compat.v1.get_variable("w", initializer=w0)
            return tf.reduce_sum(tf.matmul(x, w)) * mp.cast_compute(poison)

        loss = amp.build(fn, tf.ones([1, 2]))
        gs = tf.compat.v1.train.get_or_create_global_step()
        opt = amp.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(0.1))
        train = opt.minimize(loss, global_step=gs)
        w = tf.compat.v1.trainable_variables()[0]
        m = opt.get_slot(w, "m")
        assert opt.get_slot_names() == ["m", "v"]
        metrics = amp.metrics()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {poison: 1.0})
            assert sess.run(gs) == 1
            w1, m1 = sess.run([w, m])
            assert not np.allclose(w1, w0)
            # Gradient 1e3*256 overflows float16 in the backward pass: skipped,
            # scale halves, Adam's slots and global_step untouched.
            sess.run(train, {poison: 1000.0})
            assert sess.run(gs) == 1
            np.testing.assert_array_equal(sess.run(w), w1)
            np.testing.assert_array_equal(sess.run(m), m1)
            assert sess.run(amp.loss_scale.read()) == 128.0
            # Forward overflow (loss inf): skipped, scale unchanged.
            sess.run(train, {poison: np.inf})
            assert sess.run(gs) == 1 and sess.run(amp.loss_scale.read()) == 128.0
            sess.run(train, {poison: 1.0})
            assert sess.run(gs) == 2
            mv = sess.run(metrics)
    assert mv["total_steps"] == 4 and mv["half_fraction"] == 1.0 and mv["num_switches"] == 0


def test_rejects_non_v1_optimizer():
    import pytest

    with tf.Graph().as_default():
        amp = mp.MixedPrecision(mode="float32")
        with pytest.raises(TypeError):
            amp.wrap_optimizer(object())
        with pytest.raises(ValueError):
            mp.MixedPrecision(mode="fp8")
