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

**Compact rows (opt in).** `freeze_for_serving(value_dtype=...)` stores the frozen rows as tf.float32, tf.bfloat16,
tf.float16 (rounded to nearest) or tf.int8 (int8 rows: a uint8 per column plus a per-row fp16 scale and bias, every
value within scale / 2 of the trained one); `export_rows(value_dtype)` makes the same choice for a lean export's
plain tables. Lookups decode inside the kernel and return float32 rows; a table of int8 rows is never trained.
"""

from tensorflow_ext.embedding.export_mode import export_rows
from tensorflow_ext.embedding.export_mode import freeze_for_serving
from tensorflow_ext.embedding.export_mode import freezing
from tensorflow_ext.embedding.export_mode import in_saved_model_export

__all__ = ["export_rows", "freeze_for_serving", "freezing", "in_saved_model_export"]

# The follower (live models): imported on first use, so that `python -m tensorflow_ext.serving.follow` runs a module
# its package has not imported yet. The module is callable: `follow(...)` is `follow.follow(...)`.
_FOLLOW_NAMES = ("follow", "Follower", "ServedModel")
__all__ += list(_FOLLOW_NAMES)


def __getattr__(name):  # PEP 562
    if name in _FOLLOW_NAMES:
        import importlib  # pylint: disable=import-outside-toplevel

        module = importlib.import_module("tensorflow_ext.serving.follow")
        return module if name == "follow" else getattr(module, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
