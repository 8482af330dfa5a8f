"""An Estimator whose model_fn uses dynamic embeddings trains, evaluates and predicts."""

import numpy as np
import tensorflow as tf

import tensorflow_ext as tf_ext

BATCH = 16


def _input_fn(seed, steps, offset=0):
    def fn():
        rng = np.random.RandomState(seed)
        ids = (rng.randint(0, 50, size=[BATCH * steps, 3]) + offset).astype(np.int64)
        words = np.array([["w%d" % (i % 7) for i in row] for row in ids])
        labels = (ids.sum(axis=1) % 2).astype(np.float32).reshape(-1, 1)
        ds = tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids, "words": words}, labels))
        return ds.batch(BATCH)

    return fn


def _model_fn(features, labels, mode):
    gs = tf.compat.v1.train.get_global_step()
    emb = tf_ext.get_dynamic_embedding(
        "ids_emb", 8, num_shards=2, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=1)
    )
    words = tf_ext.get_dynamic_embedding("word_emb", 4, key_dtype=tf.string, initializer=0.0)
    x = tf.concat(
        [
            tf.reduce_mean(tf_ext.embedding_lookup(emb, features["ids"]), axis=1),
            tf.reduce_mean(tf_ext.embedding_lookup(words, features["words"]), axis=1),
        ],
        axis=1,
    )
    logits = tf.compat.v1.layers.dense(x, 1)
    prob = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"prob": prob})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops={"acc": tf.compat.v1.metrics.accuracy(labels, prob > 0.5)}
        )
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


class _SizeHook(tf.compat.v1.train.SessionRunHook):
    """Reads the table sizes at the end of a session (in whatever graph runs)."""

    def begin(self):
        self._sizes = {e.name: e.size() for e in tf_ext.embedding.get_dynamic_embeddings()}

    def end(self, session):
        self.sizes = session.run(self._sizes)


def test_estimator_train_eval_predict(tmp_path):
    model_dir = str(tmp_path)
    config = tf.estimator.RunConfig(
        model_dir=model_dir,
        save_summary_steps=None,
        log_step_count_steps=None,
        session_config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2),
    )
    est = tf.estimator.Estimator(_model_fn, config=config)
    train_hook = _SizeHook()
    est.train(_input_fn(0, 5), hooks=[train_hook])
    assert est.get_variable_value("global_step") == 5  # once per step
    trained = train_hook.sizes
    assert trained["ids_emb"] > 0 and trained["word_emb"] == 7
    reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(model_dir))
    saved_keys = reader.get_tensor("ids_emb/part_0-keys").size + reader.get_tensor("ids_emb/part_1-keys").size
    assert saved_keys == trained["ids_emb"]
    assert reader.get_tensor("ids_emb/part_0-slots").shape[1] == 8  # Adagrad accumulator

    # Eval on ids never seen in training (offset): lookups are find-only, nothing is inserted.
    eval_hook = _SizeHook()
    metrics = est.evaluate(_input_fn(1, 3, offset=1000), hooks=[eval_hook])
    assert metrics["global_step"] == 5 and "acc" in metrics and np.isfinite(metrics["loss"])
    assert eval_hook.sizes == trained

    preds = list(est.predict(_input_fn(2, 1, offset=5000), yield_single_examples=True))
    assert len(preds) == BATCH and 0.0 < preds[0]["prob"][0] < 1.0

    # Training again continues from the checkpoint (tables restored), global step advances by the steps run.
    est.train(_input_fn(3, 2))
    assert est.get_variable_value("global_step") == 7


def test_estimator_warm_start_from(tmp_path):
    cfg = lambda d: tf.estimator.RunConfig(model_dir=d, save_summary_steps=None, log_step_count_steps=None)
    first = tf.estimator.Estimator(_model_fn, config=cfg(str(tmp_path / "a")))
    first.train(_input_fn(0, 2))
    hook = _SizeHook()
    second = tf.estimator.Estimator(_model_fn, config=cfg(str(tmp_path / "b")), warm_start_from=str(tmp_path / "a"))
    second.train(_input_fn(0, 1), hooks=[hook])  # a subset of the ids: only warm start brings the others
    reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(str(tmp_path / "a")))
    saved = reader.get_tensor("ids_emb/part_0-keys").size + reader.get_tensor("ids_emb/part_1-keys").size
    assert hook.sizes["ids_emb"] == saved and hook.sizes["word_emb"] == 7


def test_export_saved_model_serves_trained_tables(tmp_path):
    est = tf.estimator.Estimator(_model_fn, model_dir=str(tmp_path / "m"))
    est.train(_input_fn(0, 2))

    def serving():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
        words = tf.compat.v1.placeholder(tf.string, [None, 3])
        return tf.estimator.export.ServingInputReceiver({"ids": ids, "words": words}, {"ids": ids, "words": words})

    path = est.export_saved_model(str(tmp_path / "export"), serving).decode()
    ids = np.array([[1, 2, 3], [4, 5, 999999]], np.int64)
    words = np.array([["w1", "w2", "w3"], ["w4", "w5", "new"]])

    def pred_input():
        return tf.compat.v1.data.Dataset.from_tensor_slices(
            ({"ids": ids, "words": words}, np.zeros([2, 1], np.float32))
        ).batch(2)

    expected = np.array([p["prob"] for p in est.predict(pred_input)])
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.load(sess, ["serve"], path)
        sig = meta.signature_def["serving_default"]
        got = sess.run(sig.outputs["prob"].name, {sig.inputs["ids"].name: ids, sig.inputs["words"].name: words})
    np.testing.assert_allclose(got, expected, rtol=1e-6)
