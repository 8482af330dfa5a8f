#!/usr/bin/env python
"""Training-step time of a 26-table CTR model with tf_ext's graph passes off and on, side by side.

Workload: the CTR example's model (``tensorflow_ext.examples.ctr.model_fn``: DeepFM, 26 categorical feature columns
= 26 dynamic embeddings, one per field, 13 dense features, MLP 256-128), batch 1024, embedding dim 8, Adagrad, on the
example's synthetic Criteo-like stream. Batches are generated before timing and fed with feed_dict.

Variants:
  chain     each feature's pooled lookup built from TensorFlow's sparse ops around a lookup
            (TF_EXT_EMBEDDING_FUSED_SPARSE=0), no graph pass
  off       one pooled-lookup op per feature (the default), no graph pass (the plain session config)
  lookups   tf_ext.graph.enable_optimizations(config, fuse_applies=False): the 26 lookups -> one multi-table lookup
  all       tf_ext.graph.enable_optimizations(config): lookups and the 26 sparse Adagrad updates fused

Each round is a fresh process that builds every variant (its own graph and session) and runs their training steps
in turn (round-robin, rotating order), so that machine noise hits all variants alike: 10 warm-up steps, then the
median of --steps timed steps per variant. The figure per variant is the median over --rounds fresh processes; the
ratio is to "off". All variants train on the same batches from the same seeds, so their losses must be identical
(checked and printed).

    python tools/bench_graph_passes.py                 # default: 3 rounds
    python tools/bench_graph_passes.py --quick         # 1 round, small batch
    python tools/bench_graph_passes.py --json docs/bench_graph_passes.json

--main_job runs the main job instead (``python -m tensorflow_ext.examples.ctr``: an Estimator on the synthetic
stream, its own input pipeline, --job_steps steps, no export) once per variant and round, fresh processes in
rotating order: ``static`` (26 static embedding variables of --static_buckets hashed buckets each, TF's own
feature columns: ``--static_buckets``), ``chain`` (TF_EXT_EMBEDDING_FUSED_SPARSE=0), ``off`` (the default build)
and ``all`` (--graph_passes); it reports the job's examples/s (its own figure: steps after the first) and checks
that AUC and logloss are identical across the dynamic variants.

    python tools/bench_graph_passes.py --main_job --json docs/bench_main_job_passes.json
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

VARIANTS = ("chain", "off", "lookups", "all")


def worker(args):
    """One round in this process: every variant in its own graph and session, steps taken in turn; prints one JSON
    line per variant with its step times (ms)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext
    from tensorflow_ext.examples import ctr, synthetic

    stream = synthetic.CriteoLikeStream(seed=args.seed, max_ids=args.max_ids)
    b = args.batch_size
    n = args.warmup + args.steps
    batches = [stream.batch(i, b) for i in range(n)]
    from tensorflow_ext.embedding import _ops

    runs = {}
    for variant in args.variants:
        _ops.set_fused_sparse(variant != "chain")
        with tf.Graph().as_default() as g:
            tf.compat.v1.set_random_seed(args.seed)
            feats = {k: tf.compat.v1.placeholder(tf.int64, [b], name=k) for k in synthetic.CATEGORICAL_KEYS}
            for k in synthetic.DENSE_KEYS:
                feats[k] = tf.compat.v1.placeholder(tf.float32, [b], name=k)
            labels = tf.compat.v1.placeholder(tf.float32, [b], name="labels")
            params = dict(
                model="deepfm",
                dim=args.dim,
                hidden_units=[int(h) for h in args.hidden.split(",")],
                optimizer="adagrad",
                learning_rate=0.5,
                num_shards=1,
                string_ids=False,
                init_stddev=0.05,
                log_every=10**9,
                batch_size=b,
                progress=False,
            )
            spec = ctr.model_fn(feats, labels, tf.estimator.ModeKeys.TRAIN, params)
            init = tf.compat.v1.global_variables_initializer()
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=args.intra_op, inter_op_parallelism_threads=args.inter_op
        )
        if variant == "lookups":
            tf_ext.graph.enable_optimizations(config, fuse_applies=False)
        elif variant == "all":
            tf_ext.graph.enable_optimizations(config)
        feeds = []
        for f, l, _ in batches:
            d = {feats[k]: f[k] for k in synthetic.CATEGORICAL_KEYS}
            for k in synthetic.DENSE_KEYS:
                d[feats[k]] = synthetic.log_counts(f[k])
            d[labels] = l
            feeds.append(d)
        sess = tf.compat.v1.Session(graph=g, config=config)
        sess.run(init)
        before = tf_ext.graph.pass_stats()
        sess.run(spec.train_op, feeds[0])  # the first run optimizes the graph (another fetch set than the steps)
        after = tf_ext.graph.pass_stats()
        runs[variant] = dict(
            sess=sess,
            fetches=[spec.train_op, spec.loss],
            feeds=feeds,
            times=[],
            losses=[],
            lookups_fused=after["lookups_fused"] - before["lookups_fused"],
            applies_fused=after["applies_fused"] - before["applies_fused"],
        )
    for i in range(1, n):
        # Round-robin, in a rotating order: machine noise hits every variant alike.
        order = args.variants[i % len(args.variants) :] + args.variants[: i % len(args.variants)]
        for variant in order:
            r = runs[variant]
            t = time.perf_counter()
            _, loss = r["sess"].run(r["fetches"], r["feeds"][i])
            if i >= args.warmup:
                r["times"].append(1000.0 * (time.perf_counter() - t))
            r["losses"].append(float(loss))
    for variant in args.variants:
        r = runs[variant]
        r["sess"].close()
        print(
            json.dumps(
                dict(
                    variant=variant,
                    median_ms=float(np.median(r["times"])),
                    p90_ms=float(np.percentile(r["times"], 90)),
                    loss_sum=float(np.sum(r["losses"])),
                    lookups_fused=r["lookups_fused"],
                    applies_fused=r["applies_fused"],
                )
            )
        )


