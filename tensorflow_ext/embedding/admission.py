"""Feature admission: a key gets a row in a dynamic embedding only once it was seen `min_count` times in training.

Recommender ids follow a long tail: most ids occur a handful of times, and a row trained on one or two examples is
noise that costs a full row (embedding and optimizer slots) until eviction. An admission policy keeps such keys out:

    emb = tf_ext.get_dynamic_embedding("user", 16, admission=tf_ext.embedding.CountAdmission(min_count=3))

* Every training lookup (`embedding_lookup`, `embedding_lookup_sparse`, `safe_embedding_lookup_sparse` and the
  TFRA names built on them) counts each distinct key of its batch that has no row yet once per run,
  however often the key occurs in the batch (in one example or several). A key is admitted in the lookup where its
  count reaches `min_count` (1 .. 2^24: counts are exact up to 2^24): it gets its row (the initializer's draw) and
  trains from then on, like any key.
* A key not admitted receives no update: its gradient is dropped, and no optimizer slot is created for it.
  `embedding_lookup` returns `default_value` (a finite float, zeros by default) as its row; the pooled lookups
  (`embedding_lookup_sparse`, `safe_embedding_lookup_sparse`) leave it out, as if it were absent from the input: it
  is in no sum and in no `mean` / `sqrtn` denominator (an example left without ids is an empty example). Training
  is then training on the input without the keys not admitted yet, also for model-parallel Horovod embeddings
  (each key's owner counts it and sends back whether it has a row with the row).
* Inference lookups (eval, predict, serving) count nothing; keys without a row are treated as above there too, so
  a model is evaluated as it was trained.
* Counts are part of the model: `tf.compat.v1.train.Saver()` saves and restores them with the embedding. A
  checkpoint saved before the embedding had a policy restores with the counts empty (see checkpoint/policy_state.py).
* Counts decay at every eviction of the embedding (its `EvictionPolicy`, `evict()`, `EvictionSaverListener`,
  `EvictionHook`; `Admission.decay`), so the policy's memory holds the counts of recent keys only.
  `CountAdmission` halves (rounded down) the count of each waiting key not counted since the previous eviction and
  forgets it at 0 (a key seen once is forgotten at the second eviction after its sighting; any waiting key after
  at most `1 + (min_count - 1).bit_length()` evictions without a sighting), and forgets a waiting key that has a
  row by then (admitted on another data-parallel rank, or restored); a key counted in every eviction period keeps
  its count and is admitted at its `min_count`-th sighting however often evictions run. `BloomAdmission` cannot
  tell keys apart in its counters: it halves every counter, so its filter no longer fills up, but a key seen `s`
  times per eviction period never reads more than `2 * s - 1`: it is admitted only if `min_count <= 2 * s - 1`
  (e.g. with `EvictionPolicy(every_n_steps=N)` and one lookup per step, `min_count` below `2 * N`; building the
  training graph logs a warning otherwise). Without eviction counts never decay: the waiting keys' table grows
  with the distinct keys, and a Bloom filter that counted many more keys than it has counters admits every key at
  once.

Two ways of counting:

* `CountAdmission`: exact counts in a side hash table holding only the keys still waiting (8-byte key, one float
  count and the table's metadata per key, no embedding row); a key leaves it when admitted, or when decay forgets it.
* `BloomAdmission`: a counting Bloom filter, `num_counters` int32 counters in a fixed array (memory independent of
  the number of keys: 4 bytes per counter), `num_hashes` counters per key, the count of a key being the minimum of
  its counters. It never under-counts; a key may be admitted early when all its counters were also raised by other
  keys. After `n` distinct keys were counted (since counts last decayed), the probability that a key never seen
  reads as seen at least once is `(1 - exp(-num_hashes * n / num_counters)) ** num_hashes`
  (`BloomAdmission.false_positive_rate`), an upper bound for being admitted before its `min_count`-th occurrence.

Under Horovod: with model-parallel embeddings the owner of a key counts it (the counts see every rank's lookups);
with data-parallel ones each rank counts its own lookups, and a key admitted on one rank is inserted on every rank by
the gathered gradient.
"""

