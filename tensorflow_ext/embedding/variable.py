"""Dynamic embedding variables: `get_dynamic_embedding`, `DynamicEmbedding`, its shards.

A dynamic embedding maps arbitrary keys (int64, or strings through a 64-bit
fingerprint) to rows of ``dim`` float32, with no vocabulary: a row is created
the first time a training lookup sees its key. It is made of ``num_shards``
tables (one ``TfExtTableHandle`` resource each); a key lives in shard
``HashKey(key) % num_shards`` (``TfExtShardIndex``).

Each table row is ``[embedding (dim) | optimizer slot columns]``. When a stock
``tf.compat.v1.train`` optimizer is applied to the embedding, its slots are
appended to the layout (the handle op's ``width``/``column_defaults`` attrs)
before the graph first runs; see ``optimizers.py``.
"""

import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

from tensorflow_ext import tf_compat
from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding.checkpoint import save as save_lib
from tensorflow_ext.embedding.shard import DynamicEmbeddingShard
from tensorflow_ext.embedding.keys import HashPartition
from tensorflow_ext.embedding.keys import string_to_key
from tensorflow_ext.embedding.layout import DynamicEmbeddingSlot  # noqa: F401  (re-exported)
from tensorflow_ext.table import table_ops

__all__ = [
    "GraphKeys",
    "DynamicEmbedding",
    "DynamicEmbeddingShard",
    "DynamicEmbeddingSlot",
    "ExportedEmbedding",
    "get_dynamic_embedding",
    "get_dynamic_embeddings",
    "string_to_key",
]

MAX_SHARDS = 1 << 16
MAX_CAPACITY = table_ops.MAX_CAPACITY  # the table core's limit, kMaxCapacity in table_limits.h


class GraphKeys(object):
    """Graph collection keys of tensorflow_ext.

    DYNAMIC_EMBEDDINGS: the `DynamicEmbeddingShard`s of the graph (every shard
      of every dynamic embedding, trainable or not).
    """

    DYNAMIC_EMBEDDINGS = "tf_ext_dynamic_embeddings"


ExportedEmbedding = collections.namedtuple("ExportedEmbedding", ["keys", "values", "slots", "versions", "frequencies"])
ExportedEmbedding.__doc__ = """The contents of a dynamic embedding (tensors).

keys: int64 [n] (for string embeddings: the fingerprints of the strings).
values: float32 [n, dim], the embeddings.
slots: float32 [n, width - dim], the optimizer slot columns ([n, 0] unless
  requested).
versions: int64 [n], the global step of each key's last update.
frequencies: int64 [n], how many times each key was looked up in training.
"""


