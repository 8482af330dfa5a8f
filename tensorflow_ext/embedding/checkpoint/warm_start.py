"""Warm-starting dynamic embeddings (`tf.compat.v1.train.warm_start`, Estimator `warm_start_from`).

TF's warm start overrides variable initializers with checkpoint values. A
dynamic embedding has no initializer, so tf_ext teaches `warm_start` (at
import) to handle its shards: a shard selected by `vars_to_warm_start` (a
regex over TRAINABLE_VARIABLES by default, as for variables) is filled, when
the model initializes, with the keys and embeddings its previous embedding had
in the checkpoint:

* the previous embedding's tensors `<prev>/part_<j>-keys` / `-values` of ALL
  its shards are read and each current shard keeps the keys that hash to it,
  so the number of shards may change between the two models; from a delta
  checkpoint each previous shard's rows are those of its whole chain (the
  full save and the deltas up to it, `delta.restore_rows`);
* `-versions` and `-freqs` come along; optimizer slots are not warm-started
  (like TF, which warm-starts trainable variables, not their slots): the keys'
  slots start from their initial values;
* the previous name defaults to the current one; `var_name_to_prev_var_name`
  may map a shard name (`emb/part_0`) to the previous embedding's name (or
  any of its shards' names): `{"emb/part_0": "old_emb", ...}`;
* values recorded as int8 rows (a serving export's: approximations of the
  trained values) are refused, as a Saver's restore refuses them: a ValueError
  naming both storages (a read-only serving table takes them);
* the previous embedding must have the same `dim`, else `warm_start` raises a
  ValueError naming both dims. `warm_start_from_checkpoint(...,
  dim_mismatch="truncate")` keeps the first `dim` columns of wider previous
  rows, `dim_mismatch="pad"` fills the extra columns of narrower ones from
  the embedding's initializer.

The fill runs as part of the model's init op: the import op is registered as
the initializer of the table resource, and `Scaffold`'s default init_op
initializes the graph's resources (Estimator and MonitoredSession run it when
no checkpoint of the model itself exists). In a plain Session, run
`warm_start_op()` after `warm_start`.
"""

import re
import threading

import tensorflow as tf

from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.embedding.checkpoint import delta as delta_lib
from tensorflow_ext.embedding.checkpoint import format as ckpt_format
from tensorflow_ext.embedding.checkpoint import restore as restore_lib
from tensorflow_ext.embedding.shard import DynamicEmbeddingShard
from tensorflow_ext.tf_compat import internals

__all__ = ["warm_start_from_checkpoint", "warm_start_op", "matching_shards", "ShardTarget", "warm_start_shard"]

_COLLECTION = "tf_ext_warm_start_ops"
_DIM_MISMATCH = ("error", "truncate", "pad")
# The dim_mismatch policy of the warm_start_from_checkpoint call in progress
# (per thread: TF's warm_start reaches our hooks through its own call stack).
_options = threading.local()


class ShardTarget(object):
    """Stands for a shard inside TF's warm_start bookkeeping."""

    def __init__(self, shard):
        self.shard = shard
        self.name = shard.name


def matching_shards(vars_to_warm_start, graph):
    shards = [
        s for s in graph.get_collection(state_lib.GraphKeys.DYNAMIC_EMBEDDINGS) if isinstance(s, DynamicEmbeddingShard)
    ]
    if vars_to_warm_start is None or isinstance(vars_to_warm_start, str):
        pattern = vars_to_warm_start
        return [s for s in shards if s.trainable and (pattern is None or re.match(pattern, s.name))]
    if isinstance(vars_to_warm_start, list):
        if all(isinstance(v, str) for v in vars_to_warm_start):
            return [s for s in shards if any(re.match(p, s.name) for p in vars_to_warm_start)]
        return [v for v in vars_to_warm_start if isinstance(v, DynamicEmbeddingShard)]
    return []


def _previous_dim(ckpt, path, prev_name, parts, shapes, shard):
    """The row width of the previous embedding's `-values` tensors."""
    dims = set()
    for part in parts:
        shape = shapes.get(part + "-values")
        if shape is None or len(shape) != 2:
            raise ValueError(
                "warm start of dynamic embedding shard %s: checkpoint %s has %s but no [n, dim] tensor "
                "%s-values (got shape %s)" % (shard.name, ckpt, part + "-keys", part, shape)
            )
        dims.add(int(shape[1]))
    if len(dims) != 1:
        raise ValueError(
            "warm start of dynamic embedding shard %s: the shards of %s in checkpoint %s have "
            "different dims %s" % (shard.name, prev_name, path, sorted(dims))
        )
    return dims.pop()


