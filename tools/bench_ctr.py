#!/usr/bin/env python
"""ctr26 end-to-end training-step benchmark, variants side by side.

Workload: 26 categorical fields, batch 4096, embedding dim 16; per field, ids are
Zipf(1.1) draws folded into 2^22 values (mod), hashed with the field id into one
int64 key space; MLP 256-128-1 on the concatenated embeddings; sigmoid cross-entropy;
Adagrad(0.05) (or Adam(1e-3) with --optimizer adam). Median step time of 40
steps after 10 warm-up steps.

Variants (each its own graph and session, all alive at once -- for every optimizer
asked for -- with steps interleaved round-robin so that machine noise hits all
variants alike):
  static  tf.nn.embedding_lookup on a [2^20, 16] variable, keys mod 2^20 (collisions)
  tfra    TFRA 0.7.2: one de.get_variable table, tf.unique, de.embedding_lookup,
          de.DynamicEmbeddingOptimizer(optimizer)
  ours    tf_ext.get_dynamic_embedding + tf_ext.embedding_lookup(emb, ids[batch, 26]),
          stock optimizer .minimize(loss, global_step)
  ours_noprefault  (only when --variants names it) ours with TF_EXT_TABLE_PREFAULT=0:
          arena slabs faulted in by the inserting thread instead of ahead of need
All variants read the same pre-generated batches through the same input
pipeline (tf.data from in-memory tensors, fed once at iterator init), so no
per-step feed_dict.

--quality trains a dynamic model (ours) and a static hashed model with equal
memory on a synthetic task whose labels come from a hidden logistic model over
per-id weights, and compares held-out AUC (see quality_main()).

Full runs:   python tools/bench_ctr.py --optimizer adagrad adam --json docs/bench_ctr.json
             python tools/bench_ctr.py --quality --json docs/bench_ctr_quality.json
Quick run:   python tools/bench_ctr.py --quick
"""

import abc
import argparse
import json
import os
import sys
import time

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


class OursEvictVariant(OursVariant):
    """Quality mode only: ours plus an eviction op fed at run time (min_version, min_frequency)."""

    name = "ours_evict"

    def table_bytes(self):
        self.min_version = tf.compat.v1.placeholder(tf.int64, [])
        self.min_frequency = tf.compat.v1.placeholder(tf.int64, [])
        removed = [s.table.evict(self.min_version, self.min_frequency) for s in self.emb.shards]
        self.evict_op = tf.add_n(removed) if len(removed) > 1 else removed[0]
        return OursVariant.table_bytes(self)

    def evict(self, min_version=-1, min_frequency=-1):
        """Removes keys with version < min_version or frequency < min_frequency; returns the count."""
        return int(self.sess.run(self.evict_op, {self.min_version: min_version, self.min_frequency: min_frequency}))

    def stats(self):
        size, mem, gs = self.sess.run([self.size_op, self.mem_op, self.global_step])
        return int(size), int(mem), int(gs)


class OursNoPrefaultVariant(OursVariant):
    """Ours with arena prefaulting off (TF_EXT_TABLE_PREFAULT=0), for an A/B run in one process.

    The variable is read when a table is created, so it is set while this variant's
    session creates its tables and restored afterwards; the other variants keep the default.
    """

    name = "ours_noprefault"
    label = "tensorflow_ext, arena prefaulting off (TF_EXT_TABLE_PREFAULT=0)"

    def __init__(self, *args, **kwargs):
        import os

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


VARIANTS = [StaticVariant, TFRAVariant, OursVariant, OursPreallocVariant, OursNoPrefaultVariant]
BY_NAME = {v.name: v for v in VARIANTS}
# Run unless --variants names them: A/B variants of ours.
OPT_IN_VARIANTS = ("ours_noprefault", "ours_prealloc")


# --------------------------------------------------------------------------- speed


