// CUDA find / insert of the tensorflow_ext table: see gpu_hash_table.h.
#include "tensorflow_ext/table/gpu/gpu_hash_table.h"

#include <algorithm>

namespace tfext {
namespace table {
namespace gpu {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;  // 8 warps per block
constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ inline unsigned long long AsULL(int64_t k) { return static_cast<unsigned long long>(k); }

// Returns the slot holding `key`, or -1. kEmptyKey maps to the extra row `capacity`.
__device__ int64_t ProbeFind(const GpuHashTable& t, int64_t key) {
  if (key == kEmptyKey) {
    return t.counters[2] ? t.capacity : -1;
  }
  const int64_t mask = t.capacity - 1;
  int64_t slot = static_cast<int64_t>(GpuHashKey(key) & static_cast<uint64_t>(mask));
  for (int64_t i = 0; i < t.capacity; ++i) {
    const int64_t k = t.keys[slot];
    if (k == key) return slot;
    if (k == kEmptyKey) return -1;  // linear probing without deletes: first hole ends the chain
    slot = (slot + 1) & mask;
  }
  return -1;
}

// Returns the slot for `key`, claiming a free one with atomicCAS if absent; -1 if the table is full.
__device__ int64_t ProbeInsert(const GpuHashTable& t, int64_t key) {
  if (key == kEmptyKey) {
    if (atomicCAS(&t.counters[2], 0ULL, 1ULL) == 0ULL) atomicAdd(&t.counters[0], 1ULL);
    return t.capacity;
  }
  const int64_t mask = t.capacity - 1;
  int64_t slot = static_cast<int64_t>(GpuHashKey(key) & static_cast<uint64_t>(mask));
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(t.keys);
  for (int64_t i = 0; i < t.capacity; ++i) {
    const int64_t seen = t.keys[slot];
    if (seen == key) return slot;
    if (seen == kEmptyKey) {
      const unsigned long long prev = atomicCAS(&keys[slot], AsULL(kEmptyKey), AsULL(key));
      if (prev == AsULL(kEmptyKey)) {
        atomicAdd(&t.counters[0], 1ULL);
        return slot;
      }
      if (prev == AsULL(key)) return slot;  // another thread inserted the same key
      // else another key took the slot: keep probing
    }
    slot = (slot + 1) & mask;
  }
  atomicAdd(&t.counters[1], 1ULL);
  return -1;
}

// One warp per key (grid-stride): lane 0 probes, the slot is broadcast, lanes copy the columns.
__global__ void FindKernel(GpuHashTable t, const int64_t* __restrict__ keys, int64_t n, float* __restrict__ out,
                           uint8_t* __restrict__ found, const float* __restrict__ default_row) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t w = t.width;
  for (int64_t i = warp; i < n; i += num_warps) {
    int64_t slot = 0;
    if (lane == 0) slot = ProbeFind(t, keys[i]);
    slot = __shfl_sync(kFullMask, slot, 0);
    float* dst = out + i * w;
    if (slot >= 0) {
      const float* src = t.values + slot * w;
      for (int64_t c = lane; c < w; c += kWarp) dst[c] = src[c];
    } else {
      for (int64_t c = lane; c < w; c += kWarp) dst[c] = default_row ? default_row[c] : 0.0f;
    }
    if (lane == 0 && found) found[i] = slot >= 0 ? 1 : 0;
  }
}

// Insert, pass 1 (thread per key): claim or find the slot, remember it, mark the slot with the highest batch index.
__global__ void ClaimKernel(GpuHashTable t, const int64_t* __restrict__ keys, int64_t n, int64_t* __restrict__ slots) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t slot = ProbeInsert(t, keys[i]);
    slots[i] = slot;
    if (slot >= 0) atomicMax(&t.owner[slot], static_cast<long long>(i));
  }
}

// Insert, pass 2 (warp per key): the last occurrence of each key writes its row.
__global__ void WriteKernel(GpuHashTable t, const int64_t* __restrict__ slots, int64_t n,
                            const float* __restrict__ values) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t num_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t w = t.width;
  for (int64_t i = warp; i < n; i += num_warps) {
    const int64_t slot = slots[i];
    if (slot < 0 || t.owner[slot] != i) continue;
    float* dst = t.values + slot * w;
    const float* src = values + i * w;
    for (int64_t c = lane; c < w; c += kWarp) dst[c] = src[c];
  }
}

