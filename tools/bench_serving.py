"""Serving benchmark: memory of the served tables and predictions/s, mutable vs frozen tables, fresh processes.

    python tools/bench_serving.py [--keys 3000000] [--dim 16] [--fields 4] [--seconds 5]
    python tools/bench_serving.py --row_dtypes [--keys 1000000] [--dims 16,64] [--fields 4] [--seconds 2]

Builds a checkpoint of `--fields` dynamic embeddings holding `--keys` keys in all (random rows), exports it twice
with `tf.compat.v1.saved_model.Builder` (the plain form and inside `tf_ext.serving.freeze_for_serving()`), plus the
same two exports of a model with one key per table (the baseline). Each export is then loaded by a fresh process that
only imports tensorflow_ext: it reports its resident memory (RSS) after the load, and predictions/s (batches of
`--batch` examples, half of the ids known) with 1 and 16 threads on one session. The memory attributable to the tables
is RSS(full export) - RSS(baseline export) of the same form; the raw embedding bytes are keys * (8 + 4 * dim).
Prints one JSON line at the end.

`--row_dtypes` compares the row dtypes of a serving export instead: for each of `--dims`, one checkpoint of `--keys`
keys is exported with rows stored as float32, bfloat16, float16 and int8 (`freeze_for_serving(value_dtype)` and
`export_rows(value_dtype)`: frozen and plain tables); each export is loaded by a fresh process, which reports the
tables' memory_bytes() per key, the SavedModel's size per key and predictions/s (1 thread).
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

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_bytes(field="VmRSS"):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# The row dtypes `--row_dtypes` compares (tf dtype names).
ROW_DTYPES = ("float32", "bfloat16", "float16", "int8")


def _serving_scope(tf, tf_ext, form, row_dtype):
    dtype = tf.as_dtype(row_dtype)
    return tf_ext.serving.freeze_for_serving(dtype) if form == "frozen" else tf_ext.serving.export_rows(dtype)


def _model(tf, tf_ext, ids, fields, dim):
    vecs, embs = [], []
    for f in range(fields):
        emb = tf_ext.get_dynamic_embedding("field_%d" % f, dim, initializer=0.0)
        embs.append(emb)
        vecs.append(tf_ext.embedding_lookup(emb, ids[:, f]))
    w = tf.compat.v1.get_variable("w", [fields * dim, 1], initializer=tf.compat.v1.constant_initializer(0.01))
    return tf.identity(tf.sigmoid(tf.matmul(tf.concat(vecs, 1), w))[:, 0], name="prob"), embs


def _write_checkpoint(tf, tf_ext, ckpt, fields, dim, n):
    """A checkpoint of `fields` embeddings of `n` keys each (random normal rows): field f holds f, f + fields, ..."""
    import numpy as np

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        ids = tf.compat.v1.placeholder(tf.int64, [None, fields])
        _, embs = _model(tf, tf_ext, ids, fields, dim)
        keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
        rows_ph = tf.compat.v1.placeholder(tf.float32, [None, dim])
        inserts = [emb.insert(keys_ph, rows_ph) for emb in embs]
        sess.run(tf.compat.v1.global_variables_initializer())
        rng = np.random.RandomState(0)
        for f, insert in enumerate(inserts):
            # Field f holds the keys f, f + fields, ...: the served ids below know which are present.
            keys = np.arange(n, dtype=np.int64) * fields + f
            for start in range(0, n, 1 << 20):
                k = keys[start : start + (1 << 20)]
                sess.run(insert, {keys_ph: k, rows_ph: rng.standard_normal([len(k), dim]).astype(np.float32)})
        tf.compat.v1.train.Saver().save(sess, ckpt)


def _export(tf, tf_ext, ckpt, export_dir, fields, dim, scope):
    """A Builder export of the model restored from `ckpt`, its inference graph built inside `scope`."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with scope:
            ids = tf.compat.v1.placeholder(tf.int64, [None, fields], name="ids")
            prob, _ = _model(tf, tf_ext, ids, fields, dim)
        tf.compat.v1.train.Saver().restore(sess, ckpt)
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        sig = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"prob": prob})
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
        builder.save()


