"""The fused compression kernels (tensorflow_ext/horovod/kernels, through compression_ops) against the TensorFlow
chains they replace in the dense gradient exchange and against numpy: bit for bit, with NaN/Inf, subnormals, ties,
empty and odd sizes. One process per test (importing tensorflow_ext.horovod changes seed defaults process-wide)."""

import subprocess
import sys
import textwrap

from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env

PRELUDE = """
import math
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
from tensorflow_ext.horovod import compression_ops as co

WIRES = {"none": None, "fp16": tf.float16, "bf16": tf.bfloat16}

def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])

def special_floats(rng, n):
    # Random bit patterns (every exponent: NaN payloads of both signs, Inf, subnormals, overflow to Inf in 16 bits)
    # mixed with ordinary gradients and the boundaries of fp16's range.
    out = rng.randint(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    out[::3] = rng.normal(size=len(out[::3])).astype(np.float32)
    edges = [65504, 65519.99, 65520, 65536, 6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-45, -0.0, np.inf, -np.inf, np.nan,
             -np.nan, 3.4028235e38, -3.4028235e38, 3.3961776e38]
    out[: min(n, len(edges))] = np.array(edges, np.float32)[:n]
    return out

def tf_pack(grads, wire, scale):
    # The pure-TF path the kernel replaces: concat, pre-scale, cast.
    flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0)
    if scale != 1.0:
        flat = flat * tf.cast(scale, flat.dtype)
    return tf.cast(flat, wire) if wire is not None else flat

def tf_unpack(wire_tensor, like, scale):
    flat = tf.cast(wire_tensor, tf.float32)
    if scale != 1.0:
        flat = flat * tf.cast(scale, tf.float32)
    parts = tf.split(flat[: sum(int(np.prod(s)) for s in like)], [int(np.prod(s)) for s in like])
    return [tf.reshape(p, s) for p, s in zip(parts, like)]

def topk_numpy(acc, k, wire_cast):
    # Exact top-k by magnitude, ties to the lower index, NaN above Inf; ascending indices; the residual rule.
    key = bits(acc.astype(np.float32)) & np.uint32(0x7FFFFFFF)
    idx = np.sort(np.lexsort((np.arange(acc.size), -key.astype(np.int64)))[: min(k, acc.size)])
    sent = wire_cast(acc[idx])
    with np.errstate(invalid="ignore"):
        rest = acc[idx] - sent
    rest[~np.isfinite(rest)] = 0
    res = acc.copy()
    res[idx] = rest
    return idx, sent, res
"""


def run(code):
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return r.stdout


def test_pack_and_unpack_equal_the_tensorflow_casts_bit_for_bit():
    """Gradients of odd sizes (one empty) with every kind of float: pack = cast(concat * scale), zero-padded;
    unpack of every 16-bit pattern = cast * scale, split into the shapes."""
    out = run(
        """
        rng = np.random.RandomState(0)
        shapes = [(7,), (0,), (33, 17), (1,), (3, 2, 2), (40001,)]
        sizes = [int(np.prod(s)) for s in shapes]
        values = special_floats(rng, sum(sizes))
        grads_np = np.split(values, np.cumsum(sizes)[:-1])
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            grads = [tf.constant(g.reshape(sh)) for g, sh in zip(grads_np, shapes)]
            for name, wire in WIRES.items():
                for scale in (1.0, 0.37, 1 / 3):
                    for multiple in (1, 4, 7):
                        got = s.run(co.pack(grads, wire, scale, multiple))
                        want = s.run(tf_pack(grads, wire, scale))
                        want = bits(want.view(np.uint16) if name == "bf16" else want)
                        n = len(want)
                        assert len(got) == -(-n // multiple) * multiple, (name, len(got), n, multiple)
                        assert np.array_equal(bits(got[:n]), want), (name, scale, np.sum(bits(got[:n]) != want))
                        assert not np.any(bits(got[n:])), "padding is +0.0"
                if wire is not None:
                    # Every 16-bit pattern back to float32, with and without a post-scale, into odd shapes.
                    patterns = np.arange(1 << 16, dtype=np.uint16)
                    w = tf.constant(patterns)
                    like = [(255, 256), (1,), (255,)]
                    like_t = [tf.zeros(sh) for sh in like]
                    for scale in (1.0, 0.25, 0.3):
                        on_wire = tf.bitcast(w, tf.float16) if name == "fp16" else w  # bf16 travels as bits
                        got = s.run(co.unpack(on_wire, wire, like_t, scale))
                        want = s.run(tf_unpack(tf.bitcast(w, wire), like, scale))
                        for g, v in zip(got, want):
                            assert g.shape == v.shape
                            assert np.array_equal(bits(g), bits(v)), (name, scale, np.sum(bits(g) != bits(v)))
            # numpy agrees on fp16 (round to nearest even, Inf beyond 65520); NaN stays NaN.
            got = s.run(co.pack(grads, tf.float16, 1.0)).view(np.float16)
            with np.errstate(over="ignore", invalid="ignore"):
                ref = values.astype(np.float16)
            assert np.array_equal(np.isnan(got), np.isnan(ref))
            assert np.array_equal(got[~np.isnan(ref)], ref[~np.isnan(ref)])
            assert got[2] == np.inf and got[1] == 65504  # 65520 rounds up to Inf, 65519.99 down to 65504
        print("PACK OK")
        """
    )
    assert "PACK OK" in out, out


