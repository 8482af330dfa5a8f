// tensorflow_ext: CPU kernels of the table ops (thin over the core).

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow_ext/table/core/table_limits.h"
#include "tensorflow_ext/table/kernels/column_range.h"
#include "tensorflow_ext/table/kernels/storage_attrs.h"
#include "tensorflow_ext/table/kernels/table_resource.h"
#include "tensorflow_ext/table/kernels/tensor_checks.h"

namespace tfext {
namespace {

using table_kernels_internal::CheckFloatTensor;
using table_kernels_internal::CheckKeysTensor;
using tensorflow::DataTypeString;
using tensorflow::DEVICE_CPU;
using tensorflow::DT_INT64;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::InvalidArgument;
namespace lookup = tensorflow::lookup;

// ---------------------------------------------------------------------------
// TfExtTableHandle

// Moves tiered stores when a table is created (the handle's tier_root attr).
// The Python side (tiered.ENV_ROOT) applies the same variable when it builds
// a graph.
constexpr char kTierRootEnv[] = "TF_EXT_TIER_ROOT";

// `path` made absolute against the current directory and lexically normal
// (no empty, "." or ".." components; "/.." is "/"), as Python's
// os.path.abspath makes it. Empty if the current directory is unknown.
std::string AbsoluteNormalPath(const std::string& path) {
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    std::vector<char> cwd(4096);
    while (getcwd(cwd.data(), cwd.size()) == nullptr) {
      if (errno != ERANGE) return "";
      cwd.resize(cwd.size() * 2);
    }
    full = std::string(cwd.data()) + "/" + full;
  }
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= full.size()) {
    size_t end = full.find('/', begin);
    if (end == std::string::npos) end = full.size();
    const std::string part = full.substr(begin, end - begin);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    begin = end + 1;
  }
  std::string out;
  for (const std::string& part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

// The store directory of a tiered table: tier_path, or, when tier_root and
// $TF_EXT_TIER_ROOT are both set (non-empty), tier_path with its tier_root
// prefix replaced by $TF_EXT_TIER_ROOT (both compared made absolute and
// normal). InvalidArgument when tier_root is set but is not a directory
// prefix of tier_path (or tier_path is empty).
Status ResolveTierPath(const std::string& op_name, const std::string& path, const std::string& root, std::string* out) {
  *out = path;
  if (root.empty()) return tensorflow::OkStatus();
  if (path.empty()) {
    return InvalidArgument("tier_root \"", root, "\" needs a tier_path (an untiered table has neither)");
  }
  const std::string normal_path = AbsoluteNormalPath(path);
  const std::string normal_root = AbsoluteNormalPath(root);
  const bool under = normal_root == "/"
                         ? !normal_path.empty()
                         : normal_path.compare(0, normal_root.size(), normal_root) == 0 &&
                               (normal_path.size() == normal_root.size() || normal_path[normal_root.size()] == '/');
  if (normal_path.empty() || normal_root.empty() || !under) {
    return InvalidArgument("tier_root \"", root, "\" is not a directory above tier_path \"", path,
                           "\" (tier_root is the root the path was resolved under, or empty)");
  }
  const char* env = std::getenv(kTierRootEnv);
  if (env == nullptr || env[0] == '\0') return tensorflow::OkStatus();
  const std::string new_root = AbsoluteNormalPath(env);
  if (new_root.empty()) {
    return InvalidArgument(kTierRootEnv, "=\"", env, "\" cannot be made absolute: the current directory is unknown");
  }
  const std::string rest = normal_path.substr(normal_root == "/" ? 0 : normal_root.size());
  *out = new_root == "/" ? (rest.empty() ? "/" : rest) : new_root + rest;
  if (*out != path) {
    LOG(INFO) << "tf_ext table " << op_name << ": its tier store is " << *out << " (" << kTierRootEnv << "=" << env
              << " replaces the root " << root << " of " << path << ")";
  }
  return tensorflow::OkStatus();
}

class TableHandleOp : public OpKernel {
 public:
  explicit TableHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &layout_.dim));
    int64_t width = -1;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("width", &width));
    layout_.width = width < 0 ? layout_.dim : width;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("column_defaults", &layout_.column_defaults));
    std::string storage;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage", &storage));
    OP_REQUIRES_OK(ctx, ParseRowStorage(storage, &layout_.storage));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("compact_cols", &layout_.compact_cols));
    std::string rounding;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding", &rounding));
    OP_REQUIRES_OK(ctx, ParseRounding(rounding, &layout_.rounding));
    OP_REQUIRES_OK(ctx, layout_.Validate());
    int64_t capacity = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("initial_capacity", &capacity));
    OP_REQUIRES(ctx, capacity >= 0, InvalidArgument("initial_capacity must be >= 0, got ", capacity));
    OP_REQUIRES(ctx, capacity <= table::kMaxCapacity,
                InvalidArgument("initial_capacity is absurdly large: ", capacity, " > 2^", table::kMaxCapacityLog2));
    int64_t shard_bits = -1;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_bits", &shard_bits));
    // The core validates the range (its message names the bound); just keep
    // the int conversion exact.
    OP_REQUIRES(ctx, shard_bits >= -1 && shard_bits <= 64,
                InvalidArgument("shard_bits must be -1 (auto) or a small shard-count "
                                "exponent, got ",
                                shard_bits));
    options_.width = layout_.width;
    options_.storage = layout_.storage;
    options_.compact_cols = layout_.compact_cols;
    options_.rounding = layout_.rounding;
    options_.initial_capacity = capacity;
    options_.shard_bits = static_cast<int>(shard_bits);
    OP_REQUIRES_OK(ctx, ctx->GetAttr("huge_pages", &options_.huge_pages));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("preallocate", &options_.preallocate));
    // Validate before any table exists: the op fails at construction.
    const std::string problem = table::ValidateOptions(options_);
    OP_REQUIRES(ctx, problem.empty(), InvalidArgument(problem));
    std::string tier_path, tier_root;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tier_path", &tier_path));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tier_root", &tier_root));
    OP_REQUIRES_OK(ctx, ResolveTierPath(def().name(), tier_path, tier_root, &tier_.path));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tier_memory_bytes", &tier_.memory_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tier_disk_bytes", &tier_.disk_bytes));
    std::string policy;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tier_policy", &policy));
    OP_REQUIRES_OK(ctx, ParseTierPolicy(policy, &tier_.policy));
    OP_REQUIRES_OK(ctx, tier_.Validate(layout_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_node_name_sharing", &use_node_name_sharing_));
  }

  ~TableHandleOp() override {
    if (initialized_ && cinfo_.resource_is_private_to_kernel()) {
      // May fail if a session reset already deleted it: ignore.
      cinfo_.resource_manager()->Delete<lookup::LookupInterface>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::mutex_lock l(mu_);
    if (!initialized_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), use_node_name_sharing_));
    }
    auto creator = [this](lookup::LookupInterface** ret) {
      TableResource* table = nullptr;
      TF_RETURN_IF_ERROR(TableResource::Create(layout_, options_, tier_, cinfo_.name(), &table));
      *ret = table;
      return tensorflow::OkStatus();
    };
    lookup::LookupInterface* found = nullptr;
    OP_REQUIRES_OK(ctx, cinfo_.resource_manager()->LookupOrCreate<lookup::LookupInterface>(
                            cinfo_.container(), cinfo_.name(), &found, creator));
    tensorflow::core::ScopedUnref unref(found);
    auto* table = dynamic_cast<TableResource*>(found);
    OP_REQUIRES(ctx, table != nullptr,
                tensorflow::errors::FailedPrecondition(
                    "a lookup table that is not a tf_ext table already exists under the name '", cinfo_.name(), "' (",
                    found->DebugString(), ")"));
    OP_REQUIRES(ctx, table->layout().SameAs(layout_),
                tensorflow::errors::FailedPrecondition("tf_ext table '", cinfo_.name(),
                                                       "' already exists with layout (", table->layout().DebugString(),
                                                       ") but this op asks for layout (", layout_.DebugString(), ")"));
    OP_REQUIRES(ctx, table->tier_config().SameAs(tier_),
                tensorflow::errors::FailedPrecondition("tf_ext table '", cinfo_.name(), "' already exists with tier (",
                                                       table->tier_config().DebugString(),
                                                       ") but this op asks for tier (", tier_.DebugString(), ")"));
    initialized_ = true;
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::MakeResourceHandle<lookup::LookupInterface>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  tensorflow::mutex mu_;
  bool initialized_ TF_GUARDED_BY(mu_) = false;
  tensorflow::ContainerInfo cinfo_;
  bool use_node_name_sharing_ = false;
  TableLayout layout_;
  table::TableOptions options_;
  TierConfig tier_;
};

