"""Bad input to the table ops: InvalidArgument naming the problem; layout mismatch."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table.table_ops import HashTable, MAX_CAPACITY
from tensorflow_ext.utils.loader import load_ops

InvalidArgument = tf.errors.InvalidArgumentError


def _ph(dtype, shape=None):
    return tf.compat.v1.placeholder(dtype, shape)


def _run_fails(sess, fetch, match, feed=None, error=InvalidArgument):
    with pytest.raises(error) as info:
        sess.run(fetch, feed_dict=feed)
    assert match in info.value.message, info.value.message


def test_wrong_key_dtype(graph, sess):
    table = HashTable(dim=2)
    keys = _ph(tf.float32)
    _run_fails(sess, table.find(keys), "keys must be int64, got float", {keys: [1.0]})
    skeys = _ph(tf.string)
    _run_fails(sess, table.insert(skeys, tf.zeros([1, 2])), "keys must be int64, got string", {skeys: ["a"]})


def test_wrong_value_dtype(graph, sess):
    table = HashTable(dim=2)
    vals = _ph(tf.float64)
    _run_fails(sess, table.insert([1], vals), "values must be float32, got double", {vals: [[1.0, 2.0]]})
    _run_fails(sess, table.accumulate([1], vals), "deltas must be float32", {vals: [[1.0, 2.0]]})
    _run_fails(sess, table.find_or_insert([1], vals), "init_values must be float32", {vals: [[1.0, 2.0]]})
    _run_fails(sess, table.find([1], default_value=vals), "default_value must be float32", {vals: [1.0, 2.0]})


def test_row_width_mismatch(graph, sess):
    table = HashTable(dim=3)
    vals = _ph(tf.float32, [None, None])
    feed = {vals: np.zeros([2, 4], np.float32)}
    _run_fails(sess, table.insert([1, 2], vals), "row width mismatch", feed)
    _run_fails(sess, table.accumulate([1, 2], vals), "row width mismatch", feed)
    _run_fails(sess, table.find_or_insert([1, 2], vals), "row width mismatch", feed)
    _run_fails(sess, table.import_([1, 2], vals), "row width mismatch", feed)


def test_init_values_row_count(graph, sess):
    table = HashTable(dim=2)
    vals = _ph(tf.float32, [None, 2])
    _run_fails(
        sess,
        table.find_or_insert([1, 2, 3], vals),
        "init_values has 2 rows but there are 3 keys",
        {vals: np.zeros([2, 2], np.float32)},
    )
    _run_fails(
        sess,
        table.insert([1, 2, 3], vals),
        "values has 4 rows but there are 3 keys",
        {vals: np.zeros([4, 2], np.float32)},
    )


def test_non_scalar_step(graph, sess):
    table = HashTable(dim=1)
    step = _ph(tf.int64)
    _run_fails(sess, table.find_or_insert([1], [[0.0]], step=step), "step must be an int64 scalar", {step: [1, 2]})
    _run_fails(sess, table.evict(min_version=step), "min_version must be an int64 scalar", {step: [1]})


def test_bad_default_value(graph, sess):
    table = HashTable(dim=3)
    d = _ph(tf.float32, [None])
    _run_fails(
        sess, table.find([1], default_value=d), "default_value must be a scalar or a vector of 3", {d: [1.0, 2.0]}
    )


def test_import_metadata_lengths(graph, sess):
    table = HashTable(dim=1)
    v = _ph(tf.int64)
    _run_fails(
        sess, table.import_([1, 2], [[1.0], [2.0]], versions=v), "versions must be empty or have one", {v: [1, 2, 3]}
    )
    _run_fails(
        sess, table.import_([1, 2], [[1.0], [2.0]], frequencies=v), "frequencies must be empty or have one", {v: [1]}
    )


def test_column_range_out_of_row(graph, sess):
    table = HashTable(dim=2, width=4)
    _run_fails(sess, table.find([1], col_begin=3, cols=2), "column range [3, 5) is out of the row [0, 4)")
    _run_fails(sess, table.export(col_begin=0, cols=5), "column range [0, 5)")
    ops = load_ops()
    _run_fails(sess, ops.tf_ext_table_find(table.resource_handle, [1], 0.0, col_begin=-1), "col_begin must be >= 0")
    _run_fails(sess, ops.tf_ext_table_find(table.resource_handle, [1], 0.0, cols=0), "cols must be >= 1 or -1")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dim=0), "dim must be >= 1, got 0"),
        (dict(dim=4, width=3), "width must be >= dim (4), got 3"),
        (
            dict(dim=2, width=3, column_defaults=[1.0, 2.0]),
            "column_defaults must be empty or have width (3) entries, got 2",
        ),
        (dict(dim=2, initial_capacity=-5), "initial_capacity must be >= 0, got -5"),
        (dict(dim=2, initial_capacity=MAX_CAPACITY + 1), "initial_capacity is absurdly large"),
    ],
)
def test_bad_layout(graph, sess, kwargs, match):
    # Python-side check.
    with pytest.raises(InvalidArgument) as info:
        HashTable(**kwargs)
    assert match in info.value.message
    # Kernel-side check (the raw op, as another front end would use it).
    kw = dict(kwargs)
    if "column_defaults" not in kw:
        kw["column_defaults"] = []
    handle = load_ops().tf_ext_table_handle(**kw)
    _run_fails(sess, handle, match)


def test_bad_shard_bits(graph, sess):
    handle = load_ops().tf_ext_table_handle(dim=2, shard_bits=40)
    _run_fails(sess, handle, "shard_bits must be -1 (auto) or in [0, ")
    handle = load_ops().tf_ext_table_handle(dim=2, shard_bits=-2, name="h2")
    _run_fails(sess, handle, "shard_bits must be -1 (auto)")


def test_handle_that_is_not_a_table(graph, sess):
    var = tf.compat.v1.get_variable("v", [2], use_resource=True)
    ops = load_ops()
    _run_fails(sess, ops.tf_ext_table_size(var.handle), "is not a tf_ext table handle")
    tf_table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, 0.0)
    _run_fails(sess, ops.tf_ext_table_size(tf_table.resource_handle), "is a lookup table but not a tf_ext table")


def test_layout_mismatch_on_shared_name(graph, sess):
    a = HashTable(dim=4, shared_name="same", name="a")
    b = HashTable(dim=8, width=10, shared_name="same", name="b")
    sess.run(a.size())
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        sess.run(b.size())
    msg = info.value.message
    assert "already exists with layout (dim=4, width=4" in msg, msg
    assert "asks for layout (dim=8, width=10" in msg, msg
    c = HashTable(dim=4, width=4, column_defaults=[1, 1, 1, 1], shared_name="same", name="c")
    with pytest.raises(tf.errors.FailedPreconditionError, match="column_defaults=\\[1, 1, 1, 1\\]"):
        sess.run(c.size())
    # Same layout (explicit zeros == empty defaults) is fine.
    d = HashTable(dim=4, column_defaults=[0, 0, 0, 0], shared_name="same", name="d")
    assert sess.run(d.size()) == 0
