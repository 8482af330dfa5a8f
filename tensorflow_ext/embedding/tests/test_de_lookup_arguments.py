"""Bad lookup arguments: max_norm and sparse weights that do not match the ids get errors naming them; valid
max_norm values clip as TensorFlow's own lookups do."""

import math

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext import tfra as de
from tensorflow_ext.embedding.tests.conftest import session_config

ROWS = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-6.0, 8.0]], np.float32)  # norms 5, 0.5, 0, 10


def _emb(num_shards=1, name="emb"):
    emb = tf_ext.get_dynamic_embedding(name, 2, initializer=0.0, num_shards=num_shards)
    return emb, emb.insert(np.arange(4, dtype=np.int64), ROWS)


def _sparse(indices, values, dense_shape, dtype=tf.int64):
    return tf.SparseTensor(
        tf.constant(indices, tf.int64), tf.constant(values, dtype), tf.constant(dense_shape, tf.int64)
    )


IDS = _sparse_args = ([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]], [0, 3, 1, 2, 3], [3, 2])
WEIGHTS = ([[0, 0], [0, 1], [1, 0], [2, 0], [2, 1]], [1.0, 2.0, 0.5, 1.0, 3.0], [3, 2])


def _lookups(emb, max_norm):
    """Every lookup flavour (native and TFRA's) with this max_norm."""
    ids = tf.constant([0, 1, 3], tf.int64)
    sp = _sparse(*IDS)
    yield lambda: tf_ext.embedding_lookup(emb, ids, max_norm=max_norm)
    yield lambda: tf_ext.embedding_lookup_sparse(emb, sp, None, max_norm=max_norm)
    yield lambda: tf_ext.safe_embedding_lookup_sparse(emb, sp, max_norm=max_norm)
    yield lambda: de.embedding_lookup(emb, ids, max_norm=max_norm)
    yield lambda: de.embedding_lookup_sparse(emb, sp, None, max_norm=max_norm)
    yield lambda: de.safe_embedding_lookup_sparse(emb, sp, max_norm=max_norm)


@pytest.mark.parametrize("max_norm", [-1.0, 0, 0.0, -0.5, float("nan"), float("inf"), -math.inf, np.float32(-2)])
def test_max_norm_out_of_range_is_refused(graph, max_norm):
    # -1.0 returned NaN rows (0 * -1 / max(0, -1)) and reversed the others; 0 zeroes every row (NaN for zero rows).
    emb, _ = _emb()
    for build in _lookups(emb, max_norm):
        with pytest.raises(ValueError, match=r"max_norm.*must be a finite number > 0.*got"):
            build()


@pytest.mark.parametrize("max_norm", ["x", True, [1.0], b"1"])
def test_max_norm_of_the_wrong_type_is_a_type_error(graph, max_norm):
    emb, _ = _emb()
    for build in _lookups(emb, max_norm):
        with pytest.raises(TypeError, match=r"max_norm.*must be a number > 0 \(or None\)"):
            build()


