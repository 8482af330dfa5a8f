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

**Live models (opt in).** A SavedModel exported inside `freeze_for_serving(live_model="<model name>")` is
updatable: the serving process applies the trainer's serving updates of that model (changed rows, removed keys,
dense variables; see `tensorflow_ext.serving.update_format`) in place, through `apply_update(sess, update_dir)` or
the SavedModel's `tf_ext_apply_update` signature (input `update_dir`, outputs `version` and `applied`), from any
runtime that loaded it with tensorflow_ext's ops. Every request reads all tables and variables at one version;
`served_version()` in a model_fn (or the `tf_ext_served_version` signature) tells which: the trainer's global step
of the last update applied, or the checkpoint's before any. See `tensorflow_ext.serving.live`.
`follow(saved_model_dir, updates_dir)` (or `python -m tensorflow_ext.serving.follow`, which also serves HTTP) loads
such an export and applies a trainer's updates as they come, in order; see `tensorflow_ext.serving.follow`.
"""

from tensorflow_ext.embedding.export_mode import export_rows
from tensorflow_ext.embedding.export_mode import freeze_for_serving
from tensorflow_ext.embedding.export_mode import freezing
from tensorflow_ext.embedding.export_mode import in_saved_model_export
from tensorflow_ext.serving.live import apply_update
from tensorflow_ext.serving.live import served_version
from tensorflow_ext.serving.updates import ServingUpdateHook
from tensorflow_ext.serving.updates import ServingUpdateListener
from tensorflow_ext.serving.updates import ServingUpdateWriter

__all__ = ["apply_update", "export_rows", "freeze_for_serving", "freezing", "in_saved_model_export", "served_version"]
# The trainer's side of live models: serving updates written every N seconds/steps or after each checkpoint.
__all__ += ["ServingUpdateHook", "ServingUpdateListener", "ServingUpdateWriter"]

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
