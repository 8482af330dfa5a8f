// tensorflow_ext: CPU kernels of TfExtEmbeddingLookup and TfExtShardIndex.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow_ext/embedding/kernels/multi_table.h"
#include "tensorflow_ext/embedding/kernels/row_initializer.h"
#include "tensorflow_ext/embedding/kernels/row_initializer_cpu.h"
#include "tensorflow_ext/table/core/check.h"
#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/core/mix.h"
#include "tensorflow_ext/table/kernels/table_resource.h"
#include "tsl/platform/random.h"

namespace tfext {
namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::InvalidArgument;

// The splitmix64 finalizer (mix.h): a bijection of uint64, the same function
// HashKey and the Python layer use.
using table::SplitMix64;

using embedding::FillInitialRowsCpu;
using embedding::RowInitParams;

// ---------------------------------------------------------------------------
// Initial values of new keys (row_initializer.h): the draw depends only on
// (initializer, seed, seed2, key), whatever the batch order, sharding or
// thread scheduling; the TF attrs below fill its RowInitParams.
class RowInitializer {
 public:
  tensorflow::Status Init(OpKernelConstruction* ctx) {
    std::string kind;
    TF_RETURN_IF_ERROR(ctx->GetAttr("init_kind", &kind));
    float a = 0, b = 1;
    TF_RETURN_IF_ERROR(ctx->GetAttr("init_a", &a));
    TF_RETURN_IF_ERROR(ctx->GetAttr("init_b", &b));
    int64_t seed = 0, seed2 = 0;
    TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &seed));
    TF_RETURN_IF_ERROR(ctx->GetAttr("seed2", &seed2));
    return Init(kind, a, b, seed, seed2);
  }

  // The same from attr values (the multi-table lookup reads one entry of each list attr per table).
  tensorflow::Status Init(const std::string& kind, float a, float b, int64_t seed, int64_t seed2) {
    if (kind == "constant") {
      p_.kind = RowInitParams::kConstant;
    } else if (kind == "random_normal") {
      p_.kind = RowInitParams::kNormal;
    } else if (kind == "truncated_normal") {
      p_.kind = RowInitParams::kTruncatedNormal;
    } else if (kind == "random_uniform") {
      p_.kind = RowInitParams::kUniform;
    } else {
      return InvalidArgument("unknown init_kind '", kind, "'");
    }
    p_.a = a;
    p_.b = b;
    if (seed == 0 && seed2 == 0) {  // like TF's random ops: nondeterministic
      seed = static_cast<int64_t>(tsl::random::New64());
      seed2 = static_cast<int64_t>(tsl::random::New64());
    }
    p_.seed_mix = SplitMix64(static_cast<uint64_t>(seed));
    p_.seed2_mix = SplitMix64(static_cast<uint64_t>(seed2));
    if ((p_.kind == RowInitParams::kNormal || p_.kind == RowInitParams::kTruncatedNormal) && !(b >= 0)) {
      return InvalidArgument("init_b (stddev) must be >= 0 for ", kind, ", got ", b);
    }
    return tensorflow::OkStatus();
  }

  // The value of missing keys when nothing is inserted.
  float MissingValue() const { return p_.MissingValue(); }

  // The initial rows of keys[index[j]] into rows[j], j < count (at most
  // HashTable::kInitBatch: FindOrInsertWith's batches).
  void FillRows(const int64_t* keys, const int64_t* index, float* const* rows, int64_t count, int64_t dim) const {
    TFEXT_DCHECK(count <= table::HashTable::kInitBatch, "FindOrInsertWith hands init at most kInitBatch rows");
    int64_t batch_keys[table::HashTable::kInitBatch];
    for (int64_t j = 0; j < count; ++j) batch_keys[j] = keys[index[j]];
    FillInitialRowsCpu(p_, batch_keys, rows, count, dim);
  }

 private:
  RowInitParams p_;
};

// ---------------------------------------------------------------------------
// Shared by the lookup kernels: attrs and the table probe of unique keys.

// Rows [n, dim] of n keys (unique, or each occurrence counts) of `table` into
// out: with insert_missing, missing keys are inserted with init's draw (count
// bumps the frequency, step >= 0 sets the version); without, they read
// init's constant and nothing changes. Through TableResource::WithKeys (a
// tiered table brings the keys' cold rows into memory first; CallTable's
// error mapping: a table that runs out of memory is a ResourceExhausted error
// of the op, never an exception out of the kernel).
tensorflow::Status ProbeRows(TableResource* table, int64_t dim, bool insert_missing, bool count,
                             const RowInitializer& init, const int64_t* k, int64_t n, int64_t step, float* out,
                             const table::ParallelFor& pf) {
  if (n == 0) return tensorflow::OkStatus();
  table::HashTable* t = table->table();
  if (!insert_missing) {
    // Read-only: missing keys read the initializer's constant (0 for the
    // random kinds); no insertion, no metadata change.
    return table->WithKeys("lookup", k, n, pf, [&] {
      const std::vector<float> missing(dim, init.MissingValue());
      t->Find(k, n, 0, dim, out, nullptr, missing.data(), pf);
    });
  }
  // Inserts (and counts) without setting versions: invisible to a delta save.
  if (step < 0) table->NoteUntrackedWrite();
  // The rows' references go to the table for the step's optimizer update of
  // these keys (HashTable::UpdateRows): it then skips its own probe.
  // (On a tiered table a demotion between this lookup and the update frees
  // rows and so changes the epoch: the update then probes, as after a removal.)
  std::shared_ptr<TableResource::RowRefs> refs;
  tensorflow::Status status = table->WithKeys("lookup", k, n, pf, [&] {  // allocations too: bad_alloc becomes an error
    refs = std::make_shared<TableResource::RowRefs>();
    refs->epoch = t->removal_epoch();  // before the probe: see UpdateRows
    refs->refs.resize(static_cast<size_t>(n));
    t->FindOrInsertWith(
        k, n, 0, dim,
        [&init, k, dim](const int64_t* index, float* const* dst, int64_t count) {
          init.FillRows(k, index, dst, count, dim);
        },
        table->column_defaults().data(), out, nullptr, count, step, pf, refs->refs.data());
  });
  if (status.ok()) table->SetLastLookupRefs(k, n, std::move(refs));
  return status;
}

