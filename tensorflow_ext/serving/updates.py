"""Serving updates, the trainer's side: the rows trained since the previous update, the keys removed and the dense
variables, written every N seconds or steps into a directory that a live serving model follows.

    writer_hook = tf_ext.serving.ServingUpdateHook("/updates", every_secs=5, model_name="ctr")
    estimator.train(input_fn, hooks=[writer_hook])

    # or, after each checkpoint:  estimator.train(input_fn, saving_listeners=[ServingUpdateListener("/updates")])
    # or, with a plain Session:   writer = ServingUpdateWriter("/updates"); ...; writer.write(sess)

What an update holds and how a served model applies it is `tensorflow_ext.serving.update_format`; versions are the
trainer's global steps. A delta from step a to step b holds, per embedding shard, every row whose version (the
global step of the key's last training lookup or update) is >= a, read with `export_since` (the embedding columns
only: no optimizer slots, no metadata), the keys removed since the previous update (eviction, `remove`, keys that
fell off a tiered table's disk), and every dense variable whole. A full update holds every row instead.

Dense variables: every global variable of the training graph (and every trainable one and MODEL_VARIABLES) except
the global step, tf_ext's own variables (under a `tf_ext_*` scope, or a tf_ext policy's counters and filters) and
slots: a variable whose name starts with another variable's name and "/" (an optimizer's slots such as
`dense/w/Adagrad`, an ExponentialMovingAverage's `dense/w/ExponentialMovingAverage`). So batch normalization's moving
mean and variance (global, not trainable) are in every update, and so are an optimizer's few non-slot scalars (Adam's
`beta1_power`, `beta2_power`), which a served model does not read. `dense_variables` adds more (local variables,
say). A global variable of an unknown shape is left out (logged), unless named in `dense_variables`.

Removed keys come from the table's change log, channel "serving": the log of delta checkpoints (channel
"checkpoint") sees the same removals and is read and committed independently, so both can run in one job. As for
delta checkpoints, writes the log cannot follow by version (a preload `insert`, an import, a restore, a lookup
without a global step) and a log past `max_removed_keys` make the next update a full one.

The chain of updates (`update-<to_step>`) is made of deltas, but where the writer cannot write one: a full update
follows an untracked write or a log overflow, and is the first update of a writer whose channel was started at the
write itself. The first update of a run (the hook starts the channel when the session is created, after the
checkpoint restore) is a delta from the global step at session start when the directory is empty or its newest
update is at that step, so a follower whose model is at that step continues; otherwise it is full (a follower of the
directory would see a gap, or an earlier run's updates past the restored checkpoint that this run never trained).

Full snapshots (`full-<to_step>`): every `full_every`-th update, and at `write(sess, full=True)`, the writer writes
the usual update into the chain and then a full snapshot of the same step beside it. A follower applies the chain
(deltas: memory for the changed rows only) and reads a snapshot only to resync, when the chain cannot take it from
its version (a gap, or a version older than the oldest update kept): applying a full update rebuilds every table
beside the served one, about twice the tables' memory while it applies (as a reload of the SavedModel). The chain's
own full updates cost a follower the same. A snapshot that fails to be written is retried at the next update.

Updates are numbered by their to_step, which strictly increases over the directory: a write at a global step that
did not advance past the directory's newest update writes nothing and returns None.

Atomicity: one `session.run` exports the rows and writes the tensor bundle into `<dir>/.tmp-<uuid>`; then
MANIFEST.json; every file and the directory are fsynced; the directory is renamed to `update-<to_step:012d>`, and
only then is the channel committed. A writer killed at any point leaves no partial `update-*` directory (a `.tmp-*`
one, deleted by the next writer). An error while writing (a full disk, a permission) is logged and counted
(`stats["failed"]`); training goes on, nothing is committed, and the next update covers the same range. A snapshot
is written the same way once its update is published and the channel committed (it reads every row, none of the
log), so it is never published without that update; the next writer deletes a snapshot past the chain's newest
update (its update was deleted: another run's).

`keep` bounds the directory: updates of the chain older than the newest `keep` ones are deleted (renamed to a
`.tmp-*` name first, so a reader never sees half of one), but only those older than the newest full one, a snapshot
or a full update of the chain (what a follower at any version needs is that full one and every update after it: a
resync, then the chain); snapshots older than the newest full one are deleted (a resync reads the newest); nothing
is deleted while no full one exists.

Horovod: in a data-parallel job only rank 0 writes (the others hold the same rows); model-parallel embeddings (each
rank holds part of the keys) are refused. Parameter-server training: every worker sees the same tables, so give the
hook (or listener) to the chief only (`hooks=[hook] if run_config.is_chief else []`); one writer per directory.
The writer is meant for a trainer whose steps do not run while it writes (hooks and listeners run between steps):
rows trained concurrently could carry versions past to_step (harmless: newer rows, rewritten by the next update).
"""

