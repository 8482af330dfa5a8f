// tensorflow_ext table core: a concurrent hash table from int64 keys to
// fixed-width rows of float32 columns, with per-key metadata (version,
// frequency). A table may store its leading columns compactly (bf16, fp16 or
// an int8 row, TableOptions::storage); callers still read and write float32.
//
// This header is the whole public interface of the core. The core knows
// nothing about TensorFlow: it is used by the TF kernels in ../kernels and is
// unit-tested on its own (hash_table_test.cc).
//
// Contract
//  * Keys: every int64 value is a key (no reserved empty or deleted key).
//    Rows: width() float32 columns per key, 1 <= width <= 2^24; every read
//    and write names a column range [col_begin, col_begin + cols) of the row.
//  * Compact rows: rows are bytes of a layout the options declare. With
//    storage != kFloat32 and compact_cols > 0, columns [0, compact_cols) are
//    stored in `storage` (row_codec.h), the others as float32; the layout is
//    recorded by the options alone (no per-row tag), so the owner of a table
//    (a TF resource, a checkpoint's record) keeps the options with it. Every
//    interface still speaks float32: a read decodes, a write rounds. Rounding
//    (row_codec.h): Update / UpdateRows (the fn's row) and the columns
//    FindOrInsertWith's init writes round with TableOptions::rounding,
//    stochastic rounding seeded by (key, the version the write leaves in the
//    row, column), so two runs of the same steps store the same bits; Insert,
//    Import, Accumulate, FindOrInsert's init_rows and column_defaults round
//    to nearest. A read returns exactly what the last write stored, so a
//    decoded row written back to a bf16/fp16 table (a checkpoint restore) is
//    stored unchanged. An int8 row is quantized as a whole: a write of some
//    of its compact columns (Update always writes all) re-quantizes the row,
//    moving the others by up to half of the new scale. A key repeated in one
//    batch is rounded after each occurrence (Accumulate adds to the rounded
//    sum). Update's fn and RemoveIf's pred see a decoded float32 copy of the
//    row, not the stored bytes.
//  * Capacity: initial_capacity (at most kMaxCapacity = 2^40) is a hint; the
//    table grows on demand as keys arrive, until memory runs out.
//  * Thread safety: every method may be called from any number of threads at
//    once; no external locking is needed. The table is split into shards,
//    each with its own reader/writer lock. What a call sees:
//     - A batched writer (FindOrInsert[With], Insert, Accumulate, Update,
//       Remove, Import) applies the keys of each shard under one acquisition
//       of that shard's write lock, shards in parallel: a concurrent reader
//       sees, for each shard, all or none of the batch's keys in it, but may
//       see one shard updated and another not yet.
//     - Find and FindMeta read a batch in blocks of a few thousand keys, each
//       block under the read locks of every shard it touches, held together:
//       a batch of up to kReadBlock keys is one consistent view; a larger
//       batch is a sequence of them.
//     - Export and Clear hold every shard's lock for the whole call: Export
//       is a consistent snapshot of the whole table, Clear is atomic.
//     - Replace builds the new contents in a table of its own and swaps them
//       in under every shard's lock: readers see all of the old contents or
//       all of the new ones. A Find or FindMeta batch larger than kReadBlock
//       that a Replace (or Clear) overtakes is read again, so a whole batch
//       of any size is one view of the table's contents before or after.
//     - RemoveIf, Evacuate, SampleMeta, Reserve and memory_bytes visit the
//       shards one at a time.
//     - size() sums per-shard counters without locks: exact when no writer
//       is running.
//  * Batches: n may be 0 (no-op). Duplicate keys within one batch are
//    processed in batch order, so for Insert the last occurrence wins, for
//    Accumulate every occurrence is added, for FindOrInsert the first
//    occurrence inserts and the later ones see the inserted row, and Update
//    calls fn once per occurrence.
//  * Errors: when memory cannot be had (or a shard is full, see
//    TableOptions::shard_bits), an operation throws OutOfMemoryError (a
//    std::bad_alloc; a plain std::bad_alloc from the C++ runtime is possible
//    too). The exception reaches the caller's thread even when it happened on
//    a ParallelFor thread, every lock is released, and the table stays
//    consistent and usable; a batched writer may have applied part of its
//    batch. The constructor throws std::invalid_argument for options that
//    fail ValidateOptions. Nothing in the core aborts the process, except a
//    failed internal check in a debug-check build (check.h).
//
// Limitations
//  * Callbacks (Update's fn, FindOrInsertWith's init, RemoveIf's pred,
//    Evacuate's pred and sink, Export's alloc) run under shard locks and
//    must not call back into the same table (they would deadlock). fn and
//    init run concurrently on the ParallelFor's threads, one shard per
//    thread at a time.
//  * Memory floor: memory_bytes() of an empty table is its bookkeeping
//    (sizeof(HashTable) + Impl + ~200 B per shard: ~3.2 KiB at 16 shards);
//    each key then adds at most 4 rows' bytes + 160 B (a shard's first rows
//    come in small doubling chunks, its index starts at 64 B) and on average
//    < 2 rows' bytes + its index share, so a small table's memory is
//    proportional to its keys. A table sized by initial_capacity (a Replace's
//    staging table included) pre-sizes no index below 16 keys per shard, so a
//    restored small table takes no more than a filled one. (Tested by
//    SmallTableMemoryIsAFloorPlusBytesPerKey.)
//  * Compact rows cost their decode and encode on every access, and their
//    operations keep per-thread float32 scratch rows (a few rows of width
//    floats per thread that ever ran one, not counted in memory_bytes()).
//    A row pointer handed to a callback is valid during that call only.
//  * Memory only grows until Clear(): removed rows are reused by later
//    inserts, but a shard's index never shrinks and arena memory is released
//    only by Clear() or destruction.
//  * A shard holds at most ~3.4e9 keys (its index has at most 2^32 slots, at
//    the default load factor). With the default shard_bits the shard count is
//    raised to fit initial_capacity; with an explicit shard_bits a full shard
//    makes writers throw OutOfMemoryError.
//  * Export writes entries in an unspecified order (shard by shard, index
//    order), which changes as the table grows.
//  * Host memory only: the CUDA table (../gpu) is a separate, fixed-capacity
//    table with its own interface.
//
// Design (see docs/design.md, "Table engine"):
//  * The key space is split into 2^k shards by the top bits of a 64-bit mixed
//    hash. Each shard has its own reader/writer lock, its own index and its own
//    row arena, so growth rehashes one shard at a time (no global pause) and
//    batched operations lock each shard once per batch.
//  * Index: open addressing (linear probing) over 8-byte slots
//    {uint32 hash tag, uint32 row id + 1} (0 = empty). A slot's home position
//    is tag & (capacity - 1), so doubling the index rehashes the 8-byte slots
//    from their stored tags without touching a row. Removal uses
//    backward-shift deletion (no tombstones), so probe lengths never degrade
//    under insert/remove churn (eviction) and lookups stop at the first empty
//    slot. The invariants this rests on are stated in hash_table.cc and
//    verified by CheckInvariants().
//  * Rows live in a per-shard arena of chunks that never move: a shard's
//    first rows in small chunks that double (4, 4, 8, ... rows: a small
//    table's memory follows its keys), then fixed-size ~16 KiB chunks;
//    removed rows go to an intrusive free list (no extra memory). Once the
//    arena is large, chunks are carved from 2 MiB slabs backed by transparent
//    huge pages (random row reads would otherwise miss the TLB). A row is
//    [int64 key | compact area | float32 columns | int64 version | uint32
//    frequency], packed with a 4-byte stride: 20 + 4*width bytes for float32
//    rows, 20 + CompactBytes(storage, compact_cols) + 4*(width - compact_cols)
//    for compact ones (the area is padded to 4 bytes; dim 16 in bf16 + one
//    float32 column: 56 bytes). The key and the values a lookup reads are
//    adjacent, the metadata that only writers touch comes last.
//  * The values hold the embedding and the optimizer slots side by side, so
//    one probe serves a lookup and an optimizer update alike. A compact
//    row's update is decoded into a per-thread float32 row, handed to fn and
//    encoded back; float32 rows are handed to fn in place (their copies take
//    the same code as before compact rows: a branch on the table's layout).
//  * Writers hash all keys, bucket them by shard with a stable counting sort,
//    then process the shards in parallel (through the caller's ParallelFor),
//    each under one write-lock acquisition, prefetching index slots and rows a
//    few keys ahead.
//  * Readers walk the keys in batch order with the same prefetching, taking
//    shard read locks in shard order (so no deadlock with writers, which hold
//    one shard lock at a time): no sort is needed and the output is written
//    sequentially.
//  * The probe hash (Murmur3Fmix64, mix.h) is independent of HashKey()
//    (SplitMix64), so tables fed by a HashKey(key) % num_tables partition keep
//    a uniform index.
//  * Growth off the critical path (opt-in, TF_EXT_TABLE_PREFAULT=1): once the arena takes slabs, each new slab
//    asks a process-wide background thread to map and fault in the next ones
//    (MADV_POPULATE_WRITE), so that inserts write to resident memory instead
//    of taking a page fault per fresh page under a shard lock. Spare slabs
//    are capped at one per 16 slabs in use, at most 8 (16 MiB) per table; a
//    writer never waits for one (it maps its own when none is ready). A
//    write that runs out of memory gives the spares back and stops the
//    requests until Clear(). Off by default; TF_EXT_TABLE_PREFAULT=1 turns it
//    on for the tables created after it is set.
//  * Memory is only used as keys arrive: initial_capacity pre-sizes the index
//    (up to kMaxPresizedKeys) with fresh anonymous memory, which the OS backs
//    with pages only when they are first written. Unless the caller asks for
//    the memory up front (TableOptions::preallocate): then the index and the
//    rows of initial_capacity keys are made resident at construction, so a
//    growing training table stops paying page faults and rehashes per step.

