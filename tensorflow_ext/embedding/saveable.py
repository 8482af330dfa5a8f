"""Checkpointing of dynamic embeddings: one SaveableObject per shard.

Each shard's saveable is in `GraphKeys.SAVEABLE_OBJECTS`, so a plain
`tf.compat.v1.train.Saver()` (and MonitoredTrainingSession's and Estimator's
savers, sharded or not) saves and restores the tables with no extra argument.
Tensors written per shard (prefix = the shard's name, e.g. `user_emb/part_0`):

  <shard>-keys      int64 [n]           the keys (string embeddings: fingerprints)
  <shard>-values    float32 [n, dim]    the embeddings
  <shard>-slots     float32 [n, s]      the optimizer slot columns (s may be 0)
  <shard>-versions  int64 [n]           global step of each key's last update
  <shard>-freqs     int64 [n]           training lookup counts
  <shard>-num_shards int64 []           the embedding's shard count when it was saved

Restore replaces the table's contents (`TfExtTableImport(clear_first=True)`)
and places every key by the current partition (`HashKey(key) % num_shards`),
not by the shard tensor it was read from: a key found in another shard's
tensors (a checkpoint written by another partitioner, or edited by hand) is
imported into the shard it belongs to, with its row, slots and metadata, so
no key becomes unreachable. Such a key is inserted into its shard after that
shard's own import when both are restored by the same Saver (and at once when
that Saver does not restore its shard). In the usual case every key is where
it belongs and restore costs one shard-index pass over the keys.
It checks the checkpoint against the graph first and fails with an
InvalidArgumentError naming the shard when they disagree: a different
`num_shards` (restoring part of the shards would silently drop the others'
keys; reshard with `tf.compat.v1.train.warm_start` instead) or a different
`dim` (the `-values` rows are not `dim` wide). A shard whose tensors are
missing from the checkpoint is the Saver's NotFoundError naming the tensor
(e.g. `Key user_emb/part_2-keys not found in checkpoint`).
When the checkpoint's slot columns do not have the width the current graph's
optimizers need (e.g. a checkpoint written by another optimizer), the slots of
the restored keys start from their initial values instead.

The tensors are built when the Saver is built (lazily, on first access to
`specs`), which freezes the table layout: create optimizers (minimize /
apply_gradients) before the Saver.
"""

import weakref

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.training.saving import saveable_object

from tensorflow_ext.embedding import _ops

__all__ = ["ShardSaveable"]

_SUFFIXES = ("-keys", "-values", "-slots", "-versions", "-freqs", "-num_shards")
_RESTORE_OPS = ("RestoreV2", "Restore", "RestoreSlice")

# Per embedding, per Saver restore being built: which shards imported their own
# rows already, and rows read from other shards' tensors still waiting for their
# shard's import (see ShardSaveable.restore).
_restore_builds = weakref.WeakKeyDictionary()


class _RestoreBuild(object):

    def __init__(self):
        self.imported = {}  # shard index -> op importing that shard's own rows
        self.pending = {}  # shard index -> [rows tuples read from other shards]


def _restore_build(embedding, restored_tensor):
    """The `_RestoreBuild` of the Saver whose restore produced `restored_tensor`.

    The shards of one Saver are restored from one filename tensor (the input of
    its Restore ops, shared by the per-device restores of a sharded Saver); a
    tensor that comes from no Restore op falls back to the outermost name scope
    (the Saver's, e.g. "save_1").
    """
    t, key = restored_tensor, None
    for _ in range(8):
        if t.op.type in _RESTORE_OPS:
            key = t.op.inputs[0].ref()
            break
        if not t.op.inputs:
            break
        t = t.op.inputs[0]
    if key is None:
        key = (tf.compat.v1.get_default_graph(), tf.compat.v1.get_default_graph().get_name_scope().split("/")[0])
    builds = _restore_builds.setdefault(embedding, {})
    return builds.setdefault(key, _RestoreBuild())


def _import_rows(shard, rows, clear_first):
    """Imports (keys, values, slots, versions, freqs) into `shard`: the embedding
    columns, then the slot columns when the slots have the width the graph's
    optimizers need (else the keys' slots keep their initial values)."""
    keys, values, slots, versions, freqs = rows
    restore_values = _ops.op("tf_ext_table_import")(
        shard.handle, keys, values, versions, freqs, col_begin=0, cols=shard.dim, clear_first=clear_first
    )
    slot_width = shard.width - shard.dim
    if slot_width == 0:
        return restore_values
    with tf.control_dependencies([restore_values]):
        matches = tf.logical_and(tf.equal(tf.rank(slots), 2), tf.equal(tf.shape(slots)[-1], slot_width))

        def _import_slots():
            with tf.control_dependencies(
                [
                    _ops.op("tf_ext_table_import")(
                        shard.handle,
                        keys,
                        tf.reshape(slots, [-1, slot_width]),
                        versions,
                        freqs,
                        col_begin=shard.dim,
                        cols=slot_width,
                        clear_first=False,
                    )
                ]
            ):
                return tf.constant(True)

        restored_slots = tf.cond(matches, _import_slots, lambda: tf.constant(False))
    return tf.group(restore_values, restored_slots)


