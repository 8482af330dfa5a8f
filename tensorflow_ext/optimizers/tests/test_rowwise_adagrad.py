"""tf_ext.RowwiseAdagradOptimizer on dense variables, against a numpy reference of its formula.

The reference computes in float32 with numpy, one rounding per operation in the optimizer's documented order (the
pairwise row sum of squares times the float32 nearest 1/cols, then acc + mean, (lr * g) / sqrt(acc), var - that), so the dense paths must match it
bit for bit; a second check compares the row mean with numpy's own mean (the formula, not only the order).
"""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.optimizers import rowwise_adagrad

tf.compat.v1.disable_v2_behavior()


def _pairwise_row_mean_square(g):
    """float32 [rows] of float32 [rows, cols]: squares padded to a power of two, summed in adjacent pairs."""
    cols = g.shape[1]
    width = 1 << (cols - 1).bit_length()
    sq = np.zeros([g.shape[0], width], np.float32)
    sq[:, :cols] = g * g
    while sq.shape[1] > 1:
        sq = sq[:, 0::2] + sq[:, 1::2]
    return sq[:, 0] * (np.float32(1.0) / np.float32(cols))


def _reference_step(var, acc, grad, lr):
    """One step on rows [rows, cols] with accumulators [rows] (float32 numpy)."""
    lr = np.float32(lr)
    acc = acc + _pairwise_row_mean_square(grad)
    return var - (lr * grad) / np.sqrt(acc)[:, None], acc


@pytest.mark.parametrize("cols", [1, 5, 8, 13])
def test_row_mean_square_is_the_pairwise_mean(cols):
    rng = np.random.RandomState(cols)
    g = rng.normal(size=[7, cols]).astype(np.float32) * np.float32(10.0) ** rng.randint(-3, 3, size=[7, 1])
    g = g.astype(np.float32)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        got = sess.run(rowwise_adagrad.row_mean_square(tf.constant(g)))
    np.testing.assert_array_equal(got, _pairwise_row_mean_square(g))
    np.testing.assert_allclose(got, np.mean(g.astype(np.float64) ** 2, axis=1), rtol=1e-6)


def test_row_mean_square_needs_a_static_width():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"static cols >= 1.*\(\?, \?\)|static cols >= 1"):
            rowwise_adagrad.row_mean_square(tf.compat.v1.placeholder(tf.float32, [None, None]))


@pytest.mark.parametrize("use_resource", [False, True], ids=["ref", "resource"])
def test_dense_gradients_follow_the_reference(use_resource):
    rng = np.random.RandomState(0)
    init = rng.normal(size=[6, 5]).astype(np.float32)
    targets = [rng.normal(size=[6, 5]).astype(np.float32) for _ in range(3)]
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("w", initializer=tf.constant(init), use_resource=use_resource)
        target = tf.compat.v1.placeholder(tf.float32, [6, 5])
        loss = tf.reduce_sum(tf.square(var * 1.5 - target))
        opt = tf_ext.RowwiseAdagradOptimizer(0.3, initial_accumulator_value=0.2)
        grad = tf.gradients(loss, [var])[0]
        train = opt.apply_gradients([(grad, var)])
        acc_slot = opt.get_slot(var, "accumulator")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            want_var, want_acc = init, np.full([6], 0.2, np.float32)
            for t in targets:
                g = sess.run(grad, {target: t})
                want_var, want_acc = _reference_step(want_var, want_acc, g, 0.3)
                sess.run(train, {target: t})
            got_var, got_acc = sess.run([var, acc_slot])
    np.testing.assert_array_equal(got_var, want_var)
    np.testing.assert_array_equal(got_acc, want_acc)
    assert not np.allclose(got_var, init)