#ifndef TENSORFLOW_EXT_TABLE_CORE_HASH_TABLE_H_
#define TENSORFLOW_EXT_TABLE_CORE_HASH_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorflow_ext/table/core/mix.h"
#include "tensorflow_ext/table/core/row_codec.h"
#include "tensorflow_ext/table/core/table_limits.h"

namespace tfext {
namespace table {

// Runs fn(begin, end) over a partition of [0, total). The TF wrapper passes one
// backed by the op's intra-op thread pool; the default runs inline. The core
// calls it with coarse units (a shard, or a block of ~8-16K keys), so a
// wrapper should give each unit a large cost and let every unit run on its
// own thread if it wants.
using ParallelFor = std::function<void(int64_t total, const std::function<void(int64_t, int64_t)>& fn)>;

ParallelFor InlineParallelFor();

struct TableOptions {
  // Floats per row (embedding dim + optimizer slot columns). Must be >= 1.
  int64_t width = 1;
  // Compact rows (row_codec.h): the leading compact_cols columns of every row
  // are stored in `storage` (bf16, fp16 or an int8 row), the others as
  // float32. Every read and write still sees float32 columns: reads decode,
  // writes round (Update and FindOrInsertWith's new rows with `rounding`,
  // seeded by key, the version the write sets and column; Insert, Import and
  // Accumulate to nearest). compact_cols is in [0, width]; 0 (or kFloat32)
  // means plain float32 rows. kInt8Row takes kNearest only.
  RowStorage storage = RowStorage::kFloat32;
  int64_t compact_cols = 0;
  Rounding rounding = Rounding::kNearest;
  // Expected number of keys, a hint in [0, kMaxCapacity]; the table grows past it on
  // demand. The index is pre-sized for min(initial_capacity,
  // kMaxPresizedKeys) keys, in memory the OS backs only as keys arrive;
  // beyond that bound the table simply grows (a shard's index doubles, which
  // costs little next to writing the rows). Below 16 keys per shard nothing
  // is pre-sized (see "Memory floor").
  int64_t initial_capacity = 0;
  // log2 of the number of shards; -1 picks one from the number of hardware
  // threads, raised where needed so that initial_capacity keys fit (one shard
  // holds at most ~3.4e9 keys at the default load factor: its index has at
  // most 2^32 slots). With an explicit shard_bits, a shard that fills up makes
  // the writing operation throw OutOfMemoryError.
  int shard_bits = -1;
  // Index load factor that triggers growth of a shard's index.
  double max_load_factor = 0.8;
  // Ask for transparent huge pages for large index arrays and arena slabs.
  // They make random finds over a big table faster (fewer TLB misses: ~1.2x
  // at width 64 here) but can make the first touch of freshly grown memory
  // slow where the kernel compacts memory on a huge-page fault, which costs a
  // fast-growing training table more than it gains. The environment variable
  // TF_EXT_TABLE_HUGE_PAGES=0|1 overrides this for every table of a process.
  bool huge_pages = true;
  // Allocate the memory of initial_capacity keys up front, as a static
  // embedding variable is: the constructor (and Clear, and the staging table
  // of Replace) sizes the index for them (not capped at kMaxPresizedKeys) and
  // maps and faults in their rows, so inserting up to that many keys takes no
  // page fault and no index growth. Best effort: nothing is preallocated if
  // it would take more than half of the memory available (MemAvailable, or
  // a cgroup limit's headroom), and what the OS refuses is left to grow on
  // demand. The memory counts in memory_bytes() from the start.
  // Costs ~stride bytes per key of construction time at the OS's page-zeroing
  // speed (a few hundred ms per GB here). No effect with initial_capacity 0.
  bool preallocate = false;
};

// The most keys initial_capacity pre-sizes the index for (see TableOptions).
constexpr int64_t kMaxPresizedKeys = int64_t{1} << 22;

// Find and FindMeta read a batch in blocks of this many keys, each block one
// consistent view of the table (see "Thread safety" above).
constexpr int64_t kReadBlock = 8192;

// Returns an empty string if the options are valid, else a message naming the
// problem (e.g. "width must be >= 1, got 0").
std::string ValidateOptions(const TableOptions& options);

// Thrown when the table cannot get the memory an operation needs, or a shard
// is full. what() names the problem and the size asked for.
class OutOfMemoryError : public std::bad_alloc {
 public:
  explicit OutOfMemoryError(const std::string& message) : message_(message) {}
  const char* what() const noexcept override { return message_.what(); }

