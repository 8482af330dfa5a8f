"""Restoring a dynamic embedding's shards from a checkpoint, in named steps.

A Saver restores each shard's saveable on its own (`ShardSaveable.restore`), but the shards of one embedding must
be restored together: a key may sit in another shard's tensors, and no shard may change before every shard's
tensors were read and checked. So the saveables of an embedding share one `SaverRestores`, given to them when they
are built; it holds one `EmbeddingRestore` per Saver restore (told apart by the prefix tensor the Saver restores
from), and each shard's restore runs these steps with it:

1. read and check (`read_and_check`): the checkpoint's shard count and `dim` against the graph's (an
   InvalidArgumentError naming the shard: restoring part of the shards would drop the others' keys; reshard with
   `tf.compat.v1.train.warm_start`); the layout record (read by its own op, `TfExtCheckpointReadOptionalString`:
   older checkpoints lack it and the Saver's read would fail; it also checks that the shard's tensors lie inside
   their data file, and names both counts where the graph has more shards than the checkpoint) against the graph's
   optimizer slots; the storage record (read by its own op too: float32 checkpoints have none), where a training
   table refuses int8_row values (before the Saver's read, whose error on a serving export's missing tensors would
   not say why); then, for a delta checkpoint, the rows of its chain (`TfExtCheckpointRestoreRows`).
2. place by partition (`EmbeddingRestore.place`): every key goes to the shard the current partition
   (`HashKey(key) % num_shards`) gives it, not to the shard whose tensors held it. A key of another shard's
   tensors is inserted into its shard after that shard's own import when the same Saver restores both (and at once
   when it does not restore that shard). Usually every key is where it belongs: one shard-index pass over the keys.
3. import (`import_rows`): one `TfExtTableImport` per shard replaces the table's contents in one step (built aside,
   swapped in under the table's locks: a concurrent lookup sees the old rows or the new ones).
4. gate (`EmbeddingRestore.gate`): no import of the embedding runs before every shard's tensors of the same Saver
   were read and checked, so a truncated file or a mismatch fails the restore with every table unchanged.

Storage: checkpoints hold float32 values whatever the table stored (see `format`); a table of another storage than
the checkpoint's rounds them to nearest as it imports them (float32 -> bfloat16 keeps 8 significand bits, and a
bfloat16 table's checkpoint restores into a float32 or bfloat16 table exactly).

Slots: where the graph's rows have slot columns, the checkpoint's layout record must have the same signature
(dim, and each optimizer's class and slot names in column order), else the restore fails naming both layouts. A
checkpoint without the record is checked by the slot width alone, with a warning on stderr.
`restore_values_only(embeddings)` restores the values (with versions and frequencies) from any layout; the
restored keys' slots then start from their initial values. A graph without slot columns (inference, evaluation,
plain SGD) and a lean (SavedModel export) restore read the values only.
"""

import sys

import tensorflow as tf

from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.embedding.checkpoint import delta as delta_lib
from tensorflow_ext.embedding.checkpoint import format as ckpt_format
from tensorflow_ext.table import refs
from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils import loader

__all__ = [
    "EmbeddingRestore",
    "SaverRestores",
    "checkpoint_source",
    "import_rows",
    "own_rows",
    "read_and_check",
    "refuses_serving_only_values",
    "release_free_memory_after",
    "restore_values_only",
    "serving_only_values_message",
]

_RESTORE_OPS = ("RestoreV2", "Restore", "RestoreSlice")
# Ops a restored tensor may pass through between the Restore op and a saveable (TF's Savers hand over the Restore
# op's outputs themselves; a caller that copies them adds identities).
_PASS_THROUGH_OPS = ("Identity",)