@pytest.mark.parametrize("use_resource", [False, True], ids=["ref", "resource"])
def test_indexed_slices_sum_duplicates_and_touch_only_their_rows(use_resource):
    rng = np.random.RandomState(1)
    init = rng.normal(size=[8, 4]).astype(np.float32)
    ids = np.array([3, 1, 3, 6, 3], np.int64)
    weights = rng.normal(size=[5, 4]).astype(np.float32)
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("w", initializer=tf.constant(init), use_resource=use_resource)
        loss = tf.reduce_sum(tf.nn.embedding_lookup(var, ids) * weights)
        opt = tf_ext.RowwiseAdagradOptimizer(lambda: tf.constant(0.5))  # a callable learning rate, as TF allows
        train = opt.minimize(loss)
        acc_slot = opt.get_slot(var, "accumulator")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got_var, got_acc = sess.run([var, acc_slot])
    summed = np.zeros([8, 4], np.float32)
    np.add.at(summed, ids, weights)  # in batch order, as unsorted_segment_sum
    rows = np.array([3, 1, 6])
    want_rows, want_acc = _reference_step(init[rows], np.full([3], 0.1, np.float32), summed[rows], 0.5)
    np.testing.assert_array_equal(got_var[rows], want_rows)
    np.testing.assert_array_equal(got_acc[rows], want_acc)
    untouched = np.array([0, 2, 4, 5, 7])
    np.testing.assert_array_equal(got_var[untouched], init[untouched])
    np.testing.assert_array_equal(got_acc[untouched], np.full([5], 0.1, np.float32))


def test_slots_behave_as_tfs():
    """get_slot_names / get_slot as for TF's AdagradOptimizer: one "accumulator" per variable, named after the
    variable and the optimizer, of shape [rows] (rank >= 2) or the variable's (rank <= 1)."""
    with tf.Graph().as_default():
        matrix = tf.compat.v1.get_variable("m", initializer=tf.ones([4, 2, 3]))
        vector = tf.compat.v1.get_variable("v", initializer=tf.ones([5]), use_resource=True)
        opt = tf_ext.RowwiseAdagradOptimizer(0.1, initial_accumulator_value=0.7, name="RA")
        stock = tf.compat.v1.train.AdagradOptimizer(0.1, name="RA2")
        loss = tf.reduce_sum(matrix) + tf.reduce_sum(vector)
        opt.minimize(loss)
        stock.minimize(loss)
        assert opt.get_slot_names() == stock.get_slot_names() == ["accumulator"]
        m_acc, v_acc = opt.get_slot(matrix, "accumulator"), opt.get_slot(vector, "accumulator")
        assert m_acc.shape.as_list() == [4] and v_acc.shape.as_list() == [5]
        assert m_acc.op.name == "m/RA" and stock.get_slot(matrix, "accumulator").op.name == "m/RA2"
        assert opt.get_slot(matrix, "no_such_slot") is None
        assert isinstance(v_acc, type(stock.get_slot(vector, "accumulator")))  # resource like its variable
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(m_acc.initialized_value()), np.full([4], 0.7, np.float32))


def test_a_rank_one_variable_keeps_one_accumulator_per_element():
    init = np.array([1.0, -2.0, 0.5], np.float32)
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("b", initializer=tf.constant(init), use_resource=True)
        grad = tf.constant([0.5, -1.0, 2.0])
        train = tf_ext.RowwiseAdagradOptimizer(0.1).apply_gradients([(grad, var)])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(var)
    want, _ = _reference_step(
        init[:, None], np.full([3], 0.1, np.float32), np.array([[0.5], [-1.0], [2.0]], np.float32), 0.1
    )
    np.testing.assert_array_equal(got, want[:, 0])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="initial_accumulator_value must be positive: 0.0"):
        tf_ext.RowwiseAdagradOptimizer(0.1, initial_accumulator_value=0.0)
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("u", initializer=tf.ones([3, 2]), validate_shape=False)
        with pytest.raises(ValueError, match="fully defined shape.*u has shape"):
            tf_ext.RowwiseAdagradOptimizer(0.1).minimize(tf.reduce_sum(var), var_list=[var])
