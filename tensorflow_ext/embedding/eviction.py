"""Eviction of stale, rare or weak keys from dynamic embeddings: one policy object, run in the training step
every N steps and before checkpoint saves.

    policy = tf_ext.embedding.EvictionPolicy(steps_to_live=100000, capacity=50000000, every_n_steps=1000)
    emb = tf_ext.get_dynamic_embedding("user", 16, eviction=policy)

A key's metadata says when it was last trained (its version = the global step of its last training lookup or
update) and how often it was looked up in training (its frequency). An `EvictionPolicy` removes, from every shard:

* `steps_to_live=N`: keys whose version < global_step - N (not trained in the last N steps);
* `min_frequency=F`: keys looked up in training fewer than F times;
* `min_l2_norm=X`: keys whose embedding's L2 norm is below X (rows that learned nothing);
* `capacity=C`: beyond C keys, the least recently trained ones (lowest version; equal versions: lowest key), so that
  at most C keys remain: the C most recent of the whole embedding, whichever shards hold them (one global threshold,
  not a quota per shard).

The criteria apply in this order. Removed keys lose their embedding and every optimizer slot; if they come back
they start again from the initializer (with `CountAdmission`, from a count of zero; `BloomAdmission`'s counters
may still hold part of their count). Every eviction of an embedding with an admission policy also halves its
admission counts (see admission.py).

When it runs:

* given to `get_dynamic_embedding(eviction=...)` with `every_n_steps=N`: inside the training step, at every global
  step that is a multiple of N (needs a global step): each shard's per-key criteria right after that shard's
  optimizer update, then `capacity` once for the whole embedding, after every shard's update and per-key eviction;
* before every checkpoint save, with `EvictionSaverListener()` (pass it to `Estimator.train(saving_listeners=...)`
  or a `CheckpointSaverHook`): checkpoints never carry evicted keys;
* every N `session.run` calls with `EvictionHook(N)`, or whenever you run the op of `evict()`.

`EvictionSaverListener` and `EvictionHook` without criteria run the policies the embeddings were created with;
with criteria (`steps_to_live=...`) they apply those to the embeddings they are given (default: all). Each
embedding with a policy counts the keys it evicted in a saved int64 variable (`evicted_keys_total`), which
`tf_ext.embedding.add_summaries()` writes to TensorBoard.

Evicting reads the whole shard (its keys and versions, and for `min_l2_norm` its rows); `capacity`, once the
embedding holds more than C keys, reads the keys and versions of every shard once more (and with the per-key criteria
their rows too, so that keys they remove never count): choose N so that this cost is small against N training steps.

Every count is an int64 on its way to the kernels; a value out of its range (see `EvictionPolicy`) is a ValueError
naming the argument and the range.
"""

import math

import numpy as np
import tensorflow as tf

from tensorflow_ext.embedding.checkpoint import policy_state
from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils.frozen import FrozenValue

__all__ = ["EvictionHook", "EvictionPolicy", "EvictionSaverListener", "evict", "restrict"]

EVICTED_COLLECTION = "tf_ext_evicted_keys"


INT64_MAX = (1 << 63) - 1
FREQUENCY_MAX = (1 << 32) - 1  # a key's frequency is a saturating uint32 (table core's KeyMeta)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_count(what, value, lo, hi=INT64_MAX):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError("%s must be an int in [%d, %d], got %r" % (what, lo, hi, value))
    if not lo <= value <= hi:
        raise ValueError(
            "%s must be an int in [%d, %d], got %d%s"
            % (what, lo, hi, value, " (frequencies saturate at %d)" % FREQUENCY_MAX if hi == FREQUENCY_MAX else "")
        )
    return int(value)


class NeverEvict(object):
    """The do-nothing eviction policy of an embedding created without one: it keeps every key (until `evict()` or
    a hook is given criteria). It has no state; all of them are equal (use `NEVER_EVICT`)."""

    evicts = False
    every_n_steps = None

    def build(self, emb):
        """No state: an empty dict."""
        del emb
        return {}

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        return "NeverEvict()"


NEVER_EVICT = NeverEvict()


