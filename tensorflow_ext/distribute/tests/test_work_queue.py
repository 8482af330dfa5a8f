"""tf_ext.distribute.WorkQueue in one process: the queue's rules through its ops, its reader, its checkpoints.

The rules are checked on the ops a reader runs (TfExtWorkQueueTake / Renew with named workers, in one Session), so
every case is exact; the reader's own threads and dataset are checked in a Session and in MonitoredTrainingSession,
and two readers (two graphs, one in-process server holding the queue) show a slow reader holding no one up. The same
rules across processes (a ps task, workers killed and restarted) are in tests/test_work_queue_cluster.py.
"""

import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.utils import loader

tf.compat.v1.disable_v2_behavior()

TAKEN, WAIT, FINISHED = 0, 1, 2
# Guards against a hang only: the conditions below are waited for, never timed.
HANG_S = 120


def _wait_until(cond, what):
    deadline = time.monotonic() + HANG_S
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.01)


class _Ops:
    """The ops a reader runs, for named workers, in one session: take(worker, finished), renew(worker)."""

    def __init__(self, queue, sess):
        ops = loader.load_ops()
        self._sess = sess
        self._worker = tf.compat.v1.placeholder(tf.string, [])
        self._finished = tf.compat.v1.placeholder(tf.bool, [])
        with tf.device(queue.device):
            self._take = ops.tf_ext_work_queue_take(queue._handle, self._worker, self._finished)
            self._renew = ops.tf_ext_work_queue_renew(queue._handle, self._worker)
            self._save = ops.tf_ext_work_queue_save(queue._handle)
        self._counts = queue.progress()

    def take(self, worker, finished=True):
        status, slice_, epoch, index, wait_secs = self._sess.run(
            self._take, {self._worker: worker, self._finished: finished}
        )
        return status, slice_.decode(), int(epoch), int(index), float(wait_secs)

    def renew(self, worker):
        return bool(self._sess.run(self._renew, {self._worker: worker}))

    def counts(self):
        return self._sess.run(self._counts)

    def save(self):
        return self._sess.run(self._save)


def _session(queue):
    sess = tf.compat.v1.Session()
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(queue.initializer)
    return sess


def _drain(ops, workers):
    """Takes round-robin for `workers` (each finishing what it held) until FINISHED; [(worker, slice, epoch)]."""
    got = []
    while True:
        statuses = []
        for w in workers:
            status, s, epoch, _, _ = ops.take(w)
            statuses.append(status)
            if status == TAKEN:
                got.append((w, s, epoch))
        if all(st == FINISHED for st in statuses):
            return got


def test_every_slice_is_handed_once_per_epoch_across_workers():
    slices = ["part-%02d" % i for i in range(13)]
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(slices, num_epochs=3, seed=7)
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            got = _drain(ops, ["a", "b", "c"])
            counts = ops.counts()
    assert len(got) == 39
    for epoch in range(3):
        handed = [s for _, s, e in got if e == epoch]
        assert sorted(handed) == slices, (epoch, handed)
    # Epochs go out in order: every slice of epoch e before any of epoch e + 1.
    assert [e for _, _, e in got] == sorted(e for _, _, e in got)
    assert {w for w, _, _ in got} == {"a", "b", "c"}
    assert counts == {"items": 39, "done": 39, "held": 0, "pending": 0}


def test_shuffle_is_a_permutation_from_the_seed_and_no_shuffle_keeps_the_order():
    slices = ["s%d" % i for i in range(20)]

    def order(**kwargs):
        with tf.Graph().as_default():
            queue = tf_ext.distribute.WorkQueue(slices, num_epochs=2, **kwargs)
            with _session(queue) as sess:
                return [s for _, s, _ in _drain(_Ops(queue, sess), ["w"])]

    a, b, c, plain = order(seed=1), order(seed=1), order(seed=2), order(shuffle=False)
    assert a == b  # the same seed in every process: the same order
    assert a != c
    assert a[:20] != a[20:]  # each epoch draws its own permutation
    assert sorted(a[:20]) == sorted(a[20:]) == sorted(slices)
    assert plain == slices + slices


