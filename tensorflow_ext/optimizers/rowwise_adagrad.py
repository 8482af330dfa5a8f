"""Row-wise Adagrad: Adagrad with one accumulator per row of a variable instead of one per element.

For a row r of a variable (a row of a [rows, ...] variable: all of its elements after the first dimension) and the
gradient g_r of the step:

    acc_r += mean_j(g_rj^2)
    var_rj -= lr * g_rj / sqrt(acc_r)

This is FBGEMM's EXACT_ROWWISE_ADAGRAD (without weight decay). Its state is one float per row, where Adagrad keeps
one float per element: for an embedding table of dim 16 trained with Adagrad, the optimizer state shrinks from 64 to
4 bytes per key. Each row still gets its own step size; what it loses is a step size per column, which matters little
for embedding rows (their columns see gradients of similar scale) and more for dense layers.

The float operations run in one fixed order, which the fused dynamic-embedding kernel
(TfExtEmbeddingSparseApplyRowwiseAdagrad, embedding/kernels/optimizer_functors.h) follows too, so a dynamic embedding
and a dense variable trained side by side stay equal bit for bit: the mean is a pairwise sum (`row_mean_square`)
times the float nearest 1/cols, then `acc + mean`, `(lr * g) / sqrt(acc)` and `var - that`.

Limitations: variables need a fully defined static shape (the row width decides the formula); a variable of rank 0
or 1 has one accumulator per element (each element is a row of one column), which makes it plain Adagrad with this
formula order.
"""

import numpy as np
import tensorflow as tf

__all__ = ["RowwiseAdagradOptimizer", "row_mean_square", "rowwise_update"]

SLOT_NAME = "accumulator"


def row_mean_square(grad):
    """The mean of each row's squares, summed pairwise: float [rows] of float [rows, cols] (cols static, >= 1).

    The squares, padded with zeros to the smallest power of two >= cols, are added in adjacent pairs, the pair sums
    in adjacent pairs, and so on (a balanced binary tree over the columns in order), then multiplied by the float
    nearest 1/cols: one rounding per operation, in the order of the C++ RowMeanSquare (optimizer_functors.h), so
    both give the same floats. (tf.reduce_mean's order depends on Eigen's vectorization, and TF's graph optimizer
    turns a division by a constant into a multiplication by its reciprocal: a fixed tree and an explicit reciprocal
    keep the two implementations equal on every CPU.)
    """
    cols = tf.compat.dimension_value(grad.shape[-1])
    if grad.shape.rank != 2 or cols is None or cols < 1:
        raise ValueError(
            "row_mean_square needs a [rows, cols] tensor with a static cols >= 1, got shape %s" % grad.shape
        )
    squares = tf.square(grad)
    width = 1 << (cols - 1).bit_length()
    if width > cols:
        squares = tf.pad(squares, [[0, 0], [0, width - cols]])
    while width > 1:
        squares = squares[:, 0::2] + squares[:, 1::2]
        width //= 2
    reciprocal = np.reciprocal(np.array(cols, squares.dtype.as_numpy_dtype))  # rounded once, in grad's dtype
    return squares[:, 0] * tf.constant(reciprocal, squares.dtype)


def rowwise_update(lr, accumulator, grad):
    """One row-wise Adagrad step of some rows: (new accumulator [rows], the amount to subtract from var [rows, cols]).

    Args:
      lr: the learning rate, a scalar of grad's dtype.
      accumulator: the rows' accumulators, [rows].
      grad: the rows' gradients, [rows, cols] (cols static).
    """
    new_accumulator = accumulator + row_mean_square(grad)
    return new_accumulator, (lr * grad) / tf.expand_dims(tf.sqrt(new_accumulator), 1)


def _row_shape(var):
    """(rows, cols) of a variable's rows: [rows, ...] for rank >= 2; each element a row of one column otherwise."""
    shape = var.get_shape()
    if not shape.is_fully_defined():
        raise ValueError(
            "RowwiseAdagradOptimizer needs variables of a fully defined shape (the row width picks the formula); "
            "%s has shape %s" % (var.op.name, shape)
        )
    dims = shape.as_list()
    if len(dims) >= 2:
        cols = 1
        for d in dims[1:]:
            cols *= d
        return dims[0], cols
    return shape.num_elements(), 1


