"""Live serving benchmark: serving updates applied to a served model at the main job's scale, in fresh processes.

    python tools/bench_serving_updates.py [--json docs/bench_serving_updates.json]
    python tools/bench_serving_updates.py --quick

The model is the main job's (``python -m tensorflow_ext.examples.ctr`` at its defaults: DeepFM, 26 tables of dim 8 +
a first-order weight, MLP 256-128, Adagrad) with its tables at their sizes after the job's default 3,000 steps
(2,449,245 keys in all). Every phase runs in processes of its own (this script with a hidden --child flag):

  prepare  builds the job's model_fn in a training graph, fills the 26 tables with random rows to the job's key
           counts, checkpoints at global step 1000 and exports the checkpoint twice: an updatable frozen SavedModel
           (``freeze_for_serving(live_model="ctr")``) and a lean plain one. Then, as a trainer restarted from that
           checkpoint, it writes the updates with ``tf_ext.serving.ServingUpdateWriter``: each changes
           ``--changed_keys`` rows (a tenth of them new keys; drawn from the tables in proportion to their sizes),
           removes ``--removed_keys`` keys, advances the global step and writes; the seconds each write takes are
           the trainer's part of freshness. The updates wait in a staging directory.
  serve    loads the live export with ``tf_ext.serving.follow()`` (``--poll_secs``); ``--clients`` threads send
           requests of ``--batch`` examples (ids drawn from the tables' keys) for ``--seconds``, while the driver
           publishes a staged update into the follower's directory every ``--update_every`` seconds (a rename, as
           the writer publishes its updates) or none at all. The process records every request's latency, its RSS
           every 20 ms and when each version became visible. Variants: ``idle`` (no clients: freshness alone),
           ``steady`` (clients, no updates) and ``updates`` (clients and updates), interleaved over ``--rounds``.
  reload   loads the live export, then loads it again into a second session (a model swapped by a full reload, the
           way to refresh a model without live updates) and closes the first; its RSS sampled throughout.
  apply    applies one staged update to a freshly loaded export, timed: the live export's apply signature
           (``tf_ext.serving.apply_update``, frozen live tables) or, for the lean export's plain (mutable) tables,
           the same update's tensors read with RestoreV2 and written in place by table ops (remove + insert per
           shard, assign per dense variable) in one session run. Interleaved over ``--rounds``.

Freshness = the trainer's write + (visible in the follower - published). Serving processes run with
``TF_ENABLE_ONEDNN_OPTS=0`` (docs/serving.md: TensorFlow's default allocator keeps the restore's temporaries). Each
result records the load average at its start and end.
"""

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_NAME = "ctr"
START_STEP = 1000
# The main job's tables after its default 3,000 steps (docs/ctr_example.md, "Sample output"): keys per field.
MAIN_JOB_KEYS = {
    "C1": 1460, "C2": 583, "C3": 416015, "C4": 365651, "C5": 305, "C6": 24, "C7": 12517, "C8": 633, "C9": 3,
    "C10": 87103, "C11": 5683, "C12": 416131, "C13": 3194, "C14": 27, "C15": 14992, "C16": 414982, "C17": 10,
    "C18": 5652, "C19": 2173, "C20": 4, "C21": 416040, "C22": 18, "C23": 15, "C24": 185235, "C25": 105,
    "C26": 100690,
}  # fmt: skip
# The driver's flags that size what the children do (passed on to each of them).
_SIZE_FLAGS = ("scale", "changed_keys", "removed_keys", "num_updates", "batch", "steady_secs")
# How often the serving process samples its RSS (a sampler thread; 20 ms is a small fraction of an apply).
_RSS_EVERY_SECS = 0.02