def speed_main(args):
    config = bc.session_config(args.intra_op, args.inter_op)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    sampler = ZipfSampler(1.1, args.vocab)
    n_batches = args.warmup + args.steps
    keys, labels, _ = make_batches(n_batches, args.batch, sampler, rng, "random")
    bc.log(
        "generated %d batches of %d x %d ids in %.1fs (%d distinct keys in all)"
        % (n_batches, args.batch, FIELDS, time.perf_counter() - t0, len(np.unique(keys)))
    )

    classes, skipped, labels_out = bc.available(BY_NAME, args.variants)
    # Every (optimizer, variant) pair is built up front and their steps are interleaved,
    # so that the "vs static Adagrad" ratios of the Adam rows come from the same minutes.
    built = []
    for opt in args.optimizer:
        for cls in classes:
            t1 = time.perf_counter()
            try:
                v = cls(keys, labels, opt, args.dim, args.seed, config, buckets=args.buckets)
            except Exception as e:
                bc.log("  %s/%s: FAILED to build: %s: %s" % (cls.name, opt, type(e).__name__, e))
                skipped["%s/%s" % (cls.name, opt)] = "%s: %s" % (type(e).__name__, e)
                continue
            bc.log("  %s/%s: built in %.1fs" % (cls.name, opt, time.perf_counter() - t1))
            built.append(v)
    times = {id(v): [] for v in built}
    for i, v in bc.interleaved(built, n_batches, args.seed + 1):
        dt = bc.time_call(v.step)
        if i >= args.warmup:
            times[id(v)].append(dt)
    results = {opt: {} for opt in args.optimizer}
    for v in built:
        opt = v.optimizer_name
        r = bc.summary_ms(times[id(v)])
        r.update(
            {
                "table_size": v.size(),
                "table_bytes": v.memory_bytes(),
                "global_step": int(v.sess.run(v.global_step)),
                "loss": v.run_loss(),
            }
        )
        results[opt][v.name] = r
        bc.log(
            "  %s/%s: median %.1f ms/step (p10 %.1f, p90 %.1f), table size %s"
            % (v.name, opt, r["median_ms"], r["p10_ms"], r["p90_ms"], r["table_size"])
        )
        v.close()
    return {"results": results, "skipped": skipped, "labels": labels_out}


