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
// Tiers: a table created with a tier path (TierConfig) keeps at most
// memory_bytes of rows in the HashTable (the memory tier) and the others in an
// on-disk store (table::TieredTable). Every key-batched call into the core
// then goes through WithKeys, which first brings the batch's cold keys back
// into memory, and every whole-table operation through the methods below
// (Size, Export, Import, Clear, RemoveIf, ...), which see both tiers. An
// untiered table takes the same paths at the cost of a branch.
//
// This header is a stable interface: the fused optimizer kernels
// (tensorflow_ext/embedding/kernels) build on it.

#ifndef TENSORFLOW_EXT_TABLE_KERNELS_TABLE_RESOURCE_H_
#define TENSORFLOW_EXT_TABLE_KERNELS_TABLE_RESOURCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
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
#include "tensorflow_ext/table/tiered/cold_store.h"
#include "tensorflow_ext/table/tiered/tiered_table.h"

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

// The tier of a table, as given by the TfExtTableHandle attrs tier_path,
// tier_memory_bytes, tier_disk_bytes and tier_policy. An empty path is an
// untiered table (all rows in memory; the other fields must keep their
// defaults).
struct TierConfig {
  std::string path;          // the store's directory (one table's own)
  int64_t memory_bytes = 0;  // the memory tier's budget, > 0 when tiered
  int64_t disk_bytes = 0;    // the disk tier's cap; 0 = unbounded
  table::TierOptions::Policy policy = table::TierOptions::Policy::kLru;

  bool enabled() const { return !path.empty(); }
  // OK or an InvalidArgument naming the attr and the bad value: negative
  // sizes, memory_bytes == 0 with a path, sizes without a path, a tiered
  // table of int8 rows (a serving format: re-quantizing a row that moves
  // between tiers is not exact).
  tensorflow::Status Validate(const TableLayout& layout) const;
  bool SameAs(const TierConfig& other) const;
  // "tier_path=/ssd/t, tier_memory_bytes=1048576, tier_disk_bytes=0,
  // tier_policy=lru", or "untiered".
  std::string DebugString() const;
};

// "lru" | "lfu" (the tier_policy attr).
const char* TierPolicyName(table::TierOptions::Policy policy);
// OK and *out, or InvalidArgument naming the choices.
tensorflow::Status ParseTierPolicy(const std::string& name, table::TierOptions::Policy* out);

class TableResource : public tensorflow::lookup::LookupInterface {
 public:
  // `layout` must be valid (TableLayout::Validate), `tier` too
  // (TierConfig::Validate), and `options` must pass table::ValidateOptions
  // (the core throws std::invalid_argument otherwise). options.width,
  // storage, compact_cols and rounding are set from the layout. `name` (the
  // resource's name) is what error messages call the table. May throw
  // std::bad_alloc, and table::StoreError when the tier's store cannot be
  // opened; use Create() from a kernel.
  TableResource(const TableLayout& layout, table::TableOptions options, const TierConfig& tier = TierConfig(),
                const std::string& name = "");

  // Creates a table; InvalidArgument for invalid options, ResourceExhausted
  // if its memory cannot be had, and for a tier store that cannot be opened
  // the status of its StoreError (see StoreErrorStatus), Internal for any
  // other failure. Never throws.
  static tensorflow::Status Create(const TableLayout& layout, const table::TableOptions& options,
                                   const TierConfig& tier, const std::string& name, TableResource** out);
  static tensorflow::Status Create(const TableLayout& layout, const table::TableOptions& options, TableResource** out) {
    return Create(layout, options, TierConfig(), "", out);
  }

  // The core table (the memory tier of a tiered table); thread-safe, so
  // callers need no extra lock. Key-batched calls must go through WithKeys
  // and whole-table operations through the methods below: on a tiered table
  // the core holds only part of the keys.
  table::HashTable* table() { return table_.get(); }
  const table::HashTable* table() const { return table_.get(); }
  // The tier (null for an untiered table).
  table::TieredTable* tier() { return tier_.get(); }
  const table::TieredTable* tier() const { return tier_.get(); }
  const TierConfig& tier_config() const { return tier_config_; }
  // The directory the tier's store is in ("" untiered): tier_config().path,
  // or, when another table of this process already holds that path, a
  // private sibling "<path>.<k>" (k = 1, 2, ...: the first this process does
  // not hold) that this table deletes when it closes. A store directory is
  // refused only to another process (its file lock): a second table of the
  // same model in one process (an evaluation or export graph in a session of
  // its own, restored from the checkpoint) is a separate cache of that
  // checkpoint, so it takes a directory of its own instead of failing.
  const std::string& tier_dir() const { return tier_dir_; }
  // The resource's name ("" if it was not given).
  const std::string& name() const { return name_; }

