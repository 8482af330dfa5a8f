"""The SaveableObjects of dynamic-embedding shards: what a Saver writes and reads for each shard.

Each shard's saveable is in `GraphKeys.SAVEABLE_OBJECTS`, so a plain `tf.compat.v1.train.Saver()` (and
MonitoredTrainingSession's and Estimator's savers, sharded or not) saves and restores the tables with no extra
argument. The tensors are those of `format` (the module docstring lists them).

A saveable's specs depend on the Saver that asks, given as a `SpecMode` (from `export_mode.saver_build()`, set
while TF builds the Saver; never from the call stack):

  FULL           a training Saver's save: rows, slots, versions, frequencies, shard count, the layout record, the
                 storage record of a compact table, and in a graph with delta checkpoints the removed keys and the
                 delta record
  RESTORE_BUILD  a training Saver's restore: `format.SUFFIXES` (what every checkpoint has; the restore reads the
                 layout and storage records and the delta chain with ops of its own)
  LEAN_EXPORT    a SavedModel export's Saver: keys, embeddings and shard count (its save also the storage record of
                 a compact table, which its restore reads with an op of its own)

The tensors of each mode are built once, the first time it is asked for (FULL freezes the table layout: create
optimizers, i.e. minimize / apply_gradients, before the Saver). Restoring is `restore`'s job (its steps and checks
are documented there); a lean restore is one whose Saver asked for lean specs, never told by counting tensors.

The saveables of an embedding's shards are built together (`shard_saveables`) and share one
`restore.SaverRestores`.
"""

import enum

import tensorflow as tf

from tensorflow_ext.embedding import export_mode
from tensorflow_ext.embedding.checkpoint import delta as delta_lib
from tensorflow_ext.embedding.checkpoint import format as ckpt_format
from tensorflow_ext.embedding.checkpoint import restore as restore_lib
from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat import internals

__all__ = ["FrozenShardSaveable", "ShardSaveable", "SpecMode", "shard_saveables"]


class SpecMode(enum.Enum):
    """Which tensors a Saver asks a shard's saveable for (see the module docstring)."""

    FULL = "full"
    RESTORE_BUILD = "restore build"
    LEAN_EXPORT = "lean export"

    @classmethod
    def of(cls, saver_build):
        """The mode for `export_mode.saver_build()`'s value (None outside a Saver build: FULL)."""
        if saver_build is None:
            return cls.FULL
        if saver_build.lean:
            return cls.LEAN_EXPORT
        return cls.RESTORE_BUILD if saver_build.restoring else cls.FULL


def shard_saveables(shards):
    """The saveables of one embedding's shards, sharing one `restore.SaverRestores`: by the kind of the shard's
    table, a `ShardSaveable` (a `refs.MutableTableRef`) or a `FrozenShardSaveable` (a `refs.FrozenTableRef`, a
    read-only serving table)."""
    restores = restore_lib.SaverRestores()
    return [_SAVEABLE_OF_TABLE[type(s.table)](s, restores) for s in shards]