// ---------------------------------------------------------------------------
// Helpers shared by the table ops.

Status GetScalarInt64(OpKernelContext* ctx, int index, const char* what, int64_t* out) {
  const Tensor& t = ctx->input(index);
  if (t.dtype() != DT_INT64 || !tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return InvalidArgument(what, " must be an int64 scalar, got ", DataTypeString(t.dtype()), " of shape ",
                           t.shape().DebugString());
  }
  *out = t.scalar<int64_t>()();
  return tensorflow::OkStatus();
}

// Checks that rows holds n rows of `cols` floats: shape keys.shape + [cols]
// or [n, cols].
Status CheckRows(const Tensor& keys, const Tensor& rows, int64_t cols, const char* what) {
  TF_RETURN_IF_ERROR(CheckFloatTensor(rows, what));
  const int64_t n = keys.NumElements();
  if (rows.dims() < 1) {
    return InvalidArgument(what, " must have shape keys.shape + [", cols, "], got a scalar");
  }
  const int64_t last = rows.dim_size(rows.dims() - 1);
  if (last != cols) {
    return InvalidArgument("row width mismatch: ", what, " has rows of ", last, " floats but the op uses ", cols,
                           " columns (shape ", rows.shape().DebugString(), ")");
  }
  const int64_t nrows = rows.NumElements() / (cols > 0 ? cols : 1);
  if (cols > 0 && nrows != n) {
    return InvalidArgument(what, " has ", nrows, " rows but there are ", n, " keys (shapes ",
                           rows.shape().DebugString(), " vs keys ", keys.shape().DebugString(), ")");
  }
  return tensorflow::OkStatus();
}

