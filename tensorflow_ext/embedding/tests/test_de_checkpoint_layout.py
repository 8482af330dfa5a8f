"""Checkpoints record each shard's row layout; a restore into another layout is refused unless asked for values only.

References: a dense `tf.Variable` trained side by side with the same optimizer, and numpy.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext

DIM = 4
IDS = np.array([1, 2, 3], np.int64)
COEF = np.linspace(-1.0, 1.0, 3 * DIM).reshape(3, DIM).astype(np.float32)


def _model(opt, num_shards=2, with_dense=True, dense_init=None):
    """A dynamic embedding and (optionally) a dense [4, DIM] reference, trained by `opt` on the same loss."""
    emb = tf_ext.get_dynamic_embedding("emb", DIM, num_shards=num_shards, initializer=0.5)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, IDS) * COEF)
    var_list, losses = None, [loss]
    dense = None
    if with_dense:
        init = np.full([4, DIM], 0.5, np.float32) if dense_init is None else dense_init
        dense = tf.compat.v1.get_variable("dense", initializer=tf.constant(init))
        losses.append(tf.reduce_sum(tf.gather(dense, IDS) * COEF))
    train = opt.minimize(tf.add_n(losses), var_list=var_list) if opt is not None else None
    return emb, dense, train


def _sorted_export(sess, emb):
    e = sess.run(emb.export(with_slots=True))
    order = np.argsort(e.keys)
    return e.keys[order], e.values[order], e.slots[order]


def _adagrad_checkpoint(path, name="Adagrad"):
    """Trains 2 Adagrad steps and saves; returns (prefix, dense reference values of IDS, exported slots)."""
    with tf.Graph().as_default():
        opt = tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.2, name=name)
        emb, dense, train = _model(opt)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            sess.run(train)
            keys, values, slots = _sorted_export(sess, emb)
            ref = sess.run(dense)[IDS]
            np.testing.assert_allclose(values, ref, rtol=1e-6)
            return saver.save(sess, path), ref, slots


@pytest.fixture(scope="module")
def adagrad_ckpt(tmp_path_factory):
    return _adagrad_checkpoint(str(tmp_path_factory.mktemp("adagrad") / "model"))


def test_checkpoint_records_the_layout(adagrad_ckpt):
    path, _, _ = adagrad_ckpt
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    for shard in ("emb/part_0", "emb/part_1"):
        record = json.loads(reader.get_tensor(shard + "-layout").decode())
        assert record["format"] == 1
        assert record["embedding"] == "emb"
        assert (record["dim"], record["width"]) == (DIM, 2 * DIM)
        assert record["signature"] == "dim=4;AdagradOptimizer(accumulator)"
        assert record["slot_groups"] == [
            {
                "optimizer": "Adagrad",
                "class": "AdagradOptimizer",
                "slots": ["accumulator"],
                "offset": DIM,
                "initial_values": [pytest.approx(0.2)],
            }
        ]
        assert reader.get_tensor(shard + "-slots").shape[1] == DIM  # the same width as a Momentum slot


def test_other_optimizer_of_the_same_width_is_refused_naming_both_layouts(adagrad_ckpt):
    path, _, _ = adagrad_ckpt
    with tf.Graph().as_default():
        emb, _, train = _model(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), with_dense=False)
        fill = tf_ext.embedding_lookup(emb, tf.constant([7, 8, 9], tf.int64), is_training=True)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            before = _sorted_export(sess, emb)
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                saver.restore(sess, path)
            after = _sorted_export(sess, emb)
    msg = info.value.message
    assert "Layout here: dim=4, width=8, slot columns: Momentum (MomentumOptimizer): momentum [4:8]" in msg
    assert "dim=4, width=8, slot columns: Adagrad (AdagradOptimizer): accumulator [4:8]" in msg
    assert "tf_ext.embedding.restore_values_only()" in msg
    for a, b in zip(before, after):  # refused before any table changed
        np.testing.assert_array_equal(a, b)
    assert before[0].tolist() == [7, 8, 9]


def test_restore_values_only_starts_slots_fresh_and_trains_like_dense(adagrad_ckpt):
    path, ref, _ = adagrad_ckpt
    dense_init = np.full([4, DIM], 0.5, np.float32)
    dense_init[IDS] = ref
    with tf.Graph().as_default():
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        emb, dense, train = _model(opt, dense_init=dense_init)
        marked = tf_ext.embedding.restore_values_only()
        assert marked == [emb]
        momentum = emb.slot_values(opt, "momentum", IDS)
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables)  # the dense reference starts from dense_init
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, path)
            keys, values, slots = _sorted_export(sess, emb)
            assert keys.tolist() == IDS.tolist()
            np.testing.assert_array_equal(values, ref)
            np.testing.assert_array_equal(sess.run(momentum), np.zeros([3, DIM]))
            for _ in range(3):
                sess.run(train)
            np.testing.assert_allclose(_sorted_export(sess, emb)[1], sess.run(dense)[IDS], rtol=1e-5)


def test_same_optimizer_under_another_name_restores_slots(adagrad_ckpt):
    path, ref, slots = adagrad_ckpt
    with tf.Graph().as_default():
        emb, _, _ = _model(tf.compat.v1.train.AdagradOptimizer(0.1, name="Renamed"), with_dense=False)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            keys, values, got_slots = _sorted_export(sess, emb)
    np.testing.assert_array_equal(values, ref)
    np.testing.assert_array_equal(got_slots, slots)


def test_inference_graph_restores_values_of_a_training_checkpoint(adagrad_ckpt):
    path, ref, _ = adagrad_ckpt
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", DIM, num_shards=2, initializer=0.5)
        rows = tf_ext.embedding_lookup(emb, IDS, is_training=False)
        saver = tf.compat.v1.train.Saver([s for s in emb.saveables])
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            np.testing.assert_array_equal(sess.run(rows), ref)


def test_restore_values_only_after_the_saver_is_a_clear_error():
    with tf.Graph().as_default():
        emb, _, _ = _model(tf.compat.v1.train.AdagradOptimizer(0.1), with_dense=False)
        tf.compat.v1.train.Saver()
        with pytest.raises(ValueError, match=r"restore_values_only\('emb'\) must be called before the Saver"):
            tf_ext.embedding.restore_values_only(emb)
        with pytest.raises(TypeError, match="DynamicEmbeddings"):
            tf_ext.embedding.restore_values_only(["emb"])


def _strip_layout_records(src, dst):
    """Rewrites checkpoint `src` as `dst` without the `-layout` tensors: a checkpoint as tensorflow_ext wrote it
    before layouts were recorded (same tensors, names, dtypes and file format)."""
    reader = tf.compat.v1.train.NewCheckpointReader(src)
    names = sorted(n for n in reader.get_variable_to_shape_map() if not n.endswith("-layout"))
    assert any(n.endswith("-slots") for n in names)
    with tf.Graph().as_default():
        tensors = [tf.constant(reader.get_tensor(n)) for n in names]
        save = tf.raw_ops.SaveV2(prefix=dst, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
        with tf.compat.v1.Session() as sess:
            sess.run(save)
    assert not any(
        n.endswith("-layout") for n in tf.compat.v1.train.NewCheckpointReader(dst).get_variable_to_shape_map()
    )
    return dst


def test_old_checkpoint_without_layout_record_restores_with_a_warning(adagrad_ckpt, tmp_path, capfd):
    path, ref, slots = adagrad_ckpt
    old = _strip_layout_records(path, str(tmp_path / "old"))
    with tf.Graph().as_default():
        emb, _, _ = _model(tf.compat.v1.train.AdagradOptimizer(0.1), with_dense=False)
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables)
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, old)
            keys, values, got_slots = _sorted_export(sess, emb)
    np.testing.assert_array_equal(values, ref)
    np.testing.assert_array_equal(got_slots, slots)
    err = capfd.readouterr().err
    assert "emb/part_0-* have no layout record" in err and "only the width was checked" in err


def test_old_checkpoint_of_another_width_is_refused(adagrad_ckpt, tmp_path):
    path, _, _ = adagrad_ckpt
    old = _strip_layout_records(path, str(tmp_path / "old"))
    with tf.Graph().as_default():
        emb, _, _ = _model(tf.compat.v1.train.AdamOptimizer(0.1), with_dense=False)  # 2 slots: width 12
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables)
        with tf.compat.v1.Session(config=session_config()) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"no layout record .*slot columns 4 wide"):
                saver.restore(sess, old)


def test_old_checkpoint_values_only(adagrad_ckpt, tmp_path):
    path, ref, _ = adagrad_ckpt
    old = _strip_layout_records(path, str(tmp_path / "old"))
    with tf.Graph().as_default():
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        emb, _, _ = _model(opt, with_dense=False)
        tf_ext.embedding.restore_values_only(emb)
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables)
        v = emb.slot_values(opt, "v", IDS)
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, old)
            np.testing.assert_array_equal(_sorted_export(sess, emb)[1], ref)
            np.testing.assert_array_equal(sess.run(v), np.zeros([3, DIM]))


def test_sharded_saver_and_one_shard_record_the_layout(tmp_path):
    with tf.Graph().as_default():
        emb, _, train = _model(tf.compat.v1.train.AdagradOptimizer(0.1), num_shards=1, with_dense=False)
        saver = tf.compat.v1.train.Saver(sharded=True)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(train)
            path = saver.save(sess, os.path.join(str(tmp_path), "m"))
    assert "Adagrad" in tf.compat.v1.train.NewCheckpointReader(path).get_tensor("emb/part_0-layout").decode()
    with tf.Graph().as_default():
        emb, _, _ = _model(tf.compat.v1.train.GradientDescentOptimizer(0.1), num_shards=1, with_dense=False)
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables, sharded=True)
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)  # SGD has no slot columns: values only, nothing to refuse
