"""Test helpers for the table ops: TF1 graph mode, one graph + session per test."""

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()


@pytest.fixture
def graph():
    g = tf.Graph()
    with g.as_default():
        yield g


def _make_session(graph, inter_op=2, intra_op=2):
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op, intra_op_parallelism_threads=intra_op)
    return tf.compat.v1.Session(graph=graph, config=config)


@pytest.fixture(name="make_session")
def make_session_fixture():
    """make_session(graph, inter_op=2, intra_op=2) -> a Session with those thread pools."""
    return _make_session


@pytest.fixture
def sess(graph):
    with _make_session(graph) as s:
        yield s
