"""A TFRA Estimator model ports to tensorflow_ext by changing its import.

`_model_fn` is written the way TFRA's own Estimator demos are (per-device shards, tf.unique + lookup with
return_trainable, DynamicEmbeddingOptimizer, size() logging, enable_inference_mode before export); only the import
line differs from TFRA code.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext import tfra as de  # was: from tensorflow_recommenders_addons import dynamic_embedding as de

import tensorflow_ext as tf_ext

tf.compat.v1.disable_v2_behavior()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_USERS, N_MOVIES, BATCH = 40, 30, 64


def _data(seed, n):
    rng = np.random.RandomState(seed)
    users = rng.randint(0, N_USERS, n).astype(np.int64) * 1000003 - 7  # some negative ids
    movies = rng.randint(0, N_MOVIES, n).astype(np.int64)
    rating = ((users % 5) * 0.5 + (movies % 3) * 0.7).astype(np.float32)
    return users, movies, rating


def _input_fn(seed=0, n=BATCH * 30):
    def fn():
        users, movies, rating = _data(seed, n)
        ds = tf.compat.v1.data.Dataset.from_tensor_slices({"user_id": users, "movie_id": movies, "user_rating": rating})
        return ds.batch(BATCH)

    return fn


def _model_fn(features, labels, mode, params):
    del labels
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    devices = ["/job:localhost/replica:0/task:0/CPU:0"] * params["ps_num"]
    initializer = tf.keras.initializers.RandomNormal(0.0, 0.1) if is_training else tf.keras.initializers.Zeros()
    user_embeddings = de.get_variable(name="user_dynamic_embeddings", dim=8, devices=devices, initializer=initializer)
    movie_embeddings = de.get_variable(
        "movie_dynamic_embeddings", tf.int64, tf.float32, 8, devices=devices, initializer=initializer
    )  # TFRA's positional order
    user_val, user_idx = tf.unique(features["user_id"])
    user_w, _ = de.embedding_lookup(params=user_embeddings, ids=user_val, name="user-id-weights", return_trainable=True)
    movie_val, movie_idx = tf.unique(features["movie_id"])
    movie_w, _ = de.embedding_lookup(
        params=movie_embeddings, ids=movie_val, name="movie-id-weights", return_trainable=True
    )
    x = tf.concat([tf.gather(user_w, user_idx), tf.gather(movie_w, movie_idx)], axis=1)
    hidden = tf.keras.layers.Dense(32, activation="relu")(x)
    out = tf.reshape(tf.keras.layers.Dense(1)(hidden), [-1])
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode, predictions={"out": out}, export_outputs={"predict": tf.estimator.export.PredictOutput({"out": out})}
        )
    loss = tf.keras.losses.MeanSquaredError()(features["user_rating"], out)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(learning_rate=0.01))
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    sizes = {
        "user_size": user_embeddings.size(),
        "movie_size": movie_embeddings.size(),
        "user_shard0": user_embeddings.size(0),
    }
    return tf.estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=train_op,
        training_hooks=[tf.compat.v1.train.LoggingTensorHook(sizes, every_n_iter=10), _Capture(sizes)],
    )


class _Capture(tf.compat.v1.train.SessionRunHook):
    last = None

    def __init__(self, tensors):
        self._tensors = tensors

    def end(self, session):
        _Capture.last = session.run(self._tensors)


def test_tfra_estimator_model_trains_evaluates_and_serves(tmp_path):
    config = tf.estimator.RunConfig(
        model_dir=str(tmp_path / "model"), save_summary_steps=None, log_step_count_steps=None
    )
    est = tf.estimator.Estimator(_model_fn, params={"ps_num": 2}, config=config)
    est.train(_input_fn(0), steps=30)
    first_eval = est.evaluate(_input_fn(1, BATCH * 4))
    est.train(_input_fn(0), steps=60)
    second_eval = est.evaluate(_input_fn(1, BATCH * 4))
    assert second_eval["loss"] < first_eval["loss"] < 2.0, (first_eval, second_eval)
    sizes = _Capture.last
    assert sizes["user_size"] == N_USERS and sizes["movie_size"] == N_MOVIES
    assert 0 < sizes["user_shard0"] < N_USERS  # one shard's count (TFRA's size(index))

    de.enable_inference_mode()
    try:

        def serving():
            feats = {
                "user_id": tf.compat.v1.placeholder(tf.int64, [None]),
                "movie_id": tf.compat.v1.placeholder(tf.int64, [None]),
            }
            return tf.estimator.export.ServingInputReceiver(feats, feats)

        export = est.export_saved_model(str(tmp_path / "export"), serving).decode()
    finally:
        de.enable_train_mode()
    users, movies, _ = _data(5, 8)
    users[0] = 123456789  # an id never seen: read as zeros, not inserted

    def pred_input():
        return tf.compat.v1.data.Dataset.from_tensor_slices({"user_id": users, "movie_id": movies}).batch(8)

    expected = np.array([p["out"] for p in est.predict(pred_input)])
    np.save(tmp_path / "users.npy", users)
    np.save(tmp_path / "movies.npy", movies)
    code = textwrap.dedent(
        """
        import numpy as np, tensorflow as tf
        import tensorflow_ext
        tf.compat.v1.disable_v2_behavior()
        with tf.compat.v1.Session() as sess:
            meta = tf.compat.v1.saved_model.load(sess, ["serve"], %r)
            sig = meta.signature_def["predict"]
            feed = {sig.inputs["user_id"].name: np.load("users.npy"), sig.inputs["movie_id"].name: np.load("movies.npy")}
            np.save("got.npy", sess.run(sig.outputs["out"].name, feed))
    """
        % export
    )
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr[-4000:]
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), expected, rtol=1e-5, atol=1e-6)


def test_restrict_policy_keeps_the_most_recent_keys():
    with tf.Graph().as_default() as g:
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = de.get_variable("r", dim=2, restrict_policy=de.TimestampRestrictPolicy, initializer=0.0)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(de.embedding_lookup(emb, ids))
        train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss, global_step=gs)
        restrict = emb.restrict(3, trigger=4)
        keys = emb.export().keys
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2], [3], [4, 5], [6]):
                sess.run(train, {ids: batch})
            assert sess.run(restrict) == 3  # 6 keys > trigger 4: keep the 3 trained last (6, then 4 and 5)
            assert sorted(sess.run(keys)) == [4, 5, 6]
            assert sess.run(restrict) == 0  # 3 keys <= trigger: nothing to do


def test_tfra_arguments_without_meaning_say_what_to_do():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="kv_creator"):
            de.get_variable("a", dim=2, kv_creator=object())
        with pytest.raises(ValueError, match="bp_v2"):
            de.get_variable("b", dim=2, bp_v2=True)
        with pytest.raises(ValueError, match="partition"):
            de.get_variable("c", dim=2, devices=["/cpu:0"] * 2, partitioner=lambda keys, n: keys % n)
        with pytest.raises(ValueError, match="synchronous"):
            de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1), synchronous=True)
        with pytest.raises(TypeError, match="tf.compat.v1.train"):
            de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        with pytest.raises(AttributeError, match="TrainableWrapper"):
            de.TrainableWrapper  # pylint: disable=pointless-statement
        with pytest.raises(AttributeError, match="kv_creator"):
            de.CuckooHashTableCreator  # pylint: disable=pointless-statement
        emb = de.get_variable("d", dim=2, checkpoint=False)
        assert not set(emb.saveables) & set(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS))


def test_native_api_answers_tfra_habits_with_what_to_use():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="TFRA's get_variable"):
            tf_ext.get_dynamic_embedding("x", tf.int64, tf.float32, 8)
        with pytest.raises(TypeError, match="tensorflow_ext.tfra.get_variable"):
            tf_ext.get_dynamic_embedding("x", 8, kv_creator=None)
        emb = tf_ext.get_dynamic_embedding("y", 4, init_size=1000)  # TFRA's init_size is accepted
        with pytest.raises(ValueError, match="no TrainableWrapper"):
            tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64), return_trainable=True)
        for name, hint in (
            ("enable_inference_mode", "is_training=False"),
            ("enable_train_mode", "inserts new keys only when an optimizer applies a gradient that flows through it"),
            ("TrainableWrapper", "optimizers"),
            ("get_variable", "get_dynamic_embedding"),
        ):
            with pytest.raises(AttributeError, match=hint):
                getattr(tf_ext, name)
        opt = tf.compat.v1.train.FtrlOptimizer(0.1)
        assert tf_ext.DynamicEmbeddingOptimizer(opt) is opt
        # TFRA's Variable methods
        ins = emb.upsert(tf.constant([1, 2], tf.int64), tf.ones([2, 4]))
        values, exists = emb.lookup(tf.constant([[1, 3]], tf.int64), return_exists=True)
        with tf.compat.v1.Session() as sess:
            sess.run(ins)
            v, e = sess.run([values, exists])
        assert v.shape == (1, 2, 4) and e.tolist() == [[True, False]]
        np.testing.assert_allclose(v[0, 0], 1.0)


def _train_and_export(make_embedding):
    """Builds an embedding with make_embedding() in a fresh graph, trains it 5 steps, returns its sorted rows."""
    with tf.Graph().as_default() as g:
        emb = make_embedding()
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.square(de.embedding_lookup(emb, ids) - 1.0))
        opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        train = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        keys, values = emb.export()[:2]
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2, 3], [3, -4], [5, 1, 1], [6], [2, 7]):
                sess.run(train, {ids: batch})
            k, v = sess.run([keys, values])
        order = np.argsort(k)
        return emb, k[order], v[order]


def test_tfra_variable_constructor_builds_what_get_variable_builds():
    devices = ["/job:localhost/replica:0/task:0/CPU:0"] * 2
    init = tf.keras.initializers.RandomNormal(0.0, 0.1, seed=7)
    # TFRA's constructor: key_dtype, value_dtype, dim, devices, partitioner, shared_name, name, initializer, ...
    emb, k1, v1 = _train_and_export(
        lambda: de.Variable(tf.int64, tf.float32, 4, devices, de.default_partition_fn, None, "user", init, init_size=64)
    )
    assert isinstance(emb, de.Variable) and isinstance(emb, tf_ext.DynamicEmbedding)
    assert emb.name == "user" and emb.dim == 4 and emb.num_shards == 2
    _, k2, v2 = _train_and_export(
        lambda: de.get_variable("user", tf.int64, tf.float32, 4, devices, initializer=init, init_size=64)
    )
    np.testing.assert_array_equal(k1, [-4, 1, 2, 3, 5, 6, 7])
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_array_equal(v1, v2)
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("tower"):
            emb = de.Variable(
                key_dtype=tf.int64,
                dim=2,
                name="r",
                restrict_policy=de.FrequencyRestrictPolicy,
                checkpoint=False,
                trainable=False,
                short_file_name=True,
            )
        assert emb.name == "tower/r" and emb.restrict_policy == "frequency"  # scoped as get_variable's name
        assert not set(emb.saveables) & set(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS))
        assert not set(emb.shards) & set(tf.compat.v1.trainable_variables())
        assert de.Variable(dim=2).name == "DynamicEmbedding_Variable"  # TFRA's default name
        with pytest.raises(ValueError, match="always creates a new one.*AUTO_REUSE"):
            de.Variable(dim=2)
        with pytest.raises(TypeError, match="takes key_dtype first.*name='user'"):
            de.Variable("user", dim=2)
        with pytest.raises(ValueError, match=r"Variable\(kv_creator"):
            de.Variable(dim=2, name="k", kv_creator=object())
        with pytest.raises(ValueError, match=r"Variable\(bp_v2"):
            de.Variable(dim=2, name="b", bp_v2=True)


# TFRA names that tensorflow_ext does not provide, with a word each answer must contain.
_NOT_PROVIDED = {
    "KVCreator": "kv_creator",
    "create_slots": "slots itself",
    "patch_on_tf": "Remove the call",
    "patch_on_tf_save_restore": "Remove the call",
    "ShadowVariable": "no shadow variables",
    "embedding_variable": "get_dynamic_embedding",
    "DEHvdSaver": "tensorflow_ext.horovod",
    "DECheckpoint": "Saver",
    "Checkpoint": "Saver",
    "WarmStartHook": "warm_start",
    "warm_start": "warm_start",
    "layers": "Keras",
    "register_all": "registers",
    "TrainableWrapper": "TrainableWrapper",
    "CuckooHashTableCreator": "kv_creator",
}


def test_tfra_names_without_equivalent_say_what_to_use():
    from tensorflow_ext import dynamic_embedding  # pylint: disable=import-outside-toplevel
    from tensorflow_ext import errors  # pylint: disable=import-outside-toplevel

    for module, prefix in ((de, "tensorflow_ext.tfra"), (dynamic_embedding, "tensorflow_ext.dynamic_embedding")):
        for name, hint in _NOT_PROVIDED.items():
            with pytest.raises(errors.NotProvidedError, match="%s is not provided: .*%s" % (name, hint)) as e:
                getattr(module, name)
            assert isinstance(e.value, AttributeError) and e.value.name == name and e.value.instead
            assert str(e.value).startswith("%s.%s" % (prefix, name))
            assert not hasattr(module, name)
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
            module.no_such_name  # pylint: disable=pointless-statement
    # TFRA's top-level names, for code that imports tensorflow_ext as tfra.
    for name in ("DEHvdSaver", "embedding_variable", "Checkpoint", "register_all"):
        with pytest.raises(
            AttributeError, match="tensorflow_ext.%s is not provided: .*%s" % (name, _NOT_PROVIDED[name])
        ):
            getattr(tf_ext, name)


def test_tfra_get_variable_takes_tfra_newer_arguments_and_one_device_string():
    with tf.Graph().as_default():
        emb = de.get_variable("s", dim=2, devices="/job:localhost/replica:0/task:0/CPU:0", short_file_name=True)
        assert emb.num_shards == 1  # one device string is one shard (TFRA), not one shard per character


def test_tfra_package_import_ports_by_renaming(tmp_path):
    """`import tensorflow_recommenders_addons as tfra; tfra.dynamic_embedding.X` ports by renaming the import."""
    code = textwrap.dedent(
        """
        from tensorflow_ext import dynamic_embedding as de_from    # first access: a submodule import
        import tensorflow as tf
        import tensorflow_ext as tfra                                # was: import tensorflow_recommenders_addons as tfra
        import tensorflow_ext.dynamic_embedding as de_import
        from tensorflow_ext.dynamic_embedding import get_variable, Variable
        tf.compat.v1.disable_v2_behavior()

        de = tfra.dynamic_embedding
        assert de is de_from is de_import, (de, de_from, de_import)
        assert get_variable is tfra.tfra.get_variable and Variable is tfra.tfra.Variable
        assert "get_variable" in dir(de) and "Variable" in de.__all__

        ids = tf.compat.v1.placeholder(tf.int64, [None])
        user = tfra.dynamic_embedding.get_variable("user", tf.int64, tf.float32, 4, initializer=0.5)
        item = tfra.dynamic_embedding.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=4, name="item")
        rows = tfra.dynamic_embedding.embedding_lookup(user, ids) + tfra.dynamic_embedding.embedding_lookup(item, ids)
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(rows, axis=1) - 1.0))
        opt = tfra.dynamic_embedding.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.05))
        train = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first = sess.run(loss, {ids: [1, 2, 3]})
            for _ in range(10):
                sess.run(train, {ids: [1, 2, 3]})
            assert sess.run(loss, {ids: [1, 2, 3]}) < first
            assert sess.run(user.size()) == 3 and sess.run(item.size()) == 3
        try:
            tfra.dynamic_embedding.KVCreator
        except AttributeError as e:
            assert "kv_creator" in str(e), e
        else:
            raise AssertionError("KVCreator")
        print("ported")
    """
    )
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0 and "ported" in r.stdout, r.stderr[-4000:]


def test_tfra_bad_arguments_name_the_argument():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"get_variable\(devices=3\).*list of device strings"):
            de.get_variable("a", dim=2, devices=3)
        with pytest.raises(TypeError, match=r"Variable\(devices=\[0\]\).*list of device strings"):
            de.Variable(dim=2, name="a", devices=[0])
        with pytest.raises(ValueError, match=r"get_variable\(init_size=-1\).*expected number of keys"):
            de.get_variable("a", dim=2, init_size=-1)
        with pytest.raises(TypeError, match=r"get_variable\(init_size=1.5\)"):
            de.get_variable("a", dim=2, init_size=1.5)
        for flag in ("trainable", "checkpoint"):
            with pytest.raises(TypeError, match=r"get_variable\(%s='no'\).*True or False" % flag):
                de.get_variable("a", dim=2, **{flag: "no"})
        assert not tf.compat.v1.get_collection(tf_ext.GraphKeys.DYNAMIC_EMBEDDINGS)  # nothing half-built


def test_tfra_default_partition_fn_takes_every_key_dtype():
    with tf.Graph().as_default():
        emb = de.get_variable("p", dim=2, devices=["/job:localhost/replica:0/task:0/CPU:0"] * 3)
        words = de.get_variable("w", tf.string, dim=2, devices=["/job:localhost/replica:0/task:0/CPU:0"] * 3)
        ids = np.arange(-20, 20)
        strings = tf.constant(["a", "b", "c", "d", "e", "f"])
        fetches = [
            de.default_partition_fn(tf.constant(ids, tf.int64), 3),
            de.default_partition_fn(tf.constant(ids, tf.int32), 3),  # int32 keys: as the table stores them
            emb.shard_ids(emb.to_keys(tf.constant(ids, tf.int64))),
            de.default_partition_fn(strings, 3),
            words.shard_ids(words.to_keys(strings)),
        ]
        with pytest.raises(TypeError, match="default_partition_fn: keys must be int64, int32 or strings, got float32"):
            de.default_partition_fn(tf.constant([1.5]), 2)
        with pytest.raises(ValueError, match="shard_num"):
            de.default_partition_fn(tf.constant([1], tf.int64), 0)
        with tf.compat.v1.Session() as sess:
            p64, p32, native, pstr, native_str = sess.run(fetches)
    np.testing.assert_array_equal(p64, native)
    np.testing.assert_array_equal(p32, native)
    np.testing.assert_array_equal(pstr, native_str)
    assert set(p64) == {0, 1, 2}


def test_tfra_default_initializer_is_zeros_as_in_tfra():
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("m", initializer=tf.compat.v1.ones_initializer()):
            made = [de.get_variable("z", dim=3), de.Variable(dim=3, name="v")]  # TFRA: initializer=None is 0
        ids = tf.constant([5, -6, 7], tf.int64)
        rows = [tf_ext.embedding_lookup(emb, ids, is_training=True) for emb in made]  # inserts the keys
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(rows)
            for emb in made:
                keys, values = sess.run(emb.export()[:2])
                assert sorted(keys) == [-6, 5, 7]
                np.testing.assert_array_equal(values, np.zeros([3, 3], np.float32))


def test_tfra_variable_methods_work_or_say_what_to_use():
    """TFRA's Variable methods and attributes on a tensorflow_ext embedding: each either works as in TFRA or raises
    a NotProvidedError (an AttributeError) saying what to use; unknown names stay plain AttributeErrors."""
    from tensorflow_ext import errors  # pylint: disable=import-outside-toplevel

    devices = ["/job:localhost/replica:0/task:0/CPU:0"] * 3
    with tf.Graph().as_default() as g:
        emb = de.get_variable("m", dim=2, devices=devices, init_size=30, initializer=0.5)
        assert emb.shard_num == 3 and emb.devices == devices and emb.init_size == 30
        assert emb.partition_fn is de.default_partition_fn
        native = tf_ext.get_dynamic_embedding("n", 2, num_shards=2)
        assert native.shard_num == 2 and native.init_size == 0 and len(native.devices) == 2
        ids = tf.constant([1, 2, 3, -4, 5], tf.int64)
        upsert = emb.upsert(ids, np.ones([5, 2], np.float32))
        values, trainable = emb.embedding_lookup(ids, name="user")  # TFRA: return_trainable=True
        assert trainable is emb and values.name.startswith("user/embedding_lookup/")
        clipped, _ = emb.embedding_lookup(ids, max_norm=0.5)
        clear = emb.clear()
        size = emb.size()
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(upsert)
            assert sess.run(size) == 5
            np.testing.assert_allclose(sess.run(values), np.ones([5, 2]))
            np.testing.assert_allclose(np.linalg.norm(sess.run(clipped), axis=1), [0.5] * 5, rtol=1e-6)
            sess.run(clear)
            assert sess.run(size) == 0
            np.testing.assert_allclose(sess.run(emb.lookup(ids)), np.full([5, 2], 0.5))  # the initializer again
        for name, hint in (
            ("tables", "emb.shards"),
            ("accum", "in place"),
            ("get_slot_variables", r"optimizer.get_slot\(shard, name\)"),
            ("save_to_file_system", "Saver"),
            ("load_from_file_system", "Saver"),
            ("load_from_file_system_with_restore_function", "Saver"),
            ("export_keys_and_scores", r"export\(\)"),
            ("get_trainable_by_name", "TF1 graph mode"),
            ("trainable_store", "TF1 graph mode"),
            ("kv_creator", "one table engine"),
            ("size_ops", r"size\(index\)"),
        ):
            with pytest.raises(
                errors.NotProvidedError,
                match=r"DynamicEmbedding\.%s \(TFRA's Variable\.%s\) is not provided: .*%s" % (name, name, hint),
            ) as e:
                getattr(emb, name)
            assert e.value.name == name and e.value.instead and isinstance(e.value, AttributeError)
            assert not hasattr(emb, name)
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'") as e:
            emb.no_such_name  # pylint: disable=pointless-statement
        assert not isinstance(e.value, errors.NotProvidedError)
        assert getattr(native, "restrict_policy", None) is None


def test_tfra_clear_refuses_a_serving_table():
    from tensorflow_ext import serving  # pylint: disable=import-outside-toplevel

    with tf.Graph().as_default():
        with serving.freeze_for_serving():
            emb = de.get_variable("frozen", dim=2)
        with pytest.raises(ValueError, match=r"frozen\.clear\(\): .*read-only serving table"):
            emb.clear()


def test_restrict_policy_is_none_for_a_get_variable_embedding_without_one():
    # TFRA's Variable.restrict_policy is None when none was given; only embeddings made by the native API lack it.
    with tf.Graph().as_default():
        emb = de.get_variable("plain", dim=2)
        assert emb.restrict_policy is None
        with tf.compat.v1.variable_scope("", reuse=True):
            assert de.get_variable("plain", dim=2, restrict_policy=de.TimestampRestrictPolicy) is emb
        assert emb.restrict_policy == "timestamp"
        native = tf_ext.get_dynamic_embedding("native", 2)
        assert not hasattr(native, "restrict_policy")


def test_variable_methods_are_attributes_of_the_variable_class():
    # TFRA's Variable.upsert / lookup / restrict, unbound: called with the embedding first.
    with tf.Graph().as_default():
        emb = de.get_variable("unbound", dim=2, initializer=0.0)
        insert = de.Variable.upsert(emb, tf.constant([3], tf.int64), tf.constant([[1.0, 2.0]]))
        with tf.control_dependencies([insert]):
            values = de.Variable.lookup(emb, tf.constant([3, 4], tf.int64))
        with tf.control_dependencies([values]):
            removed = de.Variable.restrict(emb, 0)
        with tf.compat.v1.Session() as sess:
            got, n = sess.run([values, removed])
        np.testing.assert_array_equal(got, [[1.0, 2.0], [0.0, 0.0]])
        assert n == 1
