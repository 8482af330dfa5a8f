#!/usr/bin/env python
"""Tiered storage (memory tier over an SSD tier): a table larger than its memory budget, trained side by side with
the same table held all in memory.

Sub-commands, each writes its JSON (``--json``) and prints a markdown table:

``train``: a ctr-style model whose table is ``--keys`` rows, several times the memory budget. Each run is a fresh
process (``train-child``): it preloads every key of the table (``insert`` in chunks of shuffled keys, rows drawn in
the graph), then trains on batches whose ids are Zipf(``--zipf``) draws over those keys, and prints its result as JSON.
Variants (``--variants``), run interleaved (A B C A B C ...) for ``--rounds`` rounds so that machine noise hits them
alike:

  memory           the whole table in memory (the reference)
  tiered           ``storage=tf_ext.TieredStorage(memory_bytes=--budget, path=..., disk_bytes=--disk_cap)``
  tiered_prefetch  tiered, and each step also promotes the next batch's ids (``emb.prefetch``, run after the step's
                   lookup, beside the dense layers and the apply)
  tfra             TFRA 0.7.2 in memory (``de.get_variable``, ``DynamicEmbeddingOptimizer``; opt-in)
  tfra_redis       TFRA 0.7.2 on its Redis table (``kv_creator=de.RedisTableCreator``), served by a private
                   in-memory redis-server this process starts on a free loopback port (opt-in; needs redis-server)

  Workload: ``--fields`` sparse features of ``--keys / --fields`` ids each (key = rank * fields + field), batch
  ``--batch``, dim ``--dim``, Adagrad(0.05) on the embedding and the MLP (``--hidden``) on the concatenated
  embeddings, sigmoid cross-entropy on labels of a logistic model over a fixed weight per key. The rank of each id is
  drawn from Zipf(a) over the field's ids (p(k) ~ k^-a, k = 1..V, by inverse CDF). The batches are drawn once per
  configuration (cached in ``--store_dir``) and kept in the graph as variables, read in turn, so every run trains on
  the same batches with no input work in the step.

  Each child reports steps/s over ``--steps`` timed steps after ``--warmup`` steps, per-step times, the peak RSS of the
  preload and of the training (VmHWM; the training peak after resetting it through /proc/self/clear_refs) beside the
  RSS of the process before the table holds rows ("the model": TF, graph, batches), the tier's counters over the timed
  steps (cold reads per step, hit rate = 1 - cold reads / keys looked up), the store's bytes on disk (``du``) and how
  much of them sat in the page cache (``fincore``), and the losses of the timed steps (compared with the in-memory
  run's, bit for bit).

  ``--cache``: ``warm`` (the store's pages stay in the page cache as the preload left them), ``dropped`` (the store's
  files are synced and evicted from the page cache with posix_fadvise(DONTNEED) once, before the warm-up steps), or
  ``uncached`` (evicted before every timed step too, so that every cold read of a timed step goes to the device; the
  eviction is outside the timed step). ``--drop_caches`` drops the whole page cache (root) instead of the store's
  files' pages.

``main-job``: the main job (``python -m tensorflow_ext.examples.ctr``) with and without ``--memory_budget``, same seed
and flags, interleaved for ``--rounds`` rounds: AUC, logloss and steps/s of each, and whether the final checkpoints
hold the same model bit for bit.

  python tools/bench_tiered.py train --json docs/bench_tiered.json
  python tools/bench_tiered.py train --quick          # small sizes, for development
  python tools/bench_tiered.py main-job --json docs/bench_tiered_main_job.json
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import bench_common as bc
from bench_common import np, tf

REPO_ROOT = bc.REPO_ROOT
VARIANTS = ("memory", "tiered", "tiered_prefetch", "tfra", "tfra_redis")
LABELS = {
    "memory": "all in memory",
    "tiered": "tiered (memory budget over the SSD tier)",
    "tiered_prefetch": "tiered + prefetch of the next batch's ids",
    "tfra": "TFRA 0.7.2, in memory (CuckooHashTable)",
    "tfra_redis": "TFRA 0.7.2, Redis table (a local redis-server holds every row)",
}
# TierStats order of the TfExtTableTierStats op.
STAT_NAMES = (
    "memory_keys",
    "memory_bytes",
    "disk_keys",
    "disk_bytes",
    "budget_keys",
    "lookups",
    "cold_reads",
    "demotions",
    "dropped",
    "errors",
)


# --------------------------------------------------------------------------- workload


def zipf_cdf(a, vocab):
    """float64 [vocab]: the cumulative distribution of Zipf(a) over ranks 0..vocab-1 (p(k) ~ (k + 1)^-a)."""
    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -float(a))
    return cdf / cdf[-1]


def make_batches(args, vocab, n):
    """int32 keys [n + 1, batch, fields] and float32 labels [n, batch, 1] of the training batches (the same for every
    run of one configuration: cached in --store_dir).

    Batch i: the rank of field f drawn from Zipf(a) over the field's vocab ranks (inverse CDF), key = rank * fields + f
    (the table hashes keys itself); labels from a logistic model over a fixed weight per key
    (sqrt(2) cos(2 pi frac(key * golden ratio)): mean 0, variance 1). Row n: the ids after the last batch (prefetch).
    """
    path = os.path.join(
        args.store_dir,
        "batches_a%g_v%d_f%d_b%d_n%d_s%d.npz" % (args.zipf, vocab, args.fields, args.batch, n, args.seed),
    )
    if os.path.exists(path):
        with np.load(path) as f:
            return f["keys"], f["labels"]
    rng = np.random.default_rng(args.seed)
    cdf = zipf_cdf(args.zipf, vocab)
    keys = np.empty((n + 1, args.batch, args.fields), np.int32)
    for i in range(n + 1):
        ranks = np.minimum(np.searchsorted(cdf, rng.random((args.batch, args.fields)), side="right"), vocab - 1)
        keys[i] = ranks * args.fields + np.arange(args.fields)
    frac = np.mod(keys[:n].astype(np.float64) * 0.6180339887498949, 1.0)
    w = np.sqrt(2.0) * np.cos(2.0 * np.pi * frac)
    logit = -1.2 + w.sum(axis=-1, keepdims=True) / np.sqrt(args.fields)
    labels = (rng.random(logit.shape) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    os.makedirs(args.store_dir, exist_ok=True)
    tmp = path + ".%d.tmp.npz" % os.getpid()
    np.savez(tmp, keys=keys, labels=labels)
    os.replace(tmp, path)
    return keys, labels


def batch_ops(keys, labels):
    """The batches as variables of the graph, read in turn: a step's ids, labels and the next step's ids come from
    the same position of one counter (no feed, no input pipeline work in the step).

    Returns:
      (initializer ops and their feeds, ids [batch, fields] int64, labels [batch, 1], next ids [batch, fields]).
    """
    n = labels.shape[0]
    kp = tf.compat.v1.placeholder(tf.int32, keys.shape)
    lp = tf.compat.v1.placeholder(tf.float32, labels.shape)
    kv = tf.Variable(kp, trainable=False, collections=[], name="batches_keys")
    lv = tf.Variable(lp, trainable=False, collections=[], name="batches_labels")
    counter = tf.Variable(tf.constant(0, tf.int64), trainable=False, collections=[], name="batch_counter")
    i = tf.math.floormod(counter.assign_add(1, read_value=True) - 1, n)
    ids = tf.cast(tf.gather(kv, i), tf.int64)
    next_ids = tf.cast(tf.gather(kv, i + 1), tf.int64)
    y = tf.gather(lv, i)
    init = ([kv.initializer, lv.initializer, counter.initializer], {kp: keys, lp: labels})
    return init, ids, y, next_ids


def distinct_ids_per_batch(keys):
    """The mean number of distinct ids in a batch (over up to 50 batches)."""
    return float(np.mean([len(np.unique(k)) for k in keys[:50]]))


# --------------------------------------------------------------------------- process and store measurements


def proc_status(field):
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss():
    """Resets VmHWM to the current RSS (Linux >= 4.0: '5' to /proc/self/clear_refs). False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def store_files(path):
    out = []
    for d, _, names in os.walk(path):
        out.extend(os.path.join(d, n) for n in names)
    return out


