// extern "C" harness over the GPU table for ctypes (tools/gpu/test_gpu_table.py): host arrays in, host arrays out.
// Every call returns >= 0 on success, -1 on a CUDA error (see tfext_gpu_last_error()).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "tensorflow_ext/table/gpu/gpu_hash_table.h"

using tfext::table::gpu::GpuHashTable;

namespace {

thread_local char g_error[512] = "";

int Fail(const char* what, cudaError_t err) {
  std::snprintf(g_error, sizeof(g_error), "%s: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
  return -1;
}

// Device scratch buffers, freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  cudaError_t Alloc(size_t bytes) { return cudaMalloc(&ptr, bytes > 0 ? bytes : 1); }
};

}  // namespace

extern "C" {

const char* tfext_gpu_last_error() { return g_error; }

int tfext_gpu_device_count() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return Fail("cudaGetDeviceCount", err);
  return n;
}

void* tfext_gpu_table_create(int64_t capacity, int64_t width) {
  GpuHashTable* t = new (std::nothrow) GpuHashTable();
  if (t == nullptr) return nullptr;
  cudaError_t err = tfext::table::gpu::GpuTableCreate(capacity, width, t);
  if (err != cudaSuccess) {
    Fail("GpuTableCreate", err);
    delete t;
    return nullptr;
  }
  return t;
}

void tfext_gpu_table_destroy(void* table) {
  if (table == nullptr) return;
  auto* t = static_cast<GpuHashTable*>(table);
  tfext::table::gpu::GpuTableDestroy(t);
  delete t;
}

int64_t tfext_gpu_table_capacity(void* table) { return static_cast<GpuHashTable*>(table)->capacity; }

// Returns the number of keys that found no free slot (>= 0), or -1.
int64_t tfext_gpu_table_insert(void* table, const int64_t* keys, int64_t n, const float* values) {
  auto* t = static_cast<GpuHashTable*>(table);
  DeviceBuffer d_keys, d_values;
  cudaError_t err = d_keys.Alloc(n * sizeof(int64_t));
  if (err == cudaSuccess) err = d_values.Alloc(n * t->width * sizeof(float));
  if (err == cudaSuccess && n > 0) err = cudaMemcpy(d_keys.ptr, keys, n * sizeof(int64_t), cudaMemcpyHostToDevice);
  if (err == cudaSuccess && n > 0)
    err = cudaMemcpy(d_values.ptr, values, n * t->width * sizeof(float), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return Fail("insert: copy in", err);
  err =
      tfext::table::gpu::GpuTableInsert(*t, static_cast<int64_t*>(d_keys.ptr), n, static_cast<float*>(d_values.ptr), 0);
  if (err != cudaSuccess) return Fail("GpuTableInsert", err);
  int64_t failed = 0;
  err = tfext::table::gpu::GpuTableStats(*t, 0, nullptr, &failed, /*reset_failed=*/true);
  if (err != cudaSuccess) return Fail("insert: stats", err);
  return failed;
}

// out: [n, width] floats; found: [n] bytes (may be null); default_row: [width] (may be null = zeros).
int tfext_gpu_table_find(void* table, const int64_t* keys, int64_t n, const float* default_row, float* out,
                         uint8_t* found) {
  auto* t = static_cast<GpuHashTable*>(table);
  DeviceBuffer d_keys, d_out, d_found, d_default;
  cudaError_t err = d_keys.Alloc(n * sizeof(int64_t));
  if (err == cudaSuccess) err = d_out.Alloc(n * t->width * sizeof(float));
  if (err == cudaSuccess) err = d_found.Alloc(n);
  if (err == cudaSuccess && default_row) err = d_default.Alloc(t->width * sizeof(float));
  if (err == cudaSuccess && n > 0) err = cudaMemcpy(d_keys.ptr, keys, n * sizeof(int64_t), cudaMemcpyHostToDevice);
  if (err == cudaSuccess && default_row)
    err = cudaMemcpy(d_default.ptr, default_row, t->width * sizeof(float), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return Fail("find: copy in", err);
  err = tfext::table::gpu::GpuTableFind(*t, static_cast<int64_t*>(d_keys.ptr), n, static_cast<float*>(d_out.ptr),
                                        static_cast<uint8_t*>(d_found.ptr), static_cast<float*>(d_default.ptr), 0);
  if (err != cudaSuccess) return Fail("GpuTableFind", err);
  if (n > 0) {
    err = cudaMemcpy(out, d_out.ptr, n * t->width * sizeof(float), cudaMemcpyDeviceToHost);
    if (err == cudaSuccess && found) err = cudaMemcpy(found, d_found.ptr, n, cudaMemcpyDeviceToHost);
  } else {
    err = cudaDeviceSynchronize();
  }
  if (err != cudaSuccess) return Fail("find: copy out", err);
  return 0;
}

int64_t tfext_gpu_table_size(void* table) {
  int64_t size = 0;
  cudaError_t err = tfext::table::gpu::GpuTableStats(*static_cast<GpuHashTable*>(table), 0, &size, nullptr, false);
  if (err != cudaSuccess) return Fail("size", err);
  return size;
}

int tfext_gpu_table_clear(void* table) {
  cudaError_t err = tfext::table::gpu::GpuTableClear(static_cast<GpuHashTable*>(table), 0);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) return Fail("clear", err);
  return 0;
}

}  // extern "C"
