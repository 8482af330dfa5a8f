"""Thin Python accessors of the embedding ops (C++ in tensorflow_ext/embedding/kernels/).

These are the raw ops of docs/design.md, "Embedding ops"; the high-level API
(`tf_ext.get_dynamic_embedding`, `tf_ext.embedding_lookup`, the optimizer
integration) is built on them.

    from tensorflow_ext.embedding import embedding_ops
    rows = embedding_ops.embedding_lookup_unique(handle, unique_keys, dim=16, insert_missing=True,
                                                  init_kind="random_normal", init_a=0.0, init_b=0.01)
    update = embedding_ops.sparse_apply_adagrad(handle, unique_keys, grad, lr=0.1, dim=16)
    shard = embedding_ops.shard_index(keys, num_shards=4)

Op input orders (all hyper-parameters are float32 scalars, `step` an int64 scalar,
keys an int64 vector of unique keys, grad float32 [n, dim]):

    TfExtEmbeddingLookup(table_handle, keys, step) -> values [n, dim]
        attrs dim, insert_missing, count, init_kind, init_a, init_b, seed, seed2
    TfExtEmbeddingSparseApply<Optimizer>(table_handle, keys, grad, <hyper-parameters>, step)
        attrs dim, slot_offset (-1 = dim: the slots follow the embedding), <flags>
    TfExtEmbeddingLookupIds(table_handle, ids, step) -> values [n, dim], unique_keys [u], idx [n] int32
        attrs as TfExtEmbeddingLookup; ids may repeat (dedup + lookup + gather in one kernel)
    TfExtEmbeddingLookupIdsGrad(grad [n, dim], idx [n] int32, unique_keys [u]) -> [u, dim]
    TfExtEmbeddingLookupSparse(table_handle, indices [nnz, rank], ids [nnz], dense_shape [rank],
                               default_key [0 or 1], step)
        -> values [rows, dim], unique_keys [u], idx [m] int32, entry_rows [m] int32, row_scale [rows],
           unique_rows [u, dim]
        attrs as TfExtEmbeddingLookup + combiner, fill_empty_rows (a pooled lookup in one kernel)
    TfExtEmbeddingLookupSparseGrad(grad [rows, dim], entry_rows, row_scale, idx, unique_keys) -> [u, dim]
    TfExtShardIndex(keys, num_shards) -> int32 shard ids, keys.shape

The optimizers, their hyper-parameters (in op order), flags and slots are defined once, in optimizer_spec.py.
Slot k of an optimizer occupies columns `[slot_offset + k*w, slot_offset + (k+1)*w)` of a row
`[embedding (dim) | ...]`, w = dim (w = 1 for a row-wise optimizer's slots: RowwiseAdagrad).

The apply ops reproduce TF 2.15's sparse update formulas (training_ops SparseApply*, and TF1
AdamOptimizer's sparse path for Adam). Adam is exact for the rows of the batch; TF1's dense-variable
Adam also decays m and v (and moves var) of the rows not in the batch, which a lazy table does not.
Missing keys are inserted with the table's column defaults before the update.
"""

import tensorflow as tf

from tensorflow_ext.embedding import optimizer_spec
from tensorflow_ext.utils.loader import load_ops

__all__ = [
    "INIT_KINDS",
    "OPTIMIZER_SLOTS",
    "OPTIMIZER_HYPERS",
    "load_ops",
    "embedding_lookup_unique",
    "shard_index",
    "sparse_apply",
    "sparse_apply_gradient_descent",
    "sparse_apply_momentum",
    "sparse_apply_adagrad",
    "sparse_apply_adam",
    "sparse_apply_ftrl",
    "sparse_apply_rmsprop",
    "sparse_apply_rowwise_adagrad",
    "num_slots",
    "HANDLE_GRAD_DENSE_ROWS",
    "embedding_lookup_ids",
    "lookup_ids_grad",
    "with_handle_gradient",
]

