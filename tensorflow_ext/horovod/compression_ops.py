"""The compression steps of the dense gradient exchange (`allreduce.DenseReducer`) as fused kernels.

A fused buffer travels in its *wire* form: the gradients' own dtype without compression, float16 with fp16, and
bfloat16 as uint16 bit patterns with bf16 (Horovod moves uint16 but has no bf16 reduction). Five steps touch every
entry of a buffer, and each is one op of the library (tensorflow_ext/horovod/kernels, one vectorized pass):

* `pack`: the gradients flattened, concatenated, multiplied by the pre-scale, cast to the wire dtype and
  zero-padded to a multiple of the process set's size;
* `sum_parts`: the receiving side of a 16-bit reduce-scatter (Horovod only moves the bytes): every rank's slice
  summed in float32 and rounded once;
* `unpack`: the reduced buffer cast back, multiplied by the post-scale and split into the gradients' shapes;
* `top_k_select`: per gradient, acc = gradient + residual, its k entries of largest magnitude (positions in the
  bucket and wire values, ascending), and the new residual (acc minus what was sent);
* `scatter_add`: every rank's gathered (position, value) entries summed into the bucket's gradients, scaled.

The kernels give the bits of the TensorFlow chains they replace (tf.concat, multiply, tf.cast, tf.split,
tf.math.top_k, tf.math.unsorted_segment_sum), which still serve gradients the kernels do not take: dtypes other
than float32, or shapes known only when the graph runs. Two behaviours are defined here for both: equal magnitudes
go to the lower index (NaN counts as larger than Inf, so a non-finite gradient is always sent), and a residual entry
whose sent value was Inf or NaN becomes 0 (Inf - Inf would poison every later step).
"""

import math

import tensorflow as tf

from tensorflow_ext.utils.loader import load_ops

__all__ = ["pack", "scatter_add", "sum_parts", "top_k_select", "unpack", "wire_dtype"]

_OPS = ("TfExtHvdPack", "TfExtHvdUnpack", "TfExtHvdSumParts", "TfExtHvdTopKSelect", "TfExtHvdScatterAdd")

try:
    for _op in _OPS:
        tf.no_gradient(_op)
except KeyError:  # registered already (module reloaded)
    pass


def wire_dtype(dtype, wire16):
    """The dtype a gradient of `dtype` has on the wire with 16-bit compression `wire16` (None, tf.float16 or
    tf.bfloat16): bfloat16 travels as tf.uint16; non-floating gradients are never compressed."""
    if wire16 is None or not dtype.is_floating:
        return dtype
    return tf.uint16 if wire16 == tf.bfloat16 else wire16


def _static_size(t):
    shape = t.shape
    if shape.rank is None or not shape.is_fully_defined():
        return None
    return int(math.prod(shape.as_list()))


def _fused(tensors):
    """Whether the kernels take these gradients: float32 and fully defined shapes."""
    return all(t.dtype == tf.float32 and _static_size(t) is not None for t in tensors)


def _kernel_dtype(wire16):
    return tf.float32 if wire16 is None else wire16


def _to_wire(x, wire16):
    """x (floating) cast to the wire: bfloat16 as its uint16 bits."""
    if wire16 is None or not x.dtype.is_floating:
        return x
    if x.dtype != wire16:
        x = tf.cast(x, wire16)
    return tf.bitcast(x, tf.uint16) if wire16 == tf.bfloat16 else x


def _from_wire(w, wire16, dtype):
    """The wire tensor w as `dtype` (exact: every 16-bit value is a float32)."""
    if w.dtype == tf.uint16 and wire16 == tf.bfloat16 and dtype.is_floating:
        w = tf.bitcast(w, tf.bfloat16)
    return tf.cast(w, dtype) if w.dtype != dtype else w


def _scaled(t, factor):
    return t if factor == 1.0 else t * tf.cast(factor, t.dtype)


def _kernel_view(w, wire16):
    """The wire tensor w as the kernels read it (bfloat16 bits as bfloat16; a free bitcast)."""
    return tf.bitcast(w, tf.bfloat16) if w.dtype == tf.uint16 and wire16 == tf.bfloat16 else w


