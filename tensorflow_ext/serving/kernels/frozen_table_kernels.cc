// tensorflow_ext: the read-only serving table as a TF resource, its ops and CPU kernels.
//
// A TfExtFrozenTableHandle resource (FrozenTableResource, frozen_table_resource.h: the live model's kernels read it
// too) holds a `std::shared_ptr<const table::FrozenTable>`:
// lookups copy the pointer under a short lock and then read the immutable table
// with no lock at all, so concurrent requests never wait on each other.
// TfExtFrozenTableBuild (run by the restore of a SavedModel or checkpoint)
// builds a new table aside and swaps the pointer: lookups running meanwhile
// finish on the old table, later ones see the new one. No op writes into a
// built table: FrozenTable has no mutating member.
//
// The handle's `storage` attr ("float32", "bfloat16", "float16", "int8_row":
// table/kernels/storage_attrs.h) is how the table stores its rows; every op
// still reads and writes float32 rows (Find and Export decode, Build rounds
// or quantizes). A shared table reopened with another dim or storage is an
// error naming both.

#include <cstring>
#include <memory>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/util/work_sharder.h"
#include "tensorflow_ext/serving/kernels/frozen_table_resource.h"
#include "tensorflow_ext/table/core/frozen_table.h"
#include "tensorflow_ext/table/kernels/storage_attrs.h"

namespace tfext {
namespace {

using table::FrozenTable;
using table::RowStorage;
using tensorflow::DataTypeString;
using tensorflow::DEVICE_CPU;
using tensorflow::DT_FLOAT;
using tensorflow::DT_INT64;
using tensorflow::OkStatus;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::ResourceHandle;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// ---------------------------------------------------------------------------
// TfExtFrozenTableHandle

class FrozenTableHandleOp : public OpKernel {
 public:
  explicit FrozenTableHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES(ctx, dim_ >= 1, InvalidArgument("dim must be >= 1, got ", dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_node_name_sharing", &use_node_name_sharing_));
    std::string storage;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage", &storage));
    OP_REQUIRES_OK(ctx, ParseRowStorage(storage, &storage_));
  }

  ~FrozenTableHandleOp() override {
    if (initialized_ && cinfo_.resource_is_private_to_kernel()) {
      cinfo_.resource_manager()->Delete<FrozenTableResource>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::mutex_lock l(mu_);
    if (!initialized_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), use_node_name_sharing_));
    }
    FrozenTableResource* table = nullptr;
    const int64_t dim = dim_;
    const RowStorage storage = storage_;
    OP_REQUIRES_OK(ctx, cinfo_.resource_manager()->LookupOrCreate<FrozenTableResource>(
                            cinfo_.container(), cinfo_.name(), &table, [dim, storage](FrozenTableResource** ret) {
                              try {
                                *ret = new FrozenTableResource(dim, storage);
                              } catch (const std::bad_alloc&) {
                                return tensorflow::errors::ResourceExhausted("cannot allocate a frozen table");
                              }
                              return OkStatus();
                            }));
    tensorflow::core::ScopedUnref unref(table);
    OP_REQUIRES(ctx, table->dim() == dim_,
                tensorflow::errors::FailedPrecondition("tf_ext frozen table '", cinfo_.name(),
                                                       "' already exists with dim=", table->dim(),
                                                       " but this op asks for dim=", dim_));
    OP_REQUIRES(
        ctx, table->storage() == storage_,
        tensorflow::errors::FailedPrecondition("tf_ext frozen table '", cinfo_.name(),
                                               "' already exists with storage=", RowStorageName(table->storage()),
                                               " but this op asks for storage=", RowStorageName(storage_)));
    initialized_ = true;
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<ResourceHandle>()() =
        tensorflow::MakeResourceHandle<FrozenTableResource>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  tensorflow::mutex mu_;
  bool initialized_ TF_GUARDED_BY(mu_) = false;
  tensorflow::ContainerInfo cinfo_;
  bool use_node_name_sharing_ = false;
  int64_t dim_ = 1;
  RowStorage storage_ = RowStorage::kFloat32;
};

// ---------------------------------------------------------------------------
// TfExtFrozenTableFind: handle, keys (any shape), default_value (scalar or [dim]) -> values, found

class FrozenTableFindOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<FrozenTableResource> res;
    OP_REQUIRES_OK(ctx, GetFrozenTable(ctx, 0, &res));
    const int64_t dim = res->dim();
    const Tensor& keys = ctx->input(1);
    const Tensor& def = ctx->input(2);
    OP_REQUIRES(ctx, def.NumElements() == 1 || (def.dims() == 1 && def.dim_size(0) == dim),
                InvalidArgument("default_value must be a scalar or a vector of ", dim, " floats, got shape ",
                                def.shape().DebugString()));
    TensorShape out_shape = keys.shape();
    out_shape.AddDim(dim);
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &values));
    if (ctx->output_required(1)) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &found));
    }
    const int64_t n = keys.NumElements();
    if (n == 0) return;
    std::vector<float> default_row(dim, def.flat<float>()(0));
    if (def.NumElements() == dim) std::memcpy(default_row.data(), def.flat<float>().data(), dim * sizeof(float));
    const std::shared_ptr<const FrozenTable> t = res->Get();
    const int64_t* k = keys.flat<int64_t>().data();
    float* out = values->flat<float>().data();
    bool* f = found != nullptr ? found->flat<bool>().data() : nullptr;
    auto work = [&](int64_t begin, int64_t end) {
      t->Find(k + begin, end - begin, out + begin * dim, f != nullptr ? f + begin : nullptr, default_row.data());
    };
    // Small batches (a serving request) run inline: the request threads are the parallelism.
    if (n < 16384) {
      work(0, n);
    } else {
      auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
      tensorflow::Shard(workers->num_threads, workers->workers, n, 200 + 4 * dim, work);
    }
  }
};

