"""The row layout of a dynamic embedding's table: `[embedding (dim) | slot columns of each optimizer]`.

A stock optimizer applied to a dynamic embedding keeps its slots (Adagrad's accumulator, Adam's m and v, ...) as
extra columns of the same row, so one probe per key reads and updates everything. A slot takes `dim` columns (one
value per embedding column) or, for a row-wise optimizer (tf_ext.RowwiseAdagradOptimizer), one column. The layout
grows when an optimizer is first applied (before the graph runs) and is frozen once something reads every column (a
Saver, an export with slots): a layout change after that would make the saved columns ambiguous.
"""

import threading
import weakref

import tensorflow as tf

from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat.internals import ops as tf_ops

__all__ = ["SlotGroup", "RowLayout", "DynamicEmbeddingSlot"]


class SlotGroup(object):
    """The slot columns one optimizer added to a shard's rows.

    Invariant: the slots are contiguous, in `slot_names` order, from column `offset`; each is `dim` or 1 columns wide.

    Attributes:
      optimizer_name, optimizer_class: for error messages and checkpoints.
      slot_names: the optimizer's slot names, in column order.
      initial_values: one float per slot: the value of a new key's slot.
      slot_widths: one int per slot: its columns, `dim` (one value per embedding column) or 1 (one value per row).
      offset: the first column of the group.
      dim: the embedding dimension.

    Raises:
      ValueError: slot_widths has another length than slot_names, or a width other than dim or 1.
    """

    def __init__(self, optimizer, slot_names, initial_values, offset, dim, slot_widths=None):
        self.optimizer_ref = weakref.ref(optimizer)
        self.optimizer_name = optimizer.get_name()
        self.optimizer_class = type(optimizer).__name__
        self.slot_names = list(slot_names)
        self.initial_values = [float(v) for v in initial_values]
        self.offset = int(offset)
        self.dim = int(dim)
        self.slot_widths = [self.dim] * len(self.slot_names) if slot_widths is None else [int(w) for w in slot_widths]
        if len(self.slot_widths) != len(self.slot_names) or any(w not in (1, self.dim) for w in self.slot_widths):
            raise ValueError(
                "slot_widths of optimizer %r must give each of its slots %s dim (%d) or 1 columns, got %s"
                % (self.optimizer_name, self.slot_names, self.dim, slot_widths)
            )

    @property
    def width(self):
        """The group's columns, all slots together."""
        return sum(self.slot_widths)

    def slot_width(self, slot_name):
        """The columns of slot_name: dim, or 1 for a row-wise slot."""
        return self.slot_widths[self.slot_names.index(slot_name)]

    def column(self, slot_name):
        """First column of slot_name."""
        return self.offset + sum(self.slot_widths[: self.slot_names.index(slot_name)])


