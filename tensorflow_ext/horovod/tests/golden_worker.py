"""One rank of the distributed golden test (run by horovodrun; see test_horovod.py).

Every rank trains its slice of a global batch with tensorflow_ext.horovod, then trains the same model in a plain
single-process graph on the whole global batch, and checks that its part of the table (all keys for a replica,
the keys it owns for a model-parallel embedding), the optimizer slots and the dense weights are equal.

Usage: golden_worker.py OPTIMIZER PARALLELISM FLAVOUR STEPS [VALUE_DTYPE]
  PARALLELISM: data | model | plain_horovod (horovod.tensorflow.DistributedOptimizer on a replicated embedding)
  VALUE_DTYPE: float32 (default) | bfloat16 | float16, the embedding's storage dtype (slots stay float32). Half rows
    are rounded after each update, so a float32 sum of the same gradients in another order may round a value to
    the neighbouring half value: rows are compared to one unit in the last place of the storage dtype, and most
    must be equal.
"""

import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext as tf_ext  # noqa: E402
import tensorflow_ext.horovod as tfe_hvd  # noqa: E402

DIM, PER_RANK, V = 4, 6, 25


def make_optimizer(name):
    t = tf.compat.v1.train
    return {
        "Adagrad": lambda: t.AdagradOptimizer(0.2, initial_accumulator_value=0.3),
        "Adam": lambda: t.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6),
        "Ftrl": lambda: t.FtrlOptimizer(0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
        "GradientDescent": lambda: t.GradientDescentOptimizer(0.3),
    }[name]()


def global_batches(num_ranks, steps):
    rng = np.random.RandomState(1234)  # the same on every rank
    out = []
    for _ in range(steps):
        ids = rng.randint(-V // 2, V // 2, size=[num_ranks * PER_RANK, 3]).astype(np.int64) * 7919 + 13
        labels = rng.normal(size=[num_ranks * PER_RANK, 1]).astype(np.float32)
        out.append((ids, labels))
    return out


def model(emb_fn, ids, labels, flavour):
    emb = emb_fn()
    if flavour == "sparse":
        sp = tf.sparse.from_dense(ids + 1)  # ids never 0 after +1? keep every entry: shift back below
        sp = tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)
        x = tf_ext.embedding_lookup_sparse(emb, sp, None, combiner="mean")
    else:
        x = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids), axis=1)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-0.5, 0.5, DIM).reshape(DIM, 1), tf.float32))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
    return emb, w, loss


def train(distributed, opt_name, parallelism, flavour, batches, rank, num_ranks, value_dtype):
    with tf.Graph().as_default() as g:
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        init = tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=7)
        if distributed and parallelism != "plain_horovod":
            emb_fn = lambda: tfe_hvd.get_dynamic_embedding(
                "emb", DIM, parallelism=parallelism, initializer=init, value_dtype=value_dtype
            )
        else:
            emb_fn = lambda: tf_ext.get_dynamic_embedding("emb", DIM, initializer=init, value_dtype=value_dtype)
        emb, w, loss = model(emb_fn, ids, labels, flavour)
        opt = make_optimizer(opt_name)
        if distributed and parallelism == "plain_horovod":
            import horovod.tensorflow as hvd  # Horovod's own wrapper on a replicated embedding

            opt_used = hvd.DistributedOptimizer(opt)
        elif distributed:
            opt_used = tfe_hvd.DistributedOptimizer(opt)
        else:
            opt_used = opt
        train_op = opt_used.minimize(loss, global_step=gs)
        if distributed and parallelism == "model" and num_ranks > 1:
            check_alltoall_dtypes(g, value_dtype)
        exported = emb.export(with_slots=True)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for gids, glabels in batches:
                if distributed:
                    sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
                    sess.run(train_op, {ids: gids[sl], labels: glabels[sl]})
                else:
                    sess.run(train_op, {ids: gids, labels: glabels})
            keys, values, slots = sess.run([exported.keys, exported.values, exported.slots])
            return {int(k): (v, s) for k, v, s in zip(keys, values, slots)}, sess.run(w)


def check_alltoall_dtypes(graph, value_dtype):
    """A model-parallel lookup sends keys (int64) and rows (half rows as their 2-byte values); the rows' gradient
    returns in float32."""
    sent = sorted({op.get_attr("T").name for op in graph.get_operations() if op.type == "HorovodAlltoall"})
    rows = "uint16" if value_dtype in (tf.bfloat16, tf.float16) else "float32"
    assert sent == sorted({"int64", rows, "float32"}), sent


def assert_rows_close(got, want, value_dtype, err_msg):
    if value_dtype == tf.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=err_msg)
        return
    # Half rows hold values of the storage dtype exactly.
    np.testing.assert_array_equal(got, np.asarray(got).astype(value_dtype.as_numpy_dtype).astype(np.float32))
    ulp = 2.0 ** -{tf.bfloat16: 7, tf.float16: 10}[value_dtype]
    np.testing.assert_allclose(got, want, rtol=ulp, atol=1e-6, err_msg=err_msg)


def main():
    opt_name, parallelism, flavour, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    value_dtype = tf.as_dtype(sys.argv[5] if len(sys.argv) > 5 else "float32")
    tfe_hvd.init()
    rank, num_ranks = tfe_hvd.rank(), tfe_hvd.size()
    batches = global_batches(num_ranks, steps)
    got, got_w = train(True, opt_name, parallelism, flavour, batches, rank, num_ranks, value_dtype)
    want, want_w = train(False, opt_name, parallelism, flavour, batches, rank, num_ranks, value_dtype)
    if parallelism == "model":
        from tensorflow_ext.horovod.embedding import owner_of_numpy

        keys = np.array(sorted(want), np.int64)
        want = {int(k): want[int(k)] for k in keys[owner_of_numpy(keys, num_ranks) == rank]}
    assert sorted(got) == sorted(want), (rank, sorted(set(got) ^ set(want))[:10])
    for k in want:
        assert_rows_close(got[k][0], want[k][0], value_dtype, err_msg="row of key %d" % k)
        np.testing.assert_allclose(got[k][1], want[k][1], rtol=1e-5, atol=1e-6, err_msg="slots of key %d" % k)
    if value_dtype != tf.float32:
        rows_equal = np.mean([np.array_equal(got[k][0], want[k][0]) for k in want])
        assert rows_equal >= 0.9, (rank, rows_equal)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    print("RANK %d OK keys=%d" % (rank, len(got)), flush=True)


if __name__ == "__main__":
    main()
