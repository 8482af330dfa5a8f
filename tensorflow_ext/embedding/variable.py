"""Dynamic embedding variables: `DynamicEmbedding`, the object users hold.

A dynamic embedding maps arbitrary keys (int64, or strings through a 64-bit
fingerprint) to rows of ``dim`` float32 (stored as float32, bfloat16 or float16:
``value_dtype``), with no vocabulary: a row is created
the first time a training lookup sees its key. It is made of ``num_shards``
tables (one ``TfExtTableHandle`` resource each, `DynamicEmbeddingShard`); a key
lives in shard ``HashKey(key) % num_shards`` (``TfExtShardIndex``).

A `DynamicEmbedding` is its frozen `EmbeddingConfig` (config.py), its shards and
one `EmbeddingState` (state.py), all built by the constructor and never
replaced. `get_dynamic_embedding` (creation.py) checks the arguments and applies
variable-scope naming and reuse.

Each table row is ``[embedding (dim) | optimizer slot columns]``. When a stock
``tf.compat.v1.train`` optimizer is applied to the embedding, its slots are
appended to the layout (the handle op's ``width``/``column_defaults`` attrs)
before the graph first runs; see ``optimizers.py``.
"""

import collections

import numpy as np
import tensorflow as tf

from tensorflow_ext import tf_compat
from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.embedding.shard import DynamicEmbeddingShard
from tensorflow_ext.embedding.keys import HashPartition
from tensorflow_ext.embedding.keys import string_to_key
from tensorflow_ext.embedding.layout import DynamicEmbeddingSlot  # noqa: F401  (re-exported)
from tensorflow_ext.embedding.state import GraphKeys
from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat import internals

__all__ = [
    "GraphKeys",
    "DynamicEmbedding",
    "DynamicEmbeddingShard",
    "DynamicEmbeddingSlot",
    "ExportedEmbedding",
    "string_to_key",
]


ExportedEmbedding = collections.namedtuple("ExportedEmbedding", ["keys", "values", "slots", "versions", "frequencies"])
ExportedEmbedding.__doc__ = """The contents of a dynamic embedding (tensors).

keys: int64 [n] (for string embeddings: the fingerprints of the strings).
values: float32 [n, dim], the embeddings.
slots: float32 [n, width - dim], the optimizer slot columns ([n, 0] unless
  requested).
versions: int64 [n], the global step of each key's last update.
frequencies: int64 [n], how many times each key was looked up in training.
"""

# callable(embedding, name) -> value, for attribute names DynamicEmbedding does not have (see
# `resolve_other_attributes_with`); None: a plain AttributeError.
_other_attributes = None


def resolve_other_attributes_with(resolver):
    """Sends `emb.<name>` for names `DynamicEmbedding` does not have to `resolver(emb, name)`.

    The package registers TFRA's `Variable` attributes this way (tensorflow_ext.tfra answers them: the equivalent,
    or a NotProvidedError saying what to use), so that the embedding layer does not import the TFRA module.

    Args:
      resolver: callable(DynamicEmbedding, str) -> the attribute's value; it raises AttributeError for names it
        does not know.
    """
    global _other_attributes  # pylint: disable=global-statement
    _other_attributes = resolver


