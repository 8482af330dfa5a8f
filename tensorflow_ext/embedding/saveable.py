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
  <shard>-layout    string []           the row layout (`layout_record`: JSON of dim, width
                                        and each optimizer's class, name and slot columns)

Restore replaces the table's contents (`TfExtTableImport(clear_first=True)`:
the new contents are built aside and swapped in under the table's locks, so a
concurrent lookup sees the old rows or the new ones, never an empty or partly
filled table) and places every key by the current partition (`HashKey(key) % num_shards`),
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
`dim` (the `-values` rows are not `dim` wide). A graph with more shards than
the checkpoint is caught before the Saver reads (`TfExtCheckpointReadOptionalString`
compares the embedding's `part_0-num_shards` where the shard's own tensors are
missing), so it too names both counts rather than a missing tensor. A shard
whose tensors are missing from a checkpoint of the same shard count is the
Saver's NotFoundError naming the tensor (e.g. `Key user_emb/part_2-keys not
found in checkpoint`).
No shard of an embedding is imported before every shard's tensors of the
same Saver were read and checked, so a truncated or corrupt file, or a
mismatch, fails the restore with the tables unchanged.

Slots: when the graph's rows have optimizer slot columns, the checkpoint's
layout record must have the same signature (dim, and each optimizer's class
and slot names in column order; optimizer names and initial values may
differ), else the restore fails naming both layouts: an Adagrad checkpoint is
not loaded into a Momentum model although the widths match. A checkpoint
without the record (written before it existed) is checked by the slot width
alone, with a warning on stderr. `restore_values_only(embeddings)` restores
the embedding values (with versions and frequencies) from any layout, and the
restored keys' slots start from their initial values. A graph without slot
columns (inference, evaluation, plain SGD) restores the values and ignores the
checkpoint's slots. The Saver does not read `-layout` itself (it fails on a
tensor missing from older checkpoints): restore reads it with
`TfExtCheckpointReadOptionalString` from the prefix the Saver restores from.

The tensors are built when the Saver is built (lazily, on first access to
`specs`), which freezes the table layout: create optimizers (minimize /
apply_gradients) before the Saver.
"""

import json
import re
import sys
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.training.saving import saveable_object

from tensorflow_ext import serving
from tensorflow_ext import tf_compat
from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding.checkpoint import delta as delta_lib

__all__ = ["FrozenShardSaveable", "ShardSaveable", "layout_record", "restore_values_only"]

# The rows of a shard (what a delta checkpoint's chain merges), then its shard count.
_ROW_SUFFIXES = ("-keys", "-values", "-slots", "-versions", "-freqs")
_SUFFIXES = _ROW_SUFFIXES + ("-num_shards",)
# What a SavedModel export writes and reads per shard (see tensorflow_ext.serving): the embedding only.
_LEAN_SUFFIXES = ("-keys", "-values", "-num_shards")
_LAYOUT_SUFFIX = "-layout"
_LAYOUT_FORMAT = 1
_RESTORE_OPS = ("RestoreV2", "Restore", "RestoreSlice")

# Per embedding, per Saver restore being built: which shards imported their own
# rows already, and rows read from other shards' tensors still waiting for their
# shard's import (see ShardSaveable.restore).
_restore_builds = weakref.WeakKeyDictionary()


class _RestoreBuild(object):

    def __init__(self):
        self.imported = {}  # shard index -> op importing that shard's own rows
        self.pending = {}  # shard index -> [rows tuples read from other shards]
        self.ready = []  # per shard built: an op that runs once its tensors are read and checked
        self.imports = []  # every import op built, each gated on every shard's `ready`


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


def _slot_signature(shard):
    """What must agree for slot columns to be restored: dim, and each optimizer's class and slot names in order.

    Optimizer names (e.g. "Adagrad" vs "Adagrad_1") and slot initial values may differ: the columns mean the same.
    """
    groups = ["%s(%s)" % (g.optimizer_class, ",".join(g.slot_names)) for g in shard.slot_groups if g.slot_names]
    return "dim=%d;%s" % (shard.dim, ";".join(groups) if groups else "no slots")


def _describe_layout(shard):
    """A one-line description of a shard's row layout, for error messages."""
    parts = []
    for g in shard.slot_groups:
        if not g.slot_names:
            continue
        parts.append(
            "%s (%s): %s"
            % (
                g.optimizer_name,
                g.optimizer_class,
                ", ".join("%s [%d:%d]" % (n, g.column(n), g.column(n) + g.dim) for n in g.slot_names),
            )
        )
    return "dim=%d, width=%d, slot columns: %s" % (shard.dim, shard.width, "; ".join(parts) if parts else "none")


def layout_record(shard):
    """The row layout a checkpoint records for `shard` (tensor `<shard>-layout`): a JSON string.

    Fields: format (1), embedding, dim, width, signature (what a restore compares: dim and each optimizer's class and
    slot names, in column order), description (one line, for messages), and slot_groups (per optimizer: name,
    class, slots, first column, initial values).

    Args:
      shard: a `DynamicEmbeddingShard`.

    Returns:
      str.
    """
    groups = [
        {
            "optimizer": g.optimizer_name,
            "class": g.optimizer_class,
            "slots": list(g.slot_names),
            "offset": g.offset,
            "initial_values": list(g.initial_values),
        }
        for g in shard.slot_groups
    ]
    return json.dumps(
        {
            "format": _LAYOUT_FORMAT,
            "embedding": shard.embedding.name,
            "dim": shard.dim,
            "width": shard.width,
            "signature": _slot_signature(shard),
            "description": _describe_layout(shard),
            "slot_groups": groups,
        },
        sort_keys=True,
    )


def _json_field_pattern(field):
    # The value of a string field of a json.dumps record (escaped quotes included).
    return r'"%s": "((?:[^"\\]|\\.)*)"' % field


def restore_values_only(embeddings=None):
    """Makes checkpoint restores of these embeddings import the embedding values only, not the optimizer slots.

    By default a restore refuses a checkpoint whose row layout (the optimizers and slots each row holds) differs
    from the graph's, e.g. an Adagrad checkpoint restored into a Momentum model. After this call the embeddings
    restore their values (with versions and frequencies) from any checkpoint of the same dim, and every restored key's
    slots start from the optimizers' initial values, as for a new key: what a job that changes its optimizer wants.
    Call it before the Saver is built (in an Estimator's `model_fn`, after building the training op).

    Args:
      embeddings: a `DynamicEmbedding` or a list of them; None (default): every dynamic embedding of the default graph.

    Returns:
      The list of embeddings marked.

    Raises:
      TypeError: an element is not a `DynamicEmbedding`.
      ValueError: a Saver's restore was already built for one of them (it would keep restoring the slots).
    """
    from tensorflow_ext.embedding import creation  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.embedding import variable  # pylint: disable=import-outside-toplevel

    if embeddings is None:
        embeddings = creation.get_dynamic_embeddings()
    elif isinstance(embeddings, variable.DynamicEmbedding):
        embeddings = [embeddings]
    embeddings = list(embeddings)
    for emb in embeddings:
        if not isinstance(emb, variable.DynamicEmbedding):
            raise TypeError(
                "restore_values_only takes DynamicEmbeddings (from tf_ext.get_dynamic_embedding), got %r" % (emb,)
            )
        built = [s.name for s in emb.shards if getattr(s.saveable, "_restore_built", False)]
        if built:
            raise ValueError(
                "restore_values_only(%r) must be called before the Saver is built: a restore of %s was built already "
                "and restores the slots too" % (emb.name, ", ".join(built))
            )
    for emb in embeddings:
        emb._restore_slots = False  # pylint: disable=protected-access
    return embeddings


def _restores_slots(shard):
    return getattr(shard.embedding, "_restore_slots", True)


def _import_rows(shard, rows, clear_first, with_slots):
    """Imports (keys, values, slots, versions, freqs) into `shard` in one op.

    With slots (their width checked before), whole rows; else the embedding columns, and a key new to the table
    starts its slot columns from their initial values. With clear_first the op replaces the table's contents in one
    step (concurrent lookups see the old contents or the new ones)."""
    keys, values, slots, versions, freqs = rows
    slot_width = shard.width - shard.dim
    if with_slots and slot_width > 0:
        rows = tf.concat([values, tf.reshape(slots, [-1, slot_width])], axis=1)
        cols = shard.width
    else:
        rows, cols = values, shard.dim
    return _ops.op("tf_ext_table_import")(
        shard.handle, keys, rows, versions, freqs, col_begin=0, cols=cols, clear_first=clear_first
    )


def _re2_literal(text):
    """`text` as an RE2 pattern matching it literally (RE2 rejects some of Python's re.escape escapes)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


def _in_saver_restore_build():
    """True when `ShardSaveable.specs` is read by TF's Saver to build its restore ops (not its save ops)."""
    return tf_compat.probe("saver_restore_build").active()


def _checkpoint_source(restored_tensor):
    """(prefix tensor, Restore op) of the Restore op that produced `restored_tensor`, or (None, None)."""
    t = restored_tensor
    for _ in range(8):
        if t.op.type in _RESTORE_OPS:
            return t.op.inputs[0], t.op
        if not t.op.inputs:
            return None, None
        t = t.op.inputs[0]
    return None, None


def _release_free_memory(restore_op):
    """`restore_op`, then the freed read buffers given back to the OS (a served process's memory is its tables)."""
    with tf.control_dependencies([restore_op]):
        return _ops.op("tf_ext_release_free_memory")()


class ShardSaveable(saveable_object.SaveableObject):
    """SaveableObject of one `DynamicEmbeddingShard` (see module docstring)."""

    def __init__(self, shard):  # pylint: disable=super-init-not-called
        # SaveableObject.__init__ sets `specs`; ours are built on first use.
        self._shard = shard
        self.op = shard.handle
        self.name = shard.name
        self._specs = None
        self._delta = False

    @property
    def shard(self):
        return self._shard

    @property
    def specs(self):
        if serving.in_saved_model_export():
            # A SavedModel export's Saver writes and restores the embedding columns only.
            return self._lean_specs()
        if _in_saver_restore_build():
            # The Saver reads every spec it restores in one RestoreV2, which fails on a tensor missing from the
            # checkpoint; the layout record is read by restore() itself (optional: older checkpoints lack it).
            return self._all_specs()[: len(_SUFFIXES)]
        return self._all_specs()

    @specs.setter
    def specs(self, value):
        self._specs = value

    def writes_deltas(self):
        """True when this shard's checkpoints are (or, not built yet, will be) written as deltas when asked."""
        return self._specs is None or self._delta

    def _all_specs(self):
        if self._specs is None:
            state = delta_lib.graph_state(self._shard.handle.graph)
            if type(self)._build_specs is not ShardSaveable._build_specs:
                state = None  # a subclass's own tensors (Horovod model parallel): always full
                specs = list(self._build_specs())
            else:
                specs = list(self._build_specs(state))
            # The layout record, for every subclass's specs alike (the layout is frozen by now).
            with tf_ops.colocate_with(self._shard.handle, ignore_existing=True):
                record = tf.constant(
                    layout_record(self._shard), tf.string, name=self.name.replace("/", "_") + "_layout"
                )
            specs.append(saveable_object.SaveSpec(record, "", self.name + _LAYOUT_SUFFIX))
            if state is not None:
                removed, delta_record = self._delta_tensors
                specs.append(saveable_object.SaveSpec(removed, "", self.name + delta_lib.REMOVED_SUFFIX))
                specs.append(saveable_object.SaveSpec(delta_record, "", self.name + delta_lib.DELTA_SUFFIX))
                self._delta = True
            self._specs = specs
        return self._specs

    def _lean_specs(self):
        if getattr(self, "_lean", None) is None:
            shard = self._shard
            with tf_ops.colocate_with(shard.handle, ignore_existing=True):
                with tf.name_scope(shard.name.replace("/", "_") + "_serving_export"):
                    keys, values = self._export_embedding()
                    num_shards = tf.constant(shard.embedding.num_shards, tf.int64, name="num_shards")
            self._lean = [
                saveable_object.SaveSpec(t, "", self.name + suffix)
                for t, suffix in zip((keys, values, num_shards), _LEAN_SUFFIXES)
            ]
        return self._lean

    def _export_embedding(self):
        keys, values, _, _ = _ops.op("tf_ext_table_export")(self._shard.handle, col_begin=0, cols=self._shard.dim)
        return keys, values

    @property
    def device(self):
        return self._shard.handle.device

    def _build_specs(self, delta_state=None):
        shard = self._shard
        shard.freeze_layout("a Saver (checkpoint tensors %s-*)" % shard.name)
        with tf_ops.colocate_with(shard.handle, ignore_existing=True):
            with tf.name_scope(shard.name.replace("/", "_") + "_export"):
                if delta_state is None:
                    keys, rows, versions, freqs = _ops.op("tf_ext_table_export")(
                        shard.handle, col_begin=0, cols=shard.width
                    )
                else:
                    # Delta checkpoints: the rows trained since the previous save (all of them in a full save).
                    keys, rows, versions, freqs, removed, record = delta_lib.save_tensors(shard, delta_state)
                    self._delta_tensors = (removed, record)
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

    def _read_layout(self, restored_tensors):
        """(record, found): the checkpoint's layout record of this shard, read by its own op.

        `TfExtCheckpointReadOptionalString` reads it from the prefix the Saver restores from (a checkpoint written
        before layouts were recorded lacks it, and the Saver's read would fail on that), and checks that this shard's
        tensors lie inside their data file, so a truncated file is an error naming the file. It runs before the
        Saver's RestoreV2 (a control input), whose own error on such a file does not say which file is short.
        """
        prefix, restore_op = _checkpoint_source(restored_tensors[0])
        if prefix is None:
            if len(restored_tensors) > len(_SUFFIXES):
                return restored_tensors[len(_SUFFIXES)], tf.constant(True)
            return tf.constant(""), tf.constant(False)
        # No control dependencies (the restored tensors' checks would make a cycle with the RestoreV2), and where
        # the RestoreV2 runs: the process that reads the checkpoint files.
        with tf.control_dependencies(None), tf_ops.colocate_with(restore_op, ignore_existing=True):
            record, found = _ops.op("tf_ext_checkpoint_read_optional_string")(
                prefix,
                tensor_name=self.name + _LAYOUT_SUFFIX,
                check_tensors=[self.name + suffix for suffix in _SUFFIXES + (_LAYOUT_SUFFIX,)],
                # A graph with more shards than the checkpoint: an error naming both counts (not a missing tensor).
                num_shards_tensor=self._shard.embedding.shards[0].name + "-num_shards",
                num_shards=self._shard.embedding.num_shards,
                name=self.name.replace("/", "_") + "_read_layout",
            )
        restore_op._add_control_input(found.op)  # pylint: disable=protected-access
        return record, found

    def _check_layout(self, record, found, slots):
        """An Assert that the checkpoint's slot columns are the graph's (see the module docstring).

        A checkpoint without the layout record is checked by the slot columns' width alone, with a warning on stderr.
        """
        shard = self._shard
        slot_width = shard.width - shard.dim
        expected = '"signature": ' + json.dumps(_slot_signature(shard))
        signature_ok = tf.strings.regex_full_match(record, "(?s).*" + _re2_literal(expected) + ".*")
        width_ok = tf.logical_and(tf.equal(tf.rank(slots), 2), tf.equal(tf.shape(slots)[-1], slot_width))
        ok = tf.logical_or(tf.logical_and(found, signature_ok), tf.logical_and(tf.logical_not(found), width_ok))
        checkpoint_layout = tf.where(
            found,
            tf.strings.regex_replace(record, "(?s)^.*" + _json_field_pattern("description") + ".*$", r"\1"),
            tf.strings.join(
                [
                    "no layout record (written by an older tensorflow_ext), slot columns ",
                    tf.strings.as_string(tf.shape(slots)[-1]),
                    " wide",
                ]
            ),
        )
        check = tf.debugging.Assert(
            ok,
            [
                "Checkpoint tensors %s-* hold rows of another layout than dynamic embedding %s here, whose optimizer "
                "slots would be restored into the wrong columns. Layout here: %s. Layout in the checkpoint:"
                % (self.name, shard.embedding.name, _describe_layout(shard)),
                checkpoint_layout,
                ". To restore the embedding values only (the slots then start from their initial values), call "
                "tf_ext.embedding.restore_values_only() before building the Saver.",
            ],
            name="check_layout",
        )

        def _warn():
            printed = tf.print(
                "WARNING: checkpoint tensors %s-* have no layout record (a checkpoint written by an older "
                "tensorflow_ext): their optimizer slots are restored because their width fits dynamic embedding %s "
                "(%s); only the width was checked." % (self.name, shard.embedding.name, _describe_layout(shard)),
                output_stream=sys.stderr,
            )
            with tf.control_dependencies([printed]):
                return tf.constant(True)

        with tf.control_dependencies([check]):
            warned = tf.cond(tf.logical_and(tf.logical_not(found), width_ok), _warn, lambda: tf.constant(False))
        return tf.group(check, warned)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        shard = self._shard
        self._restore_built = True
        lean = len(restored_tensors) == len(_LEAN_SUFFIXES)
        if lean:
            # A SavedModel export's Saver (lean specs): keys and embeddings only; versions and frequencies are 0.
            keys, values, num_shards = restored_tensors
            keys = tf.cast(keys, tf.int64)
            versions = freqs = tf.zeros_like(keys)
            slots = tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32)
            with_slots = False
            # Read for its checks only (a truncated file, another shard count): lean checkpoints have no layout.
            record, found = self._read_layout(restored_tensors)
        else:
            keys, values, slots, versions, freqs, num_shards = restored_tensors[: len(_SUFFIXES)]
            with_slots = _restores_slots(shard) and shard.width > shard.dim
            record, found = self._read_layout(restored_tensors)
        with tf_ops.colocate_with(shard.handle, ignore_existing=True):
            checks = self._shape_checks(num_shards, values)
            if with_slots:
                # After the shard-count and dim checks: those errors say more when they apply.
                with tf.control_dependencies(checks):
                    checks.append(self._check_layout(record, found, slots))
            if found is not None:
                # The integrity check of the layout read runs even when the layout is not compared.
                checks.append(found.op)
            with tf.control_dependencies(checks):
                keys = tf.identity(keys)
                values = tf.identity(values)
            keys = tf.cast(keys, tf.int64)
            versions = tf.cast(versions, tf.int64)
            freqs = tf.cast(freqs, tf.int64)
            prefix, restore_op = _checkpoint_source(restored_tensors[0])
            if prefix is not None:
                # A delta checkpoint: its chain's rows, applied in order (else these rows as they are).
                # A serving export's lean Saver reads the embedding only (no link's slots either).
                keys, values, slots, versions, freqs = delta_lib.restore_rows(
                    self.name,
                    prefix,
                    restore_op,
                    (keys, values, slots, versions, freqs),
                    _ROW_SUFFIXES,
                    with_slots=not lean,
                )
            values = tf.reshape(values, [-1, shard.dim])
            rows = self.select_rows((keys, values, slots, versions, freqs))
            emb = shard.embedding
            n = emb.num_shards
            if n == 1:
                imported = _import_rows(shard, rows, clear_first=True, with_slots=with_slots)
                return _release_free_memory(imported) if lean else imported

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

            own_import = _import_rows(shard, tuple(_own(t) for t in rows), clear_first=True, with_slots=with_slots)
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
                            ops.append(_import_rows(other, rows_j, clear_first=False, with_slots=with_slots))
                    else:
                        # Insert now (for a Saver that does not restore shard j), and again
                        # after shard j's own import when this Saver builds it.
                        ops.append(_import_rows(other, rows_j, clear_first=False, with_slots=with_slots))
                        build.pending.setdefault(j, []).append(rows_j)
            for rows_from_other in build.pending.pop(shard.shard_index, []):
                with tf.control_dependencies([own_import]):
                    ops.append(_import_rows(shard, rows_from_other, clear_first=False, with_slots=with_slots))
            build.imported[shard.shard_index] = own_import
            # No shard of the embedding is imported before every shard's tensors are read and checked: a
            # truncated file or a mismatch in one shard fails the restore with no table changed.
            ready = tf.group(
                *(checks + [t.op for t in restored_tensors[: len(_SUFFIXES)]] + [t.op for t in rows]),
                name="read_and_checked",
            )
            for op in ops:
                for other_ready in build.ready:
                    op._add_control_input(other_ready)  # pylint: disable=protected-access
            for op in build.imports:
                op._add_control_input(ready)  # pylint: disable=protected-access
            build.ready.append(ready)
            build.imports.extend(ops)
            return _release_free_memory(tf.group(*ops)) if lean else tf.group(*ops)

    def _shape_checks(self, num_shards, values):
        """Asserts that the checkpoint's shard count and embedding dim are the graph's."""
        shard = self._shard
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
        return checks


class FrozenShardSaveable(ShardSaveable):
    """SaveableObject of a frozen (read-only serving) shard: `<shard>-keys`, `-values` and `-num_shards` only.

    Restoring builds the shard's `table::FrozenTable` from the keys and embedding values of a training checkpoint or
    of a SavedModel (`TfExtFrozenTableBuild`, swapped in whole: concurrent lookups see the old table or the new one).
    """

    @property
    def specs(self):
        return self._lean_specs()

    @specs.setter
    def specs(self, value):
        self._specs = value

    def _export_embedding(self):
        return _ops.op("tf_ext_frozen_table_export")(self._shard.handle, dim=self._shard.dim)

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        shard = self._shard
        self._restore_built = True
        keys, values, num_shards = restored_tensors[: len(_LEAN_SUFFIXES)]
        _, found = self._read_layout(restored_tensors)  # its checks: a truncated file, another shard count
        with tf_ops.colocate_with(shard.handle, ignore_existing=True):
            checks = self._shape_checks(num_shards, values) + [found.op]
            with tf.control_dependencies(checks):
                keys = tf.identity(tf.cast(keys, tf.int64))
                values = tf.identity(tf.cast(values, tf.float32))
            prefix, restore_op = _checkpoint_source(restored_tensors[0])
            if prefix is not None:
                # A delta checkpoint (a frozen export of a training checkpoint): its chain's keys and embeddings.
                zeros = tf.zeros_like(keys)
                keys, values, _, _, _ = delta_lib.restore_rows(
                    self.name,
                    prefix,
                    restore_op,
                    (keys, values, tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32), zeros, zeros),
                    _ROW_SUFFIXES,
                    with_slots=False,
                )
            values = tf.reshape(values, [-1, shard.dim])
            if shard.embedding.num_shards > 1:
                # Keys are placed by the current partition; a key of another shard's tensors is not looked up here.
                own = tf.equal(shard.embedding.shard_ids(keys), shard.shard_index)
                own_idx = tf.reshape(tf.where(own), [-1])
                all_own = tf.reduce_all(own)
                keys, values = (
                    tf.cond(all_own, lambda t=t: tf.identity(t), lambda t=t: tf.gather(t, own_idx))
                    for t in (keys, values)
                )
            build = _ops.op("tf_ext_frozen_table_build")(shard.handle, keys, values)
        return _release_free_memory(build)
