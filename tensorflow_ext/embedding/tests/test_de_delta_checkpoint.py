"""Delta checkpoints: a full save and the deltas after it restore exactly the table the run had at each save."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import session_config

DIM = 4


def _build(num_shards=2, optimizer="adagrad"):
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding(
        "user", DIM, num_shards=num_shards, initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3)
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 0.5))
    opt = {
        "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
        "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    }[optimizer]()
    train = opt.minimize(loss, global_step=gs)
    remove_ids = tf.compat.v1.placeholder(tf.int64, [None], name="remove_ids")
    remove = emb.remove(remove_ids)
    evict = tf_ext.embedding.evict(emb, steps_to_live=4)
    return gs, emb, ids, train, remove_ids, remove, evict


def _state(sess, emb):
    """The whole table, sorted by key: keys, values, slots, versions, frequencies (numpy)."""
    exp = sess.run(emb.export(with_slots=True))
    order = np.argsort(exp.keys)
    return tuple(np.asarray(a)[order] for a in exp)


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y, what in zip(a, b, ("keys", "values", "slots", "versions", "frequencies")):
        np.testing.assert_array_equal(x, y, err_msg=what)


def _restore_state(path, num_shards=2, optimizer="adagrad"):
    with tf.Graph().as_default():
        _, emb, *_ = _build(num_shards, optimizer)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            return _state(sess, emb)


def _record(path, shard="user/part_0"):
    value = tf.train.load_checkpoint(path).get_tensor(shard + "-delta")
    return value.decode() if isinstance(value, bytes) else value


def _kind(path):
    return [line for line in _record(path).split("\n") if line.startswith("kind=")][0][len("kind=") :]


def _rows(path, shard="user/part_0"):
    return tf.train.load_checkpoint(path).get_tensor(shard + "-keys").size


def _train_run(tmp_path, num_saves=7, full_every=3, optimizer="adagrad", max_to_keep=None):
    """Trains with removals and evictions between delta saves; returns [(path, state at the save)], listener."""
    rng = np.random.RandomState(0)
    out = []
    gs, emb, ids, train, remove_ids, remove, evict = _build(optimizer=optimizer)
    listener = tf_ext.embedding.delta_checkpoints(full_every=full_every)
    saver = tf.compat.v1.train.Saver(max_to_keep=max_to_keep if max_to_keep is not None else 100)
    prefix = str(tmp_path / "model.ckpt")
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for save in range(num_saves):
            for _ in range(3):
                # Mostly fresh keys, some repeated ones (their rows change again).
                batch = np.concatenate([rng.randint(0, 300, size=20), rng.randint(1000 * save, 1000 * save + 50, 10)])
                sess.run(train, {ids: batch})
            sess.run(remove, {remove_ids: rng.randint(0, 300, size=15)})
            if save % 2 == 1:
                sess.run(evict)
            path = listener.save(sess, saver, prefix, gs)
            out.append((path, _state(sess, emb)))
    return out, listener, saver


def test_full_and_deltas_restore_the_uninterrupted_table(graph, tmp_path):
    saves, _, _ = _train_run(tmp_path, num_saves=7, full_every=3)
    kinds = [_kind(p) for p, _ in saves]
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full"]
    for (path, state), kind in zip(saves, kinds):
        if kind == "delta":
            # Only the rows trained since the previous save: far fewer than the table.
            assert 0 < _rows(path) < len(state[0]) / 2 + 1
            removed = tf.train.load_checkpoint(path).get_tensor("user/part_0-removed")
            assert removed.size > 0
        _assert_same(_restore_state(path), state)
