"""Test set-up for dynamic embeddings: TF1 graph mode, one graph per test, small sessions."""

import os
import subprocess
import sys
import textwrap

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


@pytest.fixture
def graph():
    g = tf.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def sess(graph):
    with tf.compat.v1.Session(graph=graph, config=session_config()) as s:
        yield s
