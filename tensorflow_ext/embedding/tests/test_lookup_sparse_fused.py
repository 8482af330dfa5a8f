"""Pooled lookups in one op per feature (TfExtEmbeddingLookupSparse) against the same lookups built from
TensorFlow's sparse ops (tf_ext.embedding._ops.set_fused_sparse(False)): outputs, losses and every trained row and
optimizer slot must be equal, for each combiner, safe and plain lookups, default ids, empty rows, ids of rank 3,
string keys and the stock optimizers; and against numpy for the combiners' arithmetic."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import _ops
from tensorflow_ext.utils.loader import load_ops

from .conftest import session_config

# Ids per row (rows 1, 4, 6 and 11 empty): short rows, and rows of 9, 10, 16 and 17 ids, where TensorFlow's segment
# reductions change how they add and scale; keys repeat within and across rows, and 9 (the default id of the safe
# tests) is also a real id.
_ROW_LENGTHS = {0: 3, 2: 1, 3: 2, 5: 2, 7: 10, 8: 17, 9: 9, 10: 16}
INDICES = [[r, k] for r in sorted(_ROW_LENGTHS) for k in range(_ROW_LENGTHS[r])]
IDS = [[5, 6, 5, 7, 8, 5, -3, 2**40, 9, 12, 13][(3 * i + i // 7) % 11] for i in range(len(INDICES))]
BATCH = 12
WIDTH = 17


@pytest.fixture(params=[True, False], ids=["fused", "tf_ops"])
def fused(request):
    old = _ops.set_fused_sparse(request.param)
    yield request.param
    _ops.set_fused_sparse(old)


def _build_and_train(fused, lookup, optimizer, steps=3, key_dtype=tf.int64, ids=None):
    """Trains sum((pooled - 1)^2) for `steps` steps; returns (outputs per step, losses, exported table, op types)."""
    _ops.set_fused_sparse(fused)
    with tf.Graph().as_default() as g:
        tf.compat.v1.set_random_seed(11)
        emb = tf_ext.get_dynamic_embedding(
            "e", dim=4, key_dtype=key_dtype, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.5, seed=3)
        )
        values = tf.constant(ids if ids is not None else IDS, key_dtype)
        sp = tf.SparseTensor(tf.constant(INDICES, tf.int64), values, [BATCH, WIDTH])
        out = lookup(emb, sp)
        loss = tf.reduce_sum(tf.square(out - 1.0))
        train = optimizer().minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        export = emb.export(with_slots=True)
        types = {op.type for op in g.get_operations()}
        outs, losses = [], []
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                o, l, _ = sess.run([out, loss, train])
                outs.append(o)
                losses.append(l)
            table = sess.run(export)
    order = np.argsort(table[0])
    return outs, losses, [np.asarray(part)[order] for part in table], types


def _both(lookup, optimizer=lambda: tf.compat.v1.train.AdagradOptimizer(0.3), **kw):
    try:
        a = _build_and_train(True, lookup, optimizer, **kw)
        b = _build_and_train(False, lookup, optimizer, **kw)
    finally:
        _ops.set_fused_sparse(True)
    assert "TfExtEmbeddingLookupSparse" in a[3] and "TfExtEmbeddingLookupSparseGrad" in a[3]
    assert "TfExtEmbeddingLookupSparse" not in b[3]
    for x, y in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[1], b[1])
    for x, y in zip(a[2], b[2]):
        np.testing.assert_array_equal(x, y)
    return a


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_embedding_lookup_sparse_equals_tf_ops(combiner):
    outs, _, table, _ = _both(lambda e, sp: tf_ext.embedding_lookup_sparse(e, sp, None, combiner=combiner))
    # Rows past the last non-empty one are not in the output (as TF's embedding_lookup_sparse).
    assert outs[0].shape == (11, 4)
    assert len(table[0]) == len(set(IDS))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("default_id", [None, 9])
def test_safe_embedding_lookup_sparse_equals_tf_ops(combiner, default_id):
    outs, _, table, _ = _both(
        lambda e, sp: tf_ext.safe_embedding_lookup_sparse(e, sp, None, combiner=combiner, default_id=default_id)
    )
    assert outs[0].shape == (BATCH, 4)
    if default_id is None:
        np.testing.assert_array_equal(outs[0][[1, 4, 6, 11]], 0.0)
    else:
        assert 9 in table[0]  # empty rows read (and train) the default id's row
        np.testing.assert_array_equal(outs[0][1], outs[0][4])


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: tf.compat.v1.train.GradientDescentOptimizer(0.2),
        lambda: tf.compat.v1.train.AdamOptimizer(0.05),
        lambda: tf.compat.v1.train.FtrlOptimizer(0.2, l1_regularization_strength=0.01),
        lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    ],
    ids=["sgd", "adam", "ftrl", "momentum"],
)
def test_optimizers_train_the_same_rows(optimizer):
    _both(lambda e, sp: tf_ext.safe_embedding_lookup_sparse(e, sp, None, combiner="mean"), optimizer=optimizer)


def test_string_keys_equal_tf_ops():
    ids = [b"abcdefgh"[i % 8 : i % 8 + 1] for i in range(len(INDICES))]
    _both(
        lambda e, sp: tf_ext.safe_embedding_lookup_sparse(e, sp, None, combiner="sqrtn"),
        key_dtype=tf.string,
        ids=ids,
    )


def test_rank3_ids_keep_their_batch_shape(fused):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e3", dim=2, initializer=tf.compat.v1.constant_initializer(0.5))
        sp = tf.SparseTensor([[0, 0, 0], [0, 0, 1], [1, 1, 0]], tf.constant([1, 2, 3], tf.int64), [2, 2, 2])
        out = tf_ext.safe_embedding_lookup_sparse(emb, sp, None, combiner="sum", is_training=True)
        assert out.shape.rank == 3 and out.shape[-1] == 2
        with tf.compat.v1.Session(config=session_config()) as sess:
            value = sess.run(out)
    expect = np.zeros([2, 2, 2], np.float32)
    expect[0, 0] = 1.0  # two ids of 0.5
    expect[1, 1] = 0.5
    np.testing.assert_array_equal(value, expect)


def test_combiners_match_numpy():
    """The kernel's arithmetic, from known rows (constant initializer, then assigned rows)."""
    rows = {5: [1.0, 2.0], 6: [4.0, -2.0], 7: [0.5, 0.25]}
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("n", dim=2)
        keys = tf.constant(list(rows), tf.int64)
        init = emb.upsert(keys, tf.constant(list(rows.values()), tf.float32))
        sp = tf.SparseTensor([[0, 0], [0, 1], [0, 2], [2, 0]], tf.constant([5, 6, 5, 7], tf.int64), [3, 3])
        outs = {c: tf_ext.safe_embedding_lookup_sparse(emb, sp, None, combiner=c) for c in ("sum", "mean", "sqrtn")}
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(init)
            got = sess.run(outs)
    r = {k: np.asarray(v, np.float32) for k, v in rows.items()}
    s = r[5] + r[6] + r[5]
    np.testing.assert_allclose(got["sum"][0], s, rtol=1e-6)
    np.testing.assert_allclose(got["mean"][0], s / 3, rtol=1e-6)
    np.testing.assert_allclose(got["sqrtn"][0], s / np.sqrt(3), rtol=1e-6)
    for c in got:
        np.testing.assert_array_equal(got[c][1], 0.0)
        np.testing.assert_allclose(got[c][2], rows[7], rtol=1e-6)


