"""Test isolation shared by every test directory: TensorFlow's process-wide modes, restored after each test.

A test that runs a program's entry point in-process (the ctr example's `main` turns resource variables on, as
its users want) would otherwise change how every later test of the same pytest worker builds its variables, and
which tests a worker runs after which depends on the scheduling.
"""

import pytest


@pytest.fixture(autouse=True)
def _restore_resource_variables_mode():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    enabled = tf.compat.v1.resource_variables_enabled()
    yield
    if tf.compat.v1.resource_variables_enabled() != enabled:
        if enabled:
            tf.compat.v1.enable_resource_variables()
        else:
            tf.compat.v1.disable_resource_variables()
