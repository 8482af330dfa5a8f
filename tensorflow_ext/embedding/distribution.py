"""How a dynamic embedding spans processes: its distribution, a value of its `EmbeddingConfig`.

A distribution says which process holds which keys, how a lookup reaches them and how the shards are checkpointed.
`SINGLE_PROCESS`, the do-nothing default, is an embedding whose process holds every key it trains (also each
data-parallel Horovod replica): lookups read the local shards and each shard has the plain saveable of
`checkpoint.save`. `tensorflow_ext.horovod.ModelParallel` is the other kind (keys routed to their owner rank with
alltoall, the checkpoint gathered from every rank); it is given to an embedding when it is created (by
`tensorflow_ext.horovod.get_dynamic_embedding` or `parallelism_scope`) and never changes afterwards.

A distribution has:
  name: "model" for a model-parallel one, None for `SINGLE_PROCESS` (what `DynamicEmbedding.distribution` reports
    as None);
  lookup_unique(emb, unique_keys, lookup_local, width=None): the rows of unique keys, wherever they are held, from
    `lookup_local(emb, keys)` (the lookup of this process's shards) run where the keys are;
  shard_saveables(shards): the SaveableObjects of one embedding's shards;
  local_keys(keys): the keys of int64 `keys` [n] that this process holds (e.g. those a prefetch reads).
Distributions are values: equal distributions (same kind, same processes) compare equal.
"""

from tensorflow_ext.embedding.checkpoint import save as save_lib

__all__ = ["SINGLE_PROCESS", "SingleProcess"]


class SingleProcess(object):
    """The do-nothing distribution: this process holds every key it trains (use `SINGLE_PROCESS`)."""

    name = None

    def lookup_unique(self, emb, unique_keys, lookup_local, width=None):
        """`lookup_local(emb, unique_keys)`: this process holds every key."""
        del width  # the local lookup's own columns
        return lookup_local(emb, unique_keys)

    def shard_saveables(self, shards):
        """The shards' plain saveables (`checkpoint.save.shard_saveables`)."""
        return save_lib.shard_saveables(shards)

    def local_keys(self, keys):
        """`keys`: this process holds every key."""
        return keys

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        return "SingleProcess()"


SINGLE_PROCESS = SingleProcess()
