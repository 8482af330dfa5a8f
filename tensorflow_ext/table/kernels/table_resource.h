// tensorflow_ext: the TF resource that wraps the table core.
//
// TableResource owns a tfext::table::HashTable and implements
// tensorflow::lookup::LookupInterface (key int64 scalar, value float32 [dim]),
// so TF's LookupTableFindV2/InsertV2/RemoveV2/ExportV2/SizeV2/ImportV2 work on
// a tf_ext table handle. The resource is registered in the ResourceMgr under
// the lookup::LookupInterface type (that is what TF's lookup ops look up);
// GetTableResource() below recovers the TableResource from such a handle.
//
// Layout: rows are `width` floats = [embedding (dim) | slot columns]. The
// LookupInterface methods read/write the embedding columns [0, dim); new keys
// get column_defaults() for the other columns. A layout may store its leading
// columns compactly (TableLayout::storage); every method here still takes
// and returns float32 (the core converts).
//
// This header is a stable interface: the fused optimizer kernels
// (tensorflow_ext/embedding/kernels) build on it.

#ifndef TENSORFLOW_EXT_TABLE_KERNELS_TABLE_RESOURCE_H_
#define TENSORFLOW_EXT_TABLE_KERNELS_TABLE_RESOURCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/refcount.h"
#include "tensorflow/core/lib/core/status.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow_ext/table/core/hash_table.h"

namespace tfext {

// The layout of a table, as given by the TfExtTableHandle attrs.
//
// Storage: the leading `compact_cols` columns of every row are stored in
// `storage` (row_codec.h: bf16, fp16 or an int8 row), the others as float32;
// callers always read and write float32 columns (the core decodes and
// rounds). Plain float32 rows are storage kFloat32 with compact_cols 0; a
// compact storage takes compact_cols in [1, width]. `rounding` is how the
// core rounds optimizer updates and initialised new rows into compact
// columns (other writes round to nearest); int8 rows round to nearest only.
struct TableLayout {
  int64_t dim = 1;
  int64_t width = 1;
  // Empty (= zeros) or exactly `width` entries.
  std::vector<float> column_defaults;
  table::RowStorage storage = table::RowStorage::kFloat32;
  int64_t compact_cols = 0;
  table::Rounding rounding = table::Rounding::kNearest;

  // Returns OK or an InvalidArgument naming the problem (dim < 1,
  // width < dim, column_defaults length not in {0, width}, compact_cols
  // outside [0, width], or not 0 for float32 / 0 for a compact storage,
  // int8 rows with stochastic rounding).
  tensorflow::Status Validate() const;
  // Same layout: dim, width, effective column defaults, storage and
  // compact_cols, and the rounding of compact rows (a float32 table rounds
  // nothing, so its rounding attr does not matter).
  bool SameAs(const TableLayout& other) const;
  // "dim=8, width=24, column_defaults=[0, ..., 0.1], storage=float32" (long
  // lists abbreviated); a compact layout adds compact_cols and rounding.
  std::string DebugString() const;
};

class TableResource : public tensorflow::lookup::LookupInterface {
 public:
  // `layout` must be valid (TableLayout::Validate) and `options` must pass
  // table::ValidateOptions (the core throws std::invalid_argument otherwise).
  // options.width, storage, compact_cols and rounding are set from the
  // layout. May throw std::bad_alloc; use Create() from a kernel.
  TableResource(const TableLayout& layout, table::TableOptions options);

  // Creates a table; InvalidArgument for invalid options, ResourceExhausted
  // if its memory cannot be had. Never throws.
  static tensorflow::Status Create(const TableLayout& layout, const table::TableOptions& options, TableResource** out);

  // The core table; thread-safe, so callers need no extra lock.
  table::HashTable* table() { return table_.get(); }
  const table::HashTable* table() const { return table_.get(); }

  // Embedding columns [0, dim) of each row.
  int64_t dim() const { return layout_.dim; }
  // Floats per row (dim + slot columns).
  int64_t width() const { return layout_.width; }
  // Always exactly width() entries (zeros where the attr was empty); pass
  // column_defaults().data() to the core's column_defaults arguments.
  const std::vector<float>& column_defaults() const { return column_defaults_; }
  const TableLayout& layout() const { return layout_; }
  const table::TableOptions& options() const { return options_; }

  // --- lookup::LookupInterface (embedding columns [0, dim)) ---
  // default_value: scalar, [dim], or keys.shape + [dim] (per-key defaults).
  tensorflow::Status Find(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys, tensorflow::Tensor* values,
                          const tensorflow::Tensor& default_value) override;
  // Upsert; values keys.shape + [dim]. Metadata is left unchanged for existing
  // keys (new keys: version 0, frequency 0).
  tensorflow::Status Insert(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys,
                            const tensorflow::Tensor& values) override;
  tensorflow::Status Remove(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys) override;
  size_t size() const override;
  // Outputs "keys" [n] and "values" [n, dim] of the calling op.
  tensorflow::Status ExportValues(tensorflow::OpKernelContext* ctx) override;
  // Replaces the contents (TF restore semantics) in one step (HashTable::Replace).
  tensorflow::Status ImportValues(tensorflow::OpKernelContext* ctx, const tensorflow::Tensor& keys,
                                  const tensorflow::Tensor& values) override;
  tensorflow::DataType key_dtype() const override { return tensorflow::DT_INT64; }
  tensorflow::DataType value_dtype() const override { return tensorflow::DT_FLOAT; }
  tensorflow::TensorShape key_shape() const override { return tensorflow::TensorShape({}); }
  tensorflow::TensorShape value_shape() const override { return tensorflow::TensorShape({layout_.dim}); }
  int64_t MemoryUsed() const override;
  std::string DebugString() const override;

