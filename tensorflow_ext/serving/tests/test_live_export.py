"""Updatable (live) SavedModels: the export, fresh-process loads (TF1 loader and TF2 tf.saved_model.load), serving
updates applied through the tf_ext_apply_update signature, and the refusals.

A model with a one-shard and a two-shard embedding, a dense layer and the global step is trained and checkpointed;
it is exported as a plain frozen SavedModel (the reference) and as live models: by the Builder with ref variables
(TF1's default) and with resource variables, and by Estimator.export_saved_model. Serving updates are written by
hand with update_format's names (SaveV2 in a small graph); a numpy evaluation of the parameters each update leaves
says what every served prediction must be.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.keys import HashPartition
from tensorflow_ext.serving import live
from tensorflow_ext.serving import update_format

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "live_worker.py")
DIM = 8
MODEL = "ctr"
TRAIN_IDS = 200
SHARDS = {"item": 1, "user": 2}


def _variable_scope(use_resource):
    return tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), use_resource=use_resource)


def _model(ids):
    """(probability [batch], version) of int64 ids [batch, 2] (item id, user id)."""
    embs = [
        tf_ext.get_dynamic_embedding(
            name, DIM, num_shards=SHARDS[name], initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=i)
        )
        for i, name in enumerate(("item", "user"))
    ]
    x = tf.concat([tf_ext.embedding_lookup(emb, ids[:, i]) for i, emb in enumerate(embs)], 1)
    w = tf.compat.v1.get_variable("w", [2 * DIM, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    return tf.identity(tf.sigmoid(tf.matmul(x, w) + b)[:, 0], name="prob"), embs


def _layout_entries():
    """The layout lines of the model's live export (what a trainer's update of it holds)."""
    entries = [update_format.table_entry("%s/part_%d" % (n, i), DIM) for n, k in SHARDS.items() for i in range(k)]
    entries.append(update_format.dense_entry("w", "float32", [2 * DIM, 1]))
    entries.append(update_format.dense_entry("b", "float32", [1]))
    return entries


def _numpy_predict(params, ids):
    def rows(table, keys):
        return np.stack([table.get(int(k), np.zeros(DIM, np.float32)) for k in keys])

    x = np.concatenate([rows(params["item"], ids[:, 0]), rows(params["user"], ids[:, 1])], 1)
    return 1.0 / (1.0 + np.exp(-(x @ params["w"] + params["b"])[:, 0]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Trains with Adagrad and checkpoints into an Estimator model_dir: (model_dir, params, global step)."""
    model_dir = str(tmp_path_factory.mktemp("model"))
    rng = np.random.RandomState(0)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        prob, embs = _model(ids)
        loss = tf.compat.v1.losses.log_loss(labels, prob)
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(20):
            batch = rng.randint(0, TRAIN_IDS, size=[64, 2])
            sess.run(train, {ids: batch, labels: (batch[:, 0] % 2).astype(np.float32)})
        tf.compat.v1.train.Saver().save(sess, os.path.join(model_dir, "model.ckpt"), global_step=step)
        params = {}
        for emb in embs:
            exported = emb.export()
            keys, values = sess.run([exported.keys, exported.values])
            params[emb.name] = dict(zip(keys.tolist(), values))
        with tf.compat.v1.variable_scope("", reuse=True):
            params["w"], params["b"] = sess.run([tf.compat.v1.get_variable("w"), tf.compat.v1.get_variable("b")])
        global_step = int(sess.run(step))
    return model_dir, params, global_step


def _edges(graph):
    return {
        op.name: ([t.name for t in op.inputs], [c.name for c in op.control_inputs]) for op in graph.get_operations()
    }