INIT_KINDS = ("constant", "random_normal", "truncated_normal", "random_uniform")

# Views of optimizer_spec (the one definition) for the fused optimizers.
# Slot names in column order, every slot listed (RMSProp's "mg" only when centered: see num_slots).
OPTIMIZER_SLOTS = {s.name: tuple(slot.name for slot in s.slots) for s in optimizer_spec.FUSED}
# Hyper-parameter inputs in op order (after table_handle, keys, grad; before step).
OPTIMIZER_HYPERS = {s.name: s.hypers for s in optimizer_spec.FUSED}

# First dimension of the dense_shape of the handle gradient (the key space is int64, not a dense range).
HANDLE_GRAD_DENSE_ROWS = 2**62


def _refuse_densifying(value, dtype=None, name=None, as_ref=False):
    """Tensor conversion of IndexedSlices, tried before TF's: a dynamic-embedding gradient (dense_shape
    [HANDLE_GRAD_DENSE_ROWS, dim]) has no dense form (it would span the whole int64 key space), so densifying it
    (e.g. Horovod's sparse_as_dense=True) is an error that says what to do; every other IndexedSlices is left to
    TF's own conversion."""
    del dtype, name, as_ref
    shape = tf.get_static_value(value.dense_shape) if value.dense_shape is not None else None
    if shape is not None and len(shape) >= 1 and int(shape[0]) == HANDLE_GRAD_DENSE_ROWS:
        raise ValueError(
            "A dynamic embedding's gradient (IndexedSlices of int64 keys) cannot be converted to a dense tensor: its "
            "rows are keys, not a dense range. Keep it sparse: with Horovod use "
            "tensorflow_ext.horovod.DistributedOptimizer (its sparse_as_dense applies to dense variables only), or "
            "hvd.DistributedOptimizer without sparse_as_dense."
        )
    return NotImplemented


tf.register_tensor_conversion_function(tf.IndexedSlices, _refuse_densifying, priority=99)


def num_slots(optimizer, **flags):
    """Number of slot column blocks (each dim wide, or 1 for a row-wise slot) the fused `optimizer` uses with `flags`
    (e.g. centered=True)."""
    return len(optimizer_spec.by_name(optimizer, fused=True).slot_names(flags))


def _step(step):
    if step is None:
        return tf.constant(-1, tf.int64)
    return tf.cast(step, tf.int64)


def _dim_of(grad, dim):
    if dim is not None:
        return int(dim)
    d = tf.compat.dimension_value(grad.shape[-1]) if grad.shape.rank is not None else None
    if d is None:
        raise ValueError("dim must be given when grad's last dimension is not statically known")
    return int(d)


def _seeds(seed, seed2):
    """(seed, seed2) attrs like TF's random ops: an explicit seed2 is used as is; else from get_seed(seed)."""
    if seed2 is not None:
        return int(seed or 0), int(seed2)
    s1, s2 = tf.compat.v1.get_seed(seed)
    return int(s1 or 0), int(s2 or 0)


