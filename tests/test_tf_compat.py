"""The patches of TensorFlow internals (tensorflow_ext/tf_compat.py): each is listed, guarded and tested."""

import ast
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext import tf_compat

tf.compat.v1.disable_v2_behavior()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ = tf_ext.embedding  # importing the embedding package installs its patches


def _test_functions(path):
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_every_patch_is_documented_installed_and_has_a_test():
    patches = tf_compat.patches()
    assert patches, "no patch registered"
    for p in patches:
        assert p.installed, p
        assert len(p.why) > 60, "%s: say what it replaces and why" % p.name
        path, func = p.test.split("::")
        assert func in _test_functions(path), "%s names a missing test %s" % (p.name, p.test)
        assert tf_compat.original(p.name) is not None
        # The original is TF's: the replacement wraps it, it does not replace TF's behaviour for other objects.
        assert tf_compat.original(p.name) is not getattr(p._owner_object(), p.attr)  # pylint: disable=protected-access


def test_guard_refuses_a_tensorflow_it_was_not_written_for(monkeypatch):
    patch = tf_compat.Patch("probe", "tensorflow.python.training.optimizer", "Optimizer", "get_slot", why="probe",
                            test="-", make=lambda orig: orig, tf_versions=("2.15.0", "2.16.0"))
    monkeypatch.setattr(tf, "__version__", "2.17.0")
    with pytest.raises(tf_compat.PatchError, match=r"probe.*2\.17\.0"):
        patch.check_guard()


def test_guard_refuses_a_moved_target():
    patch = tf_compat.Patch("moved", "tensorflow.python.training.optimizer", "Optimizer", "no_such_method",
                            why="probe", test="-", make=lambda orig: orig)
    with pytest.raises(tf_compat.PatchError, match="no_such_method is missing"):
        patch.install()


def test_optimizer_get_slot_of_a_shard():
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5], tf.int64)) * dense)
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        train = opt.minimize(loss)
        slot = opt.get_slot(emb.shards[0], "momentum")
        assert isinstance(slot, tf_ext.embedding.DynamicEmbeddingSlot)
        assert isinstance(opt.get_slot(dense, "momentum"), tf.Variable)  # dense variables: TF's own answer
        values = slot.lookup(tf.constant([5, 6], tf.int64))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(values)
    np.testing.assert_allclose(got, [[1.0, 1.0], [0.0, 0.0]])  # gradient 1 (dense = 1); key 6 was never trained


def test_optimizer_get_slot_names_include_embedding_slots():
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2)
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        opt.minimize(tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64))))
        assert opt.get_slot_names() == ["m", "v"]
        assert tf.compat.v1.train.AdamOptimizer(0.1).get_slot_names() == []


def test_moving_average_refuses_shards_with_advice():
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.9)
        with pytest.raises(TypeError, match="dense_variables"):
            ema.apply(emb.shards)
        v = tf.compat.v1.get_variable("v", initializer=1.0)
        assert ema.apply([v]) is not None  # dense variables: TF's own behaviour