// Allocates output 0 as an int64 scalar and sets it to value(); value() runs
// after the allocation, so a failed allocation leaves the table untouched.
template <typename ValueFn>
void SetInt64ScalarOutput(OpKernelContext* ctx, ValueFn value) {
  Tensor* out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
  out->scalar<int64_t>()() = value();
}

// keys.shape + [cols]: the shape of the rows read back for `keys`.
TensorShape RowsOutputShape(const Tensor& keys, int64_t cols) {
  TensorShape shape = keys.shape();
  shape.AddDim(cols);
  return shape;
}

// The table of an op's handle input and the width of its column range.
struct TableColumns {
  RefCountPtr<TableResource> table;
  int64_t cols = 0;
};

// The validated (handle, keys, rows) inputs 0-2 of an op on a column range.
struct KeyedRows : TableColumns {
  const Tensor* keys = nullptr;
  const Tensor* rows = nullptr;

  int64_t n() const { return keys->NumElements(); }
  const int64_t* key_data() const { return keys->flat<int64_t>().data(); }
  const float* row_data() const { return rows->flat<float>().data(); }
};

// Base for ops that act on a column range of a table.
class TableOpBase : public OpKernel {
 public:
  explicit TableOpBase(OpKernelConstruction* ctx, bool has_columns = true) : OpKernel(ctx) {
    if (has_columns) {
      OP_REQUIRES_OK(ctx, columns_.Read(ctx));
      col_begin_ = columns_.col_begin;
    }
  }

