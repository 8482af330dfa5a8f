"""Dynamic embeddings across Horovod ranks: replicated (data-parallel) or partitioned (model-parallel).

* **Data-parallel** (the default for any `tf_ext.get_dynamic_embedding`): every rank holds a full replica. The
  `DistributedOptimizer` gathers every rank's sparse gradient (keys + rows), so each rank applies the same summed
  update; a key first seen on another rank gets the same initial row everywhere (the per-key initializer with seeds
  that all ranks share).
* **Model-parallel** (`get_dynamic_embedding(..., parallelism="model")`): rank r holds only the keys whose owner is r,
  ``owner(key) = HashKey(key ^ OWNER_SALT) % num_ranks``. A lookup deduplicates its ids, sends each to its owner with
  one Horovod alltoall, the owner reads (and in training inserts) the rows, and a second alltoall brings them back.
  The gradient travels back to the owners the same way (alltoall's gradient), so each rank updates only its keys.
  `DistributedOptimizer` fuses the exchanges of all model-parallel lookups of a step into one alltoall of keys, one
  of rows and one of gradients (`tensorflow_ext.horovod.exchange`), with the same results bit for bit.
  Memory per rank is about 1/N of the table. The rows of an embedding stored in half precision (`value_dtype`
  tf.bfloat16 or tf.float16) travel in it: 2 bytes per value instead of 4, and lossless for stored rows, which
  hold exactly such values. Their gradients travel in float32 (the optimizer's math is float32).
"""

import contextlib
import dataclasses
import threading

import tensorflow as tf

from tensorflow_ext.embedding import creation
from tensorflow_ext.embedding import initializers as init_lib
from tensorflow_ext.embedding.keys import HashPartition
from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import checkpoint as ckpt_lib
from tensorflow_ext.horovod import consistency
from tensorflow_ext.horovod import exchange as exchange_lib
from tensorflow_ext.table import refs

__all__ = [
    "ModelParallel",
    "get_dynamic_embedding",
    "OWNER_SALT",
    "owner_of",
    "parallelism_scope",
    "single_process",
]

_local = threading.local()


@contextlib.contextmanager
def single_process():
    """Builds graphs in which this process holds every key: no Horovod collective, a checkpoint of any rank count.

    Inside the context, `get_dynamic_embedding(..., parallelism="model")` creates a plain embedding (the whole
    table in this process) and `DistributedOptimizer` applies the local gradients. Use it on one rank (or in a
    process without horovodrun) to export a SavedModel or to evaluate from the checkpoint of a distributed run:
    the checkpoint holds every key, under the names a single-process embedding uses.

    Yields:
      None.
    """
    previous = getattr(_local, "single_process", False)
    _local.single_process = True
    try:
        yield
    finally:
        _local.single_process = previous


def in_single_process():
    """True inside `single_process()`."""
    return getattr(_local, "single_process", False)


# Keys are also partitioned over an embedding's local shards by HashKey(key) % num_shards; salting the owner hash
# keeps the two partitions independent (otherwise with 2 ranks and 2 local shards every key of a rank would land
# in one of its shards).
OWNER_SALT = 0x5BD1E9955BD1E995


def owner_of(keys, num_ranks):
    """The rank that owns each int64 key: HashKey(key ^ OWNER_SALT) % num_ranks (int32, keys' shape).

    Args:
      keys: int64 tensor.
      num_ranks: python int >= 1.

    Returns:
      int32 tensor.
    """
    return HashPartition(num_ranks, OWNER_SALT).part_ids(keys)


def owner_of_numpy(keys, num_ranks):
    """`owner_of` in numpy (tests, offline re-partitioning)."""
    return HashPartition(num_ranks, OWNER_SALT).part_ids_numpy(keys)


