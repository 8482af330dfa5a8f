"""The CTR example's live-serving mode (``--serve_live``): the day's training streamed into a served model.

A live day is one run of the job (:func:`train.run`) with these additions:

1. Start of the day: the checkpoint the run continues from (in a new ``--model_dir``: the initialized model, saved
   as step 0) is exported as an updatable frozen SavedModel (``tf_ext.serving.freeze_for_serving(live_model=
   "ctr")``), the *daily export*, under ``<model_dir>/live_exports``.
2. A follower process (:mod:`follower`: ``python -m tensorflow_ext.serving.follow``) serves it over HTTP and applies
   each serving update the trainer writes into ``--updates_dir``, in order.
3. The trainer trains ``--steps`` with a ``tf_ext.serving.ServingUpdateHook`` writing an update every
   ``--update_secs`` seconds (and a last one when training ends).
4. Every ``--live_eval_secs`` (and once before the first step) the job scores a held-out slice of the current data
   (``--live_eval_batches`` batches of the synthetic stream's evaluation split, at the clock of the batch being
   trained: the stream drifts by ``--drift_per_day`` over the day) twice: through the follower's HTTP endpoint (the
   *live* model, at the version it serves then) and with the daily export loaded in this process and never updated
   (a model refreshed only by daily exports). A ``ctr: live:`` line reports both AUCs and the served version.
5. End of the day: after the run's evaluation and export, the job waits for the follower to serve the trainer's
   last update (the final global step), scores the next day's slice once more, and compares the follower's
   predictions with the end-of-day export's (the run's usual export, made from the final checkpoint): at that
   version the served model is the trained one.

The summary's ``live`` entry holds every point, the end of the day, the trainer's update counts and the
follower's status. Training pauses while a slice is scored (a few requests; the updates keep being applied by the
follower meanwhile).
"""

import os
import shutil
import time

import numpy as np
import tensorflow as tf

from tensorflow_ext import serving
from tensorflow_ext.examples import synthetic
from tensorflow_ext.examples.ctr import data
from tensorflow_ext.examples.ctr import follower
from tensorflow_ext.examples.ctr import log
from tensorflow_ext.examples.ctr import served
from tensorflow_ext.serving import update_format

# The served model's name: the trainer's updates carry it, and the live export refuses updates of another model.
MODEL_NAME = "ctr"
# The daily exports, under --model_dir (one timestamped SavedModel per day).
LIVE_EXPORTS = "live_exports"
# How long the end of the day waits for the follower to serve the last update. A guard against a follower that
# stopped applying (the message then says what it serves), not an expected duration: an update applies in seconds.
_FINAL_VERSION_TIMEOUT_SECS = 600.0


class _StopAtStart(tf.compat.v1.train.SessionRunHook):
    """Stops training before its first step: the Estimator then saves the initialized model (its checkpoint hook
    saves when the session is created), the start of a day in a new model_dir."""

    def after_create_session(self, session, coord):
        coord.request_stop()


class LiveEvalHook(tf.compat.v1.train.SessionRunHook):
    """Scores the held-out slice of the current data every ``every_secs`` of training, and once before the first
    step (:meth:`LiveDay.score`)."""

    def __init__(self, day, every_secs):
        self._day = day
        self._every_secs = every_secs
        self._next = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._day.start_clock()
        self._day.score(int(session.run(self._global_step)))
        self._next = time.time() + self._every_secs

    def after_run(self, run_context, run_values):
        if time.time() >= self._next:
            # Read after the step (a fetch beside the train op could see the step before or after its increment).
            self._day.score(int(run_context.session.run(self._global_step)))
            self._next = time.time() + self._every_secs


