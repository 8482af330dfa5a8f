"""The CTR example's serving export: how its tables store rows, and the AUC of the export as a server sees it.

* :func:`export_context`: the context the export is built in. ``--serve_frozen`` exports read-only frozen tables
  (``tf_ext.serving.freeze_for_serving``), ``--serve_dtype`` stores their rows as float32, bfloat16, float16 or int8
  rows (8 bits per column with a per-row scale and bias); the lookups of the served model decode the rows.
* :class:`ExportedModel`: an export loaded in a graph and session of its own, predicting in this process.
* :func:`served_auc`: loads an export in a fresh graph and session (as a serving process does: the SavedModel
  alone, nothing of the training graph) and computes the exact AUC of its ``probability`` output on the evaluation
  data. Beside the training job's own evaluation (the Estimator's AUC, read from the trained tables), it measures
  what the export's row format costs.
"""

import contextlib

import numpy as np
import tensorflow as tf

from tensorflow_ext import serving
from tensorflow_ext.examples import synthetic

_SERVING_SIGNATURE = "serving_default"


def export_context(serve_dtype, frozen, live_model=None):
    """The context to build the serving export in.

    Args:
      serve_dtype: the rows' storage dtype name ("float32", "bfloat16", "float16" or "int8"); None: as the trained
        tables store them.
      frozen: export read-only frozen tables instead of plain ones.
      live_model: the model name of an updatable (live) export of frozen tables (``--serve_live``'s start-of-day
        export); None: a plain export.

    Returns:
      A context manager; a null one for the default export (plain tables storing rows as the trained ones do).
    """
    dtype = None if serve_dtype is None else tf.as_dtype(serve_dtype)
    if live_model is not None:
        return serving.freeze_for_serving(value_dtype=dtype, live_model=live_model)
    if frozen:
        return serving.freeze_for_serving(value_dtype=dtype)
    if dtype is None:
        return contextlib.nullcontext()
    return serving.export_rows(dtype)


class ExportedModel(object):
    """An export loaded in a graph and session of its own (as a serving process loads it), predicting in process.

    Args:
      export_dir: a SavedModel written by the example (``serving_default`` takes the raw features, returns
        ``probability``).
    """

    def __init__(self, export_dir):
        self.export_dir = export_dir
        self._graph = tf.Graph()
        self._sess = tf.compat.v1.Session(graph=self._graph)
        with self._graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(self._sess, [tf.saved_model.SERVING], export_dir)
        signature = meta.signature_def[_SERVING_SIGNATURE]
        self._inputs = {key: self._graph.get_tensor_by_name(info.name) for key, info in signature.inputs.items()}
        self._probability = self._graph.get_tensor_by_name(signature.outputs["probability"].name)

    def predict(self, features):
        """float32 ``[n]``: the probabilities of the examples in ``features`` (a dict of ``[n]`` arrays by key)."""
        return self._sess.run(self._probability, {tensor: features[key] for key, tensor in self._inputs.items()})

    def close(self):
        self._sess.close()


def served_auc(export_dir, eval_input_fn):
    """The exact AUC of an export's predictions on the evaluation data, computed in a fresh graph and session.

    Args:
      export_dir: a SavedModel written by the example (``serving_default`` takes the raw features, returns
        ``probability``).
      eval_input_fn: the run's evaluation input function (a finite dataset of ``(features, labels)`` batches).

    Returns:
      ``(auc, examples)``: the AUC (:func:`synthetic.auc`, ties counted half) and how many examples it covers.
    """
    probabilities, labels = [], []
    model = ExportedModel(export_dir)
    try:
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            features, batch_labels = tf.compat.v1.data.make_one_shot_iterator(eval_input_fn()).get_next()
            while True:
                try:
                    feature_values, label_values = sess.run([features, batch_labels])
                except tf.errors.OutOfRangeError:
                    break
                probabilities.append(model.predict(feature_values))
                labels.append(label_values)
    finally:
        model.close()
    labels = np.concatenate(labels)
    return synthetic.auc(labels, np.concatenate(probabilities)), int(labels.size)
