"""The C++ runtime program (tensorflow_ext/serving/cc/live_serving_check) against Python serving the same SavedModels.

A fresh process trains a small model (a 2-shard embedding "item" and dense variables "w" [4] and "b" []) to global
step 10 and exports it twice: frozen, and frozen and updatable (`freeze_for_serving(live_model=MODEL)`). It writes
serving updates for the updatable export by hand, as `update_format` describes them: a delta (new rows, a new key,
a removed key, new dense values), then a full update. A second fresh process serves both exports from Python (the
TF1 loader, `tf_ext.serving.apply_update`) and records its predictions before and after each update. The program,
with the ops linked in and (its _dlopen variant) with the op library loaded at run time, must predict exactly
(bit for bit) what Python predicts at every step, report the same versions, and both must match a numpy model of
the rows the updates hold. A foreign update (another model's name) and a gap must end the program with a nonzero
exit and the apply op's message on stderr, without writing its output.

The programs come from `make build` (bazel-bin/tensorflow_ext/serving/cc/); `$TF_EXT_LIVE_SERVING_CHECK` names
another build of the linked one.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tensorflow_ext.embedding.tests.conftest import run_fresh

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_BIN_DIR = os.path.join(_ROOT, "bazel-bin", "tensorflow_ext", "serving", "cc")
OPS_SO = os.path.join(_ROOT, "tensorflow_ext", "_tf_ext_ops.so")

MODEL = "cc_model"
DIM = 4
NUM_SHARDS = 2
STEP = 10  # the trained global step: the live export's version
TRAIN_IDS = [1, 2, 3, 4, 5, 6]
# Trained keys, a key the delta adds (7), one only the full update has (8) and one never seen (99).
SERVE_IDS = [1, 2, 3, 4, 5, 6, 7, 8, 99]
INITIAL = 0.1  # the embedding's initializer: what an absent key reads


def _row(seed):
    return [round(seed + 0.25 * j, 2) for j in range(DIM)]


# The updates, in the order they are applied: (directory name, model name, kind, from_step, to_step, rows, removed,
# w, b). Rows {key: row}; a full update's rows are the whole table.
UPDATES = [
    ("delta", MODEL, "delta", STEP, STEP + 5, {1: _row(-1.0), 7: _row(2.0)}, [3], [0.5, -1.0, 2.0, 0.25], 0.75),
    ("full", MODEL, "full", 0, STEP + 9, {1: _row(0.5), 2: _row(-0.5), 8: _row(1.5)}, [], [1.0, 1.0, -1.0, 2.0], -2.0),
    # Refused: another model's update, and a delta from a step the model has not reached (a gap).
    ("foreign", "other_model", "delta", STEP, STEP + 5, {1: _row(9.0)}, [], [0.0] * DIM, 0.0),
    ("gap", MODEL, "delta", STEP + 20, STEP + 25, {1: _row(9.0)}, [], [0.0] * DIM, 0.0),
]


def _model(tf, tf_ext, ids):
    """Score [batch] of int64 ids [batch]: sum(item row * w) + b."""
    emb = tf_ext.get_dynamic_embedding("item", DIM, num_shards=NUM_SHARDS, initializer=INITIAL)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, -0.5, 0.25, 2.0]))
    b = tf.compat.v1.get_variable("b", initializer=tf.constant(0.1))
    return emb, tf.identity(tf.reduce_sum(tf_ext.embedding_lookup(emb, ids) * w, axis=1) + b, name="score")


def _export_all(work):
    """(Fresh process.) Trains to STEP, exports <work>/plain and <work>/live, writes the updates under <work>/updates,
    and <work>/truth.json: the trained rows, w, b and the live model's layout."""
    import tensorflow as tf

    import tensorflow_ext as tf_ext
    from tensorflow_ext.embedding.keys import hash_key_numpy
    from tensorflow_ext.serving import update_format

    tf.compat.v1.disable_v2_behavior()
    ckpt = os.path.join(work, "ckpt", "model")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb, score = _model(tf, tf_ext, ids)
        loss = tf.reduce_sum(tf.square(score - 0.1 * tf.cast(ids, tf.float32)))  # a target per id: distinct rows
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(STEP):
            sess.run(train, {ids: TRAIN_IDS})
        exported = emb.export()
        keys, values, w, b, at = sess.run([exported.keys, exported.values, "w:0", "b:0", step])
        assert at == STEP, at
        tf.compat.v1.train.Saver().save(sess, ckpt)
    truth = {"rows": {str(k): v.tolist() for k, v in zip(keys, values)}, "w": w.tolist(), "b": float(b)}

    for name, scope in (("plain", tf_ext.serving.freeze_for_serving), ("live", None)):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            with scope() if scope else tf_ext.serving.freeze_for_serving(live_model=MODEL):
                tf.compat.v1.train.get_or_create_global_step()
                ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
                _, score = _model(tf, tf_ext, ids)
                tf.compat.v1.train.Saver().restore(sess, ckpt)
                builder = tf.compat.v1.saved_model.Builder(os.path.join(work, name))
                builder.add_meta_graph_and_variables(
                    sess,
                    ["serve"],
                    signature_def_map={
                        "serving_default": tf.compat.v1.saved_model.predict_signature_def(
                            {"ids": ids}, {"score": score}
                        )
                    },
                )
                builder.save()

    # The live model's layout, as its export recorded it (the model handle's attrs).
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], os.path.join(work, "live"))
    handles = [n for n in meta.graph_def.node if n.op == "TfExtLiveModelHandle"]
    assert len(handles) == 1, [n.name for n in handles]
    layout = handles[0].attr["layout"].s.decode()
    assert handles[0].attr["model_name"].s.decode() == MODEL
    tables, dense = update_format.parse_layout(layout)
    assert sorted(dense) == ["b", "w"], layout
    # The table lines name the shards in index order (the shard names end with their index).
    shards = sorted(tables)
    assert len(shards) == NUM_SHARDS and all(tables[s] == DIM for s in shards), layout
    truth["layout"] = layout

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        for name, model, kind, from_step, to_step, rows, removed, new_w, new_b in UPDATES:
            update_dir = os.path.join(work, "updates", name, update_format.update_dir_name(to_step))
            os.makedirs(update_dir)
            tensors = {
                update_format.META_MODEL_NAME: tf.constant(model),
                update_format.META_LAYOUT: tf.constant(layout),
                update_format.META_KIND: tf.constant(kind),
                update_format.META_FROM_STEP: tf.constant(from_step, tf.int64),
                update_format.META_TO_STEP: tf.constant(to_step, tf.int64),
                "w": tf.constant(new_w, tf.float32),
                "b": tf.constant(new_b, tf.float32),
            }
            row_keys = np.array(sorted(rows), np.int64)
            row_shard = hash_key_numpy(row_keys) % np.uint64(NUM_SHARDS)
            gone = np.array(removed, np.int64)
            gone_shard = hash_key_numpy(gone) % np.uint64(NUM_SHARDS)
            for i, shard in enumerate(shards):
                mine = row_keys[row_shard == i]
                tensors[update_format.keys_name(shard)] = tf.constant(mine, tf.int64)
                tensors[update_format.values_name(shard)] = tf.constant(
                    np.array([rows[k] for k in mine], np.float32).reshape(-1, DIM)
                )
                tensors[update_format.removed_name(shard)] = tf.constant(gone[gone_shard == i], tf.int64)
            names = sorted(tensors)
            sess.run(
                tf.raw_ops.SaveV2(
                    prefix=update_format.bundle_prefix(update_dir),
                    tensor_names=names,
                    shape_and_slices=[""] * len(names),
                    tensors=[tensors[n] for n in names],
                )
            )
            manifest = {
                "format": update_format.FORMAT_VERSION,
                "model_name": model,
                "kind": kind,
                "from_step": from_step,
                "to_step": to_step,
                "layout": layout,
                "created_unix": 0.0,
                "keys": len(rows),
                "removed": len(removed),
            }
            update_format.write_manifest(update_dir, manifest)
    with open(os.path.join(work, "truth.json"), "w") as f:
        json.dump(truth, f)