class DynamicEmbedding(object):
    """A dynamic embedding: keys -> `dim` float32, no vocabulary, sharded tables.

    Create with `get_dynamic_embedding`; look up with `embedding_lookup`,
    `embedding_lookup_sparse` or `safe_embedding_lookup_sparse`; train with any
    supported stock `tf.compat.v1.train` optimizer. TFRA's `Variable` methods
    (`upsert`, `lookup`, `restrict`, `clear`, `embedding_lookup`, ...) work on
    it too: `tensorflow_ext` answers the names this class does not define with
    `tensorflow_ext.tfra`'s functions (see `resolve_other_attributes_with`).

    The constructor creates the shards, registers them in the graph collections
    and builds the embedding's state (its policies' tables and counters); it
    does not check its config. Use `get_dynamic_embedding`, which builds the
    config with `EmbeddingConfig.from_arguments` and applies variable-scope
    naming and reuse rules.

    Args:
      config: the `EmbeddingConfig` (name, dim, dtypes, initializer, shards,
        devices, capacity, policies).
    """

    def __init__(self, config):
        self._config = config
        graph = tf.compat.v1.get_default_graph()
        self._graph = graph
        self._partition = HashPartition(config.num_shards)
        self._shards = []
        for i in range(config.num_shards):
            shard = DynamicEmbeddingShard(
                self,
                i,
                "%s/part_%d" % (config.name, i),
                config.shard_device(i),
                config.shard_capacity,
                config.preallocate,
            )
            self._shards.append(shard)
        for shard, saveable in zip(self._shards, config.distribution.shard_saveables(self._shards)):
            shard.attach_saveable(saveable)
            graph.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, shard.saveable)
            graph.add_to_collection(GraphKeys.DYNAMIC_EMBEDDINGS, shard)
            if config.trainable:
                graph.add_to_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, shard)
        # The policies build their state in the caller's variable scope, admission first (their variables' names).
        self._state = state_lib.EmbeddingState(config.admission.build(self), config.eviction.build(self))

    @property
    def config(self):
        """The `EmbeddingConfig` the embedding was created with (a frozen value)."""
        return self._config

    @property
    def state(self):
        """The `EmbeddingState` of the embedding in its graph (its policies' state, restore flags)."""
        return self._state

    @property
    def name(self):
        """Full name (variable-scope prefixed)."""
        return self._config.name

    @property
    def dim(self):
        """The embedding dimension (an int)."""
        return self._config.dim

    @property
    def key_dtype(self):
        """The dtype of the ids users pass (int64, int32 or string)."""
        return self._config.key_dtype

    @property
    def value_dtype(self):
        """How the embedding values are stored: tf.float32, tf.bfloat16 or tf.float16 (lookups return float32)."""
        return self._config.value_dtype

    @property
    def slot_dtype(self):
        """How the optimizer slot columns are stored: None (float32) or `value_dtype`."""
        return self._config.slot_dtype

    @property
    def rounding(self):
        """How writes to half-precision rows round: "stochastic" or "nearest" ("nearest" for float32 rows)."""
        return self._config.rounding

    @property
    def dtype(self):
        """The dtype of what lookups return and optimizers compute in: tf.float32, whatever `value_dtype` is."""
        return tf.float32

    @property
    def initializer(self):
        """The `InitSpec` of new rows."""
        return self._config.initializer

    @property
    def trainable(self):
        """Whether the shards are in `TRAINABLE_VARIABLES`."""
        return self._config.trainable

    @property
    def distribution(self):
        """How the embedding spans processes: None (this process holds every key it trains), or a strategy
        object such as `tensorflow_ext.horovod.ModelParallel` whose `lookup_unique` routes keys to their owners."""
        distribution = self._config.distribution
        return None if distribution.name is None else distribution

    @property
    def admission(self):
        """The admission policy (`tf_ext.embedding.CountAdmission` / `BloomAdmission`), or None: every key trains."""
        policy = self._config.admission
        return None if policy.admits_every_key else policy

    @property
    def admission_state(self):
        """The admission policy's state in this graph (a dict of its tables and variables), or None."""
        return self._state.admission if self.admission is not None else None

    @property
    def eviction(self):
        """The `tf_ext.embedding.EvictionPolicy` the embedding was created with, or None."""
        policy = self._config.eviction
        return policy if policy.evicts else None

    @property
    def eviction_state(self):
        """The eviction policy's state in this graph (a dict: "evicted", the keys evicted so far), or None."""
        return self._state.eviction if self.eviction is not None else None

    @property
    def storage(self):
        """The `tf_ext.TieredStorage` of the embedding's tables, or None: every row in memory."""
        return self._config.storage

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
        # Only for names the class does not have: TFRA's Variable attributes (see resolve_other_attributes_with);
        # other names are plain AttributeErrors.
        if name.startswith("_") or _other_attributes is None:
            raise AttributeError("%r object has no attribute %r" % (type(self).__name__, name))
        return _other_attributes(self, name)

    def __repr__(self):
        # The storage is named where it is not float32 (as before compact rows).
        storage = "" if self.value_dtype == tf.float32 else " value_dtype=%s" % self.value_dtype.name
        return "<tf_ext.DynamicEmbedding %r dim=%d key_dtype=%s%s shards=%d>" % (
            self.name,
            self.dim,
            self.key_dtype.name,
            storage,
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
                "%s of dynamic embedding %r must be a dense Tensor here, got a SparseTensor" % (what, self.name)
            )
        if not isinstance(ids, (tf.Tensor, tf.Variable)):
            dtype = tf.string if self.key_dtype == tf.string else None
            ids = tf.convert_to_tensor(ids, dtype=dtype)
        dtype = ids.dtype.base_dtype
        if self.key_dtype == tf.string:
            if dtype != tf.string:
                raise TypeError(
                    "%s of dynamic embedding %r (key_dtype=string) must be strings, got %s"
                    % (what, self.name, dtype.name)
                )
            return string_to_key(ids)
        if dtype not in (tf.int64, tf.int32):
            raise TypeError(
                "%s of dynamic embedding %r (key_dtype=%s) must be int64 or int32, got %s"
                % (what, self.name, self.key_dtype.name, dtype.name)
            )
        tf_compat.mark_id_feed(ids, "dynamic embedding %r" % self.name)  # float values fed to it are refused
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
                    "size(name=...))" % (self.name, shard_index)
                )
            if not 0 <= int(shard_index) < len(self._shards):
                raise ValueError(
                    "shard_index of %r.size() must be in [0, %d) (num_shards=%d), got %d"
                    % (self.name, len(self._shards), len(self._shards), int(shard_index))
                )
        shards = self._shards if shard_index is None else [self._shards[int(shard_index)]]
        with tf.name_scope(name or (self.name.split("/")[-1] + "_size")):
            sizes = []
            for shard in shards:
                with internals.ops.colocate_with(shard.handle):
                    sizes.append(shard.table.size())
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
        with tf.name_scope(name or (self.name.split("/")[-1] + "_memory_bytes")):
            parts = []
            for shard in self._shards:
                with internals.ops.colocate_with(shard.handle):
                    parts.append(shard.table.memory_bytes())
            return tf.add_n(parts) if len(parts) > 1 else tf.identity(parts[0])

    def tier_stats(self, name=None):
        """The tier statistics of this process's shards, summed: what each shard's table says now.

        For a tiered embedding (`storage=tf_ext.TieredStorage(...)`), the sizes of the two tiers and counters since
        the tables were created; an in-memory embedding answers its memory numbers and zeros for the rest.

        Args:
          name: optional name scope.

        Returns:
          dict of scalar tensors: int64 "memory_keys", "memory_bytes" (the memory tier), "disk_keys", "disk_bytes"
          (the disk tier: bytes its files take), "budget_keys" (the keys the memory budget holds), and the
          counters "lookups" (keys the table's operations asked for), "cold_reads" (keys brought back from disk),
          "demotions" (keys moved to disk), "dropped" (keys that fell off a capped disk tier: gone), "errors"
          (background failures); float64 "hit_rate": 1 - cold_reads / lookups (1 before any lookup).
        """
        with tf.name_scope(name or (self.name.split("/")[-1] + "_tier_stats")):
            parts = []
            for shard in self._shards:
                with internals.ops.colocate_with(shard.handle):
                    parts.append(_shard_tier_stats(shard))
            total = tf.add_n(parts) if len(parts) > 1 else tf.identity(parts[0])
            out = {field: total[i] for i, field in enumerate(TIER_STATS_FIELDS)}
            lookups = tf.cast(out["lookups"], tf.float64)
            out["hit_rate"] = tf.where(
                lookups > 0,
                1.0 - tf.cast(out["cold_reads"], tf.float64) / tf.maximum(lookups, 1.0),
                tf.constant(1.0, tf.float64),
                name="hit_rate",
            )
            return out

    def prefetch(self, ids, name=None):
        """The op that brings the rows of `ids` that are on disk into memory, ahead of the step that reads them.

        Run it for the next batch's ids while the current step computes (in the same `session.run`, with no
        dependency between them, or from an input pipeline thread): the next step's lookups then find those rows in
        memory. It changes no row, version or frequency; rows it brings in may move back to disk later, as any. An
        in-memory embedding's prefetch does nothing; a model-parallel one's reads the keys this process holds.

        Args:
          ids: ids of any shape (key dtype).
          name: optional name scope.

        Returns:
          The op (one per shard, grouped).

        Raises:
          TypeError: ids of the wrong dtype (see `to_keys`).
        """
        with tf.name_scope(name or (self.name.split("/")[-1] + "_prefetch")):
            if self._config.storage is None:
                self.to_keys(ids)  # the same checks as a tiered embedding's
                return tf.no_op(name="no_tier")
            keys, _ = tf.unique(tf.reshape(self.to_keys(ids), [-1]))
            keys = self._config.distribution.local_keys(keys)
            parts, _ = self._partition.split(keys)
            ops = []
            for shard, part in zip(self._shards, parts):
                with internals.ops.colocate_with(shard.handle):
                    ops.append(shard.table.prefetch(part) if shard.table.writable else tf.no_op())
            return tf.group(*ops)

    def tier_settle(self, name=None):
        """The op that waits until every shard's memory tier is within its budget and no row is moving (demoting
        what is over the budget now). Training never needs it (rows move in the background); it makes the tiers'
        sizes exact at a point, e.g. before reading `tier_stats` in a test or a benchmark. Nothing for an in-memory
        embedding.

        Args:
          name: optional name scope.

        Returns:
          The op.
        """
        with tf.name_scope(name or (self.name.split("/")[-1] + "_tier_settle")):
            ops = []
            for shard in self._shards:
                if self._config.storage is not None and shard.table.writable:
                    with internals.ops.colocate_with(shard.handle):
                        ops.append(shard.table.tier_settle())
            return tf.group(*ops) if ops else tf.no_op()

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
        with tf.name_scope(name or (self.name.split("/")[-1] + "_export")):
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

    def check_writable(self, what):
        """Raises a ValueError naming `what` when the embedding's tables are frozen (read-only) serving tables."""
        for shard in self._shards:
            shard.check_writable("%s.%s()" % (self.name, what))

    def slot_values(self, optimizer, slot_name, ids, name=None):
        """Reads an optimizer slot of some keys.

        Args:
          optimizer: the optimizer applied to this embedding.
          slot_name: the TF slot name (e.g. "accumulator" for Adagrad, "m"/"v" for
            Adam, "accum"/"linear" for Ftrl, "rms"/"momentum"/"mg" for RMSProp).
          ids: ids of any shape (key dtype).
          name: optional name scope.

        Returns:
          float32 `ids.shape + [dim]` (`ids.shape + [1]` for a row-wise slot,
          e.g. RowwiseAdagradOptimizer's); keys not in the table read the slot's
          initial value.

        Raises:
          ValueError: the optimizer has no such slot on this embedding.
        """
        self.check_writable("slot_values")
        group = self._shards[0].slot_group(optimizer)
        if group is None or slot_name not in group.slot_names:
            raise ValueError(
                "optimizer %r has no slot %r on dynamic embedding %r (slots: %s)"
                % (
                    getattr(optimizer, "get_name", lambda: optimizer)(),
                    slot_name,
                    self.name,
                    group.slot_names if group else [],
                )
            )
        with tf.name_scope(name or "slot_values"):
            keys = self.to_keys(ids)
            flat = tf.reshape(keys, [-1])
            default = group.initial_values[group.slot_names.index(slot_name)]
            width = group.slot_width(slot_name)
            parts, positions = self._partition.split(flat)
            outs = []
            for shard, part in zip(self._shards, parts):
                shard_col = shard.slot_group(optimizer).column(slot_name)
                with internals.ops.colocate_with(shard.handle):
                    values, _ = shard.table.find(
                        part, tf.fill([width], tf.constant(default, tf.float32)), col_begin=shard_col, cols=width
                    )
                outs.append(values)
            rows = outs[0] if positions is None else tf.dynamic_stitch(positions, outs)
            return tf.reshape(rows, tf.concat([tf.shape(keys), [width]], 0))

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
        self.check_writable("insert")
        with tf.name_scope(name or "insert"):
            ids_keys = self.to_keys(ids)
            keys = tf.reshape(ids_keys, [-1])
            values = tf.convert_to_tensor(values, tf.float32)
            # Checked here, naming the embedding: the reshape and the shard
            # partition below would otherwise fail with messages about themselves.
            what = "insert into dynamic embedding %s: values" % self.name
            n_static = ids_keys.shape.num_elements()
            shape = values.shape
            if shape.rank is not None and not (n_static == 0 and shape.num_elements() == 0):
                rows = shape[:-1].num_elements() if shape.rank >= 1 else None
                if (
                    shape.rank == 0
                    or (shape[-1] is not None and shape[-1] != self.dim)
                    or (rows is not None and n_static is not None and rows != n_static)
                ):
                    raise ValueError(
                        "%s must have shape [n, dim] = [%s, %d] (n = number of ids), got shape %s"
                        % (what, n_static if n_static is not None else "n", self.dim, shape)
                    )
            n = tf.size(keys)
            last = tf.shape(values)[-1:]
            ok = tf.logical_or(
                tf.logical_and(tf.equal(n, 0), tf.equal(tf.size(values), 0)),
                tf.logical_and(
                    tf.reduce_all(tf.equal(last, self.dim)),
                    tf.logical_and(tf.equal(tf.size(last), 1), tf.equal(tf.size(values), n * self.dim)),
                ),
            )
            check = tf.debugging.Assert(
                ok,
                [
                    "%s must have shape [n, dim] with dim = %d and n = number of ids; n =" % (what, self.dim),
                    n,
                    "got shape",
                    tf.shape(values),
                ],
                name="check_values_shape",
            )
            with tf.control_dependencies([check]):
                values = tf.reshape(values, [-1, self.dim])
            if len(self._shards) == 1:
                parts, vparts = [keys], [values]
            else:
                sid = self.shard_ids(keys)
                parts = tf.dynamic_partition(keys, sid, len(self._shards))
                vparts = tf.dynamic_partition(values, sid, len(self._shards))
            ops = []
            for shard, k, v in zip(self._shards, parts, vparts):
                with internals.ops.colocate_with(shard.handle):
                    ops.append(shard.table.insert(k, v, tf.constant(-1, tf.int64), count=False))
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
        self.check_writable("remove")
        with tf.name_scope(name or "remove"):
            keys = tf.reshape(self.to_keys(ids), [-1])
            parts, _ = self._partition.split(keys)
            counts = []
            for shard, k in zip(self._shards, parts):
                with internals.ops.colocate_with(shard.handle):
                    counts.append(shard.table.remove(k))
            return tf.add_n(counts)


# The int64 fields of `DynamicEmbedding.tier_stats`, in the order of the TfExtTableTierStats op's output.
TIER_STATS_FIELDS = refs.TIER_STATS_FIELDS


def _shard_tier_stats(shard):
    """int64 [10]: the shard's tier statistics in `TIER_STATS_FIELDS` order. A frozen serving table is never tiered:
    its keys and bytes, zeros for the rest."""
    if shard.table.writable:
        return shard.table.tier_stats()
    memory = tf.stack([shard.table.size(), shard.table.memory_bytes()])
    return tf.concat([memory, tf.zeros([len(TIER_STATS_FIELDS) - 2], tf.int64)], 0)


def _export_shard(shard, with_slots):
    # A frozen table holds the embedding only: its export has no slots, and zeros as versions and frequencies.
    with internals.ops.colocate_with(shard.handle):
        if with_slots:
            shard.freeze_layout("export(with_slots=True)")
        return ExportedEmbedding(*shard.table.export_split(full_rows=with_slots))
