#!/usr/bin/env python
"""A small model's training loop: 10 low-cardinality tables, tf_ext (float32 and compact rows) vs static vs TFRA.

The model is shaped like MovieLens-100K (10 feature tables: user, item, age, gender, occupation, zip prefix, genre,
release year, weekday, hour; 3,220 ids in all; batch 256; an epoch of 80,000 examples). The ids and labels are
synthetic (Zipf-like popularity per field, labels from a hidden logistic model over per-id weights): the real data
set is not part of this repository. DeepFM-like: one dim-9 row per id (a first-order weight and an 8-dim vector),
the FM term and an MLP 64-32 on the vectors; Adagrad(0.05) unless the variant says otherwise.

Variants, each its own graph and session, all alive at once; one round trains each variant on 5 epochs' worth of batches (--steps), in a
shuffled order, and the figure is the median of the rounds:

  ours_fp32             tf_ext dynamic embeddings, float32 rows
  ours_bf16             tf_ext, bfloat16 rows and Adagrad accumulators
  ours_bf16_rowwise     tf_ext, bfloat16 rows, row-wise Adagrad (dense layers too)
  static                a static hashed table per field (tf.Variable of 2x its ids, ids hashed into buckets)
  tfra                  TFRA 0.7.2 de.get_variable per field + DynamicEmbeddingOptimizer

  python tools/bench_small_model.py --rounds 7 --json docs/bench_small_model.json
"""

import argparse
import time

import bench_common as bc
from bench_common import np, tf


# Field cardinalities shaped like MovieLens-100K's (user, item, age, gender, occupation, zip prefix, genre, release
# year, weekday, hour): 3,220 ids in all.
SMALL_FIELDS = (943, 1682, 61, 2, 21, 390, 19, 71, 7, 24)
SMALL_DIM = 9  # a first-order weight + an 8-dim vector per id
SMALL_BATCH = 256
SMALL_EXAMPLES = 80000  # one epoch
ROUND_EPOCHS = 5  # a round trains each variant this many epochs (rounds of a few seconds: steadier medians)


def small_batches(seed, steps):
    """ids [steps, batch, fields] int64 (Zipf-like popularity per field) and labels [steps, batch] float32."""
    rng = np.random.default_rng(seed)
    cols, logit = [], np.full((steps, SMALL_BATCH), -0.3)
    for f, card in enumerate(SMALL_FIELDS):
        p = 1.0 / np.arange(1, card + 1) ** 0.8
        ids = rng.choice(card, size=(steps, SMALL_BATCH), p=p / p.sum())
        weight = np.random.default_rng(1000 + f).standard_normal(card) * 0.5
        logit = logit + weight[ids]
        cols.append(ids + (f << 32))  # one key space, disjoint per field
    labels = (rng.random(logit.shape) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return np.stack(cols, axis=-1).astype(np.int64), labels


class SmallVariant(object):
    """One way to hold the 10 tables, with its own graph and session; ``train_round()`` trains one round."""

    name = "?"
    label = "?"

    def __init__(self, ids, labels, seed, config):
        self.steps = ids.shape[0]
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(seed)
            ip = tf.compat.v1.placeholder(tf.int64, ids.shape)
            lp = tf.compat.v1.placeholder(tf.float32, labels.shape)
            ds = tf.data.Dataset.from_tensor_slices((ip, lp)).repeat()
            it = tf.compat.v1.data.make_initializable_iterator(ds)
            x, y = it.get_next()
            x.set_shape(ids.shape[1:])
            y.set_shape(labels.shape[1:])
            rows = [self.embed(f, x[:, f]) for f in range(len(SMALL_FIELDS))]  # each [batch, dim]
            emb = tf.stack(rows, axis=1)
            first, vecs = tf.split(emb, [1, SMALL_DIM - 1], axis=2)
            sum_v = tf.reduce_sum(vecs, axis=1)
            fm = 0.5 * tf.reduce_sum(tf.square(sum_v) - tf.reduce_sum(tf.square(vecs), axis=1), axis=1)
            h = tf.reshape(vecs, [-1, len(SMALL_FIELDS) * (SMALL_DIM - 1)])
            for i, units in enumerate((64, 32)):
                h = tf.compat.v1.layers.dense(h, units, tf.nn.relu, name="fc%d" % i)
            logits = tf.compat.v1.layers.dense(h, 1, name="out")[:, 0] + fm + tf.reduce_sum(first, axis=[1, 2])
            self.loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
            self.train_op = self.minimize(self.make_optimizer(tf), self.loss)
            self.mem_op = self.table_bytes(tf)
        self.sess = bc.start_session(self.graph, config)
        self.sess.run(it.initializer, {ip: ids, lp: labels})

    @classmethod
    def unavailable_reason(cls):
        return None

    def make_optimizer(self, tf):
        return tf.compat.v1.train.AdagradOptimizer(0.05)

    def minimize(self, opt, loss):
        # With the global step, as a training loop runs: a compact table's stochastic rounding draws its bits from
        # the step a write leaves in the row, so without one every step rounds a row the same way.
        return opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())

    def table_bytes(self, tf):
        return None

    def train_round(self):
        """Trains one pass over the round's batches; returns the mean loss of its last 50 steps."""
        losses = [self.sess.run([self.train_op, self.loss])[1] for _ in range(self.steps)]
        return float(sum(losses[-50:]) / len(losses[-50:]))

    def memory_bytes(self):
        return int(self.sess.run(self.mem_op)) if self.mem_op is not None else None


