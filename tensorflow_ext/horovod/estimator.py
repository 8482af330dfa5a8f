"""Training a `tf.compat.v1.estimator.Estimator` (or a MonitoredTrainingSession) under horovodrun.

    config = tfe_hvd.estimator.run_config(model_dir, save_checkpoints_steps=1000)
    est = tf.compat.v1.estimator.Estimator(model_fn, config=config)
    est.train(tfe_hvd.estimator.shard_input_fn(input_fn), hooks=tfe_hvd.estimator.training_hooks(config),
              max_steps=100000)
    tfe_hvd.estimator.export_saved_model(est, export_dir, serving_input_receiver_fn)   # rank 0 writes it

What each piece does:

* `run_config`: rank 0 writes checkpoints, summaries and step logs; the other ranks write nothing (no
  CheckpointSaverHook, no summary writer) but every rank still restores from `model_dir` at start (all ranks must
  see the same directory: one machine or a shared filesystem).
* `shard_input_fn`: rank r trains on elements r, r + N, ... of the input; the input ends at the same step on every
  rank (`tensorflow_ext.horovod.input`).
* `training_hooks`: one hook per rank that, in order, (1) checks that all ranks built the same model and restored
  the same global step, (2) writes the first checkpoint on rank 0, (3) broadcasts the dense variables from rank 0,
  then (4) saves every `save_checkpoints_steps` (rank 0 writes; with model-parallel embeddings the other ranks take
  part in the gather of the full table, `tensorflow_ext.horovod.checkpoint`, and of each rank's Top-K residuals,
  `tensorflow_ext.horovod.residual_checkpoint`), (5) stops every rank when some rank's
  input ends, and (6) writes the last checkpoint when training stops. Data-parallel tables need no broadcast: they
  start empty or restore from the same checkpoint, and every rank applies the same updates.
* `export_saved_model`: rank 0 exports a SavedModel built as one process (`single_process`), holding every key.
"""

import tensorflow as tf

from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import checkpoint as ckpt_lib
from tensorflow_ext.horovod import consistency
from tensorflow_ext.horovod import embedding as hvd_embedding
from tensorflow_ext.horovod import input as input_lib
from tensorflow_ext.horovod import residual_checkpoint
from tensorflow_ext.horovod.config import TOPK_RESIDUALS
from tensorflow_ext.tf_compat import internals

__all__ = ["export_saved_model", "run_config", "shard_input_fn", "training_hooks"]

STEP_AGREEMENT_NAME = "tf_ext_global_step_agreement"

# The checkpoint schedule the user asked for, kept on the RunConfig of every rank (the other ranks' RunConfig has
# checkpoints off, but their hooks follow rank 0's schedule).
_SCHEDULE_ATTR = "_tf_ext_horovod_checkpoint_schedule"


def _rank_and_size():
    hvd = _hvd.require_horovod()
    return hvd.rank(), hvd.size()


