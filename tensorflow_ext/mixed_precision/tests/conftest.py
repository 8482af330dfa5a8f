"""Test setup: repository root on sys.path, TF1 graph mode."""

import os
import sys
import warnings

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", message=".*tf.layers.*deprecated.*")

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:.*tf.layers.*deprecated")


if os.environ.get("TF_EXT_RESOURCE_VARIABLES") == "1":  # run the suite on resource variables
    tf.compat.v1.enable_resource_variables()
