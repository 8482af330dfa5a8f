"""Faster dense allreduce for `DistributedOptimizer`: 16-bit compression, 2D (hierarchical) allreduce, Top-K
sparsification with error feedback, and fusion of a step's gradients into a few buffers.

Everything here is built from Horovod's collectives (allreduce, reducescatter, allgather, alltoall) and process
sets, so it runs on Horovod's Gloo backend (CPU) as well as on MPI.

* **Compression** (`Compression.fp16`, `Compression.bf16`): the buffer is cast to 16 bits before it is sent and
  back after. fp16 is summed by Horovod's allreduce in fp16, or as bytes like bf16 (`wire16` says which, in what
  order and how precisely; a total above 65504 becomes inf); bf16 keeps float32's range: Horovod has no bf16
  reduction, so a bf16 buffer is reduced as its 16-bit patterns (one alltoall, the sum in float32 on the receiving
  rank, one allgather: the same bytes as a ring allreduce). Infinities and NaNs stay
  non-finite, so a mixed-precision "skip the step when a gradient is not finite" still sees them. Compress
  gradients after loss scaling has been undone (wrap the loss-scaling optimizer in `DistributedOptimizer`, which
  is what happens when `DistributedOptimizer(mp_optimizer)` is built).
* **2D allreduce** (`hierarchical=True`): ranks [n*L, (n+1)*L) form node n (L = `node_size`, Horovod's
  `local_size` by default). A buffer is reduce-scattered inside the node, each rank allreduces its 1/L slice with
  the ranks of the same local index on the other nodes, and the node allgathers the slices. Only 1/L of the data
  crosses the slow link per rank. The process sets must exist before training: `tensorflow_ext.horovod.init(
  node_size=L)` registers them (or `TF_EXT_HVD_NODE_SIZE` / `TF_EXT_HVD_HIERARCHICAL=1` at `init`).
* **Top-K** (`topk_ratio=r`): per gradient of at least `topk_min_elements` entries, each rank adds its residual
  (a non-trainable variable per gradient, saved in checkpoints), sends the ceil(r * n) entries of largest
  magnitude (indices and values, one allgather each per fused buffer) and keeps the rest as its new residual.
  Every rank scatter-adds all ranks' entries, so all apply the same update. Optionally dense for the first
  `topk_warmup_steps` steps.
* **Fusion**: the gradients of a step are concatenated into flat buffers of at most `fusion_bytes` (64 MiB by
  default) and each buffer is reduced with one collective (or one chain of collectives), then split back.

The steps that touch every entry of a buffer run as fused kernels of the op library (`compression_ops`): packing
(concatenation, pre-scale and 16-bit cast in one pass), unpacking (cast back, post-scale and split), the Top-K
selection (residual add, sampled threshold, exactly k entries: equal magnitudes go to the lower index, and an Inf or
NaN is always sent) and the scatter-add of all ranks' entries. They give the bits of the TensorFlow ops they replace;
a residual entry whose sent value was not finite becomes 0.

The environment overrides the arguments: `TF_EXT_HVD_COMPRESSION` (none, fp16, bf16, auto: see `auto_compression`), `TF_EXT_HVD_HIERARCHICAL`
(0/1), `TF_EXT_HVD_NODE_SIZE`, `TF_EXT_HVD_TOPK_RATIO` (a number in (0, 1], or "none"),
`TF_EXT_HVD_TOPK_MIN_ELEMENTS`, `TF_EXT_HVD_TOPK_WARMUP_STEPS`, `TF_EXT_HVD_FUSION_BYTES`.
"""

import os

import numpy as np
import tensorflow as tf

from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import compression_ops
from tensorflow_ext.horovod import consistency
from tensorflow_ext.horovod import shm_allreduce
from tensorflow_ext.horovod import topk as topk_lib
from tensorflow_ext.horovod import wire16 as wire16_reduction
from tensorflow_ext.horovod.config import DEFAULT_FUSION_BYTES  # noqa: F401 (re-exported)
from tensorflow_ext.horovod.config import DEFAULT_TOPK_MIN_ELEMENTS  # noqa: F401 (re-exported)
from tensorflow_ext.horovod.config import ENV_PREFIX
from tensorflow_ext.horovod.config import TOPK_RESIDUALS  # noqa: F401 (re-exported)
from tensorflow_ext.horovod.config import AutoCompressor
from tensorflow_ext.horovod.config import Compression  # noqa: F401 (re-exported)
from tensorflow_ext.horovod.config import Config  # noqa: F401 (re-exported)
from tensorflow_ext.horovod.config import env_value
from tensorflow_ext.horovod.config import parse_bool
from tensorflow_ext.horovod.config import parse_int
from tensorflow_ext.horovod.config import resolve_config  # noqa: F401 (re-exported)

