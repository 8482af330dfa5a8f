"""Creating dynamic embeddings: `get_dynamic_embedding` (variable-scope naming and reuse, argument checks),
`get_dynamic_embeddings` (those of a graph), `dense_variables`, `creation_hook`."""

import contextlib
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import variable_scope as vs

from tensorflow_ext.embedding import admission as admission_lib
from tensorflow_ext.embedding import eviction as eviction_lib
from tensorflow_ext.embedding import initializers as init_lib
from tensorflow_ext.embedding import variable as var_lib
from tensorflow_ext import tf_compat
from tensorflow_ext.table import table_ops

__all__ = ["creation_hook", "dense_variables", "get_dynamic_embedding", "get_dynamic_embeddings"]

_hooks = threading.local()


@contextlib.contextmanager
def creation_hook(hook):
    """Inside, every embedding that `get_dynamic_embedding` returns (new or reused) first goes through `hook`.

    This is how a setting reaches embeddings that code the user does not write creates, e.g. the tables of
    feature columns: `tensorflow_ext.horovod.parallelism_scope("model")` makes them model-parallel. Hooks nest;
    the innermost runs last.

    Args:
      hook: callable(DynamicEmbedding) -> None; it may raise to refuse the embedding.

    Yields:
      None.
    """
    stack = getattr(_hooks, "stack", ())
    _hooks.stack = stack + (hook,)
    try:
        yield
    finally:
        _hooks.stack = stack


def _after_creation(emb):
    # The optimizer processor patched again if a library imported since replaced it (TFRA does at its import):
    # a no-op while ours is in place.
    tf_compat.reinstall_if_displaced("optimizer_get_processor")
    for hook in getattr(_hooks, "stack", ()):
        hook(emb)
    return emb


def get_dynamic_embeddings(graph=None):
    """The dynamic embeddings of a graph.

    Args:
      graph: a `tf.Graph` (default: the default graph).

    Returns:
      list of `DynamicEmbedding`, in creation order.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    seen = []
    for shard in graph.get_collection(var_lib.GraphKeys.DYNAMIC_EMBEDDINGS):
        if isinstance(shard, var_lib.DynamicEmbeddingShard) and shard.embedding not in seen:
            seen.append(shard.embedding)
    return seen


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


def _find(graph, full_name):
    for emb in get_dynamic_embeddings(graph):
        if emb.name == full_name:
            return emb
    return None


def _check_int(name, value, lo, hi=None):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError("%s must be an int, got %r" % (name, value))
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        raise ValueError("%s must be in [%d, %s], got %d" % (name, lo, hi if hi is not None else "inf", value))
    return value


def _same_policy(have, given):
    """An admission or eviction policy given again for a reused embedding: equal by value (same type and
    arguments), not only the same object."""
    if have is given:
        return True
    if have is None or type(have) is not type(given):
        return False
    if type(given).__eq__ is not object.__eq__:
        return bool(have == given)
    return vars(have) == vars(given)


def _check_devices(name, devices):
    """The shards' devices: a non-empty list (or tuple) of device strings, `tf.DeviceSpec`s or device functions."""
    if isinstance(devices, (str, bytes, tf.DeviceSpec)) or callable(devices):
        raise TypeError(
            "devices of dynamic embedding %r must be a list of devices (one per shard, reused round robin), got "
            "%r: pass [%r] for one device" % (name, devices, devices)
        )
    try:
        devices = list(devices)
    except TypeError:
        raise TypeError(
            "devices of dynamic embedding %r must be a list of device strings, got %r" % (name, devices)
        ) from None
    if not devices:
        raise ValueError("devices of dynamic embedding %r must be a non-empty list or None" % name)
    for device in devices:
        if isinstance(device, tf.DeviceSpec) or callable(device):
            continue
        if not isinstance(device, str):
            raise TypeError(
                "devices of dynamic embedding %r must be device strings such as '/job:ps/task:0' or '/cpu:0', got "
                "%r in %r" % (name, device, devices)
            )
        try:
            tf.DeviceSpec.from_string(device)
        except ValueError as e:
            raise ValueError(
                "devices of dynamic embedding %r: %r is not a device string (%s); use TensorFlow's device names, "
                "e.g. '/job:ps/task:0', '/cpu:0' or '/device:GPU:0'" % (name, device, e)
            ) from None
    return devices