// ---------------------------------------------------------------------------
// TfExtFrozenTableBuild: handle, keys [n], values [n, dim]: replaces the table's contents, stored as the handle's
// storage (an int8_row table refuses a row with a value that is not finite or beyond the fp16 range, naming its key).

class FrozenTableBuildOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<FrozenTableResource> res;
    OP_REQUIRES_OK(ctx, GetFrozenTable(ctx, 0, &res));
    const int64_t dim = res->dim();
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES(ctx, keys.dims() == 1,
                InvalidArgument("keys must be a vector, got shape ", keys.shape().DebugString()));
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(0) == keys.dim_size(0) && values.dim_size(1) == dim,
                InvalidArgument("values must be [", keys.dim_size(0), ", ", dim, "] (one row of dim=", dim,
                                " floats per key), got shape ", values.shape().DebugString()));
    std::shared_ptr<const FrozenTable> t;
    try {
      t = FrozenTable::Build(keys.flat<int64_t>().data(), values.flat<float>().data(), keys.dim_size(0), dim,
                             res->storage());
    } catch (const std::invalid_argument& e) {
      ctx->CtxFailure(InvalidArgument(e.what(), " (table ", res->DebugString(), ")"));
      return;
    } catch (const std::bad_alloc&) {
      ctx->CtxFailure(
          tensorflow::errors::ResourceExhausted("frozen table build of ", keys.dim_size(0), " keys: out of memory"));
      return;
    }
    res->Set(std::move(t));
  }
};

// ---------------------------------------------------------------------------
// TfExtFrozenTableExport: handle -> keys [n], values [n, dim] (decoded float32 rows)

class FrozenTableExportOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<FrozenTableResource> res;
    OP_REQUIRES_OK(ctx, GetFrozenTable(ctx, 0, &res));
    const std::shared_ptr<const FrozenTable> t = res->Get();
    const int64_t n = t->size();
    Tensor* keys = nullptr;
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, t->dim()}), &values));
    if (n == 0) return;
    std::memcpy(keys->flat<int64_t>().data(), t->keys(), n * sizeof(int64_t));
    t->ExportRows(values->flat<float>().data());
  }
};

template <int64_t (FrozenTable::*Stat)() const>
class FrozenTableStatOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<FrozenTableResource> res;
    OP_REQUIRES_OK(ctx, GetFrozenTable(ctx, 0, &res));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = ((*res->Get()).*Stat)();
  }
};

// TfExtReleaseFreeMemory: returns the allocator's free memory to the OS. A restore reads tensors as large as the
// tables it fills and frees them; glibc keeps freed blocks below its mmap threshold mapped, so without this a
// served process would keep the read buffers in its resident memory next to the tables. Runs after a serving
// restore.
class ReleaseFreeMemoryOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }
};

Status HandleInput(InferenceContext* c) {
  ShapeHandle h;
  return c->WithRank(c->input(0), 0, &h);
}

}  // namespace

REGISTER_OP("TfExtFrozenTableHandle")
    .Output("table_handle: resource")
    .Attr("dim: int")
    .Attr("storage: string = 'float32'")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtFrozenTableFind")
    .Input("table_handle: resource")
    .Input("keys: int64")
    .Input("default_value: float")
    .Output("values: float")
    .Output("found: bool")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      int64_t dim = -1;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      ShapeHandle values;
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), c->Vector(dim), &values));
      c->set_output(0, values);
      c->set_output(1, c->input(1));
      return OkStatus();
    });

REGISTER_OP("TfExtFrozenTableBuild")
    .Input("table_handle: resource")
    .Input("keys: int64")
    .Input("values: float")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return HandleInput(c); });

REGISTER_OP("TfExtFrozenTableExport")
    .Input("table_handle: resource")
    .Output("keys: int64")
    .Output("values: float")
    .Attr("dim: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      int64_t dim = -1;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), dim));
      return OkStatus();
    });

REGISTER_OP("TfExtFrozenTableSize")
    .Input("table_handle: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtFrozenTableMemoryBytes")
    .Input("table_handle: resource")
    .Output("bytes: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtReleaseFreeMemory").SetIsStateful().SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_KERNEL_BUILDER(Name("TfExtReleaseFreeMemory").Device(DEVICE_CPU), ReleaseFreeMemoryOp);
REGISTER_KERNEL_BUILDER(Name("TfExtFrozenTableHandle").Device(DEVICE_CPU), FrozenTableHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfExtFrozenTableFind").Device(DEVICE_CPU), FrozenTableFindOp);
REGISTER_KERNEL_BUILDER(Name("TfExtFrozenTableBuild").Device(DEVICE_CPU), FrozenTableBuildOp);
REGISTER_KERNEL_BUILDER(Name("TfExtFrozenTableExport").Device(DEVICE_CPU), FrozenTableExportOp);
REGISTER_KERNEL_BUILDER(Name("TfExtFrozenTableSize").Device(DEVICE_CPU), FrozenTableStatOp<&FrozenTable::size>);
REGISTER_KERNEL_BUILDER(Name("TfExtFrozenTableMemoryBytes").Device(DEVICE_CPU),
                        FrozenTableStatOp<&FrozenTable::memory_bytes>);

}  // namespace tfext