def _export_builder(model_dir, export_dir, live_model, use_resource=False, second_tags=None, value_dtype=None):
    """A Builder export of the model (inside freeze_for_serving(live_model=...)), and with `second_tags` a second
    meta graph of it (add_meta_graph); returns whether the exporting graph's ops kept their edges and the session
    still computes what it computed before."""
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
        with tf_ext.serving.freeze_for_serving(value_dtype, live_model), _variable_scope(use_resource):
            tf.compat.v1.train.get_or_create_global_step()
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
            prob, _ = _model(ids)
            outputs = {"prob": prob, "version": tf_ext.serving.served_version()}
            tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(model_dir))
            probe = np.array([[1, 2], [3, 4]], np.int64)
            before_values = sess.run(outputs, {ids: probe})
            before = _edges(graph)
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess,
                ["serve"],
                signature_def_map={
                    "serving_default": tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, outputs)
                },
            )
            if second_tags:
                signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, outputs)
                builder.add_meta_graph(second_tags, {"serving_default": signature})
            builder.save()
        after = _edges(graph)
        unchanged = all(after[name] == edges for name, edges in before.items())
        after_values = sess.run(outputs, {ids: probe})
        same = all(np.array_equal(before_values[k], after_values[k]) for k in outputs)
    return unchanged and same


def _model_fn(features, labels, mode, params):
    del labels
    with _variable_scope(params["use_resource"]):
        prob, _ = _model(features["ids"])
    predictions = {"prob": prob, "version": tf_ext.serving.served_version()}
    return tf.estimator.EstimatorSpec(mode, predictions=predictions)


def _export_estimator(model_dir, export_base, live_model, use_resource=False):
    est = tf.estimator.Estimator(_model_fn, model_dir=model_dir, params={"use_resource": use_resource})

    def serving_input_fn():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
        return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})

    with tf_ext.serving.freeze_for_serving(live_model=live_model):
        return est.export_saved_model(export_base, serving_input_fn).decode()


# ---------------------------------------------------------------------------------------------- updates


def _write_update(update_dir, kind, from_step, to_step, shards, dense, model_name=MODEL, entries=None):
    """Writes a serving update with update_format's names: shards {shard name: (keys, values, removed)} (missing
    shards: nothing changed), dense {variable name: value}; `entries` the layout lines (default: the model's plus
    one it does not read, as a trainer may write)."""
    entries = list(_layout_entries() if entries is None else entries)
    entries.append(update_format.dense_entry("unread", "float32", [3]))
    tensors = {
        update_format.META_MODEL_NAME: np.array(model_name.encode()),
        update_format.META_LAYOUT: np.array(update_format.layout(entries).encode()),
        update_format.META_KIND: np.array(kind.encode()),
        update_format.META_FROM_STEP: np.int64(from_step),
        update_format.META_TO_STEP: np.int64(to_step),
        "unread": np.ones([3], np.float32),
    }
    for shard in ("%s/part_%d" % (n, i) for n, k in SHARDS.items() for i in range(k)):
        keys, values, removed = shards.get(shard, ([], np.zeros([0, DIM]), []))
        tensors[update_format.keys_name(shard)] = np.asarray(keys, np.int64)
        tensors[update_format.values_name(shard)] = np.asarray(values, np.float32).reshape([-1, DIM])
        tensors[update_format.removed_name(shard)] = np.asarray(removed, np.int64)
    for name, value in dense.items():
        tensors[update_format.dense_name(name)] = np.asarray(value, np.float32)
    os.makedirs(update_dir)
    names = sorted(tensors)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sess.run(
            tf.raw_ops.SaveV2(
                prefix=update_format.bundle_prefix(update_dir),
                tensor_names=names,
                shape_and_slices=[""] * len(names),
                tensors=[tf.constant(tensors[n]) for n in names],
            )
        )
    return update_dir


def _by_shard(name, keys):
    """{shard name: keys of it} of an embedding's keys."""
    parts = HashPartition(SHARDS[name]).part_ids_numpy(np.asarray(keys, np.int64))
    return {"%s/part_%d" % (name, i): np.asarray(keys, np.int64)[parts == i] for i in range(SHARDS[name])}


