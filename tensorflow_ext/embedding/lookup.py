"""Lookups of dynamic embeddings: `embedding_lookup`, `embedding_lookup_sparse`,
`safe_embedding_lookup_sparse`.

Every lookup deduplicates its keys (`tf.unique`), reads each unique key once
per shard, and gathers the rows back, so the gradient of a key that occurs k
times is the sum of its k gradients (never last-writer-wins). For a one-shard
embedding with an in-kernel initializer, `embedding_lookup` does all three in
one kernel (TfExtEmbeddingLookupIds) and its gradient sums per unique key in
one kernel (TfExtEmbeddingLookupIdsGrad). The gradient
with respect to a shard's table handle is an `IndexedSlices` whose indices
are the shard's unique int64 keys; stock optimizers consume it (see
optimizers.py).

Training vs inference: a lookup built with `is_training=None` (the default)
is find-only (a missing key reads the initializer's constant, or zeros, and
nothing is inserted) until an optimizer applies a gradient that flows through
it (`minimize` / `apply_gradients` in the same graph); then tf_ext turns that
lookup into an inserting one. Lookups whose rows do not reach the trained loss
(eval towers, exports, lookups built after `minimize`) stay find-only. So an
Estimator's eval and predict graphs never insert keys, and its train graph
does. The optimizer must be built before a Session runs the graph (refused
otherwise). `is_training=True/False` fixes the mode.
"""

import math
import numbers

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding import embedding_ops
from tensorflow_ext.embedding import variable as var_lib
from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.tf_compat.internals import ops as tf_ops
from tensorflow_ext.utils import loader

__all__ = ["embedding_lookup", "embedding_lookup_sparse", "safe_embedding_lookup_sparse"]

# The ways pooled lookups combine an example's rows (as TF's embedding_lookup_sparse); feature columns use them too.
COMBINERS = ("mean", "sqrtn", "sum")


def _as_embedding(params, fn):
    if isinstance(params, var_lib.DynamicEmbedding):
        return params
    if isinstance(params, (list, tuple)) and len(params) == 1 and isinstance(params[0], var_lib.DynamicEmbedding):
        return params[0]
    raise TypeError(
        "%s: params must be a tf_ext DynamicEmbedding (from tf_ext.get_dynamic_embedding), " "got %r" % (fn, params)
    )


def _global_step_tensor():
    step = tf.compat.v1.train.get_global_step()
    if step is None:
        return tf.constant(-1, tf.int64)
    return tf.cast(tf.convert_to_tensor(step), tf.int64)


def _insert_once_training(shard, lookup_op):
    """A find-only lookup op becomes an inserting one when an optimizer is applied to the shard (before the first
    run; see shard_lookups)."""

    def activate():
        graph_edits.set_attr(lookup_op, "insert_missing", attr_value_pb2.AttrValue(b=True))

    shard.lookups.when_training(activate, [lookup_op])


@tf.RegisterGradient("TfExtFrozenTableFind")
def _frozen_find_grad(op, *grads):
    """Training through a frozen serving table is refused by name (rather than TF's 'no gradient defined')."""
    del grads
    raise ValueError(
        "%s reads a read-only serving table (created inside tf_ext.serving.freeze_for_serving()): it has no "
        "gradient; build training graphs outside that scope" % op.name
    )


@tf.RegisterGradient("TfExtRowsInStorageDtype")
def _rows_in_storage_dtype_grad(op, grad):
    """Both casts of `_send_in_storage_dtype` pass the float32 gradient on unrounded."""
    del op
    return grad


