"""The configuration of a dynamic embedding: one frozen value, checked once.

`EmbeddingConfig` is everything fixed when a `DynamicEmbedding` is created: its name, dimension, dtypes (how its
rows are stored and rounded), initializer, shards and their devices, capacity, preallocation, its admission and eviction policies, its
storage (in memory, or tiered over a disk store) and its distribution over processes.
`EmbeddingConfig.from_arguments` is the one place where `get_dynamic_embedding`'s arguments are checked and
completed (variable-scope defaults, a partitioner's shard count); every error names the embedding and says what
to pass. A config is a value: it cannot change after it is built, and two configs with equal fields are equal.

Invariants of a built config:

* `name` is the embedding's full (variable-scope prefixed) name; `1 <= dim <= MAX_DIM`;
* `key_dtype` is int64, int32 or string; `value_dtype` (how the embedding columns are stored) is one of
  `VALUE_DTYPES` (lookups return float32 whatever it is); `slot_dtype` is None or tf.float32 (float32 optimizer slots) or
  `value_dtype` (the slot columns stored the same way), and always None for float32 values; `rounding` is one of
  `refs.ROUNDINGS`, always "nearest" for float32 values (float32 rows are never rounded: a rounding given for them
  is an error);
* `initializer` is an `InitSpec` whose kernel seeds are pinned for `name` (a key's initial row depends only on the
  seeds and the key, whichever op inserts it);
* `1 <= num_shards <= MAX_SHARDS`; `devices` is None or a non-empty tuple (shard i on `devices[i % len]`);
* `0 <= initial_capacity <= MAX_CAPACITY`; `preallocate` only with `initial_capacity > 0`;
* `admission` is an admission policy (`ADMIT_EVERY_KEY` when none was given) and `eviction` an eviction policy
  (`NEVER_EVICT` when none was given): both are frozen values compared by value, so an equal policy built again
  for an embedding reused under `AUTO_REUSE` is the same policy;
* `distribution` is `SINGLE_PROCESS` (this process holds every key it trains) unless a creation hook gave another
  (`tensorflow_ext.horovod`'s model parallelism, see distribution.py);
* `storage` is None (every row in memory) or a `tiered.TieredStorage` whose budgets leave every shard at least a
  byte, and then no shard's device is a GPU (a tiered table lives in host memory).
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tensorflow_ext.embedding import admission as admission_lib
from tensorflow_ext.embedding import distribution as distribution_lib
from tensorflow_ext.embedding import eviction as eviction_lib
from tensorflow_ext.embedding import initializers as init_lib
from tensorflow_ext.table import refs
from tensorflow_ext.table import table_ops
from tensorflow_ext.table import tiered

MAX_DIM = 1 << 20
MAX_SHARDS = 1 << 16
MAX_CAPACITY = table_ops.MAX_CAPACITY  # the table core's limit, kMaxCapacity in table_limits.h
# How a training embedding's rows may be stored (float32, or half precision converted at the table's boundary).
VALUE_DTYPES = tuple(refs.storage_dtype(storage) for storage in refs.TRAINABLE_STORAGES)
# How optimizer updates round into half-precision rows when the caller does not say (one of refs.ROUNDINGS):
# stochastic rounding is deterministic per key, step and column (reruns are bit-identical) and unbiased, so updates
# smaller than half a bfloat16 step still move the weights on average.
DEFAULT_ROUNDING = "stochastic"


@dataclasses.dataclass(frozen=True)
class EmbeddingConfig(object):
    """What a dynamic embedding is, fixed at its creation (see the module docstring for the invariants).

    Build one with `from_arguments`, which checks every field; the constructor checks nothing.
    """

    name: str
    dim: int
    key_dtype: tf.DType
    value_dtype: tf.DType
    initializer: init_lib.InitSpec
    num_shards: int
    devices: tuple
    trainable: bool
    initial_capacity: int
    preallocate: bool
    slot_dtype: object = None
    rounding: str = "nearest"
    admission: object = admission_lib.ADMIT_EVERY_KEY
    eviction: object = eviction_lib.NEVER_EVICT
    distribution: object = distribution_lib.SINGLE_PROCESS
    storage: object = None

    @property
    def shard_capacity(self):
        """The expected number of keys per shard: initial_capacity split evenly, rounded up (every shard of a
        preallocated embedding gets memory, even below one key per shard)."""
        return -(-self.initial_capacity // self.num_shards) if self.initial_capacity else 0

    @property
    def compact_slots(self):
        """Whether the optimizer slot columns are stored as `value_dtype` too (else float32)."""
        return self.slot_dtype is not None

    def shard_tier(self, index):
        """The tier of shard `index` (see `tiered.TieredStorage.shard_tier`: its store directory and share of the
        budgets), or None for an in-memory embedding. The directory is resolved now (`TF_EXT_TIER_ROOT`, the
        Horovod rank)."""
        if self.storage is None:
            return None
        return self.storage.shard_tier(self.name, index, self.num_shards)

    def shard_device(self, index):
        """The device of shard `index`: `devices[index % len(devices)]`, or None (the active device functions)."""
        return self.devices[index % len(self.devices)] if self.devices else None

    @classmethod
    def from_arguments(
        cls,
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
        capacity_from="initial_capacity",
        scope_defaults=True,
        slot_dtype=None,
        rounding=None,
        storage=None,
    ):
        """`get_dynamic_embedding`'s arguments, checked and completed: the config of the embedding they describe.

        Args:
          name: the name as the caller passed it (errors name the embedding by it); the config's name is the
            current variable scope's name + "/" + name.
          dim, key_dtype, value_dtype, initializer, num_shards, devices, partitioner, trainable, initial_capacity,
            preallocate, admission, eviction, slot_dtype, rounding, storage: as `get_dynamic_embedding` takes them
            (None: the default).
          scope: the current `tf.compat.v1.VariableScope` (its partitioner and initializer are the defaults).
          capacity_from: how errors about initial_capacity name it ("init_size" when it came from TFRA's init_size).
          scope_defaults: whether the scope's partitioner and initializer stand in for those not passed. False when
            the call reuses an existing embedding: only what the caller passed is checked (the scope's defaults
            shaped the embedding when it was created, and a reused embedding keeps its shards and initializer).

        Returns:
          An `EmbeddingConfig`.

        Raises:
          TypeError, ValueError: an argument of the wrong type or out of its range (the message names it, the
            embedding and what to pass).
        """
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string, got %r" % (name,))
        full_name = scoped_name(scope, name)
        if isinstance(dim, tf.DType) or isinstance(key_dtype, (int, np.integer)) and not isinstance(key_dtype, bool):
            raise TypeError(
                "get_dynamic_embedding(name, dim, key_dtype, value_dtype, ...) takes dim second; got dim=%r, "
                "key_dtype=%r. This looks like TFRA's get_variable(name, key_dtype, value_dtype, dim) order: pass "
                "keywords (get_dynamic_embedding(name, dim=..., key_dtype=...)) or use "
                "tensorflow_ext.tfra.get_variable, which keeps TFRA's order." % (dim, key_dtype)
            )
        dim = _check_int("dim of dynamic embedding %r" % name, dim, 1, MAX_DIM)
        key_dtype = tf.as_dtype(key_dtype)
        if key_dtype not in (tf.int64, tf.int32, tf.string):
            raise ValueError(
                "key_dtype of dynamic embedding %r must be tf.int64, tf.int32 or tf.string, got %s"
                % (name, key_dtype.name)
            )
        value_dtype, slot_dtype, rounding = _check_row_storage(name, value_dtype, slot_dtype, rounding)
        initial_capacity = _check_initial_capacity(name, initial_capacity, capacity_from)
        preallocate = table_ops.check_preallocate(preallocate, initial_capacity, "dynamic embedding %r" % name)
        if devices is not None:
            devices = _check_devices(name, devices)
        from_scope = (
            scope_defaults
            and num_shards is None
            and partitioner is None
            and devices is None
            and scope.partitioner is not None
        )
        if from_scope:
            partitioner = scope.partitioner
        if num_shards is None:
            if partitioner is not None:
                num_shards = _shards_from_partitioner(name, partitioner, initial_capacity, dim, value_dtype, from_scope)
            elif devices:
                num_shards = len(devices)
            else:
                num_shards = 1
        num_shards = _check_int("num_shards of dynamic embedding %r" % name, num_shards, 1, MAX_SHARDS)
        if initializer is None and scope_defaults and scope.initializer is not None:
            initializer = scope.initializer
        spec = init_lib.resolve(initializer, dim)
        if admission is None:
            admission = admission_lib.ADMIT_EVERY_KEY
        elif not isinstance(admission, admission_lib.Admission):
            raise TypeError(
                "admission of dynamic embedding %r must be a tf_ext.embedding.CountAdmission or BloomAdmission, got "
                "%r" % (name, admission)
            )
        if eviction is None:
            eviction = eviction_lib.NEVER_EVICT
        elif not isinstance(eviction, eviction_lib.EvictionPolicy):
            raise TypeError(
                "eviction of dynamic embedding %r must be a tf_ext.embedding.EvictionPolicy, got %r" % (name, eviction)
            )
        if storage is not None:
            _check_storage(name, storage, num_shards, devices)
        return cls(
            name=full_name,
            dim=dim,
            key_dtype=key_dtype,
            value_dtype=value_dtype,
            # One seed pair per embedding, fixed now: a key's initial row depends only on (seeds, key).
            initializer=spec.pinned_for(full_name),
            num_shards=num_shards,
            devices=tuple(devices) if devices else None,
            trainable=trainable,
            initial_capacity=initial_capacity,
            preallocate=preallocate,
            admission=admission,
            eviction=eviction,
            slot_dtype=slot_dtype,
            rounding=rounding,
            storage=storage,
        )


def scoped_name(scope, name):
    """The full name of embedding `name` (a non-empty str) got in variable scope `scope`: "<scope name>/<name>"."""
    return scope.name + "/" + name if scope.name else name


def _as_dtype(name, what, dtype):
    try:
        return tf.as_dtype(dtype)
    except TypeError:
        raise TypeError("%s of dynamic embedding %r must be a tf.DType, got %r" % (what, name, dtype)) from None


def _check_row_storage(name, value_dtype, slot_dtype, rounding):
    """(value_dtype, slot_dtype, rounding) checked and completed (see the module docstring's invariants)."""
    supported = ", ".join("tf." + d.name for d in VALUE_DTYPES)
    value_dtype = tf.float32 if value_dtype is None else _as_dtype(name, "value_dtype", value_dtype)
    if value_dtype in (tf.int8, tf.uint8):
        raise ValueError(
            "value_dtype=tf.%s for dynamic embedding %r: int8 rows (with a per-row scale and bias) are a serving "
            "format, not a training one. Train with value_dtype %s and export int8 rows with "
            "tf_ext.serving.freeze_for_serving(value_dtype=tf.int8)." % (value_dtype.name, name, supported)
        )
    if value_dtype not in VALUE_DTYPES:
        raise ValueError(
            "value_dtype of dynamic embedding %r must be one of %s (how the rows are stored; lookups return "
            "float32), got %s" % (name, supported, value_dtype.name)
        )
    if slot_dtype is not None:
        slot_dtype = _as_dtype(name, "slot_dtype", slot_dtype)
        if slot_dtype == tf.float32:
            slot_dtype = None  # float32 slots are what None asks for
        elif slot_dtype != value_dtype:
            raise ValueError(
                "slot_dtype of dynamic embedding %r must be None or tf.float32 (float32 optimizer slots) or its "
                "value_dtype "
                "(tf.%s: the slots stored as the values are), got tf.%s" % (name, value_dtype.name, slot_dtype.name)
            )
    if rounding is None:
        rounding = DEFAULT_ROUNDING
    elif rounding not in refs.ROUNDINGS:
        raise ValueError(
            "rounding of dynamic embedding %r must be None (the default, %r) or one of %s, got %r"
            % (name, DEFAULT_ROUNDING, ", ".join(repr(r) for r in refs.ROUNDINGS), rounding)
        )
    elif value_dtype == tf.float32:
        # A rounding asked for float32 rows (which nothing rounds) is most likely a value_dtype left out.
        raise ValueError(
            "rounding=%r of dynamic embedding %r applies to half-precision rows (value_dtype tf.bfloat16 or "
            "tf.float16); its value_dtype is tf.float32, whose rows are stored unrounded: leave rounding None"
            % (rounding, name)
        )
    if value_dtype == tf.float32:
        return value_dtype, None, "nearest"  # float32 rows are stored as they are: nothing to round
    return value_dtype, slot_dtype, rounding


def _check_storage(name, storage, num_shards, devices):
    """Raises unless `storage` is a `TieredStorage` that gives each of `num_shards` shards a budget and no shard is
    placed on a GPU."""
    if not isinstance(storage, tiered.TieredStorage):
        raise TypeError(
            "storage of dynamic embedding %r must be None (every row in memory) or a "
            "tf_ext.TieredStorage(memory_bytes=..., path=...), got %r" % (name, storage)
        )
    storage.check_shards(name, num_shards)
    for device in devices or ():
        if callable(device):
            continue
        spec = device if isinstance(device, tf.DeviceSpec) else tf.DeviceSpec.from_string(device)
        if spec.device_type is not None and spec.device_type.upper() == "GPU":
            raise ValueError(
                "storage of dynamic embedding %r: a tiered table lives in host memory over a disk store, and device "
                "%r is a GPU: place its shards on CPU devices (e.g. '/cpu:0' or a parameter server's '/job:ps')"
                % (name, device)
            )


def _check_int(what, value, lo, hi):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError("%s must be an int, got %r" % (what, value))
    value = int(value)
    if value < lo or value > hi:
        raise ValueError("%s must be in [%d, %s], got %d" % (what, lo, hi, value))
    return value


def _check_initial_capacity(name, initial_capacity, capacity_from):
    what = "initial_capacity%s of dynamic embedding %r" % (
        " (TFRA's init_size)" if capacity_from == "init_size" else "",
        name,
    )
    if isinstance(initial_capacity, (bool, np.bool_)) or not isinstance(initial_capacity, (int, np.integer)):
        raise TypeError(
            "%s must be an int (the expected number of keys, 0 if unknown), got %r" % (what, initial_capacity)
        )
    if not 0 <= initial_capacity <= MAX_CAPACITY:
        raise ValueError(
            "%s must be in [0, 2^40] (the expected number of keys over all shards, a sizing hint: tables grow on "
            "demand; pass 0 if unknown), got %d" % (what, initial_capacity)
        )
    return int(initial_capacity)


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
        small, large = ask(MAX_SHARDS), ask(MAX_CAPACITY)
        if small != large:
            raise ValueError(
                "%s of dynamic embedding %r gives a shard count that depends on the table's size (%d shards "
                "for %d keys, %d for %d), and a dynamic embedding has no fixed size: pass initial_capacity (the "
                "expected number of keys; the partitioner is then asked about an [initial_capacity, dim] table) or "
                "num_shards" % (what, name, small, MAX_SHARDS, large, MAX_CAPACITY)
            )
        num_shards = small
    if not 1 <= num_shards <= MAX_SHARDS:
        raise ValueError(
            "%s of dynamic embedding %r gives %d shards (for a [%d, %d] table); a dynamic embedding needs 1 "
            "to %d: pass num_shards instead" % (what, name, num_shards, initial_capacity or MAX_SHARDS, dim, MAX_SHARDS)
        )
    return num_shards