class ModelParallel(object):
    """The distribution of a model-parallel embedding: which rank owns a key, the alltoall lookup, the checkpoint
    gathered from every rank (see `tensorflow_ext.embedding.distribution`). Two are equal when they span the same
    process set.

    Args:
      process_set: the Horovod process set whose ranks share the table (default: all ranks).
    """

    name = "model"

    def __init__(self, process_set=None):
        hvd = _hvd.require_horovod()
        self._process_set = process_set if process_set is not None else hvd.global_process_set

    def __eq__(self, other):
        return type(other) is type(self) and other.process_set is self._process_set

    def __hash__(self):
        return hash((type(self).__name__, id(self._process_set)))

    def __repr__(self):
        return "ModelParallel(%d ranks)" % self.num_ranks()

    def shard_saveables(self, shards):
        """The saveables of one embedding's shards: each gathers its shard from every rank (see
        `tensorflow_ext.horovod.checkpoint`)."""
        return ckpt_lib.model_parallel_shard_saveables(shards, self)

    @property
    def process_set(self):
        """The Horovod process set."""
        return self._process_set

    def num_ranks(self):
        """The number of ranks sharing the table."""
        return self._process_set.size()

    def rank(self):
        """This process's rank in the process set."""
        return self._process_set.rank()

    @property
    def partition(self):
        """The `HashPartition` of keys over ranks (salted, independent of the shards' partition)."""
        return HashPartition(self.num_ranks(), OWNER_SALT)

    def owner(self, keys):
        """The rank that owns each key (see `owner_of`)."""
        return self.partition.part_ids(keys)

    def local_keys(self, keys):
        """The keys of int64 `keys` [n] that this rank owns."""
        return tf.boolean_mask(keys, tf.equal(self.owner(keys), self.rank()))

    def lookup_unique(self, emb, unique_keys, lookup_local, width=None):
        """Rows [n, dim] of unique int64 keys [n], read from their owners.

        Args:
          emb: the `DynamicEmbedding` (this rank's partition).
          unique_keys: int64 [n], unique.
          lookup_local: callable(emb, keys) -> rows [m, dim] of unique local keys (the single-process lookup).
          width: the columns lookup_local returns, when not dim (e.g. a row and what the owner knows of the key).

        Returns:
          float32 [n, width or dim], differentiable: the gradient reaches each key's owner. The rows of an
          embedding stored in half precision travel in it (see `_send_rows_back`).
        """
        hvd = _hvd.require_horovod()
        n = self.num_ranks()
        if n == 1:  # this rank owns every key: the exchanges would send everything to itself
            return lookup_local(emb, unique_keys)
        with tf.name_scope("model_parallel_lookup"):
            owner = self.owner(unique_keys)
            # The keys' positions grouped by owner rank, in rank order, each group in the keys' order (a stable sort
            # by owner in one pass: dynamic_partition keeps the order within each part).
            parts = tf.dynamic_partition(tf.range(tf.size(unique_keys)), owner, n)
            order = tf.concat(parts, 0)
            # Every rank checks that all ranks built the same model before the first collective of a step.
            send = consistency.gate(tf.gather(unique_keys, order))
            splits = tf.stack([tf.size(p) for p in parts])
            name = emb.name.replace("/", "_")
            received, recv_splits = hvd.alltoall(
                send, splits=splits, process_set=self._process_set, name=name + "_keys"
            )
            # What this lookup receives passes through Identity ops that `exchange.fuse` may feed from the exchange of
            # all model-parallel lookups of the step instead.
            keys_received = tf.identity(received, name="keys_received")
            # Several ranks may ask for one key: read each once (its gradient is the sum of theirs).
            recv_unique, recv_idx = tf.unique(keys_received, out_idx=tf.int32)
            rows = tf.gather(lookup_local(emb, recv_unique), recv_idx)
            # The local table's storage, not the embedding's value_dtype: an export's table may store other rows.
            storage = emb.shards[0].storage
            wire_dtype = refs.storage_dtype(storage) if storage in refs.HALF_STORAGES else None
            back = _send_rows_back(rows, recv_splits, wire_dtype, self._process_set, name + "_rows")
            rows_received = tf.identity(back, name="rows_received")
            exchange_lib.record(
                exchange_lib.Exchange(
                    name=name,
                    process_set=self._process_set,
                    num_ranks=n,
                    send=send,
                    splits=splits,
                    keys_received=keys_received.op,
                    rows=rows,
                    width=width or emb.dim,
                    wire_dtype=wire_dtype,
                    rows_received=rows_received.op,
                )
            )
            back = tf.reshape(rows_received, [-1, width or emb.dim])
            return tf.gather(back, tf.math.invert_permutation(order))