 private:
  std::runtime_error message_;  // a string whose copy cannot throw
};

// Per-key metadata, kept beside each row.
struct KeyMeta {
  int64_t version = 0;     // caller-defined, typically the global step of the last update
  uint32_t frequency = 0;  // saturating count of touches (see the `count` flags below)
};

class HashTable {
 public:
  // Throws std::invalid_argument if ValidateOptions(options) is not empty.
  // Pre-sizing for initial_capacity is best effort: if that memory cannot be
  // had, the table starts empty and grows on demand.
  explicit HashTable(const TableOptions& options);
  ~HashTable();
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  int64_t width() const;
  int64_t size() const;  // number of keys (exact when no writer is running)
  // Bytes held by the table (index + arena + bookkeeping). A pre-sized index
  // counts in full, although the OS backs it only as keys arrive. Arena slabs
  // prefaulted ahead of growth (see "Design") count once they are ready.
  int64_t memory_bytes() const;

  // Column range [col_begin, col_begin + cols) of the rows, used by every
  // read/write below. out/values are row-major [n, cols].

  // For each key: copies the columns into out[i] if present and sets
  // found[i] = true; else copies default_row (length cols) if non-null (if
  // null, out[i] is left untouched) and sets found[i] = false. found may be
  // null.
  void Find(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, float* out, bool* found,
            const float* default_row, const ParallelFor& pf) const;

