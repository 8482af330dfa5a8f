"""Eviction policies (steps_to_live / min_frequency), run at checkpoint saves."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext


def _model():
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.1, num_shards=2)
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids)))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    return gs, ids, emb, train


def test_evict_by_steps_to_live_and_frequency(graph, sess):
    gs, ids, emb, train = _model()
    by_age = tf_ext.embedding.evict(emb, steps_to_live=2)
    by_freq = tf_ext.embedding.evict(steps_to_live=None, min_frequency=3)
    exported = emb.export(with_slots=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: [1, 2, 3]})  # step 0
    for _ in range(4):  # steps 1..4
        sess.run(train, {ids: [1, 2]})
    sess.run(train, {ids: [1, 4]})  # step 5
    # gs = 6: keep versions >= 4 -> 1 (5), 2 (4), 4 (5); 3 (version 0) goes.
    assert sess.run(by_age) == 1
    assert sorted(sess.run(exported).keys.tolist()) == [1, 2, 4]
    # frequencies: 1 -> 6, 2 -> 5, 4 -> 1: min_frequency 3 removes 4.
    assert sess.run(by_freq) == 1
    e = sess.run(exported)
    assert sorted(e.keys.tolist()) == [1, 2]
    assert e.slots.shape == (2, 2)  # slots go with their keys
    with pytest.raises(ValueError, match="policy"):
        tf_ext.embedding.evict(emb)


def test_eviction_listener_runs_before_checkpoint_save(tmp_path):
    with tf.Graph().as_default():
        gs, ids, emb, train = _model()
        listener = tf_ext.embedding.EvictionSaverListener(steps_to_live=1)
        size = emb.size()
        hooks = [tf.compat.v1.train.CheckpointSaverHook(str(tmp_path), save_steps=3, listeners=[listener])]
        with tf.compat.v1.train.MonitoredSession(
            hooks=hooks, session_creator=tf.compat.v1.train.ChiefSessionCreator(config=session_config())
        ) as sess:
            sess.run(train, {ids: [7, 8]})
            for _ in range(2):
                sess.run(train, {ids: [1]})  # step 2 -> the save at gs=3 evicts 7, 8
            assert listener.last_removed == 2
            assert sess.run(size) == 1
        reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(str(tmp_path)))
        keys = np.concatenate([reader.get_tensor("e/part_%d-keys" % i) for i in range(2)])
        assert keys.tolist() == [1]


def test_eviction_hook_every_n_steps(graph):
    gs, ids, emb, train = _model()
    hook = tf_ext.embedding.EvictionHook(every_n_steps=2, min_frequency=2)
    size = emb.size()
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        sess.run(train, {ids: [1, 2]})
        assert hook.last_removed is None
        sess.run(train, {ids: [1]})
        assert hook.last_removed == 1  # key 2 seen once
        assert sess.run(size) == 1