import os
import shutil
import sys
import time
import uuid

import tensorflow as tf

from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.embedding.checkpoint import policy_state
from tensorflow_ext.serving import update_format
from tensorflow_ext.tf_compat import internals

__all__ = ["SERVING_CHANNEL", "ServingUpdateHook", "ServingUpdateListener", "ServingUpdateWriter"]

# The change-log channel of serving updates (delta checkpoints use "checkpoint").
SERVING_CHANNEL = "serving"
STATS_FIELDS = ("written", "failed", "full", "snapshots", "skipped", "keys", "removed", "bytes")
_SCOPE = "tf_ext_serving_updates/"

# Tests only: called as _test_hook(stage, path) at "bundle_written" (the tmp directory holds the bundle),
# "manifest_written" and "renamed" (path: the published update). Lets a test stop or kill a writer mid-update.
_test_hook = None


def _stage(stage, path):
    if _test_hook is not None:
        _test_hook(stage, path)


def _check_int(what, value, minimum, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            "ServingUpdateWriter: %s must be an int >= %d%s, got %r"
            % (what, minimum, " or None" if allow_none else "", value)
        )
    return value


def _writer_rank():
    """This process's Horovod rank, or 0 without an initialized multi-process Horovod."""
    hvd = sys.modules.get("horovod.tensorflow")
    try:
        return hvd.rank() if hvd is not None and hvd.is_initialized() else 0
    except (ValueError, RuntimeError):
        return 0


