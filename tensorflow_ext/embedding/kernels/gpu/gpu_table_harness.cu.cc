// extern "C" harness over the CUDA table (BucketTable<DeviceBackend>) with the embedding layer's initializers and
// fused optimizer steps on it (gpu_embedding.h) and, for side-by-side figures, the CPU core, for ctypes:
// tools/gpu/test_gpu_table.py (correctness against numpy and the CPU core) and tools/gpu/bench_gpu_table.py
// (throughput). Needs no TensorFlow.
//
// Calls taking host arrays copy them in and out. The tfext_gpu_time_* calls take device arrays (from
// tfext_gpu_upload) and return the device time of one operation in milliseconds (CUDA events), so that figures
// are the table's, not PCIe's. Every call returns >= 0 on success, -1 on an error (tfext_gpu_last_error()).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tensorflow_ext/embedding/kernels/gpu/gpu_embedding.h"
#include "tensorflow_ext/embedding/kernels/optimizer_functors.h"
#include "tensorflow_ext/embedding/kernels/row_initializer.h"
#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/gpu/bucket_table.h"
#include "tensorflow_ext/table/gpu/device_backend.h"

using tfext::embedding::AdagradOpt;
using tfext::embedding::AdamOpt;
using tfext::embedding::FtrlOpt;
using tfext::embedding::GradientDescentOpt;
using tfext::embedding::MomentumOpt;
using tfext::embedding::OptimizerFlags;
using tfext::embedding::RMSPropOpt;
using tfext::embedding::RowInitParams;
using tfext::embedding::RowwiseAdagradOpt;
using tfext::embedding::gpu::FindOrInitialize;
using tfext::embedding::gpu::SparseApply;
using tfext::table::SplitMix64;
using tfext::table::gpu::BucketTable;
using tfext::table::gpu::DeviceBackend;
using tfext::table::gpu::EvictPolicy;
using tfext::table::gpu::GpuTableOptions;
using tfext::table::gpu::GpuTableStats;

namespace {

using GpuTable = BucketTable<DeviceBackend>;

thread_local std::string g_error;

int Fail(const std::string& what) {
  g_error = what;
  return -1;
}

// A device copy of a host array (or an output buffer), freed on scope exit.
struct DeviceArray {
  void* ptr = nullptr;
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr) cudaFree(ptr);
  }
  std::string Alloc(size_t bytes) {
    const cudaError_t err = cudaMalloc(&ptr, bytes > 0 ? bytes : 1);
    return err == cudaSuccess ? "" : tfext::table::gpu::CudaError("cudaMalloc", err);
  }
  std::string From(const void* host, size_t bytes) {
    std::string err = Alloc(bytes);
    if (err.empty() && host && bytes > 0) {
      const cudaError_t e = cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice);
      if (e != cudaSuccess) err = tfext::table::gpu::CudaError("copy in", e);
    }
    return err;
  }
  std::string To(void* host, size_t bytes) const {
    if (!host || bytes == 0) return "";
    const cudaError_t e = cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? "" : tfext::table::gpu::CudaError("copy out", e);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

RowInitParams InitParams(int kind, float a, float b, uint64_t seed, uint64_t seed2) {
  RowInitParams p;
  p.kind = static_cast<RowInitParams::Kind>(kind);
  p.a = a;
  p.b = b;
  p.seed_mix = SplitMix64(seed);
  p.seed2_mix = SplitMix64(seed2);
  return p;
}

// Runs the optimizer named `name` (hypers in the order of optimizer_functors.h) through fn(opt, num_slots).
template <class Fn>
std::string WithOptimizer(const char* name, const float* hypers, Fn fn) {
  const std::string n = name;
  OptimizerFlags flags;
  if (n == "adagrad") {
    AdagradOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, 1) : e;
  }
  if (n == "rowwise_adagrad") {
    RowwiseAdagradOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, 1) : e;
  }
  if (n == "adam") {
    AdamOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, 2) : e;
  }
  if (n == "ftrl" || n == "ftrl_multiply_linear_by_lr") {
    flags.multiply_linear_by_lr = n != "ftrl";
    FtrlOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, 2) : e;
  }
  if (n == "sgd") {
    GradientDescentOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, 0) : e;
  }
  if (n == "momentum" || n == "momentum_nesterov") {
    flags.use_nesterov = n != "momentum";
    MomentumOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, 1) : e;
  }
  if (n == "rmsprop" || n == "rmsprop_centered") {
    flags.centered = n != "rmsprop";
    RMSPropOpt o;
    std::string e = o.Prepare(hypers, flags);
    return e.empty() ? fn(o, flags.centered ? 3 : 2) : e;
  }
  return "unknown optimizer '" + n +
         "' (adagrad, rowwise_adagrad, adam, ftrl, ftrl_multiply_linear_by_lr, sgd, momentum, momentum_nesterov, "
         "rmsprop, "
         "rmsprop_centered)";
}

