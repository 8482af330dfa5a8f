"""Parameter-server training of dynamic embeddings with `tf.estimator.train_and_evaluate`, as a user runs it.

A cluster of fresh Python processes on loopback ports: a chief, one worker, two ps tasks and an evaluator, each
started with its own `TF_CONFIG` and running the same script (`import tensorflow as tf, tensorflow_ext` and the model
code). The model embeds two int64 features with `tf_ext.get_dynamic_embedding(..., num_shards=2)`; the Estimator's
replica_device_setter spreads the shards over the ps tasks. The label is a function of the ids, so the evaluator's
AUC on held-out (id pair) examples says whether the tables really trained. After the cluster is done, one plain
process (no `TF_CONFIG`) restores the chief's checkpoint with a Session + Saver and checks every key and row.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from loopback import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Guards against a hang only, never what decides pass or fail: five TensorFlow processes (a minute or two in all on
# a quiet 2-core machine) may take several times as long on a busy one.
CLUSTER_TIMEOUT_S = 900  # chief + worker + evaluator, from the first start to the last exit
RESTORE_TIMEOUT_S = 400
MAX_STEPS = 300

# One script for every task: the cluster task TF_CONFIG names, or (without TF_CONFIG) the plain restoring process.
_SCRIPT = textwrap.dedent(
    r'''
    import glob, json, os, sys, time
    import numpy as np
    import tensorflow as tf
    import tensorflow_ext as tf_ext

    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)

    MODEL_DIR = sys.argv[1]
    MAX_STEPS = int(sys.argv[2])
    USERS, ITEMS, DIM, BATCH = 1000, 200, 8, 100

    # The hidden model: label = a[user] + b[item] > 0, learnable by the embeddings + a dense layer.
    _rng = np.random.RandomState(1234)
    A, B = _rng.normal(size=USERS), _rng.normal(size=ITEMS)
    # Ids far apart and of both signs, as hashed feature ids are.
    USER_KEYS = np.arange(USERS, dtype=np.int64) * 1000003 - 500000000000
    ITEM_KEYS = np.arange(ITEMS, dtype=np.int64) * 7919 + 3


    def examples(split):
      """(user index, item index, label); "train": every user twice and every item 10 times per epoch."""
      if split == "train":
        rng = np.random.RandomState(0)
        u = np.tile(np.arange(USERS), 2)
        i = rng.permutation(np.tile(np.arange(ITEMS), 2 * USERS // ITEMS))
      else:  # held-out pairs
        rng = np.random.RandomState(99)
        u, i = rng.randint(0, USERS, 2000), rng.randint(0, ITEMS, 2000)
      return u, i, (A[u] + B[i] > 0).astype(np.float32)


    def input_fn(split, seed=0):
      u, i, y = examples(split)
      def fn():
        ds = tf.compat.v1.data.Dataset.from_tensor_slices(
            ({"user": USER_KEYS[u], "item": ITEM_KEYS[i]}, y.reshape(-1, 1)))
        if split == "train":
          # Each epoch (20 steps) is a permutation of all examples: every id is trained in every epoch.
          ds = ds.shuffle(len(y), seed=seed, reshuffle_each_iteration=True).repeat()
        return ds.batch(BATCH)
      return fn


    def model_fn(features, labels, mode):
      init = tf.compat.v1.random_normal_initializer(0.0, 0.05, seed=7)
      user = tf_ext.get_dynamic_embedding("user_emb", DIM, num_shards=2, initializer=init)
      item = tf_ext.get_dynamic_embedding("item_emb", DIM, num_shards=2, initializer=init)
      x = tf.concat([tf_ext.embedding_lookup(user, features["user"]),
                     tf_ext.embedding_lookup(item, features["item"])], axis=1)
      logits = tf.compat.v1.layers.dense(x, 1, name="out")
      prob = tf.sigmoid(logits)
      if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"prob": prob})
      loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
      if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "auc": tf.compat.v1.metrics.auc(labels, prob, num_thresholds=1000)})
      # As in Wide&Deep: Ftrl for the "wide" item embedding, Adagrad for the rest.
      deep_vars = list(user.shards) + tf.compat.v1.trainable_variables("out")
      train_op = tf.group(
          tf.compat.v1.train.AdagradOptimizer(0.3).minimize(
              loss, global_step=tf.compat.v1.train.get_global_step(), var_list=deep_vars),
          tf.compat.v1.train.FtrlOptimizer(0.3, l1_regularization_strength=0.001).minimize(
              loss, var_list=list(item.shards)))
      return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


    def _wait_for(path, what):
      deadline = time.time() + 600  # a guard against a hang only (the other process died)
      while not os.path.exists(path):
        if time.time() > deadline:
          raise RuntimeError("timed out waiting for " + what)
        time.sleep(0.05)


    class _Rendezvous(tf.compat.v1.train.SessionRunHook):
      """Makes the chief and the worker train at the same time, and counts this trainer's steps.

      A worker whose session comes up before the chief has initialized the model sleeps through the session
      manager's 30 s readiness poll and may find training over. So the worker builds its session only after the
      chief's is up ("chief_ready"), the chief starts stepping once the worker's session is up, and it goes past
      its first step only once the worker has done one ("worker_stepped"): however slow the machine or the
      worker, both train.
      """

      def __init__(self, task_type):
        self._type = task_type
        self.steps = 0

      def after_create_session(self, session, coord):
        open(self._type + "_ready", "w").close()
        if self._type == "chief":
          _wait_for("worker_ready", "the worker's session")

      def after_run(self, run_context, run_values):
        self.steps += 1
        if self.steps == 1 and self._type == "worker":
          open("worker_stepped", "w").close()
        if self.steps == 1 and self._type == "chief":
          _wait_for("worker_stepped", "the worker's first step")


    def run_cluster_task():
      task = json.loads(os.environ["TF_CONFIG"])["task"]
      session_config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
      # Passing a session_config replaces the Estimator's distributed default: keep its device filters, so a
      # trainer's session needs only the ps tasks and itself.
      if task["type"] == "chief":
        session_config.device_filters.extend(["/job:ps", "/job:chief"])
      elif task["type"] == "worker":
        session_config.device_filters.extend(["/job:ps", "/job:worker/task:%d" % task["index"]])
      config = tf.estimator.RunConfig(
          model_dir=MODEL_DIR, save_checkpoints_steps=100, save_summary_steps=100, log_step_count_steps=None,
          session_config=session_config, experimental_max_worker_delay_secs=1)
      est = tf.estimator.Estimator(model_fn, config=config)
      seed = 1 + task["index"] + (10 if task["type"] == "worker" else 0)
      hook = _Rendezvous(task["type"])
      train_spec = tf.estimator.TrainSpec(input_fn("train", seed), max_steps=MAX_STEPS, hooks=[hook])
      eval_spec = tf.estimator.EvalSpec(input_fn("eval"), steps=None, start_delay_secs=0, throttle_secs=1)
      if task["type"] == "worker":
        _wait_for("chief_ready", "the chief's session")
      print("task %s:%d starting" % (task["type"], task["index"]), flush=True)
      tf.estimator.train_and_evaluate(est, train_spec, eval_spec)  # ps tasks serve here until killed
      if task["type"] == "chief":
        print("RESULT " + json.dumps({"global_step": int(est.get_variable_value("global_step")),
                                      "steps": hook.steps}), flush=True)
      if task["type"] == "worker":
        print("RESULT " + json.dumps({"steps": hook.steps}), flush=True)
      if task["type"] == "evaluator":
        evals = []
        for path in glob.glob(os.path.join(MODEL_DIR, "eval", "events.out.tfevents.*")):
          for event in tf.compat.v1.train.summary_iterator(path):
            vals = {v.tag: v.simple_value for v in event.summary.value}
            if "auc" in vals:
              evals.append((event.step, vals["auc"], vals["loss"]))
        print("RESULT " + json.dumps({"evals": sorted(evals)}), flush=True)
      print("task %s:%d done" % (task["type"], task["index"]), flush=True)


    def restore_and_check():
      """A plain process: Session + Saver on the chief's latest checkpoint, no cluster."""
      ckpt = tf.train.latest_checkpoint(MODEL_DIR)
      u, i, y = examples("eval")
      with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features = {"user": tf.compat.v1.placeholder(tf.int64, [None]),
                    "item": tf.compat.v1.placeholder(tf.int64, [None])}
        prob = model_fn(features, None, tf.estimator.ModeKeys.PREDICT).predictions["prob"]
        embs = {e.name: e for e in tf_ext.embedding.get_dynamic_embeddings()}
        exports = {name: e.export() for name, e in embs.items()}
        devices = sorted({s.handle.device for e in embs.values() for s in e.shards})
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
          saver.restore(sess, ckpt)
          got = sess.run({name: (x.keys, x.values) for name, x in exports.items()})
          p = sess.run(prob, {features["user"]: USER_KEYS[u], features["item"]: ITEM_KEYS[i]})[:, 0]
      # The rows every key had before training: its initializer draw depends only on (seed, key).
      with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        model_fn({"user": tf.zeros([0], tf.int64), "item": tf.zeros([0], tf.int64)}, None,
                 tf.estimator.ModeKeys.PREDICT)
        embs = {e.name: e for e in tf_ext.embedding.get_dynamic_embeddings()}
        first = {"user_emb": tf_ext.embedding_lookup(embs["user_emb"], USER_KEYS, is_training=True),
                 "item_emb": tf_ext.embedding_lookup(embs["item_emb"], ITEM_KEYS, is_training=True)}
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())  # the global step a training lookup reads
          for name, rows in sess.run(first).items():
            np.save(name + "_initial.npy", rows)
      np.save("restored_prob.npy", p)
      np.save("heldout_label.npy", y)
      for name, (keys, values) in got.items():
        np.save(name + "_keys.npy", keys)
        np.save(name + "_values.npy", values)
      print("RESULT " + json.dumps({"checkpoint": ckpt, "devices": devices}), flush=True)


    if __name__ == "__main__":
      if "TF_CONFIG" in os.environ:
        run_cluster_task()
      else:
        restore_and_check()
