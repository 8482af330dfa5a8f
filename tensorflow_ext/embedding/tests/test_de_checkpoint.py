"""Checkpoints: Saver, fresh-process restore, failed saves, MonitoredTrainingSession."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext

STEPS = 6
HALF = 3
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _batch(step):
    rng = np.random.RandomState(100 + step)
    return rng.randint(-40, 40, size=[6, 3]).astype(np.int64) * 1000003


def _build():
    """A small model: a 2-shard dynamic embedding (Adam) + a dense layer."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [6, 3], name="ids")
    emb = tf_ext.get_dynamic_embedding("emb", 4, num_shards=2, initializer=0.1)
    out = tf_ext.embedding_lookup(emb, ids)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-1, 1, 12).reshape(4, 3), tf.float32))
    logits = tf.reshape(tf.matmul(tf.reshape(out, [-1, 4]), w), [6, 3, 3])
    loss = tf.reduce_mean(tf.square(logits - 0.5))
    opt = tf.compat.v1.train.AdamOptimizer(0.05)
    train = opt.minimize(loss, global_step=gs)
    exp = emb.export(with_slots=True)
    return dict(gs=gs, ids=ids, train=train, emb=emb, exp=exp, w=w, loss=loss)


def _state(sess, m):
    e, w, gs = sess.run([m["exp"], m["w"], m["gs"]])
    order = np.argsort(e.keys)
    return dict(
        keys=e.keys[order],
        values=e.values[order],
        slots=e.slots[order],
        versions=e.versions[order],
        freqs=e.frequencies[order],
        w=w,
        gs=gs,
    )


def _train(sess, m, steps):
    for _ in range(steps):
        step = sess.run(m["gs"])
        sess.run(m["train"], {m["ids"]: _batch(step)})


def _assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def uninterrupted():
    g = tf.Graph()
    with g.as_default():
        m = _build()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _train(sess, m, STEPS)
            return _state(sess, m)


def _first_half(ckpt_dir):
    g = tf.Graph()
    with g.as_default():
        m = _build()
        saver = tf.compat.v1.train.Saver()  # no arguments: tables come from SAVEABLE_OBJECTS
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _train(sess, m, HALF)
            return saver.save(sess, os.path.join(ckpt_dir, "model"), global_step=m["gs"]), _state(sess, m)


def test_saver_restore_in_fresh_graph_continues_exactly(tmp_path, uninterrupted):
    path, _ = _first_half(str(tmp_path))
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    names = reader.get_variable_to_shape_map()
    for shard in ("emb/part_0", "emb/part_1"):
        for suffix in ("-keys", "-values", "-slots", "-versions", "-freqs"):
            assert shard + suffix in names, sorted(names)
    assert names["emb/part_0-slots"][1] == 8  # Adam m, v
    g = tf.Graph()
    with g.as_default():
        m = _build()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            assert sess.run(m["gs"]) == HALF
            _train(sess, m, STEPS - HALF)
            _assert_same(_state(sess, m), uninterrupted)


def test_restore_in_fresh_process_continues_exactly(tmp_path, uninterrupted):
    path, _ = _first_half(str(tmp_path))
    out = str(tmp_path / "state.npz")
    script = (
        textwrap.dedent(
            """
      import sys
      sys.path.insert(0, %r)
      sys.path.insert(0, %r)
      import numpy as np, tensorflow as tf
      tf.compat.v1.disable_v2_behavior()
      import test_de_checkpoint as t
      with tf.Graph().as_default():
        m = t._build()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
          saver.restore(sess, %r)
          t._train(sess, m, t.STEPS - t.HALF)
          np.savez(%r, **t._state(sess, m))
      """
        )
        % (_ROOT, os.path.dirname(os.path.abspath(__file__)), path, out)
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    restored = dict(np.load(out))
    _assert_same(restored, uninterrupted)


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path):
    ckpt_dir = str(tmp_path)
    g = tf.Graph()
    with g.as_default():
        m = _build()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _train(sess, m, 2)
            first = saver.save(sess, os.path.join(ckpt_dir, "model"), global_step=m["gs"])
            state_at_first = _state(sess, m)
            _train(sess, m, 2)
            # Simulate a failing write: the next checkpoint's index file cannot be created.
            os.makedirs(os.path.join(ckpt_dir, "model-4.index"))
            with pytest.raises(Exception):
                saver.save(sess, os.path.join(ckpt_dir, "model"), global_step=m["gs"])
    assert tf.train.latest_checkpoint(ckpt_dir) == first
    g = tf.Graph()
    with g.as_default():
        m = _build()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, tf.train.latest_checkpoint(ckpt_dir))
            _assert_same(_state(sess, m), state_at_first)


