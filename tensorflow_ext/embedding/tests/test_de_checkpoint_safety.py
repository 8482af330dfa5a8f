"""Checkpoints in day-after-day pipelines: restores are atomic for concurrent lookups, a save killed midway leaves the
previous checkpoint loadable, and a damaged checkpoint is an error with no table changed.

Each scenario runs in fresh processes (subprocess), as a serving process, a trainer killed by the scheduler and the
job that restarts from its checkpoint do. References are numpy.
"""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_PRELUDE = """
import os, sys, threading, time
sys.path.insert(0, %r)
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import tensorflow_ext as tf_ext
""" % (
    _ROOT,
)


def _run(script, timeout=400):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


@pytest.mark.parametrize("num_shards", [1, 2])
def test_restore_is_atomic_for_concurrent_lookups(tmp_path, num_shards):
    # Two checkpoints hold the same keys with different rows (A: key/1000 + column, B: A + 1000). A reader thread
    # looks up keys of both in a loop while the main thread restores A, B, A, ... : every row read must be A's or
    # B's, never the initializer's -1 (an empty or half-filled table); with one shard, every lookup must be all A or
    # all B. The tables are large enough that each import takes a while.
    # The test forces the interleaving instead of hoping for it: a restore starts only after the reader has done
    # QUIET lookups since the previous restore returned (each of which must read exactly the checkpoint restored
    # last), and restores go on until at least OVERLAPPED lookups were in flight during a restore (a lookup that
    # started before a restore returned and ended after it started). The waits time out only against a hang.
    out = _run(
        """
        N, DIM, BATCH, RESTORES, QUIET, OVERLAPPED = 200000, 8, 4096, 16, 2, 16
        HANG_S, MAX_RESTORES = 300, 40 * RESTORES
        keys = np.arange(N, dtype=np.int64) * 7 + 3
        row_a = lambda k: k[:, None] / 1000.0 + np.arange(DIM)[None, :]
        emb = tf_ext.get_dynamic_embedding("emb", DIM, num_shards=%d, initializer=-1.0)
        ids = tf.compat.v1.placeholder(tf.int64, [BATCH])
        rows = tf_ext.embedding_lookup(emb, ids, is_training=False)
        new_values = tf.compat.v1.placeholder(tf.float32, [N, DIM])
        fill = emb.insert(keys, new_values)
        saver = tf.compat.v1.train.Saver()
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(fill, {new_values: row_a(keys)})
            a = saver.save(sess, os.path.join(%r, "a"))
            sess.run(fill, {new_values: row_a(keys) + 1000.0})
            b = saver.save(sess, os.path.join(%r, "b"))  # the table now holds B
            stop = threading.Event()
            cond = threading.Condition()
            # Restores started and finished by the main thread; quiet: the reader's lookups since the last restore
            # returned that ran while no restore was running.
            clock = dict(started=0, finished=0, quiet=0)
            stats = dict(lookups=0, all_a=0, all_b=0, mixed=0, bad_rows=0, overlapped=0, quiet=0, quiet_wrong=0)
            errors = []

            def reader():
                rng = np.random.RandomState(0)
                try:
                    while not stop.is_set():
                        k = keys[rng.randint(0, N, BATCH)]
                        with cond:
                            finished_before = clock["finished"]
                        got = sess.run(rows, {ids: k})
                        is_a = np.all(got == row_a(k).astype(np.float32), axis=1)
                        is_b = np.all(got == (row_a(k) + 1000.0).astype(np.float32), axis=1)
                        stats["lookups"] += 1
                        stats["bad_rows"] += int(np.sum(~(is_a | is_b)))
                        if is_a.all():
                            stats["all_a"] += 1
                        elif is_b.all():
                            stats["all_b"] += 1
                        else:
                            stats["mixed"] += 1
                        with cond:
                            if clock["started"] > finished_before:  # a restore ran during part of this lookup
                                stats["overlapped"] += 1
                            else:  # no restore ran at any time during it: it reads the last one restored
                                stats["quiet"] += 1
                                restored_a = clock["finished"] %% 2 == 1  # restores are A, B, A, ...; before: B
                                if not (is_a.all() if restored_a else is_b.all()):
                                    stats["quiet_wrong"] += 1
                                clock["quiet"] += 1
                            cond.notify_all()
                except Exception as e:  # reported below
                    errors.append(repr(e))
                with cond:
                    cond.notify_all()

            def wait_for_quiet_lookups(what):
                with cond:
                    done = cond.wait_for(lambda: clock["quiet"] >= QUIET or not t.is_alive(), timeout=HANG_S)
                assert not errors, errors
                assert done and t.is_alive(), "the reader did no lookup %%s (hang guard)" %% what

            t = threading.Thread(target=reader)
            t.start()
            i = 0
            while i < RESTORES or stats["overlapped"] < OVERLAPPED:
                assert i < MAX_RESTORES, ("no lookup overlapped a restore (hang guard)", stats)
                wait_for_quiet_lookups("before restore %%d" %% i)
                with cond:
                    clock["started"] += 1
                saver.restore(sess, a if i %% 2 == 0 else b)
                with cond:
                    clock["finished"] += 1
                    clock["quiet"] = 0
                i += 1
            wait_for_quiet_lookups("after the last restore")
            stop.set()
            t.join()
            assert not errors, errors
            stats["restores"] = i
            print("STATS", stats)
        """
        % (num_shards, str(tmp_path), str(tmp_path))
    )
    stats = eval(out.split("STATS", 1)[1].strip())  # a dict literal printed by the script
    print(stats)
    restores, quiet, overlapped = 16, 2, 16
    assert stats["restores"] >= restores, stats
    assert stats["quiet"] >= (stats["restores"] + 1) * quiet, stats
    assert stats["overlapped"] >= overlapped, stats  # the lookups really overlapped the restores
    assert stats["lookups"] == stats["quiet"] + stats["overlapped"], stats
    assert stats["all_a"] > 0 and stats["all_b"] > 0, stats
    assert stats["quiet_wrong"] == 0, stats  # a lookup after a restore returned reads that checkpoint
    assert stats["bad_rows"] == 0, stats
    if num_shards == 1:
        assert stats["mixed"] == 0, stats


