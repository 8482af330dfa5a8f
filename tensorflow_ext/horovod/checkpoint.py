"""Checkpoints of model-parallel dynamic embeddings: one full table per checkpoint, any rank count on restore.

Each rank of a model-parallel embedding holds only the keys it owns. Its checkpoint must not depend on the rank
count, so that a job can restart with another number of ranks, or the table can be loaded by one process (serving,
evaluation, a plain `tf_ext.get_dynamic_embedding`):

* **Save**: the saveable of local shard i gathers shard i of every rank (`hvd.allgather` of the keys with their
  versions and frequencies, and of the rows with their optimizer slots) and writes it under the same tensor names
  a single-process embedding writes (`<name>/part_<i>-keys`, `-values`, `-slots`, ...). Only rank 0 writes the
  checkpoint, but the gather is collective: every rank must run it at the same step. The hooks of
  `tensorflow_ext.horovod.estimator` do that (rank 0 saves, the other ranks run `gather_op`).
* **Restore**: every rank reads the full shard tensors and imports the keys it owns
  (`owner_of(key, num_ranks) == rank`); within the rank each key goes to its local shard by the embedding's own
  partition, as in a single process. Restoring needs no collective.

The number of local shards (`num_shards`) must be the same as when the checkpoint was written (as for any
dynamic embedding); the number of ranks may change.
"""

import weakref

import tensorflow as tf

from tensorflow_ext.embedding.checkpoint import restore as restore_lib
from tensorflow_ext.embedding.checkpoint import save as save_lib
from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import residual_checkpoint
from tensorflow_ext.tf_compat import internals

__all__ = ["ModelParallelShardSaveable", "gather_op", "model_parallel_saveables"]

# graph -> the group op that runs every model-parallel saveable's gather (see gather_op).
_gather_ops = weakref.WeakKeyDictionary()


class ModelParallelShardSaveable(save_lib.ShardSaveable):
    """The saveable of one local shard of a model-parallel embedding (see the module docstring).

    Its checkpoints are always full (the gather writes every rank's rows), never deltas.

    Args:
      shard: the `DynamicEmbeddingShard`.
      restores: the `restore.SaverRestores` shared by the saveables of the embedding's shards.
      distribution: the embedding's `ModelParallel`.
    """

    supports_deltas = False

    def __init__(self, shard, restores, distribution):
        super().__init__(shard, restores)
        self._distribution = distribution
        self._gathered = None

    @property
    def gathered(self):
        """The tensors the save gathers from every rank (building them, and freezing the layout, on first use)."""
        self.specs_for(save_lib.SpecMode.FULL)
        return self._gathered

    def _row_tensors(self):
        shard = self._shard
        hvd = _hvd.require_horovod()
        tag = shard.name.replace("/", "_")
        with tf.control_dependencies(None), internals.ops.colocate_with(shard.handle, ignore_existing=True):
            with tf.name_scope(tag + "_gather_for_checkpoint"):
                keys, rows, versions, freqs = shard.table.export(full_rows=True)
                # Two collectives per shard: the int64 columns together, the float rows (embedding and slots) together.
                # Horovod matches collectives across ranks by these names. The specs are built by whatever asks
                # first (a Saver, the hooks), in its name scope: the names must not depend on it.
                ints = hvd.allgather(
                    tf.stack([keys, versions, freqs], axis=1),
                    name="tf_ext_checkpoint_ints_" + tag,
                    ignore_name_scope=True,
                    process_set=self._distribution.process_set,
                )
                rows = hvd.allgather(
                    rows,
                    name="tf_ext_checkpoint_rows_" + tag,
                    ignore_name_scope=True,
                    process_set=self._distribution.process_set,
                )
                ints = tf.reshape(ints, [-1, 3])
                rows = tf.reshape(rows, [-1, shard.width])
                num_shards = tf.constant(shard.embedding.num_shards, tf.int64, name="num_shards")
        self._gathered = (ints, rows)
        return ints[:, 0], rows[:, : shard.dim], rows[:, shard.dim :], ints[:, 1], ints[:, 2], num_shards

    def select_rows(self, rows):
        """Keeps the checkpoint rows of the keys this rank owns.

        Args:
          rows: (keys, values, slots, versions, freqs) of the whole shard, as read from the checkpoint.

        Returns:
          The rows of the keys with `owner_of(key, num_ranks) == rank`.
        """
        keys = rows[0]
        mine = tf.reshape(tf.where(tf.equal(self._distribution.owner(keys), self._distribution.rank())), [-1])
        return tuple(tf.gather(t, mine) for t in rows)


def model_parallel_saveables(graph=None):
    """The `ModelParallelShardSaveable`s of a graph (from `GraphKeys.SAVEABLE_OBJECTS`), in collection order."""
    graph = graph or tf.compat.v1.get_default_graph()
    return [
        s
        for s in graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        if isinstance(s, ModelParallelShardSaveable)
    ]


def model_parallel_shard_saveables(shards, distribution):
    """The saveables of a model-parallel embedding's shards (its `ModelParallel.shard_saveables`), sharing one
    `SaverRestores` as a single-process embedding's do."""
    restores = restore_lib.SaverRestores()
    return [ModelParallelShardSaveable(shard, restores, distribution) for shard in shards]


def gather_op(graph=None):
    """What a rank that does not write the checkpoint runs when rank 0 saves: every model-parallel gather.

    Args:
      graph: a `tf.Graph` (default: the default graph). Build before the graph is finalized.

    Returns:
      A tensor to fetch (the number of rows gathered), or None when the graph has no model-parallel embedding and
      saves no per-rank Top-K residuals.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    saveables = model_parallel_saveables(graph)
    # The Top-K residuals' gathers too, when the training hooks save them per rank (residual_checkpoint).
    gathered = [t for s in saveables for t in s.gathered]
    gathered += [s.gathered for s in residual_checkpoint.residual_saveables(graph)]
    if not gathered:
        return None
    fetch, count = _gather_ops.get(graph, (None, 0))
    if fetch is None or count != len(gathered):
        with graph.as_default(), tf.control_dependencies(None), tf.compat.v1.name_scope(None):
            # A data dependency on every gathered tensor: Horovod's ops are not stateful, and Grappler turns ops whose
            # outputs reach only control edges (a tf.group) into NoOps, which would skip this rank's part of the gather.
            fetch = tf.add_n([tf.cast(tf.shape(t)[0], tf.int64) for t in gathered], name="tf_ext_checkpoint_gather")
        _gather_ops[graph] = (fetch, len(gathered))
    return fetch
