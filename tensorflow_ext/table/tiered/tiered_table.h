// A tiered table: the in-memory table::HashTable (the memory tier) over an
// on-disk ColdStore (the disk tier, cold_store.h), with a memory budget and
// an optional disk cap. TensorFlow-independent: the TF resource
// (../kernels/table_resource.h) owns one per tiered table and routes every
// key-batched operation through WithKeys.
//
// Contract
//  * Exclusive tiers: a key lives in memory or on disk, never both (a disk
//    copy left behind by a promotion is dead: ignored until deleted). A row
//    moves between them whole: all width() columns decoded to float32, with
//    its KeyMeta (version, frequency). Decoding a float32, bf16 or fp16 row
//    and re-encoding it to nearest is bit-exact, so a table whose rows went
//    to disk and came back holds the same bits as one that kept them in
//    memory: training on a tiered table is bit-identical to the untiered
//    table as long as no key falls off the disk tier (disk_bytes cap).
//    int8 rows are refused (std::invalid_argument): re-quantizing a decoded
//    int8 row is not exact.
//  * Key-batched operations (WithKeys): the batch's keys that are on disk
//    (or on their way there) are PROMOTED into memory first, then op() runs
//    against the memory tier, all under the tier's access lock held SHARED.
//    Rows leave memory (demotion) only under the access lock held EXCLUSIVE,
//    so no key of a batch leaves memory between its promotion and op(). Two
//    operations of one training step (a lookup, then the optimizer's apply)
//    each promote: a row demoted between them comes back, exact.
//  * Budget: memory_bytes holds the disk tier's store too: its RocksDB
//    memtables, block cache and fixed cost (cold_store.h "Memory"; two write
//    buffers and a cache of memory_bytes / 32 each, at most 16 and 32 MiB).
//    StoreShareBytes() takes them out of the budget (an eighth of it at most:
//    exact from 48 MiB up; below, RocksDB's floors exceed that share by up
//    to 1.7 MiB), and the memory tier gets the rest: budget_keys() =
//    (memory_bytes - StoreShareBytes()) / bytes_per_key(), where a key costs
//    its row (row_bytes) + 20 index bytes (the most the core takes per key
//    at scale), times 1.1: memory may hold up to 1.1x budget_keys before
//    batches demote themselves, and that peak must fit (the memory tier's
//    arena keeps the most rows it ever held). So memory tier + store stay
//    within memory_bytes. Demotion writes chunks of at most a write
//    buffer's rows (MaxPutRows). When the memory tier holds more than
//    budget_keys keys, a demotion round moves the lowest-ranked rows
//    (policy: LRU = the lowest versions, LFU = the lowest frequencies, then
//    versions) to disk until it holds 90% of budget_keys, sparing the rows promoted since the previous
//    round started (see "Promoted rows"). Rounds run on a background thread, woken
//    after a batch that leaves memory over budget; past 1.1x the budget (or
//    with background off) the batch's own thread demotes before WithKeys
//    returns. Concurrent batches may each add their rows before a round
//    runs, so memory may briefly hold more, by the rows of the batches in
//    flight.
//  * Disk cap (disk_bytes > 0): after each round, if the disk tier holds
//    more keys than disk_bytes / (bytes per entry), its lowest-ranked rows
//    (same policy) are dropped until it holds 90% of that. Bytes per entry:
//    the entry's size in the store's files (key + value + ~16 bytes of
//    RocksDB's); when the files take more than the cap even after
//    ColdStore::CompactIfNeeded, what they measure per key, up to twice
//    that. So the cap bounds the live rows; the files may exceed it by the
//    garbage RocksDB has not compacted yet (rows promoted back, overwritten
//    copies, tombstones; at small sizes mostly the memtable), which costs up
//    to half of the keys the cap allows while it lasts. Dropped keys are
//    gone; they are counted (stats().dropped) and kept for TakeDroppedKeys (a
//    delta checkpoint logs them as removals). Each drop pass scans the store
//    twice (a reservoir sample of the ranks, then the keys below the
//    threshold).
//  * Errors: StoreError (cold_store.h) from the store, OutOfMemoryError from
//    the memory tier, std::invalid_argument for bad options. A demotion that
//    fails to write its rows to disk puts them back into memory (exact), and
//    the error is rethrown once by the next WithKeys (or Settle). A failed
//    operation leaves every row in exactly one tier.
//  * Thread safety: every method may be called from any number of threads.
//    op() (WithKeys, WithAll), Export's alloc and RemoveIf's pred must not
//    call this TieredTable (they run under its locks); they may call the
//    memory tier (memory()).
//
// Locks (acquired only in this order, so no cycle can form):
//    demote_mu_  ->  access_ (shared or exclusive)  ->  promote_mu_  ->  count_mu_  ->  outbox_mu_
//  * demote_mu_: one demotion round (or a whole-table operation) at a time.
//  * access_: a writer-preferring reader/writer lock. Batches hold it
//    shared; a demotion chunk's Evacuate and whole-table operations hold it
//    exclusive. Writer preference keeps a stream of batches from starving
//    the demoter.
//  * promote_mu_: promoters, one at a time; the demoter also takes it (with
//    no access lock) to retire a chunk it wrote, so a promoter sees the
//    outbox unchanged from its look-up to its import.
//  * count_mu_: every move of keys between the counts (memory, the outbox,
//    disk: an Evacuate into the outbox, a promotion's import, a chunk's
//    retirement) happens whole under it, and size() and stats() read under
//    it, so they count each key once at any instant. Never held across a
//    store call: a reader of the counts never waits for the disk.
//  * outbox_mu_: the outbox (the chunk of rows between memory and disk) and
//    the set of stale disk keys.
//  The memory tier's shard locks are taken inside all of these (every
//  HashTable call), and no tier lock is taken inside a table callback. A
//  batch holds access_ (and a promoter promote_mu_) across its ParallelFor:
//  the pool that runs pf's units must not be one whose threads may wait for
//  a batch of this table (TF's intra-op pool runs the units, its inter-op
//  threads the waiting ops: separate pools).
//
// Design
//  * Demotion round: a threshold rank from HashTable::SampleMeta, then
//    Evacuate(rank <= threshold) in chunks of <= 16K keys. Each chunk is
//    evacuated under the exclusive access lock into the OUTBOX (key -> row +
//    meta), published before the lock is released; the chunk is then Put to
//    the store with no lock held, and retired. A promoter looks in memory,
//    then the outbox, then the store. A key taken from the outbox while its
//    chunk is being written is marked taken; after the Put the chunk's taken
//    keys are deleted from disk again.
//  * Promoted rows: a row brought back from disk keeps its version and
//    frequency (what training computes must not change), so by rank it is
//    among the first a round would send back, maybe before the step that
//    needed it runs (a prefetch would undo itself). So a round spares the
//    rows promoted since the previous round started (the SHIELD: the keys
//    of the promotions before this round started, and of those while it
//    runs); once a round has passed, a row ranks as its metadata say (a
//    lookup has stamped it by then). The round's threshold is chosen among
//    the rows it may move (the shielded rows' ranks, sampled, are left
//    out). At most budget_keys / 4 keys are shielded (8 bytes each, beside
//    the budget; promotions past that are not shielded until the next
//    round), so a round always finds its rows among the others.
//  * Stale disk keys: a key whose disk copy must be ignored because deleting
//    it is pending (a promotion leaves the deletion to the demoter, after its
//    next round; a key demoted again before then is just overwritten) or
//    failed (a full disk). Promote and every scan of the store skip them; a
//    later demotion of the key overwrites its copy, and each round deletes
//    the others (a batch deletes its own once kMaxStaleKeys wait).
//  * Accounting: the tier counts the live keys on disk itself (a Put adds
//    the keys that were not live there, a promotion or drop subtracts its
//    keys), so size() and stats() need no store scan. A key is in exactly
//    one of three counts: memory, in flight (an outbox row no batch took
//    back) or disk; a move updates both of its counts under count_mu_.