class DynamicEmbedding(object):
    """A dynamic embedding: keys -> `dim` float32, no vocabulary, sharded tables.

    Create with `get_dynamic_embedding`; look up with `embedding_lookup`,
    `embedding_lookup_sparse` or `safe_embedding_lookup_sparse`; train with any
    supported stock `tf.compat.v1.train` optimizer.

    The constructor creates the shards and registers them in the graph
    collections; it does not validate its arguments. Use
    `get_dynamic_embedding`, which validates them and applies variable-scope
    naming and reuse rules.

    Args:
      name: the full (variable-scope prefixed) name.
      dim: int, the embedding dimension.
      key_dtype: the dtype of the ids users pass (int64, int32 or string).
      value_dtype: the value dtype (float32).
      initializer: the `InitSpec` of new rows.
      num_shards: int >= 1, the number of tables.
      devices: optional list of device strings; shard i goes to
        `devices[i % len(devices)]`.
      trainable: whether to add the shards to `TRAINABLE_VARIABLES`.
      initial_capacity: expected number of keys over all shards (split evenly).
      preallocate: allocate the memory of initial_capacity keys when the tables
        are created (see `get_dynamic_embedding`).
    """

    def __init__(
        self,
        name,
        dim,
        key_dtype,
        value_dtype,
        initializer,
        num_shards,
        devices,
        trainable,
        initial_capacity,
        preallocate=False,
    ):
        self._name = name
        self._dim = dim
        self._key_dtype = key_dtype
        self._value_dtype = value_dtype
        # One seed pair per embedding: a key's initial row depends only on (seeds, key), whichever op inserts it.
        self._initializer = initializer.pinned_for(name)
        self._trainable = trainable
        self._devices = list(devices) if devices else None
        self._initial_capacity = int(initial_capacity or 0)  # TFRA's init_size (tensorflow_ext.tfra)
        self._distribution = None  # set by tensorflow_ext.horovod for model-parallel embeddings
        self._admission = None  # an admission policy and its state (see admission.py), set by get_dynamic_embedding
        self._admission_state = None
        self._eviction = None  # an EvictionPolicy and its state (see eviction.py), set by get_dynamic_embedding
        self._eviction_state = None
        graph = tf.compat.v1.get_default_graph()
        self._graph = graph
        self._partition = HashPartition(num_shards)
        # Rounded up: every shard of a preallocated embedding gets memory, even below one key per shard.
        per_shard_capacity = -(-int(initial_capacity) // num_shards) if initial_capacity else 0
        self._shards = []
        for i in range(num_shards):
            device = self._devices[i % len(self._devices)] if self._devices else None
            shard = DynamicEmbeddingShard(self, i, "%s/part_%d" % (name, i), device, per_shard_capacity, preallocate)
            self._shards.append(shard)
        for shard, saveable in zip(self._shards, save_lib.shard_saveables(self._shards)):
            shard._saveable = saveable  # pylint: disable=protected-access
            graph.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, shard.saveable)
            graph.add_to_collection(GraphKeys.DYNAMIC_EMBEDDINGS, shard)
            if trainable:
                graph.add_to_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, shard)

    @property
    def name(self):
        """Full name (variable-scope prefixed)."""
        return self._name

    @property
    def dim(self):
        """The embedding dimension (an int)."""
        return self._dim

    @property
    def key_dtype(self):
        """The dtype of the ids users pass (int64, int32 or string)."""
        return self._key_dtype

    @property
    def value_dtype(self):
        """The dtype of the embedding values (float32)."""
        return self._value_dtype

    @property
    def dtype(self):
        """Same as value_dtype (float32)."""
        return self._value_dtype

    @property
    def initializer(self):
        """The `InitSpec` of new rows."""
        return self._initializer

    @property
    def trainable(self):
        """Whether the shards are in `TRAINABLE_VARIABLES`."""
        return self._trainable

    @property
    def distribution(self):
        """How the embedding spans processes: None (this process holds every key it trains), or a strategy
        object such as `tensorflow_ext.horovod.ModelParallel` whose `lookup_unique` routes keys to their owners."""
        return self._distribution

    @distribution.setter
    def distribution(self, value):
        if self._distribution is not None and value is not self._distribution:
            raise ValueError("dynamic embedding %s already has a distribution (%r)" % (self._name, self._distribution))
        self._distribution = value

    @property
    def admission(self):
        """The admission policy (`tf_ext.embedding.CountAdmission` / `BloomAdmission`), or None: every key trains."""
        return self._admission

    @property
    def admission_state(self):
        """The admission policy's state in this graph (a dict of its tables and variables), or None."""
        return self._admission_state

    def set_admission(self, policy):
        """Gives the embedding an admission policy (before its first lookup; `get_dynamic_embedding(admission=)`).

        Args:
          policy: a `CountAdmission` or `BloomAdmission`.

        Raises:
          ValueError: the embedding has a policy already.
        """
        if self._admission is not None:
            raise ValueError(
                "dynamic embedding %s already has an admission policy (%r)" % (self._name, self._admission)
            )
        self._admission_state = policy.build(self)
        self._admission = policy

    @property
    def eviction(self):
        """The `tf_ext.embedding.EvictionPolicy` the embedding was created with, or None."""
        return self._eviction

    @property
    def eviction_state(self):
        """The eviction policy's state in this graph (a dict: "evicted", the keys evicted so far), or None."""
        return self._eviction_state

    def set_eviction(self, policy):
        """Gives the embedding an eviction policy (before the optimizer is applied; `get_dynamic_embedding(eviction=)`).

        Args:
          policy: an `EvictionPolicy`.

        Raises:
          ValueError: the embedding has a policy already.
        """
        if self._eviction is not None:
            raise ValueError("dynamic embedding %s already has an eviction policy (%r)" % (self._name, self._eviction))
        self._eviction_state = policy.build(self)
        self._eviction = policy

    @property
    def num_shards(self):
        """The number of shards (tables), an int >= 1."""
        return len(self._shards)

    @property
    def shards(self):
        """The `DynamicEmbeddingShard`s, in shard-index order."""
        return list(self._shards)

    @property
    def graph(self):
        """The `tf.Graph` the embedding was created in."""
        return self._graph

    @property
    def saveables(self):
        """The shards' SaveableObjects (for `tf.compat.v1.train.Saver(var_list=...)`)."""
        return [s.saveable for s in self._shards]

    def __getattr__(self, name):
        # Only for names the class does not have: TFRA's Variable attributes get tensorflow_ext.tfra's answer (the
        # equivalent, or a NotProvidedError saying what to use); other names are plain AttributeErrors.
        if name.startswith("_"):
            raise AttributeError("%r object has no attribute %r" % (type(self).__name__, name))
        from tensorflow_ext import tfra  # pylint: disable=import-outside-toplevel

        return tfra.embedding_attribute(self, name)

    def __repr__(self):
        return "<tf_ext.DynamicEmbedding %r dim=%d key_dtype=%s shards=%d>" % (
            self._name,
            self._dim,
            self._key_dtype.name,
            len(self._shards),
        )

    # ---- keys ---------------------------------------------------------------

    def to_keys(self, ids, what="ids"):
        """Converts user ids to int64 table keys (strings are fingerprinted).

        Args:
          ids: Tensor (or convertible) of any rank: int64/int32 ids, or strings
            for an embedding with key_dtype=tf.string.
          what: how the ids are named in error messages.

        Returns:
          int64 tensor of ids' shape.

        Raises:
          TypeError: ids of a dtype that does not match key_dtype (e.g. float ids).
        """
        if isinstance(ids, tf.SparseTensor):
            raise TypeError(
                "%s of dynamic embedding %r must be a dense Tensor here, got a SparseTensor" % (what, self._name)
            )
        if not isinstance(ids, (tf.Tensor, tf.Variable)):
            dtype = tf.string if self._key_dtype == tf.string else None
            ids = tf.convert_to_tensor(ids, dtype=dtype)
        dtype = ids.dtype.base_dtype
        if self._key_dtype == tf.string:
            if dtype != tf.string:
                raise TypeError(
                    "%s of dynamic embedding %r (key_dtype=string) must be strings, got %s"
                    % (what, self._name, dtype.name)
                )
            return string_to_key(ids)
        if dtype not in (tf.int64, tf.int32):
            raise TypeError(
                "%s of dynamic embedding %r (key_dtype=%s) must be int64 or int32, got %s"
                % (what, self._name, self._key_dtype.name, dtype.name)
            )
        tf_compat.mark_id_feed(ids, "dynamic embedding %r" % self._name)  # float values fed to it are refused
        if dtype != tf.int64:
            ids = tf.cast(ids, tf.int64)
        return ids

    @property
    def partition(self):
        """The `HashPartition` of keys over this embedding's shards (`HashKey(key) % num_shards`)."""
        return self._partition

    def shard_ids(self, keys):
        """The shard of each key: `HashKey(key) % num_shards`.

        Args:
          keys: int64 tensor of any rank (table keys, see `to_keys`).

        Returns:
          int32 tensor of keys' shape (all zeros for a one-shard embedding).
        """
        return self._partition.part_ids(keys)

    # ---- introspection --------------------------------------------------------

    def size(self, shard_index=None, name=None):
        """The number of keys in the embedding, or in one of its shards.

        Args:
          shard_index: None (default) for the total over all shards, or an int in
            `[0, num_shards)` for that shard's count (TFRA's `size(index)`).
          name: optional name scope (pass it by keyword).

        Returns:
          int64 scalar tensor.

        Raises:
          TypeError: shard_index is not None or an int (e.g. a name passed
            positionally: use `size(name=...)`).
          ValueError: shard_index is out of range.
        """
        if shard_index is not None:
            if isinstance(shard_index, (bool, np.bool_)) or not isinstance(shard_index, (int, np.integer)):
                raise TypeError(
                    "shard_index of %r.size() must be None or an int, got %r (pass a name scope as "
                    "size(name=...))" % (self._name, shard_index)
                )
            if not 0 <= int(shard_index) < len(self._shards):
                raise ValueError(
                    "shard_index of %r.size() must be in [0, %d) (num_shards=%d), got %d"
                    % (self._name, len(self._shards), len(self._shards), int(shard_index))
                )
        shards = self._shards if shard_index is None else [self._shards[int(shard_index)]]
        with tf.name_scope(name or (self._name.split("/")[-1] + "_size")):
            sizes = []
            for shard in shards:
                with tf_ops.colocate_with(shard.handle):
                    size_op = "tf_ext_frozen_table_size" if shard.frozen else "tf_ext_table_size"
                    sizes.append(_ops.op(size_op)(shard.handle))
            return tf.add_n(sizes) if len(sizes) > 1 else tf.identity(sizes[0])

    def memory_bytes(self, name=None):
        """The host memory the embedding's tables hold, in bytes (all shards).

        What each shard's table says it holds (`TfExtTableMemoryBytes`): keys,
        rows of `[embedding | optimizer slots]`, per-key metadata and the index,
        including capacity reserved for growth. Removing keys (`remove`, eviction)
        does not give memory back: the freed rows are reused by later keys.

        Args:
          name: optional name scope.

        Returns:
          int64 scalar tensor.
        """
        with tf.name_scope(name or (self._name.split("/")[-1] + "_memory_bytes")):
            parts = []
            for shard in self._shards:
                with tf_ops.colocate_with(shard.handle):
                    bytes_op = "tf_ext_frozen_table_memory_bytes" if shard.frozen else "tf_ext_table_memory_bytes"
                    parts.append(_ops.op(bytes_op)(shard.handle))
            return tf.add_n(parts) if len(parts) > 1 else tf.identity(parts[0])

    def export(self, with_slots=False, name=None):
        """Snapshot of the embedding (all shards concatenated, unspecified order).

        Args:
          with_slots: also export the optimizer slot columns (freezes the table
            layout: build optimizers first).
          name: optional name scope.

        Returns:
          An `ExportedEmbedding(keys, values, slots, versions, frequencies)` of
          tensors; `slots` is [n, 0] unless with_slots. For string embeddings, keys
          are the int64 fingerprints (`string_to_key`).
        """
        with tf.name_scope(name or (self._name.split("/")[-1] + "_export")):
            parts = [_export_shard(s, with_slots) for s in self._shards]
            if len(parts) == 1:
                return parts[0]
            cat = lambda i: tf.concat([p[i] for p in parts], 0)
            return ExportedEmbedding(cat(0), cat(1), cat(2), cat(3), cat(4))

    def slot_names(self, optimizer):
        """The names of `optimizer`'s slots in this embedding's rows.

        Args:
          optimizer: a `tf.compat.v1.train.Optimizer` applied to this embedding.

        Returns:
          list of str (e.g. ["m", "v"] for Adam); [] if the optimizer has no slot
          columns here (or was not applied to this embedding).
        """
        group = self._shards[0].slot_group(optimizer)
        return list(group.slot_names) if group else []

    # ---- TFRA's Variable methods (porting by renaming) ------------------------

    def _check_writable(self, what):
        for shard in self._shards:
            shard.check_writable("%s.%s()" % (self._name, what))

    def upsert(self, keys, values, name=None):
        """TFRA's name for `insert`: inserts/overwrites the embeddings of keys.

        Args:
          keys: ids of any shape (key dtype), n elements.
          values: float32 `[n, dim]` (or `keys.shape + [dim]`).
          name: optional name scope.

        Returns:
          The insert op.
        """
        return self.insert(keys, values, name=name or "upsert")

    def lookup(self, keys, return_exists=False, name=None):
        """Reads the embeddings of keys without inserting any (TFRA's `Variable.lookup`).

        Missing keys read the initializer's constant (zeros for random
        initializers). Not differentiable: train through `tf_ext.embedding_lookup`.

        Args:
          keys: ids of any shape (key dtype).
          return_exists: also return a bool tensor of keys' shape, True where
            the key is in the table.
          name: optional name scope.

        Returns:
          float32 `keys.shape + [dim]`, and the bool tensor if return_exists.
        """
        with tf.name_scope(name or "lookup"):
            keys = self.to_keys(keys)
            flat = tf.reshape(keys, [-1])
            parts, positions = self._partition.split(flat)
            rows, found = [], []
            missing_row = tf.constant(self._initializer.missing_row(self._dim), tf.float32)
            for shard, part in zip(self._shards, parts):
                with tf_ops.colocate_with(shard.handle):
                    if shard.frozen:
                        v, f = _ops.op("tf_ext_frozen_table_find")(shard.handle, part, missing_row, dim=self._dim)
                    else:
                        v, f = _ops.op("tf_ext_table_find")(
                            shard.handle, part, missing_row, col_begin=0, cols=self._dim
                        )
                rows.append(v)
                found.append(f)
            if positions is None:
                values, exists = rows[0], found[0]
            else:
                values, exists = tf.dynamic_stitch(positions, rows), tf.dynamic_stitch(positions, found)
            shape = tf.shape(keys)
            values = tf.reshape(values, tf.concat([shape, [self._dim]], 0))
            if return_exists:
                return values, tf.reshape(exists, shape)
            return values

    def restrict(self, num_reserved, trigger=None, policy=None, name=None):
        """Keeps at most `num_reserved` keys (TFRA's `Variable.restrict`).

        See `tf_ext.embedding.restrict`. The policy defaults to the one given to
        `tensorflow_ext.tfra.get_variable(restrict_policy=...)`, else "timestamp".

        Args:
          num_reserved: keys kept.
          trigger: restrict only above this many keys (default num_reserved).
          policy: "timestamp" or "frequency" (default: see above).
          name: optional name scope.

        Returns:
          int64 scalar tensor: keys removed.
        """
        self._check_writable("restrict")
        from tensorflow_ext.embedding import eviction  # pylint: disable=import-outside-toplevel

        policy = policy or getattr(self, "restrict_policy", None) or "timestamp"
        return eviction.restrict(self, num_reserved, trigger=trigger, policy=policy, name=name)

    def slot_values(self, optimizer, slot_name, ids, name=None):
        """Reads an optimizer slot of some keys.

        Args:
          optimizer: the optimizer applied to this embedding.
          slot_name: the TF slot name (e.g. "accumulator" for Adagrad, "m"/"v" for
            Adam, "accum"/"linear" for Ftrl, "rms"/"momentum"/"mg" for RMSProp).
          ids: ids of any shape (key dtype).
          name: optional name scope.

        Returns:
          float32 `ids.shape + [dim]`; keys not in the table read the slot's
          initial value.

        Raises:
          ValueError: the optimizer has no such slot on this embedding.
        """
        self._check_writable("slot_values")
        group = self._shards[0].slot_group(optimizer)
        if group is None or slot_name not in group.slot_names:
            raise ValueError(
                "optimizer %r has no slot %r on dynamic embedding %r (slots: %s)"
                % (
                    getattr(optimizer, "get_name", lambda: optimizer)(),
                    slot_name,
                    self._name,
                    group.slot_names if group else [],
                )
            )
        with tf.name_scope(name or "slot_values"):
            keys = self.to_keys(ids)
            flat = tf.reshape(keys, [-1])
            default = group.initial_values[group.slot_names.index(slot_name)]
            parts, positions = self._partition.split(flat)
            outs = []
            for shard, part in zip(self._shards, parts):
                shard_col = shard.slot_group(optimizer).column(slot_name)
                with tf_ops.colocate_with(shard.handle):
                    values, _ = _ops.op("tf_ext_table_find")(
                        shard.handle,
                        part,
                        tf.fill([self._dim], tf.constant(default, tf.float32)),
                        col_begin=shard_col,
                        cols=self._dim,
                    )
                outs.append(values)
            rows = outs[0] if positions is None else tf.dynamic_stitch(positions, outs)
            return tf.reshape(rows, tf.concat([tf.shape(keys), [self._dim]], 0))

    def insert(self, ids, values, name=None):
        """Inserts/overwrites the embeddings of keys (used to preload rows).

        Slots of new keys get their initial values; existing keys keep their slots.

        Args:
          ids: ids of any shape (key dtype), n elements.
          values: float32 `[n, dim]` (or `ids.shape + [dim]`).
          name: optional name scope.

        Returns:
          The insert op.

        Raises:
          TypeError: ids of the wrong dtype (see `to_keys`).
          ValueError: values whose static shape is not `[n, dim]` (or
            `ids.shape + [dim]`).
          InvalidArgumentError (at run time): values do not have n rows of `dim`.
        """
        self._check_writable("insert")
        with tf.name_scope(name or "insert"):
            ids_keys = self.to_keys(ids)
            keys = tf.reshape(ids_keys, [-1])
            values = tf.convert_to_tensor(values, tf.float32)
            # Checked here, naming the embedding: the reshape and the shard
            # partition below would otherwise fail with messages about themselves.
            what = "insert into dynamic embedding %s: values" % self._name
            n_static = ids_keys.shape.num_elements()
            shape = values.shape
            if shape.rank is not None and not (n_static == 0 and shape.num_elements() == 0):
                rows = shape[:-1].num_elements() if shape.rank >= 1 else None
                if (
                    shape.rank == 0
                    or (shape[-1] is not None and shape[-1] != self._dim)
                    or (rows is not None and n_static is not None and rows != n_static)
                ):
                    raise ValueError(
                        "%s must have shape [n, dim] = [%s, %d] (n = number of ids), got shape %s"
                        % (what, n_static if n_static is not None else "n", self._dim, shape)
                    )
            n = tf.size(keys)
            last = tf.shape(values)[-1:]
            ok = tf.logical_or(
                tf.logical_and(tf.equal(n, 0), tf.equal(tf.size(values), 0)),
                tf.logical_and(
                    tf.reduce_all(tf.equal(last, self._dim)),
                    tf.logical_and(tf.equal(tf.size(last), 1), tf.equal(tf.size(values), n * self._dim)),
                ),
            )
            check = tf.debugging.Assert(
                ok,
                [
                    "%s must have shape [n, dim] with dim = %d and n = number of ids; n =" % (what, self._dim),
                    n,
                    "got shape",
                    tf.shape(values),
                ],
                name="check_values_shape",
            )
            with tf.control_dependencies([check]):
                values = tf.reshape(values, [-1, self._dim])
            if len(self._shards) == 1:
                parts, vparts = [keys], [values]
            else:
                sid = self.shard_ids(keys)
                parts = tf.dynamic_partition(keys, sid, len(self._shards))
                vparts = tf.dynamic_partition(values, sid, len(self._shards))
            ops = []
            for shard, k, v in zip(self._shards, parts, vparts):
                with tf_ops.colocate_with(shard.handle):
                    ops.append(
                        _ops.op("tf_ext_table_insert")(
                            shard.handle, k, v, tf.constant(-1, tf.int64), col_begin=0, cols=self._dim, count=False
                        )
                    )
            return tf.group(*ops)

    def remove(self, ids, name=None):
        """Removes keys (absent ones are ignored) with their slots and metadata.

        Args:
          ids: ids of any shape (key dtype).
          name: optional name scope.

        Returns:
          int64 scalar tensor: the number of keys removed.

        Raises:
          TypeError: ids of the wrong dtype (see `to_keys`).
        """
        self._check_writable("remove")
        with tf.name_scope(name or "remove"):
            keys = tf.reshape(self.to_keys(ids), [-1])
            parts, _ = self._partition.split(keys)
            counts = []
            for shard, k in zip(self._shards, parts):
                with tf_ops.colocate_with(shard.handle):
                    counts.append(_ops.op("tf_ext_table_remove")(shard.handle, k))
            return tf.add_n(counts)


