"""Test set-up for dynamic embeddings: TF1 graph mode, one graph per test, small sessions."""

import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()


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