def embedding_lookup_unique(
    table_handle,
    keys,
    dim,
    step=None,
    insert_missing=False,
    count=True,
    init_kind="constant",
    init_a=0.0,
    init_b=1.0,
    seed=None,
    seed2=None,
    name=None,
):
    """Rows [n, dim] of a vector of unique int64 keys (TfExtEmbeddingLookup).

    Args:
      table_handle: resource handle of a tf_ext table (TfExtTableHandle) whose dim is `dim`.
      keys: int64 vector of unique keys (duplicates are harmless but each occurrence counts).
      dim: the table's embedding dim.
      step: int64 scalar stored as the keys' version when >= 0 (None: -1, unchanged). Only with insert_missing.
      insert_missing: True: missing keys are inserted with their own draw of the initializer (training). False:
        read-only; missing keys read `init_a` (constant) or 0 (random kinds), nothing is inserted, no metadata
        changes (inference).
      count: with insert_missing, bump each key's frequency.
      init_kind: one of INIT_KINDS. constant: init_a; random_normal / truncated_normal (|z| < 2): mean init_a,
        stddev init_b; random_uniform: [init_a, init_b).
      init_a, init_b: initializer parameters.
      seed, seed2: like TF's random ops: with seed2 None, (seed, seed2) = tf.compat.v1 get_seed(seed) (graph-level
        seed + op seed); both 0 means a nondeterministic seed. A key's initial row depends only on (seed, seed2, key).
      name: op name.

    Returns:
      float32 Tensor [n, dim]. Its gradient w.r.t. table_handle is IndexedSlices(values=grad, indices=keys).
    """
    if init_kind not in INIT_KINDS:
        raise ValueError("init_kind must be one of %s, got %r" % (INIT_KINDS, init_kind))
    s1, s2 = _seeds(seed, seed2)
    keys = tf.convert_to_tensor(keys, tf.int64)
    values = load_ops().tf_ext_embedding_lookup(
        table_handle,
        keys,
        _step(step),
        dim=int(dim),
        insert_missing=bool(insert_missing),
        count=bool(count),
        init_kind=init_kind,
        init_a=float(init_a),
        init_b=float(init_b),
        seed=s1,
        seed2=s2,
        name=name,
    )
    return with_handle_gradient(values, table_handle, keys)


_HANDLE_GRAD = "TfExtEmbeddingHandleGrad"


def with_handle_gradient(values, table_handle, keys, name="lookup_grad_bridge"):
    """`values` (the rows [n, dim] of unique `keys` read from a table, by any op), with a gradient for the table.

    The rows' gradient becomes the gradient w.r.t. `table_handle`: IndexedSlices(values=d values, indices=keys,
    dense_shape=[2**62, dim]) (an IndexedSlices gradient of the rows, e.g. through a gather with repeats, is summed
    per key first, so the indices stay unique). Every lookup of unique keys goes through this one gradient, whatever
    op read the rows (TfExtEmbeddingLookup, or TfExtTableFind / TfExtTableFindOrInsert for other initializers);
    those ops have no gradient of their own. (TfExtEmbeddingLookupIds, whose ids repeat, has its own: see
    `embedding_lookup_ids`.)

    Args:
      values: float32 [n, dim], read for `keys` from the table.
      table_handle: the table's resource handle.
      keys: int64 [n], unique.
      name: name of the IdentityN op that carries the gradient.

    Returns:
      `values` (the same rows), differentiable w.r.t. `table_handle`.
    """
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"IdentityN": _HANDLE_GRAD}):
        return tf.identity_n([values, table_handle, keys], name=name)[0]


def _handle_grad(op, *grads):
    """Gradient of `with_handle_gradient`'s IdentityN(values, handle, keys): d values -> IndexedSlices for the
    handle; none for values (the reading op has no gradient) and keys."""
    values, keys = op.inputs[0], op.inputs[2]
    grad = grads[0]
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(keys, out_type=tf.int64)[0])
    # The update must follow the lookup (which inserts new keys with their initial rows), even when the gradient
    # does not depend on the looked-up values (e.g. a linear model): otherwise an update could insert a new key
    # first, with the column defaults.
    with tf.control_dependencies([values]):
        grad = tf.identity(grad)
    dim = tf.compat.dimension_value(values.shape[-1]) if values.shape.rank is not None else None
    if dim is not None:
        dense_shape = tf.constant([HANDLE_GRAD_DENSE_ROWS, dim], tf.int64)
    else:
        dense_shape = tf.stack([tf.constant(HANDLE_GRAD_DENSE_ROWS, tf.int64), tf.shape(values, out_type=tf.int64)[-1]])
    return [None, tf.IndexedSlices(grad, keys, dense_shape=dense_shape), None]