def run_config(
    model_dir,
    save_checkpoints_steps=1000,
    save_checkpoints_secs=None,
    save_summary_steps=100,
    log_step_count_steps=100,
    **kwargs,
):
    """A `tf.estimator.RunConfig` for this rank: rank 0 saves, the others only restore.

    Args:
      model_dir: the directory of checkpoints and summaries, the same path on every rank (shared filesystem).
      save_checkpoints_steps: rank 0 writes a checkpoint every this many steps. Required with model-parallel
        embeddings (their save is collective: every rank must reach it at the same step).
      save_checkpoints_secs: alternatively, every this many seconds (only without model-parallel embeddings:
        `training_hooks` refuses it with them). Give one of the two.
      save_summary_steps: rank 0 writes summaries every this many steps (None: never).
      log_step_count_steps: rank 0 logs loss and steps/sec every this many steps (None: never).
      **kwargs: other `tf.estimator.RunConfig` arguments (keep_checkpoint_max, session_config, ...).

    Returns:
      A `tf.estimator.RunConfig`.

    Raises:
      ValueError: no model_dir, or both or neither of save_checkpoints_steps / save_checkpoints_secs.
    """
    if not model_dir:
        raise ValueError("run_config needs a model_dir that every rank can read (rank 0 writes it)")
    if (save_checkpoints_steps is None) == (save_checkpoints_secs is None):
        raise ValueError(
            "run_config: give one of save_checkpoints_steps and save_checkpoints_secs, got %r and %r"
            % (save_checkpoints_steps, save_checkpoints_secs)
        )
    for key in ("save_checkpoints_steps", "save_checkpoints_secs", "save_summary_steps", "log_step_count_steps"):
        if key in kwargs:
            raise TypeError("run_config() got %s twice" % key)
    rank, _ = _rank_and_size()
    if rank == 0:
        config = tf.estimator.RunConfig(
            model_dir=model_dir,
            save_checkpoints_steps=save_checkpoints_steps,
            save_checkpoints_secs=save_checkpoints_secs,
            save_summary_steps=save_summary_steps,
            log_step_count_steps=log_step_count_steps,
            **kwargs,
        )
    else:
        config = tf.estimator.RunConfig(
            model_dir=model_dir,
            save_checkpoints_steps=None,
            save_checkpoints_secs=None,
            save_summary_steps=None,
            log_step_count_steps=None,
            **kwargs,
        )
    setattr(config, _SCHEDULE_ATTR, (save_checkpoints_steps, save_checkpoints_secs))
    return config


def shard_input_fn(input_fn, shard=True):
    """Wraps an Estimator input_fn that returns a `tf.data.Dataset` for training under horovodrun.

    In training (mode TRAIN, or an Estimator that passes no mode), rank r reads elements r, r + N, ... of the
    dataset (`input_shard`; the elements are whole batches when input_fn batches) and the input ends at the same
    step on every rank: when the first rank reads its last element, every rank stops after that step
    (`synchronized_next`; the hooks of `training_hooks` do the stopping). In other modes the dataset is returned
    unchanged (evaluate or predict on one rank inside `single_process()`).

    Args:
      input_fn: an input_fn taking any of (mode, params, config) and returning a `tf.data.Dataset` of
        (features, labels) or features, dense tensors.
      shard: False when input_fn shards by itself (e.g. with `input_shard` before batching): only the end of input
        is synchronized.

    Returns:
      An input_fn for `Estimator.train`.
    """
    wanted = internals.function_utils.fn_args(input_fn)

    def sharded_input_fn(mode, params, config):
        kwargs = {k: v for k, v in (("mode", mode), ("params", params), ("config", config)) if k in wanted}
        dataset = input_fn(**kwargs)
        if mode not in (None, tf.estimator.ModeKeys.TRAIN):
            return dataset
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                "shard_input_fn needs an input_fn that returns a tf.data.Dataset; %s returned %s"
                % (getattr(input_fn, "__name__", input_fn), type(dataset).__name__)
            )
        if shard:
            dataset = input_lib.input_shard(dataset)
        return input_lib.synchronized_next(dataset)

    return sharded_input_fn


