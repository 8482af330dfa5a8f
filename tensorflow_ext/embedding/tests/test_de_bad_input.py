"""Bad input to dynamic embeddings: errors that name the problem, and NaN initial values that work."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import session_config

InvalidArgument = tf.errors.InvalidArgumentError


def _lookup(emb, ids):
    return tf_ext.embedding_lookup(emb, tf.constant(ids, tf.int64))


@pytest.mark.parametrize("num_shards", [1, 3])
def test_nan_initializer_lookup_and_insert(graph, num_shards):
    # A NaN constant initializer puts NaN in the table's column defaults; the table must still
    # be created (its layout compared with itself) and used.
    emb = tf_ext.get_dynamic_embedding("nan_emb", 3, initializer=float("nan"), num_shards=num_shards)
    fresh = _lookup(emb, [1, 2, 3])
    insert = emb.insert([2, 5], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    after = _lookup(emb, [2, 5, 7])
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        assert np.all(np.isnan(sess.run(fresh)))
        sess.run(insert)
        rows = sess.run(after)
    np.testing.assert_array_equal(rows[:2], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert np.all(np.isnan(rows[2]))


def test_insert_values_of_the_wrong_width_static(graph):
    emb = tf_ext.get_dynamic_embedding("emb", 4)
    with pytest.raises(
        ValueError,
        match=r"insert into dynamic embedding emb: values must have shape \[n, dim\] = \[3, 4\].*got shape \(3, 10\)",
    ):
        emb.insert([1, 2, 3], np.zeros([3, 10], np.float32))
    with pytest.raises(ValueError, match=r"\[n, dim\] = \[3, 4\].*got shape \(\)"):
        emb.insert([1, 2, 3], 1.0)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_insert_with_fewer_rows_than_ids_static(graph, num_shards):
    emb = tf_ext.get_dynamic_embedding("emb", 4, num_shards=num_shards)
    with pytest.raises(ValueError, match=r"\[n, dim\] = \[3, 4\].*got shape \(2, 4\)"):
        emb.insert([1, 2, 3], np.zeros([2, 4], np.float32))


@pytest.mark.parametrize("num_shards", [1, 2])
def test_insert_bad_values_at_run_time(graph, num_shards):
    emb = tf_ext.get_dynamic_embedding("emb", 4, num_shards=num_shards)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    values = tf.compat.v1.placeholder(tf.float32, [None, None])
    insert = emb.insert(ids, values)
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        # Wrong width (was: "Dimension size must be evenly divisible by 4 but is 10 for insert/Reshape_1").
        with pytest.raises(InvalidArgument) as info:
            sess.run(insert, {ids: [1, 2], values: np.zeros([2, 5], np.float32)})
        msg = info.value.message
        assert "insert into dynamic embedding emb: values must have shape [n, dim] with dim = 4" in msg, msg
        assert "[2]" in msg and "got shape" in msg and "[2 5]" in msg, msg
        # Fewer rows than ids (was a DynamicPartition message with several shards).
        with pytest.raises(InvalidArgument) as info:
            sess.run(insert, {ids: [1, 2, 3], values: np.zeros([2, 4], np.float32)})
        msg = info.value.message
        assert "dynamic embedding emb: values must have shape [n, dim]" in msg and "[3]" in msg and "[2 4]" in msg, msg
        # Nothing was inserted by the failed ops; a good insert works.
        sess.run(insert, {ids: [7, 8], values: [[1, 2, 3, 4], [5, 6, 7, 8]]})
        assert sess.run(emb.size()) == 2
        np.testing.assert_array_equal(sess.run(_lookup(emb, [8, 7])), [[5, 6, 7, 8], [1, 2, 3, 4]])


def test_insert_accepts_ids_shape_plus_dim_and_empty(graph):
    emb = tf_ext.get_dynamic_embedding("emb", 2, num_shards=2)
    ids = np.array([[1, 2], [3, 4]], np.int64)
    vals = np.arange(8, dtype=np.float32).reshape([2, 2, 2])
    ops = [
        emb.insert(ids, vals),
        emb.insert(np.zeros([0], np.int64), np.zeros([0, 2], np.float32)),
        emb.insert(np.zeros([0], np.int64), []),
    ]
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(ops)
        np.testing.assert_array_equal(sess.run(_lookup(emb, ids)), vals)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: tf.keras.optimizers.SGD(0.1),
        lambda: tf.keras.optimizers.Adam(0.1),
        lambda: tf.keras.optimizers.legacy.Adagrad(0.1),
    ],
    ids=["sgd", "adam", "legacy_adagrad"],
)
def test_keras_optimizer_says_to_use_tf_compat_v1_train(graph, make_optimizer):
    emb = tf_ext.get_dynamic_embedding("emb", 4)
    ids = tf.constant([1, 2, 3], tf.int64)
    loss_fn = lambda: tf.reduce_sum(tf_ext.embedding_lookup(emb, ids) ** 2)
    loss = loss_fn()
    expected = (
        r"Keras optimizer \w+ cannot train dynamic embedding emb(/part_0)?: dynamic embeddings train with "
        r"tf.compat.v1.train optimizers, e.g. tf.compat.v1.train.AdagradOptimizer"
    )
    opt = make_optimizer()
    with pytest.raises(TypeError, match=expected):
        opt.minimize(loss_fn, var_list=emb.shards)
    with pytest.raises(TypeError, match=expected):
        opt.minimize(loss, var_list=tf.compat.v1.trainable_variables())
    with pytest.raises(TypeError, match=expected):
        opt.minimize(loss_fn, var_list=[emb])
    grads = tf.gradients(loss, [s.handle for s in emb.shards])
    with pytest.raises(TypeError, match=expected):
        opt.apply_gradients(zip(grads, emb.shards))
    # The check lets dense variables through to Keras (in TF1 graph mode only the legacy Keras
    # optimizers build an update op), and tf.compat.v1.train trains the embedding.
    dense = tf.Variable([1.0, 2.0])
    step = opt.minimize(lambda: tf.reduce_sum(dense**2), var_list=[dense])
    assert (step is not None) == isinstance(opt, tf.keras.optimizers.legacy.Optimizer)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        # A lookup built after minimize feeds no gradient, so it is find-only unless told: insert the rows training
        # starts from.
        before = sess.run(tf_ext.embedding_lookup(emb, ids, is_training=True))
        sess.run(train)
        np.testing.assert_allclose(sess.run(tf_ext.embedding_lookup(emb, ids)), before * 0.8, rtol=1e-6)
        if step is not None:  # legacy Keras Adagrad: initial accumulator 0.1
            sess.run(step)
            w = np.array([1.0, 2.0])
            np.testing.assert_allclose(sess.run(dense), w - 0.1 * 2 * w / np.sqrt(0.1 + (2 * w) ** 2), rtol=1e-5)
