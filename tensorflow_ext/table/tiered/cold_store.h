// The cold store of a tiered table: rows that left the memory tier (the
// table::HashTable) live here, on disk, until a lookup brings them back.
//
// Contract
//  * A key lives on disk as one entry: 8 key bytes -> [width float32 | int64
//    version | uint32 frequency] (the full decoded row and its KeyMeta), so a
//    row moved memory -> disk -> memory comes back bit-exact.
//  * The store is a cache, not a source of truth: the checkpoint is. Writes
//    skip RocksDB's write-ahead log, and opening a directory that held a
//    store wipes it (a restore rebuilds it). Nothing here survives a process.
//  * Directory policy of OpenColdStore (StoreOptions::path):
//     - missing: created, parents too;
//     - holding our marker file TF_EXT_TIER_STORE: its contents are wiped and
//       the store starts empty (this also covers what a killed process left);
//     - non-empty without the marker: StoreError kForeign, files untouched;
//     - held by another open store, in this process or another (flock on
//       <path>/TF_EXT_TIER_STORE.lock, held until the store is destroyed):
//       StoreError kLocked naming the path and the holder's pid;
//     - not creatable or not writable (permission denied, a read-only file
//       system, a file where a directory should be): StoreError kPermission
//       naming the path, with "not writable" and the system's reason.
//  * Errors: every method may throw StoreError; what() names the store's path
//    and the problem. A full disk gives kNoSpace with "no space left on
//    device" in the message; the store stays usable for reads after a failed
//    write (and for writes once space is freed).
//  * Thread safety: every ColdStore method may be called from any number of
//    threads at once.
//  * num_keys() is exact: Put counts only keys that were absent, Delete only
//    keys that were present (each checks with a batched read first), unless
//    StoreOptions::count_keys is off (the caller keeps its own count).
//  * Memory: the store's RAM is bounded by StoreMemoryBytes(options): its
//    memtables (at most write_buffers of write_buffer_bytes each: one takes
//    the writes while the others flush to disk; writes wait while all are
//    full), its block cache (block_cache_bytes), which holds the data blocks
//    read AND the index and Bloom filter blocks of the files (partitioned:
//    only their small top-level blocks and those of the newest, smallest
//    files stay pinned), and a fixed cost per open store
//    (kStoreFixedMemoryBytes). So the index and filters of a large store
//    take no RAM beyond the cache; they are read back from the page cache
//    (not counted in the process's RSS: files are read with pread, not
//    mmap) when the cache has evicted them. One Put batch larger than a
//    write buffer makes its memtable as large as the batch: a caller that
//    counts on the bound writes batches of at most write_buffer_bytes
//    (MaxPutRows). A read pins the blocks of its batch's keys while it
//    copies their rows out (a Get of n keys: up to min(n, 1024) blocks of 4
//    KiB beyond the cache, for the call's duration). Not counted: what
//    RocksDB costs once per process: its code (~10 MiB of RSS), its
//    background flushes' and compactions' buffers (RocksDB runs one flush and
//    one compaction at a time per process) and what the allocator keeps of
//    them: measured 9-18 MiB beside one store of 5M rows of width 64.
//
// RocksDB lives in a plugin, _tf_ext_rocksdb_store.so (links the system
// librocksdb.so.7.8), next to the library holding OpenColdStore (the op
// library) or at $TF_EXT_ROCKSDB_STORE_LIB. OpenColdStore loads it with
// dlopen on first use, so a process that never opens a tiered table never
// needs librocksdb; without it, OpenColdStore throws kUnavailable naming the
// package to install. The plugin and the loader share this header's types
// across the dlopen boundary, so they must be built from the same version of
// it: the plugin exports kColdStoreAbi, and a plugin built with another
// value (a stale copy beside a newer op library) is refused with
// kUnavailable naming both values and the file, before any of its code runs
// on our types. No TensorFlow header is used here.
#ifndef TENSORFLOW_EXT_TABLE_TIERED_COLD_STORE_H_
#define TENSORFLOW_EXT_TABLE_TIERED_COLD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "tensorflow_ext/table/core/hash_table.h"  // KeyMeta