class _RankSync(object):
    """What every rank's hook does (the chief's hook also saves; see training_hooks)."""

    def _sync_init(self, root_rank, save_steps, save_secs, writes, model_dir=None, retention=None):
        self._root_rank = root_rank
        self._model_dir = model_dir
        self._retention = retention or {}
        self._save_steps = save_steps
        self._save_secs = save_secs
        self._writes = writes
        self._check = self._steps = self._broadcast = self._gather = self._has_next = self._gs = None
        self._mirror_timer = None
        self._save_saver = None

    def _sync_begin(self):
        hvd = _hvd.require_horovod()
        graph = tf.compat.v1.get_default_graph()
        saveables = ckpt_lib.model_parallel_saveables(graph)
        if saveables and self._save_secs:
            raise ValueError(
                "save_checkpoints_secs=%r cannot be used with model-parallel dynamic embeddings (%s): their "
                "checkpoint gathers every rank's keys, so every rank must save at the same step, and a time-based "
                "schedule triggers at different steps on different ranks. Use save_checkpoints_steps."
                % (self._save_secs, ", ".join(sorted({s.shard.embedding.name for s in saveables})))
            )
        self._gs = tf.compat.v1.train.get_global_step()
        residuals = []
        if self._save_steps and self._model_dir:
            # Each rank's Top-K residuals in the checkpoint (gathered: collective like a model-parallel save).
            savers = residual_checkpoint.install_saver(graph, self._model_dir, **self._retention)
            residuals, self._save_saver = savers.saveables, savers.save_saver
        elif self._save_secs and graph.get_collection(TOPK_RESIDUALS):
            tf.compat.v1.logging.warning(
                "tensorflow_ext.horovod: with save_checkpoints_secs=%r the checkpoints hold rank 0's Top-K residuals "
                "(a time-based schedule saves at different steps on different ranks, so the ranks' residuals cannot "
                "be gathered): on restart every rank resumes from them. Use save_checkpoints_steps to keep each "
                "rank's own." % self._save_secs
            )
        if saveables or residuals:
            # Rank 0's saves of model-parallel embeddings are collectives that every rank joins on its own schedule:
            # ranks with different schedules would wait for each other at the first save (checked with the model).
            consistency.declare(
                "checkpoint schedule",
                [("save_checkpoints_steps", self._save_steps), ("save_checkpoints_secs", self._save_secs)],
                graph,
            )
        with tf.compat.v1.name_scope("tf_ext_horovod_sync"):
            if hvd.size() > 1:
                self._check = consistency.check_op(graph)
                if self._gs is not None:
                    self._steps = hvd.allgather(tf.reshape(tf.cast(self._gs, tf.int64), [1]), name=STEP_AGREEMENT_NAME)
            # Every global variable but the Top-K residuals, which are each rank's own (restored per rank).
            rank_local = set(id(v) for v in graph.get_collection(TOPK_RESIDUALS))
            self._broadcast = hvd.broadcast_variables(
                [v for v in tf.compat.v1.global_variables() if id(v) not in rank_local], self._root_rank
            )
            if (saveables or residuals) and self._save_steps:
                # Built now on every rank (before the graph is finalized) so rank 0's Saver and the others' gather
                # use the same collectives.
                self._gather = ckpt_lib.gather_op(graph)
        if not self._writes and self._gather is not None:
            if self._gs is None:
                raise RuntimeError(
                    "Checkpoints of model-parallel embeddings need a global step "
                    "(tf.compat.v1.train.get_or_create_global_step())"
                )
            self._mirror_timer = tf.compat.v1.train.SecondOrStepTimer(every_steps=self._save_steps)
        self._has_next = input_lib.all_have_next(graph)

    def _sync_agree(self, session, when):
        fetches = [f for f in (self._check, self._steps) if f is not None]
        if not fetches:
            return
        out = session.run(fetches)
        if self._steps is not None:
            steps = [int(s) for s in out[-1]]
            if len(set(steps)) > 1:
                raise RuntimeError(
                    "tensorflow_ext.horovod: ranks are at different global steps %s: %s. Every rank must restore "
                    "the same checkpoint from the same model_dir (one machine or a shared filesystem) and run the "
                    "same number of steps." % (when, ", ".join("rank %d: %d" % (r, s) for r, s in enumerate(steps)))
                )

    def _mirror_save(self, session, global_step):
        """On a rank that does not write the checkpoint: the collectives of rank 0's save."""
        session.run(self._gather)
        self._mirror_timer.update_last_triggered_step(global_step)

    def _sync_fetches(self):
        fetches = {}
        if self._has_next is not None:
            fetches["has_next"] = self._has_next
        if self._mirror_timer is not None:
            fetches["global_step"] = self._gs
        return fetches

    def _sync_after_run(self, run_context, results):
        if self._mirror_timer is not None:
            # The same decision as CheckpointSaverHook.after_run on rank 0 (the global step is the same everywhere).
            if self._mirror_timer.should_trigger_for_step(results["global_step"] + 1):
                global_step = run_context.session.run(self._gs)
                if self._mirror_timer.should_trigger_for_step(global_step):
                    self._mirror_save(run_context.session, global_step)
        if "has_next" in results and not results["has_next"]:
            run_context.request_stop()

    def _sync_end(self, session):
        if self._mirror_timer is not None:
            last_step = session.run(self._gs)
            if last_step != self._mirror_timer.last_triggered_step():
                self._mirror_save(session, last_step)
        # Every rank leaves training once the last checkpoint is written, at the same step.
        self._sync_agree(session, "at the end of training")