  // For each key: if absent, inserts it with row = init_rows[i] for columns
  // [col_begin, col_begin+cols) and column_defaults[c] for every other column
  // c (column_defaults has width() entries; null means zeros). Then copies the
  // columns of the (new or existing) row into out[i] (out may be null).
  // inserted[i] tells whether key i was inserted (may be null).
  // If count: frequency += 1 for each occurrence. If version >= 0: sets the
  // key's version.
  void FindOrInsert(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* init_rows,
                    const float* column_defaults, float* out, bool* inserted, bool count, int64_t version,
                    const ParallelFor& pf);

  // Inserts or overwrites the columns. New keys get column_defaults for the
  // other columns (null = zeros). count/version as in FindOrInsert.
  void Insert(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* values,
              const float* column_defaults, bool count, int64_t version, const ParallelFor& pf);

  // row[cols] += deltas[i]; absent keys are inserted with column_defaults
  // plus the delta if insert_missing, else skipped. count/version as above.
  void Accumulate(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* deltas,
                  const float* column_defaults, bool insert_missing, bool count, int64_t version,
                  const ParallelFor& pf);

  // Runs fn(key_index, row, meta) under the shard's write lock for each key,
  // inserting absent keys with column_defaults first. row points at all
  // width() floats of the key's row (of a compact row: a decoded copy, valid
  // during the call, encoded back after fn returns, with the version fn left
  // in meta seeding stochastic rounding). Used by fused optimizer kernels:
  // one probe per key reads and updates the embedding and its slots together.
  // Keys must be unique within the batch when fn is not idempotent.
  // in_rows (optional, [n, in_cols] row-major) is only a prefetch hint: the
  // per-key input fn will read (e.g. the gradient rows), which the shard
  // order visits at random; it is prefetched a few keys ahead with the row.
  void Update(const int64_t* keys, int64_t n, const float* column_defaults,
              const std::function<void(int64_t, float*, KeyMeta*)>& fn, const ParallelFor& pf,
              const float* in_rows = nullptr, int64_t in_cols = 0);

