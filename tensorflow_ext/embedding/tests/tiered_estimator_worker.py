"""The trainer of test_tiered_estimator.py, run as a fresh process: tf.estimator.train_and_evaluate of a small model
with a dynamic embedding, in memory or tiered (`tf_ext.TieredStorage`).

Usage: python tiered_estimator_worker.py '<json config>'. The model: a 2-shard dynamic embedding "ids" (dim 8,
Adagrad, a seeded initializer) averaged over 4 ids per example under a dense logistic layer; the graph-level seed is
fixed, so two runs of one configuration, tiered or not, build the same initial model. train_and_evaluate runs
locally: a checkpoint every `every` steps, each followed (while training goes on in its own session) by an
evaluation and a SavedModel export, each in a graph and session of its own that restores the checkpoint. A tiered
model's evaluation and export thus open second tables of the embedding in this process, beside the training ones.

Config (JSON object):
  model_dir: the Estimator's directory; tier: null or the keyword arguments of tf_ext.TieredStorage;
  steps, every: training steps and the checkpoint (and evaluation) interval; result: the JSON file written at the end:
    "evals": {global step: {metric: value}} of every evaluation (read from the evaluation's summaries);
      a tiered model adds the metrics tier_disk_keys and tier_cold_reads: its evaluation table's keys on disk at
      the end and the keys it read back from disk;
    "eval_dirs": [[global step, entries of the store root's "ids" directory at the end of that evaluation]];
    "exports": the number of SavedModels exported;
    "final_dirs": the entries of the "ids" directory after everything (null in memory);
    "predictions": est.predict's probabilities of fixed ids after training; "served": the same ids through the
    last SavedModel, loaded in a new graph and session of this process.
"""

import glob
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext as tf_ext  # noqa: E402

BATCH = 64
IDS_PER_EXAMPLE = 4
VOCAB = 6000


def _data(seed, examples):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, VOCAB, size=[examples, IDS_PER_EXAMPLE]).astype(np.int64) * 1000003 + 17
    labels = ((ids[:, 0] // 1000003) % 3 == 0).astype(np.float32)[:, None]
    return ids, labels


def _input_fn(seed, examples, repeat):
    def fn():
        ids, labels = _data(seed, examples)
        ds = tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids}, labels))
        return (ds.repeat() if repeat else ds).batch(BATCH)

    return fn


def _model_fn(tier):
    def model_fn(features, labels, mode):
        kwargs = {"storage": tf_ext.TieredStorage(**tier)} if tier else {}
        emb = tf_ext.get_dynamic_embedding(
            "ids", 8, num_shards=2, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=1), **kwargs
        )
        x = tf.reduce_mean(tf_ext.embedding_lookup(emb, features["ids"]), axis=1)
        logits = tf.compat.v1.layers.dense(x, 1, name="out")
        prob = tf.sigmoid(logits)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"prob": prob})
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
        if mode == tf.estimator.ModeKeys.EVAL:
            metrics = {
                "accuracy": tf.compat.v1.metrics.accuracy(labels, prob > 0.5),
                "auc": tf.compat.v1.metrics.auc(labels, prob),
                "mean_prob": tf.compat.v1.metrics.mean(prob),
            }
            if tier:
                stats = emb.tier_stats()  # the evaluation's own tables, read after its last batch
                for name in ("disk_keys", "cold_reads"):
                    metrics["tier_" + name] = (tf.cast(stats[name], tf.float32), tf.no_op())
            return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
        train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(
            loss, global_step=tf.compat.v1.train.get_global_step()
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    return model_fn


def _serving_input_fn():
    ids = tf.compat.v1.placeholder(tf.int64, [None, IDS_PER_EXAMPLE], name="ids")
    return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})


class _DirHook(tf.compat.v1.train.SessionRunHook):
    """Records the entries of a directory at the end of each evaluation, with its global step."""

    def __init__(self, directory):
        self.directory = directory
        self.seen = []

    def begin(self):
        self._gs = tf.compat.v1.train.get_global_step()

    def end(self, session):
        self.seen.append([int(session.run(self._gs)), sorted(os.listdir(self.directory))])


def _eval_summaries(model_dir):
    evals = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):  # not the text summary of the checkpoint's path
                    evals.setdefault(str(event.step), {})[value.tag] = float(value.simple_value)
    return evals


def main(cfg):
    tier = cfg["tier"]
    config = tf.estimator.RunConfig(
        model_dir=cfg["model_dir"],
        tf_random_seed=7,
        save_checkpoints_steps=cfg["every"],
        save_summary_steps=None,
        log_step_count_steps=None,
        keep_checkpoint_max=None,
        session_config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2),
    )
    est = tf.estimator.Estimator(_model_fn(tier), config=config)
    ids_dir = os.path.join(tier["path"], "ids") if tier else None
    hook = _DirHook(ids_dir) if tier else None
    tf.estimator.train_and_evaluate(
        est,
        tf.estimator.TrainSpec(_input_fn(0, BATCH * 8, repeat=True), max_steps=cfg["steps"]),
        tf.estimator.EvalSpec(
            _input_fn(0, BATCH * 4, repeat=False),  # trained examples: the rows read are trained ones
            steps=None,
            start_delay_secs=0,
            throttle_secs=0,
            hooks=[hook] if hook else None,
            exporters=tf.estimator.LatestExporter("latest", _serving_input_fn, exports_to_keep=None),
        ),
    )
    test_ids, _ = _data(2, 32)
    predictions = [
        p["prob"].tolist()
        for p in est.predict(
            lambda: tf.compat.v1.data.Dataset.from_tensor_slices({"ids": test_ids}).batch(8),
            yield_single_examples=True,
        )
    ]
    exports = sorted(glob.glob(os.path.join(cfg["model_dir"], "export", "latest", "*")))
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], exports[-1])
            signature = meta.signature_def["serving_default"]
            prob, ids = signature.outputs["prob"].name, signature.inputs["ids"].name
            served = sess.run(prob, {ids: test_ids}).tolist()
    result = {
        "evals": _eval_summaries(cfg["model_dir"]),
        "eval_dirs": hook.seen if hook else [],
        "exports": len(exports),
        "final_dirs": sorted(os.listdir(ids_dir)) if tier else None,
        "predictions": predictions,
        "served": served,
    }
    with open(cfg["result"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
