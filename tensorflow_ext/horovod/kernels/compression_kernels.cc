// tensorflow_ext: the compression ops of the dense gradient exchange (tensorflow_ext/horovod/allreduce.py) and their
// CPU kernels, over compression.h. Each replaces a chain of TensorFlow ops with one pass over the buffers:
//
//   TfExtHvdPack(grads: N * float) -> packed: out_type [sum of sizes, padded]
//       tf.cast(concat(flatten(grads)) * scale, out_type), zero-padded to a multiple of `multiple` entries.
//   TfExtHvdUnpack(packed: in_type) -> grads: N * float (of `shapes`)
//       split(tf.cast(packed[:sum of sizes], float) * scale) reshaped to `shapes`; entries past them are ignored.
//   TfExtHvdSumParts(parts: T) -> sum: T [size / num_parts]
//       cast(reduce_sum(reshape(cast(parts, float), [num_parts, -1]), 0), T): the receiving side of a 16-bit
//       reduce-scatter (Horovod moves the bytes, the sum is formed in float32 and rounded once).
//   TfExtHvdTopKSelect(grads: N * float, residuals: N * float) -> indices: int32, values: out_type,
//       new_residuals: N * float
//       per gradient i: acc = grads[i] + residuals[i]; its ks[i] largest |acc| as (position in the concatenation
//       of the gradients, wire value), ascending; new_residuals[i] = acc minus what was sent (compression.h).
//   TfExtHvdScatterAdd(indices: int32, values: in_type) -> dense: N * float (of `shapes`)
//       split(unsorted_segment_sum(float(values), indices, sum of sizes) * scale).
//
// The 16-bit types are float16 and bfloat16 (the Python side bitcasts bfloat16 to uint16 for Horovod). Results are
// the TensorFlow chains' bit for bit (compression.h's contract; tensorflow_ext/horovod/tests/
// test_compression_kernels.py), except that a Top-K residual entry whose sent value was not finite becomes 0
// instead of NaN.

#include <algorithm>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/util/work_sharder.h"
#include "tensorflow_ext/horovod/kernels/compression.h"

namespace tfext {
namespace {

using hvd::WireFormat;
using tensorflow::DataType;
using tensorflow::DataTypeString;
using tensorflow::DEVICE_CPU;
using tensorflow::OkStatus;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::OpOutputList;
using tensorflow::PartialTensorShape;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;
namespace errors = tensorflow::errors;

// Positions are int32 on the wire (Horovod's allgather of the Top-K indices).
constexpr int64_t kMaxEntries = (int64_t{1} << 31) - 1;

WireFormat FormatOf(DataType dtype) {
  return dtype == tensorflow::DT_HALF       ? WireFormat::kFloat16
         : dtype == tensorflow::DT_BFLOAT16 ? WireFormat::kBFloat16
                                            : WireFormat::kFloat32;
}

// Elementwise work per float: pack/unpack cost a few ns, enough to split buffers of a few 10k entries.
constexpr int64_t kCostPerEntry = 8;

// Runs fn(begin, end) over [0, n) on the op's intra-op threads.
template <typename Fn>
void ParallelRange(OpKernelContext* ctx, int64_t n, Fn fn) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, n, kCostPerEntry, fn);
}

// The shapes attr, each fully defined, and their entry counts; the sum below kMaxEntries.
Status StaticShapes(OpKernelConstruction* ctx, const char* op, std::vector<TensorShape>* shapes,
                    std::vector<int64_t>* sizes, int64_t* total) {
  std::vector<PartialTensorShape> partial;
  TF_RETURN_IF_ERROR(ctx->GetAttr("shapes", &partial));
  int n;
  TF_RETURN_IF_ERROR(ctx->GetAttr("N", &n));
  if (static_cast<int>(partial.size()) != n) {
    return errors::InvalidArgument(op, ": attr shapes must have N=", n, " entries, got ", partial.size());
  }
  *total = 0;
  for (const auto& p : partial) {
    TensorShape s;
    if (!p.AsTensorShape(&s)) {
      return errors::InvalidArgument(op, ": every shape must be fully defined, got ", p.DebugString());
    }
    shapes->push_back(s);
    sizes->push_back(s.num_elements());
    *total += s.num_elements();
  }
  if (*total > kMaxEntries) {
    return errors::InvalidArgument(op, ": the shapes hold ", *total, " entries, more than ", kMaxEntries,
                                   " (positions are int32): use smaller fused buffers");
  }
  return OkStatus();
}

