"""Python wrappers of the tf_ext table engine (TF1 graph mode).

`HashTable` is a mutable hash table from int64 keys to rows of `width` float32
values: `[embedding (dim) | optimizer slot columns]`, with per-key metadata
(version = last-update step, frequency). It implements TF's lookup-table API
(`lookup`, `insert`, `remove`, `size`, `export`, `resource_handle`), so TF's own
`LookupTable*V2` ops work on its handle, and adds batched row operations
(`find`, `find_or_insert`, `accumulate`, `evict`, ...). See docs/table.md.

A `HashTable` checks and converts user input (key and value dtypes, integer
scalars) and hands it to its `refs.MutableTableRef`, which holds the handle
and the layout and adds the ops.
"""

import numpy as np
import tensorflow as tf

from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat.internals import lookup_ops
from tensorflow_ext.tf_compat.internals import saveable_object

__all__ = ["HashTable", "MAX_CAPACITY"]

# The largest initial_capacity a table accepts: the table core's kMaxCapacity (table/core/table_limits.h), which
# the handle op enforces too; Python's one copy of it. 2^40 rows is far above any machine's memory, so a larger
# value is a mistake (e.g. a vocabulary size in bytes or a partitioner's 2^63 shape).
MAX_CAPACITY = 1 << 40


def check_preallocate(preallocate, initial_capacity, what):
    """The `preallocate` option of a table-creating API (`what` names the table), checked: a bool."""
    if not isinstance(preallocate, (bool, np.bool_)):
        raise TypeError("%s: preallocate must be True or False, got %r" % (what, preallocate))
    if preallocate and not initial_capacity:
        raise ValueError(
            "%s: preallocate=True needs initial_capacity > 0 (the number of keys to allocate memory for)" % what
        )
    return bool(preallocate)


def _keys_tensor(keys):
    """int64 keys; int32/uint keys are cast, other dtypes go to the kernel (which rejects them)."""
    if not isinstance(keys, (tf.Tensor, tf.Variable)):
        try:
            keys = tf.convert_to_tensor(keys, dtype=tf.int64)
        except (TypeError, ValueError):
            keys = tf.convert_to_tensor(keys)
    if keys.dtype in (tf.int32, tf.int16, tf.int8, tf.uint8, tf.uint16, tf.uint32):
        keys = tf.cast(keys, tf.int64)
    return keys


def _float_tensor(x):
    """float32 values; tensors of another dtype go to the kernel (which rejects them)."""
    if isinstance(x, (tf.Tensor, tf.Variable)):
        return x
    try:
        return tf.convert_to_tensor(x, dtype=tf.float32)
    except (TypeError, ValueError):
        return tf.convert_to_tensor(x)


def _int64_scalar(x, what):
    """An int64 tensor for the integer argument `what` (e.g. "step").

    Integer tensors are cast to int64; python/numpy integers are converted.
    Anything else (1.5, True, a float tensor) is rejected here, naming `what`,
    instead of failing in a conversion (or being truncated by a cast). The
    shape (a scalar) is checked by the op.
    """
    if isinstance(x, (tf.Tensor, tf.Variable)):
        if not x.dtype.is_integer:
            raise refs.invalid_argument("%s must be an integer scalar, got a %s tensor" % (what, x.dtype.name))
        return tf.cast(x, tf.int64) if x.dtype != tf.int64 else x
    if np.asarray(x).dtype.kind not in "iu":
        raise refs.invalid_argument("%s must be an integer scalar, got %r" % (what, x))
    return tf.convert_to_tensor(x, dtype=tf.int64)


def _value_storage(value_dtype, what):
    """The storage name of a HashTable's `value_dtype` (`what` names the table), checked: a trainable storage."""
    try:
        storage = refs.storage_name(value_dtype)
    except ValueError:
        storage = None
    if storage not in refs.TRAINABLE_STORAGES:
        hint = (
            " (int8 rows are a serving format: tf_ext.serving.freeze_for_serving(value_dtype=tf.int8))"
            if storage == "int8_row"
            else ""
        )
        raise ValueError(
            "HashTable %r: value_dtype must be tf.float32, tf.bfloat16 or tf.float16, got %r%s"
            % (what, value_dtype, hint)
        )
    return storage