def _fit_dim(values, prev_dim, shard, dim_mismatch, ckpt, prev_name):
    """values [n, prev_dim] -> [n, shard.dim] by the dim_mismatch policy (or a ValueError)."""
    dim = shard.dim
    if prev_dim == dim:
        return values
    emb = shard.embedding
    what = "warm start of dynamic embedding %s (dim=%d) from %s in checkpoint %s (dim=%d)" % (
        emb.name,
        dim,
        prev_name,
        ckpt,
        prev_dim,
    )
    if dim_mismatch == "truncate" and prev_dim > dim:
        return values[:, :dim]
    if dim_mismatch == "pad" and prev_dim < dim:
        # The new columns are what the initializer gives a new key's row there.
        init = emb.initializer.make_rows(tf.shape(values)[0], dim)
        return tf.concat([values, init[:, prev_dim:]], 1)
    if dim_mismatch == "error":
        hint = (
            "dim_mismatch='truncate') (keeps each row's first %d columns" % dim
            if prev_dim > dim
            else "dim_mismatch='pad') (fills columns %d..%d from the initializer" % (prev_dim, dim - 1)
        )
        raise ValueError(
            "%s: the dims differ. To convert the rows, warm-start with "
            "tf_ext.embedding.warm_start_from_checkpoint(..., %s)." % (what, hint)
        )
    raise ValueError(
        "%s: dim_mismatch=%r cannot convert rows of dim %d to dim %d ('truncate' needs a wider "
        "previous embedding, 'pad' a narrower one)." % (what, dim_mismatch, prev_dim, dim)
    )


def _refuse_serving_only_values(path, parts, shapes, shard):
    """A ValueError where a training shard would warm-start from values recorded as int8 rows (a serving export's,
    as the Saver's restore refuses them: `restore.refuses_serving_only_values`)."""
    if not restore_lib.refuses_serving_only_values(shard):
        return
    reader = None
    for part in parts:
        if part + ckpt_format.STORAGE_SUFFIX not in shapes:
            continue  # no record: float32 values
        reader = reader or tf.compat.v1.train.NewCheckpointReader(path)
        if reader.get_tensor(part + ckpt_format.STORAGE_SUFFIX).decode() == ckpt_format.SERVING_ONLY_STORAGE:
            raise ValueError(
                "warm start of dynamic embedding shard %s from %s: %s"
                % (shard.name, path, restore_lib.serving_only_values_message(part, shard))
            )


def _read_previous(ckpt, prev_name, shard, dim_mismatch):
    """The keys/values/versions/freqs of embedding prev_name in ckpt that belong to `shard`."""
    path = internals.checkpoint_filename(ckpt)
    shapes = dict(tf.train.list_variables(path))
    parts = sorted(
        n[: -len("-keys")]
        for n in shapes
        if n.endswith("-keys") and re.fullmatch(re.escape(prev_name) + r"/part_\d+", n[: -len("-keys")])
    )
    if not parts:
        return None
    _refuse_serving_only_values(path, parts, shapes, shard)
    prev_dim = _previous_dim(ckpt, path, prev_name, parts, shapes, shard)
    tensors, dtypes = [], []
    for part in parts:
        for suffix, dtype in (
            ("-keys", tf.int64),
            ("-values", tf.float32),
            ("-versions", tf.int64),
            ("-freqs", tf.int64),
        ):
            tensors.append(part + suffix)
            dtypes.append(dtype)
    restored = tf.raw_ops.RestoreV2(
        prefix=path, tensor_names=tensors, shape_and_slices=[""] * len(tensors), dtypes=dtypes
    )
    restored = list(restored)
    for i, part in enumerate(parts):
        if part + ckpt_format.DELTA_SUFFIX in shapes:
            # A delta checkpoint: the part's rows are those of its chain (the full save and the deltas up to it).
            keys, values, versions, freqs = restored[4 * i : 4 * i + 4]
            no_slots = tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32)
            keys, values, _, versions, freqs = delta_lib.restore_rows(
                part,
                tf.constant(path),
                restored[0].op,
                (keys, values, no_slots, versions, freqs),
                with_slots=False,
            )
            restored[4 * i : 4 * i + 4] = [keys, values, versions, freqs]
    flat = lambda ts: tf.reshape(tf.concat(ts, 0), [-1])
    keys = flat(restored[0::4])
    values = tf.reshape(tf.concat(restored[1::4], 0), [-1, prev_dim])
    versions = flat(restored[2::4])
    freqs = flat(restored[3::4])
    emb = shard.embedding
    if emb.num_shards > 1:
        mine = tf.equal(emb.shard_ids(keys), shard.shard_index)
        keys, values, versions, freqs = [tf.boolean_mask(t, mine) for t in (keys, values, versions, freqs)]
    values = _fit_dim(values, prev_dim, shard, dim_mismatch, ckpt, prev_name)
    return keys, values, versions, freqs


