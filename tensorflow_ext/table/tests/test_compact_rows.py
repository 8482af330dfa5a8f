"""Tables that store their rows in half precision (value_dtype tf.bfloat16 / tf.float16).

Every op reads and writes float32; the stored values are the float32 inputs rounded to the storage (numpy references:
bf16 by bit operations on the float32's uint32, fp16 by np.float16), decoded exactly. The columns past dim stay
float32. Rows stored as int8 (a serving format, reached through `refs`) are checked against their error bound.
"""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table import refs
from tensorflow_ext.table.table_ops import HashTable
from tensorflow_ext.utils.loader import load_ops

HALF_DTYPES = [tf.bfloat16, tf.float16]
BF16_MAX = np.uint32(0x7F7F0000).view(np.float32)
FP16_MAX = 65504.0


def bf16_nearest(x):
    """float32 -> bf16 round to nearest even -> float32; finite values beyond bf16's range saturate."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    rounded = np.where(np.isnan(x), x, rounded)
    return np.where(np.isfinite(x) & np.isinf(rounded), np.sign(x) * BF16_MAX, rounded).astype(np.float32)


def fp16_nearest(x):
    """float32 -> IEEE half, round to nearest even -> float32; finite values beyond +-65504 saturate."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        rounded = x.astype(np.float16).astype(np.float32)
    return np.where(np.isfinite(x) & np.isinf(rounded), np.sign(x) * FP16_MAX, rounded).astype(np.float32)


ROUND = {tf.bfloat16: bf16_nearest, tf.float16: fp16_nearest}


def _values(rng, shape):
    # Values with bits below every half's precision, over several binades (and a few fp16 subnormals).
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-16, 8, shape))).astype(np.float32)


def _sorted_export(sess, table, **kwargs):
    keys, values, versions, freqs = sess.run(table.export(**kwargs))
    order = np.argsort(keys)
    return keys[order], values[order], versions[order], freqs[order]