def shard_index(keys, num_shards, name=None):
    """int32 shard ids HashKey(keys) % num_shards (TfExtShardIndex), same shape as keys (any rank)."""
    return load_ops().tf_ext_shard_index(
        tf.convert_to_tensor(keys, tf.int64), tf.convert_to_tensor(num_shards, tf.int32), name=name
    )


def sparse_apply(optimizer, table_handle, keys, grad, hypers, step=None, dim=None, slot_offset=-1, name=None, **flags):
    """Fused sparse update TfExtEmbeddingSparseApply<optimizer> (returns the op).

    Args:
      optimizer: a key of OPTIMIZER_HYPERS ("GradientDescent", "Momentum", "Adagrad", "Adam", "Ftrl", "RMSProp",
        "RowwiseAdagrad").
      table_handle: tf_ext table handle.
      keys: int64 vector of UNIQUE keys (deduplicate and sum gradients first).
      grad: float32 [n, dim].
      hypers: dict name -> float32 scalar (names of OPTIMIZER_HYPERS[optimizer]), or a sequence in that order.
      step: int64 scalar stored as the keys' version when >= 0 (None: unchanged).
      dim: the table's embedding dim (default: grad's static last dimension).
      slot_offset: first slot column (-1: dim, the slots follow the embedding).
      name: op name.
      **flags: use_nesterov (Momentum), centered (RMSProp), multiply_linear_by_lr (Ftrl).

    Returns:
      The update op.

    Raises:
      ValueError: an unknown optimizer or flag, or hyper-parameters that are not the optimizer's.
    """
    spec = optimizer_spec.by_name(optimizer, fused=True)
    names = spec.hypers
    if isinstance(hypers, dict):
        missing = [h for h in names if h not in hypers]
        extra = [h for h in hypers if h not in names]
        if missing or extra:
            raise ValueError(
                "%s hyper-parameters are %s; missing %s, unexpected %s" % (optimizer, names, missing, extra)
            )
        values = [hypers[h] for h in names]
    else:
        values = list(hypers)
        if len(values) != len(names):
            raise ValueError("%s takes %d hyper-parameters %s, got %d" % (optimizer, len(names), names, len(values)))
    allowed = tuple(f.name for f in spec.flags)
    for f in flags:
        if f not in allowed:
            raise ValueError("%s has no flag %r (flags: %s)" % (optimizer, f, allowed))
    grad = tf.convert_to_tensor(grad, tf.float32)
    inputs = dict(zip(names, [tf.cast(v, tf.float32) for v in values]))
    inputs.update(table_handle=table_handle, keys=tf.convert_to_tensor(keys, tf.int64), grad=grad, step=_step(step))
    # The op's keyword-only raw wrapper: inputs and attrs are passed by their op-def names.
    return getattr(load_ops(), spec.op_name)(
        dim=_dim_of(grad, dim),
        slot_offset=int(slot_offset),
        name=name,
        **inputs,
        **{k: bool(v) for k, v in flags.items()},
    )


def sparse_apply_gradient_descent(table_handle, keys, grad, lr, step=None, dim=None, name=None):
    """var -= lr * grad (TF: resource_scatter_add(var, keys, -grad * lr))."""
    return sparse_apply("GradientDescent", table_handle, keys, grad, dict(lr=lr), step=step, dim=dim, name=name)


def sparse_apply_momentum(
    table_handle, keys, grad, lr, momentum, step=None, dim=None, slot_offset=-1, use_nesterov=False, name=None
):
    """SparseApplyMomentum: accum = accum * momentum + grad; var -= lr * accum (Nesterov: lr * grad +
    lr * momentum * accum). Slot: [momentum]."""
    return sparse_apply(
        "Momentum",
        table_handle,
        keys,
        grad,
        dict(lr=lr, momentum=momentum),
        step=step,
        dim=dim,
        slot_offset=slot_offset,
        use_nesterov=use_nesterov,
        name=name,
    )