GpuTable* AsTable(void* t) { return static_cast<GpuTable*>(t); }

// Waits for the device; a failed kernel's error, named, if there was one.
std::string Synchronize(const char* op) {
  const cudaError_t err = cudaDeviceSynchronize();
  return err == cudaSuccess ? "" : tfext::table::gpu::CudaError(op, err);
}

// The initializer kinds of RowInitParams (0 constant .. 3 uniform); < 0 means "init_rows give the rows".
std::string CheckInit(int kind, const float* init_rows) {
  if (kind > 3) return "init_kind must be -1 (init_rows), 0 constant, 1 normal, 2 truncated normal or 3 uniform";
  if (kind < 0 && init_rows == nullptr) return "init_kind < 0 needs init_rows";
  return "";
}

}  // namespace

extern "C" {

const char* tfext_gpu_last_error() { return g_error.c_str(); }

int tfext_gpu_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return Fail(tfext::table::gpu::CudaError("cudaGetDeviceCount", err));
  return n;
}

// policy: 0 = LRU, 1 = LFU. capacity_limit 0 = growing table. storage (row_codec.h's RowStorage): 0 float32,
// 1 bfloat16, 2 float16 for the leading compact_cols columns; rounding: 0 nearest, 1 stochastic.
void* tfext_gpu_table_create(int64_t width, int64_t initial_capacity, double max_load_factor, int64_t capacity_limit,
                             int policy, int storage, int64_t compact_cols, int rounding) {
  GpuTableOptions o;
  o.width = width;
  o.initial_capacity = initial_capacity;
  o.max_load_factor = max_load_factor;
  o.capacity_limit = capacity_limit;
  o.policy = static_cast<EvictPolicy>(policy);
  o.storage = static_cast<tfext::table::RowStorage>(storage);
  o.compact_cols = compact_cols;
  o.rounding = static_cast<tfext::table::Rounding>(rounding);
  auto* t = new (std::nothrow) GpuTable();
  if (!t) {
    Fail("out of host memory");
    return nullptr;
  }
  const std::string err = t->Init(o);
  if (!err.empty()) {
    delete t;
    Fail(err);
    return nullptr;
  }
  return t;
}

void tfext_gpu_table_destroy(void* t) { delete AsTable(t); }

// out: size, used, failed, evicted, capacity, row bytes.
int tfext_gpu_table_stats(void* t, int64_t* out) {
  GpuTableStats s;
  const std::string err = AsTable(t)->Stats(&s);
  if (!err.empty()) return Fail(err);
  out[0] = s.size;
  out[1] = s.used;
  out[2] = s.failed;
  out[3] = s.evicted;
  out[4] = s.capacity;
  out[5] = AsTable(t)->row_bytes();
  return 0;
}