class SmallOurs(SmallVariant):
    name = "ours_fp32"
    label = "tf_ext, float32 rows, Adagrad"
    storage = {}

    @classmethod
    def unavailable_reason(cls):
        return bc.import_ours_embedding()[1]

    def embed(self, field, ids):
        tf_ext, _ = bc.import_ours_embedding()
        if field == 0:
            self.tf_ext, self.embs = tf_ext, []
        kwargs = {k: (tf.as_dtype(v) if k.endswith("dtype") else v) for k, v in self.storage.items()}
        emb = tf_ext.get_dynamic_embedding(
            "field_%d" % field, SMALL_DIM, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.05), **kwargs
        )
        self.embs.append(emb)
        return tf_ext.embedding_lookup(emb, ids)

    def table_bytes(self, tf):
        return tf.add_n([e.memory_bytes() for e in self.embs])


class SmallOursBF16(SmallOurs):
    name = "ours_bf16"
    label = "tf_ext, bf16 rows and Adagrad accumulators"
    storage = {"value_dtype": "bfloat16", "slot_dtype": "bfloat16"}


class SmallOursBF16Rowwise(SmallOurs):
    name = "ours_bf16_rowwise"
    label = "tf_ext, bf16 rows, row-wise Adagrad"
    storage = {"value_dtype": "bfloat16"}

    def make_optimizer(self, tf):
        return self.tf_ext.RowwiseAdagradOptimizer(0.05)


class SmallStatic(SmallVariant):
    name = "static"
    label = "static hashed tables (tf.Variable of 2x the field's ids, ids hashed into buckets)"

    def embed(self, field, ids):
        buckets = 2 * SMALL_FIELDS[field]
        if field == 0:
            self.tables = []
        table = tf.compat.v1.get_variable(
            "field_%d" % field,
            [buckets, SMALL_DIM],
            initializer=tf.compat.v1.random_normal_initializer(0.0, 0.05),
            use_resource=True,
        )
        self.tables.append(table)
        return tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), buckets))

    def table_bytes(self, tf):
        # the variables and their Adagrad accumulators
        return tf.constant(sum(2 * 4 * t.shape.num_elements() for t in self.tables), tf.int64)


