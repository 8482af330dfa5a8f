"""Compression cost of the dense gradient exchange: the fused kernels against the TensorFlow ops they replaced.

What each rank computes around its collectives, per training step, in one process (no Horovod: the collectives
are replaced by a stateful identity, so no graph rewrite can join the two sides). The gradients are those of
tools/bench_allreduce.py's model (MLP 1024-2048-2048-1: 6.3M float32 parameters, 25 MB, one fused buffer),
averaged over 2 ranks:

  fp16, bf16    pack (concat, pre-scale, 16-bit cast) + unpack (cast back, post-scale, split)
  topk1         Top-K 1% with error feedback: residual add, selection, wire values, residual update, and the
                scatter-add of 2 ranks' entries (dense sum, scale, split)
  topk1_fp16    the same with fp16 values

`--collectives` adds the whole reduction of the same 25 MB on 2 local ranks under horovodrun (loopback: no link
limit, so this is the CPU cost of each method end to end): plain Horovod float32, Horovod's own fp16 allreduce,
and DenseReducer with fp16, bf16 and Top-K 1%.

"tf" is the chain of TensorFlow ops the reduction used before the kernels (concat, multiply, tf.cast, tf.split;
the sampled-threshold top_k, tf.gather, tensor_scatter_nd_sub, unsorted_segment_sum), "fused" is
tensorflow_ext.horovod.compression_ops. Both run on the same variables, in interleaved rounds; each figure is the
median step time, and ms per MB of float32 gradient. `--load N` runs N CPU-bound processes beside the measurement
(busy loops, bounded in time, stopped by the tool) to show what a busy training machine leaves.

    .venv/bin/python tools/bench_compression.py --collectives         # quiet, then with 2 busy processes
    .venv/bin/python tools/bench_compression.py --load 0 --quick      # smoke run
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402
from bench_common import tf  # noqa: E402

import tensorflow_ext.horovod  # noqa: E402,F401  (the package's import side effects, as in training)
from tensorflow_ext.horovod import compression_ops  # noqa: E402

RANKS = 2
RATIO = 0.01
METHODS = ("fp16", "bf16", "topk1", "topk1_fp16")
WIRE = {"fp16": tf.float16, "bf16": tf.bfloat16, "topk1": None, "topk1_fp16": tf.float16}


def model_shapes(quick):
    din, width = (256, 512) if quick else (1024, 2048)
    return [(din, width), (width,), (width, width), (width,), (width, 1), (1,)]


def _barrier(t):
    """Stands for the collective: stateful, so nothing folds or joins across it."""
    return tf.raw_ops.Print(input=t, data=[], message="", first_n=0, summarize=0)


# -- the TensorFlow chain of the reduction before the fused kernels ----------------------------------------------


def _to_wire(x, wire):
    if wire is None:
        return x
    x = tf.cast(x, wire)
    return tf.bitcast(x, tf.uint16) if wire == tf.bfloat16 else x


def _from_wire(x, wire):
    if wire == tf.bfloat16:
        x = tf.bitcast(x, tf.bfloat16)
    return tf.cast(x, tf.float32) if x.dtype != tf.float32 else x


def tf_pack_unpack(grads, wire, pre, post):
    flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
    if pre != 1.0:
        flat = flat * tf.cast(pre, tf.float32)
    summed = _from_wire(_barrier(_to_wire(flat, wire)), wire)
    if post != 1.0:
        summed = summed * tf.cast(post, tf.float32)
    parts = tf.split(summed, [g.shape.num_elements() for g in grads])
    return [tf.reshape(p, g.shape) for p, g in zip(parts, grads)]


def tf_topk(grads, residuals, wire, factor):
    idx_parts, val_parts, assigns, offset = [], [], [], 0
    for g, r in zip(grads, residuals):
        n = g.shape.num_elements()
        k = max(1, int(math.ceil(RATIO * n)))
        acc = tf.reshape(g + r.read_value(), [-1])
        idx = compression_ops._top_k_indices(tf.abs(acc), n, k)  # pylint: disable=protected-access
        vals = tf.gather(acc, idx)
        comp = _to_wire(vals, wire)
        new_res = tf.tensor_scatter_nd_sub(acc, tf.expand_dims(idx, 1), _from_wire(comp, wire))
        assigns.append(r.assign(tf.reshape(new_res, r.shape)))
        idx_parts.append(idx + offset)
        val_parts.append(comp)
        offset += n
    idx, vals = _barrier(tf.concat(idx_parts, 0)), _barrier(tf.concat(val_parts, 0))
    all_idx, all_vals = tf.concat([idx] * RANKS, 0), tf.concat([vals] * RANKS, 0)  # every rank's entries
    total = tf.math.unsorted_segment_sum(_from_wire(all_vals, wire), all_idx, offset) * tf.cast(factor, tf.float32)
    parts = tf.split(total, [g.shape.num_elements() for g in grads])
    with tf.control_dependencies(assigns):
        return [tf.identity(tf.reshape(p, g.shape)) for p, g in zip(parts, grads)]


# -- the fused kernels ----------------------------------------------------------------------------------------


def fused_pack_unpack(grads, wire, pre, post):
    return compression_ops.unpack(_barrier(compression_ops.pack(grads, wire, pre)), wire, grads, post)


def fused_topk(grads, residuals, wire, factor):
    ks = [max(1, int(math.ceil(RATIO * g.shape.num_elements()))) for g in grads]
    idx, vals, new_res = compression_ops.top_k_select(grads, [r.read_value() for r in residuals], ks, wire)
    assigns = [r.assign(v) for r, v in zip(residuals, new_res)]
    idx, vals = _barrier(idx), _barrier(vals)
    parts = compression_ops.scatter_add(tf.concat([idx] * RANKS, 0), tf.concat([vals] * RANKS, 0), wire, grads, factor)
    with tf.control_dependencies(assigns):
        return [tf.identity(p) for p in parts]


def build(shapes):
    """The graph with both implementations of every method; returns (graph, {(method, impl): op}, MB)."""
    graph = tf.Graph()
    ops = {}
    with graph.as_default():
        rng = tf.random.stateless_normal
        grads = [
            tf.compat.v1.get_variable("g%d" % i, initializer=rng(s, seed=[i, 1]) * 1e-3) for i, s in enumerate(shapes)
        ]
        reads = [g.read_value() for g in grads]
        for m in METHODS:
            wire = WIRE[m]
            for impl in ("tf", "fused"):
                with tf.compat.v1.name_scope("%s_%s" % (m, impl)):
                    if m.startswith("topk"):
                        residuals = [
                            tf.compat.v1.get_variable(
                                "%s_%s_r%d" % (m, impl, i), initializer=tf.zeros(s), trainable=False
                            )
                            for i, s in enumerate(shapes)
                        ]
                        fn = tf_topk if impl == "tf" else fused_topk
                        out = fn(reads, residuals, wire, 1.0 / RANKS)
                    else:
                        fn = tf_pack_unpack if impl == "tf" else fused_pack_unpack
                        out = fn(reads, wire, 1.0, 1.0 / RANKS)
                    ops[(m, impl)] = tf.group(out)
    mb = sum(math.prod(s) for s in shapes) * 4 / 1e6
    return graph, ops, mb


COLLECTIVES = ("plain_fp32", "horovod_fp16", "fp16", "bf16", "topk1")


def collectives_worker(args):
    """One of 2 ranks (under horovodrun): the reduction of the model's gradients, one flat buffer, per method."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import allreduce as ar  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import consistency  # pylint: disable=import-outside-toplevel

    tfe_hvd.init()
    n = sum(math.prod(s) for s in model_shapes(args.quick))
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.get_variable("x", initializer=tf.random.stateless_normal([n], seed=[hvd.rank(), 1]))
        g = consistency.gate(v.read_value())
        ops = {
            "plain_fp32": hvd.allreduce(g, op=hvd.Average, name="plain"),
            "horovod_fp16": hvd.allreduce(g, op=hvd.Average, compression=hvd.Compression.fp16, name="hvd16"),
        }
        for m, kwargs in (("fp16", dict(compression="fp16")), ("bf16", dict(compression="bf16")),
                          ("topk1", dict(topk_ratio=RATIO, topk_min_elements=1))):  # fmt: skip
            reducer = ar.DenseReducer(ar.resolve_config(**kwargs), hvd.Average, 1.0, hvd.global_process_set, m)
            ops[m] = reducer.reduce([(g, v)])[0]
        ops = {m: ops[m].op for m in COLLECTIVES}
    sess = bc.start_session(graph, bc.session_config(args.intra_op, args.inter_op))
    times = {m: [] for m in COLLECTIVES}
    for m in COLLECTIVES:
        sess.run(ops[m])
    # Every rank runs the same order (collectives must match): the same seed on every rank.
    for _, m in bc.interleaved(COLLECTIVES, args.rounds, seed=7):
        t = time.perf_counter()
        sess.run(ops[m])
        times[m].append(time.perf_counter() - t)
    if hvd.rank() == 0:
        bc.write_json(args.rank_worker, {m: bc.summary_ms(t)["median_ms"] for m, t in times.items()})


