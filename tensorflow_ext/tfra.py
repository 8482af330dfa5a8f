"""TFRA's `dynamic_embedding` API on tensorflow_ext: port a TFRA model by changing one import.

    # from tensorflow_recommenders_addons import dynamic_embedding as de
    from tensorflow_ext import tfra as de

    emb = de.get_variable("user", key_dtype=tf.int64, value_dtype=tf.float32, dim=16,
                          initializer=tf.compat.v1.random_normal_initializer(0, 0.01))
    vecs = de.embedding_lookup(emb, ids)
    opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3))   # returns the optimizer itself
    train_op = opt.minimize(loss, global_step=gs)

The same module is `tensorflow_ext.dynamic_embedding`, so `import tensorflow_recommenders_addons as tfra` becomes
`import tensorflow_ext as tfra` and `tfra.dynamic_embedding.get_variable(...)` keeps working.

Every name here has TFRA's signature and argument order and returns tensorflow_ext objects (a
`DynamicEmbedding`, plain tensors). TFRA names with no meaning here raise an error that says what to use instead:
tensorflow_ext has no TrainableWrapper (stock optimizers train the embedding itself; `return_trainable=True`
returns the embedding in its place), needs no model mode (lookups of a graph without an optimizer never insert
keys, so an exported serving graph needs no switch; `enable_inference_mode` still works), has one table engine (no
kv_creator) and no need for `bp_v2`. Those errors are `tensorflow_ext.errors.NotProvidedError`, an AttributeError.
docs/migrating_from_tfra.md has the full map and the semantic differences.
"""

import functools
import numbers
import weakref

import numpy as np
import tensorflow as tf

from tensorflow_ext import errors as _errors
from tensorflow_ext.embedding import config as _config
from tensorflow_ext.embedding import creation as _creation
from tensorflow_ext.embedding import eviction as _eviction
from tensorflow_ext.embedding import keys as _keys
from tensorflow_ext.embedding import lookup as _lookup
from tensorflow_ext.embedding import optimizers as _optimizers
from tensorflow_ext.embedding import variable as _variable
from tensorflow_ext.table import tiered as _tiered

__all__ = [
    "GraphKeys",
    "Variable",
    "TimestampRestrictPolicy",
    "FrequencyRestrictPolicy",
    "DynamicEmbeddingOptimizer",
    "default_partition_fn",
    "get_variable",
    "embedding_lookup",
    "embedding_lookup_unique",
    "embedding_lookup_sparse",
    "safe_embedding_lookup_sparse",
    "ModelMode",
    "enable_inference_mode",
    "enable_train_mode",
    "get_model_mode",
    "restrict",
]


class GraphKeys(object):
    """TFRA's collection names. Both hold the shards of tensorflow_ext's dynamic embeddings.

    (tensorflow_ext keeps every shard in `tf_ext.GraphKeys.DYNAMIC_EMBEDDINGS`, and trainable ones in
    `tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES`; `tf_ext.embedding.get_dynamic_embeddings()` lists the
    embeddings.)
    """

    DYNAMIC_EMBEDDING_VARIABLES = _variable.GraphKeys.DYNAMIC_EMBEDDINGS
    TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES = _variable.GraphKeys.DYNAMIC_EMBEDDINGS


class _RestrictPolicy(object):
    """Base of the restrict policies: which keys `restrict` keeps."""

    policy = None

    def __init__(self, var=None):
        self.var = var


class TimestampRestrictPolicy(_RestrictPolicy):
    """`restrict(num_reserved)` keeps the most recently trained keys (highest version)."""

    policy = "timestamp"


class FrequencyRestrictPolicy(_RestrictPolicy):
    """`restrict(num_reserved)` keeps the most frequently looked-up keys."""

    policy = "frequency"


def default_partition_fn(keys, shard_num):
    """The shard of each key (TFRA's default partitioner; tensorflow_ext hashes keys, see docs).

    Args:
      keys: int64, int32 or string tensor (strings are fingerprinted as an embedding with key_dtype=tf.string
        does, `tf_ext.embedding.string_to_key`).
      shard_num: python int >= 1.

    Returns:
      int32 tensor of keys' shape: the shard that an embedding with `shard_num` shards keeps each key in.

    Raises:
      TypeError: keys of another dtype (e.g. float).
      ValueError: shard_num < 1.
    """
    if isinstance(shard_num, (bool, np.bool_)) or not isinstance(shard_num, numbers.Integral) or shard_num < 1:
        raise ValueError("default_partition_fn: shard_num must be an int >= 1, got %r" % (shard_num,))
    keys = tf.convert_to_tensor(keys)
    dtype = keys.dtype.base_dtype
    if dtype == tf.string:
        keys = _keys.string_to_key(keys)
    elif dtype == tf.int32:
        keys = tf.cast(keys, tf.int64)
    elif dtype != tf.int64:
        raise TypeError("default_partition_fn: keys must be int64, int32 or strings, got %s" % dtype.name)
    return _keys.HashPartition(int(shard_num)).part_ids(keys)