class EvictionPolicy(FrozenValue):
    """Which keys an embedding loses, and how often (see the module docstring).

    A policy is an immutable value: two policies with the same arguments are equal (so an embedding reused under
    `tf.compat.v1.AUTO_REUSE` accepts an equal policy built again).

    Args:
      steps_to_live: remove keys not trained in the last steps_to_live global steps (0 .. 2^63 - 1).
      min_frequency: remove keys looked up in training fewer than min_frequency times (0 .. 2^32 - 1: a key's
        frequency saturates at 2^32 - 1).
      capacity: keep at most this many keys over all shards, the most recently trained (0 .. 2^63 - 1).
      min_l2_norm: remove keys whose embedding has an L2 norm below this (a finite float > 0).
      every_n_steps: also evict inside the training step at global steps that are multiples of this
        (1 .. 2^63 - 1; None: only before saves, or with `EvictionHook`/`evict`).

    Raises:
      ValueError: no criterion, or a bad value (named, with its range).
    """

    _FIELDS = ("steps_to_live", "min_frequency", "capacity", "min_l2_norm", "every_n_steps")
    _FROZEN_WHAT = "an EvictionPolicy"
    __slots__ = _FIELDS
    evicts = True

    def __init__(self, steps_to_live=None, min_frequency=None, capacity=None, min_l2_norm=None, every_n_steps=None):
        steps_to_live = _check_count("steps_to_live", steps_to_live, 0)
        min_frequency = _check_count("min_frequency", min_frequency, 0, FREQUENCY_MAX)
        capacity = _check_count("capacity", capacity, 0)
        every_n_steps = _check_count("every_n_steps", every_n_steps, 1)
        if min_l2_norm is not None:
            if (
                isinstance(min_l2_norm, (bool, np.bool_))
                or not isinstance(min_l2_norm, (int, float, np.integer, np.floating))
                or not 0 < min_l2_norm <= _FLOAT32_MAX
            ):
                raise ValueError(
                    "min_l2_norm must be a finite number > 0 (at most %g, float32's largest), got %r"
                    % (_FLOAT32_MAX, min_l2_norm)
                )
            min_l2_norm = float(min_l2_norm)
        if steps_to_live is None and min_frequency is None and capacity is None and min_l2_norm is None:
            raise ValueError(
                "an eviction policy needs at least one of steps_to_live, min_frequency, capacity, min_l2_norm"
            )
        for field, value in zip(self._FIELDS, (steps_to_live, min_frequency, capacity, min_l2_norm, every_n_steps)):
            object.__setattr__(self, field, value)

    def __repr__(self):
        return "EvictionPolicy(%s)" % ", ".join(
            "%s=%r" % (k, getattr(self, k)) for k in self._FIELDS if getattr(self, k) is not None
        )

    def build(self, emb):
        """Creates the policy's state for a new embedding: its evicted-keys counter (a saved int64 variable).

        Args:
          emb: the new `DynamicEmbedding` (called by its constructor, in the caller's variable scope).

        Returns:
          dict with "evicted".
        """
        short = emb.name.split("/")[-1]
        with tf.compat.v1.variable_scope(short + "_eviction"), tf.control_dependencies(None):
            with tf.device(emb.shards[0].handle.device):
                evicted = policy_state.saved_counter(emb, "evicted", EVICTED_COLLECTION, "evicted-keys counter")
        return dict(evicted=evicted)

    def shard_op(self, shard, global_step=None):
        """The per-key criteria (steps_to_live, min_frequency, min_l2_norm) on one shard: an int64 scalar tensor,
        the number of keys removed. `capacity` is over all shards: see `op` and `capacity_op`.

        Args:
          shard: a `DynamicEmbeddingShard`.
          global_step: the step (default: the graph's global step; required with steps_to_live).

        Raises:
          ValueError: steps_to_live without a global step.
        """
        removed = []
        with internals.ops.colocate_with(shard.handle):
            if self.steps_to_live is not None or self.min_frequency is not None:
                min_version, min_freq = self._min_version_and_frequency(global_step)
                removed.append(shard.table.evict(min_version, min_freq))
            if self.min_l2_norm is not None:
                with tf.control_dependencies(removed):
                    keys, values, _, _ = shard.table.export()
                weak = tf.norm(values, axis=1) < tf.constant(self.min_l2_norm, tf.float32)
                removed.append(shard.table.remove(tf.boolean_mask(keys, weak)))
        if not removed:
            return tf.constant(0, tf.int64)
        return tf.add_n(removed)

    def _min_version_and_frequency(self, global_step):
        """The thresholds of `tf_ext_table_evict`: keys with version < min_version (when >= 0) or frequency <
        min_frequency (when >= 0) go."""
        if self.steps_to_live is not None:
            if global_step is None:
                global_step = tf.compat.v1.train.get_global_step()
            if global_step is None:
                raise ValueError("an eviction policy with steps_to_live needs a global step")
            # A negative step counts as 0, so that the difference cannot overflow int64.
            step = tf.maximum(tf.cast(tf.convert_to_tensor(global_step), tf.int64), 0)
            min_version = step - tf.constant(self.steps_to_live, tf.int64)
        else:
            min_version = tf.constant(-1, tf.int64)
        min_freq = tf.constant(-1 if self.min_frequency is None else self.min_frequency, tf.int64)
        return min_version, min_freq

    def _survives(self, global_step):
        """A function (values, versions, freqs) -> bool [n]: the rows the per-key criteria keep (exactly what
        `shard_op` keeps), or None without per-key criteria."""
        if self.steps_to_live is None and self.min_frequency is None and self.min_l2_norm is None:
            return None
        min_version, min_freq = self._min_version_and_frequency(global_step)

        def survives(values, versions, freqs):
            gone = tf.logical_or(
                tf.logical_and(min_version >= 0, versions < min_version),
                tf.logical_and(min_freq >= 0, freqs < min_freq),
            )
            if self.min_l2_norm is not None:
                gone = tf.logical_or(gone, tf.norm(values, axis=1) < tf.constant(self.min_l2_norm, tf.float32))
            return tf.logical_not(gone)

        return survives

    def capacity_op(self, emb, shards=None, global_step=None):
        """The `capacity` criterion: beyond `capacity` keys over all shards of `emb`, removes the least recently
        trained keys (lowest version; equal versions: lowest key first) from `shards`, so that the keys kept are the
        `capacity` most recent of the whole embedding, whichever shards they are in.

        Reads every shard's keys and versions (one int64 pair per key) when the embedding holds more than
        `capacity` keys; only their sizes otherwise. Keys that the per-key criteria remove do not count, whether or
        not they were removed yet (their rows are then read too, for `min_l2_norm`).

        Args:
          emb: a `DynamicEmbedding`.
          shards: the shards to remove from (default: all).
          global_step: the step of `steps_to_live` (default: the graph's global step).

        Returns:
          int64 scalar tensor: the keys removed (0 without capacity).
        """
        if self.capacity is None:
            return tf.constant(0, tf.int64)
        return _remove_beyond_capacity(
            emb, self.capacity, emb.shards if shards is None else shards, self._survives(global_step)
        )

    def op(self, emb, global_step=None):
        """The eviction of every shard of `emb`, counted in its evicted-keys variable when it has one.

        The per-key criteria run on every shard first, then `capacity` over the keys left in all shards.

        Returns:
          int64 scalar tensor: the keys removed.
        """
        removed = [self.shard_op(shard, global_step) for shard in emb.shards]
        if self.capacity is not None:
            with tf.control_dependencies(removed):
                removed.append(self.capacity_op(emb, global_step=global_step))
        total = emb.config.admission.decayed_after(emb, tf.add_n(removed) if len(removed) > 1 else removed[0])
        return emb.state.count_evicted(total)