def _fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _GraphPart(object):
    """What a writer adds to one training graph: the write, start, flag and commit ops and the layout."""

    def __init__(self, graph, model_name, dense_variables, max_removed_keys):
        global_step = tf.compat.v1.train.get_global_step(graph)
        if global_step is None:
            raise ValueError(
                "ServingUpdateWriter: the graph has no global step: serving updates are numbered by it and find the "
                "rows trained since the previous update by it. Create it before the training op "
                "(tf.compat.v1.train.get_or_create_global_step()) and pass it to minimize(loss, global_step=...)"
            )
        self.graph = graph
        self.shards = []
        for emb in state_lib.get_dynamic_embeddings(graph):
            if emb.distribution is not None:
                raise ValueError(
                    "ServingUpdateWriter: dynamic embedding %r is model-parallel (%s): each rank holds part of its "
                    "keys, which serving updates do not support (data-parallel Horovod is supported: rank 0 writes)"
                    % (emb.name, type(emb.distribution).__name__)
                )
            for shard in emb.shards:
                if shard.frozen:
                    raise ValueError(
                        "ServingUpdateWriter: dynamic embedding %r is a frozen serving table (created inside "
                        "freeze_for_serving()): updates are written by the training graph" % emb.name
                    )
                self.shards.append(shard)
        self.dense = _dense_variables(graph, global_step, dense_variables)
        entries = [update_format.table_entry(s.name, s.dim) for s in self.shards]
        entries += [update_format.dense_entry(v.name, v.dtype.base_dtype.name, v.shape.as_list()) for v in self.dense]
        self.layout = update_format.layout(entries)
        names = list(update_format.META_NAMES)
        for s in self.shards:
            names += [update_format.keys_name(s.name), update_format.values_name(s.name)]
            names.append(update_format.removed_name(s.name))
        names += [update_format.dense_name(v.name) for v in self.dense]
        clashes = sorted({n for n in names if names.count(n) > 1})
        if clashes:
            raise ValueError("ServingUpdateWriter: two tensors of an update would have the same name: %s" % clashes)

        with graph.as_default(), tf.init_scope(), tf.name_scope(_SCOPE):
            self.read_global_step = tf.identity(global_step, name="global_step")
            self.prefix = tf.compat.v1.placeholder(tf.string, [], name="prefix")
            self.want_delta = tf.compat.v1.placeholder(tf.bool, [], name="want_delta")
            self.since = tf.compat.v1.placeholder(tf.int64, [], name="since_step")
            self.to_step = tf.compat.v1.placeholder(tf.int64, [], name="to_step")
            starts, enabled, commits, logs, flags = [], [], [], [], []
            for s in self.shards:
                with internals.ops.colocate_with(s.handle, ignore_existing=True):
                    capacity = tf.constant(max_removed_keys, tf.int64)
                    starts.append(s.table.change_log_start(capacity, channel=SERVING_CHANNEL))
                    enabled.append(s.table.change_log(read_keys=False, channel=SERVING_CHANNEL)[1])
                    commits.append(s.table.change_log_commit(channel=SERVING_CHANNEL))
                    removed, on, untracked, overflow = s.table.change_log(channel=SERVING_CHANNEL)
                    logs.append(removed)
                    flags.append(tf.logical_and(on, tf.logical_not(tf.logical_or(untracked, overflow))))
            self.start = tf.group(*starts, name="start")
            self.enabled = tf.reduce_all(tf.stack(enabled)) if enabled else tf.constant(True)
            self.commit = tf.group(*commits, name="commit")
            # Decided in the write itself, over every shard at once: a delta only when asked for and every shard's
            # changes since the previous update were tracked (the read that decides is the read the commit drops).
            tracked = tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)
            is_delta = tf.logical_and(self.want_delta, tracked, name="is_delta")
            since = tf.where(is_delta, self.since, tf.constant(-1, tf.int64))
            tensors = [
                tf.constant(model_name),
                tf.constant(self.layout),
                tf.where(is_delta, update_format.KIND_DELTA, update_format.KIND_FULL),
                tf.where(is_delta, self.since, tf.constant(0, tf.int64)),
                self.to_step,
            ]
            key_counts, removed_counts = [], []
            for s, removed in zip(self.shards, logs):
                with internals.ops.colocate_with(s.handle, ignore_existing=True):
                    keys, values, _, _ = s.table.export_since(since)  # the embedding columns only
                    removed = removed[: tf.where(is_delta, tf.size(removed), 0)]
                tensors += [keys, values, removed]
                key_counts.append(tf.size(keys, out_type=tf.int64))
                removed_counts.append(tf.size(removed, out_type=tf.int64))
            tensors += [v.read_value() for v in self.dense]
            save = tf.raw_ops.SaveV2(
                prefix=self.prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
            )
            with tf.control_dependencies([save]):
                self.write = {
                    "is_delta": tf.identity(is_delta),
                    "keys": tf.add_n(key_counts) if key_counts else tf.constant(0, tf.int64),
                    "removed": tf.add_n(removed_counts) if removed_counts else tf.constant(0, tf.int64),
                }


def _dense_variables(graph, global_step, extra):
    """The dense variables an update holds (the module docstring's rule), plus `extra` (variables or their names),
    sorted by name."""
    global_vars = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    named = global_vars + graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    named += graph.get_collection(tf.compat.v1.GraphKeys.MODEL_VARIABLES)
    # Shards are in TRAINABLE_VARIABLES too but are no tf.Variable.
    candidates = [v for v in named if isinstance(v, tf.Variable)]
    local_vars = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES) if isinstance(v, tf.Variable)]
    op_names = {v.op.name for v in candidates + local_vars}
    policy_owned = policy_state.claimed_variables(graph)
    required = {
        v.name
        for key in (tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, tf.compat.v1.GraphKeys.MODEL_VARIABLES)
        for v in graph.get_collection(key)
        if isinstance(v, tf.Variable)
    }

    found = {}
    for v in candidates:
        parts = v.op.name.split("/")
        if v.name == global_step.name or any(p.startswith("tf_ext_") for p in parts) or id(v) in policy_owned:
            continue  # the version itself, and tf_ext's own state (counters, filters, bookkeeping)
        if any("/".join(parts[:i]) in op_names for i in range(1, len(parts))):
            continue  # a slot of another variable: an optimizer's accumulator, a moving average's shadow
        if not v.shape.is_fully_defined() and v.name not in required:
            tf.compat.v1.logging.warning(
                "serving updates: global variable %s has shape %s, not fully defined: it is not in the updates (name "
                "it in dense_variables to be told why not)",
                v.name,
                v.shape,
            )
            continue
        found[v.name] = v
    by_name = {v.name: v for v in global_vars if isinstance(v, tf.Variable)}
    by_name.update((v.name, v) for v in local_vars)
    for v in extra or ():
        if isinstance(v, str):
            name = v if ":" in v else v + ":0"
            if name not in by_name:
                raise ValueError(
                    "ServingUpdateWriter: dense_variables names %r, which is no variable of the graph" % (v,)
                )
            v = by_name[name]
        elif not isinstance(v, tf.Variable):
            raise TypeError("ServingUpdateWriter: dense_variables must be variables or their names, got %r" % (v,))
        if v.graph is not graph:
            raise ValueError("ServingUpdateWriter: dense variable %s is not in the training graph" % v.name)
        found[v.name] = v
    for v in found.values():
        if not v.shape.is_fully_defined():
            raise ValueError(
                "ServingUpdateWriter: dense variable %s has shape %s: an update holds variables of a known shape"
                % (v.name, v.shape)
            )
    return [found[n] for n in sorted(found)]


