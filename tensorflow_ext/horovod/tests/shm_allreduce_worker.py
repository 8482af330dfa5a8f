"""One rank of the shared-memory 2D allreduce tests (run by horovodrun; see test_shm_allreduce.py).

The gradient of loss = sum(var * data) is `data`, so `DistributedOptimizer.compute_gradients` returns the reduced
`data` of all ranks; every rank regenerates all ranks' data from seeds and checks against numpy and against the
same reduction with the node's stages over Gloo (intra_node="gloo").

Usage:
  shm_allreduce_worker.py main     4 ranks as 2 nodes x 2: shm vs gloo (same bits) vs numpy for float32, fp16 and
                                   bf16, odd sizes, one and several buffers per step (one inter-op thread), several
                                   steps; a stale segment left by a crashed job is replaced; no segment is left
  shm_allreduce_worker.py stuck DIR  ranks 1 and 3 stop after the first step (blocked on FIFOs DIR/fifo1,
                                   DIR/fifo3); ranks 0 and 2 fail the second step with an error naming them
                                   (TF_EXT_HVD_SHM_TIMEOUT_S=3), then release them
"""

import os
import struct
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import horovod.tensorflow as hvd  # noqa: E402

import tensorflow_ext.horovod as tfe_hvd  # noqa: E402

# Odd sizes: 7 + 1200 + 5 + 561 + 1 + 12 entries (1786), buffers of odd lengths with fusion_bytes=0.
SHAPES = [(7,), (40, 30), (5,), (33, 17), (1,), (3, 2, 2)]
SHM_OPS = ("TfExtHvdShmReduceScatter", "TfExtHvdShmAllgather")
# One inter-op thread: a rank whose only thread waited for buffer A while its peer waited for buffer B would
# deadlock; the kernels wait off the pool.
ONE_THREAD = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)


def data(rank, step, shapes):
    rng = np.random.RandomState(100 * step + rank)
    # Mixed magnitudes so that 16-bit rounding and the order of the sum matter.
    return [(rng.normal(size=s) * 10.0 ** rng.randint(-3, 3, size=s)).astype(np.float32) for s in shapes]


def build(shapes, name, **opt_kwargs):
    vs = [
        tf.compat.v1.get_variable("v%d" % i, initializer=tf.zeros(s, tf.float32), use_resource=True)
        for i, s in enumerate(shapes)
    ]
    phs = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
    loss = tf.add_n([tf.reduce_sum(v * p) for v, p in zip(vs, phs)])
    opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), name=name, **opt_kwargs)
    grads = [g for g, _ in opt.compute_gradients(loss, var_list=vs)]
    return phs, grads


def segments(graph):
    """The shm_open names of the graph's shared-memory stages."""
    return sorted({op.get_attr("segment").decode() for op in graph.get_operations() if op.type in SHM_OPS})


def reduce_steps(steps, rank, name, before_run=None, **opt_kwargs):
    """The reduced gradients of `steps` steps (one session), and the graph's segments."""
    with tf.Graph().as_default() as g:
        phs, grads = build(SHAPES, name, **opt_kwargs)
        segs = segments(g)
        if before_run is not None:
            before_run(segs)
        with tf.compat.v1.Session(config=ONE_THREAD) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            out = [s.run(grads, dict(zip(phs, data(rank, step, SHAPES)))) for step in range(steps)]
    return out, segs


def check_close(got, size, step, rel, what):
    """|got - mean over ranks| <= rel * mean over ranks of |x| (the rounding of the summands' magnitude, which a
    relative tolerance on a sum that cancels would not bound), against numpy in float64."""
    per_rank = [data(r, step, SHAPES) for r in range(size)]
    for i, g in enumerate(got):
        xs = np.stack([d[i] for d in per_rank]).astype(np.float64)
        err = np.abs(g - xs.mean(axis=0))
        bound = rel * np.abs(xs).mean(axis=0) + 1e-30
        assert np.all(err <= bound), (what, i, float(np.max(err / bound)))