def _send_in_storage_dtype(shard, rows):
    """Float32 rows [n, dim] read from `shard`'s table (ops colocated with it), as the reader receives them.

    A table placed on a task of a cluster job (a parameter server) that stores half values sends its rows as such:
    cast to the storage dtype next to the table and back to float32 where the reader runs, half the bytes over the
    network and exact (the table holds values of that dtype). Elsewhere the rows are returned as they are, and so
    are the rows of a table storing float32 or int8 rows, whatever the embedding's value_dtype (an export's table,
    `tf_ext.serving.export_rows`): their decoded values are not half values.
    """
    if shard.storage not in refs.HALF_STORAGES:
        return rows
    # ("localhost" is the job of a process without a cluster.)
    if tf.DeviceSpec.from_string(shard.handle.device).job in (None, "localhost"):
        return rows
    value_dtype = refs.storage_dtype(shard.storage)
    with tf.compat.v1.get_default_graph().gradient_override_map({"Cast": "TfExtRowsInStorageDtype"}):
        with tf_ops.colocate_with(shard.handle):
            stored = tf.cast(rows, value_dtype)
        return tf.cast(stored, tf.float32)


def _lookup_shard(shard, keys, is_training, step):
    """Rows [n, dim] of unique int64 keys [n] in one shard: a find in a serving table, else a training lookup."""
    if isinstance(shard.table, refs.FrozenTableRef):
        return _find_in_serving_table(shard, keys, is_training)
    return _lookup_training_table(shard, keys, is_training, step)


def _find_in_serving_table(shard, keys, is_training):
    """Rows [n, dim] of keys [n] in a read-only serving table: no insert, no count, no gradient."""
    if is_training:
        shard.check_writable("embedding_lookup(is_training=True)")
    with tf_ops.colocate_with(shard.handle):
        values, _ = shard.table.find(keys, tf.constant(shard.embedding.initializer.missing_row(shard.dim)))
    return values


def _lookup_training_table(shard, keys, is_training, step):
    """Rows [n, dim] of unique int64 keys [n] in a training table, inserting missing keys in training (see the
    module docstring), with the gradient for the table."""
    if is_training:
        shard.check_writable("embedding_lookup(is_training=True)")  # a table of int8 rows takes no new keys
    spec = shard.embedding.initializer
    dim = shard.dim
    handle = shard.handle
    table = shard.table
    with tf_ops.colocate_with(handle):
        if spec.in_kernel and _ops.use_fused():
            values = loader.load_ops().tf_ext_embedding_lookup(
                handle, keys, step, dim=dim, insert_missing=bool(is_training), count=True, **spec.kernel_attrs()
            )
            if is_training is None:
                _insert_once_training(shard, values.op)
        else:
            n = tf.size(keys)
            if is_training:
                values = table.find_or_insert(keys, spec.make_rows(n, dim), step, count=True)
            else:
                values, _ = table.find(keys, tf.constant(spec.missing_row(dim)))
                if is_training is None:
                    find_op = values.op
                    insert = table.find_or_insert(keys, spec.make_rows(n, dim), step, count=True)

                    def activate():
                        graph_edits.add_control_input(find_op, insert.op)

                    shard.lookups.when_training(activate, [find_op])
        values = embedding_ops.with_handle_gradient(values, handle, keys)
    values = _send_in_storage_dtype(shard, values)
    shard.lookups.record_read(keys, lambda: values)
    return values


def _lookup_unique(emb, unique_keys, is_training):
    """Rows [n, dim] (dense gradient) of unique int64 keys [n], over all shards (and processes, for an
    embedding distributed over processes)."""
    return emb.config.distribution.lookup_unique(
        emb, unique_keys, lambda e, keys: _lookup_unique_local(e, keys, is_training)
    )


def _lookup_unique_local(emb, unique_keys, is_training):
    """`_lookup_unique` over this process's shards, under the admission policy (on the keys' owner for a
    model-parallel embedding: its counts see every rank's lookups)."""
    return emb.config.admission.admitted_lookup(
        emb, unique_keys, is_training, lambda keys: _lookup_unique_rows(emb, keys, is_training)
    )