def _shards_from_partitioner(name, partitioner, initial_capacity, dim, value_dtype, from_scope=False):
    """num_shards from a TF partitioner: its partition count along axis 0 for an [initial_capacity, dim] variable
    (the table's expected size), or, without initial_capacity, for any size when its count does not depend on the
    size (as `fixed_size_partitioner`'s does not). `from_scope`: the variable scope's partitioner (errors say so:
    the caller passed none)."""
    what = "the variable scope's partitioner (%r)" % (partitioner,) if from_scope else "partitioner"

    def ask(rows):
        parts = partitioner(shape=tf.TensorShape([rows, dim]), dtype=value_dtype)
        try:
            return int(parts[0])
        except (TypeError, ValueError, IndexError):
            raise TypeError(
                "%s of dynamic embedding %r must return a list of partition counts per axis, got %r"
                % (what, name, parts)
            ) from None

    if initial_capacity > 0:
        num_shards = ask(initial_capacity)
    else:
        small, large = ask(var_lib.MAX_SHARDS), ask(var_lib.MAX_CAPACITY)
        if small != large:
            raise ValueError(
                "%s of dynamic embedding %r gives a shard count that depends on the table's size (%d shards "
                "for %d keys, %d for %d), and a dynamic embedding has no fixed size: pass initial_capacity (the "
                "expected number of keys; the partitioner is then asked about an [initial_capacity, dim] table) or "
                "num_shards" % (what, name, small, var_lib.MAX_SHARDS, large, var_lib.MAX_CAPACITY)
            )
        num_shards = small
    if not 1 <= num_shards <= var_lib.MAX_SHARDS:
        raise ValueError(
            "%s of dynamic embedding %r gives %d shards (for a [%d, %d] table); a dynamic embedding needs 1 "
            "to %d: pass num_shards instead"
            % (what, name, num_shards, initial_capacity or var_lib.MAX_SHARDS, dim, var_lib.MAX_SHARDS)
        )
    return num_shards