import abc
import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tensorflow_ext.embedding.checkpoint import policy_state
from tensorflow_ext.embedding.keys import HashPartition
from tensorflow_ext.table.table_ops import HashTable
from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils.frozen import FrozenValue

__all__ = ["ADMIT_EVERY_KEY", "BloomAdmission", "CountAdmission"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)

# Summaries and tests read these collections: one int64 variable per embedding with admission.
ADMITTED_COLLECTION = "tf_ext_admitted_keys"


# Counts are exact up to 2^24: CountAdmission keeps them as float32 (the side table's row), and a larger
# threshold could never be reached.
MAX_MIN_COUNT = 1 << 24


def _check_int(what, value, lo, hi=None, why=""):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi and value > hi):
        raise ValueError("%s must be an int in [%d, %s]%s, got %r" % (what, lo, hi or "inf", why, value))
    return int(value)


class AdmitEveryKey(object):
    """The do-nothing admission policy of an embedding created without one: every key gets its row at its first
    training lookup. It has no state and nothing to decay; all of them are equal (use `ADMIT_EVERY_KEY`)."""

    admits_every_key = True

    def build(self, emb):
        """No state: an empty dict."""
        del emb
        return {}

    def decayed_after(self, emb, removed):
        """`removed` as it is: there are no counts to decay."""
        del emb
        return removed

    def admitted_lookup(self, emb, unique_keys, is_training, lookup, return_admitted=False):
        """`lookup(unique_keys)`: every key is admitted (with return_admitted, and a bool [n] of True)."""
        del emb, is_training
        rows = lookup(unique_keys)
        return (rows, tf.ones_like(unique_keys, tf.bool)) if return_admitted else rows

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        return "AdmitEveryKey()"


ADMIT_EVERY_KEY = AdmitEveryKey()


