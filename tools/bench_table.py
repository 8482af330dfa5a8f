#!/usr/bin/env python
"""Table micro-benchmark: every backend in one run, side by side (docs/benchmarks.md).

Workload: N = 1M keys prefilled; each timed step is one
session.run on a batch of 131072 existing keys drawn uniformly; 2 intra-op
threads, 1 inter-op thread; `find` is reduced to a scalar in-graph
(tf.reduce_sum) so copying the output out of the session does not dominate;
`upsert` overwrites the rows of existing keys. Dims 16 and 64.

Backends (pluggable, see BACKENDS; one that cannot be built is skipped with the reason):
  dense     tf.gather / scatter_update on a [N, dim] resource variable (no hashing: the limit)
  tfdense   tf.lookup.experimental.DenseHashTable
  tfra      TFRA 0.7.2 CuckooHashTable (tfra.dynamic_embedding)
  ours      tensorflow_ext.table.table_ops.HashTable (find, and insert for upsert), float32 rows
  ours_bf16 the same with value_dtype=tf.bfloat16 (rows stored as bf16, read and written as float32)
  ours_fp16 the same with value_dtype=tf.float16

Timing: every backend has its own graph and session, all alive at once; the
repeats are interleaved round-robin (backend order reshuffled each round) so
that machine noise hits all backends alike; the figure is the median over
repeats after warm-up. Keys come from a pool of pre-drawn batches held in the
graph as constants (no feed of key data per step).

Full run (the figures of docs):  python tools/bench_table.py --json docs/bench_table.json
Quick run while developing:     python tools/bench_table.py --quick
"""

import abc
import argparse
import time

import bench_common as bc
from bench_common import np, tf

MKEY = 1e6


# --------------------------------------------------------------------------- backends


class Backend(abc.ABC):
    """One table implementation. Subclasses build the graph; the harness times it.

    build() must set self.find_op (a scalar tensor) and self.upsert_op (an op),
    both reading the batch selected by the placeholder self.batch_index.
    """

    name = "?"
    label = "?"
    uses_positions = False  # dense: rows are 0..N-1 positions instead of hashed keys

    @classmethod
    def unavailable_reason(cls):
        return None

    def __init__(self, dim, pools, n_keys, all_keys, init_values_fn, config):
        self.dim = dim
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.batch_index = tf.compat.v1.placeholder(tf.int32, [], name="batch_index")
            pool = pools["positions"] if self.uses_positions else pools["keys"]
            pool_t = tf.constant(pool)  # [R, batch] int64
            self.batch_keys = tf.gather(pool_t, self.batch_index)
            if pools.get("random_values"):
                # fresh values drawn in-graph every step (their RNG cost is timed too)
                self.batch_values = tf.random.normal([pools["keys"].shape[1], dim], seed=1)
            else:
                self.batch_values = tf.constant(pools["values"][dim])  # [batch, dim] float32
            self.build(n_keys)
        self.sess = bc.start_session(self.graph, config)
        t0 = time.perf_counter()
        self.prefill(n_keys, all_keys, init_values_fn)
        self.prefill_s = time.perf_counter() - t0
        self.graph.finalize()

    @abc.abstractmethod
    def build(self, n_keys):
        """Creates the table/variable and the timed find and upsert ops."""

    def prefill(self, n_keys, all_keys, init_values_fn):
        """Default: insert all keys in chunks through self.fill_keys/self.fill_values feeds."""
        chunk = 1 << 17
        for s in range(0, n_keys, chunk):
            k = all_keys[s : s + chunk]
            self.sess.run(self.fill_op, {self.fill_keys: k, self.fill_values: init_values_fn(s, len(k))})

    def make_fill_placeholders(self):
        self.fill_keys = tf.compat.v1.placeholder(tf.int64, [None], name="fill_keys")
        self.fill_values = tf.compat.v1.placeholder(tf.float32, [None, self.dim], name="fill_values")

    def size(self):
        return None

    def close(self):
        self.sess.close()


