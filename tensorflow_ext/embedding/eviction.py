"""Eviction of stale or rare keys from dynamic embeddings.

A key's metadata tells when it was last trained (its version = the global step
of its last training lookup or update) and how often it was looked up in
training (its frequency). An eviction policy removes, from every shard:

* with `steps_to_live=N`: keys whose version < global_step - N (not trained in
  the last N steps);
* with `min_frequency=F`: keys looked up in training fewer than F times.

Removed keys lose their embedding and optimizer slots; if they come back they
start again from the initializer. Eviction runs where the model is saved:
`EvictionSaverListener` runs it right before each checkpoint save (pass it to
`Estimator.train(saving_listeners=...)` or a `CheckpointSaverHook`), so
checkpoints never carry evicted keys; `EvictionHook` runs it every N steps in
any MonitoredSession. `evict()` builds the op for manual use.
"""

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding import variable as var_lib

__all__ = ["evict", "restrict", "EvictionSaverListener", "EvictionHook"]


def _check_policy(steps_to_live, min_frequency):
    if steps_to_live is None and min_frequency is None:
        raise ValueError("an eviction policy needs steps_to_live and/or min_frequency")
    if steps_to_live is not None and (not isinstance(steps_to_live, int) or steps_to_live < 0):
        raise ValueError("steps_to_live must be a non-negative int, got %r" % (steps_to_live,))
    if min_frequency is not None and (not isinstance(min_frequency, int) or min_frequency < 0):
        raise ValueError("min_frequency must be a non-negative int, got %r" % (min_frequency,))


def evict(embeddings=None, steps_to_live=None, min_frequency=None, global_step=None, name=None):
    """Builds an op that evicts stale/rare keys from dynamic embeddings.

    Args:
      embeddings: a `DynamicEmbedding`, a list of them, or None (every dynamic
        embedding of the default graph).
      steps_to_live: remove keys whose version < global_step - steps_to_live.
      min_frequency: remove keys with frequency < min_frequency.
      global_step: the step tensor/variable (default: the graph's global step;
        required with steps_to_live).
      name: optional name scope.

    Returns:
      An int64 scalar tensor: the number of keys removed (all shards).

    Raises:
      ValueError: no policy, a bad policy value, or steps_to_live without a
        global step.
    """
    _check_policy(steps_to_live, min_frequency)
    if embeddings is None:
        embeddings = var_lib.get_dynamic_embeddings()
    elif isinstance(embeddings, var_lib.DynamicEmbedding):
        embeddings = [embeddings]
    with tf.name_scope(name or "tf_ext_evict"):
        if steps_to_live is not None:
            if global_step is None:
                global_step = tf.compat.v1.train.get_global_step()
            if global_step is None:
                raise ValueError("evict(steps_to_live=...) needs a global step")
            min_version = tf.cast(tf.convert_to_tensor(global_step), tf.int64) - steps_to_live
        else:
            min_version = tf.constant(-1, tf.int64)
        min_freq = tf.constant(-1 if min_frequency is None else min_frequency, tf.int64)
        removed = []
        for emb in embeddings:
            for shard in emb.shards:
                with tf_ops.colocate_with(shard.handle):
                    removed.append(_ops.op("tf_ext_table_evict")(shard.handle, min_version, min_freq))
        if not removed:
            return tf.constant(0, tf.int64)
        return tf.add_n(removed)


_RESTRICT_SCORES = {"timestamp": 3, "frequency": 4}  # index in ExportedEmbedding: versions, frequencies


def restrict(embedding, num_reserved, trigger=None, policy="timestamp", name=None):
    """Builds an op that keeps at most `num_reserved` keys of an embedding.

    When the embedding holds more than `trigger` keys (default: num_reserved),
    every key but the `num_reserved` best is removed with its slots: the most
    recently trained ones (policy "timestamp": highest version) or the most
    frequently looked up ones (policy "frequency"). Ties are broken arbitrarily.
    This is TFRA's `Variable.restrict(num_reserved, trigger=...)` with its
    Timestamp/Frequency restrict policies, without the policy's extra tables:
    the version and frequency live in each row.

    Args:
      embedding: a `DynamicEmbedding`.
      num_reserved: int >= 0, the number of keys kept.
      trigger: int >= num_reserved or None; the op does nothing while the
        embedding holds at most `trigger` keys.
      policy: "timestamp" or "frequency".
      name: optional name scope.

    Returns:
      An int64 scalar tensor: the number of keys removed.

    Raises:
      ValueError: bad num_reserved, trigger or policy.
    """
    if not isinstance(embedding, var_lib.DynamicEmbedding):
        raise TypeError("restrict needs a tf_ext DynamicEmbedding, got %r" % (embedding,))
    if isinstance(num_reserved, bool) or not isinstance(num_reserved, int) or num_reserved < 0:
        raise ValueError("num_reserved must be a non-negative int, got %r" % (num_reserved,))
    if trigger is None:
        trigger = num_reserved
    if isinstance(trigger, bool) or not isinstance(trigger, int) or trigger < num_reserved:
        raise ValueError("trigger must be an int >= num_reserved (%d), got %r" % (num_reserved, trigger))
    if policy not in _RESTRICT_SCORES:
        raise ValueError("policy must be one of %s, got %r" % (sorted(_RESTRICT_SCORES), policy))
    with tf.name_scope(name or "tf_ext_restrict"):
        exported = embedding.export()
        keys, scores = exported[0], exported[_RESTRICT_SCORES[policy]]
        n = tf.size(keys)

        def _remove_all_but_best():
            _, keep = tf.math.top_k(scores, k=tf.minimum(n, num_reserved), sorted=False)
            drop = tf.tensor_scatter_nd_update(
                tf.ones([n], tf.bool), tf.expand_dims(keep, 1), tf.zeros_like(keep, tf.bool)
            )
            return embedding.remove(tf.boolean_mask(keys, drop))

        return tf.cond(n > trigger, _remove_all_but_best, lambda: tf.constant(0, tf.int64))