def _lookup_unique_admitted(emb, unique_keys, is_training):
    """(rows, admitted) of unique int64 keys [n]: the rows as `_lookup_unique`, and for an embedding with an
    admission policy a bool [n] saying which keys have a row (the others read the policy's default row), else None.

    Pooled lookups leave the keys not admitted out of their combination (as if absent from the input). The mask
    is known where the keys are counted: on this process, or for an embedding split across Horovod processes on
    each key's owner, which sends it back with the row (one more column).
    """
    if emb.admission is None:
        return _lookup_unique(emb, unique_keys, is_training), None

    def local(e, keys):
        return e.config.admission.admitted_lookup(
            e, keys, is_training, lambda k: _lookup_unique_rows(e, k, is_training), return_admitted=True
        )

    if emb.distribution is None:
        return local(emb, unique_keys)

    def local_with_mask(e, keys):
        rows, admitted = local(e, keys)
        return tf.concat([rows, tf.expand_dims(tf.cast(admitted, rows.dtype), 1)], 1)

    out = emb.distribution.lookup_unique(emb, unique_keys, local_with_mask, width=emb.dim + 1)
    return out[:, : emb.dim], out[:, emb.dim] > 0.5


def _lookup_unique_rows(emb, unique_keys, is_training):
    if is_training is None:
        # Shards created in training graphs where an optimizer was applied already.
        if all(s.is_training for s in emb.shards):
            is_training = True
    step = _global_step_tensor()
    parts, positions = emb.partition.split(unique_keys)
    rows = [_lookup_shard(shard, part, is_training, step) for shard, part in zip(emb.shards, parts)]
    out = rows[0] if positions is None else tf.dynamic_stitch(positions, rows)
    # Reshape's gradient turns IndexedSlices into a dense [n, dim] sum: the gradients
    # of duplicate ids are summed here, once per unique key.
    return tf.reshape(out, [-1, emb.dim])


def _one_shard_kernel(emb, kernel, inputs, is_training, **attrs):
    """Runs the fused lookup kernel `kernel` (an op of the library) on a one-shard embedding: (table handle,
    *inputs, global step) with the lookup attrs (dim, insert_missing, count, initializer) and `attrs`; a find-only
    op (is_training=None) turns inserting once an optimizer is applied. Returns (shard, the op's outputs)."""
    shard = emb.shards[0]
    if is_training is None and shard.is_training:
        is_training = True
    if is_training:
        shard.check_writable("embedding_lookup(is_training=True)")  # a table of int8 rows takes no new keys
    step = _global_step_tensor()
    with tf_ops.colocate_with(shard.handle):
        outputs = kernel(
            shard.handle,
            *inputs,
            step,
            dim=shard.dim,
            insert_missing=bool(is_training),
            count=True,
            **emb.initializer.kernel_attrs(),
            **attrs,
        )
    if is_training is None:
        _insert_once_training(shard, outputs[0].op)
    return shard, outputs


def _lookup_ids_fused(emb, flat_keys, is_training):
    """Rows [n, dim] of int64 keys [n] (duplicates allowed) of a one-shard
    embedding through TfExtEmbeddingLookupIds (dedup + lookup + gather in one
    kernel). Its gradient w.r.t. the table handle is IndexedSlices(per unique key
    sum, unique keys): see embedding_ops._lookup_ids_grad."""
    shard, (values, unique_keys, idx) = _one_shard_kernel(
        emb, loader.load_ops().tf_ext_embedding_lookup_ids, [flat_keys], is_training
    )
    values = _send_in_storage_dtype(shard, values)
    # The rows of the unique keys, for the shard's value as a tensor: every occurrence of a key holds the same
    # row, so the segment mean is that row, and its gradient (grad / count per occurrence) sums back to grad.
    shard.lookups.record_read(unique_keys, lambda: tf.math.unsorted_segment_mean(values, idx, tf.size(unique_keys)))
    return values


