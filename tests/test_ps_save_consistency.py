"""Checkpoints of parameter-server tables are consistent under asynchronous updates: a row and its slots are saved at
one instant.

A cluster of fresh processes on loopback ports: one ps task holding a dynamic embedding (two shards), two workers
training it with Adagrad as fast as they can, and a chief that saves checkpoint after checkpoint meanwhile. The
training is designed so that a row's value and its Adagrad accumulator are tied: every row starts at 0 with
accumulator A0, and every step adds a gradient of exactly 1 to every column of the rows it looks up (the loss is the
sum of the looked-up rows, over unique keys). After n updates a row's accumulator is therefore A0 + n (summed in
float32: exactly the sequence `_reference` computes) and its value -LR * sum_k 1/sqrt(A0 + k), k = 1..n. For every
key of every checkpoint the test reads n off the accumulator and checks the value against it: a save that copied a
row's value and its accumulator at different instants, with an update in between (DeepRec issue #1023), leaves a
value one update away from its accumulator's, which the check tells apart by a margin (`test_the_check_catches_a_torn
_save` shows it on rows torn on purpose, and on an export that reads the values and the slots with two ops around an
update).

Why it holds: a shard's export (TfExtTableExport, and TfExtTableExportSince for delta saves) copies every row under
the read locks of all the table's lock shards, held for the whole call, and the sparse apply updates a row's value
and slots together under its lock shard's write lock (table/core/hash_table.h, "Thread safety").
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import tensorflow as tf
from loopback import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Guards against a hang only (four TensorFlow processes on a busy 2-core machine), never what decides pass or fail.
CLUSTER_TIMEOUT_S = 600
KEYS, DIM, LR, A0 = 20000, 8, 0.05, 0.1
MIN_SAVES, MIN_STEPS, MAX_SAVES = 8, 150, 30

_SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys, time
    import numpy as np
    import tensorflow as tf
    import tensorflow_ext as tf_ext

    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)

    ROLE, INDEX, CLUSTER, OUT = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    KEYS, DIM, LR, A0, MIN_SAVES, MIN_STEPS, MAX_SAVES = [float(x) for x in sys.argv[5:12]]
    KEYS, DIM, MIN_SAVES, MIN_STEPS, MAX_SAVES = int(KEYS), int(DIM), int(MIN_SAVES), int(MIN_STEPS), int(MAX_SAVES)
    ALL_KEYS = np.arange(KEYS, dtype=np.int64) * 7919 - 10 ** 9  # spread and signed, as hashed ids are


    def wait_for(name):
      deadline = time.time() + 500  # a guard against a hang only (another process died)
      while not os.path.exists(os.path.join(OUT, name)):
        if time.time() > deadline:
          raise RuntimeError("timed out waiting for " + name)
        time.sleep(0.02)


    def mark(name):
      open(os.path.join(OUT, name), "w").close()


    cluster = tf.train.ClusterSpec(CLUSTER)
    server = tf.distribute.Server(cluster, job_name=ROLE, task_index=INDEX,
                                  config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4))
    if ROLE == "ps":
      server.join()

    device = "/job:%s/task:%d" % (ROLE, INDEX)
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)):
      step = tf.compat.v1.train.get_or_create_global_step()
      emb = tf_ext.get_dynamic_embedding("rows", DIM, num_shards=2, initializer=tf.compat.v1.zeros_initializer())
      keys = tf.compat.v1.placeholder(tf.int64, [None])
      # d loss / d row = 1 in every column of every looked-up row (the keys of a batch are unique).
      loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, keys))
      train = tf.compat.v1.train.AdagradOptimizer(LR, initial_accumulator_value=A0).minimize(loss, global_step=step)
    saver = tf.compat.v1.train.Saver(max_to_keep=None)
    # DeepRec #1023's save, for the chief to make on purpose: the values and the slots exported by two ops (placed
    # with their tables on the ps by the tables' resource edges).
    value_exports = [shard.table.export(col_begin=0, cols=DIM)[:2] for shard in emb.shards]
    slot_exports = [shard.table.export(col_begin=DIM, cols=DIM)[:2] for shard in emb.shards]
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])


    class Raw(tf.compat.v1.train.SessionRunHook):
      def after_create_session(self, session, coord):
        self.session = session


    raw = Raw()
    if ROLE == "worker":
      wait_for("chief_ready")
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=ROLE == "chief", config=config, hooks=[raw], log_step_count_steps=None,
        save_summaries_steps=None) as sess:
      if ROLE == "chief":
        mark("chief_ready")
        wait_for("worker0_stepping")
        wait_for("worker1_stepping")
        saves = []
        # Checkpoints back to back while both workers update the rows.
        while len(saves) < MAX_SAVES and (len(saves) < MIN_SAVES or raw.session.run(step) < MIN_STEPS):
          saves.append(saver.save(raw.session, os.path.join(OUT, "ckpt"), global_step=len(saves), write_meta_graph=False))
        mark("stop")
        wait_for("worker0_done")
        wait_for("worker1_done")
        # The two-op save with one update of every key between its ops (the workers are done: nothing else runs).
        exported = raw.session.run(value_exports)
        raw.session.run(train, {keys: ALL_KEYS})
        exported_slots = raw.session.run(slot_exports)
        np.savez(os.path.join(OUT, "torn.npz"),
                 keys=np.concatenate([k for k, _ in exported]), values=np.concatenate([v for _, v in exported]),
                 slot_keys=np.concatenate([k for k, _ in exported_slots]),
                 slots=np.concatenate([v for _, v in exported_slots]))
        print("RESULT " + json.dumps({"saves": saves, "global_step": int(raw.session.run(step))}), flush=True)
      else:
        rng = np.random.RandomState(INDEX)
        steps = 0
        while not os.path.exists(os.path.join(OUT, "stop")):
          # A random half of the keys: keys end up with different update counts.
          sess.run(train, {keys: ALL_KEYS[rng.rand(KEYS) < 0.5]})
          steps += 1
          if steps == 1:
            mark("worker%d_stepping" % INDEX)
        mark("worker%d_done" % INDEX)
        print("RESULT " + json.dumps({"steps": steps}), flush=True)
    """
)


