"""Delta checkpoints of dynamic embeddings: most saves write only what changed since the previous save.

    listener = tf_ext.embedding.delta_checkpoints(full_every=8)
    estimator.train(input_fn, saving_listeners=[listener])

How it fits TF's checkpoints. Every checkpoint is an ordinary TF checkpoint written by the stock Saver; for each
shard of a dynamic embedding it holds the usual tensors (`save.ShardSaveable`) plus

  <shard>-removed  int64 [m]   keys removed since the previous save (empty in a full save)
  <shard>-delta    string []   the delta record (`format.delta_record`)

In a delta save `-keys`, `-values`, `-slots`, `-versions` and `-freqs` hold only the rows whose version (the global
step of the key's last training update or lookup) is at least the graph's global step at the previous save: every
row trained since then, with its slots and metadata. The record names the chain the delta applies to, oldest first: the full
save and the deltas after it, each by its id and its file name in the same directory. Restoring a delta (any
Saver, e.g. an Estimator restarting, `predict`, a plain `saver.restore`, a serving export's restore, frozen or not,
and warm start) reads the chain in order from the checkpoint's directory: the full rows, then for each delta its removals and its rows, and imports the result in one
step. It checks each link first: a missing link, a link whose id is not the one recorded (another run's checkpoint
under the same name), or a truncated file is an error naming the files; nothing is imported then.

What a delta cannot see by version is made safe by the table's change log (C++, `TableResource`): removals
(eviction, `remove`) log their keys, up to `max_removed_keys` per shard (8 bytes a key, freed at each save); writes
that set no version (a preload `insert`, an import, a lookup without a global step) are noted. When the log
overflowed or such a write happened, the save is a full one: decided in the save itself, over all shards at once, so
a change made after the listener's `before_save` (another listener's eviction) makes it full too. A removal log was chosen over comparing key sets
at save time because the latter keeps a copy of every key of the table between saves.

Which saves are full: the first save of each graph (a new training run, each `Estimator.train` call), every
`full_every`-th save, saves after untracked changes, and saves at a global step that did not advance since the
previous save (rows trained in between could not be told apart by version). The listener keeps the checkpoints a
kept delta needs: when the Saver's `max_to_keep` would delete a link of a checkpoint it still keeps, the link is taken
off the Saver's list (so the Saver does not delete it) and deleted by the listener once no kept checkpoint needs it.
Each record also names the files the listener keeps that way ("owned="), so that a run killed between a save and
its clean-up has them deleted by the next run's first save. A record that cannot be read (a transient filesystem
error) deletes nothing: every link is then assumed needed until it can be read.
"""

import os
import uuid
import weakref

import tensorflow as tf

from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.embedding.checkpoint import format as ckpt_format
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils import loader

__all__ = ["DeltaCheckpointSaverListener", "delta_checkpoints"]

# Graph -> _DeltaState, for the graphs whose Savers write delta checkpoints.
_STATES = weakref.WeakKeyDictionary()


class _DeltaState(object):
    """The per-graph inputs of the save tensors: the step rows must have reached (-1: a full save) and the record."""

    def __init__(self, graph):
        with graph.as_default(), tf.init_scope(), tf.name_scope("tf_ext_delta_checkpoint/"):
            # Not in any collection: not saved, not initialized by the usual ops; before_save assigns both.
            self.since = tf.compat.v1.Variable(
                tf.constant(-1, tf.int64), trainable=False, collections=[], name="since_step", use_resource=True
            )
            self.record = tf.compat.v1.Variable(
                tf.constant("", tf.string), trainable=False, collections=[], name="record", use_resource=True
            )
            # The record written instead when the save turns out full (a change the delta cannot see happened
            # between before_save and the save, e.g. a later listener's eviction overflowed the removal log).
            self.full_record = tf.compat.v1.Variable(
                tf.constant("", tf.string), trainable=False, collections=[], name="full_record", use_resource=True
            )
            # What the last save wrote: True for a delta (set by the save itself, read by after_save).
            self.wrote_delta = tf.compat.v1.Variable(
                tf.constant(False), trainable=False, collections=[], name="wrote_delta", use_resource=True
            )
            self.since_in = tf.compat.v1.placeholder(tf.int64, [], name="since_step_in")
            self.record_in = tf.compat.v1.placeholder(tf.string, [], name="record_in")
            self.full_record_in = tf.compat.v1.placeholder(tf.string, [], name="full_record_in")
            self.assign = tf.group(
                self.since.assign(self.since_in),
                self.record.assign(self.record_in),
                self.full_record.assign(self.full_record_in),
                self.wrote_delta.assign(False),
                name="assign",
            )
            self.read_wrote_delta = self.wrote_delta.read_value()
        self.decision = None  # (is_delta, {shard handle name: (removed keys, since)}), built with the first Saver


