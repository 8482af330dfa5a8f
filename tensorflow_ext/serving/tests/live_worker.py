"""A serving process for live exports: loads each SavedModel after a plain `import tensorflow_ext`, then predicts and
applies serving updates in the order the request says.

Usage: python live_worker.py <request.json> <out.npz>. The request holds an ids file (npy, int64 [n, 2]) and exports,
each {"path", "tags" (default ["serve"]), "loader", "actions": ["predict" | ["apply", update_dir], ...]}. Loader
"tf1": tf.compat.v1.saved_model.loader.load into a Session, updates through tf_ext.serving.apply_update (given the
loader's MetaGraphDef at odd action indexes and not at even ones: both ways it finds the signature); "tf2":
tf.saved_model.load (eager), updates through the tf_ext_apply_update signature. For each export it writes, per
"predict", the serving_default outputs ("<export>/<i>/<output>" in the npz), and reports per action the served
version (tf_ext_served_version) or the apply's (version, applied) or its error (class and message), plus the op
types the serving signature's outputs are computed from, up to the live model's pin (tf1 loader).

The process keeps TensorFlow 2 behaviour (eager) for the tf2 loader; the tf1 loader runs in its own Graph.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import tensorflow_ext  # noqa: F401  (registers the ops: all a serving process needs)

APPLY_SIGNATURE = "tf_ext_apply_update"
VERSION_SIGNATURE = "tf_ext_served_version"


def _closure_op_types(graph, fetch_names):
    """The op types that computing the fetches runs, up to the live model's pin (whose inputs start the model)."""
    seen, stack = set(), [graph.get_tensor_by_name(n).op for n in fetch_names]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type != "TfExtLivePin":
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return sorted({op.type for op in seen})


def _error(e):
    return {"error": type(e).__name__, "message": getattr(e, "message", str(e))}


def _serve_tf1(export, ids, out, prefix):
    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel

    graph = tf.Graph()
    with graph.as_default():
        sess = tf.compat.v1.Session(graph=graph)
        meta = tf.compat.v1.saved_model.loader.load(sess, export.get("tags", ["serve"]), export["path"])
    serving = meta.signature_def["serving_default"]
    feed = serving.inputs["ids"].name
    fetches = {k: v.name for k, v in serving.outputs.items()}
    live = VERSION_SIGNATURE in meta.signature_def  # (not the plain frozen export)
    version = meta.signature_def[VERSION_SIGNATURE].outputs["version"].name if live else None
    report = {"signatures": sorted(meta.signature_def), "op_types": _closure_op_types(graph, fetches.values())}
    results = []
    for i, action in enumerate(export["actions"]):
        if action == "predict":
            values = sess.run(fetches, {feed: ids})
            for key, value in values.items():
                out["%s/%d/%s" % (prefix, i, key)] = value
            results.append({"version": int(sess.run(version))} if live else {})
        else:
            try:
                applied = tf_ext.serving.apply_update(sess, action[1], meta if i % 2 else None)
                results.append({"version": applied[0], "applied": applied[1]})
            except tf.errors.OpError as e:
                results.append(_error(e))
    sess.close()
    report["results"] = results
    return report


def _serve_tf2(export, ids, out, prefix):
    loaded = tf.saved_model.load(export["path"], tags=["serve"])
    serving = loaded.signatures["serving_default"]
    version = loaded.signatures[VERSION_SIGNATURE]
    apply = loaded.signatures[APPLY_SIGNATURE]
    results = []
    for i, action in enumerate(export["actions"]):
        if action == "predict":
            for key, value in serving(ids=tf.constant(ids)).items():
                out["%s/%d/%s" % (prefix, i, key)] = value.numpy()
            results.append({"version": int(version()["version"].numpy())})
        else:
            try:
                applied = apply(update_dir=tf.constant(action[1]))
                results.append(
                    {"version": int(applied["version"].numpy()), "applied": bool(applied["applied"].numpy())}
                )
            except tf.errors.OpError as e:
                results.append(_error(e))
    return {"signatures": sorted(loaded.signatures), "results": results}


def main():
    request = json.load(open(sys.argv[1]))
    ids = np.load(request["ids"])
    out, report = {}, {}
    for name, export in request["exports"].items():
        serve = _serve_tf1 if export["loader"] == "tf1" else _serve_tf2
        report[name] = serve(export, ids, out, name)
    np.savez(sys.argv[2], **out)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
