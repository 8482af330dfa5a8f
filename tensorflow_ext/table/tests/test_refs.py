"""The typed table refs: the column range in one place, the operations each kind allows, and their shared reads."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table import refs


def test_layout_resolves_column_ranges():
    layout = refs.TableLayout(2, 6, [1.0] * 6)
    assert layout.columns() == (0, 2)
    assert layout.columns(2, 4) == (2, 4)
    assert layout.columns(3, None) == (3, 2)
    assert layout.columns(5, 1, full_rows=True) == (0, 6)
    assert refs.TableLayout(3).column_defaults == [0.0, 0.0, 0.0]
    assert refs.TableLayout(3).column_defaults_attr == []


@pytest.mark.parametrize(
    "args, message",
    [((0,), "dim must be >= 1"), ((3, 2), "width must be >= dim"), ((2, 4, [1.0]), "column_defaults must be empty")],
)
def test_layout_refuses_invalid(args, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        refs.TableLayout(*args)


def test_frozen_ref_has_no_writes():
    writes = {"insert", "find_or_insert", "accumulate", "remove", "clear", "import_", "evict", "change_log_start"}
    assert writes <= set(dir(refs.MutableTableRef))
    assert not writes & set(dir(refs.FrozenTableRef))
    shared_reads = {"find", "contains", "size", "memory_bytes", "export", "export_split"}
    assert shared_reads <= set(dir(refs.MutableTableRef)) & set(dir(refs.FrozenTableRef))
    assert refs.MutableTableRef.writable and not refs.FrozenTableRef.writable


def test_shared_reads_agree_across_kinds(graph, sess):
    keys = tf.constant([3, 7, 11], tf.int64)
    rows = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    mutable = refs.MutableTableRef.create(refs.TableLayout(2, 4, [0.0, 0.0, 9.0, 9.0]), shared_name="refs_mutable")
    frozen = refs.FrozenTableRef.create(2, shared_name="refs_frozen")
    sess.run([mutable.insert(keys, rows, tf.constant(5, tf.int64)), frozen.build(keys, rows)])
    query = tf.constant([7, 8], tf.int64)
    for table in (mutable, frozen):
        values, found = sess.run(table.find(query, tf.zeros([2])))
        np.testing.assert_array_equal(values, [[3.0, 4.0], [0.0, 0.0]])
        np.testing.assert_array_equal(found, [True, False])
        np.testing.assert_array_equal(sess.run(table.contains(query)), [True, False])
        assert sess.run(table.size()) == 3
        k, v, extra, _, _ = sess.run(table.export_split())
        np.testing.assert_array_equal(v[np.argsort(k)], rows.eval(session=sess))
        assert extra.shape == (3, 0)
    _, _, extra, versions, _ = sess.run(mutable.export_split(full_rows=True))
    np.testing.assert_array_equal(extra, np.full((3, 2), 9.0))
    np.testing.assert_array_equal(versions, [5, 5, 5])
    np.testing.assert_array_equal(sess.run(frozen.export_split(full_rows=True))[3], [0, 0, 0])


def test_storage_names_map_dtypes_both_ways():
    pairs = [(tf.float32, "float32"), (tf.bfloat16, "bfloat16"), (tf.float16, "float16"), (tf.int8, "int8_row")]
    for dtype, name in pairs:
        assert refs.storage_name(dtype) == name
        assert refs.storage_dtype(name) == dtype
    assert refs.storage_name("bfloat16") == "bfloat16" and refs.storage_name(np.float16) == "float16"
    assert refs.STORAGES == tuple(name for _, name in pairs)
    with pytest.raises(ValueError, match="rows are stored as one of tf.float32, tf.bfloat16, tf.float16, tf.int8"):
        refs.storage_name(tf.float64)
    with pytest.raises(ValueError, match="unsupported row dtype 'no_such_dtype'"):
        refs.storage_name("no_such_dtype")
    with pytest.raises(ValueError, match="unknown row storage 'bf16': expected one of float32, bfloat16"):
        refs.storage_dtype("bf16")


def test_layout_compact_columns():
    assert refs.TableLayout(4, 12).compact_cols == 0
    assert refs.TableLayout(4, 12, compact_slots=True).compact_cols == 0  # float32: nothing is compact
    half = refs.TableLayout(4, 12, storage="bfloat16", rounding="stochastic")
    assert (half.storage, half.rounding, half.compact_slots, half.compact_cols) == ("bfloat16", "stochastic", False, 4)
    assert refs.TableLayout(4, 12, storage="float16", compact_slots=True).compact_cols == 12
    assert refs.TableLayout(4, storage="int8_row").compact_cols == 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(storage="bf16"), "storage must be one of float32, bfloat16, float16, int8_row, got 'bf16'"),
        (dict(storage=tf.bfloat16), "storage must be one of"),
        (dict(rounding="up"), "rounding must be one of nearest, stochastic, got 'up'"),
        (dict(compact_slots=1), "compact_slots must be True or False, got 1"),
        (dict(storage="int8_row", rounding="stochastic"), 'storage "int8_row" rounds to nearest only'),
        (dict(storage="int8_row", compact_slots=True), 'storage "int8_row" holds the embedding columns only'),
    ],
)
def test_layout_refuses_invalid_storage(kwargs, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        refs.TableLayout(2, 3, **kwargs)