def graph_state(graph=None):
    """The graph's `_DeltaState`, or None when its Savers write ordinary checkpoints."""
    graph = graph or tf.compat.v1.get_default_graph()
    state = _STATES.get(graph)
    return state


def _install(graph):
    if graph not in _STATES:
        _STATES[graph] = _DeltaState(graph)
    return _STATES[graph]


def _delta_shards(graph):
    """The shards of `graph` whose saveables write delta checkpoints (all but Horovod model-parallel and frozen)."""
    return [
        shard
        for emb in state_lib.get_dynamic_embeddings(graph)
        for shard in emb.shards
        if shard.saveable is not None and shard.saveable.supports_deltas
    ]


def _decision(state, shard):
    """(removed keys of `shard`, the step its rows must have reached: -1 for a full save) in the save being run.

    Built once per graph, over every shard that writes deltas: the save is a delta only when the listener asked for
    one and every shard's changes since the previous save were tracked, read in the save itself. So a change made
    after the listener's before_save (another listener's eviction that overflows the removal log, an untracked
    write) makes the whole save full, every shard alike, instead of failing it.
    """
    if state.decision is None or shard.handle.name not in state.decision[1]:
        graph = state.since.graph
        shards = _delta_shards(graph)
        if all(s.handle.name != shard.handle.name for s in shards):
            shards.append(shard)
        with graph.as_default(), tf.init_scope(), tf.name_scope("tf_ext_delta_checkpoint/"):
            since = tf.identity(state.since.read_value())
            logs, flags = {}, []
            for s in shards:
                with internals.ops.colocate_with(s.handle, ignore_existing=True):
                    removed, enabled, untracked, overflow = s.table.change_log()
                    flags.append(tf.logical_and(enabled, tf.logical_not(tf.logical_or(untracked, overflow))))
                    logs[s.handle.name] = removed
            is_delta = tf.logical_and(tf.greater_equal(since, 0), tf.reduce_all(tf.stack(flags)))
            with tf.control_dependencies([state.wrote_delta.assign(is_delta)]):
                effective_since = tf.where(is_delta, since, tf.constant(-1, tf.int64))
            out = {}
            for s in shards:
                removed = logs[s.handle.name]
                with internals.ops.colocate_with(s.handle, ignore_existing=True):
                    out[s.handle.name] = (removed[: tf.where(is_delta, tf.size(removed), 0)], effective_since)
            record = tf.where(is_delta, state.record.read_value(), state.full_record.read_value())
        state.decision = (record, out)
    record, out = state.decision
    removed, since = out[shard.handle.name]
    return removed, since, record


def save_tensors(shard, state):
    """The tensors a shard's saveable writes in a graph with delta checkpoints.

    Returns:
      (keys, rows [n, width], versions, freqs, removed keys, record): the rows whose version >= the state's step
      (all rows when it is -1, or when a change since the previous save was not tracked) and, in a delta save, the
      keys logged as removed.
    """
    removed, since, record = _decision(state, shard)
    with internals.ops.colocate_with(shard.handle, ignore_existing=True):
        keys, rows, versions, freqs = shard.table.export_since(since, full_rows=True)
        record = tf.identity(record)
    return keys, rows, versions, freqs, removed, record


