"""tf_ext.RowwiseAdagradOptimizer on dynamic embeddings: the fused kernel (and the generic path) against the same
optimizer on a dense variable, bit for bit; the one-column accumulator in rows, slot reads and checkpoints.

As in test_de_golden.py, a dense [V, dim] variable and a dynamic embedding holding the same initial rows (under
other keys) are trained side by side by ONE optimizer instance on batches with duplicate ids.
"""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding import embedding_ops

V = 10
STEPS = 4


def _key(ids):
    return ids * 7919 + 13


def _side_by_side(num_shards, dim, generic=False, seed=0):
    """(dense rows, embedding rows, dense accumulator [V], embedding accumulator [V, 1], the embedding's table
    width) after STEPS steps."""
    rng = np.random.RandomState(seed)
    init = rng.normal(0.0, 0.5, size=[V, dim]).astype(np.float32)
    old = _ops.force_generic(generic)
    try:
        with tf.Graph().as_default() as g:
            gs = tf.compat.v1.train.get_or_create_global_step()
            dense = tf.compat.v1.get_variable("dense", initializer=tf.constant(init), use_resource=True)
            emb = tf_ext.get_dynamic_embedding("dyn", dim, num_shards=num_shards, initializer=0.0)
            ids = tf.compat.v1.placeholder(tf.int64, [4, 5])
            w = tf.constant(rng.normal(size=[4, 5, dim]).astype(np.float32))
            loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(dense, ids) * w - 0.3)) + tf.reduce_sum(
                tf.square(tf_ext.embedding_lookup(emb, _key(ids)) * w - 0.3)
            )
            opt = tf_ext.RowwiseAdagradOptimizer(0.2, initial_accumulator_value=0.3)
            train = opt.minimize(loss, global_step=gs)
            all_keys = _key(tf.range(V, dtype=tf.int64))
            preload = emb.insert(all_keys, init)
            e_rows = tf_ext.embedding_lookup(emb, all_keys, is_training=False)
            e_acc = emb.slot_values(opt, "accumulator", all_keys)
            d_acc = opt.get_slot(dense, "accumulator")
            with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(preload)
                for _ in range(STEPS):
                    sess.run(train, {ids: rng.randint(0, V, size=[4, 5]).astype(np.int64)})  # duplicates
                out = sess.run([dense, e_rows, d_acc, e_acc])
            assert not np.allclose(out[0], init), "nothing trained"
            return out + [emb.shards[0].width]
    finally:
        _ops.force_generic(old)


@pytest.mark.parametrize("num_shards,dim", [(1, 8), (3, 5), (2, 1)])
def test_fused_update_equals_the_dense_optimizer_bit_for_bit(num_shards, dim):
    d_rows, e_rows, d_acc, e_acc, width = _side_by_side(num_shards, dim)
    np.testing.assert_array_equal(e_rows, d_rows)
    assert e_acc.shape == (V, 1)
    np.testing.assert_array_equal(e_acc[:, 0], d_acc)
    assert width == dim + 1  # the accumulator is one column per row


def test_generic_path_equals_the_dense_optimizer_bit_for_bit():
    d_rows, e_rows, d_acc, e_acc, _ = _side_by_side(2, 6, generic=True, seed=1)
    np.testing.assert_array_equal(e_rows, d_rows)
    np.testing.assert_array_equal(e_acc[:, 0], d_acc)


def test_raw_op_checks_the_one_column_slot_fits():
    """The fused op's layout check counts one column per row for the accumulator."""
    with tf.Graph().as_default():
        narrow = tf_ext.HashTable(dim=4, name="narrow")  # no slot column
        wide = tf_ext.HashTable(dim=4, width=5, column_defaults=[0, 0, 0, 0, 0.5], name="wide")
        grad = tf.constant([[1.0, 2.0, 3.0, 4.0]])
        bad = embedding_ops.sparse_apply_rowwise_adagrad(narrow.resource_handle, [7], grad, 0.1, dim=4)
        good = embedding_ops.sparse_apply_rowwise_adagrad(wide.resource_handle, [7], grad, 0.1, dim=4)
        row = wide.find(tf.constant([7], tf.int64), tf.zeros([5]), cols=5)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(
                tf.errors.InvalidArgumentError, match=r"slot column block\(s\) of width 1.*need width >= 5"
            ):
                sess.run(bad)
            sess.run(good)
            got = sess.run(row)[0]
    acc = np.float32(0.5) + np.float32(30.0) * (np.float32(1.0) / np.float32(4.0))
    np.testing.assert_array_equal(got[4], acc)
    want = -(np.float32(0.1) * np.array([1, 2, 3, 4], np.float32)) / np.sqrt(acc)
    np.testing.assert_array_equal(got[:4], want)