def test_sum_of_the_ranks_16_bit_slices_equals_the_float32_reduce_sum():
    """The receiving side of a 16-bit reduce-scatter: cast to float32, reduce_sum over the ranks, cast back, bit for
    bit: 1 to 5 ranks, slices of odd lengths, -0.0, Inf, NaN and sums that overflow fp16."""
    out = run(
        """
        rng = np.random.RandomState(4)
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            for wname in ("fp16", "bf16"):
                wire = WIRES[wname]
                for ranks in (1, 2, 3, 5):
                    for m in (0, 1, 17, 40001):
                        x = (rng.normal(size=ranks * m) * 10.0 ** rng.randint(-4, 5, size=ranks * m)).astype(np.float32)
                        x[::11] = -0.0
                        if m > 3:
                            x[1], x[2], x[m + 2 if ranks > 1 else 3] = np.inf, np.nan, 4e4  # 4e4 + 4e4 overflows fp16
                            x[m + 1 if ranks > 1 else 0] = 4e4
                        w = co._to_wire(tf.constant(x), wire)
                        got = s.run(co.sum_parts(w, ranks, wire))
                        parts = tf.reshape(co._from_wire(w, wire, tf.float32), [ranks, -1])
                        want = s.run(co._to_wire(tf.reduce_sum(parts, axis=0), wire))
                        assert got.shape == (m,) and np.array_equal(bits(got), bits(want)), (wname, ranks, m)
            try:
                s.run(co.sum_parts(tf.zeros([7], tf.float16), 2, tf.float16))
            except (tf.errors.InvalidArgumentError, ValueError) as e:
                print("ERROR", str(e).splitlines()[0])
        print("SUM OK")
        """
    )
    assert "SUM OK" in out, out
    assert "ERROR" in out and "7" in out.split("ERROR")[1], out


