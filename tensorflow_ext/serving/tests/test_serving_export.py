"""Serving exports of dynamic embeddings: lean SavedModel contents, the frozen read-only form, compact serving rows,
fresh-process loads, and 16 threads predicting on one session.

A model with a one-shard and a three-shard embedding (Adam: two slot columns per row) is trained and checkpointed;
it is exported four ways (Builder and Estimator, plain and frozen) with float32 rows, and with bfloat16, float16 and
int8 rows (`freeze_for_serving(value_dtype)`, `export_rows(value_dtype)`), and served by a fresh process that only
imports tensorflow_ext. Predictions and served rows are compared with a numpy evaluation of the trained parameters
(compact rows: numpy's rounding of them, or the int8 bound scale / 2 per row).
"""

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.table import refs
from tensorflow_ext.utils.loader import load_ops

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_worker.py")
DIM = 8
TRAIN_IDS = 300  # ids in [0, TRAIN_IDS) are trained; the served batches also hold ids never seen


def _model(ids):
    """Probability [batch] of int64 ids [batch, 2] (item id, user id)."""
    item = tf_ext.get_dynamic_embedding(
        "item", DIM, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=1)
    )
    user = tf_ext.get_dynamic_embedding(
        "user", DIM, num_shards=3, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=2)
    )
    x = tf.concat([tf_ext.embedding_lookup(item, ids[:, 0]), tf_ext.embedding_lookup(user, ids[:, 1])], 1)
    w = tf.compat.v1.get_variable("w", [2 * DIM, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=3))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    return tf.identity(tf.sigmoid(tf.matmul(x, w) + b)[:, 0], name="prob"), x, (item, user)


def _numpy_rows(params, ids):
    """The looked-up rows [batch, 2 * DIM] in numpy: a key the training never saw reads zeros (the random
    initializer's missing row)."""

    def rows(table, keys):
        return np.stack([table.get(int(k), np.zeros(DIM, np.float32)) for k in keys])

    return np.concatenate([rows(params["item"], ids[:, 0]), rows(params["user"], ids[:, 1])], 1)


def _numpy_predict(params, ids, x=None):
    """The model in numpy, on the rows `x` (default: the trained rows of `ids`)."""
    x = _numpy_rows(params, ids) if x is None else x
    return 1.0 / (1.0 + np.exp(-(x @ params["w"] + params["b"])[:, 0]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Trains with Adam and checkpoints into an Estimator model_dir; returns (model_dir, params, train_pred, ids)."""
    model_dir = str(tmp_path_factory.mktemp("model"))
    rng = np.random.RandomState(0)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        prob, _, (item, user) = _model(ids)
        loss = tf.compat.v1.losses.log_loss(labels, prob)
        train = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs)
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(30):
            batch = rng.randint(0, TRAIN_IDS, size=[64, 2])
            sess.run(train, {ids: batch, labels: (batch[:, 0] % 2).astype(np.float32)})
        tf.compat.v1.train.Saver().save(sess, os.path.join(model_dir, "model.ckpt"), global_step=gs)
        params = {}
        for emb in (item, user):
            exported = emb.export()
            keys, values = sess.run([exported.keys, exported.values])
            params[emb.name] = dict(zip(keys.tolist(), values))
        with tf.compat.v1.variable_scope("", reuse=True):
            params["w"], params["b"] = sess.run([tf.compat.v1.get_variable("w"), tf.compat.v1.get_variable("b")])
        known = rng.randint(0, TRAIN_IDS, size=[96, 2])
        # The training graph's own predictions on trained ids (its lookups of known keys change no row).
        train_pred = sess.run(prob, {ids: known})
    serve_ids = np.concatenate([known, rng.randint(0, 10**6, size=[64, 2]), [[-1, 2**62]]]).astype(np.int64)
    return model_dir, params, train_pred, serve_ids


def _serving_scope(frozen, value_dtype):
    """The scope an export's graph is built in: frozen tables, or plain ones, with rows stored as `value_dtype`."""
    if frozen:
        return tf_ext.serving.freeze_for_serving(value_dtype)
    return tf_ext.serving.export_rows(value_dtype) if value_dtype is not None else contextlib.nullcontext()


def _export_builder(model_dir, export_dir, frozen, value_dtype=None):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with _serving_scope(frozen, value_dtype):
            ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
            prob, rows, _ = _model(ids)
        tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(model_dir))
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        builder.add_meta_graph_and_variables(
            sess,
            ["serve"],
            signature_def_map={
                "serving_default": tf.compat.v1.saved_model.predict_signature_def(
                    {"ids": ids}, {"prob": prob, "rows": rows}
                )
            },
        )
        builder.save()
    return export_dir


def _model_fn(features, labels, mode):
    del labels
    prob, rows, _ = _model(features["ids"])
    return tf.estimator.EstimatorSpec(mode, predictions={"prob": prob, "rows": rows})


def _export_estimator(model_dir, export_base, frozen, value_dtype=None):
    est = tf.estimator.Estimator(_model_fn, model_dir=model_dir)

    def serving_input_fn():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
        return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})

    with _serving_scope(frozen, value_dtype):
        return est.export_saved_model(export_base, serving_input_fn).decode()


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory):
    model_dir = trained[0]
    base = tmp_path_factory.mktemp("exports")
    exports = {
        "builder_plain": _export_builder(model_dir, str(base / "builder_plain"), False),
        "builder_frozen": _export_builder(model_dir, str(base / "builder_frozen"), True),
        "estimator_plain": _export_estimator(model_dir, str(base / "estimator_plain"), False),
        "estimator_frozen": _export_estimator(model_dir, str(base / "estimator_frozen"), True),
    }
    for name in COMPACT_EXPORTS:
        kind, table, dtype_name = name.split("_")
        export = _export_builder if kind == "builder" else _export_estimator
        exports[name] = export(model_dir, str(base / name), table == "frozen", COMPACT_DTYPES[dtype_name])
    return exports


