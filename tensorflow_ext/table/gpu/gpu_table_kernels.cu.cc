// DEVICE_GPU kernels of the table ops (TfExtTableHandle, Find, FindOrInsert, Insert, Accumulate, Remove, Size,
// Export, Clear) on the CUDA table (bucket_table.h), for a CUDA build of TensorFlow: a graph that places a
// tf_ext.HashTable's ops on a GPU gets a table in device memory, with the CPU table's semantics.
//
// Built by `make cuda` into build/cuda/_tf_ext_gpu_ops.so (load it after tensorflow_ext with
// tf.load_op_library). Compiled in CI; never run here: the TensorFlow wheel tested with is CPU-only (no GPU device
// exists to place the ops on), and the GPU machines have no TensorFlow.
//
// Rows are float32, or their leading compact_cols columns bfloat16 / float16 (the handle's storage, compact_cols and
// rounding attrs, as the CPU table's); every op reads and writes float32 columns.
//
// Limitations: int64 keys only; int8_row storage (a serving format) is refused; Export's frequencies saturate at
// 2^32 - 1 (the CPU table's too);
// the ops that read or write a table's change log, import, evict or export by version run on CPU tables only.
#define EIGEN_USE_GPU

#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow_ext/table/gpu/bucket_table.h"
#include "tensorflow_ext/table/gpu/device_backend.h"
#include "tensorflow_ext/table/kernels/column_range.h"
#include "tensorflow_ext/table/kernels/storage_attrs.h"

namespace tfext {
namespace table {
namespace gpu {
namespace {

using tensorflow::DEVICE_GPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

// A table error as a TF status: allocation failures are ResourceExhausted, bad arguments InvalidArgument.
Status ToStatus(const std::string& err) {
  if (err.empty()) return tensorflow::OkStatus();
  if (err.find("cudaMalloc") != std::string::npos || err.find("cannot allocate") != std::string::npos) {
    return tensorflow::errors::ResourceExhausted(err);
  }
  if (err.find("kernel launch") != std::string::npos || err.find("copy to") != std::string::npos) {
    return tensorflow::errors::Internal(err);
  }
  return InvalidArgument(err);
}

class GpuTableResource : public tensorflow::ResourceBase {
 public:
  GpuTableResource(int64_t dim, std::vector<float> column_defaults, const GpuTableOptions& options)
      : dim_(dim), defaults_(std::move(column_defaults)), options_(options) {}
  ~GpuTableResource() override {
    if (d_defaults_) cudaFree(d_defaults_);
  }

  std::string DebugString() const override {
    return "tf_ext GPU table (dim=" + std::to_string(dim_) + ", width=" + std::to_string(table_.width()) +
           ", storage=" + RowStorageName(options_.storage) + ", compact_cols=" + std::to_string(options_.compact_cols) +
           ", rounding=" + RoundingName(options_.rounding) + ")";
  }

  Status Init() {
    TF_RETURN_IF_ERROR(ToStatus(table_.Init(options_)));
    if (defaults_.empty()) return tensorflow::OkStatus();
    const size_t bytes = defaults_.size() * sizeof(float);
    cudaError_t err = cudaMalloc(&d_defaults_, bytes);
    if (err == cudaSuccess) err = cudaMemcpy(d_defaults_, defaults_.data(), bytes, cudaMemcpyHostToDevice);
    return err == cudaSuccess ? tensorflow::OkStatus() : ToStatus(CudaError("column defaults", err));
  }

  int64_t dim() const { return dim_; }
  int64_t width() const { return table_.width(); }
  // The same table: width and row storage (RowFormat::SameAs).
  bool SameAs(const GpuTableOptions& o) const { return RowFormat::Of(o).SameAs(RowFormat::Of(options_)); }
  // column_defaults on the device (null: zeros).
  const float* device_defaults() const { return d_defaults_; }
  // The table, driven on the op's stream; callers hold mu().
  BucketTable<DeviceBackend>* table(OpKernelContext* ctx) {
    table_.backend().stream = ctx->eigen_gpu_device().stream();
    return &table_;
  }
  tensorflow::mutex* mu() { return &mu_; }

