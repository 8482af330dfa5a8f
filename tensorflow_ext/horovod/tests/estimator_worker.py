"""One rank of the Estimator tests (run by horovodrun from test_estimator.py), or a single-process reference.

A small CTR-like model: "user" (two ids per example; model- or data-parallel), "item" (one id, data-parallel,
a plain tf_ext embedding) and a dense layer, trained by tensorflow_ext.horovod.DistributedOptimizer through an
Estimator with the helpers of tensorflow_ext.horovod.estimator.

Element i of the input is a deterministic batch (stateless random ids seeded by i), so a restarted job reads the
same batches as an uninterrupted one: rank r reads elements step * N + r.

Commands (flags after the command):
  train    train to --max-steps (or until the input ends with --elements), dump this rank's tables to --out;
           with --export-dir rank 0 then exports a SavedModel
  restore  build the training graph, restore the latest checkpoint, dump this rank's tables (no training)
  evaluate rank 0 evaluates the latest checkpoint inside single_process() (or the single process: plainly)
Without Horovod (--single): plain tf_ext embeddings and optimizer, one process (the reference restore).
"""

import argparse
import os
import re
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext as tf_ext  # noqa: E402

V, PER_RANK = 40, 4
OPTIMIZERS = {
    "Adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.2, initial_accumulator_value=0.3),
    "Adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["train", "restore", "evaluate"])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", default=None)
    p.add_argument("--single", action="store_true")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--save-steps", type=int, default=2)
    p.add_argument("--save-secs", type=int, default=None)
    p.add_argument("--elements", type=int, default=None, help="finite input of this many elements in all")
    p.add_argument("--dim", type=int, default=4)
    p.add_argument("--parallelism", default="model")
    p.add_argument("--optimizer", default="Adagrad")
    p.add_argument("--num-shards", type=int, default=2)
    p.add_argument("--value-dtype", default="float32", help="storage dtype of both embeddings")
    p.add_argument(
        "--rank1",
        default="",
        help="on rank 1 only: dim=N, parallelism=P, optimizer=O and/or elements=N (comma-separated)",
    )
    p.add_argument("--die-at-step", type=int, default=None, help="rank 1 exits with status 3 after this step")
    p.add_argument("--export-dir", default=None)
    return p.parse_args()


ARGS = parse()
if ARGS.single:
    hvd = None
    RANK, SIZE = 0, 1
else:
    import tensorflow_ext.horovod as hvd  # noqa: E402

    hvd.init()
    RANK, SIZE = hvd.rank(), hvd.size()
if RANK == 1 and ARGS.rank1:
    for setting in ARGS.rank1.split(","):
        key, value = setting.split("=")
        setattr(ARGS, key, int(value) if key in ("dim", "elements") else value)


def batch(i):
    """Element i: features {"user": [B, 2], "item": [B, 1]} int64 and labels [B, 1]."""
    i = tf.cast(i, tf.int64)
    seed = tf.stack([i, tf.constant(17, tf.int64)])
    user = tf.random.stateless_uniform([PER_RANK, 2], seed=seed, minval=0, maxval=V, dtype=tf.int64) * 7919 - 3
    item = tf.random.stateless_uniform([PER_RANK, 1], seed=seed + 1, minval=0, maxval=V // 2, dtype=tf.int64)
    labels = tf.random.stateless_normal([PER_RANK, 1], seed=seed + 2)
    return {"user": user, "item": item}, labels


def latest_step(model_dir):
    ckpt = tf.train.latest_checkpoint(model_dir)
    return int(re.search(r"-(\d+)$", ckpt).group(1)) if ckpt else 0


def input_fn():
    if ARGS.elements is not None:
        return tf.data.Dataset.range(ARGS.elements).map(batch)
    start = latest_step(ARGS.model_dir) * SIZE  # a restarted job goes on with the next global batch
    return tf.data.Dataset.range(start, start + 100000).map(batch)


def embeddings():
    init = tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=7)
    kwargs = dict(initializer=init, value_dtype=ARGS.value_dtype)
    if hvd is None:
        user = tf_ext.get_dynamic_embedding("user", ARGS.dim, num_shards=ARGS.num_shards, **kwargs)
    else:
        user = hvd.get_dynamic_embedding(
            "user", ARGS.dim, parallelism=ARGS.parallelism, num_shards=ARGS.num_shards, **kwargs
        )
    item = tf_ext.get_dynamic_embedding("item", ARGS.dim, **kwargs)
    return user, item


