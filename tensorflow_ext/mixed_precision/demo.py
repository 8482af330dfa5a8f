"""Demo: float32 vs pure float16 vs loss-state-switched precision on a small task.

Run ``python -m tensorflow_ext.mixed_precision.demo`` (about a minute on 2
cores; ``--reduced`` for the test-sized run). Each run prints its progress
(step, precision, loss scale, applied steps, loss) every ``--log_every``
steps and every precision switch when it happens (step, from -> to, reason).
TensorBoard summaries go to ``--model_dir``/<mode> (default: a new temporary
directory, printed first), with ``results.json`` (every run's results and
switch record). The last line printed is one JSON object::

    {"metric": "test_mse", "higher_is_better": false, "fp32": ..., "half": ...,
     "auto": ..., "half_fraction": ..., "switches": ...}

The task (why pure float16 loses, honestly): a regression whose targets sit
around 100 (``y = 100 + 40 tanh(x.a/4) + 15 sin(x.b/4) + noise``, 16 standard
normal features, MLP 16-32-32-1, Adam). The model function computes its
squared-error loss in the compute dtype, as a model written once for both
precisions does. 256 squared errors of ~100^2 sum to ~2.6e6, far above
float16's largest value 65504, so in float16 the *forward* loss is ``inf``
until the batch MSE is below ~256. Loss scaling cannot fix a forward overflow:
pure float16 skips every step and never learns; the training health check
(``--max_skipped_steps``, on by default) stops that run once that many steps
in a row were skipped. Float32 gets the MSE below 256
within ~100 steps, after which float16 is safe. The switching run starts in
float16, sees the non-finite steps, switches to float32 for the policy's
dwell (100 steps by default), then returns to float16 for the rest of the run.
The final model of each run is evaluated in float32 on a held-out set.
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import tensorflow as tf

from tensorflow_ext import mixed_precision as mp

NUM_FEATURES = 16
BATCH = 256
HIDDEN = 32
STEPS = 1000
REDUCED_STEPS = 300
LOG_EVERY = 100
SUMMARY_EVERY = 10
MAX_SKIPPED_STEPS = 50
MODES = ("float32", "half", "auto")


def make_data(n, seed):
    """Generates a synthetic regression data set.

    Args:
      n: number of examples.
      seed: seed of the feature and noise generator (the target weights are
        fixed, so data sets with different seeds share the same task).

    Returns:
      A tuple (features, targets): float32 numpy arrays of shapes
      ``[n, NUM_FEATURES]`` and ``[n, 1]``.
    """
    rng = np.random.RandomState(seed)
    x = rng.randn(n, NUM_FEATURES).astype(np.float32)
    w = np.random.RandomState(0).randn(2, NUM_FEATURES).astype(np.float32)
    y = 100 + 40 * np.tanh(x @ w[0] / 4) + 15 * np.sin(x @ w[1] / 4) + 3 * rng.randn(n)
    return x, y.astype(np.float32)[:, None]


def model_fn(x, y):
    """The model, written once: works in any compute dtype.

    Args:
      x: features in the compute dtype.
      y: targets in the compute dtype.

    Returns:
      (mean squared error, predictions), in the compute dtype.
    """
    h = tf.compat.v1.layers.dense(x, HIDDEN, tf.nn.relu, name="h1")
    h = tf.compat.v1.layers.dense(h, HIDDEN, tf.nn.relu, name="h2")
    pred = tf.compat.v1.layers.dense(h, 1, name="out")
    return tf.reduce_mean(tf.square(pred - y)), pred


class _SummaryHook(tf.compat.v1.train.SessionRunHook):
    """Writes ``summary_op`` with every N-th run, at step = runs so far.

    Not ``tf.compat.v1.train.SummarySaverHook``: that one counts in
    ``global_step``, which does not move while steps are skipped, and the
    skipped steps are what this demo is about.
    """

    def __init__(self, summary_op, output_dir, every_n_iter):
        self._op = summary_op
        self._dir = output_dir
        self._every = every_n_iter
        self._iter = 0
        self._writer = None

    def begin(self):
        self._writer = tf.compat.v1.summary.FileWriter(self._dir)
        self._iter = 0

    def before_run(self, run_context):
        if (self._iter + 1) % self._every == 0:
            return tf.compat.v1.train.SessionRunArgs({"summary": self._op})
        return None

    def after_run(self, run_context, run_values):
        self._iter += 1
        if run_values.results and "summary" in run_values.results:
            self._writer.add_summary(run_values.results["summary"], self._iter)

    def end(self, session):
        self.close()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def run(
    mode,
    steps,
    half_dtype=tf.float16,
    policy=None,
    lr=0.02,
    seed=1,
    batch_size=BATCH,
    model_dir=None,
    log_every=LOG_EVERY,
    summary_every=SUMMARY_EVERY,
    max_skipped_steps=MAX_SKIPPED_STEPS,
    log_fn=print,
):
    """Trains one run and returns its results.

    Args:
      mode: ``"float32"``, ``"half"`` or ``"auto"``.
      steps: training steps (session runs).
      half_dtype: the half dtype.
      policy: optional :class:`PolicyConfig`.
      lr: Adam learning rate.
      seed: graph-level seed.
      batch_size: examples per step.
      model_dir: directory for the TensorBoard summaries (None: none written).
      log_every: progress line every N steps.
      summary_every: summaries every N steps.
      max_skipped_steps: stop the run after this many skipped steps in a row
        (the training health check; 0 disables it).
      log_fn: callable(str) for the progress and switch lines.

    Returns:
      dict with ``test_mse``, ``half_fraction``, ``switches``, ``applied_steps``
      (global_step), ``steps_run``, ``seconds``, ``switch_record`` (list of
      ``{"step", "from", "to", "reason"}``) and ``stopped`` (None, or the
      health check's message when it stopped the run).
    """
    x_train, y_train = make_data(20000, 1)
    x_test, y_test = make_data(4000, 2)
    prefix = "%-7s " % mode
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        x = tf.compat.v1.placeholder(tf.float32, [None, NUM_FEATURES])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        amp = mp.MixedPrecision(mode=mode, half_dtype=half_dtype, policy=policy)
        loss, _ = amp.build(model_fn, x, y)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = amp.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(lr))
        train_op = opt.minimize(loss, global_step=global_step)
        test_mse = mp.build_in(tf.float32, model_fn, x, y)[0]
        metrics = amp.metrics()
        log_hook = amp.logging_hook(every_n_iter=log_every, log_fn=lambda s: log_fn(prefix + s), tensors={"loss": loss})
        hooks = [log_hook]
        if max_skipped_steps:
            hooks.append(amp.health_hook(max_skipped_steps=max_skipped_steps, every_n_iter=min(10, max_skipped_steps)))
        summary_hook = None
        if model_dir:
            tf.compat.v1.summary.scalar("loss", loss)
            amp.add_summaries()
            summary_hook = _SummaryHook(tf.compat.v1.summary.merge_all(), os.path.join(model_dir, mode), summary_every)
            hooks.append(summary_hook)
        rng = np.random.RandomState(3)
        stopped = None
        steps_run = 0
        try:
            with tf.compat.v1.train.SingularMonitoredSession(hooks=hooks) as sess:
                start = time.time()
                try:
                    for _ in range(steps):
                        idx = rng.randint(0, len(x_train), batch_size)
                        steps_run += 1
                        sess.run(train_op, {x: x_train[idx], y: y_train[idx]})
                except mp.NoTrainingProgressError as e:
                    stopped = str(e)
                    log_fn(
                        prefix + "stopped by the health check after %d steps (%d skipped "
                        "in a row)" % (steps_run, e.skipped_steps)
                    )
                seconds = time.time() - start
                raw = sess.raw_session()
                mse = float(raw.run(test_mse, {x: x_test, y: y_test}))
                m, gs = raw.run([metrics, global_step])
        finally:
            if summary_hook is not None:
                summary_hook.close()
    return {
        "test_mse": mse,
        "half_fraction": float(m["half_fraction"]),
        "switches": int(m["num_switches"]),
        "applied_steps": int(gs),
        "steps_run": steps_run,
        "seconds": round(seconds, 2),
        "switch_record": list(log_hook.switches),
        "stopped": stopped,
    }


def main(argv=None):
    """Runs float32, pure half and auto; prints the JSON summary last.

    Args:
      argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
      The summary dict.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps per run")
    parser.add_argument("--reduced", action="store_true", help="test-sized run (%d steps)" % REDUCED_STEPS)
    # --half-dtype: the earlier spelling, kept as an alias.
    parser.add_argument(
        "--half_dtype", "--half-dtype", dest="half_dtype", default="float16", choices=["float16", "bfloat16"]
    )
    parser.add_argument("--batch_size", type=int, default=BATCH)
    parser.add_argument(
        "--model_dir", default=None, help="where summaries and results.json go (default: a new temporary " "directory)"
    )
    parser.add_argument("--log_every", type=int, default=LOG_EVERY, help="progress line every N steps")
    parser.add_argument("--summary_every", type=int, default=SUMMARY_EVERY, help="TensorBoard summaries every N steps")
    parser.add_argument(
        "--max_skipped_steps",
        type=int,
        default=MAX_SKIPPED_STEPS,
        help="stop a run after N skipped steps in a row (0: never)",
    )
    args = parser.parse_args(argv)
    for flag in ("steps", "batch_size", "log_every", "summary_every"):
        if getattr(args, flag) < 1:
            parser.error("--%s must be >= 1, got %d" % (flag, getattr(args, flag)))
    if args.max_skipped_steps < 0:
        parser.error("--max_skipped_steps must be >= 0, got %d" % args.max_skipped_steps)
    steps = REDUCED_STEPS if args.reduced else args.steps
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="mixed_precision_demo_")
    print("model_dir: %s" % model_dir, flush=True)
    warnings.filterwarnings("ignore", message=".*tf.layers.*deprecated.*")
    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)

    def log(line):
        print(line, flush=True)

    results = {}
    for mode in MODES:
        results[mode] = run(
            mode,
            steps,
            half_dtype=tf.as_dtype(args.half_dtype),
            batch_size=args.batch_size,
            model_dir=model_dir,
            log_every=args.log_every,
            summary_every=args.summary_every,
            max_skipped_steps=args.max_skipped_steps,
            log_fn=log,
        )
        print("%-7s %s" % (mode, json.dumps(results[mode])), flush=True)
    summary = {
        "metric": "test_mse",
        "higher_is_better": False,
        "fp32": round(results["float32"]["test_mse"], 4),
        "half": round(results["half"]["test_mse"], 4),
        "auto": round(results["auto"]["test_mse"], 4),
        "half_fraction": round(results["auto"]["half_fraction"], 4),
        "switches": results["auto"]["switches"],
    }
    with open(os.path.join(model_dir, "results.json"), "w") as f:
        json.dump({"runs": results, "summary": summary}, f, indent=1)
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