class ShardSaveable(internals.saveable_object.SaveableObject):
    """SaveableObject of one `DynamicEmbeddingShard` (see the module docstring).

    Args:
      shard: the shard.
      restores: the `restore.SaverRestores` shared by the saveables of the embedding's shards.

    A subclass may write other row tensors (`_row_tensors`) and restore only some rows (`select_rows`); one whose
    `supports_deltas` is False always writes full checkpoints.
    """

    supports_deltas = True

    def __init__(self, shard, restores):  # pylint: disable=super-init-not-called
        # SaveableObject.__init__ sets `specs`; ours depend on the Saver that asks (`specs_for`).
        self._shard = shard
        self._restores = restores
        self.op = shard.handle
        self.name = shard.name
        self._full = None  # the FULL specs, once built
        self._lean = None  # the LEAN_EXPORT specs, once built
        self._wrote_deltas = False
        self._restore_built = False

    @property
    def shard(self):
        return self._shard

    @property
    def device(self):
        return self._shard.handle.device

    @property
    def restore_built(self):
        """True once a Saver built a restore of this shard (its slot setting is fixed in it)."""
        return self._restore_built

    def spec_mode(self):
        """The `SpecMode` of the Saver asking now."""
        return SpecMode.of(export_mode.saver_build())

    @property
    def specs(self):
        return self.specs_for(self.spec_mode())

    def specs_for(self, mode):
        """The SaveSpecs of `mode` (built the first time each is asked for)."""
        if mode is SpecMode.LEAN_EXPORT:
            specs = self._lean_specs()
            build = export_mode.saver_build()
            # The storage record is optional (float32 tables write none): the restore reads it itself.
            return specs[: len(ckpt_format.LEAN_SUFFIXES)] if build is not None and build.restoring else specs
        specs = self._full_specs()
        if mode is SpecMode.RESTORE_BUILD:
            # The Saver reads every spec it restores in one RestoreV2, which fails on a tensor missing from the
            # checkpoint; the layout record is read by the restore itself (optional: older checkpoints lack it).
            return specs[: len(ckpt_format.SUFFIXES)]
        return specs

    def writes_deltas(self):
        """True when this shard's checkpoints are (or, not built yet, will be) written as deltas when asked."""
        return self._full is None or self._wrote_deltas

    def _full_specs(self):
        if self._full is None:
            shard = self._shard
            shard.freeze_layout("a Saver (checkpoint tensors %s-*)" % shard.name)
            state = delta_lib.graph_state(shard.handle.graph) if self.supports_deltas else None
            delta_tensors = ()
            if state is None:
                tensors = self._row_tensors()
            else:
                # Delta checkpoints: the rows trained since the previous save (all of them in a full save).
                tensors, delta_tensors = self._delta_row_tensors(state)
            specs = self._save_specs(tensors, ckpt_format.SUFFIXES)
            # The layout record, for every subclass's specs alike (the layout is frozen by now).
            with internals.ops.colocate_with(shard.handle, ignore_existing=True):
                record = tf.constant(
                    ckpt_format.layout_record(shard), tf.string, name=self.name.replace("/", "_") + "_layout"
                )
            specs += self._save_specs((record,), (ckpt_format.LAYOUT_SUFFIX,))
            specs += self._storage_specs()
            if delta_tensors:
                specs += self._save_specs(delta_tensors, (ckpt_format.REMOVED_SUFFIX, ckpt_format.DELTA_SUFFIX))
                self._wrote_deltas = True
            self._full = specs
        return self._full

    def _save_specs(self, tensors, suffixes):
        return [internals.saveable_object.SaveSpec(t, "", self.name + suffix) for t, suffix in zip(tensors, suffixes)]

    def _storage_specs(self):
        """The spec of the storage record (`format.storage_record`), or none for a float32 table."""
        record = ckpt_format.storage_record(self._shard)
        if record is None:
            return []
        with internals.ops.colocate_with(self._shard.handle, ignore_existing=True):
            tensor = tf.constant(record, tf.string, name=self.name.replace("/", "_") + "_storage")
        return self._save_specs((tensor,), (ckpt_format.STORAGE_SUFFIX,))

    def _lean_specs(self):
        if self._lean is None:
            shard = self._shard
            with internals.ops.colocate_with(shard.handle, ignore_existing=True):
                with tf.name_scope(shard.name.replace("/", "_") + "_serving_export"):
                    keys, values = self._export_embedding()
                    num_shards = tf.constant(shard.embedding.num_shards, tf.int64, name="num_shards")
            self._lean = self._save_specs((keys, values, num_shards), ckpt_format.LEAN_SUFFIXES)
            self._lean += self._storage_specs()
        return self._lean

    def _export_embedding(self):
        # Both kinds of table export (keys, embeddings, ...) first.
        keys, values = self._shard.table.export()[:2]
        return keys, values

    def _row_tensors(self):
        """(keys, values, slots, versions, freqs, num_shards) of a full save of the shard."""
        shard = self._shard
        with internals.ops.colocate_with(shard.handle, ignore_existing=True):
            with tf.name_scope(shard.name.replace("/", "_") + "_export"):
                rows = shard.table.export_split(full_rows=True)
                num_shards = tf.constant(shard.embedding.num_shards, tf.int64, name="num_shards")
        return rows + (num_shards,)

    def _delta_row_tensors(self, state):
        """As `_row_tensors`, of the rows a delta save writes, and (removed keys, delta record)."""
        shard = self._shard
        with internals.ops.colocate_with(shard.handle, ignore_existing=True):
            with tf.name_scope(shard.name.replace("/", "_") + "_export"):
                keys, rows, versions, freqs, removed, record = delta_lib.save_tensors(shard, state)
                num_shards = tf.constant(shard.embedding.num_shards, tf.int64, name="num_shards")
        return (keys, rows[:, : shard.dim], rows[:, shard.dim :], versions, freqs, num_shards), (removed, record)

    def select_rows(self, rows):
        """The checkpoint rows this process imports (all of them here).

        A subclass for a table split across processes keeps the keys this process owns; the result is then placed
        into shards as usual.

        Args:
          rows: (keys, values, slots, versions, freqs) tensors read from the checkpoint.

        Returns:
          The same tuple, possibly filtered row-wise.
        """
        return rows

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        shard = self._shard
        self._restore_built = True
        lean = self.spec_mode() is SpecMode.LEAN_EXPORT
        with_slots = not lean and shard.embedding.state.restores_slots and shard.width > shard.dim
        rows, checks = restore_lib.read_and_check(shard, self.name, restored_tensors, lean, with_slots)
        with internals.ops.colocate_with(shard.handle, ignore_existing=True):
            rows = self.select_rows(rows)
            if shard.embedding.num_shards == 1:
                imported = restore_lib.import_rows(shard, rows, clear_first=True, with_slots=with_slots)
            else:
                embedding_restore = self._restores.of(restored_tensors[0])
                ops = embedding_restore.place(shard, rows, with_slots)
                # No shard of the embedding is imported before every shard's tensors are read and checked: a
                # truncated file or a mismatch in one shard fails the restore with no table changed.
                ready = tf.group(
                    *(checks + [t.op for t in restored_tensors[: len(ckpt_format.SUFFIXES)]] + [t.op for t in rows]),
                    name="read_and_checked",
                )
                embedding_restore.gate(ops, ready)
                imported = tf.group(*ops)
        return restore_lib.release_free_memory_after(imported) if lean else imported