def test_top_k_select_is_the_exact_top_k_with_error_feedback():
    """Per gradient the k largest |grad + residual| (ties to the lower index, NaN and Inf first), the wire values
    tf.cast gives, and the new residual, against numpy: sizes on both sides of the sampled-threshold path, patterns
    where the sample misleads (spikes), many ties, mostly zeros, non-finite entries; buckets with offsets."""
    out = run(
        """
        rng = np.random.RandomState(1)
        def case(name, n):
            g = rng.normal(size=n).astype(np.float32)
            r = (0.1 * rng.normal(size=n)).astype(np.float32)
            if name == "heavy":
                g = rng.standard_cauchy(size=n).astype(np.float32)
            if name == "ties":
                g, r = np.round(g * 2) / 2, np.zeros(n, np.float32)
            if name == "zeros":
                g[rng.rand(n) < 0.995], r[:] = 0, 0
            if name == "spikes":  # the strided sample sees only the spikes: for large k too few pass its threshold
                g[::18], r[:] = 10.0 + rng.rand(len(g[::18])), 0
            if name == "nonfinite" and n >= 8:
                g[3], g[5], g[n // 2], r[6] = np.inf, -np.inf, np.nan, np.nan
            return g.astype(np.float32), r.astype(np.float32)

        def cast_via(sess, wire):
            if wire is None:
                return lambda x: x.copy()
            return lambda x: sess.run(tf.cast(tf.cast(tf.constant(x, tf.float32), wire), tf.float32))

        checked = 0
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            for n in (1, 2, 7, 1000, 65536, 300000):
                for name in ("normal", "heavy", "ties", "zeros", "spikes", "nonfinite"):
                    g, r = case(name, n)
                    for ratio in (0.0001, 0.01, 0.3, 1.0):
                        k = max(1, int(math.ceil(ratio * n)))
                        for wname, wire in WIRES.items():
                            if n < 1000 and wname != "fp16":
                                continue
                            idx, vals, (res,) = s.run(co.top_k_select([tf.constant(g)], [tf.constant(r)], [k], wire))
                            want_idx, want_sent, want_res = topk_numpy(g + r, k, cast_via(s, wire))
                            assert np.array_equal(idx, want_idx), (n, name, ratio, wname)
                            got_sent = vals.view(np.uint16) if wname == "bf16" else vals
                            got_sent = s.run(tf.cast(tf.bitcast(tf.constant(got_sent), wire), tf.float32)) if wname == "bf16" else got_sent.astype(np.float32)
                            assert np.array_equal(bits(got_sent), bits(want_sent)), (n, name, ratio, wname)
                            assert np.array_equal(bits(res), bits(want_res)), (n, name, ratio, wname)
                            checked += 1
                            if name == "nonfinite" and n >= 8 and k >= 4:
                                assert {3, 5, 6, n // 2} <= set(idx.tolist()), "non-finite entries are always sent"
                                assert np.all(np.isfinite(res)), "and leave no Inf or NaN behind"
            # A bucket: positions continue across the gradients; k larger than a gradient sends all of it.
            shapes, ks = [(5, 3), (70000,), (2,)], [2, 700, 9]
            gs = [rng.normal(size=sh).astype(np.float32) for sh in shapes]
            rs = [rng.normal(size=sh).astype(np.float32) for sh in shapes]
            idx, vals, res = s.run(co.top_k_select([tf.constant(x) for x in gs], [tf.constant(x) for x in rs], ks, None))
            offset, pos = 0, 0
            for x, y, k, nr in zip(gs, rs, ks, res):
                want_idx, want_sent, want_res = topk_numpy((x + y).reshape(-1), k, lambda v: v.copy())
                m = len(want_idx)
                assert np.array_equal(idx[pos : pos + m], want_idx + offset)
                assert np.array_equal(bits(vals[pos : pos + m]), bits(want_sent))
                assert nr.shape == x.shape and np.array_equal(bits(nr.reshape(-1)), bits(want_res))
                offset, pos = offset + x.size, pos + m
            assert pos == len(idx) == 2 + 700 + 2
            # An empty gradient sends nothing.
            idx, vals, res = s.run(co.top_k_select([tf.zeros([0])], [tf.zeros([0])], [1], tf.float16))
            assert idx.shape == (0,) and vals.shape == (0,) and res[0].shape == (0,)
        print("TOPK OK", checked)
        """
    )
    assert "TOPK OK" in out, out
    assert int(out.split("TOPK OK")[1]) > 200, out


def test_scatter_add_equals_unsorted_segment_sum():
    """Every rank's entries (repeated positions, -0.0, 16-bit values) summed in order, scaled and split: the bits of
    tf.math.unsorted_segment_sum * scale; a position outside the bucket is named."""
    out = run(
        """
        rng = np.random.RandomState(2)
        shapes = [(30, 20), (50,), (1,), (12, 12)]
        total = sum(int(np.prod(sh)) for sh in shapes)
        like = [tf.zeros(sh) for sh in shapes]
        ranks = 3
        idx = np.concatenate([np.sort(rng.choice(total, 90, replace=False)) for _ in range(ranks)]).astype(np.int32)
        vals = rng.normal(size=len(idx)).astype(np.float32) * 100
        vals[::7] = -0.0
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            for wname, wire in WIRES.items():
                for scale in (1.0, 1 / 3):
                    wire_vals = co._to_wire(tf.constant(vals), wire)
                    got = s.run(co.scatter_add(tf.constant(idx), wire_vals, wire, like, scale))
                    dense = tf.math.unsorted_segment_sum(co._from_wire(wire_vals, wire, tf.float32), idx, total)
                    if scale != 1.0:
                        dense = dense * tf.cast(scale, tf.float32)
                    want = s.run(tf.split(dense, [int(np.prod(sh)) for sh in shapes]))
                    for g, w, sh in zip(got, want, shapes):
                        assert g.shape == sh and np.array_equal(bits(g.reshape(-1)), bits(w)), (wname, scale)
            try:
                s.run(co.scatter_add(tf.constant([3, total], tf.int32), tf.constant([1.0, 2.0]), None, like))
            except tf.errors.InvalidArgumentError as e:
                print("ERROR", e.message)
        print("SCATTER OK")
        """
    )
    assert "SCATTER OK" in out, out
    assert "TfExtHvdScatterAdd: indices[1] = 795 is not in [0, 795)" in out, out


