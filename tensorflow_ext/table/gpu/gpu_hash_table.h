// tensorflow_ext table, CUDA build of the core's find / insert.
//
// A GPU hash table from int64 keys to rows of `width` float32, for batched lookups and upserts on device memory:
//  * open addressing, linear probing over a power-of-two array of int64 keys; a slot is claimed with atomicCAS
//    on its key, so concurrent inserts of different keys never lose one another;
//  * rows live beside the keys (values[slot * width + c]);
//  * every int64 is a valid key: the empty-slot marker kEmptyKey (INT64_MIN) is itself stored in a dedicated extra
//    row (index `capacity`), as the CPU core accepts arbitrary keys too;
//  * batched kernels: one warp per key (lane 0 probes, the warp copies the row's columns, coalesced).
//
// Semantics: Insert is an upsert. Duplicate keys within one Insert batch: the last occurrence wins, as in the CPU
// core (claim kernel records per slot the highest batch index with atomicMax, only that occurrence writes its
// row, a third kernel resets the marks). The table does not
// grow: an Insert that finds no free slot leaves the key out and counts it in the returned failure count (size the
// table with headroom, e.g. capacity >= 1.25 x keys). Find and Insert must not run concurrently on one table
// (no reader/writer ordering across kernels of different streams).
//
// Built only with --config=cuda (Bazel) or `make cuda`; tools/gpu/test_gpu_table.py checks it against numpy.

#ifndef TENSORFLOW_EXT_TABLE_GPU_GPU_HASH_TABLE_H_
#define TENSORFLOW_EXT_TABLE_GPU_GPU_HASH_TABLE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "tensorflow_ext/table/core/mix.h"
#include "tensorflow_ext/table/core/table_limits.h"

namespace tfext {
namespace table {
namespace gpu {

constexpr int64_t kEmptyKey = INT64_MIN;

struct GpuHashTable {
  int64_t* keys = nullptr;     // [capacity], kEmptyKey = free slot
  float* values = nullptr;     // [(capacity + 1) * width]; row `capacity` belongs to kEmptyKey
  long long* owner = nullptr;  // [capacity + 1], -1 between Inserts: last batch index writing the slot
  // [0] = size, [1] = failed inserts (since the last reset), [2] = kEmptyKey present.
  unsigned long long* counters = nullptr;
  int64_t capacity = 0;  // power of two
  int64_t width = 0;
};

// Allocates a table with room for at least `capacity` keys (rounded up to a power of two, >= 32; at most
// kMaxCapacity, table_limits.h). width >= 1.
cudaError_t GpuTableCreate(int64_t capacity, int64_t width, GpuHashTable* table);
cudaError_t GpuTableDestroy(GpuHashTable* table);
// Removes every key (keeps the memory).
cudaError_t GpuTableClear(GpuHashTable* table, cudaStream_t stream);

// keys: device [n]; out: device [n, width]; found: device [n] (may be null); default_row: device [width] or null
// (zeros). Missing keys get default_row and found = 0.
cudaError_t GpuTableFind(const GpuHashTable& table, const int64_t* keys, int64_t n, float* out, uint8_t* found,
                         const float* default_row, cudaStream_t stream);

// Upserts rows (device [n, width]) for keys (device [n]). Keys that found no free slot are counted in
// counters[1]; read it with GpuTableStats.
cudaError_t GpuTableInsert(const GpuHashTable& table, const int64_t* keys, int64_t n, const float* values,
                           cudaStream_t stream);

// Synchronizes `stream` and reads the number of keys and of failed inserts since the last call with reset = true.
cudaError_t GpuTableStats(const GpuHashTable& table, cudaStream_t stream, int64_t* size, int64_t* failed,
                          bool reset_failed);

// The probe hash: the CPU core's (Murmur3Fmix64, mix.h), so both tables spread keys alike.
__host__ __device__ inline uint64_t GpuHashKey(int64_t key) { return Murmur3Fmix64(static_cast<uint64_t>(key)); }

}  // namespace gpu
}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_GPU_GPU_HASH_TABLE_H_