 protected:
  // Looks up the table and resolves the column range against its layout.
  Status Prepare(OpKernelContext* ctx, TableColumns* out) {
    RefCountPtr<TableResource>& table = out->table;
    TF_RETURN_IF_ERROR(GetTableResource(ctx, 0, &table));
    return columns_.Resolve(table->dim(), table->width(), table->layout().DebugString(), &out->cols);
  }

  // Prepare, then checks keys (input 1) and `cols`-wide rows (input 2, named
  // `rows_name` in error messages).
  Status PrepareKeyedRows(OpKernelContext* ctx, const char* rows_name, KeyedRows* in) {
    TF_RETURN_IF_ERROR(Prepare(ctx, in));
    in->keys = &ctx->input(1);
    in->rows = &ctx->input(2);
    TF_RETURN_IF_ERROR(CheckKeysTensor(*in->keys));
    return CheckRows(*in->keys, *in->rows, in->cols, rows_name);
  }

  ColumnRange columns_;
  int64_t col_begin_ = 0;  // columns_.col_begin
};

// Base for the ops with inputs (handle, keys, rows, step) and a `count` attr;
// subclasses name the rows input and apply the validated batch.
class TableUpdateOpBase : public TableOpBase {
 public:
  TableUpdateOpBase(OpKernelConstruction* ctx, const char* rows_name) : TableOpBase(ctx), rows_name_(rows_name) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count", &count_));
  }

  void Compute(OpKernelContext* ctx) final {
    KeyedRows in;
    OP_REQUIRES_OK(ctx, PrepareKeyedRows(ctx, rows_name_, &in));
    int64_t step = -1;
    OP_REQUIRES_OK(ctx, GetScalarInt64(ctx, 3, "step", &step));
    // A write that sets no version is invisible to a delta save (see TableResource's change log).
    if (step < 0 && in.n() > 0) in.table->NoteUntrackedWrite();
    Apply(ctx, in, step);
  }

 protected:
  virtual void Apply(OpKernelContext* ctx, const KeyedRows& in, int64_t step) = 0;

  bool count_ = false;

 private:
  const char* const rows_name_;
};

// ---------------------------------------------------------------------------

class TableFindOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;
  void Compute(OpKernelContext* ctx) override {
    TableColumns tc;
    OP_REQUIRES_OK(ctx, Prepare(ctx, &tc));
    const int64_t cols = tc.cols;
    const Tensor& keys = ctx->input(1);
    const Tensor& def = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeysTensor(keys));
    OP_REQUIRES_OK(ctx, CheckFloatTensor(def, "default_value"));
    OP_REQUIRES(ctx, def.NumElements() == 1 || (def.dims() == 1 && def.dim_size(0) == cols),
                InvalidArgument("default_value must be a scalar or a vector of ", cols, " floats, got shape ",
                                def.shape().DebugString()));
    // Both outputs are written by the core in its single pass over the keys,
    // straight into the output tensors. `found` is only computed when the
    // graph consumes it (the executor tells through output_required; other
    // runtimes report every output as required).
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, RowsOutputShape(keys, cols), &values));
    if (ctx->output_required(1)) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &found));
    }
    const int64_t n = keys.NumElements();
    if (n == 0) return;
    std::vector<float> default_row(cols, def.flat<float>()(0));
    if (def.NumElements() == cols) {
      std::memcpy(default_row.data(), def.flat<float>().data(), cols * sizeof(float));
    }
    const int64_t* k = keys.flat<int64_t>().data();
    const table::ParallelFor pf = MakeParallelFor(ctx);
    OP_REQUIRES_OK(ctx, tc.table->WithKeys("find", k, n, pf, [&] {
      tc.table->table()->Find(k, n, col_begin_, cols, values->flat<float>().data(),
                              found != nullptr ? found->flat<bool>().data() : nullptr, default_row.data(), pf);
    }));
  }
};