def _export_shard(shard, with_slots):
    with tf_ops.colocate_with(shard.handle):
        if shard.frozen:
            # A frozen table holds the embedding only: no slots, versions or frequencies (zeros here).
            keys, values = _ops.op("tf_ext_frozen_table_export")(shard.handle, dim=shard.dim)
            zeros = tf.zeros_like(keys)
            return ExportedEmbedding(keys, values, tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32), zeros, zeros)
        if with_slots:
            shard.freeze_layout("export(with_slots=True)")
            keys, rows, versions, freqs = _ops.op("tf_ext_table_export")(shard.handle, col_begin=0, cols=shard.width)
            values = rows[:, : shard.dim]
            slots = rows[:, shard.dim :]
            return ExportedEmbedding(keys, values, slots, versions, freqs)
        keys, values, versions, freqs = _ops.op("tf_ext_table_export")(shard.handle, col_begin=0, cols=shard.dim)
        return ExportedEmbedding(keys, values, tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32), versions, freqs)


# Creation and scoping live in creation.py; these names stay importable from here.
from tensorflow_ext.embedding.creation import dense_variables  # noqa: E402,F401  pylint: disable=wrong-import-position
from tensorflow_ext.embedding.creation import (
    get_dynamic_embedding,
)  # noqa: E402,F401  pylint: disable=wrong-import-position
from tensorflow_ext.embedding.creation import (
    get_dynamic_embeddings,
)  # noqa: E402,F401  pylint: disable=wrong-import-position