def pack(grads, wire16, scale=1.0, multiple=1):
    """One flat wire buffer of `grads` (one dtype): cast(concat(flatten(grads)) * scale), zero-padded to a multiple
    of `multiple` entries.

    Args:
      grads: non-empty list of tensors of one dtype.
      wire16: None, tf.float16 or tf.bfloat16 (the compression).
      scale: python float, the pre-scale.
      multiple: int >= 1.

    Returns:
      A 1-D tensor of `wire_dtype(grads[0].dtype, wire16)`.
    """
    if _fused(grads):
        out = load_ops().tf_ext_hvd_pack(grads, out_type=_kernel_dtype(wire16), scale=scale, multiple=multiple)
        return tf.bitcast(out, tf.uint16) if wire16 == tf.bfloat16 else out
    flats = [tf.reshape(g, [-1]) for g in grads]
    flat = flats[0] if len(flats) == 1 else tf.concat(flats, 0)
    out = _to_wire(_scaled(flat, scale), wire16)
    if multiple > 1:
        out = tf.pad(out, [[0, tf.math.floormod(-tf.size(out), multiple)]])
    return out


def unpack(wire, wire16, like, scale=1.0):
    """The reduced buffer as tensors shaped and typed like `like`: split(cast(wire) * scale); entries past the
    gradients (padding) are ignored.

    Args:
      wire: 1-D tensor from `pack` (or a reduction of it).
      wire16: the compression given to `pack`.
      like: the list of gradients given to `pack`.
      scale: python float, the post-scale.

    Returns:
      list of tensors.
    """
    if _fused(like):
        return load_ops().tf_ext_hvd_unpack(
            _kernel_view(wire, wire16), N=len(like), shapes=[g.shape for g in like], scale=scale
        )
    dtype = like[0].dtype
    sizes = [tf.size(g) for g in like]
    total = tf.add_n(sizes) if len(sizes) > 1 else sizes[0]
    summed = _scaled(_from_wire(wire[:total], wire16, dtype), scale)
    parts = [summed] if len(like) == 1 else tf.split(summed, tf.stack(sizes), num=len(like))
    return [tf.reshape(p, tf.shape(g)) for p, g in zip(parts, like)]


def sum_parts(parts, num_parts, wire16):
    """The receiving side of a 16-bit reduce-scatter: `parts` (16-bit wire entries, `num_parts` equal slices, one per
    rank in rank order) summed in float32 in rank order and rounded once to the wire dtype.

    Args:
      parts: 1-D wire tensor (float16, or uint16 bfloat16 bits).
      num_parts: int, the number of ranks that sent a slice.
      wire16: tf.float16 or tf.bfloat16.

    Returns:
      A 1-D wire tensor of size(parts) / num_parts entries.
    """
    out = load_ops().tf_ext_hvd_sum_parts(_kernel_view(parts, wire16), num_parts=num_parts)
    return tf.bitcast(out, tf.uint16) if wire16 == tf.bfloat16 else out


def top_k_select(grads, residuals, ks, wire16):
    """Top-K with error feedback over a bucket of gradients of static shapes.

    Args:
      grads: list of floating tensors of one dtype and static shapes.
      residuals: their residuals' values (same shapes).
      ks: list of ints, the entries to send per gradient (at most its size).
      wire16: None, tf.float16 or tf.bfloat16.

    Returns:
      (indices, values, new_residuals): int32 positions in the concatenation of the flattened gradients, ascending
      per gradient; the wire values of acc = grad + residual there; per gradient acc minus what was sent (0 where
      that is not finite).
    """
    if _fused(grads):
        indices, values, new_residuals = load_ops().tf_ext_hvd_top_k_select(
            grads, residuals, ks=list(ks), out_type=_kernel_dtype(wire16)
        )
        if wire16 == tf.bfloat16:
            values = tf.bitcast(values, tf.uint16)
        return indices, values, list(new_residuals)
    idx_parts, val_parts, new_residuals, offset = [], [], [], 0
    for g, r, k in zip(grads, residuals, ks):
        n = _static_size(g)
        acc = tf.reshape(g + r, [-1])
        idx = tf.sort(_top_k_indices(_magnitude_key(acc), n, k))
        wire = _to_wire(tf.gather(acc, idx), wire16)
        rest = tf.gather(acc, idx) - _from_wire(wire, wire16, acc.dtype)
        rest = tf.where(tf.math.is_finite(rest), rest, tf.zeros_like(rest))
        new_res = tf.tensor_scatter_nd_update(acc, tf.expand_dims(idx, 1), rest)
        new_residuals.append(tf.reshape(new_res, tf.shape(r)))
        idx_parts.append(idx + offset)
        val_parts.append(wire)
        offset += n
    concat = lambda parts: parts[0] if len(parts) == 1 else tf.concat(parts, 0)  # noqa: E731
    return concat(idx_parts), concat(val_parts), new_residuals


