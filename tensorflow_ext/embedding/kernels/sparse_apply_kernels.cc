// tensorflow_ext: CPU kernels of TfExtEmbeddingSparseApply<Optimizer>.
//
// One templated kernel over the optimizer functors of optimizer_functors.h,
// registered for every entry of TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER. Inputs:
//   0 table_handle, 1 keys [n] (unique), 2 grad [n, dim],
//   3 .. 3+H-1 the optimizer's scalar float hyper-parameters (Opt::kHypers),
//   3+H step (int64 scalar; >= 0 sets the keys' version).
// Each key's row is updated under one probe (HashTable::Update): missing keys
// are inserted with the table's column defaults first. Slot k of a row is
// columns [slot_offset + k*w, slot_offset + (k+1)*w), w = Opt::SlotWidth(dim)
// (dim, or 1 for a row-wise optimizer).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/str_util.h"
#include "tensorflow/core/platform/strcat.h"
#include "tensorflow_ext/embedding/kernels/multi_table.h"
#include "tensorflow_ext/embedding/kernels/optimizer_registry.h"
#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/kernels/table_resource.h"

namespace tfext {
namespace {

using tensorflow::DataTypeString;
using tensorflow::DEVICE_CPU;
using tensorflow::DT_FLOAT;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShapeUtils;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::InvalidArgument;

// Reads the optional boolean attrs an optimizer declares.
tensorflow::Status ReadFlags(OpKernelConstruction* ctx, int num_flags, const char* const* specs,
                             embedding::OptimizerFlags* f) {
  for (int k = 0; k < num_flags; ++k) {
    const std::string spec = specs[k];
    const std::string name = spec.substr(0, spec.find(':'));
    bool v = false;
    TF_RETURN_IF_ERROR(ctx->GetAttr(name, &v));
    if (name == "use_nesterov") {
      f->use_nesterov = v;
    } else if (name == "centered") {
      f->centered = v;
    } else if (name == "multiply_linear_by_lr") {
      f->multiply_linear_by_lr = v;
    } else {
      return tensorflow::errors::Internal("unhandled optimizer attr ", name);
    }
  }
  return tensorflow::OkStatus();
}

// Checks table's layout against dim, slot_offset and the optimizer's slots.
template <class Opt>
tensorflow::Status CheckLayout(const std::string& op, const TableResource& table, int64_t dim, int64_t slot_offset,
                               int num_slots) {
  if (table.dim() != dim) {
    return InvalidArgument(op, ": attr dim=", dim, " does not match the table's dim=", table.dim(),
                           " (table layout: ", table.layout().DebugString(), ")");
  }
  // The core would re-quantize the whole int8 row at every step: a lossy write no training wants.
  if (table.layout().storage == ::tfext::table::RowStorage::kInt8Row) {
    return InvalidArgument(op, ": the table stores int8 rows (storage \"int8_row\"), a serving format; an optimizer ",
                           "trains tables stored as \"float32\", \"bfloat16\" or \"float16\" (table layout: ",
                           table.layout().DebugString(), ")");
  }
  // Slot k occupies columns [slot_offset + k*w, slot_offset + (k+1)*w), w = Opt::SlotWidth(dim).
  if (num_slots > 0) {
    if (slot_offset < dim) {
      return InvalidArgument(op, ": slot_offset=", slot_offset, " overlaps the embedding columns [0, ", dim, ")");
    }
    const int64_t slot_width = Opt::SlotWidth(dim);
    const int64_t end = slot_offset + num_slots * slot_width;
    if (end > table.width()) {
      return InvalidArgument(op, ": the ", num_slots, " slot column block(s) of width ", slot_width,
                             " starting at slot_offset=", slot_offset, " need width >= ", end,
                             ", but the table's width is ", table.width(),
                             " (table layout: ", table.layout().DebugString(), ")");
    }
  }
  return tensorflow::OkStatus();
}

// Checks keys [n] and grad [n, dim]; sets *n.
tensorflow::Status CheckKeysAndGrad(const std::string& op, const Tensor& keys, const Tensor& grad, int64_t dim,
                                    int64_t* n) {
  if (!TensorShapeUtils::IsVector(keys.shape())) {
    return InvalidArgument(op, ": keys must be a vector of unique int64 keys, got shape ", keys.shape().DebugString());
  }
  *n = keys.dim_size(0);
  if (!(grad.dims() == 2 && grad.dim_size(0) == *n && grad.dim_size(1) == dim)) {
    return InvalidArgument(op, ": grad must have shape [", *n, ", ", dim, "] (number of keys, dim), got shape ",
                           grad.shape().DebugString());
  }
  return tensorflow::OkStatus();
}

// Reads a float32 scalar hyper-parameter or a scalar int64 step.
tensorflow::Status ScalarFloat(const std::string& op, const char* what, const Tensor& h, float* out) {
  if (!(TensorShapeUtils::IsScalar(h.shape()) && h.dtype() == DT_FLOAT)) {
    return InvalidArgument(op, ": ", what, " must be a float32 scalar, got ", DataTypeString(h.dtype()), " of shape ",
                           h.shape().DebugString());
  }
  *out = h.scalar<float>()();
  return tensorflow::OkStatus();
}

tensorflow::Status ScalarStep(const std::string& op, const Tensor& step_t, int64_t* step) {
  if (!TensorShapeUtils::IsScalar(step_t.shape())) {
    return InvalidArgument(op, ": step must be an int64 scalar, got shape ", step_t.shape().DebugString());
  }
  *step = step_t.scalar<int64_t>()();
  return tensorflow::OkStatus();
}

// The update of n keys of one table (opt prepared): one probe per key.
// Through TableResource::WithKeys: a tiered table brings the keys' cold rows
// (and slots) back into memory first, and CallTable maps what the call
// throws (inserting missing keys can run out of memory) to the op's error
// status instead of an exception out of the kernel.
template <class Opt>
tensorflow::Status ApplyRows(const Opt& opt, TableResource* table, const int64_t* k, int64_t n, const float* g,
                             int64_t dim, int64_t slot_offset, int64_t step, const table::ParallelFor& pf) {
  if (n == 0) return tensorflow::OkStatus();
  // Updates without a step set no version: invisible to a delta save.
  if (step < 0) table->NoteUntrackedWrite();
  // The keys of a lookup gradient are the lookup's unique keys: its row
  // references (if this table's last lookup was that one) spare the probe.
  const std::shared_ptr<const TableResource::RowRefs> refs = table->LastLookupRefs(k, n);
  return table->WithKeys("apply", k, n, pf, [&] {
    table->table()->UpdateRows(
        k, refs ? refs->refs.data() : nullptr, refs ? refs->epoch : 0, n, table->column_defaults().data(),
        [&opt, g, dim, slot_offset, step](int64_t i, float* row, table::KeyMeta* meta) {
          opt.Apply(row, row + slot_offset, Opt::SlotWidth(dim), g + i * dim, dim);
          if (step >= 0) meta->version = step;
        },
        pf, g, dim);
  });
}

template <class Opt>
class EmbeddingSparseApplyOp : public OpKernel {
 public:
  explicit EmbeddingSparseApplyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_offset", &slot_offset_));
    if (slot_offset_ == -1) slot_offset_ = dim_;  // slots follow the embedding
    OP_REQUIRES(ctx, slot_offset_ >= 1,
                InvalidArgument(Opt::kOpName, ": slot_offset must be >= 1 or -1 (= dim), got ", slot_offset_));
    OP_REQUIRES_OK(ctx, ReadFlags(ctx, Opt::kNumFlags, Opt::kFlagAttrs, &flags_));
    num_slots_ = Opt::NumSlots(flags_);
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string op = Opt::kOpName;
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    OP_REQUIRES_OK(ctx, CheckLayout<Opt>(op, *table, dim_, slot_offset_, num_slots_));
    const Tensor& keys = ctx->input(1);
    const Tensor& grad = ctx->input(2);
    int64_t n;
    OP_REQUIRES_OK(ctx, CheckKeysAndGrad(op, keys, grad, dim_, &n));
    float hypers[Opt::kNumHypers];
    for (int k = 0; k < Opt::kNumHypers; ++k) {
      OP_REQUIRES_OK(ctx, ScalarFloat(op, Opt::kHypers[k], ctx->input(3 + k), &hypers[k]));
    }
    int64_t step;
    OP_REQUIRES_OK(ctx, ScalarStep(op, ctx->input(3 + Opt::kNumHypers), &step));

