"""One rank of the 2-rank checks of Top-K's Deep Gradient Compression settings (run by horovodrun; see test_topk.py).

The model is loss = sum_i sum(w_i * c_i) with c_i fed per rank and step, so the gradient of w_i is exactly c_i and
plain SGD moves w_i by -lr times the reduced gradient: every step's weights are compared with a numpy simulation of
both ranks (momentum correction with factor masking, local clipping, dense warm-up, ratio warm-up, flushes).

Usage:
  topk_worker.py reference DIR   per case, 8 steps against numpy; with every setting off the weights and residuals
                                 equal plain error feedback's bit for bit and no velocity exists; residuals and
                                 velocities saved after 4 steps and restored in a fresh graph continue as if
                                 uninterrupted
  topk_worker.py skip            DistributedOptimizer(MixedPrecisionOptimizer(SGD)): rank 1's gradient has an Inf
                                 at step 2; both ranks skip that step and keep weights, residuals and velocities;
                                 the run equals numpy without that step. Without the guard (patched out) the
                                 residual of the skipped step changes: the check can fail
"""

import math
import os
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import horovod.tensorflow as hvd  # noqa: E402

import tensorflow_ext.horovod as tfe_hvd  # noqa: E402
from tensorflow_ext import mixed_precision  # noqa: E402
from tensorflow_ext.horovod import topk  # noqa: E402

SHAPES = [(40, 30), (5,), (700,), (3000,)]
MIN_ELEMENTS = 100  # (5,) is reduced densely
FUSION_BYTES = 8000  # (40, 30) + (5,) in one buffer, (700,) and (3000,) in others
LR = 0.1
SIZE = 2

BASE = dict(topk_ratio=0.05, topk_min_elements=MIN_ELEMENTS, fusion_bytes=FUSION_BYTES)
CASES = {
    "off": dict(BASE),
    "off_explicit": dict(BASE, topk_momentum=0.0, topk_clip_norm=None, topk_ratio_warmup_steps=0, topk_flush_steps=0),
    "momentum": dict(BASE, topk_momentum=0.9),
    "clip": dict(BASE, topk_clip_norm=3.0),
    "ratio_warmup": dict(BASE, topk_ratio_warmup_steps=4),
    "all": dict(BASE, topk_momentum=0.8, topk_clip_norm=3.0, topk_warmup_steps=1, topk_ratio_warmup_steps=4,
                topk_flush_steps=3),  # fmt: skip
}


def data(rank, step):
    rng = np.random.RandomState(1000 * step + rank)
    return [(rng.normal(size=s) * rng.uniform(0.5, 2.0)).astype(np.float32) for s in SHAPES]


def initial():
    rng = np.random.RandomState(7)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


# -- numpy: both ranks ----------------------------------------------------------------------------------------


def ratios(ratio, warmup):
    out, r = [], 0.25
    while warmup and r > ratio * (1 + 1e-9):
        out.append(r)
        r /= 4.0
    return out + [ratio]