def _delta(params, rng, changed, added, removed):
    """(shards of a delta that removes `removed` keys, then sets `changed` + `added` keys to new rows and the dense
    variables to new values; the params after it: a key both removed and set ends with its new row)."""
    new = {k: (dict(v) if isinstance(v, dict) else v) for k, v in params.items()}
    shards = {}
    for name in SHARDS:
        rows = {int(k): rng.normal(0, 0.3, DIM).astype(np.float32) for k in list(changed[name]) + list(added[name])}
        for key in removed[name]:
            new[name].pop(int(key), None)
        new[name].update(rows)
        row_keys, removed_keys = _by_shard(name, sorted(rows)), _by_shard(name, removed[name])
        for shard, keys in row_keys.items():
            values = np.array([rows[int(k)] for k in keys], np.float32).reshape([-1, DIM])
            shards[shard] = (keys, values, removed_keys[shard])
    new["w"] = rng.normal(0, 0.5, [2 * DIM, 1]).astype(np.float32)
    new["b"] = rng.normal(0, 0.5, [1]).astype(np.float32)
    return shards, new


@pytest.fixture(scope="module")
def updates(trained, tmp_path_factory):
    """The updates every live export is given, in order, and the params expected after each."""
    _, params, step = trained
    base = tmp_path_factory.mktemp("updates")
    rng = np.random.RandomState(1)
    trained_keys = {name: sorted(params[name]) for name in SHARDS}
    changed = {n: trained_keys[n][:30] for n in SHARDS}
    removed = {n: trained_keys[n][25:45] for n in SHARDS}  # 5 keys both removed and changed
    added = {n: list(range(10**6, 10**6 + 12)) for n in SHARDS}
    delta_shards, after_delta = _delta(params, rng, changed, added, removed)
    delta = _write_update(
        str(base / "delta"), "delta", step, step + 5, delta_shards, {"w": after_delta["w"], "b": after_delta["b"]}
    )
    # A full update holds every row: keys it does not hold are gone.
    full_params = {
        n: {int(k): rng.normal(0, 0.3, DIM).astype(np.float32) for k in trained_keys[n][40:]} for n in SHARDS
    }
    full_params["w"] = rng.normal(0, 0.5, [2 * DIM, 1]).astype(np.float32)
    full_params["b"] = rng.normal(0, 0.5, [1]).astype(np.float32)
    full_shards = {}
    for name in SHARDS:
        for shard, keys in _by_shard(name, sorted(full_params[name])).items():
            full_shards[shard] = (keys, np.stack([full_params[name][int(k)] for k in keys]), [])
    full = _write_update(
        str(base / "full"), "full", 0, step + 9, full_shards, {"w": full_params["w"], "b": full_params["b"]}
    )
    dense = {"w": params["w"], "b": params["b"]}
    foreign = _write_update(str(base / "foreign"), "delta", step, step + 6, {}, dense, model_name="other")
    other_layout = [e for e in _layout_entries() if not e.startswith("dense w ")]
    other_layout.append(update_format.dense_entry("w", "float32", [2 * DIM, 2]))
    layout = _write_update(str(base / "layout"), "delta", step, step + 6, {}, dense, entries=other_layout)
    gap = _write_update(str(base / "gap"), "delta", step + 7, step + 8, {}, dense)
    ids = np.concatenate(
        [
            np.array(list(zip(trained_keys["item"][:50], trained_keys["user"][:50]))),  # changed, removed, kept
            np.array([[k, k + 1] for k in added["item"]]),  # added keys
            np.random.RandomState(2).randint(0, TRAIN_IDS, size=[40, 2]),
            [[5 * 10**7, 2**62]],  # never seen
        ]
    ).astype(np.int64)
    return dict(
        ids=ids,
        delta=delta,
        full=full,
        foreign=foreign,
        layout=layout,
        gap=gap,
        params=[params, after_delta, full_params],
        steps=[step, step + 5, step + 9],
    )