class FrozenShardSaveable(ShardSaveable):
    """SaveableObject of a frozen (read-only serving) shard: `<shard>-keys`, `-values` and `-num_shards` only.

    Restoring builds the shard's `table::FrozenTable` from the keys and embedding values of a training checkpoint or
    of a SavedModel (`TfExtFrozenTableBuild`, swapped in whole: concurrent lookups see the old table or the new one).
    """

    supports_deltas = False

    def spec_mode(self):
        return SpecMode.LEAN_EXPORT  # a frozen table holds the embedding only, whoever asks

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        shard = self._shard
        self._restore_built = True
        (keys, values, _, _, _), checks = restore_lib.read_and_check(
            shard, self.name, restored_tensors, lean=True, with_slots=False
        )
        del checks  # keys and values wait for them
        with internals.ops.colocate_with(shard.handle, ignore_existing=True):
            if shard.embedding.num_shards > 1:
                # Keys are placed by the current partition; a key of another shard's tensors is not looked up here.
                keys, values = restore_lib.own_rows(shard, (keys, values))
            build = shard.table.build(keys, tf.cast(values, tf.float32))
        return restore_lib.release_free_memory_after(build)


_SAVEABLE_OF_TABLE = {refs.MutableTableRef: ShardSaveable, refs.FrozenTableRef: FrozenShardSaveable}
