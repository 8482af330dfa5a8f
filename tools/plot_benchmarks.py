#!/usr/bin/env python
"""PNG bar charts of the benchmark JSON files, for docs/benchmarks.md.

  python tools/plot_benchmarks.py --table docs/bench_table.json \\
      --memory docs/bench_table_memory.json --ctr docs/bench_ctr.json --out docs/images

Writes (for each input given):
  table_throughput.png   Mkeys/s per backend, find/upsert at each dim (bench_table.py)
  table_memory.png       bytes/key per table and slot count, raw bytes as reference (bench_table_memory.py)
  ctr26_step.png         ms/step per variant and optimizer (bench_ctr_speed.py)
  gpu_table.png          B keys/s per operation and dim on the GPU, HierarchicalKV's A100 figures beside
                         (tools/gpu/bench_gpu_table.py)
  compact_rows_memory_d<dim>.png
                         bytes/key per row format, memory_bytes and RSS (tools/bench_compact_rows.py memory)
  topk_loss_vs_time.png  eval loss against training time per method, one panel per link (tools/bench_topk.py)
Needs only matplotlib (no TensorFlow).
"""

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "dense": "#9e9e9e",
    "tfdense": "#64b5f6",
    "tfra": "#ef8a62",
    "ours": "#1b7837",
    "static": "#9e9e9e",
    "raw": "#d9d9d9",
}
SHORT = {
    "dense": "dense gather/scatter (limit)",
    "tfdense": "TF DenseHashTable",
    "tfra": "TFRA CuckooHashTable",
    "ours": "tensorflow_ext",
    "static": "static embedding",
}


def _load(path):
    with open(path) as f:
        return json.load(f)


