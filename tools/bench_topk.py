"""Top-K's training quality: eval loss at equal steps and at equal wall time, per method, on bench_allreduce's MLP.

The model and data are tools/bench_allreduce.py's training workload (MLP 1024-2048-2048-1, 6.3 M float32
parameters, batch 16 per rank, a fixed teacher, the same batches for every method), trained by each method in turn
for at least --steps steps and at least --seconds of training time; every --eval-every steps the loss on a fixed
evaluation set of 512 examples is recorded with the training time so far (the evaluation itself is not counted).
Each method's series goes into the JSON; `tools/plot_benchmarks.py` is not needed to read it.

    # 2 ranks on this machine (no link shaping): the quality at equal steps
    .venv/bin/python tools/bench_topk.py local --steps 200 --json /tmp/topk_local.json
    # one rank per simulated node (root): equal steps and equal wall time
    sudo .venv/bin/python tools/bench_topk.py netsim --rates 100mbit --seconds 60 --json /tmp/topk_100m.json

Methods: plain (Horovod's allreduce), topk1 (Top-K 1%, error feedback only), topk1_dgc (Top-K 1% with the
momentum correction, local clipping and warm-up settings of `tensorflow_ext.horovod.topk`), and any
`--method NAME='{"topk_ratio": 0.01, ...}'` (DistributedOptimizer's arguments as JSON). With --momentum M the
optimizer is momentum SGD (M) for every method except those that set topk_momentum, which run plain SGD (the
momentum is then applied by the momentum correction before the exchange).
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

METHODS = {
    "plain": dict(),
    "topk1": dict(topk_ratio=0.01),
    "topk1_dgc": dict(topk_ratio=0.01, topk_momentum=0.9, topk_clip_norm=1.0, topk_ratio_warmup_steps=20),
}


def parse_methods(args):
    out = {m: METHODS[m] for m in args.methods}
    for spec in args.method or []:
        name, _, text = spec.partition("=")
        out[name] = json.loads(text)
    return out


def _machine():
    return {"cores": os.cpu_count(), "load_start": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M")}


def _worker_argv(args, out):
    argv = [sys.executable, os.path.abspath(__file__), "worker", "--out", out, "--settings", json.dumps(vars(args))]
    return argv


def _finish(results, args):
    results["load_end"] = os.getloadavg()
    for run in results["runs"]:
        print("== %s" % run["where"])
        for m, t in run["train"].items():
            print(
                "%-12s %7.2f steps/s  eval loss at step %d: %.5f  final (step %d, %.1f s): %.5f"
                % (m, t["steps_per_s"], args.steps, t["loss_at_steps"], t["steps"], t["seconds"], t["eval_loss"])
            )
    print("load average start %s end %s" % (results["machine"]["load_start"], results["load_end"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def local(args):
    results = {"machine": _machine(), "settings": vars(args), "runs": []}
    with tempfile.TemporaryDirectory() as out:
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        cmd = [horovodrun, "-np", str(args.np), "--gloo", "-H", "localhost:%d" % args.np] + _worker_argv(args, out)
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
        r = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=3600)
        if r.returncode != 0:
            sys.stderr.write(r.stdout[-6000:] + r.stderr[-6000:])
            raise SystemExit("the job failed")
        with open(os.path.join(out, "rank0.json")) as f:
            run = json.load(f)
    run["where"] = "%d ranks on one machine" % args.np
    results["runs"].append(run)
    _finish(results, args)


def netsim(args):
    if os.geteuid() != 0:
        sys.exit("netsim needs root (network namespaces and tc)")
    results = {"machine": _machine(), "settings": vars(args), "runs": []}

    def on_signal(signum, frame):
        netsim_lib.teardown()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for rate in args.rates:
            netsim_lib.setup(rate)
            with tempfile.TemporaryDirectory() as out:
                cmd = ["ip", "netns", "exec", netsim_lib.NS[0], sys.executable, os.path.abspath(__file__)]
                cmd += ["driver", "--out", out, "--settings", json.dumps(vars(args))]
                r = subprocess.run(cmd, text=True, capture_output=True, timeout=3600)
                if r.returncode != 0:
                    sys.stderr.write(r.stdout[-6000:] + r.stderr[-6000:])
                    raise SystemExit("the job at %s failed" % rate)
                with open(os.path.join(out, "rank0.json")) as f:
                    run = json.load(f)
            run.update(rate=rate, where="2 nodes x %d rank at %s" % (args.per_node, rate))
            results["runs"].append(run)
    finally:
        netsim_lib.teardown()
    _finish(results, args)


def driver(args):
    settings = json.loads(args.settings)
    argv = [sys.executable, os.path.abspath(__file__), "worker", "--out", args.out, "--settings", args.settings]
    codes = netsim_lib.run_ranks(settings["per_node"], argv, args.out)
    if any(codes):
        sys.stderr.write(netsim_lib.rank_logs(args.out, len(codes)))
        sys.exit("ranks exited with %s" % codes)


def worker(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel

    s = argparse.Namespace(**json.loads(args.settings))
    if s.steps % s.eval_every:
        raise SystemExit("--steps %d must be a multiple of --eval-every %d" % (s.steps, s.eval_every))
    tfe_hvd.init()
    rank = hvd.rank()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    out = {"ranks": hvd.size(), "train": {}}
    batch, din = 16, 1024
    rng = np.random.RandomState(7)
    teacher = rng.normal(size=[din, 1]).astype(np.float32) / np.sqrt(din)
    eval_x = rng.normal(size=[512, din]).astype(np.float32)
    eval_y = np.tanh(eval_x @ teacher) + 0.1 * np.sin(3 * eval_x[:, :1])
    for m, kwargs in parse_methods(s).items():
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
            if s.momentum > 0 and "topk_momentum" not in kwargs:
                inner = tf.compat.v1.train.MomentumOptimizer(s.lr, s.momentum)
            else:
                inner = tf.compat.v1.train.GradientDescentOptimizer(s.lr)
            opt = tfe_hvd.DistributedOptimizer(inner, **kwargs)
            train = opt.minimize(loss, global_step=gs)
            bcast = tfe_hvd.broadcast_global_variables(0)
            go_ph = tf.compat.v1.placeholder(tf.int32, [])
            go_bc = hvd.broadcast(go_ph, 0, name="go")
            # Every method sees the same batches.
            data = np.random.RandomState(100 + rank)
            with tf.compat.v1.Session(config=config) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(bcast)
                series = [[0, 0.0, float(sess.run(loss, {x: eval_x, y: eval_y}))]]
                elapsed, step, loss_at_steps = 0.0, 0, None
                while step < s.max_steps:
                    bx = data.normal(size=[batch, din]).astype(np.float32)
                    by = np.tanh(bx @ teacher) + 0.1 * np.sin(3 * bx[:, :1])
                    t = time.perf_counter()
                    sess.run(train, {x: bx, y: by})
                    elapsed += time.perf_counter() - t
                    step += 1
                    if step % s.eval_every == 0:
                        ev = float(sess.run(loss, {x: eval_x, y: eval_y}))
                        series.append([step, round(elapsed, 3), ev])
                        if step == s.steps:
                            loss_at_steps = ev
                        # All ranks stop together: rank 0's clock decides.
                        if not sess.run(go_bc, {go_ph: int(step < s.steps or elapsed < s.seconds)}):
                            break
                final = float(sess.run(loss, {x: eval_x, y: eval_y}))
        out["train"][m] = {
            "settings": kwargs,
            "steps": step,
            "seconds": elapsed,
            "steps_per_s": step / elapsed,
            "loss_at_steps": loss_at_steps,
            "eval_loss": final,
            "series": series,
        }
    if rank == 0:
        with open(os.path.join(args.out, "rank0.json"), "w") as f:
            json.dump(out, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("local", "netsim"):
        q = sub.add_parser(name)
        q.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
        q.add_argument("--method", action="append", help="NAME=JSON of DistributedOptimizer arguments")
        q.add_argument("--steps", type=int, default=100, help="at least this many steps (the equal-steps point)")
        q.add_argument("--seconds", type=float, default=0.0, help="and at least this much training time")
        q.add_argument("--max-steps", type=int, default=100000)
        q.add_argument("--eval-every", type=int, default=10)
        q.add_argument("--lr", type=float, default=0.005)
        q.add_argument("--momentum", type=float, default=0.0)
        q.add_argument("--json")
        if name == "local":
            q.add_argument("--np", type=int, default=2)
        else:
            q.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
            q.add_argument("--per-node", type=int, default=1)
    for name in ("driver", "worker"):
        q = sub.add_parser(name)
        q.add_argument("--out", required=True)
        q.add_argument("--settings", required=True)
    args = p.parse_args()
    {"local": local, "netsim": netsim, "driver": driver, "worker": worker}[args.cmd](args)


if __name__ == "__main__":
    main()