__all__ = [
    "Compression",
    "DEFAULT_FUSION_BYTES",
    "DEFAULT_TOPK_MIN_ELEMENTS",
    "TOPK_RESIDUALS",
    "Config",
    "hierarchical_process_sets",
    "init",
    "resolve_config",
]

# ---------------------------------------------------------------------------------------------------------------
# Process sets of the 2D allreduce.

# node_size -> (node process sets, cross process sets), registered at init.
_registered = {}


def _layout(size, node_size, where):
    if size % node_size != 0:
        raise ValueError(
            "%s: node_size=%d does not divide the number of ranks %d; the 2D allreduce needs nodes of equal size "
            "(ranks [n*node_size, (n+1)*node_size) form node n)" % (where, node_size, size)
        )
    nodes = [list(range(n * node_size, (n + 1) * node_size)) for n in range(size // node_size)]
    cross = [list(range(i, size, node_size)) for i in range(node_size)]
    return nodes, cross


# The rank layout Horovod's Gloo launch (horovodrun) passes each process: (variable, smallest valid value).
_LAUNCH_ENV = (
    ("HOROVOD_RANK", 0),
    ("HOROVOD_SIZE", 1),
    ("HOROVOD_LOCAL_RANK", 0),
    ("HOROVOD_LOCAL_SIZE", 1),
    ("HOROVOD_CROSS_RANK", 0),
    ("HOROVOD_CROSS_SIZE", 1),
)


def _env_int(name, minimum=None):
    """The int in environment variable `name` (None when unset or empty).

    Raises:
      ValueError: the variable is set to something that is not an int (>= minimum), naming it and its value.
    """
    if minimum is None:
        minimum = dict(_LAUNCH_ENV).get(name, 0)
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    try:
        out = int(value.strip())
    except ValueError:
        out = None
    if out is None or out < minimum:
        raise ValueError(
            "environment variable %s=%r is not an int >= %d. It is set by horovodrun for each process; unset it "
            "(or fix its value) when starting the job by other means" % (name, value, minimum)
        )
    return out


def _check_launch_env():
    """Every rank-layout variable that is set holds an int (Horovod would fail on it with a misleading message)."""
    for name, minimum in _LAUNCH_ENV:
        _env_int(name, minimum)


def init(node_size=None, **kwargs):
    """`hvd.init` that also registers the process sets of the 2D allreduce.

    Horovod's Gloo backend creates a process set's communicators at `hvd.init`, so the node and cross-node sets
    are registered there: pass `node_size`, or set `TF_EXT_HVD_NODE_SIZE` (or `TF_EXT_HVD_HIERARCHICAL=1` for
    nodes of `local_size` ranks). Without either this is `hvd.init(**kwargs)`.

    Args:
      node_size: ranks per node (a divisor of the number of ranks), or None.
      **kwargs: passed to `hvd.init` (`comm`, `process_sets`).

    Returns:
      None.

    Raises:
      ValueError: node_size does not divide the number of ranks, the number of ranks is unknown before
        `hvd.init` (not started by horovodrun or the Gloo environment variables), one of Horovod's rank-layout
        variables (HOROVOD_SIZE, HOROVOD_RANK, ...) is set to something that is not an int (named with its value),
        or Horovod did not start (named with this rank's 2D settings: ranks started with different node sizes
        register different process sets, which Horovod refuses on one of them).
    """
    hvd = _hvd.require_horovod()
    _check_launch_env()
    env = env_value("NODE_SIZE")
    if env is not None:
        node_size = parse_int(ENV_PREFIX + "NODE_SIZE", env, 1)
    elif node_size is not None:
        node_size = parse_int("node_size", node_size, 1)
    elif env_value("HIERARCHICAL") is not None and parse_bool(ENV_PREFIX + "HIERARCHICAL", env_value("HIERARCHICAL")):
        node_size = _env_int("HOROVOD_LOCAL_SIZE")
        if node_size is None:
            raise ValueError(
                "init: %sHIERARCHICAL=1 needs the node size before hvd.init: start with horovodrun (it sets "
                "HOROVOD_LOCAL_SIZE) or set %sNODE_SIZE" % (ENV_PREFIX, ENV_PREFIX)
            )
    if node_size is None:
        sets = list(kwargs.pop("process_sets", None) or [])
        _start(hvd, sets, None, 0, kwargs)
        return
    size = _env_int("HOROVOD_SIZE")
    if size is None:
        raise ValueError(
            "init(node_size=%d): the number of ranks is needed before hvd.init to register the 2D allreduce's "
            "process sets; start the job with horovodrun (or set HOROVOD_SIZE as its Gloo launch does)" % node_size
        )
    sets = list(kwargs.pop("process_sets", None) or [])
    nodes, cross = _layout(size, node_size, "init")
    ours = []
    if 1 < node_size < size:
        ours = [hvd.ProcessSet(r) for r in nodes] + [hvd.ProcessSet(r) for r in cross]
    _start(hvd, sets + ours, node_size, len(ours), kwargs)
    if ours:
        _registered[node_size] = (ours[: len(nodes)], ours[len(nodes) :])
    else:
        _registered[node_size] = (None, None)


def _start(hvd, process_sets, node_size, ours, kwargs):
    """hvd.init with `process_sets` (`ours` of them the 2D allreduce's for `node_size`).

    Raises:
      ValueError: Horovod did not start; the message names this rank's 2D settings, the usual cause being ranks
        started with different ones (Horovod fails on the rank that sees the mismatch and only logs why; the
        others stop at their first collective).
    """
    try:
        if process_sets:
            hvd.init(process_sets=process_sets, **kwargs)
        else:
            hvd.init(**kwargs)
    except ValueError as e:
        raise ValueError(
            "init: Horovod did not start (%s). This rank registered %d process sets, %d of them the 2D allreduce's "
            "(node_size=%s). Horovod's log above names its reason; when it says the ranks set up mismatching "
            "process sets, start every rank with the same node_size, %sNODE_SIZE and %sHIERARCHICAL"
            % (e, len(process_sets), ours, node_size, ENV_PREFIX, ENV_PREFIX)
        ) from e


def hierarchical_process_sets(node_size=None):
    """(this rank's node process set, its cross-node process set) for nodes of `node_size` ranks.

    Args:
      node_size: ranks per node; None: Horovod's local_size.

    Returns:
      (ProcessSet, ProcessSet), or (None, None) when the 2D allreduce is a flat one (node_size 1 or all ranks).

    Raises:
      ValueError: node_size does not divide the number of ranks, or its process sets were not registered at init.
    """
    hvd = _hvd.require_horovod()
    size, rank = hvd.size(), hvd.rank()
    node_size = hvd.local_size() if node_size is None else node_size
    _layout(size, node_size, "hierarchical allreduce")
    if node_size in (1, size):
        return None, None
    if node_size not in _registered:
        if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1":
            nodes, cross = _layout(size, node_size, "hierarchical allreduce")
            _registered[node_size] = (
                [hvd.add_process_set(r) for r in nodes],
                [hvd.add_process_set(r) for r in cross],
            )
        else:
            raise ValueError(
                "the 2D allreduce with node_size=%d needs its process sets registered when Horovod starts: call "
                "tensorflow_ext.horovod.init(node_size=%d) instead of hvd.init() (or set %sNODE_SIZE=%d before "
                "init)" % (node_size, node_size, ENV_PREFIX, node_size)
            )
    nodes, cross = _registered[node_size]
    if nodes is None:
        return None, None
    return nodes[rank // node_size], cross[rank % node_size]


# ---------------------------------------------------------------------------------------------------------------
# Collectives on flat wire buffers (compression_ops: float32, float16, or bfloat16 as uint16 bit patterns).


def _pad_to(w, multiple):
    """w zero-padded to a multiple of `multiple` entries (zero bits: +0.0 in every wire dtype)."""
    n = w.shape[0] if w.shape.rank == 1 else None
    if n is not None and n % multiple == 0:
        return w
    return tf.pad(w, [[0, tf.math.floormod(-tf.size(w), multiple)]])


class _Reducer(object):
    """Sum-reduces flat wire buffers over a process set.

    A 16-bit buffer for which `wire16.reduced_as_bytes` holds (`as_bytes=True`: bf16 as uint16 bit patterns
    always, fp16 where Horovod's Gloo lacks its F16C sums) is reduced as bytes: one alltoall, the sum in float32 on
    the receiving rank (`compression_ops.sum_parts`, rounded once per stage), one allgather: the bytes of a ring
    allreduce. Other buffers go through Horovod's own reductions in their dtype (Gloo's ring allreduce sends in both
    directions of a link at once and keeps it busy for less time than its alltoall and allgather do).
    """

    def __init__(self, name, wire16):
        self._hvd = _hvd.require_horovod()
        self._name = name
        self._wire16 = wire16

    def reduce_scatter(self, w, ps, name, as_bytes):
        """w: flat, length a multiple of ps.size(); returns this rank's summed slice."""
        hvd = self._hvd
        if as_bytes:
            got = hvd.alltoall(w, process_set=ps, name=name + "_a2a")
            if isinstance(got, (tuple, list)):
                got = got[0]
            return compression_ops.sum_parts(got, ps.size(), self._wire16)
        return hvd.reducescatter(w, op=hvd.Sum, process_set=ps, name=name + "_rs")

    def allgather(self, w, ps, name):
        """Concatenation of every rank's slice, in rank order."""
        return self._hvd.allgather(w, process_set=ps, name=name + "_ag")

    def allreduce(self, w, ps, name, as_bytes):
        """Sum over the process set (flat w, any length; the result has w's length)."""
        hvd = self._hvd
        if as_bytes:
            padded = _pad_to(w, ps.size())
            out = self.allgather(self.reduce_scatter(padded, ps, name, True), ps, name)
            return out if padded is w else out[: tf.size(w)]
        return hvd.allreduce(w, op=hvd.Sum, process_set=ps, name=name + "_ar")

    def hierarchical(self, w, node_ps, cross_ps, name, as_bytes):
        """Sum over all ranks: reduce-scatter in the node, allreduce of the slice across nodes, allgather. The
        result may be longer than w (zero padding to a multiple of the node's size)."""
        part = self.reduce_scatter(_pad_to(w, node_ps.size()), node_ps, name + "_node", as_bytes)
        part = self.allreduce(part, cross_ps, name + "_cross", as_bytes)
        return self.allgather(part, node_ps, name + "_node")


# ---------------------------------------------------------------------------------------------------------------
# The reduction of a step's dense gradients.


def _static_size(t):
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return int(np.prod(shape.as_list(), dtype=np.int64))


def _buckets(items, cap, key):
    """Consecutive groups of items with one key (dtype) whose bytes stay <= cap (one item may exceed it)."""
    groups, current, current_bytes, current_key = [], [], 0, None
    for item in items:
        k, nbytes = key(item)
        if current and (k != current_key or (cap > 0 and current_bytes + nbytes > cap) or cap == 0):
            groups.append(current)
            current, current_bytes = [], 0
        current.append(item)
        current_key = k
        current_bytes += nbytes
    if current:
        groups.append(current)
    return groups


def _item_bytes(grad):
    n = _static_size(grad)
    return grad.dtype.base_dtype.name, (n if n is not None else 1 << 30) * grad.dtype.size


class DenseReducer(object):
    """Reduces a step's dense gradients with the `Config`'s methods (built once per compute_gradients).

    Each fused buffer is packed (pre-scale and 16-bit cast in one pass), reduced in its wire form and unpacked
    (cast back, post-scale and split in one pass); Top-K selects, gathers and scatter-adds with the fused kernels of
    `compression_ops`.

    Args:
      config: a `Config`.
      op: hvd.Average or hvd.Sum.
      predivide: gradient_predivide_factor (Average only).
      process_set: the optimizer's process set (must be the global one for the 2D allreduce).
      name: name prefix of the collectives.
    """

    def __init__(self, config, op, predivide, process_set, name):
        self._hvd = hvd = _hvd.require_horovod()
        self._config = config
        self._ps = process_set
        self._name = name
        self._wire16 = config.compression.wire_dtype
        size = process_set.size()
        if op == hvd.Average:
            self._pre, self._post = 1.0 / predivide, predivide / size
        else:
            self._pre, self._post = 1.0, 1.0
        # Top-K sends unscaled values: the sum of all ranks' entries times this.
        self._topk_factor = 1.0 / size if op == hvd.Average else 1.0
        self._reducer = _Reducer(name, self._wire16)
        self._node_ps = self._cross_ps = None
        if config.hierarchical:
            if process_set is not hvd.global_process_set and process_set.size() != hvd.size():
                raise ValueError("the 2D allreduce works on all ranks; it cannot be combined with a process_set")
            self._node_ps, self._cross_ps = hierarchical_process_sets(config.node_size)

    @property
    def config(self):
        """The `Config`."""
        return self._config

    @property
    def process_set(self):
        """The process set the gradients are reduced over."""
        return self._ps

    @property
    def name(self):
        """The name prefix of the collectives."""
        return self._name

    @property
    def hvd(self):
        """The horovod.tensorflow module."""
        return self._hvd

    @property
    def wire16(self):
        """The configured 16-bit wire dtype (None: the gradients' own)."""
        return self._wire16

    @property
    def topk_factor(self):
        """What Top-K multiplies the sum of all ranks' sent entries by (1/size for Average)."""
        return self._topk_factor

    def dense_buckets(self, grads, tag):
        """The fused plain (or configured 16-bit) sum of `grads`, buffers named after `tag`."""
        return self._dense_buckets(grads, tag)

    def buckets(self, grads):
        """The fused buffers of `grads`: lists of their indices (consecutive, one dtype, at most fusion_bytes)."""
        return _buckets(list(range(len(grads))), self._config.fusion_bytes, lambda i: _item_bytes(grads[i]))

    def residual(self, var, grad):
        """The Top-K residual variable of `var` (created on first use, in TOPK_RESIDUALS)."""
        return self._residual(var, grad)

    def _dense_buckets(self, grads, tag):
        """Fused sum of grads (list of tensors); returns the reduced list."""
        out = [None] * len(grads)
        order = list(range(len(grads)))
        for b, group in enumerate(_buckets(order, self._config.fusion_bytes, lambda i: _item_bytes(grads[i]))):
            parts = self.reduce_bucket([grads[i] for i in group], "%s_%s%d" % (self._name, tag, b), self._wire16)
            for i, part in zip(group, parts):
                out[i] = part
        return out

    def reduce_bucket(self, like, name, wire16):
        """The sum of one fused buffer of gradients `like` (one dtype) with 16-bit wire `wire16` (None: the
        gradients' dtype); collectives named after `name`. Returns the reduced list."""
        as_bytes = wire16_reduction.reduced_as_bytes(wire16, like[0].dtype)
        # Padded where the first collective splits the buffer among ranks.
        if self._node_ps is not None:
            multiple = self._node_ps.size()
        else:
            multiple = self._ps.size() if as_bytes else 1
        reducer = self._reducer if wire16 == self._wire16 else _Reducer(self._name, wire16)
        packed = consistency.gate(compression_ops.pack(like, wire16, self._pre, multiple))
        if self._node_ps is not None:
            summed = shm_allreduce.hierarchical(
                self._config, reducer, packed, self._node_ps, self._cross_ps, name, as_bytes
            )
        else:
            summed = reducer.allreduce(packed, self._ps, name, as_bytes)
        return compression_ops.unpack(summed, wire16, like, self._post)

    def reduce(self, grads_and_vars, global_step=None, also_finite=()):
        """The reduced gradients of `grads_and_vars` (dense tensors), in order.

        Args:
          grads_and_vars: list of (dense gradient, variable).
          global_step: the global step tensor (needed for Top-K warm-up).
          also_finite: tensors that must be finite, with the reduced gradients, for Top-K's state to be updated
            (a mixed-precision optimizer skips the step otherwise: `topk`).

        Returns:
          list of reduced gradients.

        Raises:
          ValueError: Top-K warm-up without a global step, or compression="auto" (auto_compression.reduce
            measures and calls this reducer's buckets).
        """
        cfg = self._config
        if cfg.compression is AutoCompressor:
            raise ValueError("compression='auto' is reduced by tensorflow_ext.horovod.auto_compression.reduce")
        grads = [tf.convert_to_tensor(g) for g, _ in grads_and_vars]
        topk = []
        if cfg.topk_ratio is not None:
            topk = [
                i
                for i, g in enumerate(grads)
                if g.dtype.is_floating and _static_size(g) is not None and _static_size(g) >= cfg.topk_min_elements
            ]
        dense = [i for i in range(len(grads)) if i not in set(topk)]
        out = [None] * len(grads)
        if dense:
            for i, r in zip(dense, self._dense_buckets([grads[i] for i in dense], "dense")):
                out[i] = r
        if topk:
            vars_ = [grads_and_vars[i][1] for i in topk]
            others = [out[i] for i in dense] + list(also_finite)
            reduced = topk_lib.reduce(self, [grads[i] for i in topk], vars_, global_step, others)
            for i, r in zip(topk, reduced):
                out[i] = r
        return out

    # -- Top-K (tensorflow_ext.horovod.topk) ---------------------------------------------------------------------

    def _residual(self, var, grad):
        return topk_lib.residual(self, var, grad)

    def topk_bucket(self, like, residuals, name, wire16):
        """Top-K of one fused buffer: `like` (static shapes) plus their residual variables; collectives named after
        `name`. Returns the reduced list (after the residuals were updated)."""
        return topk_lib.bucket(self, like, residuals, name, wire16)