def _send_rows_back(rows, splits, value_dtype, process_set, name):
    """alltoall of float32 `rows` [m, width] (`splits` rows to each rank): the rows each rank receives, float32.

    With a `value_dtype` (the 2-byte dtype of a table of `refs.HALF_STORAGES`; None: float32) the rows travel as
    its 2-byte values, bitcast to uint16 (Horovod's alltoall takes no bfloat16 tensor): exact for the rows the table stores,
    which hold values of that dtype; any other value (the row of a key missing at inference, the default row of a
    key not admitted) arrives rounded to the nearest one. The gradient returns by an alltoall of float32 values
    either way, so the owner's update gets the gradients the ranks computed, unrounded.
    """
    hvd = _hvd.require_horovod()
    if value_dtype is None:
        return hvd.alltoall(rows, splits=splits, process_set=process_set, name=name)[0]

    @tf.custom_gradient
    def exchange(rows):
        wire = tf.bitcast(tf.cast(rows, value_dtype), tf.uint16)
        received, received_splits = hvd.alltoall(wire, splits=splits, process_set=process_set, name=name)

        def grad(upstream):
            # alltoall's own gradient, in float32: each rank's gradient rows go back to the rank that sent the row.
            return hvd.alltoall(upstream, splits=received_splits, process_set=process_set, name=name + "_grad")[0]

        return tf.cast(tf.bitcast(received, value_dtype), tf.float32), grad

    return exchange(rows)


_PARALLELISMS = ("data", "model")


def _check_parallelism(parallelism):
    if parallelism not in _PARALLELISMS:
        raise ValueError("parallelism must be 'data' or 'model', got %r" % (parallelism,))


def _with_parallelism(config, parallelism, process_set):
    """The embedding config with a model-parallel distribution when `parallelism` asks for one (a creation hook);
    an embedding that is model-parallel already must be what `parallelism` asks."""
    if in_single_process():
        parallelism = "data"
    current = config.distribution.name
    if current is not None and current != parallelism:
        raise ValueError("dynamic embedding %s is already %s-parallel" % (config.name, current))
    if parallelism == "model" and current is None:
        return dataclasses.replace(config, distribution=ModelParallel(process_set))
    return config


def get_dynamic_embedding(name, dim, parallelism="data", process_set=None, **kwargs):
    """`tf_ext.get_dynamic_embedding` for Horovod training.

    Args:
      name: the embedding's name.
      dim: the embedding dimension.
      parallelism: "data" (every rank holds a full replica) or "model" (each rank holds its keys; lookups go
        through alltoall).
      process_set: Horovod process set (default: all ranks).
      **kwargs: the other arguments of `tf_ext.get_dynamic_embedding`.

    Returns:
      A `DynamicEmbedding`. A model-parallel one checkpoints its full table (see
      `tensorflow_ext.horovod.checkpoint`); inside `single_process()` it is a plain embedding.

    Raises:
      ValueError: an unknown parallelism, or a model-parallel embedding with a reused name of another parallelism.
    """
    _hvd.require_horovod()
    _check_parallelism(parallelism)
    # Every rank must draw the same initial row for a key (replicas; re-partitioned restores).
    init_lib.require_deterministic_seeds(True)
    with creation.creation_hook(lambda config: _with_parallelism(config, parallelism, process_set)):
        return creation.get_dynamic_embedding(name, dim, **kwargs)


@contextlib.contextmanager
def parallelism_scope(parallelism, process_set=None):
    """Every dynamic embedding got inside (by `tf_ext.get_dynamic_embedding`, feature columns, the TFRA API) has
    this parallelism.

        with tfe_hvd.parallelism_scope("model"):
            net = tf.compat.v1.feature_column.input_layer(features, columns)   # model-parallel tables

    Args:
      parallelism: "data" or "model" (as in `get_dynamic_embedding`).
      process_set: Horovod process set of model-parallel tables (default: all ranks).

    Yields:
      None.

    Raises:
      ValueError: an unknown parallelism; inside, reusing an embedding of another parallelism.
    """
    _hvd.require_horovod()
    _check_parallelism(parallelism)
    init_lib.require_deterministic_seeds(True)
    with creation.creation_hook(lambda config: _with_parallelism(config, parallelism, process_set)):
        yield