def _update_dir(work, name):
    parent = os.path.join(work, "updates", name)
    (entry,) = os.listdir(parent)
    return os.path.join(parent, entry)


def _serve_python(saved_model, update_dirs, out):
    """(Fresh process.) The program's JSON, from Python: the TF1 loader, then tf_ext.serving.apply_update."""
    import tensorflow as tf

    import tensorflow_ext as tf_ext

    tf.compat.v1.disable_v2_behavior()
    sess = tf.compat.v1.Session(graph=tf.Graph())
    with sess.graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], saved_model)
    predict = meta.signature_def["serving_default"]
    version_sig = meta.signature_def.get("tf_ext_served_version")

    def served_version():
        return int(sess.run(version_sig.outputs["version"].name)) if version_sig else None

    def outputs():
        (score,) = sess.run([predict.outputs["score"].name], {predict.inputs["ids"].name: SERVE_IDS})
        return {"score": {"dtype": score.dtype.name, "shape": list(score.shape), "values": score.tolist()}}

    steps = [dict(update=None, version=None, applied=None, served_version=served_version(), outputs=outputs())]
    for update_dir in update_dirs:
        version, applied = tf_ext.serving.apply_update(sess, update_dir, meta)
        steps.append(
            dict(
                update=update_dir,
                version=int(version),
                applied=bool(applied),
                served_version=served_version(),
                outputs=outputs(),
            )
        )
    with open(out, "w") as f:
        json.dump({"steps": steps}, f)