def test_rounding_references_are_exact():
    # The references themselves, on values whose rounding is known.
    one_plus = np.float32(1.0 + 2.0**-8)  # bf16's tie between 1 and 1 + 2^-7: to even (1)
    assert bf16_nearest([one_plus])[0] == 1.0
    assert bf16_nearest([np.float32(1.0 + 3 * 2.0**-8)])[0] == np.float32(1.0 + 2.0**-6)
    assert bf16_nearest([np.float32(3.4e38)])[0] == BF16_MAX
    assert fp16_nearest([1e6])[0] == FP16_MAX and fp16_nearest([-1e6])[0] == -FP16_MAX
    assert np.isnan(bf16_nearest([np.nan])[0]) and np.isinf(fp16_nearest([np.inf])[0])


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_every_op_stores_rounded_values(graph, sess, dtype):
    rng = np.random.default_rng(1)
    dim, n = 5, 64
    rnd = ROUND[dtype]
    table = HashTable(dim=dim, value_dtype=dtype, name="half")
    keys = np.arange(n, dtype=np.int64) * 7 + 1
    values = _values(rng, (n, dim))
    sess.run(table.insert(keys, values, step=3))
    expected = rnd(values)
    assert not np.array_equal(expected, values)  # the test rounds something

    # find (with found and a default), lookup, TF's own lookup op, export: the rounded values, as float32.
    query = np.concatenate([keys[::3], [-5]])
    got, found = sess.run(table.find(query, default_value=-1.5, return_found=True))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got[:-1], expected[::3])
    np.testing.assert_array_equal(got[-1], np.full(dim, -1.5, np.float32))  # defaults are not rounded
    np.testing.assert_array_equal(found, [True] * (len(query) - 1) + [False])
    np.testing.assert_array_equal(sess.run(table.lookup(keys)), expected)
    tf_find = tf.raw_ops.LookupTableFindV2(
        table_handle=table.resource_handle, keys=tf.constant(keys), default_value=tf.zeros([dim])
    )
    np.testing.assert_array_equal(sess.run(tf_find), expected)
    k, v, versions, _ = _sorted_export(sess, table)
    np.testing.assert_array_equal(k, keys)
    np.testing.assert_array_equal(v, expected)
    np.testing.assert_array_equal(versions, np.full(n, 3))

    # A partial column range writes and reads only its columns, rounded.
    part = _values(rng, (n, 2))
    sess.run(table.insert(keys, part, col_begin=2, cols=2))
    expected[:, 2:4] = rnd(part)
    np.testing.assert_array_equal(sess.run(table.find(keys)), expected)
    np.testing.assert_array_equal(sess.run(table.find(keys, col_begin=1, cols=3)), expected[:, 1:4])

    # accumulate: the decoded row plus the delta (float32), rounded again; missing keys: defaults + delta.
    deltas = _values(rng, (n + 4, dim))
    acc_keys = np.concatenate([keys, [1000, 1001, 1002, 1003]])
    sess.run(table.accumulate(acc_keys, deltas, step=4))
    expected = np.concatenate([rnd(expected + deltas[:n]), rnd(deltas[n:])])
    np.testing.assert_array_equal(sess.run(table.find(acc_keys)), expected)

    # find_or_insert: existing rows as stored, new ones from their init values (rounded to nearest).
    new_keys = np.array([2000, 2001], np.int64)
    init = _values(rng, (4, dim))
    got = sess.run(table.find_or_insert(np.concatenate([acc_keys[:2], new_keys]), init, step=5))
    np.testing.assert_array_equal(got, np.concatenate([expected[:2], rnd(init[2:])]))
    np.testing.assert_array_equal(sess.run(table.find(new_keys)), rnd(init[2:]))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_insert_rounds_to_nearest_in_a_stochastic_table(graph, sess, dtype):
    # Stochastic rounding is for training writes (optimizer updates); insert, import and accumulate round to
    # nearest whatever the table's rounding.
    values = _values(np.random.default_rng(2), (256, 4))
    table = HashTable(dim=4, value_dtype=dtype, rounding="stochastic")
    assert table.rounding == "stochastic"
    keys = np.arange(256, dtype=np.int64)
    sess.run(table.insert(keys, values))
    np.testing.assert_array_equal(sess.run(table.find(keys)), ROUND[dtype](values))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_columns_past_dim_stay_float32(graph, sess, dtype):
    rng = np.random.default_rng(3)
    table = HashTable(dim=3, width=5, column_defaults=[0.0, 0.0, 0.0, 0.1, 0.2], value_dtype=dtype)
    keys = np.arange(10, dtype=np.int64)
    rows = _values(rng, (10, 5))
    sess.run(table.import_(keys, rows, full_rows=True))
    _, exported, _, _ = _sorted_export(sess, table, full_rows=True)
    np.testing.assert_array_equal(exported[:, :3], ROUND[dtype](rows[:, :3]))
    np.testing.assert_array_equal(exported[:, 3:], rows[:, 3:])
    # A new key's slot columns take their (float32) defaults exactly.
    sess.run(table.insert([99], _values(rng, (1, 3))))
    np.testing.assert_array_equal(sess.run(table.find([99], col_begin=3, cols=2)), np.float32([[0.1, 0.2]]))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_export_import_round_trips(graph, sess, dtype):
    rng = np.random.default_rng(4)
    keys = rng.choice(1 << 40, 300, replace=False).astype(np.int64)
    values = _values(rng, (300, 6))
    versions = rng.integers(0, 100, 300)
    freqs = rng.integers(0, 100, 300)
    half = HashTable(dim=6, value_dtype=dtype, name="half")
    sess.run(half.import_(keys, values, versions, freqs))
    order = np.argsort(keys)
    exported = _sorted_export(sess, half)
    np.testing.assert_array_equal(exported[1], ROUND[dtype](values)[order])
    np.testing.assert_array_equal(exported[2], versions[order])
    np.testing.assert_array_equal(exported[3], freqs[order])

    # The export of a half table is exactly representable: a second half table and a float32 table hold it
    # bit for bit, and the float32 table's export goes back unchanged.
    again = HashTable(dim=6, value_dtype=dtype, name="again")
    plain = HashTable(dim=6, name="plain")
    sess.run([again.import_(*exported), plain.import_(*exported)])
    for table in (again, plain):
        for got, want in zip(_sorted_export(sess, table), exported):
            np.testing.assert_array_equal(got, want)
    back = HashTable(dim=6, value_dtype=dtype, name="back")
    sess.run(back.import_(*_sorted_export(sess, plain)))
    np.testing.assert_array_equal(_sorted_export(sess, back)[1], exported[1])


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_saver_restores_across_storages(dtype, tmp_path):
    # The checkpoint holds float32 values: a half table's restore is bit-exact; a float32 table's checkpoint
    # restored into a half table rounds to nearest, and a half table's restored into a float32 table is exact.
    rng = np.random.default_rng(5)
    keys = np.arange(40, dtype=np.int64)
    values = _values(rng, (40, 4))

    def build(plain_dtype, half_dtype):
        plain = HashTable(dim=4, name="plain", value_dtype=plain_dtype, checkpoint=True)
        half = HashTable(dim=4, name="half", value_dtype=half_dtype, checkpoint=True)
        return plain, half, tf.compat.v1.train.Saver()

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        plain, half, saver = build(tf.float32, dtype)
        sess.run([plain.insert(keys, values), half.insert(keys, values)])
        path = saver.save(sess, str(tmp_path / "ckpt"))
        sess.run([plain.clear(), half.clear()])
        saver.restore(sess, path)
        np.testing.assert_array_equal(sess.run(plain.find(keys)), values)
        np.testing.assert_array_equal(sess.run(half.find(keys)), ROUND[dtype](values))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        plain, half, saver = build(dtype, tf.float32)  # the storages swapped
        saver.restore(sess, path)
        np.testing.assert_array_equal(sess.run(plain.find(keys)), ROUND[dtype](values))
        np.testing.assert_array_equal(sess.run(half.find(keys)), ROUND[dtype](values))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_out_of_range_and_non_finite_values(graph, sess, dtype):
    table = HashTable(dim=6, value_dtype=dtype)
    row = np.float32([[1e6, -1e6, 3.4e38, np.inf, -np.inf, np.nan]])
    sess.run(table.insert([1], row))
    got = sess.run(table.find([1]))[0]
    want = ROUND[dtype](row)[0]
    np.testing.assert_array_equal(got[:5], want[:5])  # finite values saturate, infinities stay
    assert np.isnan(got[5])