def du_bytes(path):
    """Bytes the files under path take on disk (allocated blocks, as `du` counts them)."""
    total = 0
    for p in store_files(path):
        try:
            total += os.lstat(p).st_blocks * 512
        except FileNotFoundError:  # a file the store deleted meanwhile
            pass
    return total


def cached_bytes(path):
    """Bytes of the files under path that sit in the page cache (util-linux fincore), or None without fincore."""
    files = store_files(path)
    if not files or shutil.which("fincore") is None:
        return None if files else 0
    p = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES"] + files, capture_output=True, text=True
    )
    return sum(int(x) for x in p.stdout.split() if x.isdigit())


def evict_from_page_cache(path, drop_all=False):
    """Writes back and evicts the store's files from the page cache (posix_fadvise DONTNEED), or all of it."""
    if drop_all:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return
    for p in store_files(path):
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fdatasync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def mem_available_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


# --------------------------------------------------------------------------- one run (child process)


def _tier_ops(emb, tiered):
    """(int64 [10] op of the tier's counters in STAT_NAMES order, settle op or None)."""
    try:
        stats = emb.tier_stats()
    except AttributeError:  # a build without tiered storage: the in-memory run needs no counters
        if tiered:
            raise
        return tf.zeros([len(STAT_NAMES)], tf.int64), None
    return tf.stack([stats[k] for k in STAT_NAMES]), (emb.tier_settle() if tiered else None)


