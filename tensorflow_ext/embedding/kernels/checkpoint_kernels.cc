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
//
// It also checks that the bytes of each tensor named in `check_tensors` lie
// inside its data file: a truncated file is then a DataLoss error naming the
// file, its size and the tensor, where TF's own read says only "Read less
// bytes than requested". The restore runs it before the Saver's RestoreV2.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/io/path.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/core/protobuf/tensor_bundle.pb.h"
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
    .Attr("check_tensors: list(string) = []")
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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_tensors", &check_tensors_));
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
    for (const std::string& name : check_tensors_) {
      OP_REQUIRES_OK(ctx, CheckInDataFile(ctx, &reader, path, name));
    }
    if (!reader.Contains(tensor_name_)) return;
    Tensor t;
    const Status read = reader.Lookup(tensor_name_, &t);
    // The same error code, naming the checkpoint and the tensor (a damaged
    // data file: a checksum mismatch, a short read).
    OP_REQUIRES(ctx, read.ok(),
                Status(read.code(), tensorflow::strings::StrCat("checkpoint ", path, ": cannot read tensor ",
                                                                tensor_name_, ": ", read.message())));
    OP_REQUIRES(ctx, t.dtype() == tensorflow::DT_STRING && t.NumElements() == 1,
                InvalidArgument("checkpoint tensor ", tensor_name_, " of ", path, " must be a scalar string, got ",
                                tensorflow::DataTypeString(t.dtype()), " of shape ", t.shape().DebugString()));
    value->scalar<tensorflow::tstring>()() = t.flat<tensorflow::tstring>()(0);
    found->scalar<bool>()() = true;
  }

 private:
  // OK if `name` is absent (the Saver names a missing tensor itself), sliced,
  // or stored inside its data file; else DataLoss naming the problem.
  static Status CheckInDataFile(OpKernelContext* ctx, tensorflow::BundleReader* reader, const std::string& prefix,
                                const std::string& name) {
    if (!reader->Contains(name)) return tensorflow::OkStatus();
    // The entry's metadata (data file, offset, size): the value under its key
    // in the index (GetBundleEntryProto is private).
    reader->Seek(name);
    tensorflow::BundleEntryProto entry;
    if (!reader->Valid() || reader->key() != name) return tensorflow::OkStatus();
    const absl::string_view value = reader->value();
    if (!entry.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
      return tensorflow::errors::DataLoss("checkpoint ", prefix, ": the index entry of tensor ", name,
                                          " cannot be parsed (a damaged .index file)");
    }
    if (entry.slices_size() > 0) return tensorflow::OkStatus();
    // The data file is <prefix>.data-<shard>-of-<count>; the count is in the
    // bundle header, which BundleReader does not expose: find the file.
    char shard[32];
    std::snprintf(shard, sizeof(shard), ".data-%05d-of-", static_cast<int>(entry.shard_id()));
    const std::string dir(tensorflow::io::Dirname(prefix));
    const std::string stem = std::string(tensorflow::io::Basename(prefix)) + shard;
    std::vector<std::string> children;
    TF_RETURN_IF_ERROR(ctx->env()->GetChildren(dir.empty() ? "." : dir, &children));
    std::string file;
    for (const std::string& child : children) {
      if (child.compare(0, stem.size(), stem) == 0) file = tensorflow::io::JoinPath(dir, child);
    }
    if (file.empty()) {
      return tensorflow::errors::DataLoss("checkpoint ", prefix, " is incomplete: the data file ", prefix, shard,
                                          "* that holds tensor ", name, " is missing");
    }
    uint64_t size = 0;
    TF_RETURN_IF_ERROR(ctx->env()->GetFileSize(file, &size));
    const uint64_t end = static_cast<uint64_t>(entry.offset()) + static_cast<uint64_t>(entry.size());
    if (end > size) {
      return tensorflow::errors::DataLoss("checkpoint ", prefix, " is truncated: its data file ", file, " has ", size,
                                          " bytes, but tensor ", name, " is stored at bytes [", entry.offset(), ", ",
                                          end, ") (a copy or write cut short?). Restore another checkpoint.");
    }
    return tensorflow::OkStatus();
  }

  std::string tensor_name_;
  std::vector<std::string> check_tensors_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtCheckpointReadOptionalString").Device(tensorflow::DEVICE_CPU),
                        CheckpointReadOptionalStringOp);

}  // namespace
}  // namespace tfext