 private:
  const int64_t dim_;
  const std::vector<float> defaults_;
  const GpuTableOptions options_;
  float* d_defaults_ = nullptr;
  tensorflow::mutex mu_;
  BucketTable<DeviceBackend> table_;
};

class GpuTableHandleOp : public OpKernel {
 public:
  explicit GpuTableHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    int64_t width = -1;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width));
    options_.width = width < 0 ? dim_ : width;
    OP_REQUIRES(ctx, dim_ >= 1 && options_.width >= dim_,
                InvalidArgument("dim must be >= 1 and width >= dim, got dim=", dim_, ", width=", options_.width));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("column_defaults", &defaults_));
    OP_REQUIRES(ctx, defaults_.empty() || static_cast<int64_t>(defaults_.size()) == options_.width,
                InvalidArgument("column_defaults must be empty or hold width=", options_.width, " values, got ",
                                defaults_.size()));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_capacity", &options_.initial_capacity));
    std::string storage, rounding;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage", &storage));
    OP_REQUIRES_OK(ctx, ParseRowStorage(storage, &options_.storage));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compact_cols", &options_.compact_cols));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding", &rounding));
    OP_REQUIRES_OK(ctx, ParseRounding(rounding, &options_.rounding));
    const std::string problem = ValidateGpuTableOptions(options_);
    OP_REQUIRES(ctx, problem.empty(), InvalidArgument(problem));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_node_name_sharing", &use_node_name_sharing_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::mutex_lock l(mu_);
    if (!initialized_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), use_node_name_sharing_));
    }
    GpuTableResource* table = nullptr;
    OP_REQUIRES_OK(ctx, cinfo_.resource_manager()->LookupOrCreate<GpuTableResource>(
                            cinfo_.container(), cinfo_.name(), &table, [this](GpuTableResource** ret) {
                              auto* t = new GpuTableResource(dim_, defaults_, options_);
                              const Status s = t->Init();
                              if (!s.ok()) {
                                t->Unref();
                                return s;
                              }
                              *ret = t;
                              return tensorflow::OkStatus();
                            }));
    tensorflow::core::ScopedUnref unref(table);
    OP_REQUIRES(ctx, table->dim() == dim_ && table->SameAs(options_),
                tensorflow::errors::FailedPrecondition("tf_ext GPU table '", cinfo_.name(), "' already exists as ",
                                                       table->DebugString()));
    initialized_ = true;
    Tensor* handle = nullptr;
    tensorflow::AllocatorAttributes host;
    host.set_on_host(true);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle, host));
    handle->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::MakeResourceHandle<GpuTableResource>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  tensorflow::mutex mu_;
  bool initialized_ TF_GUARDED_BY(mu_) = false;
  tensorflow::ContainerInfo cinfo_;
  bool use_node_name_sharing_ = false;
  int64_t dim_ = 1;
  std::vector<float> defaults_;
  GpuTableOptions options_;
};

// Base of the ops on a column range [col_begin, col_begin + cols) of a table (cols = -1: dim).
class GpuTableOpBase : public OpKernel {
 public:
  explicit GpuTableOpBase(OpKernelConstruction* ctx, bool has_columns = true) : OpKernel(ctx) {
    if (!has_columns) return;
    OP_REQUIRES_OK(ctx, columns_.Read(ctx));
    col_begin_ = columns_.col_begin;
  }