#ifndef TENSORFLOW_EXT_TABLE_TIERED_TIERED_TABLE_H_
#define TENSORFLOW_EXT_TABLE_TIERED_TIERED_TABLE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/tiered/cold_store.h"

namespace tfext {
namespace table {

struct TierOptions {
  std::string path;                                        // the store's directory (cold_store.h's directory policy)
  int64_t memory_bytes = 0;                                // budget of the memory tier (its memory_bytes() target)
  int64_t disk_bytes = 0;                                  // cap of the disk tier; 0 = unbounded
  enum class Policy { kLru, kLfu } policy = Policy::kLru;  // which rows leave memory / fall off disk first
  bool background = true;  // demote on a background thread (tests may turn it off and call Settle)
};

struct TierStats {  // monotonic counters since creation, plus sizes
  // disk_keys: the keys on disk or on their way there (demoted rows being
  // written); memory_keys + disk_keys is the table's size.
  int64_t memory_keys = 0, memory_bytes = 0, disk_keys = 0, disk_bytes = 0, budget_keys = 0;
  int64_t lookups = 0;     // keys that passed Promote
  int64_t cold_reads = 0;  // keys promoted from disk (a hit rate = 1 - cold_reads/lookups)
  int64_t demotions = 0;   // keys moved to disk
  int64_t dropped = 0;     // keys that fell off the disk tier (cap) — gone
  int64_t errors = 0;      // background failures
};

class TieredTable {
 public:
  // The fewest rows a budget must hold: below this a tier would demote on
  // nearly every batch.
  static constexpr int64_t kMinBudgetKeys = 64;
  // Largest chunk of rows one Evacuate / Put moves.
  static constexpr int64_t kDemoteChunk = 16384;
  // Dead disk copies (of promoted keys) whose deletion may wait for the
  // demoter: at most this many (a hash set: ~40 bytes each, ~5 MiB).
  static constexpr int64_t kMaxStaleKeys = int64_t{1} << 17;

