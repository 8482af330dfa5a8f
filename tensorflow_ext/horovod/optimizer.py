"""`DistributedOptimizer`: Horovod's optimizer wrapper, extended to dynamic embeddings.

It wraps any `tf.compat.v1.train` optimizer (it delegates `compute_gradients` / `apply_gradients` to it, as
Horovod's own `_DistributedOptimizer` does) and combines the gradients across ranks before they are applied:

* dense variables: Horovod's allreduce (compression, op, pre/post-scaling, `sparse_as_dense` as in Horovod), or,
  when asked for, the faster reductions of `tensorflow_ext.horovod.allreduce` (fp16/bf16 compression, 2D
  allreduce, Top-K sparsification with error feedback, all on fused buffers);
* data-parallel dynamic embeddings: the sparse gradients (keys + rows) of every rank are gathered
  (`hvd.allgather`), summed per key when applied, and scaled like the dense ones (Average divides by the number
  of ranks), so every replica applies the same update;
* model-parallel dynamic embeddings: the gradient already reached each key's owner through the lookup's
  alltoall; it is only scaled (Average divides by the number of ranks). `compute_gradients` first fuses the
  exchanges of the loss's model-parallel lookups (`tensorflow_ext.horovod.exchange`).

The result equals one process training on the concatenation of the ranks' batches (the golden tests check this).

Before the first collective of every step, the ranks compare their model configurations (`consistency`): ranks
that built different models fail with an error naming what differs instead of hanging in a collective.
"""

import tensorflow as tf

from tensorflow_ext.embedding import shard as shard_lib
from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import allreduce as allreduce_lib
from tensorflow_ext.horovod import auto_compression
from tensorflow_ext.horovod import consistency
from tensorflow_ext.horovod import embedding as hvd_embedding
from tensorflow_ext.horovod import exchange as exchange_lib
from tensorflow_ext.horovod import wire16

__all__ = ["DistributedOptimizer"]