def test_max_norm_tensor_out_of_range_fails_at_run_time(graph):
    emb, insert = _emb()
    bound = tf.compat.v1.placeholder(tf.float32, [])
    outs = [build() for build in _lookups(emb, bound)]
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(insert)
        sess.run(outs, {bound: 0.5})
        for out in outs:
            for bad in (-1.0, 0.0, np.nan, np.inf):
                with pytest.raises(tf.errors.InvalidArgumentError, match="max_norm must be a finite number > 0"):
                    sess.run(out, {bound: bad})
    with pytest.raises(TypeError, match="max_norm"):
        tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64), max_norm=tf.constant("x"))


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("max_norm", [0.7, 1, np.float64(4.0), "tensor"])
def test_valid_max_norm_clips_as_tensorflow_does(graph, num_shards, max_norm):
    emb, insert = _emb(num_shards)
    bound = tf.constant(2.5) if isinstance(max_norm, str) else max_norm
    dense = tf.constant(ROWS)
    ids = tf.constant([[0, 3], [2, 1]], tf.int64)
    sp, w = _sparse(*IDS), _sparse(*WEIGHTS, dtype=tf.float32)
    ours = [
        tf_ext.embedding_lookup(emb, ids, max_norm=bound),
        tf_ext.embedding_lookup_sparse(emb, sp, None, max_norm=bound),
        tf_ext.embedding_lookup_sparse(emb, sp, w, combiner="sqrtn", max_norm=bound),
        tf_ext.safe_embedding_lookup_sparse(emb, sp, w, max_norm=bound),
    ]
    theirs = [
        tf.compat.v1.nn.embedding_lookup(dense, ids, max_norm=bound),
        tf.compat.v1.nn.embedding_lookup_sparse(dense, sp, None, max_norm=bound),
        tf.compat.v1.nn.embedding_lookup_sparse(dense, sp, w, combiner="sqrtn", max_norm=bound),
        tf.compat.v1.nn.safe_embedding_lookup_sparse(dense, sp, w, max_norm=bound),
    ]
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(insert)
        for a, b in zip(sess.run(ours), sess.run(theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _sparse_lookups(emb, sp_ids, sp_weights):
    yield "sp_ids", "sp_weights", lambda: tf_ext.embedding_lookup_sparse(emb, sp_ids, sp_weights)
    yield "sparse_ids", "sparse_weights", lambda: tf_ext.safe_embedding_lookup_sparse(emb, sp_ids, sp_weights)
    yield "sp_ids", "sp_weights", lambda: de.embedding_lookup_sparse(emb, sp_ids, sp_weights)
    yield "sparse_ids", "sparse_weights", lambda: de.safe_embedding_lookup_sparse(emb, sp_ids, sp_weights)


@pytest.mark.parametrize(
    "weights",
    [
        ([[0, 0], [0, 1], [1, 0]], [1.0, 2.0, 3.0], [3, 2]),  # fewer weights than ids
        ([[0, 0, 0], [0, 1, 0], [1, 0, 0], [2, 0, 0], [2, 1, 0]], [1.0] * 5, [3, 2, 1]),  # another rank
    ],
)
def test_sparse_weights_of_another_shape_are_refused_statically(graph, weights):
    # Was TensorFlow's "Shapes (2,) and (1,) are incompatible" (or (3, 2) and (5, 2)), naming neither argument.
    emb, _ = _emb()
    for ids_name, weights_name, build in _sparse_lookups(emb, _sparse(*IDS), _sparse(*weights, dtype=tf.float32)):
        with pytest.raises(
            ValueError, match=r"%s must have the indices and dense_shape of %s" % (weights_name, ids_name)
        ):
            build()


def test_sparse_weights_that_do_not_match_the_ids_fail_at_run_time(graph):
    emb, insert = _emb(2)
    ids = tf.compat.v1.sparse_placeholder(tf.int64)
    weights = tf.compat.v1.sparse_placeholder(tf.float32)
    good = tf.compat.v1.SparseTensorValue(*WEIGHTS)
    bad = [
        tf.compat.v1.SparseTensorValue(WEIGHTS[0][:3], WEIGHTS[1][:3], [3, 2]),  # fewer weights
        tf.compat.v1.SparseTensorValue(WEIGHTS[0], WEIGHTS[1], [3, 5]),  # another dense_shape
        tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [1, 0], [2, 0], [2, 2]], WEIGHTS[1], [3, 3]),  # other indices
        tf.compat.v1.SparseTensorValue([[0, 0, 0]] * 5, WEIGHTS[1], [3, 2, 1]),  # another rank
    ]
    feed_ids = tf.compat.v1.SparseTensorValue(*IDS)
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(insert)
        for ids_name, weights_name, build in _sparse_lookups(emb, ids, weights):
            out = build()
            sess.run(out, {ids: feed_ids, weights: good})
            for value in bad:
                with pytest.raises(
                    tf.errors.InvalidArgumentError,
                    match=r"%s must have the indices and dense_shape of %s" % (weights_name, ids_name),
                ):
                    sess.run(out, {ids: feed_ids, weights: value})
