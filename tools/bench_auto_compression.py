"""compression="auto" against plain Horovod on the ranks of one machine (loopback: a fast link), side by side.

Each rank trains loss = sum(w * x) over dense variables of `--params` float32 entries in total (the gradient is
the fed data, so the step is the gradient exchange plus an SGD update), with two optimizers in two graphs of one
process: plain Horovod (`DistributedOptimizer` defaults) and `compression="auto"` (plus `--topk_ratio` when given).
Their steps run in alternating rounds of `--steps`, so a change of the machine's load hits both alike; rank 0
prints the choice, the median seconds per step of each and their ratio, and the load average.

    .venv/bin/python tools/bench_auto_compression.py --np 2 --params 4000000 --rounds 5 --steps 10
"""

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(args):
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext.horovod as tfe_hvd

    tfe_hvd.init()
    rank = tfe_hvd.rank()
    # A few layers' worth of shapes: one large matrix, a medium one, biases.
    big = max(1, int(args.params * 0.8) // 1024)
    shapes = [(big, 1024), (max(1, int(args.params * 0.2) // 256), 256), (1024,), (256,)]
    feeds = [np.random.RandomState(rank + i).normal(size=s).astype(np.float32) for i, s in enumerate(shapes)]

    def build(**kwargs):
        g = tf.Graph()
        with g.as_default():
            vs = [
                tf.compat.v1.get_variable("v%d" % i, initializer=tf.zeros(s), use_resource=True)
                for i, s in enumerate(shapes)
            ]
            phs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
            loss = tf.add_n([tf.reduce_sum(v * p) for v, p in zip(vs, phs)])
            opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1e-6), **kwargs)
            train = opt.minimize(loss)
            bcast = tfe_hvd.broadcast_global_variables(0)
            init = tf.compat.v1.global_variables_initializer()
        s = tf.compat.v1.Session(graph=g)
        s.run(init)
        s.run(bcast)
        return opt, s, train, dict(zip(phs, feeds))

    auto_kwargs = dict(compression="auto")
    if args.topk_ratio:
        auto_kwargs["topk_ratio"] = args.topk_ratio
    runs = {"plain": build(), "auto": build(**auto_kwargs)}
    times = {m: [] for m in runs}
    for m, (_, s, train, feed) in runs.items():
        s.run(train, feed)  # warm-up
    for _ in range(args.rounds):
        for m, (_, s, train, feed) in runs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                s.run(train, feed)
            times[m].append((time.perf_counter() - start) / args.steps)
    if rank == 0:
        plain, auto = (float(np.median(times[m])) for m in ("plain", "auto"))
        print("choice: %s" % runs["auto"][0].compression_choices)
        print(
            "params %d, %d ranks: plain %.2f ms/step, auto %.2f ms/step, auto/plain %.3f (load %s)"
            % (args.params, tfe_hvd.size(), 1e3 * plain, 1e3 * auto, auto / plain, " ".join(map(str, os.getloadavg())))
        )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--params", type=int, default=4000000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--topk_ratio", type=float, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    cmd = [horovodrun, "-np", str(args.np), "--gloo", "-H", "localhost:%d" % args.np, sys.executable, __file__]
    cmd += ["--worker", "--params", str(args.params), "--rounds", str(args.rounds), "--steps", str(args.steps)]
    if args.topk_ratio:
        cmd += ["--topk_ratio", str(args.topk_ratio)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if "choice:" in l or "auto/plain" in l or "Error" in l]
    print("\n".join(lines) if r.returncode == 0 else (r.stdout + r.stderr)[-5000:])
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
