"""Serving exports of dynamic embeddings: lean SavedModel tables, and the frozen read-only form.

**Lean exports (always).** A SavedModel written by `Estimator.export_saved_model` or by
`tf.compat.v1.saved_model.Builder.add_meta_graph_and_variables` / `add_meta_graph` (and `simple_save`, which uses
the Builder) holds, per table shard, only `<shard>-keys`, `<shard>-values` and `<shard>-num_shards`: no optimizer
slots, versions or frequencies. The Savers built by these exports read the same three tensors from a training
checkpoint, and the SavedModel's loader restores them. A `tf.compat.v1.train.Saver` built anywhere else keeps writing
full checkpoints.

**Frozen exports (opt in).** Embeddings created inside `freeze_for_serving()` are read-only serving tables
(`TfExtFrozenTable*` ops over the C++ `table::FrozenTable`): keys and values in flat arrays with no per-key
metadata, no growth headroom and no locks on lookups. Wrap the export in it::

    with tf_ext.serving.freeze_for_serving():
        estimator.export_saved_model(export_base, serving_input_receiver_fn)

or build the inference graph of a Builder export inside it. Lookups of a frozen embedding return the rows of known
keys and the initializer's constant (zeros for random initializers) for other keys; nothing can insert, update or
remove a key of a frozen table, and applying an optimizer to one is a ValueError.
"""

import contextlib
import threading

from tensorflow_ext import tf_compat

__all__ = ["freeze_for_serving", "freezing", "in_saved_model_export"]

_state = threading.local()


@contextlib.contextmanager
def freeze_for_serving():
    """Dynamic embeddings created inside this scope (in this thread) are frozen read-only serving tables.

    Use it around `Estimator.export_saved_model(...)`, or around the building of an inference graph that a
    `tf.compat.v1.saved_model.Builder` exports. The export's restore builds each frozen table from the checkpoint's
    keys and embedding values; the SavedModel then loads into frozen tables in any process that imported
    tensorflow_ext.

    Yields:
      None.
    """
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def freezing():
    """True inside `freeze_for_serving()` (in this thread).

    Returns:
      bool.
    """
    return getattr(_state, "depth", 0) > 0


def in_saved_model_export():
    """True when called (at any depth) from TF's SavedModel export: the Builder's `add_meta_graph*` or the
    Estimator's export of a mode. Savers built there are lean (see the module docstring).

    Returns:
      bool.
    """
    return tf_compat.probe("saved_model_export").active() or tf_compat.probe("estimator_export").active()
