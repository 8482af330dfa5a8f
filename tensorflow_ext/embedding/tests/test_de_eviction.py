"""Eviction policies (steps_to_live / min_frequency), run at checkpoint saves."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.summaries import summary_tags
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


# ---- EvictionPolicy: per embedding, in the training step and before saves --------------------------------------


def _policy_model(policy, num_shards=2, optimizer=None, admission=None):
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = tf_ext.get_dynamic_embedding(
        "e", 2, initializer=0.1, num_shards=num_shards, eviction=policy, admission=admission
    )
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 1.0))
    opt = optimizer or tf.compat.v1.train.AdagradOptimizer(0.1)
    train = opt.minimize(loss, global_step=gs)
    return gs, ids, emb, train


def test_policy_capacity_keeps_the_most_recently_trained_keys(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(capacity=4)
    gs, ids, emb, train = _policy_model(policy, num_shards=1)
    op = tf_ext.embedding.evict(emb)  # no criteria: the embedding's own policy
    sess.run(tf.compat.v1.global_variables_initializer())
    for step in range(6):
        sess.run(train, {ids: [10 + step, 20 + step]})  # keys of step s have version s
    assert sess.run(op) == 8
    e = sess.run(emb.export(with_slots=True))
    assert sorted(e.keys.tolist()) == [14, 15, 24, 25]
    assert e.slots.shape == (4, 2)
    assert sess.run(emb.eviction_state["evicted"]) == 8


def test_policy_min_l2_norm_removes_weak_rows(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(min_l2_norm=1.0)
    gs, ids, emb, train = _policy_model(policy, optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.2))
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(5):
        sess.run(train, {ids: [1, 2]})  # rows of 1 and 2 move from 0.1 towards 1
    sess.run(train, {ids: [3]})  # one step for 3: norm ~0.65
    e = sess.run(emb.export())
    norms = dict(zip(e.keys.tolist(), np.linalg.norm(e.values, axis=1)))
    want = sorted(k for k, n in norms.items() if n >= 1.0)
    assert sess.run(tf_ext.embedding.evict(emb)) == len(norms) - len(want) == 1
    assert sorted(sess.run(emb.export()).keys.tolist()) == want == [1, 2]


def test_policy_every_n_steps_evicts_inside_the_training_step(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(steps_to_live=1, every_n_steps=3)
    gs, ids, emb, train = _policy_model(policy)
    sizes = []
    sess.run(tf.compat.v1.global_variables_initializer())
    for step in range(7):
        sess.run(train, {ids: [100 + step]})  # one new key per step, never seen again
        sizes.append(int(sess.run(emb.size())))
    # Eviction runs after the update of the steps whose global step (before its increment) is 3 and 6: it keeps
    # versions >= step - 1, i.e. the keys of that step and the one before (2 of 4 keys go at 3, 3 of 5 at 6).
    assert sizes == [1, 2, 3, 2, 3, 4, 2], sizes
    assert sess.run(emb.eviction_state["evicted"]) == 2 + 3


def test_policy_keeps_memory_flat_over_a_long_run(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(capacity=2000, every_n_steps=10)
    gs, ids, emb, train = _policy_model(policy)
    mem = emb.memory_bytes()
    sess.run(tf.compat.v1.global_variables_initializer())
    rng = np.random.RandomState(0)
    seen = {}
    for step in range(1, 301):
        batch = rng.randint(0, 1 << 40, size=200)  # every step: 200 fresh ids
        sess.run(train, {ids: batch})
        if step in (60, 300):
            seen[step] = (int(sess.run(emb.size())), int(sess.run(mem)))
    # At most capacity + one interval of new keys, and the memory of step 60 is not exceeded later.
    assert seen[300][0] <= 2000 + 10 * 200
    assert seen[300][1] <= seen[60][1] * 1.05, seen


def test_saver_listener_without_criteria_runs_each_embeddings_policy(tmp_path):
    model_dir = str(tmp_path)
    with tf.Graph().as_default():
        policy = tf_ext.embedding.EvictionPolicy(min_frequency=2)
        gs, ids, emb, train = _policy_model(policy)
        plain = tf_ext.get_dynamic_embedding("plain", 2, initializer=0.1)  # no policy: left alone
        touch = tf_ext.embedding_lookup(plain, ids, is_training=True)
        listener = tf_ext.embedding.EvictionSaverListener()
        hook = tf.compat.v1.train.CheckpointSaverHook(model_dir, save_steps=100, listeners=[listener])
        with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
            s.run([train, touch], {ids: [1, 1, 2]})
            s.run([train, touch], {ids: [1, 3]})
    reader = tf.train.load_checkpoint(model_dir)
    assert sorted(np.concatenate([reader.get_tensor("e/part_%d-keys" % i) for i in range(2)]).tolist()) == [1]
    assert sorted(reader.get_tensor("plain/part_0-keys").tolist()) == [1, 2, 3]
    assert listener.last_removed == 2


def test_eviction_and_admission_together_and_in_summaries(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(steps_to_live=0, every_n_steps=2)
    gs, ids, emb, train = _policy_model(policy, admission=tf_ext.embedding.CountAdmission(2))
    summaries = tf_ext.embedding.add_summaries(emb)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: [1, 2]})  # step 0: counted once
    sess.run(train, {ids: [1]})  # step 1: 1 admitted
    sess.run(train, {ids: [2]})  # step 2: 2 admitted; eviction keeps version >= 2: 1 goes
    assert sorted(sess.run(emb.export()).keys.tolist()) == [2]
    values = {}
    for s in sess.run(summaries):
        summary = tf.compat.v1.Summary.FromString(s)
        values.update({v.tag: v.simple_value for v in summary.value})
    assert values["tf_ext/e/admitted_keys"] == 2 and values["tf_ext/e/evicted_keys"] == 1, values
    assert set(summary_tags(emb)) == {"size", "memory_bytes", "bytes_per_key", "admitted_keys", "evicted_keys"}


def test_bad_policies_are_named():
    with pytest.raises(ValueError, match="at least one of"):
        tf_ext.embedding.EvictionPolicy(every_n_steps=3)
    with pytest.raises(ValueError, match="capacity must be a non-negative int"):
        tf_ext.embedding.EvictionPolicy(capacity=-1)
    with pytest.raises(ValueError, match="min_l2_norm must be a number > 0"):
        tf_ext.embedding.EvictionPolicy(min_l2_norm=0)
    with pytest.raises(ValueError, match="every_n_steps must be a positive int"):
        tf_ext.embedding.EvictionPolicy(capacity=3, every_n_steps=0)
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding(
            "e", 2, eviction=tf_ext.embedding.EvictionPolicy(capacity=1, every_n_steps=2)
        )
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64)))
        with pytest.raises(ValueError, match="create a global step first"):
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
