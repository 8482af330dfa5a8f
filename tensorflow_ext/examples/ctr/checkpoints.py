"""What the CTR example keeps in ``--model_dir`` beside the Estimator's checkpoints, and what it reads back.

* ``ctr_progress.json``: per checkpoint (by global step), how many batches of the synthetic stream training had
  consumed. A global step is one batch per rank, so the stream position depends on the rank counts of every run so
  far, not on the step alone. Each record is written before its checkpoint, atomically (write, then rename), so every
  checkpoint on disk has one; records of checkpoints no longer on disk are dropped.
* ``ctr_config.json``: the flags that fix the checkpoint's shapes; a run continuing from a checkpoint must use the
  same values (:func:`check_model_dir_config`).
* Read back for the summary: the checkpoint's global step, its bytes, the admission/eviction counters it holds, the
  event files.
"""

import glob
import json
import os

import tensorflow as tf

from tensorflow_ext.examples.ctr import log

_PROGRESS_FILE = "ctr_progress.json"
_CONFIG_FILE = "ctr_config.json"
# Flags that fix the checkpoint's contents: a continued run must use the same values.
_SHAPE_FLAGS = ("model", "dim", "hidden", "optimizer", "num_shards", "string_ids", "static_buckets")


def checkpoint_step(model_dir):
    """The global step of the latest checkpoint in model_dir (0 if none or unreadable)."""
    ckpt = tf.train.latest_checkpoint(model_dir) if os.path.isdir(model_dir) else None
    if not ckpt:
        return 0
    try:
        return int(tf.train.load_variable(ckpt, "global_step"))
    except Exception:  # pylint: disable=broad-except
        return 0


def read_progress(model_dir):
    """``{global step: {"batches", "ranks", "batch_size"}}`` from model_dir's progress records ({} if none)."""
    path = os.path.join(model_dir, _PROGRESS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {int(step): record for step, record in json.load(f).items()}


def resume_batches(model_dir, start_step, num_ranks):
    """The stream's first batch for a run continuing from the checkpoint at `start_step`."""
    if start_step == 0:
        return 0
    record = read_progress(model_dir).get(start_step)
    if record is not None:
        return int(record["batches"])
    log.say(
        "warning: %s has no record of the batches consumed up to the checkpoint at step %d (written by an older "
        "version); continuing the stream at batch %d, as if every earlier run had %d rank(s)",
        os.path.join(model_dir, _PROGRESS_FILE),
        start_step,
        start_step * num_ranks,
        num_ranks,
    )
    return start_step * num_ranks


class StreamProgressListener(tf.compat.v1.train.CheckpointSaverListener):
    """Records, before each save, the stream batches consumed up to the checkpoint's step (``ctr_progress.json``).

    Written before the checkpoint, atomically (rename), so every checkpoint on disk has its record; records of
    checkpoints the Saver deleted are dropped after the save.
    """

    def __init__(self, model_dir, start_step, start_batches, num_ranks, batch_size):
        self._model_dir = model_dir
        self._start = (start_step, start_batches)
        self._num_ranks = num_ranks
        self._batch_size = batch_size

    def before_save(self, session, global_step_value):
        step = int(global_step_value)
        batches = self._start[1] + (step - self._start[0]) * self._num_ranks
        self._write(step, dict(batches=batches, ranks=self._num_ranks, batch_size=self._batch_size))

    def after_save(self, session, global_step_value):
        self._write(None, None)

    def _write(self, step, record):
        progress = {
            s: r
            for s, r in read_progress(self._model_dir).items()
            if os.path.exists(os.path.join(self._model_dir, "model.ckpt-%d.index" % s))
        }
        if step is not None:
            progress[step] = record
        path = os.path.join(self._model_dir, _PROGRESS_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump({str(s): progress[s] for s in sorted(progress)}, f)
        os.replace(path + ".tmp", path)


def check_model_dir_config(model_dir, config, has_checkpoint):
    """Records the model's shape flags in model_dir; refuses to continue with other ones.

    Args:
      model_dir: the model directory (exists).
      config: dict of the shape flags of this run.
      has_checkpoint: whether model_dir holds a checkpoint to continue from.

    Raises:
      SystemExit: the checkpoint was written with other shape flags.
    """
    path = os.path.join(model_dir, _CONFIG_FILE)
    if has_checkpoint and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        diff = [
            "--%s %s (checkpoint) vs %s (now)" % (k, old.get(k), config[k])
            for k in _SHAPE_FLAGS
            if k in old and old[k] != config[k]
        ]
        if diff:
            raise SystemExit(
                "ctr: %s holds a checkpoint of another model: %s. Use the same flags, --fresh, or "
                "another --model_dir." % (model_dir, "; ".join(diff))
            )
    with open(path, "w") as f:
        json.dump(config, f, sort_keys=True)


def checkpoint_bytes(prefix):
    """Bytes of a checkpoint's files (index and data), 0 if none."""
    if not prefix:
        return 0
    return sum(os.path.getsize(f) for f in glob.glob(prefix + ".*") if not f.endswith(".meta"))


def lifecycle_counts(prefix):
    """Keys admitted and evicted so far (all tables), from the counters a checkpoint holds."""
    out = {"admitted_keys": 0, "evicted_keys": 0}
    if not prefix:
        return out
    for name, _ in tf.train.list_variables(prefix):
        if name.endswith("_admission/admitted"):
            out["admitted_keys"] += int(tf.train.load_variable(prefix, name))
        elif name.endswith("_eviction/evicted"):
            out["evicted_keys"] += int(tf.train.load_variable(prefix, name))
    return out


def event_files(model_dir):
    """The TensorBoard event files under model_dir (training and eval/)."""
    return glob.glob(os.path.join(model_dir, "**", "events.out.tfevents.*"), recursive=True)
