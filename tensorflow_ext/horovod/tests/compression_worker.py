"""One rank of the 2-rank checks of the compression kernels and of the settings check (run by horovodrun; see
test_allreduce.py).

Usage:
  compression_worker.py reference   the fused reduction (DenseReducer: pack, Horovod, sum of the 16-bit slices,
                                    unpack; Top-K select, gather, scatter-add) against the pure TensorFlow + Horovod
                                    chain of the same math, bit for bit: none/fp16/bf16, Average with a predivide
                                    factor and Sum, several buckets, Top-K residuals over 3 steps
  compression_worker.py settings    per case, rank 1 alone gets TF_EXT_HVD_* overrides: the first step fails on
                                    both ranks naming the setting and both values, before any gradient is exchanged
                                    (the variables are unchanged); equal overrides on both ranks train alike
  compression_worker.py init        (4 ranks) rank 0 alone registers the 2D process sets at init: refused
"""

import hashlib
import json
import math
import os
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import horovod.tensorflow as hvd  # noqa: E402

import tensorflow_ext.horovod as tfe_hvd  # noqa: E402
from tensorflow_ext.horovod import allreduce as ar  # noqa: E402

SHAPES = [(7,), (40, 30), (5,), (33, 17), (1,), (3, 2, 2), (70000,)]


def data(rank, step, shapes):
    rng = np.random.RandomState(100 * step + rank)
    return [(rng.normal(size=s) * 10.0 ** rng.randint(-3, 3)).astype(np.float32) for s in shapes]


# -- the pure TensorFlow + Horovod chain of the reduction before the fused kernels ------------------------------


def _wire(x, comp):
    if comp == "fp16":
        return tf.cast(x, tf.float16)
    if comp == "bf16":
        return tf.bitcast(tf.cast(x, tf.bfloat16), tf.uint16)
    return x


def _unwire(x, comp):
    if comp == "bf16":
        return tf.cast(tf.bitcast(x, tf.bfloat16), tf.float32)
    return tf.cast(x, tf.float32)


def reference_dense(grads, comp, pre, post, name):
    size = hvd.size()
    flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
    if pre != 1.0:
        flat = flat * tf.cast(pre, tf.float32)
    if comp == "bf16":  # reduced as bytes: alltoall, the float32 sum, allgather
        n = tf.size(flat)
        padded = tf.pad(flat, [[0, tf.math.floormod(-n, size)]])
        got = hvd.alltoall(_wire(padded, comp), name=name + "_a2a")
        got = got[0] if isinstance(got, (tuple, list)) else got
        part = tf.reduce_sum(tf.reshape(_unwire(got, comp), [size, -1]), axis=0)
        summed = _unwire(hvd.allgather(_wire(part, comp), name=name + "_ag"), comp)[:n]
    else:
        summed = _unwire(hvd.allreduce(_wire(flat, comp), op=hvd.Sum, name=name + "_ar"), comp)
    if post != 1.0:
        summed = summed * tf.cast(post, tf.float32)
    parts = tf.split(summed, [int(np.prod(g.shape)) for g in grads])
    return [tf.reshape(p, g.shape) for p, g in zip(parts, grads)]


