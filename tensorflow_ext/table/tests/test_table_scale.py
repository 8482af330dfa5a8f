"""Large batches, growth to millions of keys, and concurrent ops on one table."""

import threading

import numpy as np
import tensorflow as tf

from tensorflow_ext.table.table_ops import HashTable


def _mix(x):
    """Spreads keys over int64 in-graph (deterministic, unique for unique x)."""
    return x * np.int64(-7046029254386353131) + np.int64(12345)


def test_large_batch_1m(graph, make_session):
    n = 1 << 20
    table = HashTable(dim=4)
    keys = _mix(tf.range(n, dtype=tf.int64))
    rows = tf.cast(tf.tile(tf.reshape(tf.range(n), [n, 1]), [1, 4]), tf.float32)
    ins = table.insert(keys, rows)
    vals, found = table.find(keys, return_found=True)
    checksum = tf.reduce_sum(vals[:, 0] - rows[:, 0])  # 0 if every row came back
    with make_session(graph) as sess:
        sess.run(ins)
        assert sess.run(table.size()) == n
        c, f = sess.run([checksum, tf.reduce_all(found)])
        assert c == 0 and f
        # find_or_insert of 1M keys, half of them existing.
        keys2 = _mix(tf.range(n // 2, n + n // 2, dtype=tf.int64))
        out = table.find_or_insert(keys2, -tf.ones([n, 4]))
        firsts = sess.run(out[:, 0])
        np.testing.assert_array_equal(firsts[: n // 2], np.arange(n // 2, n, dtype=np.float32))
        assert (firsts[n // 2 :] == -1).all()
        assert sess.run(table.size()) == n + n // 2


def test_growth_to_2m_keys(graph, make_session):
    batch = 1 << 18
    steps = 8  # 2M keys
    table = HashTable(dim=2, initial_capacity=0)
    step = tf.compat.v1.placeholder(tf.int64, [])
    keys = _mix(tf.range(batch, dtype=tf.int64) + step * batch)
    ins = table.insert(keys, tf.stack([tf.cast(keys % 1000, tf.float32), tf.ones([batch])], 1), step=step)
    size = table.size()
    mem = table.memory_bytes()
    probe = _mix(tf.constant(np.arange(0, steps * batch, 9973), tf.int64))
    vals, found = table.find(probe, return_found=True)
    with make_session(graph) as sess:
        sizes = []
        for s in range(steps):
            sess.run(ins, {step: s})
            sizes.append(sess.run(size))
        assert sizes == [batch * (s + 1) for s in range(steps)]
        v, f = sess.run([vals, found])
        assert f.all()
        np.testing.assert_array_equal(v[:, 0], (sess.run(probe) % 1000).astype(np.float32))
        raw = steps * batch * (8 + 2 * 4)
        assert sess.run(mem) >= raw


def test_parallel_ops_in_one_run_lose_no_update(graph, make_session):
    table = HashTable(dim=2, width=3)
    n_ops, n_keys = 16, 5000
    rng = np.random.RandomState(0)
    ops = []
    expected = np.zeros([n_keys, 3], np.float64)
    for i in range(n_ops):
        keys = rng.randint(0, n_keys, size=4000).astype(np.int64)  # duplicates across and within ops
        np.add.at(expected, keys, 1.0)
        ops.append(table.accumulate(keys, np.ones([4000, 3], np.float32), cols=3, count=True))
    # Concurrent readers and inserters on other keys in the same run.
    readers = [table.find(np.arange(n_keys, dtype=np.int64), cols=3) for _ in range(4)]
    inserters = [
        table.find_or_insert(
            np.arange(100000 + 1000 * i, 100000 + 1000 * (i + 1), dtype=np.int64),
            np.full([1000, 2], float(i), np.float32),
        )
        for i in range(4)
    ]
    with make_session(graph, inter_op=4, intra_op=2) as sess:
        sess.run([ops, readers, inserters])
        got = sess.run(table.find(np.arange(n_keys, dtype=np.int64), cols=3))
        np.testing.assert_array_equal(got, expected.astype(np.float32))
        k, _, _, freqs = sess.run(table.export())
        f = dict(zip(k.tolist(), freqs.tolist()))
        assert all(f.get(i, 0) == int(expected[i, 0]) for i in range(n_keys))
        for i in range(4):
            np.testing.assert_array_equal(
                sess.run(table.find(np.arange(100000 + 1000 * i, 100000 + 1000 * (i + 1), dtype=np.int64))),
                np.full([1000, 2], float(i)),
            )


def test_python_threads_calling_run_concurrently(graph, make_session):
    table = HashTable(dim=1)
    n_threads, iters, n_keys = 4, 40, 2000
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    acc = table.accumulate(keys, tf.ones([tf.size(keys), 1]))
    tid = tf.compat.v1.placeholder(tf.int64, [])
    own_keys = tf.range(1000, dtype=tf.int64) + (tid + 1) * 1000000
    fo = table.find_or_insert(own_keys, tf.ones([1000, 1]) * tf.cast(tid, tf.float32))
    rng = np.random.RandomState(1)
    batches = [[rng.randint(0, n_keys, size=3000).astype(np.int64) for _ in range(iters)] for _ in range(n_threads)]
    expected = np.zeros(n_keys)
    for bs in batches:
        for b in bs:
            np.add.at(expected, b, 1.0)
    errors = []
    with make_session(graph, inter_op=2, intra_op=2) as sess:

        def work(t):
            try:
                for b in batches[t]:
                    sess.run(acc, {keys: b})
                    sess.run(fo, {tid: t})
            except Exception as e:  # pylint: disable=broad-except
                errors.append(e)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        got = sess.run(table.find(np.arange(n_keys, dtype=np.int64)))[:, 0]
        np.testing.assert_array_equal(got, expected.astype(np.float32))
        assert sess.run(table.size()) == np.count_nonzero(expected) + n_threads * 1000
        for t in range(n_threads):
            np.testing.assert_array_equal(
                sess.run(table.find(own_keys, default_value=-1.0), {tid: t}), np.full([1000, 1], float(t))
            )
