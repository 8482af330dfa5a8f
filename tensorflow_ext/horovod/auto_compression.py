"""`compression="auto"`: each fused gradient buffer reduced with the method the link pays for.

When `DistributedOptimizer(compression="auto")` (or `TF_EXT_HVD_COMPRESSION=auto`) builds its gradient exchange,
every fused buffer is first measured, once per process, on the ranks that will train:

1. in a graph and session of their own (before the first training step), each candidate method reduces a random
   buffer of the real buffer's gradient shapes: plain float32 allreduce, fp16, bf16, and Top-K (only when the user
   gave `topk_ratio`: it changes the math, so it is never chosen otherwise). Each runs once to warm up and
   `MEASURED_RUNS` times timed, the methods in turns (the median counts); the method's compression alone (the
   fused kernels: pack and unpack, or Top-K selection and scatter-add, without collectives) is timed alike;
2. the measurements are averaged over the ranks (one allreduce), so every rank predicts from the same numbers, and
   rank 0's choice is broadcast, so every rank builds the same collectives whatever its clock said;
3. the time of method m is predicted as compression + extra + wire / scale: its compression-only time; its bytes
   on the wire at the bus bandwidth of plain float32 (plain's measured time minus its compression-only time is
   its wire time; a method's wire time is that times its bytes over plain's: ring allreduce 2(p-1)/p of the
   buffer each way, Top-K allgathers (p-1)*k positions and values); what its collectives took beyond that (never
   negative: Gloo's slow fp16 sum, an allgather's latency), which a faster link does not shorten; `scale` is
   `TF_EXT_HVD_AUTO_LINK_SCALE` (default 1: the measured link), the factor applied to the bandwidth. A method other than plain is chosen only when its
   prediction is at least `MIN_GAIN` below plain's (Top-K: `TOPK_MIN_GAIN`, as it changes the math), so
   measurement noise does not make the step slower than plain.

The choice is logged once per buffer (rank 0), returned by `DistributedOptimizer.compression_choices` and written as a
text summary (`compression_auto`). A buffer with Top-K allowed keeps its residual variables whatever is chosen (a
checkpoint restores under any choice) and a dense choice adds the residual into the gradient and clears it, so the
error a Top-K run left is still applied. A restarted process measures again (the link may have changed); the choice
is cached per process, so rebuilding the graph in one process (an Estimator's next `train` call) reuses it.
"""

import math
import os
import time

import numpy as np
import tensorflow as tf

from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import allreduce
from tensorflow_ext.horovod import compression_ops
from tensorflow_ext.horovod import consistency

__all__ = ["Choices", "METHODS", "MEASURED_RUNS", "MIN_GAIN", "TOPK_MIN_GAIN", "decide", "reduce"]

# Candidate methods, in the order of preference on equal predictions.
METHODS = ("none", "fp16", "bf16", "topk")
_WIRE16 = {"none": None, "fp16": tf.float16, "bf16": tf.bfloat16, "topk": None}

MEASURED_RUNS = 5
MIN_GAIN = 0.10
# Top-K changes the math (error feedback delays what it does not send): only when it at least halves the time.
TOPK_MIN_GAIN = 0.50

# A summary of the choices (one text tensor per optimizer) is added to this collection and to SUMMARIES.
CHOICES_COLLECTION = "tf_ext_compression_choices"

# (process set ranks, optimizer name, buffer signature) -> method: one measurement per process.
_cache = {}


