"""16-bit reduction over the simulated network: the ways of summing an fp16 / bf16 buffer across ranks, side by side.

Two simulated nodes (tools/netsim.py: namespaces joined by a shaped veth), one rank per node by default, per link
rate, in one job per Horovod build:

  * allreduce micro-benchmark of one float32 gradient of 1 .. 64 MiB, median time:
      plain       Horovod's float32 allreduce (Gloo's ring: both directions of the link at once);
      fp16_ring   DenseReducer fp16, the buffer summed by Horovod's fp16 allreduce (Gloo's ring, its fp16 sum);
      fp16_bytes  DenseReducer fp16 reduced as bytes: alltoall, the float32 sum kernel of compression_ops, allgather;
      bf16        DenseReducer bf16 (always as bytes: Horovod has no bf16 reduction);
  * training steps/s of tools/bench_allreduce.py's MLP (6.3M parameters, 25 MB of gradients per step) with plain,
    fp16_ring, fp16_bytes and bf16, and each one's eval loss.

`--horovod-dir DIR` puts a Horovod installed with `pip install --target DIR` ahead of the venv's (to compare two
Horovod builds: Gloo's scalar fp16 sum and its F16C one). `--busy N` runs N CPU-bound processes beside the ranks
for the whole job (bounded busy loops, stopped by the tool). The two fp16 paths are chosen per graph with
TF_EXT_HVD_FP16_REDUCTION (`ring` or `bytes`; see tensorflow_ext/horovod/wire16.py), a setting for this comparison.

    sudo flock /tmp/tfext_bench.lock .venv/bin/python tools/bench_wire16.py --rates 1gbit 100mbit
    sudo flock /tmp/tfext_bench.lock .venv/bin/python tools/bench_wire16.py --rates 1gbit --busy 2
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import netsim as ns  # noqa: E402  (the namespaces, the link, the ranks)

MICRO = ("plain", "fp16_ring", "fp16_bytes", "bf16")
TRAIN = ("plain", "fp16_ring", "fp16_bytes", "bf16")
COMPRESSION = {"plain": None, "fp16_ring": "fp16", "fp16_bytes": "fp16", "bf16": "bf16"}
FP16_PATH = {"fp16_ring": "ring", "fp16_bytes": "bytes"}


def _busy(n, seconds):
    """n CPU-bound processes, each ending by itself after `seconds` (the tool also stops them)."""
    loop = "import time\nt = time.time() + %f\nwhile time.time() < t:\n    pass\n" % seconds
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


def netsim(args):
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces and tc)")
    results = {"load_start": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "runs": []}
    busy = _busy(args.busy, args.busy_seconds)
    try:
        for rate in args.rates:
            ns.setup(rate)
            with tempfile.TemporaryDirectory() as out:
                t0 = time.time()
                cmd = ["ip", "netns", "exec", ns.NS[0], sys.executable, os.path.abspath(__file__), "driver"]
                cmd += ["--out", out, "--per-node", str(args.per_node), "--steps", str(args.steps)]
                cmd += ["--sizes"] + [str(s) for s in args.sizes]
                cmd += ["--horovod-dir", args.horovod_dir] if args.horovod_dir else []
                r = subprocess.run(cmd, text=True, capture_output=True, timeout=900)
                if r.returncode != 0:
                    sys.stderr.write(r.stdout[-6000:] + r.stderr[-6000:])
                    raise SystemExit("the job at %s failed" % rate)
                with open(os.path.join(out, "rank0.json")) as f:
                    run = json.load(f)
            run.update(rate=rate, wall_s=round(time.time() - t0, 1))
            results["runs"].append(run)
            _print(run)
    finally:
        ns.teardown()
        for p in busy:
            p.kill()
            p.wait()
    results["load_end"] = os.getloadavg()
    print("load average: start %s end %s" % (results["load_start"], results["load_end"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _print(run):
    print("== link %s, %d ranks, Horovod %s (job %.0f s)" % (run["rate"], run["ranks"], run["horovod"], run["wall_s"]))
    print("%-10s" % "MiB" + "".join("%14s" % m for m in MICRO))
    for row in run["micro"]:
        print("%-10g" % (row["bytes"] / 2**20) + "".join("%11.1f ms" % row[m] for m in MICRO))
    for m, t in run["train"].items():
        print("train %-11s %6.2f steps/s (%.2fx plain)  eval loss %.5f" % (
            m, t["steps_per_s"], t["steps_per_s"] / run["train"]["plain"]["steps_per_s"], t["eval_loss"]))  # fmt: skip
    sys.stdout.flush()


def driver(args):
    argv = [sys.executable, os.path.abspath(__file__), "worker", "--out", args.out, "--steps", str(args.steps)]
    argv += ["--sizes"] + [str(s) for s in args.sizes]
    if args.horovod_dir:
        argv = ["env", "PYTHONPATH=%s:%s" % (args.horovod_dir, ns.ROOT)] + argv
    codes = ns.run_ranks(args.per_node, argv, args.out)
    if any(codes):
        sys.stderr.write(ns.rank_logs(args.out, len(codes)))
        sys.exit("ranks exited with %s" % codes)


def _reduction(m, grad, v):
    """The averaged gradient with method m (the fp16 path is read when the graph is built)."""
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    from tensorflow_ext.horovod import allreduce as ar  # pylint: disable=import-outside-toplevel

    if COMPRESSION[m] is None:
        return hvd.allreduce(grad, op=hvd.Average, name="plain")
    cfg = ar.resolve_config(compression=COMPRESSION[m])
    return ar.DenseReducer(cfg, hvd.Average, 1.0, hvd.global_process_set, m).reduce([(grad, v)])[0]


def _fp16_path(m):
    os.environ["TF_EXT_HVD_FP16_REDUCTION"] = FP16_PATH.get(m, "ring")


def worker(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import horovod  # pylint: disable=import-outside-toplevel
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import consistency  # pylint: disable=import-outside-toplevel

    tfe_hvd.init()
    rank, size = hvd.rank(), hvd.size()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    out = {"ranks": size, "horovod": os.path.dirname(horovod.__file__), "micro": [], "train": {}}

    for mib in args.sizes:
        n = int(mib * 2**20) // 4
        reps = 5 if mib <= 4 else 3
        row = {"bytes": n * 4}
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable(
                "x", initializer=tf.random.stateless_normal([n], seed=[rank, 1]), use_resource=True
            )
            ops = {}
            for m in MICRO:
                _fp16_path(m)
                ops[m] = _reduction(m, consistency.gate(v.read_value()), v)
            with tf.compat.v1.Session(config=config) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                for m, op in ops.items():
                    s.run(op.op)  # warm-up
                    times = []
                    for _ in range(reps):
                        t = time.perf_counter()
                        s.run(op.op)
                        times.append(time.perf_counter() - t)
                    row[m] = float(np.median(times)) * 1e3
        out["micro"].append(row)

    steps, warm = args.steps, 3
    batch, din = 16, 1024
    rng = np.random.RandomState(7)
    teacher = rng.normal(size=[din, 1]).astype(np.float32) / np.sqrt(din)
    eval_x = rng.normal(size=[512, din]).astype(np.float32)
    eval_y = np.tanh(eval_x @ teacher) + 0.1 * np.sin(3 * eval_x[:, :1])
    for m in TRAIN:
        _fp16_path(m)
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(1)
            x = tf.compat.v1.placeholder(tf.float32, [None, din])
            y = tf.compat.v1.placeholder(tf.float32, [None, 1])
            h = x
            for i, width in enumerate((2048, 2048)):
                h = tf.compat.v1.layers.dense(h, width, tf.nn.relu, name="h%d" % i)
            pred = tf.compat.v1.layers.dense(h, 1, name="out")
            loss = tf.reduce_mean(tf.square(pred - y))
            gs = tf.compat.v1.train.get_or_create_global_step()
            kwargs = {} if COMPRESSION[m] is None else dict(compression=COMPRESSION[m])
            opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.005), **kwargs)
            train = opt.minimize(loss, global_step=gs)
            bcast = tfe_hvd.broadcast_global_variables(0)
            with tf.compat.v1.Session(config=config) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                s.run(bcast)
                data = np.random.RandomState(100 + rank)  # every method sees the same batches
                times = []
                for step in range(steps):
                    bx = data.normal(size=[batch, din]).astype(np.float32)
                    by = np.tanh(bx @ teacher) + 0.1 * np.sin(3 * bx[:, :1])
                    t = time.perf_counter()
                    s.run(train, {x: bx, y: by})
                    if step >= warm:
                        times.append(time.perf_counter() - t)
                eval_loss = float(s.run(loss, {x: eval_x, y: eval_y}))
        out["train"][m] = {"steps_per_s": len(times) / sum(times), "eval_loss": eval_loss, "steps": steps}
    if rank == 0:
        with open(os.path.join(args.out, "rank0.json"), "w") as f:
            json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    for name in ("driver", "worker"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--per-node", type=int, default=1)
        s.add_argument("--steps", type=int, default=20)
        s.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64])
        s.add_argument("--horovod-dir")
    p.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    p.add_argument("--per-node", type=int, default=1, help="ranks per simulated node")
    p.add_argument("--steps", type=int, default=20, help="training steps per method (3 of them warm-up)")
    p.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64], help="MiB of float32 per allreduce")
    p.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside the ranks")
    p.add_argument("--busy-seconds", type=float, default=600.0, help="the longest a busy process runs")
    p.add_argument("--horovod-dir", help="a Horovod installed with pip --target, ahead of the venv's")
    p.add_argument("--json")
    args = p.parse_args()
    if args.cmd is None:
        netsim(args)
    else:
        {"driver": driver, "worker": worker}[args.cmd](args)


if __name__ == "__main__":
    main()