def _rss(field="VmRSS"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _load():
    return list(os.getloadavg())


def _import_tf():
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.enable_resource_variables()
    tf.get_logger().setLevel("ERROR")
    return tf, tf_ext


def _table_sizes(scale):
    return {k: max(1, int(round(n * scale))) for k, n in MAIN_JOB_KEYS.items()}


# --------------------------------------------------------------------------- prepare (a child process)


def _params():
    """The main job's model_fn params at its defaults (flags.parse_args([]) and train._model_params)."""
    return dict(
        model="deepfm", dim=8, hidden_units=[256, 128], optimizer="adagrad", learning_rate=0.5, num_shards=1,
        string_ids=False, init_stddev=0.05, log_every=100, batch_size=1024, progress=False,
    )  # fmt: skip


def _features(tf):
    from tensorflow_ext.examples import synthetic  # pylint: disable=import-outside-toplevel

    features = {k: tf.compat.v1.placeholder(tf.int64, [None], name=k) for k in synthetic.CATEGORICAL_KEYS}
    features.update({k: tf.compat.v1.placeholder(tf.float32, [None], name=k) for k in synthetic.DENSE_KEYS})
    return features


def _field_embedding(tf_ext, key):
    (emb,) = [e for e in tf_ext.embedding.get_dynamic_embeddings() if "/%s_emb/" % key in e.name + "/"]
    return emb


def _prepare(args):
    """Checkpoint, the two exports, then the staged updates (see the module docstring)."""
    tf, tf_ext = _import_tf()
    from tensorflow_ext.examples.ctr import model  # pylint: disable=import-outside-toplevel

    work = args.work
    sizes = _table_sizes(args.scale)
    ckpt = os.path.join(work, "ckpt", "model")
    rng = np.random.default_rng(0)
    out = dict(keys=sum(sizes.values()), tables=len(sizes), load_start=_load())
    # 1. The model at the main job's size, checkpointed at START_STEP.
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        model.model_fn(_features(tf), labels, tf.estimator.ModeKeys.TRAIN, _params())
        keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
        rows_ph = tf.compat.v1.placeholder(tf.float32, [None, 9])
        inserts = {k: _field_embedding(tf_ext, k).insert(keys_ph, rows_ph) for k in sizes}
        sess.run(tf.compat.v1.global_variables_initializer())
        for key, n in sizes.items():
            for start in range(0, n, 1 << 20):
                k = np.arange(start, min(n, start + (1 << 20)), dtype=np.int64)
                sess.run(inserts[key], {keys_ph: k, rows_ph: rng.normal(0, 0.05, [len(k), 9]).astype(np.float32)})
        sess.run(tf.compat.v1.train.get_global_step().assign(START_STEP))
        tf.compat.v1.train.Saver().save(sess, ckpt)
    # 2. The exports: live (frozen, updatable) and lean (plain tables), from the checkpoint. The live scope is open
    # around the Builder too: the live export is made when the meta graph is added.
    for form in ("live", "plain"):
        scope = tf_ext.serving.freeze_for_serving(live_model=MODEL_NAME) if form == "live" else contextlib.nullcontext()
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess, scope:
            # The checkpoint's global step is the live export's version (as in an Estimator's export graph).
            tf.compat.v1.train.get_or_create_global_step()
            features = _features(tf)
            spec = model.model_fn(features, None, tf.estimator.ModeKeys.PREDICT, _params())
            tf.compat.v1.train.Saver().restore(sess, ckpt)
            builder = tf.compat.v1.saved_model.Builder(os.path.join(work, "export_" + form))
            sig = tf.compat.v1.saved_model.predict_signature_def(
                features, {"probability": spec.predictions["probability"]}
            )
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
            builder.save()
    # 3. The trainer, restarted from the checkpoint, writes the updates.
    out["updates"] = _write_updates(tf, tf_ext, args, sizes, ckpt, rng)
    out["load_end"] = _load()
    print(json.dumps(out), flush=True)


def _write_updates(tf, tf_ext, args, sizes, ckpt, rng):
    """Writes the staged updates: [{to_step, kind, keys, removed, bytes, write_seconds}]."""
    from tensorflow_ext.examples.ctr import model  # pylint: disable=import-outside-toplevel

    total = sum(sizes.values())
    written = []
    with tf.Graph().as_default():
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        model.model_fn(_features(tf), labels, tf.estimator.ModeKeys.TRAIN, _params())
        step = tf.compat.v1.train.get_global_step()
        advance = step.assign_add(1)
        keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
        rows_ph = tf.compat.v1.placeholder(tf.float32, [None, 9])
        step_ph = tf.compat.v1.placeholder(tf.int64, [])
        upserts, removes = {}, {}
        for key in sizes:
            (shard,) = _field_embedding(tf_ext, key).shards
            upserts[key] = shard.table.insert(keys_ph, rows_ph, step_ph)
            removes[key] = shard.table.remove(keys_ph)
        writer = tf_ext.serving.ServingUpdateWriter(
            args.staging, model_name=MODEL_NAME, full_every=1 << 30, keep=1 << 30
        )
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, ckpt)
            writer.start(sess)  # a follower's model is at this step: the first update is a delta from it
            next_new = dict(sizes)  # a table's new keys: past its first ones
            for _ in range(args.num_updates):
                # A training step at global step s writes its rows at version s, then advances the step to s + 1;
                # the update to step s + 1 holds them (a delta holds the versions >= its from_step).
                row_step = int(sess.run(step))
                changed = 0
                for key, n in sizes.items():
                    # As many new keys as removed ones: the tables keep their size (the memory figures compare
                    # a model with itself).
                    share = min(n, max(1, int(round(args.changed_keys * n / float(total)))))
                    gone = min(share // 2, int(round(args.removed_keys * n / float(total))))
                    picked = rng.choice(n, size=share, replace=False).astype(np.int64)
                    new = np.arange(next_new[key], next_new[key] + gone, dtype=np.int64)
                    next_new[key] += gone
                    if gone:
                        sess.run(removes[key], {keys_ph: picked[:gone]})
                    k = np.concatenate([picked[gone:], new])
                    rows = rng.normal(0, 0.05, [len(k), 9]).astype(np.float32)
                    sess.run(upserts[key], {keys_ph: k, rows_ph: rows, step_ph: row_step})
                    changed += len(k)
                sess.run(advance)
                t0 = time.perf_counter()
                manifest = writer.write(sess)
                seconds = time.perf_counter() - t0
                written.append(
                    dict(
                        to_step=manifest["to_step"],
                        kind=manifest["kind"],
                        keys=manifest["keys"],
                        removed=manifest["removed"],
                        changed=changed,
                        write_seconds=round(seconds, 3),
                    )
                )
                print("wrote %s" % json.dumps(written[-1]), file=sys.stderr, flush=True)
    return written


# --------------------------------------------------------------------------- serve / reload (child processes)


def _requests(args, sizes, count):
    """`count` requests of args.batch examples: every field's ids drawn from its table's keys."""
    from tensorflow_ext.examples import synthetic  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(1)
    out = []
    for _ in range(count):
        feeds = {k: rng.integers(0, sizes[k], args.batch).astype(np.int64) for k in synthetic.CATEGORICAL_KEYS}
        feeds.update({k: rng.exponential(1.0, args.batch).astype(np.float32) for k in synthetic.DENSE_KEYS})
        out.append(feeds)
    return out


class _RssSampler(object):
    """Samples the process's RSS every _RSS_EVERY_SECS in a thread: [(unix time, bytes)]."""

    def __init__(self):
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(_RSS_EVERY_SECS):
            self.samples.append((time.time(), _rss()))

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.samples


def _serve(args):
    """The serving process: follows the updates dir; clients predict for args.seconds; prints JSON."""
    tf, tf_ext = _import_tf()
    rss_start = _rss()
    follower = tf_ext.serving.follow(args.export, args.updates, poll_secs=args.poll_secs)
    if int(args.base_version or 0) > 0 and not follower.wait_for_version(int(args.base_version), timeout=600):
        # The updates published before the process started (the trainer's first, full one) are applied first.
        raise RuntimeError("the follower did not apply the first updates: %s" % follower.stats)
    versions = [int(v) for v in args.versions.split(",") if v]
    requests = _requests(args, _table_sizes(args.scale), 64)
    for feeds in requests[:4]:
        follower.predict(feeds)  # warm-up
    sampler = _RssSampler()
    latencies = [[] for _ in range(args.clients)]  # (start unix time, seconds) per client
    stop = threading.Event()

    def client(c):
        i = c
        while not stop.is_set():
            t0 = time.time()
            follower.predict(requests[i % len(requests)])
            latencies[c].append((t0, time.time() - t0))
            i += 1

    visible, apply_seconds = {}, {}

    def watch():
        for v in versions:
            if not follower.wait_for_version(v, timeout=args.seconds + 120):
                return  # not applied (the JSON's stats say why): no freshness for it
            visible[v] = time.time()
            # Read as the version appears (the next update comes seconds later): this apply's duration.
            apply_seconds[v] = follower.stats["last_apply_seconds"]

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(args.clients)]
    t_ready = time.time()
    for t in threads:
        t.start()
    print("ready %r" % t_ready, flush=True)
    end = t_ready + args.seconds
    while time.time() < end and not stop.wait(max(0.0, end - time.time())):
        pass
    stop.set()
    for t in threads:
        t.join()
    watcher.join()  # the last update's apply may still be running
    samples = sampler.stop()
    out = dict(
        t_ready=t_ready,
        t_end=end,
        rss_start=rss_start,
        rss=samples,
        latencies=[x for per_client in latencies for x in per_client],
        visible={str(v): t for v, t in visible.items()},
        apply_seconds={str(v): t for v, t in apply_seconds.items()},
        version=follower.version,
        stats={k: v for k, v in dict(follower.stats).items() if isinstance(v, (int, float, str, type(None)))},
        load_end=_load(),
    )
    follower.close()
    with open(args.out, "w") as f:
        json.dump(out, f)