def test_a_worker_holds_one_slice_and_waits_while_others_hold_the_last_ones():
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["x", "y", "z"], shuffle=False, lease_secs=600)
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            assert ops.take("slow")[:2] == (TAKEN, "x")
            # The fast worker reads everything else while the slow one holds "x".
            assert ops.take("fast")[:2] == (TAKEN, "y")
            assert ops.take("fast")[:2] == (TAKEN, "z")
            assert ops.counts() == {"items": 3, "done": 1, "held": 2, "pending": 0}
            status, _, _, _, wait_secs = ops.take("fast")  # "z" done; only "x" is out, held by "slow"
            assert status == WAIT and 0 < wait_secs <= 600
            assert ops.take("fast")[0] == WAIT
            assert ops.take("slow")[0] == FINISHED  # "x" done: nothing is held any more
            assert ops.take("fast")[0] == FINISHED
            assert ops.counts() == {"items": 3, "done": 3, "held": 0, "pending": 0}


def test_a_restarted_worker_gets_its_slice_back_first_and_never_a_finished_one():
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["s%d" % i for i in range(6)], shuffle=False, lease_secs=600)
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            assert [ops.take("w")[1] for _ in range(3)] == ["s0", "s1", "s2"]  # s0, s1 done; s2 held
            assert ops.take("other")[1] == "s3"
            # "w" starts again: its first ask does not finish what it held, and gets it back.
            assert ops.take("w", finished=False)[1] == "s2"
            assert ops.counts() == {"items": 6, "done": 2, "held": 2, "pending": 2}
            rest = [ops.take("w")[1] for _ in range(3)]
            assert rest[:2] == ["s4", "s5"] and rest[2] == ""
            assert ops.take("other")[0] == FINISHED


def test_a_slice_whose_lease_runs_out_goes_to_the_next_worker_that_asks():
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["only", "second"], shuffle=False, lease_secs=0.3)
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            assert ops.take("dead")[1] == "only"
            assert ops.take("alive")[1] == "second"
            assert ops.renew("alive")  # a worker renews what it holds
            status = WAIT
            while status == WAIT:  # "dead" never renews: its slice comes back once its lease is over
                status, s, _, _, _ = ops.take("alive")
            assert (status, s) == (TAKEN, "only")
            assert ops.counts() == {"items": 2, "done": 1, "held": 1, "pending": 0}
            assert not ops.renew("dead")  # it holds nothing now
            assert ops.take("dead")[0] == WAIT  # ... and finishing it marks nothing done
            assert ops.take("alive")[0] == FINISHED
            assert ops.counts()["done"] == 2


def test_reader_dataset_reads_every_slice_in_a_session_and_ends():
    slices = ["%d:%d" % (10 * i, 10 * i + 10) for i in range(5)]

    def records(s):
        bounds = tf.strings.to_number(tf.strings.split(s, ":"), tf.int64)
        return tf.data.Dataset.range(bounds[0], bounds[1])

    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(slices, num_epochs=2, lease_secs=0.5)
        dataset = queue.dataset().flat_map(records).batch(3)
        it = tf.compat.v1.data.make_initializable_iterator(dataset)
        nxt, progress = it.get_next(), queue.progress()
        with _session(queue) as sess:
            sess.run(it.initializer)
            coord = tf.compat.v1.train.Coordinator()
            threads = tf.compat.v1.train.start_queue_runners(sess, coord)
            read = []
            while True:
                try:
                    read.extend(sess.run(nxt).tolist())
                except tf.errors.OutOfRangeError:
                    break
            done = sess.run(progress)
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=30)  # the threads stop when asked
    assert sorted(read) == sorted(list(range(50)) * 2)
    assert done == {"items": 10, "done": 10, "held": 0, "pending": 0}
    with pytest.raises(ValueError, match="already has a reader"):
        with tf.Graph().as_default():
            queue = tf_ext.distribute.WorkQueue(slices)
            queue.dataset()
            queue.dataset()


