"""Initializers of dynamic embeddings: every new key gets its own draw.

A dynamic embedding has no shape to initialize up front: a row is created the
first time a key is inserted (a training lookup). :func:`resolve` turns what the
user passed as ``initializer`` into an :class:`InitSpec`:

* Initializers the lookup kernel can draw itself (``in-kernel`` kinds), found
  by class name and ``get_config()``, for TF1 ``tf.compat.v1.*_initializer``,
  TF2 ``tf.initializers.*`` and Keras initializers alike:

  ================================  ============================================
  initializer                        kernel kind (init_a, init_b)
  ================================  ============================================
  python float / int                 constant (value)
  Zeros / Ones / Constant(scalar)    constant (value)
  RandomNormal(mean, stddev)         random_normal (mean, stddev)
  TruncatedNormal(mean, stddev)      truncated_normal (mean, stddev)
  RandomUniform(minval, maxval)      random_uniform (minval, maxval)
  VarianceScaling family (Glorot,    the distribution above with the scale
  He, LeCun, ...)                    computed for fan_in = fan_out = dim
  ================================  ============================================

  A row of a dynamic embedding is one vector of ``dim`` values, so the
  variance-scaling family uses ``dim`` as both fans (a 1-D shape ``[dim]`` in
  TF's terms): e.g. ``glorot_uniform`` draws from ``U(-sqrt(3/dim),
  sqrt(3/dim))``.

* Any other callable ``init(shape, dtype)`` (e.g. ``orthogonal_initializer``,
  a lambda, a ``Constant`` with a ``[dim]`` vector) takes the generic path: the
  lookup makes ``[n, dim]`` rows in the graph for the n unique keys of the
  batch and hands them to ``TfExtTableFindOrInsert``, which keeps the rows of
  the keys that are new.

In inference (find-only) lookups a missing key reads the initializer's
constant value, or zeros for random and generic initializers; nothing is
inserted.
"""

import copy
import hashlib
import math

import numpy as np
import tensorflow as tf

__all__ = ["InitSpec", "resolve", "default_initializer", "require_deterministic_seeds"]

_deterministic_seeds = False


def require_deterministic_seeds(value=True):
    """Makes embeddings created afterwards without a graph or op seed derive their seeds from their names.

    Multi-process training (tensorflow_ext.horovod) calls this: replicas of an
    embedding must give a new key the same initial row in every process.

    Args:
      value: bool.

    Returns:
      The previous setting.
    """
    global _deterministic_seeds
    old = _deterministic_seeds
    _deterministic_seeds = bool(value)
    return old


_KERNEL_KINDS = ("constant", "random_normal", "truncated_normal", "random_uniform")
# TF's truncated normal of unit variance has stddev 0.87962566103423978 (VarianceScaling).
_TRUNC_STDDEV_CORRECTION = 0.87962566103423978


