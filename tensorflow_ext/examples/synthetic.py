"""A synthetic Criteo-like click stream with a hidden logistic model.

Used by the CTR example (``python -m tensorflow_ext.examples.ctr``) and by a
benchmark (``tools/bench_graph_passes.py``) so that both train on the same task.

The stream
----------
Each example has the Criteo layout: 26 categorical fields ``C1..C26`` and 13
integer ("count") fields ``I1..I13``, plus a 0/1 label.

* Categorical field ``f`` draws a *rank* from a bounded Zipf (power law) with
  exponent ``zipf_a`` over ``1..n_f`` (``n_f`` = the field's cardinality: the
  Criteo Kaggle cardinalities capped at ``max_ids``), and maps it to an id in
  ``[0, n_f)`` by a fixed bijection, so frequent ids are spread over the id
  space. With probability ``missing_rate[f]`` the value is missing (``-1``).
* Count field ``j`` is ``floor(expm1(max(0, 1.5 + z_j)))`` with a latent
  ``z_j ~ N(0, 1)``, i.e. a heavy-tailed count as in Criteo; models usually feed
  ``log1p(count)`` (:func:`log_counts`).
* The label is ``Bernoulli(sigmoid(logit))`` with the hidden logit::

      logit = bias + sum_f w(f, id_f)                      # per-id weights
                   + sum_j v_j z_j                         # dense weights
                   + sum_{f<g} <u(f, id_f), u(g, id_g)>    # pairwise (FM-like) interactions

  where ``w(f, id)`` and the ``latent_dim``-vector ``u(f, id)`` are derived
  deterministically from a 64-bit hash of ``(seed, field, id)`` (zero-mean,
  standard deviations ``weight_scale`` and ``latent_scale``), and ``v`` from
  ``seed``. A missing value contributes nothing. Frequent ids are learnable
  quickly, tail ids slowly or never, so AUC grows with training and with model
  capacity for ids; :meth:`CriteoLikeStream.oracle_auc` gives the ceiling (the
  AUC of the hidden logit itself).

Batches are pure functions of ``(seed, split, batch_index, batch_size)``:
training batch ``i`` is the same in every run, and the ``"eval"`` split is
disjoint from ``"train"`` (independent draws). A run that continues from a
checkpoint at global step ``s`` can start at batch ``s`` to see new data
("the next day").

API
---
``CriteoLikeStream(seed=0, max_ids=2**22, zipf_a=1.1, ...)``:

* ``.batch(index, batch_size, split="train")`` -> ``(features, labels, logits)``:
  numpy; ``features`` maps ``"C1".."C26"`` to int64 ``[batch]`` (``-1`` = missing)
  and ``"I1".."I13"`` to float32 ``[batch]`` counts; ``labels`` float32 ``[batch]``.
* ``.dataset(batch_size, num_batches, start=0, split="train", log_dense=True,
  string_ids=False)`` -> a ``tf.data.Dataset`` of ``(features, labels)`` with
  tensors of shape ``[batch_size]`` (made with ``tf.numpy_function``; works in
  TF1 graph mode and in Estimator ``input_fn`` s).
* ``.oracle_auc(num_batches, batch_size, split="eval")`` -> float.
* ``.write_tsv(path, num_rows, start=0, split="train")``: writes Criteo-format TSV
  (``label \\t 13 ints \\t 26 8-hex-digit strings``, missing = empty field).
* Module functions: :func:`log_counts`, :func:`auc`, and the constants
  ``CATEGORICAL_KEYS``, ``DENSE_KEYS``, ``CRITEO_CARDINALITIES``.
"""

import numpy as np

__all__ = [
    "CATEGORICAL_KEYS",
    "CRITEO_CARDINALITIES",
    "CriteoLikeStream",
    "DENSE_KEYS",
    "auc",
    "log_counts",
]

NUM_CATEGORICAL = 26
NUM_DENSE = 13
CATEGORICAL_KEYS = tuple("C%d" % (i + 1) for i in range(NUM_CATEGORICAL))
DENSE_KEYS = tuple("I%d" % (i + 1) for i in range(NUM_DENSE))

# Distinct values per categorical field in the Criteo Kaggle display-ads data set.
CRITEO_CARDINALITIES = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)
# Fraction of missing values per categorical field (Criteo-like; the last fields are often empty).
DEFAULT_MISSING_RATES = (
    0.0,
    0.0,
    0.03,
    0.03,
    0.0,
    0.12,
    0.0,
    0.0,
    0.0,
    0.0,
    0.0,
    0.03,
    0.0,
    0.0,
    0.0,
    0.03,
    0.0,
    0.0,
    0.44,
    0.44,
    0.03,
    0.76,
    0.0,
    0.0,
    0.44,
    0.44,
)

