"""numpy references of the tables' arithmetic, shared by the CUDA table's device check (test_gpu_table.py) and its
benchmark (bench_gpu_table.py): the mixers (mix.h), the row codec's rounding (row_codec.h: round-to-nearest-even and
the deterministic stochastic rounding, bit for bit) and the fused optimizer steps (optimizer_functors.h), each written
independently of the C++ so that a check against it can fail. numpy only (no TensorFlow).
"""

import numpy as np

F = np.float32
NEAREST, STOCHASTIC = 0, 1  # row_codec.h's Rounding


def splitmix64(x):
    """SplitMix64 (mix.h) of uint64 values."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def fmix64(keys):
    """Murmur3Fmix64 (mix.h): the table's probe hash."""
    h = keys.astype(np.uint64)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return h


def stochastic_bits(keys, version, cols):
    """row_codec.h's StochasticBits(key, version, column): [len(keys), len(cols)] uint32. One 64-bit seed per row
    (StochasticRowSeed), then lowbias32 of its low half plus a Weyl step per column, xor its high half
    (StochasticColumnBits)."""
    k = splitmix64(np.asarray(keys, np.int64).astype(np.uint64))
    with np.errstate(over="ignore"):
        seed = fmix64(k ^ (np.uint64(version) * np.uint64(0x9E3779B97F4A7C15)))[:, None]
        col = (np.asarray(cols).astype(np.uint32) + np.uint32(1)) * np.uint32(0x9E3779B9)
        x = seed.astype(np.uint32) + col[None, :]
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x ^ (seed >> np.uint64(32)).astype(np.uint32)


def round_to(storage, x, random=None):
    """What a column of `storage` holds for the float32 values x (finite, within the float16 range), as float32:
    round-to-nearest-even, or row_codec.h's stochastic rounding driven by `random` (uint32 per value)."""
    x = np.ascontiguousarray(x, np.float32)
    if storage == "bfloat16":
        u = x.view(np.uint32).astype(np.uint64)
        sign, a = u & np.uint64(0x80000000), u & np.uint64(0x7FFFFFFF)
        add = (np.uint64(0x7FFF) + ((a >> np.uint64(16)) & np.uint64(1))) if random is None else random & 0xFFFF
        r = np.minimum((a + add.astype(np.uint64)) >> np.uint64(16), np.uint64(0x7F7F))
        return (((sign >> np.uint64(16)) | r) << np.uint64(16)).astype(np.uint32).view(np.float32)
    if random is None:
        return x.astype(np.float16).astype(np.float32)
    mag = np.abs(x)
    near = mag.astype(np.float16)
    down = near.view(np.uint16) - (near.astype(np.float32) > mag).astype(np.uint16)  # truncated toward zero
    lo = down.view(np.float16).astype(np.float32)
    hi = (down + np.uint16(1)).view(np.float16).astype(np.float32)
    u = (random >> 8).astype(np.float32) * np.float32(2.0**-24)
    return np.copysign(np.where((mag - lo) > u * (hi - lo), hi, lo), x).astype(np.float32)


def round_rows(storage, rows, compact_cols, rounding=NEAREST, keys=None, version=0):
    """rows ([n, width] float32, from column 0) as a table stores them: columns [0, compact_cols) rounded."""
    out = np.array(rows, np.float32)
    cols = np.arange(compact_cols)
    random = None if rounding == NEAREST else stochastic_bits(keys, version, cols)
    out[:, :compact_cols] = round_to(storage, out[:, :compact_cols], random)
    return out


def adagrad_ref(row, g, h, dim):
    var, acc = row[:, :dim], row[:, dim : 2 * dim]
    lr = F(h[0])
    acc += g * g
    if dim == 1:
        var -= lr * g / np.sqrt(acc)
    else:
        var -= lr * g * (F(1) / np.sqrt(acc))


def rowwise_adagrad_ref(row, g, h, dim):
    """RowwiseAdagradOpt::Apply: acc += RowMeanSquare(g) (squares summed as a balanced binary tree over the columns,
    padded with zeros to a power of two, times the float nearest 1 / dim); var -= (lr * g) / sqrt(acc)."""
    var, acc = row[:, :dim], row[:, dim]
    leaves = 1 << max(dim - 1, 0).bit_length()
    tree = np.zeros((len(g), leaves), np.float32)
    tree[:, :dim] = g * g
    while tree.shape[1] > 1:
        tree = tree[:, 0::2] + tree[:, 1::2]
    acc += tree[:, 0] * (F(1) / F(dim))
    var -= (F(h[0]) * g) / np.sqrt(acc)[:, None]


def adam_ref(row, g, h, dim):
    var, m, v = row[:, :dim], row[:, dim : 2 * dim], row[:, 2 * dim :]
    b1p, b2p, lr, b1, b2, eps = (F(x) for x in h)
    lr_t = lr * np.sqrt(F(1) - b2p) / (F(1) - b1p)
    m[:] = m * b1 + g * (F(1) - b1)
    v[:] = v * b2 + (g * g) * (F(1) - b2)
    var -= (lr_t * m) / (np.sqrt(v) + eps)


def powf(x, y):
    """x ** y rounded once to float32 (as a correctly rounded powf; numpy's float32 power may be 1 ulp off)."""
    return np.power(x.astype(np.float64), np.float64(y)).astype(np.float32)


def ftrl_ref(row, g, h, dim):
    """FtrlOpt::Apply (optimizer_functors.h), multiply_linear_by_lr = false (the harness passes no flags)."""
    var, accum, linear = row[:, :dim], row[:, dim : 2 * dim], row[:, 2 * dim :]
    lr, l1, l2, l2_shrinkage, lr_power = (F(x) for x in h)
    shrink, fast, p = l2_shrinkage > 0, lr_power == F(-0.5), -lr_power
    a = accum.copy()
    if dim == 1:  # TF's scalar path (FtrlCompute)
        gs = g + (F(2) * l2_shrinkage * var) if shrink else g
        updated_a = a + g * g
        sigma = (powf(updated_a, p) - powf(a, p)) / lr
        updated_l = linear + gs - sigma * var
        quadratic = (np.sqrt(updated_a) if fast else powf(updated_a, p)) / lr + F(2) * l2
    else:
        gs = g + F(2) * l2_shrinkage * var if shrink else g
        na = a + g * g
        sigma = (np.sqrt(na) - np.sqrt(a)) if fast else (powf(na, p) - powf(a, p))
        updated_l = linear + (gs - sigma / lr * var)
        quadratic = (np.sqrt(na) if fast else powf(na, p)) / lr + F(2) * l2
    adj = np.maximum(np.minimum(updated_l, l1), -l1)
    var[:] = (adj - updated_l) / quadratic
    linear[:] = updated_l
    accum[:] = a + g * g