Status ShapesOutputs(InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
  for (size_t i = 0; i < shapes.size() && static_cast<int>(i) < c->num_outputs(); ++i) {
    ShapeHandle s;
    TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &s));
    c->set_output(static_cast<int>(i), s);
  }
  return OkStatus();
}

REGISTER_OP("TfExtHvdPack")
    .Input("grads: N * float")
    .Output("packed: out_type")
    .Attr("N: int >= 1")
    .Attr("out_type: {float, half, bfloat16}")
    .Attr("scale: float = 1.0")
    .Attr("multiple: int >= 1 = 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t multiple;
      TF_RETURN_IF_ERROR(c->GetAttr("multiple", &multiple));
      int64_t total = 0;
      for (int i = 0; i < c->num_inputs(); ++i) {
        const int64_t n = c->Value(c->NumElements(c->input(i)));
        if (n == InferenceContext::kUnknownDim) {
          c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
          return OkStatus();
        }
        total += n;
      }
      c->set_output(0, c->Vector((total + multiple - 1) / multiple * multiple));
      return OkStatus();
    })
    .Doc("tf.cast(concat(flatten(grads)) * scale, out_type), zero-padded to a multiple of `multiple` entries.");

class PackOp : public OpKernel {
 public:
  explicit PackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("multiple", &multiple_));
    DataType out_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("out_type", &out_type));
    format_ = FormatOf(out_type);
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    std::vector<int64_t> starts(grads.size() + 1, 0);
    for (int i = 0; i < grads.size(); ++i) starts[i + 1] = starts[i] + grads[i].NumElements();
    const int64_t n = starts.back();
    const int64_t padded = (n + multiple_ - 1) / multiple_ * multiple_;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({padded}), &out));
    char* dst = static_cast<char*>(out->data());
    const int64_t width = hvd::WireBytes(format_);
    std::fill(dst + n * width, dst + padded * width, 0);  // +0.0 in every format
    ParallelRange(ctx, n, [&](int64_t begin, int64_t end) {
      // The gradients overlapping [begin, end), each converted in one call.
      int i = static_cast<int>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin()) - 1;
      for (int64_t pos = begin; pos < end; ++i) {
        const int64_t stop = std::min(end, starts[i + 1]);
        const float* src = static_cast<const float*>(grads[i].data()) + (pos - starts[i]);
        hvd::PackScaled(src, stop - pos, scale_, format_, dst + pos * width);
        pos = stop;
      }
    });
  }

 private:
  float scale_;
  int64_t multiple_;
  WireFormat format_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtHvdPack").Device(DEVICE_CPU), PackOp);

REGISTER_OP("TfExtHvdUnpack")
    .Input("packed: in_type")
    .Output("grads: N * float")
    .Attr("N: int >= 1")
    .Attr("in_type: {float, half, bfloat16}")
    .Attr("scale: float = 1.0")
    .Attr("shapes: list(shape)")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      return ShapesOutputs(c);
    })
    .Doc("split(tf.cast(packed[:sum of sizes], float) * scale), reshaped to `shapes`.");

class UnpackOp : public OpKernel {
 public:
  explicit UnpackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    DataType in_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("in_type", &in_type));
    format_ = FormatOf(in_type);
    OP_REQUIRES_OK(ctx, StaticShapes(ctx, "TfExtHvdUnpack", &shapes_, &sizes_, &total_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    OP_REQUIRES(
        ctx, packed.dims() == 1,
        errors::InvalidArgument("TfExtHvdUnpack: packed must be a vector, got shape ", packed.shape().DebugString()));
    OP_REQUIRES(ctx, packed.NumElements() >= total_,
                errors::InvalidArgument("TfExtHvdUnpack: packed has ", packed.NumElements(),
                                        " entries, fewer than the shapes' ", total_));
    OpOutputList outs;
    OP_REQUIRES_OK(ctx, ctx->output_list("grads", &outs));
    std::vector<float*> dsts(shapes_.size());
    for (size_t i = 0; i < shapes_.size(); ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, outs.allocate(static_cast<int>(i), shapes_[i], &out));
      dsts[i] = static_cast<float*>(out->data());
    }
    std::vector<int64_t> starts(sizes_.size() + 1, 0);
    for (size_t i = 0; i < sizes_.size(); ++i) starts[i + 1] = starts[i] + sizes_[i];
    const char* src = static_cast<const char*>(packed.data());
    const int64_t width = hvd::WireBytes(format_);
    ParallelRange(ctx, total_, [&](int64_t begin, int64_t end) {
      int i = static_cast<int>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin()) - 1;
      for (int64_t pos = begin; pos < end; ++i) {
        const int64_t stop = std::min(end, starts[i + 1]);
        hvd::UnpackScaled(src + pos * width, format_, stop - pos, scale_, dsts[i] + (pos - starts[i]));
        pos = stop;
      }
    });
  }

 private:
  float scale_;
  WireFormat format_;
  std::vector<TensorShape> shapes_;
  std::vector<int64_t> sizes_;
  int64_t total_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtHvdUnpack").Device(DEVICE_CPU), UnpackOp);