class LookupBase : public OpKernel {
 public:
  explicit LookupBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("insert_missing", &insert_missing_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count", &count_));
    OP_REQUIRES_OK(ctx, init_.Init(ctx));
  }

 protected:
  // The table of input 0, checked against attr dim (nullptr after an error).
  tensorflow::Status Table(OpKernelContext* ctx, const char* op, RefCountPtr<TableResource>* table) {
    TF_RETURN_IF_ERROR(GetTableResource(ctx, 0, table));
    if ((*table)->dim() != dim_) {
      return InvalidArgument(op, ": attr dim=", dim_, " does not match the table's dim=", (*table)->dim(),
                             " (table layout: ", (*table)->layout().DebugString(), ")");
    }
    return tensorflow::OkStatus();
  }

  // Rows [n, dim] of n keys (unique, or each occurrence counts) into out.
  tensorflow::Status Probe(OpKernelContext* ctx, TableResource* table, const int64_t* k, int64_t n, int64_t step,
                           float* out) const {
    return ProbeRows(table, dim_, insert_missing_, count_, init_, k, n, step, out, MakeParallelFor(ctx));
  }

  int64_t dim_ = 0;
  bool insert_missing_ = false;
  bool count_ = true;
  RowInitializer init_;
};

tensorflow::Status ScalarStep(const Tensor& step_t, const char* op, int64_t* step) {
  if (!TensorShapeUtils::IsScalar(step_t.shape())) {
    return InvalidArgument(op, ": step must be an int64 scalar, got shape ", step_t.shape().DebugString());
  }
  *step = step_t.scalar<int64_t>()();
  return tensorflow::OkStatus();
}

// ---------------------------------------------------------------------------
// TfExtEmbeddingLookup(table_handle, keys, step) -> values [n, dim]

class EmbeddingLookupOp : public LookupBase {
 public:
  explicit EmbeddingLookupOp(OpKernelConstruction* ctx) : LookupBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, Table(ctx, "TfExtEmbeddingLookup", &table));
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                InvalidArgument("TfExtEmbeddingLookup: keys must be a vector of unique "
                                "int64 keys, got shape ",
                                keys.shape().DebugString()));
    int64_t step;
    OP_REQUIRES_OK(ctx, ScalarStep(ctx->input(2), "TfExtEmbeddingLookup", &step));
    const int64_t n = keys.dim_size(0);
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &values));
    OP_REQUIRES_OK(ctx, Probe(ctx, table.get(), keys.flat<int64_t>().data(), n, step, values->flat<float>().data()));
  }
};

// ---------------------------------------------------------------------------
// TfExtEmbeddingLookupIds(table_handle, ids [n], step)
//     -> values [n, dim], unique_keys [u], idx [n] (int32)
//
// tf.unique + TfExtEmbeddingLookup + tf.gather in one kernel: ids are
// deduplicated (unique_keys in order of first occurrence, ids[i] =
// unique_keys[idx[i]], as tf.unique), each unique key is probed once, and its
// row is copied to every position that holds it.

// Deduplicates keys[0, n) into *uniq (first-occurrence order) and idx.
// Open addressing over int32 slots (0 = empty, else 1 + unique index), at
// most half full. Serial (the order of first occurrences is the output), so
// the probe of key i + kAhead is prefetched while key i is placed: the set
// (4 bytes x 2n slots, 1 MB for a ctr26 batch) lives in L2/L3, and the
// dependent misses were most of the time (1.2 ms -> 0.74 ms for 106K ids).
void Dedup(const int64_t* keys, int64_t n, std::vector<int64_t>* uniq, int32_t* idx) {
  constexpr int64_t kAhead = 16;
  uint64_t cap = 16;
  while (cap < 2 * static_cast<uint64_t>(n)) cap <<= 1;
  const uint64_t mask = cap - 1;
  std::vector<int32_t> slots(cap, 0);
  uniq->resize(static_cast<size_t>(n));
  int64_t* u = uniq->data();
  int32_t count = 0;
  uint64_t home[kAhead];  // home[i % kAhead]: the first probe of key i
  for (int64_t i = 0; i < kAhead && i < n; ++i) {
    home[i] = SplitMix64(static_cast<uint64_t>(keys[i])) & mask;
    __builtin_prefetch(&slots[home[i]]);
  }
  for (int64_t i = 0; i < n; ++i) {
    uint64_t p = home[i % kAhead];
    if (i + kAhead < n) {
      const uint64_t q = SplitMix64(static_cast<uint64_t>(keys[i + kAhead])) & mask;
      home[i % kAhead] = q;
      __builtin_prefetch(&slots[q]);
    }
    const int64_t key = keys[i];
    for (;;) {
      const int32_t s = slots[p];
      if (s == 0) {
        u[count] = key;
        idx[i] = count++;
        slots[p] = count;
        break;
      }
      if (u[s - 1] == key) {
        idx[i] = s - 1;
        break;
      }
      p = (p + 1) & mask;
    }
  }
  uniq->resize(static_cast<size_t>(count));
}