int tfext_gpu_table_find(void* t, const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols,
                         const float* default_row, float* out, uint8_t* found) {
  DeviceArray k, o, f, d;
  std::string err = k.From(keys, n * sizeof(int64_t));
  if (err.empty()) err = o.From(out, n * cols * sizeof(float));  // untouched rows keep the caller's values
  if (err.empty()) err = f.Alloc(n);
  if (err.empty() && default_row) err = d.From(default_row, cols * sizeof(float));
  if (err.empty()) {
    err = AsTable(t)->Find(k.as<int64_t>(), n, col_begin, cols, o.as<float>(), f.as<uint8_t>(),
                           default_row ? d.as<float>() : nullptr);
  }
  if (err.empty()) err = o.To(out, n * cols * sizeof(float));
  if (err.empty() && found) err = f.To(found, n);
  return err.empty() ? 0 : Fail(err);
}

// init_kind < 0: init_rows ([n, cols]) give the new rows; else the per-key initializer (0 constant, 1 normal,
// 2 truncated normal, 3 uniform) with a, b, seed, seed2 as the CPU kernels' attrs.
int tfext_gpu_table_find_or_insert(void* t, const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols,
                                   int init_kind, float a, float b, uint64_t seed, uint64_t seed2,
                                   const float* init_rows, const float* column_defaults, float* out, uint8_t* inserted,
                                   int count, int64_t version) {
  GpuTable* table = AsTable(t);
  DeviceArray k, o, ins, ir, def;
  std::string err = CheckInit(init_kind, init_rows);
  if (err.empty()) err = k.From(keys, n * sizeof(int64_t));
  if (err.empty()) err = o.Alloc(n * cols * sizeof(float));
  if (err.empty()) err = ins.Alloc(n);
  if (err.empty() && init_kind < 0) err = ir.From(init_rows, n * cols * sizeof(float));
  if (err.empty() && column_defaults) err = def.From(column_defaults, table->width() * sizeof(float));
  const RowInitParams p = InitParams(init_kind < 0 ? 0 : init_kind, a, b, seed, seed2);
  const float* defaults = column_defaults ? def.as<float>() : nullptr;
  if (err.empty() && init_kind < 0) {
    err = table->FindOrInsert(k.as<int64_t>(), n, col_begin, cols, ir.as<float>(), defaults, o.as<float>(),
                              ins.as<uint8_t>(), count != 0, version);
  } else if (err.empty()) {
    err = FindOrInitialize(table, k.as<int64_t>(), n, col_begin, cols, p, defaults, o.as<float>(), ins.as<uint8_t>(),
                           count != 0, version);
  }
  if (err.empty()) err = o.To(out, n * cols * sizeof(float));
  if (err.empty() && inserted) err = ins.To(inserted, n);
  return err.empty() ? 0 : Fail(err);
}

int tfext_gpu_table_insert(void* t, const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols,
                           const float* values, const float* column_defaults, int count, int64_t version) {
  GpuTable* table = AsTable(t);
  DeviceArray k, v, def;
  std::string err = k.From(keys, n * sizeof(int64_t));
  if (err.empty()) err = v.From(values, n * cols * sizeof(float));
  if (err.empty() && column_defaults) err = def.From(column_defaults, table->width() * sizeof(float));
  if (err.empty()) {
    err = table->Insert(k.as<int64_t>(), n, col_begin, cols, v.as<float>(), column_defaults ? def.as<float>() : nullptr,
                        count != 0, version);
  }
  if (err.empty()) err = Synchronize("insert");
  return err.empty() ? 0 : Fail(err);
}

int tfext_gpu_table_accumulate(void* t, const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols,
                               const float* deltas, const float* column_defaults, int insert_missing, int count,
                               int64_t version) {
  GpuTable* table = AsTable(t);
  DeviceArray k, v, def;
  std::string err = k.From(keys, n * sizeof(int64_t));
  if (err.empty()) err = v.From(deltas, n * cols * sizeof(float));
  if (err.empty() && column_defaults) err = def.From(column_defaults, table->width() * sizeof(float));
  if (err.empty()) {
    err = table->Accumulate(k.as<int64_t>(), n, col_begin, cols, v.as<float>(),
                            column_defaults ? def.as<float>() : nullptr, insert_missing != 0, count != 0, version);
  }
  if (err.empty()) err = Synchronize("accumulate");
  return err.empty() ? 0 : Fail(err);
}

