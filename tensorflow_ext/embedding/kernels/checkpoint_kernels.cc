// tensorflow_ext: TfExtCheckpointReadOptionalString, reading one string
// tensor of a checkpoint that may not hold it.
//
//   TfExtCheckpointReadOptionalString(prefix) -> (value, found)
//
// A dynamic embedding's checkpoint records the row layout of each shard
// (`<shard>-layout`, a JSON string). Checkpoints written before that record
// existed lack the tensor, and RestoreV2 fails on a missing tensor; this op
// reads it where present and says found=false where not, so the restore can
// fall back to the checks an old checkpoint allows.

#include <string>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace tfext {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("TfExtCheckpointReadOptionalString")
    .Input("prefix: string")
    .Attr("tensor_name: string")
    .Output("value: string")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return tensorflow::OkStatus();
    });

class CheckpointReadOptionalStringOp : public OpKernel {
 public:
  explicit CheckpointReadOptionalStringOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tensor_name", &tensor_name_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& prefix = ctx->input(0);
    OP_REQUIRES(
        ctx, prefix.dtype() == tensorflow::DT_STRING && prefix.NumElements() == 1,
        InvalidArgument("prefix must be a scalar string (a checkpoint prefix), got ",
                        tensorflow::DataTypeString(prefix.dtype()), " of shape ", prefix.shape().DebugString()));
    const std::string path = prefix.flat<tensorflow::tstring>()(0);
    Tensor* value = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &value));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &found));
    value->scalar<tensorflow::tstring>()() = "";
    found->scalar<bool>()() = false;
    tensorflow::BundleReader reader(ctx->env(), path);
    // A checkpoint that cannot be opened: the same error the Saver's own
    // reads report (missing or damaged index file).
    OP_REQUIRES_OK(ctx, reader.status());
    if (!reader.Contains(tensor_name_)) return;
    Tensor t;
    OP_REQUIRES_OK(ctx, reader.Lookup(tensor_name_, &t));
    OP_REQUIRES(ctx, t.dtype() == tensorflow::DT_STRING && t.NumElements() == 1,
                InvalidArgument("checkpoint tensor ", tensor_name_, " of ", path, " must be a scalar string, got ",
                                tensorflow::DataTypeString(t.dtype()), " of shape ", t.shape().DebugString()));
    value->scalar<tensorflow::tstring>()() = t.flat<tensorflow::tstring>()(0);
    found->scalar<bool>()() = true;
  }

 private:
  std::string tensor_name_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtCheckpointReadOptionalString").Device(tensorflow::DEVICE_CPU),
                        CheckpointReadOptionalStringOp);

}  // namespace
}  // namespace tfext