def _reference(max_n):
    """(accumulators, values) after n = 0..max_n updates with gradient 1, in float32 as the kernel computes them
    (a += g * g; v -= lr * g * (1 / sqrt(a)))."""
    a = np.empty(max_n + 1, np.float32)
    v = np.empty(max_n + 1, np.float32)
    a[0], v[0] = np.float32(A0), np.float32(0)
    lr = np.float32(LR)
    for n in range(1, max_n + 1):
        a[n] = a[n - 1] + np.float32(1)
        v[n] = v[n - 1] - lr * (np.float32(1) / np.sqrt(a[n]))
    return a, v


def inconsistent_rows(values, slots, max_n):
    """(indices of the rows whose value is not the one their accumulator says, update counts n per row).

    A row is consistent when its DIM accumulators all equal the reference accumulator after some n updates and its
    DIM values all lie within a quarter of an update of the reference value after n (float32 rounding of the
    kernel's and the reference's arithmetic differs by far less: the test asserts that margin too)."""
    a_ref, v_ref = _reference(max_n)
    index = {float(a): n for n, a in enumerate(a_ref)}
    n = np.array([index.get(float(a), -1) for a in slots[:, 0]])
    known = (n >= 0) & np.all(slots == slots[:, :1], axis=1)
    n = np.where(known, n, 0)
    step = np.abs(v_ref[np.minimum(n + 1, max_n)] - v_ref[n])  # the size of the next update
    off = np.max(np.abs(values - v_ref[n][:, None]), axis=1)
    bad = ~known | (off > 0.25 * step)
    return np.flatnonzero(bad), np.where(known, n, -1), off / np.maximum(step, 1e-30)


def _env():
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _result(path):
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("RESULT ")]
    assert lines, "no RESULT line in %s" % path
    return json.loads(lines[-1][len("RESULT ") :])


def _tail(path, n=4000):
    try:
        with open(path) as f:
            return f.read()[-n:]
    except OSError as e:
        return "<%s>" % e