def _link_scale():
    """TF_EXT_HVD_AUTO_LINK_SCALE: the factor applied to the measured bus bandwidth (tests and what-if runs)."""
    text = os.environ.get(allreduce.ENV_PREFIX + "AUTO_LINK_SCALE", "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0.0 and math.isfinite(value)):
        raise ValueError(
            "%sAUTO_LINK_SCALE must be a positive number (the factor applied to the measured link bandwidth), got %r"
            % (allreduce.ENV_PREFIX, text)
        )
    return value


class Buffer(object):
    """One fused buffer: its gradients' shapes, whether Top-K may be used, and after `decide` what was measured.

    Attributes:
      name: the buffer's collective name prefix.
      shapes: list of shapes (float32 gradients of static shapes).
      topk_allowed: bool.
      method: the chosen method, one of METHODS.
      measured: {method: (seconds, compression-only seconds)} averaged over the ranks.
      predicted: {method: seconds}.
      bus_bandwidth: bytes/s of the plain allreduce on the link (None when not measured).
    """

    def __init__(self, name, shapes, topk_allowed):
        self.name = name
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.topk_allowed = topk_allowed
        self.method = None
        self.measured = {}
        self.predicted = {}
        self.bus_bandwidth = None

    @property
    def elements(self):
        return int(sum(np.prod(s, dtype=np.int64) for s in self.shapes))

    def candidates(self):
        return [m for m in METHODS if m != "topk" or self.topk_allowed]

    def describe(self):
        """One line: the buffer, each method's prediction and the choice."""
        preds = ", ".join("%s %.2f ms" % (m, 1e3 * self.predicted[m]) for m in self.candidates())
        bw = "" if self.bus_bandwidth is None else ", bus bandwidth %.1f MB/s" % (self.bus_bandwidth / 1e6)
        return "buffer %s (%d gradients, %.2f MiB%s): predicted %s: chose %s" % (
            self.name,
            len(self.shapes),
            4.0 * self.elements / (1 << 20),
            bw,
            preds,
            self.method,
        )


class Choices(object):
    """What `reduce` measured and chose. Attributes: buffers (list of Buffer), reduced (the reduced gradients)."""

    def __init__(self, buffers, reduced):
        self.buffers = buffers
        self.reduced = reduced

    def methods(self):
        """{buffer name: method}."""
        return {b.name: b.method for b in self.buffers}


def _wire_bytes(method, elements, size, ratio, shapes):
    """Bytes each rank moves over its link for one reduction of the buffer."""
    if method == "topk":
        k = sum(max(1, int(math.ceil(ratio * np.prod(s, dtype=np.int64)))) for s in shapes)
        return (size - 1) * k * 8.0
    return 2.0 * (size - 1) / size * elements * (2 if _WIRE16[method] is not None else 4)


def _build_probe(reducer, buffer, index):
    """{method: (op reducing a random buffer, op of its compression kernels alone)} in the default graph."""
    size = reducer.process_set.size()
    rng = np.random.RandomState(1234 + _hvd.require_horovod().rank())
    like = [
        # Local: not part of the model the configuration check compares.
        tf.compat.v1.Variable(
            rng.normal(size=s).astype(np.float32),
            trainable=False,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            name="probe%d_%d" % (index, i),
        )
        for i, s in enumerate(buffer.shapes)
    ]
    values = [v.read_value() for v in like]
    out = {}
    for m in buffer.candidates():
        name = "tf_ext_auto_probe_%s_%s" % (buffer.name, m)
        wire16 = _WIRE16[m]
        if m == "topk":
            zeros = [tf.zeros_like(v) for v in values]
            ks = [max(1, int(math.ceil(reducer.config.topk_ratio * np.prod(s, dtype=np.int64)))) for s in buffer.shapes]
            idx, vals, res = compression_ops.top_k_select(values, zeros, ks, None)
            local = compression_ops.scatter_add(tf.tile(idx, [size]), tf.tile(vals, [size]), None, values, 1.0)
            full = _ProbeTopK(reducer, name).run(values)
            out[m] = (tf.group(*full), tf.group(*(local + res)))
        else:
            local = compression_ops.unpack(compression_ops.pack(values, wire16, 1.0, 1), wire16, values, 1.0)
            full = reducer.reduce_bucket(values, name, wire16)
            out[m] = (tf.group(*full), tf.group(*local))
    return out


class _ProbeTopK(object):
    """Top-K's collectives on values without residual variables (the probe's graph has none)."""

    def __init__(self, reducer, name):
        self._reducer, self._name = reducer, name

    def run(self, values):
        hvd = _hvd.require_horovod()
        r = self._reducer
        ks = [max(1, int(math.ceil(r.config.topk_ratio * v.shape.num_elements()))) for v in values]
        idx, vals, _ = compression_ops.top_k_select(values, [tf.zeros_like(v) for v in values], ks, None)
        all_idx = hvd.allgather(idx, process_set=r.process_set, name=self._name + "_idx")
        all_vals = hvd.allgather(vals, process_set=r.process_set, name=self._name + "_val")
        return compression_ops.scatter_add(all_idx, all_vals, None, values, 1.0)


def _median_seconds(session, ops):
    """The median seconds of each op of `ops`, run in turns (a burst of load on the machine then slows every op
    alike instead of the one measured at the time) after one warm-up run each (first-run allocations, Horovod's
    negotiation of a new tensor name)."""
    for op in ops:
        session.run(op)
    times = [[] for _ in ops]
    for _ in range(MEASURED_RUNS):
        for op, t in zip(ops, times):
            start = time.perf_counter()
            session.run(op)
            t.append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def _measure(reducer, buffers, declared):
    """Per buffer and candidate (seconds, compression-only seconds), averaged over the process set's ranks."""
    hvd = _hvd.require_horovod()
    with tf.Graph().as_default():
        if declared is not None:
            # The probe's first collective is the configuration check (its collectives are gated): a rank whose
            # optimizer does not measure (another compression) joins it from its first training step, and both
            # fail naming the difference instead of waiting for each other's collectives.
            consistency.declare(*declared)
        probes = [_build_probe(reducer, b, j) for j, b in enumerate(buffers)]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.local_variables_initializer())
            rows = []
            for b, probe in zip(buffers, probes):
                ops = [op for m in METHODS if m in probe for op in probe[m]]
                seconds = iter(_median_seconds(session, ops))
                for m in METHODS:
                    rows.append([next(seconds), next(seconds)] if m in probe else [0.0, 0.0])
    with tf.Graph().as_default():
        # Fed, not constant: a constant input could be folded on one rank and skip the collective.
        ph = tf.compat.v1.placeholder(tf.float64, [len(rows), 2])
        avg = hvd.allreduce(ph, op=hvd.Average, process_set=reducer.process_set, name="tf_ext_auto_measure")
        with tf.compat.v1.Session() as session:
            rows = session.run(avg, {ph: np.array(rows, np.float64)})
    out = []
    for j, b in enumerate(buffers):
        block = rows[j * len(METHODS) : (j + 1) * len(METHODS)]
        out.append({m: (float(block[i][0]), float(block[i][1])) for i, m in enumerate(METHODS) if m in b.candidates()})
    return out