def _lookup_sparse_fused(emb, sp_ids, combiner, is_training, fill_empty_rows=False, default_key=None):
    """Pooled rows of a one-shard embedding through TfExtEmbeddingLookupSparse (dedup, lookup and the combiner in
    one kernel; its gradient w.r.t. the table handle is IndexedSlices(per unique key sum, unique keys): see
    embedding_ops._lookup_sparse_grad). Rows are indexed by sp_ids.indices[:, 0]."""
    keys = emb.to_keys(sp_ids.values, what="sparse ids")
    default = tf.zeros([0], tf.int64) if default_key is None else default_key
    shard, (values, unique_keys, _, _, _, unique_rows) = _one_shard_kernel(
        emb,
        loader.load_ops().tf_ext_embedding_lookup_sparse,
        [sp_ids.indices, keys, sp_ids.dense_shape, default],
        is_training,
        combiner=combiner,
        fill_empty_rows=fill_empty_rows,
    )

    def rows_read():
        # The rows the lookup read (its own output), for the shard's value as a tensor.
        return embedding_ops.with_handle_gradient(unique_rows, shard.handle, unique_keys)

    shard.lookups.record_read(unique_keys, rows_read)
    return values


def _use_fused_sparse(emb, sp_weights, max_norm):
    """The one-kernel pooled lookup serves unweighted, unclipped lookups of one-shard embeddings."""
    return sp_weights is None and max_norm is None and _ops.use_fused_sparse() and _use_fused_ids(emb)


def _use_frozen(emb):
    return (
        emb.distribution is None
        and emb.admission is None
        and all(isinstance(s.table, refs.FrozenTableRef) for s in emb.shards)
    )


def _use_fused_ids(emb):
    return (
        len(emb.shards) == 1
        and isinstance(emb.shards[0].table, refs.MutableTableRef)
        and emb.distribution is None
        and emb.admission is None
        and emb.initializer.in_kernel
        and _ops.use_fused()
    )


def _check_max_norm(fn, max_norm):
    """max_norm: None, a finite number > 0 or a float tensor (checked when it runs). TensorFlow's clip_by_norm
    returns NaN rows (zero rows) and reversed ones for max_norm <= 0, and leaves NaN/inf to the rows: refused."""
    if max_norm is None:
        return None
    if isinstance(max_norm, (tf.Tensor, tf.Variable)):
        if not (max_norm.dtype.is_floating or max_norm.dtype.is_integer):
            raise TypeError(
                "%s(max_norm=%r): max_norm must be a number > 0 (or None), got a %s tensor"
                % (fn, max_norm, max_norm.dtype.name)
            )
        bound = tf.cast(max_norm, tf.float32)
        ok = tf.logical_and(tf.math.is_finite(bound), bound > 0)
        check = tf.debugging.Assert(
            tf.reduce_all(ok),
            ["%s: max_norm must be a finite number > 0 (the L2 norm rows are clipped to), got" % fn, bound],
        )
        with tf.control_dependencies([check]):
            return tf.identity(bound)
    if isinstance(max_norm, (bool, np.bool_)) or not isinstance(max_norm, numbers.Real):
        raise TypeError(
            "%s(max_norm=%r): max_norm must be a number > 0 (or None), the L2 norm rows are clipped to; got a %s"
            % (fn, max_norm, type(max_norm).__name__)
        )
    if not (math.isfinite(float(max_norm)) and max_norm > 0):
        raise ValueError(
            "%s(max_norm=%r): max_norm must be a finite number > 0 (the L2 norm rows are clipped to), or None "
            "for no clipping; got %r" % (fn, max_norm, max_norm)
        )
    return max_norm


