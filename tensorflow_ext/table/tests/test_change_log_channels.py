"""The table's change log by channel: every removal and untracked write reaches every started channel, and each
channel has its own capacity, read marks and commit (delta checkpoints read "checkpoint", serving updates
"serving")."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table import refs

DIM = 2


class _Table(object):
    """A table with placeholders for its writes and the change-log ops of two channels."""

    def __init__(self, capacities):
        self.ref = refs.MutableTableRef.create(refs.TableLayout(DIM), shared_name="channels")
        self.keys = tf.compat.v1.placeholder(tf.int64, [None])
        self.step = tf.compat.v1.placeholder(tf.int64, [])
        rows = tf.ones(tf.stack([tf.size(self.keys), DIM]))
        self.insert = self.ref.insert(self.keys, rows, self.step)
        self.remove = self.ref.remove(self.keys)
        self.evict = self.ref.evict(self.step, tf.constant(-1, tf.int64))
        self.start = {c: self.ref.change_log_start(tf.constant(n, tf.int64), channel=c) for c, n in capacities.items()}
        self.read = {c: self.ref.change_log(channel=c) for c in capacities}
        self.flags = {c: self.ref.change_log(read_keys=False, channel=c)[1:] for c in capacities}
        self.commit = {c: self.ref.change_log_commit(channel=c) for c in capacities}

    def put(self, sess, keys, step=1):
        sess.run(self.insert, {self.keys: np.asarray(keys, np.int64), self.step: step})

    def drop(self, sess, keys):
        sess.run(self.remove, {self.keys: np.asarray(keys, np.int64)})

    def log(self, sess, channel):
        """(sorted removed keys, enabled, untracked, overflow), marking them read."""
        removed, enabled, untracked, overflow = sess.run(self.read[channel])
        return sorted(removed.tolist()), bool(enabled), bool(untracked), bool(overflow)


def test_each_channel_sees_every_removal_and_commits_alone(graph, sess):
    t = _Table({"checkpoint": 100, "serving": 100})
    t.put(sess, range(10))
    sess.run([t.start["checkpoint"], t.start["serving"]])
    t.drop(sess, [1, 2])
    assert t.log(sess, "checkpoint") == ([1, 2], True, False, False)
    sess.run(t.commit["checkpoint"])
    t.drop(sess, [3])
    # The checkpoint channel dropped what it read; the serving channel has read and committed nothing.
    assert t.log(sess, "checkpoint") == ([3], True, False, False)
    assert t.log(sess, "serving") == ([1, 2, 3], True, False, False)
    t.drop(sess, [4])  # after the serving read: kept by its commit
    sess.run(t.commit["serving"])
    assert t.log(sess, "serving") == ([4], True, False, False)
    # Eviction (RemoveIf) logs to both: keys 0 and 5..9 have version 1 < 2.
    sess.run(t.evict, {t.step: 2})
    assert t.log(sess, "checkpoint") == ([0, 3, 4, 5, 6, 7, 8, 9], True, False, False)  # nothing committed since [3]
    assert t.log(sess, "serving") == ([0, 4, 5, 6, 7, 8, 9], True, False, False)


def test_capacity_and_overflow_are_per_channel(graph, sess):
    t = _Table({"checkpoint": 2, "serving": 10})
    t.put(sess, range(10))
    sess.run([t.start["checkpoint"], t.start["serving"]])
    t.drop(sess, [1, 2, 3])
    assert t.log(sess, "checkpoint") == ([], True, False, True)
    assert t.log(sess, "serving") == ([1, 2, 3], True, False, False)
    sess.run(t.commit["checkpoint"])
    t.drop(sess, [4])
    assert t.log(sess, "checkpoint") == ([4], True, False, False)  # the overflow was read and committed
    assert t.log(sess, "serving") == ([1, 2, 3, 4], True, False, False)


def test_untracked_writes_flag_every_channel_until_its_own_commit(graph, sess):
    t = _Table({"checkpoint": 10, "serving": 10})
    sess.run([t.start["checkpoint"], t.start["serving"]])
    t.put(sess, [1], step=-1)  # no version: untracked
    for channel in ("checkpoint", "serving"):
        enabled, untracked, overflow = sess.run(t.flags[channel])
        assert enabled and untracked and not overflow, channel
    t.log(sess, "serving")
    sess.run(t.commit["serving"])
    assert not sess.run(t.flags["serving"])[1]
    assert sess.run(t.flags["checkpoint"])[1]
    # A commit without a read since the last one changes nothing.
    sess.run(t.commit["checkpoint"])
    assert sess.run(t.flags["checkpoint"])[1]


def test_restarting_a_channel_resets_it_alone(graph, sess):
    t = _Table({"checkpoint": 10, "serving": 10})
    t.put(sess, range(4))
    sess.run([t.start["checkpoint"], t.start["serving"]])
    t.drop(sess, [0])
    t.put(sess, [9], step=-1)
    sess.run(t.start["serving"])
    assert t.log(sess, "serving") == ([], True, False, False)
    assert t.log(sess, "checkpoint") == ([0], True, True, False)


def test_a_channel_never_started_logs_nothing(graph, sess):
    t = _Table({"checkpoint": 10, "serving": 10})
    t.put(sess, range(4))
    assert t.log(sess, "serving") == ([], False, False, False)
    sess.run(t.start["checkpoint"])
    t.drop(sess, [0])
    t.put(sess, [8], step=-1)
    assert t.log(sess, "serving") == ([], False, False, False)
    sess.run(t.commit["serving"])  # no-op
    assert t.log(sess, "checkpoint") == ([0], True, True, False)


def test_the_default_channel_is_the_checkpoint_one(graph, sess):
    t = _Table({"checkpoint": 10})
    t.put(sess, range(4))
    sess.run(t.ref.change_log_start(tf.constant(10, tf.int64)))
    t.drop(sess, [2])
    assert sorted(sess.run(t.ref.change_log())[0].tolist()) == [2]
    sess.run(t.ref.change_log_commit())
    assert t.log(sess, "checkpoint") == ([], True, False, False)


def test_an_empty_channel_name_is_refused(graph, sess):
    t = _Table({})
    with pytest.raises(tf.errors.InvalidArgumentError, match="channel must be a non-empty name"):
        sess.run(t.ref.change_log(channel=""))