  // --- Change log, for delta checkpoints ---
  // A delta save writes the rows whose version is at least the step of the
  // previous save (ExportSince) and the keys removed since then. A removed
  // key leaves no row to find by version, so while the log is on (from a full
  // save on) removals record their keys here, up to `capacity` keys: past
  // that only the overflow is noted and the next save must be full, so the
  // log's memory is bounded by its capacity (8 bytes a key). Writes that set
  // no version (a preload insert, an import, a clear, a lookup without a
  // step) cannot be found by version either and are noted as "untracked":
  // they make the next save full too. Logging all key sets instead (and
  // comparing them at save time) would hold a copy of every key.
  struct ChangeLogState {
    bool enabled = false;
    bool untracked = false;
    bool overflow = false;
  };
  // Turns the log on (or resets it) with room for `capacity` removed keys.
  void StartChangeLog(int64_t capacity);
  // Called by every kernel that removes keys (absent keys may be included).
  void LogRemovedKeys(const int64_t* keys, int64_t n);
  // Called by every kernel that writes rows without setting their version.
  void NoteUntrackedWrite();
  // Copies the logged keys into *removed and marks them (and the flags seen)
  // as read (removed == nullptr: returns the flags only, marks nothing); CommitChangeLog (after the save succeeded)
  // then drops what the last read saw, keeping what was logged after it.
  ChangeLogState ReadChangeLog(std::vector<int64_t>* removed);
  void CommitChangeLog();

  // The row references of the table's last training lookup (see
  // HashTable::UpdateRows): the removal epoch read before the lookup, one
  // reference per key, and the keys' fingerprint. A fused optimizer update of
  // the same keys (the lookup gradient's indices) takes them to skip its
  // probe; any other update misses the fingerprint. Only a hint: UpdateRows
  // verifies every reference it uses.
  struct RowRefs {
    uint64_t fingerprint = 0;  // set by SetLastLookupRefs
    uint64_t epoch = 0;
    std::vector<uint64_t> refs;
  };
  // Keeps `refs` (refs->refs[i] is the row of keys[i], n keys) for the update.
  void SetLastLookupRefs(const int64_t* keys, int64_t n, std::shared_ptr<RowRefs> refs);
  // The last lookup's references if it had exactly these n keys, else null.
  std::shared_ptr<const RowRefs> LastLookupRefs(const int64_t* keys, int64_t n) const;

 private:
  mutable tensorflow::mutex refs_mu_;
  std::shared_ptr<const RowRefs> last_refs_ TF_GUARDED_BY(refs_mu_);

  ~TableResource() override;

  mutable tensorflow::mutex log_mu_;
  std::atomic<bool> log_enabled_{false};
  int64_t log_capacity_ TF_GUARDED_BY(log_mu_) = 0;
  std::vector<int64_t> log_removed_ TF_GUARDED_BY(log_mu_);
  // Event sequence numbers: the last event, the last untracked write, the
  // last overflow (0 = none), and the last event and log size a read saw.
  uint64_t log_seq_ TF_GUARDED_BY(log_mu_) = 0;
  uint64_t log_untracked_seq_ TF_GUARDED_BY(log_mu_) = 0;
  uint64_t log_overflow_seq_ TF_GUARDED_BY(log_mu_) = 0;
  uint64_t log_read_seq_ TF_GUARDED_BY(log_mu_) = 0;
  size_t log_read_size_ TF_GUARDED_BY(log_mu_) = 0;

  TableLayout layout_;
  table::TableOptions options_;
  std::vector<float> column_defaults_;
  std::unique_ptr<table::HashTable> table_;
};

// A table::ParallelFor running on the op's intra-op thread pool
// (ctx->device()->tensorflow_cpu_worker_threads()). cost_per_unit is the
// estimated cost (in cycles) of one unit of `total`; the default suits the
// core's coarse units (a block of 8-16K keys, or a shard of a batch: ~1M
// cycles each), so that Eigen's cost model spreads even 2 units over 2
// threads (with 100000 it ran 2-3 units on one thread). Falls back to inline
// execution when the context has no worker pool.
table::ParallelFor MakeParallelFor(tensorflow::OpKernelContext* ctx, int64_t cost_per_unit = 1000000);

// The status for a table operation `what` (e.g. "insert") that failed because
// the core threw `error`: ResourceExhausted naming the operation, the table
// and the core's message (out of memory, or a full shard).
tensorflow::Status TableMemoryError(const TableResource& table, const char* what, const std::exception& error);

// Runs fn(), a call into table's core, and returns OK, or the error status
// of an exception it threw (see TableMemoryError). Kernels must reach the
// core only through this (the table ops and the embedding kernels alike): an
// exception that leaves a kernel terminates the process. The core throws
// only for memory once constructed (std::invalid_argument comes from its
// constructor alone, which Create maps to InvalidArgument). Example:
//   OP_REQUIRES_OK(ctx, CallTable(*table, "insert", [&] { table->table()->Insert(...); }));
template <typename Fn>
tensorflow::Status CallTable(const TableResource& table, const char* what, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const std::bad_alloc& e) {
    return TableMemoryError(table, what, e);
  } catch (const std::length_error& e) {
    return TableMemoryError(table, what, e);
  }
  return tensorflow::OkStatus();
}

// Reads the resource-handle input `input_index` and returns the table it
// refers to. InvalidArgument (naming the input) if the input is not a scalar
// resource handle or the handle is not a tf_ext table (e.g. a variable or a
// TF MutableHashTable); NotFound if the table was never created.
tensorflow::Status GetTableResource(tensorflow::OpKernelContext* ctx, int input_index,
                                    tensorflow::core::RefCountPtr<TableResource>* out);

}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_KERNELS_TABLE_RESOURCE_H_