class _WorkerHook(_RankSync, tf.compat.v1.train.SessionRunHook):
    """The hook of a rank that does not write checkpoints."""

    def __init__(self, root_rank, save_steps, save_secs, model_dir=None, retention=None):
        self._sync_init(root_rank, save_steps, save_secs, writes=False, model_dir=model_dir, retention=retention)

    def begin(self):
        self._sync_begin()

    def after_create_session(self, session, coord):
        self._sync_agree(session, "after restoring")
        if self._mirror_timer is not None:
            self._mirror_save(session, session.run(self._gs))
        session.run(self._broadcast)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._sync_fetches())

    def after_run(self, run_context, run_values):
        self._sync_after_run(run_context, run_values.results)

    def end(self, session):
        self._sync_end(session)


class _SaverSource(object):
    """What CheckpointSaverHook asks for its Saver (its `scaffold` argument is read only for `.saver`): the Saver
    that `residual_checkpoint.install_saver` set aside for saving when there is one, else the graph's SAVERS Saver
    (what the hook uses without a scaffold)."""

    def __init__(self, save_saver):
        self._save_saver = save_saver

    @property
    def saver(self):
        saver = self._save_saver()
        if saver is not None:
            return saver
        savers = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS)
        if len(savers) != 1:
            raise RuntimeError(
                "tensorflow_ext.horovod: rank 0's checkpoint hook needs exactly one Saver in the SAVERS collection, "
                "found %d" % len(savers)
            )
        return savers[0]


class _ChiefHook(_RankSync, tf.compat.v1.train.CheckpointSaverHook):
    """Rank 0's hook: a CheckpointSaverHook (so Estimator adds no other) that also synchronizes with the ranks."""

    def __init__(self, model_dir, root_rank, save_steps, save_secs, listeners=None, retention=None):
        tf.compat.v1.train.CheckpointSaverHook.__init__(
            self,
            model_dir,
            save_secs=save_secs,
            save_steps=save_steps,
            listeners=listeners,
            scaffold=_SaverSource(lambda: self._save_saver),
        )
        self._sync_init(root_rank, save_steps, save_secs, writes=True, model_dir=model_dir, retention=retention)

    def begin(self):
        tf.compat.v1.train.CheckpointSaverHook.begin(self)
        self._sync_begin()

    def after_create_session(self, session, coord):
        self._sync_agree(session, "after restoring")
        tf.compat.v1.train.CheckpointSaverHook.after_create_session(self, session, coord)
        session.run(self._broadcast)

    def before_run(self, run_context):
        fetches = self._sync_fetches()
        fetches["saver_global_step"] = self._global_step_tensor
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        saver_values = tf.compat.v1.train.SessionRunValues(
            run_values.results["saver_global_step"], run_values.options, run_values.run_metadata
        )
        tf.compat.v1.train.CheckpointSaverHook.after_run(self, run_context, saver_values)
        self._sync_after_run(run_context, run_values.results)

    def end(self, session):
        tf.compat.v1.train.CheckpointSaverHook.end(self, session)
        self._sync_end(session)


