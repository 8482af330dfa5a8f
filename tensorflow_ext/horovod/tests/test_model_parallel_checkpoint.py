"""A model-parallel embedding restores every key it owns with its own row, at any rank and shard count, from a
checkpoint whose shard tensors hold the keys where a save puts them or anywhere else (restore places each key by
the current partition after keeping the keys the rank owns)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding import keys as keys_lib
from tensorflow_ext.embedding.tests.conftest import write_shard_tensors_checkpoint
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

tf.compat.v1.disable_v2_behavior()

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "model_parallel_restore_worker.py")
DIM = 3


def _checkpoint(tmp_path, num_shards, layout, value_dtype="float32"):
    """Writes, with a plain Saver of tf.Variables, the shard tensors of an Adagrad embedding "emb" (`layout`: each
    key in its hash shard's tensors, as a save writes them, or in another one); returns (path, truth .npz path).
    The rows are values of `value_dtype`, the storage of the embedding that restores them."""
    rng = np.random.RandomState(7)
    keys = np.unique(rng.randint(-(2**62), 2**62, size=200)).astype(np.int64)
    n = len(keys)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        right = sess.run(keys_lib.hash_key_shard_ids(tf.constant(keys), num_shards))
    where = right if layout == "hashed" else (right + 1) % num_shards
    truth = dict(
        keys=keys,
        shard=right,
        values=rng.normal(size=[n, DIM]).astype(tf.as_dtype(value_dtype).as_numpy_dtype).astype(np.float32),
        slots=rng.uniform(0.1, 2.0, size=[n, DIM]).astype(np.float32),
        versions=rng.randint(0, 100, size=n).astype(np.int64),
        freqs=rng.randint(1, 50, size=n).astype(np.int64),
    )
    path = write_shard_tensors_checkpoint(str(tmp_path / "ckpt" / "m"), keys, where, truth, num_shards)
    truth_path = str(tmp_path / "truth.npz")
    np.savez(truth_path, **truth)
    return path, truth_path


@pytest.mark.parametrize("ranks,num_shards", [(2, 2), (3, 3)])
@pytest.mark.parametrize("layout", ["hashed", "misplaced"])
def test_model_parallel_restore_gives_every_owned_key_its_row(tmp_path, ranks, num_shards, layout):
    path, truth_path = _checkpoint(tmp_path, num_shards, layout)
    code, out = horovodrun(ranks, WORKER, path, truth_path, str(num_shards))
    assert code == 0, out[-6000:]
    for r in range(ranks):
        assert "RESTORE OK %d" % r in out, out[-6000:]


def test_model_parallel_bf16_rows_restore_from_a_float32_checkpoint(tmp_path):
    """An embedding stored in bf16 restores at 3 ranks, from a checkpoint of 2 shards without a storage record
    (float32 rows, here values of bf16), every key it owns with its exact row, slots, metadata and shard."""
    ranks = 3
    path, truth_path = _checkpoint(tmp_path, 2, "hashed", "bfloat16")
    code, out = horovodrun(ranks, WORKER, path, truth_path, "2", "bfloat16")
    assert code == 0, out[-6000:]
    for r in range(ranks):
        assert "RESTORE OK %d" % r in out, out[-6000:]