def _import_tf():
    import tensorflow as tf

    import tensorflow_ext as tf_ext

    tf.compat.v1.disable_v2_behavior()
    return tf, tf_ext


def _build_exports(args, workdir):
    tf, tf_ext = _import_tf()
    per_field = args.keys // args.fields
    exports = {}
    for size_name, n in (("full", per_field), ("empty", 1)):
        ckpt = os.path.join(workdir, "ckpt_%s" % size_name)
        _write_checkpoint(tf, tf_ext, ckpt, args.fields, args.dim, n)
        for form in ("mutable", "frozen"):
            export_dir = os.path.join(workdir, "%s_%s" % (form, size_name))
            scope = tf_ext.serving.freeze_for_serving() if form == "frozen" else contextlib.nullcontext()
            _export(tf, tf_ext, ckpt, export_dir, args.fields, args.dim, scope)
            exports[(form, size_name)] = export_dir
    return exports, per_field * args.fields


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _row_dtypes(args):
    """Bytes per key served and predictions/s per row dtype, frozen and plain tables, for each of `--dims`."""
    tf, tf_ext = _import_tf()
    per_field = args.keys // args.fields
    keys = per_field * args.fields
    result = dict(keys=keys, fields=args.fields, batch=args.batch, cpus=os.cpu_count(), rows=[])
    for dim in (int(d) for d in args.dims.split(",")):
        with tempfile.TemporaryDirectory() as workdir:
            ckpt = os.path.join(workdir, "ckpt")
            _write_checkpoint(tf, tf_ext, ckpt, args.fields, dim, per_field)
            for form in ("frozen", "plain"):
                for row_dtype in ROW_DTYPES:
                    export_dir = os.path.join(workdir, "%s_%s" % (form, row_dtype))
                    _export(tf, tf_ext, ckpt, export_dir, args.fields, dim, _serving_scope(tf, tf_ext, form, row_dtype))
                    served = _run_child(args, export_dir, measure_speed=True, onednn="0", threads=(1,))
                    row = dict(
                        dim=dim,
                        form=form,
                        row_dtype=row_dtype,
                        table_bytes_per_key=round(served["table_bytes"] / keys, 1),
                        saved_model_bytes_per_key=round(_dir_bytes(export_dir) / keys, 1),
                        predictions_per_s_1_thread=round(served["predictions_per_s_1_threads"]),
                    )
                    result["rows"].append(row)
                    print(
                        "dim %-3d %-6s %-8s served tables: %6.1f B/key   SavedModel: %6.1f B/key   predictions/s: %d"
                        % (
                            dim,
                            form,
                            row_dtype,
                            row["table_bytes_per_key"],
                            row["saved_model_bytes_per_key"],
                            row["predictions_per_s_1_thread"],
                        ),
                        flush=True,
                    )
                    shutil.rmtree(export_dir)
    print(json.dumps(result), flush=True)


def _serve_child(args):
    """In a fresh process: load one export, report RSS and predictions/s."""
    import numpy as np
    import tensorflow as tf

    import tensorflow_ext  # noqa: F401  (registers the ops)
    from tensorflow_ext.utils.loader import load_ops

    tf.compat.v1.disable_v2_behavior()
    rss_before = _rss_bytes()
    graph = tf.Graph()
    sess = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], args.child)
    rss_loaded = _rss_bytes()
    out = dict(
        rss_before=rss_before, rss_loaded=rss_loaded, rss_anon=_rss_bytes("RssAnon"), rss_file=_rss_bytes("RssFile")
    )
    with graph.as_default():
        memory = {"TfExtTableHandle": load_ops().tf_ext_table_memory_bytes}
        memory["TfExtFrozenTableHandle"] = load_ops().tf_ext_frozen_table_memory_bytes
        table_bytes = [memory[op.type](op.outputs[0]) for op in graph.get_operations() if op.type in memory]
    out["table_bytes"] = int(sum(sess.run(table_bytes)))
    if args.measure_speed:
        sig = meta.signature_def["serving_default"]
        feed, fetch = sig.inputs["ids"].name, sig.outputs["prob"].name
        rng = np.random.RandomState(1)
        known = args.keys // args.fields
        # Half the ids are known keys (field f holds i * fields + f), half are not (negative).
        batches = []
        for _ in range(64):
            rows = rng.randint(0, known, size=[args.batch, args.fields]) * args.fields + np.arange(args.fields)
            rows = np.where(rng.rand(args.batch, args.fields) < 0.5, rows, -1 - rows)
            batches.append(rows.astype(np.int64))
        for b in batches[:4]:
            sess.run(fetch, {feed: b})
        for threads in [int(t) for t in args.threads.split(",")]:
            counts = [0] * threads
            stop = time.time() + args.seconds

            def work(t):
                i = t
                while time.time() < stop:
                    sess.run(fetch, {feed: batches[i % len(batches)]})
                    counts[t] += 1
                    i += 1

            start = time.time()
            ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            elapsed = time.time() - start
            out["predictions_per_s_%d_threads" % threads] = sum(counts) * args.batch / elapsed
    print(json.dumps(out), flush=True)