_Shard = shard_lib.DynamicEmbeddingShard


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """See `DistributedOptimizer`."""

    def __init__(
        self,
        optimizer,
        name,
        use_locking,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        process_set,
        config,
    ):
        super().__init__(name=name, use_locking=use_locking)
        self._hvd = _hvd.require_horovod()
        self._optimizer = optimizer
        self._device_dense = device_dense
        self._device_sparse = device_sparse
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._op = op
        self._predivide = gradient_predivide_factor
        self._process_set = process_set
        self._config = config
        self._auto_choices = None
        if config.accelerated:
            # Checked now, not at the first step: a missing process set or a bad node size fails at build time.
            allreduce_lib.DenseReducer(config, op, gradient_predivide_factor, process_set, name)

    @property
    def allreduce_config(self):
        """The resolved `tensorflow_ext.horovod.allreduce.Config` of the dense gradients."""
        return self._config

    @property
    def compression_choices(self):
        """With compression="auto": {fused buffer name: "none", "fp16", "bf16" or "topk"} as chosen (the same on
        every rank) by the last compute_gradients; None otherwise (`tensorflow_ext.horovod.auto_compression`)."""
        return None if self._auto_choices is None else self._auto_choices.methods()

    @property
    def optimizer(self):
        """The wrapped optimizer."""
        return self._optimizer

    def _scale(self):
        """(prescale, postscale) of an allreduce with this op, as Horovod applies gradient_predivide_factor."""
        if self._op == self._hvd.Average and self._predivide != 1.0:
            return 1.0 / self._predivide, self._predivide / self._process_set.size()
        return 1.0, 1.0

    def _reduce_dense(self, grad, var):
        hvd = self._hvd
        if isinstance(grad, tf.IndexedSlices) and self._sparse_as_dense:
            grad = tf.convert_to_tensor(grad)
        if isinstance(grad, tf.IndexedSlices):
            grad = tf.IndexedSlices(consistency.gate(grad.values), consistency.gate(grad.indices), grad.dense_shape)
        else:
            grad = consistency.gate(grad)
        prescale, postscale = self._scale()
        op = hvd.Sum if (self._op == hvd.Average and self._predivide != 1.0) else self._op
        return hvd.allreduce(
            grad,
            device_dense=self._device_dense,
            device_sparse=self._device_sparse,
            compression=self._compression,
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self._process_set,
            name="tf_ext_allreduce_" + var.op.name.replace("/", "_"),
        )

    def _average_factor(self):
        return 1.0 / self._process_set.size() if self._op == self._hvd.Average else 1.0

    def _reduce_shard(self, grad, shard):
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(
                "the gradient of dynamic embedding shard %s must be IndexedSlices, got %s"
                % (shard.name, type(grad).__name__)
            )
        factor = self._average_factor()
        values = tf.reshape(tf.convert_to_tensor(grad.values), [-1, shard.dim])
        if shard.embedding.distribution is not None:
            # Model-parallel: the lookup's alltoall already brought every rank's gradient of this rank's keys.
            return tf.IndexedSlices(values * factor if factor != 1.0 else values, grad.indices)
        hvd = self._hvd
        name = shard.name.replace("/", "_")
        values = consistency.gate(values)
        keys = hvd.allgather(
            consistency.gate(tf.cast(grad.indices, tf.int64)),
            process_set=self._process_set,
            name="tf_ext_allgather_keys_" + name,
        )
        values = hvd.allgather(values, process_set=self._process_set, name="tf_ext_allgather_rows_" + name)
        if factor != 1.0:
            values = values * factor
        return tf.IndexedSlices(values, keys)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, combined across ranks (see the module docstring).

        Returns:
          list of (gradient, variable) pairs.
        """
        # Before the gradients exist: the model-parallel lookups of the loss share one exchange per stage.
        exchange_lib.fuse(args[0] if args else kwargs.get("loss"))
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if self._process_set.size() == 1 or hvd_embedding.in_single_process():
            return grads_and_vars
        # Declared now, not only in apply_gradients: the collectives built below run behind the configuration check,
        # which must already compare these settings when the gradients alone are run.
        consistency.declare("DistributedOptimizer '%s'" % self._name, self._reduction_settings())
        out = []
        fast = []  # indices into out of the dense gradients for the accelerated reduction
        with tf.name_scope(self._name + "_Allreduce"):
            for grad, var in grads_and_vars:
                if grad is None:
                    out.append((grad, var))
                elif isinstance(var, _Shard):
                    out.append((self._reduce_shard(grad, var), var))
                elif self._config.accelerated and (self._sparse_as_dense or not isinstance(grad, tf.IndexedSlices)):
                    fast.append(len(out))
                    out.append((tf.convert_to_tensor(grad), var))
                else:
                    out.append((self._reduce_dense(grad, var), var))
            if fast:
                reducer = allreduce_lib.DenseReducer(
                    self._config, self._op, self._predivide, self._process_set, self._name.replace("/", "_")
                )
                if self._config.compression is allreduce_lib.AutoCompressor:
                    declared = ("DistributedOptimizer '%s'" % self._name, self._reduction_settings())
                    self._auto_choices = auto_compression.reduce(reducer, [out[i] for i in fast], declared)
                    reduced = self._auto_choices.reduced
                else:
                    # Top-K keeps its state on a step that a mixed-precision optimizer skips (any gradient or the
                    # loss not finite).
                    others = [g for i, (g, _) in enumerate(out) if g is not None and i not in set(fast)]
                    loss = args[0] if args else kwargs.get("loss")
                    reduced = reducer.reduce(
                        [out[i] for i in fast],
                        global_step=tf.compat.v1.train.get_global_step(out[fast[0]][1].graph),
                        also_finite=others + ([loss] if isinstance(loss, tf.Tensor) else []),
                    )
                for i, grad in zip(fast, reduced):
                    out[i] = (grad, out[i][1])
        return out

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Calls the wrapped optimizer's apply_gradients.

        The configuration check's fingerprint is refreshed afterwards: the optimizer's slot columns are part of
        what every rank must agree on.

        Returns:
          The wrapped optimizer's apply op.
        """
        op = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        # How the gradients are reduced decides the collectives of every step (their dtypes, fusion, Top-K).
        consistency.declare("DistributedOptimizer '%s'" % self._name, self._reduction_settings(), op.graph)
        return op

    def _reduction_settings(self):
        """The settings every rank must share, resolved: a 2D node size left to Horovod is its local_size here."""
        config = self._config
        node_size = config.node_size
        if config.hierarchical and node_size is None:
            node_size = self._hvd.local_size()
        return (
            [
                ("optimizer", type(self._optimizer).__name__),
                ("op", {self._hvd.Average: "Average", self._hvd.Sum: "Sum"}.get(self._op, self._op)),
                ("compression", config.compression.name),
                ("horovod compression", getattr(self._compression, "__name__", self._compression)),
                ("sparse_as_dense", self._sparse_as_dense),
                ("gradient_predivide_factor", self._predivide),
                ("hierarchical", config.hierarchical),
                ("node_size", node_size),
            ]
            + [
                (k, getattr(config, k))
                for k in config.SETTING_FIELDS
                if k not in ("compression", "hierarchical", "node_size")  # above, as this rank resolves them
            ]
            + self._fp16_reduction_setting()
        )

    def _fp16_reduction_setting(self):
        """How fp16 buffers are summed (`wire16`: Horovod's ring or as bytes, which run different collectives),
        where this optimizer can send fp16."""
        if self._config.compression.name not in ("fp16", "auto"):
            return []
        return [("fp16 reduction", wire16.fp16_reduction())]

    def get_slot(self, *args, **kwargs):
        """The wrapped optimizer's get_slot."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """The wrapped optimizer's get_slot_names."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's variables."""
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",  # pylint: disable=invalid-name
    compression=None,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=None,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=None,
    hierarchical=False,
    node_size=None,
    topk_ratio=None,
    topk_min_elements=allreduce_lib.DEFAULT_TOPK_MIN_ELEMENTS,
    topk_warmup_steps=0,
    fusion_bytes=allreduce_lib.DEFAULT_FUSION_BYTES,
    topk_momentum=0.0,
    topk_clip_norm=None,
    topk_ratio_warmup_steps=0,
    topk_flush_steps=0,
    intra_node="auto",
):
    """Horovod's `DistributedOptimizer` (same signature) for models with dynamic embeddings, plus faster dense
    allreduce methods (`tensorflow_ext.horovod.allreduce`; docs/distributed.md, "Faster allreduce").

    With the defaults the dense gradients go through Horovod's allreduce exactly as in Horovod. Each of the
    arguments after `process_set` is overridden by its environment variable (`TF_EXT_HVD_COMPRESSION`,
    `TF_EXT_HVD_HIERARCHICAL`, `TF_EXT_HVD_NODE_SIZE`, `TF_EXT_HVD_TOPK_RATIO`, `TF_EXT_HVD_TOPK_MIN_ELEMENTS`,
    `TF_EXT_HVD_TOPK_WARMUP_STEPS`, `TF_EXT_HVD_FUSION_BYTES`, `TF_EXT_HVD_INTRA_NODE`), and so is `compression`.

    Args:
      optimizer: a `tf.compat.v1.train` optimizer.
      name, use_locking, device_dense, device_sparse: as in Horovod.
      compression: for dense gradients: Horovod's `hvd.Compression.none` (default) or `.fp16` (Horovod's
        per-tensor path), or `tensorflow_ext.horovod.Compression.fp16` / `.bf16` (fused buffers, 16 bits on the
        wire; bf16 keeps float32's range), or `.auto` / "auto" (per fused buffer the fastest of plain, fp16,
        bf16 and, when topk_ratio is given, Top-K, measured before the first step; `compression_choices`).
      sparse_as_dense: densify the IndexedSlices gradients of dense variables (as in Horovod). Dynamic embedding
        gradients always stay sparse: their "dense" form would be the whole key space.
      backward_passes_per_step: must be 1 here (gradient accumulation over several passes is not implemented for
        dynamic embeddings).
      op: `hvd.Average` (default) or `hvd.Sum`.
      gradient_predivide_factor: as in Horovod (Average only).
      average_aggregated_gradients, num_groups, groups: Horovod's grouping options; accepted for signature
        compatibility (Horovod fuses the allreduces of one step by itself).
      process_set: Horovod process set (default: all ranks).
      hierarchical: 2D allreduce: reduce inside each node of `node_size` ranks, allreduce 1/node_size slices
        across nodes, gather inside the node. Needs `tensorflow_ext.horovod.init(node_size=...)`.
      node_size: ranks per node of the 2D allreduce (default: Horovod's local_size); giving it turns
        `hierarchical` on. Must divide the number of ranks.
      topk_ratio: None (default, off) or a fraction in (0, 1]: each rank sends the ceil(ratio * n) largest
        entries of each dense gradient (plus its residual) and keeps the rest in a residual variable.
      topk_min_elements: gradients with fewer entries are reduced densely (default 1024).
      topk_warmup_steps: dense steps before Top-K starts (needs the global step).
      fusion_bytes: largest fused buffer of the accelerated paths, in bytes (default 64 MiB; 0: no fusion).
      topk_momentum: Top-K's momentum correction factor in [0, 1) (default 0: off); the wrapped optimizer must
        then be plain SGD (`tensorflow_ext.horovod.topk`). `TF_EXT_HVD_TOPK_MOMENTUM`.
      topk_clip_norm: Top-K's local gradient clipping: each rank clips its Top-K gradients to the global norm
        topk_clip_norm / sqrt(ranks) (default None: off). `TF_EXT_HVD_TOPK_CLIP_NORM`.
      topk_ratio_warmup_steps: after the dense warm-up, Top-K's ratio falls from 25% to topk_ratio over this many
        steps (default 0: off). `TF_EXT_HVD_TOPK_RATIO_WARMUP_STEPS`.
      topk_flush_steps: every this many steps Top-K sends every rank's whole residual densely (default 0: never).
        `TF_EXT_HVD_TOPK_FLUSH_STEPS`.
      intra_node: the 2D allreduce's stages inside a node: "auto" (default: through shared memory where the
        node's ranks share a host, else Horovod's collectives), "shm" or "gloo" (`shm_allreduce`).

    Returns:
      An optimizer.

    Raises:
      TypeError: `optimizer` is not a `tf.compat.v1.train` optimizer.
      ValueError: backward_passes_per_step != 1, an unsupported op, a compression that is not one of the above,
        topk_ratio outside (0, 1], a node size that does not divide the number of ranks, or 2D process sets that
        were not registered at init.
    """
    del average_aggregated_gradients, num_groups, groups
    hvd = _hvd.require_horovod()
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError(
            "tensorflow_ext.horovod.DistributedOptimizer wraps tf.compat.v1.train optimizers (they "
            "train dynamic embeddings); got %s" % type(optimizer).__name__
        )
    if backward_passes_per_step != 1:
        raise ValueError(
            "backward_passes_per_step=%r: gradient accumulation over several passes is not supported "
            "with dynamic embeddings; use 1 (a larger batch per rank has the same effect)" % (backward_passes_per_step,)
        )
    op = hvd.Average if op is None else op
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError("op must be hvd.Average or hvd.Sum, got %r" % (op,))
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor needs op=hvd.Average")
    config = allreduce_lib.resolve_config(
        compression=compression,
        hierarchical=hierarchical,
        node_size=node_size,
        topk_ratio=topk_ratio,
        topk_min_elements=topk_min_elements,
        topk_warmup_steps=topk_warmup_steps,
        fusion_bytes=fusion_bytes,
        topk_momentum=topk_momentum,
        topk_clip_norm=topk_clip_norm,
        topk_ratio_warmup_steps=topk_ratio_warmup_steps,
        topk_flush_steps=topk_flush_steps,
        intra_node=intra_node,
    )
    return _DistributedOptimizer(
        optimizer,
        name or "Distributed" + type(optimizer).__name__,
        use_locking,
        device_dense,
        device_sparse,
        config.horovod_compression or hvd.Compression.none,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        process_set if process_set is not None else hvd.global_process_set,
        config,
    )