# The actions every live export serves, in order, and what each expects: "predict" at the params of a stage.
_ACTIONS = [
    ("predict", 0),
    ("delta", "applied"),
    ("predict", 1),
    ("delta", "stale"),
    ("foreign", "InvalidArgumentError"),
    ("layout", "InvalidArgumentError"),
    ("gap", "FailedPreconditionError"),
    ("predict", 1),
    ("full", "applied"),
    ("predict", 2),
]


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory):
    model_dir = trained[0]
    base = tmp_path_factory.mktemp("exports")
    exports, unchanged = {}, {}
    exports["frozen"] = str(base / "frozen")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:  # the reference: a plain frozen export
        with tf_ext.serving.freeze_for_serving():
            tf.compat.v1.train.get_or_create_global_step()
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
            prob, _ = _model(ids)
        tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(model_dir))
        tf.compat.v1.saved_model.simple_save(sess, exports["frozen"], {"ids": ids}, {"prob": prob})
    for name, use_resource in (("builder_ref", False), ("builder_resource", True)):
        exports[name] = str(base / name)
        unchanged[name] = _export_builder(model_dir, exports[name], MODEL, use_resource, SECOND_TAGS)
    exports["builder_bfloat16"] = str(base / "builder_bfloat16")
    _export_builder(model_dir, exports["builder_bfloat16"], MODEL, value_dtype=tf.bfloat16)
    exports["estimator_ref"] = _export_estimator(model_dir, str(base / "estimator_ref"), MODEL)
    exports["estimator_resource"] = _export_estimator(model_dir, str(base / "estimator_resource"), MODEL, True)
    return exports, unchanged


