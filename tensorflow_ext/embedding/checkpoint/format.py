"""What a checkpoint holds for each shard of a dynamic embedding: tensor names, the layout record, the delta record.

Pure Python (no graph, no op): the save and restore modules build tensors from these names and records, and the
C++ restore op (`TfExtCheckpointRestoreRows`) reads the same delta record format.

Tensors per shard (prefix = the shard's name, e.g. `user_emb/part_0`):

  <shard>-keys       int64 [n]          the keys (string embeddings: fingerprints)
  <shard>-values     float32 [n, dim]   the embeddings (float32 whatever the table stores: its rows decoded)
  <shard>-slots      float32 [n, s]     the optimizer slot columns (s may be 0)
  <shard>-versions   int64 [n]          global step of each key's last update
  <shard>-freqs      int64 [n]          training lookup counts
  <shard>-num_shards int64 []           the embedding's shard count when it was saved
  <shard>-layout     string []          the layout record (below)
  <shard>-storage    string []          how the table stored the embedding columns, where not "float32"
  <shard>-removed    int64 [m]          delta checkpoints: keys removed since the previous save
  <shard>-delta      string []          delta checkpoints: the delta record (below)

A SavedModel export (and a frozen serving table) writes and reads `LEAN_SUFFIXES` only (and writes the storage
record where the storage is not float32).

The storage record is one of the row storages of `refs.STORAGES` ("bfloat16", "float16", "int8_row"); a
checkpoint without it (a float32 table's, or one written before tables stored rows compactly) stands for
"float32". The saved values are float32 whatever the storage: exact copies of the stored values. A restore into a
table of another storage rounds them to nearest (float32 -> bfloat16 -> float32 keeps the 8 leading significand
bits), except that a training table refuses int8_row values (a model restored from an int8 serving export:
approximations of trained values).

The layout record is a JSON object: format (`LAYOUT_FORMAT`), embedding, dim, width, signature (what a restore
compares: dim and each optimizer's class and slot names in column order; optimizer names and initial values may
differ), description (one line, for messages) and slot_groups (per optimizer: name, class, slots, first column,
initial values). The delta record is text: a header line, then `key=value` lines (kind, id, step, since_step), one
`link=<id> <file name>` line per checkpoint of its chain (oldest first, in the same directory) and one
`owned=<file name>` line per file the delta listener keeps for the chain.

A shard is read through its interface only: `dim`, `width`, `storage`, `slot_groups` (each with `optimizer_name`,
`optimizer_class`, `slot_names`, `offset`, `initial_values`, `dim`, `column(name)`, `slot_width(name)`) and
`embedding.name`.
"""

import json
import os
import re

__all__ = [
    "DELTA_SUFFIX",
    "LAYOUT_FORMAT",
    "LAYOUT_SUFFIX",
    "LEAN_SUFFIXES",
    "REMOVED_SUFFIX",
    "ROW_SUFFIXES",
    "SERVING_ONLY_STORAGE",
    "STORAGE_SUFFIX",
    "SUFFIXES",
    "UNRECORDED_STORAGE",
    "delta_record",
    "delta_record_links",
    "delta_record_owned",
    "describe_layout",
    "layout_record",
    "parse_layout_record",
    "re2_literal",
    "record_field_pattern",
    "signature_field",
    "slot_signature",
    "storage_record",
]

# The rows of a shard (what a delta checkpoint's chain merges), then its shard count.
ROW_SUFFIXES = ("-keys", "-values", "-slots", "-versions", "-freqs")
SUFFIXES = ROW_SUFFIXES + ("-num_shards",)
# What a SavedModel export writes and reads per shard (see tensorflow_ext.serving): the embedding only.
LEAN_SUFFIXES = ("-keys", "-values", "-num_shards")
LAYOUT_SUFFIX = "-layout"
STORAGE_SUFFIX = "-storage"
REMOVED_SUFFIX = "-removed"
DELTA_SUFFIX = "-delta"

LAYOUT_FORMAT = 1
_LAYOUT_FIELDS = ("format", "embedding", "dim", "width", "signature", "description", "slot_groups")
# The storage a checkpoint without a storage record stands for (nothing is written for it).
UNRECORDED_STORAGE = "float32"
# The storage whose values a training table refuses: int8 rows of a serving export are approximations.
SERVING_ONLY_STORAGE = "int8_row"
_DELTA_HEADER = "tf_ext delta checkpoint 1"


