"""The modes in which dynamic embeddings are built and checkpointed: frozen serving tables, SavedModel exports, and
the Saver's save or restore build.

* `freeze_for_serving(value_dtype, live_model)` / `freezing()`: embeddings created inside the scope (in this thread)
  are read-only serving tables (`tensorflow_ext.serving` re-exports both: that is where users find them).
  `live_model_name()` is the model name of the innermost such scope that gives one (`live_model`: an updatable
  export), which the SavedModel export reads (tensorflow_ext/serving/live.py; this module only records it).
* `export_rows(value_dtype)`: embeddings created inside the scope keep plain (mutable) tables whose embedding columns
  are stored as `value_dtype`, for a lean export. `serving_storage()` is the storage name the innermost of the two
  scopes asks for (both set it the same way: one mechanism for frozen and plain exports).
* `in_saved_model_export()`: whether TF's SavedModel export is on the call stack (the Builder's `add_meta_graph*`,
  the Estimator's export of a mode); the Savers built there write and read lean tables (keys and embeddings only).
* `saver_build()`: what the Saver being built in this thread asks a saveable for: its save tensors or its restore
  tensors, of a lean export or of a full checkpoint. TensorFlow's Saver has no argument that says so, so two
  tf_compat patches bracket its build (`saver_build_mode`) and its restore build (`saver_restore_build_mode`); the
  export is recognised once per Saver build, the first time a saveable asks (a Saver of other objects only never
  looks at the call stack). A saveable reads the answer as a plain value.

Invariant: outside a Saver build `saver_build()` is None; inside one it is one `SaverBuild` for the whole build (its
restore build included), whose `lean` never changes once read, and whose `restoring` is True exactly while the Saver
builds its restore ops.
"""

import contextlib
import threading

from tensorflow_ext import tf_compat
from tensorflow_ext.table import refs

__all__ = [
    "SaverBuild",
    "export_rows",
    "freeze_for_serving",
    "freezing",
    "in_saved_model_export",
    "live_model_name",
    "saver_build",
    "serving_storage",
    "table_storage",
]

_state = threading.local()


def _serving_storage_name(value_dtype, scope):
    """The storage name of `value_dtype` for a serving export, or a ValueError naming the supported dtypes."""
    try:
        return refs.storage_name(value_dtype)
    except ValueError:
        raise ValueError(
            "%s(value_dtype=%r): serving rows are stored as one of %s"
            % (scope, value_dtype, ", ".join("tf." + refs.storage_dtype(name).name for name in refs.STORAGES))
        ) from None


@contextlib.contextmanager
def _serving_scope(frozen, storage, live_model=None):
    scopes = getattr(_state, "serving_scopes", [])
    _state.serving_scopes = scopes + [(frozen, storage, live_model)]
    try:
        yield
    finally:
        _state.serving_scopes = scopes


# The patch of tensorflow_ext/serving/live.py that makes a Builder export updatable (this layer cannot import it).
_LIVE_EXPORT_PATCH = "live_model_add_meta_graph_and_variables"