class RedisServer(object):
    """A private redis-server on a free loopback port, in-memory only (no snapshots, no AOF), for TFRA's Redis table."""

    def __init__(self, workdir):
        import socket

        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("no redis-server on PATH (Debian: apt-get install -y redis-server)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        os.makedirs(workdir, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--dir", workdir, "--logfile", os.path.join(workdir, "redis.log")],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while not self._ping():  # the server answers PING once it accepts connections
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("redis-server did not start (see %s/redis.log)" % workdir)
            time.sleep(0.05)
        self.config = os.path.join(workdir, "redis_config.json")
        with open(self.config, "w") as f:
            json.dump({"redis_connection_mode": 2, "redis_host_ip": ["127.0.0.1"], "redis_host_port": [self.port]}, f)

    def _ping(self):
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                return c.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def status(self, field):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        raise KeyError(field)

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def _build_embedding(variant, args, ids, next_ids, store, redis):
    """The variant's table and its ops. Returns a dict: rows [batch, fields, dim], minimize(opt, loss) -> op,
    preload(keys placeholder) -> op, size, memory_bytes (None where the backend has no such op), prefetch (or None),
    stats ([10] in STAT_NAMES order), settle (or None)."""
    init = tf.compat.v1.random_normal_initializer(0.0, 0.01, seed=11)
    step = tf.compat.v1.train.get_or_create_global_step()
    if variant.startswith("tfra"):
        de, reason, _ = bc.import_tfra()
        if de is None:
            raise RuntimeError(reason)
        kv = {}
        if redis is not None:
            kv["kv_creator"] = de.RedisTableCreator(config=de.RedisTableConfig(redis_config_abs_dir=redis.config))
        var = de.get_variable("emb", key_dtype=tf.int64, value_dtype=tf.float32, dim=args.dim, initializer=init, **kv)
        uniq, idx = tf.unique(tf.reshape(ids, [-1]))
        rows = tf.reshape(tf.gather(de.embedding_lookup(var, uniq, name="lookup"), idx), [-1, args.fields, args.dim])
        return {
            "rows": rows,
            "minimize": lambda opt, loss: de.DynamicEmbeddingOptimizer(opt).minimize(loss, global_step=step),
            "preload": lambda pk: var.upsert(pk, tf.random.normal([tf.size(pk), args.dim], stddev=0.01, seed=5)),
            "size": var.size(),
            "memory_bytes": None,
            "prefetch": None,
            "stats": tf.zeros([len(STAT_NAMES)], tf.int64),
            "settle": None,
            "probe": lambda keys: var.lookup(keys),
        }
    tf_ext, reason = bc.import_ours_embedding()
    if tf_ext is None:
        raise RuntimeError(reason)
    tiered = variant != "memory"
    options = {}
    if tiered:
        options["storage"] = tf_ext.TieredStorage(
            memory_bytes=args.budget, path=store, disk_bytes=args.disk_cap or None, policy=args.policy
        )
    emb = tf_ext.get_dynamic_embedding("emb", dim=args.dim, initializer=init, **options)
    rows = tf_ext.embedding_lookup(emb, ids)  # [batch, fields, dim]
    prefetch = None
    if variant == "tiered_prefetch":
        # After this step's lookup (which promotes this batch), beside the dense layers' work and the apply.
        with tf.control_dependencies([rows]):
            prefetch = emb.prefetch(next_ids)
    stats, settle = _tier_ops(emb, tiered)
    return {
        "rows": rows,
        "minimize": lambda opt, loss: opt.minimize(loss, global_step=step),
        # Slots of new keys get their initial values (Adagrad's accumulators), as the first training lookup gives.
        "preload": lambda pk: emb.insert(pk, tf.random.normal([tf.size(pk), args.dim], stddev=0.01, seed=5)),
        "size": emb.size(),
        "memory_bytes": emb.memory_bytes(),
        "prefetch": prefetch,
        "stats": stats,
        "settle": settle,
        "probe": lambda keys: tf_ext.embedding_lookup(emb, keys, is_training=False),
    }