def _reload(args):
    """A full reload: the export loaded a second time into a new session beside the first, then the first closed."""
    tf, _ = _import_tf()
    rss_start = _rss()
    sampler = _RssSampler()

    def load():
        graph = tf.Graph()
        sess = tf.compat.v1.Session(graph=graph)
        with graph.as_default():
            tf.compat.v1.saved_model.loader.load(sess, ["serve"], args.export)
        return sess

    first = load()
    time.sleep(args.steady_secs)  # steady state: the RSS samples of this window
    t_reload = time.time()
    second = load()
    first.close()
    del first
    t_swapped = time.time()
    time.sleep(args.steady_secs)
    samples = sampler.stop()
    second.close()
    with open(args.out, "w") as f:
        json.dump(dict(rss=samples, rss_start=rss_start, t_reload=t_reload, t_swapped=t_swapped, load_end=_load()), f)


# --------------------------------------------------------------------------- apply (a child process)


def _plain_apply_op(tf, graph, layout):
    """(prefix placeholder, op) writing an update into the lean export's plain tables in place: per shard its
    removed keys out and its rows in (table ops), every dense variable assigned; read with RestoreV2 from the update
    bundle fed as the prefix."""
    from tensorflow_ext.serving import update_format  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.utils.loader import load_ops  # pylint: disable=import-outside-toplevel

    tables, dense = update_format.parse_layout(layout)
    with graph.as_default():
        handles = {op.name: op.outputs[0] for op in graph.get_operations() if op.type == "TfExtTableHandle"}
        variables = {op.name: op.outputs[0] for op in graph.get_operations() if op.type == "VarHandleOp"}
        prefix = tf.compat.v1.placeholder(tf.string, [])
        ops = []
        for shard, dim in sorted(tables.items()):
            names = [
                update_format.keys_name(shard),
                update_format.values_name(shard),
                update_format.removed_name(shard),
            ]
            keys, values, removed = tf.raw_ops.RestoreV2(
                prefix=prefix, tensor_names=names, shape_and_slices=[""] * 3, dtypes=[tf.int64, tf.float32, tf.int64]
            )
            gone = load_ops().tf_ext_table_remove(handles[shard], removed)
            with tf.control_dependencies([gone]):
                step = tf.constant(0, tf.int64)
                ops.append(load_ops().tf_ext_table_insert(handles[shard], keys, values, step, col_begin=0, cols=dim))
        for name, (dtype, _) in sorted(dense.items()):
            if name in variables:
                (value,) = tf.raw_ops.RestoreV2(
                    prefix=prefix, tensor_names=[name], shape_and_slices=[""], dtypes=[tf.as_dtype(dtype)]
                )
                ops.append(tf.raw_ops.AssignVariableOp(resource=variables[name], value=value))
        return prefix, tf.group(*ops)