class TableFindOrInsertOp : public TableUpdateOpBase {
 public:
  explicit TableFindOrInsertOp(OpKernelConstruction* ctx) : TableUpdateOpBase(ctx, "init_values") {}

 private:
  void Apply(OpKernelContext* ctx, const KeyedRows& in, int64_t step) override {
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, RowsOutputShape(*in.keys, in.cols), &values));
    if (in.n() == 0) return;
    const table::ParallelFor pf = MakeParallelFor(ctx);
    OP_REQUIRES_OK(ctx, in.table->WithKeys("find_or_insert", in.key_data(), in.n(), pf, [&] {
      in.table->table()->FindOrInsert(in.key_data(), in.n(), col_begin_, in.cols, in.row_data(),
                                      in.table->column_defaults().data(), values->flat<float>().data(), nullptr, count_,
                                      step, pf);
    }));
  }
};

class TableInsertOp : public TableUpdateOpBase {
 public:
  explicit TableInsertOp(OpKernelConstruction* ctx) : TableUpdateOpBase(ctx, "values") {}

 private:
  void Apply(OpKernelContext* ctx, const KeyedRows& in, int64_t step) override {
    if (in.n() == 0) return;
    const table::ParallelFor pf = MakeParallelFor(ctx);
    OP_REQUIRES_OK(ctx, in.table->WithKeys("insert", in.key_data(), in.n(), pf, [&] {
      in.table->table()->Insert(in.key_data(), in.n(), col_begin_, in.cols, in.row_data(),
                                in.table->column_defaults().data(), count_, step, pf);
    }));
  }
};

class TableAccumulateOp : public TableUpdateOpBase {
 public:
  explicit TableAccumulateOp(OpKernelConstruction* ctx) : TableUpdateOpBase(ctx, "deltas") {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert_missing", &insert_missing_));
  }

 private:
  void Apply(OpKernelContext* ctx, const KeyedRows& in, int64_t step) override {
    if (in.n() == 0) return;
    const table::ParallelFor pf = MakeParallelFor(ctx);
    OP_REQUIRES_OK(ctx, in.table->WithKeys("accumulate", in.key_data(), in.n(), pf, [&] {
      in.table->table()->Accumulate(in.key_data(), in.n(), col_begin_, in.cols, in.row_data(),
                                    in.table->column_defaults().data(), insert_missing_, count_, step, pf);
    }));
  }

  bool insert_missing_ = true;
};

class TableRemoveOp : public TableOpBase {
 public:
  explicit TableRemoveOp(OpKernelConstruction* ctx) : TableOpBase(ctx, false) {}
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysTensor(keys));
    const int64_t n = keys.NumElements();
    // The output first: a failed allocation leaves the table untouched.
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    int64_t removed = 0;
    if (n > 0) {
      OP_REQUIRES_OK(ctx, table->RemoveKeys(keys.flat<int64_t>().data(), n, MakeParallelFor(ctx), &removed));
    }
    out->scalar<int64_t>()() = removed;
  }
};

// Size: the keys of both tiers.
class TableSizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    int64_t size = 0;
    OP_REQUIRES_OK(ctx, CallTable(*table, "size", [&] { size = table->Size(); }));
    SetInt64ScalarOutput(ctx, [&] { return size; });
  }
};

// MemoryBytes: the bytes the core table (the memory tier) holds.
class TableMemoryBytesOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    SetInt64ScalarOutput(ctx, [&] { return table->table()->memory_bytes(); });
  }
};