def reference_topk(grads, residuals, ratio, comp, factor, name):
    idx_parts, val_parts, new_res, offset = [], [], [], 0
    for g, r in zip(grads, residuals):
        n = int(np.prod(g.shape))
        k = max(1, int(math.ceil(ratio * n)))
        acc = tf.reshape(g + r, [-1])
        idx = tf.math.top_k(tf.abs(acc), k=k).indices
        vals = tf.gather(acc, idx)
        sent = _unwire(_wire(vals, comp), comp)
        new_res.append(tf.reshape(tf.tensor_scatter_nd_sub(acc, tf.expand_dims(idx, 1), sent), g.shape))
        idx_parts.append(idx + offset)
        val_parts.append(_wire(vals, comp))
        offset += n
    all_idx = hvd.allgather(tf.concat(idx_parts, 0), name=name + "_idx")
    all_vals = _unwire(hvd.allgather(tf.concat(val_parts, 0), name=name + "_val"), comp)
    total = tf.math.unsorted_segment_sum(all_vals, all_idx, offset)
    if factor != 1.0:
        total = total * tf.cast(factor, tf.float32)
    parts = tf.split(total, [int(np.prod(g.shape)) for g in grads])
    return [tf.reshape(p, g.shape) for p, g in zip(parts, grads)], new_res


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check_reference(rank, size):
    checked = 0
    for comp in ("none", "fp16", "bf16"):
        for op, predivide, fusion in ((hvd.Average, 1.0, ar.DEFAULT_FUSION_BYTES), (hvd.Average, 4.0, 30000),
                                      (hvd.Sum, 1.0, 0)):  # fmt: skip
            with tf.Graph().as_default():
                phs = [tf.compat.v1.placeholder(tf.float32, s) for s in SHAPES]
                vs = [tf.Variable(tf.zeros(s), name="v%d" % i) for i, s in enumerate(SHAPES)]
                cfg = ar.resolve_config(compression=comp, fusion_bytes=fusion)
                fused = ar.DenseReducer(cfg, op, predivide, hvd.global_process_set, "fused").reduce(list(zip(phs, vs)))
                if op == hvd.Average:
                    pre, post = 1.0 / predivide, predivide / size
                else:
                    pre, post = 1.0, 1.0
                ref = reference_dense(phs, comp, pre, post, "ref")
                with tf.compat.v1.Session() as s:
                    s.run(tf.compat.v1.global_variables_initializer())
                    got, want = s.run([fused, ref], dict(zip(phs, data(rank, 0, SHAPES))))
                for g, w in zip(got, want):
                    assert same_bits(g, w), (comp, op, predivide, fusion, np.max(np.abs(g - w)))
                    checked += 1
        # Top-K with residuals: 3 steps, the reference fed the fused path's residuals before each step.
        for op in (hvd.Average, hvd.Sum):
            with tf.Graph().as_default():
                phs = [tf.compat.v1.placeholder(tf.float32, s) for s in SHAPES]
                res_phs = [tf.compat.v1.placeholder(tf.float32, s) for s in SHAPES]
                vs = [tf.Variable(tf.zeros(s), name="v%d" % i) for i, s in enumerate(SHAPES)]
                cfg = ar.resolve_config(compression=comp, topk_ratio=0.03, topk_min_elements=1, fusion_bytes=30000)
                fused = ar.DenseReducer(cfg, op, 1.0, hvd.global_process_set, "fused").reduce(list(zip(phs, vs)))
                residuals = tf.compat.v1.get_collection(ar.TOPK_RESIDUALS)
                factor = 1.0 / size if op == hvd.Average else 1.0
                ref, ref_res = reference_topk(phs, res_phs, 0.03, comp, factor, "ref")
                with tf.compat.v1.Session() as s:
                    s.run(tf.compat.v1.global_variables_initializer())
                    for step in range(3):
                        old = s.run(residuals)
                        feed = dict(zip(phs, data(rank, step, SHAPES)))
                        want, want_res = s.run([ref, ref_res], {**feed, **dict(zip(res_phs, old))})
                        got = s.run(fused, feed)
                        for g, w in zip(got, want):
                            assert same_bits(g, w), (comp, op, step, np.max(np.abs(g - w)))
                        for g, w in zip(s.run(residuals), want_res):
                            assert same_bits(g, w), (comp, op, step, "residual")
                        checked += 2 * len(SHAPES)
    print("RANK %d REFERENCE OK %d" % (rank, checked), flush=True)


# -- the settings check ---------------------------------------------------------------------------------------