def train_child(args):
    """One variant in this (fresh) process: prints ``RESULT <json>``."""
    t_start = time.perf_counter()
    variant = args.variant
    tiered = variant.startswith("tiered")
    vocab = args.keys // args.fields
    n_keys = vocab * args.fields
    batches, batch_labels = make_batches(args, vocab, args.warmup + args.steps)
    distinct = distinct_ids_per_batch(batches)

    store = os.path.join(args.store_dir, variant)
    if os.path.exists(store):
        shutil.rmtree(store)
    redis = RedisServer(store) if variant == "tfra_redis" else None
    tf.compat.v1.set_random_seed(args.seed)
    (it_init, it_feed), ids, y, next_ids = batch_ops(batches, batch_labels)
    e = _build_embedding(variant, args, ids, next_ids, store, redis)
    h = tf.reshape(e["rows"], [-1, args.fields * args.dim])
    for i, units in enumerate(args.hidden):
        h = tf.compat.v1.layers.dense(
            h,
            units,
            activation=tf.nn.relu,
            name="fc%d" % i,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=args.seed + i),
        )
    logits = tf.compat.v1.layers.dense(
        h, 1, name="out", kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=args.seed + 9)
    )
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
    train = e["minimize"](tf.compat.v1.train.AdagradOptimizer(0.05), loss)
    if e["prefetch"] is not None:
        train = tf.group(train, e["prefetch"])
    # Preload: every key once, shuffled, rows drawn in the graph.
    pk = tf.compat.v1.placeholder(tf.int64, [None])
    preload = e["preload"](pk)
    # The state compared between runs: the rows of the first timed batch's keys after training.
    probe = e["probe"](tf.constant(np.arange(0, 4096 * 97, 97, dtype=np.int64)))  # hot and cold keys
    size_op, mem_op, stats_op, settle_op = e["size"], e["memory_bytes"], e["stats"], e["settle"]

    with tf.control_dependencies(it_init):  # the batches first: other initializers may read them (and their feed)
        init = tf.group(
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
            tf.compat.v1.tables_initializer(),
        )
    sess = tf.compat.v1.Session(config=bc.session_config(args.intra_op, args.inter_op))
    sess.run(init, it_feed)
    del batches, batch_labels, it_feed
    sess.run(size_op)  # creates the table (and the store)
    bc.trim_heap()
    rss_model = proc_status("VmRSS")
    bc.log("%s: model %.0f MiB RSS, generating keys" % (variant, rss_model / 2.0**20))

    all_keys = np.arange(n_keys, dtype=np.int64)
    np.random.default_rng(args.seed + 1).shuffle(all_keys)
    # One chunk must fit the memory budget (a batch's rows are in memory at once): a quarter of what it holds, at
    # ~300 B/key. The same chunks in every variant: the rows are drawn per chunk.
    chunk = max(1, min(args.chunk, args.budget // 1200)) if args.chunk > 0 else args.budget // 1200
    t0 = time.perf_counter()
    for s in range(0, n_keys, chunk):
        sess.run(preload, {pk: all_keys[s : s + chunk]})
    del all_keys
    if settle_op is not None:
        sess.run(settle_op)
    preload_s = time.perf_counter() - t0
    bc.trim_heap()
    preload_peak = proc_status("VmHWM")
    size = int(sess.run(size_op))
    stats_preload = sess.run(stats_op)
    mem_preload = int(sess.run(mem_op)) if mem_op is not None else None
    bc.log("%s: preloaded %d keys in %.1fs, peak RSS %.0f MiB" % (variant, size, preload_s, preload_peak / 2.0**20))

    if tiered and args.cache != "warm":
        evict_from_page_cache(store, args.drop_caches)
    peak_reset = reset_peak_rss()
    losses, times, evict_s = [], [], 0.0
    for _ in range(args.warmup):
        sess.run(train)
    s0 = sess.run(stats_op)
    cached0 = cached_bytes(store) if tiered else None
    load0 = os.getloadavg()
    for _ in range(args.steps):
        if tiered and args.cache == "uncached":
            t1 = time.perf_counter()
            evict_from_page_cache(store)
            evict_s += time.perf_counter() - t1
        t1 = time.perf_counter()
        _, l = sess.run([train, loss])
        times.append(time.perf_counter() - t1)
        losses.append(float(l))
    load1 = os.getloadavg()
    s1 = sess.run(stats_op)
    cached1 = cached_bytes(store) if tiered else None
    train_peak = proc_status("VmHWM")
    if settle_op is not None:
        sess.run(settle_op)
    s2 = sess.run(stats_op)
    probe_rows = sess.run(probe)
    d = {k: int(s1[i] - s0[i]) for i, k in enumerate(STAT_NAMES)}
    result = {
        "variant": variant,
        "steps": args.steps,
        "steps_per_s": args.steps / sum(times),
        "step_ms": bc.summary_ms(times),
        "step_times_s": times,
        "losses": losses,
        "loss_hex": [float(x).hex() for x in losses],
        "probe_rows_sum": float(np.asarray(probe_rows, np.float64).sum()),
        "probe_rows_hash": _array_hash(probe_rows),
        "size": size,
        "size_end": int(sess.run(size_op)),
        "memory_tier_bytes": int(sess.run(mem_op)) if mem_op is not None else None,
        "distinct_keys_per_step": distinct,
        "ids_per_step": args.batch * args.fields,
        "preload_s": preload_s,
        "preload_chunk": chunk,
        "memory_tier_bytes_preload": mem_preload,
        "stats_preload": {k: int(v) for k, v in zip(STAT_NAMES, stats_preload)},
        "rss_model_bytes": rss_model,
        "rss_preload_peak_bytes": preload_peak,
        "rss_train_peak_bytes": train_peak if peak_reset else None,
        "loadavg_timed": [load0, load1],
        "uncached_evict_s": evict_s,
    }
    if tiered:
        result.update(
            stats_timed={k: int(v) for k, v in zip(STAT_NAMES, s1)},
            stats_end={k: int(v) for k, v in zip(STAT_NAMES, s2)},
            cold_reads_per_step=d["cold_reads"] / float(args.steps),
            promoted_per_step=d["lookups"] / float(args.steps),
            demotions_per_step=d["demotions"] / float(args.steps),
            hit_rate=(1.0 - d["cold_reads"] / float(d["lookups"])) if d["lookups"] else None,
            dropped=int(s2[STAT_NAMES.index("dropped")]),
            errors=int(s2[STAT_NAMES.index("errors")]),
            du_bytes=du_bytes(store),
            store_cached_bytes=[cached0, cached1],
        )
    if redis is not None:
        result.update(redis_rss_bytes=redis.status("VmRSS"), redis_peak_rss_bytes=redis.status("VmHWM"))
    result["wall_s"] = time.perf_counter() - t_start
    print("RESULT " + json.dumps(result), flush=True)
    sess.close()
    if redis is not None:
        # TFRA's Redis table talks to the server when it is destroyed at exit: with the server gone it crashes, so
        # this process ends here, without running destructors, once the server is stopped.
        redis.close()
        if not args.keep_store:
            shutil.rmtree(store, ignore_errors=True)
        sys.stdout.flush()
        os._exit(0)
    if not args.keep_store:
        shutil.rmtree(store, ignore_errors=True)


def _array_hash(a):
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


# --------------------------------------------------------------------------- driver


def _run_child(argv, log_path=None):
    """Runs this script with argv in a fresh process: (its RESULT dict, None) or (None, why it failed)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__)] + argv
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if log_path:
        with open(log_path, "a") as f:
            f.write("$ %s\n%s\n%s\n" % (" ".join(cmd), p.stdout, p.stderr))
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            r["process_wall_s"] = time.perf_counter() - t0
            return r, None
    err = [l for l in p.stderr.splitlines() if l.strip() and "WARNING" not in l and "deprecat" not in l.lower()]
    errors = [l for l in err if "Error: " in l and "Graph execution error" not in l]
    return None, "exit %d: %s" % (p.returncode, (errors or err or ["no output"])[-1].strip())


def _child_argv(args, variant):
    argv = ["train-child", variant]
    for flag in (
        "keys",
        "budget",
        "disk_cap",
        "policy",
        "dim",
        "fields",
        "batch",
        "zipf",
        "steps",
        "warmup",
        "chunk",
        "seed",
        "store_dir",
        "cache",
        "intra_op",
        "inter_op",
    ):
        argv += ["--" + flag, str(getattr(args, flag))]
    argv += ["--hidden"] + [str(h) for h in args.hidden]
    if args.drop_caches:
        argv.append("--drop_caches")
    return argv


def train_main(args):
    avail = mem_available_bytes()
    results, failed = {v: [] for v in args.variants}, {}
    for r in range(args.rounds):
        for v in args.variants:
            bc.log("round %d: %s ..." % (r, v))
            res, err = _run_child(_child_argv(args, v), args.log)
            if res is None:
                bc.log("  %s FAILED: %s" % (v, err))
                failed.setdefault(v, []).append(err)
                continue
            res["round"] = r
            results[v].append(res)
            bc.log("  " + _one_line(res, args))
    return {
        "results": results,
        "failed": failed,
        "labels": LABELS,
        "mem_available_at_start": avail,
        "comparisons": _train_comparisons(results),
    }


def _one_line(res, args):
    s = (
        "%s: %.2f steps/s (median step %.0f ms), preload %.0fs, RSS model %.0f MiB, peak preload %.0f / train %s MiB"
        % (
            res["variant"],
            res["steps_per_s"],
            res["step_ms"]["median_ms"],
            res["preload_s"],
            res["rss_model_bytes"] / 2.0**20,
            res["rss_preload_peak_bytes"] / 2.0**20,
            bc.fmt((res["rss_train_peak_bytes"] or float("nan")) / 2.0**20, 0),
        )
    )
    if "hit_rate" in res:
        s += ", hit rate %.4f, cold reads %.0f/step, demotions %.0f/step, du %.0f MiB, dropped %d" % (
            res["hit_rate"] if res["hit_rate"] is not None else float("nan"),
            res["cold_reads_per_step"],
            res["demotions_per_step"],
            res["du_bytes"] / 2.0**20,
            res["dropped"],
        )
    return s + ", load %.1f-%.1f" % (res["loadavg_timed"][0][0], res["loadavg_timed"][1][0])


def _train_comparisons(results):
    """Per round, each tiered variant's steps/s over the same round's in-memory run; and whether losses match."""
    mem = {r["round"]: r for r in results.get("memory", [])}
    out = {}
    for v, runs in results.items():
        if v == "memory":
            continue
        ratios, same_losses, same_rows = [], [], []
        for r in runs:
            m = mem.get(r["round"])
            if m is None:
                continue
            ratios.append(r["steps_per_s"] / m["steps_per_s"])
            same_losses.append(r["loss_hex"] == m["loss_hex"])
            same_rows.append(r["probe_rows_hash"] == m["probe_rows_hash"])
        out[v] = {"ratio_vs_memory": ratios, "losses_identical": same_losses, "probe_rows_identical": same_rows}
    return out


def _range(xs, nd=2, scale=1.0):
    xs = [x * scale for x in xs if x is not None]
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return bc.fmt(lo, nd) if bc.fmt(lo, nd) == bc.fmt(hi, nd) else "%s-%s" % (bc.fmt(lo, nd), bc.fmt(hi, nd))


def train_markdown(out):
    c, res, comp = out["config"], out["results"], out["comparisons"]
    mib = 1.0 / 2**20
    lines = [
        "%d keys (%d fields x %d ids), dim %d + Adagrad, batch %d, Zipf(%g), memory budget %.0f MiB, disk cap %s, "
        "policy %s, page cache %s; %d timed steps after %d warm-up; %d round(s), ranges over rounds"
        % (
            c["keys"],
            c["fields"],
            c["keys"] // c["fields"],
            c["dim"],
            c["batch"],
            c["zipf"],
            c["budget"] * mib,
            ("%.0f MiB" % (c["disk_cap"] * mib)) if c["disk_cap"] else "none",
            c["policy"],
            c["cache"],
            c["steps"],
            c["warmup"],
            c["rounds"],
        ),
        "",
        "| run | steps/s | vs in memory | median step (ms) | hit rate | cold reads/step | demotions/step "
        "| losses = in memory | load (start .. end) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    ran = [v for v in c["variants"] if res.get(v)]
    for v in c["variants"]:
        runs = res.get(v, [])
        if not runs:
            lines.append("| %s | failed: %s |" % (LABELS[v], "; ".join(out["failed"].get(v, ["not run"]))))
            continue
        t = "hit_rate" in runs[0]
        cv = comp.get(v, {})
        same = cv.get("losses_identical", [])
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                LABELS[v],
                _range([r["steps_per_s"] for r in runs]),
                (_range(cv.get("ratio_vs_memory", [])) + "x") if v != "memory" else "1",
                _range([r["step_ms"]["median_ms"] for r in runs], 1),
                _range([r["hit_rate"] for r in runs], 4) if t else "-",
                _range([r["cold_reads_per_step"] for r in runs], 0) if t else "-",
                _range([r["demotions_per_step"] for r in runs], 0) if t else "-",
                ("-" if v == "memory" else ("yes" if same and all(same) else "no (%d of %d)" % (sum(same), len(same)))),
                _range([r["loadavg_timed"][0][0] for r in runs], 1)
                + " .. "
                + _range([r["loadavg_timed"][1][0] for r in runs], 1),
            )
        )
    lines += [
        "",
        "| run | model RSS (MiB) | peak RSS, preload (MiB) | peak RSS, training (MiB) | training peak - model (MiB) "
        "| memory tier (MiB) | store on disk (MiB) | store in page cache (MiB) | other process (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for v in ran:
        runs = res[v]
        t = "hit_rate" in runs[0]
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                LABELS[v],
                _range([r["rss_model_bytes"] for r in runs], 0, mib),
                _range([r["rss_preload_peak_bytes"] for r in runs], 0, mib),
                _range([r["rss_train_peak_bytes"] for r in runs], 0, mib),
                _range(
                    [
                        (r["rss_train_peak_bytes"] - r["rss_model_bytes"]) if r["rss_train_peak_bytes"] else None
                        for r in runs
                    ],
                    0,
                    mib,
                ),
                _range([r["memory_tier_bytes"] for r in runs], 0, mib),
                _range([r["du_bytes"] for r in runs], 0, mib) if t else "-",
                _range([r["store_cached_bytes"][1] for r in runs], 0, mib) if t else "-",
                (
                    ("redis-server peak RSS " + _range([r["redis_peak_rss_bytes"] for r in runs], 0, mib))
                    if "redis_peak_rss_bytes" in runs[0]
                    else "-"
                ),
            )
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main job


def _main_job(flags, log_path):
    """Runs the main job with flags in a fresh process: its JSON summary (the last stdout line)."""
    cmd = [sys.executable, "-m", "tensorflow_ext.examples.ctr", "--quiet"] + flags
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        log.write("$ %s\n" % " ".join(cmd))
        log.flush()
        p = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d), see %s" % (" ".join(cmd), p.returncode, log_path))
    summary = json.loads([l for l in p.stdout.splitlines() if l.strip()][-1])
    summary["bench_wall_s"] = time.perf_counter() - t0
    return summary


def compare_checkpoints(dir_a, dir_b):
    """Whether the latest checkpoints of two model directories hold the same model, bit for bit: every dense
    variable, and every table's rows, slots, versions and frequencies matched by key (a table's export order is
    unspecified). Returns (identical, what differs first or None, tensors compared)."""
    ra, rb = tf.train.load_checkpoint(dir_a), tf.train.load_checkpoint(dir_b)
    ma, mb = ra.get_variable_to_shape_map(), rb.get_variable_to_shape_map()
    if set(ma) != set(mb):
        return False, "different tensors: %s" % sorted(set(ma) ^ set(mb))[:5], 0
    tables = {n[: -len("-keys")] for n in ma if n.endswith("-keys")}
    compared = 0
    for name in sorted(ma):
        prefix = name.rsplit("-", 1)[0]
        if prefix in tables:
            continue
        a, b = ra.get_tensor(name), rb.get_tensor(name)
        if np.asarray(a).dtype == object or np.asarray(a).shape == ():
            same = a == b
        else:
            same = np.asarray(a).tobytes() == np.asarray(b).tobytes() and np.shape(a) == np.shape(b)
        if not same:
            return False, name, compared
        compared += 1
    for prefix in sorted(tables):
        ka, kb = ra.get_tensor(prefix + "-keys"), rb.get_tensor(prefix + "-keys")
        oa, ob = np.argsort(ka, kind="stable"), np.argsort(kb, kind="stable")
        if ka[oa].tobytes() != kb[ob].tobytes():
            return False, prefix + "-keys", compared
        for field in ("values", "slots", "versions", "freqs"):
            if prefix + "-" + field not in ma:
                continue
            a, b = ra.get_tensor(prefix + "-" + field), rb.get_tensor(prefix + "-" + field)
            if a[oa].tobytes() != b[ob].tobytes():
                return False, prefix + "-" + field, compared
            compared += 1
    return True, None, compared


def main_job_main(args):
    """The main job in memory and with --memory_budget (same seed and flags), interleaved over rounds."""
    os.makedirs(args.work_dir, exist_ok=True)
    common = ["--seed", str(args.seed), "--no_export", "--fresh"] + args.job_flags
    if args.steps is not None:
        common += ["--steps", str(args.steps)]
    runs = {
        "memory": [],
        "tiered": ["--memory_budget", str(args.memory_budget), "--tier_path", os.path.join(args.work_dir, "tiers")],
    }
    if args.disk_budget:
        runs["tiered"] += ["--disk_budget", str(args.disk_budget)]
    if args.no_prefetch_run:
        # The job prefetches the next batch's ids by default; this run shows what that buys.
        runs["tiered_no_prefetch"] = runs["tiered"] + ["--no_prefetch"]
    results, failed = {k: [] for k in runs}, {}
    for r in range(args.rounds):
        for name, flags in runs.items():
            model_dir = os.path.join(args.work_dir, "model_%s" % name)
            log_path = os.path.join(args.work_dir, "%s_%d.log" % (name, r))
            load0 = os.getloadavg()
            try:
                summary = _main_job(common + ["--model_dir", model_dir] + flags, log_path)
            except RuntimeError as e:
                bc.log("  %s: %s" % (name, e))
                failed.setdefault(name, []).append(str(e))
                continue
            summary.update(round=r, loadavg=[load0, os.getloadavg()])
            if name != "memory" and any(m["round"] == r for m in results["memory"]):
                same, first, n = compare_checkpoints(
                    os.path.join(args.work_dir, "model_memory"), os.path.join(args.work_dir, "model_%s" % name)
                )
                summary["checkpoint_vs_memory"] = {"identical": same, "first_difference": first, "tensors": n}
                bc.log(
                    "  checkpoints identical to the in-memory run's: %s (%d tensors)%s"
                    % (same, n, "" if same else ", first difference: %s" % first)
                )
            results[name].append(summary)
            bc.log(
                "  round %d %s: AUC %r, logloss %r, %.2f steps/s, %s keys, wall %.0fs"
                % (
                    r,
                    name,
                    summary["auc"],
                    summary["logloss"],
                    summary["steps_per_sec"] or 0,
                    summary["total_keys"],
                    summary["bench_wall_s"],
                )
            )
    return {
        "results": results,
        "failed": failed,
        "flags": {k: common + v for k, v in runs.items()},
        "identical_auc": [
            a["auc"] == b["auc"] and a["logloss"] == b["logloss"] for a, b in zip(results["memory"], results["tiered"])
        ],
    }


def main_job_markdown(out):
    lines = [
        "| run | AUC | logloss | steps/s | table keys | memory tier (MiB) | keys on disk | hit rate | cold reads/step "
        "| wall (s) | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, runs in out["results"].items():
        for r in runs:
            t = r.get("tiers") or {}
            lines.append(
                "| %s (round %d) | %.4f | %.4f | %s | %d | %s | %s | %s | %s | %.0f | %.1f .. %.1f |"
                % (
                    name,
                    r["round"],
                    r["auc"],
                    r["logloss"],
                    bc.fmt(r["steps_per_sec"], 2),
                    r["total_keys"],
                    bc.fmt(t.get("memory_bytes", r["table_bytes"]) / 2.0**20, 1),
                    t.get("disk_keys", "-"),
                    bc.fmt(t.get("hit_rate"), 4),
                    bc.fmt(t.get("cold_reads_per_step"), 0),
                    r["bench_wall_s"],
                    r["loadavg"][0][0],
                    r["loadavg"][1][0],
                )
            )
    lines.append("")
    lines.append("AUC and logloss identical, per round: %s" % out["identical_auc"])
    for name, runs in out["results"].items():
        if name != "memory":
            lines.append(
                "%s: final checkpoint identical to the in-memory run's (dense variables; tables' rows, slots, "
                "versions, frequencies by key), per round: %s"
                % (name, [r.get("checkpoint_vs_memory", {}).get("identical") for r in runs])
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def _add_train_args(p):
    p.add_argument("--keys", type=int, default=20_000_000, help="keys preloaded into the table (all fields)")
    p.add_argument("--budget", type=int, default=1536 << 20, help="memory budget of the tier (bytes)")
    p.add_argument("--disk_cap", type=int, default=10 << 30, help="disk cap of the tier (bytes; 0: none)")
    p.add_argument("--policy", choices=("lru", "lfu"), default="lru")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 64])
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument(
        "--chunk", type=int, default=65536, help="keys per preload insert (at most a quarter of the budget's keys)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--store_dir", default=os.path.join(tempfile.gettempdir(), "tf_ext_bench_tiered"))
    p.add_argument("--cache", choices=("warm", "dropped", "uncached"), default="warm")
    p.add_argument("--drop_caches", action="store_true", help="drop the whole page cache (root) instead")
    p.add_argument("--intra_op", type=int, default=2)
    p.add_argument("--inter_op", type=int, default=2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="the ctr-style run, variants side by side in fresh processes")
    _add_train_args(t)
    t.add_argument("--variants", nargs="+", choices=VARIANTS, default=["memory", "tiered", "tiered_prefetch"])
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--quick", action="store_true", help="small sizes (development)")
    t.add_argument("--json", default=None)
    t.add_argument("--log", default=None, help="append every child's output to this file")
    c = sub.add_parser("train-child")
    c.add_argument("variant", choices=VARIANTS)
    _add_train_args(c)
    c.add_argument("--keep_store", action="store_true")
    m = sub.add_parser("main-job", help="the main job with and without --memory_budget")
    m.add_argument("--memory_budget", default="64MiB", help="the tiered run's --memory_budget")
    m.add_argument("--disk_budget", default=None, help="the tiered run's --disk_budget (default: none)")
    m.add_argument("--steps", type=int, default=None, help="the job's --steps (default: its own)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--rounds", type=int, default=2)
    m.add_argument("--no_prefetch_run", action="store_true", help="also a tiered run with --no_prefetch")
    m.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "tf_ext_bench_tiered_job"))
    m.add_argument("--job_flags", nargs=argparse.REMAINDER, default=[], help="more flags of the job (last)")
    m.add_argument("--json", default=None)
    args = p.parse_args(argv)

    if args.cmd == "train-child":
        train_child(args)
        return
    t0 = time.perf_counter()
    machine = bc.machine_info()
    if args.cmd == "train":
        if args.quick:
            args.keys, args.budget, args.steps, args.warmup, args.rounds = 400_000, 32 << 20, 20, 5, 1
        out = train_main(args)
        config = {k: v for k, v in vars(args).items() if k not in ("cmd", "json", "log")}
        out.update(config=config, machine=machine, wall_s=time.perf_counter() - t0)
        bc.finish(out, train_markdown(out), args.json)
    elif args.cmd == "main-job":
        out = main_job_main(args)
        config = {k: v for k, v in vars(args).items() if k not in ("cmd", "json")}
        out.update(config=config, machine=machine, wall_s=time.perf_counter() - t0)
        bc.finish(out, main_job_markdown(out), args.json)


if __name__ == "__main__":
    main()
