"""The modes in which dynamic embeddings are built and checkpointed: frozen serving tables, SavedModel exports, and
the Saver's save or restore build.

* `freeze_for_serving()` / `freezing()`: embeddings created inside the scope (in this thread) are read-only serving
  tables (`tensorflow_ext.serving` re-exports both: that is where users find them).
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

__all__ = ["SaverBuild", "freeze_for_serving", "freezing", "in_saved_model_export", "saver_build"]

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