def run_collectives(args):
    """The collectives part on 2 local ranks; {method: median ms}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2", "--gloo", "-H", "localhost:2"]
        cmd += [sys.executable, os.path.abspath(__file__), "--rank-worker", out, "--rounds", str(args.rounds)]
        cmd += ["--intra_op", str(args.intra_op), "--inter_op", str(args.inter_op)] + (
            ["--quick"] if args.quick else []
        )
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
            raise SystemExit("the 2-rank collectives run failed")
        with open(out) as f:
            return json.load(f)


def measure(args, shapes, load):
    """Median step time per (method, impl) with `load` busy processes beside."""
    busy = []
    try:
        for _ in range(load):
            code = "import time\nend = time.time() + %d\nwhile time.time() < end:\n    pass\n" % args.max_busy_s
            busy.append(subprocess.Popen([sys.executable, "-c", code]))
        graph, ops, mb = build(shapes)
        sess = bc.start_session(graph, bc.session_config(args.intra_op, args.inter_op))
        keys = list(ops)
        for key in keys:  # warm-up (kernel construction, the first Top-K residuals)
            for _ in range(2):
                sess.run(ops[key])
        times = {key: [] for key in keys}
        for _, key in bc.interleaved(keys, args.rounds, seed=load):
            t = time.perf_counter()
            sess.run(ops[key])
            times[key].append(time.perf_counter() - t)
        sess.close()
        collectives = run_collectives(args) if args.collectives else None
        loadavg = os.getloadavg()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    rows = []
    for m in METHODS:
        tf_ms = bc.summary_ms(times[(m, "tf")])["median_ms"]
        fused_ms = bc.summary_ms(times[(m, "fused")])["median_ms"]
        rows.append(
            {
                "method": m,
                "load_processes": load,
                "tf_ms": tf_ms,
                "fused_ms": fused_ms,
                "tf_ms_per_MB": tf_ms / mb,
                "fused_ms_per_MB": fused_ms / mb,
                "speedup": tf_ms / fused_ms,
                "loadavg_after": loadavg,
            }
        )
    if collectives is not None:
        for m in COLLECTIVES:
            rows.append({"collective": m, "load_processes": load, "ms": collectives[m], "loadavg_after": loadavg})
    return rows, mb


def link_ms_saved(method, mb, gbit):
    """Link time a 2-rank ring saves per step against a float32 allreduce (2(N-1)/N of the buffer per rank)."""
    ring = 2.0 * (RANKS - 1) / RANKS * mb
    if method in ("fp16", "bf16"):
        sent = ring / 2
    else:  # each rank allgathers k (index, value) entries of 8 or 6 bytes and receives the others'
        sent = RANKS * RATIO * mb / 4 * (6 if method.endswith("fp16") else 8)
    return (ring - sent) * 8 / (gbit * 1e3) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", type=int, nargs="+", default=[0, 2], help="busy processes beside, one run per value")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--quick", action="store_true", help="a model 16x smaller, 3 rounds")
    p.add_argument("--max_busy_s", type=int, default=900, help="upper bound on each busy process's life")
    p.add_argument("--intra_op", type=int, default=1, help="intra-op threads (1: as the ranks of bench_allreduce)")
    p.add_argument("--inter_op", type=int, default=1)
    p.add_argument("--collectives", action="store_true", help="also the reduction on 2 local ranks (horovodrun)")
    p.add_argument("--rank-worker", help=argparse.SUPPRESS)  # internal: one rank of --collectives, writing here
    p.add_argument("--json")
    args = p.parse_args()
    if args.rank_worker:
        return collectives_worker(args)
    if args.quick:
        args.rounds = min(args.rounds, 3)
    shapes = model_shapes(args.quick)
    out = {"machine": bc.machine_info(), "shapes": shapes, "ratio": RATIO, "ranks": RANKS, "results": []}
    t0 = time.time()
    mb = None
    for load in args.load:
        rows, mb = measure(args, shapes, load)
        out["results"].extend(rows)
    out["MB"] = mb
    out["wall_s"] = time.time() - t0
    lines = [
        "Compression cost per step, %.1f MB float32 gradients, averaged over %d ranks (intra_op=%d)"
        % (mb, RANKS, args.intra_op),
        "%-11s %5s %10s %10s %12s %12s %8s %14s"
        % ("method", "busy", "tf ms", "fused ms", "tf ms/MB", "fused ms/MB", "speedup", "saves@1Gbit ms"),
    ]
    for r in (r for r in out["results"] if "method" in r):
        lines.append(
            "%-11s %5d %10.2f %10.2f %12.3f %12.3f %7.1fx %14.0f"
            % (
                r["method"],
                r["load_processes"],
                r["tf_ms"],
                r["fused_ms"],
                r["tf_ms_per_MB"],
                r["fused_ms_per_MB"],
                r["speedup"],
                link_ms_saved(r["method"], mb, 1.0),
            )
        )
    coll = [r for r in out["results"] if "collective" in r]
    if coll:
        lines += ["", "The whole reduction on 2 local ranks (loopback), median ms per step:"]
        lines.append("%5s" % "busy" + "".join("%14s" % m for m in COLLECTIVES))
        for load in args.load:
            by = {r["collective"]: r["ms"] for r in coll if r["load_processes"] == load}
            lines.append("%5d" % load + "".join("%14.1f" % by[m] for m in COLLECTIVES))
    bc.finish(out, "\n".join(lines), args.json)


if __name__ == "__main__":
    main()
