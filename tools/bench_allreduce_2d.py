"""The 2D allreduce with its node stages over Gloo and over shared memory, against plain Horovod, on a simulated
2-node network (tools/netsim.py: two namespaces joined by a shaped veth link, 2 ranks in each).

Per link rate, in one job, on the same tensors / the same data:
  * allreduce of one float32 tensor of 1-64 MiB: median time and bus bandwidth (2(N-1)/N * bytes / time, as
    nccl-tests) for plain Horovod (hvd.allreduce), 2D with intra_node="gloo" and 2D with intra_node="shm";
    and the stages alone: the node's reduce-scatter + allgather over Gloo ("node_gloo") and over shared memory
    ("node_shm"), and the cross-node allreduce of a 1/2 slice ("cross");
  * training: tools/bench_allreduce.py's MLP (6.3 M float32 parameters, 25 MB of gradients per step), batch 16 per
    rank, SGD; steps/s for plain, 2D gloo and 2D shm.

    sudo flock /tmp/tfext_bench.lock .venv/bin/python tools/bench_allreduce_2d.py netsim --rate 100mbit --json out.json
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

PER_NODE = 2
MICRO = ("plain", "2d_gloo", "2d_shm", "node_gloo", "node_shm", "cross")
TRAIN = ("plain", "2d_gloo", "2d_shm")


def _job_args(args):
    return ["--out", args.out, "--steps", str(args.steps), "--sizes"] + [str(x) for x in args.sizes]


def netsim(args):
    if os.geteuid() != 0:
        sys.exit("netsim needs root (network namespaces and tc)")

    def on_signal(signum, frame):
        netsim_lib.teardown()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    load_start = os.getloadavg()
    t0 = time.time()
    try:
        netsim_lib.setup(args.rate)
        with tempfile.TemporaryDirectory() as out:
            args.out = out
            cmd = ["ip", "netns", "exec", netsim_lib.NS[0], sys.executable, os.path.abspath(__file__), "driver"]
            r = subprocess.run(cmd + _job_args(args), text=True, capture_output=True, timeout=1800)
            if r.returncode != 0:
                sys.stderr.write(r.stdout[-6000:] + r.stderr[-6000:])
                raise SystemExit("the job at %s failed" % args.rate)
            with open(os.path.join(out, "rank0.json")) as f:
                run = json.load(f)
    finally:
        netsim_lib.teardown()
    run.update(rate=args.rate, wall_s=round(time.time() - t0, 1), load_start=load_start, load_end=os.getloadavg())
    _print(run)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(run, f, indent=1)


def driver(args):
    """Inside the first namespace: the rendezvous server and the 4 ranks."""
    codes = netsim_lib.run_ranks(
        PER_NODE, [sys.executable, os.path.abspath(__file__), "worker"] + _job_args(args), args.out
    )
    if any(codes):
        sys.stderr.write(netsim_lib.rank_logs(args.out, 2 * PER_NODE))
        sys.exit("ranks exited with %s" % codes)


def _print(run):
    print("== link %s (job %.0f s, load %s -> %s)" % (run["rate"], run["wall_s"], _load(run["load_start"]),
                                                       _load(run["load_end"])))  # fmt: skip
    print("%-10s" % "MiB" + "".join("%24s" % m for m in MICRO))
    for row in run["micro"]:
        cells = "".join("%10.1f ms %7.2f MB/s" % (row[m]["ms"], row[m]["busbw_MBps"]) for m in MICRO)
        print("%-10g%s" % (row["bytes"] / 2.0**20, cells))
    for m, t in run["train"].items():
        print("train %-8s %6.3f steps/s" % (m, t["steps_per_s"]))
    sys.stdout.flush()


def _load(avg):
    return "/".join("%.1f" % x for x in avg)


def worker(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import allreduce as ar  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import consistency  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import shm_allreduce  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.utils.loader import load_ops  # pylint: disable=import-outside-toplevel

    tfe_hvd.init(node_size=PER_NODE)
    rank, size = hvd.rank(), hvd.size()
    node_ps, cross_ps = ar.hierarchical_process_sets(PER_NODE)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    out = {"ranks": size, "micro": [], "train": {}, "host_load": []}

    for mib in args.sizes:
        nbytes = int(mib * (1 << 20))
        n = nbytes // 4
        reps = 5 if nbytes <= (4 << 20) else (3 if nbytes <= (16 << 20) else 2)
        row = {"bytes": nbytes}
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable(
                "x", initializer=tf.random.stateless_normal([n], seed=[rank, 1]), use_resource=True
            )
            grad = consistency.gate(v.read_value())
            ops = {"plain": hvd.allreduce(grad, op=hvd.Average, name="plain")}
            for m, intra in (("2d_gloo", "gloo"), ("2d_shm", "shm")):
                cfg = ar.resolve_config(node_size=PER_NODE, intra_node=intra)
                ops[m] = ar.DenseReducer(cfg, hvd.Average, 1.0, hvd.global_process_set, m).reduce([(grad, v)])[0]
            part = hvd.reducescatter(grad, op=hvd.Sum, process_set=node_ps, name="node_gloo_rs")
            ops["node_gloo"] = hvd.allgather(part, process_set=node_ps, name="node_gloo_ag")
            attrs = dict(
                segment=shm_allreduce.segment_name("node_shm", n, tf.float32, PER_NODE),
                local_rank=rank % PER_NODE,
                local_size=PER_NODE,
                first_rank=rank - rank % PER_NODE,
            )
            part = load_ops().tf_ext_hvd_shm_reduce_scatter(grad, **attrs)
            ops["node_shm"] = load_ops().tf_ext_hvd_shm_allgather(part, **attrs)
            ops["cross"] = hvd.allreduce(grad[: n // PER_NODE], op=hvd.Sum, process_set=cross_ps, name="cross")
            with tf.compat.v1.Session(config=config) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                ref = s.run(ops["plain"])
                for m in MICRO:
                    got = s.run(ops[m])  # warm-up (and the 2D results against plain)
                    if m.startswith("2d"):
                        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=m)
                    times = []
                    for _ in range(reps):
                        t = time.perf_counter()
                        s.run(ops[m].op)
                        times.append(time.perf_counter() - t)
                    sec = float(np.median(times))
                    row[m] = {"ms": sec * 1e3, "busbw_MBps": 2.0 * (size - 1) / size * nbytes / sec / 1e6}
        out["micro"].append(row)
        out["host_load"].append(os.getloadavg())

    steps, warm = args.steps, 2
    batch, din = 16, 1024
    rng = np.random.RandomState(7)
    teacher = rng.normal(size=[din, 1]).astype(np.float32) / np.sqrt(din)
    for m in TRAIN:
        kwargs = {} if m == "plain" else dict(node_size=PER_NODE, intra_node=m[3:])
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
            opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.005), **kwargs)
            train = opt.minimize(loss, global_step=gs)
            bcast = tfe_hvd.broadcast_global_variables(0)
            with tf.compat.v1.Session(config=config) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                s.run(bcast)
                data = np.random.RandomState(100 + rank)
                batches = []
                for _ in range(steps):
                    bx = data.normal(size=[batch, din]).astype(np.float32)
                    batches.append((bx, np.tanh(bx @ teacher)))
                times = []
                for step, (bx, by) in enumerate(batches):
                    t = time.perf_counter()
                    s.run(train, {x: bx, y: by})
                    if step >= warm:
                        times.append(time.perf_counter() - t)
        out["train"][m] = {"steps_per_s": len(times) / sum(times), "steps": len(times)}
    if rank == 0:
        with open(os.path.join(args.out, "rank0.json"), "w") as f:
            json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("netsim", help="(root) set up the namespaces, run the job at one rate, tear down")
    n.add_argument("--rate", default="100mbit")
    n.add_argument("--json")
    for q in [n] + [sub.add_parser(name) for name in ("driver", "worker")]:
        q.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 64], help="MiB")
        q.add_argument("--steps", type=int, default=8, help="training steps per method (2 of them warm-up)")
        if q is not n:
            q.add_argument("--out", required=True)
    args = p.parse_args()
    {"netsim": netsim, "driver": driver, "worker": worker}[args.cmd](args)


if __name__ == "__main__":
    main()