def checkpoint_source(restored_tensor):
    """(prefix tensor, Restore op) of the Restore op that produced `restored_tensor`, or (None, None) when it comes
    from none (a restore built outside a Saver)."""
    t = restored_tensor
    while t.op.type in _PASS_THROUGH_OPS:
        t = t.op.inputs[0]
    if t.op.type in _RESTORE_OPS:
        return t.op.inputs[0], t.op
    return None, None


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
    if embeddings is None:
        embeddings = state_lib.get_dynamic_embeddings()
    elif state_lib.is_embedding(embeddings):
        embeddings = [embeddings]
    embeddings = list(embeddings)
    for emb in embeddings:
        if not state_lib.is_embedding(emb):
            raise TypeError(
                "restore_values_only takes DynamicEmbeddings (from tf_ext.get_dynamic_embedding), got %r" % (emb,)
            )
        built = [s.name for s in emb.shards if s.saveable is not None and s.saveable.restore_built]
        if built:
            raise ValueError(
                "restore_values_only(%r) must be called before the Saver is built: a restore of %s was built already "
                "and restores the slots too" % (emb.name, ", ".join(built))
            )
    for emb in embeddings:
        emb.state.restore_values_only()
    return embeddings


def release_free_memory_after(op):
    """`op`, then the freed read buffers given back to the OS (a served process's memory is its tables)."""
    with tf.control_dependencies([op]):
        return refs.release_free_memory()


def import_rows(shard, rows, clear_first, with_slots):
    """Step 3: imports (keys, values, slots, versions, freqs) into `shard` in one op.

    With slots (their width checked before), whole rows; else the embedding columns, and a key new to the table
    starts its slot columns from their initial values. With clear_first the op replaces the table's contents in one
    step (concurrent lookups see the old contents or the new ones)."""
    keys, values, slots, versions, freqs = rows
    slot_width = shard.width - shard.dim
    if with_slots and slot_width > 0:
        rows = tf.concat([values, tf.reshape(slots, [-1, slot_width])], axis=1)
        return shard.table.import_(keys, rows, versions, freqs, clear_first=clear_first, full_rows=True)
    return shard.table.import_(keys, values, versions, freqs, clear_first=clear_first)


def _read_layout(shard, name, restored_tensors):
    """(record, found): the checkpoint's layout record of the shard saved as `name`, read by its own op.

    `TfExtCheckpointReadOptionalString` reads it from the prefix the Saver restores from (a checkpoint written
    before layouts were recorded lacks it, and the Saver's read would fail on that), and checks that the shard's
    tensors lie inside their data file, so a truncated file is an error naming the file. It runs before the Saver's
    RestoreV2 (a control input), whose own error on such a file does not say which file is short.
    """
    prefix, restore_op = checkpoint_source(restored_tensors[0])
    if prefix is None:
        if len(restored_tensors) > len(ckpt_format.SUFFIXES):
            return restored_tensors[len(ckpt_format.SUFFIXES)], tf.constant(True)
        return tf.constant(""), tf.constant(False)
    emb = shard.embedding
    # No control dependencies (the restored tensors' checks would make a cycle with the RestoreV2), and where
    # the RestoreV2 runs: the process that reads the checkpoint files.
    with tf.control_dependencies(None), internals.ops.colocate_with(restore_op, ignore_existing=True):
        record, found = loader.load_ops().tf_ext_checkpoint_read_optional_string(
            prefix,
            tensor_name=name + ckpt_format.LAYOUT_SUFFIX,
            check_tensors=[name + suffix for suffix in ckpt_format.SUFFIXES + (ckpt_format.LAYOUT_SUFFIX,)],
            # A graph with more shards than the checkpoint: an error naming both counts (not a missing tensor).
            num_shards_tensor=emb.shards[0].name + "-num_shards",
            num_shards=emb.num_shards,
            name=name.replace("/", "_") + "_read_layout",
        )
    graph_edits.add_control_input(restore_op, found.op)
    return record, found


def refuses_serving_only_values(shard):
    """Whether `shard` refuses values recorded as `format.SERVING_ONLY_STORAGE` (int8 rows of a serving export:
    approximations of the trained values): a training table does; a serving table (frozen, or a plain one storing
    int8 rows, which is never trained) takes them."""
    return shard.table.writable and shard.storage != ckpt_format.SERVING_ONLY_STORAGE


