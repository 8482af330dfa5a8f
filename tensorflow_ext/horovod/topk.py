"""Top-K sparsification with error feedback for `allreduce.DenseReducer` (`topk_ratio`).

Per gradient of at least `topk_min_elements` entries, each rank adds its residual (a non-trainable variable per
gradient, in the TOPK_RESIDUALS collection: saved in checkpoints, never broadcast), sends the ceil(r * n) entries of
largest magnitude (positions and values, one allgather each per fused buffer) and keeps the rest as its new
residual. Every rank scatter-adds all ranks' entries, so all apply the same update. Optionally dense for the first
`topk_warmup_steps` steps (the residual is sent along and cleared).
"""

import math

import tensorflow as tf

from tensorflow_ext.horovod import allreduce as allreduce_lib
from tensorflow_ext.horovod import compression_ops
from tensorflow_ext.horovod import consistency
from tensorflow_ext.horovod.config import TOPK_RESIDUALS
from tensorflow_ext.tf_compat import internals

__all__ = ["bucket", "reduce", "residual"]


def residual(reducer, var, grad):
    """The Top-K residual variable of `var` for `reducer` (created on first use, in TOPK_RESIDUALS)."""
    out = internals.slot_creator.create_zeros_slot(var, reducer.name + "_topk_residual", dtype=grad.dtype)
    if out not in tf.compat.v1.get_collection(TOPK_RESIDUALS):
        tf.compat.v1.add_to_collection(TOPK_RESIDUALS, out)
    return out


def reduce(reducer, grads, vars_, global_step):
    """The reduced `grads` (dense, floating, static shapes) of `vars_` by Top-K with error feedback.

    Raises:
      ValueError: warm-up steps without a global step.
    """
    cfg = reducer.config
    residuals = [residual(reducer, v, g) for g, v in zip(grads, vars_)]
    if cfg.topk_warmup_steps > 0:
        if global_step is None:
            raise ValueError(
                "topk_warmup_steps=%d needs a global step: create it before minimize() "
                "(tf.compat.v1.train.get_or_create_global_step()) or set topk_warmup_steps=0" % cfg.topk_warmup_steps
            )
        warm = tf.less(global_step, tf.cast(cfg.topk_warmup_steps, global_step.dtype))
        outs = tf.cond(
            warm,
            lambda: _dense(reducer, grads, residuals),
            lambda: _sparse(reducer, grads, residuals),
            name="topk_warmup",
        )
        return list(outs)
    return _sparse(reducer, grads, residuals)


def _dense(reducer, grads, residuals):
    accs = [g + r.read_value() for g, r in zip(grads, residuals)]
    reduced = reducer.dense_buckets(accs, "warm")
    with tf.control_dependencies(reduced):
        clears = [r.assign(tf.zeros_like(r)) for r in residuals]
    with tf.control_dependencies(clears):
        return [tf.identity(t) for t in reduced]


def _sparse(reducer, grads, residuals):
    """Each bucket: per gradient the top ceil(ratio*n) of |grad + residual| (one pass, compression_ops); one
    allgather of the positions (in the bucket's flat buffer) and one of the wire values; every rank scatter-adds
    them all. The residual keeps what was not sent, including the rounding of a 16-bit wire, so sent + residual ==
    grad + old residual."""
    cfg = reducer.config
    out = [None] * len(grads)
    order = list(range(len(grads)))
    for b, group in enumerate(
        allreduce_lib._buckets(order, cfg.fusion_bytes, lambda i: allreduce_lib._item_bytes(grads[i]))
    ):
        parts = bucket(
            reducer,
            [grads[i] for i in group],
            [residuals[i] for i in group],
            "%s_topk%d" % (reducer.name, b),
            reducer.wire16,
        )
        for i, part in zip(group, parts):
            out[i] = part
    return out


def bucket(reducer, like, residuals, name, wire16):
    """Top-K of one fused buffer: `like` (static shapes) plus their residual variables; collectives named after
    `name`. Returns the reduced list (after the residuals were updated)."""
    hvd = reducer.hvd
    ks = [max(1, int(math.ceil(reducer.config.topk_ratio * allreduce_lib._static_size(g)))) for g in like]
    idx, vals, new_residuals = compression_ops.top_k_select(like, [r.read_value() for r in residuals], ks, wire16)
    assigns = [r.assign(n) for r, n in zip(residuals, new_residuals)]
    all_idx = hvd.allgather(consistency.gate(idx), process_set=reducer.process_set, name=name + "_idx")
    all_vals = hvd.allgather(consistency.gate(vals), process_set=reducer.process_set, name=name + "_val")
    parts = compression_ops.scatter_add(all_idx, all_vals, wire16, like, reducer.topk_factor)
    with tf.control_dependencies(assigns):
        return [tf.identity(p) for p in parts]