@pytest.fixture(scope="module")
def served(trained, exports, tmp_path_factory):
    """Runs the serving worker once, in a fresh process, over every export."""
    tmp = tmp_path_factory.mktemp("serve")
    ids_file = str(tmp / "ids.npy")
    np.save(ids_file, trained[3])
    # Every export serves its predictions; the compact ones also their looked-up rows (as "<name>/rows").
    served_outputs = [(name, "prob") for name in exports] + [(name, "rows") for name in COMPACT_EXPORTS]
    request = {
        "ids": ids_file,
        "exports": {
            (name if output == "prob" else name + "/rows"): dict(
                path=exports[name],
                loader="tf1_loader" if name.startswith("builder") else "saved_model_load",
                input="ids",
                output=output,
            )
            for name, output in served_outputs
        },
    }
    req_file = str(tmp / "request.json")
    json.dump(request, open(req_file, "w"))
    out_file = str(tmp / "out.npz")
    env = dict(os.environ, PYTHONPATH=_ROOT)
    proc = subprocess.run(
        [sys.executable, _WORKER, req_file, out_file],
        cwd=str(tmp),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    return report, dict(np.load(out_file))


EXPORTS = ["builder_plain", "builder_frozen", "estimator_plain", "estimator_frozen"]
COMPACT_DTYPES = {"bfloat16": tf.bfloat16, "float16": tf.float16, "int8": tf.int8}
# <how exported>_<tables>_<row dtype>: every row dtype through the Builder, int8 through the Estimator too.
COMPACT_EXPORTS = ["builder_%s_%s" % (table, dtype) for table in ("frozen", "plain") for dtype in COMPACT_DTYPES] + [
    "estimator_frozen_int8",
    "estimator_plain_int8",
]


@pytest.mark.parametrize("name", EXPORTS + COMPACT_EXPORTS)
def test_saved_model_holds_embedding_columns_only(trained, exports, name):
    params = trained[1]
    variables = os.path.join(exports[name], "variables", "variables")
    names = {n: shape for n, shape in tf.train.list_variables(variables)}
    table_tensors = sorted(n for n in names if n.startswith(("item/", "user/")))
    expected = sorted(
        "%s/part_%d%s" % (emb, i, suffix)
        for emb, shards in (("item", 1), ("user", 3))
        for i in range(shards)
        for suffix in ("-keys", "-values", "-num_shards") + (("-storage",) if name in COMPACT_EXPORTS else ())
    )
    assert table_tensors == expected
    for n in names:
        assert not n.endswith(("-slots", "-versions", "-freqs", "-layout")), n
        assert "Adam" not in n, n  # no optimizer state of the dense variables either
    # Every trained key is there, with dim-wide float32 rows (a compact export stores its rows compactly when the
    # served process restores them).
    assert names["item/part_0-values"] == [len(params["item"]), DIM]
    reader = tf.train.load_checkpoint(variables)
    assert reader.get_variable_to_dtype_map()["item/part_0-values"] == tf.float32
    if name in COMPACT_EXPORTS:  # the storage is recorded (a training restore of int8 rows is refused by it)
        storage = refs.storage_name(COMPACT_DTYPES[name.split("_")[2]])
        assert reader.get_tensor("item/part_0-storage") == storage.encode()
    assert sum(names["user/part_%d-keys" % i][0] for i in range(3)) == len(params["user"])


@pytest.mark.parametrize("name", EXPORTS)
def test_fresh_process_serves_the_training_model(trained, served, name):
    _, params, train_pred, ids = trained
    report, preds = served
    assert report[name]["errors"] == []
    pred = preds[name]
    np.testing.assert_allclose(pred, _numpy_predict(params, ids), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pred[: len(train_pred)], train_pred, rtol=1e-6, atol=1e-7)
    ops = set(report[name]["op_types"])
    if name.endswith("frozen"):
        assert "TfExtFrozenTableHandle" in ops and "TfExtTableHandle" not in ops, sorted(ops)
    else:
        assert "TfExtTableHandle" in ops and "TfExtFrozenTableHandle" not in ops, sorted(ops)
    # Served graphs never write: no insert, update or import op runs per request.
    assert not ops & {"TfExtTableFindOrInsert", "TfExtTableInsert", "TfExtTableAccumulate"}


@pytest.mark.parametrize("name", EXPORTS)
def test_sixteen_threads_get_the_single_threaded_results(served, name):
    report, _ = served
    assert report[name]["errors"] == []
    assert report[name]["mismatches"] == 0


def _bfloat16_nearest(x):
    """float32 rounded to bfloat16 (nearest even) and back, by its bits."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _int8_row_bound(x):
    """The largest error an int8 row of the values x [..., DIM] may show per element: scale / 2, where scale is at
    most (max - min + one fp16 step of min) / 255 rounded up by one fp16 step, plus float32 rounding."""
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    lo_step = np.maximum(np.exp2(np.floor(np.log2(np.maximum(np.abs(lo), 2.0**-14))) - 10), 2.0**-24)
    scale = (hi - lo + lo_step) / 255 * (1 + 2.0**-10) + 2.0**-24
    return scale / 2 + 2e-7 * np.maximum(np.abs(lo), np.abs(hi))


@pytest.mark.parametrize("name", COMPACT_EXPORTS)
def test_compact_exports_serve_rows_within_their_rounding(trained, served, name):
    _, params, _, ids = trained
    report, preds = served
    assert report[name]["errors"] == [] and report[name]["mismatches"] == 0
    assert report[name + "/rows"]["errors"] == [] and report[name + "/rows"]["mismatches"] == 0
    dtype_name = name.split("_")[2]
    exact = _numpy_rows(params, ids)
    rows = preds[name + "/rows"]
    # Per looked-up embedding (item columns, then user columns): rounded as numpy rounds, or within scale / 2.
    for part in (slice(0, DIM), slice(DIM, 2 * DIM)):
        x, served_x = exact[:, part], rows[:, part]
        if dtype_name == "bfloat16":
            np.testing.assert_array_equal(served_x, _bfloat16_nearest(x))
        elif dtype_name == "float16":
            np.testing.assert_array_equal(served_x, x.astype(np.float16).astype(np.float32))
        else:
            error = np.abs(served_x - x)
            assert np.all(error <= _int8_row_bound(x)), error.max()
            assert np.any(error > 0)  # the rows were quantized
    # Keys the training never saw still read the initializer's zeros, exactly.
    unseen = ~np.isin(ids[:, 0], list(params["item"]))
    np.testing.assert_array_equal(rows[unseen, :DIM], 0.0)
    # The predictions are the model's on the served rows, so within the rows' bound of the float32 export's.
    np.testing.assert_allclose(preds[name], _numpy_predict(params, ids, rows), rtol=1e-5, atol=1e-6)
    bound = 0.25 * np.abs(rows - exact) @ np.abs(params["w"][:, 0])
    assert np.all(np.abs(preds[name] - preds[name.split("_")[0] + "_" + name.split("_")[1]]) <= bound + 1e-6)


@pytest.mark.parametrize("kind", ["builder_frozen", "builder_plain"])
def test_compact_exports_take_fewer_bytes_when_served(trained, served, kind):
    report, _ = served
    table_bytes = {"float32": report[kind]["table_bytes"]}
    table_bytes.update({d: report[kind + "_" + d]["table_bytes"] for d in COMPACT_DTYPES})
    assert table_bytes["int8"] < table_bytes["bfloat16"] == table_bytes["float16"] < table_bytes["float32"]
    if kind == "builder_frozen":
        # Exactly the row bytes: 4 * DIM for float32, 2 * DIM for half, DIM + 4 for int8 rows, per key.
        keys = len(trained[1]["item"]) + len(trained[1]["user"])
        assert table_bytes["float32"] - table_bytes["bfloat16"] == keys * 2 * DIM
        assert table_bytes["bfloat16"] - table_bytes["int8"] == keys * (2 * DIM - (DIM + 4))


def test_serving_row_dtypes_are_checked_and_int8_rows_are_never_trained():
    with pytest.raises(ValueError, match=r"tf\.float32, tf\.bfloat16, tf\.float16, tf\.int8"):
        with tf_ext.serving.freeze_for_serving(value_dtype=tf.int32):
            pass
    with pytest.raises(ValueError, match="export_rows"):
        with tf_ext.serving.export_rows(tf.float64):
            pass
    for scope, match in ((tf_ext.serving.export_rows, "int8 rows"), (tf_ext.serving.freeze_for_serving, "read-only")):
        with tf.Graph().as_default():
            with scope(tf.int8):
                emb = tf_ext.get_dynamic_embedding("int8_item", 4)
            vecs = tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64))
            with pytest.raises(ValueError, match=match):
                tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(vecs))
            with pytest.raises(ValueError, match=match):
                emb.insert(tf.constant([1], tf.int64), tf.zeros([1, 4]))
            for num_shards in (1, 2):  # a training lookup would insert rows (one kernel for one shard)
                with scope(tf.int8):
                    other = tf_ext.get_dynamic_embedding("int8_item_%d" % num_shards, 4, num_shards=num_shards)
                with pytest.raises(ValueError, match=match):
                    tf_ext.embedding_lookup(other, tf.constant([1, 2], tf.int64), is_training=True)


def test_frozen_embedding_is_read_only():
    with tf.Graph().as_default():
        with tf_ext.serving.freeze_for_serving():
            emb = tf_ext.get_dynamic_embedding("frozen_item", 4)
        assert tf_ext.serving.freezing() is False
        vecs = tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64))
        with pytest.raises(ValueError, match="freeze_for_serving"):
            tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(vecs))
        with pytest.raises(ValueError, match="read-only"):
            emb.insert(tf.constant([1], tf.int64), tf.zeros([1, 4]))
        with pytest.raises(ValueError, match="read-only"):
            emb.remove(tf.constant([1], tf.int64))


def test_frozen_table_build_refuses_bad_rows():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with tf_ext.serving.freeze_for_serving():
            emb = tf_ext.get_dynamic_embedding("frozen_bad", 2)
        build = load_ops().tf_ext_frozen_table_build
        handle = emb.shards[0].handle
        with pytest.raises(tf.errors.InvalidArgumentError, match="key 3 occurs more than once"):
            sess.run(build(handle, tf.constant([3, 4, 3], tf.int64), tf.zeros([3, 2])))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"values must be \[2, 2\]"):
            sess.run(build(handle, tf.constant([3, 4], tf.int64), tf.zeros([2, 3])))
        # The failed builds left the (empty) table as it was; a good one replaces it whole.
        sess.run(build(handle, tf.constant([3, 4], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]])))
        np.testing.assert_array_equal(
            sess.run(emb.lookup(tf.constant([4, 5, 3], tf.int64))), [[3.0, 4.0], [0.0, 0.0], [1.0, 2.0]]
        )
        assert sess.run(emb.size()) == 2


def test_frozen_table_storage_is_fixed_per_table_and_int8_builds_check_rows():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        int8 = refs.FrozenTableRef.create(3, storage="int8_row", shared_name="storage_table")
        same_name = refs.FrozenTableRef.create(3, storage="bfloat16", shared_name="storage_table")
        assert int8.storage == "int8_row"
        sess.run(int8.handle)
        with pytest.raises(tf.errors.FailedPreconditionError, match="storage=int8_row.*storage=bfloat16"):
            sess.run(same_name.handle)
        with pytest.raises(ValueError, match="float32, bfloat16, float16, int8_row"):
            refs.FrozenTableRef.create(3, storage="int4")
        # A row an int8 row cannot hold is refused by key; the table keeps what it held.
        keys = tf.constant([5, 6], tf.int64)
        with pytest.raises(tf.errors.InvalidArgumentError, match="key 6 holds inf in column 1"):
            sess.run(int8.build(keys, tf.constant([[0.0, 1.0, 2.0], [0.0, np.inf, 2.0]])))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 5 holds 70000.* \[-65504, 65504\]"):
            sess.run(int8.build(keys, tf.constant([[0.0, 7e4, 2.0], [0.0, 1.0, 2.0]])))
        assert sess.run(int8.size()) == 0
        rows = np.array([[0.0, 0.0, 0.0], [-1.0, 0.25, 3.0]], np.float32)
        sess.run(int8.build(keys, rows))
        exported_keys, exported_rows = sess.run(int8.export())
        exported = dict(zip(exported_keys.tolist(), exported_rows))
        np.testing.assert_array_equal(exported[5], 0.0)  # an all-zero row reads exact zeros
        assert np.all(np.abs(exported[6] - rows[1]) <= _int8_row_bound(rows[1]))
        np.testing.assert_array_equal(sess.run(int8.find(keys, tf.zeros([3]))[0]), [exported[5], exported[6]])
