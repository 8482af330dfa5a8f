"""TF1 code written over `tf.compat.v1.trainable_variables()` works with dynamic embeddings in the model.

A shard stands, as a tensor, for the rows this graph's lookups read (see
`DynamicEmbeddingShard.read_keys_and_rows`). References: a dense `tf.Variable`
table with the same rows, looked up with `tf.nn.embedding_lookup`, whose L2
term is taken over the rows each lookup read (`tf.gather(W, unique(ids))`).
"""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext

V, DIM, STEPS = 12, 4, 5
L2 = 0.05


def _key(ids):
    return ids * 7919 + 13


def _batches(seed=0):
    rng = np.random.RandomState(seed)
    return [rng.randint(0, V, size=[3, 5]).astype(np.int64) for _ in range(STEPS)]


@pytest.mark.parametrize("num_shards", [1, 3])
def test_l2_over_trainable_variables_matches_dense(num_shards):
    """loss + L2 * sum(l2_loss(v) for v in trainable_variables()) trains the embedding like a dense table."""
    rng = np.random.RandomState(1)
    init = rng.normal(0, 0.5, size=[V, DIM]).astype(np.float32)
    with tf.Graph().as_default() as g:
        ids = tf.compat.v1.placeholder(tf.int64, [None, None])
        with tf.compat.v1.variable_scope("dyn"):
            emb = tf_ext.get_dynamic_embedding("emb", DIM, num_shards=num_shards, initializer=0.0)
            preload = emb.insert(_key(np.arange(V)), init)
            dyn_out = tf.reduce_sum(tf_ext.embedding_lookup(emb, _key(ids)), axis=1)
            w_dyn = tf.compat.v1.get_variable("w", initializer=tf.ones([DIM, 1]) * 0.3)
        with tf.compat.v1.variable_scope("dense"):
            table = tf.compat.v1.get_variable("table", initializer=init)
            dense_out = tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)
            w_dense = tf.compat.v1.get_variable("w", initializer=tf.ones([DIM, 1]) * 0.3)
        target = tf.ones([3, 1])
        dyn_vars = [v for v in tf.compat.v1.trainable_variables() if not v.name.startswith("dense/")]
        assert [s for s in dyn_vars if isinstance(s, tf_ext.embedding.DynamicEmbeddingShard)] == emb.shards
        # The user's idiom, over every trainable variable of the dynamic model.
        dyn_loss = tf.reduce_mean(tf.square(tf.matmul(dyn_out, w_dyn) - target)) + L2 * tf.add_n(
            [tf.nn.l2_loss(v) for v in dyn_vars]
        )
        unique_ids, _ = tf.unique(tf.reshape(ids, [-1]))
        dense_loss = tf.reduce_mean(tf.square(tf.matmul(dense_out, w_dense) - target)) + L2 * (
            tf.nn.l2_loss(tf.gather(table, unique_ids)) + tf.nn.l2_loss(w_dense)
        )
        opt = tf.compat.v1.train.AdagradOptimizer(0.2)
        train = tf.group(opt.minimize(dyn_loss, var_list=dyn_vars), opt.minimize(dense_loss, var_list=[table, w_dense]))
        rows = tf_ext.embedding_lookup(emb, _key(np.arange(V)), is_training=False)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(preload)
            for batch in _batches():
                sess.run(train, {ids: batch})
            got, want = sess.run([rows, table])
        assert not np.allclose(want, init)  # the reference trained
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_histograms_over_trainable_variables():
    with tf.Graph().as_default() as g:
        ids = tf.constant([1, 5, 5, 9], tf.int64)
        emb = tf_ext.get_dynamic_embedding("hist_emb", DIM, num_shards=2, initializer=0.5)
        _ = tf_ext.embedding_lookup(emb, ids)
        summaries = [tf.compat.v1.summary.histogram(v.op.name, v) for v in tf.compat.v1.trainable_variables()]
        merged = tf.compat.v1.summary.merge(summaries)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            proto = tf.compat.v1.Summary.FromString(sess.run(merged))
    counts = {v.tag: v.histo.num for v in proto.value}
    assert sorted(t.rsplit("_", 1)[0] if t.endswith("_1") else t for t in counts) == [
        "hist_emb/part_0",
        "hist_emb/part_1",
    ]
    assert sum(counts.values()) == 3 * DIM  # three unique keys, read once each, over both shards
    assert all(v.histo.min == 0.5 and v.histo.max == 0.5 for v in proto.value)


def test_tf_gradients_over_trainable_variables_give_indexed_slices_of_keys():
    with tf.Graph().as_default() as g:
        ids = tf.constant([3, 4, 3], tf.int64)
        emb = tf_ext.get_dynamic_embedding("grad_emb", DIM, initializer=1.0)
        w = tf.compat.v1.get_variable("w", initializer=tf.fill([DIM], 2.0))
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids) * w)
        grads = tf.gradients(loss, tf.compat.v1.trainable_variables())
        by_var = dict(zip([v.name for v in tf.compat.v1.trainable_variables()], grads))
        g_emb = by_var[emb.shards[0].name]
        assert isinstance(g_emb, tf.IndexedSlices)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            keys, values, g_w = sess.run([g_emb.indices, g_emb.values, by_var["w:0"]])
    dense = {}
    for k, v in zip(keys, values):
        dense[int(k)] = dense.get(int(k), 0) + v
    assert sorted(dense) == [3, 4]
    np.testing.assert_allclose(dense[3], [4.0] * DIM)  # key 3 twice, w = 2
    np.testing.assert_allclose(dense[4], [2.0] * DIM)
    np.testing.assert_allclose(g_w, [3.0] * DIM)  # three rows of ones


