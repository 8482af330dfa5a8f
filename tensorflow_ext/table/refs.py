"""Typed references to tf_ext tables: what a table handle allows, by kind.

A table is a resource in the session's resource manager, reached through a scalar `resource` handle tensor. There
are two kinds, told apart by type (as cuCollections' ``MutableView``/``ReadView`` and the table core's views):

- `MutableTableRef`: a training table (``TfExtTableHandle``): int64 keys -> rows of `width` float32
  ``[embedding (dim) | extra columns]`` with per-key metadata (version = last-update step, frequency). Every row
  operation takes a column range ``[col_begin, col_begin + cols)``; `TableLayout.columns` resolves it (default: the
  embedding ``[0, dim)``). The table may store the leading columns compactly (`TableLayout.storage`); the ops
  still read and write float32.
- `FrozenTableRef`: a read-only serving table (``TfExtFrozenTableHandle``): keys -> ``dim`` floats, no extra
  columns, no metadata. It is filled once (`FrozenTableRef.build`) and then only read.

Both kinds answer `find`, `contains`, `export_split`, `size` and `memory_bytes` with the same signatures, so code
that only reads a table needs no branch on its kind; writes exist only on `MutableTableRef`.

A ref adds no conversion or check of its own beyond the column range: its arguments go to the op as given (the
public `HashTable` checks and converts user input before it reaches its ref). Refs are graph-construction objects:
each method adds one op (two for `export_split`'s padding) and returns its outputs.
"""

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.utils import loader

__all__ = [
    "STORAGES",
    "ROUNDINGS",
    "TRAINABLE_STORAGES",
    "TIER_POLICIES",
    "TIER_STATS_FIELDS",
    "storage_name",
    "storage_dtype",
    "TableLayout",
    "MutableTableRef",
    "FrozenTableRef",
    "release_free_memory",
]

# The row storages, by the names the ops' `storage` attrs and checkpoints use (the C++ names are in
# table/kernels/storage_attrs.h), and the dtype each stands for. "int8_row" is 1 byte per column plus a per-row
# fp16 scale and bias (a serving format).
_STORAGE_DTYPES = (
    ("float32", tf.float32),
    ("bfloat16", tf.bfloat16),
    ("float16", tf.float16),
    ("int8_row", tf.int8),
)
STORAGES = tuple(name for name, _ in _STORAGE_DTYPES)
# The storages of rows that can be trained (updated in place); int8 rows are a serving format only.
TRAINABLE_STORAGES = ("float32", "bfloat16", "float16")
# The storages of 2-byte float values: a read of them is exact in their dtype, so they can be sent in it.
HALF_STORAGES = ("bfloat16", "float16")
# How writes round values into compact columns (the ops' `rounding` attr).
ROUNDINGS = ("nearest", "stochastic")
# Which rows of a tiered table leave memory first (and, past the disk cap, fall off the disk tier): the least
# recently updated (version) or the least frequently looked up (frequency, then version). The `tier_policy` attr.
TIER_POLICIES = ("lru", "lfu")
# The entries of `MutableTableRef.tier_stats()`, in order: the keys and bytes of each tier, how many keys the memory
# budget holds, then counters since the table was created: keys looked up, keys read back from disk (a hit rate is
# 1 - cold_reads / lookups), keys moved to disk, keys that fell off the disk tier (gone), background failures.
TIER_STATS_FIELDS = (
    "memory_keys",
    "memory_bytes",
    "disk_keys",
    "disk_bytes",
    "budget_keys",
    "lookups",
    "cold_reads",
    "demotions",
    "dropped",
    "errors",
)


