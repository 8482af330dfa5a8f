#!/usr/bin/env python
"""Compact embedding rows (bf16/fp16 training rows, row-wise optimizer state, int8 serving rows): memory and quality.

Two benchmarks, each a sub-command; each writes its JSON (``--json``) and prints a markdown table. (The step time of
compact rows: tools/bench_ctr_speed.py's ours_bf16* variants and tools/bench_small_model.py.)

``memory``: bytes per key of a dynamic embedding holding N keys, as ``memory_bytes()`` reports it and as the RSS
delta of a fresh process (one subprocess per configuration, as tools/bench_table_memory.py does: a warm-up table of
the same kind first, heap trimmed before and after the fill). Training tables are filled by training steps (an
optimizer's apply on chunks of new keys), so their optimizer slots exist as they do in a model:

  fp32_adagrad          float32 rows, Adagrad (one float32 accumulator per column)
  bf16_adagrad          bfloat16 rows and bfloat16 Adagrad accumulators (slot_dtype=value_dtype)
  bf16_rowwise          bfloat16 rows, tf_ext.RowwiseAdagradOptimizer (one float32 accumulator per row)
  fp32_adam             float32 rows, Adam (m and v per column)
  bf16_adam             bfloat16 rows, Adam's m and v in bfloat16
  frozen_fp32 / frozen_bf16 / frozen_int8
                        serving: a frozen table (``FrozenTableRef``) built from N random rows made in the graph (as
                        a serving restore builds it from the tensors it reads), stored as float32, bfloat16 or int8
                        rows (per-row scale and bias); its warm-up table has N keys too (see memory_child)
  tfra_adagrad / tfra_bf16_adagrad / tfra_adam / tfra_bf16_adam
                        TFRA: ``de.get_variable`` (float32 or bfloat16 values) trained by
                        ``de.DynamicEmbeddingOptimizer`` (one more table per slot); RSS delta only

``quality``: the main job (``python -m tensorflow_ext.examples.ctr``) at its default sizes, per seed: float32 rows +
Adagrad against bf16 rows + row-wise Adagrad (stochastic and nearest rounding; float32 rows + row-wise Adagrad
separates the optimizer's effect from the storage's), Adam with float32 against bfloat16 rows and m/v, the ``--days``
mode, and the served AUC of the exports (float32, bfloat16 and int8 frozen exports of the same checkpoint, evaluated
in a fresh session). Each run's JSON summary is kept in ``--work_dir`` so an interrupted matrix continues.

  python tools/bench_compact_rows.py memory --dim 16 --json docs/bench_compact_rows_memory_d16.json
  python tools/bench_compact_rows.py memory --dim 64 --keys 524288 --json docs/bench_compact_rows_memory_d64.json
  python tools/bench_compact_rows.py quality --seeds 0 1 2 --json docs/bench_compact_rows_quality.json
"""

import argparse
import json
import os
import subprocess
import sys
import time

import bench_common as bc
from bench_common import np, tf

REPO_ROOT = bc.REPO_ROOT

# --------------------------------------------------------------------------- memory

# name -> (backend, value dtype, slot dtype ("float32" or "same"), optimizer); serving: (backend, storage, None, None)
MEMORY_CONFIGS = {
    "fp32_adagrad": ("ours", "float32", "float32", "adagrad"),
    "bf16_adagrad": ("ours", "bfloat16", "same", "adagrad"),
    "bf16_rowwise": ("ours", "bfloat16", "float32", "rowwise_adagrad"),
    "fp32_adam": ("ours", "float32", "float32", "adam"),
    "bf16_adam": ("ours", "bfloat16", "same", "adam"),
    "frozen_fp32": ("frozen", "float32", None, None),
    "frozen_bf16": ("frozen", "bfloat16", None, None),
    "frozen_int8": ("frozen", "int8", None, None),
    "tfra_adagrad": ("tfra", "float32", "same", "adagrad"),
    "tfra_bf16_adagrad": ("tfra", "bfloat16", "same", "adagrad"),
    "tfra_adam": ("tfra", "float32", "same", "adam"),
    "tfra_bf16_adam": ("tfra", "bfloat16", "same", "adam"),
}
MEMORY_LABELS = {
    "fp32_adagrad": "float32 rows + Adagrad",
    "bf16_adagrad": "bf16 rows + Adagrad, accumulators bf16",
    "bf16_rowwise": "bf16 rows + row-wise Adagrad (1 float32 per row)",
    "fp32_adam": "float32 rows + Adam",
    "bf16_adam": "bf16 rows + Adam, m/v bf16",
    "frozen_fp32": "serving: frozen table, float32 rows",
    "frozen_bf16": "serving: frozen table, bf16 rows",
    "frozen_int8": "serving: frozen table, int8 rows (fp16 scale + bias)",
    "tfra_adagrad": "TFRA: float32 + Adagrad (2 tables)",
    "tfra_bf16_adagrad": "TFRA: bf16 + Adagrad (2 tables)",
    "tfra_adam": "TFRA: float32 + Adam (3 tables)",
    "tfra_bf16_adam": "TFRA: bf16 + Adam (3 tables)",
}


