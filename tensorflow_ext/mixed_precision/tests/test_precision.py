"""Both branches build from one model fn, share float32 masters, and have
correct gradients (compared with float32 on a task where half is exact enough)."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext import mixed_precision as mp


# Dyadic weights and small-integer inputs: every product and sum below is
# exactly representable in float16 and bfloat16, so "half is exact enough".
_RNG = np.random.RandomState(1)
_K = _RNG.choice([-0.5, 0.0, 0.5], size=(4, 8)).astype(np.float32)
_W = _RNG.choice([-0.5, 0.5], size=(8, 1)).astype(np.float32)


def model(x):
    h = tf.compat.v1.layers.dense(
        x, 8, activation=tf.nn.relu, name="h", kernel_initializer=tf.compat.v1.constant_initializer(_K)
    )
    w = tf.compat.v1.get_variable("w", initializer=_W)
    assert h.dtype == mp.compute_dtype() and w.dtype.base_dtype == mp.compute_dtype()
    return tf.matmul(h, w) * tf.constant(0.5, mp.compute_dtype())


@pytest.mark.parametrize("half", [tf.float16, tf.bfloat16])
def test_branches_share_masters_and_gradients_match_float32(half):
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(0)
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        flag = tf.compat.v1.placeholder(tf.bool, [])
        y = mp.build_switched(flag, half, model, x)
        assert y.dtype == tf.float32
        variables = tf.compat.v1.trainable_variables()
        assert sorted(v.op.name for v in variables) == ["h/bias", "h/kernel", "w"]
        assert all(v.dtype.base_dtype == tf.float32 for v in variables)
        loss = tf.reduce_mean(tf.square(y - 1.0))
        grads = tf.gradients(loss, variables)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            xv = np.random.RandomState(0).randint(-1, 2, size=(16, 4)).astype(np.float32)
            full = sess.run([y] + grads, {x: xv, flag: False})
            halfv = sess.run([y] + grads, {x: xv, flag: True})
    for a, b in zip(full, halfv):
        assert b.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
    # The float32 branch itself against numpy.
    h = np.maximum(xv @ _K, 0.0)
    y_np = 0.5 * h @ _W
    np.testing.assert_allclose(full[0], y_np, rtol=1e-6)
    dy = 2.0 * (y_np - 1.0) / len(xv) * 0.5
    np.testing.assert_allclose(full[3], h.T @ dy, rtol=1e-5, atol=1e-6)
    assert np.abs(full[1]).sum() > 0


def test_cast_compute_and_no_cast():
    g = tf.Graph()
    with g.as_default():
        ids = tf.constant([1, 2])
        with mp.precision_scope("bfloat16"):
            assert mp.compute_dtype() == tf.bfloat16 and mp.is_half()
            a, b = mp.cast_compute([tf.constant([1.0]), ids])
            assert a.dtype == tf.bfloat16 and b.dtype == tf.int32
            with mp.no_cast():
                t = tf.compat.v1.get_variable("table", [10, 2])
            assert t.dtype.base_dtype == tf.float32
            v = tf.compat.v1.get_variable("v", [2])
            assert v.dtype == tf.bfloat16
            counter = tf.compat.v1.get_variable("c", [], trainable=False)
            assert counter.dtype.base_dtype == tf.float32  # non-trainable: not cast
        assert mp.compute_dtype() == tf.float32
        with pytest.raises(ValueError):
            with mp.precision_scope(tf.int32):
                pass
        with pytest.raises(ValueError):
            mp.build_switched(tf.constant(True), tf.float32, lambda: 1.0)