  // Removes the keys (absent ones are ignored). Returns the number removed.
  int64_t Remove(const int64_t* keys, int64_t n, const ParallelFor& pf);

  // Removes every key for which pred(key, row, meta) is true (row: width()
  // floats, decoded for a compact row). Returns the number removed. Used by
  // eviction policies.
  int64_t RemoveIf(const std::function<bool(int64_t, const float*, const KeyMeta&)>& pred);

  // Metadata for keys (absent keys get zeros and found=false).
  void FindMeta(const int64_t* keys, int64_t n, KeyMeta* meta, bool* found, const ParallelFor& pf) const;

  // A consistent snapshot of the whole table: every shard's read lock is held
  // for the whole call (writers wait), so exactly the n entries given to
  // alloc are written. Sizes the outputs through `alloc(n)`, which must return
  // buffers for n keys (keys[n], rows[n * cols], versions[n],
  // frequencies[n]); any pointer may be null to skip that output. Entries come
  // in an unspecified order.
  struct ExportBuffers {
    int64_t* keys = nullptr;
    float* rows = nullptr;
    int64_t* versions = nullptr;
    uint32_t* frequencies = nullptr;
  };
  void Export(int64_t col_begin, int64_t cols, const std::function<ExportBuffers(int64_t n)>& alloc) const;

  // Export of the entries whose version >= min_version only, under the same
  // locks and with the same outputs (alloc gets the exact number of such
  // entries). Delta checkpoints write the rows trained since the last save
  // with it, reading the others' metadata only.
  void ExportSince(int64_t min_version, int64_t col_begin, int64_t cols,
                   const std::function<ExportBuffers(int64_t n)>& alloc) const;

  // Inserts/overwrites entries with their metadata (versions/frequencies may be
  // null: then 0). rows are [n, cols] for the column range; the other columns
  // of new keys get column_defaults (null = zeros).
  void Import(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* rows,
              const float* column_defaults, const int64_t* versions, const uint32_t* frequencies,
              const ParallelFor& pf);

  // Removes every key and releases memory down to the pre-sized index of a
  // new table (best effort, as in the constructor).
  void Clear();

  // Replaces the whole contents in one step: fill(staging) writes the new
  // contents into an empty table of the same layout (sized for expected_keys,
  // a hint), which is then swapped in under every shard's write lock, so no
  // reader ever sees the table empty or partly filled. The old contents are
  // freed after the locks are released. If the staging table cannot be had
  // or fill throws, the exception reaches the caller and this table is
  // unchanged. Holds the old and the new contents in memory at once. fill
  // must not call into this table (the staging table is its own).
  void Replace(int64_t expected_keys, const std::function<void(HashTable& staging)>& fill);

  // Sizes the index for at least n keys in total (n is capped at
  // kMaxCapacity); may throw OutOfMemoryError.
  void Reserve(int64_t n);

  // --- Added for the embedding kernels (TfExtEmbeddingLookup); additive. ---
  // Fills the columns [col_begin, col_begin + cols) of new keys' rows:
  // init(key_indices, dst, count) writes cols floats to dst[j] for the key
  // keys[key_indices[j]], j < count. Batches of up to kInitBatch rows, so that
  // an initializer can work on several keys at once.
  static constexpr int64_t kInitBatch = 16;
  using InitRows = std::function<void(const int64_t* key_indices, float* const* dst, int64_t count)>;
  // Like FindOrInsert, but the columns [col_begin, col_begin + cols) of the
  // keys this call inserts are filled in place by init (called under the
  // shard's write lock, only for new keys, before the lock is released; the
  // other columns get column_defaults), so a lookup draws random initial
  // values for the new keys only, with one probe per key. count/version/out/
  // inserted as in FindOrInsert; a new key's out row is written after init.
  // init must not call back into the table.
  // refs (optional, [n]): each key's row reference, for UpdateRows.
  void FindOrInsertWith(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const InitRows& init,
                        const float* column_defaults, float* out, bool* inserted, bool count, int64_t version,
                        const ParallelFor& pf, uint64_t* refs = nullptr);

