"""A process that only runs `import tensorflow_ext` can read graphs that hold tf_ext ops.

Each check runs the reader in a fresh interpreter, as a serving job, a parameter-server task or a script that
imports a MetaGraph would: nothing but `import tensorflow as tf, tensorflow_ext` before the graph is read.
"""

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 240


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run_python(code, cwd):
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=str(cwd),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, "fresh process failed:\n%s\n%s" % (r.stdout[-3000:], r.stderr[-5000:])
    return r.stdout


def _build_and_train(export_dir=None, meta_path=None):
    """Trains a two-shard embedding + dense layer for 3 steps; saves a SavedModel and/or a MetaGraph.

    Returns:
      (ids fed at serving time, the predictions this process computed for them).
    """
    ids_np = np.array([[1, 2], [-7, 10**12], [5, 123456789]], np.int64)
    with tf.Graph().as_default() as g:
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
        emb = tf_ext.get_dynamic_embedding(
            "fresh_emb", 4, num_shards=2, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=3)
        )
        x = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids), axis=1)
        pred = tf.identity(tf.compat.v1.layers.dense(x, 1, name="out"), name="pred")
        loss = tf.reduce_mean(tf.square(pred - 1.0))
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs, name="train")
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train, {ids: ids_np})
            expected = sess.run(pred, {ids: ids_np})
            if export_dir is not None:
                builder = tf.compat.v1.saved_model.Builder(export_dir)
                sig = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"pred": pred})
                builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
                builder.save()
            if meta_path is not None:
                saver = tf.compat.v1.train.Saver()
                saver.save(sess, meta_path)
    return ids_np, expected


def test_saved_model_loads_after_plain_import_tf1_loader(tmp_path):
    export_dir = str(tmp_path / "sm")
    ids, expected = _build_and_train(export_dir=export_dir)
    np.save(tmp_path / "ids.npy", ids)
    out = _run_python(
        """
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext  # the only tf_ext line a serving process needs
        tf.compat.v1.disable_v2_behavior()
        ids = np.load("ids.npy")
        with tf.compat.v1.Session() as sess:
            meta = tf.compat.v1.saved_model.load(sess, ["serve"], %r)
            sig = meta.signature_def["serving_default"]
            got = sess.run(sig.outputs["pred"].name, {sig.inputs["ids"].name: ids})
        np.save("got.npy", got)
        print("served", got.shape)
    """
        % export_dir,
        tmp_path,
    )
    assert "served (3, 1)" in out
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), expected, rtol=1e-6)


def test_saved_model_loads_after_plain_import_tf2_api(tmp_path):
    """tf.saved_model.load (what TF2-style serving code calls) runs the signature eagerly on the tables."""
    export_dir = str(tmp_path / "sm")
    ids, expected = _build_and_train(export_dir=export_dir)
    np.save(tmp_path / "ids.npy", ids)
    _run_python(
        """
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext
        loaded = tf.saved_model.load(%r)
        fn = loaded.signatures["serving_default"]
        got = fn(ids=tf.constant(np.load("ids.npy")))["pred"].numpy()
        np.save("got.npy", got)
    """
        % export_dir,
        tmp_path,
    )
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), expected, rtol=1e-6)


def test_import_meta_graph_after_plain_import(tmp_path):
    prefix = str(tmp_path / "ckpt" / "model")
    ids, expected = _build_and_train(meta_path=prefix)
    np.save(tmp_path / "ids.npy", ids)
    _run_python(
        """
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext
        tf.compat.v1.disable_v2_behavior()
        saver = tf.compat.v1.train.import_meta_graph(%r)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, %r)
            got = sess.run("pred:0", {"ids:0": np.load("ids.npy")})
            # The imported graph's training op keeps training the restored tables.
            gs = tf.compat.v1.train.get_global_step()
            step0 = sess.run(gs)
            sess.run("train", {"ids:0": np.load("ids.npy")})
            assert sess.run(gs) == step0 + 1
            assert not np.allclose(sess.run("pred:0", {"ids:0": np.load("ids.npy")}), got)
        np.save("got.npy", got)
    """
        % (prefix + ".meta", prefix),
        tmp_path,
    )
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), expected, rtol=1e-6)


def _free_port():
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ps_task_that_only_imports_tensorflow_ext_hosts_tables(tmp_path):
    """A ps process started with a plain import holds the tables a worker trains through replica_device_setter."""
    ps_addr, worker_addr = "127.0.0.1:%d" % _free_port(), "127.0.0.1:%d" % _free_port()
    cluster = {"ps": [ps_addr], "worker": [worker_addr]}
    ps_code = textwrap.dedent(
        """
        import tensorflow as tf
        import tensorflow_ext
        server = tf.distribute.Server(tf.train.ClusterSpec(%r), job_name="ps", task_index=0, start=True)
        print("ps ready", flush=True)
        server.join()
    """
        % cluster
    )
    ps = subprocess.Popen(
        [sys.executable, "-c", ps_code],
        cwd=str(tmp_path),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + TIMEOUT_S
        line = ""
        while "ps ready" not in line:
            assert ps.poll() is None, "ps task exited: %s" % ps.stdout.read()[-3000:]
            assert time.time() < deadline, "ps task did not start"
            line = ps.stdout.readline()
        out = _run_python(
            """
            import numpy as np
            import tensorflow as tf
            import tensorflow_ext as tf_ext
            tf.compat.v1.disable_v2_behavior()
            cluster = tf.train.ClusterSpec(%r)
            worker = tf.distribute.Server(cluster, job_name="worker", task_index=0, start=True)
            def build():
                with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(cluster=cluster)):
                    gs = tf.compat.v1.train.get_or_create_global_step()
                    emb = tf_ext.get_dynamic_embedding("ps_emb", 4)
                    ids = tf.constant([1, 2, 3, -4], tf.int64)
                    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 1.0))
                    train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss, global_step=gs)
                return emb, loss, train

            with tf.Graph().as_default():
                emb, loss, train = build()
                assert emb.shards[0].device.startswith("/job:ps"), emb.shards[0].device
                with tf.compat.v1.Session(worker.target) as sess:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    first = sess.run(loss)
                    for _ in range(5):
                        sess.run(train)
                    last = sess.run(loss)
            # A second client graph naming the same table reads what the worker trained on the ps task.
            with tf.Graph().as_default():
                same, _, _ = build()
                with tf.compat.v1.Session(worker.target) as sess:
                    size = sess.run(same.size())
            print("losses", first, last, "size", size)
            assert last < first and size == 4
        """
            % cluster,
            tmp_path,
        )
        assert "size 4" in out
    finally:
        ps.kill()
        ps.wait(timeout=30)