def _run_cluster(tmp_path):
    script = tmp_path / "hammer.py"
    script.write_text(_SCRIPT)
    ps, chief, w0, w1 = ["127.0.0.1:%d" % p for p in free_ports(4)]
    cluster = {"ps": [ps], "chief": [chief], "worker": [w0, w1]}
    args = [str(x) for x in (KEYS, DIM, LR, A0, MIN_SAVES, MIN_STEPS, MAX_SAVES)]
    procs, logs = {}, {}
    try:
        for role, index in (("ps", 0), ("chief", 0), ("worker", 0), ("worker", 1)):
            name = "%s%d" % (role, index)
            logs[name] = str(tmp_path / (name + ".log"))
            with open(logs[name], "w") as log:
                procs[name] = subprocess.Popen(
                    [sys.executable, str(script), role, str(index), json.dumps(cluster), str(tmp_path)] + args,
                    env=_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        deadline = time.time() + CLUSTER_TIMEOUT_S
        for name in ("chief0", "worker0", "worker1"):
            try:
                rc = procs[name].wait(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                raise AssertionError(
                    "%s: %s\n%s" % (name, rc, "\n".join("---- %s:\n%s" % (n, _tail(logs[n])) for n in sorted(procs)))
                )
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    return _result(logs["chief0"]), [_result(logs["worker%d" % i])["steps"] for i in (0, 1)]


def _rows(reader, name):
    keys = np.concatenate([reader.get_tensor("%s/part_%d-keys" % (name, s)) for s in (0, 1)])
    values = np.concatenate([reader.get_tensor("%s/part_%d-values" % (name, s)) for s in (0, 1)])
    slots = np.concatenate([reader.get_tensor("%s/part_%d-slots" % (name, s)) for s in (0, 1)])
    return keys, values, slots


def test_every_saved_row_has_its_value_and_accumulator_from_one_instant(tmp_path):
    chief, worker_steps = _run_cluster(tmp_path)
    total_steps = sum(worker_steps)
    assert min(worker_steps) > 0 and chief["global_step"] >= total_steps, (chief, worker_steps)
    previous_n, moved = None, []
    worst = 0.0
    for path in chief["saves"]:
        keys, values, slots = _rows(tf.compat.v1.train.NewCheckpointReader(path), "rows")
        assert values.shape[1] == DIM and slots.shape == values.shape  # one accumulator per column (Adagrad)
        order = np.argsort(keys)
        keys, values, slots = keys[order], values[order], slots[order]
        bad, n, off = inconsistent_rows(values, slots, total_steps)
        assert bad.size == 0, "%s: %d of %d rows torn, e.g. key %d: value %s, accumulator %s" % (
            path,
            bad.size,
            keys.size,
            keys[bad[0]],
            values[bad[0]],
            slots[bad[0]],
        )
        worst = max(worst, float(off.max()) if off.size else 0.0)
        if previous_n is not None and previous_n.size == n.size:
            # Saved one after the other: no row goes back, and the workers kept training in between.
            assert np.all(n >= previous_n), path
            moved.append(int((n - previous_n).sum()))
        previous_n = n
    # The rows moved while the chief saved (the saves overlapped the updates), and by up to every step of both
    # workers (each step updates a key at most once).
    assert sum(1 for m in moved if m > 0) >= len(moved) // 2, moved
    assert previous_n.max() <= total_steps
    # The float32 arithmetic of the kernel and of the reference agree far within the quarter update the check allows.
    assert worst < 0.05, worst
    print(
        "%d checkpoints, %d keys each, %d worker steps (%s); rows moved between saves: %s; worst |value - reference| "
        "%.4f of an update" % (len(chief["saves"]), KEYS, total_steps, worker_steps, moved, worst)
    )

    # The same check on an export that reads the values, lets one update of every key through, then reads the
    # slots: every row is one update off.
    torn = np.load(tmp_path / "torn.npz")
    np.testing.assert_array_equal(torn["keys"], torn["slot_keys"])
    bad, _, _ = inconsistent_rows(torn["values"], torn["slots"], total_steps + 1)
    assert bad.size == KEYS, bad.size


def test_the_check_catches_a_torn_save():
    a_ref, v_ref = _reference(50)
    n = np.array([0, 1, 7, 49])
    values = np.repeat(v_ref[n][:, None], DIM, axis=1)
    slots = np.repeat(a_ref[n][:, None], DIM, axis=1)
    assert inconsistent_rows(values, slots, 50)[0].size == 0
    for row in range(4):
        torn_slots = slots.copy()
        torn_slots[row] = a_ref[n[row] + 1]  # the accumulator one update ahead of the value
        assert inconsistent_rows(values, torn_slots, 50)[0].tolist() == [row]
        torn_values = values.copy()
        torn_values[row, DIM - 1] = v_ref[n[row] + 1]  # one column one update ahead
        assert inconsistent_rows(torn_values, slots, 50)[0].tolist() == [row]
        odd = slots.copy()
        odd[row, 0] += 0.5  # an accumulator no number of updates gives
        assert inconsistent_rows(values, odd, 50)[0].tolist() == [row]