class LiveDay(object):
    """One live-serving day around a run of the job: the daily export, the follower, the scored points.

    Args:
      args: parsed flags (``--serve_live`` and its flags).
      job: the run's ``train._Job`` (where the run starts: ``start_step``, ``start_batches``, the stream).
      estimator: the run's Estimator.
      train_input_fn: the run's training input function (a new model_dir trains zero steps with it to save the
        initialized model).
    """

    def __init__(self, args, job, estimator, train_input_fn):
        self._args = args
        self._job = job
        self._estimator = estimator
        self._train_input_fn = train_input_fn
        self._follower = None
        self._daily = None
        self._update_hook = None
        self._train_start = None
        self.daily_export = None
        self.daily_version = None
        self.points = []

    # ------------------------------------------------------------------ start of the day

    def start(self):
        """Exports the start of the day, starts the follower on it and loads it here; returns the training hooks."""
        args = self._args
        if tf.train.latest_checkpoint(args.model_dir) is None:
            verbosity = tf.compat.v1.logging.get_verbosity()
            if not args.verbose:  # the Estimator warns that training made no steps: that is the point here
                tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
            try:
                self._estimator.train(self._train_input_fn, hooks=[_StopAtStart()])
            finally:
                tf.compat.v1.logging.set_verbosity(verbosity)
        self.daily_version = self._job.start_step
        self._drop_foreign_updates()
        with served.export_context(args.serve_dtype, True, live_model=MODEL_NAME):
            self.daily_export = self._estimator.export_saved_model(
                os.path.join(args.model_dir, LIVE_EXPORTS), data.serving_input_fn(self._job.string_ids)
            ).decode()
        self._follower = follower.FollowerProcess(self.daily_export, args.updates_dir, args.poll_secs, args.verbose)
        self._daily = served.ExportedModel(self.daily_export)
        if not args.quiet:
            log.say(
                "live: daily export (global step %d) %s, served by follower pid %d at %s; serving updates every "
                "%g s into %s",
                self.daily_version,
                self.daily_export,
                self._follower.pid,
                self._follower.url,
                args.update_secs,
                args.updates_dir,
            )
        self._update_hook = serving.ServingUpdateHook(
            args.updates_dir, every_secs=args.update_secs, model_name=MODEL_NAME
        )
        return [self._update_hook, LiveEvalHook(self, args.live_eval_secs)]

    def start_clock(self):
        """The day's clock starts (a point's ``seconds``): the training session exists, the first step is next."""
        self._train_start = time.time()

    def _drop_foreign_updates(self):
        """Removes updates past the step the day starts from: the trainer continues from that checkpoint, so they
        were written by another run (one that trained past it and was not checkpointed, or an earlier model in a
        reused directory); the follower would otherwise apply them as this model's."""
        for step, path in update_format.list_updates(self._args.updates_dir):
            if step > self.daily_version:
                log.say("live: removing %s (past the checkpoint's global step %d)", path, self.daily_version)
                shutil.rmtree(path)

    # ------------------------------------------------------------------ the day

    def _slice(self, step):
        """The held-out slice at the trainer's ``step``: ``(features, labels)`` of the stream's evaluation split at
        the clock of the batch trained at that step (the data the model sees now)."""
        args, job = self._args, self._job
        clock = job.start_batches + (step - job.start_step)
        features, labels = [], []
        for index in range(args.live_eval_batches):
            batch, batch_labels, _ = job.stream.batch(index, args.batch_size, "eval", clock)
            for key in synthetic.DENSE_KEYS:
                batch[key] = synthetic.log_counts(batch[key])
            features.append(batch)
            labels.append(batch_labels)
        merged = {key: np.concatenate([f[key] for f in features]) for key in features[0]}
        return merged, np.concatenate(labels)

    def score(self, step, final=False):
        """Scores the slice at ``step`` through the follower and with the daily export; returns the point."""
        features, labels = self._slice(step)
        live, version = self._follower.predict(features)
        daily = self._daily.predict(features)
        point = dict(
            seconds=round(time.time() - self._train_start, 1) if self._train_start else 0.0,
            step=step,
            served_version=version,
            lag_steps=step - version,
            live_auc=round(synthetic.auc(labels, live), 6),
            daily_auc=round(synthetic.auc(labels, daily), 6),
            examples=int(labels.size),
        )
        if not final:
            self.points.append(point)
        if not self._args.quiet:
            log.say(
                "live: %s%.1f s, step %d: served version %d (%d steps behind), AUC %.4f live vs %.4f daily export "
                "(step %d) on %d held-out examples%s",
                "end of day, " if final else "",
                point["seconds"],
                step,
                version,
                point["lag_steps"],
                point["live_auc"],
                point["daily_auc"],
                self.daily_version,
                point["examples"],
                " of the next day's data" if final else " of the current data",
            )
        return point, features, live

    # ------------------------------------------------------------------ end of the day

    def finish(self, global_step, export_dir):
        """The end of the day: waits for the last update, scores, checks the served model against the end-of-day
        export; returns the summary's ``live`` entry."""
        status = self._follower.wait_for_version(global_step, _FINAL_VERSION_TIMEOUT_SECS)
        point, features, live = self.score(global_step, final=True)
        max_diff = None
        if export_dir:
            end_of_day = served.ExportedModel(export_dir)
            try:
                max_diff = float(np.max(np.abs(end_of_day.predict(features) - live)))
            finally:
                end_of_day.close()
        status = self._follower.status()
        stats = self._update_hook.writer.stats if self._update_hook is not None else None
        if not self._args.quiet:
            log.say(
                "live: %s; follower: %s; the served model at version %d vs the end-of-day export: max |difference| "
                "%s on %d examples",
                _writer_line(stats),
                _follower_line(status),
                point["served_version"],
                "-" if max_diff is None else "%.3g" % max_diff,
                point["examples"],
            )
        return dict(
            model_name=MODEL_NAME,
            daily_export=self.daily_export,
            daily_version=self.daily_version,
            updates_dir=self._args.updates_dir,
            update_secs=self._args.update_secs,
            points=self.points,
            final=point,
            max_abs_diff_vs_export=max_diff,
            updates=dict(stats) if stats is not None else None,
            follower=status,
        )

    def close(self):
        """Stops the follower and closes the daily model (also after an error)."""
        if self._daily is not None:
            self._daily.close()
            self._daily = None
        if self._follower is not None:
            self._follower.close()
            self._follower = None


def _writer_line(stats):
    if not stats:
        return "no updates written"
    return "%d serving updates written (%d full, %d failed, %d keys, %s)" % (
        stats.get("written", 0),
        stats.get("full", 0),
        stats.get("failed", 0),
        stats.get("keys", 0),
        log.mib(stats.get("bytes", 0)),
    )


def _follower_line(status):
    stats = status.get("stats", {})
    return "version %d, %d updates applied, %d stale, %d refused, %d resyncs" % (
        int(status.get("version", -1)),
        stats.get("applied", 0),
        stats.get("stale", 0),
        stats.get("refused", 0),
        stats.get("resyncs", 0),
    )
