"""Lazy loading of the op library _tf_ext_ops.so, with a TensorFlow version check.

    from tensorflow_ext.utils.loader import load_ops
    ops = load_ops()            # tf.load_op_library(...) module, loaded once
    ops.tf_ext_table_find(...)

The library sits next to the package (tensorflow_ext/_tf_ext_ops.so: in the wheel, or copied there by `make build`).
The build also writes tensorflow_ext/_build_info.py with the TF version it compiled against; loading under another
TF version raises errors.VersionMismatchError naming both versions, instead of an undefined-symbol traceback.
$TF_EXT_OPS_PATH overrides the library path (tests, debugging).
"""

import importlib
import os
import re
import threading

from tensorflow_ext import errors
from tensorflow_ext import version as _version

OPS_LIBRARY = "_tf_ext_ops.so"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_lock = threading.Lock()
_ops = None


def ops_library_path():
    """Returns where _tf_ext_ops.so is expected.

    Returns:
      The path in ``$TF_EXT_OPS_PATH`` if that is set and non-empty, else
      ``tensorflow_ext/_tf_ext_ops.so`` next to the package. The file may not
      exist.
    """
    return os.environ.get("TF_EXT_OPS_PATH") or os.path.join(_PACKAGE_DIR, OPS_LIBRARY)


def build_info():
    """Returns the build information written by the build.

    Returns:
      The ``tensorflow_ext._build_info`` module, or None when the package was
      not built (plain source checkout).
    """
    try:
        return importlib.import_module("tensorflow_ext._build_info")
    except ImportError:
        return None


def built_tf_version():
    """Returns the TensorFlow version the op library was built against.

    Returns:
      The version string (``_build_info.TF_VERSION``), or None when there is
      no build information or it records no version.
    """
    info = build_info()
    return getattr(info, "TF_VERSION", None) if info is not None else None


def _release(v):
    """'2.15.1' -> (2, 15, 1); tolerant of suffixes such as '2.15.0rc1' or '2.15.1+cpu'."""
    nums = []
    for part in str(v).split(".")[:3]:
        m = re.match(r"\d+", part)
        nums.append(int(m.group(0)) if m else 0)
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)


def check_tf_version(installed=None):
    """Checks that the installed TensorFlow can run the op library.

    The installed version must lie in the supported range
    (``version.MIN_TF_VERSION`` <= v < ``version.MAX_TF_VERSION_EXCLUSIVE``)
    and, when build information exists, equal the version the op library was
    built against.

    Args:
      installed: the TensorFlow version string to check; default: the
        imported ``tensorflow.__version__``.

    Returns:
      The installed version string.

    Raises:
      errors.VersionMismatchError: the version is outside the supported range
        or differs from the build's.
    """
    if installed is None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        installed = tf.__version__
    lo, hi = _release(_version.MIN_TF_VERSION), _release(_version.MAX_TF_VERSION_EXCLUSIVE)
    if not lo <= _release(installed) < hi:
        raise errors.VersionMismatchError(
            "tensorflow_ext %s supports TensorFlow %s (tensorflow-cpu or tensorflow), but TensorFlow %s is installed. "
            "Install e.g. `pip install tensorflow-cpu==2.15.1`."
            % (_version.__version__, _version.SUPPORTED_TF_VERSIONS, installed),
            installed=installed,
            expected=_version.SUPPORTED_TF_VERSIONS,
        )
    built = built_tf_version()
    if built is not None and built != installed:
        raise errors.VersionMismatchError(
            "tensorflow_ext's op library was built against TensorFlow %s, but TensorFlow %s is installed: "
            "reinstall the tensorflow_ext wheel built for TensorFlow %s, or rebuild it (`make build`)."
            % (built, installed, installed),
            installed=installed,
            expected=built,
        )
    return installed


def _looks_like_abi_error(err):
    text = str(err)
    return "undefined symbol" in text or "symbol lookup error" in text or "version `" in text


def load_ops():
    """Loads _tf_ext_ops.so once (thread-safe) and returns the op module.

    Later calls return the same module without checking again (until
    :func:`reset_for_tests`).

    Returns:
      The module returned by ``tf.load_op_library`` (one Python function per
      op, e.g. ``tf_ext_table_find``).

    Raises:
      errors.VersionMismatchError: the installed TensorFlow is unsupported or
        differs from the build's (see :func:`check_tf_version`), or loading
        failed with an ABI (undefined symbol) error.
      errors.OpLibraryNotFoundError: the library is not at
        :func:`ops_library_path`.
      OSError: other load failures (also ``tf.errors.NotFoundError``),
        re-raised unchanged.
    """
    global _ops
    if _ops is not None:
        return _ops
    with _lock:
        if _ops is not None:
            return _ops
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        installed = check_tf_version(tf.__version__)
        path = ops_library_path()
        if not os.path.exists(path):
            raise errors.OpLibraryNotFoundError(
                "tensorflow_ext's op library %s was not found. In a source checkout run `make build` (it builds "
                "the library with Bazel and copies it there); otherwise reinstall the tensorflow_ext wheel." % path
            )
        try:
            _ops = tf.load_op_library(path)
        except (OSError, tf.errors.NotFoundError) as e:
            if _looks_like_abi_error(e):
                built = built_tf_version() or "an unknown version"
                raise errors.VersionMismatchError(
                    "tensorflow_ext's op library %s does not match the installed TensorFlow %s (it was built against "
                    "TensorFlow %s): %s. Rebuild it (`make build`) or install the wheel built for TensorFlow %s."
                    % (path, installed, built, str(e).strip().splitlines()[0] if str(e).strip() else e, installed),
                    installed=installed,
                    expected=built,
                ) from e
            raise
        return _ops


def reset_for_tests():
    """Forgets the loaded module (tests only; TF cannot unload the library itself)."""
    global _ops
    with _lock:
        _ops = None