class Admission(FrozenValue, abc.ABC):
    """What both policies share: the threshold, the default row, the admitted-keys counter, the lookup.

    A policy is an immutable value: two policies of one class with the same arguments are equal (so an embedding
    reused under `tf.compat.v1.AUTO_REUSE` accepts an equal policy built again). Its state in a graph is built by
    `build` when an embedding is created and kept by the embedding (`DynamicEmbedding.admission_state`).

    A policy supplies `_FIELDS` (its arguments, in constructor order), `_build` (its state), `_count` (count and
    read) and `memory_bytes`.
    """

    _FIELDS = ("min_count", "default_value")
    _FROZEN_WHAT = "an admission policy"
    admits_every_key = False

    def __init__(self, min_count, default_value):
        min_count = _check_int(
            "min_count",
            min_count,
            1,
            MAX_MIN_COUNT,
            " (counts are exact up to 2^24; a larger threshold could never be reached: use at most %d)" % MAX_MIN_COUNT,
        )
        try:
            value = float(default_value)
        except (TypeError, ValueError):
            raise ValueError("default_value must be a number, got %r" % (default_value,)) from None
        if isinstance(default_value, (bool, np.bool_)) or not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
            raise ValueError(
                "default_value must be a finite float32 number (what keys not admitted yet read; a NaN or Inf "
                "row makes the loss NaN from the first step), got %r" % (default_value,)
            )
        object.__setattr__(self, "min_count", min_count)
        object.__setattr__(self, "default_value", value)

    def build(self, emb):
        """Creates the policy's state for a new embedding (called by its constructor, in the caller's variable scope).

        Args:
          emb: the `DynamicEmbedding`.

        Returns:
          The state (a dict) the embedding keeps in its `EmbeddingState` (`emb.state.admission`).
        """
        short = emb.name.split("/")[-1]
        with tf.compat.v1.variable_scope(short + "_admission"), tf.control_dependencies(None):
            with tf.device(emb.shards[0].handle.device):
                state = self._build(emb)
                # Saved by a saveable of its own (like the policy's other state): a checkpoint written before the
                # embedding had this policy restores with the state empty.
                state["admitted"] = policy_state.saved_counter(
                    emb, "admitted", ADMITTED_COLLECTION, "admitted-keys counter"
                )
        return state

    @abc.abstractmethod
    def _build(self, emb):
        """The policy's own state for `emb` (a dict of its tables and variables)."""

    @abc.abstractmethod
    def _count(self, state, keys):
        """Counts `keys` (unique, without rows) once more; returns their counts after it (int64 [n])."""

    def _forget(self, state, keys):
        """Admitted keys need no count any more (an op, or None)."""
        return None

    def _default_repr(self):
        """The repr's default_value argument (left out at its default, 0)."""
        return ", default_value=%r" % self.default_value if self.default_value else ""

    def admitted_keys_total(self, emb):
        """int64 variable: keys of `emb` admitted so far (saved with the model)."""
        return emb.state.admission["admitted"]

    def decay(self, emb):
        """An op that decays the counts of `emb`; every eviction of `emb` runs it.

        `CountAdmission` halves (rounded down) the counts of the waiting keys not counted since its previous decay,
        forgets those that reach 0 and those that have a row by now (admitted on another data-parallel rank, or
        restored), so its table holds only keys counted in the last few eviction periods. `BloomAdmission` halves
        every counter, so that the filter holds the counts of recent keys and does not fill up.
        """
        with tf.name_scope("admission_decay"), tf.device(emb.shards[0].handle.device):
            return self._decay(emb, emb.state.admission)

    def decayed_after(self, emb, removed):
        """`removed` (the keys an eviction of `emb` removed), once the counts of `emb` decayed after that eviction."""
        with tf.control_dependencies([removed]):
            decay = self.decay(emb)
        with tf.control_dependencies([decay]):
            return tf.identity(removed)

    def admitted_lookup(self, emb, unique_keys, is_training, lookup, return_admitted=False):
        """Rows [n, dim] of unique int64 keys [n] under this admission policy.

        Args:
          emb: the `DynamicEmbedding` (with this policy).
          unique_keys: int64 [n], unique.
          is_training: as in the lookups (True, False or None).
          lookup: callable(keys) -> rows [m, dim] of unique keys (the lookup without admission; it inserts in training).
          return_admitted: also return which keys are admitted (pooled lookups leave the others out).

        Returns:
          float32 [n, dim]: the rows of admitted keys (differentiable, their gradients reach the table) and
          `default_value` rows for the others (no gradient); with return_admitted, (rows, bool [n]: admitted).
        """
        state = emb.state.admission
        with tf.name_scope("admission"):
            n = tf.size(unique_keys)
            has_row = _has_row(emb, unique_keys)
            training = _training_flag(emb, is_training)
            waiting = tf.boolean_mask(unique_keys, tf.logical_not(has_row))

            def count_and_admit():
                counts = self._count(state, waiting)
                newly = counts >= self.min_count
                new_keys = tf.boolean_mask(waiting, newly)
                updates = [state["admitted"].assign_add(tf.cast(tf.size(new_keys), tf.int64))]
                forget = self._forget(state, new_keys)
                if forget is not None:
                    updates.append(forget)
                with tf.control_dependencies(updates):
                    return tf.identity(newly)

            newly = tf.cond(training, count_and_admit, lambda: tf.zeros_like(waiting, tf.bool))
            admitted = tf.tensor_scatter_nd_update(has_row, tf.where(tf.logical_not(has_row)), newly)
            positions = tf.where(admitted)  # [m, 1]
            rows = lookup(tf.gather_nd(unique_keys, positions))
            # scatter_nd's gradient is a gather: only the admitted keys' rows get (and pass on) a gradient.
            out = tf.scatter_nd(positions, rows, tf.stack([tf.cast(n, tf.int64), emb.dim]))
            if self.default_value:
                out = tf.where(tf.expand_dims(admitted, 1), out, tf.fill(tf.shape(out), self.default_value))
            return (out, admitted) if return_admitted else out

    @abc.abstractmethod
    def _decay(self, emb, state):
        """The op of `decay`."""

    @abc.abstractmethod
    def memory_bytes(self, emb):
        """int64 scalar: bytes the policy's state for `emb` holds."""


