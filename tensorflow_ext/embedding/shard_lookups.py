"""What a shard knows about the lookups built on it: training mode, unique keys, and the rows they read.

* **Training mode.** Lookups are built find-only (`is_training=None`): they never insert keys until an optimizer
  is applied to the embedding in the same graph; then `set_training()` turns the graph's lookups into inserting
  ones (before the graph first runs). So Estimator eval/predict graphs and serving exports never insert keys.
* **Unique keys.** The key tensors that lookups produced unique (their gradients need no second dedup).
* **Reads.** The keys and rows each lookup read, from which the shard's value as a tensor is built on demand
  (`DynamicEmbeddingShard.read_keys_and_rows`).
"""

import threading

import tensorflow as tf

__all__ = ["ShardLookups"]


class ShardLookups(object):
    """The lookups of one shard in one graph (thread-safe).

    Args:
      shard_name: for error messages.
    """

    def __init__(self, shard_name):
        self._shard_name = shard_name
        self._training = False
        self._pending = []  # activations of find-only lookups, run by set_training
        self._unique_keys = set()  # refs of key tensors that are unique by construction
        self._reads = []  # (unique keys [n], callable -> their rows [n, dim]), in build order
        self._read_cache = {}  # number of reads -> (keys, rows)
        self._lock = threading.Lock()

    @property
    def is_training(self):
        """True once an optimizer was applied to the shard in this graph."""
        return self._training

    def when_training(self, activate_fn):
        """Runs `activate_fn()` (turning a find-only lookup into an inserting one) now if training, else on
        `set_training`."""
        with self._lock:
            if not self._training:
                self._pending.append(activate_fn)
                return
        activate_fn()

    def set_training(self):
        """Turns the shard's find-only lookups into inserting ones, now and for lookups built later."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._training = True
        for activate in pending:
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