REGISTER_OP("TfExtHvdSumParts")
    .Input("parts: T")
    .Output("sum: T")
    .Attr("T: {half, bfloat16}")
    .Attr("num_parts: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle parts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &parts));
      int64_t num_parts;
      TF_RETURN_IF_ERROR(c->GetAttr("num_parts", &num_parts));
      DimensionHandle m;
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(parts, 0), num_parts, /*evenly_divisible=*/true, &m));
      c->set_output(0, c->Vector(m));
      return OkStatus();
    })
    .Doc(
        "The receiving side of a 16-bit reduce-scatter: parts is num_parts equal slices (one per rank, in rank "
        "order); cast(reduce_sum(reshape(cast(parts, float), [num_parts, -1]), 0), T).");

class SumPartsOp : public OpKernel {
 public:
  explicit SumPartsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_parts", &num_parts_));
    DataType dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    format_ = FormatOf(dtype);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& parts = ctx->input(0);
    OP_REQUIRES(ctx, parts.dims() == 1 && parts.NumElements() % num_parts_ == 0,
                errors::InvalidArgument("TfExtHvdSumParts: parts must be a vector of num_parts=", num_parts_,
                                        " equal slices, got shape ", parts.shape().DebugString()));
    const int64_t m = parts.NumElements() / num_parts_;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &out));
    const uint16_t* src = static_cast<const uint16_t*>(parts.data());
    uint16_t* dst = static_cast<uint16_t*>(out->data());
    ParallelRange(ctx, m, [&](int64_t begin, int64_t end) {
      hvd::SumParts(src + begin, num_parts_, m, end - begin, format_, dst + begin);
    });
  }

 private:
  int64_t num_parts_;
  WireFormat format_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtHvdSumParts").Device(DEVICE_CPU), SumPartsOp);

REGISTER_OP("TfExtHvdTopKSelect")
    .Input("grads: N * float")
    .Input("residuals: N * float")
    .Output("indices: int32")
    .Output("values: out_type")
    .Output("new_residuals: N * float")
    .Attr("N: int >= 1")
    .Attr("ks: list(int)")
    .Attr("out_type: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<int64_t> ks;
      TF_RETURN_IF_ERROR(c->GetAttr("ks", &ks));
      const int n = c->num_inputs() / 2;
      if (static_cast<int>(ks.size()) != n) {
        return errors::InvalidArgument("TfExtHvdTopKSelect: attr ks must have N=", n, " entries, got ", ks.size());
      }
      int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        ShapeHandle merged;
        TF_RETURN_IF_ERROR(c->Merge(c->input(i), c->input(n + i), &merged));
        c->set_output(2 + i, merged);
        const int64_t size = c->Value(c->NumElements(merged));
        total = (total == InferenceContext::kUnknownDim || size == InferenceContext::kUnknownDim)
                    ? InferenceContext::kUnknownDim
                    : total + std::min(ks[i], size);
      }
      c->set_output(0, c->Vector(total));
      c->set_output(1, c->Vector(total));
      return OkStatus();
    })
    .Doc(
        "Top-K with error feedback: per gradient, the ks[i] largest |grads[i] + residuals[i]| as (position in the "
        "gradients' concatenation, value), ascending; new_residuals[i] keeps what was not sent.");

