"""The 2D allreduce's stages inside a node through shared memory, where the node's ranks share a host.

The 2D allreduce (`allreduce`, `hierarchical=True`) reduce-scatters a fused buffer inside each node of L ranks,
allreduces each rank's 1/L slice across nodes, and allgathers the slices inside the node. With Horovod's Gloo
collectives the two stages inside the node cost TCP loopback traffic on the cores that compute, and each of the
three collectives waits for a Horovod cycle. Here the node's ranks map one POSIX shared-memory segment per fused
buffer instead (the op library's TfExtHvdShmReduceScatter / TfExtHvdShmAllgather, tensorflow_ext/horovod/shm):

* reduce-scatter: each rank copies its buffer into its slot of the segment, waits at a barrier for the node's other
  ranks, and sums its 1/L slice of every slot in one vectorised pass;
* the slice is allreduced across nodes with Horovod on the cross-node process set, exactly as before (same names,
  so nodes that reduce inside differently still match);
* allgather: each rank copies its reduced slice into the segment's result buffer, a barrier, each copies it whole.

Only Horovod's cross-node allreduce is left to Horovod's cycle. Sums (the kernel's contract): float32 in local rank
order (two ranks: one IEEE addition, the bits of Gloo's reduce-scatter), float16 and bfloat16 in float32 from +0 in
local rank order, rounded once (the bits of `compression_ops.sum_parts`, hence of the bf16 path over Gloo; for
float16 and two ranks also of Gloo's half addition, except that -0 + -0 gives +0). With more than two ranks per
node, Gloo's ring sums in another order, so results may differ from the Gloo path in the last bit.

Used where `Config.intra_node` is "shm", or "auto" (the default) when the node's ranks share a host: the node's
ranks [n*L, (n+1)*L) lie inside this host's ranks as Horovod numbers them (a host's ranks are consecutive and its
local ranks start at its first rank, as horovodrun starts them). A buffer whose length is known only when the graph
runs, or of a dtype other than float32, float16 and bfloat16, goes through the Gloo path.

The segment's name is derived from the job's rendezvous (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, or MPI's job id), the
node and the buffer, so two jobs never share one; it is unlinked as soon as the node's ranks mapped it, and one left
over by a job that crashed while attaching is replaced. A rank that does not reach a barrier within
`TF_EXT_HVD_SHM_TIMEOUT_S` seconds (default 600) fails the step on the other ranks of its node with an error naming
it, instead of a hang.
"""

import hashlib
import os

import tensorflow as tf

from tensorflow_ext.horovod import _hvd
from tensorflow_ext.utils.loader import load_ops

__all__ = ["hierarchical", "intra_node_mode", "segment_name"]

_OPS = ("TfExtHvdShmReduceScatter", "TfExtHvdShmAllgather")

try:
    for _op in _OPS:
        tf.no_gradient(_op)
except KeyError:  # registered already (module reloaded)
    pass

# Environment variables that identify the job on every one of its ranks (Gloo's rendezvous, MPI's job ids).
_JOB_ENV = (
    "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    "PMI_ID",
)

_KERNEL_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _node_on_one_host(hvd, node_size):
    """Whether this rank's node [n*L, (n+1)*L) lies inside this host's ranks (the same answer on all its ranks)."""
    rank, local_rank, local_size = hvd.rank(), hvd.local_rank(), hvd.local_size()
    host_first = rank - local_rank
    node_first = rank // node_size * node_size
    return host_first <= node_first and node_first + node_size <= host_first + local_size


