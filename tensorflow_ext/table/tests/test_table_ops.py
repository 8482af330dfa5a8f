"""Semantics of the tf_ext table ops against numpy/dict references (TF1 graph mode)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table.table_ops import HashTable
from tensorflow_ext.utils.loader import load_ops


def _ref_find(ref, keys, dim, default=0.0):
    flat = np.asarray(keys).reshape(-1)
    out = np.array([ref.get(int(k), np.full(dim, default, np.float32)) for k in flat], np.float32)
    return out.reshape(np.shape(keys) + (dim,))


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 2)])
def test_insert_find_any_rank(graph, sess, shape):
    rng = np.random.RandomState(len(shape))
    dim = 3
    table = HashTable(dim=dim)
    keys = rng.randint(-50, 50, size=shape).astype(np.int64)
    vals = rng.randn(*(shape + (dim,))).astype(np.float32)
    ref = {}
    for k, v in zip(keys.reshape(-1), vals.reshape(-1, dim)):
        ref[int(k)] = v  # last wins
    query = rng.randint(-60, 60, size=shape).astype(np.int64)
    ins = table.insert(keys, vals)
    values, found = table.find(query, default_value=-1.0, return_found=True)
    assert values.shape.as_list() == list(shape) + [dim]
    assert found.shape.as_list() == list(shape)
    sess.run(ins)
    got_v, got_f = sess.run([values, found])
    np.testing.assert_array_equal(got_v, _ref_find(ref, query, dim, -1.0))
    np.testing.assert_array_equal(got_f, np.vectorize(lambda k: int(k) in ref)(query).reshape(shape))
    assert sess.run(table.size()) == len(ref)


def test_duplicates_in_one_batch(graph, sess):
    table = HashTable(dim=2)
    keys = np.array([5, 1, 5, 2, 5, 1], np.int64)
    vals = np.arange(12, dtype=np.float32).reshape(6, 2)
    sess.run(table.insert(keys, vals))
    got = sess.run(table.find([5, 1, 2]))
    np.testing.assert_array_equal(got, vals[[4, 5, 3]])  # last occurrence wins

    acc = HashTable(dim=2, name="acc")
    sess.run(acc.accumulate(keys, vals))
    got = sess.run(acc.find([5, 1, 2]))
    np.testing.assert_allclose(got, [vals[[0, 2, 4]].sum(0), vals[[1, 5]].sum(0), vals[3]])

    foi = HashTable(dim=2, name="foi")
    out = sess.run(foi.find_or_insert(keys, vals, step=3))
    # The first occurrence inserts; the later ones read the inserted row.
    np.testing.assert_array_equal(out, vals[[0, 1, 0, 3, 0, 1]])
    ks, _, versions, freqs = sess.run(foi.export())
    meta = {int(k): (int(v), int(f)) for k, v, f in zip(ks, versions, freqs)}
    assert meta == {5: (3, 3), 1: (3, 2), 2: (3, 1)}


def test_empty_batches(graph, sess):
    table = HashTable(dim=4, width=6)
    empty_k = tf.zeros([0], tf.int64)
    empty_v = tf.zeros([0, 4])
    v = table.find(empty_k)
    fo = table.find_or_insert(empty_k, empty_v)
    empty2 = tf.zeros([3, 0], tf.int64)
    v2 = table.find(empty2)
    assert v2.shape.as_list() == [3, 0, 4]
    res = sess.run(
        [
            v,
            fo,
            v2,
            table.insert(empty_k, empty_v),
            table.accumulate(empty_k, empty_v),
            table.remove(empty_k),
            table.import_(empty_k, empty_v, clear_first=False),
        ]
    )
    assert res[0].shape == (0, 4) and res[1].shape == (0, 4) and res[2].shape == (3, 0, 4)
    assert res[5] == 0
    keys, vals, vers, freqs = sess.run(table.export())
    assert keys.shape == (0,) and vals.shape == (0, 4) and vers.shape == (0,) and freqs.shape == (0,)
    assert sess.run(table.size()) == 0


def test_find_or_insert_and_metadata(graph, sess):
    table = HashTable(dim=2, width=4, column_defaults=[0, 0, 0.1, 0.2])
    keys = tf.constant([10, 20], tf.int64)
    out1 = table.find_or_insert(keys, [[1, 1], [2, 2]], step=7)
    with tf.control_dependencies([out1]):
        out2 = table.find_or_insert(tf.constant([20, 30], tf.int64), [[9, 9], [3, 3]], step=8)
    o1, o2 = sess.run([out1, out2])
    np.testing.assert_array_equal(o1, [[1, 1], [2, 2]])
    np.testing.assert_array_equal(o2, [[2, 2], [3, 3]])
    k, v, ver, fr = sess.run(table.export(full_rows=True))
    got = {int(a): (list(b), int(c), int(d)) for a, b, c, d in zip(k, v, ver, fr)}
    assert got[10] == ([1, 1, pytest.approx(0.1), pytest.approx(0.2)], 7, 1)
    assert got[20] == ([2, 2, pytest.approx(0.1), pytest.approx(0.2)], 8, 2)
    assert got[30] == ([3, 3, pytest.approx(0.1), pytest.approx(0.2)], 8, 1)
    # count=False leaves frequencies alone; step=-1 leaves versions alone.
    sess.run(table.find_or_insert([10], [[0, 0]], count=False))
    k, _, ver, fr = sess.run(table.export())
    assert dict(zip(k.tolist(), zip(ver.tolist(), fr.tolist())))[10] == (7, 1)


def test_find_or_insert_callable_initializer(graph, sess):
    table = HashTable(dim=8)
    keys = tf.constant([[1, 2, 3], [4, 1, 2]], tf.int64)
    out = table.find_or_insert(keys, tf.compat.v1.random_normal_initializer(seed=1))
    assert out.shape.as_list() == [2, 3, 8]
    got = sess.run(out)
    np.testing.assert_array_equal(got[0, 0], got[1, 1])  # same key, same row
    assert not np.allclose(got[0, 0], got[0, 1])  # each new key its own draw
    np.testing.assert_array_equal(sess.run(table.find(keys)), got)


def test_column_ranges(graph, sess):
    table = HashTable(dim=2, width=5, column_defaults=[0, 0, 1, 2, 3])
    sess.run(table.insert([1, 2], [[1, 1], [2, 2]]))
    sess.run(table.insert([2], [[7, 8]], col_begin=3, cols=2))
    np.testing.assert_array_equal(sess.run(table.find([1, 2], cols=5)), [[1, 1, 1, 2, 3], [2, 2, 1, 7, 8]])
    sess.run(table.accumulate([1, 1], [[0.5], [0.25]], col_begin=2, cols=1))
    np.testing.assert_array_equal(sess.run(table.find([1], col_begin=2, cols=1)), [[1.75]])
    # A new key inserted through slot columns gets defaults for the embedding.
    sess.run(table.insert([3], [[9]], col_begin=4, cols=1))
    np.testing.assert_array_equal(sess.run(table.find([3], cols=5)), [[0, 0, 1, 2, 9]])


def test_accumulate_insert_missing(graph, sess):
    table = HashTable(dim=1, width=2, column_defaults=[1.0, 5.0])
    sess.run(table.accumulate([1], [[2.0]], insert_missing=False))
    assert sess.run(table.size()) == 0
    sess.run(table.accumulate([1], [[2.0]]))
    np.testing.assert_array_equal(sess.run(table.find([1], cols=2)), [[3.0, 5.0]])


def test_remove_size_clear_memory(graph, sess):
    table = HashTable(dim=4)
    sess.run(table.insert(tf.range(100, dtype=tf.int64), tf.ones([100, 4])))
    assert sess.run(table.size()) == 100
    assert sess.run(table.remove([1, 2, 2, 500])) == 2
    assert sess.run(table.size()) == 98
    assert sess.run(table.memory_bytes()) >= 98 * 4 * 4
    sess.run(table.clear())
    assert sess.run(table.size()) == 0
    _, found = table.find([3], return_found=True)
    assert not sess.run(found)[0]


def test_export_import_round_trip(graph, sess):
    src = HashTable(dim=2, width=3, name="src")
    keys = np.arange(50, dtype=np.int64) * 7
    vals = np.random.RandomState(0).randn(50, 3).astype(np.float32)
    sess.run(src.import_(keys, vals, versions=np.arange(50), frequencies=np.arange(50) * 2, full_rows=True))
    ex = sess.run(src.export(full_rows=True))
    order = np.argsort(ex[0])
    np.testing.assert_array_equal(ex[0][order], keys)
    np.testing.assert_array_equal(ex[1][order], vals)
    np.testing.assert_array_equal(ex[2][order], np.arange(50))
    np.testing.assert_array_equal(ex[3][order], np.arange(50) * 2)

    dst = HashTable(dim=2, width=3, name="dst")
    sess.run(dst.insert([999], [[1, 1]]))
    k, v, ver, fr = src.export(full_rows=True)
    sess.run(dst.import_(k, v, ver, fr, full_rows=True))  # clear_first: 999 is gone
    ex2 = sess.run(dst.export(full_rows=True))
    order2 = np.argsort(ex2[0])
    for a, b in zip(ex, ex2):
        np.testing.assert_array_equal(a[order], b[order2])
    # clear_first=False merges.
    sess.run(dst.import_([999], [[1, 1]], clear_first=False))
    assert sess.run(dst.size()) == 51


def test_evict(graph, sess):
    table = HashTable(dim=1)
    for step, keys in enumerate([[1, 2, 3], [2, 3], [3]]):
        sess.run(table.find_or_insert(keys, np.zeros([len(keys), 1], np.float32), step=step))
    # versions: 1->0, 2->1, 3->2; frequencies: 1->1, 2->2, 3->3
    assert sess.run(table.evict(min_version=-1, min_frequency=-1)) == 0
    assert sess.run(table.evict(min_frequency=2)) == 1
    assert sorted(sess.run(table.export())[0].tolist()) == [2, 3]
    assert sess.run(table.evict(min_version=2)) == 1
    assert sess.run(table.export())[0].tolist() == [3]


def test_static_shapes(graph):
    ops = load_ops()
    table = HashTable(dim=5, width=7)
    keys = tf.compat.v1.placeholder(tf.int64, [None, 3])
    assert table.find(keys).shape.as_list() == [None, 3, 5]
    assert table.find(keys, cols=2, col_begin=5).shape.as_list() == [None, 3, 2]
    # cols=-1 resolves dim through the handle's shape data.
    v, f = ops.tf_ext_table_find(table.resource_handle, keys, 0.0)
    assert v.shape.as_list() == [None, 3, 5] and f.shape.as_list() == [None, 3]
    assert ops.tf_ext_table_export(table.resource_handle)[1].shape.as_list() == [None, 5]
    assert table.find_or_insert(keys, tf.zeros([6, 5])).shape.as_list() == [None, 3, 5]
    # Statically known width mismatch fails at graph construction.
    with pytest.raises(ValueError, match="row width mismatch"):
        table.insert([1, 2], tf.zeros([2, 4]))
    with pytest.raises(ValueError, match="step must be a scalar"):
        table.insert([1, 2], tf.zeros([2, 5]), step=[1, 2])


def test_tf_builtin_lookup_ops_on_handle(graph, sess):
    table = HashTable(dim=3)
    h = table.resource_handle
    keys = tf.constant([1, 2, 3], tf.int64)
    vals = tf.constant(np.arange(9, dtype=np.float32).reshape(3, 3))
    sess.run(tf.raw_ops.LookupTableInsertV2(table_handle=h, keys=keys, values=vals))
    assert sess.run(tf.raw_ops.LookupTableSizeV2(table_handle=h)) == 3
    found = tf.raw_ops.LookupTableFindV2(
        table_handle=h, keys=tf.constant([[3, 9]], tf.int64), default_value=tf.constant([-1.0, -1.0, -1.0])
    )
    assert found.shape.as_list() == [1, 2, 3]
    np.testing.assert_array_equal(sess.run(found), [[[6, 7, 8], [-1, -1, -1]]])
    sess.run(tf.raw_ops.LookupTableRemoveV2(table_handle=h, keys=tf.constant([2], tf.int64)))
    ek, ev = tf.raw_ops.LookupTableExportV2(table_handle=h, Tkeys=tf.int64, Tvalues=tf.float32)
    ek, ev = sess.run([ek, ev])
    order = np.argsort(ek)
    np.testing.assert_array_equal(ek[order], [1, 3])
    np.testing.assert_array_equal(ev[order], [[0, 1, 2], [6, 7, 8]])
    sess.run(
        tf.raw_ops.LookupTableImportV2(
            table_handle=h, keys=tf.constant([5], tf.int64), values=tf.constant([[5.0, 5.0, 5.0]])
        )
    )
    assert sess.run(table.export())[0].tolist() == [5]  # import replaces the contents


def test_tf_lookup_style_api(graph):
    table = HashTable(dim=2, default_value=[-1.0, -2.0])
    assert isinstance(table, tf.lookup.experimental.MutableHashTable.__mro__[1])
    assert table.key_dtype == tf.int64 and table.value_dtype == tf.float32
    ins = table.insert(tf.constant([1], tf.int64), tf.constant([[3.0, 4.0]]))
    out = table.lookup(tf.constant([1, 2], tf.int64))
    out2 = table[tf.constant([[2]], tf.int64)]
    with tf.compat.v1.Session() as s:  # a plain default-config session
        s.run(ins)
        np.testing.assert_array_equal(s.run(out), [[3, 4], [-1, -2]])
        np.testing.assert_array_equal(s.run(out2), [[[-1, -2]]])
        assert s.run(table.size()) == 1
    assert table.name == "TfExtHashTable"


def test_int32_keys_are_accepted(graph, sess):
    table = HashTable(dim=1)
    sess.run(table.insert(tf.constant([1, 2], tf.int32), [[1.0], [2.0]]))
    np.testing.assert_array_equal(sess.run(table.find(tf.constant([2], tf.int32))), [[2.0]])


def test_shared_name_shares_one_table(graph, sess):
    a = HashTable(dim=2, shared_name="shared_t")
    b = HashTable(dim=2, shared_name="shared_t", name="other")
    sess.run(a.insert([1], [[1, 2]]))
    np.testing.assert_array_equal(sess.run(b.find([1])), [[1, 2]])


def test_tf_find_v2_per_key_default_and_errors(graph, sess):
    table = HashTable(dim=2)
    h = table.resource_handle
    sess.run(table.insert([1], [[1.0, 1.0]]))
    out = tf.raw_ops.LookupTableFindV2(
        table_handle=h, keys=tf.constant([1, 2], tf.int64), default_value=tf.constant([[7.0, 7.0], [8.0, 9.0]])
    )
    np.testing.assert_array_equal(sess.run(out), [[1, 1], [8, 9]])
    with pytest.raises(tf.errors.InvalidArgumentError):
        sess.run(
            tf.raw_ops.LookupTableInsertV2(
                table_handle=h, keys=tf.constant([1], tf.int64), values=tf.constant([[1.0, 2.0, 3.0]])
            )
        )


def test_saver_round_trip(tmp_path):
    path = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        table = HashTable(dim=2, width=3, checkpoint=True, name="saved")
        fill = table.find_or_insert([1, 2, 3], [[1, 1], [2, 2], [3, 3]], step=4)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(fill)
            saver.save(sess, path)
    with tf.Graph().as_default():
        table = HashTable(dim=2, width=3, checkpoint=True, name="saved")
        ins = table.insert([99], [[9, 9]])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(ins)
            saver.restore(sess, path)
            k, v, ver, fr = sess.run(table.export(full_rows=True))
            order = np.argsort(k)
            np.testing.assert_array_equal(k[order], [1, 2, 3])  # 99 is gone (restore replaces)
            np.testing.assert_array_equal(v[order], [[1, 1, 0], [2, 2, 0], [3, 3, 0]])
            np.testing.assert_array_equal(ver[order], [4, 4, 4])
            np.testing.assert_array_equal(fr[order], [1, 1, 1])


@pytest.mark.parametrize("huge_pages", [True, False])
def test_huge_pages_option_keeps_contents(graph, sess, huge_pages):
    # 600K rows of width 32 pass the arena's slab threshold, so the huge-page
    # (madvise) and plain allocation paths both run on large memory.
    rng = np.random.RandomState(11)
    n, dim = 600000, 32
    table = HashTable(dim=dim, huge_pages=huge_pages)
    assert table.resource_handle.op.get_attr("huge_pages") == huge_pages
    keys = np.unique(rng.randint(0, 1 << 40, size=n + 1000, dtype=np.int64))[:n]
    rng.shuffle(keys)
    vals = rng.randn(n, dim).astype(np.float32)
    sess.run(table.insert(keys, vals))
    got = sess.run(table.find(keys[::7]))
    np.testing.assert_array_equal(got, vals[::7])
    assert sess.run(table.size()) == n


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_eager_table_ops_use_its_handle_after_saved_model_save(tmp_path):
    # tf.saved_model.save traces the resource's creator (a second _create_resource in a function graph); the
    # table's ops must keep using its own handle afterwards. Eager mode, so in a fresh process.
    code = """
        import tensorflow as tf
        from tensorflow_ext.table.table_ops import HashTable
        table = HashTable(dim=2)
        table.insert(tf.constant([1, 2], tf.int64), tf.constant([[1.0, 1.0], [2.0, 2.0]]))
        module = tf.Module()
        module.table = table
        tf.saved_model.save(module, %r)
        print(table.find(tf.constant([1, 3], tf.int64)).numpy().tolist(), int(table.size()))
    """ % str(
        tmp_path / "saved"
    )
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[[1.0, 1.0], [0.0, 0.0]] 2"


def test_small_table_memory_is_a_floor_plus_bytes_per_key(graph, sess):
    # dim 9 + Adagrad (width 18, 92-byte rows), 16 shards: a fixed floor (the shards' bookkeeping) plus at most
    # 4 rows + 160 B per key (small first chunks), not a ~16 KiB chunk per shard touched (before: 15 KiB for 1 key,
    # ~190 KiB for 100); a restore of 2 keys takes no more than the table that held them. Margins, not exact bytes.
    per_key = 4 * 92 + 160
    empty = sess.run(HashTable(dim=9, width=18, shard_bits=4).memory_bytes())
    assert empty <= 8 << 10
    for n in (1, 10, 100):
        table = HashTable(dim=9, width=18, shard_bits=4)
        sess.run(table.insert(tf.range(n, dtype=tf.int64) * 7919, tf.ones([n, 9])))
        held = sess.run(table.memory_bytes())
        assert held - empty <= n * per_key, (n, held, empty)
    table = HashTable(dim=9, width=18, shard_bits=4)
    sess.run(table.insert([3, 11], tf.ones([2, 9])))
    held = sess.run(table.memory_bytes())
    assert held <= empty + 2 * per_key
    sess.run(table.import_(tf.constant([3, 11], tf.int64), tf.ones([2, 9]), clear_first=True))
    assert sess.run(table.size()) == 2
    assert sess.run(table.memory_bytes()) <= held