 protected:
  Status Table(OpKernelContext* ctx, tensorflow::core::RefCountPtr<GpuTableResource>* table, int64_t* cols) {
    TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, 0), table));
    if (cols == nullptr) return tensorflow::OkStatus();
    return columns_.Resolve((*table)->dim(), (*table)->width(), (*table)->DebugString(), cols);
  }

  // rows must be keys.shape + [cols] (or [n, cols]).
  static Status CheckRows(const Tensor& keys, const Tensor& rows, int64_t cols, const char* what) {
    if (rows.dims() < 1 || rows.dim_size(rows.dims() - 1) != cols || rows.NumElements() != keys.NumElements() * cols) {
      return InvalidArgument(what, " must have shape keys.shape + [", cols, "] (keys ", keys.shape().DebugString(),
                             "), got ", rows.shape().DebugString());
    }
    return tensorflow::OkStatus();
  }

  static TensorShape RowsShape(const Tensor& keys, int64_t cols) {
    TensorShape shape = keys.shape();
    shape.AddDim(cols);
    return shape;
  }

  ColumnRange columns_;
  int64_t col_begin_ = 0;  // columns_.col_begin
};

class GpuTableFindOp : public GpuTableOpBase {
 public:
  using GpuTableOpBase::GpuTableOpBase;
  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<GpuTableResource> t;
    int64_t cols = 0;
    OP_REQUIRES_OK(ctx, Table(ctx, &t, &cols));
    const Tensor& keys = ctx->input(1);
    const Tensor& def = ctx->input(2);  // host memory
    OP_REQUIRES(ctx, def.NumElements() == 1 || (def.dims() == 1 && def.dim_size(0) == cols),
                InvalidArgument("default_value must be a scalar or a vector of ", cols, " floats, got shape ",
                                def.shape().DebugString()));
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, RowsShape(keys, cols), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &found));
    const int64_t n = keys.NumElements();
    if (n == 0) return;
    std::vector<float> host_row(cols, def.flat<float>()(0));
    if (def.NumElements() == cols) std::copy_n(def.flat<float>().data(), cols, host_row.data());
    Tensor d_row;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({cols}), &d_row));
    tensorflow::mutex_lock l(*t->mu());
    BucketTable<DeviceBackend>* table = t->table(ctx);
    OP_REQUIRES_OK(ctx, ToStatus(table->backend().CopyToDevice(d_row.flat<float>().data(), host_row.data(),
                                                               cols * sizeof(float))));
    // found is bool (one byte) in TF: the table writes 0/1 bytes into it.
    OP_REQUIRES_OK(
        ctx, ToStatus(table->Find(keys.flat<int64_t>().data(), n, col_begin_, cols, values->flat<float>().data(),
                                  reinterpret_cast<uint8_t*>(found->flat<bool>().data()), d_row.flat<float>().data())));
    // host_row must outlive the copy: wait for the stream before it goes.
    OP_REQUIRES(ctx, cudaStreamSynchronize(table->backend().stream) == cudaSuccess,
                tensorflow::errors::Internal("find: device error"));
  }
};

// (handle, keys, rows, step) ops.
class GpuTableUpdateOpBase : public GpuTableOpBase {
 public:
  GpuTableUpdateOpBase(OpKernelConstruction* ctx, const char* rows_name) : GpuTableOpBase(ctx), rows_name_(rows_name) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count", &count_));
  }
  void Compute(OpKernelContext* ctx) final {
    tensorflow::core::RefCountPtr<GpuTableResource> t;
    int64_t cols = 0;
    OP_REQUIRES_OK(ctx, Table(ctx, &t, &cols));
    const Tensor& keys = ctx->input(1);
    const Tensor& rows = ctx->input(2);
    const Tensor& step = ctx->input(3);  // host memory
    OP_REQUIRES_OK(ctx, CheckRows(keys, rows, cols, rows_name_));
    OP_REQUIRES(ctx, step.NumElements() == 1, InvalidArgument("step must be an int64 scalar"));
    tensorflow::mutex_lock l(*t->mu());
    Apply(ctx, t.get(), keys, rows, cols, step.flat<int64_t>()(0));
  }

 protected:
  virtual void Apply(OpKernelContext* ctx, GpuTableResource* t, const Tensor& keys, const Tensor& rows, int64_t cols,
                     int64_t step) = 0;
  bool count_ = false;

 private:
  const char* const rows_name_;
};