def intra_node_mode(config, node_size):
    """ "shm" or "gloo": how this rank's node reduces inside with `config.intra_node` and nodes of `node_size`.

    Raises:
      ValueError: intra_node is "shm" but the node's ranks do not share a host (named with the layout).
    """
    hvd = _hvd.require_horovod()
    if config.intra_node == "gloo" or node_size <= 1:
        return "gloo"
    shared = _node_on_one_host(hvd, node_size)
    if config.intra_node == "shm" and not shared:
        raise ValueError(
            "intra_node='shm' (TF_EXT_HVD_INTRA_NODE) needs the ranks of each 2D node on one host: rank %d's node "
            "is ranks [%d, %d) but its host holds ranks [%d, %d) (local_size=%d); use intra_node='auto' or 'gloo', "
            "or a node_size that divides the ranks per host"
            % (
                hvd.rank(),
                hvd.rank() // node_size * node_size,
                hvd.rank() // node_size * node_size + node_size,
                hvd.rank() - hvd.local_rank(),
                hvd.rank() - hvd.local_rank() + hvd.local_size(),
                hvd.local_size(),
            )
        )
    return "shm" if shared else "gloo"


def segment_name(name, entries, dtype, node_size):
    """The shm_open name of buffer `name` (its entries and dtype) for this rank's node: the same on the node's
    ranks, different for another job, node or buffer."""
    hvd = _hvd.require_horovod()
    job = "|".join("%s=%s" % (k, os.environ.get(k, "")) for k in _JOB_ENV)
    key = "%s|uid=%d|size=%d|node=%d/%d|%s|%d|%s" % (
        job,
        os.getuid(),
        hvd.size(),
        hvd.rank() // node_size,
        node_size,
        name,
        entries,
        tf.as_dtype(dtype).name,
    )
    return "/tfext2d_" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:32]


def _kernel_view(w):
    """The wire tensor as the kernels take it (bf16 bit patterns as bfloat16: a free bitcast)."""
    return tf.bitcast(w, tf.bfloat16) if w.dtype == tf.uint16 else w


def _wire_view(t, wire):
    return tf.bitcast(t, tf.uint16) if wire == tf.uint16 else t


def hierarchical(config, reducer, w, node_ps, cross_ps, name, as_bytes):
    """The 2D sum of flat wire buffer `w` over all ranks: inside the node through shared memory where
    `intra_node_mode` says so (and the buffer's length is static and its dtype one the kernels take), else
    `reducer.hierarchical` (Horovod's collectives). The result may be longer than w (zero padding to a multiple of
    the node's size).

    Args:
      config: the `Config` (intra_node, shm_timeout_s).
      reducer: the `allreduce._Reducer` of the buffer's wire (it reduces the cross-node stage).
      w: 1-D wire tensor (float32, float16, or bf16 bit patterns as uint16).
      node_ps, cross_ps: this rank's node and cross-node process sets.
      name: the collectives' name prefix.
      as_bytes: whether the cross-node stage reduces bf16 as bytes.
    """
    hvd = _hvd.require_horovod()
    size = node_ps.size()
    n = tf.compat.dimension_value(w.shape[0]) if w.shape.rank == 1 else None
    view_dtype = tf.bfloat16 if w.dtype == tf.uint16 else w.dtype
    if (
        n is None
        or view_dtype not in _KERNEL_DTYPES
        or (w.dtype == tf.uint16 and not as_bytes)
        or intra_node_mode(config, size) != "shm"
    ):
        return reducer.hierarchical(w, node_ps, cross_ps, name, as_bytes)
    if n % size:
        w = tf.pad(w, [[0, size - n % size]])
        n += size - n % size
    node_first = hvd.rank() // size * size
    attrs = dict(
        segment=segment_name(name, n, view_dtype, size),
        local_rank=hvd.rank() - node_first,
        local_size=size,
        first_rank=node_first,
        timeout_seconds=float(config.shm_timeout_s),
    )
    ops = load_ops()
    part = _wire_view(ops.tf_ext_hvd_shm_reduce_scatter(_kernel_view(w), name=name + "_shm_rs", **attrs), w.dtype)
    part = reducer.allreduce(part, cross_ps, name + "_cross", as_bytes)
    out = ops.tf_ext_hvd_shm_allgather(_kernel_view(part), name=name + "_shm_ag", **attrs)
    return _wire_view(out, w.dtype)