// Returns the number of keys removed.
int64_t tfext_gpu_table_remove(void* t, const int64_t* keys, int64_t n) {
  DeviceArray k;
  std::string err = k.From(keys, n * sizeof(int64_t));
  int64_t removed = 0;
  if (err.empty()) err = AsTable(t)->Remove(k.as<int64_t>(), n, &removed);
  return err.empty() ? removed : Fail(err);
}

// optimizer: "adagrad" (hypers: lr), "rowwise_adagrad" (lr), "adam" (beta1_power, beta2_power, lr, beta1, beta2,
// epsilon), "ftrl" (lr, l1, l2, l2_shrinkage, lr_power). Row layout: [var | slot 0 | slot 1], dim columns each (one
// column: rowwise_adagrad's accumulator). Keys must be distinct.
int tfext_gpu_table_apply(void* t, const char* optimizer, const float* hypers, int64_t dim, const int64_t* keys,
                          int64_t n, const float* grads, const float* column_defaults, int64_t version) {
  GpuTable* table = AsTable(t);
  DeviceArray k, g, def;
  std::string err = k.From(keys, n * sizeof(int64_t));
  if (err.empty()) err = g.From(grads, n * dim * sizeof(float));
  if (err.empty() && column_defaults) err = def.From(column_defaults, table->width() * sizeof(float));
  if (err.empty()) {
    err = WithOptimizer(optimizer, hypers, [&](const auto& opt, int num_slots) {
      return SparseApply(table, k.as<int64_t>(), n, g.as<float>(), dim, num_slots, opt,
                         column_defaults ? def.as<float>() : nullptr, version);
    });
  }
  if (err.empty()) err = Synchronize("apply");
  return err.empty() ? 0 : Fail(err);
}

// Returns the number of entries written (<= max_n); any output may be null.
int64_t tfext_gpu_table_export(void* t, int64_t col_begin, int64_t cols, int64_t max_n, int64_t* keys, float* rows,
                               int64_t* versions, uint32_t* freqs) {
  DeviceArray k, r, v, f;
  std::string err = k.Alloc(max_n * sizeof(int64_t));
  if (err.empty()) err = r.Alloc(max_n * cols * sizeof(float));
  if (err.empty()) err = v.Alloc(max_n * sizeof(int64_t));
  if (err.empty()) err = f.Alloc(max_n * sizeof(uint32_t));
  int64_t n = 0;
  if (err.empty()) {
    err = AsTable(t)->Export(col_begin, cols, max_n, k.as<int64_t>(), r.as<float>(), v.as<int64_t>(), f.as<uint32_t>(),
                             &n);
  }
  if (err.empty()) err = k.To(keys, n * sizeof(int64_t));
  if (err.empty()) err = r.To(rows, n * cols * sizeof(float));
  if (err.empty()) err = v.To(versions, n * sizeof(int64_t));
  if (err.empty()) err = f.To(freqs, n * sizeof(uint32_t));
  return err.empty() ? n : Fail(err);
}

int tfext_gpu_table_clear(void* t) {
  std::string err = AsTable(t)->Clear();
  if (err.empty()) err = Synchronize("clear");
  return err.empty() ? 0 : Fail(err);
}

int tfext_gpu_table_reserve(void* t, int64_t keys) {
  const std::string err = AsTable(t)->Reserve(keys);
  return err.empty() ? 0 : Fail(err);
}