def warm_start_shard(ckpt, prev_tensor_name, shard):
    prev = prev_tensor_name or shard.name
    prev = re.sub(r"/part_\d+$", "", prev)
    dim_mismatch = getattr(_options, "dim_mismatch", "error")
    with internals.ops.colocate_with(shard.handle), tf.name_scope("warm_start_" + shard.name.replace("/", "_")):
        data = _read_previous(ckpt, prev, shard, dim_mismatch)
        if data is None:
            raise ValueError(
                "warm start of dynamic embedding shard %s: checkpoint %s has no tensors %s/part_*-keys"
                % (shard.name, ckpt, prev)
            )
        keys, values, versions, freqs = data
        op = shard.table.import_(keys, values, versions, freqs, clear_first=True)
    internals.resources.register_resource(shard.handle, op, tf.constant(True), is_shared=True)
    tf.compat.v1.add_to_collection(_COLLECTION, op)
    tf.compat.v1.logging.info("Warm-starting dynamic embedding shard %s from %s (%s)", shard.name, ckpt, prev)
    return op


def warm_start_from_checkpoint(
    ckpt_to_initialize_from,
    vars_to_warm_start=".*",
    var_name_to_vocab_info=None,
    var_name_to_prev_var_name=None,
    dim_mismatch="error",
):
    """`tf.compat.v1.train.warm_start`, with a choice for embeddings whose dim changed.

    Warm-starts variables and dynamic embeddings exactly as
    `tf.compat.v1.train.warm_start` (which tf_ext teaches about dynamic
    embeddings), and lets a dynamic embedding start from a previous one of
    another `dim`. Call it where you would call `warm_start`: after building the
    model, before the session is created (in an Estimator, at the end of
    `model_fn` in TRAIN mode, instead of `warm_start_from`).

    Args:
      ckpt_to_initialize_from: a checkpoint prefix or directory.
      vars_to_warm_start: as in `tf.compat.v1.train.warm_start` (default ".*").
      var_name_to_vocab_info: as in `tf.compat.v1.train.warm_start` (dense
        variables only).
      var_name_to_prev_var_name: as in `tf.compat.v1.train.warm_start`; a key
        may be a shard name (`emb/part_0`) mapped to the previous embedding.
      dim_mismatch: what to do when a dynamic embedding's previous `dim` differs
        from its current one: "error" (default, a ValueError naming both dims),
        "truncate" (previous dim larger: keep each row's first `dim` columns) or
        "pad" (previous dim smaller: keep the previous columns, fill the new ones
        from the embedding's initializer). Embeddings whose dim did not change are
        copied as they are. Any shard counts, before and after, are fine.

    Raises:
      ValueError: dim_mismatch is not one of "error", "truncate", "pad"; or a
        dim differs and dim_mismatch does not convert it (see above); or what
        `tf.compat.v1.train.warm_start` raises.
    """
    if dim_mismatch not in _DIM_MISMATCH:
        raise ValueError(
            "dim_mismatch must be one of %s, got %r" % (", ".join(repr(p) for p in _DIM_MISMATCH), dim_mismatch)
        )
    previous = getattr(_options, "dim_mismatch", None)
    _options.dim_mismatch = dim_mismatch
    try:
        tf.compat.v1.train.warm_start(
            ckpt_to_initialize_from,
            vars_to_warm_start=vars_to_warm_start,
            var_name_to_vocab_info=var_name_to_vocab_info,
            var_name_to_prev_var_name=var_name_to_prev_var_name,
        )
    finally:
        if previous is None:
            del _options.dim_mismatch
        else:
            _options.dim_mismatch = previous


def warm_start_op(graph=None):
    """The op that fills the warm-started dynamic embeddings of a graph.

    `tf.compat.v1.train.warm_start` only records what to load for dynamic
    embeddings; this op imports the rows. A Scaffold's default init_op
    (Estimator, MonitoredSession) runs it; in a plain Session run it yourself
    after `warm_start`.

    Args:
      graph: a `tf.Graph` (default: the default graph).

    Returns:
      An op (a no-op if no dynamic embedding is warm-started).
    """
    graph = graph or tf.compat.v1.get_default_graph()
    return tf.group(*graph.get_collection(_COLLECTION))
