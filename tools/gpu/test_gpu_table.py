#!/usr/bin/env python3
"""Checks the CUDA table (tensorflow_ext/table/gpu) against a numpy reference, through the ctypes harness.

Run on a machine with an NVIDIA GPU (sm_80 / sm_90); needs only numpy (no TensorFlow):

    make cuda && python tools/gpu/test_gpu_table.py            # build/cuda/libtfext_gpu_table.so
    python tools/gpu/test_gpu_table.py --lib path/to/libtfext_gpu_table.so

Without --lib it looks for $TFEXT_GPU_LIB, build/cuda/, bazel-bin/ and, failing those, compiles the harness with
nvcc into a temporary directory. Exit status 0 = all checks passed; prints one line per check.
"""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_DIR = os.path.join(ROOT, "tensorflow_ext", "table", "gpu")
INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max


def build_with_nvcc(out_dir):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    lib = os.path.join(out_dir, "libtfext_gpu_table.so")
    cmd = [
        nvcc,
        "-std=c++17",
        "-O3",
        "-x",
        "cu",
        "-Xcompiler",
        "-fPIC",
        "-shared",
        "-I",
        ROOT,
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-o",
        lib,
        os.path.join(GPU_DIR, "gpu_hash_table.cu.cc"),
        os.path.join(GPU_DIR, "gpu_harness.cu.cc"),
    ]
    print("building:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return lib


def find_lib(arg):
    for cand in [
        arg,
        os.environ.get("TFEXT_GPU_LIB"),
        os.path.join(ROOT, "build", "cuda", "libtfext_gpu_table.so"),
        os.path.join(ROOT, "bazel-bin", "tensorflow_ext", "table", "gpu", "libtfext_gpu_table.so"),
    ]:
        if cand and os.path.exists(cand):
            return cand
    return build_with_nvcc(tempfile.mkdtemp(prefix="tfext_gpu_"))


class GpuTable:
    def __init__(self, lib, capacity, width):
        self.lib, self.width = lib, width
        self.h = lib.tfext_gpu_table_create(capacity, width)
        if not self.h:
            raise RuntimeError("create failed: " + lib.tfext_gpu_last_error().decode())

    def _check(self, rc, what):
        if rc < 0:
            raise RuntimeError("%s failed: %s" % (what, self.lib.tfext_gpu_last_error().decode()))
        return rc

    def insert(self, keys, values):
        keys = np.ascontiguousarray(keys, np.int64)
        values = np.ascontiguousarray(values, np.float32).reshape(len(keys), self.width)
        return self._check(
            self.lib.tfext_gpu_table_insert(self.h, keys.ctypes.data, len(keys), values.ctypes.data), "insert"
        )

    def find(self, keys, default=None):
        keys = np.ascontiguousarray(keys, np.int64)
        out = np.empty((len(keys), self.width), np.float32)
        found = np.empty(len(keys), np.uint8)
        d = None if default is None else np.ascontiguousarray(default, np.float32)
        self._check(
            self.lib.tfext_gpu_table_find(
                self.h,
                keys.ctypes.data,
                len(keys),
                None if d is None else d.ctypes.data,
                out.ctypes.data,
                found.ctypes.data,
            ),
            "find",
        )
        return out, found.astype(bool)

    def size(self):
        return self._check(self.lib.tfext_gpu_table_size(self.h), "size")

    def capacity(self):
        return self.lib.tfext_gpu_table_capacity(self.h)

    def clear(self):
        self._check(self.lib.tfext_gpu_table_clear(self.h), "clear")

    def close(self):
        self.lib.tfext_gpu_table_destroy(self.h)
        self.h = None


def load(path):
    lib = ctypes.CDLL(path)
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.tfext_gpu_last_error.restype = ctypes.c_char_p
    lib.tfext_gpu_device_count.restype = ctypes.c_int
    lib.tfext_gpu_table_create.restype = vp
    lib.tfext_gpu_table_create.argtypes = [i64, i64]
    lib.tfext_gpu_table_destroy.argtypes = [vp]
    lib.tfext_gpu_table_capacity.restype = i64
    lib.tfext_gpu_table_capacity.argtypes = [vp]
    lib.tfext_gpu_table_insert.restype = i64
    lib.tfext_gpu_table_insert.argtypes = [vp, vp, i64, vp]
    lib.tfext_gpu_table_find.restype = ctypes.c_int
    lib.tfext_gpu_table_find.argtypes = [vp, vp, i64, vp, vp, vp]
    lib.tfext_gpu_table_size.restype = i64
    lib.tfext_gpu_table_size.argtypes = [vp]
    lib.tfext_gpu_table_clear.restype = ctypes.c_int
    lib.tfext_gpu_table_clear.argtypes = [vp]
    return lib


class Reference:
    """dict-of-rows model: upsert, last occurrence of a key in a batch wins."""

    def __init__(self, width):
        self.width, self.rows = width, {}

    def insert(self, keys, values):
        for k, v in zip(keys.tolist(), values.reshape(len(keys), self.width)):
            self.rows[k] = v.copy()

    def find(self, keys, default):
        out = np.empty((len(keys), self.width), np.float32)
        found = np.zeros(len(keys), bool)
        for i, k in enumerate(keys.tolist()):
            if k in self.rows:
                out[i], found[i] = self.rows[k], True
            else:
                out[i] = 0.0 if default is None else default
        return out, found


CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def compare(t, ref, keys, default, what):
    got, got_found = t.find(keys, default)
    want, want_found = ref.find(keys, default)
    assert np.array_equal(got_found, want_found), "%s: found flags differ at %s" % (
        what,
        np.nonzero(got_found != want_found)[0][:10],
    )
    assert np.array_equal(got, want), "%s: rows differ at %s" % (what, np.nonzero((got != want).any(1))[0][:10])
    assert t.size() == len(ref.rows), "%s: size %d != %d" % (what, t.size(), len(ref.rows))


@check
def basic_upsert_and_find(lib, rng):
    for width in (1, 16, 33, 64, 130):
        t, ref = GpuTable(lib, 4096, width), Reference(width)
        keys = np.unique(rng.integers(INT64_MIN, INT64_MAX, 2000, dtype=np.int64))
        keys = np.concatenate([keys, np.array([0, -1, 1, INT64_MAX, INT64_MIN], np.int64)])
        keys = np.unique(keys)
        vals = rng.standard_normal((len(keys), width)).astype(np.float32)
        assert t.insert(keys, vals) == 0
        ref.insert(keys, vals)
        default = rng.standard_normal(width).astype(np.float32)
        probe = np.concatenate([keys, rng.integers(INT64_MIN, INT64_MAX, 1000, dtype=np.int64)])
        rng.shuffle(probe)
        compare(t, ref, probe, default, "width %d" % width)
        compare(t, ref, probe, None, "width %d, zero default" % width)
        # overwrite half of them
        half = keys[::2]
        v2 = rng.standard_normal((len(half), width)).astype(np.float32)
        assert t.insert(half, v2) == 0
        ref.insert(half, v2)
        compare(t, ref, probe, default, "width %d after upsert" % width)
        t.close()


@check
def duplicates_last_occurrence_wins(lib, rng):
    width = 8
    t, ref = GpuTable(lib, 1 << 12, width), Reference(width)
    for _ in range(5):
        keys = rng.integers(0, 300, 3000).astype(np.int64)  # many duplicates within the batch
        keys[::97] = INT64_MIN
        vals = rng.standard_normal((len(keys), width)).astype(np.float32)
        assert t.insert(keys, vals) == 0
        ref.insert(keys, vals)
        compare(t, ref, np.arange(-5, 305, dtype=np.int64), None, "duplicates")
        compare(t, ref, np.array([INT64_MIN], np.int64), None, "empty-key marker as a key")
    t.close()


@check
def empty_batches_and_clear(lib, rng):
    t, ref = GpuTable(lib, 0, 4), Reference(4)
    assert t.capacity() >= 32
    assert t.insert(np.zeros(0, np.int64), np.zeros((0, 4), np.float32)) == 0
    out, found = t.find(np.zeros(0, np.int64))
    assert out.shape == (0, 4) and found.shape == (0,)
    keys = np.arange(20, dtype=np.int64)
    vals = rng.standard_normal((20, 4)).astype(np.float32)
    t.insert(keys, vals)
    ref.insert(keys, vals)
    compare(t, ref, keys, None, "small")
    t.clear()
    ref = Reference(4)
    compare(t, ref, keys, None, "after clear")
    t.close()


@check
def full_table_reports_failures(lib, rng):
    t = GpuTable(lib, 64, 2)
    cap = t.capacity()
    keys = np.arange(1, cap + 11, dtype=np.int64)
    vals = rng.standard_normal((len(keys), 2)).astype(np.float32)
    failed = t.insert(keys, vals)
    assert failed == 10, "expected 10 failed inserts into a table of %d, got %d" % (cap, failed)
    assert t.size() == cap
    out, found = t.find(keys)
    assert found.sum() == cap
    assert np.array_equal(out[found], vals[found])
    t.close()


@check
def large_batch_high_load(lib, rng):
    width = 16
    n = 1_000_000
    t, ref_keys = GpuTable(lib, 1 << 20, width), None
    keys = np.unique(rng.integers(INT64_MIN, INT64_MAX, int(n * 1.01), dtype=np.int64))[: int(0.9 * (1 << 20))]
    rng.shuffle(keys)
    vals = rng.standard_normal((len(keys), width)).astype(np.float32)
    t0 = time.time()
    assert t.insert(keys, vals) == 0
    out, found = t.find(keys)
    dt = time.time() - t0
    assert found.all() and np.array_equal(out, vals)
    missing = rng.integers(INT64_MIN, INT64_MAX, 10000, dtype=np.int64)
    missing = missing[~np.isin(missing, keys)]
    _, found = t.find(missing)
    assert not found.any()
    assert t.size() == len(keys)
    t.close()
    print("    %d keys at load 0.9: insert+find round trip %.3f s (incl. host copies)" % (len(keys), dt))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path to libtfext_gpu_table.so")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    path = find_lib(args.lib)
    lib = load(path)
    n = lib.tfext_gpu_device_count()
    if n <= 0:
        print("no CUDA device available (%s)" % lib.tfext_gpu_last_error().decode())
        return 2
    print("harness %s, %d device(s)" % (path, n))
    failures = 0
    for fn in CHECKS:
        rng = np.random.default_rng(args.seed)
        try:
            fn(lib, rng)
            print("PASS", fn.__name__, flush=True)
        except Exception as e:  # report every check
            failures += 1
            print("FAIL", fn.__name__, "-", e, flush=True)
    print("%d/%d checks passed" % (len(CHECKS) - failures, len(CHECKS)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
