"""Distributed training step: tensorflow_ext.horovod (model- and data-parallel) vs plain Horovod, 1/2/4 ranks.

Each configuration runs in fresh processes under `horovodrun --gloo` on this machine. The global batch is fixed
(strong scaling): rank r trains rows [r*B/N, (r+1)*B/N) of the same global batch stream, so every rank count sees
the same keys and the tables can be compared.

Model: F categorical fields (Zipf(1.1) ids over 2^22 per field, hashed with the field), split over E embedding
tables (`--embeddings`, default 1; `--dims` gives their dims in turn, default 16), concatenated into an MLP
128-64-1, logistic loss, Adagrad 0.05 everywhere.

Variants:
  tfext_model          tf_ext dynamic embeddings, model-parallel (each rank owns 1/N of the keys; alltoall lookups,
                       the exchanges of all tables fused: one alltoall of keys, one of rows, one of gradients)
  tfext_model_unfused  the same with each table's own exchanges (TF_EXT_HVD_FUSED_EXCHANGES=0): 3 alltoalls per
                       table per step
  tfext_data           tf_ext dynamic embeddings replicated on every rank (sparse gradients allgathered)
  hvd_static           plain Horovod: hvd.DistributedOptimizer, static [2^20 / E, dim] variables (ids mod the size,
                       collisions), tf.nn.embedding_lookup (their IndexedSlices gradients allgathered by Horovod)

`--repeats R` runs the variants R times in turn (A B A B ..., each in fresh processes) and reports, per variant,
the median over the repeats and each variant's step time over hvd_static's (the median of the per-repeat ratios).
The load average is recorded before each run. `--cycle_time MS` sets HOROVOD_CYCLE_TIME for every run.
`--netsim RATE` (root) runs each job on two simulated nodes (network namespaces joined by a veth pair shaped with
`tc ... tbf rate RATE` on both ends, as tools/bench_allreduce.py does), one rank on each, and removes them at the end.

Reported per configuration: median step time (ms), examples/s total and per rank, payload bytes each rank hands to
collectives per step (what the graph passes to allreduce/allgather/alltoall; the wire traffic of a ring allreduce is
about 2(N-1)/N of it), of which the alltoalls of a model-parallel lookup (the keys and the rows it sends, and the
rows' gradients), and table bytes per rank (tf_ext: TfExtTableMemoryBytes of the local tables; static: the variable
and its Adagrad slot).

`--value_dtypes` runs the tf_ext variants once per storage dtype of the embedding (float32, bfloat16, float16); a
half-precision model-parallel embedding sends its rows as 2-byte values.

    .venv/bin/python tools/bench_horovod.py --json docs/bench_horovod.json          # ~5 min on 2 cores
    .venv/bin/python tools/bench_horovod.py --ranks 1 2 --steps 10 --quick           # smoke run
    .venv/bin/python tools/bench_horovod.py --ranks 2 --variants tfext_model --value_dtypes float32 bfloat16
    .venv/bin/python tools/bench_horovod.py --ranks 2 --variants tfext_model hvd_static --repeats 5    # A B A B
    .venv/bin/python tools/bench_horovod.py --ranks 2 --embeddings 8 --dims 16 8 32 16 --repeats 5 \
        --variants tfext_model tfext_model_unfused hvd_static
    sudo .venv/bin/python tools/bench_horovod.py --ranks 2 --netsim 1gbit --variants tfext_model hvd_static \
        --repeats 3
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import netsim as netsim_lib  # tools/netsim.py: the namespaces, the link, the ranks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANTS = ("tfext_model", "tfext_model_unfused", "tfext_data", "hvd_static")
DEFAULT_VARIANTS = ("tfext_model", "tfext_data", "hvd_static")
VALUE_DTYPES = ("float32", "bfloat16", "float16")
COLLECTIVES = ("HorovodAllreduce", "HorovodAllgather", "HorovodAlltoall", "HorovodGroupedAllreduce")
VOCAB_BITS, STATIC_BUCKETS = 22, 1 << 20


def _zipf_ids(rng, n, fields):
    import numpy as np  # pylint: disable=import-outside-toplevel

    ids = np.minimum(rng.zipf(1.1, size=[n, fields]), 1 << VOCAB_BITS).astype(np.int64)
    return ids + (np.arange(fields, dtype=np.int64) << 40)  # one key space per field


def _ops_run_by(op):
    """The ops that running `op` runs (its data and control inputs, transitively), in graph order."""
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        if o not in seen:
            seen.add(o)
            todo.extend(t.op for t in o.inputs)
            todo.extend(o.control_inputs)
    return [o for o in op.graph.get_operations() if o in seen]


def worker(args):
    """One rank (under horovodrun): trains, times, writes its figures to args.out/rank-<r>.json."""
    sys.path.insert(0, HERE)
    import bench_common  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (TF1 mode, quiet logs)
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel
    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    per_rank = args.global_batch // size
    fields = args.fields
    payload = []  # bytes handed to collectives per step
    alltoall = {"keys": [], "rows": [], "row_gradients": []}  # the model-parallel lookup's share of it

    with tf.Graph().as_default() as g:
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [per_rank, fields])
        labels = tf.compat.v1.placeholder(tf.float32, [per_rank, 1])
        init = tf.compat.v1.truncated_normal_initializer(0.0, 0.05, seed=1)
        groups = np.array_split(np.arange(fields), args.embeddings)
        xs, table_sizes = [], []
        for k, cols in enumerate(groups):
            dim = args.dims[k % len(args.dims)]
            name = "emb" if args.embeddings == 1 else "emb%d" % k
            ids_k = ids if args.embeddings == 1 else tf.gather(ids, cols, axis=1)
            if args.variant == "hvd_static":
                buckets = STATIC_BUCKETS // args.embeddings
                table = tf.compat.v1.get_variable("static_" + name, [buckets, dim], initializer=init)
                xs.append(tf.nn.embedding_lookup(table, tf.math.floormod(ids_k, buckets)))
                table_sizes.append(tf.constant(2 * buckets * dim * 4, tf.int64))  # variable + Adagrad slot
            else:
                emb = tfe_hvd.get_dynamic_embedding(
                    name,
                    dim,
                    parallelism="data" if args.variant == "tfext_data" else "model",
                    initializer=init,
                    value_dtype=args.value_dtype,
                )
                xs.append(tf_ext.embedding_lookup(emb, ids_k))
                table_sizes.append(emb.memory_bytes())
            xs[-1] = tf.reshape(xs[-1], [per_rank, len(cols) * dim])
        x = tf.concat(xs, 1)
        mem = tf.add_n([tf.cast(t, tf.int64) for t in table_sizes])
        table_bytes = lambda sess: int(sess.run(mem))  # noqa: E731
        for width in (128, 64):
            x = tf.compat.v1.layers.dense(x, width, activation=tf.nn.relu)
        logits = tf.compat.v1.layers.dense(x, 1)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        opt = tf.compat.v1.train.AdagradOptimizer(0.05)
        if args.variant == "hvd_static":
            opt = hvd.DistributedOptimizer(opt)
        else:
            opt = tfe_hvd.DistributedOptimizer(opt)
        grads_and_vars = opt.compute_gradients(loss)
        train = opt.apply_gradients(grads_and_vars, global_step=gs)
        # Payload per step: look at what the graph hands to Horovod's collectives (inputs of Horovod ops) that a
        # step runs (the lookups' own exchanges stay in the graph unused once fused).
        for op in _ops_run_by(train):
            if op.type in COLLECTIVES:
                for t in op.inputs:
                    # (uint16: half rows on the wire; the model check's one-time collectives send other dtypes.)
                    if t.dtype in (tf.float32, tf.float16, tf.uint16, tf.int64, tf.int32) and t.op.type != "Const":
                        nbytes = tf.cast(tf.size(t), tf.int64) * t.dtype.size
                        payload.append(nbytes)
                        if op.type == "HorovodAlltoall":
                            # tf.gradients builds the backward alltoall under "gradients/".
                            part = (
                                "row_gradients"
                                if op.name.startswith("gradients")
                                else ("keys" if t.dtype == tf.int64 else "rows")
                            )
                            alltoall[part].append(nbytes)
        total = lambda sizes: tf.add_n(sizes) if sizes else tf.constant(0, tf.int64)  # noqa: E731
        payload_bytes = {"payload_bytes": total(payload)}
        payload_bytes.update({"alltoall_%s_bytes" % part: total(sizes) for part, sizes in alltoall.items()})
        bcast = hvd.broadcast_global_variables(0)
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=args.intra_op, inter_op_parallelism_threads=1)
        with tf.compat.v1.Session(graph=g, config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            times, cpu, sent = [], [], {name: [] for name in payload_bytes}
            # The batches are drawn before the steps: drawing them between steps (Zipf sampling, several ms) would
            # compete for the cores with the other ranks' steps.
            batches = []
            sl = slice(rank * per_rank, (rank + 1) * per_rank)
            for step in range(args.warmup + args.steps):
                rng = np.random.RandomState(1000 + step)  # the same global batch on every rank count
                gids = _zipf_ids(rng, args.global_batch, fields)
                glabels = (rng.uniform(size=[args.global_batch, 1]) < 0.25).astype(np.float32)
                batches.append((gids[sl], glabels[sl]))
            for step, (batch_ids, batch_labels) in enumerate(batches):
                t0, c0 = time.perf_counter(), time.process_time()
                _, b = sess.run([train, payload_bytes], {ids: batch_ids, labels: batch_labels})
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                if step >= args.warmup:
                    times.append(dt)
                    cpu.append(dc)
                    for name, value in b.items():
                        sent[name].append(int(value))
            out = {
                "rank": rank,
                "size": size,
                "variant": args.variant,
                "step_ms": float(np.median(times) * 1e3),
                # CPU time of the whole process (TF, Horovod's and Gloo's threads) per step: the work a step costs
                # this rank, which the machine's load does not change much.
                "cpu_ms": float(np.median(cpu) * 1e3),
                "table_bytes": table_bytes(sess),
            }
            out.update({name: float(np.median(values)) for name, values in sent.items()})
    with open(os.path.join(args.out, "rank-%d.json" % rank), "w") as f:
        json.dump(out, f)


def run_config(variant, ranks, value_dtype, args):
    with tempfile.TemporaryDirectory() as out:
        worker_args = [
            "--variant",
            variant,
            "--value_dtype",
            value_dtype,
            "--out",
            out,
            "--global_batch",
            str(args.global_batch),
            "--fields",
            str(args.fields),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--intra_op",
            str(args.intra_op),
            "--embeddings",
            str(args.embeddings),
            "--dims",
        ] + [str(d) for d in args.dims]
        if args.netsim:
            # One rank per simulated node; the job runs from the first node (the rendezvous is there).
            cmd = ["ip", "netns", "exec", netsim_lib.NS[0], sys.executable, os.path.abspath(__file__)]
            cmd += ["--netsim_driver"]
        else:
            cmd = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", str(ranks), "--gloo"]
            cmd += ["-H", "localhost:%d" % ranks, sys.executable, os.path.abspath(__file__), "--worker"]
        cmd += worker_args
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), TF_CPP_MIN_LOG_LEVEL="2"
        )
        # The unfused variant: each table's own exchanges (the same model and results, 3 alltoalls per table).
        env["TF_EXT_HVD_FUSED_EXCHANGES"] = "0" if variant == "tfext_model_unfused" else "1"
        if args.cycle_time is not None:
            env["HOROVOD_CYCLE_TIME"] = str(args.cycle_time)
        load_avg = os.getloadavg()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0:
            raise RuntimeError("%s at %d ranks failed:\n%s" % (variant, ranks, (r.stdout + r.stderr)[-4000:]))
        per_rank = [json.load(open(os.path.join(out, "rank-%d.json" % i))) for i in range(ranks)]
    step_ms = max(p["step_ms"] for p in per_rank)  # a synchronous step is as slow as its slowest rank
    return {
        "variant": variant,
        "value_dtype": value_dtype,
        "ranks": ranks,
        "step_ms": step_ms,
        "cpu_ms_per_rank": max(p["cpu_ms"] for p in per_rank),
        "examples_per_s": args.global_batch / (step_ms / 1e3),
        "examples_per_s_per_rank": args.global_batch / ranks / (step_ms / 1e3),
        "payload_bytes_per_rank": max(p["payload_bytes"] for p in per_rank),
        "alltoall_bytes_per_rank": {
            part: max(p["alltoall_%s_bytes" % part] for p in per_rank) for part in ("keys", "rows", "row_gradients")
        },
        "table_bytes_per_rank": max(p["table_bytes"] for p in per_rank),
        "table_bytes_all_ranks": sum(p["table_bytes"] for p in per_rank),
        "load_avg_before": load_avg,
    }


# ---------------------------------------------------------------------------------------------------------------
# --netsim: two network namespaces ("nodes") joined by a veth pair shaped with tbf on both ends, one rank in each
# (tools/netsim.py). Names of its own (other tools' namespaces may exist at the same time).

netsim_lib.use_names(
    ns=("tfe_mp_n0", "tfe_mp_n1"),
    dev=("tfe_mp_v0", "tfe_mp_v1"),
    ips=("10.235.0.1", "10.235.0.2"),
    hostnames=("tfe-mp-node0", "tfe-mp-node1"),
)


def netsim_driver(worker_argv, out):
    """Inside the first node: Horovod's Gloo rendezvous server and one rank per node (what horovodrun would do)."""
    argv = [sys.executable, os.path.abspath(__file__), "--worker"] + worker_argv
    # The ranks' PYTHONPATH: the repository ahead of this process's (run_config's), as before.
    env = {"PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    codes = netsim_lib.run_ranks(1, argv, out, env=env)
    if any(codes):
        sys.stderr.write(netsim_lib.rank_logs(out, len(codes)))
        sys.exit("ranks exited with %s" % codes)
    return 0


def _summary(results):
    """Per rank count and variant: the median step over the repeats, and the median over the repeats of its step
    over hvd_static's step in the same repeat."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    lines = []
    for ranks in sorted({r["ranks"] for r in results}):
        runs = [r for r in results if r["ranks"] == ranks]
        static = {r["repeat"]: r["step_ms"] for r in runs if r["variant"] == "hvd_static"}
        loads = [r["load_avg_before"][0] for r in runs]
        for variant, value_dtype in sorted({(r["variant"], r["value_dtype"]) for r in runs}):
            mine = [r for r in runs if (r["variant"], r["value_dtype"]) == (variant, value_dtype)]
            ratios = [r["step_ms"] / static[r["repeat"]] for r in mine if r["repeat"] in static]
            lines.append(
                "summary ranks=%d %-19s %-8s median step %7.1f ms (cpu %.1f ms/rank) over %d runs%s  (load %.1f-%.1f)"
                % (
                    ranks,
                    variant,
                    value_dtype,
                    np.median([r["step_ms"] for r in mine]),
                    np.median([r["cpu_ms_per_rank"] for r in mine]),
                    len(mine),
                    (
                        ", vs hvd_static %.2fx (per-run ratios %s)"
                        % (np.median(ratios), " ".join("%.2f" % x for x in ratios))
                        if ratios
                        else ""
                    ),
                    min(loads),
                    max(loads),
                )
            )
    return lines


def _run_all(args):
    """Every configuration, the variants in turn within each repeat; prints a line per run."""
    results = []
    for ranks in args.ranks:
        for repeat in range(args.repeats):
            for variant in args.variants:
                for value_dtype in args.value_dtypes if variant != "hvd_static" else ["float32"]:
                    res = run_config(variant, ranks, value_dtype, args)
                    res["repeat"] = repeat
                    results.append(res)
                    a2a = res["alltoall_bytes_per_rank"]
                    print(
                        "%-19s %-8s ranks=%d  step %7.1f ms  %8.0f ex/s (%7.0f per rank)  payload %6.2f MB/rank/step "
                        "(alltoall keys %.3f, rows %.3f, row gradients %.3f)  table %7.1f MB/rank  cpu %.1f ms/rank  "
                        "load %.1f"
                        % (
                            variant,
                            value_dtype,
                            ranks,
                            res["step_ms"],
                            res["examples_per_s"],
                            res["examples_per_s_per_rank"],
                            res["payload_bytes_per_rank"] / 1e6,
                            a2a["keys"] / 1e6,
                            a2a["rows"] / 1e6,
                            a2a["row_gradients"] / 1e6,
                            res["table_bytes_per_rank"] / 1e6,
                            res["cpu_ms_per_rank"],
                            res["load_avg_before"][0],
                        ),
                        flush=True,
                    )
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS)
    parser.add_argument("--value_dtype", choices=VALUE_DTYPES, default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(DEFAULT_VARIANTS))
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument(
        "--value_dtypes",
        nargs="+",
        choices=VALUE_DTYPES,
        default=["float32"],
        help="storage dtypes of the tf_ext embeddings (hvd_static runs once, in float32)",
    )
    parser.add_argument("--global_batch", type=int, default=4096)
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--intra_op", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--embeddings", type=int, default=1, help="embedding tables the fields are split over")
    parser.add_argument("--dims", nargs="+", type=int, default=[16], help="the tables' dims, in turn")
    parser.add_argument("--repeats", type=int, default=1, help="run the variants this many times in turn")
    parser.add_argument("--cycle_time", type=float, help="HOROVOD_CYCLE_TIME (ms) of every run (default: Horovod's)")
    parser.add_argument(
        "--netsim",
        metavar="RATE",
        help="(root) run each job on two simulated nodes, one rank each, joined by a link of RATE (tc rate, e.g. "
        "1gbit); --ranks must be 2",
    )
    parser.add_argument("--netsim_driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--quick", action="store_true", help="small batch, few steps (smoke run)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.netsim_driver:
        argv = sys.argv[1:]
        argv.remove("--netsim_driver")
        return netsim_driver(argv, args.out)
    if args.quick:
        args.global_batch, args.steps, args.warmup = 512, 5, 2
    if not 1 <= args.embeddings <= args.fields:
        parser.error("--embeddings must be in [1, --fields], got %d" % args.embeddings)
    if args.netsim:
        if args.ranks != [2]:
            parser.error("--netsim runs one rank on each of 2 nodes: use --ranks 2, got %s" % args.ranks)
        if os.geteuid() != 0:
            sys.exit("--netsim needs root (network namespaces and tc)")
        signal.signal(signal.SIGTERM, lambda signum, frame: (netsim_lib.teardown(), sys.exit(128 + signum)))
        netsim_lib.setup(args.netsim)
    try:
        results = _run_all(args)
    finally:
        if args.netsim:
            netsim_lib.teardown()
    summary = _summary(results) if args.repeats > 1 else []
    for line in summary:
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": {
                        k: v for k, v in vars(args).items() if k not in ("worker", "out", "variant", "value_dtype")
                    },
                    "load_avg": os.getloadavg(),
                    "results": results,
                    "summary": summary,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