def accumulator_shape(var):
    """The shape of `var`'s accumulator slot: [rows] for rank >= 2, var's own shape for rank 0 or 1."""
    shape = var.get_shape()
    if shape.rank is not None and shape.rank >= 2:
        return tf.TensorShape([_row_shape(var)[0]])
    _row_shape(var)  # the same shape check
    return shape


class RowwiseAdagradOptimizer(tf.compat.v1.train.Optimizer):
    """Adagrad with one accumulator per row (see the module docstring for the formula).

    Usable like `tf.compat.v1.train.AdagradOptimizer`: on ref and resource variables, dense gradients and
    IndexedSlices (the gradients of a key's duplicates are summed first, as for every TF1 optimizer), and on dynamic
    embeddings (`tf_ext.get_dynamic_embedding`), whose rows keep the accumulator as one extra column.

    Its slot is "accumulator" (`get_slot_names()`, `get_slot(var, "accumulator")`), of shape [rows] for a variable of
    rank >= 2 and of the variable's shape for rank 0 or 1, starting at `initial_accumulator_value`.

    Args:
      learning_rate: a float, a scalar tensor or a callable returning one.
      initial_accumulator_value: the accumulators' starting value, > 0.
      use_locking: lock the updates (as TF's optimizers do).
      name: the name of the optimizer's ops.

    Raises:
      ValueError: initial_accumulator_value is not positive.
    """

    def __init__(self, learning_rate, initial_accumulator_value=0.1, use_locking=False, name="RowwiseAdagrad"):
        if not initial_accumulator_value > 0.0:
            raise ValueError("initial_accumulator_value must be positive: %s" % initial_accumulator_value)
        super(RowwiseAdagradOptimizer, self).__init__(use_locking, name)
        self._learning_rate = learning_rate
        self._initial_accumulator_value = initial_accumulator_value
        self._learning_rate_tensor = None

    def _create_slots(self, var_list):
        for var in var_list:
            dtype = var.dtype.base_dtype
            initializer = tf.compat.v1.constant_initializer(self._initial_accumulator_value, dtype=dtype)
            self._get_or_make_slot_with_initializer(
                var, initializer, accumulator_shape(var), dtype, SLOT_NAME, self._name
            )

    def _prepare(self):
        learning_rate = self._learning_rate() if callable(self._learning_rate) else self._learning_rate
        self._learning_rate_tensor = tf.convert_to_tensor(learning_rate, name="learning_rate")

    def _lr(self, dtype):
        return tf.cast(self._learning_rate_tensor, dtype)

    def _apply_dense_to(self, grad, var):
        rows, cols = _row_shape(var)
        accumulator = self.get_slot(var, SLOT_NAME)
        new_accumulator, delta = rowwise_update(
            self._lr(grad.dtype.base_dtype),
            tf.reshape(tf.convert_to_tensor(accumulator), [rows]),
            tf.reshape(grad, [rows, cols]),
        )
        acc_update = tf.compat.v1.assign(
            accumulator, tf.reshape(new_accumulator, accumulator.get_shape()), use_locking=self._use_locking
        )
        var_update = tf.compat.v1.assign_sub(var, tf.reshape(delta, var.get_shape()), use_locking=self._use_locking)
        return tf.group(acc_update, var_update)

    def _apply_sparse_to(self, values, var, indices):
        """values [n, ...] of the unique rows `indices` of var."""
        _, cols = _row_shape(var)
        accumulator = self.get_slot(var, SLOT_NAME)
        new_accumulator, delta = rowwise_update(
            self._lr(values.dtype.base_dtype), tf.gather(accumulator, indices), tf.reshape(values, [-1, cols])
        )
        acc_update = tf.compat.v1.scatter_update(accumulator, indices, new_accumulator, use_locking=self._use_locking)
        var_update = tf.compat.v1.scatter_sub(
            var, indices, tf.reshape(delta, tf.shape(values)), use_locking=self._use_locking
        )
        return tf.group(acc_update, var_update)

    def _apply_dense(self, grad, var):
        return self._apply_dense_to(grad, var)

    def _resource_apply_dense(self, grad, handle):
        return self._apply_dense_to(grad, handle)

    def _apply_sparse(self, grad, var):
        return self._apply_sparse_to(grad.values, var, grad.indices)

    def _resource_apply_sparse(self, grad, handle, indices):
        return self._apply_sparse_to(grad, handle, indices)