// Runs fn(begin, end) over [0, total) on the op's worker threads when the
// work (total * cost_per_unit cycles) is worth it.
void ParallelRows(OpKernelContext* ctx, int64_t total, int64_t cost_per_unit,
                  const std::function<void(int64_t, int64_t)>& fn) {
  const tensorflow::DeviceBase::CpuWorkerThreads* workers = ctx->device()->tensorflow_cpu_worker_threads();
  if (workers == nullptr || workers->workers == nullptr || workers->num_threads <= 1 ||
      total * cost_per_unit < 200000) {
    fn(0, total);
    return;
  }
  workers->workers->ParallelFor(total, cost_per_unit, fn);
}

class EmbeddingLookupIdsOp : public LookupBase {
 public:
  explicit EmbeddingLookupIdsOp(OpKernelConstruction* ctx) : LookupBase(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "TfExtEmbeddingLookupIds";
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, Table(ctx, op, &table));
    const Tensor& ids = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(ids.shape()),
                InvalidArgument(op, ": ids must be a vector of int64 keys, got shape ", ids.shape().DebugString()));
    const int64_t n = ids.dim_size(0);
    OP_REQUIRES(ctx, n <= std::numeric_limits<int32_t>::max(),
                InvalidArgument(op, ": at most 2^31 - 1 ids per call, got ", n));
    int64_t step;
    OP_REQUIRES_OK(ctx, ScalarStep(ctx->input(2), op, &step));

    Tensor* idx_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &idx_t));
    int32_t* idx = idx_t->flat<int32_t>().data();
    std::vector<int64_t> uniq;
    Dedup(ids.flat<int64_t>().data(), n, &uniq, idx);
    const int64_t u = static_cast<int64_t>(uniq.size());
    Tensor* keys_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({u}), &keys_t));
    std::copy(uniq.begin(), uniq.end(), keys_t->flat<int64_t>().data());

    Tensor rows_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_FLOAT, TensorShape({u, dim_}), &rows_t));
    const float* rows = rows_t.flat<float>().data();
    OP_REQUIRES_OK(ctx, Probe(ctx, table.get(), keys_t->flat<int64_t>().data(), u, step, rows_t.flat<float>().data()));

    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim_}), &values));
    float* out = values->flat<float>().data();
    const int64_t dim = dim_;
    ParallelRows(ctx, n, 4 * dim, [=](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        std::memcpy(out + i * dim, rows + static_cast<int64_t>(idx[i]) * dim, sizeof(float) * dim);
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupIds").Device(DEVICE_CPU), EmbeddingLookupIdsOp);

// ---------------------------------------------------------------------------
// TfExtEmbeddingLookupIdsGrad(grad [n, dim], idx [n], unique_keys [u]) -> [u, dim]
//
// The gradient of TfExtEmbeddingLookupIds per unique key: out[j] = sum of
// grad[i] over the i with idx[i] == j, added in increasing i (the order of
// tf.math.unsorted_segment_sum on CPU).

class EmbeddingLookupIdsGradOp : public OpKernel {
 public:
  explicit EmbeddingLookupIdsGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const char* op = "TfExtEmbeddingLookupIdsGrad";
    const Tensor& grad = ctx->input(0);
    const Tensor& idx_t = ctx->input(1);
    const Tensor& keys = ctx->input(2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(idx_t.shape()),
                InvalidArgument(op, ": idx must be an int32 vector, got shape ", idx_t.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(keys.shape()),
                InvalidArgument(op, ": unique_keys must be an int64 vector, got shape ", keys.shape().DebugString()));
    const int64_t n = idx_t.dim_size(0);
    const int64_t u = keys.dim_size(0);
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == n,
                InvalidArgument(op, ": grad must have shape [", n, ", dim] (one row per id), got shape ",
                                grad.shape().DebugString()));
    const int64_t dim = grad.dim_size(1);
    const int32_t* idx = idx_t.flat<int32_t>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(
          ctx, idx[i] >= 0 && idx[i] < u,
          InvalidArgument(op, ": idx[", i, "] = ", idx[i], " is not in [0, ", u, ") (the number of unique keys)"));
    }
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, dim}), &out_t));
    float* out = out_t->flat<float>().data();
    const float* g = grad.flat<float>().data();
    // Each part owns a range of unique indices and scans all of idx, so no
    // two threads write the same row and every row adds in increasing i.
    const tensorflow::DeviceBase::CpuWorkerThreads* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t threads = (workers == nullptr || workers->workers == nullptr) ? 1 : workers->num_threads;
    const int64_t parts = (n * dim >= (int64_t{1} << 16) && threads > 1) ? threads : 1;
    auto run = [=](int64_t first_part, int64_t end_part) {
      for (int64_t part = first_part; part < end_part; ++part) {
        const int64_t lo = u * part / parts, hi = u * (part + 1) / parts;
        std::memset(out + lo * dim, 0, sizeof(float) * (hi - lo) * dim);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j = idx[i];
          if (j < lo || j >= hi) continue;
          float* dst = out + j * dim;
          const float* src = g + i * dim;
          for (int64_t c = 0; c < dim; ++c) dst[c] += src[c];
        }
      }
    };
    if (parts == 1) {
      run(0, 1);
    } else {
      workers->workers->ParallelFor(parts, n * dim, run);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupIdsGrad").Device(DEVICE_CPU), EmbeddingLookupIdsGradOp);

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookup").Device(DEVICE_CPU), EmbeddingLookupOp);

// ---------------------------------------------------------------------------
// TfExtEmbeddingLookupMulti(table_handles [N], keys [N], steps [N]) -> values [N]
//
// N TfExtEmbeddingLookup in one kernel: table i reads keys[i] with the i-th
// entry of every list attr. What the graph passes put in place of N
// independent lookups; the results are those of the N single lookups.

template <typename T>
tensorflow::Status ListAttr(OpKernelConstruction* ctx, const char* name, int n, std::vector<T>* out) {
  TF_RETURN_IF_ERROR(ctx->GetAttr(name, out));
  if (static_cast<int>(out->size()) != n) {
    return InvalidArgument(ctx->def().op(), ": attr ", name, " must have N=", n, " entries, got ", out->size());
  }
  return tensorflow::OkStatus();
}

// The per-table lookup attrs of a multi-table lookup (TFEXT_MULTI_LOOKUP_ATTRS):
// one entry per table of each of the single lookup's attrs.
struct MultiLookupAttrs {
  int n = 0;
  std::vector<int64_t> dims;
  std::vector<bool> insert_missing;
  std::vector<bool> count;
  std::vector<RowInitializer> init;

  tensorflow::Status Parse(OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("N", &n));
    std::vector<std::string> kinds;
    std::vector<float> a, b;
    std::vector<int64_t> seed, seed2;
    TF_RETURN_IF_ERROR(ListAttr(ctx, "dims", n, &dims));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "insert_missing", n, &insert_missing));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "count", n, &count));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "init_kind", n, &kinds));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "init_a", n, &a));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "init_b", n, &b));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "seed", n, &seed));
    TF_RETURN_IF_ERROR(ListAttr(ctx, "seed2", n, &seed2));
    init.resize(n);
    for (int i = 0; i < n; ++i) {
      if (dims[i] < 1) return InvalidArgument(ctx->def().op(), ": dims[", i, "] must be >= 1, got ", dims[i]);
      const tensorflow::Status s = init[i].Init(kinds[i], a[i], b[i], seed[i], seed2[i]);
      if (!s.ok()) return InvalidArgument(ctx->def().op(), ": table ", i, ": ", s.message());
    }
    return tensorflow::OkStatus();
  }
};