class ShardSaveable(saveable_object.SaveableObject):
    """SaveableObject of one `DynamicEmbeddingShard` (see module docstring)."""

    def __init__(self, shard):  # pylint: disable=super-init-not-called
        # SaveableObject.__init__ sets `specs`; ours are built on first use.
        self._shard = shard
        self.op = shard.handle
        self.name = shard.name
        self._specs = None

    @property
    def shard(self):
        return self._shard

    @property
    def specs(self):
        if self._specs is None:
            self._specs = self._build_specs()
        return self._specs

    @specs.setter
    def specs(self, value):
        self._specs = value

    @property
    def device(self):
        return self._shard.handle.device

    def _build_specs(self):
        shard = self._shard
        shard.freeze_layout("a Saver (checkpoint tensors %s-*)" % shard.name)
        with tf_ops.colocate_with(shard.handle, ignore_existing=True):
            with tf.name_scope(shard.name.replace("/", "_") + "_export"):
                keys, rows, versions, freqs = _ops.op("tf_ext_table_export")(
                    shard.handle, col_begin=0, cols=shard.width
                )
                values = rows[:, : shard.dim]
                slots = rows[:, shard.dim :]
                num_shards = tf.constant(shard.embedding.num_shards, tf.int64, name="num_shards")
        tensors = (keys, values, slots, versions, freqs, num_shards)
        return [saveable_object.SaveSpec(t, "", self.name + suffix) for t, suffix in zip(tensors, _SUFFIXES)]

    def select_rows(self, rows):
        """The checkpoint rows this process imports (all of them here).

        A subclass for a table split across processes keeps the keys this
        process owns; the result is then placed into shards as usual.

        Args:
          rows: (keys, values, slots, versions, freqs) tensors read from the
            checkpoint.

        Returns:
          The same tuple, possibly filtered row-wise.
        """
        return rows

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        shard = self._shard
        keys, values, slots, versions, freqs, num_shards = restored_tensors
        with tf_ops.colocate_with(shard.handle, ignore_existing=True):
            checks = [
                tf.debugging.Assert(
                    tf.equal(tf.cast(num_shards, tf.int64), shard.embedding.num_shards),
                    [
                        "Checkpoint tensors %s-* were written by a dynamic embedding with a different number of shards; "
                        "embedding %s has num_shards=%d here (restoring would drop the keys of the other shards; use "
                        "tf.compat.v1.train.warm_start to reshard). Checkpoint num_shards:"
                        % (self.name, shard.embedding.name, shard.embedding.num_shards),
                        num_shards,
                    ],
                    name="check_num_shards",
                ),
                tf.debugging.Assert(
                    tf.logical_and(tf.equal(tf.rank(values), 2), tf.equal(tf.shape(values)[-1], shard.dim)),
                    [
                        "Checkpoint tensor %s-values does not match dynamic embedding %s: its rows must be dim=%d wide. "
                        "Checkpoint shape:" % (self.name, shard.embedding.name, shard.dim),
                        tf.shape(values),
                    ],
                    name="check_dim",
                ),
            ]
            with tf.control_dependencies(checks):
                keys = tf.identity(keys)
                values = tf.identity(values)
            keys = tf.cast(keys, tf.int64)
            versions = tf.cast(versions, tf.int64)
            freqs = tf.cast(freqs, tf.int64)
            values = tf.reshape(values, [-1, shard.dim])
            rows = self.select_rows((keys, values, slots, versions, freqs))
            emb = shard.embedding
            n = emb.num_shards
            if n == 1:
                return _import_rows(shard, rows, clear_first=True)

            # Place every key by the current partition: keys of this tensor that
            # belong to another shard go there (usually none: the cond then passes
            # the tensors through without a copy).
            sid = emb.shard_ids(keys)
            own = tf.equal(sid, shard.shard_index)
            all_own = tf.reduce_all(own)
            own_idx = tf.reshape(tf.where(own), [-1])
            others_idx = tf.reshape(tf.where(tf.logical_not(own)), [-1])

            def _own(t):
                return tf.cond(all_own, lambda: tf.identity(t), lambda: tf.gather(t, own_idx))

            own_import = _import_rows(shard, tuple(_own(t) for t in rows), clear_first=True)
            ops = [own_import]
            others_sid = tf.gather(sid, others_idx)
            parts = [tf.dynamic_partition(tf.gather(t, others_idx), others_sid, n) for t in rows]
            build = _restore_build(emb, restored_tensors[0])
            for j, other in enumerate(emb.shards):
                if j == shard.shard_index:
                    continue
                rows_j = tuple(p[j] for p in parts)
                with tf_ops.colocate_with(other.handle, ignore_existing=True):
                    if j in build.imported:
                        # Shard j's own import was built: insert after it (it clears first).
                        with tf.control_dependencies([build.imported[j]]):
                            ops.append(_import_rows(other, rows_j, clear_first=False))
                    else:
                        # Insert now (for a Saver that does not restore shard j), and again
                        # after shard j's own import when this Saver builds it.
                        ops.append(_import_rows(other, rows_j, clear_first=False))
                        build.pending.setdefault(j, []).append(rows_j)
            for rows_from_other in build.pending.pop(shard.shard_index, []):
                with tf.control_dependencies([own_import]):
                    ops.append(_import_rows(shard, rows_from_other, clear_first=False))
            build.imported[shard.shard_index] = own_import
            return tf.group(*ops)