# The restrict policy ("timestamp", "frequency", or None when none was given) of each embedding that get_variable /
# Variable built or reused last: TFRA's `Variable.restrict` reads it, and `emb.restrict_policy` returns it.
# Embeddings made otherwise are not in it (they have no `restrict_policy` attribute).
_restrict_policies = weakref.WeakKeyDictionary()


def _policy_name(restrict_policy):
    if restrict_policy is None:
        return None
    if isinstance(restrict_policy, type) and issubclass(restrict_policy, _RestrictPolicy):
        return restrict_policy.policy
    if isinstance(restrict_policy, _RestrictPolicy):
        return restrict_policy.policy
    name = getattr(restrict_policy, "__name__", type(restrict_policy).__name__)
    if "Timestamp" in name:
        return "timestamp"
    if "Frequency" in name:
        return "frequency"
    raise ValueError(
        "restrict_policy must be tensorflow_ext.tfra.TimestampRestrictPolicy or "
        "FrequencyRestrictPolicy, got %r" % (restrict_policy,)
    )


def get_variable(
    name,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
    dim=1,
    devices=None,
    partitioner=default_partition_fn,
    shared_name="get_variable",
    initializer=None,
    trainable=True,
    checkpoint=True,
    init_size=0,
    kv_creator=None,
    restrict_policy=None,
    bp_v2=False,
    short_file_name=False,
    storage=None,
):
    """TFRA's `get_variable`, in its argument order: creates or reuses a `tf_ext.DynamicEmbedding`.

    Args:
      name: the embedding's name (variable-scope prefixed, reused under AUTO_REUSE as in TFRA).
      key_dtype: tf.int64, tf.int32 or tf.string.
      value_dtype: tf.float32, or tf.bfloat16 / tf.float16 (TFRA's half value_dtype): rows stored in half
        precision, converted at the table's boundary (lookups return float32; optimizer slots stay float32, updates
        round with the default rounding; see `tf_ext.get_dynamic_embedding`'s value_dtype, slot_dtype, rounding).
      dim: the embedding dimension.
      devices: list of device strings; one shard per device (as in TFRA; one device string is one shard).
      partitioner: TFRA's `default_partition_fn` (tensorflow_ext always partitions keys by a 64-bit hash; other
        partition functions are refused).
      shared_name: ignored (table resources are named after the embedding).
      initializer: as in TFRA (a number, a numpy vector of dim values, a TF initializer or a callable); every new
        key gets its own draw. None (the default) is 0, as in TFRA (the variable scope's initializer is not used).
      trainable: add the shards to the trainable variables.
      checkpoint: False keeps the embedding out of checkpoints (its shards' saveables leave SAVEABLE_OBJECTS).
      init_size: expected number of keys (tensorflow_ext's `initial_capacity`).
      kv_creator: None (one table engine), or a `tf_ext.TieredStorage`: the same as storage=.
      restrict_policy: None, `TimestampRestrictPolicy` or `FrequencyRestrictPolicy`: the policy of
        `restrict(emb, num_reserved)`.
      bp_v2: must be False (updates are applied in place per key; see docs/migrating_from_tfra.md).
      short_file_name: accepted and ignored (TFRA's checkpoint file names; tensorflow_ext's checkpoints go through
        the Saver, and the name is prefixed by the variable scope either way).
      storage: tensorflow_ext's own (not TFRA's): None (every row in memory) or a `tf_ext.TieredStorage`, as in
        `tf_ext.get_dynamic_embedding` (docs/tiered_storage.md).

    Returns:
      A `DynamicEmbedding`.

    Raises:
      ValueError: an argument with no equivalent here (another kv_creator, bp_v2=True, a custom partitioner).
    """
    return _build("get_variable", **locals())  # every argument, by name


