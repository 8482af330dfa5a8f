"""Top-K sparsification with error feedback for `allreduce.DenseReducer` (`topk_ratio`), with what Deep Gradient
Compression (Lin et al., ICLR 2018) adds to train as well as the dense exchange.

Per gradient of at least `topk_min_elements` entries, each rank adds its residual v (a non-trainable variable per
gradient, in the TOPK_RESIDUALS collection: saved in checkpoints, never broadcast), sends the ceil(r * n) entries of
largest magnitude (positions and values, one allgather each per fused buffer) and keeps the rest as its new
residual. Every rank scatter-adds all ranks' entries, so all apply the same update. Each of these is off by default
and changes nothing when off:

* `topk_warmup_steps` D: the first D steps are dense (the residual is sent along and cleared).
* `topk_momentum` m (momentum correction): a local velocity u (a second variable per gradient, also in
  TOPK_RESIDUALS) accumulates u = m * u + g and the residual v += u; the top-k of v is sent, and u and v are zeroed
  where it was sent (momentum factor masking: a sent entry's momentum would otherwise push it again and again).
  The sent update is already the momentum update: the wrapped optimizer must be plain SGD
  (`GradientDescentOptimizer`); a momentum optimizer on top would apply momentum twice. Dense steps (warm-up,
  flush) send u + v and keep u, which is exactly momentum SGD on the averaged gradient.
* `topk_clip_norm` c (local gradient clipping): each rank clips its Top-K gradients to the global norm
  c / sqrt(ranks) before they are accumulated (the sum over ranks then has norm at most about c).
* `topk_ratio_warmup_steps` W: after the dense steps, the ratio falls exponentially from 25% to r over W steps
  (25%, 6.25%, 1.56%, ... each for an equal share of W, then r), so that the residual does not start from a
  model that changes fast.
* `topk_flush_steps` K: every K-th step (global step % K == K - 1) is dense: every rank's whole residual is sent
  and cleared.

A step whose gradients are not finite (a mixed-precision optimizer skips it: `DistributedOptimizer(mp_optimizer)`)
leaves the residuals and velocities as they were: an Inf or NaN is always among the entries sent (so every rank
sees it and skips the same step), and the state is only updated when every rank's sent values, this reduction's
other gradients, the optimizer's other reduced gradients and the loss are finite. Without that the entries sent on
a skipped step would be lost, and the finite part of a skipped step's gradient would be kept in the residual.
"""

import math

import tensorflow as tf

from tensorflow_ext.horovod import compression_ops
from tensorflow_ext.horovod import consistency
from tensorflow_ext.horovod.config import TOPK_RESIDUALS
from tensorflow_ext.tf_compat import internals

__all__ = ["RATIO_WARMUP_START", "bucket", "ratio_schedule", "reduce", "residual", "velocity"]

# The ratio the ratio warm-up starts from; each stage sends a quarter of the previous one (DGC's schedule).
RATIO_WARMUP_START = 0.25
_RATIO_WARMUP_FACTOR = 4.0


def _state(reducer, var, grad, what):
    out = internals.slot_creator.create_zeros_slot(var, "%s_topk_%s" % (reducer.name, what), dtype=grad.dtype)
    if out not in tf.compat.v1.get_collection(TOPK_RESIDUALS):
        tf.compat.v1.add_to_collection(TOPK_RESIDUALS, out)
    return out


def residual(reducer, var, grad):
    """The Top-K residual variable of `var` for `reducer` (created on first use, in TOPK_RESIDUALS)."""
    return _state(reducer, var, grad, "residual")


def velocity(reducer, var, grad):
    """The momentum-correction velocity of `var` for `reducer` (created on first use, in TOPK_RESIDUALS)."""
    return _state(reducer, var, grad, "velocity")


def ratio_schedule(ratio, warmup_steps):
    """The ratios of the ratio warm-up, then `ratio`: [0.25, 0.0625, ..., ratio] (only those above `ratio`), or
    [ratio] without warm-up."""
    out = []
    if warmup_steps > 0:
        r = RATIO_WARMUP_START
        while r > ratio * (1.0 + 1e-9):
            out.append(r)
            r /= _RATIO_WARMUP_FACTOR
    return out + [ratio]


def _ks(ratio, like):
    return [max(1, int(math.ceil(ratio * g.shape.num_elements()))) for g in like]