def _apply(args):
    """Applies a chain of updates to a freshly loaded export (live: the apply signature; plain: table ops in
    place); only the last one is timed: the ones before it bring the export to its from_step and run the apply's
    graph once (its first run prepares the graph, as a serving process's first apply does)."""
    tf, tf_ext = _import_tf()
    from tensorflow_ext.serving import update_format  # pylint: disable=import-outside-toplevel

    chain = args.update.split(",")
    graph = tf.Graph()
    sess = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], args.export)
    stats = None
    if args.form == "plain":
        prefix, op = _plain_apply_op(tf, graph, update_format.read_manifest(chain[0])["layout"])
    else:
        from tensorflow_ext.serving import live_ops  # pylint: disable=import-outside-toplevel

        with graph.as_default():
            (handle,) = [o.outputs[0] for o in graph.get_operations() if o.type == "TfExtLiveModelHandle"]
            stats = live_ops.stats(handle)
    for update_dir in chain:
        manifest = update_format.read_manifest(update_dir)
        live_before = dict(zip(live_ops.STATS_FIELDS, sess.run(stats).tolist())) if stats is not None else None
        rss_before = _rss()
        sampler = _RssSampler()
        t0 = time.perf_counter()
        if args.form == "live":
            version, applied = tf_ext.serving.apply_update(sess, update_dir)
            assert applied and version == manifest["to_step"], (version, applied, manifest)
        else:
            sess.run(op, {prefix: update_format.bundle_prefix(update_dir)})
        seconds = time.perf_counter() - t0
        rss_peak = max([b for _, b in sampler.stop()] + [rss_before, _rss()])
    live_after = dict(zip(live_ops.STATS_FIELDS, sess.run(stats).tolist())) if stats is not None else None
    # The same request to both forms after the same updates: the driver compares the answers.
    sig = meta.signature_def["serving_default"]
    feeds = _requests(args, _table_sizes(args.scale), 1)[0]
    probability = sess.run(sig.outputs["probability"].name, {sig.inputs[k].name: v for k, v in feeds.items()})
    out = dict(
        form=args.form,
        predictions=probability.tolist(),
        seconds=seconds,
        kind=manifest["kind"],
        keys=manifest["keys"],
        removed=manifest["removed"],
        rss_before=rss_before,
        rss_peak=rss_peak,  # sampled every _RSS_EVERY_SECS during the timed apply
        rss_after=_rss(),
        live_before=live_before,  # the live model's counters (live_ops.STATS_FIELDS) before and after it
        live_after=live_after,
        load_end=_load(),
    )
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------- the driver