_INT64_MIN = -(1 << 63)


def _export_keys_and_versions(shard, survives=None):
    """The shard's keys and versions; with `survives`, only those of the rows it keeps."""
    with internals.ops.colocate_with(shard.handle):
        cols = 1 if survives is None else shard.dim
        keys, values, versions, freqs = shard.table.export(cols=cols)
        if survives is not None:
            kept = survives(values, versions, freqs)
            keys, versions = tf.boolean_mask(keys, kept), tf.boolean_mask(versions, kept)
    return keys, versions


def _remove_beyond_capacity(emb, capacity, targets, survives=None):
    """Keeps the `capacity` greatest (version, key) pairs of all shards of `emb`; removes the others from `targets`.

    Keys are unique over shards, so (version, key) orders all keys strictly: the threshold is the pair of the
    capacity-th greatest, computed from every shard's versions, and each target removes its keys below it. Sizes and
    the threshold are int64 (capacity may exceed int32). With `survives` (the per-key criteria), only the keys they
    keep count, so a shard whose per-key eviction has not run yet does not push the threshold up.
    """
    cap = tf.constant(capacity, tf.int64)
    sizes = []
    for shard in emb.shards:
        with internals.ops.colocate_with(shard.handle):
            sizes.append(shard.table.size())
    total = tf.add_n(sizes) if len(sizes) > 1 else sizes[0]

    def remove():
        exported = [_export_keys_and_versions(shard, survives) for shard in emb.shards]
        keys = tf.concat([k for k, _ in exported], 0)
        versions = tf.concat([v for _, v in exported], 0)
        n = tf.size(versions, out_type=tf.int64)
        # n > capacity >= 0 here (unless keys were removed since the sizes were read): capacity < n fits top_k's int32.
        k = tf.cast(tf.maximum(tf.minimum(n, cap), 1), tf.int32)

        def threshold():
            top_versions, _ = tf.math.top_k(versions, k=k, sorted=True)
            v = top_versions[-1]
            newer = tf.reduce_sum(tf.cast(versions > v, tf.int64))
            tied = tf.boolean_mask(keys, tf.equal(versions, v))
            top_keys, _ = tf.math.top_k(tied, k=tf.cast(cap - newer, tf.int32), sorted=True)
            return v, top_keys[-1]

        def keep_all():
            return tf.constant(_INT64_MIN, tf.int64), tf.constant(_INT64_MIN, tf.int64)

        if capacity == 0:
            v, k_min = tf.constant((1 << 63) - 1, tf.int64), tf.constant((1 << 63) - 1, tf.int64)
            drop_all = True
        else:
            v, k_min = tf.cond(n > cap, threshold, keep_all)
            drop_all = False
        removed = []
        for shard in targets:
            i = emb.shards.index(shard)
            shard_keys, shard_versions = exported[i]
            with internals.ops.colocate_with(shard.handle):
                if drop_all:
                    drop = shard_keys
                else:
                    keep = tf.logical_or(
                        shard_versions > v, tf.logical_and(tf.equal(shard_versions, v), shard_keys >= k_min)
                    )
                    drop = tf.boolean_mask(shard_keys, tf.logical_not(keep))
                removed.append(shard.table.remove(drop))
        return tf.add_n(removed) if len(removed) > 1 else removed[0]

    return tf.cond(total > cap, remove, lambda: tf.constant(0, tf.int64))