def test_save_killed_midway_leaves_the_previous_checkpoint_loadable(tmp_path):
    # A trainer saves model-1, changes every row, and is killed while writing model-2. A fresh process restores the
    # latest checkpoint: model-1, every row as it was saved.
    # The kill lands mid-write whatever the machine's speed: before the second save the trainer limits the size of
    # the files it may write (RLIMIT_FSIZE) well below that of the data file, so the kernel kills it (SIGXFSZ, whose
    # default action ends the process at once, without cleanup, as SIGKILL does) in the middle of writing it.
    ckpt_dir = str(tmp_path / "ckpt")
    os.makedirs(ckpt_dir)
    script = textwrap.dedent(
        """
        N, DIM = 1500000, 64
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding("emb", DIM, initializer=0.0)
        keys = tf.range(N, dtype=tf.int64)
        # Exact in float32 (multiples of 0.25 below 2**20): the reference needs no tolerance.
        base = tf.cast(keys[:, None] %% 997, tf.float32) * 0.25 + tf.range(DIM, dtype=tf.float32)[None, :]
        shift = tf.compat.v1.placeholder(tf.float32, [])
        fill = emb.insert(keys, base + shift)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill, {shift: 0.0})
            saver.save(sess, os.path.join(%r, "model"), global_step=1)
            sess.run(fill, {shift: 1.0})
            import resource, signal
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: the kernel's default ends the process
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            data_bytes = os.path.getsize(os.path.join(%r, "model-1.data-00000-of-00001"))
            resource.setrlimit(resource.RLIMIT_FSIZE, (data_bytes // 8, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            print("SAVING", flush=True)
            saver.save(sess, os.path.join(%r, "model"), global_step=2)
            print("SAVED", flush=True)
        """
        % (ckpt_dir, ckpt_dir, ckpt_dir)
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen(
        [sys.executable, "-c", _PRELUDE + script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        out, err = proc.communicate(timeout=400)  # a guard against a hang only
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGXFSZ, (proc.returncode, out, err[-4000:])
    assert "SAVING" in out and "SAVED" not in out, out
    left = sorted(os.listdir(ckpt_dir))
    assert "model-2.index" not in left, left  # killed mid-save, not after
    assert any(f.startswith("model-2") for f in left), left  # its partial files are there

    out = _run(
        """
        emb = tf_ext.get_dynamic_embedding("emb", 64, initializer=0.0)
        gs = tf.compat.v1.train.get_or_create_global_step()
        exp = emb.export()
        saver = tf.compat.v1.train.Saver()
        latest = tf.train.latest_checkpoint(%r)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, latest)
            e = sess.run(exp)
        order = np.argsort(e.keys)
        keys, values = e.keys[order], e.values[order]
        assert np.array_equal(keys, np.arange(1500000)), keys[:10]
        expected = (keys[:, None] %% 997).astype(np.float32) * 0.25 + np.arange(64, dtype=np.float32)
        assert np.array_equal(values, expected), np.abs(values - expected).max()
        print("RESTORED", os.path.basename(latest))
        """
        % ckpt_dir
    )
    assert "RESTORED model-1" in out, out


def _two_shard_checkpoint(path):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", 4, num_shards=2, initializer=0.25)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.range(50, dtype=tf.int64)))
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(train)
            return saver.save(sess, path)


@pytest.mark.parametrize("cut", [4, "half"])
def test_truncated_data_file_is_an_error_and_changes_no_table(tmp_path, cut):
    # Cutting the last 4 bytes damages only the tensor stored last (one of part_1's), so part_0's tensors still read
    # fine: no shard may be imported all the same, and the error names the file and what it lacks.
    prefix = _two_shard_checkpoint(str(tmp_path / "model"))
    data = prefix + ".data-00000-of-00001"
    with open(data, "rb") as f:
        raw = f.read()
    with open(data, "wb") as f:
        f.write(raw[: len(raw) - 4] if cut == 4 else raw[: len(raw) // 2])
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", 4, num_shards=2, initializer=7.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.range(50, dtype=tf.int64)))
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
        fill = tf_ext.embedding_lookup(emb, tf.range(1000, 1040, dtype=tf.int64), is_training=True)
        exp = emb.export(with_slots=True)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(fill)
            before = sess.run(exp)
            with pytest.raises(tf.errors.DataLossError) as info:
                saver.restore(sess, prefix)
            after = sess.run(exp)
    msg = info.value.message
    assert "checkpoint %s is truncated: its data file %s has %d bytes" % (prefix, data, os.path.getsize(data)) in msg
    assert "but tensor emb/part_" in msg
    for got, want in zip(after, before):
        np.testing.assert_array_equal(np.sort(got, axis=0), np.sort(want, axis=0))
    assert sorted(after.keys.tolist()) == list(range(1000, 1040))
