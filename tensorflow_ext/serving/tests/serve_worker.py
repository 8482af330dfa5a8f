"""A serving process: loads SavedModels after a plain `import tensorflow_ext` and predicts, 1 and 16 threads.

Usage: python serve_worker.py <request.json> <out.npz>. The request lists exports
(path, loader "tf1_loader" or "saved_model_load", input and output keys) and an ids file (npy, int64 [n, 2]).
For each export it writes the single-threaded predictions of every batch, and whether 16 threads predicting the same
batches concurrently on the one session got exactly the same values, plus the op types of the loaded graph and the
bytes its tables hold once loaded (the sum of their memory_bytes).
"""

import json
import sys
import threading

import numpy as np
import tensorflow as tf

import tensorflow_ext  # noqa: F401  (registers the ops: all a serving process needs)
from tensorflow_ext.utils.loader import load_ops

tf.compat.v1.disable_v2_behavior()

BATCH = 32
ROUNDS = 8
THREADS = 16


def _serve(export, ids):
    graph = tf.Graph()
    sess = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        load = (
            tf.compat.v1.saved_model.loader.load if export["loader"] == "tf1_loader" else tf.compat.v1.saved_model.load
        )
        meta = load(sess, ["serve"], export["path"])
        memory_ops = {"TfExtTableHandle": load_ops().tf_ext_table_memory_bytes}
        memory_ops["TfExtFrozenTableHandle"] = load_ops().tf_ext_frozen_table_memory_bytes
        table_bytes = [memory_ops[op.type](op.outputs[0]) for op in graph.get_operations() if op.type in memory_ops]
    table_bytes = int(sum(sess.run(table_bytes)))
    sig = meta.signature_def["serving_default"]
    feed_name = sig.inputs[export["input"]].name
    fetch_name = sig.outputs[export["output"]].name
    batches = [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]
    single = [sess.run(fetch_name, {feed_name: b}) for b in batches]

    mismatches = []
    errors = []
    start = threading.Barrier(THREADS)

    def worker(t):
        try:
            start.wait()
            for r in range(ROUNDS):
                for j in range(len(batches)):
                    k = (j + t + r) % len(batches)  # threads run different batches at the same time
                    out = sess.run(fetch_name, {feed_name: batches[k]})
                    if not np.array_equal(out, single[k]):
                        mismatches.append((t, k))
        except Exception as e:  # pylint: disable=broad-except
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    op_types = sorted({op.type for op in graph.get_operations()})
    sess.close()
    return np.concatenate(single), len(mismatches), errors, op_types, table_bytes


def main():
    request = json.load(open(sys.argv[1]))
    ids = np.load(request["ids"])
    out, report = {}, {}
    for name, export in request["exports"].items():
        pred, mismatches, errors, op_types, table_bytes = _serve(export, ids)
        out[name] = pred
        report[name] = dict(mismatches=mismatches, errors=errors, op_types=op_types, table_bytes=table_bytes)
    np.savez(sys.argv[2], **out)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