class InStepEvictions(object):
    """The in-step evictions of one `apply_gradients` call (built by the optimizer support, one per call): which
    shards of each embedding the call updates, and the per-key evictions built so far.

    Args:
      shards: the shards the call updates.
    """

    def __init__(self, shards=()):
        self._expected = {}  # id(embedding) -> [its shards in the call]
        for shard in shards:
            self._expected.setdefault(id(shard.embedding), []).append(shard)
        self._done = {}  # id(embedding) -> [(shard, its update and per-key eviction)]
        self._built = set()  # id(embedding) whose capacity step is built

    def add(self, shard, op):
        """Records the shard's update and per-key eviction.

        Returns:
          (ops, whole): once every shard of the embedding in the call is recorded, their ops and True (the
          embedding's step is to be built now, once); before that, None and True. A shard the call did not
          announce (a processor used outside `apply_gradients`, or the same shard again): [op] and False (its
          capacity step is its own, removing only its keys).
        """
        key = id(shard.embedding)
        expected = self._expected.get(key, ())
        if key in self._built or not any(s is shard for s in expected):
            return [op], False
        done = self._done.setdefault(key, [])
        done.append((shard, op))
        if {id(s) for s, _ in done} != {id(s) for s in expected}:
            return None, True
        self._built.add(key)
        return [o for _, o in done], True


def _due(policy, step):
    return tf.logical_and(step > 0, tf.equal(step % tf.constant(policy.every_n_steps, tf.int64), 0))