    Opt opt;
    const std::string problem = opt.Prepare(hypers, flags_);
    OP_REQUIRES(ctx, problem.empty(), InvalidArgument(op, ": ", problem));
    OP_REQUIRES_OK(ctx, ApplyRows(opt, table.get(), keys.flat<int64_t>().data(), n, grad.flat<float>().data(), dim_,
                                  slot_offset_, step, MakeParallelFor(ctx)));
  }

 private:
  int64_t dim_ = 0;
  int64_t slot_offset_ = 0;
  int num_slots_ = 0;
  embedding::OptimizerFlags flags_;
};

// <Opt>Multi(table_handles [N], keys [N], grads [N], <hyper> [N] per hyper, steps [N]):
// N EmbeddingSparseApplyOp<Opt> in one kernel (attrs dims and slot_offsets
// per table, flags shared). What the graph passes put in place of N
// independent updates of distinct tables.
template <class Opt>
class EmbeddingSparseApplyMultiOp : public OpKernel {
 public:
  explicit EmbeddingSparseApplyMultiOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    const char* op = MultiApplyOpName<Opt>();
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dims", &dims_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_offsets", &slot_offsets_));
    OP_REQUIRES(ctx, static_cast<int>(dims_.size()) == n_ && static_cast<int>(slot_offsets_.size()) == n_,
                InvalidArgument(op, ": attrs dims and slot_offsets must have N=", n_, " entries, got ", dims_.size(),
                                " and ", slot_offsets_.size()));
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES(ctx, dims_[i] >= 1, InvalidArgument(op, ": dims[", i, "] must be >= 1, got ", dims_[i]));
      if (slot_offsets_[i] == -1) slot_offsets_[i] = dims_[i];
      OP_REQUIRES(ctx, slot_offsets_[i] >= 1,
                  InvalidArgument(op, ": slot_offsets[", i, "] must be >= 1 or -1 (= dim), got ", slot_offsets_[i]));
    }
    OP_REQUIRES_OK(ctx, ReadFlags(ctx, Opt::kNumFlags, Opt::kFlagAttrs, &flags_));
    num_slots_ = Opt::NumSlots(flags_);
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string base = MultiApplyOpName<Opt>();
    std::vector<RefCountPtr<TableResource>> tables(n_);
    std::vector<Opt> opts(n_);
    std::vector<int64_t> sizes(n_), steps(n_), work(n_);
    for (int i = 0; i < n_; ++i) {
      const std::string op = tensorflow::strings::StrCat(base, " (table ", i, ")");
      OP_REQUIRES_OK(ctx, GetTableResource(ctx, i, &tables[i]));
      OP_REQUIRES_OK(ctx, CheckLayout<Opt>(op, *tables[i], dims_[i], slot_offsets_[i], num_slots_));
      OP_REQUIRES_OK(ctx, CheckKeysAndGrad(op, ctx->input(n_ + i), ctx->input(2 * n_ + i), dims_[i], &sizes[i]));
      float hypers[Opt::kNumHypers];
      for (int k = 0; k < Opt::kNumHypers; ++k) {
        OP_REQUIRES_OK(ctx, ScalarFloat(op, Opt::kHypers[k], ctx->input((3 + k) * n_ + i), &hypers[k]));
      }
      OP_REQUIRES_OK(ctx, ScalarStep(op, ctx->input((3 + Opt::kNumHypers) * n_ + i), &steps[i]));
      const std::string problem = opts[i].Prepare(hypers, flags_);
      OP_REQUIRES(ctx, problem.empty(), InvalidArgument(op, ": ", problem));
      work[i] = sizes[i] * dims_[i];
    }
    OP_REQUIRES_OK(ctx, RunPerTable(ctx, work, [&](int i, const table::ParallelFor& pf) {
                     return ApplyRows(opts[i], tables[i].get(), ctx->input(n_ + i).flat<int64_t>().data(), sizes[i],
                                      ctx->input(2 * n_ + i).flat<float>().data(), dims_[i], slot_offsets_[i], steps[i],
                                      pf);
                   }));
  }

 private:
  int n_ = 0;
  std::vector<int64_t> dims_;
  std::vector<int64_t> slot_offsets_;
  int num_slots_ = 0;
  embedding::OptimizerFlags flags_;
};

#define TFEXT_REGISTER_APPLY_KERNEL(Opt)                                                       \
  REGISTER_KERNEL_BUILDER(Name(Opt::kOpName).Device(DEVICE_CPU), EmbeddingSparseApplyOp<Opt>); \
  REGISTER_KERNEL_BUILDER(Name(MultiApplyOpName<Opt>()).Device(DEVICE_CPU), EmbeddingSparseApplyMultiOp<Opt>);

TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER(TFEXT_REGISTER_APPLY_KERNEL)

}  // namespace
}  // namespace tfext