class SmallTFRA(SmallVariant):
    name = "tfra"
    label = "TFRA 0.7.2 (de.get_variable per field, DynamicEmbeddingOptimizer)"

    @classmethod
    def unavailable_reason(cls):
        de, reason, version = bc.import_tfra()
        if de is not None:
            cls.label = cls.label.replace("0.7.2", version)
        return reason

    def embed(self, field, ids):
        de, _, _ = bc.import_tfra()
        self.de = de
        var = de.get_variable(
            "field_%d" % field,
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            dim=SMALL_DIM,
            initializer=tf.compat.v1.random_normal_initializer(0.0, 0.05),
        )
        uniq, idx = tf.unique(ids)
        return tf.gather(de.embedding_lookup(var, uniq), idx)

    def minimize(self, opt, loss):
        return self.de.DynamicEmbeddingOptimizer(opt).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step()
        )


SMALL_VARIANTS = [SmallOurs, SmallOursBF16, SmallOursBF16Rowwise, SmallStatic, SmallTFRA]


def small_main(args):
    config = bc.session_config(args.intra_op, args.inter_op)
    ids, labels = small_batches(args.seed, args.steps)
    classes, skipped, labels_out = bc.available({c.name: c for c in SMALL_VARIANTS}, args.variants)
    built = []
    for cls in classes:
        try:
            built.append(cls(ids, labels, args.seed, config))
        except Exception as e:  # a variant whose pieces are missing here is reported, not fatal
            bc.log("  %s: FAILED to build: %s: %s" % (cls.name, type(e).__name__, e))
            skipped[cls.name] = "%s: %s" % (type(e).__name__, e)
    times = {v.name: [] for v in built}
    losses = {}
    for r, v in bc.interleaved(built, args.rounds, args.seed + 1):
        t0 = time.perf_counter()
        losses[v.name] = v.train_round()
        times[v.name].append(time.perf_counter() - t0)
        bc.log("  round %d %s: %.2f s" % (r + 1, v.name, times[v.name][-1]))
    results = {}
    for v in built:
        t = times[v.name]
        results[v.name] = {
            "median_s": float(np.median(t)),
            "rounds_s": t,
            "loss_last_50_steps": losses[v.name],
            "table_bytes": v.memory_bytes(),
        }
    return {"results": results, "skipped": skipped, "labels": labels_out}


def small_markdown(out):
    c, res = out["config"], out["results"]
    lines = [
        "seconds per round (%d steps of batch %d, %d tables, %d ids), median of %d interleaved rounds (lower is better)"
        % (c["steps"], SMALL_BATCH, len(SMALL_FIELDS), sum(SMALL_FIELDS), c["rounds"]),
        "",
        "| variant | median s | rounds (s) | vs tf_ext float32 | table bytes | loss (last 50 steps of the last round) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    base = res.get("ours_fp32", {}).get("median_s")
    for cls in SMALL_VARIANTS:
        if cls.name not in res:
            continue
        r = res[cls.name]
        lines.append(
            "| %s | %.2f | %s | %s | %s | %.4f |"
            % (
                out["labels"][cls.name],
                r["median_s"],
                ", ".join("%.2f" % t for t in r["rounds_s"]),
                "%.2fx" % (r["median_s"] / base) if base else "-",
                "{:,}".format(r["table_bytes"]) if r["table_bytes"] is not None else "-",
                r["loss_last_50_steps"],
            )
        )
    for k, v in sorted(out["skipped"].items()):
        lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--steps",
        type=int,
        default=ROUND_EPOCHS * SMALL_EXAMPLES // SMALL_BATCH,
        help="steps per round (default %d: %d epochs)" % (ROUND_EPOCHS * SMALL_EXAMPLES // SMALL_BATCH, ROUND_EPOCHS),
    )
    p.add_argument(
        "--variants", nargs="+", default=[c.name for c in SMALL_VARIANTS], choices=[c.name for c in SMALL_VARIANTS]
    )
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--json")
    bc.add_session_args(p)
    args = p.parse_args(argv)
    info = bc.machine_info()
    t0 = time.time()
    out = dict(small_main(args))
    out.update(
        benchmark="small_model",
        config={k: getattr(args, k) for k in ("rounds", "steps", "variants", "seed", "intra_op", "inter_op")},
        machine=info,
        wall_s=time.time() - t0,
    )
    return bc.finish(out, small_markdown(out), args.json)


if __name__ == "__main__":
    main()