def _bars(ax, groups, series, values, colors, labels, fmt="%.1f"):
    """Grouped bar chart: values[s][g]; None is left out."""
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, s in enumerate(series):
        xs, ys = [], []
        for g in range(len(groups)):
            v = values[s][g]
            if v is not None:
                xs.append(g - 0.4 + width * (i + 0.5))
                ys.append(v)
        bars = ax.bar(xs, ys, width, label=labels.get(s, s), color=colors.get(s))
        for b, y in zip(bars, ys):
            ax.annotate(fmt % y, (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _subtitle(d):
    m = d.get("machine", {})
    la = m.get("loadavg")
    return "%s, TF %s, %s CPUs%s" % (
        m.get("time", ""),
        m.get("tensorflow", "?"),
        m.get("cpus", "?"),
        ", load avg %.1f at start" % la[0] if la else "",
    )


def _save(fig, ax, out_dir, name):
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_table(d, out_dir):
    dims = d["config"]["dims"]
    groups = ["%s dim %d" % (op, dim) for dim in dims for op in ("find", "upsert")]
    series = [b for b in ("dense", "tfdense", "tfra", "ours") if any(b in d["results"].get(str(x), {}) for x in dims)]
    values = {}
    for s in series:
        values[s] = []
        for dim in dims:
            for op in ("find", "upsert"):
                r = d["results"].get(str(dim), {}).get(s)
                values[s].append(r[op]["mkeys_s"] if r else None)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    _bars(ax, groups, series, values, COLORS, SHORT)
    c = d["config"]
    ax.set_ylabel("Mkeys/s (higher is better)")
    ax.set_title(
        "Table ops: %s keys, batch %d, %d intra-op threads, %s of %d\n%s"
        % ("{:,}".format(c["keys"]), c["batch"], c["intra_op"], c.get("stat", "median"), c["repeats"], _subtitle(d)),
        fontsize=9,
    )
    return _save(fig, ax, out_dir, "table_throughput.png")


def plot_memory(d, out_dir):
    slots = d["config"]["slots"]
    dim = d["config"]["dim"]
    groups = ["%d slot%s (width %d)" % (s, "" if s == 1 else "s", dim * (1 + s)) for s in slots]
    series, values, labels = ["raw"], {"raw": [8 + 4 * dim * (1 + s) for s in slots]}, {"raw": "raw (8 + 4*width)"}
    colors = dict(COLORS)
    for b in ("tfdense", "tfra", "ours"):
        r = d["results"].get(b)
        if not r:
            continue
        if b == "ours" and any("op_bytes_per_key" in r.get(str(s), {}) for s in slots):
            series.append("ours_op")
            values["ours_op"] = [r[str(s)].get("op_bytes_per_key") if str(s) in r else None for s in slots]
            labels["ours_op"] = "tensorflow_ext (MemoryBytes op)"
            colors["ours_op"] = "#5aae61"
        series.append(b)
        values[b] = [r[str(s)]["rss_bytes_per_key"] if str(s) in r else None for s in slots]
        labels[b] = SHORT[b] + " (RSS delta)"
    fig, ax = plt.subplots(figsize=(8, 4.2))
    _bars(ax, groups, series, values, colors, labels, fmt="%.0f")
    ax.set_ylabel("bytes per key (lower is better)")
    ax.set_title(
        "Table memory at steady state: dim %d, %s keys\n%s" % (dim, "{:,}".format(d["config"]["keys"]), _subtitle(d)),
        fontsize=9,
    )
    return _save(fig, ax, out_dir, "table_memory.png")


# tools/bench_compact_rows.py memory configurations, in the order of docs/benchmarks.md (training, serving, TFRA)
COMPACT_ORDER = (
    "fp32_adagrad bf16_adagrad bf16_rowwise fp32_adam bf16_adam frozen_fp32 frozen_bf16 frozen_int8 "
    "tfra_adagrad tfra_bf16_adagrad tfra_adam tfra_bf16_adam"
).split()


def plot_compact_memory(d, out_dir):
    """Bytes per key per row format (tools/bench_compact_rows.py memory): memory_bytes and RSS delta side by side."""
    res, dim = d["results"], d["config"]["dim"]
    names = [n for n in COMPACT_ORDER if n in res]
    values = {
        "op": [res[n].get("op_bytes_per_key") for n in names],
        "rss": [res[n]["rss_bytes_per_key"] for n in names],
    }
    labels = {"op": "memory_bytes()", "rss": "RSS delta"}
    colors = {"op": "#5aae61", "rss": COLORS["ours"]}
    fig, ax = plt.subplots(figsize=(11, 4.4))
    _bars(ax, [n.replace("_", "\n") for n in names], ["op", "rss"], values, colors, labels, fmt="%.0f")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("bytes per key (lower is better)")
    ax.set_title(
        "Compact rows: bytes per key, dim %d, %s keys (names: tools/bench_compact_rows.py)\n%s"
        % (dim, "{:,}".format(d["config"]["keys"]), _subtitle(d)),
        fontsize=9,
    )
    return _save(fig, ax, out_dir, "compact_rows_memory_d%d.png" % dim)


def plot_ctr(d, out_dir):
    opts = list(d["results"].keys())
    series = [v for v in ("static", "tfra", "ours") if any(v in d["results"][o] for o in opts)]
    values = {s: [d["results"][o].get(s, {}).get("median_ms") for o in opts] for s in series}
    labels = {"static": "static embedding (2^20 rows)", "tfra": "TFRA 0.7.2", "ours": "tensorflow_ext"}
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _bars(ax, [o.capitalize() for o in opts], series, values, COLORS, labels)
    c = d["config"]
    ax.set_ylabel("ms per training step (lower is better)")
    ax.set_title(
        "ctr26: batch %d, 26 fields, dim %d, median of %d steps\n%s" % (c["batch"], c["dim"], c["steps"], _subtitle(d)),
        fontsize=9,
    )
    return _save(fig, ax, out_dir, "ctr26_step.png")


def plot_gpu(d, out_dir):
    rows = [r for r in d["results"] if r["load"] == 0.5]
    ops = [
        op
        for op in ("find", "insert", "accumulate", "find_or_insert", "apply_adam")
        if any(r["op"] == op for r in rows)
    ]
    dims = sorted({r["dim"] for r in rows})
    by = {(r["op"], r["dim"]): r["gpu_keys_per_s"] / 1e9 for r in rows}
    series = ["dim %d" % dim for dim in dims]
    values = {"dim %d" % dim: [by.get((op, dim)) for op in ops] for dim in dims}
    colors = dict(zip(series, ("#c7e9c0", "#74c476", "#31a354", "#006d2c")))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    _bars(ax, ops, series, values, colors, {})
    for i, op in enumerate(ops):
        hkv = d.get("hkv_reference", {}).get(op)
        if hkv:
            ax.fill_between([i - 0.45, i + 0.45], hkv[0] / 1e9, hkv[1] / 1e9, color="#ef8a62", alpha=0.35, lw=0)
    ax.fill_between([], [], [], color="#ef8a62", alpha=0.35, label="HierarchicalKV, A100 80GB (published)")
    ax.set_ylabel("B keys/s (higher is better)")
    keys = rows[0]["keys"] if rows else 0
    ax.set_title(
        "CUDA table: %s keys per call, load 0.5, median of device times\n%s, %s"
        % ("{:,}".format(keys), d.get("device", "?"), d.get("date", "")),
        fontsize=9,
    )
    return _save(fig, ax, out_dir, "gpu_table.png")


def plot_topk(paths, out_dir):
    """Eval loss against training time per method, one panel per run of tools/bench_topk.py."""
    runs = [(d, run) for d in map(_load, paths) for run in d["runs"]]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.8), squeeze=False)
    for ax, (d, run) in zip(axes[0], runs):
        for m, t in run["train"].items():
            series = t["series"]
            ax.plot([s[1] for s in series], [s[2] for s in series], label="%s (%.2f steps/s)" % (m, t["steps_per_s"]))
        load = d["machine"]["load_start"][0], d["load_end"][0]
        ax.set_title("%s, load %.1f -> %.1f" % (run["where"], load[0], load[1]), fontsize=9)
        ax.set_xlabel("training time, s")
        ax.set_ylabel("eval loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "topk_loss_vs_time.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", help="JSON of tools/bench_table.py")
    p.add_argument("--memory", help="JSON of tools/bench_table_memory.py")
    p.add_argument("--ctr", help="JSON of tools/bench_ctr_speed.py")
    p.add_argument("--gpu", help="JSON of tools/gpu/bench_gpu_table.py")
    p.add_argument("--compact", nargs="*", default=[], help="JSONs of tools/bench_compact_rows.py memory (one per dim)")
    p.add_argument("--topk", nargs="*", default=[], help="JSONs of tools/bench_topk.py netsim (one panel per link)")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "images")
    )
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    done = []
    inputs = [(args.table, plot_table), (args.memory, plot_memory), (args.ctr, plot_ctr), (args.gpu, plot_gpu)]
    for path, fn in inputs + [(path, plot_compact_memory) for path in args.compact]:
        if path:
            if not os.path.exists(path):
                print("missing %s, skipped" % path)
                continue
            done.append(fn(_load(path), args.out))
    if args.topk:
        done.append(plot_topk(args.topk, args.out))
    for p_ in done:
        print("wrote %s" % p_)
    if not done:
        p.error("give at least one of --table, --memory, --ctr, --gpu, --compact, --topk")


if __name__ == "__main__":
    main()
