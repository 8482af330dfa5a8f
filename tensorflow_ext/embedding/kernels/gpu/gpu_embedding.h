// tensorflow_ext: the embedding layer's operations on the CUDA table (table/gpu/bucket_table.h): lookups that
// insert missing keys with a per-key initializer, and the fused sparse optimizer steps. The table is generic (rows of
// floats, functors for new rows and per-element updates); the embedding math lives here, above it, as on the CPU
// side, where the embedding kernels pass the same formulas to the core's FindOrInsertWith and Update.
//
// Contract
//  * FindOrInitialize: the GPU table's FindOrInsert whose new keys get the initializer's row (row_initializer.h's
//    FillInitialRow): for the same RowInitParams, the same floats as the CPU kernels, bit for bit (--fmad=false on
//    the device, see row_initializer.h).
//  * SparseApply: one step of an optimizer of optimizer_functors.h on distinct keys; rows are [var | slot 0 | ...],
//    dim columns for the variable and Opt::SlotWidth(dim) per slot (dim, or 1 for a row-wise optimizer), the CPU
//    kernels' layout. A key the table lacks gets column_defaults first, as in the CPU kernels. The same floats as
//    the CPU kernels' step (one rounding per operation). On a table with compact (bfloat16 / float16) columns the
//    step sees float32 and the table rounds the result back (bucket_table.h), as the CPU table does.
//  * Both return an empty string on success, else a message naming the problem (as the table's operations).
//
// Limitations
//  * SparseApply refuses a batch that names a key twice (sum the gradients of a key first, as the embedding
//    gradient ops already do): the table's Update runs each key once.
//  * No TensorFlow kernels use these yet: the dynamic embedding ops have CPU kernels only. The ctypes harness
//    (gpu_table_harness.cu.cc) and the host test (gpu_embedding_host_test.cc) are their callers.
//
// Design
//  * The initializer runs one thread per new key (a key's values are drawn in sequence: the truncated normal skips
//    values in stream order); an element-wise optimizer one thread per element, so that a warp reads and writes
//    consecutive columns of a row; a row-wise one (RowwiseAdagradOpt: the row's mean squared gradient feeds every
//    column) one thread per row (Apply over the whole row).
//  * Column ownership: the table's Update lets the thread of element j touch only the row's columns x with
//    x % cols == j. An optimizer's ApplyElement(var, slots, dim, g, j, dim) touches var[j] and slots[k * dim + j],
//    i.e. row columns j + m * dim: with cols = dim, exactly its own.

#ifndef TENSORFLOW_EXT_EMBEDDING_KERNELS_GPU_GPU_EMBEDDING_H_
#define TENSORFLOW_EXT_EMBEDDING_KERNELS_GPU_GPU_EMBEDDING_H_

#include <cstdint>
#include <string>
#include <type_traits>

#include "tensorflow_ext/embedding/kernels/optimizer_functors.h"
#include "tensorflow_ext/embedding/kernels/row_initializer.h"
#include "tensorflow_ext/table/core/host_device.h"
#include "tensorflow_ext/table/gpu/bucket_table.h"

namespace tfext {
namespace embedding {
namespace gpu {

// A new key's initial row from the initializer (the table's FindOrInsertWith init).
struct InitializerRow {
  RowInitParams params;
  int64_t cols;
  TFEXT_HOST_DEVICE void operator()(int64_t /*first*/, int64_t key, float* dst) const {
    FillInitialRow(params, key, dst, cols, InlineBoxMuller());
  }
};

// Element j of batch entry i's optimizer step (the table's Update fn): var = row[0, dim), slot k = row[(k + 1) *
// dim, (k + 2) * dim), the gradient grads[i * dim, (i + 1) * dim).
template <class Opt>
struct OptimizerElement {
  Opt opt;
  const float* grads;  // [n, dim], device memory of the table's backend
  int64_t dim;
  TFEXT_HOST_DEVICE void operator()(int64_t i, int64_t j, float* row) const {
    opt.ApplyElement(row, row + dim, dim, grads + i * dim, j, dim);
  }
};

// Batch entry i's whole optimizer step (the table's Update fn with cols = 1: the thread owns the whole row), for the
// optimizers that reduce over the row first.
template <class Opt>
struct OptimizerRow {
  Opt opt;
  const float* grads;  // [n, dim], device memory of the table's backend
  int64_t dim;
  int64_t slot_width;  // Opt::SlotWidth(dim), from the host
  TFEXT_HOST_DEVICE void operator()(int64_t i, int64_t /*j*/, float* row) const {
    opt.Apply(row, row + dim, slot_width, grads + i * dim, dim);
  }
};

// Missing keys are inserted with the initializer's values in columns [col_begin, col_begin + cols), the other columns
// from column_defaults (null: zeros); out[i] gets the key's columns, inserted[i] (may be null) is 1 for the first
// occurrence of a key this call inserted (BucketTable::FindOrInsertWith).
template <class Backend>
std::string FindOrInitialize(table::gpu::BucketTable<Backend>* table, const int64_t* keys, int64_t n, int64_t col_begin,
                             int64_t cols, const RowInitParams& init, const float* column_defaults, float* out,
                             uint8_t* inserted, bool count, int64_t version) {
  if (init.kind < RowInitParams::kConstant || init.kind > RowInitParams::kUniform) {
    return "FindOrInsert: unknown initializer kind " + std::to_string(static_cast<int>(init.kind));
  }
  return table->FindOrInsertWith(keys, n, col_begin, cols, InitializerRow{init, cols}, column_defaults, out, inserted,
                                 count, version);
}

// One fused optimizer step for distinct keys: opt is prepared on the host (Opt::Prepare), num_slots is its
// NumSlots for the flags it was prepared with.
template <class Backend, class Opt>
std::string SparseApply(table::gpu::BucketTable<Backend>* table, const int64_t* keys, int64_t n, const float* grads,
                        int64_t dim, int64_t num_slots, const Opt& opt, const float* column_defaults, int64_t version) {
  static_assert(std::is_trivially_copyable<Opt>::value,
                "the prepared optimizer travels to the device by value, in a kernel's parameters");
  if (n < 0) return "Apply: n must be >= 0, got " + std::to_string(n);
  if (dim < 1 || dim + num_slots * Opt::SlotWidth(dim) > table->width()) {
    return "Apply: dim " + std::to_string(dim) + " with " + std::to_string(num_slots) + " slots of " +
           std::to_string(Opt::SlotWidth(dim)) + " columns does not fit rows of width " +
           std::to_string(table->width());
  }
  if constexpr (std::is_base_of<ElementwiseOptimizer<Opt>, Opt>::value) {
    return table->Update(keys, n, dim, OptimizerElement<Opt>{opt, grads, dim}, column_defaults, version);
  } else {
    return table->Update(keys, n, 1, OptimizerRow<Opt>{opt, grads, dim, Opt::SlotWidth(dim)}, column_defaults, version);
  }
}

}  // namespace gpu
}  // namespace embedding
}  // namespace tfext

#endif  // TENSORFLOW_EXT_EMBEDDING_KERNELS_GPU_GPU_EMBEDDING_H_
