"""The per-graph state of dynamic embeddings: each embedding's `EmbeddingState`, and how a graph lists them.

A `DynamicEmbedding` is its frozen `EmbeddingConfig`, its shards and one `EmbeddingState`, built once when the
embedding is created (in its graph and variable scope) and never replaced:

* the admission policy's state (its counts table or Bloom counters, the admitted-keys counter),
* the eviction policy's state (the evicted-keys counter),
* whether a restore of the embedding's checkpoint also restores its optimizer slots.

The policies' state is empty for the do-nothing policies (`ADMIT_EVERY_KEY`, `NEVER_EVICT`). A graph lists its
embeddings through the shards in `GraphKeys.DYNAMIC_EMBEDDINGS` (`get_dynamic_embeddings`).
"""

import tensorflow as tf

__all__ = ["EmbeddingState", "GraphKeys", "get_dynamic_embeddings", "is_embedding"]


class GraphKeys(object):
    """Graph collection keys of tensorflow_ext.

    DYNAMIC_EMBEDDINGS: the `DynamicEmbeddingShard`s of the graph (every shard
      of every dynamic embedding, trainable or not).
    """

    DYNAMIC_EMBEDDINGS = "tf_ext_dynamic_embeddings"


class EmbeddingState(object):
    """The state of one dynamic embedding in its graph (see the module docstring).

    Args:
      admission: dict of the admission policy's tables and variables (empty: every key is admitted).
      eviction: dict of the eviction policy's variables, "evicted" the keys evicted so far (empty: no policy).
    """

    def __init__(self, admission, eviction):
        self._admission = dict(admission)
        self._eviction = dict(eviction)
        self._restores_slots = True

    @property
    def admission(self):
        """The admission policy's state: a new dict of its tables and variables (empty without a policy)."""
        return dict(self._admission)

    @property
    def eviction(self):
        """The eviction policy's state: a new dict, "evicted" the keys evicted so far (empty without a policy)."""
        return dict(self._eviction)

    def count_evicted(self, removed):
        """`removed` (int64 scalar: keys an eviction removed), once added to the evicted-keys counter if there is one."""
        evicted = self._eviction.get("evicted")
        if evicted is None:
            return removed
        with tf.control_dependencies([evicted.assign_add(removed)]):
            return tf.identity(removed)

    @property
    def restores_slots(self):
        """Whether a restore of the embedding also restores its optimizer slots (False after `restore_values_only`)."""
        return self._restores_slots

    def restore_values_only(self):
        """Restores built from now on read the embedding's rows and metadata but not its optimizer slots."""
        self._restores_slots = False


def is_embedding(value):
    """True for a `DynamicEmbedding` (the objects that carry an `EmbeddingState`)."""
    return isinstance(getattr(value, "state", None), EmbeddingState)


def get_dynamic_embeddings(graph=None):
    """The dynamic embeddings of a graph.

    Args:
      graph: a `tf.Graph` (default: the default graph).

    Returns:
      list of `DynamicEmbedding`, in creation order.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    seen = []
    for shard in graph.get_collection(GraphKeys.DYNAMIC_EMBEDDINGS):
        embedding = getattr(shard, "embedding", None)
        if is_embedding(embedding) and embedding not in seen:
            seen.append(embedding)
    return seen