def test_weighted_and_clipped_lookups_use_tf_ops():
    """Weights and max_norm are served by TF's sparse ops (the one-op form covers unweighted, unclipped lookups)."""
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("w", dim=2)
        sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 1])
        w = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([0.5, 2.0]), [2, 1])
        tf_ext.embedding_lookup_sparse(emb, sp, w)
        tf_ext.safe_embedding_lookup_sparse(emb, sp, None, max_norm=1.0)
        assert "TfExtEmbeddingLookupSparse" not in {op.type for op in g.get_operations()}


def _raw(indices, ids, dense_shape, default_key=(), fill=True):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("raw", dim=2)
        out = load_ops().tf_ext_embedding_lookup_sparse(
            emb.shards[0].handle,
            tf.constant(indices, tf.int64, shape=[len(indices), 2]),
            tf.constant(ids, tf.int64, shape=[len(ids)]),
            tf.constant(dense_shape, tf.int64),
            tf.constant(list(default_key), tf.int64, shape=[len(default_key)]),
            tf.constant(-1, tf.int64),
            dim=2,
            fill_empty_rows=fill,
        )
        with tf.compat.v1.Session(config=session_config()) as sess:
            return sess.run(out)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(indices=[[3, 0]], ids=[1], dense_shape=[2, 1]), r"indices\[0, 0\] = 3 is not a row in \[0, 2\)"),
        (dict(indices=[[-1, 0]], ids=[1], dense_shape=[2, 1], fill=False), r"indices\[0, 0\] = -1 is not a row"),
        (dict(indices=[[0, 0]], ids=[1], dense_shape=[2, 1], default_key=[4], fill=False), "default_key must hold 0"),
        (dict(indices=[[0, 0]], ids=[1], dense_shape=[2, 1], default_key=[4, 5]), "default_key must hold 0 or 1"),
        (dict(indices=[[0, 0]], ids=[1], dense_shape=[-1, 1]), r"dense_shape\[0\] = -1"),
    ],
)
def test_bad_input_is_a_named_error(kwargs, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _raw(**kwargs)


def test_empty_batch():
    values, keys, idx, rows, scale, unique_rows = _raw([], [], [3, 1], default_key=[7])
    assert values.shape == (3, 2) and list(keys) == [7] and list(idx) == [0, 0, 0] and list(rows) == [0, 1, 2]
    assert unique_rows.shape == (1, 2) and list(scale) == [1.0, 1.0, 1.0]
    values, keys, idx, _, _, unique_rows = _raw([], [], [0, 1], fill=False)
    assert values.shape == (0, 2) and len(keys) == 0 and len(idx) == 0 and unique_rows.shape == (0, 2)


def test_entries_are_ordered_by_row():
    """Unsorted input rows are served (TF's segment ops refuse them); entries come out by row, stable."""
    values, keys, idx, rows, scale, _ = _raw([[2, 0], [0, 0], [2, 1], [0, 1]], [10, 11, 12, 10], [3, 2])
    assert list(keys) == [10, 11, 12]
    assert list(rows) == [0, 0, 2, 2] and list(idx) == [1, 0, 0, 2]
    np.testing.assert_array_equal(scale, np.float32([0.5, 0.0, 0.5]))  # mean: 1/n per row, 0 for the empty one
    np.testing.assert_array_equal(values[1], 0.0)


def test_shard_value_is_the_rows_the_lookup_read(fused):
    """The shard as a tensor (what a summary or an l2 loss of the shard reads) holds the rows the lookup read, in
    the step that reads them (before that step's update), and its gradient reaches the table."""
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("v", dim=2, initializer=tf.compat.v1.constant_initializer(0.5))
        sp = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([3, 4, 3], tf.int64), [2, 2])
        pooled = tf_ext.safe_embedding_lookup_sparse(emb, sp, None, combiner="sum")
        shard_value = tf.convert_to_tensor(emb.shards[0])
        loss = tf.reduce_sum(pooled) + tf.nn.l2_loss(shard_value)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first, _ = sess.run([shard_value, train])
            second = sess.run(shard_value)
    np.testing.assert_array_equal(first, np.full([2, 2], 0.5, np.float32))
    # d/dw: key 3 occurs twice in the pooled sum (2) + l2 (w = 0.5), key 4 once (1) + 0.5.
    np.testing.assert_allclose(np.sort(second[:, 0]), [0.5 - 0.1 * 2.5, 0.5 - 0.1 * 1.5], rtol=1e-6)
