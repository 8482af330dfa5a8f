#!/usr/bin/env python
"""ctr26 end-to-end training-step benchmark, variants side by side.

Workload (tools/bench_ctr_variants.py): 26 categorical fields, batch 4096, embedding dim 16; per field, ids are
Zipf(1.1) draws folded into 2^22 values (mod), hashed with the field id into one int64 key space; MLP 256-128-1 on
the concatenated embeddings; sigmoid cross-entropy; Adagrad(0.05) (or, by --optimizer, row-wise Adagrad(0.05) or
Adam(1e-3)). Median step time of 40 steps after 10 warm-up steps.

Variants (each its own graph and session, all alive at once -- for every optimizer
asked for -- with steps interleaved round-robin so that machine noise hits all
variants alike; --isolate R runs each in a fresh process instead):
  static  tf.nn.embedding_lookup on a [2^20, 16] variable, keys mod 2^20 (collisions)
  tfra    TFRA 0.7.2: one de.get_variable table, tf.unique, de.embedding_lookup,
          de.DynamicEmbeddingOptimizer(optimizer)
  ours    tf_ext.get_dynamic_embedding + tf_ext.embedding_lookup(emb, ids[batch, 26]),
          stock optimizer .minimize(loss, global_step)
  ours_prealloc    (only when --variants names it) ours with initial_capacity=2^21, preallocate=True
  ours_noprefault  (only when --variants names it) ours with TF_EXT_TABLE_PREFAULT=0:
          arena slabs faulted in by the inserting thread instead of ahead of need
  ours_bf16        (only when --variants names it) ours with bfloat16 rows and optimizer slots
  ours_bf16_rows   (only when --variants names it) ours with bfloat16 rows, float32 slots
                   (with --optimizer rowwise_adagrad: one float32 accumulator per row)
All variants read the same pre-generated batches through the same input
pipeline (tf.data from in-memory tensors, fed once at iterator init), so no
per-step feed_dict.

Model quality at equal memory is tools/bench_ctr_quality.py.

Full run:    python tools/bench_ctr_speed.py --optimizer adagrad adam --json docs/bench_ctr.json
Compact rows: python tools/bench_ctr_speed.py --variants ours ours_bf16 ours_bf16_rows \
                --optimizer adagrad rowwise_adagrad --json docs/bench_ctr_compact.json
Quick run:   python tools/bench_ctr_speed.py --quick
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import bench_common as bc
import bench_ctr_variants as cv
from bench_common import np


def speed_main(args):
    """All (optimizer, variant) pairs in this process, their steps interleaved; the results per optimizer."""
    config = bc.session_config(args.intra_op, args.inter_op)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    sampler = cv.ZipfSampler(1.1, args.vocab)
    n_batches = args.warmup + args.steps
    keys, labels, _ = cv.make_batches(n_batches, args.batch, sampler, rng, "random")
    bc.log(
        "generated %d batches of %d x %d ids in %.1fs (%d distinct keys in all)"
        % (n_batches, args.batch, cv.FIELDS, time.perf_counter() - t0, len(np.unique(keys)))
    )

    classes, skipped, labels_out = bc.available(cv.BY_NAME, args.variants)
    # Every (optimizer, variant) pair is built up front and their steps are interleaved,
    # so that the "vs static Adagrad" ratios of the Adam rows come from the same minutes.
    built = []
    for opt in args.optimizer:
        for cls in classes:
            t1 = time.perf_counter()
            try:
                v = cls(keys, labels, opt, args.dim, args.seed, config, buckets=args.buckets)
            except Exception as e:
                bc.log("  %s/%s: FAILED to build: %s: %s" % (cls.name, opt, type(e).__name__, e))
                skipped["%s/%s" % (cls.name, opt)] = "%s: %s" % (type(e).__name__, e)
                continue
            bc.log("  %s/%s: built in %.1fs" % (cls.name, opt, time.perf_counter() - t1))
            built.append(v)
    times = {id(v): [] for v in built}
    for i, v in bc.interleaved(built, n_batches, args.seed + 1):
        dt = bc.time_call(v.step)
        if i >= args.warmup:
            times[id(v)].append(dt)
    return {"results": _step_results(args, built, times), "skipped": skipped, "labels": labels_out}


def _step_results(args, built, times):
    """``{optimizer: {variant: step-time summary, table size and bytes, global step, loss}}``; closes the variants."""
    results = {opt: {} for opt in args.optimizer}
    for v in built:
        opt = v.optimizer_name
        r = bc.summary_ms(times[id(v)])
        r.update(
            {
                "table_size": v.size(),
                "table_bytes": v.memory_bytes(),
                "global_step": int(v.sess.run(v.global_step)),
                "loss": v.run_loss(),
            }
        )
        results[opt][v.name] = r
        bc.log(
            "  %s/%s: median %.1f ms/step (p10 %.1f, p90 %.1f), table size %s"
            % (v.name, opt, r["median_ms"], r["p10_ms"], r["p90_ms"], r["table_size"])
        )
        v.close()
    return results


def isolated_main(args):
    """--isolate R: every (optimizer, variant) pair in a fresh process of its own, R rounds in rotating order.

    As a user runs one model per process: variants in one process share its memory, and on a VM whose page faults
    slow down as the process grows (docs/benchmarks.md, section 3) one variant's tables would slow another's growth.
    The figure of a pair is the median of its rounds' medians; ratios are also taken per round.
    """
    classes, skipped, labels_out = bc.available(cv.BY_NAME, args.variants)
    pairs = [(opt, cls.name) for opt in args.optimizer for cls in classes]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.isolate):
            got = {}
            for k in range(len(pairs)):
                opt, name = pairs[(k + r) % len(pairs)]
                res = _run_isolated(args, opt, name, os.path.join(tmp, "r%d_%s_%s.json" % (r, opt, name)))
                if res is None:
                    skipped["%s/%s" % (name, opt)] = "failed to build (see its own run)"
                    continue
                got.setdefault(opt, {})[name] = res
                bc.log("  round %d %s/%s: median %.1f ms/step" % (r + 1, name, opt, res["median_ms"]))
            rounds.append(got)
    results = {}
    for opt, name in pairs:
        runs = [g[opt][name] for g in rounds if name in g.get(opt, {})]
        if not runs:
            continue
        med = {k: float(np.median([x[k] for x in runs])) for k in ("median_ms", "p10_ms", "p90_ms")}
        med.update({"table_size": runs[-1]["table_size"], "rounds_ms": [x["median_ms"] for x in runs]})
        results.setdefault(opt, {})[name] = med
    return {"results": results, "skipped": skipped, "labels": labels_out, "rounds": rounds}


def _run_isolated(args, opt, name, json_path):
    """One (optimizer, variant) pair in a fresh process of this script; its result (None: it failed to build)."""
    passed = ["--batch", args.batch, "--dim", args.dim, "--vocab", args.vocab, "--buckets", args.buckets]
    passed += ["--steps", args.steps, "--warmup", args.warmup, "--seed", args.seed]
    passed += ["--intra_op", args.intra_op, "--inter_op", args.inter_op]
    cmd = [sys.executable, os.path.abspath(__file__), "--variants", name, "--optimizer", opt, "--json", json_path]
    proc = subprocess.run(cmd + [str(a) for a in passed], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("%s/%s failed:\n%s" % (opt, name, proc.stderr[-3000:]))
    with open(json_path) as f:
        return json.load(f)["results"].get(opt, {}).get(name)


def speed_markdown(out):
    """The report: one row per (variant, optimizer), the targets, the per-round ratios of --isolate, the skipped."""
    res = out["results"]
    c = out["config"]
    lines = [
        "ms/step, median of %d steps after %d warm-up (lower is better); batch %d, %d fields, dim %d, "
        "%d intra-op threads" % (c["steps"], c["warmup"], c["batch"], cv.FIELDS, c["dim"], c["intra_op"]),
        "",
        "| variant | optimizer | ms/step | p10 | p90 | vs static Adagrad | keys in table after run |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    base = res.get("adagrad", {}).get("static", {}).get("median_ms")
    for opt, r in res.items():
        for cls in cv.VARIANTS:
            if cls.name not in r:
                continue
            x = r[cls.name]
            rel = "%.2fx" % (x["median_ms"] / base) if base else "-"
            lines.append(
                "| %s | %s | %.1f | %.1f | %.1f | %s | %s |"
                % (
                    out["labels"].get(cls.name, cls.name),
                    opt,
                    x["median_ms"],
                    x["p10_ms"],
                    x["p90_ms"],
                    rel,
                    "{:,}".format(x["table_size"]) if x["table_size"] is not None else "-",
                )
            )
    targets = _targets(res, base)
    if targets:
        lines += [""] + targets
    lines += _round_ratios(out.get("rounds", []))
    if out["skipped"]:
        lines.append("")
        for k, v in sorted(out["skipped"].items()):
            lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


def _targets(res, base):
    """The ratios the targets are stated in (vs static Adagrad, prefaulting on/off, TFRA vs ours), MET or not."""
    targets = []
    for opt, r in res.items():
        o, t = (r.get(k, {}).get("median_ms") for k in ("ours", "tfra"))
        if o and base:
            lim = 1.15 if opt == "adagrad" else 1.25
            targets.append(
                "%s: ours / static-Adagrad = %.2f (target <= %.2f): %s"
                % (opt, o / base, lim, "MET" if o / base <= lim else "not met")
            )
        p = r.get("ours_prealloc", {}).get("median_ms")
        if p and base:
            lim = 0.9 if opt == "adagrad" else 1.1
            targets.append(
                "%s: ours_prealloc / static-Adagrad = %.2f (target <= %.2f): %s"
                % (opt, p / base, lim, "MET" if p / base <= lim else "not met")
            )
        for compact in ("ours_bf16", "ours_bf16_rows"):
            c = r.get(compact, {}).get("median_ms")
            if o and c:
                targets.append(
                    "%s: %s / ours (bf16 rows vs float32 rows) = %.2f (target <= 1.00): %s"
                    % (opt, compact, c / o, "MET" if c / o <= 1.0 else "not met")
                )
        n = r.get("ours_noprefault", {}).get("median_ms")
        if o and n:
            targets.append("%s: ours / ours_noprefault (prefaulting on / off) = %.2f" % (opt, o / n))
        if o and t:
            targets.append(
                "%s: TFRA / ours = %.2f%s"
                % (
                    opt,
                    t / o,
                    (" (target >= 2.5): " + ("MET" if t / o >= 2.5 else "not met")) if opt == "adagrad" else "",
                )
            )
    return targets


def _round_ratios(rounds):
    """--isolate: one line per round, every pair's median vs that round's static Adagrad."""
    lines = []
    for k, g in enumerate(rounds):
        b = g.get("adagrad", {}).get("static", {}).get("median_ms")
        if b:
            lines.append(
                "round %d (fresh process per variant), vs static Adagrad: " % (k + 1)
                + ", ".join(
                    "%s/%s %.2f" % (name, opt, x["median_ms"] / b)
                    for opt, r in g.items()
                    for name, x in r.items()
                    if not (opt == "adagrad" and name == "static")
                )
            )
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch_size", "--batch", dest="batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1 << 22, help="ids per field (Zipf draws mod vocab)")
    p.add_argument("--buckets", type=int, default=1 << 20, help="rows of the static variant")
    p.add_argument("--steps", type=int, default=40, help="timed steps")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--optimizer", nargs="+", default=["adagrad"], choices=["adagrad", "rowwise_adagrad", "adam"])
    p.add_argument(
        "--variants",
        nargs="+",
        default=[v.name for v in cv.VARIANTS if v.name not in cv.OPT_IN_VARIANTS],
        choices=[v.name for v in cv.VARIANTS],
    )
    bc.add_session_args(p)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--quick", action="store_true", help="batch 1024, 10 steps after 3")
    p.add_argument(
        "--isolate",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="run every (optimizer, variant) in a fresh process of its own, ROUNDS rounds in rotating order "
        "(default 0: all variants interleaved in this process)",
    )
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.steps, args.warmup = 1024, 10, 3

    info = bc.machine_info()
    t0 = time.perf_counter()
    out = dict(isolated_main(args) if args.isolate else speed_main(args))
    config_keys = ("batch", "dim", "vocab", "buckets", "steps", "warmup", "optimizer", "intra_op", "inter_op")
    config_keys += ("seed", "quick", "isolate")
    out.update(
        {
            "benchmark": "ctr26",
            "config": {k: getattr(args, k) for k in config_keys},
            "machine": info,
            "wall_s": time.perf_counter() - t0,
        }
    )
    return bc.finish(out, speed_markdown(out), args.json)


if __name__ == "__main__":
    main()
