"""The ctr26 benchmark's workload and model variants, shared by tools/bench_ctr_speed.py and tools/bench_ctr_quality.py.

Workload: 26 categorical fields; per field, ids are Zipf(1.1) draws folded into 2^22 values (mod), hashed with the
field id into one int64 key space (:func:`make_batches`; labels random, or from a hidden logistic model over per-key
weights); MLP 256-128-1 on the concatenated embeddings; sigmoid cross-entropy; Adagrad(0.05), row-wise Adagrad(0.05) or
Adam(1e-3).

A :class:`Variant` is one way to hold the embeddings, with its own graph and session; every variant reads the same
pre-generated batches through the same input pipeline (tf.data from in-memory tensors, fed once at iterator init),
so no per-step feed_dict:
  static  tf.nn.embedding_lookup on a [buckets, dim] variable, keys mod buckets (collisions)
  tfra    TFRA: one de.get_variable table, tf.unique, de.embedding_lookup, de.DynamicEmbeddingOptimizer(optimizer)
  ours    tf_ext.get_dynamic_embedding + tf_ext.embedding_lookup(emb, ids[batch, 26]),
          stock optimizer .minimize(loss, global_step)
  ours_prealloc    (opt-in) ours with the memory of 2^21 keys allocated when the table is created
  ours_noprefault  (opt-in) ours with TF_EXT_TABLE_PREFAULT=0: arena slabs faulted in by the inserting thread
          instead of ahead of need
  ours_bf16        (opt-in) ours with bfloat16 rows and optimizer slots
  ours_bf16_rows   (opt-in) ours with bfloat16 rows, float32 slots
Not a script: import it from a script in tools/ (which puts tools/ on sys.path).
"""

import abc
import os

import bench_common as bc
from bench_common import np, tf

FIELDS = 26
MASK63 = (1 << 63) - 1


# --------------------------------------------------------------------------- data


def mix64(x):
    """The table's key mixer (splitmix64's finalizer) on uint64 arrays: tensorflow_ext's own HashKey."""
    from tensorflow_ext.embedding.keys import hash_key_numpy

    return hash_key_numpy(x)


class ZipfSampler(object):
    """Zipf(a) ids folded into [0, vocab): numpy's zipf draw (k >= 1, unbounded) mod vocab.

    About 20% of Zipf(1.1) draws exceed 2^22; folding them back spreads them over
    the whole range, which is what gives the ~2.1M distinct keys after 50 steps (a
    distribution truncated at 2^22 instead gives ~1.1M).
    """

    def __init__(self, a, vocab):
        self.a, self.vocab = float(a), int(vocab)

    def sample(self, rng, shape):
        return rng.zipf(self.a, shape) % self.vocab


def field_keys(ranks):
    """ranks [..., FIELDS] -> int64 keys, rank hashed with its field id (distinct per field)."""
    field = np.arange(ranks.shape[-1], dtype=np.uint64)
    k = mix64((field << np.uint64(40)) | ranks.astype(np.uint64))
    return (k & np.uint64(MASK63)).astype(np.int64)


