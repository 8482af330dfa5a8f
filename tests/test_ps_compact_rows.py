"""A dynamic embedding stored in bf16/fp16 on a parameter server (a `tf.distribute.Server` ps task in a process of
its own) trains from a worker process exactly like the same model in one process.

The worker builds the model under `replica_device_setter`, so the embedding's tables live on the ps task, and trains
a few steps through a session on its own server; then it trains the same model without a cluster and compares every
loss, row and slot bit for bit (placement does not change the arithmetic). The rows of a half-precision table cross
from the ps task to the worker as half values: the cast to the storage dtype runs on the ps task, next to the
table, and the cast back to float32 on the worker.
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
    VALUE_DTYPE = tf.as_dtype(sys.argv[2])
    NUM_SHARDS = int(sys.argv[3])
    STEPS, DIM = 4, 8
    rng = np.random.RandomState(3)
    BATCHES = [rng.randint(0, 40, size=[16, 3]).astype(np.int64) * 7919 - 100 for _ in range(STEPS)]
    LABELS = [rng.normal(size=[16, 1]).astype(np.float32) for _ in range(STEPS)]


    def train(target):
        with tf.Graph().as_default() as g:
            placement = contextlib.nullcontext()
            if target is not None:
                placement = tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
                    ps_tasks=1, worker_device="/job:worker/task:0", cluster=CLUSTER))
            with placement:
                gs = tf.compat.v1.train.get_or_create_global_step()
                ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
                labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
                emb = tf_ext.get_dynamic_embedding(
                    "emb", DIM, num_shards=NUM_SHARDS, value_dtype=VALUE_DTYPE,
                    initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=5))
                x = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids), axis=1)
                w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-1, 1, DIM).reshape(DIM, 1),
                                                                              tf.float32))
                loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
                train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=gs)
            exported = emb.export(with_slots=True)
            with tf.compat.v1.Session(target or "", graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                losses = [sess.run([loss, train_op], {ids: b, labels: y})[0] for b, y in zip(BATCHES, LABELS)]
                keys, values, slots = sess.run([exported.keys, exported.values, exported.slots])
            order = np.argsort(keys)
            devices = sorted({s.handle.device for s in emb.shards})
            # Where each Cast that touches the embedding's rows runs, and what it makes.
            casts = sorted({(op.inputs[0].dtype.name, op.outputs[0].dtype.name, op.device)
                            for op in g.get_operations() if op.type == "Cast" and "emb" in op.name
                            and "gradients" not in op.name})
            return dict(losses=np.array(losses), keys=keys[order], values=values[order], slots=slots[order],
                        devices=devices, casts=casts)


    server = tf.distribute.Server(tf.train.ClusterSpec(CLUSTER), job_name="worker", task_index=0)
    got = train(server.target)
    want = train(None)
    for field in ("losses", "keys", "values", "slots"):
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)
    np.testing.assert_array_equal(got["keys"], np.unique(np.concatenate(BATCHES)))
    # Rows of a half table hold values of its dtype.
    np.testing.assert_array_equal(
        got["values"], got["values"].astype(VALUE_DTYPE.as_numpy_dtype).astype(np.float32))
    print("RESULT " + json.dumps({"devices": got["devices"], "casts": got["casts"]}), flush=True)
    """
)


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


@pytest.mark.parametrize("value_dtype,num_shards", [("bfloat16", 2), ("float16", 1)])
def test_half_rows_on_a_ps_task_train_like_one_process(tmp_path, value_dtype, num_shards):
    ps, worker = ["127.0.0.1:%d" % p for p in free_ports(2)]
    cluster = json.dumps({"ps": [ps], "worker": [worker]})
    ps_proc = subprocess.Popen(
        [sys.executable, "-c", _PS, cluster], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", _WORKER, cluster, value_dtype, str(num_shards)],
            env=_env(),
            cwd=str(tmp_path),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        ps_proc.kill()
        ps_proc.wait(timeout=60)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    result = json.loads([l for l in r.stdout.splitlines() if l.startswith("RESULT ")][-1][len("RESULT ") :])
    assert result["devices"] == ["/job:ps/task:0"], result
    # The rows leave the ps task as half values and become float32 on the worker.
    casts = [tuple(c) for c in result["casts"]]
    assert ("float32", value_dtype, "/job:ps/task:0") in casts, casts
    assert (value_dtype, "float32", "/job:worker/task:0") in casts, casts
