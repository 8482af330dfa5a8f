"""TensorBoard summaries of dynamic embeddings: keys, memory, bytes per key.

    emb = tf_ext.get_dynamic_embedding("user_emb", dim=16)
    ...
    tf_ext.embedding.add_summaries()          # every embedding of the graph
    merged = tf.compat.v1.summary.merge_all()  # or let Estimator / MonitoredTrainingSession write them

Per embedding ``<name>`` (its full name, e.g. ``input_layer/C1/embedding_weights``)
three scalars are added, with these exact tags whatever the current name scope:

* ``tf_ext/<name>/size``: keys held (all shards), `DynamicEmbedding.size()`;
* ``tf_ext/<name>/memory_bytes``: bytes the tables hold, `DynamicEmbedding.memory_bytes()`;
* ``tf_ext/<name>/bytes_per_key``: ``memory_bytes / size`` (0 while the embedding is empty).

An embedding with an admission policy also gets ``tf_ext/<name>/admitted_keys`` (keys admitted so far), one with
an eviction policy ``tf_ext/<name>/evicted_keys`` (keys evicted so far); both counts are saved with the model.

A tiered embedding (``storage=tf_ext.TieredStorage(...)``) also gets its tiers' (this process's shards):

* ``tf_ext/<name>/tier/memory_bytes`` and ``tier/disk_bytes``: the bytes of each tier now;
* ``tf_ext/<name>/tier/hit_rate``: the share of the keys asked for that were in memory, since the summary was last
  written (since the start, the first time or when no key was asked for in between);
* ``tf_ext/<name>/tier/cold_reads_per_sec`` and ``tier/demotions_per_sec``: keys read back from disk and keys moved
  to disk per second since the summary was last written (0 the first time);
* ``tf_ext/<name>/tier/dropped_keys``: keys that fell off a capped disk tier since the tables were created.

The rates keep the previous counts in a small table of the session (no variable to initialize, nothing saved).
"""

import numpy as np
import tensorflow as tf

from tensorflow_ext.embedding import creation
from tensorflow_ext.embedding import variable as variable_lib

__all__ = ["add_summaries", "summary_tags"]

_KINDS = ("size", "memory_bytes", "bytes_per_key")
_TIER_KINDS = (
    "tier/memory_bytes",
    "tier/disk_bytes",
    "tier/hit_rate",
    "tier/cold_reads_per_sec",
    "tier/demotions_per_sec",
    "tier/dropped_keys",
)


def _kinds(embedding):
    kinds = _KINDS
    if embedding.admission is not None:
        kinds += ("admitted_keys",)
    if embedding.eviction is not None:
        kinds += ("evicted_keys",)
    if embedding.storage is not None:
        kinds += _TIER_KINDS
    return kinds


def _tier_values(embedding):
    """The values of the `_TIER_KINDS` summaries of a tiered embedding, in that order.

    The rates and the hit rate are over the time since the values were last computed: the previous counts and time
    live in a hash table of the session (`MutableHashTableOfTensorsV2`, created on first use, so there is nothing to
    initialize and nothing in a checkpoint), read before and written after each computation.
    """
    stats = embedding.tier_stats(name="tier_stats")
    # cold reads, demotions, lookups, time (seconds); all zeros before the first computation.
    counts = tf.cast(tf.stack([stats["cold_reads"], stats["demotions"], stats["lookups"]]), tf.float64)
    now = tf.timestamp()
    previous_table = tf.raw_ops.MutableHashTableOfTensorsV2(
        key_dtype=tf.int64, value_dtype=tf.float64, value_shape=[4], use_node_name_sharing=True, name="previous"
    )
    key = tf.constant([0], tf.int64)
    previous = tf.raw_ops.LookupTableFindV2(
        table_handle=previous_table, keys=key, default_value=tf.zeros([4], tf.float64)
    )[0]
    elapsed = now - previous[3]
    deltas = counts - previous[:3]
    rates = tf.where(
        tf.logical_and(previous[3] > 0, elapsed > 0), deltas[:2] / tf.maximum(elapsed, 1e-9), tf.zeros([2], tf.float64)
    )
    hit_rate = tf.where(deltas[2] > 0, 1.0 - deltas[0] / tf.maximum(deltas[2], 1.0), stats["hit_rate"])
    with tf.control_dependencies([rates, hit_rate]):
        update = tf.raw_ops.LookupTableInsertV2(
            table_handle=previous_table, keys=key, values=tf.concat([counts, [now]], 0)[None, :]
        )
    with tf.control_dependencies([update]):
        return [
            tf.identity(stats["memory_bytes"], name="memory_bytes"),
            tf.identity(stats["disk_bytes"], name="disk_bytes"),
            tf.identity(hit_rate, name="hit_rate"),
            tf.identity(rates[0], name="cold_reads_per_sec"),
            tf.identity(rates[1], name="demotions_per_sec"),
            tf.identity(stats["dropped"], name="dropped_keys"),
        ]


def summary_tags(embedding):
    """The tags `add_summaries` gives an embedding's summaries.

    Args:
      embedding: a `DynamicEmbedding`.

    Returns:
      dict with keys "size", "memory_bytes", "bytes_per_key" (and "admitted_keys",
      "evicted_keys" for an embedding with those policies, "tier/memory_bytes",
      "tier/disk_bytes", "tier/hit_rate", "tier/cold_reads_per_sec",
      "tier/demotions_per_sec", "tier/dropped_keys" for a tiered one) and the
      tags as values (``tf_ext/<name>/<kind>``).

    Raises:
      TypeError: embedding is not a `DynamicEmbedding`.
    """
    if not isinstance(embedding, variable_lib.DynamicEmbedding):
        raise TypeError("summary_tags() expects a tf_ext DynamicEmbedding, got %r" % (embedding,))
    return {kind: "tf_ext/%s/%s" % (embedding.name, kind) for kind in _kinds(embedding)}