def hidden_weight(keys):
    """A fixed N(0, 1) weight per key (Box-Muller on two hashes of the key)."""
    k = keys.astype(np.uint64)
    u1 = (mix64(k ^ np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    u2 = (mix64(k ^ np.uint64(0xD1B54A32D192ED03)) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def make_batches(n, batch, sampler, rng, label_mode, scale=0.4, bias=-1.2):
    """Returns keys [n, batch, FIELDS] int64, labels [n, batch, 1] float32 (and true logits)."""
    ranks = sampler.sample(rng, (n, batch, FIELDS))
    keys = field_keys(ranks)
    if label_mode == "hidden":
        logits = bias + scale * hidden_weight(keys).sum(axis=-1)
        labels = (rng.random(logits.shape) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    else:
        logits = None
        labels = (rng.random((n, batch)) < 0.25).astype(np.float32)
    return keys, labels[..., None], logits


# --------------------------------------------------------------------------- model


def mlp_logits(x, seed):
    """MLP 256-128-1 on x [batch, FIELDS * dim]."""
    h = x
    for i, units in enumerate((256, 128)):
        h = tf.compat.v1.layers.dense(
            h,
            units,
            activation=tf.nn.relu,
            name="fc%d" % i,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed + i),
        )
    return tf.compat.v1.layers.dense(
        h, 1, name="out", kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed + 9)
    )


def make_optimizer(name, lr=None):
    if name == "adagrad":
        return tf.compat.v1.train.AdagradOptimizer(0.05 if lr is None else lr)
    if name == "rowwise_adagrad":
        from tensorflow_ext.optimizers import RowwiseAdagradOptimizer

        return RowwiseAdagradOptimizer(0.05 if lr is None else lr)
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(1e-3 if lr is None else lr)
    raise ValueError(name)


def emb_initializer(seed):
    return tf.compat.v1.random_normal_initializer(0.0, 0.01, seed=seed)


class Variant(abc.ABC):
    """One model variant: its own graph and session; the input pipeline is shared code."""

    name = "?"
    label = "?"

    @classmethod
    def unavailable_reason(cls):
        return None

    def __init__(self, keys, labels, optimizer, dim, seed, config, buckets=None, eval_keys=None):
        self.dim, self.buckets, self.optimizer_name = dim, buckets, optimizer
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(seed)
            kp = tf.compat.v1.placeholder(tf.int64, keys.shape)
            lp = tf.compat.v1.placeholder(tf.float32, labels.shape)
            ds = tf.data.Dataset.from_tensor_slices((kp, lp)).repeat()
            it = tf.compat.v1.data.make_initializable_iterator(ds)
            ids, y = it.get_next()
            ids.set_shape(keys.shape[1:])
            y.set_shape(labels.shape[1:])
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            with tf.compat.v1.variable_scope("model"):
                emb = self.embed(ids)  # [batch, FIELDS, dim]
                x = tf.reshape(emb, [-1, keys.shape[-1] * dim])
                logits = mlp_logits(x, seed)
            self.loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
            opt = make_optimizer(optimizer)
            self.train_op = self.minimize(opt, self.loss)
            self.size_op = self.table_size()
            self.mem_op = self.table_bytes()
            if eval_keys is not None:
                self.eval_ids = tf.compat.v1.placeholder(tf.int64, [None, keys.shape[-1]])
                with tf.compat.v1.variable_scope("model", reuse=True):
                    e = self.embed_eval(self.eval_ids)
                    xe = tf.reshape(e, [-1, keys.shape[-1] * dim])
                    self.eval_logits = mlp_logits(xe, seed)
        self.sess = bc.start_session(self.graph, config)
        self.sess.run(it.initializer, {kp: keys, lp: labels})

    # hooks
    @abc.abstractmethod
    def embed(self, ids):
        """The [batch, fields, dim] embeddings of `ids` (training graph)."""

    def embed_eval(self, ids):
        return self.embed(ids)

    def minimize(self, opt, loss):
        return opt.minimize(loss, global_step=self.global_step)

    def table_size(self):
        return None

    def table_bytes(self):
        return None

    def step(self):
        self.sess.run(self.train_op)

    def run_loss(self):
        return float(self.sess.run(self.loss))

    def size(self):
        return int(self.sess.run(self.size_op)) if self.size_op is not None else None

    def memory_bytes(self):
        return int(self.sess.run(self.mem_op)) if self.mem_op is not None else None

    def predict(self, keys):
        return self.sess.run(self.eval_logits, {self.eval_ids: keys})

    def close(self):
        self.sess.close()


class StaticVariant(Variant):
    name = "static"
    label = "static tf.nn.embedding_lookup (2^20 buckets, ids mod buckets)"

    def embed(self, ids):
        self.table = tf.compat.v1.get_variable(
            "emb", [self.buckets, self.dim], tf.float32, initializer=emb_initializer(11), use_resource=True
        )
        return tf.nn.embedding_lookup(self.table, tf.math.floormod(ids, self.buckets))

    def embed_eval(self, ids):
        return tf.nn.embedding_lookup(self.table, tf.math.floormod(ids, self.buckets))

    def table_size(self):
        return tf.constant(self.buckets, tf.int64)

    def table_bytes(self):
        slots = {"adagrad": 1, "adam": 2}[self.optimizer_name]
        return tf.constant(self.buckets * self.dim * 4 * (1 + slots), tf.int64)


class TFRAVariant(Variant):
    name = "tfra"
    label = "TFRA 0.7.2 (tf.unique + de.embedding_lookup + DynamicEmbeddingOptimizer)"

    @classmethod
    def unavailable_reason(cls):
        de, reason, version = bc.import_tfra()
        if de is not None:
            cls.label = cls.label.replace("0.7.2", version)
        return reason

    def embed(self, ids):
        de, _, _ = bc.import_tfra()
        self.de = de
        self.var = de.get_variable(
            "emb", key_dtype=tf.int64, value_dtype=tf.float32, dim=self.dim, initializer=emb_initializer(11)
        )
        flat = tf.reshape(ids, [-1])
        uniq, idx = tf.unique(flat)
        rows = de.embedding_lookup(self.var, uniq, name="lookup")
        return tf.reshape(tf.gather(rows, idx), tf.concat([tf.shape(ids), [self.dim]], 0))

    def embed_eval(self, ids):
        rows = self.var.lookup(tf.reshape(ids, [-1]))
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.dim]], 0))

    def minimize(self, opt, loss):
        return self.de.DynamicEmbeddingOptimizer(opt).minimize(loss, global_step=self.global_step)

    def table_size(self):
        return self.var.size()


