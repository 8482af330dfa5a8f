// tensorflow_ext: CPU kernels of TfExtEmbeddingSparseApply<Optimizer>.
//
// One templated kernel over the optimizer functors of optimizer_functors.h,
// registered for every entry of TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER. Inputs:
//   0 table_handle, 1 keys [n] (unique), 2 grad [n, dim],
//   3 .. 3+H-1 the optimizer's scalar float hyper-parameters (Opt::kHypers),
//   3+H step (int64 scalar; >= 0 sets the keys' version).
// Each key's row is updated under one probe (HashTable::Update): missing keys
// are inserted with the table's column defaults first.

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
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
    const char* op = Opt::kOpName;
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    OP_REQUIRES(ctx, table->dim() == dim_,
                InvalidArgument(op, ": attr dim=", dim_, " does not match the table's dim=", table->dim(),
                                " (table layout: ", table->layout().DebugString(), ")"));
    // Slot k occupies columns [slot_offset + k*dim, slot_offset + (k+1)*dim).
    if (num_slots_ > 0) {
      OP_REQUIRES(
          ctx, slot_offset_ >= dim_,
          InvalidArgument(op, ": slot_offset=", slot_offset_, " overlaps the embedding columns [0, ", dim_, ")"));
      const int64_t end = slot_offset_ + num_slots_ * dim_;
      OP_REQUIRES(ctx, end <= table->width(),
                  InvalidArgument(op, ": the ", num_slots_, " slot column block(s) of dim ", dim_,
                                  " starting at slot_offset=", slot_offset_, " need width >= ", end,
                                  ", but the table's width is ", table->width(),
                                  " (table layout: ", table->layout().DebugString(), ")"));
    }

    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(
        ctx, TensorShapeUtils::IsVector(keys.shape()),
        InvalidArgument(op, ": keys must be a vector of unique int64 keys, got shape ", keys.shape().DebugString()));
    const int64_t n = keys.dim_size(0);
    const Tensor& grad = ctx->input(2);
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == n && grad.dim_size(1) == dim_,
                InvalidArgument(op, ": grad must have shape [", n, ", ", dim_, "] (number of keys, dim), got shape ",
                                grad.shape().DebugString()));

    float hypers[Opt::kNumHypers];
    for (int k = 0; k < Opt::kNumHypers; ++k) {
      const Tensor& h = ctx->input(3 + k);
      OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(h.shape()) && h.dtype() == DT_FLOAT,
                  InvalidArgument(op, ": ", Opt::kHypers[k], " must be a float32 scalar, got ",
                                  DataTypeString(h.dtype()), " of shape ", h.shape().DebugString()));
      hypers[k] = h.scalar<float>()();
    }
    const Tensor& step_t = ctx->input(3 + Opt::kNumHypers);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step_t.shape()),
                InvalidArgument(op, ": step must be an int64 scalar, got shape ", step_t.shape().DebugString()));
    const int64_t step = step_t.scalar<int64_t>()();

    Opt opt;
    const std::string problem = opt.Prepare(hypers, flags_);
    OP_REQUIRES(ctx, problem.empty(), InvalidArgument(op, ": ", problem));
    if (n == 0) return;
    // Updates without a step set no version: invisible to a delta save.
    if (step < 0) table->NoteUntrackedWrite();

    const int64_t* k = keys.flat<int64_t>().data();
    const float* g = grad.flat<float>().data();
    const int64_t dim = dim_;
    const int64_t slot_offset = slot_offset_;
    // Through CallTable: inserting missing keys can run out of memory, which
    // must become a ResourceExhausted error of the op, not an exception out
    // of the kernel.
    OP_REQUIRES_OK(ctx, CallTable(*table, "apply", [&] {
                     table->table()->Update(
                         k, n, table->column_defaults().data(),
                         [&opt, g, dim, slot_offset, step](int64_t i, float* row, table::KeyMeta* meta) {
                           opt.Apply(row, row + slot_offset, dim, g + i * dim, dim);
                           if (step >= 0) meta->version = step;
                         },
                         MakeParallelFor(ctx), g, dim);
                   }));
  }

 private:
  int64_t dim_ = 0;
  int64_t slot_offset_ = 0;
  int num_slots_ = 0;
  embedding::OptimizerFlags flags_;
};

#define TFEXT_REGISTER_APPLY_KERNEL(Opt) \
  REGISTER_KERNEL_BUILDER(Name(Opt::kOpName).Device(DEVICE_CPU), EmbeddingSparseApplyOp<Opt>);

TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER(TFEXT_REGISTER_APPLY_KERNEL)

}  // namespace
}  // namespace tfext