// Initial rows computed on the device (a table-free kernel over the same FillInitialRow) and on the host, to check
// that both give the same floats.
int tfext_gpu_initial_rows(int kind, float a, float b, uint64_t seed, uint64_t seed2, const int64_t* keys, int64_t n,
                           int64_t dim, float* device_out, float* host_out) {
  const std::string bad = kind < 0 ? "init_kind must be 0..3" : CheckInit(kind, nullptr);
  if (!bad.empty()) return Fail(bad);
  const RowInitParams p = InitParams(kind, a, b, seed, seed2);
  for (int64_t i = 0; i < n; ++i) {
    tfext::embedding::FillInitialRow(p, keys[i], host_out + i * dim, dim, tfext::embedding::InlineBoxMuller());
  }
  GpuTable table;
  GpuTableOptions o;
  o.width = dim;
  o.initial_capacity = n;
  std::string err = table.Init(o);
  DeviceArray k, out;
  if (err.empty()) err = k.From(keys, n * sizeof(int64_t));
  if (err.empty()) err = out.Alloc(n * dim * sizeof(float));
  if (err.empty()) {
    err = FindOrInitialize(&table, k.as<int64_t>(), n, 0, dim, p, nullptr, out.as<float>(), nullptr, false, -1);
  }
  if (err.empty()) err = out.To(device_out, n * dim * sizeof(float));
  return err.empty() ? 0 : Fail(err);
}

// ---- benchmarks: device-resident inputs ------------------------------------------------------------------------
void* tfext_gpu_upload(const void* host, int64_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
  if (err == cudaSuccess && host && bytes > 0) err = cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    Fail(tfext::table::gpu::CudaError("upload", err));
    if (p) cudaFree(p);
    return nullptr;
  }
  return p;
}

void tfext_gpu_free(void* p) { cudaFree(p); }

// Device milliseconds of one operation on device arrays: op = "find" (out), "insert" (values), "find_or_insert"
// (normal initializer; out), "accumulate" (values as deltas), "apply_adam" (values as [n, cols] gradients; rows
// must hold 3 * cols columns). Returns -1 on an error.
double tfext_gpu_time(void* t, const char* op, const int64_t* d_keys, int64_t n, int64_t cols, const float* d_values,
                      float* d_out) {
  GpuTable* table = AsTable(t);
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) {
    Fail("cudaEventCreate failed");
    return -1;
  }
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    Fail("cudaEventCreate failed");
    return -1;
  }
  const std::string name = op;
  const RowInitParams init = InitParams(1, 0.0f, 0.05f, 1, 2);
  const float adam[] = {0.9f, 0.999f, 0.001f, 0.9f, 0.999f, 1e-7f};
  AdamOpt adam_opt;
  adam_opt.Prepare(adam, OptimizerFlags());
  cudaDeviceSynchronize();
  cudaEventRecord(start, table->backend().stream);
  std::string err;
  if (name == "find") {
    err = table->Find(d_keys, n, 0, cols, d_out, nullptr, nullptr);
  } else if (name == "insert") {
    err = table->Insert(d_keys, n, 0, cols, d_values, nullptr, false, -1);
  } else if (name == "find_or_insert") {
    err = FindOrInitialize(table, d_keys, n, 0, cols, init, nullptr, d_out, nullptr, false, -1);
  } else if (name == "accumulate") {
    err = table->Accumulate(d_keys, n, 0, cols, d_values, nullptr, false, false, -1);
  } else if (name == "apply_adam") {
    err = SparseApply(table, d_keys, n, d_values, cols, 2, adam_opt, nullptr, -1);
  } else {
    err = "unknown op '" + name + "'";
  }
  cudaEventRecord(stop, table->backend().stream);
  const cudaError_t sync = cudaEventSynchronize(stop);
  float ms = -1;
  if (err.empty() && sync != cudaSuccess) err = tfext::table::gpu::CudaError("timing", sync);
  if (err.empty()) cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!err.empty()) {
    Fail(err);
    return -1;
  }
  return ms;
}

