"""One rank of the faster-allreduce tests (run by horovodrun; see test_allreduce.py).

The gradient of loss = sum(var * data) is `data`, so `DistributedOptimizer.compute_gradients` returns the reduced
`data` of all ranks; every rank regenerates all ranks' data from seeds and checks against numpy.

Usage:
  allreduce_worker.py main CKPT_DIR      4 ranks as 2 nodes x 2: 2D vs flat, fp16/bf16, inf/NaN, Top-K (ratio 1.0
                                         vs dense training, residual exactness with warm-up), bad node size;
                                         saves a checkpoint per rank with the Top-K residuals
  allreduce_worker.py restore CKPT_DIR   a fresh job restores the residuals (and keeps them through the
                                         broadcast), continues like the simulation; 2D without its process sets
"""

import math
import os
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext.horovod as tfe_hvd  # noqa: E402

SHAPES = [(7,), (40, 30), (5,), (33, 17), (1,), (3, 2, 2)]


def data(rank, step, shapes, seed=0):
    rng = np.random.RandomState(1000 * seed + 100 * step + rank)
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


def build(shapes, **opt_kwargs):
    """Variables of `shapes`, placeholders for the data, the reduced gradients and a plain SGD step on them."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    vs = [
        tf.compat.v1.get_variable("v%d" % i, initializer=tf.zeros(s, tf.float32), use_resource=True)
        for i, s in enumerate(shapes)
    ]
    phs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
    loss = tf.add_n([tf.reduce_sum(v * p) for v, p in zip(vs, phs)])
    opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), **opt_kwargs)
    gvs = opt.compute_gradients(loss, var_list=vs)
    grads = [g for g, _ in gvs]
    train = opt.apply_gradients(gvs, global_step=gs)
    return vs, phs, grads, train


def reduce_once(shapes, inputs, **opt_kwargs):
    with tf.Graph().as_default():
        _, phs, grads, _ = build(shapes, **opt_kwargs)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            return s.run(grads, dict(zip(phs, inputs)))


def check_2d_and_compression(rank, size):
    inputs = data(rank, 0, SHAPES)
    want = [np.mean([data(r, 0, SHAPES)[i] for r in range(size)], axis=0) for i in range(len(SHAPES))]
    flat = reduce_once(SHAPES, inputs)
    for name, kwargs in [
        ("2D", dict(hierarchical=True)),  # nodes of local_size (4 on localhost): a flat allreduce
        ("2D node_size=2", dict(node_size=2)),
        ("2D node_size=2 no fusion", dict(node_size=2, fusion_bytes=0)),
        ("2D node_size=2 small buffers", dict(node_size=2, fusion_bytes=4000)),
        ("2D node_size=2 Sum", dict(node_size=2, op=tfe_hvd.Sum)),
    ]:
        got = reduce_once(SHAPES, inputs, **kwargs)
        scale = size if "Sum" in name else 1
        for g, f, w in zip(got, flat, want):
            assert g.shape == w.shape, (name, g.shape, w.shape)
            np.testing.assert_allclose(g, w * scale, rtol=1e-5, atol=1e-6, err_msg=name)
            if scale == 1:
                np.testing.assert_allclose(g, f, rtol=1e-5, atol=1e-6, err_msg=name + " vs flat")
    print("RANK %d 2D OK" % rank, flush=True)

    for comp, tol in [(tfe_hvd.Compression.fp16, 2e-3), (tfe_hvd.Compression.bf16, 1.6e-2)]:
        for kwargs in (dict(), dict(node_size=2), dict(node_size=2, fusion_bytes=0)):
            got = reduce_once(SHAPES, inputs, compression=comp, **kwargs)
            for g, w in zip(got, want):
                assert g.dtype == np.float32
                # Relative to the size of the values summed (16 bits carry 3 significant digits or fewer).
                np.testing.assert_allclose(g, w, rtol=0, atol=tol * 4, err_msg="%s %s" % (comp.name, kwargs))
            # It really went through 16 bits.
            assert max(np.max(np.abs(g - w)) for g, w in zip(got, want)) > 1e-5, (comp.name, kwargs)
        # Non-finite values stay non-finite (the loss-scaling skip must see them); big finite ones are not clipped.
        special = [np.ones(s, np.float32) for s in SHAPES]
        if rank == 1:
            special[1][0, 0] = np.inf
            special[1][0, 1] = -np.inf
            special[3][2, 2] = np.nan
        if rank == 2:
            special[1][1, 0] = 3e4  # 4 ranks: the fp16 sum 3e4 + 3 exceeds nothing; bf16 keeps it
        for kwargs in (dict(), dict(node_size=2)):
            got = reduce_once(SHAPES, special, compression=comp, **kwargs)
            assert got[1][0, 0] == np.inf and got[1][0, 1] == -np.inf, (comp.name, kwargs, got[1][0, :2])
            assert np.isnan(got[3][2, 2]), (comp.name, kwargs)
            np.testing.assert_allclose(got[1][1, 0], (3e4 + 3) / size, rtol=tol)
            assert np.all(np.isfinite(got[0])) and np.allclose(got[0], 1.0)
        if comp is tfe_hvd.Compression.fp16:
            big = [np.ones(s, np.float32) for s in SHAPES]
            big[0][0] = 7e4  # above fp16's largest finite value: inf, never a clipped 65504
            got = reduce_once(SHAPES, big, compression=comp)
            assert got[0][0] == np.inf, got[0][0]
    print("RANK %d COMPRESSION OK" % rank, flush=True)


def simulate_topk(size, steps, shapes, ratio, min_elements, warmup, seed):
    """numpy error feedback: per step, the reduced gradients and every rank's residuals after it."""
    res = [[np.zeros(s, np.float32) for s in shapes] for _ in range(size)]
    out = []
    for step in range(steps):
        reduced = []
        for i, s in enumerate(shapes):
            n = int(np.prod(s))
            total = np.zeros(n, np.float32)
            for r in range(size):
                acc = (data(r, step, shapes, seed)[i] + res[r][i]).reshape(-1)
                if n < min_elements:
                    total += acc
                    continue
                if step < warmup:
                    total += acc
                    res[r][i] = np.zeros(s, np.float32)
                    continue
                k = max(1, int(math.ceil(ratio * n)))
                top = np.argsort(-np.abs(acc), kind="stable")[:k]
                sent = np.zeros(n, np.float32)
                sent[top] = acc[top]
                total += sent
                res[r][i] = (acc - sent).reshape(s)
            reduced.append((total / size).reshape(s))
        out.append((reduced, [[x.copy() for x in rr] for rr in res]))
    return out


