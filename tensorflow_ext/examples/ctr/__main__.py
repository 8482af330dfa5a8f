"""``python -m tensorflow_ext.examples.ctr``: runs the CTR example's command (:func:`cli.main`).

Also runnable as a script (``python tensorflow_ext/examples/ctr``, with tensorflow_ext importable); then it turns the
TF C++ runtime's info lines off before anything imports TensorFlow.
"""

import os
import sys


def _wants_verbose(argv):
    # Any unambiguous prefix of --verbose, as argparse accepts.
    return any(len(a) >= 3 and "--verbose".startswith(a) for a in argv)


def _quiet_tf_runtime_logs():
    """Turns the TF C++ runtime's info lines off when run as a script (unless --verbose or set).

    TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, at its first log line, which it writes while
    being imported; so this only works before TensorFlow is imported. Level 1: info lines off,
    warnings and errors still shown. (``python -m tensorflow_ext.examples.ctr`` imports the
    ``tensorflow_ext`` package, and with it TensorFlow, before this module runs: there TF's
    import lines stay unless the variable is set in the environment.)
    """
    if "tensorflow" not in sys.modules and not _wants_verbose(sys.argv[1:]):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


if __name__ == "__main__":
    _quiet_tf_runtime_logs()
    # Imported after the line above: this import brings TensorFlow in.
    from tensorflow_ext.examples.ctr import cli  # pylint: disable=g-import-not-at-top

    sys.exit(cli.main())
