"""One rank of the fused-exchange tests (run by horovodrun; see test_model_parallel_fusion.py).

Trains a model with five model-parallel embeddings of different dims and lookups (ids, sparse mean, safe sparse
with admission, rows stored in bf16; two whose ids depend on what another lookup received, so they are fused
after it), a data-parallel one and a dense layer, with Adam, on its slice of a global batch; then looks up an
eval batch through a lookup the loss does not depend on (its own exchange). Writes what it trained (each
embedding's rows and slots of the keys this rank owns, the dense weights, the losses, the eval rows) to
OUT/rank-<r>.npz and prints the Horovod alltoalls a training step runs.

With REFERENCE=1 it also trains the same model in one plain process on the whole global batch and checks its
part against it (rows and slots within float32 rounding of the other summation order; bf16 rows within one unit
in the last place, most equal).

Usage: fusion_worker.py OUT STEPS [REFERENCE]
"""

import os
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext as tf_ext  # noqa: E402  pylint: disable=wrong-import-position
import tensorflow_ext.horovod as tfe_hvd  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_ext.horovod import consistency  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_ext.horovod import exchange  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_ext.horovod.embedding import owner_of_numpy  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_ext.horovod.tests.golden_worker import (
    assert_rows_close,
)  # noqa: E402  pylint: disable=wrong-import-position

PER_RANK, V = 5, 23
# name: (dim, value_dtype, parallelism)
EMBEDDINGS = {
    "ids4": (4, tf.float32, "model"),
    "sparse3_bf16": (3, tf.bfloat16, "model"),
    "admit5": (5, tf.float32, "model"),
    "after_a": (2, tf.float32, "model"),
    "after_b": (6, tf.float32, "model"),
    "replica2": (2, tf.float32, "data"),
}


def global_batches(num_ranks, steps):
    rng = np.random.RandomState(4321)  # the same on every rank
    out = []
    for _ in range(steps):
        n = num_ranks * PER_RANK
        out.append(
            dict(
                ids=rng.randint(-V, V, size=[n, 3]).astype(np.int64) * 7919 + 5,
                sparse=rng.randint(0, V, size=[n, 2]).astype(np.int64),
                labels=rng.normal(size=[n, 1]).astype(np.float32),
            )
        )
    return out


def build(distributed):
    """The model; returns (embeddings by name, placeholders, loss, eval rows, dense weights)."""
    init = tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=11)
    embs = {}
    for name, (dim, value_dtype, parallelism) in EMBEDDINGS.items():
        kwargs = dict(initializer=init, value_dtype=value_dtype)
        if name == "admit5":
            kwargs["admission"] = tf_ext.embedding.CountAdmission(2, default_value=0.25)
        if distributed:
            embs[name] = tfe_hvd.get_dynamic_embedding(name, dim, parallelism=parallelism, **kwargs)
        else:
            embs[name] = tf_ext.get_dynamic_embedding(name, dim, **kwargs)
    ph = dict(
        ids=tf.compat.v1.placeholder(tf.int64, [None, 3]),
        sparse=tf.compat.v1.placeholder(tf.int64, [None, 2]),
        labels=tf.compat.v1.placeholder(tf.float32, [None, 1]),
        eval_ids=tf.compat.v1.placeholder(tf.int64, [None]),
    )
    rows = tf_ext.embedding_lookup(embs["ids4"], ph["ids"])  # [B, 3, 4]
    sp = tf.sparse.from_dense(ph["sparse"] + 1)
    sp = tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)  # every entry kept
    feats = [
        tf.reduce_sum(rows, 1),
        tf_ext.embedding_lookup_sparse(embs["sparse3_bf16"], sp, None, combiner="mean"),
        tf_ext.safe_embedding_lookup_sparse(embs["admit5"], sp, None, combiner="sum"),
        tf.reduce_mean(tf_ext.embedding_lookup(embs["replica2"], ph["sparse"]), 1),
    ]
    # Ids that depend on what the first lookup received (a data edge that leaves the values as they are): these two
    # lookups wait for its rows, so their exchange is fused in a group of its own, after the first.
    after = ph["sparse"] * 3 + tf.cast(tf.reduce_sum(tf.stop_gradient(rows)) * 0.0, tf.int64)
    feats += [tf.reduce_sum(tf_ext.embedding_lookup(embs[n], after), 1) for n in ("after_a", "after_b")]
    x = tf.concat(feats, 1)
    width = sum(d for d, _, _ in EMBEDDINGS.values())
    w = tf.compat.v1.get_variable(
        "w", initializer=tf.constant(np.linspace(-0.4, 0.6, width).reshape(width, 1), tf.float32)
    )
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - ph["labels"]))
    eval_rows = tf_ext.embedding_lookup(embs["ids4"], ph["eval_ids"], is_training=False)
    return embs, ph, loss, eval_rows, w


