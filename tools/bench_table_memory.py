#!/usr/bin/env python
"""Table memory benchmark: bytes per key at steady state, dim 16 with 0, 1 and 2 optimizer slots.

Each configuration runs in its own subprocess so that its RSS is clean. In the
child: a session is created and a small warm-up table of the same kind is
filled (so the session's executor, thread pools and feed buffers already exist),
the heap is trimmed and RSS read (baseline); then the measured table(s) are
filled with N keys in chunks, the heap is trimmed again and RSS read. bytes/key
= RSS delta / N.

Configurations (dim 16; a slot is one more dim-16 float column group per key):
  ours     one tensorflow_ext table whose rows are [embedding | slots]: width 16/32/48.
           Reported twice: the TfExtTableMemoryBytes op (bytes the table says it holds)
           and the RSS delta.
  tfra     TFRA 0.7.2: one dim-16 CuckooHashTable plus one CuckooHashTable per slot
           (what DynamicEmbeddingOptimizer creates: slots are extra tables). RSS delta.
           A reference run on the same kind of machine measured 444 bytes/key with one slot (Adagrad).
  tfdense  TF DenseHashTable with value shape [width] (one table, slots as extra columns). RSS delta.

raw bytes/key = 8 (key) + 4 * width (floats), i.e. 72 / 136 / 200.

Full run:   python tools/bench_table_memory.py --json docs/bench_table_memory.json
Quick run:  python tools/bench_table_memory.py --quick
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ["ours", "tfra", "tfdense"]
LABELS = {
    "ours": "tensorflow_ext table (one row: embedding + slots)",
    "tfra": "TFRA 0.7.2 CuckooHashTable (one table per slot)",
    "tfdense": "TF DenseHashTable (value [width])",
}


# --------------------------------------------------------------------------- child


def child(backend, slots, keys, dim, chunk, seed):
    import bench_common as bc
    from bench_common import np, tf

    width = dim * (1 + slots)
    rng = np.random.default_rng(seed)
    all_keys = np.unique(rng.integers(1, 2**62, size=int(keys * 1.01) + 16, dtype=np.int64))[:keys]
    rng.shuffle(all_keys)
    warm_keys = np.arange(-(chunk + 10), -10, dtype=np.int64)  # disjoint from all_keys

    kp = tf.compat.v1.placeholder(tf.int64, [None])
    mem_op = None
    result = {
        "backend": backend,
        "slots": slots,
        "dim": dim,
        "width": width,
        "keys": keys,
        "raw_bytes_per_key": 8 + 4 * width,
    }

    def make_tables(prefix):
        """Returns (list of (table, value_width)), the fill op for keys kp and values vps."""
        if backend == "ours":
            table_ops, reason = bc.import_ours_table()
            if table_ops is None:
                raise RuntimeError(reason)
            defaults = [0.0] * dim + [0.1] * (width - dim)
            t = table_ops.HashTable(
                dim=dim, width=width, column_defaults=defaults, initial_capacity=0, name=prefix + "ours"
            )
            return [t], [dim]
        if backend == "tfra":
            de, reason, _ = bc.import_tfra()
            if de is None:
                raise RuntimeError(reason)
            ts = [
                de.CuckooHashTable(tf.int64, tf.float32, tf.zeros([dim]), name="%stfra_%d" % (prefix, i))
                for i in range(1 + slots)
            ]
            return ts, [dim] * len(ts)
        if backend == "tfdense":
            t = tf.lookup.experimental.DenseHashTable(
                tf.int64,
                tf.float32,
                default_value=tf.zeros([width]),
                empty_key=-(2**62),
                deleted_key=-(2**62) - 1,
                name=prefix + "tfdense",
            )
            return [t], [width]
        raise ValueError(backend)

    def fill_ops(tables, widths):
        vps, ops = [], []
        for t, w in zip(tables, widths):
            vp = tf.compat.v1.placeholder(tf.float32, [None, w])
            vps.append(vp)
            ops.append(t.insert(kp, vp))
        return vps, tf.group(*ops)

    warm_tables, warm_widths = make_tables("warm_")
    warm_vps, warm_fill = fill_ops(warm_tables, warm_widths)
    tables, widths = make_tables("")
    vps, fill = fill_ops(tables, widths)
    size_op = tables[0].size()
    all_sizes = [t.size() for t in tables]
    if backend == "ours":
        mem_op = tables[0].memory_bytes()

    sess = bc.start_session(tf.compat.v1.get_default_graph(), bc.session_config())

    def feed_for(k, vps_, widths_):
        d = {kp: k}
        for vp, w in zip(vps_, widths_):
            d[vp] = rng.standard_normal((len(k), w)).astype(np.float32)
        return d

    sess.run(warm_fill, feed_for(warm_keys, warm_vps, warm_widths))
    if mem_op is not None:
        mem0 = int(sess.run(mem_op))  # the empty measured table (created on first run)
    else:
        sess.run(all_sizes)  # creates the tables before the baseline
    bc.trim_heap()
    time.sleep(0.2)
    rss0 = bc.rss_bytes()
    t0 = time.perf_counter()
    for s in range(0, keys, chunk):
        k = all_keys[s : s + chunk]
        sess.run(fill, feed_for(k, vps, widths))
    result["fill_s"] = time.perf_counter() - t0
    n = int(sess.run(size_op))
    bc.trim_heap()
    time.sleep(0.2)
    rss1 = bc.rss_bytes()
    result["size"] = n
    result["rss_delta_bytes"] = rss1 - rss0
    result["rss_bytes_per_key"] = (rss1 - rss0) / float(n)
    if mem_op is not None:
        mem1 = int(sess.run(mem_op))
        result["op_bytes"] = mem1
        result["op_bytes_per_key"] = mem1 / float(n)
        result["op_bytes_empty"] = mem0
    print("RESULT " + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- parent


def run_config(backend, slots, args):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        backend,
        str(slots),
        "--keys",
        str(args.keys),
        "--dim",
        str(args.dim),
        "--chunk",
        str(args.chunk),
    ]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            r["wall_s"] = time.perf_counter() - t0
            return r, None
    err = [l for l in p.stderr.splitlines() if l.strip() and "WARNING" not in l and "deprecat" not in l.lower()]
    return None, "exit %d: %s" % (p.returncode, (err[-1] if err else "no output"))


def markdown(out):
    res, slots = out["results"], out["config"]["slots"]
    lines = [
        "bytes per key, dim %d, %d keys (lower is better); raw = 8 + 4*width"
        % (out["config"]["dim"], out["config"]["keys"]),
        "",
        "| table | "
        + " | ".join("%d slot%s (width %d)" % (s, "" if s == 1 else "s", out["config"]["dim"] * (1 + s)) for s in slots)
        + " |",
        "|---|" + "---:|" * len(slots),
    ]

    def cell(b, s, field):
        r = res.get(b, {}).get(str(s))
        return "%.0f" % r[field] if r and r.get(field) is not None else "-"

    lines.append(
        "| raw (8 + 4*width) | " + " | ".join("%d" % (8 + 4 * out["config"]["dim"] * (1 + s)) for s in slots) + " |"
    )
    for b in BACKENDS:
        if b not in res:
            continue
        if b == "ours":
            lines.append(
                "| %s, TfExtTableMemoryBytes | " % LABELS[b]
                + " | ".join(cell(b, s, "op_bytes_per_key") for s in slots)
                + " |"
            )
        lines.append(
            "| %s, RSS delta | " % LABELS[b] + " | ".join(cell(b, s, "rss_bytes_per_key") for s in slots) + " |"
        )
    if "ours" in res:
        vals = []
        for s in slots:
            r = res["ours"].get(str(s))
            vals.append("%.2fx" % (r["rss_bytes_per_key"] / r["raw_bytes_per_key"]) if r else "-")
        lines.append("| *ours RSS / raw (target <= 1.5x)* | " + " | ".join(vals) + " |")
    if out["skipped"]:
        lines.append("")
        for k, v in sorted(out["skipped"].items()):
            lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1 << 20)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--slots", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--chunk", type=int, default=65536, help="keys per insert while filling")
    p.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS)
    p.add_argument("--quick", action="store_true", help="256K keys")
    p.add_argument("--json", help="write the results here (input of tools/plot_benchmarks.py)")
    p.add_argument("--child", nargs=2, metavar=("BACKEND", "SLOTS"), help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], int(args.child[1]), args.keys, args.dim, args.chunk, args.seed)
        return None
    if args.quick:
        args.keys = 1 << 18

    sys.path.insert(0, HERE)
    import bench_common as bc

    info = bc.machine_info()
    t_start = time.time()
    results, skipped = {}, {}
    for b in args.backends:
        for s in args.slots:
            r, err = run_config(b, s, args)
            if r is None:
                bc.log("%-8s slots=%d: skipped (%s)" % (b, s, err))
                skipped["%s/%d" % (b, s)] = err
                continue
            results.setdefault(b, {})[str(s)] = r
            extra = (", op %.0f B/key" % r["op_bytes_per_key"]) if "op_bytes_per_key" in r else ""
            bc.log(
                "%-8s slots=%d width=%d: RSS %.0f B/key%s (raw %d), %d keys, fill %.1fs"
                % (b, s, r["width"], r["rss_bytes_per_key"], extra, r["raw_bytes_per_key"], r["size"], r["fill_s"])
            )
    out = {
        "benchmark": "table_memory",
        "config": {"keys": args.keys, "dim": args.dim, "slots": args.slots, "chunk": args.chunk, "quick": args.quick},
        "labels": LABELS,
        "results": results,
        "skipped": skipped,
        "wall_s": time.time() - t_start,
        "machine": info,
    }
    return bc.finish(out, markdown(out), args.json)


if __name__ == "__main__":
    main()