def test_restore_replaces_table_contents(tmp_path, sess, graph):
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
    out = tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64), is_training=True)
    other = tf_ext.embedding_lookup(emb, tf.constant([3], tf.int64), is_training=True)
    saver = tf.compat.v1.train.Saver()
    sess.run(out)
    path = saver.save(sess, str(tmp_path / "m"))
    sess.run(other)
    assert sess.run(emb.size()) == 3
    saver.restore(sess, path)
    assert sess.run(emb.size()) == 2  # key 3 is gone: restore = clear + import


def test_other_optimizer_is_refused_and_values_only_resets_slots(tmp_path):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
        train = tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.5).minimize(loss)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(train)
            path = saver.save(sess, str(tmp_path / "m"))
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
        tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="another layout"):
                saver.restore(sess, path)
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        opt.minimize(loss)
        tf_ext.embedding.restore_values_only(emb)
        m_slot = emb.slot_values(opt, "m", [1, 2])
        rows = tf_ext.embedding_lookup(emb, [1, 2], is_training=False)
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables)  # Adam's beta powers are not in the checkpoint
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, path)
            np.testing.assert_allclose(sess.run(rows), np.full([2, 2], 1.0 - 0.1 / np.sqrt(1.5)), rtol=1e-6)
            np.testing.assert_allclose(sess.run(m_slot), np.zeros([2, 2]))


def test_monitored_training_session_checkpoints(tmp_path):
    ckpt_dir = str(tmp_path)

    def run(steps):
        with tf.Graph().as_default():
            m = _build()
            size_op = m["emb"].size()
            with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=ckpt_dir,
                save_checkpoint_steps=2,
                save_summaries_steps=None,
                log_step_count_steps=None,
                config=session_config(),
            ) as sess:
                for _ in range(steps):
                    step = sess.run(m["gs"])
                    sess.run(m["train"], {m["ids"]: _batch(step)})
                return sess.run([m["gs"], size_op])

    gs, size = run(4)
    assert gs == 4
    gs2, size2 = run(0)  # restores the final checkpoint written at the end
    assert (gs2, size2) == (4, size)
    gs3, _ = run(2)
    assert gs3 == 6


def test_sharded_saver(tmp_path, graph, sess):
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0, num_shards=3)
    out = tf_ext.embedding_lookup(emb, tf.range(20, dtype=tf.int64), is_training=True)
    saver = tf.compat.v1.train.Saver(sharded=True)
    sess.run(out)
    path = saver.save(sess, str(tmp_path / "m"))
    sess.run(emb.remove(tf.range(20, dtype=tf.int64)))
    assert sess.run(emb.size()) == 0
    saver.restore(sess, path)
    assert sess.run(emb.size()) == 20


def test_warm_start_reshards_values_and_keeps_dense_path(tmp_path):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", 3, num_shards=2)
        w = tf.compat.v1.get_variable("w", [3])
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.range(30, dtype=tf.int64)) * w)
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        exp = emb.export()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            old = sess.run(exp)
            old_w = sess.run(w)
            ckpt = saver.save(sess, str(tmp_path / "a"))
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding("emb", 3, num_shards=3)  # another shard count
        w = tf.compat.v1.get_variable("w", [3])
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.range(30, dtype=tf.int64)) * w)
        opt = tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.7)
        opt.minimize(loss)
        tf.compat.v1.train.warm_start(ckpt, vars_to_warm_start=".*")
        exp = emb.export()
        acc = emb.slot_values(opt, "accumulator", [0])
        size = emb.size()
        with tf.compat.v1.train.MonitoredSession() as sess:  # Scaffold's init_op fills the tables
            new = sess.run(exp)
            np.testing.assert_allclose(sess.run(w), old_w)
            np.testing.assert_allclose(sess.run(acc), [[0.7] * 3])  # slots are not warm-started
            sizes = [sess.run(size)]
    o, n = np.argsort(old.keys), np.argsort(new.keys)
    np.testing.assert_array_equal(new.keys[n], old.keys[o])
    np.testing.assert_array_equal(new.values[n], old.values[o])
    assert sizes == [30]


def test_saver_built_before_optimizer_is_a_clear_error(graph):
    emb = tf_ext.get_dynamic_embedding("e", 2)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, [1]))
    tf.compat.v1.train.Saver()
    with pytest.raises(ValueError, match=r"'e': its table layout was frozen when a Saver"):
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)  # no slots: fine
