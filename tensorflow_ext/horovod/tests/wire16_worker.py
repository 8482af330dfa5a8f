"""One rank of the checks of the 16-bit reductions (tensorflow_ext/horovod/wire16.py; run by horovodrun from
test_wire16.py on 2 and 4 ranks).

Usage:
  wire16_worker.py check    DenseReducer with fp16 (both ways: ring and bytes) and bf16 against numpy, on buffers
                            of odd sizes (1, 3, 1001, 70001 entries, one bucket each and all fused), Average and Sum:
                            the bytes way bit for bit (the slices summed in float32 in rank order and rounded once),
                            Horovod's fp16 ring within its pairwise fp16 rounding; Inf and NaN stay non-finite; a
                            total above 65504 is inf; partial sums beyond fp16's range cancel in the bytes way
  wire16_worker.py settings (2 ranks) rank 1 alone sets TF_EXT_HVD_FP16_REDUCTION=bytes, rank 0 ring: the first
                            step with fp16 fails on both ranks naming the setting and both values, the variables
                            unchanged; the same value on both ranks trains
"""

import os
import sys

import ml_dtypes
import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import horovod.tensorflow as hvd  # noqa: E402

import tensorflow_ext.horovod as tfe_hvd  # noqa: E402
from tensorflow_ext.horovod import allreduce as ar  # noqa: E402
from tensorflow_ext.horovod import wire16  # noqa: E402

SHAPES = [(1,), (3,), (7, 143), (70001,)]
WIRE = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


def data(rank, shapes, seed):
    rng = np.random.RandomState(1000 * seed + rank)
    return [(rng.normal(size=s) * 10.0 ** rng.randint(-2, 3)).astype(np.float32) for s in shapes]


def numpy_bytes_sum(inputs, comp, pre, post):
    """What the bytes way computes: per entry wire(0 + float(wire(x_0 * pre)) + float(wire(x_1 * pre)) + ...), summed
    in float32 in rank order, then float(.) * post (each multiply skipped when its factor is 1)."""
    wire = WIRE[comp]
    total = np.zeros_like(inputs[0])
    for x in inputs:
        scaled = x if pre == 1.0 else x * np.float32(pre)
        total = total + scaled.astype(wire).astype(np.float32)
    out = total.astype(wire).astype(np.float32)
    return out if post == 1.0 else out * np.float32(post)


def reduce_once(shapes, feeds, comp, way, op, fusion_bytes):
    """The DenseReducer result of this rank's `feeds` (the fp16 way set when the graph is built)."""
    os.environ[wire16.FP16_REDUCTION_ENV] = way
    try:
        with tf.Graph().as_default():
            phs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
            vs = [tf.Variable(tf.zeros(s), name="v%d" % i) for i, s in enumerate(shapes)]
            cfg = ar.resolve_config(compression=comp, fusion_bytes=fusion_bytes)
            out = ar.DenseReducer(cfg, op, 1.0, hvd.global_process_set, "w16").reduce(list(zip(phs, vs)))
            with tf.compat.v1.Session() as s:
                return s.run(out, dict(zip(phs, feeds)))
    finally:
        del os.environ[wire16.FP16_REDUCTION_ENV]


