"""Step time of float32, pure half (bfloat16, float16) and switched precision.

A small MLP (in -> width -> width -> 1, ReLU, MSE, Adam) on constant in-graph
data, trained with tensorflow_ext.mixed_precision in each mode; reports the
median step time of N steps after a warm-up and the ratio to float32, as a
markdown table. The machine is shared and noisy: compare ratios.

Usage:
  python tools/bench_mixed_precision.py [--steps 90] [--warmup 5] [--batch_size 256]
      [--width 128] [--inputs 64] [--threads 2] [--rounds 9]
"""

import argparse

import bench_common as bc
from bench_common import np, tf

from tensorflow_ext import mixed_precision as mp

# (label, mode, half dtype, initial precision)
CONFIGS = [
    ("float32", "float32", "float16", "float32"),
    ("pure bfloat16", "half", "bfloat16", "half"),
    ("pure float16", "half", "float16", "half"),
    ("switching, in bfloat16", "auto", "bfloat16", "half"),
    ("switching, in float16", "auto", "float16", "half"),
    ("switching, in float32 branch", "auto", "float16", "float32"),
]


def build(mode, half_dtype, initial, args):
    """Builds one configuration; returns (session, train_op, metrics, global_step)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(0)
        rng = np.random.RandomState(0)
        x = tf.constant(rng.randn(args.batch, args.inputs).astype(np.float32))
        y = tf.constant(rng.randn(args.batch, 1).astype(np.float32))

        def model(x, y):
            h = tf.compat.v1.layers.dense(x, args.width, tf.nn.relu, name="h1")
            h = tf.compat.v1.layers.dense(h, args.width, tf.nn.relu, name="h2")
            out = tf.compat.v1.layers.dense(h, 1, name="out")
            return tf.reduce_mean(tf.square(out - y))

        # Policy that never leaves the starting precision during the run.
        policy = mp.PolicyConfig(min_full_steps=10**6, max_full_steps=10**6, max_overflow_rate=0.99)
        amp = mp.MixedPrecision(mode=mode, half_dtype=half_dtype, policy=policy, initial_precision=initial)
        loss = amp.build(model, x, y)
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = amp.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(1e-3)).minimize(loss, global_step=gs)
        metrics = amp.metrics()
    sess = bc.start_session(graph, bc.session_config(args.threads, 1))
    for _ in range(args.warmup):
        sess.run(train)
    return sess, train, metrics, gs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch_size", "--batch", dest="batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    built = [build(mode, tf.as_dtype(dt), initial, args) for _, mode, dt, initial in CONFIGS]
    times = [[] for _ in CONFIGS]
    # The configurations take turns, per_round steps each, in rounds.
    per_round = max(1, args.steps // args.rounds)
    for _, i in bc.interleaved(range(len(built)), args.rounds, seed=0):
        sess, train = built[i][:2]
        times[i].extend(bc.time_call(sess.run, train) for _ in range(per_round))
    rows = []
    for (label, _, _, _), (sess, _, metrics, gs), t in zip(CONFIGS, built, times):
        m, applied = sess.run([metrics, gs])
        rows.append((label, bc.summary_ms(t)["median_ms"], m["half_fraction"], applied / m["total_steps"]))
        sess.close()
    base = rows[0][1]
    print(
        "MLP %d-%d-%d-1, batch %d, Adam, %d intra-op threads; median of %d steps "
        "(%d interleaved rounds) after %d warm-up"
        % (
            args.inputs,
            args.width,
            args.width,
            args.batch,
            args.threads,
            per_round * args.rounds,
            args.rounds,
            args.warmup,
        )
    )
    print()
    print("| mode | ms/step (median) | vs float32 | steps in half | steps applied |")
    print("|---|---:|---:|---:|---:|")
    for label, ms, half, applied in rows:
        print("| %s | %.2f | %.2fx | %.0f%% | %.0f%% |" % (label, ms, ms / base, 100 * half, 100 * applied))


if __name__ == "__main__":
    main()