def storage_name(dtype):
    """The storage name ("float32", "bfloat16", "float16", "int8_row") of rows stored as `dtype`.

    Args:
      dtype: tf.float32, tf.bfloat16, tf.float16 or tf.int8 (int8 rows: per-row scale and bias), or anything
        `tf.as_dtype` takes for them.

    Raises:
      ValueError: another dtype, naming the supported ones.
    """
    try:
        as_dtype = tf.as_dtype(dtype)
    except TypeError:
        as_dtype = None
    for name, storage_as_dtype in _STORAGE_DTYPES:
        if as_dtype == storage_as_dtype:
            return name
    raise ValueError(
        "unsupported row dtype %r: rows are stored as one of %s"
        % (dtype, ", ".join("tf.%s" % d.name for _, d in _STORAGE_DTYPES))
    )


def storage_dtype(name):
    """The dtype (tf.float32, tf.bfloat16, tf.float16, tf.int8) of the storage `name` (see `storage_name`).

    Raises:
      ValueError: an unknown name, naming the known ones.
    """
    for storage, dtype in _STORAGE_DTYPES:
        if isinstance(name, str) and name == storage:
            return dtype
    raise ValueError("unknown row storage %r: expected one of %s" % (name, ", ".join(STORAGES)))


def invalid_argument(msg):
    """A `tf.errors.InvalidArgumentError` with `msg`, for checks made at graph construction."""
    return tf.errors.InvalidArgumentError(None, None, msg)


class TableLayout(object):
    """The columns of a table's rows: `dim` embedding columns, `width` columns in all, new keys' values, and how
    the rows are stored.

    Every operation reads and writes float32 columns. A compact `storage` keeps the leading `compact_cols` columns
    of each row in fewer bytes: the embedding columns, or (`compact_slots`) every column, optimizer slots included;
    the other columns stay float32. Reads decode exactly; writes round: optimizer updates and initialised new rows
    with `rounding`, other writes (insert, import, accumulate) to nearest.

    Invariants: 1 <= dim <= width; the stored defaults are empty (all zeros) or exactly `width` floats; storage and
    rounding are valid names, int8 rows with nearest rounding and without compact slots. A subclass may widen the
    layout (`_widen`), keeping them (with `compact_slots` the compact columns widen too).

    Args:
      dim: int >= 1, the embedding columns `[0, dim)`.
      width: floats per row, >= dim (default: dim).
      column_defaults: None/empty (zeros) or `width` floats: the values of a new key's columns that the inserting
        op does not provide.
      storage: one of `STORAGES`: "float32" (default), "bfloat16", "float16" (2 bytes a column), "int8_row"
        (1 byte a column plus a per-row scale and bias; a serving format). `storage_name(dtype)` maps a dtype.
      compact_slots: store the columns past dim (optimizer slots) in `storage` too (default: float32). Ignored
        for float32 storage.
      rounding: "nearest" (round to nearest even) or "stochastic" (deterministic per key, step and column, so a
        rerun stores the same bits): how optimizer updates round into compact columns. Ignored for float32.

    Raises:
      tf.errors.InvalidArgumentError: dim < 1, width < dim, column_defaults of another length than width, an
        unknown storage or rounding, int8 rows with stochastic rounding or compact slots.
    """

    def __init__(
        self, dim, width=None, column_defaults=None, storage="float32", compact_slots=False, rounding="nearest"
    ):
        dim = int(dim)
        width = dim if width is None else int(width)
        column_defaults = [] if column_defaults is None else [float(v) for v in column_defaults]
        if dim < 1:
            raise invalid_argument("dim must be >= 1, got %d" % dim)
        if width < dim:
            raise invalid_argument("width must be >= dim (%d), got %d" % (dim, width))
        if column_defaults and len(column_defaults) != width:
            raise invalid_argument(
                "column_defaults must be empty or have width (%d) entries, got %d" % (width, len(column_defaults))
            )
        if not isinstance(storage, str) or storage not in STORAGES:
            raise invalid_argument("storage must be one of %s, got %r" % (", ".join(STORAGES), storage))
        if rounding not in ROUNDINGS:
            raise invalid_argument("rounding must be one of %s, got %r" % (", ".join(ROUNDINGS), rounding))
        if not isinstance(compact_slots, (bool, np.bool_)):
            raise invalid_argument("compact_slots must be True or False, got %r" % (compact_slots,))
        if storage == "int8_row" and rounding != "nearest":
            raise invalid_argument(
                'storage "int8_row" rounds to nearest only: rounding must be "nearest", got %r' % rounding
            )
        if storage == "int8_row" and compact_slots:
            raise invalid_argument('storage "int8_row" holds the embedding columns only: compact_slots must be False')
        self._dim = dim
        self._width = width
        self._defaults = column_defaults
        self._storage = storage
        self._compact_slots = bool(compact_slots)
        self._rounding = rounding

    @property
    def dim(self):
        """The embedding columns per row (an int)."""
        return self._dim

    @property
    def width(self):
        """Floats per row: dim + the extra (optimizer slot) columns."""
        return self._width

    @property
    def storage(self):
        """How the compact columns are stored: one of `STORAGES` ("float32": no compact columns)."""
        return self._storage

    @property
    def rounding(self):
        """How optimizer updates round into compact columns: "nearest" or "stochastic"."""
        return self._rounding

    @property
    def compact_slots(self):
        """Whether the columns past dim (optimizer slots) are stored in `storage` too."""
        return self._compact_slots

    @property
    def compact_cols(self):
        """The leading columns of each row stored in `storage`: 0 for float32, else width with compact slots,
        else dim (the handle op's `compact_cols` attr)."""
        if self._storage == "float32":
            return 0
        return self._width if self._compact_slots else self._dim

    @property
    def column_defaults(self):
        """The `width` values a new key's columns start with (a new list)."""
        return list(self._defaults) or [0.0] * self._width

    @property
    def column_defaults_attr(self):
        """The handle op's `column_defaults` attr: empty for all zeros (a new list)."""
        return list(self._defaults)

    def columns(self, col_begin=0, cols=None, full_rows=False):
        """The column range `(col_begin, cols)` of a row operation, as the ops take it.

        Args:
          col_begin: first column (default 0).
          cols: number of columns (default: dim).
          full_rows: all `width` columns (overrides col_begin/cols).

        Returns:
          (int, int). The op checks that the range lies in the row.
        """
        if full_rows:
            return 0, self._width
        return int(col_begin), (self._dim if cols is None else int(cols))

    def _widen(self, width, column_defaults):
        """Sets a larger width and its defaults (empty = zeros); for layouts that grow before the graph runs."""
        self._width = int(width)
        self._defaults = [float(v) for v in column_defaults]


