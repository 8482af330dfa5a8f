#!/usr/bin/env python3
"""Throughput of the CUDA table (tensorflow_ext/table/gpu) on the GPU, next to the CPU core on the same keys,
through the ctypes harness (tensorflow_ext/embedding/kernels/gpu/gpu_table_harness.cu.cc). Needs only python3 and
numpy (no TensorFlow):

    make cuda && python3 tools/gpu/bench_gpu_table.py --json bench_gpu.json
    python3 tools/gpu/bench_gpu_table.py --quick                  # one small configuration

The library is found as tools/gpu/test_gpu_table.py finds it (--lib, $TFEXT_GPU_LIB, build/cuda/, bazel-bin/, else
built like `make cuda`).

GPU figures: device time of one call (CUDA events on the table's stream, tfext_gpu_time) on arrays already on the
device, so PCIe copies are not counted; the host round trip inside a write (one read of the table's counters for
its load check) is.
Each table has a fixed number of slots (default 2^23) and is prefilled (untimed) to the load factor asked for, with
room left so that no timed call rehashes (checked: the capacity is printed before and after). Timed, with --keys
keys per call: find, insert (assign: existing keys), accumulate (existing keys), find_or_insert (new keys; the table
is cleared and prefilled again before each repeat, so every call starts at the same load), apply_adam (a separate
table of width 3 * dim, existing distinct keys). keys/s = keys / (median ms / 1e3), median of --repeats calls after
one warm-up call. --storages: the same for each row storage; a bfloat16 / float16 table stores the dim value
columns compactly (Adam's two slots stay float32) with stochastic rounding. CPU figures (float32 rows only): the CPU
core (tfext_cpu_time, wall time on --threads host threads), prefilled with the same keys: find, insert,
find_or_insert (fresh keys per repeat: its table grows by --keys per repeat).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from numpy_reference import STOCHASTIC, splitmix64  # noqa: E402
from test_gpu_table import (  # noqa: E402
    STORAGES,
    GpuError,
    Table,
    find_lib,
    last_error,
    load_lib,
    ptr,
)

MAX_LOAD_FACTOR = 0.95  # the largest the table accepts: the most room above the prefill for the timed batches
# HierarchicalKV's published figures on an A100-80GB (1M keys per call, load factor 0.5, dim 8-64), keys/s.
HKV_A100 = {"find": (2.0e9, 2.5e9), "insert": (0.8e9, 1.1e9)}  # insert: HKV's insert_or_assign
HKV_NOTE = "HierarchicalKV, A100-80GB, 1M keys/call, load 0.5, dim 8-64"
TARGET_DIM, TARGET_LOAD = 16, 0.5
TARGETS = {"find": 4.0e9, "insert": 1.5e9}  # keys/s on an H100 at dim 16, load 0.5
ADAM_VS_FIND = 1.5  # fused Adam apply: at most 1.5x the time of a find of the same keys
GPU_OPS = ("find", "insert", "accumulate", "find_or_insert", "apply_adam")
CPU_OPS = ("find", "insert", "find_or_insert")


def distinct_keys(n, salt):
    """n distinct pseudo-random int64 keys (a bijection of 0..n-1)."""
    return splitmix64(np.arange(n, dtype=np.uint64) + np.uint64(salt << 44)).view(np.int64)


def fmt_rate(r):
    if r is None:
        return "-"
    return "%.2f B" % (r / 1e9) if r >= 1e9 else "%.0f M" % (r / 1e6)


def device_name():
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


class Device:
    """Device arrays (tfext_gpu_upload), freed together."""

    def __init__(self, lib):
        self.lib, self.ptrs = lib, []

    def upload(self, host=None, nbytes=None):
        p = self.lib.tfext_gpu_upload(ptr(host), host.nbytes if host is not None else nbytes)
        if not p:
            raise GpuError("upload: " + last_error(self.lib))
        self.ptrs.append(p)
        return p

    def free(self):
        for p in self.ptrs:
            self.lib.tfext_gpu_free(p)
        self.ptrs = []


def gpu_time(lib, table, op, d_keys, n, cols, d_values=None, d_out=None):
    ms = lib.tfext_gpu_time(table.h, op.encode(), d_keys, n, cols, d_values, d_out)
    if ms < 0:
        raise GpuError("%s: %s" % (op, last_error(lib)))
    return ms


def cpu_time(lib, table, op, keys, cols, values, out, threads):
    ms = lib.tfext_cpu_time(table, op.encode(), ptr(keys), len(keys), cols, ptr(values), ptr(out), threads)
    if ms < 0:
        raise GpuError("cpu %s: %s" % (op, last_error(lib)))
    return ms


def repeat(fn, repeats):
    fn()  # warm-up
    return [fn() for _ in range(repeats)]


def bench_config(lib, args, dim, load, storage, rng):
    slots, n = 1 << args.slots_log2, args.keys
    prefill_n = int(load * slots)
    if prefill_n < n:
        raise SystemExit("load %.2f of %d slots is fewer than --keys %d keys to time" % (load, slots, n))
    cpu_fresh = n * (args.cpu_repeats + 1)
    keys = distinct_keys(prefill_n + max(n, cpu_fresh), salt=dim)
    prefill, new = keys[:prefill_n], keys[prefill_n:]
    existing = prefill[rng.choice(prefill_n, n, replace=False)]
    values = (0.01 * rng.standard_normal((n, dim))).astype(np.float32)
    if prefill_n + n > MAX_LOAD_FACTOR * slots:
        print(
            "warning: load %.2f + %d keys per call exceeds %.2f of %d slots: timed writes may rehash"
            % (load, n, MAX_LOAD_FACTOR, slots)
        )
    initial_capacity = int(MAX_LOAD_FACTOR * (slots - 2))  # RoundUpSlots(initial_capacity / mlf + 1) == slots
    dev = Device(lib)
    results = {}
    try:
        d_prefill, d_existing, d_new = dev.upload(prefill), dev.upload(existing), dev.upload(new[:n])
        d_values, d_out = dev.upload(values), dev.upload(nbytes=values.nbytes)

        def fill(table):
            for off in range(0, prefill_n, n):
                gpu_time(lib, table, "insert", d_prefill + 8 * off, min(n, prefill_n - off), dim, d_values)

        def timed(table, op, d_keys, d_in=None, d_out=None):
            return repeat(lambda: gpu_time(lib, table, op, d_keys, n, dim, d_in, d_out), args.repeats)

        compact = dict(storage=storage, compact_cols=0 if storage == "float32" else dim, rounding=STOCHASTIC)
        with Table(lib, dim, initial_capacity, MAX_LOAD_FACTOR, **compact) as t:
            cap0, row_bytes = t.stats()["capacity"], t.stats()["row_bytes"]
            fill(t)
            s = t.stats()
            ms = {"find": timed(t, "find", d_existing, None, d_out), "insert": timed(t, "insert", d_existing, d_values)}
            ms["accumulate"] = timed(t, "accumulate", d_existing, d_values)

            def find_or_insert_fresh():  # new keys at the same load every time: clear and prefill first
                t.clear()
                fill(t)
                return gpu_time(lib, t, "find_or_insert", d_new, n, dim, None, d_out)

            ms["find_or_insert"] = repeat(find_or_insert_fresh, args.repeats)
            cap1 = t.stats()["capacity"]
        with Table(lib, 3 * dim, initial_capacity, MAX_LOAD_FACTOR, **compact) as t:
            fill(t)  # var columns; the Adam slots start at 0
            ms["apply_adam"] = timed(t, "apply_adam", d_existing, d_values)
            cap1 = max(cap1, t.stats()["capacity"])
    finally:
        dev.free()
    print(
        "%s rows (%d bytes), dim %d, load %.2f: %d slots (capacity %d after prefill, %d at the end), %d keys "
        "prefilled, load %.4f"
        % (storage, row_bytes, dim, load, cap0, s["capacity"], cap1, s["size"], s["size"] / s["capacity"]),
        flush=True,
    )
    for op in GPU_OPS:
        med = statistics.median(ms[op])
        results[op] = {"gpu_ms": med, "gpu_ms_all": ms[op], "gpu_keys_per_s": n / (med / 1e3)}
    if not args.no_cpu and storage == "float32":
        for op, r in bench_cpu(lib, args, dim, prefill, existing, new, values).items():
            results[op].update(r)
    rows = []
    for op in GPU_OPS:
        r = dict(op=op, storage=storage, row_bytes=row_bytes, dim=dim, load=load, keys=n, slots=slots)
        r.update(capacity_before=cap0, capacity_after=cap1)
        r.update(results[op])
        rows.append(r)
    return rows


def bench_cpu(lib, args, dim, prefill, existing, new, values):
    n, threads = args.keys, args.threads
    t = lib.tfext_cpu_table_create(dim, len(prefill) + n * (args.cpu_repeats + 1), STORAGES["float32"], 0, 0)
    if not t:
        raise GpuError("cpu create: " + last_error(lib))
    out = np.zeros_like(values)
    try:
        for off in range(0, len(prefill), n):
            cpu_time(lib, t, "insert", prefill[off : off + n], dim, values, None, threads)
        ms = {}
        for op in ("find", "insert"):
            ms[op] = repeat(lambda: cpu_time(lib, t, op, existing, dim, values, out, threads), args.cpu_repeats)
        fresh = iter(range(args.cpu_repeats + 1))

        def find_or_insert_fresh():
            batch = new[next(fresh) * n :][:n]
            return cpu_time(lib, t, "find_or_insert", batch, dim, None, out, threads)

        ms["find_or_insert"] = repeat(find_or_insert_fresh, args.cpu_repeats)
    finally:
        lib.tfext_cpu_table_destroy(t)
    res = {}
    for op, v in ms.items():
        med = statistics.median(v)
        res[op] = {"cpu_ms": med, "cpu_ms_all": v, "cpu_keys_per_s": n / (med / 1e3), "cpu_threads": threads}
    return res


def report(rows, device, threads):
    print()
    print("find_or_insert: new keys; GPU: the table is cleared and prefilled before each call (same load every call);")
    print("CPU: fresh keys per call (its table grows by one batch per call). insert: existing keys (assign).")
    print()
    print(
        "| op | storage | dim | load | GPU ms | GPU keys/s | CPU keys/s (%d thr) | GPU/CPU | %s |" % (threads, HKV_NOTE)
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        cpu = r.get("cpu_keys_per_s")
        hkv = HKV_A100.get(r["op"]) if r["storage"] == "float32" else None
        print(
            "| %s | %s | %d | %.2f | %.3f | %s | %s | %s | %s |"
            % (
                r["op"],
                r["storage"],
                r["dim"],
                r["load"],
                r["gpu_ms"],
                fmt_rate(r["gpu_keys_per_s"]),
                fmt_rate(cpu),
                "%.1fx" % (r["gpu_keys_per_s"] / cpu) if cpu else "-",
                "%.1f-%.1f B" % (hkv[0] / 1e9, hkv[1] / 1e9) if hkv else "-",
            )
        )
    print()
    targets = []
    by = {(r["op"], r["dim"], r["load"]): r for r in rows if r["storage"] == "float32"}
    on = "" if "H100" in device else " (target set for an H100; this is %s)" % device
    for op, want in TARGETS.items():
        r = by.get((op, TARGET_DIM, TARGET_LOAD))
        name = "%s >= %s keys/s at dim %d, load %.1f%s" % (op, fmt_rate(want), TARGET_DIM, TARGET_LOAD, on)
        if r is None:
            targets.append(("SKIP", name, "not measured"))
        else:
            got = r["gpu_keys_per_s"]
            targets.append(("PASS" if got >= want else "FAIL", name, "%s keys/s" % fmt_rate(got)))
    for (op, dim, load), r in sorted(by.items()):
        if op == "apply_adam":
            ratio = r["gpu_ms"] / by[("find", dim, load)]["gpu_ms"]
            name = "apply_adam within %.1fx of find, dim %d, load %.2f" % (ADAM_VS_FIND, dim, load)
            targets.append(("PASS" if ratio <= ADAM_VS_FIND else "FAIL", name, "%.2fx" % ratio))
    for status, name, got in targets:
        print("%s %s: %s" % (status, name, got))
    return [{"status": s, "target": n, "measured": g} for s, n, g in targets]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="path to libtfext_gpu_table.so")
    ap.add_argument("--keys", type=int, default=1_000_000, help="keys per timed call (default 1M)")
    ap.add_argument("--dims", default="8,16,32,64")
    ap.add_argument("--loads", default="0.5,0.75", help="load factors after prefill")
    ap.add_argument("--storages", default="float32", help="row storages: float32, bfloat16, float16 (comma-separated)")
    ap.add_argument("--repeats", type=int, default=5, help="timed GPU calls per figure, after one warm-up")
    ap.add_argument("--cpu-repeats", type=int, default=3)
    ap.add_argument("--slots-log2", type=int, default=23, help="slots of each table (default 2^23)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU core threads (default: all)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU core")
    ap.add_argument("--quick", action="store_true", help="dim 16, load 0.5, 2 repeats, 2^20 slots, 100k keys")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict", action="store_true", help="exit status 1 if a target FAILs")
    args = ap.parse_args()
    if args.quick:
        args.dims, args.loads, args.repeats, args.cpu_repeats = "16", "0.5", 2, 2
        args.slots_log2, args.keys = 20, 100_000
    path = find_lib(args.lib)
    lib = load_lib(path)
    count = lib.tfext_gpu_device_count()
    if count < 1:
        print("no CUDA device: %s" % (last_error(lib) if count < 0 else "none found"))
        return 2
    device, cpu = device_name(), cpu_model()
    print("device: %s; CPU: %s (%d threads); harness %s" % (device, cpu, args.threads, path), flush=True)
    rng = np.random.default_rng(args.seed)
    rows = []
    storages = args.storages.split(",")
    unknown = sorted(set(storages) - set(STORAGES))
    if unknown:
        ap.error("--storages: unknown %s (choose from %s)" % (", ".join(unknown), ", ".join(STORAGES)))
    for dim in [int(d) for d in args.dims.split(",")]:
        for load in [float(x) for x in args.loads.split(",")]:
            for storage in storages:
                config_rows = bench_config(lib, args, dim, load, storage, rng)
                # As soon as measured (a run cut short by a time limit keeps them).
                print("  " + ", ".join("%s %s keys/s" % (r["op"], fmt_rate(r["gpu_keys_per_s"])) for r in config_rows))
                rows += config_rows
    targets = report(rows, device, args.threads)
    if args.json:
        doc = {
            "device": device,
            "cpu": cpu,
            "cpu_threads": args.threads,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "lib": path,
            "method": __doc__[__doc__.index("GPU figures") :].strip(),
            "hkv_reference": {"note": HKV_NOTE, **{op: list(r) for op, r in HKV_A100.items()}},
            "results": rows,
            "targets": targets,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", args.json)
    return 1 if args.strict and any(t["status"] == "FAIL" for t in targets) else 0


if __name__ == "__main__":
    sys.exit(main())