class RowLayout(refs.TableLayout):
    """The columns of a dynamic embedding table's rows and their initial values (thread-safe).

    A `refs.TableLayout` that grows by whole slot groups (`add_slot_columns`) until it is frozen (`freeze`).

    Args:
      dim: the embedding dimension (the first `dim` columns).
      embedding_defaults: the `dim` initial values of the embedding columns (used when a key is inserted without
        its embedding), or None for zeros.
      owner_name: the embedding's name, for error messages.
      storage, compact_slots, rounding: how the rows are stored (see `refs.TableLayout`).
    """

    def __init__(self, dim, embedding_defaults, owner_name, storage="float32", compact_slots=False, rounding="nearest"):
        if embedding_defaults is None or all(v == 0.0 for v in embedding_defaults):
            embedding_defaults = None  # all zeros: the handle op's empty column_defaults
        super(RowLayout, self).__init__(
            dim, dim, embedding_defaults, storage=storage, compact_slots=compact_slots, rounding=rounding
        )
        self._groups = []
        self._frozen_by = None
        self._owner_name = owner_name
        self._lock = threading.Lock()

    @property
    def groups(self):
        """The `SlotGroup`s, in column order (a new list)."""
        return list(self._groups)

    @property
    def frozen_by(self):
        """What froze the layout (str), or None."""
        return self._frozen_by

    def group(self, optimizer):
        """The `SlotGroup` of `optimizer` (by identity), or None."""
        for group in self._groups:
            if group.optimizer_ref() is optimizer:
                return group
        return None

    def add_slot_columns(self, optimizer, slot_names, initial_values, slot_widths=None):
        """Appends `optimizer`'s slot columns (once per optimizer).

        Args:
          optimizer: the optimizer object.
          slot_names: list of slot names.
          initial_values: one float per slot.
          slot_widths: one int per slot, dim or 1 (see `SlotGroup`); None: dim for every slot.

        Returns:
          (the `SlotGroup`, True if the width or defaults changed).

        Raises:
          ValueError: the layout was frozen, or slot_widths are not dim or 1 per slot.
        """
        with self._lock:
            group = self.group(optimizer)
            if group is not None:
                return group, False
            if not slot_names:
                group = SlotGroup(optimizer, [], [], self._dim, self._dim)
                self._groups.append(group)
                return group, False
            if self._frozen_by is not None:
                raise ValueError(
                    "Cannot add the slots %s of optimizer %r to dynamic embedding %r: its table layout was frozen "
                    "when %s was built for it. Build the training op (optimizer.minimize / apply_gradients) before "
                    "creating the Saver (or calling export(with_slots=True))."
                    % (slot_names, optimizer.get_name(), self._owner_name, self._frozen_by)
                )
            group = SlotGroup(optimizer, slot_names, initial_values, self._width, self._dim, slot_widths)
            defaults = self.column_defaults
            for value, width in zip(group.initial_values, group.slot_widths):
                defaults.extend([value] * width)
            self._widen(self._width + group.width, defaults)
            self._groups.append(group)
            return group, True

    def freeze(self, reason):
        """Marks the layout final; later slot columns raise. Keeps the first reason.

        Args:
          reason: what froze it (for the error message).
        """
        with self._lock:
            if self._frozen_by is None:
                self._frozen_by = reason


class DynamicEmbeddingSlot(object):
    """One optimizer slot of a shard (e.g. Adagrad's "accumulator"): columns of the shard's rows.

    `optimizer.get_slot(shard, name)` returns this for a dynamic embedding
    shard (a slot is not a variable here: it lives in the table row). As a
    tensor it is the slot of the keys that this graph's lookups read, in the
    order of `shard.read_keys_and_rows()`; `lookup(keys)` reads any keys.

    Args:
      shard: the `DynamicEmbeddingShard`.
      optimizer: the optimizer that owns the slot.
      slot_name: the TF slot name.
    """

    def __init__(self, shard, optimizer, slot_name):
        self._shard = shard
        self._optimizer = optimizer
        self._slot_name = slot_name

    @property
    def shard(self):
        """The `DynamicEmbeddingShard` whose rows hold the slot."""
        return self._shard

    @property
    def name(self):
        """`<shard name>/<optimizer name>/<slot name>`."""
        return "%s/%s/%s" % (self._shard.name, self._optimizer.get_name(), self._slot_name)

    @property
    def dtype(self):
        """float32."""
        return tf.float32

    @property
    def shape(self):
        """`[None, width]`: `[None, dim]` like the shard, or `[None, 1]` for a row-wise slot."""
        return tf.TensorShape([None, self._group().slot_width(self._slot_name)])

    def _group(self):
        return self._shard.slot_group(self._optimizer)

    def lookup(self, keys, name=None):
        """The slot values of int64 table keys of this shard (missing keys: the slot's initial value).

        Args:
          keys: int64 tensor [n].
          name: optional name scope.

        Returns:
          float32 [n, width] (width: dim, or 1 for a row-wise slot).
        """
        group = self._group()
        width = group.slot_width(self._slot_name)
        default = group.initial_values[group.slot_names.index(self._slot_name)]
        with tf.name_scope(name or "slot_lookup"), tf_ops.colocate_with(self._shard.handle):
            values, _ = self._shard.table.find(
                tf.convert_to_tensor(keys, tf.int64),
                tf.fill([width], tf.constant(default, tf.float32)),
                col_begin=group.column(self._slot_name),
                cols=width,
            )
            return values

    def value(self):
        """The slot of the keys this graph's lookups read (see `DynamicEmbeddingShard.read_keys_and_rows`)."""
        keys, _ = self._shard.read_keys_and_rows()
        return self.lookup(keys)

    def __repr__(self):
        return "<tf_ext.DynamicEmbeddingSlot %r>" % self.name


tf.register_tensor_conversion_function(
    DynamicEmbeddingSlot, lambda slot, dtype=None, name=None, as_ref=False: slot.value()
)