def check(rank, size):
    cases = [("fp16", "bytes"), ("fp16", "ring"), ("bf16", "bytes"), ("bf16", "ring")]  # bf16 ignores the way
    for comp, way in cases:
        for op in (hvd.Average, hvd.Sum):
            post = 1.0 / size if op == hvd.Average else 1.0
            for fusion in (ar.DEFAULT_FUSION_BYTES, 0):
                everyone = [data(r, SHAPES, 1) for r in range(size)]
                got = reduce_once(SHAPES, everyone[rank], comp, way, op, fusion)
                for i, g in enumerate(got):
                    want = numpy_bytes_sum([e[i] for e in everyone], comp, 1.0, post)
                    where = (comp, way, op, fusion, SHAPES[i])
                    assert g.shape == want.shape and g.dtype == np.float32, where
                    if comp == "bf16" or way == "bytes" or size == 2:
                        # With 2 ranks Horovod's ring rounds the one fp16 sum a + b once too: the same bits.
                        assert np.array_equal(g.view(np.uint32), want.view(np.uint32)), (
                            where,
                            np.max(np.abs(g - want)),
                        )
                    else:
                        # The ring rounds each of its size - 1 partial sums to fp16, the reference its total once:
                        # each rounding is within 2^-11 (half an fp16 step) of sum |x|, plus subnormal steps.
                        bound = size * 2.0**-11 * post * sum(np.abs(e[i]) for e in everyone) + 1e-7
                        assert np.all(np.abs(g - want) <= bound), (where, np.max(np.abs(g - want) - bound))
                    # It went through 16 bits (a float32 sum would differ somewhere on the big buffer).
                    if SHAPES[i] == (70001,):
                        exact = sum(e[i] for e in everyone) * np.float32(post)
                        assert np.any(g != exact), where
    print("RANK %d VS NUMPY OK" % rank, flush=True)

    shapes = [(5,), (4, 3)]
    for comp, way in cases:
        special = [np.ones(s, np.float32) for s in shapes]
        if rank == size - 1:
            special[0][0], special[0][1], special[1][2, 1] = np.inf, -np.inf, np.nan
        got = reduce_once(shapes, special, comp, way, hvd.Sum, ar.DEFAULT_FUSION_BYTES)
        assert got[0][0] == np.inf and got[0][1] == -np.inf and np.isnan(got[1][2, 1]), (comp, way, got)
        assert np.all(got[0][2:] == size) and np.sum(np.isfinite(got[1])) == 11, (comp, way, got)
        # A total above fp16's largest finite value (65504) is inf in fp16 (never clipped); bf16 keeps it.
        big = [np.full(s, 40000.0, np.float32) for s in shapes]
        got = reduce_once(shapes, big, comp, way, hvd.Sum, ar.DEFAULT_FUSION_BYTES)
        want = numpy_bytes_sum([b[0] for b in [big] * size], comp, 1.0, 1.0)
        if comp == "fp16":
            assert np.all(got[0] == np.inf), (comp, way, got[0])
        else:
            assert np.array_equal(got[0], want) and np.all(np.isfinite(got[0])), (comp, way, got[0])
    # A sum whose fp16 encoding equals the old value's bits read as an integer (78.0 is 0x54E0, and 0x004E = 78 is
    # the subnormal 4.65e-6): Gloo's scalar float16 assignment used to drop it (fixed by gloo_f16c.patch). Three
    # entries: Gloo's F16C loop leaves up to 7 to the scalar path.
    tiny = float(np.array([0x004E], np.uint16).view(np.float16)[0])
    pair = [np.array([tiny, 78.0, 1.0], np.float32), np.array([78.0, tiny, 1.0], np.float32)]
    if size == 2:
        for way in ("ring", "bytes"):
            got = reduce_once([(3,)], [pair[rank]], "fp16", way, hvd.Sum, ar.DEFAULT_FUSION_BYTES)
            assert np.array_equal(got[0], np.array([78.0, 78.0, 2.0], np.float32)), (way, got[0])
    # Partial sums beyond fp16's range: 60000 on the first half of the ranks, -60000 on the second half. Summed in
    # float32 and rounded once, the total is exactly 0; Horovod's ring sums pairwise in fp16 (inf partial sums).
    sign = 1.0 if rank < size // 2 else -1.0
    cancel = [np.full(s, sign * 60000.0, np.float32) for s in shapes]
    got = reduce_once(shapes, cancel, "fp16", "bytes", hvd.Sum, ar.DEFAULT_FUSION_BYTES)
    assert all(np.all(g == 0.0) for g in got), got
    print("RANK %d SPECIAL OK" % rank, flush=True)


def check_settings(rank):
    """Ranks that would sum fp16 in different ways (different collectives) are refused before the exchange."""
    shapes = [(40, 30), (5,)]
    for name, ways in (("mismatch", ("ring", "bytes")), ("same", ("bytes", "bytes"))):
        os.environ[wire16.FP16_REDUCTION_ENV] = ways[rank]
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            vs = [tf.compat.v1.get_variable("v%d" % i, initializer=tf.ones(s), use_resource=True) for i, s in
                  enumerate(shapes)]  # fmt: skip
            phs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
            loss = tf.add_n([tf.reduce_sum(v * p) for v, p in zip(vs, phs)])
            opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), compression="fp16")
            train = opt.minimize(loss, global_step=gs, var_list=vs)
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                try:
                    s.run(train, dict(zip(phs, data(rank, shapes, 2))))
                except tf.errors.InvalidArgumentError as e:
                    line = [x for x in e.message.splitlines() if "fp16 reduction" in x]
                    print("RANK %d CASE %s REFUSED: %s" % (rank, name, line[0] if line else e.message), flush=True)
                    assert all(np.all(v == 1.0) for v in s.run(vs)), name  # stopped before the exchange
                    continue
                values = s.run(vs)
                assert all(np.any(v != 1.0) and np.all(np.isfinite(v)) for v in values), name
                print("RANK %d CASE %s TRAINED" % (rank, name), flush=True)
        del os.environ[wire16.FP16_REDUCTION_ENV]


def main():
    tfe_hvd.init()
    rank, size = tfe_hvd.rank(), tfe_hvd.size()
    assert sys.argv[1] in ("check", "settings"), sys.argv
    if sys.argv[1] == "settings":
        check_settings(rank)
        print("RANK %d DONE" % rank, flush=True)
        return
    check(rank, size)
    print("RANK %d DONE" % rank, flush=True)


if __name__ == "__main__":
    main()
