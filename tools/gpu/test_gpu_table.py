#!/usr/bin/env python3
"""Checks the CUDA table (tensorflow_ext/table/gpu) and the embedding layer's initializers and optimizer steps on it
against numpy references, through the ctypes harness (tensorflow_ext/embedding/kernels/gpu/gpu_table_harness.cu.cc),
for float32 rows and for rows whose leading columns are stored as bfloat16 or float16 (row_codec.h's rounding,
reimplemented in numpy_reference.py: round-to-nearest-even and the deterministic stochastic rounding).

Run on a machine with an NVIDIA GPU (sm_80 / sm_90); needs only python3 and numpy (no TensorFlow):

    make cuda && python3 tools/gpu/test_gpu_table.py            # build/cuda/libtfext_gpu_table.so
    python3 tools/gpu/test_gpu_table.py --lib path/to/libtfext_gpu_table.so

Without --lib it takes $TFEXT_GPU_LIB, build/cuda/, bazel-bin/tensorflow_ext/embedding/kernels/gpu/ and, failing
those, builds the harness with the commands of `make cuda` into a temporary directory. Prints one line per check ("PASS name" or
"FAIL name: why"); exit status 1 if any check failed.
"""

import argparse
import ctypes
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_reference import (  # noqa: E402
    NEAREST,
    STOCHASTIC,
    F,
    adagrad_ref,
    adam_ref,
    fmix64,
    ftrl_ref,
    round_rows,
    rowwise_adagrad_ref,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB_NAME = "libtfext_gpu_table.so"
INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
SPECIAL_KEYS = np.array([INT64_MIN, INT64_MAX, -1, 0, INT64_MIN + 1], np.int64)
LRU, LFU = 0, 1
STORAGES = {"float32": 0, "bfloat16": 1, "float16": 2}  # row_codec.h's RowStorage
TRUNC_NORMAL = (2, 0.0, 0.05, 7, 8)  # init_kind, a (mean), b (stddev), seed, seed2


# ---------------------------------------------------------------- library
def build_like_make(out_dir):
    """The Makefile's $(GPU_LIB) recipe (`make cuda`), into out_dir. NVCC, CXX, CUDA_ARCHS as in the Makefile."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cxx = os.environ.get("CXX") or "g++"
    archs = os.environ.get("CUDA_ARCHS", "80 90").split()
    if not os.path.exists(nvcc):
        sys.exit("no %s found, and nvcc not found to build it (install the CUDA toolkit or set NVCC=...)" % LIB_NAME)
    lib, hash_o, harness_o = (os.path.join(out_dir, n) for n in (LIB_NAME, "hash_table.o", "harness.o"))
    gencode = [f for a in archs for f in ("-gencode", "arch=compute_%s,code=sm_%s" % (a, a))]
    cmds = [
        [cxx, "-std=c++17", "-O3", "-fPIC", "-pthread", "-I" + ROOT, "-c", "-o", hash_o]
        + ["tensorflow_ext/table/core/hash_table.cc"],
        [nvcc, "-std=c++17", "-O3", "--fmad=false", "-Werror", "all-warnings", "-Xcompiler", "-fPIC", "-Xcompiler"]
        + ["-pthread", "-I" + ROOT]
        + gencode
        + ["-c", "-o", harness_o, "-x", "cu", "tensorflow_ext/embedding/kernels/gpu/gpu_table_harness.cu.cc"],
        [nvcc, "-shared", "-Xcompiler", "-pthread", "-o", lib, harness_o, hash_o],
    ]
    for cmd in cmds:
        print("building:", shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
    return lib


def find_lib(arg=None):
    for cand in [
        arg,
        os.environ.get("TFEXT_GPU_LIB"),
        os.path.join(ROOT, "build", "cuda", LIB_NAME),
        os.path.join(ROOT, "bazel-bin", "tensorflow_ext", "embedding", "kernels", "gpu", LIB_NAME),
    ]:
        if cand and os.path.exists(cand):
            return cand
    return build_like_make(tempfile.mkdtemp(prefix="tfext_gpu_"))


def load_lib(path):
    """The harness with a ctypes signature for every function (gpu_table_harness.cu.cc)."""
    lib = ctypes.CDLL(path)
    vp, cp, i32, i64, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int64, ctypes.c_uint64
    f32, f64 = ctypes.c_float, ctypes.c_double
    signatures = {
        "tfext_gpu_last_error": (cp, []),
        "tfext_gpu_device_count": (i32, []),
        "tfext_gpu_table_create": (vp, [i64, i64, f64, i64, i32, i32, i64, i32]),
        "tfext_gpu_table_destroy": (None, [vp]),
        "tfext_gpu_table_stats": (i32, [vp, vp]),
        "tfext_gpu_table_find": (i32, [vp, vp, i64, i64, i64, vp, vp, vp]),
        "tfext_gpu_table_find_or_insert": (
            i32,
            [vp, vp, i64, i64, i64, i32, f32, f32, u64, u64] + [vp] * 4 + [i32, i64],
        ),
        "tfext_gpu_table_insert": (i32, [vp, vp, i64, i64, i64, vp, vp, i32, i64]),
        "tfext_gpu_table_accumulate": (i32, [vp, vp, i64, i64, i64, vp, vp, i32, i32, i64]),
        "tfext_gpu_table_remove": (i64, [vp, vp, i64]),
        "tfext_gpu_table_apply": (i32, [vp, cp, vp, i64, vp, i64, vp, vp, i64]),
        "tfext_gpu_table_export": (i64, [vp, i64, i64, i64, vp, vp, vp, vp]),
        "tfext_gpu_table_clear": (i32, [vp]),
        "tfext_gpu_table_reserve": (i32, [vp, i64]),
        "tfext_gpu_initial_rows": (i32, [i32, f32, f32, u64, u64, vp, i64, i64, vp, vp]),
        "tfext_gpu_upload": (vp, [vp, i64]),
        "tfext_gpu_free": (None, [vp]),
        "tfext_gpu_time": (f64, [vp, cp, vp, i64, i64, vp, vp]),
        "tfext_cpu_table_create": (vp, [i64, i64, i32, i64, i32]),
        "tfext_cpu_table_destroy": (None, [vp]),
        "tfext_cpu_table_apply": (i32, [vp, cp, vp, i64, vp, i64, vp, vp, i64]),
        "tfext_cpu_table_find": (i32, [vp, vp, i64, vp, vp]),
        "tfext_cpu_time": (f64, [vp, cp, vp, i64, i64, vp, vp, i32]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class GpuError(RuntimeError):
    pass


def last_error(lib):
    return (lib.tfext_gpu_last_error() or b"").decode(errors="replace")


def ptr(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def rows_of(a, n, cols):
    return np.ascontiguousarray(a, np.float32).reshape(n, cols)


def opt_f32(a):
    return None if a is None else np.ascontiguousarray(a, np.float32)


class Table:
    """One BucketTable<DeviceBackend> through the harness (host arrays in and out)."""

    def __init__(
        self,
        lib,
        width,
        initial_capacity=0,
        max_load_factor=0.75,
        capacity_limit=0,
        policy=LRU,
        storage="float32",
        compact_cols=0,
        rounding=NEAREST,
    ):
        """storage ("float32", "bfloat16", "float16") holds the leading compact_cols columns of every row."""
        self.lib, self.width = lib, width
        self.h = lib.tfext_gpu_table_create(
            width, initial_capacity, max_load_factor, capacity_limit, policy, STORAGES[storage], compact_cols, rounding
        )
        if not self.h:
            raise GpuError("create: " + last_error(lib))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lib.tfext_gpu_table_destroy(self.h)
        self.h = None

    def _call(self, fn, *args):
        rc = getattr(self.lib, "tfext_gpu_table_" + fn)(self.h, *args)
        if rc < 0:
            raise GpuError("%s: %s" % (fn, last_error(self.lib)))
        return rc

    def _batch(self, keys, col_begin, cols):
        keys = np.ascontiguousarray(keys, np.int64)
        return keys, (ptr(keys), len(keys), col_begin, cols or self.width - col_begin)

    def stats(self):
        out = np.zeros(6, np.int64)
        self._call("stats", ptr(out))
        return dict(zip(("size", "used", "failed", "evicted", "capacity", "row_bytes"), out.tolist()))

    def find(self, keys, default=None, col_begin=0, cols=None, fill=0.0):
        keys, batch = self._batch(keys, col_begin, cols)
        out = np.full((len(keys), batch[3]), fill, np.float32)  # missing keys keep these values without a default
        found = np.zeros(len(keys), np.uint8)
        self._call("find", *batch, ptr(opt_f32(default)), ptr(out), ptr(found))
        return out, found.astype(bool)

    def find_or_insert(self, keys, init=TRUNC_NORMAL, col_begin=0, cols=None, defaults=None, count=False, version=-1):
        """init: (init_kind, a, b, seed, seed2), or the [n, cols] rows of new keys (init_rows, init_kind -1)."""
        keys, batch = self._batch(keys, col_begin, cols)
        n, cols = len(keys), batch[3]
        init_rows = None if isinstance(init, tuple) else rows_of(init, n, cols)
        init = (-1, 0.0, 0.0, 0, 0) if init_rows is not None else init
        out, inserted = np.zeros((n, cols), np.float32), np.zeros(n, np.uint8)
        args = (ptr(init_rows), ptr(opt_f32(defaults)), ptr(out), ptr(inserted), count, version)
        self._call("find_or_insert", *batch, *init, *args)
        return out, inserted.astype(bool)

    def insert(self, keys, values, col_begin=0, defaults=None, count=False, version=-1):
        keys, batch = self._batch(keys, col_begin, values.shape[1])
        values = rows_of(values, len(keys), batch[3])
        self._call("insert", *batch, ptr(values), ptr(opt_f32(defaults)), count, version)

    def accumulate(self, keys, deltas, col_begin=0, defaults=None, insert_missing=False, count=False):
        keys, batch = self._batch(keys, col_begin, deltas.shape[1])
        deltas = rows_of(deltas, len(keys), batch[3])
        self._call("accumulate", *batch, ptr(deltas), ptr(opt_f32(defaults)), insert_missing, count, -1)

    def remove(self, keys):
        keys = np.ascontiguousarray(keys, np.int64)
        return self._call("remove", ptr(keys), len(keys))

    def apply(self, optimizer, hypers, dim, keys, grads, defaults=None, version=-1):
        keys, hypers = np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(hypers, np.float32)
        grads, defaults = rows_of(grads, len(keys), dim), ptr(opt_f32(defaults))
        self._call("apply", optimizer.encode(), ptr(hypers), dim, ptr(keys), len(keys), ptr(grads), defaults, version)

    def export(self, col_begin=0, cols=None, max_n=None):
        """(keys, rows, versions, freqs), sorted by key."""
        cols = cols or self.width - col_begin
        max_n = self.stats()["size"] if max_n is None else max_n
        keys, rows = np.zeros(max_n, np.int64), np.zeros((max_n, cols), np.float32)
        versions, freqs = np.zeros(max_n, np.int64), np.zeros(max_n, np.uint32)
        n = self._call("export", col_begin, cols, max_n, ptr(keys), ptr(rows), ptr(versions), ptr(freqs))
        order = np.argsort(keys[:n], kind="stable")
        return keys[:n][order], rows[:n][order], versions[:n][order], freqs[:n][order]

    def clear(self):
        self._call("clear")


class CpuTable:
    """The CPU core (hash_table.h) through the harness: the fused steps and full-row finds, to compare with Table."""

    def __init__(self, lib, width, storage="float32", compact_cols=0, rounding=NEAREST):
        self.lib, self.width = lib, width
        self.h = lib.tfext_cpu_table_create(width, 0, STORAGES[storage], compact_cols, rounding)
        if not self.h:
            raise GpuError("cpu create: " + last_error(lib))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lib.tfext_cpu_table_destroy(self.h)
        self.h = None

    def apply(self, optimizer, hypers, dim, keys, grads, defaults=None, version=-1):
        keys, hypers = np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(hypers, np.float32)
        grads, defaults = rows_of(grads, len(keys), dim), ptr(opt_f32(defaults))
        args = (optimizer.encode(), ptr(hypers), dim, ptr(keys), len(keys), ptr(grads), defaults, version)
        if self.lib.tfext_cpu_table_apply(self.h, *args) < 0:
            raise GpuError("cpu apply: " + last_error(self.lib))

    def find(self, keys):
        keys = np.ascontiguousarray(keys, np.int64)
        out, found = np.zeros((len(keys), self.width), np.float32), np.zeros(len(keys), np.uint8)
        if self.lib.tfext_cpu_table_find(self.h, ptr(keys), len(keys), ptr(out), ptr(found)) < 0:
            raise GpuError("cpu find: " + last_error(self.lib))
        return out, found.astype(bool)


def initial_rows(lib, keys, dim, init=TRUNC_NORMAL):
    """(device rows, host rows) of tfext_gpu_initial_rows."""
    keys = np.ascontiguousarray(keys, np.int64)
    dev, host = np.zeros((len(keys), dim), np.float32), np.zeros((len(keys), dim), np.float32)
    rc = lib.tfext_gpu_initial_rows(*init, ptr(keys), len(keys), dim, ptr(dev), ptr(host))
    if rc < 0:
        raise GpuError("initial_rows: " + last_error(lib))
    return dev, host


# ---------------------------------------------------------------- helpers
def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_equal(got, want, what):
    expect(got.shape == want.shape, "%s: shape %s != %s" % (what, got.shape, want.shape))
    bad = np.nonzero((got != want).reshape(len(got), -1).any(1))[0] if got.size else []
    expect(len(bad) == 0, "%s: %d rows differ, first at %s" % (what, len(bad), list(bad[:5])))


def random_keys(rng, n):
    return rng.integers(INT64_MIN, INT64_MAX, n, dtype=np.int64)


def distinct_keys(rng, n):
    keys = np.unique(random_keys(rng, n + n // 8 + 16))
    rng.shuffle(keys)
    return keys[:n]


def first_occurrence(keys):
    mask = np.zeros(len(keys), bool)
    mask[np.unique(keys, return_index=True)[1]] = True
    return mask


def last_wins(keys, rows):
    """Distinct sorted keys and the row of each key's last occurrence."""
    uk, idx = np.unique(keys[::-1], return_index=True)
    return uk, rows[::-1][idx]


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


# ---------------------------------------------------------------- checks
@check
def insert_find(lib, rng):
    w = 8
    pool = random_keys(rng, 150_000)
    with Table(lib, w) as t:
        ref = {}
        for _ in range(2):  # 200k keys with duplicates in each batch: the last occurrence wins
            keys = np.concatenate([pool[rng.integers(0, len(pool), 200_000)], SPECIAL_KEYS])
            rng.shuffle(keys)
            vals = rng.standard_normal((len(keys), w)).astype(np.float32)
            t.insert(keys, vals)
            ref.update(zip(keys.tolist(), vals))
        probe = np.concatenate([pool, SPECIAL_KEYS, random_keys(rng, 50_000)])
        default = rng.standard_normal(w).astype(np.float32)
        want_found = np.array([k in ref for k in probe.tolist()])
        want = np.stack([ref.get(k, default) for k in probe.tolist()])
        out, found = t.find(probe, default)
        expect(np.array_equal(found, want_found), "found flags differ")
        expect_equal(out, want, "rows (default_row for missing keys)")
        out, _ = t.find(probe, None, fill=123.0)
        expect((out[~want_found] == 123.0).all(), "without default_row, missing rows must stay untouched")
        out, _ = t.find(probe, default[3:7], col_begin=3, cols=4)
        expect_equal(out, want[:, 3:7], "columns [3, 7)")
        out, found = t.find(SPECIAL_KEYS)
        expect(found.all(), "INT64_MIN, INT64_MAX, -1, 0, INT64_MIN+1 must be ordinary keys")
        expect_equal(out, np.stack([ref[k] for k in SPECIAL_KEYS.tolist()]), "rows of the special keys")
        expect(t.stats()["size"] == len(ref), "size %d != %d" % (t.stats()["size"], len(ref)))


@check
def find_or_insert_truncated_normal(lib, rng):
    dim = 37  # three blocks of the key's stream, with rejections
    pool = np.concatenate([random_keys(rng, 8000), SPECIAL_KEYS])
    keys1 = pool[rng.integers(0, len(pool), 20_000)]
    dev, host = initial_rows(lib, keys1, dim)
    expect(np.array_equal(dev.view(np.uint32), host.view(np.uint32)), "device initial rows differ from host rows")
    expect(np.abs(host).max() <= 0.1001 and host.std() > 0.02, "truncated normal(0, 0.05) out of range")
    with Table(lib, dim) as t:
        out, ins = t.find_or_insert(keys1)
        expect(np.array_equal(out, host), "new rows differ from the host initial rows")
        expect(np.array_equal(ins, first_occurrence(keys1)), "inserted must flag the first occurrence of a key")
        new = random_keys(rng, 3000)
        keys2 = np.concatenate([keys1[:5000], new, new[:1000]])
        rng.shuffle(keys2)
        _, host2 = initial_rows(lib, keys2, dim)
        out, ins = t.find_or_insert(keys2)
        expect(np.array_equal(out, host2), "rows of a mixed batch (stored keys read their unchanged rows)")
        expect(np.array_equal(ins, first_occurrence(keys2) & ~np.isin(keys2, keys1)), "inserted flags, mixed batch")
        expect(np.array_equal(t.find(keys2)[0], host2), "find after find_or_insert")
    with Table(lib, dim + 3) as t:  # a column range: the other columns from defaults
        defaults = np.arange(dim + 3, dtype=np.float32)
        out, _ = t.find_or_insert(keys1, col_begin=3, cols=dim, defaults=defaults)
        full, _ = t.find(keys1)
        expect(np.array_equal(out, host) and np.array_equal(full[:, 3:], host), "initial rows in columns [3, 40)")
        expect((full[:, :3] == defaults[:3]).all(), "defaults outside the range")
    with Table(lib, 4) as t:  # init_rows (init_kind < 0): the row of the key's first occurrence
        keys = pool[rng.integers(0, 100, 1000)]
        init = rng.standard_normal((len(keys), 4)).astype(np.float32)
        out, _ = t.find_or_insert(keys, init=init)
        uk, idx = np.unique(keys, return_index=True)
        want = init[idx[np.searchsorted(uk, keys)]]
        expect(np.array_equal(out, want), "init_rows: rows of the first occurrences")


@check
def growth_under_load(lib, rng):
    w = 8
    pool = random_keys(rng, 3_000_000)
    with Table(lib, w, initial_capacity=1000) as t:
        cap0 = t.stats()["capacity"]
        all_keys, all_vals, caps = [], [], []
        for _ in range(8):  # 2M keys in batches of 250k, duplicates within and across batches
            keys = pool[rng.integers(0, len(pool), 250_000)]
            vals = rng.standard_normal((len(keys), w)).astype(np.float32)
            t.insert(keys, vals)
            all_keys.append(keys)
            all_vals.append(vals)
            caps.append(t.stats()["capacity"])
        uk, rows = last_wins(np.concatenate(all_keys), np.concatenate(all_vals))
        s = t.stats()
        expect(caps[-1] > cap0 and caps == sorted(caps), "capacity must grow: %d -> %s" % (cap0, caps))
        expect(s["size"] == len(uk), "size %d != %d distinct keys" % (s["size"], len(uk)))
        expect(s["capacity"] * 0.75 >= s["size"] and s["failed"] == 0, "load above max_load_factor: %s" % s)
        out, found = t.find(uk)
        expect(found.all(), "%d keys lost in growth" % (~found).sum())
        expect_equal(out, rows, "rows after growth")


@check
def accumulate(lib, rng):
    w, cb, cols = 8, 2, 4
    present, absent = np.split(distinct_keys(rng, 6000), [5000])
    universe = np.concatenate([present, absent])
    order = np.argsort(universe)
    ref = np.zeros((len(universe), w), np.float32)
    ref[: len(present)] = rng.integers(-50, 50, (len(present), w))
    stored = np.arange(len(universe)) < len(present)
    defaults = np.arange(w, dtype=np.float32) * 10
    with Table(lib, w) as t:
        t.insert(present, ref[: len(present)])
        for insert_missing in (False, True):
            keys = np.concatenate([present[rng.integers(0, 5000, 20_000)], absent[rng.integers(0, 1000, 3000)]])
            deltas = rng.integers(-8, 8, (len(keys), cols)).astype(np.float32)  # integers: exact in any order
            t.accumulate(keys, deltas, col_begin=cb, defaults=defaults, insert_missing=insert_missing)
            pos = order[np.searchsorted(universe[order], keys)]
            if insert_missing:
                new = np.unique(pos[~stored[pos]])
                ref[new], stored[new] = defaults, True
            keep = stored[pos]
            view = ref[:, cb : cb + cols]
            np.add.at(view, pos[keep], deltas[keep])
            out, found = t.find(universe)
            what = "insert_missing=%s" % insert_missing
            expect(np.array_equal(found, stored), what + ": found flags")
            expect_equal(out[stored], ref[stored], what + ": rows")
            expect(t.stats()["size"] == stored.sum(), what + ": size")


@check
def remove(lib, rng):
    w = 4
    keys = distinct_keys(rng, 11_000)
    keys, absent = keys[:10_000], keys[10_000:]
    vals = rng.standard_normal((len(keys), w)).astype(np.float32)
    with Table(lib, w) as t:
        t.insert(keys, vals)
        batch = np.concatenate([keys[:3000], keys[:100], absent[:500]])  # duplicates and absent keys
        n = t.remove(batch)
        expect(n == 3000, "remove returned %d, want 3000" % n)
        expect(t.stats()["size"] == 7000, "size %d after remove, want 7000" % t.stats()["size"])
        expect(not t.find(keys[:3000])[1].any(), "removed keys still found")
        out, found = t.find(keys[3000:])
        expect(found.all() and np.array_equal(out, vals[3000:]), "other keys hurt by remove")
        expect(t.remove(keys[:3000]) == 0, "removing again must remove nothing")
        vals2 = rng.standard_normal((3000, w)).astype(np.float32)
        t.insert(keys[:3000], vals2)
        out, found = t.find(keys[:3000])
        expect(found.all() and np.array_equal(out, vals2), "reinserted keys")
        expect(t.stats()["size"] == 10_000, "size after reinsertion")


@check
def export(lib, rng):
    w = 6
    pool = distinct_keys(rng, 3000)
    ref_rows, ref_ver, ref_freq = {}, {}, {}
    with Table(lib, w) as t:
        for v in range(4):
            keys = pool[rng.integers(0, 2500, 5000)]
            vals = rng.standard_normal((len(keys), w)).astype(np.float32)
            t.insert(keys, vals, count=True, version=100 + v)
            for k, row in zip(keys.tolist(), vals):
                ref_rows[k], ref_ver[k], ref_freq[k] = row, 100 + v, ref_freq.get(k, 0) + 1
        keys = pool[rng.integers(0, 3000, 4000)]  # find_or_insert counts too (new keys: the constant 0.5)
        t.find_or_insert(keys, init=(0, 0.5, 0.0, 0, 0), count=True, version=200)
        for k in keys.tolist():
            ref_rows.setdefault(k, np.full(w, 0.5, np.float32))
            ref_ver[k], ref_freq[k] = 200, ref_freq.get(k, 0) + 1
        ek, er, ev, ef = t.export()
        want_keys = np.array(sorted(ref_rows), np.int64)
        expect(np.array_equal(ek, want_keys), "exported keys differ (%d vs %d)" % (len(ek), len(want_keys)))
        expect_equal(er, np.stack([ref_rows[k] for k in want_keys.tolist()]), "exported rows")
        expect(np.array_equal(ev, [ref_ver[k] for k in want_keys.tolist()]), "exported versions")
        expect(np.array_equal(ef, [ref_freq[k] for k in want_keys.tolist()]), "exported frequencies")
        expect(np.array_equal(t.export(col_begin=1, cols=3)[1], er[:, 1:4]), "export of columns [1, 4)")
        try:
            t.export(max_n=len(want_keys) - 1)
            expect(False, "export into too small arrays must fail")
        except GpuError:
            pass


@check
def apply_optimizers(lib, rng):
    adam_h = [[F(0.9) ** t, F(0.999) ** t, 0.01, 0.9, 0.999, 1e-7] for t in (1, 2, 3)]
    cases = [
        ("adagrad", "", adagrad_ref, [[0.1]] * 3),
        ("rowwise_adagrad", "", rowwise_adagrad_ref, [[0.1]] * 3),
        ("adam", "", adam_ref, adam_h),
        ("ftrl", " (lr_power -0.5)", ftrl_ref, [[0.05, 0.001, 0.01, 0.0, -0.5]] * 3),
        ("ftrl", " (lr_power -0.6, l2_shrinkage)", ftrl_ref, [[0.05, 0.001, 0.01, 0.02, -0.6]] * 3),
    ]
    for name, variant, ref_fn, steps in cases:
        for dim in (1, 8):
            # Ftrl's pow (the scalar path, or lr_power != -0.5): CUDA's powf is within 4 ulp, and linear's
            # sigma / lr * var turns one ulp of pow(accum) into up to ~1e-5.
            atol = 2e-4 if name == "ftrl" and (dim == 1 or steps[0][4] != -0.5) else 1e-6
            what = "%s%s dim %d" % (name, variant, dim)
            keys = distinct_keys(rng, 3000)
            rows0 = np.concatenate(
                [rng.standard_normal((2000, dim)), rng.uniform(0.1, 1, (2000, dim)), rng.uniform(0, 0.1, (2000, dim))],
                axis=1,
            ).astype(np.float32)
            defaults = np.concatenate([np.zeros(dim), np.full(dim, 0.1), np.zeros(dim)]).astype(np.float32)
            ref = dict(zip(keys[:2000].tolist(), rows0))  # keys[2000:] start absent: Apply inserts defaults
            with Table(lib, 3 * dim) as t:
                t.insert(keys[:2000], rows0)
                for h in steps:
                    batch = rng.permutation(keys)[:2000]
                    grads = rng.standard_normal((len(batch), dim)).astype(np.float32)
                    t.apply(name, h, dim, batch, grads, defaults=defaults)
                    rows = np.stack([ref.get(k, defaults) for k in batch.tolist()]).astype(np.float32)
                    ref_fn(rows, grads, h, dim)
                    ref.update(zip(batch.tolist(), rows))
                probe = np.array(list(ref), np.int64)
                out, found = t.find(probe)
                want = np.stack([ref[k] for k in probe.tolist()])
                expect(found.all() and t.stats()["size"] == len(ref), what + ": keys")
                bad = ~np.isclose(out, want, rtol=1e-5, atol=atol)
                expect(
                    not bad.any(), "%s: %d values off, e.g. %s vs %s" % (what, bad.sum(), out[bad][:3], want[bad][:3])
                )
                dup = np.concatenate([probe[:10], probe[:1]])
                before = t.find(probe)[0]
                try:
                    t.apply(name, steps[0], dim, dup, np.ones((len(dup), dim), np.float32))
                    expect(False, what + ": duplicate keys must be rejected")
                except GpuError as e:
                    expect("distinct" in str(e), what + ": error should mention 'distinct': %s" % e)
                expect(np.array_equal(t.find(probe)[0], before), what + ": a rejected apply changed rows")


@check
def capped_lru(lib, rng):
    w, limit = 4, 4096
    keys = distinct_keys(rng, 20_000)
    ref_rows, ref_ver = {}, {}
    with Table(lib, w, capacity_limit=limit, policy=LRU) as t:
        cap = t.stats()["capacity"]
        expect(cap == limit, "capacity %d != %d" % (cap, limit))
        prev = keys[:0]
        for v, chunk in enumerate(np.array_split(keys, 40), start=1):  # 500 new keys + 50 rewrites a batch
            batch = np.concatenate([chunk, prev[:50]])
            vals = rng.standard_normal((len(batch), w)).astype(np.float32)
            t.insert(batch, vals, version=v)
            for k, row in zip(batch.tolist(), vals):
                ref_rows[k], ref_ver[k] = row, v
            prev = chunk
        s = t.stats()
        expect(s["size"] <= limit and s["evicted"] > 0 and s["failed"] == 0, "stats %s" % s)
        ek, er, ev, _ = t.export()
        expect(len(ek) == s["size"], "exported %d != size %d" % (len(ek), s["size"]))
        expect_equal(er, np.stack([ref_rows[k] for k in ek.tolist()]), "rows of surviving keys")
        expect(np.array_equal(ev, [ref_ver[k] for k in ek.tolist()]), "versions of surviving keys")
        expect(t.find(prev)[1].all(), "the last batch's keys must all be present")
        # LRU, per bucket: no evicted key was written after a surviving key of its bucket.
        all_keys = np.array(list(ref_ver), np.int64)
        vers = np.array([ref_ver[k] for k in all_keys.tolist()])
        bucket = (fmix64(all_keys) & np.uint64(cap - 1)) >> np.uint64(7)
        alive = np.isin(all_keys, ek)
        for b in np.unique(bucket):
            m = bucket == b
            if (m & ~alive).any():
                expect(vers[m & ~alive].max() <= vers[m & alive].min(), "bucket %d evicted a newer key" % b)


@check
def capped_lfu(lib, rng):
    w, limit = 4, 4096
    hot, cold = np.split(distinct_keys(rng, 20_256), [256])
    with Table(lib, w, capacity_limit=limit, policy=LFU) as t:
        hot_vals = rng.standard_normal((len(hot), w)).astype(np.float32)
        for _ in range(10):
            t.insert(hot, hot_vals, count=True)
        for chunk in np.array_split(cold, 40):
            t.insert(chunk, np.ones((len(chunk), w), np.float32), count=True)
        s = t.stats()
        expect(s["size"] <= limit and s["evicted"] > 0, "stats %s" % s)
        out, found = t.find(hot)
        expect(found.all(), "%d frequent keys evicted by keys seen once" % (~found).sum())
        expect(np.array_equal(out, hot_vals), "rows of the frequent keys")


@check
def clear(lib, rng):
    for capacity_limit in (0, 4096):
        with Table(lib, 4, capacity_limit=capacity_limit) as t:
            keys = distinct_keys(rng, 3000)
            t.insert(keys, np.ones((len(keys), 4), np.float32))
            t.clear()
            s = t.stats()
            expect(s["size"] == 0 and s["used"] == 0, "stats after clear: %s" % s)
            expect(not t.find(keys)[1].any(), "keys found after clear")
            expect(len(t.export(max_n=10)[0]) == 0, "export after clear")
            t.insert(keys[:10], np.full((10, 4), 2, np.float32))
            out, found = t.find(keys[:10])
            expect(found.all() and (out == 2).all() and t.stats()["size"] == 10, "insert after clear")


# What one ulp of a storage is, relative to a value (bfloat16: 8 significant bits, float16: 11).
STORAGE_RTOL = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


@check
def compact_rows(lib, rng):
    """bfloat16 / float16 rows: insert and find_or_insert's given rows round to nearest, initialized rows by the
    table's (stochastic) rounding, accumulate after each addition, export decodes, growth copies rows, row bytes."""
    dim, w = 8, 9  # compact values + one float32 column (a row-wise accumulator)
    for storage in ("bfloat16", "float16"):
        what = storage + ": "
        with Table(lib, w, 1000, storage=storage, compact_cols=dim, rounding=STOCHASTIC) as t:
            expect(t.stats()["row_bytes"] == 2 * dim + 4, what + "row bytes %d" % t.stats()["row_bytes"])
            keys = distinct_keys(rng, 200_000)  # grows from 1000 keys: rehash copies compact rows
            vals = rng.standard_normal((len(keys), w)).astype(np.float32)
            t.insert(keys, vals, version=1)
            want = round_rows(storage, vals, dim)
            out, found = t.find(keys)
            expect(found.all() and t.stats()["capacity"] > 2048, what + "keys after growth")
            expect_equal(out, want, what + "inserted rows (nearest)")
            expect_equal(t.find(keys, col_begin=5, cols=4)[0], want[:, 5:], what + "columns [5, 9)")
            ek, er, ev, _ = t.export()
            order = np.argsort(keys)
            expect(np.array_equal(ek, keys[order]) and (ev == 1).all(), what + "exported keys and versions")
            expect_equal(er, want[order], what + "exported rows")
            # Accumulate: small integers stay exact in both storages, so any order of the duplicates' additions
            # gives the numpy sums; adjacent half columns race on their 32-bit words.
            ints = rng.integers(-50, 50, (len(keys), w)).astype(np.float32)
            t.insert(keys, ints)
            batch = keys[rng.integers(0, 2000, 30_000)]
            deltas = rng.integers(-3, 4, (len(batch), w)).astype(np.float32)
            t.accumulate(batch, deltas)
            ref = dict(zip(keys[:2000].tolist(), ints[:2000].copy()))
            for k, d in zip(batch.tolist(), deltas):
                ref[k] += d
            probe = np.array(list(ref), np.int64)
            expect_equal(t.find(probe)[0], np.stack([ref[k] for k in probe.tolist()]), what + "accumulated rows")
            # Initialized rows: the truncated normal, rounded by the table's stochastic rounding with the bits of
            # (key, version 7, column); given rows (init_kind -1) round to nearest.
            new = distinct_keys(rng, 50_000)
            _, host = initial_rows(lib, new, w)
            out, inserted = t.find_or_insert(new, version=7)
            expect(inserted.all(), what + "inserted flags")
            want_new = round_rows(storage, host, dim, STOCHASTIC, new, 7)
            expect_equal(out, want_new, what + "initialized rows (stochastic), as returned")
            expect_equal(t.find(new)[0], want_new, what + "initialized rows (stochastic), as stored")
            given = rng.standard_normal((1000, w)).astype(np.float32)
            fresh = distinct_keys(rng, 1000)
            out, _ = t.find_or_insert(fresh, init=given, version=8)
            expect_equal(out, round_rows(storage, given, dim), what + "given new rows (nearest)")


@check
def compact_apply(lib, rng):
    """The fused Adagrad, row-wise Adagrad and Adam steps on bfloat16 / float16 rows (the variable compact, or the whole row):
    numpy's step, then the row rounded by the stochastic rounding with the bits of (key, step, column). numpy's
    float32 math may differ from the device's in the last bit, which can move a rounded value by one ulp of the
    storage: at least 99% of the values must equal numpy's bit for bit, all within two ulps. Two tables given the
    same steps hold the same bits."""
    dim = 8
    adam_h = [[F(0.9) ** t, F(0.999) ** t, 0.01, 0.9, 0.999, 1e-7] for t in (1, 2, 3)]
    for name, ref_fn, steps, width in (
        ("adagrad", adagrad_ref, [[0.1]] * 3, 2 * dim),
        ("rowwise_adagrad", rowwise_adagrad_ref, [[0.1]] * 3, dim + 1),  # bfloat16 values + a float32 accumulator
        ("adam", adam_ref, adam_h, 3 * dim),
    ):
        for storage in ("bfloat16", "float16"):
            for compact_cols in (dim, width):
                what = "%s on %s, %d compact columns" % (name, storage, compact_cols)
                keys = distinct_keys(rng, 6000)
                defaults = np.concatenate([np.zeros(dim), np.full(width - dim, 0.1)]).astype(np.float32)
                kw = dict(storage=storage, compact_cols=compact_cols, rounding=STOCHASTIC)
                with Table(lib, width, **kw) as t, Table(lib, width, **kw) as twin:
                    ref = {}
                    stored_defaults = round_rows(storage, defaults[None, :], compact_cols)[0]
                    for step, h in enumerate(steps, start=1):
                        batch = rng.permutation(keys)[:4000]
                        grads = rng.standard_normal((len(batch), dim)).astype(np.float32)
                        t.apply(name, h, dim, batch, grads, defaults=defaults, version=step)
                        twin.apply(name, h, dim, batch, grads, defaults=defaults, version=step)
                        rows = np.stack([ref.get(k, stored_defaults) for k in batch.tolist()]).astype(np.float32)
                        ref_fn(rows, grads, h, dim)
                        rows = round_rows(storage, rows, compact_cols, STOCHASTIC, batch, step)
                        ref.update(zip(batch.tolist(), rows))
                    probe = np.array(list(ref), np.int64)
                    out, found = t.find(probe)
                    want = np.stack([ref[k] for k in probe.tolist()])
                    expect(found.all(), what + ": keys")
                    exact = (out.view(np.uint32) == want.view(np.uint32)).mean()
                    close = np.abs(out - want) <= 2 * STORAGE_RTOL[storage] * np.abs(want) + 1e-6
                    expect(
                        exact >= 0.99 and close.all(),
                        "%s: %.4f of the values bit-exact, %d beyond two ulps, e.g. %s vs %s"
                        % (what, exact, (~close).sum(), out[~close][:3], want[~close][:3]),
                    )
                    expect(np.array_equal(t.export()[1], twin.export()[1]), what + ": two tables differ")


@check
def apply_matches_cpu_core(lib, rng):
    """The fused steps give the CPU core's rows bit for bit (the same formulas, --fmad=false, IEEE sqrt and division)
    on float32 rows and on bfloat16 / float16 rows with stochastic rounding (the whole row compact). Ftrl with
    lr_power -0.5 only: its general path's powf is not correctly rounded on the device."""
    dim = 8
    adam_h = [[F(0.9) ** t, F(0.999) ** t, 0.01, 0.9, 0.999, 1e-7] for t in (1, 2, 3)]
    cases = [
        ("adagrad", [[0.1]] * 3, 2 * dim),
        ("rowwise_adagrad", [[0.1]] * 3, dim + 1),
        ("adam", adam_h, 3 * dim),
        ("ftrl", [[0.05, 0.001, 0.01, 0.0, -0.5]] * 3, 3 * dim),
    ]
    for name, steps, width in cases:
        for storage in ("float32", "bfloat16", "float16"):
            kw = dict(storage=storage, compact_cols=0 if storage == "float32" else width, rounding=STOCHASTIC)
            keys = distinct_keys(rng, 6000)
            defaults = np.concatenate([np.zeros(dim), np.full(width - dim, 0.1)]).astype(np.float32)
            with Table(lib, width, **kw) as t, CpuTable(lib, width, **kw) as c:
                for step, h in enumerate(steps, start=1):
                    batch = rng.permutation(keys)[:4000]
                    grads = rng.standard_normal((len(batch), dim)).astype(np.float32)
                    t.apply(name, h, dim, batch, grads, defaults=defaults, version=step)
                    c.apply(name, h, dim, batch, grads, defaults=defaults, version=step)
                out, found = t.find(keys)
                want, want_found = c.find(keys)
                what = "%s on %s rows" % (name, storage)
                expect(np.array_equal(found, want_found), what + ": keys")
                expect_equal(out.view(np.uint32), want.view(np.uint32), what + ": rows (bits) against the CPU core")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--lib", help="path to %s (default: $TFEXT_GPU_LIB, build/cuda/, bazel-bin/, else build)" % LIB_NAME
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help="comma-separated check names")
    args = ap.parse_args()
    path = find_lib(args.lib)
    lib = load_lib(path)
    n = lib.tfext_gpu_device_count()
    if n < 1:
        print("FAIL device_count: %s" % (last_error(lib) if n < 0 else "no CUDA device"), flush=True)
        return 1
    print("PASS device_count: %d device(s), harness %s" % (n, path), flush=True)
    only = set(args.only.split(",")) if args.only else None
    failures = 0
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        try:
            fn(lib, np.random.default_rng(args.seed))
            print("PASS", fn.__name__, flush=True)
        except Exception as e:  # every check reports
            failures += 1
            why = str(e) if isinstance(e, (AssertionError, GpuError)) else traceback.format_exc().strip()
            print("FAIL %s: %s" % (fn.__name__, why), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
