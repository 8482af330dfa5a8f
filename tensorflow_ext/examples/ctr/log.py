"""What the CTR example prints, and what TensorFlow may print while it runs.

The example's own lines go to stderr with a ``ctr: `` prefix (stdout carries only the JSON summary, as its
last line). TensorFlow's Python-side chatter is scoped to a run by :func:`tf_chatter`.
"""

import contextlib
import sys
import warnings

import tensorflow as tf

from tensorflow_ext.tf_compat import graph_edits


def say(message, *args):
    """One line of the example's own output (stderr; stdout is for the JSON summary)."""
    print("ctr: " + (message % args if args else message), file=sys.stderr, flush=True)


def mib(num_bytes):
    """``num_bytes`` as ``"12.3 MiB"``."""
    return "%.1f MiB" % (num_bytes / float(1 << 20))


@contextlib.contextmanager
def tf_chatter(verbose):
    """TensorFlow's Python-side logs for the run: all of them if verbose, else warnings only.

    The example uses TF1 APIs on purpose (Estimator, feature columns, ``tf.compat.v1``), each
    of which logs a deprecation warning on first use; those and the Estimator's INFO lines
    are turned off for the run unless ``verbose``, and the previous settings come back after.
    """
    old_verbosity = tf.compat.v1.logging.get_verbosity()
    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as quiet:
            if verbose:
                tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
            else:
                tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
                quiet.enter_context(graph_edits.deprecation_warnings_silenced())
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", PendingDeprecationWarning)
            yield
    finally:
        tf.compat.v1.logging.set_verbosity(old_verbosity)