def training_hooks(config=None, model_dir=None, save_checkpoints_steps=None, save_checkpoints_secs=None, root_rank=0):
    """The hooks every rank passes to `Estimator.train` (or `MonitoredTrainingSession(hooks=...)`).

    With an Estimator pass the RunConfig of `run_config`. With a MonitoredTrainingSession pass model_dir and the
    schedule, and turn the session's own saving and summaries off on ranks other than 0
    (`save_checkpoint_secs=None, save_checkpoint_steps=None`, and on those ranks `save_summaries_steps=None,
    log_step_count_steps=None`; on rank 0 the returned hook is the checkpoint saver). Give no other hook that runs
    Horovod collectives (these hooks broadcast the variables: no `hvd.BroadcastGlobalVariablesHook` needed).

    Args:
      config: the `tf.estimator.RunConfig` (from `run_config`, or any RunConfig: its save_checkpoints_* then give
        the schedule).
      model_dir: without config: the checkpoint directory (None: no checkpoints).
      save_checkpoints_steps, save_checkpoints_secs: without config: the schedule (one of them).
      root_rank: the rank whose dense variables are broadcast at start.

    Returns:
      list of one `SessionRunHook`.

    Raises:
      ValueError: both config and model_dir/schedule given, both steps and secs, or on a rank other than 0 a
        RunConfig that writes checkpoints or summaries (not one of `run_config`).
    """
    rank, _ = _rank_and_size()
    retention = None
    if config is not None:
        if model_dir is not None or save_checkpoints_steps is not None or save_checkpoints_secs is not None:
            raise ValueError("training_hooks: give config, or model_dir and the schedule, not both")
        if rank != 0 and (config.save_checkpoints_steps or config.save_checkpoints_secs or config.save_summary_steps):
            raise ValueError(
                "training_hooks: the RunConfig of rank %d writes checkpoints or summaries (save_checkpoints_steps=%r, "
                "save_checkpoints_secs=%r, save_summary_steps=%r): every rank would write to model_dir, and the "
                "checkpoints of model-parallel embeddings would not be synchronized. Build it with "
                "tensorflow_ext.horovod.run_config(model_dir, ...), which leaves writing to rank 0."
                % (rank, config.save_checkpoints_steps, config.save_checkpoints_secs, config.save_summary_steps)
            )
        model_dir = config.model_dir
        retention = dict(
            keep_checkpoint_max=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
        )
        save_checkpoints_steps, save_checkpoints_secs = getattr(
            config, _SCHEDULE_ATTR, (config.save_checkpoints_steps, config.save_checkpoints_secs)
        )
    if save_checkpoints_steps is not None and save_checkpoints_secs is not None:
        raise ValueError(
            "training_hooks: give one of save_checkpoints_steps and save_checkpoints_secs, got %r and "
            "%r" % (save_checkpoints_steps, save_checkpoints_secs)
        )
    if not model_dir:
        save_checkpoints_steps = save_checkpoints_secs = None
    if rank == 0 and (save_checkpoints_steps or save_checkpoints_secs):
        return [_ChiefHook(model_dir, root_rank, save_checkpoints_steps, save_checkpoints_secs, retention=retention)]
    return [_WorkerHook(root_rank, save_checkpoints_steps, save_checkpoints_secs, model_dir, retention)]


def export_saved_model(estimator, export_dir_base, serving_input_receiver_fn, **kwargs):
    """Rank 0 exports a SavedModel of the latest checkpoint, built as one process (every key of every table).

    The serving graph is built inside `single_process()`: model-parallel embeddings are plain embeddings that
    restore the whole table from the checkpoint, and it contains no Horovod op, so a process that only imports
    tensorflow_ext serves it. Other ranks export nothing.

    Args:
      estimator: the trained `Estimator` (its model_dir holds the checkpoint).
      export_dir_base: as in `Estimator.export_saved_model`.
      serving_input_receiver_fn: as in `Estimator.export_saved_model`.
      **kwargs: other `Estimator.export_saved_model` arguments.

    Returns:
      The export directory (bytes) on rank 0, None on the other ranks.
    """
    rank, _ = _rank_and_size()
    if rank != 0:
        return None
    with hvd_embedding.single_process():
        return estimator.export_saved_model(export_dir_base, serving_input_receiver_fn, **kwargs)