CASES = [
    # (name, rank 0's overrides, rank 1's overrides)
    ("compression", {}, {"TF_EXT_HVD_COMPRESSION": "fp16"}),
    ("compression kinds", {"TF_EXT_HVD_COMPRESSION": "bf16"}, {"TF_EXT_HVD_COMPRESSION": "fp16"}),
    ("topk_ratio", {"TF_EXT_HVD_TOPK_RATIO": "0.01"}, {"TF_EXT_HVD_TOPK_RATIO": "0.02"}),
    ("hierarchical", {}, {"TF_EXT_HVD_HIERARCHICAL": "1"}),
    ("node_size", {"TF_EXT_HVD_HIERARCHICAL": "1"}, {"TF_EXT_HVD_NODE_SIZE": "1"}),
    ("fusion_bytes", {"TF_EXT_HVD_COMPRESSION": "fp16"}, {"TF_EXT_HVD_COMPRESSION": "fp16",
                                                          "TF_EXT_HVD_FUSION_BYTES": "1024"}),  # fmt: skip
    ("gradients only", {}, {"TF_EXT_HVD_TOPK_RATIO": "0.5"}),
    ("same", {"TF_EXT_HVD_COMPRESSION": "bf16", "TF_EXT_HVD_TOPK_RATIO": "0.5"},
     {"TF_EXT_HVD_COMPRESSION": "bf16", "TF_EXT_HVD_TOPK_RATIO": "0.5"}),  # fmt: skip
]


def check_settings(rank, size):
    shapes = [(40, 30), (5,)]
    for name, env0, env1 in CASES:
        env = env1 if rank == 1 else env0
        for var in [k for k in os.environ if k.startswith(ar.ENV_PREFIX)]:
            del os.environ[var]
        os.environ.update(env)
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            vs = [tf.compat.v1.get_variable("v%d" % i, initializer=tf.ones(s), use_resource=True) for i, s in
                  enumerate(shapes)]  # fmt: skip
            phs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
            loss = tf.add_n([tf.reduce_sum(v * p) for v, p in zip(vs, phs)])
            opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), topk_min_elements=1)
            gvs = opt.compute_gradients(loss, var_list=vs)
            run = [g for g, _ in gvs] if name == "gradients only" else opt.apply_gradients(gvs, global_step=gs)
            inputs = data(rank, 0, shapes)
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                try:
                    s.run(run, dict(zip(phs, inputs)))
                except tf.errors.InvalidArgumentError as e:
                    message = [line for line in e.message.splitlines() if "ranks built different models" in line]
                    print(
                        "RANK %d CASE %s REFUSED: %s" % (rank, name, message[0] if message else e.message), flush=True
                    )
                    # No gradient reached a variable (the step stopped before the exchange).
                    for v, value in zip(vs, s.run(vs)):
                        assert np.all(value == 1.0), (name, v.op.name)
                    continue
                values = s.run(vs)
        if name != "gradients only":
            # Every rank applied the same update (the test compares the digests), and it moved the variables.
            assert all(np.any(v != 1.0) and np.all(np.isfinite(v)) for v in values), name
        digest = hashlib.sha256(b"".join(v.tobytes() for v in values)).hexdigest()[:16]
        print("RANK %d CASE %s TRAINED %s" % (rank, name, digest), flush=True)


def main():
    mode = sys.argv[1]
    if mode == "init":
        # 4 ranks: rank 0 alone asks for 2D process sets of 2 ranks per node. Horovod refuses the mismatch on one
        # rank (which says what this rank registered); the others stop at their first collective.
        if os.environ.get("HOROVOD_RANK") == "0":
            os.environ["TF_EXT_HVD_NODE_SIZE"] = "2"
        tfe_hvd.init()
        tfe_hvd.barrier()
        print("RANK %d STARTED" % tfe_hvd.rank(), flush=True)
        return
    tfe_hvd.init()
    rank, size = tfe_hvd.rank(), tfe_hvd.size()
    assert size == 2, size
    if mode == "reference":
        check_reference(rank, size)
    else:
        check_settings(rank, size)
    print("RANK %d DONE %s" % (rank, json.dumps(mode)), flush=True)


if __name__ == "__main__":
    main()