def _model(opt_class=None):
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [6], name="ids")
    emb = tf_ext.get_dynamic_embedding("emb", 4, num_shards=2, initializer=0.1)
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 0.5))
    opt = (opt_class or tf_ext.RowwiseAdagradOptimizer)(0.1)
    train = opt.minimize(loss, global_step=gs)
    keys = tf.constant(np.arange(1, 9, dtype=np.int64) * 1000003)
    reads = [tf_ext.embedding_lookup(emb, keys, is_training=False), emb.slot_values(opt, "accumulator", keys)]
    return dict(ids=ids, train=train, reads=reads, saver=tf.compat.v1.train.Saver())


def test_checkpoint_saves_and_restores_the_one_column_accumulator(tmp_path):
    prefix = str(tmp_path / "ckpt")
    batches = [np.array([1, 2, 2, 5, 8, 1], np.int64) * 1000003, np.array([3, 5, 5, 7, 8, 8], np.int64) * 1000003]
    with tf.Graph().as_default():
        m = _model()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for b in batches:
                sess.run(m["train"], {m["ids"]: b})
            saved = sess.run(m["reads"])
            m["saver"].save(sess, prefix)
    shapes = dict(tf.train.list_variables(prefix))
    assert shapes["emb/part_0-slots"][1] == 1  # one accumulator column per key
    with tf.Graph().as_default():
        m = _model()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            m["saver"].restore(sess, prefix)
            restored = sess.run(m["reads"])
    for got, want in zip(restored, saved):
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(saved[1], 0.1), "the accumulators did not move"


def test_checkpoint_of_another_optimizer_is_refused_naming_both(tmp_path):
    prefix = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        m = _model(tf.compat.v1.train.AdagradOptimizer)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            m["saver"].save(sess, prefix)
    with tf.Graph().as_default():
        m = _model()
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.OpError, match="AdagradOptimizer.*RowwiseAdagradOptimizer|Rowwise.*Adagrad"):
                m["saver"].restore(sess, prefix)


def _train_three_tables(fuse):
    """Rows and accumulators of three embeddings (dims 3, 4, 1) after 3 steps, and the apply op types that ran."""
    config = session_config()
    if fuse:
        config = tf_ext.graph.enable_optimizations(config)
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        tables = [
            tf_ext.get_dynamic_embedding("t%d" % i, dim, initializer=tf.compat.v1.random_normal_initializer(seed=i + 1))
            for i, dim in enumerate((3, 4, 1))
        ]
        loss = tf.add_n([tf.reduce_sum(tf.square(tf_ext.embedding_lookup(t, ids) - 0.5)) for t in tables])
        opt = tf_ext.RowwiseAdagradOptimizer(0.3)
        train = opt.minimize(loss)
        keys = tf.range(12, dtype=tf.int64)
        reads = [
            (tf_ext.embedding_lookup(t, keys, is_training=False), t.slot_values(opt, "accumulator", keys))
            for t in tables
        ]
        md = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(3):
                kw = dict(options=tf.compat.v1.RunOptions(output_partition_graphs=True), run_metadata=md)
                sess.run(train, {ids: np.array([step, step + 1, step + 1, 7], np.int64)}, **(kw if step == 0 else {}))
            ops = [n.op for g in md.partition_graphs for n in g.node if n.op.startswith("TfExtEmbeddingSparseApply")]
            return sess.run(reads), ops


def test_multi_table_fused_update_equals_the_single_table_updates():
    """The graph passes fuse the three tables' updates into one TfExtEmbeddingSparseApplyRowwiseAdagradMulti: the
    same tables bit for bit."""
    fused, fused_ops = _train_three_tables(True)
    single, single_ops = _train_three_tables(False)
    assert single_ops.count("TfExtEmbeddingSparseApplyRowwiseAdagrad") == 3
    assert fused_ops == ["TfExtEmbeddingSparseApplyRowwiseAdagradMulti"]
    for (f_rows, f_acc), (s_rows, s_acc) in zip(fused, single):
        np.testing.assert_array_equal(f_rows, s_rows)
        np.testing.assert_array_equal(f_acc, s_acc)
        assert f_acc.shape == (12, 1) and not np.allclose(f_acc, 0.1)