def _write_json(path, argv, results, **meta):
    """The results and what produced them (command, machine, settings) as JSON at `path`."""
    meta.update(
        command="python tools/bench_graph_passes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        machine=platform.machine(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
    )
    with open(path, "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1, sort_keys=True)


MAIN_JOB_VARIANTS = ("static", "chain", "off", "all")
DYNAMIC_VARIANTS = tuple(v for v in MAIN_JOB_VARIANTS if v != "static")


def main_job(args, argv):
    """The main job per variant and round (fresh processes, rotating order): examples/s, AUC, logloss."""
    import statistics
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {v: [] for v in MAIN_JOB_VARIANTS}
    for r in range(args.rounds):
        k = r % len(MAIN_JOB_VARIANTS)
        order = MAIN_JOB_VARIANTS[k:] + MAIN_JOB_VARIANTS[:k]
        for variant in order:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=root)
            env.pop("TF_EXT_GRAPH_PASSES", None)
            env["TF_EXT_EMBEDDING_FUSED_SPARSE"] = "0" if variant == "chain" else "1"
            with tempfile.TemporaryDirectory() as model_dir:
                cmd = [
                    sys.executable,
                    "-m",
                    "tensorflow_ext.examples.ctr",
                    "--steps",
                    str(args.job_steps),
                    "--no_export",
                    "--model_dir",
                    model_dir,
                    "--quiet",
                ] + (["--graph_passes"] if variant == "all" else [])
                if variant == "static":
                    cmd += ["--static_buckets", str(args.static_buckets)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root)
            if out.returncode != 0:
                sys.exit("%s round %d failed:\n%s" % (variant, r + 1, out.stderr[-3000:]))
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[variant].append(res)
            print(
                "round %d  %-6s %8d examples/s  AUC %.4f  logloss %.4f"
                % (r + 1, variant, res["examples_per_sec"], res["auc"], res["logloss"]),
                flush=True,
            )
    summary = {}
    for v in MAIN_JOB_VARIANTS:
        eps = [x["examples_per_sec"] for x in results[v]]
        summary[v] = dict(
            examples_per_sec=int(statistics.median(eps)),
            rounds=eps,
            auc=results[v][0]["auc"],
            logloss=results[v][0]["logloss"],
        )
    base = summary["chain"]["examples_per_sec"]
    static = summary["static"]["examples_per_sec"]
    print(
        "\n| variant | examples/s (median of %d runs) | step time vs chain | vs static | AUC | logloss |" % args.rounds
    )
    print("|---|---:|---:|---:|---:|---:|")
    for v in MAIN_JOB_VARIANTS:
        s = summary[v]
        s["step_vs_chain"] = round(base / s["examples_per_sec"], 3)
        s["step_vs_static"] = round(static / s["examples_per_sec"], 3)
        print(
            "| %s | %d | %.2fx | %.2fx | %.4f | %.4f |"
            % (v, s["examples_per_sec"], s["step_vs_chain"], s["step_vs_static"], s["auc"], s["logloss"])
        )
    same = len({(x["auc"], x["logloss"]) for v in DYNAMIC_VARIANTS for x in results[v]}) == 1
    print("\nAUC and logloss identical across the dynamic variants and runs: %s" % same)
    if args.json:
        _write_json(
            args.json,
            argv,
            summary,
            job_steps=args.job_steps,
            static_buckets=args.static_buckets,
            rounds=args.rounds,
            quality_identical=same,
        )
    return 0 if same else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant and process")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=1024)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--hidden", default="256,128")
    p.add_argument("--max_ids", type=int, default=2**22)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--intra_op", type=int, default=2)
    p.add_argument("--inter_op", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="1 round, batch 256, 20 timed steps")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--main_job", action="store_true", help="time the main job per variant (see above)")
    p.add_argument("--job_steps", type=int, default=400, help="--main_job: training steps per run")
    p.add_argument("--static_buckets", type=int, default=2**17, help="--main_job: buckets per field of 'static'")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.main_job:
        return main_job(args, argv)
    if args.quick:
        args.rounds, args.batch_size, args.steps = 1, 256, 20

    forwarded = []
    for flag in ("steps", "warmup", "batch_size", "dim", "hidden", "max_ids", "seed", "intra_op", "inter_op"):
        forwarded += ["--" + flag, str(getattr(args, flag))]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_EXT_GRAPH_PASSES", None)
    results = {v: [] for v in args.variants}
    for r in range(args.rounds):
        out = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker", "--variants"] + args.variants + forwarded,
            env=env,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            sys.exit("round %d failed:\n%s" % (r + 1, out.stderr[-3000:]))
        for line in out.stdout.strip().splitlines():
            res = json.loads(line)
            results[res["variant"]].append(res)
            print(
                "round %d  %-8s %7.2f ms/step (p90 %.2f)" % (r + 1, res["variant"], res["median_ms"], res["p90_ms"]),
                flush=True,
            )

    import statistics

    summary = {}
    for v in args.variants:
        summary[v] = dict(
            median_ms=round(statistics.median(x["median_ms"] for x in results[v]), 2),
            rounds_ms=[round(x["median_ms"], 2) for x in results[v]],
            lookups_fused=results[v][0]["lookups_fused"],
            applies_fused=results[v][0]["applies_fused"],
            loss_sum=results[v][0]["loss_sum"],
        )
    base = summary.get("off", {}).get("median_ms")
    print()
    print(
        "| variant | step (ms, median of %d fresh processes) | vs off | lookups fused | updates fused |" % args.rounds
    )
    print("|---|---|---|---|---|")
    for v in args.variants:
        s = summary[v]
        ratio = "%.2fx" % (s["median_ms"] / base) if base else "-"
        s["ratio_vs_off"] = round(s["median_ms"] / base, 3) if base else None
        print("| %s | %.2f | %s | %d | %d |" % (v, s["median_ms"], ratio, s["lookups_fused"], s["applies_fused"]))
    same = len({summary[v]["loss_sum"] for v in args.variants}) == 1
    print("\nlosses identical across variants: %s" % same)
    if args.json:
        _write_json(
            args.json,
            argv,
            summary,
            batch_size=args.batch_size,
            dim=args.dim,
            hidden=args.hidden,
            steps=args.steps,
            rounds=args.rounds,
            intra_op=args.intra_op,
            inter_op=args.inter_op,
            losses_identical=same,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
