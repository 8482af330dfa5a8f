"""Test set-up for dynamic embeddings: TF1 graph mode, one graph per test, small sessions."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()


def run_fresh(code, cwd, timeout=300, env=None, with_stderr=False):
    """Runs `code` (dedented) in a fresh interpreter that imports only what it imports; returns its stdout.

    For the scenarios that happen in a new process (export then load, restore, warm start). The timeout guards
    against hangs only. `env`: variables added to the interpreter's environment. `with_stderr`: return
    (stdout, stderr), for tests of what it logs."""
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=str(cwd),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, "fresh process failed:\n%s\n%s" % (proc.stdout[-3000:], proc.stderr[-6000:])
    return (proc.stdout, proc.stderr) if with_stderr else proc.stdout


def session_config():
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)


def write_shard_tensors_checkpoint(path, keys, where, truth, num_shards):
    """Writes, with a plain Saver of tf.Variables (in a graph of its own), the tensors of a num_shards-shard Adagrad
    embedding "emb" whose shard i's tensors hold the keys with where == i and their values, slots, versions and freqs
    (arrays aligned with keys, from the dict truth). Returns the checkpoint's path (what Saver.save returns)."""
    with tf.Graph().as_default():
        var_list = {}
        for i in range(num_shards):
            m = where == i
            for suffix, value in (
                ("keys", keys[m]),
                ("values", truth["values"][m]),
                ("slots", truth["slots"][m]),
                ("versions", truth["versions"][m]),
                ("freqs", truth["freqs"][m]),
                ("num_shards", np.int64(num_shards)),
            ):
                name = "emb/part_%d-%s" % (i, suffix)
                var_list[name] = tf.compat.v1.get_variable("v%d_%s" % (i, suffix), initializer=tf.constant(value))
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, path)


@pytest.fixture
def graph():
    g = tf.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def sess(graph):
    with tf.compat.v1.Session(graph=graph, config=session_config()) as s:
        yield s