'''
)


def _env(tf_config=None):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _result(log_path):
    with open(log_path) as f:
        lines = [l for l in f.read().splitlines() if l.startswith("RESULT ")]
    assert lines, "no RESULT line in %s" % log_path
    return json.loads(lines[-1][len("RESULT ") :])


def _tail(path, n=4000):
    try:
        with open(path) as f:
            return f.read()[-n:]
    except OSError as e:
        return "<%s>" % e


def _read_graph(model_dir):
    graph_def = tf.compat.v1.GraphDef()
    with open(os.path.join(model_dir, "graph.pbtxt")) as f:
        text_format.Parse(f.read(), graph_def)
    return graph_def


def _auc(labels, scores):
    """Exact ROC AUC (Mann-Whitney), ties counted half."""
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    ranks = np.empty(len(s))
    lo = 0
    while lo < len(s):
        hi = lo
        while hi + 1 < len(s) and s[hi + 1] == s[lo]:
            hi += 1
        ranks[lo : hi + 1] = (lo + hi) / 2.0 + 1
        lo = hi + 1
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return (ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def test_train_and_evaluate_with_ps_tasks_holding_dynamic_embeddings(tmp_path):
    script = tmp_path / "ps_model.py"
    script.write_text(_SCRIPT)
    model_dir = str(tmp_path / "model")
    chief, worker, ps0, ps1 = ["127.0.0.1:%d" % p for p in free_ports(4)]
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps0, ps1]}
    tasks = [("ps", 0), ("ps", 1), ("chief", 0), ("worker", 0), ("evaluator", 0)]
    procs, logs = {}, {}
    start = time.time()
    try:
        for task_type, index in tasks:
            name = "%s%d" % (task_type, index)
            logs[name] = str(tmp_path / (name + ".log"))
            with open(logs[name], "w") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, str(script), model_dir, str(MAX_STEPS)],
                    cwd=str(tmp_path),
                    env=_env({"cluster": cluster, "task": {"type": task_type, "index": index}}),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )

        def diagnostics():
            return "\n".join("---- %s (rc %s):\n%s" % (n, procs[n].poll(), _tail(logs[n])) for n in procs)

        # The trainers and the evaluator end by themselves; the ps tasks serve until killed.
        deadline = start + CLUSTER_TIMEOUT_S
        for name in ("chief0", "worker0", "evaluator0"):
            try:
                rc = procs[name].wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError("%s did not finish in %d s\n%s" % (name, CLUSTER_TIMEOUT_S, diagnostics()))
            assert rc == 0, "%s failed\n%s" % (name, diagnostics())
        for name in ("ps0", "ps1"):
            assert procs[name].poll() is None, "ps task exited early\n%s" % diagnostics()
        cluster_s = time.time() - start
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for p in procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    # Training advanced to the target: the chief's checkpoint is at (or, with the async worker, just past) it.
    chief_result = _result(logs["chief0"])
    global_step = chief_result["global_step"]
    assert MAX_STEPS <= global_step < MAX_STEPS + 10, chief_result
    # Both trainers stepped, concurrently, on the one global step the ps tasks hold.
    chief_steps, worker_steps = chief_result["steps"], _result(logs["worker0"])["steps"]
    assert chief_steps > 0 and worker_steps > 0, (chief_steps, worker_steps)
    assert abs(chief_steps + worker_steps - global_step) <= 3, (chief_steps, worker_steps, global_step)

    # The tables were on the ps tasks: in the chief's graph, each embedding's two shard tables are on ps 0 and 1.
    graph_def = _read_graph(model_dir)
    handles = {}
    for node in graph_def.node:
        if node.op == "TfExtTableHandle":
            handles.setdefault(node.name.split("/")[0], []).append(tf.DeviceSpec.from_string(node.device))
    assert sorted(handles) == ["item_emb", "user_emb"], handles
    for emb, specs in handles.items():
        assert [s.job for s in specs] == ["ps", "ps"], (emb, [s.to_string() for s in specs])
        assert sorted(s.task for s in specs) == [0, 1], (emb, [s.to_string() for s in specs])
    # ... and so is every op that reads or updates them (no table op was placed on the chief).
    by_name = {node.name: node for node in graph_def.node}
    handle_names = {node.name for node in graph_def.node if node.op == "TfExtTableHandle"}
    table_ops = [
        node
        for node in graph_def.node
        if node.op.startswith("TfExt")
        and node.op != "TfExtTableHandle"
        and any(inp.split(":")[0].lstrip("^") in handle_names for inp in node.input)
    ]
    assert {
        "TfExtEmbeddingLookup",
        "TfExtEmbeddingSparseApplyAdagrad",
        "TfExtEmbeddingSparseApplyFtrl",
        "TfExtTableExport",
        "TfExtTableImport",
    } <= {node.op for node in table_ops}, table_ops
    for node in table_ops:
        handle = next(by_name[inp.split(":")[0]] for inp in node.input if inp.split(":")[0] in handle_names)
        assert node.device == handle.device, (node.name, node.op, node.device, handle.name, handle.device)

    # The evaluator evaluated the chief's checkpoints, the last one at the target step, with a sane AUC.
    evals = _result(logs["evaluator0"])["evals"]
    # (It stops at the first checkpoint at or past the target: with the worker stepping concurrently, the chief can
    # save one at the target and its final one a step later.)
    assert evals and MAX_STEPS <= evals[-1][0] <= global_step, evals
    _, final_auc, final_loss = evals[-1]
    assert final_auc > 0.7 and final_loss < 0.69, evals

    # One plain process (no TF_CONFIG, no cluster) restores the chief's checkpoint: every key, every row.
    restore_start = time.time()
    r = subprocess.run(
        [sys.executable, str(script), model_dir, str(MAX_STEPS)],
        cwd=str(tmp_path),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=RESTORE_TIMEOUT_S,
    )
    assert r.returncode == 0, "restore failed:\n%s\n%s" % (r.stdout[-3000:], r.stderr[-5000:])
    restore_s = time.time() - restore_start
    restored = json.loads([l for l in r.stdout.splitlines() if l.startswith("RESULT ")][-1][len("RESULT ") :])
    assert restored["checkpoint"].endswith("model.ckpt-%d" % global_step), restored
    assert restored["devices"] == [""], restored  # the plain process placed the tables locally

    reader = tf.compat.v1.train.NewCheckpointReader(restored["checkpoint"])
    expected_ids = {
        "user_emb": np.arange(1000, dtype=np.int64) * 1000003 - 500000000000,
        "item_emb": np.arange(200, dtype=np.int64) * 7919 + 3,
    }
    for name, ids in expected_ids.items():
        keys = np.load(tmp_path / (name + "_keys.npy"))
        values = np.load(tmp_path / (name + "_values.npy"))
        # Every id the cluster trained is there, once, and nothing else.
        np.testing.assert_array_equal(np.sort(keys), np.sort(ids))
        # The rows are the checkpoint's rows (both ps shards were saved and restored).
        ck_keys = np.concatenate([reader.get_tensor("%s/part_%d-keys" % (name, s)) for s in (0, 1)])
        ck_values = np.concatenate([reader.get_tensor("%s/part_%d-values" % (name, s)) for s in (0, 1)])
        assert all(reader.get_tensor("%s/part_%d-keys" % (name, s)).size > 0 for s in (0, 1))
        np.testing.assert_array_equal(values[np.argsort(keys)], ck_values[np.argsort(ck_keys)])
        # Every key was trained: no row is still its initial draw (Ftrl's L1 may have zeroed some item rows).
        initial = np.load(tmp_path / (name + "_initial.npy"))
        moved = np.any(values[np.argsort(keys)] != initial[np.argsort(ids)], axis=1)
        assert moved.all(), (name, np.flatnonzero(~moved)[:10])
    assert np.abs(np.load(tmp_path / "user_emb_values.npy")).max() > 0.2  # Adagrad moved rows well past N(0, .05)

    # The worker trained the same tables as the chief (the ps tasks' tables, shared by both sessions), not tables
    # of its own: each training step bumps the frequency of its batch's distinct users (about 97.5 of 100), so
    # the saved frequencies add up to the steps of both trainers, not to the chief's alone.
    freqs = sum(reader.get_tensor("user_emb/part_%d-freqs" % s).sum() for s in (0, 1))
    assert 0.9 * 100 * (chief_steps + worker_steps) <= freqs <= 100 * (global_step + 3), (
        freqs,
        chief_steps,
        worker_steps,
    )

    # The restored model scores the held-out pairs as the evaluator did (tf.metrics.auc is a thresholded estimate,
    # and the evaluator's last checkpoint may be a step before the chief's last).
    auc = _auc(np.load(tmp_path / "heldout_label.npy"), np.load(tmp_path / "restored_prob.npy"))
    assert auc > 0.7, auc
    assert abs(auc - final_auc) < 0.02, (auc, final_auc)
    print(
        "cluster %.1f s (chief %d + worker %d steps), restore %.1f s, evals %s, restored auc %.4f"
        % (cluster_s, chief_steps, worker_steps, restore_s, evals, auc)
    )