def _predict(buffer, measured, size, ratio, scale):
    """{method: predicted seconds} and the plain allreduce's bus bandwidth (see the module docstring)."""
    plain_total, plain_cpu = measured["none"]
    # Noise can make the compression-only time exceed the whole; the wire then counts as a tenth of the whole.
    plain_wire = max(plain_total - plain_cpu, 0.1 * plain_total, 1e-9)
    plain_bytes = _wire_bytes("none", buffer.elements, size, ratio, buffer.shapes)
    predicted = {}
    for m, (total, cpu) in measured.items():
        wire = plain_wire * _wire_bytes(m, buffer.elements, size, ratio, buffer.shapes) / plain_bytes
        # What the method's collectives take beyond moving its bytes at plain's bandwidth (Gloo's slow fp16 sum,
        # an allgather's latency) does not get faster with the link; never negative, so that a collective more
        # efficient per byte than plain's ring allreduce on loopback is not extrapolated to a faster link.
        extra = max(total - cpu - wire, 0.0)
        predicted[m] = cpu + extra + wire / scale
    return predicted, plain_bytes / plain_wire


def _choose(buffer):
    plain = buffer.predicted["none"]
    gain = lambda m: 0.0 if m == "none" else TOPK_MIN_GAIN if m == "topk" else MIN_GAIN  # noqa: E731
    allowed = [m for m in buffer.candidates() if buffer.predicted[m] <= (1.0 - gain(m)) * plain]
    return min(allowed, key=lambda m: (buffer.predicted[m], METHODS.index(m)))


