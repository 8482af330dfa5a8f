"""TFRA's `dynamic_embedding` module under its own name: `tensorflow_ext.tfra` (the same functions and classes).

Code written against TFRA's package ports by changing its import line only:

    # import tensorflow_recommenders_addons as tfra
    import tensorflow_ext as tfra
    emb = tfra.dynamic_embedding.get_variable("user", dim=16)

    # from tensorflow_recommenders_addons import dynamic_embedding as de
    from tensorflow_ext import dynamic_embedding as de        # or: from tensorflow_ext import tfra as de

See `tensorflow_ext.tfra` and docs/migrating_from_tfra.md.
"""

from tensorflow_ext import tfra as _tfra
from tensorflow_ext.tfra import *  # noqa: F401,F403  pylint: disable=wildcard-import,unused-wildcard-import
from tensorflow_ext.tfra import __all__  # noqa: F401


def __getattr__(name):
    # TFRA names with no meaning here: the error says what to use instead.
    raise _tfra._not_provided(__name__, name)  # pylint: disable=protected-access


def __dir__():
    return sorted(set(globals()) | set(__all__))
