"""An updatable SavedModel loaded for serving: predict, apply an update, read the served version.

`ServedModel` is what the follower (`tensorflow_ext.serving.follow`) applies a trainer's updates to and predicts
with; it uses only the SavedModel's signatures (`tf_ext_apply_update`, `tf_ext_served_version` and the model's own),
so any live export (`freeze_for_serving(live_model=...)`) loads.
"""

import re

import numpy as np
import tensorflow as tf

from tensorflow_ext.serving.live import APPLY_SIGNATURE
from tensorflow_ext.serving.live import APPLY_UPDATE_DIR
from tensorflow_ext.serving.live import VERSION_SIGNATURE

__all__ = ["DEFAULT_SIGNATURE", "ServedModel", "op_message"]

DEFAULT_SIGNATURE = "serving_default"


def op_message(error):
    """An error's own message: for an OpError without what TensorFlow puts around it (a leading "Graph execution
    error" with the node's Python stack up to its "Node: '...'" line, the trailing "[[{{node ...}}]]")."""
    message = error.message if isinstance(error, tf.errors.OpError) else str(error)
    message = message.split("\n\t [[")[0]
    nodes = list(re.finditer(r"(^|\n)Node: '[^'\n]*'\n", message))
    if nodes:
        message = message[nodes[-1].end() :]
    return message.strip()


class ServedModel(object):
    """An updatable SavedModel loaded in its own Graph and Session: predict, apply an update, read the version.

    Thread-safe: predictions, applies and version reads may run at the same time from any threads (the model pins
    one version per Session.run and serializes applies).

    Args:
      saved_model_dir: the SavedModel's directory (an export made inside `freeze_for_serving(live_model=...)`).
      tags: the MetaGraph's tags.
      config: an optional `tf.compat.v1.ConfigProto` for the Session.

    Raises:
      ValueError: the SavedModel has no `tf_ext_apply_update` or `tf_ext_served_version` signature (it is not
        updatable), naming the directory and the signatures it has.
    """

    def __init__(self, saved_model_dir, tags=("serve",), config=None):
        self.saved_model_dir = saved_model_dir
        self._graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=self._graph, config=config)
        try:
            with self._graph.as_default():
                meta = tf.compat.v1.saved_model.loader.load(self._session, list(tags), saved_model_dir)
            self._signatures = dict(meta.signature_def)
            missing = [s for s in (APPLY_SIGNATURE, VERSION_SIGNATURE) if s not in self._signatures]
            if missing:
                raise ValueError(
                    "the SavedModel %s is not updatable: it has no %s signature (it has %s); export it inside "
                    "tf_ext.serving.freeze_for_serving(live_model=...)"
                    % (saved_model_dir, " or ".join(missing), sorted(self._signatures))
                )
            apply_sig = self._signatures[APPLY_SIGNATURE]
            self._apply_feed = apply_sig.inputs[APPLY_UPDATE_DIR].name
            self._apply_fetches = [apply_sig.outputs["version"].name, apply_sig.outputs["applied"].name]
            self._version_fetch = self._signatures[VERSION_SIGNATURE].outputs["version"].name
            handles = [op for op in self._graph.get_operations() if op.type == "TfExtLiveModelHandle"]
            # The live model's name and layout lines (update_format), for messages and the status endpoint.
            self.model_name = handles[0].get_attr("model_name").decode() if len(handles) == 1 else None
            self.layout = handles[0].get_attr("layout").decode() if len(handles) == 1 else None
        except BaseException:
            self._session.close()
            raise

    @property
    def session(self):
        return self._session

    @property
    def graph(self):
        return self._graph

    @property
    def signature_def(self):
        """{signature name: SignatureDef} of the loaded MetaGraph."""
        return dict(self._signatures)

    def version(self):
        """The served version (the trainer's global step the model reflects)."""
        return int(self._session.run(self._version_fetch))

    def apply(self, update_dir):
        """Applies one update directory through `tf_ext_apply_update`: (version after it, applied).

        applied is False for a stale update (already reflected). Raises the model's errors as they are:
        InvalidArgumentError (another model, a layout that lacks the model's lines, bad shapes),
        FailedPreconditionError (a gap), DataLossError / NotFoundError / OutOfRangeError (a damaged bundle).
        """
        version, applied = self._session.run(self._apply_fetches, {self._apply_feed: update_dir})
        return int(version), bool(applied)

    def predict(self, feeds, signature=DEFAULT_SIGNATURE):
        """({output key: numpy value}, version) of one request: the outputs and the version they were computed at.

        Args:
          feeds: {input key of the signature: value}; values are converted to the input's dtype.
          signature: the signature's name.

        Raises:
          ValueError: an unknown signature, a missing or unknown input key (naming the signature's keys), or an
            input or output that is not a dense tensor.
          tf.errors.OpError: what the model raises (InvalidArgumentError for a value of the wrong shape).
        """
        sig = self._signatures.get(signature)
        if sig is None or signature in (APPLY_SIGNATURE, VERSION_SIGNATURE):
            raise ValueError(
                "no signature %r to predict with; the model has %s"
                % (signature, sorted(s for s in self._signatures if s not in (APPLY_SIGNATURE, VERSION_SIGNATURE)))
            )
        if not isinstance(feeds, dict):
            if len(sig.inputs) != 1:
                raise ValueError(
                    "signature %r has inputs %s: give a dict of them, got a %s"
                    % (signature, sorted(sig.inputs), type(feeds).__name__)
                )
            feeds = {next(iter(sig.inputs)): feeds}
        unknown = sorted(set(feeds) - set(sig.inputs))
        missing = sorted(set(sig.inputs) - set(feeds))
        if unknown or missing:
            raise ValueError(
                "signature %r has inputs %s; got unknown %s, missing %s"
                % (signature, sorted(sig.inputs), unknown, missing)
            )
        feed_dict = {}
        for key, value in feeds.items():
            info = sig.inputs[key]
            if not info.name:
                raise ValueError("input %r of signature %r is not a dense tensor" % (key, signature))
            feed_dict[info.name] = np.asarray(value, dtype=tf.as_dtype(info.dtype).as_numpy_dtype)
        keys = sorted(sig.outputs)
        for key in keys:
            if not sig.outputs[key].name:
                raise ValueError("output %r of signature %r is not a dense tensor" % (key, signature))
        # One run fetches the outputs and the served version: the model's one pin per run makes them one version.
        values = self._session.run([sig.outputs[k].name for k in keys] + [self._version_fetch], feed_dict)
        return dict(zip(keys, values[:-1])), int(values[-1])

    def close(self):
        self._session.close()