  // Embedding columns [0, dim) of each row.
  int64_t dim() const { return layout_.dim; }
  // Floats per row (dim + slot columns).
  int64_t width() const { return layout_.width; }
  // Always exactly width() entries (zeros where the attr was empty); pass
  // column_defaults().data() to the core's column_defaults arguments.
  const std::vector<float>& column_defaults() const { return column_defaults_; }
  const TableLayout& layout() const { return layout_; }
  const table::TableOptions& options() const { return options_; }

  // --- Access by key (both tiers) ---
  // Runs fn(), a call into table() for the keys[0, n) only, through
  // CallTable (so returning the status of anything it throws): on a tiered
  // table with the batch's cold keys brought into memory first and the tier's
  // shared access lock held, so that none of them leaves memory until fn
  // returns (table::TieredTable::WithKeys). Untiered: CallTable(fn). Every
  // kernel that reaches the core by key does so through this; fn must not
  // touch keys outside the batch (they may be on disk). `what` names the
  // operation in error messages.
  template <typename Fn>
  tensorflow::Status WithKeys(const char* what, const int64_t* keys, int64_t n, const table::ParallelFor& pf, Fn&& fn);
  // Removes keys[0, n) (absent ones are ignored) from both tiers, logs them
  // in the change log, and sets *removed to how many were present. A tiered
  // table takes them in chunks of a quarter of its budget: a removal (an
  // eviction by capacity or L2 norm, restrict) may name far more keys than the
  // memory tier holds, and WithKeys refuses a batch that does not fit (its
  // keys on disk come into memory first). A failed chunk leaves the chunks
  // before it removed (and logged).
  tensorflow::Status RemoveKeys(const int64_t* keys, int64_t n, const table::ParallelFor& pf, int64_t* removed);

  // --- Whole-table operations (both tiers) ---
  // These may throw like the core (and table::StoreError on a tiered table):
  // call them inside CallTable.
  // Keys in memory plus keys on disk.
  int64_t Size() const;
  // As HashTable::Export / ExportSince, over both tiers.
  void Export(int64_t col_begin, int64_t cols,
              const std::function<table::HashTable::ExportBuffers(int64_t)>& alloc) const;
  void ExportSince(int64_t min_version, int64_t col_begin, int64_t cols,
                   const std::function<table::HashTable::ExportBuffers(int64_t)>& alloc) const;
  // Writes rows [n, cols] of the column range with their metadata (null:
  // zeros); new keys get column_defaults() elsewhere. clear_first (a
  // restore): the new contents replace the old in one step (untiered:
  // HashTable::Replace, so readers never see a half-filled table); tiered:
  // both tiers are emptied first and rows beyond the budget go to disk as
  // they arrive (TieredTable::Import).
  void Import(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* rows,
              const int64_t* versions, const uint32_t* frequencies, bool clear_first, const table::ParallelFor& pf);
  void Clear();
  // Removes every key (of both tiers) for which pred(key, row, meta) holds
  // (row: width() decoded floats) and logs the removed keys in the change
  // log. pred must not call the table. Returns the number removed.
  int64_t RemoveIf(const std::function<bool(int64_t, const float*, const table::KeyMeta&)>& pred);
  // The tier's counters (TierStats); an untiered table answers its memory
  // numbers and zeros.
  table::TierStats tier_stats() const;
  // Blocks until the memory tier is within its budget and no demotion is in
  // flight (tests, benchmarks); no-op untiered.
  void Settle();

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

  // --- Change log, for delta checkpoints and serving updates ---
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
  //
  // Channels: delta checkpoints and serving updates read and commit the log
  // at their own times, so each reader has its own channel (by name:
  // kCheckpointChannel, "serving", ...) with its own capacity, read marks and
  // commit. Every removal and untracked write goes to every started channel;
  // a channel that was never started reads as disabled and logs nothing.
  static constexpr const char* kCheckpointChannel = "checkpoint";
  struct ChangeLogState {
    bool enabled = false;
    bool untracked = false;
    bool overflow = false;
  };
  // Turns `channel`'s log on (or resets it) with room for `capacity` removed
  // keys. Other channels are unchanged.
  void StartChangeLog(const std::string& channel, int64_t capacity);
  // Called by every kernel that removes keys (absent keys may be included).
  void LogRemovedKeys(const int64_t* keys, int64_t n);
  // Called by every kernel that writes rows without setting their version.
  void NoteUntrackedWrite();
  // Keys that fell off the disk tier are logged as removals too (taken from
  // the tier after each batch and before every read of the log).
  // Copies `channel`'s logged keys into *removed and marks them (and the flags
  // seen) as read (removed == nullptr: returns the flags only, marks nothing);
  // CommitChangeLog (after the save succeeded) then drops what the last read
  // saw, keeping what was logged after it. A commit without a read since the
  // previous commit drops nothing.
  ChangeLogState ReadChangeLog(const std::string& channel, std::vector<int64_t>* removed);
  void CommitChangeLog(const std::string& channel);

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
  // Logs the keys that fell off the disk tier since the last call as removed.
  void LogDroppedKeys();
  // Opens tier_ in tier_config_.path, or in a private sibling of it (see
  // tier_dir()); sets tier_dir_*. Throws like table::TieredTable's constructor.
  void OpenTier();