  // memory: the resource's table (not owned, outlives this), empty. Opens
  // the store (StoreError: kLocked, kForeign, kIO, kUnavailable). Throws
  // std::invalid_argument for int8 rows, a width that differs from the
  // table's, a non-positive memory_bytes, a negative disk_bytes, or a budget
  // of fewer than kMinBudgetKeys rows (the message names memory_bytes and
  // the bytes per row).
  TieredTable(HashTable* memory, const TableOptions& table_options, const TierOptions& options);
  // The same over a store the caller opened (tests wrap the RocksDB store to
  // inject failures); options.path only names the table in messages.
  TieredTable(HashTable* memory, const TableOptions& table_options, const TierOptions& options,
              std::unique_ptr<ColdStore> store);
  // Stops the demoter and closes the store (the directory stays, marked: the
  // next open wipes it).
  ~TieredTable();
  TieredTable(const TieredTable&) = delete;
  TieredTable& operator=(const TieredTable&) = delete;

  // Runs op() for a batch of keys: takes the shared access lock, promotes
  // the batch's cold keys (one ColdStore::Get for all absent keys, Import
  // into memory with their metadata; their disk copies are dead from then
  // on), then op(); releases;
  // then, if memory is over budget, wakes the demoter (or demotes before
  // returning). Throws StoreError (kInvalid when the batch's distinct keys
  // do not fit in the budget: "memory_bytes=X holds N rows of B bytes; this
  // batch needs M rows"), OutOfMemoryError. A pending background error is
  // rethrown here once (op() does not run then).
  template <typename Op>
  void WithKeys(const int64_t* keys, int64_t n, const ParallelFor& pf, Op&& op) {
    BeforeBatch(keys, n);
    {
      SharedAccess lock(access_);
      Promote(keys, n, pf);
      op();
    }
    AfterBatch();
  }

  // Runs op() with the whole table quiescent: no demotion in flight, no
  // batch running, every key in memory or on disk.
  template <typename Op>
  void WithAll(Op&& op) {
    std::lock_guard<std::mutex> round(demote_mu_);
    ReturnOutboxLocked();
    ExclusiveAccess lock(access_);
    op();
  }