class EmbeddingLookupMultiOp : public OpKernel {
 public:
  explicit EmbeddingLookupMultiOp(OpKernelConstruction* ctx) : OpKernel(ctx) { OP_REQUIRES_OK(ctx, a_.Parse(ctx)); }

  void Compute(OpKernelContext* ctx) override {
    const char* op = "TfExtEmbeddingLookupMulti";
    std::vector<RefCountPtr<TableResource>> tables(a_.n);
    std::vector<const int64_t*> keys(a_.n);
    std::vector<int64_t> sizes(a_.n), steps(a_.n), work(a_.n);
    std::vector<float*> out(a_.n);
    for (int i = 0; i < a_.n; ++i) {
      OP_REQUIRES_OK(ctx, GetTableResource(ctx, i, &tables[i]));
      OP_REQUIRES(ctx, tables[i]->dim() == a_.dims[i],
                  InvalidArgument(op, ": table ", i, ": attr dims[", i, "]=", a_.dims[i],
                                  " does not match the table's dim=", tables[i]->dim(),
                                  " (table layout: ", tables[i]->layout().DebugString(), ")"));
      const Tensor& k = ctx->input(a_.n + i);
      OP_REQUIRES(ctx, TensorShapeUtils::IsVector(k.shape()),
                  InvalidArgument(op, ": keys[", i, "] must be a vector of unique int64 keys, got shape ",
                                  k.shape().DebugString()));
      OP_REQUIRES_OK(ctx, ScalarStep(ctx->input(2 * a_.n + i), op, &steps[i]));
      sizes[i] = k.dim_size(0);
      keys[i] = k.flat<int64_t>().data();
      work[i] = sizes[i] * a_.dims[i];
      Tensor* values = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({sizes[i], a_.dims[i]}), &values));
      out[i] = values->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, RunPerTable(ctx, work, [&](int i, const table::ParallelFor& pf) {
                     return ProbeRows(tables[i].get(), a_.dims[i], a_.insert_missing[i], a_.count[i], a_.init[i],
                                      keys[i], sizes[i], steps[i], out[i], pf);
                   }));
  }

 private:
  MultiLookupAttrs a_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupMulti").Device(DEVICE_CPU), EmbeddingLookupMultiOp);

// ---------------------------------------------------------------------------
// TfExtEmbeddingLookupSparse(table_handle, indices [nnz, rank], ids [nnz],
//     dense_shape [rank], default_key [0 or 1], step)
//     -> values [rows, dim], unique_keys [u], idx [m], entry_rows [m], row_scale [rows]
//
// The whole pooled lookup of one feature in one kernel (what
// embedding_lookup_sparse / safe_embedding_lookup_sparse build from ~20 TF
// ops: unique, lookup, gather, fill_empty_rows, sparse_segment_<combiner>).
// m = nnz, plus one entry per empty row filled with the default key.

enum class Combiner { kSum, kMean, kSqrtN };

tensorflow::Status ParseCombiner(const std::string& s, Combiner* out) {
  if (s == "sum") {
    *out = Combiner::kSum;
  } else if (s == "mean") {
    *out = Combiner::kMean;
  } else if (s == "sqrtn") {
    *out = Combiner::kSqrtN;
  } else {
    return InvalidArgument("combiner must be 'sum', 'mean' or 'sqrtn', got '", s, "'");
  }
  return tensorflow::OkStatus();
}