@pytest.mark.parametrize("dim", [16, 64])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=lambda d: d.name)
def test_memory_bytes_smaller(graph, sess, dtype, dim):
    n = 20000
    keys = np.arange(n, dtype=np.int64)
    values = np.ones((n, dim), np.float32)
    plain = HashTable(dim=dim, shard_bits=2, name="plain")
    half = HashTable(dim=dim, shard_bits=2, value_dtype=dtype, name="half")
    sess.run([plain.insert(keys, values), half.insert(keys, values)])
    plain_bytes, half_bytes = sess.run([plain.memory_bytes(), half.memory_bytes()])
    saved = (plain_bytes - half_bytes) / n
    # 2 bytes a column fewer per key (row chunks and the index are the same for both).
    assert saved >= 0.9 * 2 * dim, (plain_bytes, half_bytes)
    assert saved <= 1.1 * 2 * dim, (plain_bytes, half_bytes)


def test_int8_rows_within_half_a_step(graph, sess):
    # int8 rows (a serving format, reached through refs): each row is quantized as a whole with a per-row scale and
    # bias; every column reads back within scale / 2 (scale ~ (max - min) / 255) of the value written.
    rng = np.random.default_rng(6)
    dim = 16
    table = refs.MutableTableRef.create(refs.TableLayout(dim, storage="int8_row"), shared_name="int8_rows")
    keys = np.arange(100, dtype=np.int64)
    values = _values(rng, (100, dim))
    values[0] = 0.0  # an all-zero row reads back as zeros
    values[1] = 0.25  # so does a constant row
    sess.run(table.insert(tf.constant(keys), tf.constant(values), tf.constant(-1, tf.int64)))
    got, found = sess.run(table.find(tf.constant(keys), tf.constant(0.0)))
    assert found.all()
    np.testing.assert_array_equal(got[0], np.zeros(dim, np.float32))
    np.testing.assert_array_equal(got[1], np.full(dim, 0.25, np.float32))
    step = (values.max(axis=1) - values.min(axis=1)) / 255.0
    # fp16 scale and bias add a relative error of ~2^-11 of the row's range.
    bound = step / 2 * (1 + 2.0**-9) + np.abs(values).max(axis=1) * 2.0**-10
    error = np.abs(got - values).max(axis=1)
    assert (error <= bound).all(), (error / step)[error > bound]
    assert (error > 0).any()  # quantized, not stored as float32


