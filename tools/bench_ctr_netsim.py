"""The main job (`python -m tensorflow_ext.examples.ctr --distributed ...`) over a simulated slow link, per method.

As root, `netsim` makes two network namespaces ("nodes") joined by a tbf-shaped veth pair (tools/netsim.py), and per
link rate runs the CTR example's distributed job once per method of reducing the dense gradients, on `--per_node`
ranks in each namespace (default 1: one rank per node, 2 ranks), then removes the namespaces (also on errors and
SIGTERM). No ssh: the tool runs Horovod's Gloo rendezvous server itself and gives each rank horovodrun's environment.

Every method trains the same job from scratch (`--fresh`): the same synthetic stream, seed, steps and batch per rank,
so the AUC on the held-out batches (rank 0 evaluates the final checkpoint) is taken after the same number of
examples. Methods (the example's flags):

    plain        DistributedOptimizer's defaults (Horovod's allreduce of float32 gradients)
    fp16, bf16   --compression fp16 / bf16 (16 bits on the wire)
    topk1        --topk_ratio 0.01 (Top-K 1% with error feedback)
    topk1_fp16   --topk_ratio 0.01 --compression fp16
    auto         --compression auto --topk_ratio 0.01 (per fused buffer: plain, fp16, bf16 or Top-K, measured)
    2d           --node_size <per_node> (only with --per_node > 1)

Per run: examples/s over the timed steps (the first `--untimed_steps` are warm-up: graph, first collectives and
auto's measurement), the evaluation AUC and logloss, the training loss (rank 0, mean of the last 10 steps), the
wall time, the bytes that crossed the link each way (the run's start included) and the load average (1 and 5
minutes) before and after. With `--rounds R` every method runs R times per rate, in turns (the order rotates each
round, as the machine's load drifts), and the table gives the median examples/s and the range. Only the dense
gradients are compressed: the embedding rows' exchange (data_parallel: an allgather of the touched rows;
model_parallel: alltoalls) is the same in every method.

    sudo flock /tmp/tfext_bench.lock .venv/bin/python tools/bench_ctr_netsim.py netsim \\
        --rates 100mbit 1gbit --json /tmp/ctr_netsim.json                      # ~5 min on 2 loaded cores
    sudo .venv/bin/python tools/bench_ctr_netsim.py netsim --rates 1gbit --methods plain fp16 --quick  # smoke run
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

# Method -> the CTR example's flags for it ("{per_node}" is replaced by --per_node).
METHODS = {
    "plain": [],
    "fp16": ["--compression", "fp16"],
    "bf16": ["--compression", "bf16"],
    "topk1": ["--topk_ratio", "0.01"],
    "topk1_fp16": ["--topk_ratio", "0.01", "--compression", "fp16"],
    "auto": ["--compression", "auto", "--topk_ratio", "0.01"],
    "2d": ["--node_size", "{per_node}"],
}
# The job's sizes: the example's default model (dim 8, MLP 256-128: 0.36 MB of dense gradients per step) on a
# smaller id space and batch, so that a run takes well under a minute on a loaded 2-core machine.
SIZES = dict(steps=60, batch_size=512, eval_steps=10, untimed_steps=10, dim=8, hidden="256,128", max_ids=2**20)
QUICK = dict(steps=12, batch_size=128, eval_steps=2, untimed_steps=4, dim=4, hidden="64,32", max_ids=2**16)
RUN_TIMEOUT_S = 600


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("netsim", help="(root) set up the namespaces, run the job per rate and method, tear down")
    n.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"], help="tc rates of the link (one run each)")
    n.add_argument("--per_node", type=int, choices=(1, 2), default=1, help="ranks per node (default 1)")
    n.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=None, help="default: all that apply")
    n.add_argument("--parallelism", choices=("data_parallel", "model_parallel"), default="data_parallel")
    n.add_argument("--threads", type=int, default=1, help="the ranks' TensorFlow threads (default 1)")
    for k, v in SIZES.items():
        n.add_argument("--" + k, type=type(v), default=None, help="default %s (--quick: %s)" % (v, QUICK[k]))
    n.add_argument("--rounds", type=int, default=1, help="runs of every method per rate, in turns (default 1)")
    n.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    n.add_argument("--json", help="write the results here")
    d = sub.add_parser("driver", help="(inside the first namespace) the rendezvous server and the ranks of one run")
    d.add_argument("--out", required=True)
    d.add_argument("--per_node", type=int, required=True)
    d.add_argument("ctr_args", nargs=argparse.REMAINDER, help="-- then the CTR example's flags")
    args = p.parse_args(argv)
    if args.cmd == "netsim":
        sizes = QUICK if args.quick else SIZES
        for k, v in sizes.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
        if args.rounds < 1:
            p.error("--rounds must be >= 1, got %d" % args.rounds)
        if args.untimed_steps >= args.steps:
            p.error("--untimed_steps (%d) must be below --steps (%d)" % (args.untimed_steps, args.steps))
        if args.methods is None:
            args.methods = [m for m in METHODS if m != "2d" or args.per_node > 1]
        elif "2d" in args.methods and args.per_node == 1:
            p.error("2d needs --per_node 2 (it reduces inside each node first)")
    return args


def ctr_argv(args, method, model_dir):
    """The CTR example's command line of one run of `method`."""
    argv = ["-m", "tensorflow_ext.examples.ctr", "--distributed", args.parallelism, "--fresh"]
    argv += ["--model_dir", model_dir, "--no_export", "--seed", "0", "--threads", str(args.threads)]
    for k in SIZES:
        argv += ["--" + k, str(getattr(args, k))]
    # The summary's loss is the mean over the last logging period: the last 10 steps. Checkpoints only at the end.
    argv += ["--log_every", str(min(10, args.steps)), "--save_checkpoints_steps", str(10 * args.steps)]
    return argv + [a.format(per_node=args.per_node) for a in METHODS[method]]