def test_shard_as_tensor_before_any_lookup_says_what_to_do():
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("early", DIM)
        with pytest.raises(ValueError, match="no tf_ext.embedding_lookup"):
            tf.nn.l2_loss(emb.shards[0])


def test_moving_average_over_trainable_variables_refuses_shards_and_dense_variables_work():
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("ema_emb", DIM)
        x = tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64))
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([DIM]))
        loss = tf.reduce_sum(x * w)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.5)
        with pytest.raises(TypeError, match=r"ema_emb/part_0.*dense_variables"):
            ema.apply(tf.compat.v1.trainable_variables())
        dense = tf_ext.embedding.dense_variables(tf.compat.v1.trainable_variables())
        assert dense == [w]
        with tf.control_dependencies([train]):
            averaged = ema.apply(dense)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(averaged)
            w_now, avg = sess.run([w, ema.average(w)])
    assert not np.allclose(w_now, 1.0)
    np.testing.assert_allclose(avg, 0.5 * 1.0 + 0.5 * w_now, rtol=1e-6)


def test_get_slot_of_a_shard_reads_the_row_columns():
    with tf.Graph().as_default() as g:
        ids = tf.constant([7, 8, 7], tf.int64)
        emb = tf_ext.get_dynamic_embedding("slot_emb", DIM, initializer=1.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids))
        opt = tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.25)
        train = opt.minimize(loss)
        shard = emb.shards[0]
        slot = opt.get_slot(shard, "accumulator")
        assert isinstance(slot, tf_ext.embedding.DynamicEmbeddingSlot)
        assert opt.get_slot(shard, "no_such_slot") is None
        assert "accumulator" in opt.get_slot_names()
        as_tensor = tf.convert_to_tensor(slot)
        keys, _ = shard.read_keys_and_rows()
        reference = emb.slot_values(opt, "accumulator", tf.constant([7, 8], tf.int64))
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(train)
            got_keys, got, want = sess.run([keys, as_tensor, reference])
    order = {int(k): i for i, k in enumerate(got_keys)}
    # key 7 occurs twice: accumulator 0.25 + 2^2, key 8 once: 0.25 + 1
    np.testing.assert_allclose(got[order[7]], [4.25] * DIM)
    np.testing.assert_allclose(got[order[8]], [1.25] * DIM)
    np.testing.assert_allclose(want, [[4.25] * DIM, [1.25] * DIM])


def _callable_initializer(shape, dtype=tf.float32, partition_info=None):
    del partition_info
    return tf.fill(shape, tf.constant(0.5, dtype))


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("initializer", [0.5, _callable_initializer], ids=["in_kernel", "table_find"])
def test_every_lookup_path_has_one_handle_gradient(num_shards, initializer):
    """The lookup kernel and the table-find lookup (other initializers) share one gradient: the rows' gradient as
    IndexedSlices of the unique keys with dense_shape [2**62, dim]; the lookup op has none of its own."""
    from tensorflow.python.framework import ops as tf_ops  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.embedding import embedding_ops  # pylint: disable=import-outside-toplevel

    with pytest.raises(LookupError):
        tf_ops.gradient_registry.lookup("TfExtEmbeddingLookup")
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", DIM, initializer=initializer, num_shards=num_shards)
        assert emb.initializer.in_kernel == (initializer == 0.5)
        ids = tf.constant([[3, 4], [3, 9]], tf.int64)
        # Sparse lookups take the unique-key path for every embedding (also one shard with an in-kernel initializer).
        out = tf_ext.embedding_lookup_sparse(emb, tf.sparse.from_dense(ids), None, combiner="sum")
        w = tf.constant(np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM))
        grads = tf.gradients(tf.reduce_sum(out * w), [s.handle for s in emb.shards])
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            got = {}
            for grad in grads:
                assert isinstance(grad, tf.IndexedSlices)
                keys, values, dense_shape = sess.run([grad.indices, grad.values, grad.dense_shape])
                assert dense_shape.tolist() == [embedding_ops.HANDLE_GRAD_DENSE_ROWS, DIM]
                assert len(set(keys.tolist())) == len(keys)  # unique
                got.update({int(k): v for k, v in zip(keys, values)})
    assert sorted(got) == [3, 4, 9]
    np.testing.assert_allclose(got[3], np.arange(DIM) + np.arange(DIM, 2 * DIM))  # key 3 in both rows
    np.testing.assert_allclose(got[4], np.arange(DIM))
    np.testing.assert_allclose(got[9], np.arange(DIM, 2 * DIM))


def test_densifying_a_dynamic_embedding_gradient_is_a_clear_error():
    """sparse_as_dense-style conversion would span the int64 key space: refused with advice, not an overflow."""
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("dense_grad", DIM)
        dense = tf.compat.v1.get_variable("table", [5, DIM])
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64))) + tf.reduce_sum(
            tf.gather(dense, [0, 3])
        )
        g_emb, g_dense = tf.gradients(loss, [emb.shards[0], dense])
        with pytest.raises(ValueError, match="cannot be converted to a dense tensor.*DistributedOptimizer"):
            tf.convert_to_tensor(g_emb)
        assert tf.convert_to_tensor(g_dense).shape.as_list() == [5, DIM]  # other IndexedSlices: TF's conversion
