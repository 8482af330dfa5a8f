"""XLA on a ragged-batch stream: compile counts, compile time and step time of the dense part of a CTR model.

Model: 26 id fields looked up in one tf_ext dynamic embedding (dim 8, never compiled) + 13 dense features, an MLP
256-128-1, Adagrad. The stream: batches of random sizes in [--min_batch, --max_batch]. Variants, each in a fresh
process, side by side:

  plain      no XLA
  autoclust  TF's auto-clustering (global_jit_level ON_1, TF_XLA_FLAGS=--tf_xla_cpu_global_jit)
  jit_scope  the MLP under tf.xla.experimental.jit_scope() (one compilation per new batch size)
  bucketed   tf_ext.xla.compile_bucketed on the MLP (batch padded to powers of two)

Compilations and their time are counted from TF's own log (device_compiler, VLOG 1); lazy compilation is off, so a
shape compiles at its first run.

    .venv/bin/python tools/bench_xla.py --json docs/bench_xla.json
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANTS = ("plain", "autoclust", "jit_scope", "bucketed")


def worker(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel

    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 26])
    dense = tf.compat.v1.placeholder(tf.float32, [None, 13])
    labels = tf.compat.v1.placeholder(tf.float32, [None])
    emb = tf_ext.get_dynamic_embedding("emb", 8, initializer=tf.compat.v1.random_normal_initializer(0, 0.05, seed=1))
    x = tf.concat([tf.reshape(tf_ext.embedding_lookup(emb, ids), [-1, 26 * 8]), dense], 1)

    def mlp(x):
        h = tf.compat.v1.layers.dense(x, 256, tf.nn.relu, name="h1")
        h = tf.compat.v1.layers.dense(h, 128, tf.nn.relu, name="h2")
        return tf.squeeze(tf.compat.v1.layers.dense(h, 1, name="out"), 1)

    if args.variant == "bucketed":
        logits = tf_ext.xla.compile_bucketed(mlp, [x])
    elif args.variant == "jit_scope":
        with tf.xla.experimental.jit_scope():
            logits = mlp(x)
    else:
        logits = mlp(x)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss, global_step=gs)
    config = tf.compat.v1.ConfigProto()
    if args.variant == "autoclust":
        config.graph_options.optimizer_options.global_jit_level = tf.compat.v1.OptimizerOptions.ON_1
    rng = np.random.RandomState(0)
    sizes = rng.randint(args.min_batch, args.max_batch + 1, size=args.steps)
    times = []
    t_all = time.perf_counter()
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for n in sizes:
            feed = {
                ids: rng.zipf(1.2, size=[n, 26]) + np.arange(26) * 1000003,
                dense: rng.normal(size=[n, 13]).astype(np.float32),
                labels: (rng.uniform(size=n) < 0.25).astype(np.float32),
            }
            t0 = time.perf_counter()
            sess.run(train, feed)
            times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    last = times[len(times) // 2 :]
    out = dict(
        variant=args.variant,
        total_seconds=total,
        median_step_ms_second_half=float(np.median(last) * 1e3),
        examples_per_sec_second_half=float(np.sum(sizes[len(times) // 2 :]) / np.sum(last)),
        distinct_sizes=int(len(set(sizes.tolist()))),
    )
    print("RESULT " + json.dumps(out), flush=True)


def run_variant(variant, args):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="device_compiler=1")
    env["TF_XLA_FLAGS"] = "--tf_xla_enable_lazy_compilation=false" + (
        " --tf_xla_cpu_global_jit" if variant == "autoclust" else ""
    )
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--variant", variant]
    cmd += ["--steps", str(args.steps), "--min_batch", str(args.min_batch), "--max_batch", str(args.max_batch)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (variant, r.stderr[-3000:]))
    out = json.loads(r.stdout.split("RESULT ", 1)[1].splitlines()[0])
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    compiles = [
        float(t) * scale[u]
        for t, u in re.findall(r"Compilation of XLA executable time: ([\d.]+) (us|ms|s)\b", r.stderr)
    ]
    real = [c for c in compiles if c >= 1e-3]  # cache hits are logged too, in microseconds
    out["compilations"] = len(real)
    out["compile_seconds"] = round(sum(real), 2)
    out["gave_up"] = "megamorphic" in r.stderr.lower()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=VARIANTS)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--min_batch", type=int, default=256)
    p.add_argument("--max_batch", type=int, default=2048)
    p.add_argument("--timeout", type=int, default=1200)
    p.add_argument("--json")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    results = [run_variant(v, args) for v in args.variants]
    print("variant    total s  compilations  compile s  step ms (2nd half)  examples/s (2nd half)")
    for r in results:
        print(
            "%-10s %7.1f  %12d  %9.2f  %18.2f  %21.0f"
            % (
                r["variant"],
                r["total_seconds"],
                r["compilations"],
                r["compile_seconds"],
                r["median_step_ms_second_half"],
                r["examples_per_sec_second_half"],
            )
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