class TopKSelectOp : public OpKernel {
 public:
  explicit TopKSelectOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ks", &ks_));
    for (int64_t k : ks_) {
      OP_REQUIRES(ctx, k >= 0, errors::InvalidArgument("TfExtHvdTopKSelect: every k must be >= 0, got ", k));
    }
    DataType out_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("out_type", &out_type));
    format_ = FormatOf(out_type);
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList grads, residuals;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    OP_REQUIRES_OK(ctx, ctx->input_list("residuals", &residuals));
    OP_REQUIRES(ctx, static_cast<size_t>(grads.size()) == ks_.size(),
                errors::InvalidArgument("TfExtHvdTopKSelect: attr ks has ", ks_.size(), " entries for ", grads.size(),
                                        " gradients"));
    int64_t total = 0, sent = 0;
    for (int i = 0; i < grads.size(); ++i) {
      OP_REQUIRES(
          ctx, grads[i].shape() == residuals[i].shape(),
          errors::InvalidArgument("TfExtHvdTopKSelect: gradient ", i, " has shape ", grads[i].shape().DebugString(),
                                  " but its residual ", residuals[i].shape().DebugString()));
      total += grads[i].NumElements();
      sent += std::min(ks_[i], grads[i].NumElements());
    }
    OP_REQUIRES(ctx, total <= kMaxEntries,
                errors::InvalidArgument("TfExtHvdTopKSelect: the gradients hold ", total, " entries, more than ",
                                        kMaxEntries, " (positions are int32): use smaller fused buffers"));
    Tensor* indices = nullptr;
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({sent}), &indices));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({sent}), &values));
    OpOutputList new_residuals;
    OP_REQUIRES_OK(ctx, ctx->output_list("new_residuals", &new_residuals));
    hvd::TopKScratch scratch;
    int64_t offset = 0, out = 0;
    const int64_t width = hvd::WireBytes(format_);
    for (int i = 0; i < grads.size(); ++i) {
      Tensor* res = nullptr;
      // The residual's buffer is reused when this op holds its only reference (the variable keeps its own).
      OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({grads.size() + i}, 2 + i, grads[i].shape(), &res));
      const int64_t n = grads[i].NumElements();
      out += hvd::TopKSelect(static_cast<const float*>(grads[i].data()), static_cast<const float*>(residuals[i].data()),
                             n, ks_[i], static_cast<int32_t>(offset), format_, static_cast<float*>(res->data()),
                             indices->flat<int32_t>().data() + out, static_cast<char*>(values->data()) + out * width,
                             &scratch);
      offset += n;
    }
  }

 private:
  std::vector<int64_t> ks_;
  WireFormat format_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtHvdTopKSelect").Device(DEVICE_CPU), TopKSelectOp);

REGISTER_OP("TfExtHvdScatterAdd")
    .Input("indices: int32")
    .Input("values: in_type")
    .Output("dense: N * float")
    .Attr("N: int >= 1")
    .Attr("in_type: {float, half, bfloat16}")
    .Attr("scale: float = 1.0")
    .Attr("shapes: list(shape)")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices, values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
      TF_RETURN_IF_ERROR(c->Merge(indices, values, &indices));
      return ShapesOutputs(c);
    })
    .Doc("split(unsorted_segment_sum(float(values), indices, sum of sizes) * scale), reshaped to `shapes`.");

class ScatterAddOp : public OpKernel {
 public:
  explicit ScatterAddOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    DataType in_type;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("in_type", &in_type));
    format_ = FormatOf(in_type);
    OP_REQUIRES_OK(ctx, StaticShapes(ctx, "TfExtHvdScatterAdd", &shapes_, &sizes_, &total_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    const Tensor& values = ctx->input(1);
    OP_REQUIRES(ctx, indices.dims() == 1 && values.dims() == 1 && indices.NumElements() == values.NumElements(),
                errors::InvalidArgument("TfExtHvdScatterAdd: indices and values must be vectors of one length, got ",
                                        indices.shape().DebugString(), " and ", values.shape().DebugString()));
    OpOutputList outs;
    OP_REQUIRES_OK(ctx, ctx->output_list("dense", &outs));
    std::vector<float*> parts(shapes_.size());
    std::vector<int64_t> starts(shapes_.size() + 1, 0);
    for (size_t i = 0; i < shapes_.size(); ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, outs.allocate(static_cast<int>(i), shapes_[i], &out));
      parts[i] = static_cast<float*>(out->data());
      starts[i + 1] = starts[i] + sizes_[i];
    }
    const int64_t bad = hvd::ScatterAdd(indices.flat<int32_t>().data(), values.data(), format_, indices.NumElements(),
                                        scale_, parts.data(), starts.data(), static_cast<int>(parts.size()));
    OP_REQUIRES(ctx, bad < 0,
                errors::InvalidArgument("TfExtHvdScatterAdd: indices[", bad, "] = ",
                                        bad < 0 ? 0 : indices.flat<int32_t>()(bad), " is not in [0, ", total_, ")"));
  }

 private:
  float scale_;
  WireFormat format_;
  std::vector<TensorShape> shapes_;
  std::vector<int64_t> sizes_;
  int64_t total_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtHvdScatterAdd").Device(DEVICE_CPU), ScatterAddOp);

}  // namespace
}  // namespace tfext