def _check_weights(fn, sp_ids, sp_weights, ids_name, weights_name):
    """sp_weights must have sp_ids' indices and dense_shape (one weight per id): checked statically where the shapes
    are known, else when the lookup runs. Returns sp_weights (its values depend on the run-time check)."""
    if sp_weights is None:
        return None
    problem = "%s: %s must have the indices and dense_shape of %s (one weight per id)" % (fn, weights_name, ids_name)
    for what, a, b in (
        ("indices", sp_ids.indices, sp_weights.indices),
        ("dense_shape", sp_ids.dense_shape, sp_weights.dense_shape),
        ("values", sp_ids.values, sp_weights.values),
    ):
        if not a.shape.is_compatible_with(b.shape):
            raise ValueError(
                "%s; %s.%s has shape %s, %s.%s %s" % (problem, ids_name, what, a.shape, weights_name, what, b.shape)
            )
    if sp_weights.indices is sp_ids.indices and sp_weights.dense_shape is sp_ids.dense_shape:
        return sp_weights

    def same(a, b):  # a and b of one rank (indices: 2, dense_shape: 1; a SparseTensor's)
        same_shape = tf.reduce_all(tf.equal(tf.shape(a), tf.shape(b)))
        return tf.cond(
            same_shape,
            lambda: tf.reduce_all(tf.equal(a, tf.reshape(b, tf.shape(a)))),
            lambda: tf.constant(False),
        )

    ok = tf.logical_and(same(sp_ids.dense_shape, sp_weights.dense_shape), same(sp_ids.indices, sp_weights.indices))
    check = tf.debugging.Assert(
        ok,
        [
            problem + "; shapes of the indices:",
            tf.shape(sp_ids.indices),
            tf.shape(sp_weights.indices),
            "dense_shapes:",
            sp_ids.dense_shape,
            sp_weights.dense_shape,
        ],
    )
    with tf.control_dependencies([check]):
        return tf.SparseTensor(sp_weights.indices, tf.identity(sp_weights.values), sp_weights.dense_shape)


def _refuse_return_trainable(fn, return_trainable):
    """TFRA's lookups can return their TrainableWrapper; there is none here: say what replaces it."""
    if return_trainable:
        raise ValueError(
            "%s(return_trainable=True): tensorflow_ext has no TrainableWrapper. The embedding's shards are in "
            "tf.compat.v1.trainable_variables() and stock optimizers train them directly; for the rows a lookup "
            "read use the shard as a tensor (tf.convert_to_tensor(emb.shards[i])), and for optimizer slots "
            "optimizer.get_slot(shard, name). Drop return_trainable." % fn
        )


def embedding_lookup(params, ids, name=None, is_training=None, max_norm=None, return_trainable=False):
    """Looks up ids in a dynamic embedding (like `tf.nn.embedding_lookup`).

    Args:
      params: a `DynamicEmbedding`.
      ids: a Tensor of ids of any rank, of the embedding's key dtype (int64 or
        int32; strings for key_dtype=tf.string).
      name: optional name scope.
      is_training: None (default: find-only until an optimizer applies a
        gradient flowing through this lookup, in this graph), True (insert
        missing keys with their initial rows), False (never insert).
      max_norm: None, or a finite number > 0 (or a float scalar tensor, checked
        when the lookup runs): rows are clipped to this L2 norm.
      return_trainable: TFRA's flag; must be False (ValueError naming what to
        use instead).

    Returns:
      float32 Tensor of shape `ids.shape + [dim]`.

    Raises:
      TypeError: params is not a DynamicEmbedding, ids have the wrong dtype, or
        max_norm is not a number.
      ValueError: return_trainable=True, or max_norm <= 0, NaN or infinite.
    """
    _refuse_return_trainable("embedding_lookup", return_trainable)
    emb = _as_embedding(params, "embedding_lookup")
    with tf.name_scope(name or "embedding_lookup"):
        max_norm = _check_max_norm("embedding_lookup", max_norm)
        ids_t = (
            ids
            if isinstance(ids, (tf.Tensor, tf.Variable))
            else tf.convert_to_tensor(ids, dtype=tf.string if emb.key_dtype == tf.string else None)
        )
        keys = emb.to_keys(ids_t)
        flat = tf.reshape(keys, [-1])
        if _use_frozen(emb):
            # A read-only serving table: no dedup (nothing to count or differentiate), one find per shard.
            parts, positions = emb.partition.split(flat)
            rows = [_lookup_shard(shard, part, is_training, None) for shard, part in zip(emb.shards, parts)]
            out = emb.partition.stitch(positions, rows)
            if max_norm is not None:
                out = tf.clip_by_norm(out, max_norm, axes=[1])
        elif _use_fused_ids(emb):
            # One kernel dedups, looks up each unique key once and writes every id's
            # row; the gradient sums per unique key in one kernel too.
            out = _lookup_ids_fused(emb, flat, is_training)
            if max_norm is not None:  # row-wise, so clipping after the gather is the same
                out = tf.clip_by_norm(out, max_norm, axes=[1])
        else:
            unique_keys, idx = tf.unique(flat, out_idx=tf.int32)
            rows = _lookup_unique(emb, unique_keys, is_training)
            if max_norm is not None:
                rows = tf.clip_by_norm(rows, max_norm, axes=[1])
            out = tf.gather(rows, idx)
        out = tf.reshape(out, tf.concat([tf.shape(keys), [emb.dim]], 0))
        out.set_shape(keys.shape.concatenate([emb.dim]))
        return out