class DenseBackend(Backend):
    name = "dense"
    label = "dense tf.gather / scatter_update"
    uses_positions = True

    def build(self, n_keys):
        self.init_ph = tf.compat.v1.placeholder(tf.float32, [n_keys, self.dim])
        self.var = tf.compat.v1.get_variable(
            "table", [n_keys, self.dim], tf.float32, initializer=tf.compat.v1.zeros_initializer(), use_resource=True
        )
        self.fill_op = self.var.assign(self.init_ph, read_value=False)
        self.find_op = tf.reduce_sum(tf.gather(self.var, self.batch_keys))
        self.upsert_op = tf.compat.v1.scatter_update(self.var, self.batch_keys, self.batch_values).op

    def prefill(self, n_keys, all_keys, init_values_fn):
        self.sess.run(self.fill_op, {self.init_ph: init_values_fn(0, n_keys)})

    def size(self):
        return int(self.var.shape[0])


class TFDenseHashBackend(Backend):
    name = "tfdense"
    label = "TF DenseHashTable"

    def build(self, n_keys):
        self.make_fill_placeholders()
        self.table = tf.lookup.experimental.DenseHashTable(
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            default_value=tf.zeros([self.dim], tf.float32),
            empty_key=-1,
            deleted_key=-2,
        )
        self.fill_op = self.table.insert(self.fill_keys, self.fill_values)
        self.find_op = tf.reduce_sum(self.table.lookup(self.batch_keys))
        self.upsert_op = self.table.insert(self.batch_keys, self.batch_values)
        self.size_op = self.table.size()

    def size(self):
        return int(self.sess.run(self.size_op))


class TFRABackend(Backend):
    name = "tfra"
    label = "TFRA CuckooHashTable"

    @classmethod
    def unavailable_reason(cls):
        de, reason, version = bc.import_tfra()
        if de is not None:
            cls.label = "TFRA %s CuckooHashTable" % version
        return reason

    def build(self, n_keys):
        de, _, _ = bc.import_tfra()
        self.make_fill_placeholders()
        self.table = de.CuckooHashTable(
            key_dtype=tf.int64,
            value_dtype=tf.float32,
            default_value=tf.zeros([self.dim], tf.float32),
            name="tfra_table",
        )
        self.fill_op = self.table.insert(self.fill_keys, self.fill_values)
        self.find_op = tf.reduce_sum(self.table.lookup(self.batch_keys))
        self.upsert_op = self.table.insert(self.batch_keys, self.batch_values)
        self.size_op = self.table.size()

    def size(self):
        return int(self.sess.run(self.size_op))


class OursBackend(Backend):
    name = "ours"
    label = "tensorflow_ext HashTable"
    value_dtype = tf.float32  # the storage of the rows (every op reads and writes float32)

    @classmethod
    def unavailable_reason(cls):
        _, reason = bc.import_ours_table()
        return reason

    def build(self, n_keys):
        table_ops, _ = bc.import_ours_table()
        self.make_fill_placeholders()
        self.table = table_ops.HashTable(
            dim=self.dim, width=self.dim, initial_capacity=0, name="ours_table", value_dtype=self.value_dtype
        )
        self.fill_op = self.table.insert(self.fill_keys, self.fill_values)
        self.find_op = tf.reduce_sum(self.table.find(self.batch_keys))
        self.upsert_op = self.table.insert(self.batch_keys, self.batch_values)
        self.size_op = self.table.size()
        self.mem_op = self.table.memory_bytes()

    def size(self):
        return int(self.sess.run(self.size_op))


class OursBFloat16Backend(OursBackend):
    name = "ours_bf16"
    label = "tensorflow_ext HashTable, bfloat16 rows"
    value_dtype = tf.bfloat16


class OursFloat16Backend(OursBackend):
    name = "ours_fp16"
    label = "tensorflow_ext HashTable, float16 rows"
    value_dtype = tf.float16


BACKENDS = [DenseBackend, TFDenseHashBackend, TFRABackend, OursBackend, OursBFloat16Backend, OursFloat16Backend]
BY_NAME = {b.name: b for b in BACKENDS}


# --------------------------------------------------------------------------- harness


def make_pools(n_keys, batch, n_batches, dims, seed):
    rng = np.random.default_rng(seed)
    # Hashed-feature-like keys: distinct, spread over the positive int64 range
    # (-1/-2 are DenseHashTable's empty/deleted markers).
    keys = np.unique(rng.integers(1, 2**62, size=int(n_keys * 1.01) + 16, dtype=np.int64))
    rng.shuffle(keys)
    keys = keys[:n_keys]
    assert len(keys) == n_keys
    positions = rng.integers(0, n_keys, size=(n_batches, batch), dtype=np.int64)
    pools = {"positions": positions, "keys": keys[positions], "values": {}}
    for d in dims:
        pools["values"][d] = rng.standard_normal((batch, d)).astype(np.float32)
    return keys, pools