def _ours_optimizer(tf_ext, name):
    if name == "adagrad":
        return tf.compat.v1.train.AdagradOptimizer(0.05)
    if name == "rowwise_adagrad":
        return tf_ext.RowwiseAdagradOptimizer(0.05)
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(1e-3)
    raise ValueError("unknown optimizer %r" % name)


def memory_child(config, keys, dim, chunk, seed):
    """One configuration in this (fresh) process: prints ``RESULT <json>``."""
    backend, value_dtype, slot_dtype, optimizer = MEMORY_CONFIGS[config]
    rng = np.random.default_rng(seed)
    all_keys = np.unique(rng.integers(1, 2**62, size=int(keys * 1.01) + 16, dtype=np.int64))[:keys]
    rng.shuffle(all_keys)
    warm_keys = np.arange(-(chunk + 10), -10, dtype=np.int64)  # disjoint from all_keys
    kp = tf.compat.v1.placeholder(tf.int64, [None])
    vp = tf.compat.v1.placeholder(tf.float32, [None, dim])

    if backend == "ours":
        tf_ext, reason = bc.import_ours_embedding()
        if tf_ext is None:
            raise RuntimeError(reason)
        storage = {}
        if value_dtype != "float32":
            storage["value_dtype"] = tf.as_dtype(value_dtype)
            if slot_dtype == "same":
                storage["slot_dtype"] = storage["value_dtype"]

        def make(name):
            emb = tf_ext.get_dynamic_embedding(
                name, dim, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.01), **storage
            )
            rows = tf_ext.embedding_lookup(emb, kp)
            step = tf.compat.v1.train.get_or_create_global_step()  # stochastic rounding draws from the step
            fill = _ours_optimizer(tf_ext, optimizer).minimize(tf.reduce_sum(rows * vp), global_step=step)
            return fill, emb.size(), emb.memory_bytes()

    elif backend == "tfra":
        de, reason, _ = bc.import_tfra()
        if de is None:
            raise RuntimeError(reason)

        def make(name):
            var = de.get_variable(
                name,
                key_dtype=tf.int64,
                value_dtype=tf.as_dtype(value_dtype),
                dim=dim,
                initializer=tf.compat.v1.random_normal_initializer(0.0, 0.01),
            )
            rows = tf.cast(de.embedding_lookup(var, kp), tf.float32)
            opt = de.DynamicEmbeddingOptimizer(_ours_optimizer(None, optimizer))
            return opt.minimize(tf.reduce_sum(rows * vp)), var.size(), None

    else:
        from tensorflow_ext.table import refs

        def make(name):
            # Built from float32 rows made in the graph, as a serving restore builds it from the tensors it reads.
            # The allocator keeps the memory of those transient rows (4 * dim B/key) after the build, so the warm-up
            # table has the same size: the measured build reuses that memory, and the RSS delta is the table's own.
            table = refs.FrozenTableRef.create(dim, **_frozen_storage(refs, value_dtype), name=name)
            build_keys = tf.range(1, keys + 1, dtype=tf.int64) * (1 if name == "warm" else -1) * 0x9E3779B1
            rows = tf.random.normal([keys, dim], seed=seed)
            return table.build(build_keys, rows), table.size(), table.memory_bytes()

    warm_fill, _, _ = make("warm")
    fill, size_op, mem_op = make("emb")
    sess = bc.start_session(tf.compat.v1.get_default_graph(), bc.session_config())

    def feed(k):
        return {kp: k, vp: rng.standard_normal((len(k), dim)).astype(np.float32)}

    sess.run(warm_fill, {} if backend == "frozen" else feed(warm_keys))
    mem0 = int(sess.run(mem_op)) if mem_op is not None else None
    sess.run(size_op)  # creates the measured table before the baseline
    bc.trim_heap()
    time.sleep(0.2)
    rss0 = bc.rss_bytes()
    t0 = time.perf_counter()
    if backend == "frozen":
        # A frozen table is built once, from all its rows (the restore of a serving export).
        sess.run(fill)
    else:
        for s in range(0, keys, chunk):
            sess.run(fill, feed(all_keys[s : s + chunk]))
    fill_s = time.perf_counter() - t0
    n = int(sess.run(size_op))
    bc.trim_heap()
    time.sleep(0.2)
    rss1 = bc.rss_bytes()
    result = {
        "config": config,
        "backend": backend,
        "value_dtype": value_dtype,
        "slot_dtype": slot_dtype,
        "optimizer": optimizer,
        "dim": dim,
        "keys": keys,
        "size": n,
        "fill_s": fill_s,
        "rss_delta_bytes": rss1 - rss0,
        "rss_bytes_per_key": (rss1 - rss0) / float(n),
    }
    if mem_op is not None:
        mem1 = int(sess.run(mem_op))
        result.update(op_bytes=mem1, op_bytes_per_key=mem1 / float(n), op_bytes_empty=mem0)
    print("RESULT " + json.dumps(result), flush=True)