def _child(args, role, extra, stdout=subprocess.PIPE):
    sizes = []
    for name in _SIZE_FLAGS:  # every child sees the driver's sizes (its own defaults are the full run's)
        sizes += ["--" + name, repr(getattr(args, name))]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", role] + sizes + extra
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0")
    return subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, universal_newlines=True)


def _finish(proc, what):
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s" % (what, proc.returncode, err[-4000:]))
    return out


def _run_serve(args, variant, work, updates):
    """One serving process of `variant` (idle, steady, updates); returns its figures."""
    updates_dir = tempfile.mkdtemp(prefix="updates_", dir=work)
    # The trainer's first update when it is a full one is in the directory before the follower starts, for every
    # variant alike; the deltas are published while it serves (none in the steady variant).
    base = [u for u in updates if u["kind"] != "delta"]
    publish = [] if variant == "steady" else [u for u in updates if u["kind"] == "delta"]
    moved = []

    def move_in(u):
        target = os.path.join(updates_dir, os.path.basename(u["path"]))
        os.rename(u["path"], target)  # a rename publishes an update, as the writer's own does
        moved.append((target, u["path"]))

    for u in base:
        move_in(u)
    out_path = os.path.join(work, "serve_%s.json" % variant)
    load_start = _load()
    clients = 0 if variant == "idle" else args.clients
    proc = _child(
        args,
        "serve",
        ["--export", os.path.join(work, "export_live"), "--updates", updates_dir, "--out", out_path]
        + ["--base_version", str(max([u["to_step"] for u in base] + [0]))]
        + ["--versions", ",".join(str(u["to_step"]) for u in publish), "--clients", str(clients)]
        + ["--seconds", repr(args.seconds), "--poll_secs", repr(args.poll_secs)],
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            _finish(proc, "serving process")
            raise RuntimeError("serving process: unexpected first line %r" % line)
        t_ready = float(line.split()[1])
        published = {}
        for i, u in enumerate(publish):
            time.sleep(max(0.0, t_ready + args.steady_secs + i * args.update_every - time.time()))
            published[u["to_step"]] = time.time()
            move_in(u)
        _finish(proc, "serving process")
    finally:
        for target, staged in moved:
            os.rename(target, staged)
    with open(out_path) as f:
        r = json.load(f)
    shutil.rmtree(updates_dir)
    return _serve_figures(args, variant, r, publish, published, load_start)


def _serve_figures(args, variant, r, publish, published, load_start):
    window = (r["t_ready"] + args.steady_secs, r["t_end"])
    lat = np.asarray([s for t, s in r["latencies"] if window[0] <= t < window[1]]) * 1e3
    rss = [(t, b) for t, b in r["rss"]]
    steady = [b for t, b in rss if r["t_ready"] <= t < window[0]]
    during = [b for t, b in rss if t >= window[0]]
    # The last second of the window (the last update applied seconds before): what the updates left resident.
    after = [b for t, b in rss if window[1] - 1.0 <= t < window[1]]
    fresh = []
    for u in publish:
        v = str(u["to_step"])
        if v in r["visible"] and u["to_step"] in published:
            seen = r["visible"][v] - published[u["to_step"]]
            fresh.append(
                dict(keys=u["keys"], removed=u["removed"], write_s=u["write_seconds"], publish_to_visible_s=seen,
                     freshness_s=u["write_seconds"] + seen)
            )  # fmt: skip
    # The requests that overlapped an apply (from its start, visible time - its duration, to the visible time),
    # and the others.
    applies = [
        (r["visible"][v] - r["apply_seconds"][v], r["visible"][v]) for v in r["visible"] if v in r["apply_seconds"]
    ]
    overlap, apart = [], []
    for t, sec in r["latencies"]:
        if window[0] <= t < window[1]:
            hit = any(t < end and t + sec > begin for begin, end in applies)
            (overlap if hit else apart).append(sec * 1e3)
    n = len(lat)
    return dict(
        variant=variant,
        requests=n,
        qps=n / (window[1] - window[0]) if n else 0.0,
        p50_ms=float(np.percentile(lat, 50)) if n else None,
        p99_ms=float(np.percentile(lat, 99)) if n else None,
        apply_seconds=sorted(r["apply_seconds"].values()),
        requests_during_applies=len(overlap),
        p99_during_applies_ms=float(np.percentile(overlap, 99)) if overlap else None,
        p99_apart_ms=float(np.percentile(apart, 99)) if apart else None,
        rss_start=r["rss_start"],  # before the model was loaded: the process's own (TensorFlow's) memory
        rss_steady=float(np.median(steady)) if steady else None,
        rss_max=float(max(during)) if during else None,
        rss_end=float(np.median(after)) if after else None,
        freshness=fresh,
        served_version=r["version"],
        follower_stats=r["stats"],
        load_start=load_start,
        load_end=r["load_end"],
    )


def _run_reload(args, work):
    out_path = os.path.join(work, "reload.json")
    load_start = _load()
    extra = ["--export", os.path.join(work, "export_live"), "--out", out_path]
    _finish(_child(args, "reload", extra), "reload process")
    with open(out_path) as f:
        r = json.load(f)
    steady = [b for t, b in r["rss"] if t < r["t_reload"]]
    return dict(
        rss_start=r["rss_start"],
        rss_steady=float(np.median(steady[len(steady) // 2 :])),
        rss_max=float(max(b for _, b in r["rss"])),
        reload_s=r["t_swapped"] - r["t_reload"],
        load_start=load_start,
        load_end=r["load_end"],
    )


def _run_apply(args, work, form, chain):
    load_start = _load()
    export = os.path.join(work, "export_" + form)
    extra = ["--form", form, "--export", export, "--update", ",".join(u["path"] for u in chain)]
    out = _finish(_child(args, "apply", extra), "apply (%s)" % form)
    r = json.loads(out.strip().splitlines()[-1])
    r["mkeys_per_s"] = (r["keys"] + r["removed"]) / r["seconds"] / 1e6
    r["load_start"] = load_start
    return r


def _ratio(peak, steady, base=0):
    """ "1.23x": (peak - base) / (steady - base), or "-"."""
    if not peak or not steady or steady <= base:
        return "-"
    return "%.2fx" % ((peak - base) / float(steady - base))


def _report(result):
    lines = ["keys %d in %d tables (dim 9), changed per update %d, removed %d; %d client threads, batch %d" % (
        result["keys"], result["tables"], result["changed_keys"], result["removed_keys"], result["clients"],
        result["batch"])]  # fmt: skip
    for run in result["serve"]:
        fresh = ", ".join("%.2f s (write %.2f + visible %.2f)" % (
            f["freshness_s"], f["write_s"], f["publish_to_visible_s"]) for f in run["freshness"])  # fmt: skip
        lines.append(
            "serve %-7s %7.0f req/s p50 %6.2f ms p99 %6.2f ms  RSS steady %6.1f MiB max %6.1f MiB (%s; the model's "
            "part %s) end %6.1f MiB  freshness %s  load %s..%s" % (
                run["variant"], run["qps"], run["p50_ms"] or 0, run["p99_ms"] or 0, (run["rss_steady"] or 0) / 2**20,
                (run["rss_max"] or 0) / 2**20, _ratio(run["rss_max"], run["rss_steady"]),
                _ratio(run["rss_max"], run["rss_steady"], run["rss_start"]), (run["rss_end"] or 0) / 2**20,
                fresh or "-", run["load_start"][0], run["load_end"][0])  # fmt: skip
        )
        if run["requests_during_applies"]:
            lines.append(
                "    %d requests (%.0f%%) overlapped an apply: p99 %.2f ms; the others: p99 %.2f ms; applies took %s s"
                % (
                    run["requests_during_applies"],
                    100.0 * run["requests_during_applies"] / max(run["requests"], 1),
                    run["p99_during_applies_ms"],
                    run["p99_apart_ms"],
                    ", ".join("%.2f" % a for a in run["apply_seconds"]),
                )
            )
    for run in result["reload"]:
        lines.append(
            "reload: RSS steady %.1f MiB, max %.1f MiB (%s; the model's part %s), %.1f s"
            % (
                run["rss_steady"] / 2**20,
                run["rss_max"] / 2**20,
                _ratio(run["rss_max"], run["rss_steady"]),
                _ratio(run["rss_max"], run["rss_steady"], run["rss_start"]),
                run["reload_s"],
            )
        )
    for run in result["apply"]:
        lines.append(
            "apply %-5s %d keys + %d removed in %.2f s: %.2f Mkeys/s (load %s; predictions live vs plain: max "
            "|difference| %.3g)"
            % (
                run["form"],
                run["keys"],
                run["removed"],
                run["seconds"],
                run["mkeys_per_s"],
                run["load_end"][0],
                run["max_abs_diff_live_vs_plain"],
            )
        )
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes (1/100 of the keys), short runs")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--scale", type=float, default=None, help="fraction of the main job's keys (default 1)")
    p.add_argument("--changed_keys", type=int, default=None, help="rows changed per update (default 1,000,000)")
    p.add_argument("--removed_keys", type=int, default=None, help="keys removed per update (default 10,000)")
    p.add_argument("--num_updates", type=int, default=None, help="deltas written (default 5; >= 2)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--batch", type=int, default=256, help="examples per request")
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="clients' time per serving process (default: the steady window and --num_updates x --update_every)",
    )
    p.add_argument("--steady_secs", type=float, default=None, help="steady window before updates (default 8)")
    p.add_argument("--update_every", type=float, default=5.0)
    p.add_argument("--poll_secs", type=float, default=1.0, help="the follower's listing period")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds of every variant (default 2)")
    p.add_argument(
        "--only",
        default="idle,steady,updates,reload,apply",
        help="the measurements to run, comma-separated (default all: idle,steady,updates,reload,apply)",
    )
    for hidden in ("--child", "--work", "--staging", "--export", "--updates", "--out", "--versions", "--form",
                   "--update", "--base_version"):  # fmt: skip
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    quick = dict(scale=0.01, changed_keys=10000, removed_keys=100, num_updates=3, steady_secs=2.0, rounds=1)
    full = dict(scale=1.0, changed_keys=1000000, removed_keys=10000, num_updates=5, steady_secs=8.0, rounds=2)
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.seconds is None:  # the steady window, then the updates' window
        args.seconds = args.steady_secs + args.num_updates * args.update_every
    if args.child:
        {"prepare": _prepare, "serve": _serve, "reload": _reload, "apply": _apply}[args.child](args)
        return
    t0 = time.time()
    result = dict(vars(args), machine=dict(cpus=os.cpu_count(), load_start=_load(), time=time.strftime("%F %T")))
    with tempfile.TemporaryDirectory(prefix="bench_serving_updates_") as work:
        staging = os.path.join(work, "staging")
        out = _finish(_child(args, "prepare", ["--work", work, "--staging", staging]), "prepare")
        prepared = json.loads(out.strip().splitlines()[-1])
        updates = prepared["updates"]
        for u in updates:
            u["path"] = os.path.join(staging, "update-%012d" % u["to_step"])
        result.update(keys=prepared["keys"], tables=prepared["tables"], writes=updates)
        print("prepared: %s" % json.dumps(prepared), flush=True)
        deltas = [u for u in updates if u["kind"] == "delta"]
        result["serve"], result["reload"], result["apply"] = [], [], []
        only = set(args.only.split(","))
        for r in range(args.rounds):
            for variant in ("idle", "steady", "updates") if r % 2 == 0 else ("updates", "steady", "idle"):
                if variant in only:
                    result["serve"].append(_run_serve(args, variant, work, updates))
                    print(json.dumps(result["serve"][-1]), flush=True)
            if "reload" in only:
                result["reload"].append(_run_reload(args, work))
            if "apply" not in only:
                continue
            for form in ("live", "plain") if r % 2 == 0 else ("plain", "live"):
                chain = updates[: updates.index(deltas[1]) + 1]
                result["apply"].append(_run_apply(args, work, form, chain))
            # Both forms answer the same request alike after the same updates (the rows and the variables agree).
            pair = result["apply"][-2:]
            diff = float(np.max(np.abs(np.subtract(pair[0].pop("predictions"), pair[1].pop("predictions")))))
            for run in pair:
                run["max_abs_diff_live_vs_plain"] = diff
                print(json.dumps(run), flush=True)
    result["wall_s"] = time.time() - t0
    result["machine"]["load_end"] = _load()
    print()
    print(_report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote %s" % args.json)


if __name__ == "__main__":
    main()