def decide(reducer, buffers, declared=None):
    """Sets each buffer's method (the same on every rank): measured, or this process's earlier choice.

    Args:
      reducer: the `allreduce.DenseReducer`.
      buffers: list of `Buffer`.
      declared: None or (what, fields): the optimizer's settings that the ranks must share
        (`consistency.declare`), compared before the first measurement.

    Returns:
      list of `Buffer` with their methods set (this process's earlier ones where it measured them already).
    """
    hvd = _hvd.require_horovod()
    ps = reducer.process_set
    ranks = tuple(getattr(ps, "ranks", None) or range(hvd.size()))

    def key(b):
        return (ranks, reducer.name, b.name, tuple(b.shapes), b.topk_allowed)

    todo = [b for b in buffers if key(b) not in _cache]
    if todo:
        size, ratio, scale = ps.size(), reducer.config.topk_ratio, _link_scale()
        for b, measured in zip(todo, _measure(reducer, todo, declared)):
            b.measured = measured
            b.predicted, b.bus_bandwidth = _predict(b, measured, size, ratio, scale)
            b.method = _choose(b)
        with tf.Graph().as_default():
            ph = tf.compat.v1.placeholder(tf.int32, [len(todo)])
            root = hvd.broadcast(ph, 0, process_set=ps, name="tf_ext_auto_choice")
            with tf.compat.v1.Session() as session:
                chosen = session.run(root, {ph: [METHODS.index(b.method) for b in todo]})
        for b, i in zip(todo, chosen):
            b.method = METHODS[int(i)]
            _cache[key(b)] = b
            if hvd.rank() == 0:
                tf.compat.v1.logging.info("compression auto: %s", b.describe())
    return [_cache[key(b)] for b in buffers]


def reduce(reducer, grads_and_vars, declared=None):
    """The reduced gradients of `grads_and_vars` with each fused buffer's chosen method.

    Float32 gradients of static shapes are fused into buffers (those Top-K may take, >= topk_min_elements when
    topk_ratio is given, apart from the others) and measured; other gradients get the plain fused allreduce.

    Args:
      reducer: the `allreduce.DenseReducer` (its config's compression is auto).
      grads_and_vars: list of (dense gradient, variable).
      declared: None or the optimizer's (what, fields) declared to the configuration check (see `decide`).

    Returns:
      A `Choices`.

    Raises:
      InvalidArgumentError: the ranks' declared settings differ (e.g. one rank without compression="auto").
    """
    cfg = reducer.config
    grads = [tf.convert_to_tensor(g) for g, _ in grads_and_vars]
    static = [i for i, g in enumerate(grads) if g.dtype == tf.float32 and allreduce._static_size(g) is not None]
    eligible = []
    if cfg.topk_ratio is not None:
        eligible = [i for i in static if allreduce._static_size(grads[i]) >= cfg.topk_min_elements]
    dense = [i for i in static if i not in set(eligible)]
    others = [i for i in range(len(grads)) if i not in set(static)]
    out = [None] * len(grads)
    if others:
        for i, r in zip(others, reducer.dense_buckets([grads[i] for i in others], "dense")):
            out[i] = r
    groups = []
    for tag, idxs in (("auto", dense), ("autok", eligible)):
        buckets = allreduce._buckets(idxs, cfg.fusion_bytes, lambda i: allreduce._item_bytes(grads[i]))
        for b, group in enumerate(buckets):
            name = "%s_%s%d" % (reducer.name, tag, b)
            groups.append((group, Buffer(name, [grads[i].shape.as_list() for i in group], tag == "autok")))
    buffers = decide(reducer, [b for _, b in groups], declared)
    for (group, _), buf in zip(groups, buffers):
        like = [grads[i] for i in group]
        if buf.topk_allowed:
            residuals = [reducer.residual(grads_and_vars[i][1], grads[i]) for i in group]
            if buf.method == "topk":
                parts = reducer.topk_bucket(like, residuals, buf.name, None)
            else:
                # The residual a Top-K run left (a restored checkpoint) is sent now and cleared.
                accs = [g + r.read_value() for g, r in zip(like, residuals)]
                reduced = reducer.reduce_bucket(accs, buf.name, _WIRE16[buf.method])
                with tf.control_dependencies(reduced):
                    clears = [r.assign(tf.zeros_like(r)) for r in residuals]
                with tf.control_dependencies(clears):
                    parts = [tf.identity(t) for t in reduced]
        else:
            parts = reducer.reduce_bucket(like, buf.name, _WIRE16[buf.method])
        for i, part in zip(group, parts):
            out[i] = part
    if buffers:
        text = tf.constant("\n".join(b.describe() for b in buffers), name="compression_auto_choices")
        tf.compat.v1.add_to_collection(CHOICES_COLLECTION, text)
        tf.compat.v1.summary.text("compression_auto", text)
    return Choices(buffers, out)