class ServingUpdateWriter(object):
    """Writes serving updates (see the module docstring) from a training graph.

    Build it in the training graph before the graph is finalized (an Estimator's hook and listener build it in
    their `begin`); it also builds itself on construction when the default graph already holds the model. Then
    `start(sess)` once the session holds the state the first delta starts from (after init or restore; optional),
    and `write(sess)` whenever an update is due.

    Args:
      updates_dir: the directory of updates (a local path; created when missing).
      model_name: the name the served model checks (`freeze_for_serving(live_model=...)`).
      full_every: int >= 1: every full_every-th update of the writer has a full snapshot beside it (1: every
        update). The chain itself stays deltas (see the module docstring).
      keep: int >= 1: updates of the chain kept (see the module docstring for what is never deleted), or None: keep
        every update and snapshot.
      dense_variables: more variables (or names) to write besides the default ones (the module docstring's rule).
      max_removed_keys: removed keys each shard logs between updates (8 bytes each); past that the next is full.
      summary_dir: where to write TensorBoard scalars `tf_ext/serving_updates/{written,failed,keys,bytes}` after
        each attempt (None: none).

    Attributes:
      stats: a dict of counts since construction: written (updates of the chain), failed (writes of an update
        or a snapshot), full (full updates of the chain), snapshots (full snapshots written), skipped (nothing new),
        keys (rows written into the chain), removed (keys), bytes (of updates and snapshots).
    """

    def __init__(
        self,
        updates_dir,
        model_name="model",
        full_every=16,
        keep=32,
        dense_variables=None,
        max_removed_keys=2**22,
        summary_dir=None,
    ):
        if not isinstance(updates_dir, str) or not updates_dir:
            raise ValueError("ServingUpdateWriter: updates_dir must be a non-empty path, got %r" % (updates_dir,))
        if not isinstance(model_name, str) or not model_name or any(c.isspace() for c in model_name):
            raise ValueError(
                "ServingUpdateWriter: model_name must be a name without whitespace, got %r" % (model_name,)
            )
        self._dir = updates_dir
        self._model_name = model_name
        self._full_every = _check_int("full_every", full_every, 1)
        self._keep = _check_int("keep", keep, 1, allow_none=True)
        self._extra = list(dense_variables or ())
        self._max_removed_keys = _check_int("max_removed_keys", max_removed_keys, 0)
        self._summary_dir = summary_dir
        self._part = None
        self._kinds = {}  # update path -> kind, of the updates this writer wrote or read
        self.last_snapshot = None  # the manifest of the snapshot the last write() wrote, if it wrote one
        self._cleaned = False
        self.stats = {k: 0 for k in STATS_FIELDS}
        self._reset()
        graph = tf.compat.v1.get_default_graph()
        if state_lib.get_dynamic_embeddings(graph) or graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES):
            self.build(graph)

    def _reset(self):
        self._base = None  # the step the next delta starts from (the last to_step, or the step at start)
        self._chain = 0  # updates since (and with) the last full one or snapshot (or the start); 0: none yet

    @property
    def updates_dir(self):
        return self._dir

    @property
    def model_name(self):
        return self._model_name

    @property
    def layout(self):
        """The layout text of the updates (update_format's lines), once built."""
        return None if self._part is None else self._part.layout

    def build(self, graph=None):
        """Adds the writer's ops to `graph` (default: the default graph), once per graph; a new graph resets the
        writer's run state (a new `Estimator.train` call is a new run)."""
        graph = graph or tf.compat.v1.get_default_graph()
        if self._part is not None and self._part.graph is graph:
            return
        if graph.finalized:
            raise RuntimeError(
                "ServingUpdateWriter: the graph is finalized: build the writer (or call build()) before the session "
                "starts (hooks and listeners do it in begin())"
            )
        self._part = _GraphPart(graph, self._model_name, self._extra, self._max_removed_keys)
        self._reset()

    def _part_for(self, sess):
        if self._part is None or self._part.graph is not sess.graph:
            raise RuntimeError(
                "ServingUpdateWriter: not built in this session's graph: build the writer (or call build()) in the "
                "training graph before the session starts"
            )
        return self._part

    def start(self, sess):
        """Starts the change log in the session's tables; the next update may be a delta from the global step now.

        Run it once the tables hold the state a follower's model may have (after initialization or a restore).
        """
        part = self._part_for(sess)
        if _writer_rank() != 0:
            return
        sess.run(part.start)
        self._reset()
        self._base = int(sess.run(part.read_global_step))
        self._chain = 1  # the state at start counts as a full one (a follower's model at this step)

    def write(self, sess, full=False):
        """Writes one serving update, if the global step advanced past the directory's newest update.

        Args:
          sess: a Session of the training graph (a hook's run_context.session works too).
          full: write a full snapshot beside the update (as every `full_every`-th update does).

        Returns:
          The manifest of the update written into the chain (a dict, see update_format), or None: nothing new, not
          rank 0, or a failure (logged and counted in `stats["failed"]`; the next update covers its range). A
          snapshot written with it is `last_snapshot` (its manifest; None when none was written).
        """
        part = self._part_for(sess)
        if _writer_rank() != 0:
            return None
        started_now = not sess.run(part.enabled)
        if started_now:  # a new session's tables (or start() never called): nothing tells what changed before
            self.start(sess)
        step = int(sess.run(part.read_global_step))
        try:
            existing = update_format.list_updates(self._dir)
        except OSError as e:  # not a directory, not readable: as a failed write
            self._failed(step, e)
            self._summaries(step, None)
            return None
        newest = existing[-1][0] if existing else None
        if (newest is not None and step <= newest) or (
            not started_now and self._base is not None and step <= self._base
        ):
            self.stats["skipped"] += 1  # nothing trained since the newest update (or since start())
            return None
        want_delta = (
            not started_now
            and self._base is not None
            and self._base < step
            and (newest is None or newest == self._base)
        )
        self.last_snapshot = None
        manifest = self._write(sess, part, step, want_delta, update_format.update_dir_name(step))
        if manifest is None:
            self._summaries(step, None)
            return None
        sess.run(part.commit)
        self._base = step
        if manifest["kind"] == update_format.KIND_FULL:
            self._chain = 1
        else:
            self._chain += 1
            # The full one and full_every - 1 deltas after it; a snapshot that failed is tried at the next update.
            if full or self._chain > self._full_every:
                # The same state as the update just written (no step runs between the two): the log's removals
                # are committed, and a full write reads every row, none of the log.
                self.last_snapshot = self._write(sess, part, step, False, update_format.snapshot_dir_name(step))
                if self.last_snapshot is not None:
                    self._chain = 1
        self._summaries(step, manifest)
        self._prune()
        return manifest

    def _write(self, sess, part, step, want_delta, name):
        """Writes and publishes the update (or snapshot) `name`; returns its manifest, or None after a failure
        (logged, counted)."""
        snapshot = update_format.parse_snapshot_dir_name(name) is not None
        final = os.path.join(self._dir, name)
        tmp = os.path.join(self._dir, update_format.TMP_PREFIX + uuid.uuid4().hex)
        try:
            os.makedirs(self._dir, exist_ok=True)
            if not self._cleaned:
                self._clean_directory()
            os.mkdir(tmp)
            out = sess.run(
                part.write,
                {
                    part.prefix: update_format.bundle_prefix(tmp),
                    part.want_delta: want_delta,
                    part.since: self._base if self._base is not None else -1,
                    part.to_step: step,
                },
            )
            _stage("bundle_written", tmp)
            kind = update_format.KIND_DELTA if out["is_delta"] else update_format.KIND_FULL
            manifest = {
                "format": update_format.FORMAT_VERSION,
                "model_name": self._model_name,
                "kind": kind,
                "from_step": int(self._base) if out["is_delta"] else 0,
                "to_step": step,
                "layout": part.layout,
                "created_unix": time.time(),
                "keys": int(out["keys"]),
                "removed": int(out["removed"]),
            }
            nbytes = 0
            for name in os.listdir(tmp):
                path = os.path.join(tmp, name)
                nbytes += os.path.getsize(path)
                _fsync_path(path)
            manifest["bytes"] = nbytes
            update_format.write_manifest(tmp, manifest)
            _fsync_path(tmp, directory=True)
            _stage("manifest_written", tmp)
            os.rename(tmp, final)
        except (tf.errors.OpError, OSError) as e:
            self._failed(step, e, snapshot)
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        try:
            _fsync_path(self._dir, directory=True)  # the rename itself
        except OSError as e:
            tf.compat.v1.logging.warning(
                "serving updates: cannot fsync %s after publishing %s: %s", self._dir, final, e
            )
        _stage("renamed", final)
        self.stats["bytes"] += nbytes
        if snapshot:
            self.stats["snapshots"] += 1
        else:
            self._kinds[final] = kind
            self.stats["written"] += 1
            self.stats["full"] += kind == update_format.KIND_FULL
            self.stats["keys"] += manifest["keys"]
            self.stats["removed"] += manifest["removed"]
        tf.compat.v1.logging.info(
            "serving updates: wrote %s (%s%s from step %d, %d rows, %d removed keys, %d bytes)",
            final,
            kind,
            " snapshot" if snapshot else "",
            manifest["from_step"],
            manifest["keys"],
            manifest["removed"],
            nbytes,
        )
        return manifest

    def _failed(self, step, error, snapshot=False):
        self.stats["failed"] += 1
        tf.compat.v1.logging.warning(
            "serving updates: writing the %s at step %d into %s failed (%d failures so far); training goes on and %s: "
            "%s",
            "full snapshot" if snapshot else "update",
            step,
            self._dir,
            self.stats["failed"],
            (
                "the update of that step is in the chain, the next update writes a snapshot"
                if snapshot
                else "the next update covers the same steps"
            ),
            error,
        )

    def _clean_directory(self):
        """Deletes, once per writer, the `.tmp-*` entries a killed writer (or deletion) left, and the snapshots past
        the chain's newest update: a snapshot is published after the update of its step, so those belong to another
        run whose updates were deleted (and would take this run's snapshot names)."""
        for name in os.listdir(self._dir):
            if name.startswith(update_format.TMP_PREFIX):
                shutil.rmtree(os.path.join(self._dir, name), ignore_errors=True)
        updates = update_format.list_updates(self._dir)
        newest = updates[-1][0] if updates else -1
        for step, path in update_format.list_snapshots(self._dir):
            if step > newest:
                tf.compat.v1.logging.warning(
                    "serving updates: deleting %s, a snapshot past the newest update of the chain (%s): another "
                    "run's",
                    path,
                    updates[-1][1] if updates else "none",
                )
                self._delete(path)
        self._cleaned = True

    def _kind(self, path):
        if path not in self._kinds:
            try:
                self._kinds[path] = update_format.read_manifest(path)["kind"]
            except update_format.UpdateFormatError:
                return None  # unreadable: not taken for a full update
        return self._kinds[path]

    def _prune(self):
        """Deletes the updates of the chain beyond `keep` and the snapshots, if older than the newest full one."""
        if self._keep is None:
            return
        try:
            updates = update_format.list_updates(self._dir)
            snapshots = update_format.list_snapshots(self._dir)
        except OSError as e:
            tf.compat.v1.logging.warning("serving updates: cannot list %s to delete old updates: %s", self._dir, e)
            return
        fulls = [step for step, path in updates if self._kind(path) == update_format.KIND_FULL]
        fulls += [step for step, _ in snapshots]
        if not fulls:
            return  # every update may be needed by a follower at some step of the chain
        newest_full = max(fulls)
        older = sum(1 for step, _ in updates if step < newest_full)
        doomed = [path for _, path in updates[: min(len(updates) - self._keep, older)]]
        doomed += [path for step, path in snapshots if step < newest_full]
        for path in doomed:
            self._delete(path)

    def _delete(self, path):
        """Deletes an update or snapshot; renamed first, so that a reader listing the directory never sees half of
        it."""
        tmp = os.path.join(self._dir, update_format.TMP_PREFIX + uuid.uuid4().hex)
        try:
            os.rename(path, tmp)
        except OSError as e:
            tf.compat.v1.logging.warning("serving updates: cannot delete %s: %s", path, e)
            return
        shutil.rmtree(tmp, ignore_errors=True)
        self._kinds.pop(path, None)

    def _summaries(self, step, manifest):
        if self._summary_dir is None:
            return
        values = [
            tf.compat.v1.Summary.Value(tag="tf_ext/serving_updates/written", simple_value=self.stats["written"]),
            tf.compat.v1.Summary.Value(tag="tf_ext/serving_updates/failed", simple_value=self.stats["failed"]),
        ]
        if manifest is not None:
            values.append(tf.compat.v1.Summary.Value(tag="tf_ext/serving_updates/keys", simple_value=manifest["keys"]))
            values.append(
                tf.compat.v1.Summary.Value(tag="tf_ext/serving_updates/bytes", simple_value=manifest["bytes"])
            )
        writer = tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)
        writer.add_summary(tf.compat.v1.Summary(value=values), step)
        writer.flush()