def _check_combiner(combiner):
    if combiner is None:
        combiner = "mean"
    if combiner not in COMBINERS:
        raise ValueError(
            "combiner must be one of %s or %r, got %r" % (", ".join(map(repr, COMBINERS[:-1])), COMBINERS[-1], combiner)
        )
    return combiner


def _check_sparse(sp, what):
    if not isinstance(sp, (tf.SparseTensor, tf.compat.v1.SparseTensorValue)):
        raise TypeError("%s must be a SparseTensor, got %r" % (what, type(sp).__name__))
    return tf.SparseTensor.from_value(sp) if isinstance(sp, tf.compat.v1.SparseTensorValue) else sp


def _remap(emb, sp_ids, is_training, extra_keys=None):
    """Looks up the unique keys of sp_ids (+ extra_keys appended at the end).

    Returns (rows [u, dim], SparseTensor of row indices with sp_ids' indices,
    position of the first extra key in rows, admitted): admitted is None, or
    for an embedding with an admission policy a bool per entry of sp_ids: its
    key has a row (pooling leaves the other entries out).
    """
    keys = emb.to_keys(sp_ids.values, what="sparse ids")
    n_ids = tf.size(keys)
    all_keys = keys if extra_keys is None else tf.concat([keys, extra_keys], 0)
    unique_keys, idx = tf.unique(all_keys, out_idx=tf.int64)
    rows, admitted = _lookup_unique_admitted(emb, unique_keys, is_training)
    remapped = tf.SparseTensor(sp_ids.indices, idx[:n_ids], sp_ids.dense_shape)
    if admitted is not None:
        admitted = tf.gather(admitted, idx[:n_ids])
    return rows, remapped, idx[n_ids:], admitted