class MutableTableRef(object):
    """A training table's handle with its layout: every row operation, metadata, eviction, change log.

    Args:
      handle: the scalar `resource` tensor of a ``TfExtTableHandle`` op.
      layout: its `TableLayout` (the layout the handle op carries; see `set_handle_layout`).
    """

    writable = True

    def __init__(self, handle, layout):
        self._handle = handle
        self._layout = layout

    @classmethod
    def create(
        cls,
        layout,
        initial_capacity=0,
        shard_bits=-1,
        huge_pages=True,
        preallocate=False,
        container="",
        shared_name="",
        use_node_name_sharing=False,
        name=None,
        tier=None,
    ):
        """Adds a ``TfExtTableHandle`` op for `layout` (the table is created when it first runs).

        Args:
          layout: the `TableLayout`.
          initial_capacity, shard_bits, huge_pages, preallocate: the table's sizing (see `HashTable`).
          container, shared_name, use_node_name_sharing: the resource's sharing (as TF's resource ops).
          name: the op's name.
          tier: None (every row in memory), or this table's own tier: an object with attributes `path` (the
            directory of its on-disk store, one table's alone), `memory_bytes` (> 0: the budget of the rows kept in
            memory), `disk_bytes` (None or 0: unbounded; else the cap of the store's files) and `policy` (one of
            `TIER_POLICIES`), e.g. a `tf_ext.TieredStorage` already divided per shard. Rows beyond the memory budget
            live on disk; every operation still sees all of them. int8 rows cannot be tiered. An optional attribute
            `resolved_root` (None, or the directory `path` was resolved under, as `TieredStorage.shard_tier` sets
            it) becomes the op's ``tier_root``: a process that creates the table with `TF_EXT_TIER_ROOT` set puts
            the store under that root instead.

        Returns:
          The `MutableTableRef`.

        Raises:
          tf.errors.InvalidArgumentError: a tier with a bad field (naming it), or over int8 rows.
        """
        tier_attrs = _tier_attrs(tier, layout)
        handle = loader.load_ops().tf_ext_table_handle(
            dim=layout.dim,
            width=layout.width,
            column_defaults=layout.column_defaults_attr,
            storage=layout.storage,
            compact_cols=layout.compact_cols,
            rounding=layout.rounding,
            initial_capacity=initial_capacity,
            shard_bits=shard_bits,
            huge_pages=huge_pages,
            preallocate=preallocate,
            container=container,
            shared_name=shared_name,
            use_node_name_sharing=use_node_name_sharing,
            name=name,
            **tier_attrs,
        )
        return cls(handle, layout)

    @property
    def handle(self):
        """The table resource (a scalar `resource` tensor)."""
        return self._handle

    @property
    def layout(self):
        """The `TableLayout` of the rows."""
        return self._layout

    @property
    def dim(self):
        """The embedding columns per row."""
        return self._layout.dim

    @property
    def width(self):
        """Floats per row."""
        return self._layout.width

    def set_handle_layout(self):
        """Writes the layout's current width, column defaults and compact columns into the handle op's attrs.

        For a layout that grew after the handle op was built (optimizer slot columns): the table is created with
        the attrs the op carries when it first runs, so this must happen before that (graph construction time).
        """
        op = self._handle.op
        graph_edits.set_attr(op, "width", attr_value_pb2.AttrValue(i=int(self._layout.width)))
        graph_edits.set_attr(op, "compact_cols", attr_value_pb2.AttrValue(i=int(self._layout.compact_cols)))
        graph_edits.set_attr(
            op,
            "column_defaults",
            attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(f=[float(v) for v in self._layout.column_defaults])
            ),
        )

    # ---- reads ---------------------------------------------------------------

    def find(self, keys, default_value, col_begin=0, cols=None, name=None):
        """(values `keys.shape + [cols]`, found bool `keys.shape`): the rows of keys; `default_value` (scalar or
        `[cols]`) for missing ones."""
        col_begin, cols = self._layout.columns(col_begin, cols)
        return loader.load_ops().tf_ext_table_find(
            self._handle, keys, default_value, col_begin=col_begin, cols=cols, name=name
        )

    def contains(self, keys, name=None):
        """bool `keys.shape`: which keys have a row (reads one column; no insert, no count)."""
        return self.find(keys, tf.constant(0.0), cols=1, name=name)[1]

    def size(self, name=None):
        """int64 scalar: the number of keys."""
        return loader.load_ops().tf_ext_table_size(self._handle, name=name)

    def memory_bytes(self, name=None):
        """int64 scalar: bytes held by the table (index + rows + bookkeeping)."""
        return loader.load_ops().tf_ext_table_memory_bytes(self._handle, name=name)

    def export(self, col_begin=0, cols=None, full_rows=False, name=None):
        """(keys [n], values [n, cols], versions [n], frequencies [n]): a snapshot, in an unspecified order."""
        col_begin, cols = self._layout.columns(col_begin, cols, full_rows)
        return loader.load_ops().tf_ext_table_export(self._handle, col_begin=col_begin, cols=cols, name=name)

    def export_split(self, full_rows=False, name=None):
        """(keys, values [n, dim], extra columns [n, width - dim] or [n, 0] unless full_rows, versions,
        frequencies): a snapshot with the embedding and the extra columns apart."""
        if full_rows:
            keys, rows, versions, freqs = self.export(full_rows=True, name=name)
            return keys, rows[:, : self.dim], rows[:, self.dim :], versions, freqs
        keys, values, versions, freqs = self.export(name=name)
        return keys, values, tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32), versions, freqs

    def export_since(self, min_version, col_begin=0, cols=None, full_rows=False, name=None):
        """As `export`, of the rows whose version >= min_version (int64 scalar; -1: all rows)."""
        col_begin, cols = self._layout.columns(col_begin, cols, full_rows)
        return loader.load_ops().tf_ext_table_export_since(
            self._handle, min_version, col_begin=col_begin, cols=cols, name=name
        )

    # ---- writes --------------------------------------------------------------

    def find_or_insert(self, keys, init_values, step, count=True, col_begin=0, cols=None, name=None):
        """values `keys.shape + [cols]`: the rows of keys, missing ones inserted first from `init_values`
        ([n, cols]); `step` (int64 scalar, >= 0) becomes their version; `count` bumps frequencies."""
        col_begin, cols = self._layout.columns(col_begin, cols)
        return loader.load_ops().tf_ext_table_find_or_insert(
            self._handle, keys, init_values, step, col_begin=col_begin, cols=cols, count=count, name=name
        )

    def insert(self, keys, values, step, count=False, col_begin=0, cols=None, name=None):
        """The op that inserts or overwrites the column range of keys (duplicates: the last one wins)."""
        col_begin, cols = self._layout.columns(col_begin, cols)
        return loader.load_ops().tf_ext_table_insert(
            self._handle, keys, values, step, col_begin=col_begin, cols=cols, count=count, name=name
        )

    def accumulate(self, keys, deltas, step, insert_missing=True, count=False, col_begin=0, cols=None, name=None):
        """The op that adds deltas to the column range of keys (duplicates: every occurrence)."""
        col_begin, cols = self._layout.columns(col_begin, cols)
        return loader.load_ops().tf_ext_table_accumulate(
            self._handle,
            keys,
            deltas,
            step,
            col_begin=col_begin,
            cols=cols,
            insert_missing=insert_missing,
            count=count,
            name=name,
        )

    def remove(self, keys, name=None):
        """int64 scalar: the number of keys removed (absent ones are ignored)."""
        return loader.load_ops().tf_ext_table_remove(self._handle, keys, name=name)

    def clear(self, name=None):
        """The op that removes every key."""
        return loader.load_ops().tf_ext_table_clear(self._handle, name=name)

    def import_(
        self, keys, values, versions, frequencies, clear_first=True, col_begin=0, cols=None, full_rows=False, name=None
    ):
        """The op that imports entries with their metadata (keys [n]; versions/frequencies [n] or [0] = zeros);
        `clear_first` removes every key first (restore semantics)."""
        col_begin, cols = self._layout.columns(col_begin, cols, full_rows)
        return loader.load_ops().tf_ext_table_import(
            self._handle,
            keys,
            values,
            versions,
            frequencies,
            col_begin=col_begin,
            cols=cols,
            clear_first=clear_first,
            name=name,
        )

    def evict(self, min_version, min_frequency, name=None):
        """int64 scalar: the number of keys removed with version < min_version or frequency < min_frequency
        (int64 scalars; negative: no test)."""
        return loader.load_ops().tf_ext_table_evict(self._handle, min_version, min_frequency, name=name)

    # ---- change log (delta checkpoints, serving updates) -------------------------

    def change_log_start(self, capacity, channel="checkpoint", name=None):
        """The op that starts (or restarts) logging removed keys in `channel`, up to `capacity` (int64 scalar).

        Channels are independent readers of the same removals ("checkpoint": delta checkpoints; "serving": serving
        updates): each has its own capacity, read marks and commit.
        """
        return loader.load_ops().tf_ext_table_change_log_start(self._handle, capacity, channel=channel, name=name)

    def change_log(self, read_keys=True, channel="checkpoint", name=None):
        """(removed keys int64 [m] (empty unless read_keys), enabled, untracked, overflow bools): `channel`'s state.

        With read_keys the keys and flags returned are marked as read: `change_log_commit` then drops them.
        A channel never started reads as not enabled.
        """
        return loader.load_ops().tf_ext_table_change_log(self._handle, read_keys=read_keys, channel=channel, name=name)

    def change_log_commit(self, channel="checkpoint", name=None):
        """The op that drops from `channel`'s log what its last read saw (after the save that read it succeeded)."""
        return loader.load_ops().tf_ext_table_change_log_commit(self._handle, channel=channel, name=name)

    # ---- tiers (memory over disk) ------------------------------------------------

    def tier_stats(self, name=None):
        """int64 [10]: the tier's sizes and counters, named by `TIER_STATS_FIELDS` in order. An untiered table
        answers its keys and memory bytes, then zeros."""
        return loader.load_ops().tf_ext_table_tier_stats(self._handle, name=name)

    def tier_settle(self, name=None):
        """The op that waits until the memory tier is within its budget and no move to disk is in flight (tests,
        benchmarks: training never needs it). No-op untiered."""
        return loader.load_ops().tf_ext_table_tier_settle(self._handle, name=name)

    def prefetch(self, keys, name=None):
        """The op that brings the on-disk rows of `keys` (int64, any shape) into memory and changes nothing else:
        run it beside one step with the next step's keys, so that their reads overlap the step. No-op untiered."""
        return loader.load_ops().tf_ext_table_prefetch(self._handle, keys, name=name)