def serving_only_values_message(name, shard):
    """Why `shard` refuses the values of checkpoint tensors `<name>-*` recorded as `format.SERVING_ONLY_STORAGE`."""
    return (
        "Checkpoint tensors %s-* hold %s values (int8 rows with a per-row scale and bias, as a serving export "
        "stores them: approximations of the trained values), and dynamic embedding %s here is a training "
        "table storing %s rows: refused. Restore training tables from a training checkpoint (storage "
        "float32, bfloat16 or float16); serve int8 rows with tf_ext.serving.freeze_for_serving(value_dtype="
        "tf.int8)." % (name, ckpt_format.SERVING_ONLY_STORAGE, shard.embedding.name, shard.storage)
    )


def _refuse_serving_only_values(shard, name, restored_tensors):
    """An Assert, run before the Saver's read, that the checkpoint's storage record is not int8_row, for a table
    that refuses such values (`refuses_serving_only_values`). None where there is nothing to check: a serving table,
    or a restore built outside a Saver (no checkpoint to read the record from)."""
    prefix, restore_op = checkpoint_source(restored_tensors[0])
    if prefix is None or not refuses_serving_only_values(shard):
        return None
    with tf.control_dependencies(None), internals.ops.colocate_with(restore_op, ignore_existing=True):
        storage, found = loader.load_ops().tf_ext_checkpoint_read_optional_string(
            prefix, tensor_name=name + ckpt_format.STORAGE_SUFFIX, name=name.replace("/", "_") + "_read_storage"
        )
        check = tf.debugging.Assert(
            tf.logical_not(tf.logical_and(found, tf.equal(storage, ckpt_format.SERVING_ONLY_STORAGE))),
            [serving_only_values_message(name, shard)],
            name="check_storage",
        )
    graph_edits.add_control_input(restore_op, check)
    return check