@contextlib.contextmanager
def freeze_for_serving(value_dtype=None, live_model=None):
    """Dynamic embeddings created inside this scope (in this thread) are frozen read-only serving tables.

    Use it around `Estimator.export_saved_model(...)`, or around the building of an inference graph that a
    `tf.compat.v1.saved_model.Builder` exports. The export's restore builds each frozen table from the checkpoint's
    keys and embedding values; the SavedModel then loads into frozen tables in any process that imported
    tensorflow_ext.

    With `live_model`, a SavedModel exported inside the scope is updatable: the process serving it applies the
    serving updates of that model (`tf_ext.serving.apply_update`, or its `tf_ext_apply_update` signature) to its
    frozen tables and to the variables its signatures read, and each request reads them all at one version
    (`tensorflow_ext.serving.live`). Export the Builder's graph inside the scope too (not only build it).

    Args:
      value_dtype: how the frozen tables store their rows: tf.float32, tf.bfloat16, tf.float16 (rounded to
        nearest) or tf.int8 (int8 rows: a uint8 per column plus a per-row fp16 scale and bias; every value within
        scale / 2 of the trained one). None: the embedding's own `value_dtype` (tf.float32 unless it was created
        with another). Lookups return float32 rows whatever the storage.
      live_model: None, or the name of the model whose serving updates the export applies (a non-empty str
        without whitespace: the trainer's `ServingUpdateWriter(model_name=)`).

    Yields:
      None.

    Raises:
      ValueError: another dtype, naming the supported ones; a `live_model` that is not a non-empty str without
        whitespace, or one inside `export_rows()` (a live model updates frozen tables only).
      RuntimeError: `live_model` before `tensorflow_ext.serving` was imported (it installs the live export).
    """
    storage = None if value_dtype is None else _serving_storage_name(value_dtype, "freeze_for_serving")
    if live_model is not None:
        if not isinstance(live_model, str) or not live_model or any(c.isspace() for c in live_model):
            raise ValueError(
                "freeze_for_serving(live_model=%r): the model name must be a non-empty str without whitespace (as "
                "the trainer's ServingUpdateWriter(model_name=) is)" % (live_model,)
            )
        if any(not frozen for frozen, _, _ in getattr(_state, "serving_scopes", [])):
            raise ValueError(
                "freeze_for_serving(live_model=%r) inside export_rows(): a live model updates frozen tables only, "
                "and the plain tables of export_rows() are not updated; use freeze_for_serving(value_dtype=..., "
                "live_model=...) alone" % live_model
            )
        if not tf_compat.is_installed(_LIVE_EXPORT_PATCH):
            raise RuntimeError(
                "freeze_for_serving(live_model=%r): import tensorflow_ext.serving first (tf_ext.serving."
                "freeze_for_serving does), which installs the live export" % live_model
            )
    with _serving_scope(True, storage, live_model):
        yield


@contextlib.contextmanager
def export_rows(value_dtype):
    """Dynamic embeddings created inside this scope (in this thread) store their embedding columns as
    `value_dtype` in plain (lean-export) tables: the same choice as `freeze_for_serving(value_dtype)`, for an export
    that keeps mutable tables.

    Args:
      value_dtype: tf.float32, tf.bfloat16, tf.float16 or tf.int8 (as for `freeze_for_serving`). A table with int8
        rows is a serving table: it is never trained (applying an optimizer to it is an error).

    Yields:
      None.

    Raises:
      ValueError: another dtype, naming the supported ones; inside `freeze_for_serving(live_model=...)`.
    """
    storage = _serving_storage_name(value_dtype, "export_rows")
    if live_model_name() is not None:  # (also when an inner scope names no model: the plain tables stay plain)
        raise ValueError(
            "export_rows(%r) inside freeze_for_serving(live_model=%r): a live model updates frozen tables only, and "
            "the plain tables of export_rows() would not be updated; use freeze_for_serving(value_dtype=...) for "
            "compact rows" % (value_dtype, live_model_name())
        )
    with _serving_scope(False, storage):
        yield


def freezing():
    """True when the innermost serving scope of this thread is `freeze_for_serving()`.

    Returns:
      bool.
    """
    scopes = getattr(_state, "serving_scopes", [])
    return bool(scopes) and scopes[-1][0]


def live_model_name():
    """The model name of the innermost `freeze_for_serving(live_model=...)` scope of this thread (scopes inside it
    that name none keep it), else None: a SavedModel exported now is updatable with that model's serving updates.

    Returns:
      str or None.
    """
    names = [live for _, _, live in getattr(_state, "serving_scopes", []) if live is not None]
    return names[-1] if names else None


def serving_storage():
    """The storage name ("float32", "bfloat16", "float16", "int8_row") the innermost serving scope of this thread
    asks for, or None (outside both scopes, or inside `freeze_for_serving()` with no value_dtype: the embedding's
    own storage).

    Returns:
      str or None.
    """
    scopes = getattr(_state, "serving_scopes", [])
    return scopes[-1][1] if scopes else None