def simulate(cfg, steps_data, w=None):
    """(weights after each step, final per-rank residuals, final per-rank velocities) for the data of the applied
    steps, steps_data[t][rank]."""
    m = np.float32(cfg.get("topk_momentum", 0.0))
    clip = cfg.get("topk_clip_norm")
    warm, rw, flush = (
        cfg.get("topk_warmup_steps", 0),
        cfg.get("topk_ratio_warmup_steps", 0),
        cfg.get("topk_flush_steps", 0),
    )
    sched = ratios(cfg["topk_ratio"], rw)
    big = [i for i, s in enumerate(SHAPES) if int(np.prod(s)) >= MIN_ELEMENTS]
    w = [x.copy() for x in (w or initial())]
    v = [[np.zeros(SHAPES[i], np.float32) for i in big] for _ in range(SIZE)]
    u = [[np.zeros(SHAPES[i], np.float32) for i in big] for _ in range(SIZE)]
    out = []
    for t, per_rank in enumerate(steps_data):
        dense = t < warm or (flush > 0 and t % flush == flush - 1)
        stage = min(max(t - warm, 0) * (len(sched) - 1) // rw, len(sched) - 1) if rw else len(sched) - 1
        ratio = sched[stage]
        sums = [np.zeros(s, np.float32) for s in SHAPES]
        for r in range(SIZE):
            g = [per_rank[r][i] for i in big]
            if clip is not None:
                norm = math.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in g))
                limit = clip / math.sqrt(SIZE)
                if norm > limit:
                    g = [x * np.float32(limit / norm) for x in g]
            for j, i in enumerate(big):
                acc = m * u[r][j] + g[j] if m else g[j]
                s = (acc + v[r][j]).reshape(-1)
                if dense:
                    sent = s
                    v[r][j] = np.zeros_like(v[r][j])
                    u[r][j] = acc
                else:
                    k = max(1, int(math.ceil(ratio * s.size)))
                    idx = np.argsort(-np.abs(s), kind="stable")[:k]
                    sent = np.zeros_like(s)
                    sent[idx] = s[idx]
                    rest = s.copy()
                    rest[idx] = 0
                    v[r][j] = rest.reshape(SHAPES[i])
                    uf = acc.reshape(-1).copy()
                    uf[idx] = 0
                    u[r][j] = uf.reshape(SHAPES[i])
                sums[i] += sent.reshape(SHAPES[i])
            for i in range(len(SHAPES)):
                if i not in big:
                    sums[i] += per_rank[r][i]
        w = [x - np.float32(LR) * (s * np.float32(1.0 / SIZE)) for x, s in zip(w, sums)]
        out.append([x.copy() for x in w])
    return out, v, u


# -- TensorFlow -------------------------------------------------------------------------------------------------


def build(cfg, mixed=False):
    gs = tf.compat.v1.train.get_or_create_global_step()
    ws = [tf.compat.v1.get_variable("w%d" % i, initializer=x) for i, x in enumerate(initial())]
    cs = [tf.compat.v1.placeholder(tf.float32, s) for s in SHAPES]
    loss = tf.add_n([tf.reduce_sum(w * c) for w, c in zip(ws, cs)])
    opt = tf.compat.v1.train.GradientDescentOptimizer(LR)
    if mixed:
        opt = mixed_precision.MixedPrecision(mode="half").wrap_optimizer(opt)
    opt = tfe_hvd.DistributedOptimizer(opt, **cfg)
    train = opt.minimize(loss, global_step=gs)
    state = tf.compat.v1.get_collection(tfe_hvd.allreduce.TOPK_RESIDUALS)
    return ws, cs, train, state


def names(state):
    return sorted(v.op.name for v in state)


def by_name(state, values):
    return dict(zip([v.op.name for v in state], values))


def check(rank, what, got, want, exact=False):
    for g, w in zip(got, want):
        ok = np.array_equal(g, w) if exact else np.allclose(g, w, rtol=2e-5, atol=2e-6)
        if not ok:
            raise AssertionError("%s: rank %d max diff %g" % (what, rank, float(np.max(np.abs(g - w)))))


