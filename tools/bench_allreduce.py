"""Faster dense allreduce (tensorflow_ext.horovod.allreduce) over a simulated 2-node network, side by side.

As root, `netsim` makes two network namespaces ("nodes") joined by a veth pair whose both ends are shaped with
`tc qdisc ... root tbf rate R` (no netem needed), runs `--per_node` ranks in each (default 2: 2 nodes x 2), and
removes everything at the end (also on errors and Ctrl-C). Ranks of one node talk over the namespace's local
route (unshaped); ranks of different nodes cross the shaped link. The ranks are started without ssh: this tool
runs Horovod's Gloo rendezvous server itself (inside the first namespace) and gives each rank the environment that
horovodrun would (HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*, HOROVOD_HOSTNAME, HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT,
HOROVOD_GLOO_IFACE, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo), started with `ip netns exec`.

Per link rate, in one job, every method on the same tensors / the same data:
  * allreduce of one float32 tensor of 1 KiB .. 64 MiB: median time and bus bandwidth (2(N-1)/N * bytes / time,
    the convention of nccl-tests) for plain Horovod (hvd.allreduce), 2D (node_size=per_node, through shared memory
    and through Gloo inside a node; with 2+ ranks per node), Top-K 1% (every size), FP16, BF16;
  * training: an MLP 1024-2048-2048-1 (6.3 M float32 parameters, 25 MB of dense gradients per step), batch 16 per
    rank, SGD; steps/s, and the loss on a fixed evaluation set after the run for each method.

    sudo .venv/bin/python tools/bench_allreduce.py netsim --rates 1gbit 10gbit --json /tmp/bench_allreduce.json
    sudo .venv/bin/python tools/bench_allreduce.py netsim --rates 1gbit --quick      # smoke run
    sudo .venv/bin/python tools/bench_allreduce.py netsim --per_node 1 --rates 100mbit 1gbit 10gbit   # 2 x 1 rank
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


def methods(per_node):
    """(micro-benchmark methods, training methods): name -> DenseReducer settings (None: Horovod's hvd.allreduce).

    The 2D allreduce (through shared memory inside a node, and through Gloo as before) only with several ranks per
    node."""
    two_d = {}
    if per_node > 1:
        two_d = {"2d": dict(node_size=per_node), "2d_gloo": dict(node_size=per_node, intra_node="gloo")}
    micro = dict(plain=None, **two_d)
    micro.update(topk1=dict(topk_ratio=0.01, topk_min_elements=1), fp16=dict(compression="fp16"))
    micro.update(bf16=dict(compression="bf16"))
    train = dict(plain=dict(), **two_d)
    train.update(topk1=dict(topk_ratio=0.01), fp16=dict(compression="fp16"), bf16=dict(compression="bf16"))
    train.update(topk1_fp16=dict(topk_ratio=0.01, compression="fp16"))
    return micro, train


def netsim(args):
    if os.geteuid() != 0:
        sys.exit("netsim needs root (network namespaces and tc)")
    results = {"machine": _machine(), "runs": []}

    def on_signal(signum, frame):
        netsim_lib.teardown()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for rate in args.rates:
            netsim_lib.setup(rate)
            with tempfile.TemporaryDirectory() as out:
                cmd = ["ip", "netns", "exec", netsim_lib.NS[0], sys.executable, os.path.abspath(__file__)]
                cmd += ["driver", "--out", out, "--per_node", str(args.per_node)]
                cmd += ["--quick"] if args.quick else []
                t0 = time.time()
                r = subprocess.run(cmd, text=True, capture_output=True, timeout=1800)
                if r.returncode != 0:
                    sys.stderr.write(r.stdout[-6000:] + r.stderr[-6000:])
                    raise SystemExit("the job at %s failed" % rate)
                with open(os.path.join(out, "rank0.json")) as f:
                    run = json.load(f)
                run.update(
                    rate=rate, wall_s=round(time.time() - t0, 1), per_node=args.per_node, load_end=os.getloadavg()
                )
                results["runs"].append(run)
                _print(run)
    finally:
        netsim_lib.teardown()
    results["load_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _machine():
    return {"cores": os.cpu_count(), "load_start": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M")}


def _print(run):
    print("== link %s (job %.0f s)" % (run["rate"], run["wall_s"]))
    micro, _ = methods(run["per_node"])
    print("%-10s" % "bytes" + "".join("%24s" % m for m in micro))
    for row in run["micro"]:
        cells = "".join("%12.2f ms %6.1f MB/s" % (row[m]["ms"], row[m]["busbw_MBps"]) for m in micro)  # noqa: E501
        print("%-10d%s" % (row["bytes"], cells))
    for m, t in run["train"].items():
        print("train %-11s %6.2f steps/s  eval loss %.5f" % (m, t["steps_per_s"], t["eval_loss"]))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------------------------
# The job: rendezvous server + 4 ranks (run inside the first namespace).


def driver(args):
    argv = [sys.executable, os.path.abspath(__file__), "worker", "--out", args.out, "--per_node", str(args.per_node)]
    argv += ["--quick"] if args.quick else []
    codes = netsim_lib.run_ranks(args.per_node, argv, args.out)
    if any(codes):
        sys.stderr.write(netsim_lib.rank_logs(args.out, len(codes)))
        sys.exit("ranks exited with %s" % codes)


# ---------------------------------------------------------------------------------------------------------------
# One rank.


def worker(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import allreduce as ar  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.horovod import consistency  # pylint: disable=import-outside-toplevel

    tfe_hvd.init(node_size=args.per_node)
    micro_methods, train_methods = methods(args.per_node)
    rank, size = hvd.rank(), hvd.size()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    out = {"ranks": size, "micro": [], "train": {}}

    sizes = [1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]
    if args.quick:
        sizes = [1 << 10, 1 << 20, 1 << 22]
    for nbytes in sizes:
        n = nbytes // 4
        reps = 20 if nbytes <= (1 << 20) else (5 if nbytes <= (1 << 22) else (3 if nbytes <= (1 << 24) else 2))
        row = {"bytes": nbytes}
        with tf.Graph().as_default():
            v = tf.compat.v1.get_variable(
                "x", initializer=tf.random.stateless_normal([n], seed=[rank, 1]), use_resource=True
            )
            ops = {}
            for m, kwargs in micro_methods.items():
                grad = consistency.gate(v.read_value())
                if kwargs is None:
                    ops[m] = hvd.allreduce(grad, op=hvd.Average, name="plain")
                else:
                    cfg = ar.resolve_config(**kwargs)
                    ops[m] = ar.DenseReducer(cfg, hvd.Average, 1.0, hvd.global_process_set, m).reduce([(grad, v)])[0]
            with tf.compat.v1.Session(config=config) as s:
                s.run(tf.compat.v1.global_variables_initializer())
                for m, op in ops.items():
                    s.run(op)  # warm-up
                    times = []
                    for _ in range(reps):
                        t = time.perf_counter()
                        s.run(op.op)
                        times.append(time.perf_counter() - t)
                    sec = float(np.median(times))
                    row[m] = {"ms": sec * 1e3, "busbw_MBps": 2.0 * (size - 1) / size * nbytes / sec / 1e6}
        out["micro"].append(row)

    steps, warm = (8, 2) if args.quick else (40, 5)
    batch, din = 16, 1024
    rng = np.random.RandomState(7)
    teacher = rng.normal(size=[din, 1]).astype(np.float32) / np.sqrt(din)
    eval_x = rng.normal(size=[512, din]).astype(np.float32)
    eval_y = np.tanh(eval_x @ teacher) + 0.1 * np.sin(3 * eval_x[:, :1])
    for m, kwargs in train_methods.items():
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
            nparams = sum(int(np.prod(t.shape)) for t in tf.compat.v1.trainable_variables())
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
        out["train"][m] = {
            "steps_per_s": len(times) / sum(times),
            "eval_loss": eval_loss,
            "steps": steps,
            "dense_grad_MB": nparams * 4 / 1e6,
        }
    if rank == 0:
        with open(os.path.join(args.out, "rank0.json"), "w") as f:
            json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("netsim", help="(root) set up the namespaces, run the job per rate, tear down")
    n.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"])
    n.add_argument("--json")
    n.add_argument("--quick", action="store_true")
    n.add_argument("--per_node", type=int, default=2, help="ranks per simulated node (default 2; 2D methods need 2+)")
    for name in ("driver", "worker"):
        s = sub.add_parser(name)
        s.add_argument("--out", required=True)
        s.add_argument("--quick", action="store_true")
        s.add_argument("--per_node", type=int, default=2)
    args = p.parse_args()
    {"netsim": netsim, "driver": driver, "worker": worker}[args.cmd](args)


if __name__ == "__main__":
    main()