  // --- Row references: an optimizer update without a second probe. ---
  // A lookup's FindOrInsertWith can hand out where each key's row is (refs);
  // the fused optimizer update of the same keys later in the step then goes
  // straight to the rows. Rows never move, so a reference stays exact until a
  // row is freed (a removal, eviction) or the memory released (Clear,
  // Replace), which change removal_epoch().
  //
  // The epoch to pair with references: read it before the FindOrInsertWith
  // that makes them.
  uint64_t removal_epoch() const;
  // Update(keys, n, column_defaults, fn, pf, in_rows, in_cols), the same
  // results, using refs[i] (from a FindOrInsertWith when removal_epoch() was
  // `epoch`) as the row of keys[i] when it is still exact: the epoch is
  // unchanged (checked under each shard's lock) and the row holds keys[i].
  // Every other key (refs null, an epoch changed, a reference from another
  // batch or none) is found by the usual probe, and inserted if absent.
  // Returns how many keys went through their references.
  int64_t UpdateRows(const int64_t* keys, const uint64_t* refs, uint64_t epoch, int64_t n, const float* column_defaults,
                     const std::function<void(int64_t, float*, KeyMeta*)>& fn, const ParallelFor& pf,
                     const float* in_rows = nullptr, int64_t in_cols = 0);

  // --- Tiered storage (a memory tier over a disk tier); additive. ---
  // Bytes one key's row takes in the arena: the row stride of "Design"
  // (20 + 4 * width for float32 rows, 20 + CompactBytes(storage,
  // compact_cols) + 4 * (width - compact_cols) for compact ones). A key also
  // costs its index share (8 bytes per slot at the load factor) and arena
  // slack; memory_bytes() counts all of it.
  int64_t row_bytes() const;

  // Replaces *out with the metadata of up to max_samples keys spread evenly
  // over the whole table: every shard is read in index order under its read
  // lock (one shard at a time), and live rows are picked at a fixed spacing
  // of size() / max_samples, so each shard contributes in proportion to its
  // keys. All keys when size() <= max_samples. For choosing a threshold
  // (e.g. the version below which ~10% of the keys fall) without reading
  // every row. Deterministic: the same table state (the same operations in
  // the same order) gives the same samples. Concurrent writers may change
  // what is seen; at most max_samples entries are returned either way.
  void SampleMeta(int64_t max_samples, std::vector<KeyMeta>* out) const;

  // Moves rows out of the table, a bounded number per call: removes up to
  // max_keys keys for which pred(key, meta) is true, handing each one to
  // sink(key, row, meta) just before its row is freed (row: width() floats,
  // a decoded copy for a compact row, valid during the call). Every key sink
  // gets is removed, every key removed went through sink, once.
  // Shards are visited one at a time under their WRITE lock, starting where
  // *cursor says: *cursor % num_shards is the shard, and the rest of it a
  // position inside that shard (start with 0; otherwise pass back what the
  // previous call left). A call that reaches max_keys stops there and sets
  // *cursor to resume at that shard and position; a call that removes fewer
  // than max_keys has looked at every key of the table (the first shard is
  // visited again from its start when the call began inside it), so it
  // found every key that matched while its shard was locked. Repeated calls
  // thus sweep the table round-robin, each a short exclusive hold per shard.
  // Returns the number removed; removal_epoch() changes when any key is.
  // pred may see a key twice in one call (the resumed shard); pred and sink
  // run under the shard's write lock and must not call the table. If either
  // throws, the keys already handed to sink are removed before the exception
  // propagates (sink holds them: no row is in both places or in neither),
  // and the key being looked at when it threw stays in the table.
  int64_t Evacuate(int64_t max_keys, int64_t* cursor, const std::function<bool(int64_t, const KeyMeta&)>& pred,
                   const std::function<void(int64_t, const float*, const KeyMeta&)>& sink);

  // Verifies every internal invariant of the index and the arena (stated in
  // hash_table.cc) under all shard read locks. Returns an empty string, or a
  // description of the first violation found. Takes time linear in the
  // table's memory: for tests and debugging, not for serving paths.
  std::string CheckInvariants() const;

 private:
  struct Impl;
  friend struct HashTableTestPeer;  // test_peer.h: damages an index, to test CheckInvariants
  std::unique_ptr<Impl> impl_;
};

// A 64-bit mixer (SplitMix64, mix.h; bijective) for partitioning keys across
// tables, e.g. HashKey(key) % num_tables in the Python layer. The table itself
// shards and probes with a different mixer so that such a partition does not
// bias its index.
inline uint64_t HashKey(int64_t key) { return SplitMix64(static_cast<uint64_t>(key)); }

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_HASH_TABLE_H_