def embedding_lookup_sparse(
    params, sp_ids, sp_weights, partition_strategy=None, name=None, combiner="mean", max_norm=None, is_training=None
):
    """Pooled lookups of a batch of sparse ids (like `tf.nn.embedding_lookup_sparse`).

    Row i of the result combines the embeddings of the ids in row i of sp_ids
    (weighted by sp_weights): "sum" = sum(w * e), "mean" = sum(w * e) / sum(w),
    "sqrtn" = sum(w * e) / sqrt(sum(w^2)). Semantics and output shape are those
    of `tf.compat.v1.nn.embedding_lookup_sparse` (rows of sp_ids past the last
    non-empty one are not in the output; empty rows in between are zeros).
    Every entry of sp_ids is a key, whatever its value (negative ids included).

    Args:
      params: a `DynamicEmbedding`.
      sp_ids: `SparseTensor` [batch, k] of ids (key dtype).
      sp_weights: `SparseTensor` of float weights with the indices and
        dense_shape of sp_ids, or None (all weights 1). Checked statically where
        the shapes are known, else when the lookup runs (InvalidArgumentError).
      partition_strategy: ignored (for signature compatibility).
      name: optional name scope.
      combiner: "mean" (default), "sqrtn" or "sum".
      max_norm: None, or a finite number > 0 (see `embedding_lookup`):
        embeddings are l2-clipped to this norm before combining.
      is_training: see `embedding_lookup`.

    Returns:
      float32 Tensor [rows, dim].

    Raises:
      TypeError: bad params, sp_ids not a SparseTensor, ids of the wrong dtype,
        max_norm not a number.
      ValueError: unknown combiner, max_norm out of range, sp_weights of
        another shape than sp_ids.
    """
    del partition_strategy
    emb = _as_embedding(params, "embedding_lookup_sparse")
    combiner = _check_combiner(combiner)
    sp_ids = _check_sparse(sp_ids, "sp_ids")
    if sp_weights is not None:
        sp_weights = _check_sparse(sp_weights, "sp_weights")
    with tf.name_scope(name or "embedding_lookup_sparse"):
        max_norm = _check_max_norm("embedding_lookup_sparse", max_norm)
        sp_weights = _check_weights("embedding_lookup_sparse", sp_ids, sp_weights, "sp_ids", "sp_weights")
        if _use_fused_sparse(emb, sp_weights, max_norm):
            return _lookup_sparse_fused(emb, sp_ids, combiner, is_training)
        rows, remapped, _, admitted = _remap(emb, sp_ids, is_training)
        if admitted is not None:
            # Ids not admitted yet weigh 0: left out of the sums and of the mean/sqrtn denominators (an example
            # left with none reads zeros, as an empty one).
            if sp_weights is None:
                weights = tf.cast(admitted, tf.float32)
            else:  # in the weights' own dtype (TensorFlow casts them to the rows' dtype, e.g. from float64)
                weights = sp_weights.values * tf.cast(admitted, sp_weights.values.dtype)
            sp_weights = tf.SparseTensor(sp_ids.indices, weights, sp_ids.dense_shape)
        return tf.compat.v1.nn.embedding_lookup_sparse(rows, remapped, sp_weights, combiner=combiner, max_norm=max_norm)