// One table's pooled lookup: its attrs.
struct SparseLookupSpec {
  int64_t dim = 0;
  bool insert_missing = false;
  bool count = true;
  Combiner combiner = Combiner::kMean;
  bool fill_empty_rows = false;
  const RowInitializer* init = nullptr;
};

// One table's pooled lookup: its inputs. Preconditions (checked by
// CheckSparseInputs): indices is [nnz, rank >= 1], ids [nnz], dense_shape
// [rank], default_key [0 or 1] (0 unless fill_empty_rows).
struct SparseLookupInputs {
  const Tensor* indices = nullptr;
  const Tensor* ids = nullptr;
  const Tensor* dense_shape = nullptr;
  const Tensor* default_key = nullptr;
  int64_t step = -1;
};

tensorflow::Status CheckSparseInputs(const char* op, const SparseLookupSpec& spec, const SparseLookupInputs& in) {
  const Tensor& indices = *in.indices;
  const Tensor& ids = *in.ids;
  if (indices.dims() != 2 || indices.dim_size(1) < 1) {
    return InvalidArgument(op, ": indices must be [nnz, rank] with rank >= 1, got shape ",
                           indices.shape().DebugString());
  }
  if (!TensorShapeUtils::IsVector(ids.shape()) || ids.dim_size(0) != indices.dim_size(0)) {
    return InvalidArgument(op, ": ids must be a vector of ", indices.dim_size(0),
                           " keys (one per row of indices), got shape ", ids.shape().DebugString());
  }
  if (!TensorShapeUtils::IsVector(in.dense_shape->shape()) || in.dense_shape->dim_size(0) != indices.dim_size(1)) {
    return InvalidArgument(op, ": dense_shape must be a vector of ", indices.dim_size(1),
                           " (the rank of indices), got shape ", in.dense_shape->shape().DebugString());
  }
  if (!TensorShapeUtils::IsVector(in.default_key->shape()) || in.default_key->dim_size(0) > 1 ||
      (!spec.fill_empty_rows && in.default_key->dim_size(0) != 0)) {
    return InvalidArgument(op, ": default_key must hold ", spec.fill_empty_rows ? "0 or 1" : "0 (no fill_empty_rows)",
                           " keys, got shape ", in.default_key->shape().DebugString());
  }
  if (indices.dim_size(0) >= std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(op, ": at most 2^31 - 2 ids per call, got ", indices.dim_size(0));
  }
  return tensorflow::OkStatus();
}

// The dedup and row bookkeeping of one pooled lookup (no table access).
// Entries are ordered by row (stable: a row's ids in input order, then the
// default key of a filled empty row): the order in which TensorFlow's sorted
// segment reductions, and their gradients, visit them.
struct SparsePlan {
  int64_t rows = 0;                // output rows
  std::vector<int64_t> uniq;       // unique keys
  std::vector<int32_t> idx;        // per entry: index into uniq
  std::vector<int32_t> entry_row;  // per entry: output row
  std::vector<int64_t> row_begin;  // entries of row r: [row_begin[r], row_begin[r + 1])
  std::vector<float> row_scale;    // per output row: the gradient's factor
};

tensorflow::Status PlanSparseLookup(const char* op, const SparseLookupSpec& spec, const SparseLookupInputs& in,
                                    SparsePlan* plan) {
  const int64_t nnz = in.ids->dim_size(0);
  const int64_t rank = in.indices->dim_size(1);
  const int64_t* ind = in.indices->flat<int64_t>().data();
  const int64_t batch = in.dense_shape->flat<int64_t>()(0);
  int64_t rows = 0;
  if (spec.fill_empty_rows) {
    if (batch < 0 || batch >= std::numeric_limits<int32_t>::max()) {
      return InvalidArgument(op, ": dense_shape[0] = ", batch, " is not in [0, 2^31 - 1)");
    }
    rows = batch;
  }
  std::vector<int32_t> row_of(nnz);
  for (int64_t e = 0; e < nnz; ++e) {
    const int64_t r = ind[e * rank];
    if (r < 0 || (spec.fill_empty_rows && r >= batch) || r >= std::numeric_limits<int32_t>::max()) {
      return InvalidArgument(op, ": indices[", e, ", 0] = ", r, " is not a row in [0, ",
                             spec.fill_empty_rows ? batch : int64_t{std::numeric_limits<int32_t>::max()}, ")");
    }
    row_of[e] = static_cast<int32_t>(r);
    if (!spec.fill_empty_rows && r >= rows) rows = r + 1;
  }
  plan->rows = rows;
  const bool has_default = in.default_key->NumElements() == 1;
  std::vector<int64_t> counts(rows, 0);
  for (int64_t e = 0; e < nnz; ++e) ++counts[row_of[e]];
  // An empty row gets one entry, the default key, where there is one.
  const auto filled = [&](int64_t r) { return has_default && counts[r] == 0; };

  std::vector<int64_t> keys(in.ids->flat<int64_t>().data(), in.ids->flat<int64_t>().data() + nnz);
  if (has_default) keys.push_back(in.default_key->flat<int64_t>()(0));
  std::vector<int32_t> key_idx(keys.size());
  Dedup(keys.data(), static_cast<int64_t>(keys.size()), &plan->uniq, key_idx.data());

  // Row offsets (a filled row holds one entry), then the entries by row.
  plan->row_begin.assign(rows + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    plan->row_begin[r + 1] = plan->row_begin[r] + (filled(r) ? 1 : counts[r]);
  }
  const int64_t m = plan->row_begin[rows];
  plan->idx.resize(m);
  plan->entry_row.resize(m);
  std::vector<int64_t> next(plan->row_begin.begin(), plan->row_begin.end() - 1);
  for (int64_t e = 0; e < nnz; ++e) {
    const int64_t at = next[row_of[e]]++;
    plan->idx[at] = key_idx[e];
    plan->entry_row[at] = row_of[e];
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (!filled(r)) continue;
    plan->idx[next[r]] = key_idx[nnz];
    plan->entry_row[next[r]] = static_cast<int32_t>(r);
  }
  // The gradient's factor per row: TensorFlow's sparse segment gradient
  // computes 1/n and 1/sqrt(n) in double and rounds them to float.
  plan->row_scale.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = plan->row_begin[r + 1] - plan->row_begin[r];
    double s = 0.0;
    if (n > 0) {
      switch (spec.combiner) {
        case Combiner::kSum:
          s = 1.0;
          break;
        case Combiner::kMean:
          s = 1.0 / static_cast<double>(n);
          break;
        case Combiner::kSqrtN:
          s = 1.0 / std::sqrt(static_cast<double>(n));
          break;
      }
    }
    plan->row_scale[r] = static_cast<float>(s);
  }
  return tensorflow::OkStatus();
}

