"""Test set-up for the graph passes: TF1 graph mode, the repository first on sys.path."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()