class FrozenTableRef(object):
    """A read-only serving table's handle: keys -> `dim` floats, no extra columns, no metadata.

    The read methods match `MutableTableRef`'s (column ranges aside: a frozen row is its embedding); `build` fills
    the table once (a restore), and nothing else writes it. The table stores its rows as `storage` (one of
    `STORAGES`; "int8_row": a uint8 per column plus a per-row fp16 scale and bias, each column within scale / 2 of
    the value it was built from); reads return float32 rows whatever the storage.

    Args:
      handle: the scalar `resource` tensor of a ``TfExtFrozenTableHandle`` op.
      dim: the embedding columns per row.
      storage: the handle op's storage name.
    """

    writable = False

    def __init__(self, handle, dim, storage="float32"):
        self._handle = handle
        self._dim = int(dim)
        self._storage = storage

    @classmethod
    def create(cls, dim, storage="float32", container="", shared_name="", use_node_name_sharing=False, name=None):
        """Adds a ``TfExtFrozenTableHandle`` op (the table is created empty when it first runs).

        Args:
          storage: how the rows are stored, one of `STORAGES` (`storage_name(dtype)` maps a dtype).

        Returns:
          The `FrozenTableRef`.

        Raises:
          ValueError: an unknown storage, naming the known ones.
        """
        storage_dtype(storage)  # validates the name
        handle = loader.load_ops().tf_ext_frozen_table_handle(
            dim=int(dim),
            storage=storage,
            container=container,
            shared_name=shared_name,
            use_node_name_sharing=use_node_name_sharing,
            name=name,
        )
        return cls(handle, dim, storage)

    @property
    def handle(self):
        """The table resource (a scalar `resource` tensor)."""
        return self._handle

    @property
    def dim(self):
        """The embedding columns per row."""
        return self._dim

    @property
    def width(self):
        """Floats per row: dim (a frozen table holds no extra columns)."""
        return self._dim

    @property
    def storage(self):
        """How the rows are stored: one of `STORAGES`."""
        return self._storage

    def build(self, keys, values, name=None):
        """The op that fills the table with keys [n] and float32 values [n, dim] (replacing what it held), stored
        as `storage`: rounded to nearest for "bfloat16" and "float16", quantized per row for "int8_row" (which
        refuses, when the op runs, a row holding a value that is not finite or beyond +-65504, naming its key)."""
        return loader.load_ops().tf_ext_frozen_table_build(self._handle, keys, values, name=name)

    def find(self, keys, default_value, name=None):
        """(values `keys.shape + [dim]`, found bool `keys.shape`); `default_value` (`[dim]`) for missing keys."""
        return loader.load_ops().tf_ext_frozen_table_find(self._handle, keys, default_value, dim=self._dim, name=name)

    def contains(self, keys, name=None):
        """bool `keys.shape`: which keys have a row."""
        return self.find(keys, tf.zeros([self._dim], tf.float32), name=name)[1]

    def size(self, name=None):
        """int64 scalar: the number of keys."""
        return loader.load_ops().tf_ext_frozen_table_size(self._handle, name=name)

    def memory_bytes(self, name=None):
        """int64 scalar: bytes held by the table."""
        return loader.load_ops().tf_ext_frozen_table_memory_bytes(self._handle, name=name)

    def export(self, name=None):
        """(keys [n], values [n, dim]): the table's contents, in an unspecified order."""
        return loader.load_ops().tf_ext_frozen_table_export(self._handle, dim=self._dim, name=name)

    def export_split(self, full_rows=False, name=None):
        """As `MutableTableRef.export_split`: (keys, values, extra columns [n, 0], versions, frequencies), the
        metadata zeros (a frozen table keeps none). `full_rows` changes nothing (a row is its embedding)."""
        del full_rows  # a frozen row has no columns past dim
        keys, values = self.export(name=name)
        zeros = tf.zeros_like(keys)
        return keys, values, tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32), zeros, zeros