// Probes the plan's unique keys (their rows into unique_rows [u, dim]) and
// writes the combined rows into values [plan.rows, dim] (every row is
// written). A row's rows are added in TensorFlow's sparse-segment order (the
// first 2-9 together and scaled, then blocks of 8; 1/n applied as a factor for
// fewer than 10 ids, as a division from 10 on), so the results equal
// tf.nn.embedding_lookup_sparse's bit for bit.
tensorflow::Status CombineSparseLookup(TableResource* table, const SparseLookupSpec& spec, const SparsePlan& plan,
                                       int64_t step, float* unique_rows, float* values, const table::ParallelFor& pf) {
  const int64_t dim = spec.dim;
  const int64_t u = static_cast<int64_t>(plan.uniq.size());
  TF_RETURN_IF_ERROR(
      ProbeRows(table, dim, spec.insert_missing, spec.count, *spec.init, plan.uniq.data(), u, step, unique_rows, pf));
  const bool mean = spec.combiner == Combiner::kMean, sqrtn = spec.combiner == Combiner::kSqrtN;
  for (int64_t r = 0; r < plan.rows; ++r) {
    const int64_t begin = plan.row_begin[r], n = plan.row_begin[r + 1] - begin;
    float* out = values + r * dim;
    if (n == 0) {
      std::memset(out, 0, sizeof(float) * dim);
      continue;
    }
    const int32_t* ids = plan.idx.data() + begin;
    auto row = [&](int64_t k) { return unique_rows + static_cast<int64_t>(ids[k]) * dim; };
    if (n == 1) {
      std::memcpy(out, row(0), sizeof(float) * dim);
      continue;
    }
    int64_t head = n & 7;
    if (head == 0) head = 8;
    if (head == 1) head = 9;
    float scale = 1.0f;
    if (n < 10 && mean) scale = 1.0f / static_cast<float>(n);
    if (n < 10 && sqrtn) scale = 1.0f / static_cast<float>(std::sqrt(static_cast<double>(n)));
    for (int64_t c = 0; c < dim; ++c) {
      float acc = row(0)[c];
      for (int64_t k = 1; k < head; ++k) acc += row(k)[c];
      out[c] = acc * scale;
    }
    for (int64_t k = head; k < n; k += 8) {
      for (int64_t c = 0; c < dim; ++c) {
        float block = row(k)[c];
        for (int64_t j = 1; j < 8; ++j) block += row(k + j)[c];
        out[c] += block;
      }
    }
    if (n >= 10 && (mean || sqrtn)) {
      const float divisor = mean ? static_cast<float>(n) : static_cast<float>(std::sqrt(static_cast<double>(n)));
      for (int64_t c = 0; c < dim; ++c) out[c] = out[c] / divisor;
    }
  }
  return tensorflow::OkStatus();
}

// The outputs of table i of an op with n tables (each output a list of n).
struct SparseOutputs {
  Tensor* values = nullptr;
  Tensor* unique_keys = nullptr;
  Tensor* idx = nullptr;
  Tensor* entry_rows = nullptr;
  Tensor* row_scale = nullptr;
  Tensor* unique_rows = nullptr;
};

tensorflow::Status AllocateSparseOutputs(OpKernelContext* ctx, int n, int i, int64_t dim, const SparsePlan& plan,
                                         SparseOutputs* out) {
  const int64_t u = static_cast<int64_t>(plan.uniq.size());
  const int64_t m = static_cast<int64_t>(plan.idx.size());
  TF_RETURN_IF_ERROR(ctx->allocate_output(i, TensorShape({plan.rows, dim}), &out->values));
  TF_RETURN_IF_ERROR(ctx->allocate_output(n + i, TensorShape({u}), &out->unique_keys));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2 * n + i, TensorShape({m}), &out->idx));
  TF_RETURN_IF_ERROR(ctx->allocate_output(3 * n + i, TensorShape({m}), &out->entry_rows));
  TF_RETURN_IF_ERROR(ctx->allocate_output(4 * n + i, TensorShape({plan.rows}), &out->row_scale));
  TF_RETURN_IF_ERROR(ctx->allocate_output(5 * n + i, TensorShape({u, dim}), &out->unique_rows));
  std::copy(plan.uniq.begin(), plan.uniq.end(), out->unique_keys->flat<int64_t>().data());
  std::copy(plan.idx.begin(), plan.idx.end(), out->idx->flat<int32_t>().data());
  std::copy(plan.entry_row.begin(), plan.entry_row.end(), out->entry_rows->flat<int32_t>().data());
  std::copy(plan.row_scale.begin(), plan.row_scale.end(), out->row_scale->flat<float>().data());
  return tensorflow::OkStatus();
}