def summary_of(text):
    """The CTR example's JSON summary: the last line of rank 0's output that is a JSON object."""
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON summary in the output:\n%s" % text[-3000:])


def order(methods, round_index):
    """The methods' order in one round: rotated each round, so that no method always runs first (or after the same
    one) while the machine's load drifts."""
    k = round_index % len(methods)
    return methods[k:] + methods[:k]


def result(rate, method, summary, load_start, load_end, wall_s, link=(0, 0), round_index=0):
    """One run's entry of the results: what the table and the JSON report. `link`: the bytes the first node's end
    of the link sent and received during the run (its start and end included)."""
    return dict(
        rate=rate,
        method=method,
        round=round_index,
        examples_per_sec=summary["examples_per_sec"],
        steps_per_sec=summary["steps_per_sec"],
        auc=summary["auc"],
        logloss=summary["logloss"],
        loss=summary["loss"],
        ranks=summary["ranks"],
        steps=summary["steps"],
        examples=summary["steps"] * summary["batch_size"] * summary["ranks"],
        compression_choices=summary.get("compression_choices"),
        link_MB_sent=round(link[0] / 1e6, 2),
        link_MB_received=round(link[1] / 1e6, 2),
        load_start=[round(x, 2) for x in load_start],
        load_end=[round(x, 2) for x in load_end],
        wall_s=round(wall_s, 1),
    )