def _run_worker(tmp, request):
    req_file, out_file = os.path.join(tmp, "request.json"), os.path.join(tmp, "out.npz")
    json.dump(request, open(req_file, "w"))
    proc = subprocess.run(
        [sys.executable, _WORKER, req_file, out_file],
        cwd=tmp,
        env=dict(os.environ, PYTHONPATH=_ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), dict(np.load(out_file))


LIVE_TF1 = ["builder_ref", "builder_resource", "estimator_ref", "estimator_resource", "builder_ref/second"]
SECOND_TAGS = ["serve", "second"]  # the Builder exports' second meta graph (add_meta_graph)
LIVE_TF2 = ["builder_resource", "estimator_ref"]


def _actions(updates):
    return [a if a == "predict" else ["apply", updates[a]] for a, _ in _ACTIONS]


@pytest.fixture(scope="module")
def served_tf1(exports, updates, tmp_path_factory):
    """Every export in one fresh process (TF1 loader, a Session each)."""
    tmp = str(tmp_path_factory.mktemp("serve_tf1"))
    np.save(os.path.join(tmp, "ids.npy"), updates["ids"])
    request = {"ids": os.path.join(tmp, "ids.npy"), "exports": {}}
    request["exports"]["frozen"] = dict(path=exports[0]["frozen"], loader="tf1", actions=["predict"], frozen=True)
    for name in LIVE_TF1 + ["builder_bfloat16"]:
        path, tags = (exports[0][name.split("/")[0]], SECOND_TAGS) if "/" in name else (exports[0][name], ["serve"])
        request["exports"][name] = dict(path=path, tags=tags, loader="tf1", actions=_actions(updates))
    return _run_worker(tmp, request)


@pytest.fixture(scope="module", params=LIVE_TF2)
def served_tf2(request, exports, updates, tmp_path_factory):
    """One export in a fresh process with TF2's tf.saved_model.load (eager: a process per export, since eager
    functions share resources by name across loaded models)."""
    tmp = str(tmp_path_factory.mktemp("serve_tf2"))
    np.save(os.path.join(tmp, "ids.npy"), updates["ids"])
    name = request.param
    work = {"ids": os.path.join(tmp, "ids.npy"), "exports": {name: dict(path=exports[0][name], loader="tf2")}}
    work["exports"][name]["actions"] = _actions(updates)
    report, out = _run_worker(tmp, work)
    return name, report, out


def _bfloat16_nearest(x):
    """float32 rounded to bfloat16 (nearest even) and back, by its bits."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _check_served(name, report, out, updates, rows=lambda row: row):
    """Checks the served results of _ACTIONS; `rows` maps a row to how the export's tables store it."""
    results = report[name]["results"]
    assert len(results) == len(_ACTIONS), results
    stage_version = updates["steps"]
    version = stage_version[0]
    for i, ((action, expect), result) in enumerate(zip(_ACTIONS, results)):
        if action == "predict":
            assert "error" not in result, result
            assert result["version"] == stage_version[expect] == version, (i, result)
            params = dict(updates["params"][expect])
            params.update({n: {k: rows(v) for k, v in params[n].items()} for n in SHARDS})
            expected = _numpy_predict(params, updates["ids"])
            np.testing.assert_allclose(out["%s/%d/prob" % (name, i)], expected, rtol=1e-5, atol=1e-6)
            # served_version() in the model reads the request's version
            np.testing.assert_array_equal(out["%s/%d/version" % (name, i)], version)
        elif expect in ("applied", "stale"):
            assert "error" not in result, (i, result)
            if expect == "applied":
                version = stage_version[1] if action == "delta" else stage_version[2]
            assert result == {"version": version, "applied": expect == "applied"}, (i, action, result)
        else:
            assert result.get("error") == expect, (i, action, result)
    return results


@pytest.mark.parametrize("name", LIVE_TF1)
def test_live_exports_serve_the_frozen_predictions(served_tf1, updates, name):
    report, out = served_tf1
    reference = out["frozen/0/prob"]
    np.testing.assert_allclose(reference, _numpy_predict(updates["params"][0], updates["ids"]), rtol=1e-5, atol=1e-6)
    # Before any update a live model serves exactly the plain frozen export's predictions.
    np.testing.assert_array_equal(out["%s/0/prob" % name], reference)
    assert {live.APPLY_SIGNATURE, live.VERSION_SIGNATURE, "serving_default"} <= set(report[name]["signatures"])
    # The served graph reads the live model: past the pin, no table or variable is read.
    op_types = set(report[name]["op_types"])
    assert {"TfExtLivePin", "TfExtLiveFind", "TfExtLiveDense", "TfExtLiveVersion"} <= op_types, sorted(op_types)
    state_ops = {"TfExtFrozenTableFind", "TfExtFrozenTableHandle", "ReadVariableOp", "VarHandleOp", "VariableV2"}
    assert not op_types & state_ops, sorted(op_types)


@pytest.mark.parametrize("name", LIVE_TF1)
def test_updates_change_predictions_as_numpy_says_tf1_loader(served_tf1, updates, name):
    report, out = served_tf1
    _check_served(name, report, out, updates)


def test_compact_rows_take_updates_rounded_as_they_store_rows(served_tf1, updates):
    report, out = served_tf1
    _check_served("builder_bfloat16", report, out, updates, rows=_bfloat16_nearest)
    # (the rounding shows: float32 rows would serve other predictions)
    float32 = _numpy_predict(updates["params"][1], updates["ids"])
    assert np.abs(out["builder_bfloat16/2/prob"] - float32).max() > 1e-4


def test_updates_change_predictions_as_numpy_says_tf2_load(served_tf2, updates):
    name, report, out = served_tf2
    assert {live.APPLY_SIGNATURE, live.VERSION_SIGNATURE, "serving_default"} <= set(report[name]["signatures"])
    _check_served(name, report, out, updates)


@pytest.mark.parametrize("name", LIVE_TF1)
def test_foreign_and_other_layout_updates_are_refused_naming_both(served_tf1, name):
    results = served_tf1[0][name]["results"]
    by_action = {action: result for (action, _), result in zip(_ACTIONS, results)}
    foreign = by_action["foreign"]["message"]
    assert "'other'" in foreign and "'%s'" % MODEL in foreign, foreign
    layout = by_action["layout"]["message"]
    assert "dense w float32 16,1" in layout and "dense w float32 16,2" in layout, layout


def test_the_exporting_graph_keeps_its_edges(exports):
    assert exports[1] == {"builder_ref": True, "builder_resource": True}


def test_served_version_outside_a_live_export_is_the_global_step():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        assert sess.run(tf_ext.serving.served_version()) == 0
        step = tf.compat.v1.train.get_or_create_global_step()
        version = tf_ext.serving.served_version()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(step.assign(17))
        assert sess.run(version) == 17


def test_live_models_refuse_what_they_cannot_update(tmp_path):
    with pytest.raises(ValueError, match="export_rows"):
        with tf_ext.serving.freeze_for_serving(live_model=MODEL), tf_ext.serving.export_rows(tf.float16):
            pass
    with pytest.raises(ValueError, match="export_rows"):
        with tf_ext.serving.export_rows(tf.float16), tf_ext.serving.freeze_for_serving(live_model=MODEL):
            pass
    for name in ("", "two words", 3):
        with pytest.raises(ValueError, match="non-empty str without whitespace"):
            with tf_ext.serving.freeze_for_serving(live_model=name):
                pass

    def export(build, name, before=lambda: None):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            made = before()  # outside the live scope
            with tf_ext.serving.freeze_for_serving(live_model=MODEL):
                ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
                out = build(ids, made)
                sess.run(tf.compat.v1.global_variables_initializer())
                builder = tf.compat.v1.saved_model.Builder(str(tmp_path / name))
                signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"out": out})
                builder.add_meta_graph_and_variables(sess, ["serve"], {"serving_default": signature})

    def lookup(ids, emb):
        return tf_ext.embedding_lookup(emb, ids)

    def gathered_variable(ids, _):
        table = tf.compat.v1.get_variable("table", [10, 4], use_resource=True)
        return tf.gather(table, ids)

    def lookup_in_cond(ids, _):
        emb = tf_ext.get_dynamic_embedding("item", 4)
        return tf.compat.v1.cond(tf.size(ids) > 0, lambda: tf_ext.embedding_lookup(emb, ids), lambda: tf.zeros([0, 4]))

    with pytest.raises(ValueError, match=r"live model 'ctr'.*plain table 'plain/part_0'"):
        export(lookup, "plain", before=lambda: tf_ext.get_dynamic_embedding("plain", 4))
    with pytest.raises(ValueError, match=r"live model 'ctr'.*variable 'table'.*ResourceGather"):
        export(gathered_variable, "gather")
    with pytest.raises(ValueError, match=r"live model 'ctr'.*inside a tf\.cond"):
        export(lookup_in_cond, "cond")