class CountAdmission(Admission):
    """Exact counting in a side table of the keys still waiting (see the module docstring).

    Args:
      min_count: int >= 1: a key is admitted at its min_count-th training lookup (1 = no admission).
      default_value: what a key without a row reads (a float; default 0).
    """

    def __init__(self, min_count, default_value=0.0):
        super().__init__(min_count, default_value)

    def __repr__(self):
        return "CountAdmission(min_count=%d%s)" % (self.min_count, self._default_repr())

    def _build(self, emb):
        # Saved under the embedding's name as `<embedding>/admission_counts-*`. The table's handle op has that very
        # name: a MetaGraph records SAVEABLE_OBJECTS by name, and importing it (a SavedModel load,
        # import_meta_graph) looks the name up as a graph element.
        name = emb.name + "/admission_counts"
        with tf.name_scope(emb.name + "/"):
            table = HashTable(1, name="admission_counts")
        if table.resource_handle.op.name != name:
            raise ValueError(
                "dynamic embedding %s: the graph already has an op named %s (the admission counts' table needs "
                "that name); rename that op or the embedding" % (emb.name, name)
            )
        policy_state.register(policy_state.PolicyStateSaveable(name, emb, "admission counts", table=table))
        return dict(table=table)

    def _count(self, state, keys):
        table = state["table"]
        ones = tf.ones([tf.size(keys), 1], tf.float32)
        # Version 1: counted since the last decay (decay sets it back to 0).
        add = table.accumulate(keys, ones, step=1, insert_missing=True)
        with tf.control_dependencies([add]):
            counts = table.find(keys, default_value=0.0)
        return tf.cast(tf.reshape(counts, [-1]), tf.int64)

    def _forget(self, state, keys):
        return state["table"].remove(keys)

    def _decay(self, emb, state):
        table = state["table"]
        keys, counts, versions, _ = table.export()
        # Keys counted since the last decay keep their count (a key seen in every period reaches min_count however
        # often evictions run); the others are halved, and forgotten at 0.
        seen = tf.expand_dims(versions > 0, 1)
        decayed = tf.where(seen, counts, tf.floor(counts * 0.5))
        drop = tf.logical_or(tf.reshape(decayed, [-1]) < 1.0, _has_row(emb, keys))
        removed = table.remove(tf.boolean_mask(keys, drop))
        keep = tf.logical_not(drop)
        # Subtracting what halving takes off (rather than writing the halves) keeps a count added meanwhile.
        with tf.control_dependencies([removed]):
            return table.accumulate(
                tf.boolean_mask(keys, keep), tf.boolean_mask(decayed - counts, keep), step=0, insert_missing=False
            )

    def pending_keys(self, emb):
        """int64 scalar: keys of `emb` counted but not admitted yet."""
        return emb.state.admission["table"].size()

    def memory_bytes(self, emb):
        return emb.state.admission["table"].memory_bytes()