def _median(values):
    v = sorted(values)
    return 0.5 * (v[(len(v) - 1) // 2] + v[len(v) // 2])


def table(runs):
    """The results as a text table, one row per rate and method: the median examples/s over its rounds (and their
    range), its ratio to plain's median, the mean AUC, logloss and loss, the link's MB per step each way (the larger
    direction; the run's start included), the 1-minute load average at the start of its first run and the end of
    its last, the wall time."""
    head = "%-8s %-11s %10s %13s %8s %7s %8s %7s %8s %11s %6s"
    lines = [head % ("link", "method", "examples/s", "range", "vs plain", "AUC", "logloss", "loss", "MB/step", "load",
                     "wall")]  # fmt: skip
    for rate in dict.fromkeys(r["rate"] for r in runs):
        of_rate = [r for r in runs if r["rate"] == rate]
        rows = {}
        for r in of_rate:
            rows.setdefault(r["method"], []).append(r)
        speed = {m: _median([r["examples_per_sec"] or 0 for r in rs]) for m, rs in rows.items()}
        for m, rs in rows.items():
            eps = [r["examples_per_sec"] or 0 for r in rs]
            losses = [r["loss"] for r in rs if r["loss"] is not None]
            mb = max(max(r["link_MB_sent"], r["link_MB_received"]) / max(r["steps"], 1) for r in rs)
            lines.append(
                "%-8s %-11s %10.0f %13s %8s %7.4f %8.4f %7s %8.3f %11s %5.0fs"
                % (
                    rate,
                    m,
                    speed[m],
                    "%.0f-%.0f" % (min(eps), max(eps)) if len(rs) > 1 else "",
                    "%.2fx" % (speed[m] / speed["plain"]) if speed.get("plain") else "-",
                    sum(r["auc"] for r in rs) / len(rs),
                    sum(r["logloss"] for r in rs) / len(rs),
                    "%.4f" % (sum(losses) / len(losses)) if losses else "-",
                    mb,
                    "%.1f->%.1f" % (rs[0]["load_start"][0], rs[-1]["load_end"][0]),
                    sum(r["wall_s"] for r in rs),
                )
            )
    return "\n".join(lines)


def netsim(args):
    if os.geteuid() != 0:
        sys.exit("netsim needs root (network namespaces and tc)")
    here = os.path.abspath(__file__)
    settings = {k: getattr(args, k) for k in ["per_node", "parallelism", "threads", "rounds"] + list(SIZES)}
    results = {"settings": settings, "load_start": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M"), "runs": []}

    def on_signal(signum, frame):
        netsim_lib.teardown()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    t_all = time.time()
    try:
        for rate in args.rates:
            netsim_lib.setup(rate)
            for i, method in ((i, m) for i in range(args.rounds) for m in order(args.methods, i)):
                with tempfile.TemporaryDirectory(prefix="ctr_netsim_") as out:
                    cmd = ["ip", "netns", "exec", netsim_lib.NS[0], sys.executable, here, "driver", "--out", out]
                    cmd += ["--per_node", str(args.per_node), "--"] + ctr_argv(args, method, os.path.join(out, "m"))
                    link0, load_start, t0 = netsim_lib.link_bytes(), os.getloadavg(), time.time()
                    r = subprocess.run(cmd, text=True, capture_output=True, timeout=RUN_TIMEOUT_S)
                    link = [b - a for a, b in zip(link0, netsim_lib.link_bytes())]
                    if r.returncode != 0:
                        sys.stderr.write(r.stdout[-6000:] + r.stderr[-6000:])
                        raise SystemExit("the %s run at %s failed" % (method, rate))
                    with open(os.path.join(out, "rank0.log")) as f:
                        summary = summary_of(f.read())
                    run = result(rate, method, summary, load_start, os.getloadavg(), time.time() - t0, link, i)
                results["runs"].append(run)
                print("%s %s (round %d): %s examples/s, AUC %.4f, link %.1f/%.1f MB (load %.2f -> %.2f, %.0f s)" % (
                    rate, method, i, run["examples_per_sec"], run["auc"], run["link_MB_sent"],
                    run["link_MB_received"], run["load_start"][0], run["load_end"][0], run["wall_s"]),
                    flush=True)  # fmt: skip
    finally:
        netsim_lib.teardown()
    results["load_end"] = os.getloadavg()
    results["wall_s"] = round(time.time() - t_all, 1)
    print(table(results["runs"]))
    print(
        "load average start %s, end %s; wall %.0f s" % (results["load_start"], results["load_end"], results["wall_s"])
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def driver(args):
    ctr = args.ctr_args[1:] if args.ctr_args[:1] == ["--"] else args.ctr_args
    codes = netsim_lib.run_ranks(args.per_node, [sys.executable] + ctr, args.out)
    if any(codes):
        sys.stderr.write(netsim_lib.rank_logs(args.out, len(codes)))
        sys.exit("ranks exited with %s" % codes)


def main():
    args = parse_args()
    {"netsim": netsim, "driver": driver}[args.cmd](args)


if __name__ == "__main__":
    main()