  mutable tensorflow::mutex refs_mu_;
  std::shared_ptr<const RowRefs> last_refs_ TF_GUARDED_BY(refs_mu_);

  ~TableResource() override;

  // One reader's log (see StartChangeLog).
  struct ChangeLogChannel {
    int64_t capacity = 0;
    std::vector<int64_t> removed;
    // Event sequence numbers: the last event, the last untracked write, the
    // last overflow (0 = none), and the last event and log size a read saw.
    uint64_t seq = 0;
    uint64_t untracked_seq = 0;
    uint64_t overflow_seq = 0;
    uint64_t read_seq = 0;
    size_t read_size = 0;
  };
  mutable tensorflow::mutex log_mu_;
  // Whether any channel was started: removals skip log_mu_ until then.
  std::atomic<bool> log_enabled_{false};
  // The started channels, by name (a handful at most: a map keeps it simple).
  std::map<std::string, ChangeLogChannel> log_channels_ TF_GUARDED_BY(log_mu_);

  TableLayout layout_;
  table::TableOptions options_;
  TierConfig tier_config_;
  std::string name_;
  std::vector<float> column_defaults_;
  std::unique_ptr<table::HashTable> table_;
  // tier_dir(), its key in the process's registry of held store directories
  // (the canonical path), and whether it is a private sibling to delete. The
  // destructor closes tier_ first, then deletes and releases the directory.
  std::string tier_dir_;
  std::string tier_dir_key_;
  bool tier_dir_private_ = false;
  // After table_: destroyed first (it stops its demoter and refers to table_).
  std::unique_ptr<table::TieredTable> tier_;
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

// The status for a table operation `what` that failed in the table's disk
// tier: by error.code(), kNoSpace -> ResourceExhausted, kLocked and kForeign
// -> FailedPrecondition, kCorrupt -> DataLoss, kInvalid -> InvalidArgument,
// kPermission (the directory is not writable) -> PermissionDenied,
// kUnavailable (the store's library is missing) -> FailedPrecondition (not
// Unavailable, which a MonitoredSession takes for a lost worker and retries
// forever), kIO -> Internal. The message names the table, the operation and
// the store's directory, then the store's own message.
tensorflow::Status StoreErrorStatus(const TableResource& table, const char* what, const table::StoreError& error);

// Runs fn(), a call into table's core (or its tier), and returns OK, or the
// error status of an exception it threw (TableMemoryError for memory,
// StoreErrorStatus for the disk tier, Internal for anything else). Kernels
// must reach the core only through this (the table ops and the embedding
// kernels alike; by key through TableResource::WithKeys, which calls it): an
// exception that leaves a kernel terminates the process. Example:
//   OP_REQUIRES_OK(ctx, CallTable(*table, "clear", [&] { table->Clear(); }));
template <typename Fn>
tensorflow::Status CallTable(const TableResource& table, const char* what, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
  } catch (const std::bad_alloc& e) {
    return TableMemoryError(table, what, e);
  } catch (const std::length_error& e) {
    return TableMemoryError(table, what, e);
  } catch (const table::StoreError& e) {
    return StoreErrorStatus(table, what, e);
  } catch (const std::exception& e) {
    return tensorflow::errors::Internal("tf_ext table '", table.name(), "' ", what, " failed: ", e.what());
  }
  return tensorflow::OkStatus();
}

template <typename Fn>
tensorflow::Status TableResource::WithKeys(const char* what, const int64_t* keys, int64_t n,
                                           const table::ParallelFor& pf, Fn&& fn) {
  if (tier_ == nullptr) return CallTable(*this, what, std::forward<Fn>(fn));
  const tensorflow::Status status = CallTable(*this, what, [&] { tier_->WithKeys(keys, n, pf, fn); });
  LogDroppedKeys();
  return status;
}

// Reads the resource-handle input `input_index` and returns the table it
// refers to. InvalidArgument (naming the input) if the input is not a scalar
// resource handle or the handle is not a tf_ext table (e.g. a variable or a
// TF MutableHashTable); NotFound if the table was never created.
tensorflow::Status GetTableResource(tensorflow::OpKernelContext* ctx, int input_index,
                                    tensorflow::core::RefCountPtr<TableResource>* out);

}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_KERNELS_TABLE_RESOURCE_H_