def in_step_eviction(shard, update_op, call=None):
    """The shard's optimizer update followed, at global steps that are multiples of the policy's every_n_steps, by
    the eviction of the shard (called by the optimizer support for embeddings with such a policy).

    The per-key criteria apply to the shard's keys right after its update. `capacity` (and the decay of the
    admission counts) applies to the whole embedding once per step: after the update and per-key eviction of every
    shard of the embedding that the `apply_gradients` call updates (`call`), so that it reads every shard once and
    only after its update. The processor of the last of those shards returns the embedding's step with its own.

    Args:
      shard: a `DynamicEmbeddingShard`.
      update_op: its optimizer update.
      call: the `InStepEvictions` of the `apply_gradients` call, or None (a processor used on its own: capacity
        then removes only this shard's keys, after its update).

    Returns:
      An op.

    Raises:
      ValueError: the graph has no global step.
    """
    emb = shard.embedding
    policy = emb.config.eviction
    if policy.every_n_steps is None:
        return update_op
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        raise ValueError(
            "dynamic embedding %s: EvictionPolicy(every_n_steps=%d) evicts at global steps that are multiples of "
            "every_n_steps; create a global step first (tf.compat.v1.train.get_or_create_global_step())"
            % (emb.name, policy.every_n_steps)
        )
    evicted = emb.state.eviction["evicted"]
    with tf.name_scope("tf_ext_eviction"):
        with tf.control_dependencies([update_op]):
            step = tf.cast(tf.convert_to_tensor(global_step), tf.int64)
            removed = tf.cond(
                _due(policy, step), lambda: policy.shard_op(shard, step), lambda: tf.constant(0, tf.int64)
            )
            local = evicted.assign_add(removed, read_value=False)
        if policy.capacity is None and emb.config.admission.admits_every_key:
            return local
        shard_ops, whole = (call if call is not None else InStepEvictions()).add(shard, local)
        if shard_ops is None:
            return local  # the last shard of the embedding in this call builds its step

        def evict_embedding():
            beyond = policy.capacity_op(emb, emb.shards if whole else [shard], global_step=step)
            # Admission counts decay once per eviction of the embedding (a shard alone: with the first shard's).
            return emb.config.admission.decayed_after(emb, beyond) if whole or shard is emb.shards[0] else beyond

        with tf.control_dependencies(shard_ops):
            step = tf.cast(tf.convert_to_tensor(global_step), tf.int64)
            removed = tf.cond(_due(policy, step), evict_embedding, lambda: tf.constant(0, tf.int64))
            counted = evicted.assign_add(removed, read_value=False)
        return tf.group(local, counted)