def test_reader_in_monitored_training_session_asks_for_a_slice_only_when_the_last_is_read():
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["s%d" % i for i in range(4)], shuffle=False)
        dataset = queue.dataset().flat_map(lambda s: tf.data.Dataset.from_tensors(s).repeat(5))
        it = tf.compat.v1.data.make_initializable_iterator(dataset)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, it.initializer)
        nxt, progress = it.get_next(), queue.progress()
        seen = []
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:
            while not sess.should_stop():
                s = sess.run(nxt).decode()
                p = sess.run(progress)
                seen.append((s, p["done"], p["held"]))
    assert [s for s, _, _ in seen] == [s for s in ("s0", "s1", "s2", "s3") for _ in range(5)]
    # While a slice is read, this worker holds it alone, and every slice before it is done: nothing is read ahead
    # (the reader turns tf.data's injected prefetch off).
    assert [(done, held) for _, done, held in seen] == [(i // 5, 1) for i in range(20)], seen


def test_a_slow_reader_holds_one_slice_while_a_fast_one_reads_the_rest():
    """Two workers' graphs on one in-process server (the queue's task): the slow one takes a slice and stops; the
    fast one reads every other slice, waits, and ends only once the slow one finishes."""
    server = tf.distribute.Server.create_local_server()
    slices = ["s%02d" % i for i in range(10)]

    def reader(worker):
        graph = tf.Graph()
        with graph.as_default():
            queue = tf_ext.distribute.WorkQueue(slices, worker=worker, lease_secs=600)
            # (Two workers on one task: their iterators need names of their own, the queue is shared by name.)
            with tf.name_scope(worker):
                it = tf.compat.v1.data.make_initializable_iterator(queue.dataset())
            nxt, progress = it.get_next(), queue.progress()
            sess = tf.compat.v1.Session(server.target)
            if worker == "slow":
                sess.run(queue.initializer)
            sess.run(it.initializer)
            coord = tf.compat.v1.train.Coordinator()
            threads = tf.compat.v1.train.start_queue_runners(sess, coord)
        return sess, nxt, progress, coord, threads

    slow, fast = reader("slow"), reader("fast")
    held_by_slow = slow[0].run(slow[1]).decode()
    fast_read, fast_ended = [], threading.Event()

    def read_fast():
        try:
            while True:
                fast_read.append(fast[0].run(fast[1]).decode())
        except tf.errors.OutOfRangeError:
            fast_ended.set()

    t = threading.Thread(target=read_fast, daemon=True)
    t.start()
    _wait_until(lambda: len(fast_read) == 9, "the fast reader's 9 slices")
    # The fast reader read everything but the slow reader's slice, and waits (its dataset has not ended).
    assert sorted(fast_read + [held_by_slow]) == slices
    _wait_until(lambda: slow[0].run(slow[2])["done"] == 9, "the fast reader's last slice done")
    assert not fast_ended.is_set() and slow[0].run(slow[2])["held"] == 1
    with pytest.raises(tf.errors.OutOfRangeError):
        slow[0].run(slow[1])  # the slow reader finishes its slice: nothing is left
    t.join(HANG_S)
    assert fast_ended.is_set() and len(fast_read) == 9
    for sess, _, progress, coord, threads in (slow, fast):
        assert sess.run(progress) == {"items": 10, "done": 10, "held": 0, "pending": 0}
        coord.request_stop()
        coord.join(threads, stop_grace_period_secs=30)
        sess.close()


def _checkpointed_graph(slices, **kwargs):
    tf.compat.v1.train.get_or_create_global_step()
    queue = tf_ext.distribute.WorkQueue(slices, shuffle=False, lease_secs=600, **kwargs)
    return queue, tf.compat.v1.train.Saver()


def test_checkpoint_keeps_what_was_done_and_hands_out_again_what_was_held(tmp_path):
    slices = ["s%d" % i for i in range(6)]
    prefix = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        queue, saver = _checkpointed_graph(slices)
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            assert [ops.take("a")[1] for _ in range(3)] == ["s0", "s1", "s2"]  # s0, s1 done, s2 held
            assert ops.take("b")[1] == "s3"  # held
            saver.save(sess, prefix)
            assert ops.take("b")[1] == "s4"  # done after the save: not in the checkpoint
    with tf.Graph().as_default():
        queue, saver = _checkpointed_graph(slices)
        with tf.compat.v1.Session() as sess:  # a new process's queue: empty until the restore
            assert not sess.run(queue._is_initialized)
            saver.restore(sess, prefix)
            ops = _Ops(queue, sess)
            assert ops.counts() == {"items": 6, "done": 2, "held": 0, "pending": 4}
            assert [ops.take("c")[1] for _ in range(4)] == ["s2", "s3", "s4", "s5"]
            assert ops.take("c")[0] == FINISHED


def test_checkpoint_of_other_slices_or_without_the_queue_restores_it_afresh(tmp_path):
    with tf.Graph().as_default():
        queue, saver = _checkpointed_graph(["a", "b", "c"])
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            ops.take("w")
            ops.take("w")  # "a" done
            saver.save(sess, str(tmp_path / "queue"))
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            tf.compat.v1.train.Saver().save(sess, str(tmp_path / "no_queue"))
    for path, kwargs in (("queue", {"seed": 5}), ("queue", {"num_epochs": 2}), ("no_queue", {})):
        with tf.Graph().as_default():
            queue, saver = _checkpointed_graph(["a", "b", "c"], **kwargs)
            with tf.compat.v1.Session() as sess:
                saver.restore(sess, str(tmp_path / path))
                ops = _Ops(queue, sess)
                assert ops.counts()["done"] == 0, (path, kwargs)
                assert ops.take("w")[1] == "a"
    # The same queue restores its progress (the cases above differ by their arguments only).
    with tf.Graph().as_default():
        queue, saver = _checkpointed_graph(["a", "b", "c"])
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, str(tmp_path / "queue"))
            assert _Ops(queue, sess).counts()["done"] == 1


def test_checkpoint_restores_without_a_global_step_too(tmp_path):
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["a", "b"], shuffle=False)
        saver = tf.compat.v1.train.Saver()
        with _session(queue) as sess:
            ops = _Ops(queue, sess)
            ops.take("w")
            ops.take("w")
            saver.save(sess, str(tmp_path / "ckpt"))
    reader = tf.compat.v1.train.NewCheckpointReader(str(tmp_path / "ckpt"))
    assert re.fullmatch(rb"wq1:[0-9a-f]{16}:2x1", reader.get_tensor("work_queue-digest"))
    np.testing.assert_array_equal(reader.get_tensor("work_queue-done"), [1, 0])
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["a", "b"], shuffle=False)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, str(tmp_path / "ckpt"))
            assert _Ops(queue, sess).take("w")[1] == "b"