def check_main(rank, size):
    steps = 3
    cases = [
        ("float32", dict(), 1e-6),
        ("fp16", dict(compression=tfe_hvd.Compression.fp16), 4e-3),
        ("bf16", dict(compression=tfe_hvd.Compression.bf16), 3e-2),
    ]
    for label, comp, rel in cases:
        for fusion in (64 << 20, 0, 4000):  # one buffer; one per gradient; a few small ones
            tag = "%s fusion_bytes=%d" % (label, fusion)
            kwargs = dict(node_size=2, fusion_bytes=fusion, **comp)
            shm, shm_segs = reduce_steps(steps, rank, "opt_shm", intra_node="shm", **kwargs)
            gloo, gloo_segs = reduce_steps(steps, rank, "opt_gloo", intra_node="gloo", **kwargs)
            auto, auto_segs = reduce_steps(steps, rank, "opt_auto", **kwargs)
            assert gloo_segs == [], (tag, gloo_segs)
            assert len(shm_segs) >= (1 if fusion else len(SHAPES)), (tag, shm_segs)
            # The four local ranks share the host: "auto" takes shared memory.
            assert len(auto_segs) == len(shm_segs), (tag, auto_segs, shm_segs)
            for step in range(steps):
                for i, (a, b, c) in enumerate(zip(shm[step], gloo[step], auto[step])):
                    # Two ranks per node: the node's sum is one addition, the same bits as Gloo's.
                    np.testing.assert_array_equal(a, b, err_msg="%s step %d grad %d shm vs gloo" % (tag, step, i))
                    np.testing.assert_array_equal(a, c, err_msg="%s step %d grad %d shm vs auto" % (tag, step, i))
                check_close(shm[step], size, step, rel, "%s step %d vs numpy" % (tag, step))
            for seg in shm_segs:
                assert not os.path.exists("/dev/shm" + seg), ("segment left behind", seg)
    print("RANK %d SHM MATCHES GLOO OK" % rank, flush=True)

    # A stale segment (a crashed job's, its creator dead) under the name this job will use: replaced.
    dead = subprocess.Popen(["true"])
    dead.wait()

    def plant(seg):
        """A segment as a crashed job leaves it: initialised (the header's magic), its creator gone."""
        entries = sum(int(np.prod(s)) for s in SHAPES)
        slot_bytes = 4 * (entries + entries % 2)  # one float32 buffer, padded to the node's 2 ranks
        with open("/dev/shm" + seg, "wb") as f:
            f.write(struct.pack("<QiiqI", 0x74666578324453, dead.pid, 2, slot_bytes, 2))
            f.truncate(4096 + 3 * slot_bytes)  # header page, 2 slots, the result

    with tf.Graph().as_default() as g:
        phs, grads = build(SHAPES, "opt_stale", node_size=2, intra_node="shm")
        segs = segments(g)
        assert len(segs) == 1, segs
        barrier = hvd.allreduce(tf.constant(1.0), name="planted_barrier")
        with tf.compat.v1.Session(config=ONE_THREAD) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            if rank % 2 == 1:
                plant(segs[0])
            s.run(barrier)  # the stale file exists before local rank 0 creates the segment
            got = s.run(grads, dict(zip(phs, data(rank, 0, SHAPES))))
    check_close(got, size, 0, 1e-6, "after a stale segment")
    assert not os.path.exists("/dev/shm" + segs[0]), segs
    print("RANK %d STALE SEGMENT REPLACED OK" % rank, flush=True)


def check_stuck(rank, size, fifo_dir):
    """Local rank 1 of each node stops before the second step's barrier (blocked reading a FIFO that its node's
    local rank 0 writes once it got the error). It stays alive: when a rank exits, Horovod's background loop on the
    others aborts them (a Gloo read error) before any barrier times out, which ends the job as well."""
    os.environ["TF_EXT_HVD_SHM_TIMEOUT_S"] = "3"
    fifo = os.path.join(fifo_dir, "fifo%d" % (rank | 1))
    with tf.Graph().as_default():
        phs, grads = build(SHAPES, "opt_stuck", node_size=2, intra_node="shm", fusion_bytes=0)
        barrier = hvd.allreduce(tf.constant(1.0), name="stuck_barrier")
        with tf.compat.v1.Session(config=ONE_THREAD) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(grads, dict(zip(phs, data(rank, 0, SHAPES))))
            print("RANK %d FIRST STEP OK" % rank, flush=True)
            if rank % 2 == 1:
                with open(fifo) as f:  # blocks until local rank 0 opens it for writing
                    f.read()
            else:
                t0 = time.time()
                try:
                    s.run(grads, dict(zip(phs, data(rank, 1, SHAPES))))
                except tf.errors.DeadlineExceededError as e:
                    msg = [line for line in e.message.splitlines() if "over shared memory" in line][0]
                    # Its node's barriers so far: the first step's reduce-scatter and allgather.
                    missing = "local rank 1 (rank %d, last at barrier 2) did not reach barrier 3" % (rank + 1)
                    assert missing in msg and "TF_EXT_HVD_SHM_TIMEOUT_S" in msg, msg
                    print("RANK %d TIMEOUT OK after %.1f s: %s" % (rank, time.time() - t0, msg), flush=True)
                else:
                    raise AssertionError("the second step passed without local rank 1")
                with open(fifo, "w") as f:
                    f.write("go")
            s.run(barrier)  # every rank is done before any exits (an exit aborts the others' Horovod)


def main():
    mode = sys.argv[1]
    tfe_hvd.init(node_size=2)
    rank, size = tfe_hvd.rank(), tfe_hvd.size()
    assert size == 4, size
    if mode == "main":
        check_main(rank, size)
    else:
        check_stuck(rank, size, sys.argv[2])
    print("RANK %d DONE" % rank, flush=True)


if __name__ == "__main__":
    main()