TOPK_SHAPES = [(30, 20), (50,), (12, 12)]
TOPK = dict(topk_ratio=0.05, topk_min_elements=100, topk_warmup_steps=2)
TOPK_SENT = [0, 2]  # the shapes of at least topk_min_elements entries


def check_topk(rank, size, ckpt_dir):
    # ratio 1.0 equals dense training (every entry sent, residual 0).
    steps = 3
    results = []
    for kwargs in (dict(), dict(topk_ratio=1.0, topk_min_elements=1)):
        with tf.Graph().as_default():
            vs, phs, grads, train = build(TOPK_SHAPES, **kwargs)
            residuals = tf.compat.v1.get_collection(tfe_hvd.allreduce.TOPK_RESIDUALS)
            assert len(residuals) == (len(TOPK_SHAPES) if kwargs else 0), residuals
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                for step in range(steps):
                    s.run(train, dict(zip(phs, data(rank, step, TOPK_SHAPES))))
                results.append(s.run(vs))
                for r in s.run(residuals):
                    assert not np.any(r), "ratio 1.0 left a residual"
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    print("RANK %d TOPK RATIO 1 OK" % rank, flush=True)

    # Error feedback against numpy, with 2 dense warm-up steps; every step: sent + residual == grad + residual.
    steps = 5
    sim = simulate_topk(size, steps, TOPK_SHAPES, seed=1, ratio=0.05, min_elements=100, warmup=2)
    with tf.Graph().as_default():
        vs, phs, grads, train = build(TOPK_SHAPES, **TOPK)
        residuals = tf.compat.v1.get_collection(tfe_hvd.allreduce.TOPK_RESIDUALS)
        assert [r.op.name for r in residuals] == [
            "v0/DistributedGradientDescentOptimizer_topk_residual",
            "v2/DistributedGradientDescentOptimizer_topk_residual",
        ], [r.op.name for r in residuals]
        assert all(r not in tf.compat.v1.trainable_variables() for r in residuals)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                old = s.run(residuals)
                inputs = data(rank, step, TOPK_SHAPES, seed=1)
                got, _ = s.run([grads, train], dict(zip(phs, inputs)))
                new = s.run(residuals)
                want_grads, want_res = sim[step]
                for i in range(len(TOPK_SHAPES)):
                    np.testing.assert_allclose(got[i], want_grads[i], rtol=1e-5, atol=1e-6, err_msg="step %d" % step)
                for i, o, n in zip(TOPK_SENT, old, new):  # the gradients large enough for Top-K
                    np.testing.assert_allclose(n, want_res[rank][i], rtol=1e-6, atol=1e-7)
                    # What this rank sent is what left its accumulator: exactly acc where sent, 0 elsewhere.
                    acc = inputs[i] + o
                    sent = acc - n
                    assert np.all((sent == 0) | (sent == acc)), "step %d: a sent entry is not the accumulator's" % step
                    k = np.count_nonzero(sent)
                    want_k = acc.size if step < 2 else int(math.ceil(0.05 * acc.size))
                    assert k == want_k, (step, k, want_k)
            saver = tf.compat.v1.train.Saver()
            saver.save(s, os.path.join(ckpt_dir, "rank%d" % rank, "model"), global_step=steps)
            np.savez(os.path.join(ckpt_dir, "rank%d.npz" % rank), *s.run(residuals))
    print("RANK %d TOPK RESIDUAL OK" % rank, flush=True)

    # fp16 values on the wire: the residual keeps the rounding error too (sent + residual == accumulator).
    with tf.Graph().as_default():
        vs, phs, grads, train = build(TOPK_SHAPES, topk_ratio=0.1, topk_min_elements=1, compression="fp16")
        residuals = tf.compat.v1.get_collection(tfe_hvd.allreduce.TOPK_RESIDUALS)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            inputs = data(rank, 0, TOPK_SHAPES, seed=2)
            s.run(train, dict(zip(phs, inputs)))
            for x, n in zip(inputs, s.run(residuals)):
                sent = x - n
                assert np.all(sent.astype(np.float16).astype(np.float32) == sent)  # fp16 values were sent
                assert np.count_nonzero(sent) == int(math.ceil(0.1 * x.size))
                # Where an entry was sent, the residual keeps its rounding error (at most half an fp16 step).
                where = sent != 0
                assert np.all(np.abs(n[where]) <= np.abs(x[where]) * 2.0**-11), np.max(np.abs(n[where]))
                assert np.any(n[where] != 0)
    print("RANK %d TOPK FP16 OK" % rank, flush=True)