def isolated_main(args):
    """--isolate R: every (optimizer, variant) pair in a fresh process of its own, R rounds in rotating order.

    As a user runs one model per process: variants in one process share its memory, and on a VM whose page faults
    slow down as the process grows (docs/benchmarks.md, section 3) one variant's tables would slow another's growth.
    The figure of a pair is the median of its rounds' medians; ratios are also taken per round.
    """
    import subprocess
    import tempfile

    classes, skipped, labels_out = bc.available(BY_NAME, args.variants)
    pairs = [(opt, cls.name) for opt in args.optimizer for cls in classes]
    passed = ["--batch", args.batch, "--dim", args.dim, "--vocab", args.vocab, "--buckets", args.buckets]
    passed += ["--steps", args.steps, "--warmup", args.warmup, "--seed", args.seed]
    passed += ["--intra_op", args.intra_op, "--inter_op", args.inter_op]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.isolate):
            got = {}
            for k in range(len(pairs)):
                opt, name = pairs[(k + r) % len(pairs)]
                path = os.path.join(tmp, "r%d_%s_%s.json" % (r, opt, name))
                cmd = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--variants",
                    name,
                    "--optimizer",
                    opt,
                    "--json",
                    path,
                ]
                proc = subprocess.run(cmd + [str(a) for a in passed], capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RuntimeError("%s/%s failed:\n%s" % (opt, name, proc.stderr[-3000:]))
                with open(path) as f:
                    res = json.load(f)["results"].get(opt, {}).get(name)
                if res is None:
                    skipped["%s/%s" % (name, opt)] = "failed to build (see its own run)"
                    continue
                got.setdefault(opt, {})[name] = res
                bc.log("  round %d %s/%s: median %.1f ms/step" % (r + 1, name, opt, res["median_ms"]))
            rounds.append(got)
    results = {}
    for opt, name in pairs:
        runs = [g[opt][name] for g in rounds if name in g.get(opt, {})]
        if not runs:
            continue
        med = {k: float(np.median([x[k] for x in runs])) for k in ("median_ms", "p10_ms", "p90_ms")}
        med.update({"table_size": runs[-1]["table_size"], "rounds_ms": [x["median_ms"] for x in runs]})
        results.setdefault(opt, {})[name] = med
    return {"results": results, "skipped": skipped, "labels": labels_out, "rounds": rounds}


def speed_markdown(out):
    res = out["results"]
    c = out["config"]
    lines = [
        "ms/step, median of %d steps after %d warm-up (lower is better); batch %d, %d fields, dim %d, "
        "%d intra-op threads" % (c["steps"], c["warmup"], c["batch"], FIELDS, c["dim"], c["intra_op"]),
        "",
        "| variant | optimizer | ms/step | p10 | p90 | vs static Adagrad | keys in table after run |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    base = res.get("adagrad", {}).get("static", {}).get("median_ms")
    for opt, r in res.items():
        for cls in VARIANTS:
            if cls.name not in r:
                continue
            x = r[cls.name]
            rel = "%.2fx" % (x["median_ms"] / base) if base else "-"
            lines.append(
                "| %s | %s | %.1f | %.1f | %.1f | %s | %s |"
                % (
                    out["labels"].get(cls.name, cls.name),
                    opt,
                    x["median_ms"],
                    x["p10_ms"],
                    x["p90_ms"],
                    rel,
                    "{:,}".format(x["table_size"]) if x["table_size"] is not None else "-",
                )
            )
    targets = []
    for opt, r in res.items():
        o, s, t = (r.get(k, {}).get("median_ms") for k in ("ours", "static", "tfra"))
        if o and base:
            lim = 1.15 if opt == "adagrad" else 1.25
            targets.append(
                "%s: ours / static-Adagrad = %.2f (target <= %.2f): %s"
                % (opt, o / base, lim, "MET" if o / base <= lim else "not met")
            )
        p = r.get("ours_prealloc", {}).get("median_ms")
        if p and base:
            lim = 0.9 if opt == "adagrad" else 1.1
            targets.append(
                "%s: ours_prealloc / static-Adagrad = %.2f (target <= %.2f): %s"
                % (opt, p / base, lim, "MET" if p / base <= lim else "not met")
            )
        n = r.get("ours_noprefault", {}).get("median_ms")
        if o and n:
            targets.append("%s: ours / ours_noprefault (prefaulting on / off) = %.2f" % (opt, o / n))
        if o and t:
            targets.append(
                "%s: TFRA / ours = %.2f%s"
                % (
                    opt,
                    t / o,
                    (" (target >= 2.5): " + ("MET" if t / o >= 2.5 else "not met")) if opt == "adagrad" else "",
                )
            )
    if targets:
        lines += [""] + targets
    for k, g in enumerate(out.get("rounds", [])):
        b = g.get("adagrad", {}).get("static", {}).get("median_ms")
        if b:
            lines.append(
                "round %d (fresh process per variant), vs static Adagrad: " % (k + 1)
                + ", ".join(
                    "%s/%s %.2f" % (name, opt, x["median_ms"] / b)
                    for opt, r in g.items()
                    for name, x in r.items()
                    if not (opt == "adagrad" and name == "static")
                )
            )
    if out["skipped"]:
        lines.append("")
        for k, v in sorted(out["skipped"].items()):
            lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


# --------------------------------------------------------------------------- quality


def auc(y, score):
    """ROC AUC by the rank statistic (ties get their mean rank)."""
    y = np.asarray(y).ravel().astype(bool)
    score = np.asarray(score).ravel()
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(len(s), dtype=np.float64)
    i = 0
    # mean ranks for ties
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(s)]])
    avg = (starts + ends - 1) / 2.0 + 1.0
    ranks_sorted = np.repeat(avg, ends - starts)
    ranks[order] = ranks_sorted
    npos = y.sum()
    nneg = len(y) - npos
    del i
    return float((ranks[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def quality_main(args):
    """Dynamic (ours, with eviction) vs static hashed embedding at a fixed memory budget, held-out AUC.

    Task: the ctr26 id distribution; label ~ Bernoulli(sigmoid(bias + 0.4 * sum_f w(key_f)))
    with a fixed N(0,1) hidden weight per key. A static table must hash keys into
    fewer rows, and colliding keys share a row, so their (independent) weights
    cannot both be learned; a dynamic table gives every key it holds its own row,
    but under a memory budget it can hold only some keys and must evict the rest.

    Fairness:
      * same model (embedding dim, MLP, initializers, seeds), same optimizer
        (Adagrad 0.05) and the same training batches in the same order, one epoch
        (every batch seen once, as in a stream); evaluation on fresh held-out batches
        from the same distribution, with is_training=False (evaluation inserts no key;
        a key the dynamic table does not hold reads as zeros).
      * fixed budget (--quality_budgets, in static rows R): B = R * dim * 4 * 2 bytes
        (embedding + Adagrad accumulator). The static model gets R rows (ids mod R).
        The dynamic model trains with periodic eviction (every --quality_evict_every
        steps, policy --quality_policy, see train_dynamic_budget()) so that its
        TfExtTableMemoryBytes (keys, embedding and Adagrad columns, metadata, index,
        overhead: the bytes the table holds) stays at or under B. The table never
        gives memory back (evicted rows are reused), so its bytes only grow: the
        reported peak is the maximum over all readings, before and after each
        eviction, and at the end. A peak over B is reported as such, not hidden.
      * optional (--quality_all_keys, the earlier comparison): the dynamic model with
        no eviction (it keeps every key seen) vs a static model with its bytes.
      * the AUC of the true logits (the ceiling) is reported.
      * repeated for --quality_seeds seeds (data, task draws and model init follow the
        seed); the verdict uses the mean paired difference per budget.
    """
    runs = []
    for i in range(args.quality_seeds):
        r = quality_one(args, args.seed + 1000 * i)
        if r["skipped"]:
            return r
        runs.append(r["results"])
    out = {"runs": runs, "budgets": {}}
    names = ["rows_%d" % rows for rows in args.quality_budgets] + (["all_keys"] if args.quality_all_keys else [])
    for name in names:
        diffs = [x[name]["dynamic"]["auc"] - x[name]["static"]["auc"] for x in runs]
        out["budgets"][name] = {
            "diffs": diffs,
            "diff_mean": float(np.mean(diffs)),
            "diff_sd": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None,
            "dynamic_auc_mean": float(np.mean([x[name]["dynamic"]["auc"] for x in runs])),
            "static_auc_mean": float(np.mean([x[name]["static"]["auc"] for x in runs])),
            "max_peak_over_budget": (
                max((x[name]["dynamic"].get("peak_bytes", 0) - x[name]["budget_bytes"]) for x in runs)
                if name != "all_keys"
                else None
            ),
        }
    out["oracle_auc_mean"] = float(np.mean([x["oracle_auc"] for x in runs]))
    return {"results": out, "skipped": {}, "labels": {}}


def train_dynamic_budget(v, steps, budget, every, policy):
    """Trains v (OursEvictVariant) for `steps` steps keeping its table bytes <= budget.

    Every `every` steps: read (keys, bytes); the readings before the first eviction
    give bytes per key (bytes / keys, index included; the last one is kept) and so the key cap
    K = 0.97 * budget / bytes_per_key. If the keys plus the growth expected before
    the next eviction (1.25 x the largest growth seen between two evictions) would
    pass K, evict down to that target:
      * policy "lru": steps_to_live -- remove keys not trained in the last ttl steps,
        lowering ttl (by 1, or ttl // 16 when ttl >= 32) until the target is met;
        the next eviction starts from that ttl plus the steps since (the window
        that fitted last time, grown by the elapsed steps), so it removes no more
        than needed;
      * policy "lfu": min_frequency -- remove keys looked up fewer than F times,
        raising F from 2 until the target is met (note: the op's test is
        'version < min_version OR frequency < min_frequency', so recent keys with a
        low count are removed too; this acts as an admission filter).
    Bytes are read before and after every eviction; the peak is their maximum.
    """
    peak, cap, grow, last_after, ttl, evictions, removed_total, last_gs = 0, None, 0, 0, 0, 0, 0, 0
    t0 = time.perf_counter()
    for i in range(steps):
        v.step()
        if (i + 1) % every and i + 1 != steps:
            continue
        size, mem, gs = v.stats()
        peak = max(peak, mem)
        if evictions == 0:  # bytes per key, re-measured until the first eviction (the table only grows until then)
            cap = int(0.97 * budget * size / mem)
        grow = max(grow, size - last_after)
        target = cap - int(1.25 * grow)
        if size > target and i + 1 != steps:
            if policy == "lru":
                ttl = min(ttl + gs - last_gs, gs)
                while True:
                    removed_total += v.evict(min_version=gs - ttl)
                    size = v.stats()[0]
                    if size <= target or ttl == 0:
                        break
                    ttl -= 1 if ttl < 32 else ttl // 16
            else:
                f = 2
                while True:
                    removed_total += v.evict(min_frequency=f)
                    size = v.stats()[0]
                    if size <= target or f > 1000:
                        break
                    f += 1
            evictions += 1
            last_gs = gs
            size, mem, _ = v.stats()
            peak = max(peak, mem)
        last_after = size
    size, mem, _ = v.stats()
    peak = max(peak, mem)
    return {
        "peak_bytes": peak,
        "key_cap": cap,
        "evictions": evictions,
        "removed": removed_total,
        "last_ttl": ttl if policy == "lru" else None,
        "train_s": time.perf_counter() - t0,
    }


def quality_one(args, seed):
    """One seed of the quality comparison (data, hidden task draws and model init all follow the seed)."""
    config = bc.session_config(args.intra_op, args.inter_op)
    rng = np.random.default_rng(seed + 100)
    sampler = ZipfSampler(1.1, args.vocab)
    t0 = time.perf_counter()
    keys, labels, _ = make_batches(args.quality_steps, args.batch, sampler, rng, "hidden")
    ekeys, elabels, elogits = make_batches(args.eval_batches, args.batch, sampler, rng, "hidden")
    ekeys = ekeys.reshape(-1, FIELDS)
    elabels = elabels.ravel()
    bc.log(
        "quality, seed %d: %d training batches (%d distinct keys), %d eval examples, CTR %.3f, generated in %.1fs"
        % (seed, args.quality_steps, len(np.unique(keys)), len(elabels), labels.mean(), time.perf_counter() - t0)
    )
    out = {"oracle_auc": auc(elabels, elogits.ravel()), "seed": seed}
    reason = OursVariant.unavailable_reason()
    if reason:
        bc.log("quality needs ours: %s" % reason)
        return {"results": out, "skipped": {"ours": reason}, "labels": {}}

    def evaluate(v, r):
        before = v.size() if v.size_op is not None else None
        scores = np.concatenate([v.predict(ekeys[i : i + 65536]) for i in range(0, len(ekeys), 65536)])
        r["auc"] = auc(elabels, scores)
        if before is not None and not isinstance(v, StaticVariant) and v.size() != before:
            bc.log("  WARNING: evaluation inserted keys into the %s table" % v.name)
        v.close()
        return r

    def train_static(rows):
        v = StaticVariant(keys, labels, "adagrad", args.dim, seed, config, buckets=rows, eval_keys=ekeys)
        t1 = time.perf_counter()
        for _ in range(args.quality_steps):
            v.step()
        r = {"buckets": rows, "table_bytes": v.memory_bytes(), "train_s": time.perf_counter() - t1}
        return evaluate(v, r)

    for rows in args.quality_budgets:
        budget = rows * args.dim * 4 * 2
        v = OursEvictVariant(keys, labels, "adagrad", args.dim, seed, config, eval_keys=ekeys)
        dyn = train_dynamic_budget(v, args.quality_steps, budget, args.quality_evict_every, args.quality_policy)
        dyn.update(
            {
                "table_size": v.size(),
                "table_bytes": v.memory_bytes(),
                "policy": args.quality_policy,
                "evict_every": args.quality_evict_every,
            }
        )
        dyn = evaluate(v, dyn)
        st = train_static(rows)
        out["rows_%d" % rows] = {"budget_bytes": budget, "dynamic": dyn, "static": st}
        bc.log(
            "  budget %d rows (%.0f MiB): dynamic AUC %.4f (%d keys at the end, peak %.1f MiB, %d evictions, "
            "last ttl %s, train %.0fs) vs static AUC %.4f (train %.0fs): %+.4f"
            % (
                rows,
                budget / 2**20,
                dyn["auc"],
                dyn["table_size"],
                dyn["peak_bytes"] / 2**20,
                dyn["evictions"],
                dyn["last_ttl"],
                dyn["train_s"],
                st["auc"],
                st["train_s"],
                dyn["auc"] - st["auc"],
            )
        )
    if args.quality_all_keys:
        v = OursVariant(keys, labels, "adagrad", args.dim, seed, config, eval_keys=ekeys)
        t1 = time.perf_counter()
        for _ in range(args.quality_steps):
            v.step()
        dyn = {"table_size": v.size(), "table_bytes": v.memory_bytes(), "train_s": time.perf_counter() - t1}
        dyn = evaluate(v, dyn)
        rows = int(dyn["table_bytes"] // (args.dim * 4 * 2))
        st = train_static(rows)
        out["all_keys"] = {"budget_bytes": dyn["table_bytes"], "dynamic": dyn, "static": st}
        bc.log(
            "  all keys (no eviction): dynamic AUC %.4f (%d keys, %.1f MiB) vs static %d rows AUC %.4f: %+.4f"
            % (dyn["auc"], dyn["table_size"], dyn["table_bytes"] / 2**20, rows, st["auc"], dyn["auc"] - st["auc"])
        )
    return {"results": out, "skipped": {}, "labels": {}}


def quality_markdown(out):
    r = out["results"]
    c = out["config"]
    lines = [
        "held-out AUC after one pass over %d batches of %d (Adagrad 0.05, dim %d); dynamic: eviction policy %s "
        "every %d steps; higher is better"
        % (c["quality_steps"], c["batch"], c["dim"], c.get("quality_policy"), c.get("quality_evict_every", 0)),
        "",
    ]
    if not r.get("runs"):
        lines += ["skipped %s: %s" % kv for kv in sorted(out["skipped"].items())]
        return "\n".join(lines)
    lines += [
        "| budget | seed | dynamic: keys at end | dynamic: peak bytes | dynamic AUC | static rows | static AUC "
        "| difference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in r["budgets"]:
        for x in r["runs"]:
            b = x[name]
            lines.append(
                "| %s (%.1f MiB) | %d | {:,} | %.1f MiB | %.4f | {:,} | %.4f | %+.4f |".format(
                    b["dynamic"]["table_size"], b["static"]["buckets"]
                )
                % (
                    name,
                    b["budget_bytes"] / 2**20,
                    x["seed"],
                    b["dynamic"].get("peak_bytes", b["dynamic"]["table_bytes"]) / 2**20,
                    b["dynamic"]["auc"],
                    b["static"]["auc"],
                    b["dynamic"]["auc"] - b["static"]["auc"],
                )
            )
    lines += [
        "",
        "| budget | dynamic AUC (mean) | static AUC (mean) | dynamic - static: mean | sd | peak over budget |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in r["budgets"].items():
        over = s["max_peak_over_budget"]
        lines.append(
            "| %s | %.4f | %.4f | %+.4f | %s | %s |"
            % (
                name,
                s["dynamic_auc_mean"],
                s["static_auc_mean"],
                s["diff_mean"],
                "%.4f" % s["diff_sd"] if s["diff_sd"] is not None else "-",
                (
                    "-"
                    if over is None
                    else (
                        "none (max %.1f MiB under)" % (-over / 2**20) if over <= 0 else "%.1f MiB OVER" % (over / 2**20)
                    )
                ),
            )
        )
    lines.append("")
    lines.append("true logits (ceiling), mean over seeds: %.4f" % r["oracle_auc_mean"])
    for k, v in sorted(out["skipped"].items()):
        lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch_size", "--batch", dest="batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1 << 22, help="ids per field (Zipf draws mod vocab)")
    p.add_argument("--buckets", type=int, default=1 << 20, help="rows of the static variant")
    p.add_argument("--steps", type=int, default=40, help="timed steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--optimizer", nargs="+", default=["adagrad"], choices=["adagrad", "adam"])
    p.add_argument(
        "--variants",
        nargs="+",
        default=[v.name for v in VARIANTS if v.name not in OPT_IN_VARIANTS],
        choices=[v.name for v in VARIANTS],
    )
    bc.add_session_args(p)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument(
        "--quick", action="store_true", help="speed: batch 1024, 10 steps after 3; quality: 60 batches of 1024"
    )
    p.add_argument("--quality", action="store_true", help="AUC of dynamic vs static hashed at equal memory")
    p.add_argument(
        "--quality_steps", "--quality-steps", type=int, default=300, help="training batches (one pass) in --quality"
    )
    p.add_argument("--eval_batches", "--eval-batches", type=int, default=16)
    p.add_argument(
        "--quality_seeds",
        "--quality-seeds",
        type=int,
        default=3,
        help="--quality: repeat with this many seeds (data, task and init) and report the mean difference",
    )
    p.add_argument(
        "--no_static_reference",
        "--no-static-reference",
        dest="static_reference",
        action="store_false",
        help="(unused since --quality compares at fixed budgets; kept for old command lines)",
    )
    p.add_argument(
        "--quality_budgets",
        "--quality-budgets",
        type=int,
        nargs="+",
        default=[1 << 20, 1 << 22],
        help="--quality: memory budgets, in static rows (bytes = rows * dim * 4 * 2)",
    )
    p.add_argument(
        "--quality_evict_every",
        "--quality-evict-every",
        type=int,
        default=2,
        help="--quality: dynamic model evicts every N steps",
    )
    p.add_argument(
        "--quality_policy",
        "--quality-policy",
        choices=["lru", "lfu"],
        default="lru",
        help="--quality: eviction policy, lru (steps_to_live) or lfu (min_frequency)",
    )
    p.add_argument(
        "--quality_all_keys",
        "--quality-all-keys",
        action="store_true",
        help="--quality: also the earlier comparison (dynamic keeps every key, static gets its bytes)",
    )
    p.add_argument(
        "--isolate",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="speed: run every (optimizer, variant) in a fresh process of its own, ROUNDS rounds in rotating order "
        "(default 0: all variants interleaved in this process)",
    )
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.steps, args.warmup = 1024, 10, 3
        args.quality_steps, args.eval_batches = 60, 8

    info = bc.machine_info()
    t0 = time.perf_counter()
    if args.quality:
        body = quality_main(args)
    elif args.isolate:
        body = isolated_main(args)
    else:
        body = speed_main(args)
    out = dict(body)
    out.update(
        {
            "benchmark": "ctr26_quality" if args.quality else "ctr26",
            "config": {
                k: getattr(args, k)
                for k in (
                    "batch",
                    "dim",
                    "vocab",
                    "buckets",
                    "steps",
                    "warmup",
                    "optimizer",
                    "intra_op",
                    "inter_op",
                    "seed",
                    "quick",
                    "quality_steps",
                    "eval_batches",
                    "quality_seeds",
                    "quality_budgets",
                    "quality_evict_every",
                    "quality_policy",
                    "quality_all_keys",
                    "isolate",
                )
            },
            "machine": info,
            "wall_s": time.perf_counter() - t0,
        }
    )
    return bc.finish(out, quality_markdown(out) if args.quality else speed_markdown(out), args.json)


if __name__ == "__main__":
    main()