def test_queue_ops_name_the_problem():
    with tf.Graph().as_default():
        queue = tf_ext.distribute.WorkQueue(["a"])
        ops = _Ops(queue, tf.compat.v1.Session())
        with pytest.raises(tf.errors.FailedPreconditionError, match="work queue 'work_queue' is not initialized"):
            ops.take("w")
        with pytest.raises(tf.errors.InvalidArgumentError, match="worker must name"):
            ops._sess.run(queue.initializer)
            ops.take("")
    for kwargs, error, message in (
        ({"slices": []}, ValueError, "slices must not be empty"),
        ({"slices": "abc"}, TypeError, "slices must be a list of strings"),
        ({"slices": ["a", ""]}, ValueError, "slice 1 is an empty string"),
        ({"slices": ["a", 3]}, TypeError, "slice 1 must be a string"),
        ({"slices": ["a"], "num_epochs": 0}, ValueError, "num_epochs must be an int >= 1, got 0"),
        ({"slices": ["a"], "lease_secs": -1}, ValueError, "lease_secs must be a positive number of seconds, got -1"),
        ({"slices": ["a"], "seed": 1.5}, TypeError, "seed must be an int, got 1.5"),
        ({"slices": ["a"], "worker": ""}, ValueError, "worker must be a non-empty string"),
    ):
        with tf.Graph().as_default():
            with pytest.raises(error, match=re.escape(message)):
                tf_ext.distribute.WorkQueue(**kwargs)


def test_queue_names_are_unique_and_absolute_and_workers_default_to_tf_config(tmp_path):
    code = textwrap.dedent(
        """
        import json, os
        import tensorflow as tf
        import tensorflow_ext as tf_ext
        tf.compat.v1.disable_v2_behavior()
        with tf.name_scope("outer"):
            a = tf_ext.distribute.WorkQueue(["x"])
            b = tf_ext.distribute.WorkQueue(["x"], device="/job:other/task:2")
        a.dataset()
        with tf.device("/job:worker/task:3"):
            b.dataset()
        runners = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)
        print(json.dumps({"names": [a.name, b.name], "devices": [a.device, b.device],
                          "workers": [r._r.worker for r in runners]}))
        """
    )
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ":".join(sys.path)}

    def run(tf_config):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=dict(env, **({"TF_CONFIG": tf_config} if tf_config else {})),
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])

    plain = run(None)
    assert plain["names"] == ["work_queue", "work_queue_1"]  # not under "outer/": every process agrees
    assert plain["devices"][1] == "/job:other/task:2"
    assert plain["workers"] == ["local", "worker:3"]
    cluster = run('{"cluster": {"ps": ["h:1"], "worker": ["h:2", "h:3"]}, "task": {"type": "worker", "index": 1}}')
    assert cluster["devices"][0] == "/job:ps/task:0/device:CPU:0"
    assert cluster["workers"] == ["worker:1", "worker:1"]
