"""Restoring dynamic embeddings from bad checkpoints: a clear error, never a crash or silent data loss.

Each case restores into a session whose tables already hold data, and checks both the error (type and a message
naming the problem) and that a restore that failed before touching the tables left them as they were.
"""

import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext

KEYS = 50


def _model(dim=4, num_shards=2, initializer=0.25):
    emb = tf_ext.get_dynamic_embedding("emb", dim, num_shards=num_shards, initializer=initializer)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.range(KEYS, dtype=tf.int64)))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
    return emb, train


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A 2-shard, dim-4 Adagrad checkpoint holding KEYS keys: its prefix."""
    d = str(tmp_path_factory.mktemp("good"))
    with tf.Graph().as_default():
        _, train = _model()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(train)
            return saver.save(sess, os.path.join(d, "model"))


def _copy(prefix, tmp_path):
    """Copies checkpoint `prefix`'s files into tmp_path; returns the new prefix and its data file."""
    d = os.path.dirname(prefix)
    for f in os.listdir(d):
        if f.startswith(os.path.basename(prefix) + "."):
            shutil.copy(os.path.join(d, f), str(tmp_path))
    new = os.path.join(str(tmp_path), os.path.basename(prefix))
    data = [os.path.join(str(tmp_path), f) for f in os.listdir(str(tmp_path)) if ".data-" in f]
    assert len(data) == 1, data
    return new, data[0]


def _restore(path, error, match, keep_tables=True, **model_kw):
    """Restores `path` into a fresh model whose tables hold 3 keys; expects `error` matching `match`."""
    with tf.Graph().as_default():
        emb, _ = _model(initializer=7.0, **model_kw)
        fill = tf_ext.embedding_lookup(emb, tf.constant([1001, 1002, 1003], tf.int64), is_training=True)
        exp = emb.export()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(fill)
            before = sess.run(exp)
            with pytest.raises(error, match=match):
                saver.restore(sess, path)
            after = sess.run(exp)
    if keep_tables:  # the restore failed before any table was cleared
        assert sorted(after.keys.tolist()) == [1001, 1002, 1003]
        np.testing.assert_array_equal(np.sort(after.values, axis=None), np.sort(before.values, axis=None))


def test_good_checkpoint_restores(ckpt):
    with tf.Graph().as_default():
        emb, _ = _model()
        size = emb.size()
        with tf.compat.v1.Session(config=session_config()) as sess:
            tf.compat.v1.train.Saver().restore(sess, ckpt)
            assert sess.run(size) == KEYS


def test_truncated_data_file(ckpt, tmp_path):
    path, data = _copy(ckpt, tmp_path)
    with open(data, "rb") as f:
        raw = f.read()
    with open(data, "wb") as f:
        f.write(raw[: len(raw) // 2])
    _restore(path, (tf.errors.OutOfRangeError, tf.errors.DataLossError), r"(?i)read less bytes|truncat|data loss")


def test_corrupt_data_file(ckpt, tmp_path):
    path, data = _copy(ckpt, tmp_path)
    with open(data, "rb") as f:
        raw = bytearray(f.read())
    for i in range(0, len(raw), 5):
        raw[i] ^= 0xA5
    with open(data, "wb") as f:
        f.write(bytes(raw))
    _restore(path, tf.errors.DataLossError, r"(?i)checksum does not match")


def test_truncated_index_file(ckpt, tmp_path):
    path, _ = _copy(ckpt, tmp_path)
    with open(path + ".index", "rb") as f:
        raw = f.read()
    with open(path + ".index", "wb") as f:
        f.write(raw[: len(raw) // 2])
    _restore(path, tf.errors.DataLossError, r"not an sstable|corrupt|Truncated|bad magic")


def test_checkpoint_missing_one_shard_names_it(tmp_path):
    with tf.Graph().as_default():
        emb, train = _model()
        saver = tf.compat.v1.train.Saver(var_list=emb.saveables[:1])  # part_1's tensors are not written
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(train)
            path = saver.save(sess, str(tmp_path / "partial"))
    names = tf.compat.v1.train.NewCheckpointReader(path).get_variable_to_shape_map()
    assert "emb/part_0-keys" in names and "emb/part_1-keys" not in names
    _restore(path, tf.errors.NotFoundError, r"emb/part_1-\w+ not found in checkpoint")


def test_more_shards_than_the_checkpoint_names_both_counts(ckpt):
    # Not the Saver's "emb/part_2-keys not found": the shard counts, and what to do.
    _restore(
        ckpt,
        tf.errors.InvalidArgumentError,
        r"(?s)emb saved with num_shards=2.*has num_shards=3 here.*emb/part_2-keys.*warm_start",
        num_shards=3,
    )


def test_fewer_shards_than_the_checkpoint_is_an_error_not_a_partial_restore(ckpt):
    # Restoring part_0 alone into a 1-shard embedding would silently drop part_1's keys.
    _restore(ckpt, tf.errors.InvalidArgumentError, r"(?s)different number of shards.*num_shards=1.*\[2\]", num_shards=1)


@pytest.mark.parametrize("dim", [2, 8])
def test_other_dim_is_a_clear_error(ckpt, dim):
    _restore(
        ckpt,
        tf.errors.InvalidArgumentError,
        r"(?s)emb/part_\d-values does not match dynamic embedding emb: .*dim=%d.*\[\d+ 4\]" % dim,
        dim=dim,
    )


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    _restore(str(tmp_path / "nothing"), ValueError, r"not a valid checkpoint")
