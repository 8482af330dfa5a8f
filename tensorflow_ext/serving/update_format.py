"""What a serving update is on disk: its directory, tensor names, layout lines and manifest (pure Python, no TF).

A trainer writes serving updates (`tensorflow_ext.serving.updates`) into one directory; a live model
(`tensorflow_ext.serving.live`) applies them; the follower (`tensorflow_ext.serving.follow`) finds them. All three
read the names below from here, and the C++ apply op compares the same layout lines.

An updates directory holds two kinds of entries, both written as `.tmp-<random>` and renamed when complete (so a
reader never sees a partial one):

  update-<to_step:012d>   the chain: every update the trainer wrote, in to_step order, each a delta from the previous
                          one's to_step, or a full update where the trainer could not write a delta (its first update,
                          or one after changes its change log could not follow). A follower applies the chain in
                          order: a delta costs the served model only its changed rows.
  full-<to_step:012d>     a full snapshot beside the chain: every `full_every`-th update, the trainer also writes the
                          whole model at that update's to_step (kind "full", same format; published after the chain's
                          update of that step). The chain does not need it: a follower reads it only to resync, when
                          its version is older than the oldest delta it could chain from (a gap, or updates deleted by
                          the trainer's `keep`, which deletes only entries older than the newest full one, snapshot or
                          chained: that one and every delta after it stay). Applying a full update rebuilds every table
                          beside the served one: about twice the tables' memory while it applies, like loading the
                          SavedModel again.

Each of them is a directory holding

  update.index, update.data-*   a TF tensor bundle (SaveV2; every tensor CRC-checked when read) with
      tf_ext_update/model_name  string []   the model the update belongs to
      tf_ext_update/layout      string []   the trainer's layout lines (below)
      tf_ext_update/kind        string []   "delta" or "full"
      tf_ext_update/from_step   int64 []    a delta holds every change made at global steps >= from_step
      tf_ext_update/to_step     int64 []    ... up to the trainer's global step to_step (the served version after it)
      <shard>/keys              int64 [n]         per embedding shard: the keys changed (all keys in a full update)
      <shard>/values            float32 [n, dim]  their embeddings (no optimizer slots, no metadata)
      <shard>/removed           int64 [m]         the keys removed (empty in a full update)
      <variable name>           the dense variable's value, whole, in every update
  MANIFEST.json                 the same metadata as JSON, plus counts and the time it was written

Version rule (what makes an update apply): a served model's version is the trainer's global step its state
reflects. A full update applies to any version below its to_step (it replaces every row and dense value). A delta
applies to a model at version v with from_step <= v < to_step: it holds every row whose last training update was at a
step >= from_step, so rows the model already has are rewritten with newer values and the rest are unchanged. A delta
with from_step > v is a gap; one with to_step <= v is stale (already reflected) and changes nothing.

Layout lines, one per entry, sorted, joined by newlines:

  table <shard name> <dim>
  dense <variable name> <dtype name> <shape: comma-separated dims, or "scalar">

A live model applies an update only when every line of its own layout is in the update's layout (the trainer may
write more: variables the served graph does not read).
"""

import json
import os
import re

__all__ = [
    "BUNDLE_NAME",
    "FORMAT_VERSION",
    "KIND_DELTA",
    "KIND_FULL",
    "KINDS",
    "MANIFEST_NAME",
    "META_FROM_STEP",
    "META_KIND",
    "META_LAYOUT",
    "META_MODEL_NAME",
    "META_NAMES",
    "META_TO_STEP",
    "TMP_PREFIX",
    "UpdateFormatError",
    "bundle_prefix",
    "dense_entry",
    "dense_name",
    "keys_name",
    "layout",
    "layout_difference",
    "list_snapshots",
    "list_updates",
    "parse_layout",
    "parse_snapshot_dir_name",
    "parse_update_dir_name",
    "read_manifest",
    "removed_name",
    "snapshot_dir_name",
    "table_entry",
    "update_dir_name",
    "values_name",
    "write_manifest",
]

FORMAT_VERSION = 1
BUNDLE_NAME = "update"
MANIFEST_NAME = "MANIFEST.json"
TMP_PREFIX = ".tmp-"
_DIR_PREFIX = "update-"
_DIR_RE = re.compile(r"^update-(\d{12,})$")
_SNAPSHOT_PREFIX = "full-"
_SNAPSHOT_RE = re.compile(r"^full-(\d{12,})$")

META_MODEL_NAME = "tf_ext_update/model_name"
META_LAYOUT = "tf_ext_update/layout"
META_KIND = "tf_ext_update/kind"
META_FROM_STEP = "tf_ext_update/from_step"
META_TO_STEP = "tf_ext_update/to_step"
# The order in which the apply graph reads them (and the C++ check op takes them).
META_NAMES = (META_MODEL_NAME, META_LAYOUT, META_KIND, META_FROM_STEP, META_TO_STEP)

KIND_DELTA = "delta"
KIND_FULL = "full"
KINDS = (KIND_DELTA, KIND_FULL)

# The manifest's required fields and their types.
_MANIFEST_FIELDS = {
    "format": int,
    "model_name": str,
    "kind": str,
    "from_step": int,
    "to_step": int,
    "layout": str,
    "created_unix": float,
    "keys": int,
    "removed": int,
}


class UpdateFormatError(ValueError):
    """A serving update directory or manifest that is not what this module describes (the message names it)."""


def keys_name(shard_name):
    return shard_name + "/keys"


def values_name(shard_name):
    return shard_name + "/values"


def removed_name(shard_name):
    return shard_name + "/removed"


def dense_name(variable_name):
    """The bundle name of a dense variable's value: the variable's name without the ":0"."""
    return variable_name[:-2] if variable_name.endswith(":0") else variable_name