def test_layout_attrs_reach_the_handle(graph):
    table = HashTable(dim=4, width=6, value_dtype=tf.bfloat16, rounding="stochastic")
    op = table.resource_handle.op
    assert op.get_attr("storage") == b"bfloat16"
    assert op.get_attr("compact_cols") == 4
    assert op.get_attr("rounding") == b"stochastic"
    assert table.storage_dtype == tf.bfloat16 and table.value_dtype == tf.float32
    plain = HashTable(dim=4, name="plain").resource_handle.op
    assert (plain.get_attr("storage"), plain.get_attr("compact_cols")) == (b"float32", 0)


def test_widened_layout_updates_compact_cols(graph):
    # Optimizer slots widen a layout after its handle op is built; with compact slots the compact columns follow.
    class Widening(refs.TableLayout):
        def widen(self, width):
            self._widen(width, [])

    for compact_slots, expected in ((True, 12), (False, 4)):
        layout = Widening(4, storage="float16", compact_slots=compact_slots)
        ref = refs.MutableTableRef.create(layout, name="w%d" % compact_slots)
        assert ref.handle.op.get_attr("compact_cols") == 4
        layout.widen(12)
        ref.set_handle_layout()
        assert ref.handle.op.get_attr("width") == 12
        assert ref.handle.op.get_attr("compact_cols") == expected


def test_hash_table_refuses_other_value_dtypes(graph):
    with pytest.raises(ValueError, match="int8 rows are a serving format"):
        HashTable(dim=2, value_dtype=tf.int8)
    with pytest.raises(ValueError, match="value_dtype must be tf.float32, tf.bfloat16 or tf.float16, got tf.float64"):
        HashTable(dim=2, value_dtype=tf.float64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rounding must be one of nearest, stochastic"):
        HashTable(dim=2, value_dtype=tf.bfloat16, rounding="up")


@pytest.mark.parametrize(
    "attrs, match",
    [
        (dict(storage="bf16"), 'storage must be one of "float32", "bfloat16", "float16", "int8_row", got "bf16"'),
        (dict(storage="bfloat16", compact_cols=2, rounding="up"), 'rounding must be "nearest" or "stochastic"'),
        (dict(storage="bfloat16", compact_cols=0), 'compact_cols must be in [1, width=3] for storage "bfloat16"'),
        (dict(storage="float16", compact_cols=4), 'compact_cols must be in [1, width=3] for storage "float16", got 4'),
        (dict(compact_cols=2), 'compact_cols must be 0 for storage "float32"'),
        (
            dict(storage="int8_row", compact_cols=2, rounding="stochastic"),
            'storage "int8_row" rounds to nearest only',
        ),
    ],
)
def test_handle_op_refuses_bad_storage_attrs(graph, sess, attrs, match):
    handle = load_ops().tf_ext_table_handle(dim=2, width=3, **attrs)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        sess.run(handle)
    assert match in info.value.message, info.value.message


def test_shared_table_reopened_with_another_storage_is_refused(graph, sess):
    first = HashTable(dim=4, shared_name="shared_half", name="first", value_dtype=tf.bfloat16)
    sess.run(first.size())
    for kwargs in (dict(), dict(value_dtype=tf.float16), dict(value_dtype=tf.bfloat16, rounding="stochastic")):
        other = HashTable(dim=4, shared_name="shared_half", **kwargs)
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            sess.run(other.size())
        msg = info.value.message
        assert (
            "already exists with layout (dim=4, width=4, column_defaults=[], storage=bfloat16, compact_cols=4, "
            "rounding=nearest)" in msg
        ), msg
        assert "storage=%s" % refs.storage_name(kwargs.get("value_dtype", tf.float32)) in msg.split("asks for")[1]
    # The same storage and rounding open the same table.
    same = HashTable(dim=4, shared_name="shared_half", name="same", value_dtype=tf.bfloat16)
    sess.run(first.insert([1], [[1.0, 2.0, 3.0, 4.0]]))
    assert sess.run(same.size()) == 1


def test_float32_tables_share_whatever_their_rounding(graph, sess):
    # A float32 table rounds nothing: its rounding attr is no part of the layout.
    a = HashTable(dim=2, shared_name="shared_plain", name="a")
    b = HashTable(dim=2, shared_name="shared_plain", name="b", rounding="stochastic")
    sess.run(a.insert([1], [[1.0, 2.0]]))
    assert sess.run(b.size()) == 1
