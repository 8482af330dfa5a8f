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
//     - not creatable or not writable: StoreError kIO naming the path.
//  * Errors: every method may throw StoreError; what() names the store's path
//    and the problem. A full disk gives kNoSpace with "no space left on
//    device" in the message; the store stays usable for reads after a failed
//    write (and for writes once space is freed).
//  * Thread safety: every ColdStore method may be called from any number of
//    threads at once.
//  * num_keys() is exact: Put counts only keys that were absent, Delete only
//    keys that were present (each checks with a batched read first), unless
//    StoreOptions::count_keys is off (the caller keeps its own count).
//
// RocksDB lives in a plugin, _tf_ext_rocksdb_store.so (links the system
// librocksdb.so.7.8), next to the library holding OpenColdStore (the op
// library) or at $TF_EXT_ROCKSDB_STORE_LIB. OpenColdStore loads it with
// dlopen on first use, so a process that never opens a tiered table never
// needs librocksdb; without it, OpenColdStore throws kUnavailable naming the
// package to install. No TensorFlow header is used here.
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
  enum Code { kNoSpace, kIO, kCorrupt, kLocked, kForeign, kInvalid, kUnavailable };
  StoreError(Code code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

struct StoreOptions {
  std::string path;   // directory; created if missing (parents too)
  int64_t width = 1;  // floats per row
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

// Opens (creates) a store; see the directory policy above. Throws StoreError (kInvalid for width < 1 or an empty
// path). Loads the plugin on first use.
std::unique_ptr<ColdStore> OpenColdStore(const StoreOptions& options);

// The plugin's one entry point, exported with C linkage as kOpenRocksDbStoreSymbol so dlsym finds it by name.
// Returns a new store owned by the caller, or null with *error_code (a StoreError::Code) and *error_message set:
// exceptions never cross the dlopen boundary at open (the store's methods do throw StoreError; both sides are
// built by one compiler and libstdc++).
typedef ColdStore* (*OpenRocksDbStoreFn)(const StoreOptions* options, int* error_code, std::string* error_message);
constexpr const char* kOpenRocksDbStoreSymbol = "tfext_open_rocksdb_store";
constexpr const char* kRocksDbStoreLibrary = "_tf_ext_rocksdb_store.so";
constexpr const char* kRocksDbStoreLibraryEnv = "TF_EXT_ROCKSDB_STORE_LIB";

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_TIERED_COLD_STORE_H_