def test_a_trainers_updates_bring_the_served_model_to_the_trainers_state(trained, exports, tmp_path):
    """The trainer goes on from the exported checkpoint with a ServingUpdateWriter (deltas with new, retrained and
    removed keys, some of them removed and trained again between two updates, the last one with a full snapshot
    beside it); the live exports, given its updates in order, serve after each one what numpy computes from the
    trainer's parameters at that update (so a delta that lost a removal or a row shows), and so does an export given
    the snapshot alone (a resync)."""
    from tensorflow_ext.serving.updates import ServingUpdateWriter  # pylint: disable=import-outside-toplevel

    model_dir, _, step = trained
    updates_dir = str(tmp_path / "updates")
    rng = np.random.RandomState(3)
    removed_keys = np.arange(0, TRAIN_IDS, 7)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        prob, embs = _model(ids)
        loss = tf.compat.v1.losses.log_loss(labels, prob)
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=global_step)
        remove = embs[1].remove(tf.constant(removed_keys, tf.int64))
        writer = ServingUpdateWriter(updates_dir, model_name=MODEL)
        tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(model_dir))
        writer.start(sess)

        def trainer_params():
            params = {}
            for emb in embs:
                exported = emb.export()
                keys, values = sess.run([exported.keys, exported.values])
                params[emb.name] = dict(zip(keys.tolist(), values))
            with tf.compat.v1.variable_scope("", reuse=True):
                params["w"], params["b"] = sess.run([tf.compat.v1.get_variable("w"), tf.compat.v1.get_variable("b")])
            return params

        manifests, stages = [], []
        for round_ in range(3):
            for i in range(4):  # ids past TRAIN_IDS are new keys
                if round_ == 1 and i == 2:
                    # Removed mid-interval: the next two steps train some of them again (removed and re-added
                    # between two updates), the others stay removed.
                    sess.run(remove)
                batch = rng.randint(0, TRAIN_IDS + 100, size=[64, 2])
                sess.run(train, {ids: batch, labels: (batch[:, 1] % 2).astype(np.float32)})
            manifests.append(writer.write(sess, full=round_ == 2))
            stages.append(trainer_params())
        snapshot = writer.last_snapshot
    assert [m["kind"] for m in manifests] == ["delta", "delta", "delta"]
    assert (snapshot["kind"], snapshot["to_step"]) == ("full", manifests[2]["to_step"])
    assert manifests[1]["removed"] > 0
    readded = [k for k in removed_keys.tolist() if k in stages[1]["user"]]
    assert readded and len(readded) < len(removed_keys), "the test must see keys re-added and keys left removed"
    to_steps = [m["to_step"] for m in manifests]
    assert to_steps == [step + 4, step + 8, step + 12]
    # Every removed user key (re-added or not), random ids, new and unknown ones.
    serve_ids = np.concatenate(
        [
            np.stack([rng.randint(0, TRAIN_IDS, len(removed_keys)), removed_keys], 1),
            rng.randint(0, TRAIN_IDS + 100, size=[64, 2]),
            [[TRAIN_IDS + 500, 2**40]],
        ]
    )
    np.save(str(tmp_path / "ids.npy"), serve_ids.astype(np.int64))
    actions = []
    for _, path in update_format.list_updates(updates_dir):
        actions += [["apply", path], "predict"]
    request = {"ids": str(tmp_path / "ids.npy"), "exports": {}}
    for name in ("builder_ref", "estimator_resource"):
        request["exports"][name] = dict(path=exports[0][name], loader="tf1", actions=actions)
    (snapshot_path,) = [p for _, p in update_format.list_snapshots(updates_dir)]
    request["exports"]["resync"] = dict(
        path=exports[0]["builder_ref"], loader="tf1", actions=[["apply", snapshot_path], "predict"]
    )
    report, out = _run_worker(str(tmp_path), request)
    assert report["resync"]["results"] == [{"version": to_steps[2], "applied": True}, {"version": to_steps[2]}]
    np.testing.assert_allclose(
        out["resync/1/prob"], _numpy_predict(stages[2], serve_ids), rtol=1e-5, atol=1e-6, err_msg="the snapshot"
    )
    for name in ("builder_ref", "estimator_resource"):
        results = report[name]["results"]
        assert results[0::2] == [{"version": s, "applied": True} for s in to_steps], results
        assert results[1::2] == [{"version": s} for s in to_steps], results
        for u, params in enumerate(stages):
            expected = _numpy_predict(params, serve_ids)
            got = out["%s/%d/prob" % (name, 2 * u + 1)]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg="%s after update %d" % (name, u))
            np.testing.assert_array_equal(out["%s/%d/version" % (name, 2 * u + 1)], to_steps[u])