def ancestors(op):
    """`op` and the ops it depends on (data and control inputs, transitively)."""
    seen, todo = set(), [op]
    while todo:
        op = todo.pop()
        if op in seen:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def live_alltoalls(train_op):
    """The Horovod alltoalls a run of `train_op` executes (the ops it depends on), by name."""
    return sorted(op.name for op in ancestors(train_op) if op.type == "HorovodAlltoall")


def check_dependencies(grads_and_vars, w):
    """The fused exchanges wait only for what they need: the rows' exchange for no dense layer, the gradients'
    exchange for no dense variable's gradient and no other collective (so it starts as soon as the embeddings'
    gradients exist, beside the dense gradients' allreduce)."""
    graph = w.graph
    fused = {
        stage: [op for op in graph.get_operations() if op.name.endswith("tf_ext_fused_lookups_0_" + stage)]
        for stage in ("rows", "row_gradients")
    }
    assert all(len(ops) == 1 for ops in fused.values()), fused
    before_rows = ancestors(fused["rows"][0])
    assert not [op.name for op in before_rows if op.type == "MatMul" or op.name.startswith("gradients")]
    # The raw gradient of the dense weights: the op in front of its allreduce, past the model check's pass-through.
    reduced = [g for g, v in grads_and_vars if v is w][0]
    allreduce = [op for op in ancestors(reduced.op) if op.type == "HorovodAllreduce"]
    assert len(allreduce) == 1, allreduce
    raw = allreduce[0].inputs[0].op
    while raw.type in ("Identity", "Print"):
        raw = raw.inputs[0].op
    assert raw.type == "MatMul", raw
    before_gradients = ancestors(fused["row_gradients"][0])
    assert raw not in before_gradients, raw.name
    # (The model check's allgathers run before the first collective of the first step only.)
    others = [
        op.name
        for op in before_gradients
        if op.type in ("HorovodAllreduce", "HorovodAllgather") and not op.name.startswith(consistency.CHECK_NAME)
    ]
    assert not others, others


def train(distributed, batches, rank, num_ranks):
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        embs, ph, loss, eval_rows, w = build(distributed)
        opt = tf.compat.v1.train.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6)
        if distributed:
            opt = tfe_hvd.DistributedOptimizer(opt)
        grads_and_vars = opt.compute_gradients(loss)
        train_op = opt.apply_gradients(grads_and_vars, global_step=gs)
        alltoalls = live_alltoalls(train_op)
        if distributed and exchange.fused_enabled():
            check_dependencies(grads_and_vars, w)
            print("RANK %d DEPENDENCIES OK" % rank, flush=True)
        exports = {n: e.export(with_slots=True) for n, e in embs.items()}
        out = {"losses": []}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            if distributed:
                sess.run(tfe_hvd.broadcast_global_variables(0))
            for batch in batches:
                sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK) if distributed else slice(None)
                feed = {ph[k]: v[sl] for k, v in batch.items()}
                out["losses"].append(sess.run([loss, train_op], feed)[0])
            out["eval"] = sess.run(eval_rows, {ph["eval_ids"]: batches[0]["ids"][:, 0]})
            out["w"] = sess.run(w)
            for name, exp in exports.items():
                keys, values, slots = sess.run([exp.keys, exp.values, exp.slots])
                order = np.argsort(keys)
                out[name + "/keys"], out[name + "/values"], out[name + "/slots"] = (
                    keys[order],
                    values[order],
                    slots[order],
                )
        out["losses"] = np.array(out["losses"])
        return out, alltoalls


def check_against_one_process(got, want, rank, num_ranks):
    for name, (_, value_dtype, parallelism) in EMBEDDINGS.items():
        keys = want[name + "/keys"]
        mine = owner_of_numpy(keys, num_ranks) == rank if parallelism == "model" else np.ones(len(keys), bool)
        np.testing.assert_array_equal(got[name + "/keys"], keys[mine], err_msg=name)
        assert_rows_close(got[name + "/values"], want[name + "/values"][mine], value_dtype, err_msg=name)
        np.testing.assert_allclose(
            got[name + "/slots"], want[name + "/slots"][mine], rtol=1e-4, atol=1e-6, err_msg=name
        )
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["eval"], want["eval"], rtol=1e-4, atol=1e-6)


def main(out_dir, steps, reference):
    tfe_hvd.init()
    rank, num_ranks = tfe_hvd.rank(), tfe_hvd.size()
    batches = global_batches(num_ranks, steps)
    got, alltoalls = train(True, batches, rank, num_ranks)
    np.savez(os.path.join(out_dir, "rank-%d.npz" % rank), **got)
    print("RANK %d ALLTOALLS %s" % (rank, " ".join(alltoalls)), flush=True)
    if reference:
        want, _ = train(False, batches, rank, num_ranks)
        check_against_one_process(got, want, rank, num_ranks)
        print("RANK %d MATCHES ONE PROCESS" % rank, flush=True)
    print("RANK %d DONE" % rank, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3 and sys.argv[3] == "1")
