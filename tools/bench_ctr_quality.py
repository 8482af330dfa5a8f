#!/usr/bin/env python
"""ctr26 model quality: a dynamic embedding (ours, with eviction) vs a static hashed one at equal memory.

Trains a dynamic model (ours) and a static hashed model with equal memory on a synthetic task whose labels come from
a hidden logistic model over per-id weights, and compares held-out AUC (see quality_main()). The workload and the
model variants are tools/bench_ctr_variants.py's (26 fields, Zipf(1.1) ids, MLP 256-128-1, Adagrad 0.05); the step
time of the variants is tools/bench_ctr_speed.py.

Full run:    python tools/bench_ctr_quality.py --json docs/bench_ctr_quality.json
Quick run:   python tools/bench_ctr_quality.py --quick
"""

import argparse
import time

import bench_common as bc
import bench_ctr_variants as cv
from bench_common import np, tf


class OursEvictVariant(cv.OursVariant):
    """Ours plus an eviction op fed at run time (min_version, min_frequency)."""

    name = "ours_evict"

    def table_bytes(self):
        self.min_version = tf.compat.v1.placeholder(tf.int64, [])
        self.min_frequency = tf.compat.v1.placeholder(tf.int64, [])
        removed = [s.table.evict(self.min_version, self.min_frequency) for s in self.emb.shards]
        self.evict_op = tf.add_n(removed) if len(removed) > 1 else removed[0]
        return cv.OursVariant.table_bytes(self)

    def evict(self, min_version=-1, min_frequency=-1):
        """Removes keys with version < min_version or frequency < min_frequency; returns the count."""
        return int(self.sess.run(self.evict_op, {self.min_version: min_version, self.min_frequency: min_frequency}))

    def stats(self):
        size, mem, gs = self.sess.run([self.size_op, self.mem_op, self.global_step])
        return int(size), int(mem), int(gs)


