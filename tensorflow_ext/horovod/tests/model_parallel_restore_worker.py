"""One rank of a model-parallel restore: restores checkpoint PATH (written by test_model_parallel_checkpoint.py from
TRUTH, an .npz of every key's row) into a model-parallel Adagrad embedding "emb" of NUM_SHARDS local shards, and
checks every key this rank owns: its row, slots, version and frequency, and the local shard it sits in.

  model_parallel_restore_worker.py PATH TRUTH NUM_SHARDS [VALUE_DTYPE]

VALUE_DTYPE (float32 by default, or bfloat16 / float16) is the embedding's storage dtype; TRUTH's rows must then be
values of that dtype (a restore rounds the checkpoint's float32 rows to it).
"""

import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import horovod.tensorflow as hvd  # noqa: E402  pylint: disable=wrong-import-position

import tensorflow_ext as tf_ext  # noqa: E402  pylint: disable=wrong-import-position
import tensorflow_ext.horovod as tfe_hvd  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_ext.horovod.embedding import owner_of_numpy  # noqa: E402  pylint: disable=wrong-import-position

DIM = 3


def main(path, truth_path, num_shards, value_dtype):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    truth = dict(np.load(truth_path))
    emb = tfe_hvd.get_dynamic_embedding(
        "emb", DIM, parallelism="model", num_shards=num_shards, initializer=9.0, value_dtype=value_dtype
    )
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([11, -11], tf.int64)))
    step = tf.compat.v1.train.get_or_create_global_step()  # half rows round stochastically by step
    tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.3).minimize(loss, step)  # slot columns
    saver = tf.compat.v1.train.Saver(var_list=emb.saveables)
    exp = emb.export(with_slots=True)
    sizes = [emb.size(i) for i in range(num_shards)]
    with tf.compat.v1.Session() as sess:
        saver.restore(sess, path)
        got, got_sizes = sess.run([exp, sizes])
    keys = truth["keys"]
    mine = owner_of_numpy(keys, size) == rank
    order = np.argsort(got.keys)
    np.testing.assert_array_equal(got.keys[order], keys[mine])  # exactly the keys this rank owns
    for field, want in (("values", "values"), ("slots", "slots"), ("versions", "versions"), ("frequencies", "freqs")):
        np.testing.assert_array_equal(
            getattr(got, field)[order], truth[want][mine], err_msg="rank %d %s" % (rank, field)
        )
    right = truth["shard"][mine]
    assert got_sizes == [int(np.sum(right == i)) for i in range(num_shards)], (rank, got_sizes)
    print("RESTORE OK %d keys=%d" % (rank, len(got.keys)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), tf.as_dtype(sys.argv[4] if len(sys.argv) > 4 else "float32"))
