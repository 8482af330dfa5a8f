"""A tiered dynamic embedding on a parameter server (a `tf.distribute.Server` ps task in a process of its own) keeps
its stores with the ps task and trains from a worker process exactly like the same model all in memory in one
process.

The worker builds the model under `replica_device_setter`, so the embedding's tables, and with them their memory
tiers and on-disk stores, live on the ps task; it trains a few steps through a session on its own server, with a
memory budget of 64 rows per shard (most keys end up on disk, settled after each step), then trains the same model
without a cluster and without tiers and compares every loss, row and slot bit for bit. Each store directory's lock
names the process that holds it: the ps task's, which keeps the stores open after the worker is gone.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from loopback import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A guard against a hang only, never what decides pass or fail (two TensorFlow processes on a busy machine).
TIMEOUT_S = 600

_PS = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    import tensorflow_ext  # registers the table ops the ps task runs
    cluster = tf.train.ClusterSpec(json.loads(sys.argv[1]))
    tf.distribute.Server(cluster, job_name="ps", task_index=0).join()
    """
)

_WORKER = textwrap.dedent(
    r"""
    import contextlib, json, sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext

    CLUSTER = json.loads(sys.argv[1])
    TIER_ROOT = sys.argv[2]
    NUM_SHARDS = int(sys.argv[3])
    STEPS, DIM, ROWS = 6, 8, 64
    rng = np.random.RandomState(3)
    BATCHES = []
    for step in range(STEPS):
        ids = rng.randint(0, 2000, size=[16 * NUM_SHARDS, 3]).astype(np.int64)
        if step >= 2:  # a quarter of the ids from the steps before the previous one: rows on disk by then
            reuse = rng.rand(*ids.shape) < 0.25
            ids[reuse] = rng.choice(np.concatenate(BATCHES[: step - 1]).reshape(-1), size=int(reuse.sum()))
        BATCHES.append(ids)
    LABELS = [rng.normal(size=[16 * NUM_SHARDS, 1]).astype(np.float32) for _ in range(STEPS)]
    FIELDS = ("memory_keys", "disk_keys", "budget_keys", "cold_reads", "demotions", "errors")


    def model(storage):
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        emb = tf_ext.get_dynamic_embedding(
            "emb", DIM, num_shards=NUM_SHARDS, storage=storage,
            initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=5))
        x = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids * 7919 - 100), axis=1)
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-1, 1, DIM).reshape(DIM, 1),
                                                                      tf.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=gs)
        return emb, ids, labels, loss, train_op


    def memory_bytes():
        # A budget of about ROWS rows per shard: a row's bytes from a probe table's budget_keys (the tier's own
        # accounting), in this process.
        probe = 1 << 20
        with tf.Graph().as_default():
            emb, ids, labels, loss, train_op = model(tf_ext.TieredStorage(probe, TIER_ROOT + "_probe"))
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                budget_keys = int(sess.run(emb.tier_stats()["budget_keys"])) // NUM_SHARDS
        return -(-probe // NUM_SHARDS // budget_keys) * ROWS * NUM_SHARDS


    def train(target, storage):
        with tf.Graph().as_default() as g:
            placement = contextlib.nullcontext()
            if target is not None:
                placement = tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                    ps_tasks=1, worker_device="/job:worker/task:0", cluster=CLUSTER))
            with placement:
                emb, ids, labels, loss, train_op = model(storage)
            exported = emb.export(with_slots=True)
            stats, settle = emb.tier_stats(), emb.tier_settle()
            with tf.compat.v1.Session(target or "", graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                losses, tiers = [], []
                for b, y in zip(BATCHES, LABELS):
                    losses.append(sess.run([loss, train_op], {ids: b, labels: y})[0])
                    sess.run(settle)
                    s = sess.run(stats)
                    tiers.append([int(s[f]) for f in FIELDS])
                keys, values, slots, versions, freqs = sess.run(exported)
            order = np.argsort(keys)
            devices = sorted({s.handle.device for s in emb.shards})
            return dict(losses=np.array(losses), keys=keys[order], values=values[order], slots=slots[order],
                        versions=versions[order], freqs=freqs[order], devices=devices, tiers=tiers)


    server = tf.distribute.Server(tf.train.ClusterSpec(CLUSTER), job_name="worker", task_index=0)
    got = train(server.target, tf_ext.TieredStorage(memory_bytes(), TIER_ROOT))
    want = train(None, None)
    for field in ("losses", "keys", "values", "slots", "versions", "freqs"):
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)
    print("RESULT " + json.dumps({"devices": got["devices"], "tiers": got["tiers"], "keys": len(got["keys"])}),
          flush=True)
    """
)


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    env.pop("TF_EXT_TIER_ROOT", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.mark.parametrize("num_shards", [1, 2])
def test_tiered_embedding_on_a_ps_task_trains_like_one_process_in_memory(tmp_path, num_shards):
    ps, worker = ["127.0.0.1:%d" % p for p in free_ports(2)]
    cluster = json.dumps({"ps": [ps], "worker": [worker]})
    tier_root = str(tmp_path / "tiers")
    ps_proc = subprocess.Popen(
        [sys.executable, "-c", _PS, cluster], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", _WORKER, cluster, tier_root, str(num_shards)],
            env=_env(),
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
        # The worker has exited; the ps task holds each shard's store (the lock file names its pid).
        stores = [os.path.join(tier_root, "emb", "shard_%d_of_%d" % (i, num_shards)) for i in range(num_shards)]
        owners = [open(os.path.join(s, "TF_EXT_TIER_STORE.lock")).read().split() for s in stores]
        assert all(str(ps_proc.pid) in owner for owner in owners), (ps_proc.pid, owners)
        assert ps_proc.poll() is None
    finally:
        ps_proc.kill()
        ps_proc.wait(timeout=60)
    result = json.loads([l for l in r.stdout.splitlines() if l.startswith("RESULT ")][-1][len("RESULT ") :])
    assert result["devices"] == ["/job:ps/task:0"], result
    tiers = result["tiers"]  # per step: memory_keys, disk_keys, budget_keys, cold_reads, demotions, errors
    for before, after in zip(tiers[2:], tiers[3:]):
        assert after[3] > before[3] and after[4] > before[4], tiers  # cold reads and demotions every step
    memory_keys, disk_keys, budget_keys, _, _, errors = tiers[-1]
    assert disk_keys > memory_keys and memory_keys <= budget_keys and errors == 0, tiers
    assert memory_keys + disk_keys == result["keys"]