// TfExtTableTierStats: the tier's counters, in table::TierStats order.
class TableTierStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    table::TierStats st{};
    OP_REQUIRES_OK(ctx, CallTable(*table, "tier_stats", [&] { st = table->tier_stats(); }));
    const int64_t values[] = {st.memory_keys, st.memory_bytes, st.disk_keys, st.disk_bytes, st.budget_keys,
                              st.lookups,     st.cold_reads,   st.demotions, st.dropped,    st.errors};
    constexpr int64_t kCount = sizeof(values) / sizeof(values[0]);
    static_assert(kCount == 10, "TfExtTableTierStats outputs 10 counters (table_ops.cc)");
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({kCount}), &out));
    std::memcpy(out->flat<int64_t>().data(), values, sizeof(values));
  }
};

class TableTierSettleOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    OP_REQUIRES_OK(ctx, CallTable(*table, "tier_settle", [&] { table->Settle(); }));
  }
};

// TfExtTablePrefetch: brings the keys' cold rows into memory (nothing else
// changes: no insert, no count, no version), so that the batch that uses
// them next finds them there.
class TablePrefetchOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeysTensor(keys));
    const int64_t n = keys.NumElements();
    if (n == 0 || table->tier() == nullptr) return;
    OP_REQUIRES_OK(ctx, table->WithKeys("prefetch", keys.flat<int64_t>().data(), n, MakeParallelFor(ctx), [] {}));
  }
};

class TableClearOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    table->NoteUntrackedWrite();
    OP_REQUIRES_OK(ctx, CallTable(*table, "clear", [&] { table->Clear(); }));
  }
};

// Runs `export_fn(size_outputs)` (TableResource::Export or ExportSince) into the op's four outputs: keys, rows of
// tc.cols columns, versions and frequencies (widened from the table's uint32 counters to int64).
template <class ExportFn>
void ExportToOutputs(OpKernelContext* ctx, const TableColumns& tc, ExportFn export_fn) {
  Status st;
  Tensor freqs32;
  Tensor* freqs = nullptr;
  OP_REQUIRES_OK(ctx, CallTable(*tc.table, "export", [&] {
                   export_fn([&](int64_t n) {
                     table::HashTable::ExportBuffers b;
                     Tensor* keys = nullptr;
                     Tensor* values = nullptr;
                     Tensor* versions = nullptr;
                     st = ctx->allocate_output(0, TensorShape({n}), &keys);
                     if (st.ok()) st = ctx->allocate_output(1, TensorShape({n, tc.cols}), &values);
                     if (st.ok()) st = ctx->allocate_output(2, TensorShape({n}), &versions);
                     if (st.ok()) st = ctx->allocate_output(3, TensorShape({n}), &freqs);
                     if (st.ok()) st = ctx->allocate_temp(tensorflow::DT_UINT32, TensorShape({n}), &freqs32);
                     if (!st.ok()) return b;
                     b.keys = keys->flat<int64_t>().data();
                     b.rows = values->flat<float>().data();
                     b.versions = versions->flat<int64_t>().data();
                     b.frequencies = freqs32.flat<uint32_t>().data();
                     return b;
                   });
                 }));
  OP_REQUIRES_OK(ctx, st);
  OP_REQUIRES(ctx, freqs != nullptr, tensorflow::errors::Internal("table export did not size its outputs"));
  auto f64 = freqs->flat<int64_t>();
  auto f32 = freqs32.flat<uint32_t>();
  for (int64_t i = 0; i < f64.size(); ++i) f64(i) = f32(i);
}

class TableExportOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;
  void Compute(OpKernelContext* ctx) override {
    TableColumns tc;
    OP_REQUIRES_OK(ctx, Prepare(ctx, &tc));
    ExportToOutputs(ctx, tc, [&](auto size_outputs) { tc.table->Export(col_begin_, tc.cols, size_outputs); });
  }
};

// Rows whose version >= min_version (all rows when min_version < 0).
class TableExportSinceOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;
  void Compute(OpKernelContext* ctx) override {
    TableColumns tc;
    OP_REQUIRES_OK(ctx, Prepare(ctx, &tc));
    int64_t min_version = -1;
    OP_REQUIRES_OK(ctx, GetScalarInt64(ctx, 1, "min_version", &min_version));
    if (min_version < 0) min_version = std::numeric_limits<int64_t>::min();
    ExportToOutputs(ctx, tc,
                    [&](auto size_outputs) { tc.table->ExportSince(min_version, col_begin_, tc.cols, size_outputs); });
  }
};