def slot_signature(shard):
    """What must agree for slot columns to be restored: dim, and each optimizer's class and slot names in order.

    Optimizer names (e.g. "Adagrad" vs "Adagrad_1") and slot initial values may differ: the columns mean the same.
    """
    groups = ["%s(%s)" % (g.optimizer_class, ",".join(g.slot_names)) for g in shard.slot_groups if g.slot_names]
    return "dim=%d;%s" % (shard.dim, ";".join(groups) if groups else "no slots")


def describe_layout(shard):
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
                ", ".join("%s [%d:%d]" % (n, g.column(n), g.column(n) + g.slot_width(n)) for n in g.slot_names),
            )
        )
    # The storage is named where it is not float32 (the only one before tables stored rows compactly).
    storage = "" if shard.storage == UNRECORDED_STORAGE else ", storage=%s" % shard.storage
    return "dim=%d, width=%d%s, slot columns: %s" % (
        shard.dim,
        shard.width,
        storage,
        "; ".join(parts) if parts else "none",
    )


def layout_record(shard):
    """The row layout a checkpoint records for `shard` (tensor `<shard>-layout`): a JSON string (see the module
    docstring).

    Args:
      shard: a `DynamicEmbeddingShard` (or anything with its layout interface).

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
            "format": LAYOUT_FORMAT,
            "embedding": shard.embedding.name,
            "dim": shard.dim,
            "width": shard.width,
            "signature": slot_signature(shard),
            "description": describe_layout(shard),
            "slot_groups": groups,
        },
        sort_keys=True,
    )


def storage_record(shard):
    """The storage record a checkpoint of `shard` writes (tensor `<shard>-storage`): the table's storage name, or
    None where it is `UNRECORDED_STORAGE` (float32: nothing is written, as before tables stored rows compactly)."""
    return None if shard.storage == UNRECORDED_STORAGE else shard.storage


def parse_layout_record(text):
    """The fields of a layout record (a dict), checked.

    Args:
      text: str or bytes, the `<shard>-layout` tensor's value.

    Returns:
      dict with the fields of the module docstring.

    Raises:
      ValueError: not a layout record, another format, or a field missing.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        record = json.loads(text)
    except ValueError as e:
        raise ValueError("not a dynamic embedding layout record (%s): %r" % (e, text[:80])) from e
    if not isinstance(record, dict) or record.get("format") != LAYOUT_FORMAT:
        raise ValueError(
            "layout record of format %r, this tensorflow_ext reads format %d"
            % (record.get("format") if isinstance(record, dict) else None, LAYOUT_FORMAT)
        )
    missing = [f for f in _LAYOUT_FIELDS if f not in record]
    if missing:
        raise ValueError("layout record without %s" % ", ".join(missing))
    return record


def signature_field(shard):
    """The text by which a layout record names `shard`'s signature (a restore matches it in the record's text)."""
    return '"signature": ' + json.dumps(slot_signature(shard))


def record_field_pattern(field):
    """An RE2 pattern whose group 1 is the value of string field `field` of a layout record (quotes escaped)."""
    return r'"%s": "((?:[^"\\]|\\.)*)"' % field


def re2_literal(text):
    """`text` as an RE2 pattern matching it literally (RE2 rejects some of Python's re.escape escapes)."""
    return re.sub(r"([\\.^$|?*+()\[\]{}])", r"\\\1", text)


def delta_record(kind, save_id, step, since, links, owned=()):
    """The delta record of a save (tensor `<shard>-delta`).

    Args:
      kind: "full" or "delta".
      save_id: the save's unique id.
      step: the checkpoint's global step.
      since: the step the rows of a delta have reached (-1 for a full save).
      links: (id, path) of each checkpoint the delta applies to, oldest first (empty for a full save).
      owned: paths of the files the delta listener keeps for the chain.

    Returns:
      str.
    """
    if kind not in ("full", "delta"):
        raise ValueError("a delta record's kind is 'full' or 'delta', got %r" % (kind,))
    lines = [_DELTA_HEADER, "kind=" + kind, "id=" + save_id, "step=%d" % step, "since_step=%d" % since]
    lines += ["link=%s %s" % (link_id, os.path.basename(path)) for link_id, path in links]
    lines += ["owned=" + os.path.basename(path) for path in owned]
    return "\n".join(lines) + "\n"


def delta_record_links(record, directory):
    """(id, path) of each link of a delta record, the paths in `directory` (the checkpoint's)."""
    out = []
    for line in record.split("\n"):
        if line.startswith("link="):
            link_id, _, base = line[len("link=") :].partition(" ")
            out.append((link_id, os.path.join(directory, base)))
    return out


def delta_record_owned(record, directory):
    """The paths of the files a save kept for its deltas (its record's "owned=" lines), in `directory`."""
    return [os.path.join(directory, line[len("owned=") :]) for line in record.split("\n") if line.startswith("owned=")]