class OursVariant(Variant):
    name = "ours"
    label = "tensorflow_ext (get_dynamic_embedding + embedding_lookup + stock optimizer)"

    @classmethod
    def unavailable_reason(cls):
        _, reason = bc.import_ours_embedding()
        return reason

    table_options = {}  # extra get_dynamic_embedding arguments of a variant

    def embed(self, ids):
        tf_ext, _ = bc.import_ours_embedding()
        self.emb = tf_ext.get_dynamic_embedding(
            "emb", dim=self.dim, initializer=emb_initializer(11), **self.table_options
        )
        self.tf_ext = tf_ext
        return tf_ext.embedding_lookup(self.emb, ids)

    def embed_eval(self, ids):
        # evaluation must not insert the held-out keys (they would count as memory)
        return self.tf_ext.embedding_lookup(self.emb, ids, is_training=False)

    def table_size(self):
        return self.emb.size()

    def table_bytes(self):
        return self.emb.memory_bytes()


class OursNoPrefaultVariant(OursVariant):
    """Ours with arena prefaulting off (TF_EXT_TABLE_PREFAULT=0), for an A/B run in one process.

    The variable is read when a table is created, so it is set while this variant's
    session creates its tables and restored afterwards; the other variants keep the default.
    """

    name = "ours_noprefault"
    label = "tensorflow_ext, arena prefaulting off (TF_EXT_TABLE_PREFAULT=0)"

    def __init__(self, *args, **kwargs):
        saved = os.environ.get("TF_EXT_TABLE_PREFAULT")
        os.environ["TF_EXT_TABLE_PREFAULT"] = "0"
        try:
            super(OursNoPrefaultVariant, self).__init__(*args, **kwargs)
            self.size()  # creates the tables now, under the variable
        finally:
            if saved is None:
                del os.environ["TF_EXT_TABLE_PREFAULT"]
            else:
                os.environ["TF_EXT_TABLE_PREFAULT"] = saved


class OursPreallocVariant(OursVariant):
    """Ours with the memory of 2^21 keys (~the 2.1M the default run ends with) allocated when the table is created,
    as the static variable's memory is."""

    name = "ours_prealloc"
    label = "tensorflow_ext, initial_capacity=2^21, preallocate=True"
    table_options = {"initial_capacity": 1 << 21, "preallocate": True}


class OursBF16Variant(OursVariant):
    """Ours with compact rows: bfloat16 embedding columns and optimizer slots (the optimizer's math stays float32,
    rounded back stochastically)."""

    name = "ours_bf16"
    label = "tensorflow_ext, bf16 rows and slots (value_dtype=slot_dtype=tf.bfloat16)"
    table_options = {"value_dtype": tf.bfloat16, "slot_dtype": tf.bfloat16, "rounding": "stochastic"}


class OursBF16RowsVariant(OursVariant):
    """Ours with bfloat16 embedding columns and float32 optimizer slots (with row-wise Adagrad: one per row)."""

    name = "ours_bf16_rows"
    label = "tensorflow_ext, bf16 rows, float32 slots (value_dtype=tf.bfloat16)"
    table_options = {"value_dtype": tf.bfloat16, "rounding": "stochastic"}


VARIANTS = [
    StaticVariant,
    TFRAVariant,
    OursVariant,
    OursPreallocVariant,
    OursNoPrefaultVariant,
    OursBF16Variant,
    OursBF16RowsVariant,
]
BY_NAME = {v.name: v for v in VARIANTS}
# Run only when --variants names them: A/B variants of ours.
OPT_IN_VARIANTS = ("ours_noprefault", "ours_prealloc", "ours_bf16", "ours_bf16_rows")
