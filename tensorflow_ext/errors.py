"""Exceptions raised by tensorflow_ext itself (TF ops raise tf.errors.* as usual)."""


class TfExtError(Exception):
    """Base class of tensorflow_ext's own errors."""


class VersionMismatchError(TfExtError, ImportError):
    """The installed TensorFlow is not the one the op library was built against (or is unsupported).

    Attributes: installed (tf.__version__), expected (the version the build recorded or the supported range).
    """

    def __init__(self, message, installed=None, expected=None):
        super().__init__(message)
        self.installed = installed
        self.expected = expected


class OpLibraryNotFoundError(TfExtError, ImportError):
    """_tf_ext_ops.so is missing (source checkout not built, or a broken install)."""


class NotProvidedError(TfExtError, AttributeError):
    """A name of TFRA's API (tensorflow_recommenders_addons) that tensorflow_ext does not provide.

    The message says what to use instead (or that nothing is needed). An AttributeError, so `hasattr()` is False and
    `getattr(module, name, default)` returns the default, as for any missing attribute.

    Attributes: name (the missing name), instead (what to use).
    """

    def __init__(self, message, name=None, instead=None):
        super().__init__(message, name=name)
        self.instead = instead
