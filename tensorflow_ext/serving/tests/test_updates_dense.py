"""The dense variables of serving updates: the writer's default set (every global variable but the global step,
tf_ext's own and slots), and a live export of a batch-normalized model that follows its trainer exactly.

Batch normalization's moving mean and variance are global variables that are neither trainable nor in
MODEL_VARIABLES: a served model reads them, so every update must carry them, or the model refuses the updates (its
layout has lines the updates lack).
"""

import numpy as np
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import session_config
from tensorflow_ext.serving import update_format
from tensorflow_ext.serving.follow import Follower
from tensorflow_ext.serving.follow import ServedModel
from tensorflow_ext.serving.updates import ServingUpdateWriter

MODEL = "bn_ctr"
DIM = 4
EPSILON = 1e-3  # batch_normalization's default


def _tower(ids, training):
    """(logits [batch], embedding) of the model: an embedding, batch normalization, a dense layer."""
    emb = tf_ext.get_dynamic_embedding(
        "user", DIM, num_shards=2, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.5, seed=1)
    )
    x = tf_ext.embedding_lookup(emb, ids)
    h = tf.compat.v1.layers.batch_normalization(x, training=training, momentum=0.5, epsilon=EPSILON, name="bn")
    logits = tf.compat.v1.layers.dense(
        h, 1, name="out", kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2)
    )
    return logits[:, 0], emb


def _variable(name):
    (v,) = [v for v in tf.compat.v1.global_variables() if v.op.name == name]
    return v


def test_the_default_dense_variables_are_the_global_ones_but_the_step_tf_exts_own_and_slots(tmp_path):
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = tf_ext.get_dynamic_embedding(
            "item", DIM, initializer=0.1, admission=tf_ext.embedding.BloomAdmission(min_count=2, num_counters=64)
        )
        x = tf_ext.embedding_lookup(emb, ids)
        h = tf.compat.v1.layers.batch_normalization(x, training=True, name="bn")
        logits = tf.compat.v1.layers.dense(h, 1, name="out")
        loss = tf.reduce_mean(tf.square(logits))
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step)
        ema = tf.train.ExponentialMovingAverage(0.9)
        with tf.control_dependencies([train]):
            ema.apply([_variable("out/kernel")])
        tf.compat.v1.metrics.mean(loss, name="loss_mean")  # local variables: not written unless named
        # A shape left unknown in both variable kinds (with validate_shape=False alone, a resource variable -- on
        # when another test in the same process enabled them -- still takes its initializer's static shape).
        unknown_shape = tf.compat.v1.placeholder_with_default(tf.zeros([2]), [None])
        tf.compat.v1.get_variable("unknown", validate_shape=False, initializer=unknown_shape, trainable=False)
        global_names = {v.op.name for v in tf.compat.v1.global_variables()}
        # What the rule leaves out is there: Adam's and the moving average's slots, tf_ext's admission state.
        assert {"bn/gamma/Adam", "out/kernel/ExponentialMovingAverage", "item_admission/bloom_counters"} <= global_names
        writer = ServingUpdateWriter(str(tmp_path / "u"), dense_variables=["loss_mean/count"])
        _, dense = update_format.parse_layout(writer.layout)
    assert sorted(dense) == [
        "beta1_power",  # Adam's non-slot scalars: written (a served model does not read them)
        "beta2_power",
        "bn/beta",
        "bn/gamma",
        "bn/moving_mean",
        "bn/moving_variance",
        "loss_mean/count",  # a local variable, named
        "out/bias",
        "out/kernel",
    ], sorted(dense)
    assert dense["bn/moving_variance"] == ("float32", (DIM,))


def _export(work, checkpoint):
    export_dir = str(work / "export")
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        with tf_ext.serving.freeze_for_serving(live_model=MODEL):
            tf.compat.v1.train.get_or_create_global_step()
            ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
            logits, _ = _tower(ids, training=False)
            outputs = {
                "logits": logits,
                "moving_mean": tf.identity(_variable("bn/moving_mean")),
                "moving_variance": tf.identity(_variable("bn/moving_variance")),
                "version": tf_ext.serving.served_version(),
            }
            tf.compat.v1.train.Saver().restore(sess, checkpoint)
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, outputs)
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return export_dir


def test_a_batch_normalized_live_export_follows_its_trainers_updates(tmp_path):
    rng = np.random.RandomState(0)
    serve_ids = np.arange(0, 60, dtype=np.int64)
    updates_dir = str(tmp_path / "updates")
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        step = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        logits, emb = _tower(ids, training=True)
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
        with tf.control_dependencies(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=step)
        writer = ServingUpdateWriter(updates_dir, model_name=MODEL, keep=None)
        names = ("bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_variance", "out/kernel", "out/bias")
        variables = {name: _variable(name) for name in names}
        exported = emb.export()

        def train_steps(n, high):
            for _ in range(n):
                batch = rng.randint(0, high, size=32).astype(np.int64)
                sess.run(train, {ids: batch, labels: (batch % 3 == 0).astype(np.float32)})

        def trainer_state():
            keys, values = sess.run([exported.keys, exported.values])
            return dict(zip(keys.tolist(), values)), sess.run(variables)

        sess.run(tf.compat.v1.global_variables_initializer())
        train_steps(5, 40)
        checkpoint = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "ckpt" / "model"), global_step=step)
        writer.start(sess)  # the next update is a delta from the exported step
        model = ServedModel(_export(tmp_path, checkpoint), config=session_config())
        follower = Follower(model, updates_dir, start=False)
        try:
            assert model.version() == 5
            for round_, high in enumerate((40, 60, 60)):  # new ids in the second round
                train_steps(3, high)
                manifest = writer.write(sess)
                assert manifest["kind"] == update_format.KIND_DELTA
                assert follower.poll_once() == 1, follower.stats
                rows, dense = trainer_state()
                served, version = follower.predict({"ids": serve_ids}, with_version=True)
                assert version == manifest["to_step"] == 5 + 3 * (round_ + 1)
                # The moving statistics are the trainer's, exactly, and so is the served model's computation.
                np.testing.assert_array_equal(served["moving_mean"], dense["bn/moving_mean"])
                np.testing.assert_array_equal(served["moving_variance"], dense["bn/moving_variance"])
                x = np.stack([rows.get(int(k), np.zeros(DIM, np.float32)) for k in serve_ids])
                h = (x - dense["bn/moving_mean"]) / np.sqrt(dense["bn/moving_variance"] + EPSILON)
                h = h * dense["bn/gamma"] + dense["bn/beta"]
                expected = (h @ dense["out/kernel"] + dense["out/bias"])[:, 0]
                np.testing.assert_allclose(
                    served["logits"], expected, rtol=1e-5, atol=1e-5, err_msg="round %d" % round_
                )
        finally:
            follower.close()
    assert follower.stats["refused"] == 0 and follower.stats["applied"] == 3