class GpuTableFindOrInsertOp : public GpuTableUpdateOpBase {
 public:
  explicit GpuTableFindOrInsertOp(OpKernelConstruction* ctx) : GpuTableUpdateOpBase(ctx, "init_values") {}

 private:
  void Apply(OpKernelContext* ctx, GpuTableResource* t, const Tensor& keys, const Tensor& rows, int64_t cols,
             int64_t step) override {
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, RowsShape(keys, cols), &values));
    if (keys.NumElements() == 0) return;
    OP_REQUIRES_OK(
        ctx, ToStatus(t->table(ctx)->FindOrInsert(keys.flat<int64_t>().data(), keys.NumElements(), col_begin_, cols,
                                                  rows.flat<float>().data(), t->device_defaults(),
                                                  values->flat<float>().data(), nullptr, count_, step)));
  }
};

class GpuTableInsertOp : public GpuTableUpdateOpBase {
 public:
  explicit GpuTableInsertOp(OpKernelConstruction* ctx) : GpuTableUpdateOpBase(ctx, "values") {}

 private:
  void Apply(OpKernelContext* ctx, GpuTableResource* t, const Tensor& keys, const Tensor& rows, int64_t cols,
             int64_t step) override {
    OP_REQUIRES_OK(ctx,
                   ToStatus(t->table(ctx)->Insert(keys.flat<int64_t>().data(), keys.NumElements(), col_begin_, cols,
                                                  rows.flat<float>().data(), t->device_defaults(), count_, step)));
  }
};

class GpuTableAccumulateOp : public GpuTableUpdateOpBase {
 public:
  explicit GpuTableAccumulateOp(OpKernelConstruction* ctx) : GpuTableUpdateOpBase(ctx, "deltas") {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert_missing", &insert_missing_));
  }

 private:
  void Apply(OpKernelContext* ctx, GpuTableResource* t, const Tensor& keys, const Tensor& rows, int64_t cols,
             int64_t step) override {
    OP_REQUIRES_OK(ctx, ToStatus(t->table(ctx)->Accumulate(keys.flat<int64_t>().data(), keys.NumElements(), col_begin_,
                                                           cols, rows.flat<float>().data(), t->device_defaults(),
                                                           insert_missing_, count_, step)));
  }
  bool insert_missing_ = true;
};

class GpuTableRemoveOp : public GpuTableOpBase {
 public:
  explicit GpuTableRemoveOp(OpKernelConstruction* ctx) : GpuTableOpBase(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<GpuTableResource> t;
    OP_REQUIRES_OK(ctx, Table(ctx, &t, nullptr));
    const Tensor& keys = ctx->input(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // host memory
    int64_t removed = 0;
    tensorflow::mutex_lock l(*t->mu());
    OP_REQUIRES_OK(ctx, ToStatus(t->table(ctx)->Remove(keys.flat<int64_t>().data(), keys.NumElements(), &removed)));
    out->scalar<int64_t>()() = removed;
  }
};

class GpuTableSizeOp : public GpuTableOpBase {
 public:
  explicit GpuTableSizeOp(OpKernelConstruction* ctx) : GpuTableOpBase(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<GpuTableResource> t;
    OP_REQUIRES_OK(ctx, Table(ctx, &t, nullptr));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));  // host memory
    GpuTableStats s;
    tensorflow::mutex_lock l(*t->mu());
    OP_REQUIRES_OK(ctx, ToStatus(t->table(ctx)->Stats(&s)));
    out->scalar<int64_t>()() = s.size;
  }
};