def check_errors(rank):
    with tf.Graph().as_default():
        try:
            build(SHAPES[:1], node_size=3)
        except ValueError as e:
            assert "node_size=3 does not divide the number of ranks 4" in str(e), e
            print("RANK %d ERROR node_size: %s" % (rank, e), flush=True)
        else:
            raise AssertionError("node_size=3 accepted on 4 ranks")


def restore(rank, size, ckpt_dir):
    steps = 5
    sim = simulate_topk(size, steps + 1, TOPK_SHAPES, seed=1, ratio=0.05, min_elements=100, warmup=2)
    with tf.Graph().as_default():
        vs, phs, grads, train = build(TOPK_SHAPES, **TOPK)
        residuals = tf.compat.v1.get_collection(tfe_hvd.allreduce.TOPK_RESIDUALS)
        bcast = tfe_hvd.broadcast_global_variables(0)
        with tf.compat.v1.Session() as s:
            tf.compat.v1.train.Saver().restore(s, os.path.join(ckpt_dir, "rank%d" % rank, "model-%d" % steps))
            s.run(bcast)
            saved = np.load(os.path.join(ckpt_dir, "rank%d.npz" % rank))
            for i, r in enumerate(s.run(residuals)):
                np.testing.assert_array_equal(r, saved["arr_%d" % i])
            assert s.run(tf.compat.v1.train.get_global_step()) == steps
            got, _ = s.run([grads, train], dict(zip(phs, data(rank, steps, TOPK_SHAPES, seed=1))))
            want_grads, want_res = sim[steps]
            for g, w in zip(got, want_grads):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            for r, w in zip(s.run(residuals), [want_res[rank][i] for i in TOPK_SENT]):
                np.testing.assert_allclose(r, w, rtol=1e-6, atol=1e-7)
    print("RANK %d RESTORE OK" % rank, flush=True)
    with tf.Graph().as_default():
        try:
            build(SHAPES[:1], node_size=2)
        except ValueError as e:
            assert "tensorflow_ext.horovod.init(node_size=2)" in str(e), e
            print("RANK %d ERROR unregistered: %s" % (rank, e), flush=True)
        else:
            raise AssertionError("2D without registered process sets accepted")


def main():
    mode, ckpt_dir = sys.argv[1], sys.argv[2]
    if mode == "main":
        tfe_hvd.init(node_size=2)
    else:
        tfe_hvd.init()
    rank, size = tfe_hvd.rank(), tfe_hvd.size()
    assert size == 4, size
    if mode == "main":
        check_2d_and_compression(rank, size)
        check_topk(rank, size, ckpt_dir)
        check_errors(rank)
    else:
        restore(rank, size, ckpt_dir)
    print("RANK %d DONE" % rank, flush=True)


if __name__ == "__main__":
    main()