def restore_rows(name, prefix, restore_op, rows, with_slots=True):
    """The rows a restore of shard `name` from `prefix` imports: `rows` themselves unless `prefix` is a delta.

    For a delta, the rows of its chain applied in order (see the module docstring); a missing, foreign or truncated
    link fails with an error naming it. One op (`TfExtCheckpointRestoreRows`), placed with the Saver's Restore op
    (the process that reads the checkpoint files).

    Args:
      name: the shard's checkpoint name (e.g. "user/part_0").
      prefix: the string tensor the Saver restores from.
      restore_op: the Saver's Restore op.
      rows: (keys, values, slots, versions, freqs) read from `prefix` (tensors `name` + `format.ROW_SUFFIXES`).
      with_slots: False where only the embedding is wanted (serving exports, warm start): the links' slots are not
        read, `rows`' slots are ignored, and the slots returned have 0 columns.

    Returns:
      (keys, values, slots, versions, freqs).
    """
    keys, values, slots, versions, freqs = rows
    with internals.ops.colocate_with(restore_op, ignore_existing=True):
        return tuple(
            loader.load_ops().tf_ext_checkpoint_restore_rows(
                prefix,
                keys,
                tf.cast(values, tf.float32),
                tf.cast(slots, tf.float32),
                versions,
                freqs,
                record_tensor=name + ckpt_format.DELTA_SUFFIX,
                removed_tensor=name + ckpt_format.REMOVED_SUFFIX,
                row_tensors=[name + suffix for suffix in ckpt_format.ROW_SUFFIXES],
                with_slots=with_slots,
                name=name.replace("/", "_") + "_delta_chain",
            )
        )


def _index_exists(path):
    """Whether checkpoint `path` exists (its index file), through TF's filesystems (local, gs://, hdfs://, ram://...).

    None when that cannot be told (an error other than "not found"): a transient error is never taken for a deleted
    checkpoint. (Python's glob sees local files only, and reads an unreadable directory as empty.)
    """
    try:
        return tf.io.gfile.exists(path + ".index")
    except (tf.errors.OpError, OSError):
        return None


