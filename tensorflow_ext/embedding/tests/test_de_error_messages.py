"""Errors a user meets when putting the pieces together in another order than the docs: each says on its first line
what happened and what to do."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext


def _model():
    step = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
    return emb, step, loss


def _train(scaffold, listener, ckpt_dir, steps=3):
    hook = tf.compat.v1.train.CheckpointSaverHook(ckpt_dir, save_steps=1, scaffold=scaffold, listeners=[listener])
    train = tf.compat.v1.get_collection("train")[0]
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=ckpt_dir, scaffold=scaffold, save_checkpoint_steps=None, hooks=[hook], config=session_config()
    ) as sess:
        for _ in range(steps):
            sess.run(train)


def test_a_scaffold_with_its_own_saver_and_delta_checkpoints_get_one_order(tmp_path):
    """With a Scaffold's own Saver, the listener must exist before the Saver, and must know the Saver: both errors
    name the one order that works (training op, listener, Saver added to GraphKeys.SAVERS), and it works."""
    with tf.Graph().as_default():  # the Saver first, handed to the listener
        emb, step, loss = _model()
        tf.compat.v1.add_to_collection("train", tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, step))
        saver = tf.compat.v1.train.Saver()
        listener = tf_ext.embedding.delta_checkpoints(3, saver=saver)
        with pytest.raises(RuntimeError) as first:
            _train(tf.compat.v1.train.Scaffold(saver=saver), listener, str(tmp_path / "a"))
    with tf.Graph().as_default():  # the listener first, the Saver built later for the Scaffold
        emb, step, loss = _model()
        tf.compat.v1.add_to_collection("train", tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, step))
        listener = tf_ext.embedding.delta_checkpoints(3)
        with pytest.raises(ValueError) as second:
            _train(tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver()), listener, str(tmp_path / "b"))
    for info in (first, second):
        line = str(info.value).splitlines()[0]
        assert "delta_checkpoints(" in line and "GraphKeys.SAVERS" in line, line
        assert line.index("delta_checkpoints(") < line.index("Saver()"), line  # the listener, then the Saver
    with tf.Graph().as_default():  # the order both name
        emb, step, loss = _model()
        tf.compat.v1.add_to_collection("train", tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, step))
        listener = tf_ext.embedding.delta_checkpoints(3)
        saver = tf.compat.v1.train.Saver()
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)
        _train(tf.compat.v1.train.Scaffold(saver=saver), listener, str(tmp_path / "c"))
    assert tf.train.latest_checkpoint(str(tmp_path / "c")) is not None


def test_float_ids_are_refused():
    """Float ids are refused by name: float tensors and placeholders when the lookup is built, float values fed to an
    integer ids placeholder when the graph runs (TF would truncate them silently: 1.7 would read key 1's row)."""
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5)
        for bad in (tf.compat.v1.placeholder(tf.float32, [None]), tf.constant([1.5, 2.0])):
            with pytest.raises(TypeError, match="ids of dynamic embedding 'e' .*must be int64 or int32, got float"):
                tf_ext.embedding_lookup(emb, bad)
        with pytest.raises(TypeError, match="must be int64 or int32, got float"):
            tf_ext.embedding_lookup_sparse(emb, tf.sparse.from_dense(tf.constant([[1.5, 2.0]])), None)
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        rows = tf_ext.embedding_lookup(emb, ids, is_training=True)
        sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, name="sp_ids")
        pooled = tf_ext.embedding_lookup_sparse(emb, sp_ids, None, is_training=True)
        other = tf.compat.v1.placeholder(tf.int64, [None])  # not ids of a lookup: TF's own feeding
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for value in ([1.7, 2.2], np.array([1.0, 2.0]), np.array([3.5], np.float32)):
                with pytest.raises(TypeError) as info:
                    sess.run(rows, {ids: value})
                line = str(info.value).splitlines()[0]
                assert line.startswith("Float values fed to ids:0, the ids of dynamic embedding 'e': feed integer ids")
            with pytest.raises(TypeError, match="Float values fed to sp_ids/values:0"):
                sess.run(pooled, {sp_ids: tf.compat.v1.SparseTensorValue([[0, 0]], np.array([1.5]), [1, 1])})
            with pytest.raises(TypeError, match="Float values fed to ids:0"):
                sess.run(rows, {"ids:0": [1.5]})
            assert sess.run(emb.size()) == 0  # nothing was looked up
            sess.run(rows, {ids: np.array([1, 2])})
            sess.run(pooled, {sp_ids: tf.compat.v1.SparseTensorValue([[0, 0]], np.array([3]), [1, 1])})
            assert sess.run(emb.size()) == 3
            assert sess.run(other, {other: [1.0]}).tolist() == [1]


def test_a_restore_refused_for_another_layout_says_so_on_its_first_line(tmp_path):
    """A checkpoint of an Adam-trained embedding restored where Adagrad trains it: the first line names both layouts
    and the fix (TF's generic 'Restoring from checkpoint failed...' comes below it)."""
    prefix = str(tmp_path / "model")

    def build(optimizer):
        _, _, loss = _model()
        return optimizer.minimize(loss)

    with tf.Graph().as_default():
        train = build(tf.compat.v1.train.AdamOptimizer(0.1))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            saver.save(sess, prefix)
    with tf.Graph().as_default():
        build(tf.compat.v1.train.AdagradOptimizer(0.1))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                saver.restore(sess, prefix)
    message = str(info.value)
    first = message.splitlines()[0]
    assert first.startswith("Checkpoint tensors e/part_0-* hold rows of another layout than dynamic embedding e"), first
    assert "Adagrad" in first and "m [2:4], v [4:6]" in first and "restore_values_only()" in first, first
    assert "Restoring from checkpoint failed" in message  # TF's own text follows


def test_other_restore_errors_keep_tensorflow_first_line(tmp_path):
    prefix = str(tmp_path / "model")
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=[1.0])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(v.initializer)
            saver.save(sess, prefix)
    with tf.Graph().as_default():
        # Another dtype: RestoreV2 refuses it whatever the variable kind (a resource variable would take another
        # shape silently).
        tf.compat.v1.get_variable("v", initializer=[1, 2], dtype=tf.int32)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                saver.restore(sess, prefix)
    assert str(info.value).startswith("Restoring from checkpoint failed.")