def test_other_dtypes_and_dynamic_shapes_take_the_tensorflow_path_with_the_same_rules():
    """float64 gradients and shapes known only at run time go through TensorFlow ops: the same tie and residual
    rules, and float32 values give the kernels' bits."""
    out = run(
        """
        rng = np.random.RandomState(3)
        g = rng.normal(size=70001)
        g[[10, 20, 30]] = [np.inf, np.nan, -np.inf]
        g[100:400] = 5.0  # 300 ties above every other finite entry: the lower indices win
        r = rng.normal(size=70001) * 0.1
        r[100:400] = 0
        k = 150
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            for wname, wire in WIRES.items():
                idx, vals, (res,) = s.run(co.top_k_select([tf.constant(g)], [tf.constant(r)], [k], wire))
                want_idx, _, _ = topk_numpy(g + r, k, lambda x: x)
                assert np.array_equal(idx, want_idx), wname
                assert np.array_equal(idx, [10, 20, 30] + list(range(100, 247))), idx
                assert np.all(np.isfinite(res)) and res[10] == 0 and res[20] == 0
                # The same values in float32 through the kernel select the same entries.
                idx32, _, _ = s.run(co.top_k_select([tf.constant(g.astype(np.float32))], [tf.constant(r.astype(np.float32))], [k], wire))
                assert np.array_equal(idx, idx32), wname
            # Dynamic shapes: pack/unpack through tf ops equal the kernels on the same values.
            x = rng.normal(size=[6, 5]).astype(np.float32)
            ph = tf.compat.v1.placeholder(tf.float32, [None, 5])
            for wname, wire in WIRES.items():
                dyn = s.run(co.pack([ph, ph], wire, 0.5, 4), {ph: x})
                fixed = s.run(co.pack([tf.constant(x), tf.constant(x)], wire, 0.5, 4))
                assert np.array_equal(bits(dyn), bits(fixed)), wname
                back = s.run(co.unpack(tf.constant(fixed), wire, [ph, ph], 2.0), {ph: x})
                back_fused = s.run(co.unpack(tf.constant(fixed), wire, [tf.constant(x), tf.constant(x)], 2.0))
                for a, b in zip(back, back_fused):
                    assert a.shape == (6, 5) and np.array_equal(bits(a), bits(b)), wname
        print("FALLBACK OK")
        """
    )
    assert "FALLBACK OK" in out, out


def test_kernels_refuse_bad_inputs_naming_them():
    out = run(
        """
        ops = co.load_ops()
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            for build in (
                lambda: ops.tf_ext_hvd_unpack(tf.compat.v1.placeholder_with_default(tf.zeros([5]), [None]), N=1, shapes=[[2, 3]]),
                lambda: ops.tf_ext_hvd_top_k_select([tf.zeros([4])], [tf.compat.v1.placeholder_with_default(tf.zeros([5]), [None])], ks=[1], out_type=tf.float32),
                lambda: ops.tf_ext_hvd_scatter_add([0], [1.0], N=1, shapes=[tf.TensorShape([None])]),
            ):
                try:
                    s.run(build())
                except (tf.errors.InvalidArgumentError, ValueError) as e:
                    text = getattr(e, "message", str(e))
                    print("ERROR", [line for line in text.splitlines() if line.startswith("TfExtHvd")][0])
        """
    )
    lines = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert lines[0] == "ERROR TfExtHvdUnpack: packed has 5 entries, fewer than the shapes' 6", lines
    assert lines[1].startswith("ERROR TfExtHvdTopKSelect: gradient 0 has shape [4] but its residual [5]"), lines
    assert lines[2] == "ERROR TfExtHvdScatterAdd: every shape must be fully defined, got [?]", lines