def _finite(tensors):
    """Scalar bool: every entry of every floating tensor is finite (wire bf16 bits included)."""
    checks = []
    for t in tensors:
        if isinstance(t, tf.IndexedSlices):
            t = t.values
        if t is None or not (t.dtype.is_floating or t.dtype == tf.uint16):
            continue
        if t.dtype == tf.uint16:  # bfloat16 wire bits
            t = tf.bitcast(t, tf.bfloat16)
        checks.append(tf.reduce_all(tf.math.is_finite(t)))
    if not checks:
        return tf.constant(True)
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


def _guarded(ok, updates):
    """The assignments `updates`, in order, as one op that runs them only when `ok`: (variable, value, False)
    assigns value; (variable, nd_indices, True) zeroes the variable's entries there (after the assignments before
    it)."""

    def commit():
        ops = []
        for var, value, scatter in updates:
            if scatter:
                with tf.control_dependencies(ops):
                    zeros = tf.zeros([tf.shape(value)[0]], var.dtype.base_dtype)
                    ops.append(tf.compat.v1.scatter_nd_update(var, value, zeros).op)
            else:
                ops.append(tf.compat.v1.assign(var, value).op)
        with tf.control_dependencies(ops):
            return tf.constant(True)

    return tf.cond(ok, commit, lambda: tf.constant(False), name="topk_commit_if_finite")


