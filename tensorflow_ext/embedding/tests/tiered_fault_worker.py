"""The trainer of the tiered-storage fault tests (test_tiered_faults.py), run as a fresh process.

Usage: python tiered_fault_worker.py '<json config>'. It builds one model: a dynamic embedding "emb" (Adagrad, a
seeded random initializer, optionally `tf_ext.TieredStorage`) under a dense logistic layer, and trains it on a
deterministic stream of ids in which every step brings `new` keys never seen before (so a small memory tier keeps
demoting) and `old` keys drawn from those seen so far (so rows come back from disk). A step's ids depend on the step
number only, so a run restarted from a checkpoint at step k sees what an uninterrupted run sees after step k.

Config (JSON object):
  dim, num_shards, new, old: the model and the stream (defaults 8, 1, 96, 32).
  tier: null (an in-memory embedding) or the keyword arguments of tf_ext.TieredStorage; value_dtype: the
    embedding's (a dtype name; default float32).
  ckpt_dir: where checkpoints go ("model-<step>"); save_every: save after every that many steps (0: never);
    save_at: and after these steps.
  restore: true to restore the latest checkpoint of ckpt_dir (or the checkpoint restore_from) before training.
  steps: train until the global step reaches it.
  dump_at: global steps after which the embedding (keys, values, slots, versions, frequencies) and the dense weight
    are written to <out_dir>/state_<step>.npz, rows sorted by key (the restored step included when it is listed);
    dump_restored: true writes what was restored to <out_dir>/state_restored.npz.
  ready_after: after this global step (and its checkpoint), write b"READY <step>\\n" to the inherited file
    descriptor ready_fd, then go on training (the parent kills the process then).
  hold: after the first step, write b"READY <pid>\\n" to ready_fd, then wait for EOF on stdin before closing (a
    process holding the store open).
  save_after_error: when a training step fails, record its error and the ids of its batch (error_ids), save the
    model to <ckpt_dir>/after_error (not made the latest checkpoint) and stop.
  ballast: a file that fills the store's disk: at the first failed training step, record its error (first_error)
    and ids (first_error_ids), delete the file and run the step again (space is back).
  retry_new: when a training step fails, record its error, train one batch of retry_new fresh keys instead and
    record the embedding's size (size_after_retry), then stop.
  twin: after training, build the same model in a second graph and session of this process (a second table on the
    same store path) and train twin_steps steps (default 1) from scratch there: record what it raised (twin_error),
    its tier stats (twin_stats) and the entries of the store root's "emb" directory while that session is open
    (twin_dirs_open) and once it is closed and deleted (twin_dirs_closed), and write its state after the last step
    to <out_dir>/twin_state_<twin_steps>.npz; then train one more step in the first (dumped when dump_at lists it).
  export_rows: build the model inside tf_ext.serving.export_rows(<this dtype>); train: false builds a serving graph
    (lookups without an optimizer; a step is one lookup).
  result: a JSON file written at the end: {"pid", "step", "saved": [steps], "stats": tier stats of each shard,
    "error": null or {"class", "message", "stage", "step"}}. An expected failure (a tf.errors.OpError or a ValueError
    while building or running) is recorded there and the process exits 0; anything else is a crash (exit != 0).
"""

import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, _ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext as tf_ext  # noqa: E402

KEY_STRIDE = 1000003  # keys spread over the hash space, as real ids are


def batch_ids(step, new, old):
    """The ids of global step `step` (a function of the step alone): `new` fresh keys and `old` keys seen before,
    skewed towards the earliest ones (a hot set), shuffled."""
    rng = np.random.RandomState(1000 + step)
    fresh = np.arange(step * new, (step + 1) * new, dtype=np.int64)
    if step == 0:
        seen = fresh[: min(old, new)]
    else:
        seen = (rng.random_sample(old) ** 3 * (step * new)).astype(np.int64)
    ids = np.concatenate([fresh, seen]) * KEY_STRIDE + 17
    rng.shuffle(ids)
    return ids