_SPLITS = {"train": 1, "eval": 2}
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_PRIME = 2147483647  # 2^31 - 1, larger than every cardinality, so coprime with each


def _splitmix64(x):
    """Vectorised SplitMix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _hash_unit(seed, field, ids, salt):
    """Zero-mean, unit-variance values (uniform on [-sqrt3, sqrt3]) from (seed, field, id, salt)."""
    with np.errstate(over="ignore"):
        k = np.uint64(seed) * np.uint64(0xD6E8FEB86659FD93) ^ np.uint64(field * 1000003 + salt * 7919 + 1) * np.uint64(
            0x9E3779B97F4A7C15
        )
        h = _splitmix64(ids.astype(np.uint64) ^ _splitmix64(k))
    u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)  # [0, 1)
    return (u - 0.5) * np.sqrt(12.0)


def log_counts(x):
    """The usual Criteo dense transform: ``log1p(max(x, 0))`` (numpy or TF tensors).

    Args:
      x: counts; negative values (and the ``-1``/``0`` of missing values) map to 0.

    Returns:
      ``log1p(max(x, 0))`` with the input's type (numpy array or tensor).
    """
    if isinstance(x, np.ndarray):
        return np.log1p(np.maximum(x, 0)).astype(np.float32)
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.math.log1p(tf.maximum(x, 0.0))


def auc(labels, scores):
    """Exact ROC AUC (ties counted half) of ``scores`` for 0/1 ``labels``.

    Args:
      labels: 0/1 array.
      scores: array of the same length.

    Returns:
      The AUC as a float (0.5 when one class is absent).
    """
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return 0.5
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # Average ranks over ties.
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


class CriteoLikeStream(object):
    """A deterministic synthetic Criteo-like stream with hidden-model labels.

    Args:
      seed: selects the hidden model and the draws (int >= 0).
      max_ids: cap on each field's cardinality (the id space per field).
      zipf_a: Zipf exponent of the id frequencies (> 0, != 1; 1.1 is typical of
        click logs).
      cardinalities: 26 per-field id-space sizes before the cap (default: Criteo's).
      missing_rates: 26 per-field probabilities of a missing value.
      weight_scale: std of the per-id hidden weights ``w``.
      latent_dim: width of the hidden interaction vectors ``u`` (0 disables the
        interaction term).
      latent_scale: std of each component of ``u``.
      dense_scale: std of the dense part ``sum_j v_j z_j``.
      bias: the hidden logit's intercept (sets the click rate, ~0.25 by default).
      drift: ranks the popularity of ids moves per batch of the stream's clock (0: a stationary stream). At clock
        t, rank r draws the id of rank ``r + floor(t * drift)`` of clock 0: ids that were popular fade into the
        tail, ids never seen before become popular (the hidden weight of an id never changes).

    Raises:
      ValueError: bad argument values.
    """

    def __init__(
        self,
        seed=0,
        max_ids=2**22,
        zipf_a=1.1,
        cardinalities=None,
        missing_rates=None,
        weight_scale=0.3,
        latent_dim=4,
        latent_scale=0.15,
        dense_scale=0.8,
        bias=-1.5,
        drift=0.0,
    ):
        if int(seed) < 0:
            raise ValueError("seed must be >= 0, got %r" % (seed,))
        if int(max_ids) < 2:
            raise ValueError("max_ids must be >= 2, got %r" % (max_ids,))
        if zipf_a <= 0 or abs(zipf_a - 1.0) < 1e-6:
            raise ValueError("zipf_a must be > 0 and != 1, got %r" % (zipf_a,))
        cards = CRITEO_CARDINALITIES if cardinalities is None else tuple(cardinalities)
        miss = DEFAULT_MISSING_RATES if missing_rates is None else tuple(missing_rates)
        if len(cards) != NUM_CATEGORICAL or len(miss) != NUM_CATEGORICAL:
            raise ValueError("cardinalities and missing_rates need %d entries" % NUM_CATEGORICAL)
        if any(not 0.0 <= m < 1.0 for m in miss):
            raise ValueError("missing_rates must be in [0, 1)")
        self.seed = int(seed)
        self.max_ids = int(max_ids)
        self.zipf_a = float(zipf_a)
        self.cardinalities = tuple(int(min(max(c, 2), self.max_ids)) for c in cards)
        self.missing_rates = tuple(float(m) for m in miss)
        self.weight_scale = float(weight_scale)
        self.latent_dim = int(latent_dim)
        self.latent_scale = float(latent_scale)
        self.bias = float(bias)
        if drift < 0:
            raise ValueError("drift must be >= 0, got %r" % (drift,))
        self.drift = float(drift)
        rng = np.random.default_rng([self.seed, 12345])
        v = rng.normal(size=NUM_DENSE)
        self.dense_weights = v / np.linalg.norm(v) * float(dense_scale)
        self._offsets = rng.integers(0, 2**31, size=NUM_CATEGORICAL)
        # Hex salts make the TSV strings of different fields differ.
        self._hex_salts = rng.integers(0, 2**32, size=NUM_CATEGORICAL, dtype=np.uint64)

    # ------------------------------------------------------------------ draws

    def _ranks(self, rng, n, size):
        """Bounded Zipf ranks in [1, n] by the inverse CDF of the continuous power law."""
        s = 1.0 - self.zipf_a
        u = rng.random(size)
        top = (n + 1.0) ** s
        r = np.floor((1.0 + u * (top - 1.0)) ** (1.0 / s))
        return np.clip(r, 1, n).astype(np.int64)

    def hidden_weight(self, field, ids):
        """The hidden per-id weights ``w(field, ids)`` (numpy float64, 0 for missing ids).

        Args:
          field: field index in ``[0, 26)``.
          ids: int64 array of ids (``-1`` = missing).

        Returns:
          float64 array shaped like ``ids``.
        """
        ids = np.asarray(ids, dtype=np.int64)
        w = self.weight_scale * _hash_unit(self.seed, field, ids, 0)
        return np.where(ids >= 0, w, 0.0)

    def hidden_latent(self, field, ids):
        """The hidden interaction vectors ``u(field, ids)``: ``ids.shape + [latent_dim]`` (0 if missing)."""
        ids = np.asarray(ids, dtype=np.int64)
        cols = [self.latent_scale * _hash_unit(self.seed, field, ids, 1 + l) for l in range(self.latent_dim)]
        u = np.stack(cols, axis=-1) if cols else np.zeros(ids.shape + (0,))
        return np.where((ids >= 0)[..., None], u, 0.0)

    def batch(self, index, batch_size, split="train", clock=None):
        """One batch of the stream, a pure function of its arguments and the seed.

        Args:
          index: batch index (int >= 0).
          batch_size: examples per batch.
          split: ``"train"`` or ``"eval"`` (independent draws).
          clock: the time of the batch for ``drift`` (default: ``index`` for "train", 0 for "eval"; evaluate "the
            next day" with the clock of its first training batch).

        Returns:
          ``(features, labels, logits)``: ``features`` maps ``C1..C26`` to int64
          ``[batch_size]`` ids (``-1`` = missing) and ``I1..I13`` to float32
          counts; ``labels`` float32 0/1; ``logits`` float64 hidden logits.

        Raises:
          ValueError: unknown split.
        """
        if split not in _SPLITS:
            raise ValueError("split must be one of %s, got %r" % (sorted(_SPLITS), split))
        rng = np.random.default_rng([self.seed, _SPLITS[split], int(index)])
        if clock is None:
            clock = index if split == "train" else 0
        shift = int(np.floor(float(clock) * self.drift))
        b = int(batch_size)
        features = {}
        logit = np.full(b, self.bias)
        sum_u = np.zeros((b, self.latent_dim))
        sum_u2 = np.zeros(b)
        for f, key in enumerate(CATEGORICAL_KEYS):
            n = self.cardinalities[f]
            ranks = self._ranks(rng, n, b)
            ids = ((ranks - 1 + shift) * _PRIME + int(self._offsets[f])) % n
            if self.missing_rates[f] > 0:
                ids = np.where(rng.random(b) < self.missing_rates[f], -1, ids)
            features[key] = ids.astype(np.int64)
            logit += self.hidden_weight(f, ids)
            if self.latent_dim:
                u = self.hidden_latent(f, ids)
                sum_u += u
                sum_u2 += np.sum(u * u, axis=1)
        if self.latent_dim:
            logit += 0.5 * (np.sum(sum_u * sum_u, axis=1) - sum_u2)
        z = rng.normal(size=(b, NUM_DENSE))
        logit += z @ self.dense_weights
        counts = np.floor(np.expm1(np.maximum(0.0, 1.5 + z))).astype(np.float32)
        for j, key in enumerate(DENSE_KEYS):
            features[key] = counts[:, j]
        labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return features, labels, logit

    def oracle_auc(self, num_batches, batch_size, split="eval", clock=None):
        """AUC of the hidden logit on ``num_batches`` batches: the best any model can do.

        Args:
          num_batches: number of batches (from index 0).
          batch_size: examples per batch.
          split: ``"train"`` or ``"eval"``.
          clock: as in `batch`.

        Returns:
          float AUC.
        """
        labels, logits = [], []
        for i in range(int(num_batches)):
            _, y, lg = self.batch(i, batch_size, split, clock)
            labels.append(y)
            logits.append(lg)
        return auc(np.concatenate(labels), np.concatenate(logits))

    def hex_ids(self, field, ids):
        """Criteo-style 8-hex-digit strings for ``ids`` of ``field`` (``""`` for missing).

        Args:
          field: field index in ``[0, 26)``.
          ids: int64 array (``-1`` = missing).

        Returns:
          numpy array of ``bytes``.
        """
        ids = np.asarray(ids, dtype=np.int64)
        m32 = np.uint64(0xFFFFFFFF)
        # A bijection of 32-bit values (xor, odd multiplies, xor-shifts): distinct ids stay distinct.
        with np.errstate(over="ignore"):
            x = (ids.astype(np.uint64) ^ self._hex_salts[field]) & m32
            x = (x * np.uint64(0x45D9F3B)) & m32
            x ^= x >> np.uint64(16)
            x = (x * np.uint64(0x119DE1F3)) & m32
            x ^= x >> np.uint64(15)
        out = np.array([b"%08x" % int(v) for v in x], dtype=object)
        out[ids < 0] = b""
        return out

    # ------------------------------------------------------------------ TF

    def dataset(
        self,
        batch_size,
        num_batches,
        start=0,
        split="train",
        log_dense=True,
        string_ids=False,
        num_parallel_calls=2,
        clock=None,
    ):
        """A ``tf.data.Dataset`` of ``(features, labels)`` batches of the stream.

        Args:
          batch_size: examples per batch.
          num_batches: batches to produce (None: endless).
          start: index of the first batch.
          split: ``"train"`` or ``"eval"``.
          log_dense: feed ``log1p(count)`` instead of raw counts for ``I1..I13``.
          string_ids: give categorical values as Criteo-style hex strings
            (missing = ``""``) instead of int64 ids (missing = ``-1``).
          num_parallel_calls: batches generated in parallel.
          clock: as in `batch` (one clock for every batch; default: each batch's own).

        Returns:
          A ``tf.data.Dataset`` whose elements are ``(features dict, labels)`` with
          tensors of static shape ``[batch_size]``.

        Raises:
          ValueError: unknown split.
        """
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        if split not in _SPLITS:
            raise ValueError("split must be one of %s, got %r" % (sorted(_SPLITS), split))
        b = int(batch_size)
        cat_dtype = tf.string if string_ids else tf.int64

        def gen(index):
            feats, labels, _ = self.batch(int(index), b, split, clock)
            out = []
            for f, key in enumerate(CATEGORICAL_KEYS):
                out.append(self.hex_ids(f, feats[key]) if string_ids else feats[key])
            dense = np.stack([feats[k] for k in DENSE_KEYS], axis=1)
            out.append(log_counts(dense) if log_dense else dense)
            out.append(labels)
            return tuple(out)

        touts = [cat_dtype] * NUM_CATEGORICAL + [tf.float32, tf.float32]

        def to_tensors(index):
            vals = tf.compat.v1.numpy_function(gen, [index], touts, stateful=False)
            features = {}
            for key, v in zip(CATEGORICAL_KEYS, vals[:NUM_CATEGORICAL]):
                v.set_shape([b])
                features[key] = v
            dense = vals[NUM_CATEGORICAL]
            dense.set_shape([b, NUM_DENSE])
            for j, key in enumerate(DENSE_KEYS):
                features[key] = dense[:, j]
            labels = vals[NUM_CATEGORICAL + 1]
            labels.set_shape([b])
            return features, labels

        start = int(start)
        stop = None if num_batches is None else start + int(num_batches)
        ds = tf.data.Dataset.range(start, stop) if stop is not None else tf.data.Dataset.range(start, 2**62)
        return ds.map(to_tensors, num_parallel_calls=num_parallel_calls).prefetch(2)

    def write_tsv(self, path, num_rows, start=0, split="train", batch_size=1024):
        """Writes ``num_rows`` examples in Criteo TSV format.

        Each line is ``label \\t I1..I13 \\t C1..C26``: integer counts, 8-hex-digit
        categorical strings (:meth:`hex_ids`); missing values are empty fields.

        Args:
          path: output file.
          num_rows: number of lines.
          start: first batch index of the stream.
          split: ``"train"`` or ``"eval"``.
          batch_size: batch size used to draw the rows.

        Returns:
          The number of lines written.
        """
        written = 0
        index = int(start)
        with open(path, "wb") as out:
            while written < num_rows:
                feats, labels, _ = self.batch(index, batch_size, split)
                index += 1
                n = min(batch_size, num_rows - written)
                hexes = [self.hex_ids(f, feats[k][:n]) for f, k in enumerate(CATEGORICAL_KEYS)]
                for i in range(n):
                    ints = [b"%d" % int(feats[k][i]) for k in DENSE_KEYS]
                    cats = [h[i] for h in hexes]
                    out.write(b"\t".join([b"%d" % int(labels[i])] + ints + cats) + b"\n")
                written += n
        return written
