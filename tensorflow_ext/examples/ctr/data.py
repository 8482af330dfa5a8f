"""What the CTR example trains and evaluates on, and what its serving export takes.

Two sources, one feature layout (:mod:`tensorflow_ext.examples.synthetic`: ``C1..C26`` categorical ids and
``I1..I13`` log counts, label 0/1):

* the synthetic stream (default): int64 ids, -1 for a missing value. A run continues the stream where the
  checkpoint it starts from stopped, so every run sees new data; evaluation batches come from the stream's
  held-out split.
* Criteo TSV files (``--data``): hex-string ids ("" missing) that are the tables' keys as they are. Without
  ``--eval_data``, a tenth of the lines (by hash) is held out of training for evaluation.
"""

import tensorflow as tf

from tensorflow_ext.examples import synthetic

# The features of a training batch that hold the next batch's ids (`with_next_ids`): "next/C1", ...
NEXT_PREFIX = "next/"


def training_source(args, num_ranks):
    """The run's data source.

    Args:
      args: parsed flags.
      num_ranks: processes training together (1 unless --distributed).

    Returns:
      ``(stream, string_ids, source)``: the synthetic stream (None with --data), whether the ids are strings
      (TSV) or int64 (synthetic), and the source's name for the output ("synthetic" or the files).
    """
    if args.data:
        return None, True, ",".join(args.train_files)
    # Day by day (and in a live-serving day), the stream drifts by --drift_per_day over the batches of one day (all
    # ranks together).
    drift = args.drift_per_day / float(args.steps * num_ranks) if (args.days or args.serve_live) and args.steps else 0.0
    stream = synthetic.CriteoLikeStream(seed=args.seed, max_ids=args.max_ids, zipf_a=args.zipf, drift=drift)
    return stream, False, "synthetic"


def with_next_ids(dataset):
    """`dataset` of ``(features, labels)`` batches, each batch's features also holding the next batch's categorical
    ids as ``next/<key>`` (the last batch: its own ids), so that a training step can prefetch the rows its successor
    reads from a tiered table's disk. Each batch is still made once (a window of two holds it). Only the last batch
    may be shorter than the others (as `Dataset.batch` makes them): a pair is padded to its longer batch."""

    def pairs(features, labels):
        # Padded: the last batch of a file may be shorter than the one before it (its ids padded with -1 or "",
        # missing values, which only the prefetch reads).
        return tf.data.Dataset.zip((features, labels)).padded_batch(2, padding_values=_padding_values(dataset))

    def split(features, labels):
        out = {k: v[0] for k, v in features.items()}
        for key in synthetic.CATEGORICAL_KEYS:
            out[NEXT_PREFIX + key] = features[key][-1]
        return out, labels[0]

    return dataset.window(2, shift=1).flat_map(pairs).map(split)


def _padding_values(dataset):
    """The padding of `with_next_ids`' pairs: -1 for int ids, "" for string ids (both missing), 0 for the rest."""

    def pad(spec):
        if spec.dtype == tf.string:
            return tf.constant("", tf.string)
        if spec.dtype.is_integer:
            return tf.constant(-1, spec.dtype)
        return tf.constant(0, spec.dtype)

    return tf.nest.map_structure(pad, dataset.element_spec)


def prefetches(args):
    """Whether the training batches carry the next batch's ids: tiered tables, prefetch not turned off, one process
    (Horovod ranks read interleaved batches, and a model-parallel table's keys are read on their owners)."""
    return bool(args.memory_budget) and not args.no_prefetch and not args.distributed


def input_fns(args, stream, start_batches, num_ranks):
    """The Estimator's input functions for this run.

    Args:
      args: parsed flags.
      stream: the synthetic stream, or None (--data).
      start_batches: the stream's first batch for this run (the batches consumed by the runs before).
      num_ranks: processes training together.

    Returns:
      ``(train_input_fn, eval_input_fn, eval_clock)``; ``eval_clock`` is the stream's clock the evaluation data
      is drawn at (day by day: the next day's, i.e. after this run's training), None otherwise.
    """
    if stream is not None:

        def train_input_fn():
            # New data on every run: continue the stream where the checkpoint stopped. Distributed, rank r
            # reads batches r, r + N, ... of it (the Horovod input sharding).
            dataset = stream.dataset(
                args.batch_size,
                args.steps * num_ranks if args.steps is not None else None,
                start=start_batches,
                split="train",
            )
            return with_next_ids(dataset) if prefetches(args) else dataset

        # Day by day (and live), a model is evaluated on the next day's data (the stream's clock after this run's
        # training).
        eval_clock = start_batches + args.steps * num_ranks if args.days or args.serve_live else None

        def eval_input_fn():
            return stream.dataset(args.batch_size, args.eval_steps, start=0, split="eval", clock=eval_clock)

        return train_input_fn, eval_input_fn, eval_clock

    holdout = None if args.eval_files else "train"

    def tsv_train_input_fn():
        dataset = tsv_dataset(args.train_files, args.batch_size, args.epochs, holdout)
        return with_next_ids(dataset) if prefetches(args) else dataset

    def tsv_eval_input_fn():
        if args.eval_files:
            return tsv_dataset(args.eval_files, args.batch_size, 1, None)
        return tsv_dataset(args.train_files, args.batch_size, 1, "eval")

    return tsv_train_input_fn, tsv_eval_input_fn, None


def tsv_dataset(files, batch_size, epochs, holdout):
    """Criteo TSV lines -> batches of (features, labels).

    Args:
      files: list of paths.
      batch_size: examples per batch.
      epochs: passes over the files.
      holdout: None (all lines), "train" (lines whose hash mod 10 != 0) or
        "eval" (the other tenth).

    Returns:
      A ``tf.data.Dataset``.
    """
    ds = tf.data.TextLineDataset(files)
    if holdout is not None:

        def keep(line):
            bucket = tf.strings.to_hash_bucket_fast(line, 10)
            return tf.equal(bucket, 0) if holdout == "eval" else tf.not_equal(bucket, 0)

        ds = ds.filter(keep)
    if epochs > 1:
        ds = ds.repeat(epochs)
    defaults = [[0.0]] + [[0.0]] * synthetic.NUM_DENSE + [[""]] * synthetic.NUM_CATEGORICAL

    def parse(lines):
        cols = tf.io.decode_csv(lines, record_defaults=defaults, field_delim="\t", use_quote_delim=False)
        features = {}
        for j, key in enumerate(synthetic.DENSE_KEYS):
            features[key] = synthetic.log_counts(cols[1 + j])
        for f, key in enumerate(synthetic.CATEGORICAL_KEYS):
            features[key] = cols[1 + synthetic.NUM_DENSE + f]
        return features, cols[0]

    return ds.batch(batch_size).map(parse, num_parallel_calls=2).prefetch(2)


def serving_input_fn(string_ids):
    """The export's input: one raw value per field and example (ids, or hex strings with --data; log counts)."""
    id_dtype = tf.string if string_ids else tf.int64

    def serving_input_receiver_fn():
        features = {k: tf.compat.v1.placeholder(id_dtype, [None], name=k) for k in synthetic.CATEGORICAL_KEYS}
        for k in synthetic.DENSE_KEYS:
            features[k] = tf.compat.v1.placeholder(tf.float32, [None], name=k)
        return tf.estimator.export.ServingInputReceiver(features, features)

    return serving_input_receiver_fn
