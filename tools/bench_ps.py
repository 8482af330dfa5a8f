"""Parameter-server training over a simulated slow link: examples/s with 1 and 2 workers, and a straggler's epoch.

As root, `netsim` makes two network namespaces joined by a veth pair whose both ends are shaped with
`tc qdisc ... root tbf rate R` (PLATFORM.md, "Simulating a slow network"): the ps task runs in the first, the chief
and the workers in the second, so every lookup, gradient and dense-variable transfer between a worker and the ps
crosses the shaped link. It removes both namespaces at the end (also on errors, SIGTERM and Ctrl-C), and every
process and wait has a deadline.

The job: the CTR example's DeepFM (`tensorflow_ext.examples.ctr.model.model_fn`: 26 dynamic-embedding tables, an
MLP, Adagrad) on the synthetic Criteo-like stream, its variables and tables on one ps task
(`replica_device_setter`), in TF1 asynchronous parameter-server training; a chief that initializes the model and
trains nothing; N workers (MonitoredTrainingSession) reading their batches through `tf_ext.distribute.WorkQueue`
(slices of batch indexes; the batches come from a pool generated up front, so input costs next to nothing).

  * throughput: per link rate and worker count, every worker trains for --seconds after its warm-up; the examples
    of the steps that end inside one common window, over the window's length, summed over the workers.
  * straggler (--straggler_delay S, at the first rate): 2 workers, the second sleeping S seconds after each step;
    the wall time of one epoch of --epoch_batches batches, with the work queue and with a static split (worker i
    reads slices i, i + 2, ...), and the batches each worker trained.

    sudo .venv/bin/python tools/bench_ps.py netsim --rates 1gbit 100mbit --workers 1 2 --json docs/bench_ps.json
    sudo .venv/bin/python tools/bench_ps.py netsim --rates 1gbit --workers 1 --quick       # smoke run
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NS = ("tfe_ps_n0", "tfe_ps_n1")  # the ps task's "machine", the chief's and workers'
DEV = ("tfe_ps_v0", "tfe_ps_v1")
IPS = ("10.234.0.1", "10.234.0.2")
PORT = 2300
# Deadlines: a guard against hangs (a process that died, a link that stopped), never what a figure depends on.
START_S = 300  # from starting the processes to every worker warm
RUN_S = 900  # the measurement or the epoch, after that
BATCH = 512
MODEL = dict(
    model="deepfm",
    dim=16,
    hidden_units=[256, 128],
    optimizer="adagrad",
    learning_rate=0.05,
    num_shards=1,
    string_ids=False,
    init_stddev=0.05,
    log_every=10**9,
    batch_size=BATCH,
    progress=False,
)


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


# ---------------------------------------------------------------------------------------------------------------
# The network.


def teardown():
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)


def setup(rate):
    teardown()
    for ns in NS:
        sh("ip", "netns", "add", ns)
    sh("ip", "link", "add", DEV[0], "type", "veth", "peer", "name", DEV[1])
    for ns, dev, ip in zip(NS, DEV, IPS):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Token bucket on each end's egress: the link's rate in both directions.
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", "256kb", "latency", "20ms")  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# One job: ps + chief + workers, started in their namespaces; waits on marker files in `out`.


def _cluster(num_workers):
    return {
        "ps": ["%s:%d" % (IPS[0], PORT)],
        "chief": ["%s:%d" % (IPS[1], PORT)],
        "worker": ["%s:%d" % (IPS[1], PORT + 1 + i) for i in range(num_workers)],
    }


def _wait(out, names, deadline, procs):
    while not all(os.path.exists(os.path.join(out, n)) for n in names):
        for name, p in procs.items():
            if p.poll() not in (None, 0):
                raise RuntimeError("%s exited with %s:\n%s" % (name, p.poll(), _tail(out, name)))
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for %s:\n%s" % (names, "\n".join(_tail(out, n) for n in procs)))
        time.sleep(0.1)


def _tail(out, name):
    try:
        with open(os.path.join(out, name + ".log")) as f:
            return "---- %s\n%s" % (name, f.read()[-3000:])
    except OSError as e:
        return "---- %s: %s" % (name, e)


def run_job(mode, num_workers, args, extra=None):
    """Runs one job; returns the workers' results (dicts) and the job's load averages."""
    with tempfile.TemporaryDirectory() as out:
        job = dict(
            mode=mode,
            cluster=_cluster(num_workers),
            seconds=args.seconds,
            warmup=args.warmup,
            epoch_batches=args.epoch_batches,
            slice_batches=args.slice_batches,
            **(extra or {}),
        )
        with open(os.path.join(out, "job.json"), "w") as f:
            json.dump(job, f)
        tasks = [("ps", 0), ("chief", 0)] + [("worker", i) for i in range(num_workers)]
        procs = {}
        load_start = os.getloadavg()
        try:
            for task_type, index in tasks:
                name = "%s%d" % (task_type, index)
                env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
                env["CUDA_VISIBLE_DEVICES"] = ""
                env["TF_CONFIG"] = json.dumps({"cluster": job["cluster"], "task": {"type": task_type, "index": index}})
                ns = NS[0] if task_type == "ps" else NS[1]
                cmd = ["ip", "netns", "exec", ns, sys.executable, os.path.abspath(__file__), "task", "--out", out]
                with open(os.path.join(out, name + ".log"), "w") as log:
                    procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            workers = ["worker%d" % i for i in range(num_workers)]
            _wait(out, [w + ".warm" for w in workers], time.time() + START_S, procs)
            # One window (or one epoch start) for every worker, on the machine's one clock.
            t0 = time.time() + 1.0
            with open(os.path.join(out, "go.tmp"), "w") as f:
                json.dump({"t0": t0, "t1": t0 + args.seconds}, f)
            os.rename(os.path.join(out, "go.tmp"), os.path.join(out, "go"))
            link = None
            if mode == "throughput":
                # The bytes the workers' end of the link sent and received in the window.
                time.sleep(max(0.0, t0 - time.time()))
                before = _link_bytes()
                time.sleep(max(0.0, t0 + args.seconds - time.time()))
                after = _link_bytes()
                link = {k: (after[k] - before[k]) / args.seconds / 1e6 for k in after}
            _wait(out, [w + ".json" for w in workers], time.time() + RUN_S, procs)
            results = []
            for w in workers:
                with open(os.path.join(out, w + ".json")) as f:
                    results.append(json.load(f))
            open(os.path.join(out, "stop"), "w").close()
            for name in ["chief0"] + workers:
                procs[name].wait(timeout=120)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                p.wait()
        return results, {"t0": t0, "link_MBps": link, "load_start": load_start, "load_end": os.getloadavg()}


def _link_bytes():
    """{"to_ps": bytes, "from_ps": bytes} the workers' namespace's end of the link has sent and received."""
    stats = json.loads(sh("ip", "-n", NS[1], "-s", "-j", "link", "show", "dev", DEV[1]).stdout)[0]["stats64"]
    return {"to_ps": stats["tx"]["bytes"], "from_ps": stats["rx"]["bytes"]}


# ---------------------------------------------------------------------------------------------------------------
# A task of the job (in its namespace).


def task(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.examples import synthetic  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.examples.ctr import model  # pylint: disable=import-outside-toplevel

    with open(os.path.join(args.out, "job.json")) as f:
        job = json.load(f)
    me = json.loads(os.environ["TF_CONFIG"])["task"]
    name = "%s%d" % (me["type"], me["index"])
    cluster = tf.train.ClusterSpec(job["cluster"])
    server = tf.distribute.Server(
        cluster,
        job_name=me["type"],
        task_index=me["index"],
        config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=2),
    )
    if me["type"] == "ps":
        server.join()  # killed by the driver

    def path(f):
        return os.path.join(args.out, f)

    def wait_for(f, limit=RUN_S + START_S):
        deadline = time.time() + limit
        while not os.path.exists(path(f)):
            if time.time() > deadline:
                raise RuntimeError("timed out waiting for " + f)
            time.sleep(0.05)

    num_workers = len(job["cluster"]["worker"])
    slice_batches = job["slice_batches"]
    if job["mode"] == "throughput":
        num_slices = 5000  # not drained in a window: the workers stop at its end
    else:
        num_slices = job["epoch_batches"] // slice_batches
    slices = ["%d:%d" % (i * slice_batches, slice_batches) for i in range(num_slices)]

    stream = synthetic.CriteoLikeStream(seed=0, max_ids=2**20)
    pool = [stream.batch(i, BATCH) for i in range(32)]  # the input costs next to nothing
    cat = [np.stack([p[0][k] for p in pool]) for k in synthetic.CATEGORICAL_KEYS]
    dense = np.stack([synthetic.log_counts(np.stack([p[0][k] for k in synthetic.DENSE_KEYS], 1)) for p in pool])
    labels = np.stack([p[1] for p in pool]).astype(np.float32)

    def batch_of(index):
        j = index % len(pool)
        return tuple([c[j] for c in cat] + [dense[j], labels[j]])

    def to_tensors(index):
        touts = [tf.int64] * synthetic.NUM_CATEGORICAL + [tf.float32, tf.float32]
        vals = tf.compat.v1.numpy_function(batch_of, [index], touts, stateful=False)
        features = {}
        for key, v in zip(synthetic.CATEGORICAL_KEYS, vals):
            v.set_shape([BATCH])
            features[key] = v
        d = vals[synthetic.NUM_CATEGORICAL]
        d.set_shape([BATCH, synthetic.NUM_DENSE])
        for j, key in enumerate(synthetic.DENSE_KEYS):
            features[key] = d[:, j]
        y = vals[-1]
        y.set_shape([BATCH])
        return features, y

    def read(s):
        bounds = tf.strings.to_number(tf.strings.split(s, ":"), tf.int64)
        return tf.data.Dataset.range(bounds[0], bounds[0] + bounds[1])

    worker_device = "/job:%s/task:%d" % (me["type"], me["index"])
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(worker_device=worker_device, cluster=cluster)):
        if job.get("static") and me["type"] == "worker":
            names = tf.compat.v1.data.Dataset.from_tensor_slices(slices[me["index"] :: num_workers])
        else:
            names = tf_ext.distribute.WorkQueue(slices, shuffle=False, lease_secs=120).dataset()
        data = names.flat_map(read).map(to_tensors).prefetch(2)
        it = tf.compat.v1.data.make_initializable_iterator(data)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, it.initializer)
        features, y = it.get_next()
        spec = model.model_fn(features, y, tf.estimator.ModeKeys.TRAIN, dict(MODEL))
    config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps", worker_device], inter_op_parallelism_threads=2, intra_op_parallelism_threads=2
    )
    if me["type"] == "worker":
        wait_for("chief_ready")
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=me["type"] == "chief",
        config=config,
        log_step_count_steps=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
    ) as sess:
        if me["type"] == "chief":
            open(path("chief_ready"), "w").close()
            wait_for("stop")
            return
        delay = job.get("straggler_delay", 0.0) if me["index"] == num_workers - 1 else 0.0
        step = spec.train_op
        if job["mode"] == "throughput":
            for _ in range(job["warmup"]):
                sess.run(step)
            open(path(name + ".warm"), "w").close()
            wait_for("go")
            with open(path("go")) as f:
                window = json.load(f)
            steps = 0
            while time.time() < window["t1"]:
                sess.run(step)
                if window["t0"] <= time.time() <= window["t1"]:
                    steps += 1
            result = {"steps": steps, "examples": steps * BATCH, "seconds": window["t1"] - window["t0"]}
        else:
            open(path(name + ".warm"), "w").close()
            wait_for("go")
            with open(path("go")) as f:
                t0 = json.load(f)["t0"]
            while time.time() < t0:
                time.sleep(0.01)
            steps = 0
            try:
                while True:
                    sess.run(step)
                    steps += 1
                    if delay:
                        time.sleep(delay)
            except tf.errors.OutOfRangeError:
                pass
            result = {"batches": steps, "seconds": time.time() - t0}
        with open(path(name + ".json.tmp"), "w") as f:
            json.dump(result, f)
        os.rename(path(name + ".json.tmp"), path(name + ".json"))


# ---------------------------------------------------------------------------------------------------------------


def netsim(args):
    if os.geteuid() != 0:
        sys.exit("netsim needs root (network namespaces and tc)")
    results = {"cores": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M"), "load_start": os.getloadavg()}
    results.update(batch=BATCH, model={k: v for k, v in MODEL.items() if k not in ("progress", "log_every")})
    results.update(throughput=[], straggler=[])

    def on_signal(signum, frame):
        teardown()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    t_start = time.time()
    try:
        for rate in args.rates:
            setup(rate)
            for n in args.workers:
                workers, job = run_job("throughput", n, args)
                row = dict(rate=rate, workers=n, examples_per_s=sum(w["examples"] / w["seconds"] for w in workers))
                row.update(per_worker_steps=[w["steps"] for w in workers], seconds=args.seconds, **job)
                results["throughput"].append(row)
                print(
                    "%-8s %d worker(s): %7.0f examples/s  (steps per worker %s in %g s; link MB/s to ps %.1f, "
                    "from ps %.1f; load %.1f -> %.1f)"
                    % (
                        rate,
                        n,
                        row["examples_per_s"],
                        row["per_worker_steps"],
                        args.seconds,
                        job["link_MBps"]["to_ps"],
                        job["link_MBps"]["from_ps"],
                        job["load_start"][0],
                        job["load_end"][0],
                    ),  # fmt: skip
                    flush=True,
                )
            if args.straggler_delay and rate == args.rates[0]:
                for static in (False, True):
                    extra = {"straggler_delay": args.straggler_delay, "static": static}
                    workers, job = run_job("epoch", 2, args, extra)
                    row = dict(rate=rate, input="static split" if static else "work queue", **extra)
                    row.update(epoch_s=max(w["seconds"] for w in workers), batches=[w["batches"] for w in workers])
                    row.update(job)
                    results["straggler"].append(row)
                    print(
                        "%-8s straggler (+%g s/step), %-12s: epoch of %d batches in %6.1f s, batches per worker %s "
                        "(load %.1f -> %.1f)"
                        % (
                            rate,
                            args.straggler_delay,
                            row["input"],
                            args.epoch_batches,
                            row["epoch_s"],
                            row["batches"],
                            job["load_start"][0],
                            job["load_end"][0],
                        ),  # fmt: skip
                        flush=True,
                    )
    finally:
        teardown()
    results["load_end"] = os.getloadavg()
    results["wall_s"] = round(time.time() - t_start, 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print("wrote %s" % args.json)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("netsim", help="the benchmark (root): namespaces, jobs, report")
    n.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"], help="tbf rates of the link")
    n.add_argument("--workers", nargs="+", type=int, default=[1, 2], help="worker counts to measure")
    n.add_argument("--seconds", type=float, default=30.0, help="the measurement window of a throughput job")
    n.add_argument("--warmup", type=int, default=10, help="steps per worker before the window")
    n.add_argument("--slice_batches", type=int, default=10, help="batches per work-queue slice")
    n.add_argument("--epoch_batches", type=int, default=200, help="batches of the straggler's epoch")
    n.add_argument("--straggler_delay", type=float, default=0.0, help="seconds the slow worker sleeps per step")
    n.add_argument("--quick", action="store_true", help="smoke run: a short window")
    n.add_argument("--json", default=None, help="write the results here")
    t = sub.add_parser("task", help="(internal) one task of a job, in its namespace")
    t.add_argument("--out", required=True)
    args = p.parse_args()
    if args.cmd == "task":
        task(args)
        return
    if args.quick:
        args.seconds, args.warmup, args.epoch_batches = 6.0, 3, 40
    netsim(args)


if __name__ == "__main__":
    main()