class DeltaCheckpointSaverListener(tf.compat.v1.train.CheckpointSaverListener):
    """Makes the checkpoints of dynamic embeddings full every `full_every` saves and deltas in between.

    See `delta_checkpoints`.
    """

    def __init__(self, full_every, saver=None, max_removed_keys=2**22):
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise ValueError(
                "delta_checkpoints: full_every must be an int >= 1 (saves per full save), got %r" % (full_every,)
            )
        if isinstance(max_removed_keys, bool) or not isinstance(max_removed_keys, int) or max_removed_keys < 0:
            raise ValueError("delta_checkpoints: max_removed_keys must be an int >= 0, got %r" % (max_removed_keys,))
        if saver is not None and not hasattr(saver, "last_checkpoints"):
            raise TypeError("delta_checkpoints: saver must be a tf.compat.v1.train.Saver, got %r" % (saver,))
        self._full_every = full_every
        self._saver = saver
        self._max_removed_keys = max_removed_keys
        self._graph = None
        self._reset()

    def _reset(self):
        self._chain = []  # (id, path) of the last full save and the deltas after it
        self._last_step = None
        self._last_graph_step = None  # the graph's global step at the last save (what the next delta's rows reach)
        self._needs = {}  # checkpoint path -> paths of the links it needs (None: its record could not be read)
        self._kept_for_deltas = set()  # links the Saver no longer lists, kept because a listed checkpoint needs them
        self._pending = None

    @property
    def full_every(self):
        return self._full_every

    def begin(self):
        """Installs the delta save tensors into the default graph; call before its Saver is built."""
        graph = tf.compat.v1.get_default_graph()
        if graph is self._graph:
            return
        self._graph = graph
        self._reset()
        self._state = _install(graph)
        self._shards = [s for emb in state_lib.get_dynamic_embeddings(graph) for s in emb.shards]
        with graph.as_default(), tf.init_scope(), tf.name_scope("tf_ext_delta_checkpoint/"):
            starts, flags, commits = [], [], []
            for shard in self._shards:
                with internals.ops.colocate_with(shard.handle, ignore_existing=True):
                    starts.append(shard.table.change_log_start(tf.constant(self._max_removed_keys, tf.int64)))
                    _, enabled, untracked, overflow = shard.table.change_log(read_keys=False)
                    flags.append(tf.logical_and(enabled, tf.logical_not(tf.logical_or(untracked, overflow))))
                    commits.append(shard.table.change_log_commit())
            self._start = tf.group(*starts, name="start")
            self._tracked = tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)
            self._commit = tf.group(*commits, name="commit")
            global_step = tf.compat.v1.train.get_global_step(graph)
            self._read_global_step = None if global_step is None else tf.identity(global_step, name="global_step")

    def _get_saver(self, session):
        if self._saver is not None:
            return self._saver
        savers = session.graph.get_collection(tf.compat.v1.GraphKeys.SAVERS)
        if len(savers) != 1:
            raise ValueError(
                "delta checkpoints: cannot tell which Saver writes the checkpoints (%d in GraphKeys.SAVERS): pass "
                "it as tf_ext.embedding.delta_checkpoints(full_every, saver=...), or, for a Saver built after the "
                "listener (a Scaffold's own Saver: build the training op, then delta_checkpoints(...), then "
                "saver = tf.compat.v1.train.Saver()), add it: "
                "tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)" % len(savers)
            )
        return savers[0]

    def _check_built(self):
        late = [s.name for s in self._shards if s.saveable is not None and not s.saveable.writes_deltas()]
        if late:
            raise RuntimeError(
                "delta checkpoints: %s would write full checkpoints without a delta record: the Saver was built "
                "before tf_ext.embedding.delta_checkpoints(): build the training op, then delta_checkpoints(...) "
                "(or call its begin()), then saver = tf.compat.v1.train.Saver(); a Saver built after the listener "
                "(a Scaffold's own Saver) is found in GraphKeys.SAVERS "
                "(tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)). (Or the "
                "embedding is a Horovod model-parallel one, which delta checkpoints do not support.)" % ", ".join(late)
            )

    def _recover_needs(self, paths):
        """Reads which links the listed checkpoints of an earlier run need, and which files it kept (their records).

        A record that cannot be read (a transient filesystem error) leaves that checkpoint's needs unknown (None):
        every link is then assumed needed and nothing is deleted until it is read; it is read again at the next save.
        """
        for path in paths:
            if not self._shards or (path in self._needs and self._needs[path] is not None):
                continue  # read already
            try:
                reader = tf.compat.v1.train.NewCheckpointReader(path)
                # Every shard holds the same record; the first saved one (an embedding kept out of checkpoints,
                # e.g. TFRA's checkpoint=False, has none).
                names = [s.name + ckpt_format.DELTA_SUFFIX for s in self._shards]
                keys = [n for n in names if reader.has_tensor(n)]
                links, owned = [], []
                if keys:
                    record = reader.get_tensor(keys[0])
                    record = record.decode() if isinstance(record, bytes) else str(record)
                    directory = os.path.dirname(path)
                    links = [p for _, p in ckpt_format.delta_record_links(record, directory)]
                    owned = ckpt_format.delta_record_owned(record, directory)
            except (tf.errors.OpError, ValueError, OSError) as e:
                if _index_exists(path) is False:
                    links, owned = [], []  # gone (deleted by hand): it needs nothing
                else:
                    tf.compat.v1.logging.warning(
                        "delta checkpoints: cannot read the record of %s (%s); keeping every checkpoint it may need "
                        "until it can be read",
                        path,
                        e,
                    )
                    links, owned = None, []
            self._needs[path] = links
            # Files an earlier save kept for its deltas (a run killed before cleaning them up): known again, so they
            # are deleted once nothing needs them.
            self._kept_for_deltas.update(p for p in owned if p not in paths)

    def _unknown_needs(self, paths):
        return [p for p in paths if p in self._needs and self._needs[p] is None]

    def before_save(self, session, global_step_value):
        if self._graph is not session.graph:
            raise RuntimeError(
                "delta checkpoints: the listener's begin() was not called for this graph (pass it to "
                "CheckpointSaverHook(listeners=...) or Estimator.train(saving_listeners=...), or call begin() before "
                "building the Saver)"
            )
        self._check_built()
        saver = self._get_saver(session)
        step = int(global_step_value)
        # The step the rows trained since this save will have reached: the graph's global step (the version lookups
        # and updates write), whatever step names the checkpoint.
        graph_step = step if self._read_global_step is None else int(session.run(self._read_global_step))
        self._recover_needs(saver.last_checkpoints)
        if (
            self._chain
            and self._last_graph_step is not None
            and graph_step <= self._last_graph_step
            and step > self._last_step
        ):
            tf.compat.v1.logging.warning(
                "delta checkpoints: the global step did not advance since the previous save (%d, checkpoint step "
                "%d): this save is a full one. Deltas need a global step that advances (minimize(loss, "
                "global_step=...)).",
                graph_step,
                step,
            )
        full = (
            not self._chain
            or len(self._chain) >= self._full_every
            or self._last_step is None
            or step <= self._last_step  # the same name as the previous save: it would overwrite a link
            or self._last_graph_step is None
            or graph_step <= self._last_graph_step  # rows trained since the last save could have older versions
            or not session.run(self._tracked)
        )
        save_id = uuid.uuid4().hex
        links = [] if full else list(self._chain)
        since = -1 if full else self._last_graph_step
        # Keep what the checkpoints the Saver keeps need: the Saver deletes its oldest beyond max_to_keep while
        # saving; a link a kept checkpoint needs is taken off its list (and deleted here once nothing needs it).
        max_to_keep = saver.saver_def.max_to_keep
        listed = list(saver.last_checkpoints)
        doomed = []
        if max_to_keep > 0 and len(listed) + 1 > max_to_keep:
            doomed = listed[: len(listed) + 1 - max_to_keep]
            kept = listed[len(listed) + 1 - max_to_keep :]
            needed = {p for _, p in links}
            for p in kept:
                needed.update(self._needs.get(p) or ())
            if self._unknown_needs(kept):
                needed.update(doomed)  # a kept checkpoint's needs are unknown: it may need any of them
            rescued = [p for p in doomed if p in needed]
            if rescued:
                # pylint: disable=protected-access
                saver.set_last_checkpoints_with_time(
                    [(p, t) for p, t in internals.saver_checkpoints_with_time(saver) if p not in rescued]
                )
                self._kept_for_deltas.update(rescued)
        # The record names the files this listener manages besides the listed checkpoints, so that a run killed
        # between the save and after_save's clean-up has them deleted by the next run.
        # (Not the Saver's own doomed checkpoints: it deletes them while saving, or keeps some on purpose with
        # keep_checkpoint_every_n_hours.)
        owned = sorted(self._kept_for_deltas)
        record = ckpt_format.delta_record("full" if full else "delta", save_id, step, since, links, owned)
        full_record = record if full else ckpt_format.delta_record("full", save_id, step, -1, [], owned)
        session.run(
            self._state.assign,
            {
                self._state.since_in: since,
                self._state.record_in: record,
                self._state.full_record_in: full_record,
            },
        )
        if full:
            session.run(self._start)
        self._pending = (save_id, step, graph_step, links)

    def after_save(self, session, global_step_value):
        del global_step_value
        if self._pending is None:
            return
        save_id, step, graph_step, links = self._pending
        self._pending = None
        saver = self._get_saver(session)
        listed = list(saver.last_checkpoints)
        if not listed:
            raise RuntimeError(
                "delta checkpoints: the Saver lists no checkpoint after the save, so the listener cannot tell which "
                "file the save wrote (saved with write_state=False?): save with write_state=True (the default), as "
                "the hooks and listener.save do"
            )
        path = listed[-1]
        if any(os.path.basename(p) == os.path.basename(path) for _, p in links):
            raise RuntimeError(
                "delta checkpoints: the delta %s was saved under the name of a checkpoint it applies to, which it "
                "replaced; save with global_step=" % path
            )
        # A save asked to be a delta is full when a change it could not see happened after before_save.
        full = not links or not bool(session.run(self._state.read_wrote_delta))
        if full:
            links = []
        session.run(self._commit)
        self._chain = [(save_id, path)] if full else self._chain + [(save_id, path)]
        self._last_step = step
        self._last_graph_step = graph_step
        self._needs[path] = [p for _, p in links]
        # Links kept for deltas (here, or by an earlier run: read from the records) that no listed checkpoint
        # needs any more go now, as the Saver would have deleted them.
        known = set(self._kept_for_deltas)
        for links_of in self._needs.values():
            known.update(links_of or ())
        if self._unknown_needs(listed):
            # A listed checkpoint's needs are unknown (its record could not be read): delete nothing now.
            self._kept_for_deltas = known - set(listed)
            return
        needed = set()
        for p in listed:
            needed.update(self._needs.get(p) or ())
        unknown = set()  # existence unknown (a transient error): kept for a later save's clean-up
        for p in sorted(known - needed - set(listed)):
            exists = _index_exists(p)
            if exists:
                tf.compat.v1.train.remove_checkpoint(p)
            elif exists is None:
                unknown.add(p)
        self._kept_for_deltas = {p for p in needed if p not in listed} | unknown
        self._needs = {p: links_of for p, links_of in self._needs.items() if p in listed or p in needed}

    def save(self, sess, saver, save_path, global_step, write_meta_graph=True):
        """`saver.save(sess, save_path, global_step=...)` as a delta or full save, for plain Sessions.

        Args:
          sess: the Session.
          saver: the `tf.compat.v1.train.Saver` (built after this listener).
          save_path: the checkpoint prefix; the step is appended (`<save_path>-<step>`), as the hooks do.
          global_step: int, or a tensor/variable to read.
          write_meta_graph: passed to `saver.save` (the hooks write the graph with the first save only).

        Returns:
          The path of the checkpoint written.
        """
        if self._saver is None:
            self._saver = saver
        elif saver is not self._saver:
            raise ValueError("delta checkpoints: save() got another Saver than the one the listener was given")
        step = global_step if isinstance(global_step, int) else int(sess.run(global_step))
        self.begin()
        self.before_save(sess, step)
        path = saver.save(sess, save_path, global_step=step, write_meta_graph=write_meta_graph)
        self.after_save(sess, step)
        return path