class InitSpec(object):
    """How new rows of a dynamic embedding are initialized.

    Attributes:
      kind: one of "constant", "random_normal", "truncated_normal",
        "random_uniform" (in-kernel kinds), or None for the generic path.
      a, b: the kind's parameters (constant value / mean, stddev / minval,
        maxval).
      seed: the op-level seed the user gave (or None).
      fn: for the generic path, the callable ``fn(shape, dtype)``.
      row: for a constant vector initializer, the ``[dim]`` row.
      description: a short human-readable description.
    """

    def __init__(self, kind=None, a=0.0, b=1.0, seed=None, fn=None, row=None, description=""):
        if kind is not None and kind not in _KERNEL_KINDS:
            raise ValueError("unknown init kind %r" % (kind,))
        self.kind = kind
        self.a = float(a)
        self.b = float(b)
        self.seed = seed
        self.fn = fn
        self.row = None if row is None else np.asarray(row, dtype=np.float32)
        self.description = description
        self._pinned = None  # (seed, seed2) fixed by pinned_for

    @property
    def in_kernel(self):
        """True if the lookup kernel can draw new rows itself."""
        return self.kind is not None

    def missing_row(self, dim):
        """The [dim] row a find-only lookup returns for a missing key."""
        if self.kind == "constant":
            return np.full([dim], self.a, dtype=np.float32)
        if self.row is not None:
            return self.row
        return np.zeros([dim], dtype=np.float32)

    def embedding_column_defaults(self, dim):
        """Column defaults of the embedding columns (used when an op inserts a key
        without providing its embedding, e.g. an optimizer update of a key that a
        lookup did not insert): the constant value, else zeros."""
        return [float(v) for v in self.missing_row(dim)]

    def seeds(self):
        """(seed, seed2) for the kernel attrs.

        Fixed by `pinned_for` when the embedding is created (so every lookup and
        update of one embedding draws a key's row from the same (seed, seed2,
        key)); otherwise from the graph seed and op seed at the call.
        """
        if self._pinned is not None:
            return self._pinned
        seed, seed2 = tf.compat.v1.get_seed(self.seed)
        return int(seed or 0), int(seed2 or 0)

    def kernel_attrs(self):
        """The initializer attrs of the lookup kernels: init_kind, init_a, init_b, seed, seed2 (in-kernel kinds)."""
        seed, seed2 = self.seeds()
        return dict(init_kind=self.kind, init_a=self.a, init_b=self.b, seed=seed, seed2=seed2)

    def pinned_for(self, name):
        """A copy of this spec whose kernel seeds are fixed now, for embedding `name`.

        Seeds come from the graph and op seeds. With neither set they are 0, 0
        (a fresh random stream per process, as TF's random ops), unless
        `require_deterministic_seeds(True)` was called (multi-process training:
        every process must draw the same initial row for a key): then they are
        derived from the embedding's name.

        Args:
          name: the embedding's full name.

        Returns:
          A new InitSpec.
        """
        seed, seed2 = tf.compat.v1.get_seed(self.seed)
        if seed is None and seed2 is None and _deterministic_seeds:
            digest = hashlib.sha256(name.encode("utf-8")).digest()
            seed = int.from_bytes(digest[:8], "little") & 0x7FFFFFFFFFFFFFFF
            seed2 = int.from_bytes(digest[8:16], "little") & 0x7FFFFFFFFFFFFFFF
        pinned = copy.copy(self)
        pinned._pinned = (int(seed or 0), int(seed2 or 0))  # pylint: disable=protected-access
        return pinned

    def make_rows(self, n, dim):
        """Builds in-graph initial rows [n, dim] float32 for n keys (n: int32 scalar tensor)."""
        shape = tf.stack([n, tf.constant(dim, tf.int32)])
        if self.kind == "constant":
            return tf.fill(shape, tf.constant(self.a, tf.float32))
        if self.kind == "random_normal":
            return tf.random.normal(shape, self.a, self.b, dtype=tf.float32, seed=self.seed)
        if self.kind == "truncated_normal":
            return tf.random.truncated_normal(shape, self.a, self.b, dtype=tf.float32, seed=self.seed)
        if self.kind == "random_uniform":
            return tf.random.uniform(shape, self.a, self.b, dtype=tf.float32, seed=self.seed)
        if self.row is not None:
            return tf.tile(tf.constant(self.row[None, :]), tf.stack([n, tf.constant(1, tf.int32)]))
        try:
            rows = _call(self.fn, shape)
        except (TypeError, ValueError):
            # Initializers that need a static shape (e.g. orthogonal): one [1, dim]
            # draw per key, in a loop (slow; only for new rows of such initializers).
            rows = tf.map_fn(
                lambda _: tf.reshape(tf.cast(_call(self.fn, [1, dim]), tf.float32), [dim]),
                tf.range(n),
                dtype=tf.float32,
            )
        rows = tf.convert_to_tensor(rows)
        if rows.dtype != tf.float32:
            rows = tf.cast(rows, tf.float32)
        return tf.reshape(rows, shape)

    def __repr__(self):
        return "InitSpec(%s)" % (self.description or self.kind)


def default_initializer(dim):
    """The initializer used when none is given: truncated normal, stddev 1/sqrt(dim).

    (The default of ``tf.feature_column.embedding_column``.)
    """
    return InitSpec(
        "truncated_normal", 0.0, 1.0 / math.sqrt(dim), None, description="truncated_normal(0, 1/sqrt(%d))" % dim
    )


def _class_names(obj):
    return [c.__name__ for c in type(obj).__mro__]


def _config(obj):
    try:
        return dict(obj.get_config())
    except Exception:  # pylint: disable=broad-except
        return None


def _scalar(value):
    arr = np.asarray(value, dtype=np.float64)
    if arr.size == 1:
        return float(arr.reshape(()))
    return None