def build(cfg):
    dim, num_shards = cfg.get("dim", 8), cfg.get("num_shards", 1)
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    kwargs = {}
    if cfg.get("tier") is not None:
        kwargs["storage"] = tf_ext.TieredStorage(**cfg["tier"])
    if cfg.get("value_dtype"):
        kwargs["value_dtype"] = tf.as_dtype(cfg["value_dtype"])
    emb = tf_ext.get_dynamic_embedding(
        "emb",
        dim,
        num_shards=num_shards,
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=3),
        **kwargs,
    )
    rows = tf_ext.embedding_lookup(emb, ids, is_training=cfg.get("train", True))
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-1.0, 1.0, dim, dtype=np.float32)[:, None]))
    logits = tf.squeeze(tf.matmul(rows, w), 1)
    labels = tf.cast(tf.equal(ids % 7, 3), tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if cfg.get("train", True):
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    else:  # a serving graph: a step is one lookup
        train = tf.group(rows, tf.compat.v1.assign_add(gs, 1))
    return dict(gs=gs, ids=ids, emb=emb, w=w, train=train, exp=emb.export(with_slots=cfg.get("train", True)))


def dump(sess, m, path):
    e, w, gs = sess.run([m["exp"], m["w"], m["gs"]])
    order = np.argsort(e.keys, kind="stable")
    np.savez(
        path,
        keys=e.keys[order],
        values=e.values[order],
        slots=e.slots[order],
        versions=e.versions[order],
        freqs=e.frequencies[order],
        w=w,
        gs=np.int64(gs),
    )


def _error(e, stage, step):
    message = e.message if isinstance(e, tf.errors.OpError) else str(e)
    return {"class": type(e).__name__, "message": message, "stage": stage, "step": step}


def _session():
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
    return tf.compat.v1.Session(config=config)


def _twin_session(cfg, emb_dir, result):
    """The twin's graph and session (both gone, and so its tables, when this returns)."""
    steps = cfg.get("twin_steps", 1)
    with tf.Graph().as_default():
        m = build(cfg)
        stats = m["emb"].tier_stats()
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                sess.run(m["train"], {m["ids"]: batch_ids(step, cfg.get("new", 96), cfg.get("old", 32))})
            dump(sess, m, os.path.join(cfg["out_dir"], "twin_state_%d.npz" % steps))
            result["twin_stats"] = {k: np.asarray(v).tolist() for k, v in sess.run(stats).items()}
            result["twin_dirs_open"] = sorted(os.listdir(emb_dir))


def twin(cfg, result):
    """Builds the same model in a second graph and session of this process (a second table on the same store
    path), trains it and deletes the session; records twin_error, twin_stats, twin_dirs_open and twin_dirs_closed."""
    emb_dir = os.path.join(cfg["tier"]["path"], "emb")
    result["twin_error"] = None
    try:
        _twin_session(cfg, emb_dir, result)
    except (tf.errors.OpError, ValueError) as e:
        result["twin_error"] = _error(e, "twin", 0)
    result["twin_dirs_closed"] = sorted(os.listdir(emb_dir))


def main(cfg):
    result = {"pid": os.getpid(), "step": None, "saved": [], "stats": None, "error": None}
    stage, step = "build", None
    ready = os.fdopen(cfg["ready_fd"], "wb", buffering=0) if cfg.get("ready_fd") is not None else None
    new, old = cfg.get("new", 96), cfg.get("old", 32)
    dump_at = set(cfg.get("dump_at", []))
    save_at = set(cfg.get("save_at", []))

    def run_step(sess, m, step):
        sess.run(m["train"], {m["ids"]: batch_ids(step, new, old)})

    try:
        if cfg.get("export_rows"):
            with tf_ext.serving.export_rows(tf.as_dtype(cfg["export_rows"])):
                m = build(cfg)
        else:
            m = build(cfg)
        stats = m["emb"].tier_stats() if cfg.get("tier") else None  # summed over the shards
        saver = tf.compat.v1.train.Saver(max_to_keep=100)
        with _session() as sess:
            stage = "init"
            sess.run(tf.compat.v1.global_variables_initializer())
            if cfg.get("restore"):
                stage = "restore"
                saver.restore(sess, cfg.get("restore_from") or tf.train.latest_checkpoint(cfg["ckpt_dir"]))
            step = int(sess.run(m["gs"]))
            if cfg.get("restore") and cfg.get("dump_restored"):
                stage = "dump"
                dump(sess, m, os.path.join(cfg["out_dir"], "state_restored.npz"))
            if step in dump_at:
                stage = "dump"
                dump(sess, m, os.path.join(cfg["out_dir"], "state_%d.npz" % step))
            while step < cfg.get("steps", 0):
                stage = "train"
                try:
                    run_step(sess, m, step)
                except tf.errors.OpError as e:
                    if cfg.get("ballast") and "first_error" not in result:
                        # Space comes back: the step is run again and training goes on.
                        result["first_error"] = _error(e, stage, step)
                        result["first_error_ids"] = batch_ids(step, new, old).tolist()
                        os.remove(cfg["ballast"])
                        continue
                    if cfg.get("save_after_error"):
                        # What the table holds after the failed step, saved (not as the latest checkpoint).
                        result["error"] = _error(e, stage, step)
                        result["error_ids"] = batch_ids(step, new, old).tolist()
                        stage = "save_after_error"
                        saver.save(sess, os.path.join(cfg["ckpt_dir"], "after_error"), write_state=False)
                        break
                    if not cfg.get("retry_new"):
                        raise
                    # The failed step changed nothing: a batch of retry_new fresh keys trains, and the table then
                    # holds those keys alone (the embedding is empty before step 0).
                    result["error"] = _error(e, stage, step)
                    stage = "retry"
                    fresh = np.arange(cfg["retry_new"], dtype=np.int64) * KEY_STRIDE + 5
                    sess.run(m["train"], {m["ids"]: fresh})
                    result["size_after_retry"] = int(sess.run(m["emb"].size()))
                    break
                step += 1
                if step in save_at or (cfg.get("save_every") and step % cfg["save_every"] == 0):
                    stage = "save"
                    saver.save(sess, os.path.join(cfg["ckpt_dir"], "model"), global_step=step)
                    result["saved"].append(step)
                if step in dump_at:
                    stage = "dump"
                    dump(sess, m, os.path.join(cfg["out_dir"], "state_%d.npz" % step))
                if cfg.get("hold") and step == 1:
                    ready.write(b"READY %d\n" % os.getpid())
                    sys.stdin.read()  # until the parent closes our stdin
                    break
                if step == cfg.get("ready_after"):
                    ready.write(b"READY %d\n" % step)
            if cfg.get("twin"):
                twin(cfg, result)
                stage = "after_twin"  # this process's first table still trains
                run_step(sess, m, step)
                step += 1
                if step in dump_at:
                    stage = "dump"
                    dump(sess, m, os.path.join(cfg["out_dir"], "state_%d.npz" % step))
            if stats is not None:
                stage = "stats"
                result["stats"] = {k: np.asarray(v).tolist() for k, v in sess.run(stats).items()}
    except (tf.errors.OpError, ValueError) as e:
        result["error"] = _error(e, stage, step)
    result["step"] = step
    with open(cfg["result"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