def sparse_apply_adagrad(table_handle, keys, grad, lr, step=None, dim=None, slot_offset=-1, name=None):
    """SparseApplyAdagrad (v1): accum += grad^2; var -= lr * grad / sqrt(accum). Slot: [accumulator]."""
    return sparse_apply(
        "Adagrad", table_handle, keys, grad, dict(lr=lr), step=step, dim=dim, slot_offset=slot_offset, name=name
    )


def sparse_apply_adam(
    table_handle,
    keys,
    grad,
    beta1_power,
    beta2_power,
    lr,
    beta1,
    beta2,
    epsilon,
    step=None,
    dim=None,
    slot_offset=-1,
    name=None,
):
    """TF1 AdamOptimizer's sparse update, for the rows of the batch:
    lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power); m = m * beta1 + (1 - beta1) * grad;
    v = v * beta2 + (1 - beta2) * grad^2; var -= lr_t * m / (sqrt(v) + epsilon). Slots: [m, v].
    (TF1's dense-variable Adam also decays m/v of the rows not in the batch; this lazy update does not.)"""
    return sparse_apply(
        "Adam",
        table_handle,
        keys,
        grad,
        dict(beta1_power=beta1_power, beta2_power=beta2_power, lr=lr, beta1=beta1, beta2=beta2, epsilon=epsilon),
        step=step,
        dim=dim,
        slot_offset=slot_offset,
        name=name,
    )


def sparse_apply_ftrl(
    table_handle,
    keys,
    grad,
    lr,
    l1,
    l2,
    lr_power,
    l2_shrinkage=0.0,
    step=None,
    dim=None,
    slot_offset=-1,
    multiply_linear_by_lr=False,
    name=None,
):
    """SparseApplyFtrl (l2_shrinkage == 0) / SparseApplyFtrlV2 (l2_shrinkage > 0). Slots: [accum, linear].
    Note the op's input order is (lr, l1, l2, l2_shrinkage, lr_power), as in ResourceSparseApplyFtrlV2."""
    return sparse_apply(
        "Ftrl",
        table_handle,
        keys,
        grad,
        dict(lr=lr, l1=l1, l2=l2, l2_shrinkage=l2_shrinkage, lr_power=lr_power),
        step=step,
        dim=dim,
        slot_offset=slot_offset,
        multiply_linear_by_lr=multiply_linear_by_lr,
        name=name,
    )


def sparse_apply_rmsprop(
    table_handle, keys, grad, lr, rho, momentum, epsilon, step=None, dim=None, slot_offset=-1, centered=False, name=None
):
    """SparseApplyRMSProp / SparseApplyCenteredRMSProp (rho = TF1 RMSPropOptimizer's decay).
    Slots: [rms, momentum] (+ [mg] if centered)."""
    return sparse_apply(
        "RMSProp",
        table_handle,
        keys,
        grad,
        dict(lr=lr, rho=rho, momentum=momentum, epsilon=epsilon),
        step=step,
        dim=dim,
        slot_offset=slot_offset,
        centered=centered,
        name=name,
    )


def sparse_apply_rowwise_adagrad(table_handle, keys, grad, lr, step=None, dim=None, slot_offset=-1, name=None):
    """tf_ext.RowwiseAdagradOptimizer's step: accum += mean(grad^2) per row; var -= lr * grad / sqrt(accum).
    Slot: [accumulator], one column."""
    return sparse_apply(
        "RowwiseAdagrad", table_handle, keys, grad, dict(lr=lr), step=step, dim=dim, slot_offset=slot_offset, name=name
    )