def resolve(initializer, dim):
    """Turns an ``initializer`` argument into an :class:`InitSpec`.

    Args:
      initializer: None (default), a python number, a TF/Keras initializer, or
        any callable ``init(shape, dtype)``.
      dim: the embedding dimension.

    Returns:
      An InitSpec.

    Raises:
      TypeError: initializer is neither a number nor callable.
      ValueError: a constant vector whose length is not dim.
    """
    if initializer is None:
        return default_initializer(dim)
    if isinstance(initializer, InitSpec):
        return initializer
    if isinstance(initializer, (bool, np.bool_)):
        raise TypeError("initializer must be a number or an initializer, got bool %r" % initializer)
    if isinstance(initializer, (int, float, np.integer, np.floating)):
        return InitSpec("constant", float(initializer), description="constant(%g)" % float(initializer))
    if isinstance(initializer, (list, tuple, np.ndarray)):
        row = np.asarray(initializer, dtype=np.float32).reshape([-1])
        if row.size == 1:
            return InitSpec("constant", float(row[0]), description="constant(%g)" % float(row[0]))
        if row.size != dim:
            raise ValueError("a constant initializer vector must have dim=%d values, got %d" % (dim, row.size))
        return InitSpec(None, row=row, description="constant row")
    if not callable(initializer):
        raise TypeError(
            "initializer must be a number, a TF initializer or a callable init(shape, dtype); "
            "got %r" % (initializer,)
        )

    names = _class_names(initializer)
    cfg = _config(initializer)
    if cfg is not None:
        seed = cfg.get("seed")
        if "Zeros" in names or "ZerosInitializer" in names:
            return InitSpec("constant", 0.0, description="zeros")
        if "Ones" in names or "OnesInitializer" in names:
            return InitSpec("constant", 1.0, description="ones")
        if "Constant" in names or "ConstantInitializer" in names:
            value = cfg.get("value", 0.0)
            scalar = _scalar(value)
            if scalar is not None:
                return InitSpec("constant", scalar, description="constant(%g)" % scalar)
            row = np.asarray(value, dtype=np.float32).reshape([-1])
            if row.size != dim:
                raise ValueError(
                    "a Constant initializer for a dynamic embedding must hold a scalar or dim=%d "
                    "values, got %d" % (dim, row.size)
                )
            return InitSpec(None, row=row, description="constant row")
        # VarianceScaling subclasses (GlorotUniform, HeNormal, ...) before the plain random classes.
        if "VarianceScaling" in names and hasattr(initializer, "scale") and hasattr(initializer, "distribution"):
            scale = float(initializer.scale)
            distribution = str(initializer.distribution).lower()
            n = float(dim)  # fan_in = fan_out = dim for a row
            variance = scale / max(1.0, n)
            if distribution == "uniform":
                limit = math.sqrt(3.0 * variance)
                return InitSpec("random_uniform", -limit, limit, seed, description="variance_scaling uniform")
            if distribution in ("truncated_normal",):
                return InitSpec(
                    "truncated_normal",
                    0.0,
                    math.sqrt(variance) / _TRUNC_STDDEV_CORRECTION,
                    seed,
                    description="variance_scaling truncated_normal",
                )
            if distribution in ("untruncated_normal", "normal"):
                return InitSpec("random_normal", 0.0, math.sqrt(variance), seed, description="variance_scaling normal")
        if "RandomNormal" in names and "mean" in cfg and "stddev" in cfg:
            return InitSpec(
                "random_normal",
                cfg["mean"],
                cfg["stddev"],
                seed,
                description="random_normal(%g, %g)" % (cfg["mean"], cfg["stddev"]),
            )
        if "TruncatedNormal" in names and "mean" in cfg and "stddev" in cfg:
            return InitSpec(
                "truncated_normal",
                cfg["mean"],
                cfg["stddev"],
                seed,
                description="truncated_normal(%g, %g)" % (cfg["mean"], cfg["stddev"]),
            )
        if "RandomUniform" in names and "minval" in cfg and "maxval" in cfg:
            minval, maxval = _scalar(cfg["minval"]), _scalar(cfg["maxval"])
            if minval is not None and maxval is not None:
                return InitSpec(
                    "random_uniform", minval, maxval, seed, description="random_uniform(%g, %g)" % (minval, maxval)
                )
    return InitSpec(None, fn=initializer, description=type(initializer).__name__)


def _call(fn, shape):
    try:
        return fn(shape, dtype=tf.float32)
    except TypeError as e:
        if "dtype" not in str(e):
            raise
        return fn(shape)
