"""Serving exports made from delta checkpoints: every trained key serves its trained row.

An Estimator trains with `tf_ext.embedding.delta_checkpoints`, so its latest checkpoint is a delta that holds only
the rows trained since the previous save. It is exported four ways (Estimator and Builder, plain and frozen); a fresh
process that only imports tensorflow_ext loads each SavedModel and looks up every trained key.
"""

import contextlib
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import run_fresh

DIM = 4
NUM_SHARDS = 2


def _embedding():
    return tf_ext.get_dynamic_embedding(
        "user", DIM, num_shards=NUM_SHARDS, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=1)
    )


def _model_fn(features, labels, mode):
    del labels
    rows = tf_ext.embedding_lookup(_embedding(), features["ids"])
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"rows": rows})
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(rows, 1) - 1.0))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def _input_fn():
    # 12 batches of 8 keys: every batch new keys (so each delta holds a small part of the table), some repeated.
    ids = np.concatenate([np.arange(8 * i, 8 * i + 6) for i in range(12)])
    ids = np.stack([ids[i : i + 6] for i in range(0, len(ids), 6)])
    ids = np.concatenate([ids, ids[:, :2] // 3], axis=1).reshape([-1]).astype(np.int64)
    return tf.compat.v1.data.Dataset.from_tensor_slices({"ids": ids}).batch(8)


def _serving_input_fn():
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})


def _freeze(frozen):
    return tf_ext.serving.freeze_for_serving() if frozen else contextlib.nullcontext()


def _export_builder(checkpoint, export_dir, frozen):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        with _freeze(frozen):
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            rows = tf_ext.embedding_lookup(_embedding(), ids)
        tf.compat.v1.train.Saver().restore(sess, checkpoint)
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"rows": rows})
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    return export_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model_dir, latest checkpoint, {key: trained row}) of an Estimator trained with delta checkpoints."""
    model_dir = str(tmp_path_factory.mktemp("model"))
    config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=3, keep_checkpoint_max=3)
    est = tf.estimator.Estimator(_model_fn, config=config)
    est.train(_input_fn, saving_listeners=[tf_ext.embedding.delta_checkpoints(full_every=100)])
    latest = tf.train.latest_checkpoint(model_dir)
    with tf.Graph().as_default():
        emb = _embedding()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, latest)  # a plain restore reads the delta's whole chain
            exported = sess.run(emb.export())
    table = dict(zip(exported.keys.tolist(), exported.values))
    reader = tf.train.load_checkpoint(latest)
    record = reader.get_tensor("user/part_0-delta")
    assert b"kind=delta" in record
    in_delta = sum(reader.get_tensor("user/part_%d-keys" % i).size for i in range(NUM_SHARDS))
    assert 0 < in_delta < len(table) / 2  # the delta alone holds a small part of the table
    return est, latest, table


@pytest.fixture(scope="module")
def served(trained, tmp_path_factory):
    est, latest, table = trained
    base = tmp_path_factory.mktemp("exports")
    exports = {}
    for frozen in (False, True):
        suffix = "frozen" if frozen else "plain"
        with _freeze(frozen):
            exports["estimator_" + suffix] = est.export_saved_model(
                str(base / ("estimator_" + suffix)), _serving_input_fn
            ).decode()
        exports["builder_" + suffix] = _export_builder(latest, str(base / ("builder_" + suffix)), frozen)
    keys = np.array(sorted(table), np.int64)
    keys_file = str(base / "keys.npy")
    np.save(keys_file, keys)
    out = str(base / "served.npz")
    code = """
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext  # noqa: F401  (registers the ops: all a serving process needs)
        tf.compat.v1.disable_v2_behavior()
        keys = np.load(%r)
        result = {}
        for name, path in %r.items():
            graph = tf.Graph()
            with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
                meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
                sig = meta.signature_def["serving_default"]
                result[name] = sess.run(sig.outputs["rows"].name, {sig.inputs["ids"].name: keys})
        np.savez(%r, **result)
    """ % (
        keys_file,
        exports,
        out,
    )
    run_fresh(code, base)
    return keys, dict(np.load(out)), exports


@pytest.mark.parametrize("name", ["estimator_frozen", "estimator_plain", "builder_frozen", "builder_plain"])
def test_export_of_a_delta_checkpoint_serves_every_trained_row(trained, served, name):
    table = trained[2]
    keys, results, _ = served
    rows = results[name]
    expected = np.stack([table[k] for k in keys.tolist()])
    wrong = [k for k, got, want in zip(keys.tolist(), rows, expected) if not np.array_equal(got, want)]
    assert not wrong, "%s: %d of %d trained keys serve another row (e.g. %s)" % (name, len(wrong), len(keys), wrong[:5])


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "frozen"])
@pytest.mark.parametrize("num_shards", [1, 3])
def test_restore_into_another_shard_count_names_both_counts(trained, served, frozen, num_shards):
    """A delta checkpoint, or a frozen export's variables, restored where the embedding has another num_shards."""
    checkpoints = [trained[1]]
    if frozen:  # a frozen graph's Saver reads what an export holds (a plain Saver also wants the slots)
        checkpoints.append(os.path.join(served[2]["builder_frozen"], "variables", "variables"))
    for checkpoint in checkpoints:
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            with _freeze(frozen):
                tf_ext.get_dynamic_embedding("user", DIM, num_shards=num_shards)
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                tf.compat.v1.train.Saver().restore(sess, checkpoint)
        message = str(info.value)
        assert "num_shards=%d" % num_shards in message and "warm_start" in message, message