def table_storage(storage, compact_slots, rounding):
    """(storage, compact_slots, rounding) of a table created now, from the embedding's own: inside a serving scope
    that names a value_dtype, its storage for the embedding columns, rounded to nearest (an export's rows are
    written once, by its restore), with float32 slot columns; else the embedding's own, unchanged.

    Returns:
      (str, bool, str).
    """
    serving = serving_storage()
    return (storage, compact_slots, rounding) if serving is None else (serving, False, "nearest")


def in_saved_model_export():
    """True when called (at any depth) from TF's SavedModel export: the Builder's `add_meta_graph*` or the
    Estimator's export of a mode. Savers built there are lean (see `tensorflow_ext.serving`).

    Returns:
      bool.
    """
    return tf_compat.probe("saved_model_export").active() or tf_compat.probe("estimator_export").active()


class SaverBuild(object):
    """The Saver being built in this thread.

    Attributes:
      restoring: the Saver is building its restore ops (else its save ops).
    """

    def __init__(self):
        self.restoring = False
        self._lean = None

    @property
    def lean(self):
        """True when the Saver belongs to a SavedModel export (it writes and reads keys and embeddings only).

        Recognised by the export's caller probes the first time it is read, inside the build (the export's frames
        are below it on the stack), and kept for the rest of the build."""
        if self._lean is None:
            self._lean = in_saved_model_export()
        return self._lean


def saver_build():
    """The `SaverBuild` of the Saver being built in this thread, or None outside a Saver build."""
    return getattr(_state, "saver_build", None)


@tf_compat.register(
    "saver_build_mode",
    "tensorflow.python.training.saver",
    "BaseSaverBuilder",
    "_build_internal",
    why="A dynamic-embedding shard's saveable writes other tensors for a SavedModel export's Saver (keys and "
    "embeddings only) than for a training Saver (rows, slots, metadata, layout record), and TF's Saver builder asks "
    "a saveable for its specs with no argument saying which Saver asks. The replacement runs the build with a "
    "`SaverBuild` for this thread (the export recognised once, by its caller probes, when a saveable first asks), "
    "so the saveables read the answer as a value; other saveables are unaffected.",
    test="tensorflow_ext/serving/tests/test_serving_export.py::test_saved_model_holds_embedding_columns_only",
)
def _make_build_internal(original):

    def _build_internal(self, *args, **kwargs):
        outer = saver_build()
        _state.saver_build = SaverBuild()
        try:
            return original(self, *args, **kwargs)
        finally:
            _state.saver_build = outer

    return _build_internal


@tf_compat.register(
    "saver_restore_build_mode",
    "tensorflow.python.training.saver",
    "BaseSaverBuilder",
    "_AddRestoreOps",
    why="A dynamic-embedding shard saves its row-layout record, but checkpoints written before the record existed "
    "lack it, and the Saver restores every spec in one RestoreV2 that fails on a missing tensor. The replacement "
    "marks the Saver's restore build (every restore op of a Saver, sharded or not, is built here), during which "
    "the shard's saveable leaves the record out of its specs and reads it itself, if present.",
    test="tensorflow_ext/embedding/tests/test_de_checkpoint_layout.py::"
    "test_old_checkpoint_without_layout_record_restores_with_a_warning",
)
def _make_add_restore_ops(original):

    def _AddRestoreOps(self, *args, **kwargs):  # pylint: disable=invalid-name
        outer = saver_build()
        build = outer if outer is not None else SaverBuild()  # the same build's restore part: the same `lean`
        restoring = build.restoring
        build.restoring = True
        _state.saver_build = build
        try:
            return original(self, *args, **kwargs)
        finally:
            build.restoring = restoring
            _state.saver_build = outer

    return _AddRestoreOps


tf_compat.install("saver_build_mode", "saver_restore_build_mode")