def test_apply_update_refuses_a_model_that_is_not_live(exports, updates):
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], exports[0]["frozen"])
        with pytest.raises(
            ValueError, match=r"no signature 'tf_ext_apply_update' \(signatures: \['serving_default'\]\)"
        ):
            tf_ext.serving.apply_update(sess, updates["delta"], meta)
        with pytest.raises(ValueError, match="holds no live export"):
            tf_ext.serving.apply_update(sess, updates["delta"])


def test_the_builders_base_class_exports_live_models_too(tmp_path):
    """TF's _SavedModelBuilder (the base class of tf.compat.v1.saved_model.Builder, which overrides both methods
    without calling it) is patched as well."""
    from tensorflow.python.saved_model import builder_impl  # pylint: disable=import-outside-toplevel

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with tf_ext.serving.freeze_for_serving(live_model=MODEL):
            tf.compat.v1.train.get_or_create_global_step()
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
            prob, _ = _model(ids)
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = builder_impl._SavedModelBuilder(str(tmp_path / "base"))  # pylint: disable=protected-access
            signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"prob": prob})
            builder.add_meta_graph_and_variables(sess, ["serve"], {"serving_default": signature})
            builder.add_meta_graph(["serve", "second"], {"serving_default": signature})
            builder.save()
    for tags in (["serve"], ["serve", "second"]):
        with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, tags, str(tmp_path / "base"))
            assert {live.APPLY_SIGNATURE, live.VERSION_SIGNATURE} <= set(meta.signature_def)
            prob = graph.get_tensor_by_name(meta.signature_def["serving_default"].outputs["prob"].name)
            closure_types = {op.type for op in live._closure([prob])}  # pylint: disable=protected-access
            assert "TfExtLiveFind" in closure_types and "TfExtFrozenTableFind" not in closure_types
            assert sess.run(prob, {meta.signature_def["serving_default"].inputs["ids"].name: [[1, 2]]}).shape == (1,)
            assert sess.run(meta.signature_def[live.VERSION_SIGNATURE].outputs["version"].name) == 0