def _build(
    caller,
    name,
    key_dtype,
    value_dtype,
    dim,
    devices,
    partitioner,
    shared_name,
    initializer,
    trainable,
    checkpoint,
    init_size,
    kv_creator,
    restrict_policy,
    bp_v2,
    short_file_name,
    storage=None,
    reuse=None,
):
    """get_variable and Variable: TFRA's arguments -> get_dynamic_embedding's (`caller` names the error's source).

    shared_name and short_file_name are accepted and ignored (see `get_variable`).
    """
    del shared_name, short_file_name
    if isinstance(kv_creator, _tiered.TieredStorage):
        if storage is not None:
            raise ValueError("%s(kv_creator=..., storage=...): pass the TieredStorage once (storage=)" % caller)
        storage, kv_creator = kv_creator, None
    if kv_creator is not None:
        raise ValueError(
            "%s(kv_creator=...): tensorflow_ext has one table engine (a concurrent CPU hash table that "
            "grows on demand), so there is no creator to choose. Remove kv_creator; use init_size for the expected "
            "number of keys, and storage=tf_ext.TieredStorage(memory_bytes, path) to keep the rows that do not fit "
            "in memory on disk." % caller
        )
    if bp_v2:
        raise ValueError(
            "%s(bp_v2=True): tensorflow_ext's optimizers update each key's row in place in one kernel "
            "(no read-lookup-write across processes), which is what bp_v2 emulates. Remove bp_v2." % caller
        )
    if partitioner is not None and partitioner is not default_partition_fn:
        raise ValueError(
            "%s(partitioner=%r): tensorflow_ext partitions keys over shards by a 64-bit hash of the key "
            "(tf_ext.embedding.DynamicEmbedding.shard_ids); custom partition functions are not supported. "
            "Remove partitioner (the number of shards is len(devices))." % (caller, partitioner)
        )
    if initializer is None:
        initializer = 0.0  # TFRA's default (the native default is a truncated normal)
    if isinstance(devices, (str, tf.DeviceSpec)):
        devices = [devices]  # TFRA: one device string is one shard on that device
    if devices is not None and (
        not isinstance(devices, (list, tuple)) or not all(isinstance(d, (str, tf.DeviceSpec)) for d in devices)
    ):
        raise TypeError(
            "%s(devices=%r): devices must be a list of device strings, one shard per device (e.g. "
            "['/job:ps/task:0', '/job:ps/task:1']), one device string, or None" % (caller, devices)
        )
    if isinstance(init_size, (bool, np.bool_)) or not isinstance(init_size, numbers.Integral):
        raise TypeError(
            "%s(init_size=%r): init_size must be an int, the expected number of keys (0 if unknown)"
            % (caller, init_size)
        )
    if init_size < 0:
        raise ValueError(
            "%s(init_size=%r): init_size must be >= 0, the expected number of keys (0 if unknown)" % (caller, init_size)
        )
    for flag, value in (("trainable", trainable), ("checkpoint", checkpoint)):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError("%s(%s=%r): %s must be True or False" % (caller, flag, value, flag))
    policy = _policy_name(restrict_policy)
    emb = _creation.get_dynamic_embedding(
        name,
        dim=dim,
        key_dtype=key_dtype,
        value_dtype=value_dtype,
        initializer=initializer,
        num_shards=len(devices) if devices else None,
        devices=devices,
        trainable=trainable,
        initial_capacity=init_size,
        reuse=reuse,
        storage=storage,
    )
    if not checkpoint:
        saveables = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        for s in emb.saveables:
            if s in saveables:
                saveables.remove(s)
    _restrict_policies[emb] = policy
    return emb