  // --- Whole-table operations over both tiers (they lock: not inside WithAll or WithKeys). ---
  // Keys in memory + in flight to disk + on disk: each key once, at any
  // instant (a demotion or promotion in progress neither hides nor doubles
  // a key). Waits only for a move in progress, never for the disk.
  int64_t size() const;
  // As HashTable::Export over both tiers: one consistent view, alloc called
  // once with the total count (memory entries first, then disk entries).
  void Export(int64_t col_begin, int64_t cols, const std::function<HashTable::ExportBuffers(int64_t)>& alloc) const;
  // As HashTable::ExportSince over both tiers (scans the disk tier twice:
  // to count, then to copy).
  void ExportSince(int64_t min_version, int64_t col_begin, int64_t cols,
                   const std::function<HashTable::ExportBuffers(int64_t)>& alloc) const;
  // As HashTable::Import (a restore). clear_first empties both tiers first.
  // The keys go in chunks through the same path as a batch (a key on disk
  // comes back to memory before its columns are overwritten, so the other
  // columns are kept), and memory is demoted synchronously between chunks:
  // a restore larger than the budget never holds it all in memory. Not
  // atomic: a concurrent reader may see part of the restore.
  void Import(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* rows,
              const float* column_defaults, const int64_t* versions, const uint32_t* frequencies, bool clear_first,
              const ParallelFor& pf);
  // Removes every key of both tiers.
  void Clear();
  // RemoveIf over both tiers (eviction): pred sees every row of either tier
  // (a decoded float32 row). The keys removed from the disk tier are
  // appended to *removed_disk_keys (may be null). Returns the number of keys
  // removed from both tiers.
  int64_t RemoveIf(const std::function<bool(int64_t, const float*, const KeyMeta&)>& pred,
                   std::vector<int64_t>* removed_disk_keys);
  // Blocks until memory <= budget (demoting now if needed), no demotion is
  // in flight and the disk tier is within its cap. Rethrows a pending
  // background error. For tests and benchmarks (and the Settle op).
  void Settle();
  // One consistent view of the counts: memory_keys + disk_keys == size(),
  // where disk_keys includes the rows in flight to disk (they have left
  // memory). The byte sizes are read beside it.
  TierStats stats() const;
  int64_t budget_keys() const { return budget_keys_; }
  // Bytes per key the budget is divided by: (the memory tier's row stride +
  // 20 index bytes) * 1.1, rounded up (see "Budget").
  int64_t bytes_per_key() const { return bytes_per_key_; }
  static int64_t BytesPerKey(int64_t row_bytes);
  // The budget's arithmetic (see "Budget"): the store's options and its
  // share of memory_bytes, the keys a budget holds, and the smallest budget
  // that holds `rows` keys.
  static StoreOptions StoreOptionsFor(const TierOptions& options, int64_t width);
  static int64_t StoreShareBytes(int64_t memory_bytes);
  static int64_t BudgetKeys(int64_t memory_bytes, int64_t row_bytes);
  static int64_t MemoryBytesFor(int64_t rows, int64_t row_bytes);
  // Keys that fell off the disk tier since the last call (for the
  // delta-checkpoint change log).
  std::vector<int64_t> TakeDroppedKeys();

  HashTable* memory() const { return memory_; }
  const TierOptions& options() const { return options_; }

 private:
  // A reader/writer lock that prefers writers: once a writer waits, new
  // readers wait behind it (glibc's default rwlock prefers readers, which
  // would let a stream of batches starve the demoter). Not recursive.
  class AccessLock {
   public:
    void lock_shared();
    void unlock_shared();
    void lock();
    void unlock();

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    int64_t readers_ = 0;
    int64_t writers_waiting_ = 0;
    bool writer_ = false;
  };
  class SharedAccess {
   public:
    explicit SharedAccess(AccessLock& lock) : lock_(lock) { lock_.lock_shared(); }
    ~SharedAccess() { lock_.unlock_shared(); }

   private:
    AccessLock& lock_;
  };
  class ExclusiveAccess {
   public:
    explicit ExclusiveAccess(AccessLock& lock) : lock_(lock) { lock_.lock(); }
    ~ExclusiveAccess() { lock_.unlock(); }

   private:
    AccessLock& lock_;
  };

  // One chunk of rows between memory and disk (guarded by outbox_mu_).
  struct Outbox {
    std::vector<int64_t> keys;
    std::vector<float> rows;  // keys.size() * width
    std::vector<KeyMeta> meta;
    std::vector<char> taken;                  // promoted back while the chunk was being written
    std::unordered_map<int64_t, int64_t> at;  // key -> index in keys
  };

