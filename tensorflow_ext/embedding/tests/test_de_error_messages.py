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
