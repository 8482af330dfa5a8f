"""XLA for the dense part of a model, with batch-size buckets so that ragged batches do not recompile.

XLA compiles a cluster once per input shape. Recommender input pipelines produce ragged batches (the last batch of a
file, per-day files, filtered examples), and with TF's own clustering every new batch size is a new compilation: a
stream of ragged batches keeps compiling (TF gives up on a cluster that compiled more than 10 times with fewer than
50 runs each, and runs it uncompiled from then on). `compile_bucketed` pads the batch dimension up to the next of a
few bucket sizes before the compiled part and slices the outputs back, so the cluster sees at most one shape per
bucket:

    logits = tf_ext.xla.compile_bucketed(lambda x: mlp(x), [features])          # the dense layers only

Rules:

* Only what `fn` builds is compiled. Keep the dynamic-embedding lookups (stateful table ops, which XLA cannot
  compile) outside: call it on their outputs.
* `fn` must treat examples independently (dense layers, activations, per-example losses): the padded examples are
  zeros, and their outputs are cut off before anything else sees them, so they get no gradient. An op that mixes
  examples (batch normalization over the batch, a mean over the batch inside `fn`) would see the padding.
* Buckets: `buckets=` (sorted batch sizes); default powers of two from 16 to 65536; a batch larger than the last
  bucket is padded to a multiple of it. `TF_EXT_XLA_BUCKETS="64,256,1024"` overrides the default;
  `TF_EXT_XLA=0` turns the compilation off (fn runs as plain TF ops, no padding) without a code change.
* Compile counts: each call registers its bucket tensor; `CompileStatsHook` fetches it every step, logs each bucket
  seen for the first time (a compilation, with the step time it cost), and writes the summaries
  `tf_ext/xla/<name>/compiles` and `tf_ext/xla/<name>/compile_seconds` (the extra time of those steps over the
  median step).

TF compiles a cluster lazily, at the second run of a new shape (the first runs uncompiled); set
`TF_XLA_FLAGS=--tf_xla_enable_lazy_compilation=false` to compile at the first.
"""

import collections
import os
import time

import numpy as np
import tensorflow as tf

__all__ = ["BUCKETS_COLLECTION", "CompileStatsHook", "compile_bucketed", "default_buckets", "enabled"]

BUCKETS_COLLECTION = "tf_ext_xla_buckets"
_DEFAULT_BUCKETS = tuple(2**i for i in range(4, 17))


def enabled():
    """False when the environment turns compilation off (TF_EXT_XLA=0)."""
    return os.environ.get("TF_EXT_XLA", "1").strip().lower() not in ("0", "false", "off", "no")


def default_buckets():
    """The bucket sizes without `buckets=`: TF_EXT_XLA_BUCKETS (comma-separated) or powers of two 16..65536.

    Raises:
      ValueError: TF_EXT_XLA_BUCKETS is not a list of positive ints.
    """
    text = os.environ.get("TF_EXT_XLA_BUCKETS")
    if not text:
        return _DEFAULT_BUCKETS
    try:
        return _check_buckets([int(b) for b in text.split(",") if b.strip()], "TF_EXT_XLA_BUCKETS")
    except ValueError as e:
        raise ValueError("%s (TF_EXT_XLA_BUCKETS=%r)" % (e, text)) from None


def _check_buckets(buckets, what):
    buckets = tuple(buckets)
    if not buckets or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in buckets):
        raise ValueError("%s must be a non-empty list of positive ints, got %r" % (what, buckets))
    if list(buckets) != sorted(set(buckets)):
        raise ValueError("%s must be strictly increasing, got %r" % (what, buckets))
    return tuple(int(b) for b in buckets)