def reference(out_dir):
    rank = hvd.rank()
    steps = 8
    plain = None
    for case, cfg in CASES.items():
        want, want_v, want_u = simulate(cfg, [[data(r, t) for r in range(SIZE)] for t in range(steps)])
        with tf.Graph().as_default():
            ws, cs, train, state = build(cfg)
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                got = []
                for t in range(steps):
                    s.run(train, dict(zip(cs, data(rank, t))))
                    got.append(s.run(ws))
                    check(rank, "%s step %d" % (case, t), got[-1], want[t])
                residual_values = by_name(state, s.run(state))
        res = [residual_values[n] for n in sorted(residual_values) if n.endswith("_topk_residual")]
        vel = [residual_values[n] for n in sorted(residual_values) if n.endswith("_topk_velocity")]
        # Sorted by variable name: w0, w2, w3 (the Top-K ones) in both.
        check(rank, case + " residuals", res, want_v[rank])
        if cfg.get("topk_momentum"):
            check(rank, case + " velocities", vel, want_u[rank])
        elif vel:
            raise AssertionError("%s: velocities without momentum: %s" % (case, sorted(residual_values)))
        if case.startswith("off"):
            # Plain error feedback: the same bits as the numpy simulation's float32 arithmetic.
            flat = [x for step in got for x in step]
            if plain is None:
                plain = flat
            check(rank, case + " vs off", flat, plain, exact=True)
        print("RANK %d CASE %s OK" % (rank, case), flush=True)

    # Saved after 4 steps, restored in a fresh graph: the next 4 steps equal the uninterrupted run.
    cfg = CASES["all"]
    path = os.path.join(out_dir, "rank%d" % rank, "model")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    want, _, _ = simulate(cfg, [[data(r, t) for r in range(SIZE)] for t in range(steps)])
    with tf.Graph().as_default():
        ws, cs, train, state = build(cfg)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for t in range(4):
                s.run(train, dict(zip(cs, data(rank, t))))
            saved_state = by_name(state, s.run(state))
            saver.save(s, path)
    with tf.Graph().as_default():
        ws, cs, train, state = build(cfg)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            saver.restore(s, path)
            restored = by_name(state, s.run(state))
            if sorted(restored) != sorted(saved_state) or not any(n.endswith("_topk_velocity") for n in restored):
                raise AssertionError("restored state %s, saved %s" % (sorted(restored), sorted(saved_state)))
            check(rank, "restored state", [restored[n] for n in sorted(restored)],
                  [saved_state[n] for n in sorted(saved_state)], exact=True)  # fmt: skip
            for t in range(4, steps):
                s.run(train, dict(zip(cs, data(rank, t))))
                check(rank, "restored step %d" % t, s.run(ws), want[t])
    print("RANK %d RESTORE OK" % rank, flush=True)


def skip():
    rank = hvd.rank()
    cfg = dict(BASE, topk_momentum=0.9)
    bad_step, steps = 2, 6

    def feed(t):
        d = data(rank, t)
        if t == bad_step and rank == 1:
            d[2][17] = np.inf
        return d

    def run(guard):
        with tf.Graph().as_default():
            ws, cs, train, state = build(cfg, mixed=True)
            gs = tf.compat.v1.train.get_global_step()
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                got, states = [], []
                for t in range(steps):
                    before = s.run(state)
                    s.run(train, dict(zip(cs, feed(t))))
                    got.append(s.run(ws))
                    states.append((before, s.run(state), s.run(gs)))
        return got, states

    got, states = run(True)
    before, after, step = states[bad_step]
    if step != bad_step:
        raise AssertionError("rank %d: global step %d after the skipped step %d" % (rank, step, bad_step))
    check(rank, "weights of the skipped step", got[bad_step], got[bad_step - 1], exact=True)
    check(rank, "state of the skipped step", after, before, exact=True)
    applied = [t for t in range(steps) if t != bad_step]
    want, _, _ = simulate(cfg, [[data(r, t) for r in range(SIZE)] for t in applied])
    for j, t in enumerate(applied):
        check(rank, "skip run step %d" % t, got[t], want[j])
    print("RANK %d SKIP OK" % rank, flush=True)

    # Negative control: with the state committed whatever the step's finiteness, the skipped step changes it.
    guarded = topk._guarded
    topk._guarded = lambda ok, updates: guarded(tf.constant(True), updates)
    try:
        _, states = run(False)
    finally:
        topk._guarded = guarded
    before, after, _ = states[bad_step]
    changed = sum(int(not np.array_equal(a, b)) for a, b in zip(after, before))
    print("RANK %d UNGUARDED CHANGED %d" % (rank, changed), flush=True)


def main():
    tfe_hvd.init()
    assert hvd.size() == SIZE, hvd.size()
    if sys.argv[1] == "reference":
        reference(sys.argv[2])
    elif sys.argv[1] == "skip":
        skip()
    else:
        raise SystemExit("unknown check %r" % sys.argv[1])


if __name__ == "__main__":
    main()