def table_entry(shard_name, dim):
    _check_name(shard_name)
    return "table %s %d" % (shard_name, int(dim))


def dense_entry(variable_name, dtype_name, shape):
    """The layout line of a dense variable: `dtype_name` as `tf.DType.name` ("float32"), `shape` a list of ints."""
    name = dense_name(variable_name)
    _check_name(name)
    dims = [int(d) for d in shape]
    return "dense %s %s %s" % (name, dtype_name, ",".join(str(d) for d in dims) if dims else "scalar")


def _check_name(name):
    if not name or any(c.isspace() for c in name):
        raise UpdateFormatError("a layout name must be non-empty and without whitespace, got %r" % (name,))


def layout(entries):
    """The layout text of these entry lines (sorted, duplicates dropped)."""
    return "\n".join(sorted(set(entries)))


def parse_layout(text):
    """({shard name: dim}, {variable name: (dtype name, shape tuple)}) of a layout text.

    Raises:
      UpdateFormatError: a line that is neither a table nor a dense entry.
    """
    tables, dense = {}, {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "table" and parts[2].isdigit():
            tables[parts[1]] = int(parts[2])
        elif len(parts) == 4 and parts[0] == "dense":
            shape = () if parts[3] == "scalar" else tuple(int(d) for d in parts[3].split(","))
            dense[parts[1]] = (parts[2], shape)
        else:
            raise UpdateFormatError("not a layout line: %r" % (line,))
    return tables, dense


def layout_difference(model_layout, update_layout):
    """ "" when every line of `model_layout` is in `update_layout`, else a message naming each difference."""
    have = set(update_layout.splitlines())
    missing = [line for line in model_layout.splitlines() if line not in have]
    if not missing:
        return ""
    by_name = {line.split(" ")[1]: line for line in have if line.count(" ") >= 2}
    parts = []
    for line in missing:
        other = by_name.get(line.split(" ")[1])
        parts.append("the model has '%s', the update %s" % (line, "has '%s'" % other if other else "has no such entry"))
    return "; ".join(parts)


def update_dir_name(to_step):
    """The base name of the chain's update at `to_step`."""
    return _dir_name(_DIR_PREFIX, to_step, "an update")


def snapshot_dir_name(to_step):
    """The base name of the full snapshot at `to_step` (written beside the chain's update of that step)."""
    return _dir_name(_SNAPSHOT_PREFIX, to_step, "a snapshot")


def _dir_name(prefix, to_step, what):
    if int(to_step) < 0:
        raise UpdateFormatError("%s's to_step must be >= 0, got %d" % (what, to_step))
    return "%s%012d" % (prefix, int(to_step))


def parse_update_dir_name(name):
    """The to_step of a chain update directory's base name, or None for any other name (temporaries and snapshots
    included)."""
    m = _DIR_RE.match(name)
    return int(m.group(1)) if m else None


def parse_snapshot_dir_name(name):
    """The to_step of a full snapshot directory's base name, or None for any other name."""
    m = _SNAPSHOT_RE.match(name)
    return int(m.group(1)) if m else None


def bundle_prefix(update_dir):
    """The tensor bundle's prefix inside an update directory (what SaveV2 and RestoreV2 take)."""
    return os.path.join(update_dir, BUNDLE_NAME)


def list_updates(updates_dir):
    """[(to_step, path)] of the complete updates of the chain in `updates_dir`, by to_step (an absent directory:
    [])."""
    return _list(updates_dir, parse_update_dir_name)


def list_snapshots(updates_dir):
    """[(to_step, path)] of the complete full snapshots in `updates_dir`, by to_step (an absent directory: [])."""
    return _list(updates_dir, parse_snapshot_dir_name)


def _list(updates_dir, parse):
    try:
        names = os.listdir(updates_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        step = parse(name)
        if step is not None:
            found.append((step, os.path.join(updates_dir, name)))
    return sorted(found)


def write_manifest(update_dir, manifest):
    """Writes MANIFEST.json (fsynced) into an update directory that is not yet published."""
    _check_manifest(manifest, update_dir)
    path = os.path.join(update_dir, MANIFEST_NAME)
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def read_manifest(update_dir):
    """The manifest of an update directory.

    Raises:
      UpdateFormatError: missing, unreadable, not JSON, or a field missing or of the wrong type (named).
    """
    path = os.path.join(update_dir, MANIFEST_NAME)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UpdateFormatError("serving update %s: cannot read %s: %s" % (update_dir, MANIFEST_NAME, e)) from None
    _check_manifest(manifest, update_dir)
    return manifest


def _check_manifest(manifest, where):
    if not isinstance(manifest, dict):
        raise UpdateFormatError("serving update %s: the manifest is not a JSON object" % where)
    for field, kind in _MANIFEST_FIELDS.items():
        value = manifest.get(field)
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind)
        )
        if not ok or (kind is int and isinstance(value, bool)):
            raise UpdateFormatError(
                "serving update %s: manifest field %r must be %s, got %r" % (where, field, kind.__name__, value)
            )
    if manifest["format"] != FORMAT_VERSION:
        raise UpdateFormatError(
            "serving update %s: format %d, this tensorflow_ext reads format %d"
            % (where, manifest["format"], FORMAT_VERSION)
        )
    if manifest["kind"] not in KINDS:
        raise UpdateFormatError("serving update %s: kind %r is not one of %s" % (where, manifest["kind"], KINDS))
    if not 0 <= manifest["from_step"] <= manifest["to_step"]:
        raise UpdateFormatError(
            "serving update %s: from_step %d and to_step %d must satisfy 0 <= from_step <= to_step"
            % (where, manifest["from_step"], manifest["to_step"])
        )