def embedding_lookup_ids(
    table_handle,
    ids,
    dim,
    step=None,
    insert_missing=False,
    count=True,
    init_kind="constant",
    init_a=0.0,
    init_b=1.0,
    seed=None,
    seed2=None,
    name=None,
):
    """(values [n, dim], unique_keys [u], idx [n] int32) of an int64 vector of ids that may repeat
    (TfExtEmbeddingLookupIds): tf.unique + embedding_lookup_unique + tf.gather in one kernel.

    unique_keys are the distinct ids in order of first occurrence, ids[i] = unique_keys[idx[i]];
    each unique key is looked up (inserted, counted) once; values[i] is the row of ids[i]. Arguments as
    `embedding_lookup_unique`. The gradient of values w.r.t. table_handle is
    IndexedSlices(lookup_ids_grad(d values, idx, unique_keys), unique_keys): one row per unique key,
    the sum over its occurrences.
    """
    if init_kind not in INIT_KINDS:
        raise ValueError("init_kind must be one of %s, got %r" % (INIT_KINDS, init_kind))
    s1, s2 = _seeds(seed, seed2)
    return load_ops().tf_ext_embedding_lookup_ids(
        table_handle,
        tf.convert_to_tensor(ids, tf.int64),
        _step(step),
        dim=int(dim),
        insert_missing=bool(insert_missing),
        count=bool(count),
        init_kind=init_kind,
        init_a=float(init_a),
        init_b=float(init_b),
        seed=s1,
        seed2=s2,
        name=name,
    )


def lookup_ids_grad(grad, idx, unique_keys, name=None):
    """[u, dim]: row j is the sum of grad[i] over the i with idx[i] == j (TfExtEmbeddingLookupIdsGrad),
    added in increasing i; like tf.math.unsorted_segment_sum(grad, idx, size(unique_keys))."""
    return load_ops().tf_ext_embedding_lookup_ids_grad(
        tf.convert_to_tensor(grad, tf.float32),
        tf.convert_to_tensor(idx, tf.int32),
        tf.convert_to_tensor(unique_keys, tf.int64),
        name=name,
    )


def _lookup_ids_grad(op, grad, unused_keys_grad, unused_idx_grad):
    """d values -> IndexedSlices(per unique key sum, unique_keys) for the table handle (unique indices)."""
    del unused_keys_grad, unused_idx_grad
    keys, idx = op.outputs[1], op.outputs[2]
    dim = op.get_attr("dim")
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)
    summed = lookup_ids_grad(grad, idx, keys)
    dense_shape = tf.constant([HANDLE_GRAD_DENSE_ROWS, dim], tf.int64)
    return [tf.IndexedSlices(values=summed, indices=keys, dense_shape=dense_shape), None, None]


def _lookup_sparse_grad(op, grad, *unused_grads):
    """d values -> IndexedSlices(per unique key sum of the scaled row gradients, unique_keys) for the table handle."""
    del unused_grads
    if grad is None:  # only the rows-read output was used (the shard's value): its gradient goes to the handle
        return [None] * 6
    keys, idx, entry_rows, row_scale = op.outputs[1:5]
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)
    summed = load_ops().tf_ext_embedding_lookup_sparse_grad(grad, entry_rows, row_scale, idx, keys)
    dense_shape = tf.constant([HANDLE_GRAD_DENSE_ROWS, op.get_attr("dim")], tf.int64)
    return [tf.IndexedSlices(values=summed, indices=keys, dense_shape=dense_shape)] + [None] * 5


try:
    tf.RegisterGradient("TfExtEmbeddingLookupSparse")(_lookup_sparse_grad)
    tf.no_gradient("TfExtEmbeddingLookupSparseGrad")
    tf.RegisterGradient("TfExtEmbeddingLookupIds")(_lookup_ids_grad)
    tf.no_gradient("TfExtEmbeddingLookupIdsGrad")
except KeyError:  # registered already (module reloaded)
    pass

try:
    tf.RegisterGradient(_HANDLE_GRAD)(_handle_grad)
    tf.no_gradient("TfExtShardIndex")
except KeyError:  # registered already (module reloaded)
    pass