class BloomAdmission(Admission):
    """Counting in a counting Bloom filter of fixed size (see the module docstring).

    Args:
      min_count: int >= 1: a key is admitted once all of its counters reach min_count.
      num_counters: int32 counters in the filter (memory: 4 bytes each). Size it to >= 10x the distinct keys you
        expect between two evictions (each eviction halves the counters) for a false-positive rate below 1% with 3
        hashes. With oneDNN on (TensorFlow's default on x86), TensorFlow's CPU allocator keeps the buffer the
        filter's zeros were built in as a pool for later tensors, so the process's resident memory right after
        initialization grows by up to twice the filter (`TF_ENABLE_ONEDNN_OPTS=0`: once).
      num_hashes: counters per key (1..8).
      default_value: what a key without a row reads (a float; default 0).
    """

    _FIELDS = ("min_count", "num_counters", "num_hashes", "default_value")

    def __init__(self, min_count, num_counters=1 << 22, num_hashes=3, default_value=0.0):
        super().__init__(min_count, default_value)
        object.__setattr__(self, "num_counters", _check_int("num_counters", num_counters, 16, 1 << 31))
        object.__setattr__(self, "num_hashes", _check_int("num_hashes", num_hashes, 1, 8))

    def __repr__(self):
        return "BloomAdmission(min_count=%d, num_counters=%d, num_hashes=%d%s)" % (
            self.min_count,
            self.num_counters,
            self.num_hashes,
            self._default_repr(),
        )

    @staticmethod
    def false_positive_rate(num_keys, num_counters, num_hashes):
        """Probability that a key never counted reads a count >= 1 after `num_keys` distinct keys were counted."""
        return (1.0 - math.exp(-float(num_hashes) * num_keys / num_counters)) ** num_hashes

    def _build(self, emb):
        def zeros(shape, dtype, partition_info=None):
            del partition_info
            # Not tf.zeros: Grappler folds zeros of a constant shape into a Const node that the session keeps for
            # its lifetime, a second copy of the filter. A zero fed through placeholder_with_default is not folded.
            zero = tf.compat.v1.placeholder_with_default(tf.constant(0, dtype), [], name="zero")
            return tf.fill(shape, zero)

        counters = tf.compat.v1.get_variable(
            "bloom_counters", [self.num_counters], tf.int32, initializer=zeros, trainable=False
        )
        policy_state.register(
            policy_state.PolicyStateSaveable(
                counters.op.name,
                emb,
                "BloomAdmission counters",
                variable=counters,
                zeros=lambda: zeros([self.num_counters], tf.int32),
            )
        )
        return dict(counters=counters)

    def _decay(self, emb, state):
        every = emb.config.eviction.every_n_steps
        if every is not None and self.min_count >= 2 * every:
            tf.compat.v1.logging.warning(
                "dynamic embedding %s: %r halves its counters at every eviction (EvictionPolicy(every_n_steps=%d)), "
                "so a key looked up once per step counts at most %d and will never reach min_count=%d; use "
                "CountAdmission (it halves only the keys that stopped coming), a min_count below %d or a larger "
                "every_n_steps" % (emb.name, self, every, 2 * every - 1, self.min_count, 2 * every)
            )
        counters = state["counters"]
        return tf.compat.v1.assign(counters, tf.bitwise.right_shift(counters, 1), use_locking=True)

    def _slots(self, keys):
        # Independent hashes: the tables' key mixer with one salt per hash function.
        salts = [0x9E3779B97F4A7C15 * (i + 1) & 0xFFFFFFFFFFFFFFFF for i in range(self.num_hashes)]
        return tf.stack([HashPartition(self.num_counters, salt).part_ids(keys) for salt in salts], axis=1)

    def _count(self, state, keys):
        slots = self._slots(keys)  # [n, h]
        flat = tf.reshape(slots, [-1])
        add = tf.compat.v1.scatter_add(state["counters"], flat, tf.ones_like(flat), use_locking=True)
        with tf.control_dependencies([add]):
            # A key's count: the least of its counters (never below its true count).
            return tf.cast(tf.reduce_min(tf.gather(state["counters"], slots), axis=1), tf.int64)

    def memory_bytes(self, emb):
        del emb  # the same for every embedding
        return tf.constant(4 * self.num_counters, tf.int64)


def _training_flag(emb, is_training):
    """A bool scalar: True when the lookup trains. For is_training=None, a constant that becomes True when an
    optimizer applies a gradient that flows through the lookup, like the lookups' insert_missing attr."""
    if is_training is None and all(s.is_training for s in emb.shards):
        is_training = True
    flag = tf.constant(bool(is_training), name="training")
    if is_training is None:

        def activate():
            value = tf.make_tensor_proto(True, tf.bool)
            graph_edits.set_attr(flag.op, "value", attr_value_pb2.AttrValue(tensor=value))

        emb.shards[0].lookups.when_training(activate, [flag.op])
    return flag


def _has_row(emb, keys):
    """bool [n]: which unique int64 keys have a row (no insert, no count)."""
    parts, positions = emb.partition.split(keys)
    found = []
    for shard, part in zip(emb.shards, parts):
        with internals.ops.colocate_with(shard.handle):
            found.append(shard.table.contains(part))
    return found[0] if positions is None else tf.dynamic_stitch(positions, found)