def scatter_add(indices, values, wire16, like, scale=1.0):
    """Every rank's (position, wire value) entries summed into dense tensors like `like`, times `scale`.

    Args:
      indices: int32 positions in the concatenation of the flattened `like` tensors.
      values: their wire values.
      wire16: the compression of the values.
      like: the bucket's gradients (static shapes).
      scale: python float.

    Returns:
      list of tensors shaped and typed like `like`.
    """
    if _fused(like):
        return load_ops().tf_ext_hvd_scatter_add(
            indices, _kernel_view(values, wire16), N=len(like), shapes=[g.shape for g in like], scale=scale
        )
    dtype = like[0].dtype
    sizes = [_static_size(g) for g in like]
    total = tf.math.unsorted_segment_sum(_from_wire(values, wire16, dtype), indices, sum(sizes))
    total = _scaled(total, scale)
    parts = tf.split(total, sizes) if len(like) > 1 else [total]
    return [tf.reshape(p, g.shape) for p, g in zip(parts, like)]


# ---------------------------------------------------------------------------------------------------------------
# The exact top-k of the TensorFlow path.

# Below this many entries (or above this ratio) tf.math.top_k on the whole tensor is cheap enough.
_PRESELECT_MIN_ELEMENTS = 1 << 16
_PRESELECT_MAX_RATIO = 0.25
_SAMPLE = 16384


def _magnitude_key(x):
    """|x| as an integer that orders like the magnitude and puts NaN above Inf (the kernels' order): the bits of the
    float32 (float64) value without the sign; 16-bit floats convert to float32 exactly."""
    if x.dtype == tf.float64:
        return tf.bitwise.bitwise_and(tf.bitcast(x, tf.int64), tf.constant(0x7FFFFFFFFFFFFFFF, tf.int64))
    bits = tf.bitcast(tf.cast(x, tf.float32), tf.int32)
    return tf.bitwise.bitwise_and(bits, tf.constant(0x7FFFFFFF, tf.int32))


def _top_k_indices(key, n, k):
    """int32 indices of the k largest entries of the flat `key` (n entries; ties to the lower index), unordered.

    tf.math.top_k over millions of entries costs about 15 ns per entry on one CPU core, so a threshold is first
    estimated from a strided sample (at twice the wanted fraction), only the entries above it are ranked exactly,
    and the exact top_k of the whole tensor runs only when fewer than k entries pass (never wrong, only slower).
    """
    if k >= n:
        return tf.range(n, dtype=tf.int32)
    if n < _PRESELECT_MIN_ELEMENTS or k > _PRESELECT_MAX_RATIO * n:
        return tf.math.top_k(key, k=k, sorted=False).indices
    stride = max(1, n // _SAMPLE)
    sample = key[::stride]
    m = (n + stride - 1) // stride
    keep = min(m, max(1, int(math.ceil(2.0 * k * m / n))))
    threshold = tf.reduce_min(tf.math.top_k(sample, k=keep, sorted=False).values)
    candidates = tf.cast(tf.reshape(tf.where(key >= threshold), [-1]), tf.int32)

    def ranked():
        best = tf.math.top_k(tf.gather(key, candidates), k=k, sorted=False).indices
        return tf.gather(candidates, best)

    def whole():
        return tf.math.top_k(key, k=k, sorted=False).indices

    return tf.cond(tf.size(candidates) >= k, ranked, whole, name="topk_select")