def delta_checkpoints(full_every, saver=None, max_removed_keys=2**22):
    """Checkpoints of dynamic embeddings written as deltas: a full save every `full_every` saves, deltas between.

    A delta holds the rows trained since the previous save (with their optimizer slots, versions and frequencies)
    and the keys removed since then; restoring it (with any Saver, Estimator or MonitoredTrainingSession) applies its
    full save and the deltas before it in order, giving exactly the table saved. Dense variables are saved whole,
    as usual.

    Usage: Estimator `train(..., saving_listeners=[listener])`; `CheckpointSaverHook(..., listeners=[listener])`;
    with a plain Saver, create the listener after the model and before the Saver, then save with
    `listener.save(sess, saver, path, global_step)`.

    Args:
      full_every: int >= 1: every full_every-th save is full (1: every save).
      saver: the Saver (default: the graph's only Saver in `GraphKeys.SAVERS`, as hooks and Estimators use).
      max_removed_keys: removed keys each shard logs between saves (8 bytes each); past that the next save is full.

    Returns:
      A `DeltaCheckpointSaverListener` (a `tf.compat.v1.train.CheckpointSaverListener`).

    Raises:
      ValueError / TypeError: a bad argument.
    """
    listener = DeltaCheckpointSaverListener(full_every, saver=saver, max_removed_keys=max_removed_keys)
    if state_lib.get_dynamic_embeddings():
        listener.begin()  # a graph already built (plain Sessions): install before its Saver
    return listener
