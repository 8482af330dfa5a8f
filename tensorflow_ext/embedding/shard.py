"""`DynamicEmbeddingShard`: one table of a dynamic embedding, as optimizers and savers see it.

A shard stands in for a variable (name, dtype, shape, device, `handle` as the
gradient target, conversion to a tensor) while its rows live in a hash table.
It owns its row layout (`layout.RowLayout`: embedding columns then optimizer
slot columns), its table as a typed ref (`table`: a `refs.MutableTableRef`
for training, a `refs.FrozenTableRef` for a read-only serving table; the
ref's type is what makes a shard frozen) and this graph's lookups of it
(`shard_lookups.ShardLookups`).
"""

import contextlib

import tensorflow as tf

from tensorflow_ext.embedding import export_mode
from tensorflow_ext.embedding import layout as layout_lib
from tensorflow_ext.embedding import shard_lookups
from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat.internals import object_identity

__all__ = ["DynamicEmbeddingShard"]


class DynamicEmbeddingShard(object):
    """One table of a `DynamicEmbedding`: what optimizers and savers see.

    A shard stands in for a variable: it is in `GraphKeys.TRAINABLE_VARIABLES`
    (when trainable) and in `tf_ext` 's `GraphKeys.DYNAMIC_EMBEDDINGS`; its
    `handle` is the table resource, the target of gradients (an `IndexedSlices`
    whose indices are int64 keys). Its saveable (in `SAVEABLE_OBJECTS`) writes
    `<name>-keys`, `-values`, `-slots`, `-versions`, `-freqs`, `-num_shards`.

    Shards are created by `DynamicEmbedding` (through `get_dynamic_embedding`);
    do not construct them directly.

    Invariants: the table's kind (the type of `table`) is fixed at creation; a
    frozen shard's rows are its embedding (no slot columns) and every write to
    it is refused (`check_writable`); a mutable shard's handle op carries its
    layout's width and column defaults (updated when slot columns are added,
    before the graph first runs).

    Args:
      embedding: the `DynamicEmbedding` this shard belongs to.
      index: int, the shard index in `[0, embedding.num_shards)`.
      name: the shard's name, `<embedding name>/part_<index>`; also the shared
        name of the table resource.
      device: optional device string for the table, or None for the active
        device functions.
      initial_capacity: expected number of keys in this shard (the table grows
        on demand).
      preallocate: allocate the memory of `initial_capacity` keys when the
        table is created (see `tf_ext.HashTable`).
    """

    def __init__(self, embedding, index, name, device, initial_capacity, preallocate=False):
        self._embedding = embedding
        self._index = index
        self._name = name
        self._dim = embedding.dim
        config = embedding.config
        # A serving export's scope may store the rows otherwise (tf_ext.serving.export_rows, freeze_for_serving).
        storage, compact_slots, rounding = export_mode.table_storage(
            refs.storage_name(config.value_dtype), config.compact_slots, config.rounding
        )
        self._layout = layout_lib.RowLayout(
            self._dim,
            embedding.initializer.embedding_column_defaults(self._dim),
            embedding.name,
            storage=storage,
            compact_slots=compact_slots,
            rounding=rounding,
        )
        self._lookups = shard_lookups.ShardLookups(name)
        with tf.control_dependencies(None), tf.compat.v1.name_scope(None):
            with tf.compat.v1.name_scope(embedding.name + "/"):
                with tf.device(device) if device is not None else contextlib.nullcontext():
                    self._table = self._create_table(name, index, initial_capacity, preallocate)
        self._saveable = None

    def _create_table(self, name, index, initial_capacity, preallocate):
        if export_mode.freezing():
            # Created inside tf_ext.serving.freeze_for_serving(): a read-only serving table (no slots, no metadata),
            # never tiered: its flat arrays are built once and read without locks, all in memory.
            return refs.FrozenTableRef.create(
                self._dim, storage=self._layout.storage, shared_name=name, name="part_%d" % index
            )
        tier = self._embedding.config.shard_tier(index)
        if tier is not None and self._layout.storage not in refs.TRAINABLE_STORAGES:
            raise ValueError(
                "dynamic embedding %r has tiered storage, and tf_ext.serving.export_rows(tf.int8) asks for int8 rows, "
                "which cannot be tiered (rows move between the tiers exactly only in float formats): export with "
                "export_rows(tf.float32 / tf.bfloat16 / tf.float16), or freeze_for_serving(value_dtype=tf.int8) "
                "(an in-memory serving table)" % self._embedding.name
            )
        return refs.MutableTableRef.create(
            self._layout,
            initial_capacity=int(initial_capacity),
            shard_bits=-1,
            # Training tables grow every step; on kernels that compact memory
            # on a huge-page fault, huge pages made growth-heavy steps ~20%
            # slower (docs/benchmarks.md). TF_EXT_TABLE_HUGE_PAGES=1 overrides.
            huge_pages=False,
            preallocate=bool(preallocate),
            shared_name=name,
            name="part_%d" % index,
            tier=tier,
        )

    # ---- variable-like interface ------------------------------------------------

    @property
    def name(self):
        """The shard's name, `<embedding name>/part_<i>` (also its checkpoint prefix)."""
        return self._name

    @property
    def handle(self):
        """The table resource (a scalar `resource` tensor)."""
        return self._table.handle

    @property
    def table(self):
        """The table as a typed ref: a `refs.MutableTableRef`, or a `refs.FrozenTableRef` for a read-only serving
        table (created inside `tf_ext.serving.freeze_for_serving()`)."""
        return self._table

    @property
    def frozen(self):
        """True for a read-only serving table (created inside `tf_ext.serving.freeze_for_serving()`)."""
        return not self._table.writable

    def check_writable(self, what):
        """Raises a ValueError naming `what` when the shard is a frozen (read-only) serving table or stores int8
        rows."""
        if not self._table.writable:
            raise ValueError(
                "%s: dynamic embedding %r was created inside tf_ext.serving.freeze_for_serving() and is a read-only "
                "serving table (lookups only); build training and table updates outside that scope"
                % (what, self._embedding.name)
            )
        if self._layout.storage not in refs.TRAINABLE_STORAGES:
            raise ValueError(
                "%s: dynamic embedding %r stores int8 rows (made inside tf_ext.serving.export_rows(tf.int8)), a "
                "serving format that is never trained or updated; build training outside that scope"
                % (what, self._embedding.name)
            )

    @property
    def op(self):
        """The `TfExtTableHandle` op."""
        return self._table.handle.op

    @property
    def device(self):
        """The device string of the table resource (may be empty)."""
        return self._table.handle.device

    @property
    def graph(self):
        """The `tf.Graph` the table resource lives in."""
        return self._table.handle.graph

    @property
    def dtype(self):
        """float32, as optimizers expect of a variable: what the rows read as, whatever `storage` is."""
        return tf.float32

    @property
    def storage(self):
        """How the table stores the embedding columns: a `refs.STORAGES` name ("float32", "bfloat16", ...)."""
        return self._layout.storage

    @property
    def key_dtype(self):
        """The dtype of the table keys: always `tf.int64`.

        Ids of other dtypes are converted by the owning `DynamicEmbedding` (see
        `DynamicEmbedding.key_dtype`).
        """
        return tf.int64

    @property
    def shape(self):
        """`[None, dim]`: a table has no fixed number of rows."""
        return tf.TensorShape([None, self._dim])

    def get_shape(self):
        """Alias of `shape`, for code that treats the shard as a variable.

        Returns:
          `tf.TensorShape([None, dim])`.
        """
        return self.shape

    @property
    def trainable(self):
        """Whether the owning embedding is trainable (see `DynamicEmbedding.trainable`)."""
        return self._embedding.trainable

    @property
    def embedding(self):
        """The `DynamicEmbedding` this shard belongs to."""
        return self._embedding

    @property
    def shard_index(self):
        """The index of this shard in its embedding (an int)."""
        return self._index

    @property
    def dim(self):
        """The embedding dimension (an int): the leading `dim` columns of a row."""
        return self._dim

    @property
    def width(self):
        """Floats per row: dim + the optimizer slot columns."""
        return self._layout.width

    @property
    def column_defaults(self):
        """The `width` values a new key's columns start with."""
        return self._layout.column_defaults

    @property
    def layout(self):
        """The `RowLayout` of the rows (embedding and slot columns)."""
        return self._layout

    @property
    def lookups(self):
        """The `ShardLookups` of this graph: training mode, unique key tensors, the rows lookups read."""
        return self._lookups

    def ref(self):
        """A hashable reference to the shard (as `tf.Variable.ref()`), for code that keys dicts by variable."""
        return object_identity.Reference(self)

    def to_proto(self, export_scope=None):  # pylint: disable=unused-argument
        """Shards are not serialized into MetaGraphDef variable collections.

        Args:
          export_scope: ignored (present for `tf.Variable` compatibility).

        Returns:
          None, so `export_meta_graph` skips the shard in variable collections.
        """
        return None

    def __repr__(self):
        return "<tf_ext.DynamicEmbeddingShard %r dim=%d width=%d device=%r>" % (
            self._name,
            self._dim,
            self._layout.width,
            self.device,
        )

    # ---- layout ---------------------------------------------------------------

    def slot_group(self, optimizer):
        """The `SlotGroup` of `optimizer` on this shard (by identity), or None."""
        return self._layout.group(optimizer)

    @property
    def slot_groups(self):
        """The `SlotGroup`s of this shard (a new list), in layout order."""
        return self._layout.groups

    def add_slot_columns(self, optimizer, slot_names, initial_values, slot_widths=None):
        """Appends `optimizer`'s slot columns to the rows (once per optimizer).

        The table is created when the graph first runs, with the layout its
        handle op carries then; this updates the op's `width` and
        `column_defaults` attrs (graph construction time only).

        Args:
          optimizer: the optimizer object.
          slot_names: list of slot names.
          initial_values: one float per slot: the value of a new key's slot.
          slot_widths: one int per slot, dim or 1 (a row-wise slot); None: dim each.

        Returns:
          The `SlotGroup` (its `offset` is the first slot column).

        Raises:
          ValueError: the layout was frozen (a Saver or an export with slots was
            built for this embedding already).
        """
        self.check_writable("an optimizer (%s)" % type(optimizer).__name__)
        group, changed = self._layout.add_slot_columns(optimizer, slot_names, initial_values, slot_widths)
        if changed:
            self._table.set_handle_layout()
        return group

    def freeze_layout(self, reason):
        """Marks the layout final (called when a Saver/export reads every column).

        Args:
          reason: str naming what froze the layout (used in the error message).
        """
        self._layout.freeze(reason)

    # ---- training/inference lookups -------------------------------------------

    @property
    def is_training(self):
        """True once `set_training()` was called: every lookup of this shard in
        this graph inserts keys, also lookups built later. (Without it, a lookup
        built with is_training=None turns inserting when an optimizer applies a
        gradient that flows through it.)"""
        return self._lookups.is_training

    def set_training(self):
        """Turns the shard's find-only lookups (built with is_training=None) into
        inserting ones, now and for lookups built later (all of them, also those
        whose rows no optimizer trains)."""
        self.check_writable("training lookups")
        self._lookups.set_training()

    # ---- the shard as a tensor: the rows this graph's lookups read ---------------

    def read_keys_and_rows(self, name=None):
        """The keys and rows that this graph's lookups read from this shard.

        A table has no fixed set of rows, so the rows a training step touches
        stand for the shard wherever TF code treats a trainable variable as a
        tensor: `tf.convert_to_tensor(shard)`, `tf.nn.l2_loss(shard)`, histogram
        summaries over `tf.compat.v1.trainable_variables()`. One row per unique key
        per lookup (a key read by two lookups appears twice). The rows are
        differentiable: their gradient reaches the table like the lookups'
        gradients, so an L2 term built from them trains with the model.

        Args:
          name: optional name scope.

        Returns:
          (keys int64 [n], rows float32 [n, dim]) tensors.

        Raises:
          ValueError: no lookup of this graph has read the shard yet (build the
            model's lookups first).
        """
        out = self._lookups.read_keys_and_rows(name or (self._name + "/read_rows/"))
        if out is None:
            raise ValueError(
                "Dynamic embedding shard %s has no value as a tensor yet: it stands for the rows that this graph's "
                "lookups read, and no tf_ext.embedding_lookup* of %r was built. Build the model (its lookups) before "
                "using the shard as a tensor (l2 loss, summaries); to read given keys use "
                "tf_ext.embedding_lookup(emb, ids)." % (self._name, self._embedding.name)
            )
        return out

    def value(self):
        """The rows this graph's lookups read (see `read_keys_and_rows`), [n, dim].

        Returns:
          float32 tensor.
        """
        return self.read_keys_and_rows()[1]

    read_value = value

    def _as_tensor(self, dtype=None, name=None, as_ref=False):
        # as_ref: the table handle, as for a resource variable (tf.gradients(loss, shard) differentiates
        # w.r.t. the handle and gets IndexedSlices of keys, the gradient optimizers apply).
        if as_ref:
            return self._table.handle
        rows = self.read_keys_and_rows()[1]
        if dtype is not None and not tf.as_dtype(dtype).is_compatible_with(rows.dtype):
            raise ValueError(
                "Dynamic embedding shard %s holds float32 rows; cannot convert it to %s"
                % (self._name, tf.as_dtype(dtype).name)
            )
        return rows

    # ---- checkpointing ----------------------------------------------------------

    @property
    def saveable(self):
        """The shard's `SaveableObject` (also in `GraphKeys.SAVEABLE_OBJECTS`)."""
        return self._saveable

    def attach_saveable(self, saveable):
        """Gives the shard its `SaveableObject`, once: the embedding's distribution builds the saveables of all its
        shards together (a model-parallel embedding's share one gather), after the shards exist."""
        if self._saveable is not None:
            raise ValueError("shard %s already has a saveable" % self._name)
        self._saveable = saveable


def _shard_to_tensor(shard, dtype=None, name=None, as_ref=False):
    return shard._as_tensor(dtype=dtype, name=name, as_ref=as_ref)  # pylint: disable=protected-access


tf.register_tensor_conversion_function(DynamicEmbeddingShard, _shard_to_tensor)
