"""The op-library switches of the dynamic embedding Python layer: fused kernels or the generic path.

The ops themselves are reached through typed wrappers: table ops through a shard's table ref
(``tensorflow_ext.table.refs``), the fused embedding ops through ``embedding_ops`` or the op library that
``tensorflow_ext.utils.loader`` loads.

The layer has two paths that must agree: the fused embedding ops, and a generic path built from table ops
(find, apply the formula in-graph, insert). ``TF_EXT_EMBEDDING_FORCE_GENERIC=1`` (or :func:`force_generic`) makes
new graphs take the generic path, which tests use to check both paths against each other.

Pooled lookups (``embedding_lookup_sparse``, ``safe_embedding_lookup_sparse``, feature columns) of one-shard
embeddings without weights are one op per feature (``TfExtEmbeddingLookupSparse``).
``TF_EXT_EMBEDDING_FUSED_SPARSE=0`` (or :func:`set_fused_sparse`) makes new graphs build them from TensorFlow's
sparse ops around a lookup instead (same results), for A/B comparisons.
"""

import os

_force_generic = os.environ.get("TF_EXT_EMBEDDING_FORCE_GENERIC") == "1"


def force_generic(value=True):
    """Makes new graphs use the table-op (generic) paths instead of the fused ops.

    Args:
      value: bool.

    Returns:
      The previous setting.
    """
    global _force_generic
    old = _force_generic
    _force_generic = bool(value)
    return old


_fused_sparse = os.environ.get("TF_EXT_EMBEDDING_FUSED_SPARSE", "1") != "0"


def set_fused_sparse(value=True):
    """Makes new graphs build pooled lookups as one op per feature (True, the default) or from TensorFlow's
    sparse ops (False).

    Args:
      value: bool.

    Returns:
      The previous setting.
    """
    global _fused_sparse
    old = _fused_sparse
    _fused_sparse = bool(value)
    return old


def use_fused_sparse():
    """True if pooled lookups are built as one op per feature (see :func:`set_fused_sparse`)."""
    return _fused_sparse and use_fused()


def use_fused():
    """True unless the generic path is forced (see :func:`force_generic`)."""
    return not _force_generic