def _as_writer(writer_or_dir, writer_kwargs, who):
    if isinstance(writer_or_dir, ServingUpdateWriter):
        if writer_kwargs:
            raise TypeError("%s: writer arguments %s given with a ServingUpdateWriter" % (who, sorted(writer_kwargs)))
        return writer_or_dir
    return ServingUpdateWriter(writer_or_dir, **writer_kwargs)


class ServingUpdateHook(tf.compat.v1.train.SessionRunHook):
    """Writes a serving update every `every_secs` seconds or `every_steps` global steps, and one at the end.

    For `Estimator.train(hooks=[...])` and `MonitoredTrainingSession(hooks=[...])`. The change log starts when the
    session is created (after the checkpoint restore), so the first update may be a delta from that step.

    Args:
      writer_or_dir: a `ServingUpdateWriter`, or the updates directory (then `writer_kwargs` build one).
      every_secs / every_steps: exactly one: how often an update is written (after the run that reaches it).
      **writer_kwargs: `ServingUpdateWriter` arguments.
    """

    def __init__(self, writer_or_dir, every_secs=None, every_steps=None, **writer_kwargs):
        if (every_secs is None) == (every_steps is None):
            raise ValueError(
                "ServingUpdateHook: give exactly one of every_secs and every_steps, got every_secs=%r, every_steps=%r"
                % (every_secs, every_steps)
            )
        if every_steps is not None:
            _check_int("every_steps", every_steps, 1)
        elif isinstance(every_secs, bool) or not isinstance(every_secs, (int, float)) or every_secs <= 0:
            raise ValueError("ServingUpdateHook: every_secs must be a number > 0, got %r" % (every_secs,))
        self._writer = _as_writer(writer_or_dir, writer_kwargs, "ServingUpdateHook")
        self._timer = tf.compat.v1.train.SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps)

    @property
    def writer(self):
        return self._writer

    def begin(self):
        self._writer.build()
        self._global_step = tf.compat.v1.train.get_global_step()
        self._timer.reset()

    def after_create_session(self, session, coord):
        del coord
        self._writer.start(session)
        self._timer.update_last_triggered_step(int(session.run(self._global_step)))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        # The step read before the run; the run advanced it by (at least) one.
        if self._timer.should_trigger_for_step(int(run_values.results) + 1):
            step = int(run_context.session.run(self._global_step))
            if self._timer.should_trigger_for_step(step):
                self._timer.update_last_triggered_step(step)
                self._writer.write(run_context.session)

    def end(self, session):
        self._writer.write(session)


class ServingUpdateListener(tf.compat.v1.train.CheckpointSaverListener):
    """Writes a serving update after each checkpoint (`Estimator.train(saving_listeners=[...])`).

    Args:
      writer_or_dir: a `ServingUpdateWriter`, or the updates directory (then `writer_kwargs` build one).
      **writer_kwargs: `ServingUpdateWriter` arguments.
    """

    def __init__(self, writer_or_dir, **writer_kwargs):
        self._writer = _as_writer(writer_or_dir, writer_kwargs, "ServingUpdateListener")

    @property
    def writer(self):
        return self._writer

    def begin(self):
        self._writer.build()

    def after_save(self, session, global_step_value):
        del global_step_value
        self._writer.write(session)