def _frozen_storage(refs, value_dtype):
    """The frozen table's storage argument ({} for float32 rows, the default)."""
    if value_dtype == "float32":
        return {}
    return {"storage": refs.storage_name(tf.as_dtype(value_dtype))}


def _run_child(argv):
    """Runs this script with argv in a fresh process; its RESULT dict, or (None, why it failed)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__)] + argv, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            r["wall_s"] = time.perf_counter() - t0
            return r, None
    err = [l for l in p.stderr.splitlines() if l.strip() and "WARNING" not in l and "deprecat" not in l.lower()]
    return None, "exit %d: %s" % (p.returncode, (err[-1] if err else "no output"))


def memory_main(args):
    results, skipped = {}, {}
    for config in args.configs:
        r, err = _run_child(
            ["memory-child", config, "--keys", str(args.keys), "--dim", str(args.dim), "--chunk", str(args.chunk)]
        )
        if r is None:
            bc.log("%-18s skipped (%s)" % (config, err))
            skipped[config] = err
            continue
        results[config] = r
        bc.log(
            "%-18s RSS %.0f B/key%s, %d keys, fill %.1fs"
            % (
                config,
                r["rss_bytes_per_key"],
                (", memory_bytes %.0f B/key" % r["op_bytes_per_key"]) if "op_bytes_per_key" in r else "",
                r["size"],
                r["fill_s"],
            )
        )
    return {"results": results, "skipped": skipped, "labels": MEMORY_LABELS}


def memory_markdown(out):
    c, res = out["config"], out["results"]
    lines = [
        "bytes per key, dim %d, %d keys (lower is better); memory_bytes() and the RSS delta of a fresh process"
        % (c["dim"], c["keys"]),
        "",
        "| configuration | memory_bytes B/key | RSS delta B/key | vs float32 + Adagrad (RSS) |",
        "|---|---:|---:|---:|",
    ]
    base = res.get("fp32_adagrad", {}).get("rss_bytes_per_key")
    frozen_base = res.get("frozen_fp32", {}).get("rss_bytes_per_key")
    for name in MEMORY_CONFIGS:
        if name not in res:
            continue
        r = res[name]
        ref = frozen_base if name.startswith("frozen") else base
        lines.append(
            "| %s | %s | %.0f | %s |"
            % (
                out["labels"][name],
                "%.0f" % r["op_bytes_per_key"] if "op_bytes_per_key" in r else "-",
                r["rss_bytes_per_key"],
                "%.2fx" % (r["rss_bytes_per_key"] / ref) if ref else "-",
            )
        )
    lines.append("")
    lines += _memory_targets(c["dim"], res)
    for k, v in sorted(out["skipped"].items()):
        lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


def _memory_targets(dim, res):
    """The targets stated for this dim, MET or not (RSS and memory_bytes both must meet them)."""

    def worst(name):
        r = res.get(name)
        if r is None:
            return None
        return max(r["rss_bytes_per_key"], r.get("op_bytes_per_key", 0.0))

    lines = []
    if dim == 16:
        for name, limit in (("bf16_rowwise", 64), ("frozen_int8", 40)):
            w = worst(name)
            if w is not None:
                lines.append(
                    "%s: %.0f B/key, the larger of memory_bytes and RSS (target <= %d): %s"
                    % (name, w, limit, "MET" if w <= limit else "not met")
                )
    if dim == 64 and "frozen_int8" in res and "frozen_fp32" in res:
        for field in ("rss_bytes_per_key", "op_bytes_per_key"):
            a, b = res["frozen_int8"].get(field), res["frozen_fp32"].get(field)
            if a and b:
                lines.append(
                    "frozen int8 / frozen float32 (%s) = %.2f (target <= 0.30): %s"
                    % (field, a / b, "MET" if a / b <= 0.3 else "not met")
                )
    return lines


# --------------------------------------------------------------------------- quality

# name -> the main job's flags (besides --seed, --model_dir, --fresh, --quiet); every run also reports the served
# AUC of its default (plain float32) export.
QUALITY_RUNS = {
    "adagrad_fp32": ["--optimizer", "adagrad"],
    "rowwise_fp32": ["--optimizer", "rowwise_adagrad"],
    "rowwise_bf16_stochastic": [
        "--optimizer",
        "rowwise_adagrad",
        "--value_dtype",
        "bfloat16",
        "--rounding",
        "stochastic",
    ],
    "rowwise_bf16_nearest": ["--optimizer", "rowwise_adagrad", "--value_dtype", "bfloat16", "--rounding", "nearest"],
    "adam_fp32": ["--optimizer", "adam"],
    "adam_bf16": [
        "--optimizer",
        "adam",
        "--value_dtype",
        "bfloat16",
        "--slot_dtype",
        "same",
        "--rounding",
        "stochastic",
    ],
    "days_adagrad_fp32": ["--optimizer", "adagrad", "--days", "5"],
    "days_rowwise_bf16": [
        "--optimizer",
        "rowwise_adagrad",
        "--value_dtype",
        "bfloat16",
        "--rounding",
        "stochastic",
        "--days",
        "5",
    ],
}
# Exports of a trained run's checkpoint (--steps 0: evaluate and export only): name -> (run, export flags).
SERVED_EXPORTS = {
    "adagrad_fp32/frozen_fp32": ("adagrad_fp32", ["--serve_frozen", "--serve_dtype", "float32"]),
    "adagrad_fp32/frozen_bf16": ("adagrad_fp32", ["--serve_frozen", "--serve_dtype", "bfloat16"]),
    "adagrad_fp32/frozen_int8": ("adagrad_fp32", ["--serve_frozen", "--serve_dtype", "int8"]),
    "rowwise_bf16_stochastic/frozen_int8": ("rowwise_bf16_stochastic", ["--serve_frozen", "--serve_dtype", "int8"]),
}
# (name, baseline, candidate, what the comparison decides, target on the mean difference or None)
QUALITY_COMPARISONS = (
    ("bf16 + row-wise Adagrad vs float32 + Adagrad", "adagrad_fp32", "rowwise_bf16_stochastic", "auc", 0.001),
    ("row-wise vs element-wise Adagrad (float32 rows)", "adagrad_fp32", "rowwise_fp32", "auc", None),
    ("bf16 vs float32 rows (row-wise Adagrad)", "rowwise_fp32", "rowwise_bf16_stochastic", "auc", None),
    ("bf16 rounding: stochastic vs nearest", "rowwise_bf16_nearest", "rowwise_bf16_stochastic", "auc", None),
    ("Adam: bf16 rows and m/v vs float32", "adam_fp32", "adam_bf16", "auc", 0.001),
    (
        "--days 5: bf16 + row-wise vs float32 + Adagrad (last day)",
        "days_adagrad_fp32",
        "days_rowwise_bf16",
        "auc",
        0.001,
    ),
    (
        "served: frozen int8 vs frozen float32 export",
        "adagrad_fp32/frozen_fp32",
        "adagrad_fp32/frozen_int8",
        "served_auc",
        0.0005,
    ),
    (
        "served: frozen bf16 vs frozen float32 export",
        "adagrad_fp32/frozen_fp32",
        "adagrad_fp32/frozen_bf16",
        "served_auc",
        None,
    ),
    ("served: frozen float32 vs plain float32 export", "adagrad_fp32", "adagrad_fp32/frozen_fp32", "served_auc", None),
    (
        "served, bf16 + row-wise model: frozen int8 vs plain bf16 export",
        "rowwise_bf16_stochastic",
        "rowwise_bf16_stochastic/frozen_int8",
        "served_auc",
        0.0005,
    ),
)


def _main_job(flags, log_path):
    """Runs the main job with flags; its JSON summary (the last stdout line)."""
    cmd = [sys.executable, "-m", "tensorflow_ext.examples.ctr", "--quiet"] + flags
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    with open(log_path, "w") as log:
        p = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d), see %s" % (" ".join(cmd), p.returncode, log_path))
    return json.loads([l for l in p.stdout.splitlines() if l.strip()][-1])


def quality_main(args):
    os.makedirs(args.work_dir, exist_ok=True)
    common = [] if args.steps is None else ["--steps", str(args.steps)]
    results, skipped = {}, {}

    def cached(key, flags):
        path = os.path.join(args.work_dir, key.replace("/", "__") + ".json")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        if args.cached_only:
            skipped[key] = "not run (--cached_only)"
            return None
        t0 = time.time()
        try:
            s = _main_job(flags, path[: -len(".json")] + ".log")
        except RuntimeError as e:
            bc.log("  %s: %s" % (key, e))
            skipped[key] = str(e)
            return None
        s["bench_wall_s"] = round(time.time() - t0, 1)
        with open(path, "w") as f:
            json.dump(s, f)
        return s

    for seed in args.seeds:
        for name in args.runs:
            model_dir = os.path.join(args.work_dir, "model_%s_s%d" % (name, seed))
            flags = QUALITY_RUNS[name] + common + ["--seed", str(seed), "--model_dir", model_dir, "--served_auc"]
            if name.startswith("days_") and args.days_steps:
                flags += ["--steps", str(args.days_steps)]
            s = cached("%s/s%d" % (name, seed), ["--fresh"] + flags)
            if s is None:
                continue
            results.setdefault(name, {})[str(seed)] = _quality_row(s)
            bc.log(
                "  %s seed %d: AUC %.4f, served %.4f, %.0f B/key, %.0fs"
                % (
                    name,
                    seed,
                    s["auc"],
                    s.get("served_auc", float("nan")),
                    s.get("table_bytes_per_key") or 0,
                    s["bench_wall_s"],
                )
            )
            for export, (run, export_flags) in SERVED_EXPORTS.items():
                if run != name:
                    continue
                flags_export = QUALITY_RUNS[name] + ["--steps", "0", "--seed", str(seed), "--model_dir", model_dir]
                flags_export += ["--served_auc"] + export_flags
                e = cached("%s/s%d" % (export, seed), flags_export)
                if e is not None:
                    results.setdefault(export, {})[str(seed)] = _quality_row(e)
                    bc.log("  %s seed %d: served AUC %.6f" % (export, seed, e["served_auc"]))
    return {"results": results, "skipped": skipped, "comparisons": _comparisons(results)}


def _quality_row(summary):
    keep = (
        "auc",
        "served_auc",
        "served_examples",
        "logloss",
        "oracle_auc",
        "total_keys",
        "table_bytes",
        "table_bytes_per_key",
        "steps",
        "steps_per_sec",
        "train_seconds",
        "bench_wall_s",
    )
    row = {k: summary.get(k) for k in keep}
    if summary.get("days"):
        row["days_auc"] = [d["auc"] for d in summary["days"]]
    return row


def _comparisons(results):
    """Per comparison: per-seed differences (candidate - baseline), their mean and spread, each side's mean/std."""
    out = []
    for title, base, cand, metric, target in QUALITY_COMPARISONS:
        b, c = results.get(base, {}), results.get(cand, {})
        seeds = sorted(set(b) & set(c), key=int)
        if not seeds:
            continue
        bv = np.array([b[s][metric] for s in seeds], np.float64)
        cv = np.array([c[s][metric] for s in seeds], np.float64)
        d = cv - bv
        row = {
            "title": title,
            "baseline": base,
            "candidate": cand,
            "metric": metric,
            "seeds": [int(s) for s in seeds],
            "baseline_mean": float(bv.mean()),
            "baseline_std": float(bv.std(ddof=1)) if len(seeds) > 1 else None,
            "candidate_mean": float(cv.mean()),
            "candidate_std": float(cv.std(ddof=1)) if len(seeds) > 1 else None,
            "diffs": d.tolist(),
            "mean_diff": float(d.mean()),
            "diff_std": float(d.std(ddof=1)) if len(seeds) > 1 else None,
            "target": target,
        }
        if target is not None:
            # The target bounds the loss: a candidate better than its baseline meets it too.
            row["met"] = bool(d.mean() >= -target)
        out.append(row)
    return out


