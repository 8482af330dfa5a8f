"""What a shard knows about the lookups built on it: training mode, unique keys, and the rows they read.

* **Training mode.** Lookups are built find-only (`is_training=None`): they never insert keys until an optimizer
  applies a gradient that flows through them (`minimize` / `apply_gradients` in the same graph); then
  `train_lookups_feeding` turns exactly those lookups into inserting ones. A lookup whose rows do not reach the
  loss (an eval tower or an export built in the training graph, a lookup built after `minimize`) stays find-only,
  so Estimator eval/predict graphs and serving exports never insert keys. The flip edits the lookup's op, which
  TensorFlow ignores once a Session has the graph: that case is refused with an error saying what to do.
* **Unique keys.** The key tensors that lookups produced unique (their gradients need no second dedup).
* **Reads.** The keys and rows each lookup read, from which the shard's value as a tensor is built on demand
  (`DynamicEmbeddingShard.read_keys_and_rows`).
"""

import threading

import tensorflow as tf

from tensorflow_ext import errors
from tensorflow_ext import tf_compat

__all__ = ["LookupModeError", "ShardLookups", "ancestor_ops"]


class LookupModeError(errors.TfExtError, ValueError):
    """A find-only lookup should become an inserting one, but a Session already holds it."""


def ancestor_ops(tensors):
    """The set of ops that `tensors` (tensors, IndexedSlices or ops) depend on, through data and control inputs."""
    stack = []
    for t in tensors:
        if isinstance(t, tf.IndexedSlices):
            stack.extend(x.op for x in (t.values, t.indices, t.dense_shape) if x is not None)
        elif isinstance(t, tf.Operation):
            stack.append(t)
        elif t is not None:
            stack.append(t.op)
    seen = set()
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(x.op for x in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _refuse_edits_a_session_ignores(shard_name, ops):
    """Raises LookupModeError if an open Session already holds one of `ops` (it would ignore their change)."""
    late = [op for op in ops if tf_compat.held_by_an_open_session(op)]
    if late:
        raise LookupModeError(
            "An optimizer is applied to dynamic embedding %s after a Session ran its graph, so its lookup %s "
            "cannot become a training (inserting) lookup: build the optimizer (minimize / apply_gradients) before "
            "the first session.run, or pass is_training=True to the lookup. (The lookup was built with "
            "is_training=None, find-only until an optimizer trains it; TensorFlow ignores changes to ops that a "
            "Session already holds, so it would silently keep reading without inserting new keys. Opening a new "
            "Session after closing the old one also works.)" % (shard_name, late[0].name)
        )


class ShardLookups(object):
    """The lookups of one shard in one graph (thread-safe).

    Args:
      shard_name: for error messages.
    """

    def __init__(self, shard_name):
        self._shard_name = shard_name
        self._training = False  # set_training() was called: every lookup inserts, also those built later
        self._applied = False  # an optimizer was applied to the shard in this graph
        # Find-only lookups (is_training=None) not turned inserting yet: (ops the activation edits, activate_fn).
        self._pending = []
        self._unique_keys = set()  # refs of key tensors that are unique by construction
        self._reads = []  # (unique keys [n], callable -> their rows [n, dim]), in build order
        self._read_cache = {}  # number of reads -> (keys, rows)
        self._lock = threading.Lock()

    @property
    def is_training(self):
        """True once `set_training()` was called: the shard's lookups insert keys, also those built later."""
        return self._training

    @property
    def optimizer_applied(self):
        """True once an optimizer was applied to the shard in this graph."""
        return self._applied

    def when_training(self, activate_fn, ops):
        """Registers a find-only lookup: `activate_fn()` turns it into an inserting one.

        It runs now if `set_training()` was called, else when an optimizer applies a gradient that one of `ops`
        feeds (`train_lookups_feeding`), or on `set_training()`.

        Args:
          activate_fn: callable editing `ops` (graph construction only).
          ops: the ops `activate_fn` edits (the lookup op, an admission flag): the gradient's ancestors are looked
            for among them, and an op a Session already holds cannot be edited.
        """
        ops = tuple(ops)
        with self._lock:
            if not self._training:
                self._pending.append((ops, activate_fn))
                return
        _refuse_edits_a_session_ignores(self._shard_name, ops)
        activate_fn()

    def set_training(self):
        """Turns every find-only lookup of the shard into an inserting one, now and for lookups built later."""
        with self._lock:
            pending = list(self._pending)
        _refuse_edits_a_session_ignores(self._shard_name, [op for ops, _ in pending for op in ops])
        with self._lock:
            pending, self._pending = self._pending, []
            self._training = True
        for _, activate in pending:
            activate()

    def lookups_feeding(self, ancestors):
        """The pending find-only lookups (their activations) one of whose ops is in `ancestors` (a set of ops)."""
        with self._lock:
            return [entry for entry in self._pending if any(op in ancestors for op in entry[0])]

    def check_lookups_feeding(self, ancestors):
        """Raises `LookupModeError` if a lookup feeding `ancestors` can no longer be turned inserting."""
        _refuse_edits_a_session_ignores(
            self._shard_name, [op for ops, _ in self.lookups_feeding(ancestors) for op in ops]
        )

    def train_lookups_feeding(self, ancestors):
        """Called when an optimizer is applied to the shard: turns the find-only lookups whose ops are in
        `ancestors` (the ops the applied gradient depends on) into inserting ones; the others stay find-only.

        Raises:
          LookupModeError: a Session already holds one of those lookups (TensorFlow would ignore the change).
        """
        entries = self.lookups_feeding(ancestors)
        _refuse_edits_a_session_ignores(self._shard_name, [op for ops, _ in entries for op in ops])
        with self._lock:
            self._applied = True
            ids = set(map(id, entries))
            self._pending = [e for e in self._pending if id(e) not in ids]
        for _, activate in entries:
            activate()

    def record_read(self, unique_keys, unique_rows_fn):
        """Records that a lookup read `unique_keys` (unique int64 [n]) of the shard.

        Args:
          unique_keys: int64 vector, unique.
          unique_rows_fn: callable building their rows [n, dim], differentiable w.r.t. the table handle like the
            lookup; it runs only if someone asks for the shard's value.
        """
        with self._lock:
            self._unique_keys.add(unique_keys.ref())
            self._reads.append((unique_keys, unique_rows_fn))

    def keys_are_unique(self, keys):
        """True if `keys` is a key tensor a lookup produced unique (its gradient needs no dedup)."""
        with self._lock:
            return keys.ref() in self._unique_keys

    def read_keys_and_rows(self, name):
        """(keys [n], rows [n, dim]) of every recorded read, concatenated (built once per number of reads), or
        None when no lookup read the shard yet."""
        with self._lock:
            reads = list(self._reads)
            cached = self._read_cache.get(len(reads))
        if not reads:
            return None
        if cached is not None:
            return cached
        with tf.name_scope(name):
            keys = [k for k, _ in reads]
            rows = [fn() for _, fn in reads]
            if len(reads) > 1:
                out = (tf.concat(keys, 0), tf.concat(rows, 0))
            else:
                out = (tf.identity(keys[0]), tf.identity(rows[0]))
        with self._lock:
            self._read_cache[len(reads)] = out
        return out