def _program(name):
    path = os.path.join(_BIN_DIR, name)
    if name == "live_serving_check":
        path = os.environ.get("TF_EXT_LIVE_SERVING_CHECK", path)
    assert os.access(path, os.X_OK), "%s is not built: run `make build` (it builds //tensorflow_ext/serving/cc:all)" % (
        path
    )
    return path


def _run_program(name, saved_model, out, updates=(), op_library="linked"):
    """Runs the program; returns (returncode, stderr, its JSON or None when it wrote none)."""
    cmd = [_program(name), "--saved_model", saved_model, "--op_library", op_library]
    cmd += ["--ids", ",".join(str(i) for i in SERVE_IDS), "--out", out]
    for update_dir in updates:
        cmd += ["--update", update_dir]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    result = None
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    return proc.returncode, proc.stderr, result


def _scores(step):
    values = step["outputs"]["score"]
    assert values["dtype"] == "float32" and values["shape"] == [len(SERVE_IDS)], values
    return np.array(values["values"], np.float32)  # 9 digits: the float32 the program computed, exactly


def _reference(truth):
    """[(rows, w, b)] the served model should hold before the updates and after each applied one (numpy model)."""
    rows = {int(k): np.array(v, np.float64) for k, v in truth["rows"].items()}
    states = [(dict(rows), np.array(truth["w"]), truth["b"])]
    for _, _, kind, _, _, new_rows, removed, w, b in UPDATES[:2]:
        if kind == "full":
            rows = {}
        for k in removed:
            rows.pop(k, None)
        rows.update({k: np.array(v, np.float64) for k, v in new_rows.items()})
        states.append((dict(rows), np.array(w), b))
    return states