// The `channel` attr of the change-log ops: a non-empty name.
Status GetChannelAttr(OpKernelConstruction* ctx, std::string* channel) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("channel", channel));
  if (channel->empty()) {
    return InvalidArgument("change log channel must be a non-empty name (e.g. '", TableResource::kCheckpointChannel,
                           "'), got ''");
  }
  return tensorflow::OkStatus();
}

// TfExtTableChangeLog: the removed keys logged in a channel (marked as read) and its flags.
class TableChangeLogOp : public OpKernel {
 public:
  explicit TableChangeLogOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("read_keys", &read_keys_));
    OP_REQUIRES_OK(ctx, GetChannelAttr(ctx, &channel_));
  }
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    std::vector<int64_t> removed;
    const TableResource::ChangeLogState state = table->ReadChangeLog(channel_, read_keys_ ? &removed : nullptr);
    Tensor* keys = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(removed.size())}), &keys));
    if (!removed.empty()) std::memcpy(keys->flat<int64_t>().data(), removed.data(), removed.size() * sizeof(int64_t));
    const bool flags[3] = {state.enabled, state.untracked, state.overflow};
    for (int i = 0; i < 3; ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1 + i, TensorShape({}), &out));
      out->scalar<bool>()() = flags[i];
    }
  }

 private:
  bool read_keys_ = true;
  std::string channel_;
};

class TableChangeLogStartOp : public OpKernel {
 public:
  explicit TableChangeLogStartOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetChannelAttr(ctx, &channel_));
  }
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    int64_t capacity = 0;
    OP_REQUIRES_OK(ctx, GetScalarInt64(ctx, 1, "capacity", &capacity));
    OP_REQUIRES(ctx, capacity >= 0, InvalidArgument("capacity must be >= 0 removed keys, got ", capacity));
    table->StartChangeLog(channel_, capacity);
  }

 private:
  std::string channel_;
};

class TableChangeLogCommitOp : public OpKernel {
 public:
  explicit TableChangeLogCommitOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetChannelAttr(ctx, &channel_));
  }
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    table->CommitChangeLog(channel_);
  }

 private:
  std::string channel_;
};

class TableImportOp : public TableOpBase {
 public:
  explicit TableImportOp(OpKernelConstruction* ctx) : TableOpBase(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("clear_first", &clear_first_));
  }
  void Compute(OpKernelContext* ctx) override {
    // Import takes what Export produced: keys [n], values [n, cols].
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                InvalidArgument("import: keys must be a vector [n] (as export returns them), got "
                                "shape ",
                                keys.shape().DebugString()));
    KeyedRows in;
    OP_REQUIRES_OK(ctx, PrepareKeyedRows(ctx, "values", &in));
    const Tensor& versions = ctx->input(3);
    const Tensor& freqs = ctx->input(4);
    const int64_t n = in.n();
    OP_REQUIRES(ctx, versions.NumElements() == 0 || versions.NumElements() == n,
                InvalidArgument("versions must be empty or have one entry per key (", n, "), got shape ",
                                versions.shape().DebugString()));
    OP_REQUIRES(ctx, freqs.NumElements() == 0 || freqs.NumElements() == n,
                InvalidArgument("frequencies must be empty or have one entry per key (", n, "), got shape ",
                                freqs.shape().DebugString()));
    std::vector<uint32_t> f32;
    if (freqs.NumElements() == n && n > 0) {
      f32.resize(n);
      auto f = freqs.flat<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = f(i);
        f32[i] = v < 0 ? 0u : (v > 0xffffffffLL ? 0xffffffffu : static_cast<uint32_t>(v));
      }
    }
    const int64_t* version_data = versions.NumElements() == n ? versions.flat<int64_t>().data() : nullptr;
    const uint32_t* freq_data = f32.empty() ? nullptr : f32.data();
    // Imported rows keep the versions given: a delta save cannot find them by version.
    if (n > 0 || clear_first_) in.table->NoteUntrackedWrite();
    // clear_first (a restore) on an untiered table: the new contents are
    // built aside and swapped in at once, so concurrent lookups (serving, an
    // evaluator) see the old table or the new one, never an empty or
    // half-filled one; a failure (out of memory) leaves the old contents. A
    // tiered table fills its tiers in place (TableResource::Import).
    if (n == 0 && !clear_first_) return;
    OP_REQUIRES_OK(ctx, CallTable(*in.table, "import", [&] {
                     in.table->Import(in.key_data(), n, col_begin_, in.cols, in.row_data(), version_data, freq_data,
                                      clear_first_, MakeParallelFor(ctx));
                   }));
  }

 private:
  bool clear_first_ = true;
};

class TableEvictOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, GetTableResource(ctx, 0, &table));
    int64_t min_version = -1, min_frequency = -1;
    OP_REQUIRES_OK(ctx, GetScalarInt64(ctx, 1, "min_version", &min_version));
    OP_REQUIRES_OK(ctx, GetScalarInt64(ctx, 2, "min_frequency", &min_frequency));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    int64_t removed = 0;
    if (min_version >= 0 || min_frequency >= 0) {
      // Both tiers; TableResource::RemoveIf logs the removed keys in the change log.
      OP_REQUIRES_OK(
          ctx, CallTable(*table, "evict", [&] {
            removed = table->RemoveIf([min_version, min_frequency](int64_t, const float*, const table::KeyMeta& m) {
              return (min_version >= 0 && m.version < min_version) ||
                     (min_frequency >= 0 && static_cast<int64_t>(m.frequency) < min_frequency);
            });
          }));
    }
    out->scalar<int64_t>()() = removed;
  }
};

#define TFEXT_REGISTER_CPU(name, cls) REGISTER_KERNEL_BUILDER(Name(name).Device(DEVICE_CPU), cls)

TFEXT_REGISTER_CPU("TfExtTableHandle", TableHandleOp);
TFEXT_REGISTER_CPU("TfExtTableFind", TableFindOp);
TFEXT_REGISTER_CPU("TfExtTableFindOrInsert", TableFindOrInsertOp);
TFEXT_REGISTER_CPU("TfExtTableInsert", TableInsertOp);
TFEXT_REGISTER_CPU("TfExtTableAccumulate", TableAccumulateOp);
TFEXT_REGISTER_CPU("TfExtTableRemove", TableRemoveOp);
TFEXT_REGISTER_CPU("TfExtTableSize", TableSizeOp);
TFEXT_REGISTER_CPU("TfExtTableExport", TableExportOp);
TFEXT_REGISTER_CPU("TfExtTableImport", TableImportOp);
TFEXT_REGISTER_CPU("TfExtTableClear", TableClearOp);
TFEXT_REGISTER_CPU("TfExtTableMemoryBytes", TableMemoryBytesOp);
TFEXT_REGISTER_CPU("TfExtTableEvict", TableEvictOp);
TFEXT_REGISTER_CPU("TfExtTableExportSince", TableExportSinceOp);
TFEXT_REGISTER_CPU("TfExtTableChangeLog", TableChangeLogOp);
TFEXT_REGISTER_CPU("TfExtTableChangeLogStart", TableChangeLogStartOp);
TFEXT_REGISTER_CPU("TfExtTableChangeLogCommit", TableChangeLogCommitOp);
TFEXT_REGISTER_CPU("TfExtTableTierStats", TableTierStatsOp);
TFEXT_REGISTER_CPU("TfExtTableTierSettle", TableTierSettleOp);
TFEXT_REGISTER_CPU("TfExtTablePrefetch", TablePrefetchOp);

}  // namespace
}  // namespace tfext