def get_dynamic_embedding(
    name,
    dim,
    key_dtype=tf.int64,
    value_dtype=tf.float32,
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
      value_dtype: tf.float32 (the only supported value type).
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
      **tfra_kwargs: TFRA's `get_variable` keywords, for code ported by
        renaming: `init_size` (= initial_capacity). The others of TFRA
        (kv_creator, restrict_policy, bp_v2, checkpoint, shared_name) raise a
        TypeError that says what to use (`tensorflow_ext.tfra.get_variable`
        takes them all).

    Returns:
      A `DynamicEmbedding`.

    Raises:
      ValueError: the embedding exists and the scope does not reuse, it does not
        exist and reuse=True, a reused embedding has another dim/key dtype, a
        dense variable of that name exists, dim <= 0, num_shards <= 0, or
        unsupported dtypes.
      TypeError: dim/num_shards not integers, bad initializer.
      RuntimeError: called in eager mode (TF1 graph mode is required).
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "get_dynamic_embedding needs TF1 graph mode: call "
            "tf.compat.v1.disable_v2_behavior() (or build inside a tf.Graph().as_default())"
        )
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string, got %r" % (name,))
    if isinstance(dim, tf.DType) or isinstance(key_dtype, (int, np.integer)) and not isinstance(key_dtype, bool):
        raise TypeError(
            "get_dynamic_embedding(name, dim, key_dtype, value_dtype, ...) takes dim second; got dim=%r, key_dtype=%r. "
            "This looks like TFRA's get_variable(name, key_dtype, value_dtype, dim) order: pass keywords "
            "(get_dynamic_embedding(name, dim=..., key_dtype=...)) or use tensorflow_ext.tfra.get_variable, which "
            "keeps TFRA's order." % (dim, key_dtype)
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
    try:
        dim = _check_int("dim of dynamic embedding %r" % name, dim, 1, 1 << 20)
    except ValueError as e:
        raise ValueError(str(e)) from None
    key_dtype = tf.as_dtype(key_dtype)
    if key_dtype not in (tf.int64, tf.int32, tf.string):
        raise ValueError(
            "key_dtype of dynamic embedding %r must be tf.int64, tf.int32 or tf.string, got %s" % (name, key_dtype.name)
        )
    value_dtype = tf.as_dtype(value_dtype)
    if value_dtype != tf.float32:
        raise ValueError("value_dtype of dynamic embedding %r must be tf.float32, got %s" % (name, value_dtype.name))
    what = "initial_capacity%s of dynamic embedding %r" % (" (TFRA's init_size)" if from_init_size else "", name)
    if isinstance(initial_capacity, (bool, np.bool_)) or not isinstance(initial_capacity, (int, np.integer)):
        raise TypeError(
            "%s must be an int (the expected number of keys, 0 if unknown), got %r" % (what, initial_capacity)
        )
    if not 0 <= initial_capacity <= var_lib.MAX_CAPACITY:
        raise ValueError(
            "%s must be in [0, 2^40] (the expected number of keys over all shards, a sizing hint: tables grow on "
            "demand; pass 0 if unknown), got %d" % (what, initial_capacity)
        )
    initial_capacity = int(initial_capacity)
    preallocate = table_ops.check_preallocate(preallocate, initial_capacity, "dynamic embedding %r" % name)

    scope = tf.compat.v1.get_variable_scope()
    full_name = scope.name + "/" + name if scope.name else name
    if reuse is None:
        reuse = scope.reuse
    graph = tf.compat.v1.get_default_graph()
    existing = _find(graph, full_name)
    if existing is not None:
        if reuse is False or reuse is None:
            raise ValueError(
                "Dynamic embedding %s already exists, disallowed. Did you mean to set reuse=True or "
                "reuse=tf.compat.v1.AUTO_REUSE in VarScope?" % full_name
            )
        if existing.dim != dim:
            raise ValueError(
                "Trying to share dynamic embedding %s, but specified dim %d and found dim %d"
                % (full_name, dim, existing.dim)
            )
        if existing.key_dtype != key_dtype:
            raise ValueError(
                "Trying to share dynamic embedding %s, but specified key_dtype %s and found %s"
                % (full_name, key_dtype.name, existing.key_dtype.name)
            )
        if admission is not None and not _same_policy(existing.admission, admission):
            raise ValueError(
                "Trying to share dynamic embedding %s with admission=%r, but it has %r"
                % (full_name, admission, existing.admission)
            )
        if eviction is not None and not _same_policy(existing.eviction, eviction):
            raise ValueError(
                "Trying to share dynamic embedding %s with eviction=%r, but it has %r"
                % (full_name, eviction, existing.eviction)
            )
        return _after_creation(existing)
    if reuse is True:
        raise ValueError(
            "Dynamic embedding %s does not exist, or was not created with tf_ext.get_dynamic_embedding(). "
            "Did you mean to set reuse=tf.compat.v1.AUTO_REUSE in VarScope?" % full_name
        )
    store = vs._get_default_variable_store()  # pylint: disable=protected-access
    if full_name in getattr(store, "_vars", {}):
        raise ValueError("Cannot create dynamic embedding %s: a variable of that name exists" % full_name)

    if devices is not None:
        devices = _check_devices(name, devices)
    from_scope = num_shards is None and partitioner is None and devices is None and scope.partitioner is not None
    if from_scope:
        partitioner = scope.partitioner
    if num_shards is None:
        if partitioner is not None:
            num_shards = _shards_from_partitioner(name, partitioner, initial_capacity, dim, value_dtype, from_scope)
        elif devices:
            num_shards = len(devices)
        else:
            num_shards = 1
    num_shards = _check_int("num_shards of dynamic embedding %r" % name, num_shards, 1, var_lib.MAX_SHARDS)

    if initializer is None and scope.initializer is not None:
        initializer = scope.initializer
    spec = init_lib.resolve(initializer, dim)
    if admission is not None and not isinstance(admission, admission_lib.Admission):
        raise TypeError(
            "admission of dynamic embedding %r must be a tf_ext.embedding.CountAdmission or BloomAdmission, got %r"
            % (name, admission)
        )
    if eviction is not None and not isinstance(eviction, eviction_lib.EvictionPolicy):
        raise TypeError(
            "eviction of dynamic embedding %r must be a tf_ext.embedding.EvictionPolicy, got %r" % (name, eviction)
        )
    emb = var_lib.DynamicEmbedding(
        full_name, dim, key_dtype, value_dtype, spec, num_shards, devices, trainable, initial_capacity, preallocate
    )
    if admission is not None:
        emb.set_admission(admission)
    if eviction is not None:
        emb.set_eviction(eviction)
    return _after_creation(emb)