def init_values_fn_for(dim, seed):
    def fn(start, n):
        rng = np.random.default_rng(seed + start)
        return rng.standard_normal((n, dim)).astype(np.float32)

    return fn


def bench_dim(dim, backend_classes, args, config):
    all_keys, pools = make_pools(args.keys, args.batch, args.pool, [dim], args.seed)
    pools["random_values"] = args.upsert_values == "random"
    init_fn = init_values_fn_for(dim, args.seed)
    built = []
    for cls in backend_classes:
        t0 = time.perf_counter()
        try:
            b = cls(dim, pools, args.keys, all_keys, init_fn, config)
        except Exception as e:
            bc.log("  %-8s dim %d: FAILED to build/prefill: %s: %s" % (cls.name, dim, type(e).__name__, e))
            continue
        n = b.size()
        bc.log(
            "  %-8s dim %d: prefilled %s keys in %.2fs (build+prefill %.2fs)"
            % (cls.name, dim, n, b.prefill_s, time.perf_counter() - t0)
        )
        if n is not None and n != args.keys:
            bc.log("  WARNING: %s holds %d keys, expected %d" % (cls.name, n, args.keys))
        built.append(b)

    ops = ["find", "upsert"]
    samples = {b.name: {op: [] for op in ops} for b in built}
    for step, (r, b) in enumerate(bc.interleaved(built, args.warmup + args.repeats, args.seed)):
        for op in ops:
            fetch = b.find_op if op == "find" else b.upsert_op
            dt = bc.time_call(b.sess.run, fetch, {b.batch_index: step % args.pool})
            if r >= args.warmup:
                samples[b.name][op].append(dt)
    # a cheap sanity check: find gives the same sum for every hashed backend on the
    # same (last upserted) values -> all backends did the same work.
    results = {}
    for b in built:
        res = {}
        for op in ops:
            res[op] = summary = bc.summary_ms(samples[b.name][op])
            med, p10 = summary["median_ms"] / 1e3, summary["p10_ms"] / 1e3
            summary.update(
                {
                    "mkeys_s": args.batch / (med if args.stat == "median" else p10) / MKEY,
                    "mkeys_s_median": args.batch / med / MKEY,
                    "mkeys_s_p10": args.batch / p10 / MKEY,
                }
            )
        res["prefill_s"] = b.prefill_s
        res["size"] = b.size()
        if getattr(b, "mem_op", None) is not None:  # ours
            try:
                res["memory_bytes"] = int(b.sess.run(b.mem_op))
            except Exception:
                pass
        results[b.name] = res
    for b in built:
        b.close()
    return results


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def get(results, dim, backend, op):
    try:
        return results[str(dim)][backend][op]["mkeys_s"]
    except KeyError:
        return None


def markdown(out):
    results, dims = out["results"], out["config"]["dims"]
    cols = [(d, op) for d in dims for op in ("find", "upsert")]
    head = "| backend | " + " | ".join("%s dim%d" % (op, d) for d, op in cols) + " |"
    lines = [
        "Mkeys/s, %s of %d repeats (higher is better); %d keys, batch %d, %d intra-op threads"
        % (
            out["config"].get("stat", "median"),
            out["config"]["repeats"],
            out["config"]["keys"],
            out["config"]["batch"],
            out["config"]["intra_op"],
        )
        + ("; upsert values drawn in-graph each step" if out["config"].get("upsert_values") == "random" else ""),
        "",
        head,
        "|---|" + "---:|" * len(cols),
    ]
    for cls in BACKENDS:
        if not any(cls.name in results.get(str(d), {}) for d in dims):
            continue
        lab = out["labels"].get(cls.name, cls.name)
        lines.append("| %s | " % lab + " | ".join(bc.fmt(get(results, d, cls.name, op)) for d, op in cols) + " |")
    for num, den, what in (
        ("ours", "dense", "ours / dense"),
        ("ours", "tfra", "ours / TFRA"),
        ("tfra", "dense", "TFRA / dense"),
        ("tfdense", "dense", "DenseHashTable / dense"),
        ("ours_bf16", "ours", "bfloat16 rows / float32 rows"),
        ("ours_fp16", "ours", "float16 rows / float32 rows"),
    ):
        vals = [ratio(get(results, d, num, op), get(results, d, den, op)) for d, op in cols]
        if any(v is not None for v in vals):
            lines.append("| *%s* | " % what + " | ".join(("%.2fx" % v if v is not None else "-") for v in vals) + " |")
    memory = [
        "%s %.1f B/key at dim %d" % (out["labels"].get(name, name), res["memory_bytes"] / res["size"], d)
        for d in dims
        for name, res in results.get(str(d), {}).items()
        if res.get("memory_bytes") and res.get("size")
    ]
    if memory:
        lines += ["", "memory_bytes(): " + "; ".join(memory)]
    if out["skipped"]:
        lines.append("")
        for k, v in out["skipped"].items():
            lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


