"""Feature lifecycle over days of drift: AUC and memory of admission + eviction, no policy, and a static hashed table.

Each variant runs the main job day by day (`python -m tensorflow_ext.examples.ctr --days N`) in a fresh process per
seed, on the same drifting synthetic stream:

  policy   dynamic embeddings with CountAdmission(--admission) and EvictionPolicy(capacity=--capacity)
  none     dynamic embeddings, no policy (every id keeps its row: memory grows with the ids seen)
  static   static hashed tables (tf.Variable per field, ids hashed into buckets) with the memory the policy run
           ended with (buckets = its table bytes / (26 fields x (dim + 1) floats x 2 for the Adagrad accumulator))

Reported per variant and day: AUC on the next day's data (mean and min/max over seeds) and table MiB.

    .venv/bin/python tools/bench_lifecycle.py --json docs/bench_lifecycle.json --plot docs/bench_lifecycle.png
    .venv/bin/python tools/bench_lifecycle.py --seeds 0 --days 2 --steps 30        # smoke run
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIELDS = 26


def run_ctr(model_dir, seed, args, extra):
    cmd = [sys.executable, "-m", "tensorflow_ext.examples.ctr", "--quick", "--fresh", "--quiet", "--no_export"]
    cmd += ["--model_dir", model_dir, "--seed", str(seed), "--days", str(args.days), "--steps", str(args.steps)]
    cmd += ["--eval_steps", str(args.eval_steps), "--drift_per_day", str(args.drift_per_day)] + extra
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        raise RuntimeError("ctr failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--steps", type=int, default=80, help="training steps per day")
    p.add_argument("--eval_steps", type=int, default=6)
    p.add_argument("--drift_per_day", type=float, default=20.0)
    p.add_argument("--admission", type=int, default=2)
    p.add_argument("--capacity", type=int, default=600, help="keys per table for the policy variant")
    p.add_argument("--evict_every", type=int, default=20)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--json")
    p.add_argument("--plot")
    args = p.parse_args()

    dim = 4  # --quick: dim 4; DeepFM tables hold dim + 1 columns
    results = {"policy": [], "none": [], "static": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            policy = run_ctr(
                os.path.join(tmp, "policy%d" % seed),
                seed,
                args,
                ["--admission", str(args.admission), "--capacity", str(args.capacity)]
                + ["--evict_every", str(args.evict_every)],
            )
            results["policy"].append(policy["days"])
            results["none"].append(run_ctr(os.path.join(tmp, "none%d" % seed), seed, args, [])["days"])
            table_bytes = policy["days"][-1]["table_mib"] * (1 << 20)
            buckets = max(2, int(table_bytes / (FIELDS * (dim + 1) * 4 * 2)))
            static = run_ctr(os.path.join(tmp, "static%d" % seed), seed, args, ["--static_buckets", str(buckets)])
            for d in static["days"]:
                d["buckets"] = buckets
            results["static"].append(static["days"])
            print("seed %d done (%.0f s)" % (seed, time.time() - t0), file=sys.stderr, flush=True)

    summary = {}
    for variant, runs in results.items():
        rows = []
        for day in range(args.days):
            aucs = [r[day]["auc"] for r in runs]
            mibs = [r[day]["table_mib"] for r in runs]
            rows.append(
                dict(
                    day=day + 1,
                    auc_mean=round(sum(aucs) / len(aucs), 4),
                    auc_min=min(aucs),
                    auc_max=max(aucs),
                    table_mib=round(sum(mibs) / len(mibs), 2),
                    keys=int(sum(r[day]["total_keys"] for r in runs) / len(runs)),
                )
            )
        summary[variant] = rows
    print("variant  day  AUC mean (min..max)      table MiB   keys")
    for variant, rows in summary.items():
        for r in rows:
            print(
                "%-7s  %3d  %.4f (%.4f..%.4f)  %9.2f  %7d"
                % (variant, r["day"], r["auc_mean"], r["auc_min"], r["auc_max"], r["table_mib"], r["keys"])
            )
    out = dict(args=vars(args), summary=summary, runs=results, wall_seconds=round(time.time() - t0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        import matplotlib  # pylint: disable=import-outside-toplevel

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
        for variant, rows in summary.items():
            x = [r["day"] for r in rows]
            ax1.errorbar(
                x,
                [r["auc_mean"] for r in rows],
                yerr=[[r["auc_mean"] - r["auc_min"] for r in rows], [r["auc_max"] - r["auc_mean"] for r in rows]],
                marker="o",
                capsize=3,
                label=variant,
            )
            ax2.plot(x, [r["table_mib"] for r in rows], "o-", label=variant)
        ax1.set_xlabel("day")
        ax1.set_ylabel("AUC on the next day (%d seeds)" % len(args.seeds))
        ax1.legend()
        ax2.set_xlabel("day")
        ax2.set_ylabel("table MiB")
        ax2.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=80)


if __name__ == "__main__":
    main()