class _VariableType(type):
    """The type of `Variable`: every `DynamicEmbedding` is an instance of `Variable` (TFRA code checks
    `isinstance(x, de.Variable)`), and `Variable`'s attributes are `DynamicEmbedding`'s."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _variable.DynamicEmbedding)

    def __subclasscheck__(cls, subclass):
        return type.__subclasscheck__(cls, subclass) or (
            isinstance(subclass, type) and issubclass(subclass, _variable.DynamicEmbedding)
        )

    def __getattr__(cls, name):
        if name in _EMBEDDING_METHODS:  # TFRA's Variable methods, unbound: called with the embedding first
            return _EMBEDDING_METHODS[name]
        return getattr(_variable.DynamicEmbedding, name)


class Variable(metaclass=_VariableType):
    """TFRA's `Variable` constructor, in its argument order: creates a new `tf_ext.DynamicEmbedding`.

        emb = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=8, name="user", initializer=0.0)

    It builds the embedding `get_variable(name, ...)` builds with the same arguments (the name is prefixed by the
    current variable scope, as get_variable's is), but never reuses one: an embedding of that name in the graph is
    an error (use `get_variable` under a reusing variable scope to share one). The result is a `DynamicEmbedding`,
    and `isinstance(emb, de.Variable)` is True for every dynamic embedding.

    Args:
      key_dtype, value_dtype, dim, devices, partitioner, initializer, trainable, checkpoint, init_size, kv_creator,
      restrict_policy, bp_v2, short_file_name, storage: as in `get_variable`.
      shared_name: ignored (table resources are named after the embedding).
      name: the embedding's name (TFRA's default "DynamicEmbedding_Variable").

    Returns:
      A `DynamicEmbedding` (not an instance of this class's own type).

    Raises:
      ValueError: an embedding of that name exists, or an argument with no equivalent here (see `get_variable`).
      TypeError: the name passed first, where TFRA's constructor takes key_dtype.
    """

    def __new__(
        cls,
        key_dtype=tf.int64,
        value_dtype=tf.float32,
        dim=1,
        devices=None,
        partitioner=default_partition_fn,
        shared_name=None,
        name="DynamicEmbedding_Variable",
        initializer=None,
        trainable=True,
        checkpoint=True,
        init_size=0,
        kv_creator=None,
        restrict_policy=None,
        bp_v2=False,
        short_file_name=False,
        storage=None,
    ):
        tfra_args = dict(locals())  # every argument, by name (taken before any other local exists)
        del tfra_args["cls"]
        if isinstance(key_dtype, str):
            try:
                tf.as_dtype(key_dtype)
            except TypeError:
                raise TypeError(
                    "Variable(%r, ...): TFRA's Variable constructor takes key_dtype first and the name as a keyword: "
                    "Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=..., name=%r), or "
                    "get_variable(%r, ...), whose first argument is the name." % (key_dtype, key_dtype, key_dtype)
                ) from None
        if not isinstance(name, str) or not name:
            raise ValueError("Variable(name=%r): name must be a non-empty string" % (name,))
        full_name = _config.scoped_name(tf.compat.v1.get_variable_scope(), name)
        for emb in _creation.get_dynamic_embeddings():
            if emb.name == full_name:
                raise ValueError(
                    "Variable(name=%r): dynamic embedding %s exists in this graph; TFRA's Variable constructor "
                    "always creates a new one. Pick another name, or share it with get_variable(%r, ...) under "
                    "tf.compat.v1.variable_scope(..., reuse=tf.compat.v1.AUTO_REUSE)." % (name, full_name, name)
                )
        return _build("Variable", reuse=False, **tfra_args)


def restrict(var, num_reserved, trigger=None, name=None):
    """TFRA's `var.restrict(num_reserved, trigger=...)` as a function (see `tf_ext.embedding.restrict`).

    Args:
      var: a `DynamicEmbedding` created with a restrict_policy.
      num_reserved: keys to keep.
      trigger: restrict only above this many keys (default num_reserved).
      name: optional name scope.

    Returns:
      int64 scalar tensor: keys removed.

    Raises:
      ValueError: the embedding has no restrict policy.
    """
    policy = _restrict_policies.get(var)
    if policy is None:
        raise ValueError(
            "dynamic embedding %r has no restrict policy: create it with "
            "get_variable(..., restrict_policy=TimestampRestrictPolicy) or call "
            "tf_ext.embedding.restrict(emb, num_reserved, policy='timestamp')" % var.name
        )
    return _eviction.restrict(var, num_reserved, trigger=trigger, policy=policy, name=name)


class ModelMode(object):
    """TFRA's model modes: TRAIN lookups insert new keys, INFERENCE lookups only read."""

    TRAIN = "train"
    INFERENCE = "inference"
    CURRENT_SETTING = TRAIN


def enable_inference_mode():
    """Lookups built afterwards through this module never insert keys (TFRA's inference mode).

    tensorflow_ext does this by itself for graphs without an optimizer (Estimator eval/predict/export), so a
    ported model keeps working whether or not it calls this.
    """
    ModelMode.CURRENT_SETTING = ModelMode.INFERENCE


def enable_train_mode():
    """Lookups built afterwards through this module follow tensorflow_ext's rule: a lookup inserts new keys only
    when an optimizer applies a gradient that flows through it."""
    ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def get_model_mode():
    """'train' or 'inference' (see `enable_inference_mode`)."""
    return ModelMode.CURRENT_SETTING


def _is_training():
    # None: tensorflow_ext's own rule (a lookup inserts only when an optimizer applies a gradient through it).
    return False if ModelMode.CURRENT_SETTING == ModelMode.INFERENCE else None


def _with_trainable(values, params, return_trainable):
    """TFRA returns (values, TrainableWrapper) with return_trainable: here the embedding itself stands in for
    the wrapper (optimizers accept it in var_list; it has no other use here)."""
    return (values, params) if return_trainable else values


def embedding_lookup(
    params, ids, partition_strategy=None, name=None, validate_indices=None, max_norm=None, return_trainable=False
):
    """TFRA's `embedding_lookup`: rows of `ids` (any shape) -> ids.shape + [dim].

    Duplicate ids are summed in the gradient (TFRA's plain lookup is last-writer-wins on duplicates). With
    return_trainable=True returns `(values, params)`: the embedding stands in for TFRA's TrainableWrapper.
    """
    del partition_strategy, validate_indices
    values = _lookup.embedding_lookup(params, ids, name=name, max_norm=max_norm, is_training=_is_training())
    return _with_trainable(values, params, return_trainable)


def embedding_lookup_unique(
    params, ids, partition_strategy=None, name=None, validate_indices=None, max_norm=None, return_trainable=False
):
    """TFRA's `embedding_lookup_unique`: the same as `embedding_lookup` (which always deduplicates here)."""
    return embedding_lookup(params, ids, partition_strategy, name, validate_indices, max_norm, return_trainable)


def embedding_lookup_sparse(
    params,
    sp_ids,
    sp_weights,
    partition_strategy=None,
    name="embedding_lookup_sparse",
    combiner="mean",
    max_norm=None,
    return_trainable=False,
):
    """TFRA's `embedding_lookup_sparse` (combiners mean, sqrtn, sum)."""
    values = _lookup.embedding_lookup_sparse(
        params,
        sp_ids,
        sp_weights,
        partition_strategy=partition_strategy,
        name=name,
        combiner=combiner,
        max_norm=max_norm,
        is_training=_is_training(),
    )
    return _with_trainable(values, params, return_trainable)


def safe_embedding_lookup_sparse(
    embedding_weights,
    sparse_ids,
    sparse_weights=None,
    combiner="mean",
    default_id=None,
    name="safe_embedding_lookup_sparse",
    partition_strategy=None,
    max_norm=None,
    return_trainable=False,
):
    """TFRA's `safe_embedding_lookup_sparse`. Every int64 id is a key (negative ones too)."""
    values = _lookup.safe_embedding_lookup_sparse(
        embedding_weights,
        sparse_ids,
        sparse_weights=sparse_weights,
        combiner=combiner,
        default_id=default_id,
        name=name,
        partition_strategy=partition_strategy,
        max_norm=max_norm,
        is_training=_is_training(),
    )
    return _with_trainable(values, embedding_weights, return_trainable)


def DynamicEmbeddingOptimizer(self, bp_v2=False, synchronous=False, **kwargs):  # pylint: disable=invalid-name
    """TFRA's optimizer wrapper: returns the optimizer itself, which trains dynamic embeddings as it is.

    Args:
      self: a `tf.compat.v1.train` optimizer (see `tf_ext.embedding.supported_optimizers()`).
      bp_v2: must be False.
      synchronous: must be False.
      **kwargs: none accepted.

    Returns:
      `self`.

    Raises:
      TypeError: not a supported optimizer, or unknown keyword arguments.
      ValueError: bp_v2 or synchronous set.
    """
    if kwargs:
        raise TypeError("DynamicEmbeddingOptimizer got unexpected arguments %s" % sorted(kwargs))
    if bp_v2:
        raise ValueError(
            "DynamicEmbeddingOptimizer(bp_v2=True): not needed, rows are updated in place per key. " "Remove bp_v2."
        )
    if synchronous:
        raise ValueError(
            "DynamicEmbeddingOptimizer(synchronous=True) (TFRA's Horovod allreduce of dense "
            "gradients) is not supported: tensorflow_ext trains in one process or on parameter "
            "servers (replica_device_setter). Remove synchronous."
        )
    if not isinstance(self, tf.compat.v1.train.Optimizer):
        raise TypeError(
            "DynamicEmbeddingOptimizer needs a tf.compat.v1.train optimizer (e.g. AdamOptimizer); got %s. Keras "
            "optimizers do not train dynamic embeddings." % type(self).__name__
        )
    _optimizers.handler_for(self)  # a TypeError naming the supported optimizers
    return self


_NO_REDIS = "no Redis backend: keep the rows that do not fit in memory on local disk with storage=tf_ext.TieredStorage."
_INSTEAD = {
    "TrainableWrapper": "tensorflow_ext has no TrainableWrapper: the embedding's shards are trainable variables "
    "that stock optimizers train directly (see tensorflow_ext.tfra docs).",
    "DEResourceVariable": "tensorflow_ext has no shadow variables: lookups read the table directly.",
    "shadow_ops": "tensorflow_ext has no shadow variables: lookups read the table directly.",
    "trainable_wrapper_filter": "tensorflow_ext has no TrainableWrapper to filter: "
    "tf_ext.embedding.dense_variables(var_list) lists the dense variables.",
    "CuckooHashTable": "tensorflow_ext has one table engine: tf_ext.HashTable (or get_variable for embeddings).",
    "CuckooHashTableConfig": "tensorflow_ext has one table engine: remove kv_creator.",
    "CuckooHashTableCreator": "tensorflow_ext has one table engine: remove kv_creator.",
    "HkvHashTable": "tensorflow_ext's table runs on the CPU; remove kv_creator.",
    "HkvHashTableConfig": "tensorflow_ext's table runs on the CPU; remove kv_creator.",
    "HkvHashTableCreator": "tensorflow_ext's table runs on the CPU; remove kv_creator.",
    "HkvEvictStrategy": "use tf_ext.embedding.restrict / EvictionHook for eviction.",
    "RedisTable": _NO_REDIS,
    "RedisTableConfig": _NO_REDIS,
    "RedisTableCreator": _NO_REDIS,
    "FileSystemSaver": "checkpoints go through tf.compat.v1.train.Saver / Estimator (atomic, resharding on "
    "restore); remove the saver argument.",
    "RestrictPolicy": "use TimestampRestrictPolicy or FrequencyRestrictPolicy (or tf_ext.embedding.restrict).",
    "keras": "tensorflow_ext supports TF1 graph mode (Estimator, Session), not Keras layers.",
    "DistributedVariableWrapper": "tf.distribute strategies are not supported; use parameter servers "
    "(replica_device_setter).",
    "train": "the tfra.train hooks are not needed: Saver/Estimator checkpoint dynamic embeddings.",
    "math": "use tf.math / tf.sparse ops on the looked-up rows.",
    "data_flow": "use tf.dynamic_partition / tf.dynamic_stitch.",
    "KVCreator": "tensorflow_ext has one table engine, so there is no KV creator to subclass or pass: remove "
    "kv_creator (init_size sizes the table).",
    "create_slots": "not needed: a stock tf.compat.v1.train optimizer creates a dynamic embedding's slots itself, in "
    "the embedding's table row; optimizer.get_slot(shard, name) and emb.slot_values(optimizer, name, ids) read them. "
    "Remove the call.",
    "patch_on_tf": "not needed: `import tensorflow_ext` sets up what TensorFlow needs for dynamic embeddings "
    "(optimizers, Saver, Estimator, replica_device_setter). Remove the call.",
    "patch_on_tf_save_restore": "not needed: tf.compat.v1.train.Saver and Estimator checkpoints save and restore "
    "dynamic embeddings as they are. Remove the call.",
    "ShadowVariable": "tensorflow_ext has no shadow variables (TFRA's tf.function / Keras path): in TF1 graph mode "
    "embedding_lookup reads the table directly and stock optimizers train it.",
    "embedding_variable": "TFRA's EmbeddingVariable maps to a dynamic embedding: "
    "tf_ext.get_dynamic_embedding(name, dim, ...) (or tensorflow_ext.tfra.get_variable) trained by stock "
    "tf.compat.v1.train optimizers; steps_to_live is tf_ext.embedding.EvictionPolicy(steps_to_live=...), a "
    "frequency filter tf_ext.embedding.CountAdmission(min_count) (docs/embedding.md).",
    "DEHvdSaver": "Horovod jobs save through tensorflow_ext.horovod: with an Estimator, tfe_hvd.run_config + "
    "tfe_hvd.training_hooks (rank 0 writes the checkpoint, every rank's keys included); with a Session, rank 0's "
    "tf.compat.v1.train.Saver while the other ranks run tfe_hvd.checkpoint.gather_op() (docs/distributed.md).",
    "DECheckpoint": "use tf.compat.v1.train.Saver / Estimator checkpoints, which save dynamic embeddings (TF2 object "
    "checkpoints are not supported: TF1 graph mode only).",
    "Checkpoint": "use tf.compat.v1.train.Saver / Estimator checkpoints, which save dynamic embeddings (TF2 object "
    "checkpoints are not supported: TF1 graph mode only).",
    "DEHvdModelCheckpoint": "tensorflow_ext supports TF1 graph mode (Estimator, Session), not Keras callbacks; Horovod "
    "checkpoints: tfe_hvd.run_config + tfe_hvd.training_hooks (docs/distributed.md).",
    "layers": "tensorflow_ext supports TF1 graph mode (Estimator, Session), not Keras layers: use "
    "get_variable + embedding_lookup.",
    "callbacks": "tensorflow_ext supports TF1 graph mode (Estimator, Session), not Keras callbacks.",
    "models": "tensorflow_ext supports TF1 graph mode (Estimator, Session), not Keras models; export with "
    "Estimator.export_saved_model or tf.compat.v1.saved_model (docs/serving.md).",
    "warm_start": "use tf.compat.v1.train.warm_start or Estimator's warm_start_from, which warm-start dynamic "
    "embeddings (tf_ext.embedding.warm_start_from_checkpoint to change the dim; docs/embedding.md).",
    "WarmStartHook": "use tf.compat.v1.train.warm_start or Estimator's warm_start_from, which warm-start dynamic "
    "embeddings (tf_ext.embedding.warm_start_from_checkpoint to change the dim; docs/embedding.md).",
    "ragged_embedding_ops": "look up a tf.RaggedTensor's flat_values with embedding_lookup (and rebuild it with "
    "tf.RaggedTensor.from_row_splits), or pass ragged.to_sparse() to embedding_lookup_sparse.",
    "register_all": "not needed: `import tensorflow_ext` registers tensorflow_ext's ops and kernels.",
}


# For `tensorflow_ext.<TFRA name>`: the native API's answer (this module provides these names itself).
_TOP_LEVEL_INSTEAD = dict(
    _INSTEAD,
    **{
        "get_variable": "use tf_ext.get_dynamic_embedding(name, dim, key_dtype=..., ...) (dim second), or "
        "tensorflow_ext.tfra.get_variable, which keeps TFRA's argument order.",
        "embedding_lookup_unique": "tf_ext.embedding_lookup always deduplicates ids; use it.",
        "enable_inference_mode": "tensorflow_ext needs no model mode: a graph in which no optimizer is applied to an "
        "embedding (Estimator eval/predict, an export for serving) only reads it and never "
        "inserts keys; tf_ext.embedding_lookup(..., is_training=False) forces that per lookup "
        "(tensorflow_ext.tfra.enable_inference_mode exists for ported code).",
        "enable_train_mode": "tensorflow_ext needs no model mode: a lookup built with is_training=None (the default) "
        "inserts new keys only when an optimizer applies a gradient that flows through it (minimize / "
        "apply_gradients in the same graph), so an eval or export lookup in a training graph stays "
        "find-only; tf_ext.embedding_lookup(..., is_training=True) forces inserting for one lookup.",
        "get_model_mode": "tensorflow_ext needs no model mode (see tf_ext.embedding_lookup's is_training).",
        "ModelMode": "tensorflow_ext needs no model mode (see tf_ext.embedding_lookup's is_training).",
        "Variable": "tf_ext.DynamicEmbedding (created by tf_ext.get_dynamic_embedding).",
        "restrict_policy": "tf_ext.embedding.restrict(emb, num_reserved, policy='timestamp'|'frequency').",
    },
)


def _not_provided(module, name):
    """The error for `module.name`, a TFRA name this module does not provide (AttributeError otherwise)."""
    if name in _INSTEAD:
        return _errors.NotProvidedError(
            "%s.%s is not provided: %s" % (module, name, _INSTEAD[name]), name=name, instead=_INSTEAD[name]
        )
    return AttributeError("module %r has no attribute %r" % (module, name))


def __getattr__(name):
    raise _not_provided(__name__, name)


# ---- TFRA's Variable attributes on a DynamicEmbedding ----------------------------------------------------------------
# DynamicEmbedding has TFRA's size, remove and export itself; for the names it does not have, the package sends
# `emb.<name>` to `embedding_attribute` (tensorflow_ext/__init__.py registers it with
# `variable.resolve_other_attributes_with`).


def _upsert(emb, keys, values, name=None):
    """TFRA's name for `emb.insert`: inserts/overwrites the embeddings of keys (ids of any shape, n elements;
    values float32 `[n, dim]` or `keys.shape + [dim]`); returns the insert op."""
    return emb.insert(keys, values, name=name or "upsert")


def _lookup_rows(emb, keys, return_exists=False, name=None):
    """Reads the embeddings of keys without inserting any (TFRA's `Variable.lookup`).

    Missing keys read the initializer's constant (zeros for random initializers). Not differentiable: train through
    `tf_ext.embedding_lookup`.

    Args:
      keys: ids of any shape (key dtype).
      return_exists: also return a bool tensor of keys' shape, True where the key is in the table.
      name: optional name scope.

    Returns:
      float32 `keys.shape + [dim]`, and the bool tensor if return_exists.
    """
    with tf.name_scope(name or "lookup"):
        keys = emb.to_keys(keys)
        parts, positions = emb.partition.split(tf.reshape(keys, [-1]))
        rows, found = [], []
        missing_row = tf.constant(emb.initializer.missing_row(emb.dim), tf.float32)
        for shard, part in zip(emb.shards, parts):
            with tf.compat.v1.colocate_with(shard.handle):
                v, f = shard.table.find(part, missing_row)
            rows.append(v)
            found.append(f)
        if positions is None:
            values, exists = rows[0], found[0]
        else:
            values, exists = tf.dynamic_stitch(positions, rows), tf.dynamic_stitch(positions, found)
        shape = tf.shape(keys)
        values = tf.reshape(values, tf.concat([shape, [emb.dim]], 0))
        if return_exists:
            return values, tf.reshape(exists, shape)
        return values


def _restrict(emb, num_reserved, trigger=None, policy=None, name=None):
    """Keeps at most `num_reserved` keys (TFRA's `Variable.restrict`; see `tf_ext.embedding.restrict`): above
    `trigger` keys (default num_reserved), by `policy` ("timestamp" or "frequency"; default: the one given to
    `get_variable(restrict_policy=...)`, else "timestamp"). Returns an int64 scalar tensor: the keys removed."""
    emb.check_writable("restrict")
    policy = policy or _restrict_policies.get(emb) or "timestamp"
    return _eviction.restrict(emb, num_reserved, trigger=trigger, policy=policy, name=name)


def _clear(emb, name=None):
    """Removes every key of the embedding, with its row and optimizer slots (TFRA's `Variable.clear`).

    Admission counts and eviction state are kept. Returns the op (a group of one clear per shard).
    """
    emb.check_writable("clear")
    with tf.name_scope(name or (emb.name.split("/")[-1] + "_clear")):
        ops = []
        for shard in emb.shards:
            with tf.compat.v1.colocate_with(shard.handle):
                ops.append(shard.table.clear())
        return tf.group(*ops)


def _embedding_lookup_method(emb, ids, name=None, max_norm=None):
    """TFRA's `Variable.embedding_lookup`: `(values, emb)` (the embedding stands in for the TrainableWrapper)."""
    return embedding_lookup(
        emb, ids, name=(name + "/embedding_lookup") if name else None, max_norm=max_norm, return_trainable=True
    )


def _restrict_policy(emb):
    # TFRA's Variable.restrict_policy: None for one made without a policy; the native API's embeddings have none.
    if emb not in _restrict_policies:
        raise AttributeError("'DynamicEmbedding' object has no attribute 'restrict_policy'")
    return _restrict_policies[emb]


def _devices(emb):
    # The device each shard was placed on, as given (get_variable's devices: one shard per device), else the table's.
    given = emb.config.devices
    return [given[i % len(given)] if given else shard.device for i, shard in enumerate(emb.shards)]


# TFRA's Variable methods: emb.<name>(...) calls the function with the embedding first.
_EMBEDDING_METHODS = {
    "upsert": _upsert,
    "lookup": _lookup_rows,
    "restrict": _restrict,
    "clear": _clear,
    "embedding_lookup": _embedding_lookup_method,
}

_EMBEDDING_EQUIVALENTS = {
    "restrict_policy": _restrict_policy,
    "shard_num": lambda emb: emb.num_shards,
    "devices": _devices,
    "init_size": lambda emb: emb.config.initial_capacity,
    "partition_fn": lambda emb: default_partition_fn,
}

_SAVE_INSTEAD = (
    "tensorflow_ext saves dynamic embeddings with tf.compat.v1.train.Saver / Estimator checkpoints (atomic; restore "
    "re-partitions keys for another number of shards or Horovod ranks); to move keys and rows yourself, "
    "emb.export() and emb.upsert(keys, values)."
)

_EMBEDDING_INSTEAD = {
    "tables": "the embedding's tables are its shards, emb.shards (one DynamicEmbeddingShard per device); read and "
    "write keys through the embedding: lookup, upsert, remove, size(index), export().",
    "accum": "tensorflow_ext's optimizers update each key's row in place in one kernel (what accum serves for "
    "TFRA's bp_v2), so there is no delta to accumulate; to write rows yourself use emb.upsert(keys, values).",
    "get_slot_variables": "optimizer slots live in the embedding's table rows: optimizer.get_slot(shard, name) for "
    "shard in emb.shards returns a DynamicEmbeddingSlot view of a slot's columns, emb.slot_names(optimizer) lists "
    "the slots, emb.slot_values(optimizer, name, ids) reads them.",
    "save_to_file_system": _SAVE_INSTEAD,
    "load_from_file_system": _SAVE_INSTEAD,
    "load_from_file_system_with_restore_function": _SAVE_INSTEAD,
    "export_keys_and_scores": "TFRA's HKV tables only: emb.export() returns every key with its row, versions (the "
    "step of its last update) and frequencies (ExportedEmbedding(keys, values, slots, versions, frequencies)).",
    "get_trainable_by_name": "tensorflow_ext supports TF1 graph mode, where there are no shadow variables: "
    "optimizers train the embedding's shards (tf.compat.v1.trainable_variables()) directly.",
    "trainable_store": "tensorflow_ext supports TF1 graph mode, where there are no TrainableWrappers to store: "
    "optimizers train the embedding's shards (tf.compat.v1.trainable_variables()) directly.",
    "kv_creator": "tensorflow_ext has one table engine (a concurrent CPU hash table that grows on demand).",
    "size_ops": "emb.size(index) returns the size of shard `index` (emb.size() the total).",
}


def embedding_attribute(emb, name):
    """`emb.<name>` for a TFRA `Variable` attribute that `DynamicEmbedding` has no method for: the equivalent, or a
    NotProvidedError saying what to use; any other name is a plain AttributeError."""
    if name in _EMBEDDING_METHODS:
        return functools.partial(_EMBEDDING_METHODS[name], emb)
    if name in _EMBEDDING_EQUIVALENTS:
        return _EMBEDDING_EQUIVALENTS[name](emb)
    if name in _EMBEDDING_INSTEAD:
        raise _errors.NotProvidedError(
            "DynamicEmbedding.%s (TFRA's Variable.%s) is not provided: %s" % (name, name, _EMBEDDING_INSTEAD[name]),
            name=name,
            instead=_EMBEDDING_INSTEAD[name],
        )
    raise AttributeError("'DynamicEmbedding' object has no attribute %r" % name)
