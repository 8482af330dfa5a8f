"""Imports Horovod's TensorFlow bindings, or says how to install them."""

INSTALL_HINT = (
    "tensorflow_ext.horovod needs Horovod 0.28.1 built with TensorFlow support. In a source checkout run "
    "`make horovod`; elsewhere: HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 "
    "pip install --no-build-isolation horovod==0.28.1 (with the system cmake 3.x on PATH)."
)


def require_horovod():
    """Returns `horovod.tensorflow`.

    Raises:
      ImportError: Horovod (with its TensorFlow bindings) is not installed; the message names the install step.
    """
    try:
        import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError("%s (%s)" % (INSTALL_HINT, e)) from e
    return hvd
