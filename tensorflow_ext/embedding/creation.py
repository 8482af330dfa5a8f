"""Creating dynamic embeddings: `get_dynamic_embedding` (variable-scope naming and reuse; the arguments are
checked by `EmbeddingConfig.from_arguments`), `get_dynamic_embeddings` (those of a graph), `dense_variables`,
`creation_hook`."""

import contextlib
import threading

import tensorflow as tf

from tensorflow_ext import tf_compat
from tensorflow_ext.embedding import config as config_lib
from tensorflow_ext.embedding import variable as var_lib
from tensorflow_ext.embedding.state import get_dynamic_embeddings
from tensorflow_ext.tf_compat import internals

__all__ = ["creation_hook", "dense_variables", "get_dynamic_embedding", "get_dynamic_embeddings"]

_hooks = threading.local()


@contextlib.contextmanager
def creation_hook(hook):
    """Inside, the config of every embedding that `get_dynamic_embedding` returns first goes through `hook`.

    This is how a setting reaches embeddings that code the user does not write creates, e.g. the tables of
    feature columns: `tensorflow_ext.horovod.parallelism_scope("model")` makes them model-parallel. A new
    embedding is built with the config the hooks return; a reused one cannot change (a hook that returns another
    config for it is a ValueError), so a hook may only check it. Hooks nest; the innermost runs last.

    Args:
      hook: callable(EmbeddingConfig) -> EmbeddingConfig (the same one, or a `dataclasses.replace`d one); it may
        raise to refuse the embedding.

    Yields:
      None.
    """
    stack = getattr(_hooks, "stack", ())
    _hooks.stack = stack + (hook,)
    try:
        yield
    finally:
        _hooks.stack = stack


def _through_hooks(config):
    # The optimizer processor patched again if a library imported since replaced it (TFRA does at its import):
    # a no-op while ours is in place.
    tf_compat.reinstall_if_displaced("optimizer_get_processor")
    for hook in getattr(_hooks, "stack", ()):
        config = hook(config)
    return config


def dense_variables(var_list=None):
    """The variables of `var_list` that are not dynamic embedding shards.

    For TF code that needs real `tf.Variable`s, e.g.
    `ema.apply(tf_ext.embedding.dense_variables(tf.compat.v1.trainable_variables()))`.

    Args:
      var_list: a list of variables and shards (default:
        `tf.compat.v1.trainable_variables()`).

    Returns:
      list, in the input order.
    """
    if var_list is None:
        var_list = tf.compat.v1.trainable_variables()
    return [v for v in var_list if not isinstance(v, var_lib.DynamicEmbeddingShard)]


def _describe(value):
    """A dtype as `tf.<name>`, other values as repr (for reuse errors)."""
    return "tf." + value.name if isinstance(value, tf.DType) else repr(value)


def _find(graph, full_name):
    for emb in get_dynamic_embeddings(graph):
        if emb.name == full_name:
            return emb
    return None


