"""Delta checkpoint against full checkpoint: bytes written and seconds of one save, when a fraction of keys changed.

Each repetition runs in a fresh process: fill a dynamic embedding (Adagrad, so rows carry a slot column group) with
--keys keys, save a full checkpoint, train --changed of the keys (one step), save again as a delta (timed), and also
time a restore of both (the delta restore reads its chain: full + delta). Saves skip the meta graph, as the hooks'
saves after the first do.

    .venv/bin/python tools/bench_delta_checkpoint.py --keys 3000000 --dim 16 --changed 0.05 --repeats 3
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _bytes(prefix):
    d = os.path.dirname(prefix)
    base = os.path.basename(prefix)
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.startswith(base + "."))


def _child(args):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel

    work = tempfile.mkdtemp(dir=args.dir)
    n, dim = args.keys, args.dim
    changed = int(n * args.changed)
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding("emb", dim, initializer=0.01, initial_capacity=n)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    fill_ids = tf.compat.v1.placeholder(tf.int64, [None])
    fill = emb.insert(fill_ids, tf.fill(tf.stack([tf.size(fill_ids), dim]), 0.5))
    listener = tf_ext.embedding.delta_checkpoints(full_every=1000)
    saver = tf.compat.v1.train.Saver(max_to_keep=100)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    out = {}
    rng = np.random.RandomState(0)
    keys = rng.randint(0, 2**62, size=n, dtype=np.int64)
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(0, n, 1 << 20):
            sess.run(fill, {fill_ids: keys[i : i + (1 << 20)]})
        # As after a day of training: the saved rows were trained before the step of the save.
        sess.run(gs.assign(1000))
        t = time.perf_counter()
        full = listener.save(sess, saver, os.path.join(work, "model.ckpt"), gs, write_meta_graph=False)
        out["full_save_s"] = time.perf_counter() - t
        out["full_bytes"] = _bytes(full)
        sess.run(train, {ids: keys[rng.choice(n, changed, replace=False)]})
        t = time.perf_counter()
        delta = listener.save(sess, saver, os.path.join(work, "model.ckpt"), gs, write_meta_graph=False)
        out["delta_save_s"] = time.perf_counter() - t
        out["delta_bytes"] = _bytes(delta)
        out["table_keys"] = int(sess.run(emb.size()))
        out["delta_rows"] = int(tf.train.load_checkpoint(delta).get_tensor("emb/part_0-keys").size)
    # Restores in a new graph: the full checkpoint alone, and the delta (its chain: the full one and the delta).
    for name, path in (("full", full), ("delta", delta)):
        with tf.Graph().as_default():
            tf.compat.v1.train.get_or_create_global_step()
            emb = tf_ext.get_dynamic_embedding("emb", dim, initializer=0.01)
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(tf_ext.embedding_lookup(emb, ids)))
            restorer = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session(config=config) as sess:
                t = time.perf_counter()
                restorer.restore(sess, path)
                out[name + "_restore_s"] = time.perf_counter() - t
    shutil.rmtree(work)
    print("RESULT " + json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=3000000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--changed", type=float, default=0.05, help="fraction of keys trained between the saves")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    runs = []
    for _ in range(args.repeats):
        cmd = [sys.executable, os.path.abspath(__file__), "--child"] + sys.argv[1:]
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1]
        runs.append(json.loads(line[len("RESULT ") :]))
    med = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    print(
        "keys %d, dim %d (+ Adagrad slot), %.0f%% changed, median of %d fresh processes"
        % (med["table_keys"], args.dim, 100 * args.changed, len(runs))
    )
    print("  full save : %8.1f MB  %6.2f s" % (med["full_bytes"] / 1e6, med["full_save_s"]))
    print(
        "  delta save: %8.1f MB  %6.2f s   (%.3fx bytes, %.3fx time; %d rows)"
        % (
            med["delta_bytes"] / 1e6,
            med["delta_save_s"],
            med["delta_bytes"] / med["full_bytes"],
            med["delta_save_s"] / med["full_save_s"],
            med["delta_rows"],
        )
    )
    print("  restore   : full %.2f s, full + delta chain %.2f s" % (med["full_restore_s"], med["delta_restore_s"]))
    print(json.dumps({"runs": runs, "median": med}))


if __name__ == "__main__":
    main()