def targets(out):
    """The product targets (find vs dense, upsert vs TFRA), checked on this run's ratios."""
    res, lines = out["results"], []
    for d in out["config"]["dims"]:
        f = ratio(get(res, d, "ours", "find"), get(res, d, "dense", "find"))
        u = ratio(get(res, d, "ours", "upsert"), get(res, d, "tfra", "upsert"))
        if f is not None:
            lines.append(
                "dim %d find  ours/dense = %.2f (target >= 0.75): %s" % (d, f, "MET" if f >= 0.75 else "not met")
            )
        if u is not None:
            lines.append(
                "dim %d upsert ours/TFRA = %.2f (target >= 2.0): %s" % (d, u, "MET" if u >= 2.0 else "not met")
            )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1 << 20, help="keys prefilled (default 1M = 2^20)")
    p.add_argument("--batch_size", "--batch", dest="batch", type=int, default=131072, help="keys per timed step")
    p.add_argument("--repeats", type=int, default=40, help="timed repeats per backend and op")
    p.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    p.add_argument("--pool", type=int, default=8, help="distinct pre-drawn batches cycled through")
    p.add_argument("--dims", type=int, nargs="+", default=[16, 64])
    p.add_argument("--backends", nargs="+", default=[b.name for b in BACKENDS], choices=[b.name for b in BACKENDS])
    bc.add_session_args(p)
    p.add_argument(
        "--stat",
        choices=["median", "p10"],
        default="median",
        help="time statistic behind the Mkeys/s figures (p10 = 10th-percentile time, "
        "less sensitive to load from other processes); both are in the JSON",
    )
    p.add_argument(
        "--upsert_values",
        "--upsert-values",
        choices=["const", "random"],
        default="const",
        help="const: one pre-drawn [batch, dim] tensor (times the table op alone); random: "
        "tf.random.normal drawn in-graph each step (adds the RNG's cost to every backend)",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--quick", action="store_true", help="small run while developing: 256K keys, batch 32768, 10 repeats"
    )
    p.add_argument("--json", help="write the results here (input of tools/plot_benchmarks.py)")
    args = p.parse_args(argv)
    if args.quick:
        args.keys, args.batch, args.repeats, args.warmup = 1 << 18, 32768, 10, 2

    config = bc.session_config(args.intra_op, args.inter_op)
    classes, skipped, labels = bc.available(BY_NAME, args.backends)
    t_start = time.perf_counter()
    info = bc.machine_info()
    results = {}
    for d in args.dims:
        bc.log("dim %d:" % d)
        results[str(d)] = bench_dim(d, classes, args, config)
    out = {
        "benchmark": "table",
        "config": {
            "keys": args.keys,
            "batch": args.batch,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "dims": args.dims,
            "intra_op": args.intra_op,
            "inter_op": args.inter_op,
            "pool": args.pool,
            "quick": args.quick,
            "stat": args.stat,
            "upsert_values": args.upsert_values,
        },
        "machine": info,
        "labels": labels,
        "skipped": skipped,
        "results": results,
        "wall_s": time.perf_counter() - t_start,
    }
    t = targets(out)
    return bc.finish(out, markdown(out) + ("\n\n" + t if t else ""), args.json)


if __name__ == "__main__":
    main()