def _tier_attrs(tier, layout):
    """The handle op's tier_* attrs of `tier` (see `MutableTableRef.create`), checked."""
    if tier is None:
        return {}
    fields = {}
    for field in ("path", "memory_bytes", "disk_bytes", "policy"):
        if not hasattr(tier, field):
            raise TypeError("tier must have attributes path, memory_bytes, disk_bytes and policy, got %r" % (tier,))
        fields[field] = getattr(tier, field)
    path = fields["path"]
    if not isinstance(path, str) or not path:
        raise invalid_argument("tier path must be a non-empty directory name, got %r" % (path,))
    memory_bytes, disk_bytes = fields["memory_bytes"], 0 if fields["disk_bytes"] is None else fields["disk_bytes"]
    for what, value, least in (("memory_bytes", memory_bytes, 1), ("disk_bytes", disk_bytes, 0)):
        if isinstance(value, (bool, np.bool_)) or np.asarray(value).dtype.kind not in "iu" or np.ndim(value) != 0:
            raise invalid_argument("tier %s must be an integer number of bytes, got %r" % (what, value))
        if int(value) < least:
            raise invalid_argument("tier %s must be >= %d, got %d" % (what, least, int(value)))
    if fields["policy"] not in TIER_POLICIES:
        raise invalid_argument("tier policy must be one of %s, got %r" % (", ".join(TIER_POLICIES), fields["policy"]))
    if layout.storage == "int8_row":
        raise invalid_argument(
            'a tiered table (tier path %r) cannot store int8 rows (storage "int8_row", a serving format: rows moving '
            'between the tiers would be re-quantized); use "float32", "bfloat16" or "float16"' % path
        )
    root = getattr(tier, "resolved_root", None)
    if root is not None and (not isinstance(root, str) or not root):
        raise invalid_argument("tier resolved_root must be None or a non-empty directory name, got %r" % (root,))
    attrs = {
        "tier_path": path,
        "tier_memory_bytes": int(memory_bytes),
        "tier_disk_bytes": int(disk_bytes),
        "tier_policy": fields["policy"],
    }
    if root is not None:
        attrs["tier_root"] = root
    return attrs


def release_free_memory(name=None):
    """The op that gives the allocator's freed memory back to the OS (after a large restore or build)."""
    return loader.load_ops().tf_ext_release_free_memory(name=name)