  void BeforeBatch(const int64_t* keys, int64_t n);
  void AfterBatch();
  // Brings the batch's keys that are absent in memory and present in the
  // outbox or the store into memory. Call with access_ held shared.
  void Promote(const int64_t* keys, int64_t n, const ParallelFor& pf);
  // Runs demotion rounds until memory <= 90% of the budget, then the disk
  // cap. Call with demote_mu_ held and no other tier lock. Throws the
  // round's failure.
  void DemoteLocked();
  // One chunk: evacuate (exclusive access), Put, retire. Returns the rows
  // moved (0: none matched the threshold).
  int64_t DemoteChunk(int64_t max_keys, const std::function<bool(int64_t, const KeyMeta&)>& pred);
  // Drops the lowest-ranked disk rows while the store is over its cap. Call
  // with demote_mu_ held.
  void EnforceDiskCapLocked();
  // Puts the outbox's rows that no promoter took back into memory (after a
  // failed Put). Call with demote_mu_ held and no other tier lock; throws
  // OutOfMemoryError, leaving the rows in the outbox.
  void ReturnOutboxLocked();
  // Retries the deletion of stale disk keys. Call with demote_mu_ held.
  void DeleteStaleLocked();
  // Rank order of the policy: a <= b means a leaves first.
  bool RankLE(const KeyMeta& a, const KeyMeta& b) const;
  // The rank below which `need` of the rows a round may move lie (the
  // shielded rows left out), from a sample of the memory tier and one of
  // the shielded rows; quantiles times 2^widen. Call with demote_mu_ held.
  KeyMeta ChooseThreshold(int64_t need, int widen);
  // Starts a round's shield: the keys promoted since the previous round
  // started. Call with demote_mu_ held and no other tier lock.
  void RollShieldLocked();
  // Whether a round must spare the key's row. Call with access_ exclusive.
  bool Shielded(int64_t key) const;
  // Calls fn for every live (non-stale) disk entry. Call inside WithAll.
  void ForEachDisk(const std::function<bool(int64_t, const float*, const KeyMeta&)>& fn) const;
  void DemoterLoop();
  void RecordBackgroundError(std::exception_ptr error);
  void RethrowPendingError();
  std::string BatchTooBigMessage(int64_t rows) const;

  HashTable* const memory_;
  const TableOptions table_options_;
  const TierOptions options_;
  const int64_t width_;
  int64_t bytes_per_key_ = 0;
  int64_t budget_keys_ = 0;
  std::unique_ptr<ColdStore> store_;

  std::mutex demote_mu_;
  mutable AccessLock access_;
  std::mutex promote_mu_;
  mutable std::mutex outbox_mu_;
  Outbox outbox_;                        // guarded by outbox_mu_
  std::unordered_set<int64_t> stale_;    // guarded by outbox_mu_
  std::atomic<int64_t> outbox_keys_{0};  // outbox_.keys.size(), read without the lock
  std::atomic<int64_t> disk_keys_{0};    // live keys on disk; a move to or from memory changes it under count_mu_
  mutable std::mutex count_mu_;
  int64_t in_flight_ = 0;        // outbox rows no batch took back (guarded by count_mu_)
  int64_t evacuate_cursor_ = 0;  // guarded by demote_mu_
  // The shield ("Promoted rows"): the keys promoted since the current round
  // started (promoted_, appended by promoters under promote_mu_ with access_
  // shared; sorted up to promoted_sorted_ under access_ exclusive), and
  // those promoted between the previous round's start and this one's
  // (shield_, sorted; written by the demoter under promote_mu_).
  std::vector<int64_t> promoted_;
  int64_t promoted_sorted_ = 0;
  std::vector<int64_t> shield_;

  // Counters (TierStats).
  std::atomic<int64_t> lookups_{0}, cold_reads_{0}, demotions_{0}, dropped_{0}, errors_{0};

  std::mutex dropped_mu_;
  std::vector<int64_t> dropped_keys_;  // guarded by dropped_mu_

  // The demoter thread and its wake-up state (guarded by wake_mu_).
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_ = false;
  bool stop_ = false;
  std::exception_ptr pending_error_;  // guarded by wake_mu_
  std::thread demoter_;
};

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_TIERED_TIERED_TABLE_H_