def model_fn(features, labels, mode):
    user, item = embeddings()
    u = tf_ext.embedding_lookup(user, features["user"])  # [B, 2, dim]
    x = tf.concat([tf.reduce_sum(u, axis=1), tf_ext.embedding_lookup(item, features["item"])[:, 0, :]], axis=1)
    w = tf.compat.v1.get_variable("w", [2 * ARGS.dim, 1], initializer=tf.compat.v1.glorot_uniform_initializer())
    logits = tf.matmul(x, w)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits, "user_rows": u})
    loss = tf.reduce_mean(tf.square(logits - labels))
    opt = OPTIMIZERS[ARGS.optimizer]()
    if hvd is not None:
        opt = hvd.DistributedOptimizer(opt)
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def dump_fetches():
    """Tensors of this rank's tables (keys, values, slots), the dense weight and the global step."""
    out = {}
    for emb in tf_ext.embedding.get_dynamic_embeddings():
        ex = emb.export(with_slots=True)
        out[emb.name + "_keys"], out[emb.name + "_values"], out[emb.name + "_slots"] = ex.keys, ex.values, ex.slots
    out["w"] = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, "w")[0]
    for v in tf.compat.v1.get_collection("tf_ext_topk_residuals"):  # Top-K on (TF_EXT_HVD_TOPK_RATIO)
        out["residual:" + v.op.name.replace("/", "|")] = v
    out["global_step"] = tf.compat.v1.train.get_global_step()
    return out


class DumpHook(tf.compat.v1.train.SessionRunHook):

    def begin(self):
        self._fetches = dump_fetches()

    def after_create_session(self, session, coord):
        # After training_hooks' (restore, agreement, broadcast): what this rank starts from.
        if ARGS.out:
            np.savez(os.path.join(ARGS.out, "rank%d_start.npz" % RANK), **session.run(self._fetches))

    def end(self, session):
        if ARGS.out:
            np.savez(os.path.join(ARGS.out, "rank%d.npz" % RANK), **session.run(self._fetches))


class DieHook(tf.compat.v1.train.SessionRunHook):

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.train.get_global_step())

    def after_run(self, run_context, run_values):
        if RANK == 1 and run_values.results + 1 >= ARGS.die_at_step:
            print("RANK 1 EXITS AT STEP %d" % (run_values.results + 1), flush=True)
            os._exit(3)  # pylint: disable=protected-access


def train():
    # A graph seed: two fresh jobs start from the same dense weights (the restart test compares runs).
    if ARGS.save_secs:
        config = hvd.run_config(
            ARGS.model_dir, save_checkpoints_steps=None, save_checkpoints_secs=ARGS.save_secs, tf_random_seed=1234
        )
    else:
        config = hvd.run_config(ARGS.model_dir, save_checkpoints_steps=ARGS.save_steps, tf_random_seed=1234)
    est = tf.compat.v1.estimator.Estimator(model_fn, config=config)
    hooks = hvd.training_hooks(config) + [DumpHook()]
    if ARGS.die_at_step:
        hooks.append(DieHook())
    est.train(hvd.shard_input_fn(input_fn), hooks=hooks, max_steps=ARGS.max_steps)
    print("RANK %d TRAINED step=%d" % (RANK, est.get_variable_value("global_step")), flush=True)
    if ARGS.export_dir:
        path = hvd.export_saved_model(est, ARGS.export_dir, serving_input_receiver_fn)
        print("RANK %d EXPORTED %s" % (RANK, path.decode() if path else None), flush=True)


def serving_input_receiver_fn():
    features = {
        "user": tf.compat.v1.placeholder(tf.int64, [None, 2], name="user"),
        "item": tf.compat.v1.placeholder(tf.int64, [None, 1], name="item"),
    }
    return tf.estimator.export.ServingInputReceiver(features, features)


def evaluate():
    """Rank 0 (or the single process) evaluates the latest checkpoint on the first 4 elements."""
    if hvd is not None and RANK != 0:
        return
    est = tf.compat.v1.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(ARGS.model_dir))
    eval_input_fn = lambda: tf.data.Dataset.range(4).map(batch)  # noqa: E731
    if hvd is None:
        metrics = est.evaluate(eval_input_fn)
    else:
        with hvd.single_process():
            metrics = est.evaluate(eval_input_fn)
    print("EVAL step=%d loss=%.9g" % (metrics["global_step"], metrics["loss"]), flush=True)


def restore():
    with tf.Graph().as_default():
        features = {
            "user": tf.compat.v1.placeholder(tf.int64, [None, 2]),
            "item": tf.compat.v1.placeholder(tf.int64, [None, 1]),
        }
        model_fn(features, tf.compat.v1.placeholder(tf.float32, [None, 1]), tf.estimator.ModeKeys.TRAIN)
        saver = tf.compat.v1.train.Saver()
        fetches = dump_fetches()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.restore(session, tf.train.latest_checkpoint(ARGS.model_dir))
            np.savez(os.path.join(ARGS.out, "rank%d.npz" % RANK), **session.run(fetches))
    print("RANK %d RESTORED" % RANK, flush=True)


if __name__ == "__main__":
    {"train": train, "restore": restore, "evaluate": evaluate}[ARGS.command]()
    sys.stdout.flush()