class HashTable(lookup_ops.LookupInterface):
    """A tf_ext hash table: int64 keys -> rows of `width` float32, with metadata.

    The embedding columns may be stored in half precision (`value_dtype` tf.bfloat16 or tf.float16: 2 bytes a
    column instead of 4); every operation still reads and writes float32 (lookups and exports return the stored
    values decoded exactly, writes round them: see `value_dtype` and `rounding` below).

    The table is created in the session's resource manager the first time its
    handle op runs (no initializer to run). Tables with the same `shared_name`
    (and container) are one table; they must agree on the layout (dim, width,
    column_defaults, value_dtype, and rounding for half-precision rows), else
    the handle op fails with FailedPrecondition naming both layouts.

    Keys may have any rank; outputs of row operations have shape
    `keys.shape + [cols]`. Column-range arguments `col_begin`/`cols` select
    columns `[col_begin, col_begin + cols)` of the rows (default: the embedding,
    `[0, dim)`).
    """

    def __init__(
        self,
        dim,
        width=None,
        column_defaults=None,
        initial_capacity=0,
        shard_bits=-1,
        huge_pages=True,
        preallocate=False,
        default_value=0.0,
        name="TfExtHashTable",
        shared_name=None,
        container=None,
        checkpoint=False,
        value_dtype=tf.float32,
        rounding="nearest",
    ):
        """Creates the table's handle op.

        Args:
          dim: int >= 1, the embedding columns `[0, dim)`; `lookup`/TF's lookup ops
            read and write these (value_shape `[dim]`).
          width: floats per row, >= dim (default: dim). Columns past dim hold
            optimizer slots.
          column_defaults: None/empty (zeros) or `width` floats: the values of a new
            key's columns that the inserting op does not provide.
          initial_capacity: expected number of keys (0 <= capacity <= 2^40), a
            hint: the index is pre-sized for up to 2^22 keys (memory the OS backs
            only as keys arrive) and the table grows past it on demand; very
            large values also raise the automatic shard count so that this many
            keys fit.
          shard_bits: log2 of the number of shards, -1 = automatic.
          huge_pages: ask the OS for transparent huge pages for large index and
            row memory: faster random finds over a big table, but a slower first
            touch of freshly grown memory on kernels that compact memory on a
            huge-page fault (a cost for fast-growing training tables, which
            `get_dynamic_embedding` therefore creates without them). The
            environment variable TF_EXT_TABLE_HUGE_PAGES=0|1 overrides it.
          preallocate: allocate the memory of `initial_capacity` keys (index and
            rows) when the table is created, as a static variable's, instead of
            as keys arrive: inserts up to that many keys then take no page
            faults and no index growth. The memory counts from the start.
          default_value: the value `lookup()` returns for missing keys (scalar or
            `[dim]`).
          name: name of the handle op.
          shared_name: tables with the same shared_name share one resource. If
            None, the table is shared under its node name.
          container: resource container ("" = default).
          checkpoint: if True, `tf.compat.v1.train.Saver()` saves and restores the
            table (full rows and metadata, as `<name>-keys`, `-values`,
            `-versions`, `-freqs`) through the SAVEABLE_OBJECTS collection.
            (Dynamic embeddings register their own saveables instead.) The
            saved values are float32 (a half-precision table's are exact);
            restoring into a table of another value_dtype rounds to nearest.
          value_dtype: how the embedding columns `[0, dim)` are stored:
            tf.float32 (default), tf.bfloat16 (float32's range, 8 significant
            bits) or tf.float16 (IEEE half: 11 significant bits, finite values
            saturate at +-65504). Columns past dim stay float32. Lookups,
            finds and exports return float32 either way.
          rounding: how writes that train the rows (fused optimizer updates and
            initialised new rows) round into half-precision columns: "nearest"
            (round to nearest even, the default) or "stochastic" (rounds up
            with probability proportional to the distance, so small updates
            are not lost on average; deterministic per key, step and column).
            insert, import_ and accumulate always round to nearest. Ignored for
            float32.

        Raises:
          tf.errors.InvalidArgumentError: an invalid layout, capacity or
            rounding.
          TypeError, ValueError: preallocate not a bool, or True without an
            initial_capacity; a value_dtype other than float32, bfloat16 or
            float16.
        """
        layout = refs.TableLayout(dim, width, column_defaults, _value_storage(value_dtype, name), rounding=rounding)
        initial_capacity = int(initial_capacity)
        if initial_capacity < 0:
            raise refs.invalid_argument("initial_capacity must be >= 0, got %d" % initial_capacity)
        if initial_capacity > MAX_CAPACITY:
            raise refs.invalid_argument("initial_capacity is absurdly large: %d > 2^40" % initial_capacity)
        self._layout = layout
        self._initial_capacity = initial_capacity
        self._shard_bits = int(shard_bits)
        self._huge_pages = bool(huge_pages)
        self._preallocate = check_preallocate(preallocate, initial_capacity, "HashTable %r" % (name,))
        self._name = name
        self._shared_name = shared_name
        self._container = container or ""
        self._table_name = None
        self._default_value = tf.convert_to_tensor(default_value, dtype=tf.float32)
        super(HashTable, self).__init__(tf.int64, tf.float32)
        self._resource_handle = self._create_resource()
        if checkpoint and not tf.executing_eagerly():
            tf.compat.v1.add_to_collection(
                tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, HashTable._Saveable(self, self._table_name or name)
            )

    def _create_resource(self):
        handle = refs.MutableTableRef.create(
            self._layout,
            initial_capacity=self._initial_capacity,
            shard_bits=self._shard_bits,
            huge_pages=self._huge_pages,
            preallocate=self._preallocate,
            container=self._container,
            shared_name=self._shared_name or "",
            use_node_name_sharing=self._shared_name is None,
            name=self._name,
        ).handle
        if not tf.executing_eagerly():
            self._table_name = handle.op.name.split("/")[-1]
        return handle

    @property
    def _table_ref(self):
        # The ref of the current `resource_handle`: TF calls `_create_resource` again to trace a SavedModel's
        # resource creator, and that handle (of a function graph) must not replace the one the ops use.
        return refs.MutableTableRef(self.resource_handle, self._layout)

    # ---- layout -------------------------------------------------------------

    @property
    def name(self):
        """The table's (node) name."""
        return self._table_name

    @property
    def dim(self):
        """Embedding columns per row."""
        return self._layout.dim

    @property
    def width(self):
        """Floats per row (dim + slot columns)."""
        return self._layout.width

    @property
    def column_defaults(self):
        """The values of a new key's columns that an op does not provide (width floats)."""
        return self._layout.column_defaults

    @property
    def storage_dtype(self):
        """How the embedding columns are stored: tf.float32, tf.bfloat16 or tf.float16 (the `value_dtype` given;
        `value_dtype`, TF's lookup-table contract, is the float32 that lookups return)."""
        return refs.storage_dtype(self._layout.storage)

    @property
    def rounding(self):
        """How training writes round into half-precision columns: "nearest" or "stochastic"."""
        return self._layout.rounding

    @property
    def default_value(self):
        """The float32 value `lookup` returns for missing keys (TF's `LookupInterface` contract)."""
        return self._default_value

    # ---- row operations -----------------------------------------------------

    def find(self, keys, default_value=0.0, return_found=False, col_begin=0, cols=None, name=None):
        """Reads the rows of keys.

        Args:
          keys: int64 tensor of any rank.
          default_value: scalar or `[cols]` float32: the row of a missing key.
          return_found: also return a bool tensor (keys.shape) telling which keys
            are present.
          col_begin: first column of the range (default 0).
          cols: number of columns of the range (default: dim).
          name: op name.

        Returns:
          values `keys.shape + [cols]` float32 (and `found` if return_found).

        Raises:
          tf.errors.InvalidArgumentError (at run time): wrong dtypes, bad
            default_value shape, column range out of the row.
        """
        values, found = self._table_ref.find(
            _keys_tensor(keys), _float_tensor(default_value), col_begin=col_begin, cols=cols, name=name
        )
        return (values, found) if return_found else values

    def lookup(self, keys, name=None):
        """tf.lookup-style lookup: embedding rows, `default_value` for missing keys.

        Args:
          keys: int64 tensor of any rank.
          name: op name.

        Returns:
          float32 tensor `keys.shape + [dim]`.

        Raises:
          InvalidArgumentError (at run time): keys are not int64.
        """
        return self.find(keys, self._default_value, name=name)

    def find_or_insert(self, keys, init_values, step=-1, count=True, col_begin=0, cols=None, name=None):
        """Reads the rows of keys, inserting the missing ones first.

        Args:
          keys: int64 tensor of any rank (n elements).
          init_values: float32 `[n, cols]` (or `keys.shape + [cols]`): row i is the
            initial value of keys[i] if it is new. May also be a callable
            `init(shape, dtype)` (e.g. a TF initializer) returning such a tensor.
            Columns outside the range get column_defaults.
          step: int64 scalar; when >= 0, stored as the keys' version.
          count: bump each key's frequency once per occurrence.
          col_begin: first column of the range (default 0).
          cols: number of columns of the range (default: dim).
          name: op name.

        Returns:
          values `keys.shape + [cols]`. Duplicate keys: the first occurrence
          inserts, the later ones read the inserted row.

        Raises:
          tf.errors.InvalidArgumentError: init_values rows != number of keys, row
            width mismatch, non-scalar step, wrong dtypes; at once (graph
            construction) for a step that is not an integer (e.g. 1.5).
          tf.errors.ResourceExhaustedError (at run time): out of memory.
        """
        keys = _keys_tensor(keys)
        if callable(init_values):
            n = tf.size(keys, out_type=tf.int64)
            range_cols = self._layout.columns(col_begin, cols)[1]
            init_values = init_values(tf.stack([n, tf.constant(range_cols, tf.int64)]), dtype=tf.float32)
        return self._table_ref.find_or_insert(
            keys,
            _float_tensor(init_values),
            _int64_scalar(step, "step"),
            count=bool(count),
            col_begin=col_begin,
            cols=cols,
            name=name,
        )

    def insert(self, keys, values, step=-1, count=False, col_begin=0, cols=None, name=None):
        """Inserts or overwrites rows (duplicates in a batch: the last one wins).

        Args:
          keys: int64 tensor of any rank.
          values: float32 `keys.shape + [cols]` (or `[n, cols]`).
          step: int64 scalar; when >= 0, stored as the keys' version.
          count: bump the keys' frequencies.
          col_begin: first column of the range (default 0).
          cols: number of columns of the range (default: dim). New keys get
            column_defaults outside the range.
          name: op name.

        Returns:
          The op.

        Raises:
          tf.errors.InvalidArgumentError: row width mismatch, wrong row count or
            dtypes, non-scalar step; at once for a step that is not an integer.
          tf.errors.ResourceExhaustedError (at run time): out of memory.
        """
        return self._table_ref.insert(
            _keys_tensor(keys),
            _float_tensor(values),
            _int64_scalar(step, "step"),
            count=bool(count),
            col_begin=col_begin,
            cols=cols,
            name=name,
        )

    def accumulate(self, keys, deltas, step=-1, insert_missing=True, count=False, col_begin=0, cols=None, name=None):
        """Adds deltas to rows (duplicates in a batch: every occurrence is added).

        Args:
          keys: int64 tensor of any rank.
          deltas: float32 `keys.shape + [cols]` (or `[n, cols]`).
          step: int64 scalar; when >= 0, stored as the keys' version.
          insert_missing: missing keys are inserted as column_defaults + delta;
            if False they are skipped.
          count: bump the keys' frequencies.
          col_begin: first column of the range (default 0).
          cols: number of columns of the range (default: dim).
          name: op name.

        Returns:
          The op.

        Raises:
          tf.errors.InvalidArgumentError: as for insert.
          tf.errors.ResourceExhaustedError (at run time): out of memory.
        """
        return self._table_ref.accumulate(
            _keys_tensor(keys),
            _float_tensor(deltas),
            _int64_scalar(step, "step"),
            col_begin=col_begin,
            cols=cols,
            insert_missing=bool(insert_missing),
            count=bool(count),
            name=name,
        )

    def remove(self, keys, name=None):
        """Removes keys (absent ones are ignored).

        Args:
          keys: int64 tensor of any rank.
          name: op name.

        Returns:
          int64 scalar: the number of keys removed.

        Raises:
          InvalidArgumentError (at run time): keys are not int64.
        """
        return self._table_ref.remove(_keys_tensor(keys), name=name)

    def size(self, name=None):
        """The number of keys in the table.

        Args:
          name: op name.

        Returns:
          int64 scalar tensor.
        """
        return self._table_ref.size(name=name)

    def memory_bytes(self, name=None):
        """Bytes held by the table (index + rows + bookkeeping).

        Args:
          name: op name.

        Returns:
          int64 scalar tensor.
        """
        return self._table_ref.memory_bytes(name=name)

    def clear(self, name=None):
        """Removes every key.

        Args:
          name: op name.

        Returns:
          The clear op (no outputs).
        """
        return self._table_ref.clear(name=name)

    def export(self, col_begin=0, cols=None, full_rows=False, name=None):
        """Snapshot of the table.

        Args:
          col_begin: first column of the range (default 0).
          cols: number of columns of the range (default: dim).
          full_rows: export all `width` columns (overrides col_begin/cols).
          name: op name.

        Returns:
          (keys [n] int64, values [n, cols] float32, versions [n] int64,
          frequencies [n] int64), in an unspecified order.
        """
        return self._table_ref.export(col_begin=col_begin, cols=cols, full_rows=full_rows, name=name)

    def import_(
        self,
        keys,
        values,
        versions=None,
        frequencies=None,
        clear_first=True,
        col_begin=0,
        cols=None,
        full_rows=False,
        name=None,
    ):
        """Imports entries with their metadata (restore).

        Args:
          keys: int64 [n] (a vector, as `export` returns them).
          values: float32 [n, cols].
          versions: int64 [n], or None (zeros).
          frequencies: int64 [n], or None (zeros).
          clear_first: remove every key first (restore semantics).
          col_begin: first column of the range, as in export().
          cols: number of columns of the range, as in export().
          full_rows: import all `width` columns, as in export().
          name: op name.

        Returns:
          The op.

        Raises:
          ValueError: keys of a static rank other than 1.
          tf.errors.InvalidArgumentError: keys not a vector (at run time when
            their rank is not static), values rows != number of keys, row width
            mismatch, versions/frequencies of the wrong length.
          tf.errors.ResourceExhaustedError (at run time): out of memory.
        """
        keys = _keys_tensor(keys)
        if keys.shape.rank is not None and keys.shape.rank != 1:
            raise ValueError("import_: keys must be a vector [n] (as export() returns them), got shape %s" % keys.shape)
        empty = tf.zeros([0], tf.int64)
        versions = empty if versions is None else tf.cast(versions, tf.int64)
        frequencies = empty if frequencies is None else tf.cast(frequencies, tf.int64)
        return self._table_ref.import_(
            keys,
            _float_tensor(values),
            versions,
            frequencies,
            clear_first=bool(clear_first),
            col_begin=col_begin,
            cols=cols,
            full_rows=full_rows,
            name=name,
        )

    def evict(self, min_version=-1, min_frequency=-1, name=None):
        """Removes keys with version < min_version or frequency < min_frequency.

        Args:
          min_version: int64 scalar (python int or tensor); keys last updated
            before this global step are removed. Negative: no version test.
          min_frequency: int64 scalar; keys looked up fewer times are removed.
            Negative: no frequency test.
          name: op name.

        Returns:
          int64 scalar: the number of keys removed.
        """
        return self._table_ref.evict(
            _int64_scalar(min_version, "min_version"),
            _int64_scalar(min_frequency, "min_frequency"),
            name=name,
        )

    class _Saveable(saveable_object.SaveableObject):
        """Saves/restores the full rows and metadata of a HashTable (TF1 Saver)."""

        def __init__(self, table, name):
            keys, values, versions, freqs = table.export(full_rows=True)
            specs = [
                saveable_object.SaveSpec(keys, "", name + "-keys"),
                saveable_object.SaveSpec(values, "", name + "-values"),
                saveable_object.SaveSpec(versions, "", name + "-versions"),
                saveable_object.SaveSpec(freqs, "", name + "-freqs"),
            ]
            self.table = table
            super(HashTable._Saveable, self).__init__(table.resource_handle, specs, name)

        def restore(self, restored_tensors, restored_shapes):
            del restored_shapes  # unused
            keys, values, versions, freqs = restored_tensors
            with tf.name_scope("%s_table_restore" % self.name):
                with tf.compat.v1.colocate_with(self.table.resource_handle):
                    return self.table.import_(keys, values, versions, freqs, clear_first=True, full_rows=True)