def _bucket_size(n, buckets):
    """int32 scalar: the smallest bucket >= n, or n rounded up to a multiple of the last bucket."""
    table = tf.constant(buckets, tf.int32)
    last = buckets[-1]
    index = tf.searchsorted(table, tf.reshape(n, [1]), side="left")[0]
    return tf.where(n > last, (n + last - 1) // last * last, tf.gather(table, tf.minimum(index, len(buckets) - 1)))


def compile_bucketed(fn, inputs, buckets=None, name="dense"):
    """Builds `fn(*inputs)` compiled by XLA on inputs whose batch dimension is padded to a bucket size.

    Args:
      fn: callable(*tensors) -> a tensor or a (nested) structure of tensors, each with the batch as its first
        dimension; builds the part to compile (dense layers; no table ops).
      inputs: list of tensors with the same first (batch) dimension.
      buckets: increasing batch sizes (default: `default_buckets()`).
      name: the cluster's name in logs and summaries (a suffix makes repeated names unique).

    Returns:
      `fn`'s outputs for the real examples (batch dimension = the inputs' own).

    Raises:
      ValueError: no inputs, bad buckets, or an output without the batch dimension.
    """
    inputs = [tf.convert_to_tensor(x) for x in inputs]
    if not inputs:
        raise ValueError("compile_bucketed(%r) needs at least one input tensor" % name)
    buckets = default_buckets() if buckets is None else _check_buckets(buckets, "buckets")
    if not enabled():
        return fn(*inputs)
    with tf.name_scope("xla_%s" % name):
        n = tf.shape(inputs[0], out_type=tf.int32)[0]
        size = _bucket_size(n, buckets)
        padded = []
        for x in inputs:
            pad = tf.concat([[[0, size - n]], tf.zeros([tf.rank(x) - 1, 2], tf.int32)], 0)
            p = tf.pad(x, pad)
            p.set_shape(tf.TensorShape([None]).concatenate(x.shape[1:]))  # keep the static feature dims
            padded.append(p)
    tf.compat.v1.add_to_collection(BUCKETS_COLLECTION, (name, tf.identity(size, name="bucket")))
    with tf.xla.experimental.jit_scope():
        outputs = fn(*padded)

    def cut(t):
        if t.shape.rank == 0:
            raise ValueError(
                "compile_bucketed(%r): every output of fn needs the batch as its first dimension; got a scalar %s "
                "(reduce over the batch outside fn)" % (name, t.name)
            )
        return t[:n]

    return tf.nest.map_structure(cut, outputs)


class CompileStatsHook(tf.compat.v1.train.SessionRunHook):
    """Counts the compilations of `compile_bucketed` clusters (new buckets) and their cost, logs and summarises them.

    Args:
      output_dir: where the summaries go (None: logs only).
      every_n_steps: summary period.
    """

    def __init__(self, output_dir=None, every_n_steps=100):
        self._output_dir = output_dir
        self._every = int(every_n_steps)
        self.compiles = collections.Counter()  # cluster -> buckets seen
        self.compile_seconds = collections.Counter()
        self._seen = collections.defaultdict(set)
        self._times = []
        self._pending = {}  # (cluster, bucket) -> runs left in which its compilation may happen

    def begin(self):
        self._buckets = {}
        for name, tensor in tf.compat.v1.get_collection(BUCKETS_COLLECTION):
            unique, i = name, 1
            while unique in self._buckets:
                i += 1
                unique = "%s_%d" % (name, i)
            self._buckets[unique] = tensor
        self._writer = tf.compat.v1.summary.FileWriterCache.get(self._output_dir) if self._output_dir else None
        self._step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        self._t0 = time.time()
        fetches = dict(self._buckets)
        if self._step is not None:
            fetches["__step"] = self._step
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        dt = time.time() - self._t0
        results = run_values.results
        self._times.append(dt)
        median = float(np.median(self._times[-50:]))
        for cluster in self._buckets:
            bucket = int(results[cluster])
            key = (cluster, bucket)
            if bucket not in self._seen[cluster]:
                self._seen[cluster].add(bucket)
                self.compiles[cluster] += 1
                self._pending[key] = 2  # TF compiles at the first or (lazily) the second run of a shape
                tf.compat.v1.logging.info(
                    "tf_ext.xla: cluster %s: batch bucket %d is new (compilation %d)",
                    cluster,
                    bucket,
                    self.compiles[cluster],
                )
            if self._pending.get(key):
                self._pending[key] -= 1
                self.compile_seconds[cluster] += max(0.0, dt - median)
        step = results.get("__step", len(self._times))
        if self._writer is not None and len(self._times) % self._every == 0:
            values = []
            for cluster in self._buckets:
                values.append(
                    tf.compat.v1.Summary.Value(
                        tag="tf_ext/xla/%s/compiles" % cluster, simple_value=self.compiles[cluster]
                    )
                )
                values.append(
                    tf.compat.v1.Summary.Value(
                        tag="tf_ext/xla/%s/compile_seconds" % cluster, simple_value=self.compile_seconds[cluster]
                    )
                )
            self._writer.add_summary(tf.compat.v1.Summary(value=values), step)