class _EvictionPolicy(object):
    """The policy and the eviction op shared by the saver listener and the hook."""

    def _init_policy(self, embeddings, steps_to_live, min_frequency):
        _check_policy(steps_to_live, min_frequency)
        self._embeddings = embeddings
        self._steps_to_live = steps_to_live
        self._min_frequency = min_frequency
        self._op = None
        self.last_removed = None

    def begin(self):
        """Builds the eviction op (called once, before the graph is finalized).

        Raises:
          ValueError: `steps_to_live` was given and the graph has no global step.
        """
        self._op = evict(self._embeddings, self._steps_to_live, self._min_frequency)


class EvictionSaverListener(_EvictionPolicy, tf.compat.v1.train.CheckpointSaverListener):
    """Evicts keys right before every checkpoint save (see module docstring).

    Example:
      est.train(input_fn, saving_listeners=[
          tf_ext.embedding.EvictionSaverListener(steps_to_live=10000)])

    Args:
      embeddings: a `DynamicEmbedding`, a list of them, or None (every dynamic
        embedding of the graph when `begin` runs).
      steps_to_live: remove keys whose version < global_step - steps_to_live.
      min_frequency: remove keys with frequency < min_frequency.

    Attributes:
      last_removed: the number of keys removed before the last save (None
        before the first save).

    Raises:
      ValueError: no policy (neither `steps_to_live` nor `min_frequency`), or a
        policy value that is not a non-negative int.
    """

    def __init__(self, embeddings=None, steps_to_live=None, min_frequency=None):
        self._init_policy(embeddings, steps_to_live, min_frequency)

    def before_save(self, session, global_step_value):
        """Runs the eviction op, sets `last_removed` and logs the count.

        Args:
          session: the `tf.compat.v1.Session` about to be saved.
          global_step_value: the global step of the checkpoint (for the log).
        """
        self.last_removed = int(session.run(self._op))
        tf.compat.v1.logging.info(
            "tf_ext: evicted %d keys from dynamic embeddings at step %d", self.last_removed, global_step_value
        )


class EvictionHook(_EvictionPolicy, tf.compat.v1.train.SessionRunHook):
    """Evicts keys after every `every_n_steps`-th `run` call of the session.

    Args:
      every_n_steps: positive int: evict after every N-th `session.run` (counted
        by this hook, not by the global step).
      embeddings: a `DynamicEmbedding`, a list of them, or None (every dynamic
        embedding of the graph when `begin` runs).
      steps_to_live: remove keys whose version < global_step - steps_to_live.
      min_frequency: remove keys with frequency < min_frequency.

    Attributes:
      last_removed: the number of keys removed by the last eviction (None
        before the first one).

    Raises:
      ValueError: no policy, a bad policy value, or `every_n_steps` not a
        positive int.
    """

    def __init__(self, every_n_steps, embeddings=None, steps_to_live=None, min_frequency=None):
        self._init_policy(embeddings, steps_to_live, min_frequency)
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError("every_n_steps must be a positive int, got %r" % (every_n_steps,))
        self._every = every_n_steps
        self._runs = 0

    def after_run(self, run_context, run_values):
        """Counts the run; every `every_n_steps`-th one runs the eviction op.

        Sets `last_removed` to the number of keys removed.

        Args:
          run_context: the `tf.compat.v1.train.SessionRunContext`; its session
            runs the eviction op.
          run_values: the `tf.compat.v1.train.SessionRunValues` (unused).
        """
        self._runs += 1
        if self._runs % self._every == 0:
            self.last_removed = int(run_context.session.run(self._op))