def _predict(state):
    rows, w, b = state
    return np.array([(rows.get(i, np.full(DIM, INITIAL)) * w).sum() + b for i in SERVE_IDS])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """{"work", "truth", "python": {"plain": JSON, "live": JSON}}: the exports, updates and Python's answers."""
    work = str(tmp_path_factory.mktemp("cc_runtime"))
    run_fresh("from tensorflow_ext.serving.tests.test_cc_runtime import _export_all; _export_all(%r)" % work, work)
    applied = [_update_dir(work, "delta"), _update_dir(work, "full"), _update_dir(work, "delta")]
    code = "from tensorflow_ext.serving.tests.test_cc_runtime import _serve_python\n"
    code += "_serve_python(%r, [], %r)\n" % (os.path.join(work, "plain"), os.path.join(work, "py_plain.json"))
    code += "_serve_python(%r, %r, %r)\n" % (os.path.join(work, "live"), applied, os.path.join(work, "py_live.json"))
    run_fresh(code, work)
    python = {}
    for name in ("plain", "live"):
        with open(os.path.join(work, "py_%s.json" % name)) as f:
            python[name] = json.load(f)
    with open(os.path.join(work, "truth.json")) as f:
        truth = json.load(f)
    return {"work": work, "truth": truth, "python": python, "applied": applied}


def test_plain_frozen_model_predicts_as_python(served):
    work = served["work"]
    rc, err, result = _run_program("live_serving_check", os.path.join(work, "plain"), os.path.join(work, "cc.json"))
    assert rc == 0, err
    (step,) = result["steps"]
    (expected,) = served["python"]["plain"]["steps"]
    assert step["served_version"] is None  # not an updatable export
    np.testing.assert_array_equal(_scores(step), _scores(expected))
    np.testing.assert_allclose(_scores(step), _predict(_reference(served["truth"])[0]), rtol=1e-5)
    assert result["ops"] == "linked" and result["tensorflow"]

    # An update needs the export's apply signature: refused, naming it.
    out = os.path.join(work, "cc_refused.json")
    rc, err, result = _run_program("live_serving_check", os.path.join(work, "plain"), out, [served["applied"][0]])
    assert rc == 1 and result is None
    assert "has no 'tf_ext_apply_update' signature" in err, err


@pytest.mark.parametrize("program", ["live_serving_check", "live_serving_check_dlopen"])
def test_updates_apply_as_in_python(served, program):
    work = served["work"]
    op_library = "linked" if program == "live_serving_check" else OPS_SO
    out = os.path.join(work, "cc_%s.json" % program)
    rc, err, result = _run_program(program, os.path.join(work, "live"), out, served["applied"], op_library)
    assert rc == 0, err
    expected = served["python"]["live"]["steps"]
    assert [s["update"] for s in result["steps"]] == [None] + served["applied"]
    # Before: the export's step; the delta, the full update, then the delta again (stale now: nothing changes).
    assert [s["served_version"] for s in result["steps"]] == [STEP, STEP + 5, STEP + 9, STEP + 9]
    assert [(s["version"], s["applied"]) for s in result["steps"][1:]] == [
        (STEP + 5, True),
        (STEP + 9, True),
        (STEP + 9, False),
    ]
    for step, python in zip(result["steps"], expected):
        for key in ("version", "applied", "served_version"):
            assert step[key] == python[key], (key, step, python)
        np.testing.assert_array_equal(_scores(step), _scores(python))
    states = _reference(served["truth"])
    states.append(states[-1])  # the stale delta
    for step, state in zip(result["steps"], states):
        np.testing.assert_allclose(_scores(step), _predict(state), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(_scores(result["steps"][0]), _scores(result["steps"][1]))


@pytest.mark.parametrize(
    "name, message",
    [
        ("foreign", "update for model 'other_model', this model is '%s'" % MODEL),
        ("gap", "served version %d, the update holds changes from step %d to %d" % (STEP, STEP + 20, STEP + 25)),
    ],
)
def test_refused_update_exits_nonzero(served, name, message):
    work = served["work"]
    update_dir = _update_dir(work, name)
    out = os.path.join(work, "cc_%s.json" % name)
    rc, err, result = _run_program("live_serving_check", os.path.join(work, "live"), out, [update_dir])
    assert rc == 1, (rc, err)
    assert result is None  # nothing written: a caller never reads a partial run
    assert ("live_serving_check: update %s: " % update_dir) in err and message in err, err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