def _run_child(args, export_dir, measure_speed, onednn="1", threads=(1, 16)):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        export_dir,
        "--keys",
        str(args.keys),
        "--fields",
        str(args.fields),
        "--batch",
        str(args.batch),
        "--seconds",
        str(args.seconds),
        "--threads",
        ",".join(str(t) for t in threads),
    ]
    if measure_speed:
        cmd.append("--measure_speed")
    # TF_ENABLE_ONEDNN_OPTS picks TensorFlow's CPU allocator: oneDNN's pool (the default) keeps the memory of the
    # restore's temporary tensors; the plain allocator gives it back.
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS=onednn)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if proc.returncode != 0:
        raise RuntimeError("serving process failed:\n" + proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=3000000, help="keys in all tables together (default 3e6)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--fields", type=int, default=4, help="tables (one id per example each)")
    p.add_argument("--batch", type=int, default=256, help="examples per request")
    p.add_argument("--seconds", type=float, default=5.0, help="per throughput measurement")
    p.add_argument("--row_dtypes", action="store_true", help="compare the row dtypes of serving exports instead")
    p.add_argument("--dims", default="16,64", help="--row_dtypes: the embedding dims (default 16,64)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--threads", default="1,16", help=argparse.SUPPRESS)
    p.add_argument("--measure_speed", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _serve_child(args)
        return
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.row_dtypes:
        _row_dtypes(args)
        return
    with tempfile.TemporaryDirectory() as workdir:
        exports, keys = _build_exports(args, workdir)
        raw = keys * (8 + 4 * args.dim)
        result = dict(keys=keys, dim=args.dim, fields=args.fields, batch=args.batch, raw_bytes=raw, cpus=os.cpu_count())
        for form, onednn in (("mutable", "1"), ("frozen", "1"), ("mutable", "0"), ("frozen", "0")):
            if onednn == "0":
                form_name = form + "_onednn_off"
            else:
                form_name = form
            base = _run_child(args, exports[(form, "empty")], measure_speed=False, onednn=onednn)
            full = _run_child(args, exports[(form, "full")], measure_speed=True, onednn=onednn)
            table_bytes = full["rss_loaded"] - base["rss_loaded"]
            result[form_name] = dict(
                table_rss_bytes=table_bytes,
                rss_vs_raw=round(table_bytes / raw, 3),
                anon_bytes=full["rss_anon"] - base["rss_anon"],
                file_bytes=full["rss_file"] - base["rss_file"],
                predictions_per_s_1_thread=round(full["predictions_per_s_1_threads"]),
                predictions_per_s_16_threads=round(full["predictions_per_s_16_threads"]),
            )
            print(
                "%-19s tables: %.1f MB RSS for %.1f MB raw (%.2fx); predictions/s: %d (1 thread), %d (16 threads)"
                % (
                    form_name,
                    table_bytes / 1e6,
                    raw / 1e6,
                    table_bytes / raw,
                    result[form_name]["predictions_per_s_1_thread"],
                    result[form_name]["predictions_per_s_16_threads"],
                ),
                flush=True,
            )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