def quality_markdown(out):
    c = out["config"]
    lines = [
        "the main job, %s steps per run (days: %s per day), seeds %s; AUC on the evaluation data (Estimator metric; "
        "served: exact AUC of the export's predictions in a fresh session). Differences are candidate - baseline "
        "per seed; 'spread' is the standard deviation over seeds."
        % (c["steps"] or "default (3000)", c["days_steps"] or c["steps"] or "default", c["seeds"]),
        "",
        "| comparison | baseline mean (spread) | candidate mean (spread) | mean difference (spread of the paired "
        "differences) | per seed | target |",
        "|---|---:|---:|---:|---|---|",
    ]

    def f(x, nd=4):
        return "-" if x is None else ("%%.%df" % nd) % x

    for r in out["comparisons"]:
        nd = 4 if r["metric"] == "auc" else 6
        target = "-"
        if r["target"] is not None:
            target = "diff >= -%g: %s" % (r["target"], "MET" if r["met"] else "not met")
        lines.append(
            "| %s (%s) | %s (%s) | %s (%s) | %+.*f (%s) | %s | %s |"
            % (
                r["title"],
                r["metric"],
                f(r["baseline_mean"], nd),
                f(r["baseline_std"], nd),
                f(r["candidate_mean"], nd),
                f(r["candidate_std"], nd),
                nd,
                r["mean_diff"],
                f(r["diff_std"], nd),
                ", ".join("%+.*f" % (nd, x) for x in r["diffs"]),
                target,
            )
        )
    lines += ["", "| run | seed | AUC | served AUC | B/key | keys | steps/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, per_seed in out["results"].items():
        for seed, r in sorted(per_seed.items(), key=lambda kv: int(kv[0])):
            lines.append(
                "| %s | %s | %s | %s | %s | %s | %s |"
                % (
                    name,
                    seed,
                    f(r["auc"]),
                    f(r["served_auc"], 5),
                    f(r["table_bytes_per_key"], 0),
                    r["total_keys"] if r["total_keys"] is not None else "-",
                    f(r["steps_per_sec"], 1),
                )
            )
    for k, v in sorted(out["skipped"].items()):
        lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("memory", help="bytes per key per configuration (fresh process each)")
    m.add_argument("--keys", type=int, default=1 << 20)
    m.add_argument("--dim", type=int, default=16)
    m.add_argument("--chunk", type=int, default=65536, help="keys per training step (or insert) while filling")
    m.add_argument("--configs", nargs="+", default=list(MEMORY_CONFIGS), choices=list(MEMORY_CONFIGS))
    m.add_argument("--json")
    mc = sub.add_parser("memory-child", help=argparse.SUPPRESS)
    mc.add_argument("config", choices=list(MEMORY_CONFIGS))
    mc.add_argument("--keys", type=int, required=True)
    mc.add_argument("--dim", type=int, required=True)
    mc.add_argument("--chunk", type=int, required=True)
    mc.add_argument("--seed", type=int, default=7)
    q = sub.add_parser("quality", help="the main job per configuration and seed; AUC differences and their spread")
    q.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    q.add_argument("--runs", nargs="+", default=list(QUALITY_RUNS), choices=list(QUALITY_RUNS))
    q.add_argument("--steps", type=int, default=None, help="training steps per run (default: the job's own)")
    q.add_argument("--days_steps", type=int, default=600, help="steps per day of the --days runs")
    q.add_argument(
        "--work_dir",
        default="/tmp/tf_ext_bench_compact_rows",
        help="model dirs and each run's summary (kept: a rerun continues the matrix)",
    )
    q.add_argument(
        "--cached_only",
        action="store_true",
        help="report the runs kept in --work_dir; run none (e.g. while a matrix runs)",
    )
    q.add_argument("--json")
    args = p.parse_args(argv)
    if args.command == "memory-child":
        memory_child(args.config, args.keys, args.dim, args.chunk, args.seed)
        return None
    info = bc.machine_info()
    t0 = time.time()
    run, markdown, config_keys = {
        "memory": (memory_main, memory_markdown, ("keys", "dim", "chunk", "configs")),
        "quality": (quality_main, quality_markdown, ("seeds", "runs", "steps", "days_steps", "cached_only")),
    }[args.command]
    out = dict(run(args))
    out.update(
        benchmark="compact_rows_" + args.command,
        config={k: getattr(args, k) for k in config_keys},
        machine=info,
        wall_s=time.time() - t0,
    )
    return bc.finish(out, markdown(out), args.json)


if __name__ == "__main__":
    main()