def _as_embedding_list(embeddings):
    if embeddings is None:
        return list(creation.get_dynamic_embeddings())
    if isinstance(embeddings, variable_lib.DynamicEmbedding):
        return [embeddings]
    if isinstance(embeddings, (str, bytes)) or not hasattr(embeddings, "__iter__"):
        raise TypeError(
            "embeddings of add_summaries() must be None, a DynamicEmbedding or a list of them, "
            "got %r" % (embeddings,)
        )
    out = []
    for i, emb in enumerate(embeddings):
        if not isinstance(emb, variable_lib.DynamicEmbedding):
            raise TypeError(
                "embeddings[%d] of add_summaries() must be a DynamicEmbedding (from "
                "tf_ext.get_dynamic_embedding), got %r" % (i, emb)
            )
        out.append(emb)
    return out


def _existing_scalar_summaries(graph, collections):
    """tag -> summary tensor of the ScalarSummary ops already in `collections`."""
    found = {}
    for key in collections:
        for t in graph.get_collection(key):
            op = getattr(t, "op", None)
            if op is None or op.type != "ScalarSummary":
                continue
            value = tf.get_static_value(op.inputs[0])
            if value is None or np.ndim(value) != 0:
                continue
            tag = value.item() if isinstance(value, np.ndarray) else value
            found[tag.decode() if isinstance(tag, bytes) else str(tag)] = t
    return found


def add_summaries(embeddings=None, collections=None):
    """Adds TensorBoard scalar summaries of dynamic embeddings to the graph.

    For each embedding: ``tf_ext/<name>/size`` (keys, all shards),
    ``tf_ext/<name>/memory_bytes`` (bytes its tables hold: keys, rows with the
    optimizer slots, metadata, index) and ``tf_ext/<name>/bytes_per_key``
    (memory_bytes / size, 0 while empty). The tags do not depend on the current
    name scope. Calling it again for the same embedding and collections adds
    nothing new (a merged summary cannot hold a tag twice).

    The summaries go to the `tf.compat.v1.GraphKeys.SUMMARIES` collection by
    default, which `tf.compat.v1.summary.merge_all()`, `MonitoredTrainingSession`
    and `tf.estimator.Estimator` (call it in `model_fn`) write to TensorBoard.

    Args:
      embeddings: a `DynamicEmbedding`, a list of them, or None (default) for
        every dynamic embedding of the default graph.
      collections: graph collection keys to add the summaries to (default
        `[tf.compat.v1.GraphKeys.SUMMARIES]`; `[]` adds them to none).

    Returns:
      list of string tensors (serialized `Summary` protos), three per embedding
      in the order size, memory_bytes, bytes_per_key (then admitted_keys,
      evicted_keys for embeddings with those policies, and the six tier
      summaries of a tiered embedding, see the module docstring); [] if there
      is no embedding.

    Raises:
      TypeError: embeddings holds something other than a `DynamicEmbedding`, or
        collections is a string.
      ValueError: an embedding belongs to another graph than the default one.
    """
    if isinstance(collections, (str, bytes)):
        raise TypeError(
            "collections of add_summaries() must be a list of collection keys, got the string "
            "%r (wrap it in a list)" % (collections,)
        )
    embs = _as_embedding_list(embeddings)
    collections = [tf.compat.v1.GraphKeys.SUMMARIES] if collections is None else list(collections)
    graph = tf.compat.v1.get_default_graph()
    for emb in embs:
        if emb.graph is not graph:
            raise ValueError(
                "add_summaries(): dynamic embedding %r belongs to another graph than the default "
                "one; call it inside `with graph.as_default():`" % emb.name
            )
    existing = _existing_scalar_summaries(graph, collections) if collections else {}
    out = []
    for emb in embs:
        tags = summary_tags(emb)
        kinds = _kinds(emb)
        if all(tags[k] in existing for k in kinds):
            out.extend(existing[tags[k]] for k in kinds)
            continue
        short = emb.name.split("/")[-1]
        with tf.name_scope("tf_ext_summaries/%s" % short):
            size = emb.size(name="size")
            memory = emb.memory_bytes(name="memory_bytes")
            per_key = tf.where(
                size > 0,
                tf.cast(memory, tf.float64) / tf.cast(tf.maximum(size, 1), tf.float64),
                tf.constant(0.0, tf.float64),
                name="bytes_per_key",
            )
            values = [size, memory, per_key]
            if emb.admission is not None:
                values.append(emb.admission_state["admitted"].read_value())
            if emb.eviction is not None:
                values.append(emb.eviction_state["evicted"].read_value())
            if emb.storage is not None:
                with tf.name_scope("tier"):
                    values.extend(_tier_values(emb))
            for kind, value in zip(kinds, values):
                if tags[kind] in existing:
                    out.append(existing[tags[kind]])
                    continue
                # The raw op takes the exact tag; tf.compat.v1.summary.scalar would prefix
                # the current name scope and uniquify repeated names.
                summary = tf.raw_ops.ScalarSummary(tags=tags[kind], values=value, name=kind.replace("/", "_"))
                for key in collections:
                    graph.add_to_collection(key, summary)
                out.append(summary)
    return out
