"""The CTR example's tiered tables (``--memory_budget``): each table's budget, the next batch's prefetch, the stats.

* :func:`storages`: one ``tf_ext.TieredStorage`` per table. The budget is for all the model's tables together and
  each table gets what its keys can need at most (its id space, at least 128 rows, times an estimate of a key's
  bytes) while that fits, the big tables sharing the rest evenly (water filling): a table of 3 ids needs some
  kilobytes, one of 10 million ids gets all it can. The disk cap is split by what each table may put on disk.
* :func:`prefetch_op`: the op that brings the rows of the next batch's ids (``next/<key>`` features, see
  :func:`data.with_next_ids`) from disk while the current step computes.
* :func:`stats_tensor`: the tier statistics of all the tables, summed, for the progress lines and the summary.
"""

import tensorflow as tf

from tensorflow_ext import embedding
from tensorflow_ext.embedding import variable
from tensorflow_ext.examples import synthetic
from tensorflow_ext.examples.ctr import data
from tensorflow_ext.table import tiered

# Slot columns per embedding column (and per-row columns) of each optimizer, for the estimate of a key's bytes.
_SLOTS_PER_COLUMN = {"adagrad": 1, "adam": 2, "ftrl": 2, "sgd": 0, "momentum": 1, "rmsprop": 2}
_ROWWISE_COLUMNS = {"rowwise_adagrad": 1}
# A key's bytes beside its columns: index entry, version, frequency, row header (an overestimate is harmless: the
# small tables get a little more than they need).
_KEY_OVERHEAD_BYTES = 48
# The fewest rows a table's budget is sized for: twice the least a memory tier accepts (64 rows).
_MIN_ROWS = 128


def table_dims(params):
    """``{table name suffix: dim}`` of the model's categorical tables: DeepFM one (``emb``, dim + 1: the first-order
    weight beside the vector), Wide&Deep two (``wide`` of dim 1, ``emb`` of dim)."""
    if params["model"] == "deepfm":
        return {"emb": params["dim"] + 1}
    return {"wide": 1, "emb": params["dim"]}


def key_bytes(dim, optimizer):
    """An estimate of the memory a key of a `dim`-wide table costs with `optimizer` (float32 columns)."""
    columns = dim * (1 + _SLOTS_PER_COLUMN.get(optimizer, 0)) + _ROWWISE_COLUMNS.get(optimizer, 0)
    return 4 * columns + _KEY_OVERHEAD_BYTES


def _water_fill(total, needs):
    """``{name: share}``: `total` split so that a name whose need fits an even share of what is left gets its need,
    and the others share the rest evenly."""
    shares, open_names, left = {}, set(needs), float(total)
    while open_names:
        even = left / len(open_names)
        fitting = {n for n in open_names if needs[n] <= even}
        if not fitting:
            for n in open_names:
                shares[n] = even
            break
        for n in fitting:
            shares[n] = needs[n]
            left -= needs[n]
        open_names -= fitting
    return shares


def storages(params):
    """``{column name: tf_ext.TieredStorage}`` of every categorical table of the model (None without a budget).

    Args:
      params: the model's params: ``memory_budget`` (bytes, or None), ``tier_path``, ``disk_budget`` (or None),
        ``tier_policy``, ``cardinalities`` (the id space of each field), ``model``, ``dim``, ``optimizer``.

    Returns:
      A dict keyed by the feature column names (``C1_emb``, ``C1_wide``, ...), or None.
    """
    if not params.get("memory_budget"):
        return None
    needs = {}
    for suffix, dim in table_dims(params).items():
        for key, ids in zip(synthetic.CATEGORICAL_KEYS, params["cardinalities"]):
            # 1.25: the table's index keeps free slots. A tier holds at least 64 rows: a tiny table gets 128.
            needs["%s_%s" % (key, suffix)] = 1.25 * max(ids, _MIN_ROWS) * key_bytes(dim, params["optimizer"])
    memory = _water_fill(params["memory_budget"], needs)
    disk = None
    if params.get("disk_budget"):
        spill = {name: max(needs[name] - memory[name], 1.0) for name in needs}
        total_spill = sum(spill.values())
        # At least a byte each (a cap must be positive), and no more than the budget in all.
        spread = max(params["disk_budget"] - len(needs), 0)
        disk = {name: 1 + int(spread * spill[name] / total_spill) for name in needs}
    return {
        name: tiered.TieredStorage(
            memory_bytes=max(1, int(memory[name])),
            path=params["tier_path"],
            disk_bytes=None if disk is None else disk[name],
            policy=params.get("tier_policy", "lru"),
        )
        for name in needs
    }


def prefetch_op(features, columns):
    """The op that prefetches the next batch's ids of every tiered table (None when the features carry no
    ``next/`` ids).

    Args:
      features: the model's features (with ``next/<key>`` from :func:`data.with_next_ids`).
      columns: ``{field key: the DynamicEmbedding of its table}`` (several tables per field: a list).

    Returns:
      An op, or None.
    """
    ops = []
    for key, embeddings in sorted(columns.items()):
        ids = features.get(data.NEXT_PREFIX + key)
        if ids is None:
            continue
        if ids.dtype.is_integer:
            ids = tf.boolean_mask(ids, tf.not_equal(ids, -1))  # -1: missing (no row)
        for emb in embeddings:
            if emb.storage is not None:
                ops.append(emb.prefetch(ids))
    return tf.group(*ops, name="prefetch_next_ids") if ops else None


def stats_tensor():
    """int64 [10]: the tier statistics of every tiered embedding of the graph, summed (`refs.TIER_STATS_FIELDS`
    order); None when no embedding is tiered."""
    parts = []
    for emb in embedding.get_dynamic_embeddings():
        if emb.storage is not None:
            stats = emb.tier_stats()
            parts.append(tf.stack([stats[field] for field in variable.TIER_STATS_FIELDS]))
    if not parts:
        return None
    return tf.add_n(parts) if len(parts) > 1 else parts[0]


def stats_dict(values):
    """``{field: int}`` of a fetched :func:`stats_tensor` value."""
    return {field: int(v) for field, v in zip(variable.TIER_STATS_FIELDS, values)}