def reduce(reducer, grads, vars_, global_step, also_finite=()):
    """The reduced `grads` (dense, floating, static shapes) of `vars_` by Top-K with error feedback.

    Args:
      reducer: the `DenseReducer`.
      grads, vars_: lists of gradients and their variables.
      global_step: the global step tensor (or None when no setting needs it).
      also_finite: tensors (reduced gradients, the loss) that must be finite for the Top-K state to be updated.

    Returns:
      list of the reduced gradients; they run after the state was updated (or left as it was).

    Raises:
      ValueError: a setting that needs the global step without one.
    """
    cfg = reducer.config
    residuals = [residual(reducer, v, g) for g, v in zip(grads, vars_)]
    momentum = cfg.topk_momentum
    velocities = [velocity(reducer, v, g) for g, v in zip(grads, vars_)] if momentum > 0 else None
    ratios = ratio_schedule(cfg.topk_ratio, cfg.topk_ratio_warmup_steps)
    dense_steps = cfg.topk_warmup_steps > 0 or cfg.topk_flush_steps > 0
    if (dense_steps or len(ratios) > 1) and global_step is None:
        raise ValueError(
            "Top-K with topk_warmup_steps=%d, topk_ratio_warmup_steps=%d, topk_flush_steps=%d needs a global step: "
            "create it before minimize() (tf.compat.v1.train.get_or_create_global_step()) or set them to 0"
            % (cfg.topk_warmup_steps, cfg.topk_ratio_warmup_steps, cfg.topk_flush_steps)
        )
    if cfg.topk_clip_norm is not None:
        limit = cfg.topk_clip_norm / math.sqrt(reducer.process_set.size())
        grads, _ = tf.clip_by_global_norm(grads, limit, name="topk_local_clip")
    if velocities is not None:
        accs = [tf.cast(momentum, g.dtype) * u.read_value() + g for g, u in zip(grads, velocities)]
    else:
        accs = list(grads)
    others_finite = _finite(list(also_finite))
    n = len(grads)

    def unpack(flat):
        # A branch returns one flat list (tf.cond's outputs): outputs, new residuals, with momentum the nd indices of
        # the sent entries (where the velocity is zeroed; none on dense steps), and whether the sent values are finite.
        outs, new_v = flat[:n], flat[n : 2 * n]
        masks = flat[2 * n : 3 * n] if velocities is not None else None
        return outs, new_v, masks, flat[-1]

    def dense():
        outs, new_v = _dense(reducer, accs, residuals)
        masks = [tf.zeros([0, len(g.shape)], tf.int64) for g in grads] if velocities is not None else []
        return outs + new_v + masks + [_finite(outs)]

    def sparse(ratio):
        def branch():
            tag = "" if ratio == cfg.topk_ratio else "_r%d" % ratios.index(ratio)
            outs, new_v, masks, finite = _sparse(reducer, accs, residuals, ratio, tag, velocities is not None)
            return outs + new_v + (masks if velocities is not None else []) + [finite]

        return branch

    branches = ([dense] if dense_steps else []) + [sparse(r) for r in ratios]
    if len(branches) == 1:
        flat = branches[0]()
    else:
        t = tf.cast(global_step, tf.int64)
        index = tf.constant(0, tf.int64)
        if len(ratios) > 1:
            stages = len(ratios) - 1
            since = tf.maximum(t - cfg.topk_warmup_steps, 0)
            index = tf.minimum(since * stages // cfg.topk_ratio_warmup_steps, stages)
        if dense_steps:
            is_dense = tf.less(t, cfg.topk_warmup_steps)
            if cfg.topk_flush_steps > 0:
                flush = tf.equal(tf.math.floormod(t, cfg.topk_flush_steps), cfg.topk_flush_steps - 1)
                is_dense = tf.logical_or(is_dense, flush)
            index = tf.where(is_dense, tf.constant(0, tf.int64), index + 1)
        flat = list(_select(index, branches))
    outs, new_v, masks, finite = unpack(flat)
    updates = [(r, v, False) for r, v in zip(residuals, new_v)]
    if velocities is not None:
        updates += [(u, a, False) for u, a in zip(velocities, accs)]
        updates += [(u, m, True) for u, m in zip(velocities, masks)]
    committed = _guarded(tf.logical_and(finite, others_finite), updates)
    with tf.control_dependencies([committed]):
        return [tf.identity(t) for t in outs]


def _select(index, branches):
    """branches[index]() as nested tf.cond (Horovod's collectives inside; every rank takes the same branch)."""
    if len(branches) == 1:
        return branches[0]()
    rest = lambda: _select(index - 1, branches[1:])  # noqa: E731
    return tf.cond(tf.equal(index, 0), branches[0], rest, name="topk_schedule")


def _dense(reducer, accs, residuals):
    """Every rank's whole acc + residual, summed densely; the new residuals (zero)."""
    full = [a + r.read_value() for a, r in zip(accs, residuals)]
    reduced = reducer.dense_buckets(full, "warm")
    return list(reduced), [tf.zeros_like(r) for r in residuals]


def _sparse(reducer, accs, residuals, ratio, tag, with_masks):
    """Each bucket: per gradient the top ceil(ratio*n) of |acc + residual| (one pass, compression_ops); one
    allgather of the positions (in the bucket's flat buffer) and one of the wire values; every rank scatter-adds
    them all. The residual keeps what was not sent, including the rounding of a 16-bit wire, so sent + residual ==
    acc + old residual. Returns (outputs, new residuals, per gradient the nd indices of its sent entries, finite)."""
    n = len(accs)
    outs, new_v, masks, finite = [None] * n, [None] * n, [None] * n, []
    for b, group in enumerate(reducer.buckets(accs)):
        like = [accs[i] for i in group]
        ks = _ks(ratio, like)
        parts, idx, new_res, all_vals = _exchange(
            reducer, like, [residuals[i].read_value() for i in group], ks, "%s_topk%s%d" % (reducer.name, tag, b),
            reducer.wire16
        )  # fmt: skip
        finite.append(_finite([all_vals]))
        start, offset = 0, 0
        for i, part, res, k in zip(group, parts, new_res, ks):
            outs[i], new_v[i] = part, res
            if not with_masks:
                continue
            local = tf.cast(idx[start : start + k] - offset, tf.int64)
            shape = tf.shape(accs[i], out_type=tf.int64)
            masks[i] = tf.transpose(tf.unravel_index(local, shape)) if accs[i].shape.rank != 1 else local[:, None]
            start += k
            offset += accs[i].shape.num_elements()
    finite = finite[0] if len(finite) == 1 else tf.reduce_all(tf.stack(finite))
    return outs, new_v, masks, finite


def _exchange(reducer, like, residual_values, ks, name, wire16):
    """Select, gather and scatter-add one fused buffer: (reduced list, local positions, new residuals, all ranks'
    wire values)."""
    hvd = reducer.hvd
    idx, vals, new_residuals = compression_ops.top_k_select(like, residual_values, ks, wire16)
    all_idx = hvd.allgather(consistency.gate(idx), process_set=reducer.process_set, name=name + "_idx")
    all_vals = hvd.allgather(consistency.gate(vals), process_set=reducer.process_set, name=name + "_val")
    parts = compression_ops.scatter_add(all_idx, all_vals, wire16, like, reducer.topk_factor)
    return parts, idx, new_residuals, all_vals


def bucket(reducer, like, residuals, name, wire16):
    """Top-K of one fused buffer (plain error feedback: compression="auto"'s Top-K): `like` (static shapes) plus
    their residual variables; collectives named after `name`. Returns the reduced list (after the residuals were
    updated)."""
    ks = _ks(reducer.config.topk_ratio, like)
    parts, _, new_residuals, _ = _exchange(reducer, like, [r.read_value() for r in residuals], ks, name, wire16)
    assigns = [r.assign(n) for r, n in zip(residuals, new_residuals)]
    with tf.control_dependencies(assigns):
        return [tf.identity(p) for p in parts]