def safe_embedding_lookup_sparse(
    embedding_weights,
    sparse_ids,
    sparse_weights=None,
    combiner="mean",
    default_id=None,
    name=None,
    partition_strategy=None,
    max_norm=None,
    is_training=None,
):
    """Pooled lookups robust to invalid ids and empty rows (like
    `tf.compat.v1.nn.safe_embedding_lookup_sparse`).

    Every integer id is a key, negative ones included (hashed feature ids take
    all 2^64 values, so no value can mean "missing"): to mark a value missing,
    leave its entry out of the SparseTensor. Unlike TF's function, negative ids
    are therefore not pruned. For string embeddings the empty string is missing
    and pruned. Entries with a non-positive weight are pruned unless combiner is
    "sum". A row with no id left gets the embedding of `default_id`, or zeros if
    default_id is None. Ids of rank > 2 are supported (the result has the shape
    of sparse_ids without its last dimension, plus [dim]). Unlike TF's function,
    empty rows do not look up (and so do not insert) any key when default_id is
    None.

    Args:
      embedding_weights: a `DynamicEmbedding`.
      sparse_ids: `SparseTensor` [d_0, ..., d_n, k] of ids.
      sparse_weights: `SparseTensor` of float weights with the indices and
        dense_shape of sparse_ids, or None.
      combiner: "mean" (default), "sqrtn" or "sum".
      default_id: an id (key dtype) whose embedding empty rows get, or None.
      name: optional name scope.
      partition_strategy: ignored.
      max_norm: None, or a finite number > 0: embeddings are l2-clipped before
        combining.
      is_training: see `embedding_lookup`.

    Returns:
      float32 Tensor [d_0, ..., d_n, dim].

    Raises:
      TypeError, ValueError: as for `embedding_lookup_sparse`.
    """
    del partition_strategy
    emb = _as_embedding(embedding_weights, "safe_embedding_lookup_sparse")
    combiner = _check_combiner(combiner)
    sparse_ids = _check_sparse(sparse_ids, "sparse_ids")
    if sparse_weights is not None:
        sparse_weights = _check_sparse(sparse_weights, "sparse_weights")
    with tf.name_scope(name or "safe_embedding_lookup_sparse"):
        max_norm = _check_max_norm("safe_embedding_lookup_sparse", max_norm)
        sparse_weights = _check_weights(
            "safe_embedding_lookup_sparse", sparse_ids, sparse_weights, "sparse_ids", "sparse_weights"
        )
        original_shape = sparse_ids.dense_shape
        rank = tf.size(original_shape)
        rank_static = tf.compat.dimension_value(sparse_ids.dense_shape.shape[0])
        if rank_static != 2:
            batch = tf.reduce_prod(tf.slice(original_shape, [0], [rank - 1]))
            sparse_ids = tf.sparse.reshape(sparse_ids, tf.stack([batch, tf.gather(original_shape, rank - 1)]))
        if sparse_weights is not None:
            # The weights on the ids' indices and shape (as TF's function).
            sparse_weights = tf.SparseTensor(sparse_ids.indices, sparse_weights.values, sparse_ids.dense_shape)

        # Prune missing values: empty strings of string embeddings, and non-positive
        # weights unless combining by sum. Integer ids are never pruned: every int64
        # (negative ones included) is a key.
        valid = None
        if emb.key_dtype == tf.string:
            valid = tf.not_equal(sparse_ids.values, "")
        if sparse_weights is not None and combiner != "sum":
            positive = tf.greater(sparse_weights.values, 0)
            valid = positive if valid is None else tf.logical_and(valid, positive)
        if valid is not None:
            sparse_ids = tf.sparse.retain(sparse_ids, valid)
            if sparse_weights is not None:
                sparse_weights = tf.sparse.retain(sparse_weights, valid)

        # Rows with no id get the extra row: default_id's embedding, or zeros.
        extra = None
        if default_id is not None:
            extra = tf.reshape(emb.to_keys(tf.convert_to_tensor(default_id), what="default_id"), [1])
        if _use_fused_sparse(emb, sparse_weights, max_norm):
            result = _lookup_sparse_fused(
                emb, sparse_ids, combiner, is_training, fill_empty_rows=True, default_key=extra
            )
            return _restore_batch_shape(result, original_shape, rank, rank_static, emb.dim)
        rows, remapped, extra_idx, admitted = _remap(emb, sparse_ids, is_training, extra)
        if admitted is not None:
            # Ids not admitted yet are left out, as if absent from the input (an example left with none is empty).
            remapped = tf.sparse.retain(remapped, admitted)
            if sparse_weights is not None:
                sparse_weights = tf.sparse.retain(sparse_weights, admitted)
        if default_id is None:
            fill_index = tf.cast(tf.shape(rows)[0], tf.int64)
            rows = tf.concat([rows, tf.zeros([1, emb.dim], tf.float32)], 0)
        else:
            fill_index = extra_idx[0]
        remapped, _ = tf.sparse.fill_empty_rows(remapped, fill_index)
        if sparse_weights is not None:
            sparse_weights, _ = tf.sparse.fill_empty_rows(sparse_weights, 1.0)
        result = tf.compat.v1.nn.embedding_lookup_sparse(
            rows, remapped, sparse_weights, combiner=combiner, max_norm=max_norm
        )
        return _restore_batch_shape(result, original_shape, rank, rank_static, emb.dim)


def _restore_batch_shape(result, original_shape, rank, rank_static, dim):
    """[d_0 * ... * d_n, dim] -> [d_0, ..., d_n, dim] (nothing to do for rank-2 ids)."""
    if rank_static == 2:
        return result
    final = tf.reshape(result, tf.concat([tf.slice(tf.cast(original_shape, tf.int32), [0], [rank - 1]), [dim]], 0))
    if rank_static is not None:
        final.set_shape(tf.TensorShape([None] * (rank_static - 1)).concatenate([dim]))
    return final