// ---- the CPU core on the same keys (host arrays) -----------------------------------------------------------------
// storage, compact_cols, rounding: as tfext_gpu_table_create's.
void* tfext_cpu_table_create(int64_t width, int64_t initial_capacity, int storage, int64_t compact_cols, int rounding) {
  tfext::table::TableOptions o;
  o.width = width;
  o.initial_capacity = initial_capacity;
  o.storage = static_cast<tfext::table::RowStorage>(storage);
  o.compact_cols = compact_cols;
  o.rounding = static_cast<tfext::table::Rounding>(rounding);
  try {
    return new tfext::table::HashTable(o);
  } catch (const std::exception& e) {
    Fail(e.what());
    return nullptr;
  }
}

void tfext_cpu_table_destroy(void* t) { delete static_cast<tfext::table::HashTable*>(t); }

// The CPU core's fused step of tfext_gpu_table_apply (the same optimizers and arguments, on one host thread), so
// that a check compares the two tables' rows bit for bit.
int tfext_cpu_table_apply(void* t, const char* optimizer, const float* hypers, int64_t dim, const int64_t* keys,
                          int64_t n, const float* grads, const float* column_defaults, int64_t version) {
  auto* table = static_cast<tfext::table::HashTable*>(t);
  const std::string err = WithOptimizer(optimizer, hypers, [&](const auto& opt, int /*num_slots*/) {
    const int64_t slot_width = std::decay_t<decltype(opt)>::SlotWidth(dim);
    try {
      table->Update(
          keys, n, column_defaults,
          [&](int64_t i, float* row, tfext::table::KeyMeta* meta) {
            opt.Apply(row, row + dim, slot_width, grads + i * dim, dim);
            if (version >= 0) meta->version = version;
          },
          tfext::table::InlineParallelFor());
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  return err.empty() ? 0 : Fail(err);
}

// Full rows of keys (found[i] = 0 and out untouched for a missing key).
int tfext_cpu_table_find(void* t, const int64_t* keys, int64_t n, float* out, uint8_t* found) {
  auto* table = static_cast<tfext::table::HashTable*>(t);
  try {
    table->Find(keys, n, 0, table->width(), out, reinterpret_cast<bool*>(found), nullptr,
                tfext::table::InlineParallelFor());
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  return 0;
}

// Wall milliseconds of one operation on `threads` host threads: op = "find", "insert", "find_or_insert".
double tfext_cpu_time(void* t, const char* op, const int64_t* keys, int64_t n, int64_t cols, const float* values,
                      float* out, int threads) {
  auto* table = static_cast<tfext::table::HashTable*>(t);
  const tfext::table::ParallelFor pf = [threads](int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
    std::vector<std::thread> pool;
    const int64_t per = (total + threads - 1) / threads;
    for (int64_t b = 0; b < total; b += per) pool.emplace_back(fn, b, std::min(total, b + per));
    for (auto& th : pool) th.join();
  };
  const RowInitParams init = InitParams(1, 0.0f, 0.05f, 1, 2);
  const std::string name = op;
  const auto start = std::chrono::steady_clock::now();
  try {
    if (name == "find") {
      table->Find(keys, n, 0, cols, out, nullptr, nullptr, pf);
    } else if (name == "insert") {
      table->Insert(keys, n, 0, cols, values, nullptr, false, -1, pf);
    } else if (name == "find_or_insert") {
      table->FindOrInsertWith(
          keys, n, 0, cols,
          [&](const int64_t* index, float* const* dst, int64_t count) {
            for (int64_t j = 0; j < count; ++j) {
              tfext::embedding::FillInitialRow(init, keys[index[j]], dst[j], cols, tfext::embedding::InlineBoxMuller());
            }
          },
          nullptr, out, nullptr, false, -1, pf);
    } else {
      Fail("unknown op '" + name + "'");
      return -1;
    }
  } catch (const std::exception& e) {
    Fail(e.what());
    return -1;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // extern "C"