def get_dynamic_embedding(
    name,
    dim,
    key_dtype=tf.int64,
    value_dtype=None,
    initializer=None,
    num_shards=None,
    devices=None,
    partitioner=None,
    trainable=True,
    initial_capacity=0,
    preallocate=False,
    reuse=None,
    admission=None,
    eviction=None,
    slot_dtype=None,
    rounding=None,
    storage=None,
    **tfra_kwargs,
):
    """Gets an existing dynamic embedding or creates a new one (variable_scope rules).

    The full name is the current variable scope's name + "/" + `name`. As with
    `tf.compat.v1.get_variable`, a new embedding is created unless the scope
    reuses (`reuse=True` requires it to exist, `tf.compat.v1.AUTO_REUSE`
    creates or reuses).

    Keys are partitioned over `num_shards` tables by `HashKey(key) % num_shards`;
    shard i is placed on `devices[i % len(devices)]`, or by the active device
    functions (so `tf.compat.v1.train.replica_device_setter` puts the tables on
    parameter servers, round robin).

    Args:
      name: the embedding's name (no "/"-free requirement; scoped like a
        variable).
      dim: int >= 1, the embedding dimension.
      key_dtype: tf.int64 (default), tf.int32, or tf.string. String ids are
        mapped to int64 keys by a 64-bit fingerprint (`string_to_key`).
      value_dtype: how the embedding columns are stored: tf.float32 (None, the
        default, for a new embedding), tf.bfloat16 or tf.float16 (half the
        bytes; rows are converted at the table's boundary, so lookups return
        float32 and optimizers compute in float32, their results rounded back;
        see docs/embedding.md, "Compact rows"). tf.int8 is a serving format
        (`tf_ext.serving.freeze_for_serving(value_dtype=tf.int8)`), a ValueError
        here.
      initializer: None (the variable scope's initializer, else
        truncated_normal(0, 1/sqrt(dim))), a python number (constant), any
        TF/Keras initializer, or a callable `init(shape, dtype)`. Every new key
        gets its own draw (see `initializers.py`).
      num_shards: number of tables (default 1, or len(devices)).
      devices: optional list of device strings for the shards (a list even for
        one device: `["/cpu:0"]`).
      partitioner: optional TF partitioner (e.g.
        `tf.compat.v1.fixed_size_partitioner(4)`): num_shards = its partition
        count along axis 0 for an `[initial_capacity, dim]` variable. Without
        initial_capacity, only a partitioner whose count does not depend on the
        size (such as fixed_size_partitioner) is accepted: a size-based one
        (`variable_axis_size_partitioner`, `min_max_variable_partitioner`) needs
        initial_capacity. Defaults to the variable scope's partitioner when
        neither num_shards nor devices is given.
      trainable: add the shards to `TRAINABLE_VARIABLES` (stock optimizers then
        train them through `minimize`).
      initial_capacity: expected number of keys (all shards), an int in
        [0, 2^40]; tables grow on demand (0: unknown).
      preallocate: allocate the memory of `initial_capacity` keys (hash index
        and rows, embedding and optimizer slots) when the tables are created, as
        a static embedding variable's is, instead of as keys arrive: a training
        step that inserts new keys then pays no page faults and no index growth
        for them (docs/benchmarks.md, ctr26). The memory counts in
        `memory_bytes()` from the start; past initial_capacity keys the tables
        grow on demand as usual.
      reuse: overrides the variable scope's reuse (True, False or AUTO_REUSE).
      admission: None (every key trains from its first lookup) or an admission policy,
        `tf_ext.embedding.CountAdmission(min_count)` or `BloomAdmission(min_count, ...)`:
        a key gets a row only at its min_count-th training lookup (see admission.py).
      eviction: None or a `tf_ext.embedding.EvictionPolicy` (time to live, minimum
        frequency, capacity, L2 norm; run every N steps in training and before
        saves, see eviction.py).
      slot_dtype: None (default): optimizer slot columns are float32;
        `value_dtype`: they are stored as the values are. Anything else is a
        ValueError.
      rounding: how writes to half-precision rows round: "stochastic"
        (unbiased, deterministic per key, step and column, so reruns are
        bit-identical) or "nearest"; None: the default
        (`tf_ext.embedding.config.DEFAULT_ROUNDING`). Float32 rows are not
        rounded: a rounding given for them is a ValueError.
      storage: None (default): every row in memory; or a
        `tf_ext.TieredStorage(memory_bytes, path, disk_bytes=None,
        policy="lru")`: at most `memory_bytes` of rows (with their slots and
        metadata) in memory in this process, the others in an on-disk store
        per shard under `path` (`<path>/<name>/shard_<i>_of_<n>`). Training is
        bit-identical to the in-memory embedding while no key falls off a
        capped disk tier (see docs/tiered_storage.md).
      **tfra_kwargs: TFRA's `get_variable` keywords, for code ported by
        renaming: `init_size` (= initial_capacity). The others of TFRA
        (kv_creator, restrict_policy, bp_v2, checkpoint, shared_name) raise a
        TypeError that says what to use (`tensorflow_ext.tfra.get_variable`
        takes them all).

    A reused embedding keeps what it was created with: its shards, devices,
    initializer and capacity are not compared with the arguments (nor is the
    variable scope's partitioner or initializer consulted), but the arguments
    passed are checked as for a new embedding, and a dim, key dtype, policy,
    value dtype, slot dtype, rounding or storage given must equal the
    embedding's.

    Returns:
      A `DynamicEmbedding`.

    Raises:
      ValueError: the embedding exists and the scope does not reuse, it does not
        exist and reuse=True, a reused embedding has another dim/key dtype,
        admission/eviction policy, row storage (value_dtype, slot_dtype,
        rounding) or storage, a creation hook would change a reused
        embedding (e.g. its Horovod parallelism), a dense variable of that name
        exists, dim <= 0, num_shards <= 0, or unsupported dtypes.
      TypeError: dim/num_shards not integers, bad initializer.
      RuntimeError: called in eager mode (TF1 graph mode is required).
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "get_dynamic_embedding needs TF1 graph mode: call "
            "tf.compat.v1.disable_v2_behavior() (or build inside a tf.Graph().as_default())"
        )
    from_init_size = "init_size" in tfra_kwargs
    if from_init_size:
        init_size = tfra_kwargs.pop("init_size")
        if initial_capacity:
            raise TypeError("get_dynamic_embedding: pass initial_capacity or TFRA's init_size, not both")
        initial_capacity = init_size
    for key in sorted(tfra_kwargs):
        if key in ("kv_creator", "restrict_policy", "bp_v2", "checkpoint", "shared_name"):
            raise TypeError(
                "get_dynamic_embedding does not take TFRA's %s=; tensorflow_ext.tfra.get_variable accepts TFRA's "
                "arguments and says what each maps to (docs/migrating_from_tfra.md)." % key
            )
        raise TypeError("get_dynamic_embedding() got an unexpected keyword argument %r" % key)
    scope = tf.compat.v1.get_variable_scope()
    graph = tf.compat.v1.get_default_graph()
    existing = _find(graph, config_lib.scoped_name(scope, name)) if isinstance(name, str) and name else None
    if value_dtype is None and existing is not None:
        # A slot_dtype or rounding given on reuse is checked against the embedding's own storage.
        value_dtype = existing.value_dtype
    config = config_lib.EmbeddingConfig.from_arguments(
        name,
        dim,
        key_dtype,
        value_dtype,
        initializer,
        num_shards,
        devices,
        partitioner,
        trainable,
        initial_capacity,
        preallocate,
        admission,
        eviction,
        scope,
        capacity_from="init_size" if from_init_size else "initial_capacity",
        scope_defaults=existing is None,
        slot_dtype=slot_dtype,
        rounding=rounding,
        storage=storage,
    )
    if reuse is None:
        reuse = scope.reuse
    full_name = config.name
    if existing is not None:
        if reuse is False or reuse is None:
            raise ValueError(
                "Dynamic embedding %s already exists, disallowed. Did you mean to set reuse=True or "
                "reuse=tf.compat.v1.AUTO_REUSE in VarScope?" % full_name
            )
        if existing.dim != config.dim:
            raise ValueError(
                "Trying to share dynamic embedding %s, but specified dim %d and found dim %d"
                % (full_name, config.dim, existing.dim)
            )
        if existing.key_dtype != config.key_dtype:
            raise ValueError(
                "Trying to share dynamic embedding %s, but specified key_dtype %s and found %s"
                % (full_name, config.key_dtype.name, existing.key_dtype.name)
            )
        # A policy given again must equal the embedding's (policies are values); one left out is not compared.
        if admission is not None and existing.config.admission != config.admission:
            raise ValueError(
                "Trying to share dynamic embedding %s with admission=%r, but it has %r"
                % (full_name, admission, existing.admission)
            )
        if eviction is not None and existing.config.eviction != config.eviction:
            raise ValueError(
                "Trying to share dynamic embedding %s with eviction=%r, but it has %r"
                % (full_name, eviction, existing.eviction)
            )
        # The row storage given again must be the embedding's; what was left out is not compared.
        for field, given in (
            ("value_dtype", value_dtype),
            ("slot_dtype", slot_dtype),
            ("rounding", rounding),
            ("storage", storage),
        ):
            if given is not None and getattr(existing.config, field) != getattr(config, field):
                raise ValueError(
                    "Trying to share dynamic embedding %s with %s=%s, but it has %s"
                    % (full_name, field, _describe(getattr(config, field)), _describe(getattr(existing.config, field)))
                )
        hooked = _through_hooks(existing.config)
        if hooked != existing.config:
            raise ValueError(
                "Trying to share dynamic embedding %s with distribution %r, but it has %r (a creation hook, such as "
                "tensorflow_ext.horovod's parallelism, cannot change an embedding that exists)"
                % (full_name, hooked.distribution, existing.config.distribution)
            )
        return existing
    if reuse is True:
        raise ValueError(
            "Dynamic embedding %s does not exist, or was not created with tf_ext.get_dynamic_embedding(). "
            "Did you mean to set reuse=tf.compat.v1.AUTO_REUSE in VarScope?" % full_name
        )
    if internals.variable_store_has(full_name):
        raise ValueError("Cannot create dynamic embedding %s: a variable of that name exists" % full_name)

    return var_lib.DynamicEmbedding(_through_hooks(config))