namespace tfext {
namespace table {

class StoreError : public std::runtime_error {  // what() names the path and the problem
 public:
  // kPermission: the store's directory cannot be created or written (permission denied, a read-only file system,
  // a file in the way). New codes go at the end (the plugin passes a code as an int at open).
  enum Code { kNoSpace, kIO, kCorrupt, kLocked, kForeign, kInvalid, kUnavailable, kPermission };
  StoreError(Code code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

struct StoreOptions {
  std::string path;   // directory; created if missing (parents too)
  int64_t width = 1;  // floats per row
  // The store's RAM (see "Memory" above; StoreMemoryBytes). Memtables: write_buffers (>= 2) of write_buffer_bytes
  // (>= kMinWriteBufferBytes) each; the files' levels are sized from them. Block cache: block_cache_bytes (>= 0;
  // 0 = no cache: then every read also reads the index and filter blocks it needs from the file).
  int64_t write_buffer_bytes = 16 << 20;
  int64_t write_buffers = 2;
  int64_t block_cache_bytes = 32 << 20;
  // Put and Delete first read which of their keys are present, so that num_keys() is exact whatever the caller
  // writes. A caller that keeps its own count (the tiered table) turns this off: Put and Delete then skip that read
  // (measured: ~20% more tiered lookups per CPU-second with 25% of the keys in memory, tiered_table_bench), Put counts
  // every key as new and Delete every key as present (exact only when the caller puts absent keys and deletes present
  // ones), and Delete writes a tombstone per key.
  bool count_keys = true;
};

class ColdStore {  // thread-safe; all methods may throw StoreError
 public:
  virtual ~ColdStore() = default;
  // found[i] true and rows[i*width..] / meta[i] filled for keys present (absent keys: found[i] false, their row and
  // meta left untouched). Batched (MultiGet).
  virtual void Get(const int64_t* keys, int64_t n, float* rows, KeyMeta* meta, bool* found) = 0;
  // Writes n rows atomically (one WriteBatch, WAL off: the checkpoint is the source of truth). A key repeated in
  // the batch: the last occurrence wins.
  virtual void Put(const int64_t* keys, int64_t n, const float* rows, const KeyMeta* meta) = 0;
  // Deletes the keys (absent ones are ignored), atomically.
  virtual void Delete(const int64_t* keys, int64_t n) = 0;
  // Visits every entry of a snapshot (writes during the visit are not seen); fn returns false to stop. fn may call
  // the store.
  virtual void ForEach(const std::function<bool(int64_t, const float*, const KeyMeta&)>& fn) const = 0;
  virtual int64_t num_keys() const = 0;  // exact (see the contract above)
  // Bytes the store takes on disk now, approx. what `du` says: its data files plus the entries not yet flushed to
  // them (they reach the disk at the next flush). For the disk cap; not exact to the byte.
  virtual int64_t disk_bytes() const = 0;
  // Drops every entry, fast: a fresh database replaces the old one (a ForEach in flight finishes on the old one).
  virtual void Clear() = 0;
  // Reclaims the space of deleted rows once they are many (a quarter of the live keys): a full compaction, which
  // needs free space about the store's size while it runs. For the disk cap, after large deletes.
  virtual void CompactIfNeeded() = 0;
  virtual const std::string& path() const = 0;
};

// The smallest memtable RocksDB makes (it raises smaller write buffers to this).
constexpr int64_t kMinWriteBufferBytes = int64_t{64} << 10;
// RAM an open store takes beyond its memtables and block cache: its database's state, table readers (~2 KiB per
// file), index and filter blocks pinned beyond the cache's capacity, and what the allocator (glibc malloc) keeps
// of the memtables and blocks it freed. Measured over 8-16 stores of 100K-200K rows of width 64 each (cold_store_test
// AStoreKeepsItsMemoryWithinStoreMemoryBytes, cold_store_bench --stores): 0.2 MiB per empty store; with rows, 0.6-1.0
// MiB of RSS per store over its write buffers and cache at buffers of 256 KiB-1 MiB (of which ~0.4 MiB freed memory
// the allocator keeps).
constexpr int64_t kStoreFixedMemoryBytes = int64_t{3} << 19;  // 1.5 MiB

// The bound on a store's RAM with these options (see "Memory" above): its memtables, its block cache and its
// fixed cost.
inline int64_t StoreMemoryBytes(const StoreOptions& options) {
  const int64_t buffer =
      options.write_buffer_bytes > kMinWriteBufferBytes ? options.write_buffer_bytes : kMinWriteBufferBytes;
  return options.write_buffers * buffer + options.block_cache_bytes + kStoreFixedMemoryBytes;
}

// The most rows of `width` floats one Put may write and keep its memtable within write_buffer_bytes (at least 1).
inline int64_t MaxPutRows(const StoreOptions& options) {
  // An entry in a memtable: the key (8), the value, RocksDB's internal key suffix (8), the skip list node and
  // length prefixes (~32 at the heights RocksDB draws).
  const int64_t entry = 8 + options.width * 4 + 8 + 4 + 8 + 32;
  const int64_t buffer =
      options.write_buffer_bytes > kMinWriteBufferBytes ? options.write_buffer_bytes : kMinWriteBufferBytes;
  return buffer / entry > 1 ? buffer / entry : 1;
}

// Opens (creates) a store; see the directory policy above. Throws StoreError (kInvalid for width < 1, an empty
// path or bad sizes; kUnavailable when the plugin cannot be loaded or was built from another version of this
// header). Loads the plugin on first use.
std::unique_ptr<ColdStore> OpenColdStore(const StoreOptions& options);

// The plugin's one entry point, exported with C linkage as kOpenRocksDbStoreSymbol so dlsym finds it by name.
// Returns a new store owned by the caller, or null with *error_code (a StoreError::Code) and *error_message set:
// exceptions never cross the dlopen boundary at open (the store's methods do throw StoreError; both sides are
// built by one compiler and libstdc++).
typedef ColdStore* (*OpenRocksDbStoreFn)(const StoreOptions* options, int* error_code, std::string* error_message);
constexpr const char* kOpenRocksDbStoreSymbol = "tfext_open_rocksdb_store";

// The version of the interface between the loader and the plugin: this header's StoreError, StoreOptions,
// KeyMeta, ColdStore (its virtual methods) and OpenRocksDbStoreFn. Raise it with any change to them (the size
// checks below catch a changed field, not a changed method). The plugin exports it as a C function,
// kRocksDbStoreAbiSymbol (int (*)()), which the loader calls before anything else of the plugin.
//   1: the first interface (no version symbol: a plugin without one is refused as older than 2)
//   2: StoreOptions::write_buffer_bytes and write_buffers; StoreError::kPermission
constexpr int kColdStoreAbi = 2;
typedef int (*RocksDbStoreAbiFn)();
constexpr const char* kRocksDbStoreAbiSymbol = "tfext_rocksdb_store_abi";
static_assert(sizeof(StoreOptions) == sizeof(std::string) + 5 * sizeof(int64_t),
              "StoreOptions changed: raise kColdStoreAbi and update this check");
static_assert(sizeof(KeyMeta) == 16, "KeyMeta changed: raise kColdStoreAbi and update this check");
constexpr const char* kRocksDbStoreLibrary = "_tf_ext_rocksdb_store.so";
constexpr const char* kRocksDbStoreLibraryEnv = "TF_EXT_ROCKSDB_STORE_LIB";

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_TIERED_COLD_STORE_H_