// Runs fn, turning a failed host allocation (std::bad_alloc from the plan's
// vectors) into a ResourceExhausted error of the op instead of an exception
// out of the kernel.
template <typename Fn>
tensorflow::Status NoThrow(const char* op, const Fn& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return tensorflow::errors::ResourceExhausted(op, ": out of host memory for the lookup's bookkeeping");
  }
}

class EmbeddingLookupSparseOp : public LookupBase {
 public:
  explicit EmbeddingLookupSparseOp(OpKernelConstruction* ctx) : LookupBase(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    OP_REQUIRES_OK(ctx, ParseCombiner(combiner, &spec_.combiner));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fill_empty_rows", &spec_.fill_empty_rows));
    spec_.dim = dim_;
    spec_.insert_missing = insert_missing_;
    spec_.count = count_;
    spec_.init = &init_;
  }

  void Compute(OpKernelContext* ctx) override {
    const char* op = "TfExtEmbeddingLookupSparse";
    RefCountPtr<TableResource> table;
    OP_REQUIRES_OK(ctx, Table(ctx, op, &table));
    const SparseLookupSpec& spec = spec_;
    SparseLookupInputs in{&ctx->input(1), &ctx->input(2), &ctx->input(3), &ctx->input(4)};
    OP_REQUIRES_OK(ctx, ScalarStep(ctx->input(5), op, &in.step));
    OP_REQUIRES_OK(ctx, CheckSparseInputs(op, spec, in));
    OP_REQUIRES_OK(ctx, NoThrow(op, [&]() -> tensorflow::Status {
                     SparsePlan plan;
                     TF_RETURN_IF_ERROR(PlanSparseLookup(op, spec, in, &plan));
                     SparseOutputs out;
                     TF_RETURN_IF_ERROR(AllocateSparseOutputs(ctx, 1, 0, dim_, plan, &out));
                     return CombineSparseLookup(table.get(), spec, plan, in.step, out.unique_rows->flat<float>().data(),
                                                out.values->flat<float>().data(), MakeParallelFor(ctx));
                   }));
  }

 private:
  SparseLookupSpec spec_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupSparse").Device(DEVICE_CPU), EmbeddingLookupSparseOp);

class EmbeddingLookupSparseMultiOp : public OpKernel {
 public:
  explicit EmbeddingLookupSparseMultiOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    const char* op = "TfExtEmbeddingLookupSparseMulti";
    MultiLookupAttrs attrs;
    OP_REQUIRES_OK(ctx, attrs.Parse(ctx));
    n_ = attrs.n;
    init_ = std::move(attrs.init);
    std::vector<std::string> combiners;
    std::vector<bool> fill;
    OP_REQUIRES_OK(ctx, ListAttr(ctx, "combiner", n_, &combiners));
    OP_REQUIRES_OK(ctx, ListAttr(ctx, "fill_empty_rows", n_, &fill));
    spec_.resize(n_);
    for (int i = 0; i < n_; ++i) {
      const tensorflow::Status s = ParseCombiner(combiners[i], &spec_[i].combiner);
      OP_REQUIRES(ctx, s.ok(), InvalidArgument(op, ": table ", i, ": ", s.message()));
      spec_[i].dim = attrs.dims[i];
      spec_[i].insert_missing = attrs.insert_missing[i];
      spec_[i].count = attrs.count[i];
      spec_[i].fill_empty_rows = fill[i];
      spec_[i].init = &init_[i];
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const char* op = "TfExtEmbeddingLookupSparseMulti";
    const int n = n_;
    std::vector<RefCountPtr<TableResource>> tables(n);
    std::vector<SparseLookupInputs> in(n);
    std::vector<int64_t> work(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, GetTableResource(ctx, i, &tables[i]));
      OP_REQUIRES(ctx, tables[i]->dim() == spec_[i].dim,
                  InvalidArgument(op, ": table ", i, ": attr dims[", i, "]=", spec_[i].dim,
                                  " does not match the table's dim=", tables[i]->dim(),
                                  " (table layout: ", tables[i]->layout().DebugString(), ")"));
      in[i] = SparseLookupInputs{&ctx->input(n + i), &ctx->input(2 * n + i), &ctx->input(3 * n + i),
                                 &ctx->input(4 * n + i)};
      OP_REQUIRES_OK(ctx, ScalarStep(ctx->input(5 * n + i), op, &in[i].step));
      OP_REQUIRES_OK(ctx, CheckSparseInputs(op, spec_[i], in[i]));
      work[i] = in[i].ids->NumElements() * spec_[i].dim;
    }
    // Each table in one go (dedup, outputs, probe and combine), the tables in parallel. allocate_output is
    // not safe to call concurrently: the allocations take a lock.
    std::mutex allocate_mu;
    OP_REQUIRES_OK(ctx, RunPerTable(ctx, work, [&](int i, const table::ParallelFor& pf) {
                     return NoThrow(op, [&]() -> tensorflow::Status {
                       SparsePlan plan;
                       TF_RETURN_IF_ERROR(PlanSparseLookup(op, spec_[i], in[i], &plan));
                       SparseOutputs out;
                       {
                         std::lock_guard<std::mutex> lock(allocate_mu);
                         TF_RETURN_IF_ERROR(AllocateSparseOutputs(ctx, n, i, spec_[i].dim, plan, &out));
                       }
                       return CombineSparseLookup(tables[i].get(), spec_[i], plan, in[i].step,
                                                  out.unique_rows->flat<float>().data(),
                                                  out.values->flat<float>().data(), pf);
                     });
                   }));
  }