def _check_layout(shard, name, record, found, slots):
    """An Assert that the checkpoint's slot columns are the graph's (see the module docstring).

    A checkpoint without the layout record is checked by the slot columns' width alone, with a warning on stderr.
    """
    slot_width = shard.width - shard.dim
    expected = ckpt_format.signature_field(shard)
    signature_ok = tf.strings.regex_full_match(record, "(?s).*" + ckpt_format.re2_literal(expected) + ".*")
    width_ok = tf.logical_and(tf.equal(tf.rank(slots), 2), tf.equal(tf.shape(slots)[-1], slot_width))
    ok = tf.logical_or(tf.logical_and(found, signature_ok), tf.logical_and(tf.logical_not(found), width_ok))
    checkpoint_layout = tf.where(
        found,
        tf.strings.regex_replace(record, "(?s)^.*" + ckpt_format.record_field_pattern("description") + ".*$", r"\1"),
        tf.strings.join(
            [
                "no layout record (written by an older tensorflow_ext), slot columns ",
                tf.strings.as_string(tf.shape(slots)[-1]),
                " wide",
            ]
        ),
    )
    emb_name = shard.embedding.name
    here = ckpt_format.describe_layout(shard)
    check = tf.debugging.Assert(
        ok,
        [
            "Checkpoint tensors %s-* hold rows of another layout than dynamic embedding %s here, whose optimizer "
            "slots would be restored into the wrong columns. Layout here: %s. Layout in the checkpoint:"
            % (name, emb_name, here),
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
            "(%s); only the width was checked." % (name, emb_name, here),
            output_stream=sys.stderr,
        )
        with tf.control_dependencies([printed]):
            return tf.constant(True)

    with tf.control_dependencies([check]):
        warned = tf.cond(tf.logical_and(tf.logical_not(found), width_ok), _warn, lambda: tf.constant(False))
    return tf.group(check, warned)


def _shape_checks(shard, name, num_shards, values):
    """Asserts that the checkpoint's shard count and embedding dim are the graph's."""
    emb = shard.embedding
    return [
        tf.debugging.Assert(
            tf.equal(tf.cast(num_shards, tf.int64), emb.num_shards),
            [
                "Checkpoint tensors %s-* were written by a dynamic embedding with a different number of shards; "
                "embedding %s has num_shards=%d here (restoring would drop the keys of the other shards; use "
                "tf.compat.v1.train.warm_start to reshard). Checkpoint num_shards:" % (name, emb.name, emb.num_shards),
                num_shards,
            ],
            name="check_num_shards",
        ),
        tf.debugging.Assert(
            tf.logical_and(tf.equal(tf.rank(values), 2), tf.equal(tf.shape(values)[-1], shard.dim)),
            [
                "Checkpoint tensor %s-values does not match dynamic embedding %s: its rows must be dim=%d wide. "
                "Checkpoint shape:" % (name, emb.name, shard.dim),
                tf.shape(values),
            ],
            name="check_dim",
        ),
    ]


def read_and_check(shard, name, restored_tensors, lean, with_slots):
    """Step 1: the rows a restore of `shard` (saved as `name`) imports, and the checks they wait for.

    Args:
      shard: the `DynamicEmbeddingShard` restored.
      name: its saveable's name (the tensors' prefix in the checkpoint).
      restored_tensors: what the Saver read: `LEAN_SUFFIXES` (lean) or `SUFFIXES` (then perhaps the layout record).
      lean: a SavedModel export's restore (keys and embeddings only; versions and frequencies are 0).
      with_slots: the slot columns are restored (their layout is checked).

    Returns:
      ((keys, values [n, dim], slots, versions, freqs), checks): the rows, each tensor after every check of this
      shard (shard count, dim, layout, the layout read's integrity check) and, for a delta checkpoint, its chain's.
    """
    if lean:
        keys, values, num_shards = restored_tensors[: len(ckpt_format.LEAN_SUFFIXES)]
        keys = tf.cast(keys, tf.int64)
        versions = freqs = tf.zeros_like(keys)
        slots = tf.zeros(tf.stack([tf.size(keys), 0]), tf.float32)
    else:
        keys, values, slots, versions, freqs, num_shards = restored_tensors[: len(ckpt_format.SUFFIXES)]
    # Read for its checks even where the layout is not compared (a truncated file, another shard count).
    record, found = _read_layout(shard, name, restored_tensors)
    storage_check = _refuse_serving_only_values(shard, name, restored_tensors)
    with internals.ops.colocate_with(shard.handle, ignore_existing=True):
        checks = _shape_checks(shard, name, num_shards, values)
        if storage_check is not None:
            checks.append(storage_check)
        if with_slots:
            # After the shard-count and dim checks: those errors say more when they apply.
            with tf.control_dependencies(checks):
                checks.append(_check_layout(shard, name, record, found, slots))
        checks.append(found.op)
        with tf.control_dependencies(checks):
            keys = tf.identity(keys)
            values = tf.identity(values)
        keys = tf.cast(keys, tf.int64)
        versions = tf.cast(versions, tf.int64)
        freqs = tf.cast(freqs, tf.int64)
        prefix, restore_op = checkpoint_source(restored_tensors[0])
        if prefix is not None:
            # A delta checkpoint: its chain's rows, applied in order (else these rows as they are). A lean restore
            # reads the embedding only (no link's slots either).
            keys, values, slots, versions, freqs = delta_lib.restore_rows(
                name, prefix, restore_op, (keys, values, slots, versions, freqs), with_slots=not lean
            )
        values = tf.reshape(values, [-1, shard.dim])
    return (keys, values, slots, versions, freqs), checks


def _own_rows(shard, rows):
    """(the rows whose keys the current partition gives to `shard`, each key's shard, which keys are its own).

    The own rows are `rows` themselves, passed through without a copy, when every key is its own (the usual case).
    """
    sid = shard.embedding.shard_ids(rows[0])
    own = tf.equal(sid, shard.shard_index)
    all_own = tf.reduce_all(own)
    own_idx = tf.reshape(tf.where(own), [-1])
    own_rows = tuple(tf.cond(all_own, lambda t=t: tf.identity(t), lambda t=t: tf.gather(t, own_idx)) for t in rows)
    return own_rows, sid, own


def own_rows(shard, rows):
    """Step 2 where other shards' keys are dropped (a read-only serving table): the rows of `rows` (keys first) that
    the current partition gives to `shard`."""
    return _own_rows(shard, rows)[0]


class EmbeddingRestore(object):
    """One Saver's restore of one embedding: which shards imported their own rows, the rows waiting for a shard's
    import, and the gate that holds every import until every shard was read and checked (steps 2 and 4).

    Invariants: `imported` holds each shard index at most once (a Saver restores a shard once); every op in
    `imports` waits for every op in `ready`, whichever shard was built first.
    """

    def __init__(self):
        self.imported = {}  # shard index -> op importing that shard's own rows
        self.pending = {}  # shard index -> [rows tuples read from other shards]
        self.ready = []  # per shard built: an op that runs once its tensors are read and checked
        self.imports = []  # every import op built

    def place(self, shard, rows, with_slots):
        """Step 2 and 3: imports `rows` (read from `shard`'s tensors) by the current partition.

        Returns:
          The import ops built (the shard's own import first).
        """
        emb = shard.embedding
        own, sid, is_own = _own_rows(shard, rows)
        own_import = import_rows(shard, own, clear_first=True, with_slots=with_slots)
        ops = [own_import]
        others_idx = tf.reshape(tf.where(tf.logical_not(is_own)), [-1])
        others_sid = tf.gather(sid, others_idx)
        parts = [tf.dynamic_partition(tf.gather(t, others_idx), others_sid, emb.num_shards) for t in rows]
        for j, other in enumerate(emb.shards):
            if j == shard.shard_index:
                continue
            rows_j = tuple(p[j] for p in parts)
            with internals.ops.colocate_with(other.handle, ignore_existing=True):
                if j in self.imported:
                    # Shard j's own import was built: insert after it (it clears first).
                    with tf.control_dependencies([self.imported[j]]):
                        ops.append(import_rows(other, rows_j, clear_first=False, with_slots=with_slots))
                else:
                    # Insert now (for a Saver that does not restore shard j), and again after shard j's own import
                    # when this Saver builds it.
                    ops.append(import_rows(other, rows_j, clear_first=False, with_slots=with_slots))
                    self.pending.setdefault(j, []).append(rows_j)
        for rows_from_other in self.pending.pop(shard.shard_index, []):
            with tf.control_dependencies([own_import]):
                ops.append(import_rows(shard, rows_from_other, clear_first=False, with_slots=with_slots))
        self.imported[shard.shard_index] = own_import
        return ops

    def gate(self, ops, ready):
        """Step 4: `ops` wait for every shard read so far, and every import so far waits for `ready` (this shard's
        tensors read and checked)."""
        for op in ops:
            for other_ready in self.ready:
                graph_edits.add_control_input(op, other_ready)
        for op in self.imports:
            graph_edits.add_control_input(op, ready)
        self.ready.append(ready)
        self.imports.extend(ops)


class SaverRestores(object):
    """The restores of one embedding: one `EmbeddingRestore` per Saver restore that reads it.

    Shared by the saveables of the embedding's shards (given to each when they are built). The shards of one Saver
    are restored from one prefix tensor (the input of its Restore ops, shared by the per-device restores of a
    sharded Saver); a restore from no Restore op falls back to the outermost name scope (the Saver's, e.g.
    "save_1").
    """

    def __init__(self):
        self._by_source = {}

    def of(self, restored_tensor):
        """The `EmbeddingRestore` of the Saver whose restore produced `restored_tensor`."""
        prefix, _ = checkpoint_source(restored_tensor)
        if prefix is not None:
            key = prefix.ref()
        else:
            graph = tf.compat.v1.get_default_graph()
            key = (graph, graph.get_name_scope().split("/")[0])
        return self._by_source.setdefault(key, EmbeddingRestore())