class GpuTableClearOp : public GpuTableOpBase {
 public:
  explicit GpuTableClearOp(OpKernelConstruction* ctx) : GpuTableOpBase(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<GpuTableResource> t;
    OP_REQUIRES_OK(ctx, Table(ctx, &t, nullptr));
    tensorflow::mutex_lock l(*t->mu());
    OP_REQUIRES_OK(ctx, ToStatus(t->table(ctx)->Clear()));
  }
};

// Widens the table's uint32 frequencies to the op's int64 output.
struct WidenFrequencies {
  const uint32_t* in;
  int64_t* out;
  TFEXT_HOST_DEVICE void operator()(int64_t i) const { out[i] = in[i]; }
};

class GpuTableExportOp : public GpuTableOpBase {
 public:
  using GpuTableOpBase::GpuTableOpBase;
  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<GpuTableResource> t;
    int64_t cols = 0;
    OP_REQUIRES_OK(ctx, Table(ctx, &t, &cols));
    tensorflow::mutex_lock l(*t->mu());
    BucketTable<DeviceBackend>* table = t->table(ctx);
    GpuTableStats s;
    OP_REQUIRES_OK(ctx, ToStatus(table->Stats(&s)));
    const int64_t n = s.size;
    Tensor *keys = nullptr, *values = nullptr, *versions = nullptr, *freqs = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &keys));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, cols}), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &versions));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n}), &freqs));
    Tensor narrow;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({n}), &narrow));
    uint32_t* narrow_freqs = reinterpret_cast<uint32_t*>(narrow.flat<int32_t>().data());
    int64_t written = 0;
    OP_REQUIRES_OK(
        ctx, ToStatus(table->Export(col_begin_, cols, n, keys->flat<int64_t>().data(), values->flat<float>().data(),
                                    versions->flat<int64_t>().data(), narrow_freqs, &written)));
    OP_REQUIRES(ctx, written == n,
                tensorflow::errors::Internal("export wrote ", written, " entries of a table of ", n));
    OP_REQUIRES_OK(
        ctx, ToStatus(table->backend().ForEach(n, WidenFrequencies{narrow_freqs, freqs->flat<int64_t>().data()})));
  }
};

#define TFEXT_REGISTER_GPU(name, cls) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(DEVICE_GPU).HostMemory("table_handle"), cls)

REGISTER_KERNEL_BUILDER(Name("TfExtTableHandle").Device(DEVICE_GPU).HostMemory("table_handle"), GpuTableHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableFind")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_handle")
                            .HostMemory("default_value")
                            .TypeConstraint<int64_t>("Tkeys")
                            .TypeConstraint<float>("Tvalues"),
                        GpuTableFindOp);
#define TFEXT_REGISTER_GPU_UPDATE(name, cls)                     \
  REGISTER_KERNEL_BUILDER(Name(name)                             \
                              .Device(DEVICE_GPU)                \
                              .HostMemory("table_handle")        \
                              .HostMemory("step")                \
                              .TypeConstraint<int64_t>("Tkeys")  \
                              .TypeConstraint<float>("Tvalues"), \
                          cls)
TFEXT_REGISTER_GPU_UPDATE("TfExtTableFindOrInsert", GpuTableFindOrInsertOp);
TFEXT_REGISTER_GPU_UPDATE("TfExtTableInsert", GpuTableInsertOp);
TFEXT_REGISTER_GPU_UPDATE("TfExtTableAccumulate", GpuTableAccumulateOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableRemove")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_handle")
                            .HostMemory("num_removed")
                            .TypeConstraint<int64_t>("Tkeys"),
                        GpuTableRemoveOp);
REGISTER_KERNEL_BUILDER(Name("TfExtTableSize").Device(DEVICE_GPU).HostMemory("table_handle").HostMemory("size"),
                        GpuTableSizeOp);
TFEXT_REGISTER_GPU("TfExtTableClear", GpuTableClearOp);
TFEXT_REGISTER_GPU("TfExtTableExport", GpuTableExportOp);

}  // namespace
}  // namespace gpu
}  // namespace table
}  // namespace tfext
