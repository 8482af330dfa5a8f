"""What a training job does when the link between its nodes drops for a few seconds (root, simulated network).

Two simulated nodes (tools/netsim.py: namespaces joined by a tbf-shaped veth), one rank on each, train a small MLP
through `tensorflow_ext.horovod.DistributedOptimizer` (plain, or Top-K 1%). `--drop_at` seconds after the first
step, the link drops for `--drop_for` seconds, then comes back:

  * `--drop_mode tbf` (default): `tc qdisc change ... tbf rate 1kbit` on both ends (packets queue and are dropped;
    the devices stay up), then the original rate again;
  * `--drop_mode down`: `ip link set <veth> down` on both ends, then up.

The job either continues (reported: the longest gap between two steps, and the steps after the link came back)
or fails (reported: each rank's error, how long after the drop began, and the exit codes). The whole job is
bounded: --bound_s after the drop began, whatever is still running is killed and reported as hung.

    sudo flock /tmp/tfext_bench.lock .venv/bin/python tools/bench_link_drop.py --drop_at 8 --drop_for 3
    sudo flock /tmp/tfext_bench.lock .venv/bin/python tools/bench_link_drop.py --method topk1 --drop_for 30
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import netsim as netsim_lib  # tools/netsim.py: the namespaces, the link, the ranks

PER_NODE = 1
METHODS = {"plain": dict(), "topk1": dict(topk_ratio=0.01)}
STEP_RE = re.compile(r"^STEP (\d+) ([0-9.]+)$")
FAIL_RE = re.compile(r"^FAILED ([0-9.]+) step=(\d+) (\w+): (.*)$")
DONE_RE = re.compile(r"^DONE ([0-9.]+) steps=(\d+)$")


def positive(value):
    """argparse type: a number of seconds > 0."""
    try:
        out = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number of seconds > 0, got %r" % value) from None
    if not out > 0:
        raise argparse.ArgumentTypeError("must be a number of seconds > 0, got %r" % value)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="run", choices=["run", "driver", "worker"])
    p.add_argument("--rate", default="1gbit", help="the link's tc rate while it is up")
    p.add_argument("--method", default="plain", choices=sorted(METHODS))
    p.add_argument("--drop_at", type=positive, default=8.0, help="seconds after the first step")
    p.add_argument("--drop_for", type=positive, default=3.0, help="seconds the link stays down")
    p.add_argument("--drop_mode", default="tbf", choices=["tbf", "down"])
    p.add_argument("--after_s", type=positive, default=10.0, help="training goes on this long after the link is back")
    p.add_argument("--bound_s", type=positive, default=150.0, help="kill what still runs this long after the drop")
    p.add_argument("--json", default=None, help="append the result to this JSON file")
    p.add_argument("--out", default=None, help="(driver, worker) the directory of the rank logs")
    args = p.parse_args(argv)
    if args.bound_s <= args.drop_for:
        p.error("--bound_s (%g) must exceed --drop_for (%g)" % (args.bound_s, args.drop_for))
    return args


def drop_commands(rate, mode, down):
    """The commands that drop the link (`down` True) or restore it at `rate`, one per end of the veth."""
    cmds = []
    for ns, dev in zip(netsim_lib.NS, netsim_lib.DEV):
        if mode == "down":
            cmds.append(["ip", "-n", ns, "link", "set", dev, "down" if down else "up"])
        else:
            burst = "1mb" if rate.startswith("10g") else "256kb"
            shape = ["rate", "1kbit", "burst", "2kb"] if down else ["rate", rate, "burst", burst]
            cmds.append(["tc", "-n", ns, "qdisc", "change", "dev", dev, "root", "tbf"] + shape + ["latency", "20ms"])
    return cmds


def parse_rank_log(text):
    """One rank's log -> {"steps": [(step, wall time)], "failed": (time, step, kind, message) or None,
    "done": (time, steps) or None}."""
    steps, failed, done = [], None, None
    for line in text.splitlines():
        m = STEP_RE.match(line.strip())
        if m:
            steps.append((int(m.group(1)), float(m.group(2))))
            continue
        m = FAIL_RE.match(line.strip())
        if m and failed is None:
            failed = (float(m.group(1)), int(m.group(2)), m.group(3), m.group(4))
            continue
        m = DONE_RE.match(line.strip())
        if m:
            done = (float(m.group(1)), int(m.group(2)))
    return {"steps": steps, "failed": failed, "done": done}


def summarize(rank, drop_start, drop_end):
    """What one rank saw around the drop (times are wall-clock seconds).

    Returns a dict: outcome ("continued", "failed" or "hung"), stall_s (the longest gap between two consecutive steps
    that ends after the drop began; for a rank that failed, from its last step to the failure), steps_after (steps
    that ended after the link came back), failed_after_s (from the drop's start to the error) and error.
    """
    times = [t for _, t in rank["steps"]]
    out = {"steps": len(times), "steps_after": sum(1 for t in times if t > drop_end)}
    gaps = [b - a for a, b in zip(times, times[1:]) if b > drop_start]
    if rank["failed"] is not None:
        when, _, kind, message = rank["failed"]
        last = max([t for t in times if t <= when] or [drop_start])
        gaps.append(when - last)
        out.update(outcome="failed", failed_after_s=round(when - drop_start, 1), error="%s: %s" % (kind, message))
    elif rank["done"] is not None:
        out["outcome"] = "continued"
    else:
        out["outcome"] = "hung"
    out["stall_s"] = round(max(gaps), 2) if gaps else None
    return out


def run(args):
    if os.geteuid() != 0:
        sys.exit("bench_link_drop needs root (network namespaces and tc)")

    def on_signal(signum, frame):
        netsim_lib.teardown()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    result = dict(
        method=args.method,
        rate=args.rate,
        drop_mode=args.drop_mode,
        drop_at=args.drop_at,
        drop_for=args.drop_for,
        gloo_timeout_s=os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "30 (Horovod's default)"),
        load_start=os.getloadavg(),
    )
    netsim_lib.setup(args.rate)
    try:
        with tempfile.TemporaryDirectory() as out:
            cmd = ["ip", "netns", "exec", netsim_lib.NS[0], sys.executable, os.path.abspath(__file__), "driver"]
            cmd += ["--out", out, "--method", args.method, "--drop_at", str(args.drop_at)]
            cmd += ["--drop_for", str(args.drop_for), "--after_s", str(args.after_s)]
            driver = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            # The first step's line in rank 0's log starts the clock (start-up on a busy machine varies a lot).
            first = _wait_for_first_step(os.path.join(out, "rank0.log"), driver, timeout=600)
            drop_start = first + args.drop_at
            time.sleep(max(0.0, drop_start - time.time()))
            drop_start = time.time()
            for c in drop_commands(args.rate, args.drop_mode, down=True):
                netsim_lib.sh(*c)
            time.sleep(args.drop_for)
            for c in drop_commands(args.rate, args.drop_mode, down=False):
                netsim_lib.sh(*c)
            drop_end = time.time()
            try:
                driver.wait(timeout=max(1.0, drop_start + args.bound_s - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
            result["driver_output"] = driver.stdout.read().decode(errors="replace")[-2000:]
            ranks = []
            for r in range(2 * PER_NODE):
                path = os.path.join(out, "rank%d.log" % r)
                text = open(path).read() if os.path.exists(path) else ""
                s = summarize(parse_rank_log(text), drop_start, drop_end)
                s["log_tail"] = "\n".join(l for l in text.splitlines() if not STEP_RE.match(l))[-1500:]
                ranks.append(s)
            result.update(ranks=ranks, job_s_after_drop=round(time.time() - drop_start, 1))
    finally:
        netsim_lib.teardown()
    result["load_end"] = os.getloadavg()
    _print(result)
    if args.json:
        runs = json.load(open(args.json)) if os.path.exists(args.json) else []
        runs.append(result)
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


def _wait_for_first_step(path, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            steps = parse_rank_log(open(path).read())["steps"]
            if steps:
                return steps[0][1]
        if proc.poll() is not None:
            raise SystemExit("the job ended before its first step:\n" + proc.stdout.read().decode()[-4000:])
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("no step within %d s" % timeout)


def _print(result):
    print(
        "%s at %s, link %s for %gs (%s) after %gs; load %.1f -> %.1f"
        % (
            result["method"],
            result["rate"],
            "dropped",
            result["drop_for"],
            result["drop_mode"],
            result["drop_at"],
            result["load_start"][0],
            result["load_end"][0],
        )
    )
    for r, s in enumerate(result.get("ranks", [])):
        print(
            "  rank %d: %s, longest step gap %s s, %d steps after the link came back%s"
            % (
                r,
                s["outcome"],
                s["stall_s"],
                s["steps_after"],
                ", error %.1f s after the drop: %s" % (s["failed_after_s"], s["error"][:300]) if "error" in s else "",
            )
        )


def driver(args):
    """Inside the first namespace: the rendezvous and both ranks (they stop drop_at + drop_for + after_s after their
    first step)."""
    argv = [sys.executable, os.path.abspath(__file__), "worker", "--out", args.out, "--method", args.method]
    argv += ["--drop_at", str(args.drop_at), "--drop_for", str(args.drop_for), "--after_s", str(args.after_s)]
    codes = netsim_lib.run_ranks(PER_NODE, argv, args.out)
    print("EXIT CODES %s" % codes, flush=True)


def worker(args):
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    import tensorflow_ext.horovod as tfe_hvd  # pylint: disable=import-outside-toplevel

    tfe_hvd.init()
    rank = tfe_hvd.rank()
    rng = np.random.RandomState(rank)
    x = tf.constant(rng.randn(16, 256).astype(np.float32))
    y = tf.constant(rng.randn(16, 1).astype(np.float32))
    h = x
    for i, width in enumerate((512, 512)):
        h = tf.compat.v1.layers.dense(h, width, tf.nn.relu, name="d%d" % i)
    loss = tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(h, 1, name="out") - y))
    opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01), **METHODS[args.method])
    train = opt.minimize(loss)
    # Every rank stops at the same step: each says whether its clock passed the stop time, summed across ranks.
    past = tf.compat.v1.placeholder(tf.float32, [])
    with tf.control_dependencies([train]):
        stop = hvd.allreduce(past, op=hvd.Sum, name="link_drop_stop")
    step, first, stop_at = 0, None, None
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(tfe_hvd.broadcast_global_variables(0))
        while step < 100000:
            try:
                stopping = sess.run(stop, {past: float(stop_at is not None and time.time() > stop_at)})
            except tf.errors.OpError as e:
                message = " ".join(e.message.split())[:1500]
                print("FAILED %.3f step=%d %s: %s" % (time.time(), step, type(e).__name__, message), flush=True)
                sys.exit(1)
            step += 1
            now = time.time()
            print("STEP %d %.3f" % (step, now), flush=True)
            if first is None:
                first = now
                stop_at = first + args.drop_at + args.drop_for + args.after_s
            if stopping > 0:
                break
    print("DONE %.3f steps=%d" % (time.time(), step), flush=True)


def main():
    args = parse_args()
    {"run": run, "driver": driver, "worker": worker}[args.mode](args)


if __name__ == "__main__":
    main()