def evict(embeddings=None, steps_to_live=None, min_frequency=None, global_step=None, name=None):
    """Builds an op that evicts keys from dynamic embeddings.

    Args:
      embeddings: a `DynamicEmbedding`, a list of them, or None (every dynamic embedding of the default graph).
      steps_to_live: remove keys whose version < global_step - steps_to_live.
      min_frequency: remove keys with frequency < min_frequency.
      global_step: the step tensor/variable (default: the graph's global step; required with steps_to_live).
      name: optional name scope.

    Without steps_to_live and min_frequency, each embedding's own `EvictionPolicy` (from `get_dynamic_embedding(
    eviction=...)`) applies, and embeddings without one are left alone.

    Returns:
      An int64 scalar tensor: the number of keys removed (all shards).

    Raises:
      ValueError: a bad policy value, steps_to_live without a global step, or no criterion and no embedding with
        a policy.
    """
    if embeddings is None:
        embeddings = state_lib.get_dynamic_embeddings()
    elif state_lib.is_embedding(embeddings):
        embeddings = [embeddings]
    if steps_to_live is None and min_frequency is None:
        pairs = [(emb, emb.config.eviction) for emb in embeddings if emb.config.eviction.evicts]
        if not pairs:
            raise ValueError(
                "an eviction policy needs steps_to_live and/or min_frequency (or embeddings created with "
                "get_dynamic_embedding(eviction=tf_ext.embedding.EvictionPolicy(...)))"
            )
    else:
        given = EvictionPolicy(steps_to_live=steps_to_live, min_frequency=min_frequency)
        pairs = [(emb, given) for emb in embeddings]
    with tf.name_scope(name or "tf_ext_evict"):
        removed = [policy.op(emb, global_step) for emb, policy in pairs]
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
      num_reserved: int in [0, 2^63 - 1], the number of keys kept.
      trigger: int in [num_reserved, 2^63 - 1] or None; the op does nothing while the
        embedding holds at most `trigger` keys.
      policy: "timestamp" or "frequency".
      name: optional name scope.

    Returns:
      An int64 scalar tensor: the number of keys removed.

    Raises:
      ValueError: bad num_reserved, trigger or policy.
    """
    if not state_lib.is_embedding(embedding):
        raise TypeError("restrict needs a tf_ext DynamicEmbedding, got %r" % (embedding,))
    num_reserved = _check_count("num_reserved", num_reserved, 0)
    if trigger is None:
        trigger = num_reserved
    trigger = _check_count("trigger", trigger, num_reserved)
    if policy not in _RESTRICT_SCORES:
        raise ValueError("policy must be one of %s, got %r" % (sorted(_RESTRICT_SCORES), policy))
    with tf.name_scope(name or "tf_ext_restrict"):
        exported = embedding.export()
        keys, scores = exported[0], exported[_RESTRICT_SCORES[policy]]
        n = tf.size(keys, out_type=tf.int64)  # int64 throughout: num_reserved and trigger may exceed int32

        def _remove_all_but_best():
            k = tf.cast(tf.minimum(n, tf.constant(num_reserved, tf.int64)), tf.int32)  # < n, which fits int32
            _, keep = tf.math.top_k(scores, k=k, sorted=False)
            drop = tf.tensor_scatter_nd_update(
                tf.ones(tf.reshape(n, [1]), tf.bool), tf.expand_dims(keep, 1), tf.zeros_like(keep, tf.bool)
            )
            return embedding.remove(tf.boolean_mask(keys, drop))

        return tf.cond(n > tf.constant(trigger, tf.int64), _remove_all_but_best, lambda: tf.constant(0, tf.int64))


class _EvictionRunner(object):
    """The eviction op shared by the saver listener and the hook."""

    def _init_policy(self, embeddings, steps_to_live, min_frequency):
        if steps_to_live is not None or min_frequency is not None:
            EvictionPolicy(steps_to_live=steps_to_live, min_frequency=min_frequency)  # checks the values
        self._embeddings = embeddings
        self._steps_to_live = steps_to_live
        self._min_frequency = min_frequency
        self._op = None
        self.last_removed = None

    def begin(self):
        """Builds the eviction op (called once, before the graph is finalized).

        Raises:
          ValueError: `steps_to_live` without a global step, or no criterion and no embedding with a policy.
        """
        self._op = evict(self._embeddings, self._steps_to_live, self._min_frequency)


class EvictionSaverListener(_EvictionRunner, tf.compat.v1.train.CheckpointSaverListener):
    """Evicts keys right before every checkpoint save (see module docstring).

    Example:
      est.train(input_fn, saving_listeners=[
          tf_ext.embedding.EvictionSaverListener(steps_to_live=10000)])

    Args:
      embeddings: a `DynamicEmbedding`, a list of them, or None (every dynamic
        embedding of the graph when `begin` runs).
      steps_to_live: remove keys whose version < global_step - steps_to_live.
      min_frequency: remove keys with frequency < min_frequency.
        Without both, each embedding's own `EvictionPolicy` applies.

    Attributes:
      last_removed: the number of keys removed before the last save (None
        before the first save).

    Raises:
      ValueError: a policy value out of its range (see `EvictionPolicy`; without
        criteria and without embeddings that have a policy: at `begin`).
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


class EvictionHook(_EvictionRunner, tf.compat.v1.train.SessionRunHook):
    """Evicts keys after every `every_n_steps`-th `run` call of the session.

    Args:
      every_n_steps: int in [1, 2^63 - 1]: evict after every N-th `session.run` (counted
        by this hook, not by the global step).
      embeddings: a `DynamicEmbedding`, a list of them, or None (every dynamic
        embedding of the graph when `begin` runs).
      steps_to_live: remove keys whose version < global_step - steps_to_live.
      min_frequency: remove keys with frequency < min_frequency.
        Without both, each embedding's own `EvictionPolicy` applies.

    Attributes:
      last_removed: the number of keys removed by the last eviction (None
        before the first one).

    Raises:
      ValueError: a bad policy value, or `every_n_steps` out of [1, 2^63 - 1].
    """

    def __init__(self, every_n_steps, embeddings=None, steps_to_live=None, min_frequency=None):
        self._init_policy(embeddings, steps_to_live, min_frequency)
        if every_n_steps is None:
            raise ValueError("every_n_steps must be an int in [1, %d], got None" % INT64_MAX)
        self._every = _check_count("every_n_steps", every_n_steps, 1)
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
