"""Tests of tf_ext.feature_column (dynamic-embedding feature columns), TF1 graph mode."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding import feature_column as dfc
from tensorflow_ext.embedding import creation

fc_v1 = tf.compat.v1.feature_column


def _sparse(rows, dtype=np.int64):
    """rows: list of lists of ids -> SparseTensorValue [len(rows), max_len]."""
    indices, values = [], []
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            indices.append([i, j])
            values.append(v)
    width = max([len(r) for r in rows] + [1])
    return tf.compat.v1.SparseTensorValue(
        np.array(indices, np.int64).reshape(-1, 2), np.array(values, dtype), np.array([len(rows), width], np.int64)
    )


def _sp_tensor(value):
    return tf.SparseTensor(value.indices, value.values, value.dense_shape)


def _train_side_by_side(features, ours, theirs, steps=4, lr=0.3, seed=0):
    """Builds input_layer(ours) and input_layer(theirs) on the same features, trains both
    with GradientDescent on a separable squared loss, returns (ours, theirs) outputs
    before and after training."""
    with tf.Graph().as_default():
        feats = {
            k: (_sp_tensor(v) if isinstance(v, tf.compat.v1.SparseTensorValue) else tf.constant(v))
            for k, v in features.items()
        }
        with tf.compat.v1.variable_scope("ours"):
            out_a = fc_v1.input_layer(feats, [ours])
        with tf.compat.v1.variable_scope("theirs"):
            out_b = fc_v1.input_layer(feats, [theirs])
        target = tf.constant(np.random.RandomState(seed).normal(size=(1, out_a.shape[1])).astype(np.float32))
        loss = tf.reduce_sum(tf.square(out_a - target)) + tf.reduce_sum(tf.square(out_b - target))
        train = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.tables_initializer())
            before = sess.run([out_a, out_b])
            for _ in range(steps):
                sess.run(train)
            after = sess.run([out_a, out_b])
    return before, after


def _assert_pair_close(pair, atol=1e-5):
    a, b = pair
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("combiner,num_shards", [("mean", 1), ("sqrtn", 1), ("sum", 1), ("mean", 3)])
def test_raw_ids_match_tf_embedding_column_sparse(combiner, num_shards):
    # Duplicates inside a row, an empty row, shared ids across rows.
    ids = _sparse([[3, 7, 3], [], [7], [11, 2, 42, 3]])
    ours = dfc.categorical_column_with_dynamic_embedding(
        "ids", 4, initializer=tf.compat.v1.constant_initializer(0.25), combiner=combiner, num_shards=num_shards
    )
    theirs = fc_v1.embedding_column(
        fc_v1.categorical_column_with_identity("ids", 100),
        4,
        combiner=combiner,
        initializer=tf.compat.v1.constant_initializer(0.25),
    )
    before, after = _train_side_by_side({"ids": ids}, ours, theirs)
    _assert_pair_close(before)
    _assert_pair_close(after)
    assert np.abs(after[0] - before[0]).max() > 1e-3  # it did train
    assert np.all(after[0][1] == 0.0)  # empty row -> zeros


def test_raw_ids_dense_input_drops_ignore_value():
    ids = np.array([[5, -1, 5], [-1, -1, -1], [9, 2, -1]], np.int64)
    ours = dfc.categorical_column_with_dynamic_embedding("ids", 3, initializer=0.5, ignore_value=-1)
    theirs = fc_v1.embedding_column(
        fc_v1.categorical_column_with_identity("ids", 10), 3, initializer=tf.compat.v1.constant_initializer(0.5)
    )
    before, after = _train_side_by_side({"ids": ids}, ours, theirs)
    _assert_pair_close(before)
    _assert_pair_close(after)
    assert np.all(after[0][1] == 0.0)


def test_max_norm_matches_tf():
    ids = _sparse([[1, 2], [2], [3, 1, 1]])
    ours = dfc.categorical_column_with_dynamic_embedding("ids", 4, initializer=1.0, max_norm=0.7)
    theirs = fc_v1.embedding_column(
        fc_v1.categorical_column_with_identity("ids", 10),
        4,
        max_norm=0.7,
        initializer=tf.compat.v1.constant_initializer(1.0),
    )
    before, after = _train_side_by_side({"ids": ids}, ours, theirs, lr=0.05)
    _assert_pair_close(before)
    _assert_pair_close(after)
    assert np.allclose(np.linalg.norm(before[0], axis=1), 0.7, atol=1e-5)


def test_rank1_int32_ids():
    ids = np.array([4, 1, 4, -1], np.int32)
    ours = dfc.categorical_column_with_dynamic_embedding("ids", 2, initializer=1.0, ignore_value=-1)
    theirs = fc_v1.embedding_column(
        fc_v1.categorical_column_with_identity("ids", 10), 2, initializer=tf.compat.v1.constant_initializer(1.0)
    )
    _, after = _train_side_by_side({"ids": ids}, ours, theirs)
    _assert_pair_close(after)


def test_string_ids_match_vocabulary_column():
    vocab = ["a", "b", "c", "d"]
    words = np.array([["a", "b", ""], ["", "", ""], ["d", "d", "c"]])
    ours = dfc.categorical_column_with_dynamic_embedding("w", 3, dtype=tf.string, initializer=0.1, combiner="sqrtn")
    theirs = fc_v1.embedding_column(
        fc_v1.categorical_column_with_vocabulary_list("w", vocab),
        3,
        combiner="sqrtn",
        initializer=tf.compat.v1.constant_initializer(0.1),
    )
    before, after = _train_side_by_side({"w": words}, ours, theirs)
    _assert_pair_close(before)
    _assert_pair_close(after)
    assert np.all(after[0][1] == 0.0)


def test_embedding_column_backs_hash_bucket_column():
    words = _sparse([[b"x", b"y"], [b"zz"], [b"x", b"x", b"q"]], dtype=object)
    cat = fc_v1.categorical_column_with_hash_bucket("w", 1000)
    ours = dfc.embedding_column(cat, 5, initializer=0.2)
    theirs = fc_v1.embedding_column(cat, 5, initializer=tf.compat.v1.constant_initializer(0.2))
    assert ours.name == theirs.name == "w_embedding"
    before, after = _train_side_by_side({"w": words}, ours, theirs)
    _assert_pair_close(before)
    _assert_pair_close(after)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
def test_embedding_column_weighted(combiner):
    cat = tf.feature_column.weighted_categorical_column(
        tf.feature_column.categorical_column_with_identity("ids", 50), "w"
    )
    ours = dfc.embedding_column(cat, 3, combiner=combiner, initializer=0.3)
    theirs = tf.feature_column.embedding_column(
        cat, 3, combiner=combiner, initializer=tf.compat.v1.constant_initializer(0.3)
    )
    feats = {
        "ids": _sparse([[1, 2, 1], [7], [3, 4]]),
        "w": _sparse([[0.5, 2.0, 1.0], [3.0], [1.0, 0.25]], dtype=np.float32),
    }
    before, after = _train_side_by_side(feats, ours, theirs)
    _assert_pair_close(before)
    _assert_pair_close(after)


def test_v2_plumbing_get_dense_tensor():
    """The v2 interface: FeatureTransformationCache + get_dense_tensor (+ create_state)."""
    from tensorflow.python.feature_column import feature_column_v2 as fc_v2

    col = dfc.categorical_column_with_dynamic_embedding("ids", 4, initializer=0.5, ignore_value=-1)
    assert isinstance(col, fc_v2.DenseColumn)
    assert col._is_v2_column  # pylint: disable=protected-access
    assert col.variable_shape == tf.TensorShape([4])
    assert col.parse_example_spec == {"ids": tf.io.VarLenFeature(tf.int64)}
    with tf.Graph().as_default():
        feats = {"ids": tf.constant([[1, 2], [3, -1], [-1, -1]], tf.int64)}
        cache = fc_v2.FeatureTransformationCache(feats)
        out = col.get_dense_tensor(cache, None)
        # The same through a StateManager that holds the table (DenseFeatures' way).
        sm = fc_v2._StateManagerImpl(layer=None, trainable=True)  # pylint: disable=protected-access
        with tf.compat.v1.variable_scope("layer"):
            col.create_state(sm)
        assert sm.has_resource(col, "embedding_weights")
        out2 = col.get_dense_tensor(fc_v2.FeatureTransformationCache(feats), sm)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            a, b = sess.run([out, out2])
    expected = np.array([[0.5] * 4, [0.5] * 4, [0.0] * 4], np.float32)
    np.testing.assert_allclose(a, expected)
    np.testing.assert_allclose(b, expected)


def test_keras_dense_features_graph_mode():
    """v2 plumbing end to end: DenseFeatures builds the table through create_state."""
    col = dfc.categorical_column_with_dynamic_embedding("ids", 3, initializer=0.5, ignore_value=-1)
    with tf.Graph().as_default():
        layer = tf.compat.v1.keras.layers.DenseFeatures([col, tf.feature_column.numeric_column("x")])
        out = layer({"ids": tf.constant([[1], [2], [-1]], tf.int64), "x": tf.constant([[1.0], [2.0], [3.0]])})
        train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(tf.reduce_sum(tf.square(out - 1.0)))
        names = [e.name for e in creation.get_dynamic_embeddings()]
        assert names == ["dense_features/ids_embedding/embedding_weights"], names
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            before = sess.run(out)
            sess.run(train)
            after = sess.run(out)
    np.testing.assert_allclose(before, [[0.5] * 3 + [1.0], [0.5] * 3 + [2.0], [0.0] * 3 + [3.0]])
    assert np.all(after[:2, :3] > 0.6) and np.all(after[2] == before[2])


def test_reuse_under_variable_scope():
    col = dfc.categorical_column_with_dynamic_embedding("ids", 2, initializer=0.0)
    with tf.Graph().as_default():
        feats = {"ids": tf.constant([[1], [2]], tf.int64)}
        target = tf.constant([[1.0, -1.0], [2.0, 0.5]])
        with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
            a = fc_v1.input_layer(feats, [col])
        with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
            b = fc_v1.input_layer(feats, [col])
        # Training through `a` moves `b`: one table.
        train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(tf.reduce_sum(tf.square(a - target)))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            va, vb = sess.run([a, b])
    np.testing.assert_allclose(va, vb)
    assert np.abs(vb).max() > 0.1


def test_column_names_and_validation():
    col = dfc.categorical_column_with_dynamic_embedding("C1", 8)
    assert col.name == "C1_embedding"
    assert dfc.categorical_column_with_dynamic_embedding("C1", 8, name="c1_e").name == "c1_e"
    assert col.key_dtype == tf.int64
    assert dfc.categorical_column_with_dynamic_embedding("s", 2, dtype=tf.string).key_dtype == tf.string
    with pytest.raises(ValueError, match="dim"):
        dfc.categorical_column_with_dynamic_embedding("C1", 0)
    with pytest.raises(ValueError, match="combiner"):
        dfc.categorical_column_with_dynamic_embedding("C1", 4, combiner="max")
    with pytest.raises(ValueError, match="max_norm"):
        dfc.categorical_column_with_dynamic_embedding("C1", 4, max_norm=-1.0)
    with pytest.raises(ValueError, match="dtype"):
        dfc.categorical_column_with_dynamic_embedding("C1", 4, dtype=tf.float32)
    with pytest.raises(ValueError, match="num_shards"):
        dfc.categorical_column_with_dynamic_embedding("C1", 4, num_shards=0)
    with pytest.raises(ValueError, match="categorical column"):
        dfc.embedding_column(fc_v1.numeric_column("x"), 4)
    with pytest.raises(ValueError, match="num_buckets"):
        col.categorical_column.num_buckets  # pylint: disable=pointless-statement
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="integer ids"):
            fc_v1.input_layer({"C1": tf.constant([["a"]])}, [col])


def _estimator_input_fn(batch=64, steps=None, seed=0, id_offset=0):
    def input_fn():
        rng = np.random.RandomState(seed)
        n = batch * 40
        ids = rng.randint(0, 200, size=(n, 2)).astype(np.int64) + id_offset
        ids[rng.rand(n) < 0.1, 1] = -1
        # Label: a fixed function of the first id -> learnable only through the embedding.
        labels = ((ids[:, 0] * 2654435761) % 7 < 3).astype(np.float32)
        x = rng.normal(size=(n,)).astype(np.float32)
        ds = tf.data.Dataset.from_tensor_slices(({"ids": ids, "x": x}, labels))
        return ds.repeat().batch(batch) if steps is None else ds.batch(batch).take(steps)

    return input_fn


def _model_fn(features, labels, mode, params):
    cols = [
        dfc.categorical_column_with_dynamic_embedding("ids", 4, initializer=0.0, ignore_value=-1),
        fc_v1.numeric_column("x"),
    ]
    net = fc_v1.input_layer(features, cols)
    w = tf.compat.v1.get_variable("w", [5, 1], initializer=tf.compat.v1.ones_initializer())
    logits = tf.squeeze(tf.matmul(net, w), 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {"auc": tf.compat.v1.metrics.auc(labels, tf.sigmoid(logits))}
        (emb,) = creation.get_dynamic_embeddings()
        metrics["keys"] = (emb.size(), tf.no_op())
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    gs = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss, global_step=gs)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_estimator_trains_evaluates_predicts(tmp_path):
    config = tf.estimator.RunConfig(
        model_dir=str(tmp_path), save_summary_steps=1000, log_step_count_steps=1000, tf_random_seed=1
    )
    est = tf.estimator.Estimator(_model_fn, config=config)
    est.train(_estimator_input_fn(), steps=60)
    m1 = est.evaluate(_estimator_input_fn(steps=5), steps=5)
    assert m1["global_step"] == 60
    assert m1["auc"] > 0.75, m1
    ckpt_vars = dict(tf.train.list_variables(str(tmp_path)))
    assert any("ids_embedding/embedding_weights" in k for k in ckpt_vars), sorted(ckpt_vars)
    # The table holds exactly the 200 ids seen in training (the -1 cells were ignore_value),
    # and evaluating on unseen ids inserts nothing.
    assert ckpt_vars["input_layer/ids_embedding/embedding_weights/part_0-keys"] == [200]
    assert m1["keys"] == 200
    m_unseen = est.evaluate(_estimator_input_fn(steps=3, id_offset=10000), steps=3)
    assert m_unseen["keys"] == 200
    # Continue training from the checkpoint (tables restored): global_step grows.
    est.train(_estimator_input_fn(seed=2), steps=20)
    m2 = est.evaluate(_estimator_input_fn(steps=5), steps=5)
    assert m2["global_step"] == 80
    assert m2["auc"] >= m1["auc"] - 0.02, (m1, m2)
    preds = list(est.predict(_estimator_input_fn(steps=1), yield_single_examples=False))
    assert preds[0]["logit"].shape == (64,)


def test_exposed_as_tf_ext_feature_column():
    import tensorflow_ext as tf_ext

    assert (
        tf_ext.feature_column.categorical_column_with_dynamic_embedding is dfc.categorical_column_with_dynamic_embedding
    )
    assert tf_ext.feature_column.embedding_column is dfc.embedding_column


def test_columns_accept_exactly_the_lookup_combiners():
    from tensorflow_ext.embedding import lookup  # pylint: disable=import-outside-toplevel

    ids = fc_v1.categorical_column_with_identity("ids", num_buckets=10)
    for combiner in lookup.COMBINERS:
        assert dfc.categorical_column_with_dynamic_embedding("k", 2, combiner=combiner).combiner == combiner
        assert dfc.embedding_column(ids, 2, combiner=combiner).combiner == combiner
    with pytest.raises(ValueError, match=r"combiner must be one of \('mean', 'sqrtn', 'sum'\), got 'max'"):
        dfc.categorical_column_with_dynamic_embedding("k", 2, combiner="max")
    with pytest.raises(ValueError, match="combiner must be one of"):
        dfc.embedding_column(ids, 2, combiner="max")
    with tf.Graph().as_default():
        emb = creation.get_dynamic_embedding("e", 2)
        sp = _sp_tensor(_sparse([[1, 2]]))
        with pytest.raises(ValueError, match="combiner must be one of 'mean', 'sqrtn' or 'sum', got 'max'"):
            lookup.embedding_lookup_sparse(emb, sp, None, combiner="max")