// Insert, pass 3 (thread per key): reset the marks for the next batch.
__global__ void ResetOwnerKernel(GpuHashTable t, const int64_t* __restrict__ slots, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (slots[i] >= 0) t.owner[slots[i]] = -1;
  }
}

__global__ void FillKernel(int64_t* keys, long long* owner, int64_t capacity) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i <= capacity;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < capacity) keys[i] = kEmptyKey;
    owner[i] = -1;
  }
}

int Blocks(int64_t work_items, int64_t per_block) {
  const int64_t b = (work_items + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(b, 65535)));
}

}  // namespace

cudaError_t GpuTableCreate(int64_t capacity, int64_t width, GpuHashTable* table) {
  if (table == nullptr || width < 1 || capacity < 0 || capacity > kMaxCapacity) return cudaErrorInvalidValue;
  int64_t cap = 32;
  while (cap < capacity) cap <<= 1;
  GpuHashTable t;
  t.capacity = cap;
  t.width = width;
  cudaError_t err = cudaMalloc(&t.keys, cap * sizeof(int64_t));
  if (err == cudaSuccess) err = cudaMalloc(&t.values, (cap + 1) * width * sizeof(float));
  if (err == cudaSuccess) err = cudaMalloc(&t.owner, (cap + 1) * sizeof(long long));
  if (err == cudaSuccess) err = cudaMalloc(&t.counters, 3 * sizeof(unsigned long long));
  if (err == cudaSuccess) err = cudaMemset(t.values, 0, (cap + 1) * width * sizeof(float));
  if (err == cudaSuccess) err = GpuTableClear(&t, 0);
  if (err == cudaSuccess) err = cudaStreamSynchronize(0);
  if (err != cudaSuccess) {
    GpuTableDestroy(&t);
    return err;
  }
  *table = t;
  return cudaSuccess;
}

cudaError_t GpuTableDestroy(GpuHashTable* table) {
  cudaError_t err = cudaSuccess;
  if (table->keys) err = cudaFree(table->keys);
  if (table->values) cudaFree(table->values);
  if (table->owner) cudaFree(table->owner);
  if (table->counters) cudaFree(table->counters);
  *table = GpuHashTable();
  return err;
}

cudaError_t GpuTableClear(GpuHashTable* table, cudaStream_t stream) {
  FillKernel<<<Blocks(table->capacity + 1, kThreads), kThreads, 0, stream>>>(table->keys, table->owner,
                                                                             table->capacity);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return cudaMemsetAsync(table->counters, 0, 3 * sizeof(unsigned long long), stream);
}

cudaError_t GpuTableFind(const GpuHashTable& table, const int64_t* keys, int64_t n, float* out, uint8_t* found,
                         const float* default_row, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t per_block = kThreads / kWarp;
  FindKernel<<<Blocks(n, per_block), kThreads, 0, stream>>>(table, keys, n, out, found, default_row);
  return cudaGetLastError();
}

cudaError_t GpuTableInsert(const GpuHashTable& table, const int64_t* keys, int64_t n, const float* values,
                           cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  int64_t* slots = nullptr;
  cudaError_t err = cudaMallocAsync(&slots, n * sizeof(int64_t), stream);
  if (err != cudaSuccess) return err;
  ClaimKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(table, keys, n, slots);
  WriteKernel<<<Blocks(n, kThreads / kWarp), kThreads, 0, stream>>>(table, slots, n, values);
  ResetOwnerKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(table, slots, n);
  err = cudaGetLastError();
  cudaError_t free_err = cudaFreeAsync(slots, stream);
  return err != cudaSuccess ? err : free_err;
}

cudaError_t GpuTableStats(const GpuHashTable& table, cudaStream_t stream, int64_t* size, int64_t* failed,
                          bool reset_failed) {
  unsigned long long host[3];
  cudaError_t err = cudaMemcpyAsync(host, table.counters, sizeof(host), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  if (size) *size = static_cast<int64_t>(host[0]);
  if (failed) *failed = static_cast<int64_t>(host[1]);
  if (reset_failed) {
    err = cudaMemsetAsync(table.counters + 1, 0, sizeof(unsigned long long), stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  }
  return err;
}

}  // namespace gpu
}  // namespace table
}  // namespace tfext