def auc(y, score):
    """ROC AUC by the rank statistic (ties get their mean rank)."""
    y = np.asarray(y).ravel().astype(bool)
    score = np.asarray(score).ravel()
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # mean ranks for ties
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(s)]])
    avg = (starts + ends - 1) / 2.0 + 1.0
    ranks_sorted = np.repeat(avg, ends - starts)
    ranks[order] = ranks_sorted
    npos = y.sum()
    nneg = len(y) - npos
    return float((ranks[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def quality_main(args):
    """Dynamic (ours, with eviction) vs static hashed embedding at a fixed memory budget, held-out AUC.

    Task: the ctr26 id distribution; label ~ Bernoulli(sigmoid(bias + 0.4 * sum_f w(key_f)))
    with a fixed N(0,1) hidden weight per key. A static table must hash keys into
    fewer rows, and colliding keys share a row, so their (independent) weights
    cannot both be learned; a dynamic table gives every key it holds its own row,
    but under a memory budget it can hold only some keys and must evict the rest.

    Fairness:
      * same model (embedding dim, MLP, initializers, seeds), same optimizer
        (Adagrad 0.05) and the same training batches in the same order, one epoch
        (every batch seen once, as in a stream); evaluation on fresh held-out batches
        from the same distribution, with is_training=False (evaluation inserts no key;
        a key the dynamic table does not hold reads as zeros).
      * fixed budget (--quality_budgets, in static rows R): B = R * dim * 4 * 2 bytes
        (embedding + Adagrad accumulator). The static model gets R rows (ids mod R).
        The dynamic model trains with periodic eviction (every --quality_evict_every
        steps, policy --quality_policy, see train_dynamic_budget()) so that its
        TfExtTableMemoryBytes (keys, embedding and Adagrad columns, metadata, index,
        overhead: the bytes the table holds) stays at or under B. The table never
        gives memory back (evicted rows are reused), so its bytes only grow: the
        reported peak is the maximum over all readings, before and after each
        eviction, and at the end. A peak over B is reported as such, not hidden.
      * optional (--quality_all_keys, the earlier comparison): the dynamic model with
        no eviction (it keeps every key seen) vs a static model with its bytes.
      * the AUC of the true logits (the ceiling) is reported.
      * repeated for --quality_seeds seeds (data, task draws and model init follow the
        seed); the verdict uses the mean paired difference per budget.
    """
    runs = []
    for i in range(args.quality_seeds):
        r = quality_one(args, args.seed + 1000 * i)
        if r["skipped"]:
            return r
        runs.append(r["results"])
    out = {"runs": runs, "budgets": {}}
    names = ["rows_%d" % rows for rows in args.quality_budgets] + (["all_keys"] if args.quality_all_keys else [])
    for name in names:
        diffs = [x[name]["dynamic"]["auc"] - x[name]["static"]["auc"] for x in runs]
        out["budgets"][name] = {
            "diffs": diffs,
            "diff_mean": float(np.mean(diffs)),
            "diff_sd": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None,
            "dynamic_auc_mean": float(np.mean([x[name]["dynamic"]["auc"] for x in runs])),
            "static_auc_mean": float(np.mean([x[name]["static"]["auc"] for x in runs])),
            "max_peak_over_budget": (
                max((x[name]["dynamic"].get("peak_bytes", 0) - x[name]["budget_bytes"]) for x in runs)
                if name != "all_keys"
                else None
            ),
        }
    out["oracle_auc_mean"] = float(np.mean([x["oracle_auc"] for x in runs]))
    return {"results": out, "skipped": {}, "labels": {}}


def train_dynamic_budget(v, steps, budget, every, policy):
    """Trains v (OursEvictVariant) for `steps` steps keeping its table bytes <= budget.

    Every `every` steps: read (keys, bytes); the readings before the first eviction
    give bytes per key (bytes / keys, index included; the last one is kept) and so the key cap
    K = 0.97 * budget / bytes_per_key. If the keys plus the growth expected before
    the next eviction (1.25 x the largest growth seen between two evictions) would
    pass K, evict down to that target:
      * policy "lru": steps_to_live -- remove keys not trained in the last ttl steps,
        lowering ttl (by 1, or ttl // 16 when ttl >= 32) until the target is met;
        the next eviction starts from that ttl plus the steps since (the window
        that fitted last time, grown by the elapsed steps), so it removes no more
        than needed;
      * policy "lfu": min_frequency -- remove keys looked up fewer than F times,
        raising F from 2 until the target is met (note: the op's test is
        'version < min_version OR frequency < min_frequency', so recent keys with a
        low count are removed too; this acts as an admission filter).
    Bytes are read before and after every eviction; the peak is their maximum.
    """
    peak, cap, grow, last_after, ttl, evictions, removed_total, last_gs = 0, None, 0, 0, 0, 0, 0, 0
    t0 = time.perf_counter()
    for i in range(steps):
        v.step()
        if (i + 1) % every and i + 1 != steps:
            continue
        size, mem, gs = v.stats()
        peak = max(peak, mem)
        if evictions == 0:  # bytes per key, re-measured until the first eviction (the table only grows until then)
            cap = int(0.97 * budget * size / mem)
        grow = max(grow, size - last_after)
        target = cap - int(1.25 * grow)
        if size > target and i + 1 != steps:
            if policy == "lru":
                removed, ttl = _evict_lru(v, gs, min(ttl + gs - last_gs, gs), target)
            else:
                removed = _evict_lfu(v, target)
            removed_total += removed
            evictions += 1
            last_gs = gs
            size, mem, _ = v.stats()
            peak = max(peak, mem)
        last_after = size
    size, mem, _ = v.stats()
    peak = max(peak, mem)
    return {
        "peak_bytes": peak,
        "key_cap": cap,
        "evictions": evictions,
        "removed": removed_total,
        "last_ttl": ttl if policy == "lru" else None,
        "train_s": time.perf_counter() - t0,
    }


def _evict_lru(v, gs, ttl, target):
    """Removes keys not trained in the last ttl steps, lowering ttl until at most target keys are left.

    Returns (keys removed, the ttl that fitted).
    """
    removed = 0
    while True:
        removed += v.evict(min_version=gs - ttl)
        if v.stats()[0] <= target or ttl == 0:
            return removed, ttl
        ttl -= 1 if ttl < 32 else ttl // 16


def _evict_lfu(v, target):
    """Removes keys looked up fewer than F times, raising F from 2 until at most target keys are left; the count."""
    removed, f = 0, 2
    while True:
        removed += v.evict(min_frequency=f)
        if v.stats()[0] <= target or f > 1000:
            return removed
        f += 1


class _SeedRun(object):
    """One seed's data (training and held-out batches) and the models trained and evaluated on it."""

    def __init__(self, args, seed):
        self.args, self.seed = args, seed
        self.config = bc.session_config(args.intra_op, args.inter_op)
        rng = np.random.default_rng(seed + 100)
        sampler = cv.ZipfSampler(1.1, args.vocab)
        t0 = time.perf_counter()
        self.keys, self.labels, _ = cv.make_batches(args.quality_steps, args.batch, sampler, rng, "hidden")
        ekeys, elabels, self.eval_logits = cv.make_batches(args.eval_batches, args.batch, sampler, rng, "hidden")
        self.eval_keys = ekeys.reshape(-1, cv.FIELDS)
        self.eval_labels = elabels.ravel()
        bc.log(
            "quality, seed %d: %d training batches (%d distinct keys), %d eval examples, CTR %.3f, generated in %.1fs"
            % (
                seed,
                args.quality_steps,
                len(np.unique(self.keys)),
                len(self.eval_labels),
                self.labels.mean(),
                time.perf_counter() - t0,
            )
        )

    def evaluate(self, v, r):
        """Adds the held-out AUC of v to r and closes v."""
        ekeys = self.eval_keys
        before = v.size() if v.size_op is not None else None
        scores = np.concatenate([v.predict(ekeys[i : i + 65536]) for i in range(0, len(ekeys), 65536)])
        r["auc"] = auc(self.eval_labels, scores)
        if before is not None and not isinstance(v, cv.StaticVariant) and v.size() != before:
            bc.log("  WARNING: evaluation inserted keys into the %s table" % v.name)
        v.close()
        return r

    def _variant(self, cls, **kwargs):
        a = self.args
        return cls(self.keys, self.labels, "adagrad", a.dim, self.seed, self.config, eval_keys=self.eval_keys, **kwargs)

    def train_static(self, rows):
        """The static model with `rows` buckets, trained and evaluated."""
        v = self._variant(cv.StaticVariant, buckets=rows)
        t1 = time.perf_counter()
        for _ in range(self.args.quality_steps):
            v.step()
        r = {"buckets": rows, "table_bytes": v.memory_bytes(), "train_s": time.perf_counter() - t1}
        return self.evaluate(v, r)

    def at_budget(self, rows):
        """Dynamic with eviction vs static, both in the memory of `rows` static rows."""
        a = self.args
        budget = rows * a.dim * 4 * 2
        v = self._variant(OursEvictVariant)
        dyn = train_dynamic_budget(v, a.quality_steps, budget, a.quality_evict_every, a.quality_policy)
        dyn.update(
            {
                "table_size": v.size(),
                "table_bytes": v.memory_bytes(),
                "policy": a.quality_policy,
                "evict_every": a.quality_evict_every,
            }
        )
        dyn = self.evaluate(v, dyn)
        st = self.train_static(rows)
        bc.log(
            "  budget %d rows (%.0f MiB): dynamic AUC %.4f (%d keys at the end, peak %.1f MiB, %d evictions, "
            "last ttl %s, train %.0fs) vs static AUC %.4f (train %.0fs): %+.4f"
            % (
                rows,
                budget / 2**20,
                dyn["auc"],
                dyn["table_size"],
                dyn["peak_bytes"] / 2**20,
                dyn["evictions"],
                dyn["last_ttl"],
                dyn["train_s"],
                st["auc"],
                st["train_s"],
                dyn["auc"] - st["auc"],
            )
        )
        return {"budget_bytes": budget, "dynamic": dyn, "static": st}

    def all_keys(self):
        """Dynamic keeping every key (no eviction) vs static with its bytes."""
        v = self._variant(cv.OursVariant)
        t1 = time.perf_counter()
        for _ in range(self.args.quality_steps):
            v.step()
        dyn = {"table_size": v.size(), "table_bytes": v.memory_bytes(), "train_s": time.perf_counter() - t1}
        dyn = self.evaluate(v, dyn)
        rows = int(dyn["table_bytes"] // (self.args.dim * 4 * 2))
        st = self.train_static(rows)
        bc.log(
            "  all keys (no eviction): dynamic AUC %.4f (%d keys, %.1f MiB) vs static %d rows AUC %.4f: %+.4f"
            % (dyn["auc"], dyn["table_size"], dyn["table_bytes"] / 2**20, rows, st["auc"], dyn["auc"] - st["auc"])
        )
        return {"budget_bytes": dyn["table_bytes"], "dynamic": dyn, "static": st}


def quality_one(args, seed):
    """One seed of the quality comparison (data, hidden task draws and model init all follow the seed)."""
    run = _SeedRun(args, seed)
    out = {"oracle_auc": auc(run.eval_labels, run.eval_logits.ravel()), "seed": seed}
    reason = cv.OursVariant.unavailable_reason()
    if reason:
        bc.log("quality needs ours: %s" % reason)
        return {"results": out, "skipped": {"ours": reason}, "labels": {}}
    for rows in args.quality_budgets:
        out["rows_%d" % rows] = run.at_budget(rows)
    if args.quality_all_keys:
        out["all_keys"] = run.all_keys()
    return {"results": out, "skipped": {}, "labels": {}}


def quality_markdown(out):
    """The report: one row per (budget, seed), then one per budget over the seeds, the ceiling, the skipped."""
    r = out["results"]
    c = out["config"]
    lines = [
        "held-out AUC after one pass over %d batches of %d (Adagrad 0.05, dim %d); dynamic: eviction policy %s "
        "every %d steps; higher is better"
        % (c["quality_steps"], c["batch"], c["dim"], c.get("quality_policy"), c.get("quality_evict_every", 0)),
        "",
    ]
    if not r.get("runs"):
        lines += ["skipped %s: %s" % kv for kv in sorted(out["skipped"].items())]
        return "\n".join(lines)
    lines += _per_seed_rows(r)
    lines += _per_budget_rows(r)
    lines.append("")
    lines.append("true logits (ceiling), mean over seeds: %.4f" % r["oracle_auc_mean"])
    for k, v in sorted(out["skipped"].items()):
        lines.append("skipped %s: %s" % (k, v))
    return "\n".join(lines)


def _per_seed_rows(r):
    lines = [
        "| budget | seed | dynamic: keys at end | dynamic: peak bytes | dynamic AUC | static rows | static AUC "
        "| difference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in r["budgets"]:
        for x in r["runs"]:
            b = x[name]
            lines.append(
                "| %s (%.1f MiB) | %d | {:,} | %.1f MiB | %.4f | {:,} | %.4f | %+.4f |".format(
                    b["dynamic"]["table_size"], b["static"]["buckets"]
                )
                % (
                    name,
                    b["budget_bytes"] / 2**20,
                    x["seed"],
                    b["dynamic"].get("peak_bytes", b["dynamic"]["table_bytes"]) / 2**20,
                    b["dynamic"]["auc"],
                    b["static"]["auc"],
                    b["dynamic"]["auc"] - b["static"]["auc"],
                )
            )
    return lines


def _per_budget_rows(r):
    lines = [
        "",
        "| budget | dynamic AUC (mean) | static AUC (mean) | dynamic - static: mean | sd | peak over budget |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in r["budgets"].items():
        over = s["max_peak_over_budget"]
        lines.append(
            "| %s | %.4f | %.4f | %+.4f | %s | %s |"
            % (
                name,
                s["dynamic_auc_mean"],
                s["static_auc_mean"],
                s["diff_mean"],
                "%.4f" % s["diff_sd"] if s["diff_sd"] is not None else "-",
                (
                    "-"
                    if over is None
                    else (
                        "none (max %.1f MiB under)" % (-over / 2**20) if over <= 0 else "%.1f MiB OVER" % (over / 2**20)
                    )
                ),
            )
        )
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch_size", "--batch", dest="batch", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1 << 22, help="ids per field (Zipf draws mod vocab)")
    bc.add_session_args(p)
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--quick", action="store_true", help="60 batches of 1024, 8 eval batches")
    p.add_argument("--quality_steps", "--quality-steps", type=int, default=300, help="training batches (one pass)")
    p.add_argument("--eval_batches", "--eval-batches", type=int, default=16)
    p.add_argument(
        "--quality_seeds",
        "--quality-seeds",
        type=int,
        default=3,
        help="repeat with this many seeds (data, task and init) and report the mean difference",
    )
    p.add_argument(
        "--quality_budgets",
        "--quality-budgets",
        type=int,
        nargs="+",
        default=[1 << 20, 1 << 22],
        help="memory budgets, in static rows (bytes = rows * dim * 4 * 2)",
    )
    p.add_argument(
        "--quality_evict_every", "--quality-evict-every", type=int, default=2, help="dynamic model evicts every N steps"
    )
    p.add_argument(
        "--quality_policy",
        "--quality-policy",
        choices=["lru", "lfu"],
        default="lru",
        help="eviction policy, lru (steps_to_live) or lfu (min_frequency)",
    )
    p.add_argument(
        "--quality_all_keys",
        "--quality-all-keys",
        action="store_true",
        help="also the earlier comparison (dynamic keeps every key, static gets its bytes)",
    )
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.quality_steps, args.eval_batches = 1024, 60, 8

    info = bc.machine_info()
    t0 = time.perf_counter()
    out = dict(quality_main(args))
    config_keys = ("batch", "dim", "vocab", "intra_op", "inter_op", "seed", "quick", "quality_steps", "eval_batches")
    config_keys += ("quality_seeds", "quality_budgets", "quality_evict_every", "quality_policy", "quality_all_keys")
    out.update(
        {
            "benchmark": "ctr26_quality",
            "config": {k: getattr(args, k) for k in config_keys},
            "machine": info,
            "wall_s": time.perf_counter() - t0,
        }
    )
    return bc.finish(out, quality_markdown(out), args.json)


if __name__ == "__main__":
    main()