 private:
  int n_ = 0;
  std::vector<RowInitializer> init_;
  std::vector<SparseLookupSpec> spec_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupSparseMulti").Device(DEVICE_CPU), EmbeddingLookupSparseMultiOp);

// ---------------------------------------------------------------------------
// TfExtEmbeddingLookupSparseGrad(grad [rows, dim], entry_rows [m], row_scale [rows], idx [m], unique_keys [u])
//     -> [u, dim]

tensorflow::Status SparseGradOne(const char* op, const Tensor& grad, const Tensor& entry_rows_t,
                                 const Tensor& row_scale_t, const Tensor& idx_t, const Tensor& keys,
                                 OpKernelContext* ctx, int output, Tensor** out_t) {
  if (grad.dims() != 2) return InvalidArgument(op, ": grad must be [rows, dim], got ", grad.shape().DebugString());
  const int64_t rows = grad.dim_size(0), dim = grad.dim_size(1);
  if (!TensorShapeUtils::IsVector(row_scale_t.shape()) || row_scale_t.dim_size(0) != rows) {
    return InvalidArgument(op, ": row_scale must be a vector of ", rows, " (the rows of grad), got shape ",
                           row_scale_t.shape().DebugString());
  }
  if (!TensorShapeUtils::IsVector(idx_t.shape()) || !TensorShapeUtils::IsVector(entry_rows_t.shape()) ||
      idx_t.dim_size(0) != entry_rows_t.dim_size(0)) {
    return InvalidArgument(op, ": idx and entry_rows must be vectors of one length, got shapes ",
                           idx_t.shape().DebugString(), " and ", entry_rows_t.shape().DebugString());
  }
  if (!TensorShapeUtils::IsVector(keys.shape())) {
    return InvalidArgument(op, ": unique_keys must be a vector, got shape ", keys.shape().DebugString());
  }
  const int64_t m = idx_t.dim_size(0), u = keys.dim_size(0);
  const int32_t* idx = idx_t.flat<int32_t>().data();
  const int32_t* er = entry_rows_t.flat<int32_t>().data();
  for (int64_t e = 0; e < m; ++e) {
    if (idx[e] < 0 || idx[e] >= u || er[e] < 0 || er[e] >= rows) {
      return InvalidArgument(op, ": entry ", e, " (idx ", idx[e], ", row ", er[e], ") is outside [0, ", u, ") x [0, ",
                             rows, ")");
    }
  }
  TF_RETURN_IF_ERROR(ctx->allocate_output(output, TensorShape({u, dim}), out_t));
  float* out = (*out_t)->flat<float>().data();
  const float* g = grad.flat<float>().data();
  const float* scale = row_scale_t.flat<float>().data();
  std::memset(out, 0, sizeof(float) * u * dim);
  for (int64_t e = 0; e < m; ++e) {
    float* dst = out + static_cast<int64_t>(idx[e]) * dim;
    const float* src = g + static_cast<int64_t>(er[e]) * dim;
    const float s = scale[er[e]];
    for (int64_t c = 0; c < dim; ++c) dst[c] += src[c] * s;
  }
  return tensorflow::OkStatus();
}

class EmbeddingLookupSparseGradOp : public OpKernel {
 public:
  explicit EmbeddingLookupSparseGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, SparseGradOne("TfExtEmbeddingLookupSparseGrad", ctx->input(0), ctx->input(1), ctx->input(2),
                                      ctx->input(3), ctx->input(4), ctx, 0, &out));
  }
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupSparseGrad").Device(DEVICE_CPU), EmbeddingLookupSparseGradOp);

class EmbeddingLookupSparseGradMultiOp : public OpKernel {
 public:
  explicit EmbeddingLookupSparseGradMultiOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n_));
  }
  void Compute(OpKernelContext* ctx) override {
    const int n = n_;
    for (int i = 0; i < n; ++i) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx,
                     SparseGradOne("TfExtEmbeddingLookupSparseGradMulti", ctx->input(i), ctx->input(n + i),
                                   ctx->input(2 * n + i), ctx->input(3 * n + i), ctx->input(4 * n + i), ctx, i, &out));
    }
  }

 private:
  int n_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TfExtEmbeddingLookupSparseGradMulti").Device(DEVICE_CPU),
                        EmbeddingLookupSparseGradMultiOp);

// ---------------------------------------------------------------------------
// TfExtShardIndex(keys, num_shards) -> HashKey(keys) % num_shards

class ShardIndexOp : public OpKernel {
 public:
  explicit ShardIndexOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& num_shards_t = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(num_shards_t.shape()),
                InvalidArgument("TfExtShardIndex: num_shards must be an int32 scalar, got shape ",
                                num_shards_t.shape().DebugString()));
    const int32_t num_shards = num_shards_t.scalar<int32_t>()();
    OP_REQUIRES(ctx, num_shards >= 1, InvalidArgument("TfExtShardIndex: num_shards must be >= 1, got ", num_shards));
    Tensor* ids = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &ids));
    const int64_t n = keys.NumElements();
    const int64_t* k = keys.flat<int64_t>().data();
    int32_t* out = ids->flat<int32_t>().data();
    const uint64_t m = static_cast<uint64_t>(num_shards);
    if (m == 1) {
      for (int64_t i = 0; i < n; ++i) out[i] = 0;
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<int32_t>(table::HashKey(k[i]) % m);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("TfExtShardIndex").Device(DEVICE_CPU), ShardIndexOp);

}  // namespace
}  // namespace tfext
