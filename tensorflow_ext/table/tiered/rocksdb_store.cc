// The cold store on RocksDB: the plugin _tf_ext_rocksdb_store.so, loaded by store_loader.cc (see cold_store.h for
// the contract). Its one exported symbol is tfext_open_rocksdb_store.
//
// Layout of a store directory <path>:
//   TF_EXT_TIER_STORE       the marker ("tf_ext tier store", format version): this directory is ours to wipe
//   TF_EXT_TIER_STORE.lock  flock'ed while a store is open; holds the owner's pid (for the kLocked message)
//   db-<n>/                 the RocksDB database (n counts Clear()s; the old one is removed once unused)
// Closing a store removes its database (a store is a cache with no meaning after its table is gone) and leaves
// the marker and the lock file, so the next open of that path knows the directory is ours.
//
// RocksDB options, chosen for random point reads of 100-300 byte values served from the OS page cache. Measured
// with cold_store_bench (500K rows of width 32, 161 disk bytes/row; Mkeys per CPU-second of the calling thread, a
// 2-core machine at load ~10, so +-15%):
//  * No compression: trained float rows do not compress (lz4: 161.2 disk bytes/row against 161.3, reads no faster),
//    and it would put RocksDB on the snappy/zstd/zlib symbols TensorFlow's framework library exports to the process.
//  * 4 KiB blocks (one page per point read: 0.23 Mkeys/s for present keys, 0.16 with 16 KiB blocks), a 10 bits/key
//    Bloom filter (~1% false positives: a Get of absent keys, the common case for a key new to the table, runs at
//    1.7-1.9 Mkeys/s, 0.16 without it), an in-block hash index (cheap; within the noise here).
//  * The store's RAM is bounded (cold_store.h "Memory"): memtables and block cache as StoreOptions says, and the
//    index and filter blocks (about 2.5 bytes per disk row: 1.25 of filter, ~1.3 of index; 12 MiB for 5M rows of
//    width 64) in the block cache, partitioned in 4 KiB blocks (their top-level blocks and level 0's pinned), not
//    in the table readers, where they grew with the store. The price, measured with 2M rows of width 64 after the
//    compactions settled (Mkeys per CPU-second, load ~4): with a 32 MiB cache (all of them fit) gets of present
//    keys 0.17 against 0.20 with whole filters in the table readers, gets of absent keys 0.60 against 1.19 (each
//    probe of a file looks up a partition in the cache), get + delete the same (0.08); with a 2 MiB cache (most
//    partitions come back from the page cache) 0.135, 0.42 and 0.056. Whole (unpartitioned) index and filter
//    blocks in the cache read as fast as the table readers' with a large cache (0.18, 1.11), but a miss loads a
//    whole file's filter (~140 KiB): with a cache smaller than them, every probe would.
//  * The block cache (in the process's RSS) keeps hot data blocks; the page cache does the rest. pread, not mmap:
//    mmap reads were ~30% faster (0.38 against 0.29 Mkeys/s) but would count every touched page of the disk tier in
//    the process's RSS, where the memory tier's budget is meant to be the whole story.
//  * Memtables: write_buffers of write_buffer_bytes (the tiered table: two of memory_bytes / 32, 64 KiB to 16 MiB),
//    and levels sized from them. Small buffers cost compaction CPU (more, smaller flushes): 1M rows written and
//    read took 12.7 s of process CPU with 16 MiB buffers, 16.4 s with 4 MiB, 18.7 s with 1 MiB, 21.8 s with 256 KiB.
//  * No write-ahead log (the checkpoint is the source of truth), no flush at close, and SST files with many
//    tombstones are compacted automatically (promotes delete every key they bring back to memory).
//  * Put and Delete read the keys first (a MultiGet) so num_keys() is exact and only present keys get tombstones:
//    a promote's Get + Delete runs at 0.11 Mkeys/s with the check, 0.14 without.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/utilities/table_properties_collectors.h"
#include "rocksdb/write_batch.h"
#include "tensorflow_ext/table/tiered/cold_store.h"

namespace tfext {
namespace table {
namespace {

constexpr char kMarkerName[] = "TF_EXT_TIER_STORE";
constexpr char kLockName[] = "TF_EXT_TIER_STORE.lock";
// The first line identifies the directory as ours; the format version says how entries are encoded (a store is
// wiped at open, so a different version needs no migration).
constexpr char kMarkerText[] =
    "tf_ext tier store\nformat 1: key = 8 bytes big-endian, value = width float32 | "
    "int64 version | uint32 frequency\n";
constexpr int64_t kMaxWidth = int64_t{1} << 24;  // the core's limit (hash_table.h)
constexpr int64_t kBatch = 1024;                 // keys per MultiGet call (bounds the pinned blocks)

std::string ErrnoText(int err) { return std::strerror(err); }

// The code of a failed file system call on the store's directory: a full disk, a directory this process cannot
// write (permissions, a read-only file system, a file in the way), or another I/O failure.
StoreError::Code CodeOfErrno(int err) {
  switch (err) {
    case ENOSPC:
      return StoreError::kNoSpace;
    case EACCES:
    case EPERM:
    case EROFS:
    case ENOTDIR:
      return StoreError::kPermission;
    default:
      return StoreError::kIO;
  }
}

// ---------------------------------------------------------------- directory helpers

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// mkdir -p. Throws kPermission (or kIO, kNoSpace) naming the component that could not be made.
void MakeDirs(const std::string& path) {
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    const size_t next = path.find('/', pos + 1);
    prefix = path.substr(0, next);
    pos = next;
    if (prefix.empty() || prefix == "/" || IsDirectory(prefix)) continue;
    if (mkdir(prefix.c_str(), 0777) != 0 && !(errno == EEXIST && IsDirectory(prefix))) {
      const int err = errno;
      if (err == EEXIST) {
        throw StoreError(StoreError::kPermission, "tier store " + path + ": the path is not writable: " + prefix +
                                                      " is a file, not a directory");
      }
      throw StoreError(CodeOfErrno(err), "tier store " + path + ": the path is not writable: cannot create the " +
                                             "directory " + prefix + ": " + ErrnoText(err));
    }
  }
}

// Names in a directory, without . and .. Throws kIO.
std::vector<std::string> ListDir(const std::string& dir, const std::string& store_path) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    throw StoreError(CodeOfErrno(err), "tier store " + store_path + ": cannot list " + dir + ": " + ErrnoText(err));
  }
  while (struct dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// rm -rf (best effort; returns the first errno, 0 if all went).
int RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return errno == ENOENT ? 0 : errno;
  int first_error = 0;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = opendir(path.c_str())) {
      std::vector<std::string> children;
      while (struct dirent* e = readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) children.emplace_back(e->d_name);
      }
      closedir(d);
      for (const std::string& c : children) {
        const int err = RemoveTree(path + "/" + c);
        if (first_error == 0) first_error = err;
      }
    }
    if (rmdir(path.c_str()) != 0 && first_error == 0) first_error = errno;
  } else if (unlink(path.c_str()) != 0 && errno != ENOENT && first_error == 0) {
    first_error = errno;
  }
  return first_error;
}

// Writes the whole string to a new file (replacing one). Returns 0 or an errno.
int WriteFile(const std::string& file, const std::string& text) {
  const int fd = open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = write(fd, text.data() + done, text.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return err;
    }
    done += static_cast<size_t>(w);
  }
  return close(fd) == 0 ? 0 : errno;
}

// ---------------------------------------------------------------- lock files across fork()

// A flock belongs to the open file description, which a fork()ed child shares: a child that outlives the store
// (a multiprocessing worker) would keep its directory locked, and a reopen by the parent would find it held.
// The open lock files are registered here and a fork handler closes the child's copies (close() is
// async-signal-safe; the registry is lock-free because a fork may happen while another thread holds any mutex).
// The handler runs in the child, when the child is first scheduled: until then the child still shares the lock, so
// a reopen by the parent right after fork() and close can still find it held (kLocked, naming the parent's pid).
constexpr int kMaxLockFds = 1024;
std::atomic<int> g_lock_fds[kMaxLockFds];  // -1 or 0 = free (static storage starts at 0; fd 0 is never a lock file)

void CloseLockFdsInChild() {
  for (std::atomic<int>& slot : g_lock_fds) {
    const int fd = slot.load(std::memory_order_relaxed);
    if (fd > 0) {
      close(fd);
      slot.store(-1, std::memory_order_relaxed);
    }
  }
}

void RegisterLockFd(int fd) {
  static const int installed = pthread_atfork(nullptr, nullptr, &CloseLockFdsInChild);
  (void)installed;
  for (std::atomic<int>& slot : g_lock_fds) {
    int expected = slot.load(std::memory_order_relaxed);
    if (expected <= 0 && slot.compare_exchange_strong(expected, fd)) return;
  }
  // More than kMaxLockFds stores open at once: this one's lock is not released in forked children.
}

void UnregisterLockFd(int fd) {
  for (std::atomic<int>& slot : g_lock_fds) {
    int expected = fd;
    if (slot.compare_exchange_strong(expected, -1)) return;
  }
}

// ---------------------------------------------------------------- encoding

void EncodeKey(int64_t key, char* out) {
  uint64_t u = static_cast<uint64_t>(key);
  for (int b = 7; b >= 0; --b) {
    out[b] = static_cast<char>(u & 0xff);
    u >>= 8;
  }
}

int64_t DecodeKey(const char* in) {
  uint64_t u = 0;
  for (int b = 0; b < 8; ++b) u = (u << 8) | static_cast<unsigned char>(in[b]);
  return static_cast<int64_t>(u);
}

// The store resumes a database stopped by a full disk itself, from its next write once there is room
// (RocksDbStore::Recover), instead of RocksDB's own recovery, which polls the free space every 5 s (a write would
// fail for seconds after space is back) and refuses a manual resume meanwhile.
class NoAutoRecovery : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status bg_error, bool* auto_recovery) override {
    bg_error.PermitUncheckedError();
    *auto_recovery = false;
  }
};

// ---------------------------------------------------------------- the store

class RocksDbStore : public ColdStore {
 public:
  // Takes the directory (see cold_store.h's policy) and opens a fresh database in it.
  explicit RocksDbStore(const StoreOptions& options)
      : path_(options.path),
        width_(options.width),
        value_bytes_(static_cast<size_t>(options.width) * sizeof(float) + sizeof(int64_t) + sizeof(uint32_t)),
        write_buffer_bytes_(std::max(options.write_buffer_bytes, kMinWriteBufferBytes)),
        write_buffers_(options.write_buffers),
        block_cache_bytes_(options.block_cache_bytes),
        count_keys_(options.count_keys) {
    TakeDirectory();
    try {
      db_ = OpenDb(generation_);
    } catch (...) {
      ReleaseDirectory();
      throw;
    }
  }

  ~RocksDbStore() override {
    db_.reset();  // the last reference closes the database and removes its files
    ReleaseDirectory();
  }

  void Get(const int64_t* keys, int64_t n, float* rows, KeyMeta* meta, bool* found) override {
    if (n <= 0) return;
    const std::shared_ptr<rocksdb::DB> db = Db();
    Batch batch;
    rocksdb::ReadOptions ro;
    for (int64_t begin = 0; begin < n; begin += kBatch) {
      const int64_t m = std::min(kBatch, n - begin);
      batch.Read(db.get(), ro, keys + begin, m);
      for (int64_t i = 0; i < m; ++i) {
        const rocksdb::Status& s = batch.statuses[i];
        if (s.IsNotFound()) {
          found[begin + i] = false;
          continue;
        }
        if (!s.ok()) throw Error(s, "reading " + std::to_string(n) + " keys");
        DecodeValue(keys[begin + i], batch.values[i], rows + (begin + i) * width_, &meta[begin + i]);
        found[begin + i] = true;
      }
    }
  }

  void Put(const int64_t* keys, int64_t n, const float* rows, const KeyMeta* meta) override {
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(write_mu_);  // the presence check and the write are one step for num_keys
    const std::shared_ptr<rocksdb::DB> db = Db();
    int64_t added = n;  // without count_keys the caller vouches that every key is new
    if (count_keys_) {
      const std::vector<int64_t> distinct = Distinct(keys, n);
      added = static_cast<int64_t>(distinct.size()) - CountPresent(db.get(), distinct);
    }
    rocksdb::WriteBatch wb(static_cast<size_t>(n) * (value_bytes_ + 8 + 8));
    std::string value(value_bytes_, '\0');
    char k[8];
    for (int64_t i = 0; i < n; ++i) {
      EncodeKey(keys[i], k);
      std::memcpy(&value[0], rows + i * width_, static_cast<size_t>(width_) * sizeof(float));
      std::memcpy(&value[width_ * sizeof(float)], &meta[i].version, sizeof(int64_t));
      std::memcpy(&value[width_ * sizeof(float) + sizeof(int64_t)], &meta[i].frequency, sizeof(uint32_t));
      const rocksdb::Status s = wb.Put(rocksdb::Slice(k, 8), value);
      if (!s.ok()) throw Error(s, "batching " + std::to_string(n) + " rows");
    }
    Write(db.get(), &wb, "writing " + std::to_string(n) + " rows");
    num_keys_.fetch_add(added, std::memory_order_relaxed);
  }

  void Delete(const int64_t* keys, int64_t n) override {
    if (n <= 0) return;
    std::lock_guard<std::mutex> lock(write_mu_);
    const std::shared_ptr<rocksdb::DB> db = Db();
    const std::vector<int64_t> distinct = Distinct(keys, n);
    // Only present keys get a tombstone: num_keys stays exact and absent keys cost no space. Without count_keys
    // the caller vouches that every key is present.
    std::vector<bool> is_present(distinct.size(), true);
    if (count_keys_) Presence(db.get(), distinct, &is_present);
    rocksdb::WriteBatch wb;
    int64_t removed = 0;
    char k[8];
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (!is_present[i]) continue;
      EncodeKey(distinct[i], k);
      const rocksdb::Status s = wb.Delete(rocksdb::Slice(k, 8));
      if (!s.ok()) throw Error(s, "batching " + std::to_string(n) + " deletes");
      ++removed;
    }
    if (removed == 0) return;
    Write(db.get(), &wb, "deleting " + std::to_string(removed) + " keys");
    num_keys_.fetch_sub(removed, std::memory_order_relaxed);
    deletes_since_compaction_.fetch_add(removed, std::memory_order_relaxed);
  }

  void ForEach(const std::function<bool(int64_t, const float*, const KeyMeta&)>& fn) const override {
    const std::shared_ptr<rocksdb::DB> db = Db();  // stays open through a concurrent Clear
    struct SnapshotGuard {
      rocksdb::DB* db;
      const rocksdb::Snapshot* snapshot;
      ~SnapshotGuard() { db->ReleaseSnapshot(snapshot); }
    } guard{db.get(), db->GetSnapshot()};
    rocksdb::ReadOptions ro;
    ro.snapshot = guard.snapshot;
    ro.fill_cache = false;  // a scan must not push the hot rows out of the block cache
    ro.readahead_size = 2 << 20;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    std::vector<float> row(static_cast<size_t>(width_));
    KeyMeta m;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const rocksdb::Slice key = it->key();
      if (key.size() != 8) {
        throw StoreError(StoreError::kCorrupt, "tier store " + path_ + ": an entry has a key of " +
                                                   std::to_string(key.size()) + " bytes; expected 8");
      }
      const int64_t k = DecodeKey(key.data());
      DecodeValue(k, it->value(), row.data(), &m);
      if (!fn(k, row.data(), m)) return;
    }
    if (!it->status().ok()) throw Error(it->status(), "scanning the store");
  }

  int64_t num_keys() const override { return num_keys_.load(std::memory_order_relaxed); }

  // The SST files of every live version of the database (those an open ForEach still reads included), plus what
  // the memtables hold (entries not flushed yet: they reach the disk at the next flush). Files already obsolete
  // but not yet unlinked by RocksDB's background threads, the MANIFEST, OPTIONS and LOG files (a few KB) are not
  // counted.
  int64_t disk_bytes() const override {
    const std::shared_ptr<rocksdb::DB> db = Db();
    uint64_t sst = 0, entries = 0, imm_entries = 0, deletes = 0, imm_deletes = 0;
    db->GetIntProperty(rocksdb::DB::Properties::kTotalSstFilesSize, &sst);
    db->GetIntProperty(rocksdb::DB::Properties::kNumEntriesActiveMemTable, &entries);
    db->GetIntProperty(rocksdb::DB::Properties::kNumEntriesImmMemTables, &imm_entries);
    db->GetIntProperty(rocksdb::DB::Properties::kNumDeletesActiveMemTable, &deletes);
    db->GetIntProperty(rocksdb::DB::Properties::kNumDeletesImmMemTables, &imm_deletes);
    // An SST entry costs its key, its value and ~8 bytes of internal key (sequence number, type) and block index.
    const uint64_t puts = (entries + imm_entries) - std::min(entries + imm_entries, deletes + imm_deletes);
    const uint64_t memtable = puts * (value_bytes_ + 16) + (deletes + imm_deletes) * 16;
    return static_cast<int64_t>(sst + memtable);
  }

  // A fresh database replaces the old one, which closes and is removed when its last user (a ForEach) is done.
  void Clear() override {
    std::lock_guard<std::mutex> lock(write_mu_);
    std::shared_ptr<rocksdb::DB> fresh = OpenDb(generation_ + 1);
    std::shared_ptr<rocksdb::DB> old;
    {
      std::lock_guard<std::mutex> db_lock(db_mu_);
      ++generation_;
      old = std::move(db_);
      db_ = std::move(fresh);
    }
    num_keys_.store(0, std::memory_order_relaxed);
    deletes_since_compaction_.store(0, std::memory_order_relaxed);
    old.reset();
  }

  // A full compaction once the tombstones since the last one reach a quarter of the live keys (and at least
  // kMinCompactionDeletes): deleted rows then take no space. Costs a rewrite of the store; concurrent reads and
  // writes go on meanwhile. Needs free space of about the store's size while it runs.
  void CompactIfNeeded() override {
    constexpr int64_t kMinCompactionDeletes = 4096;
    std::lock_guard<std::mutex> lock(compact_mu_);
    const int64_t deletes = deletes_since_compaction_.load(std::memory_order_relaxed);
    if (deletes < std::max<int64_t>(kMinCompactionDeletes, num_keys() / 4)) return;
    const std::shared_ptr<rocksdb::DB> db = Db();
    rocksdb::Status s = db->Flush(rocksdb::FlushOptions());
    if (s.ok()) {
      rocksdb::CompactRangeOptions co;
      co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
      co.exclusive_manual_compaction = false;
      s = db->CompactRange(co, nullptr, nullptr);
    }
    if (!s.ok()) throw Error(s, "compacting after " + std::to_string(deletes) + " deletes");
    deletes_since_compaction_.fetch_sub(deletes, std::memory_order_relaxed);
  }

  const std::string& path() const override { return path_; }

 private:
  // MultiGet buffers for up to kBatch keys, reused across chunks.
  struct Batch {
    std::vector<char> key_bytes;
    std::vector<rocksdb::Slice> slices;
    std::vector<rocksdb::PinnableSlice> values;
    std::vector<rocksdb::Status> statuses;

    void Read(rocksdb::DB* db, const rocksdb::ReadOptions& ro, const int64_t* keys, int64_t m) {
      key_bytes.resize(static_cast<size_t>(m) * 8);
      slices.resize(static_cast<size_t>(m));
      if (values.size() < static_cast<size_t>(m)) values.resize(static_cast<size_t>(m));
      statuses.assign(static_cast<size_t>(m), rocksdb::Status());
      for (int64_t i = 0; i < m; ++i) {
        EncodeKey(keys[i], &key_bytes[i * 8]);
        slices[i] = rocksdb::Slice(&key_bytes[i * 8], 8);
        values[i].Reset();
      }
      db->MultiGet(ro, db->DefaultColumnFamily(), static_cast<size_t>(m), slices.data(), values.data(),
                   statuses.data());
    }
  };

  static std::vector<int64_t> Distinct(const int64_t* keys, int64_t n) {
    std::vector<int64_t> d(keys, keys + n);
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
    return d;
  }

  void Presence(rocksdb::DB* db, const std::vector<int64_t>& keys, std::vector<bool>* present) const {
    present->assign(keys.size(), false);
    Batch batch;
    rocksdb::ReadOptions ro;
    const int64_t n = static_cast<int64_t>(keys.size());
    for (int64_t begin = 0; begin < n; begin += kBatch) {
      const int64_t m = std::min(kBatch, n - begin);
      batch.Read(db, ro, keys.data() + begin, m);
      for (int64_t i = 0; i < m; ++i) {
        const rocksdb::Status& s = batch.statuses[i];
        if (!s.ok() && !s.IsNotFound()) throw Error(s, "checking " + std::to_string(n) + " keys");
        (*present)[begin + i] = s.ok();
      }
    }
  }

  int64_t CountPresent(rocksdb::DB* db, const std::vector<int64_t>& keys) const {
    std::vector<bool> present;
    Presence(db, keys, &present);
    return std::count(present.begin(), present.end(), true);
  }

  void DecodeValue(int64_t key, const rocksdb::Slice& v, float* row, KeyMeta* meta) const {
    if (v.size() != value_bytes_) {
      throw StoreError(StoreError::kCorrupt, "tier store " + path_ + ": the row of key " + std::to_string(key) +
                                                 " has " + std::to_string(v.size()) + " bytes; expected " +
                                                 std::to_string(value_bytes_) + " (width " + std::to_string(width_) +
                                                 ")");
    }
    std::memcpy(row, v.data(), static_cast<size_t>(width_) * sizeof(float));
    std::memcpy(&meta->version, v.data() + width_ * sizeof(float), sizeof(int64_t));
    std::memcpy(&meta->frequency, v.data() + width_ * sizeof(float) + sizeof(int64_t), sizeof(uint32_t));
  }

  // A write without the WAL. A full disk stops the database (a flush or compaction failed; the rows already
  // written stay readable in the memtables). A write that finds it stopped fails at once while the disk is still
  // full; once there is room again, it resumes the database (Recover) and is retried, so a write succeeds as soon
  // as space is back.
  void Write(rocksdb::DB* db, rocksdb::WriteBatch* wb, const std::string& what) {
    rocksdb::WriteOptions wo;
    wo.disableWAL = true;
    rocksdb::Status s = db->Write(wo, wb);
    // A stopped database fails writes with its background error, or with Incomplete when the write waited for a
    // flush (memtables full) and the error came meanwhile.
    if (!s.ok() && (s.IsIOError() || s.IsNoSpace() || s.IsIncomplete()) && HasRoomFor(wb->GetDataSize())) {
      if (Recover(db)) s = db->Write(wo, wb);
    }
    if (!s.ok()) throw Error(s, what);
  }

  // Resumes a database stopped by a background error; returns whether it did. Call with write_mu_ held. The
  // resume runs alone: compactions are off and no background job runs meanwhile. In RocksDB 7.8 a manual resume
  // that fails because of another job's error (a compaction that found the disk full while the resume's flush
  // waited) leaves its flush queued but never scheduled: every later resume then waits for it forever (measured:
  // 1 run in 3-5 of a full-disk test with 64 KiB write buffers). With nothing else running, a resume fails only by
  // its own flush, which has run by then.
  bool Recover(rocksdb::DB* db) {
    std::lock_guard<std::mutex> no_manual_compaction(compact_mu_);
    db->SetOptions({{"disable_auto_compactions", "true"}}).PermitUncheckedError();
    bool resumed = false;
    if (db->PauseBackgroundWork().ok()) {  // waits for the running (and sleeping failed) jobs
      db->ContinueBackgroundWork().PermitUncheckedError();
      resumed = db->Resume().ok();
    }
    db->SetOptions({{"disable_auto_compactions", "false"}}).PermitUncheckedError();
    return resumed;
  }

  // Whether the store's file system has room for a write of `bytes` and the flushes it may need (every memtable,
  // and a margin), so that waiting for RocksDB's recovery makes sense.
  bool HasRoomFor(size_t bytes) const {
    struct statvfs fs;
    if (statvfs(path_.c_str(), &fs) != 0) return false;
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    return free_bytes >= bytes + static_cast<uint64_t>(write_buffers_ * write_buffer_bytes_) + (uint64_t{1} << 20);
  }

  StoreError Error(const rocksdb::Status& s, const std::string& what) const {
    const std::string text = s.ToString();
    if (s.IsNoSpace() || text.find("No space left on device") != std::string::npos) {
      return StoreError(StoreError::kNoSpace,
                        "tier store " + path_ + ": no space left on device while " + what + " (" + text + ")");
    }
    StoreError::Code code = StoreError::kIO;
    if (s.IsCorruption()) {
      code = StoreError::kCorrupt;
    } else if (s.IsInvalidArgument() || s.IsNotSupported()) {
      code = StoreError::kInvalid;
    } else if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsShutdownInProgress() || s.IsIncomplete()) {
      code = StoreError::kUnavailable;
    }
    return StoreError(code, "tier store " + path_ + ": " + what + " failed: " + text);
  }

  std::shared_ptr<rocksdb::DB> Db() const {
    std::lock_guard<std::mutex> lock(db_mu_);
    return db_;
  }

  std::string DbDir(int64_t generation) const { return path_ + "/db-" + std::to_string(generation); }

  std::shared_ptr<rocksdb::DB> OpenDb(int64_t generation) {
    const std::string dir = DbDir(generation);
    rocksdb::BlockBasedTableOptions t;
    t.block_size = 4096;
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    t.whole_key_filtering = true;
    t.optimize_filters_for_memory = true;
    t.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
    // Index and filter blocks live in the block cache, partitioned in 4 KiB blocks under a small top-level
    // block, so that the cache bounds them: a store of 5M rows of width 64 has ~12 MiB of them, which table
    // readers would otherwise hold for good. Pinned (never evicted): the top-level blocks, and every index and
    // filter block of the level-0 files (fresh flushes, at most a few write buffers' worth of rows). Without a
    // cache (block_cache_bytes 0) the table readers hold them (RAM that grows with the store).
    t.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
    t.partition_filters = true;
    t.metadata_block_size = 4096;
    if (block_cache_bytes_ > 0) {
      t.cache_index_and_filter_blocks = true;
      t.cache_index_and_filter_blocks_with_high_priority = true;
      t.pin_top_level_index_and_filter = true;
      t.pin_l0_filter_and_index_blocks_in_cache = true;
      // Not strict: pinned blocks may take the cache over its capacity rather than fail a read. Half of it is
      // kept for index and filter blocks (high priority), so a scan of data blocks cannot evict them all.
      t.block_cache = rocksdb::NewLRUCache(static_cast<size_t>(block_cache_bytes_), /*num_shard_bits=*/-1,
                                           /*strict_capacity_limit=*/false, /*high_pri_pool_ratio=*/0.5);
    } else {
      t.no_block_cache = true;
    }
    rocksdb::Options o;
    o.create_if_missing = true;
    o.error_if_exists = true;
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    o.compression = rocksdb::kNoCompression;
    o.bottommost_compression = rocksdb::kDisableCompressionOption;
    // Memtables: write_buffers_ of write_buffer_bytes_ at most (StoreOptions). The levels are sized from them:
    // a level-0 compaction (4 memtables' worth) merges into a base level of ~4x that, not RocksDB's default of
    // 256 MiB, which small memtables would rewrite whole at every level-0 compaction.
    o.write_buffer_size = static_cast<size_t>(write_buffer_bytes_);
    o.max_write_buffer_number = static_cast<int>(write_buffers_);
    o.min_write_buffer_number_to_merge = 1;
    // Files of 32 MiB or more: each open file's table reader keeps ~2 KiB outside the cache.
    o.max_bytes_for_level_base = static_cast<uint64_t>(16 * write_buffer_bytes_);
    o.target_file_size_base = static_cast<uint64_t>(std::max<int64_t>(4 * write_buffer_bytes_, 32 << 20));
    o.memtable_whole_key_filtering = true;
    o.memtable_prefix_bloom_size_ratio = 0.02;
    o.level_compaction_dynamic_level_bytes = true;
    o.max_background_jobs = 2;
    o.max_open_files = -1;
    o.avoid_flush_during_shutdown = true;
    o.info_log_level = rocksdb::WARN_LEVEL;
    o.keep_log_file_num = 2;
    o.max_log_file_size = 1 << 20;
    o.stats_dump_period_sec = 0;
    o.stats_persist_period_sec = 0;
    o.listeners.push_back(std::make_shared<NoAutoRecovery>());
    // An SST file whose last 64K entries hold 16K tombstones is compacted in the background.
    o.table_properties_collector_factories.push_back(
        rocksdb::NewCompactOnDeletionCollectorFactory(64 * 1024, 16 * 1024));
    rocksdb::DB* raw = nullptr;
    const rocksdb::Status s = rocksdb::DB::Open(o, dir, &raw);
    if (!s.ok()) throw Error(s, "opening a database in " + dir);
    // Closing: stop compactions rather than wait for them, close, remove the files.
    return std::shared_ptr<rocksdb::DB>(raw, [dir](rocksdb::DB* db) {
      rocksdb::CancelAllBackgroundWork(db, /*wait=*/true);
      delete db;
      RemoveTree(dir);
    });
  }

  // The directory policy of cold_store.h: create, refuse a foreign directory, lock, wipe, mark.
  void TakeDirectory() {
    MakeDirs(path_);
    const std::vector<std::string> names = ListDir(path_, path_);
    const bool marked = std::find(names.begin(), names.end(), kMarkerName) != names.end();
    const bool only_lock = names.size() == 1 && names[0] == kLockName;  // a store killed while taking it
    if (!names.empty() && !marked && !only_lock) {
      throw StoreError(StoreError::kForeign,
                       path_ + " is not a tf_ext tier store (it holds " + std::to_string(names.size()) +
                           " entries, e.g. '" + names[0] + "', and no " + kMarkerName +
                           " marker); refusing to delete its files: give tiered storage an empty or new directory");
    }
    const std::string lock_file = path_ + "/" + kLockName;
    lock_fd_ = open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd_ < 0) {
      const int err = errno;
      throw StoreError(CodeOfErrno(err), "tier store " + path_ + ": the directory is not writable (creating " +
                                             lock_file + "): " + ErrnoText(err));
    }
    if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char pid[32] = {0};
      const ssize_t got = pread(lock_fd_, pid, sizeof(pid) - 1, 0);
      std::string holder = got > 0 ? std::string(pid, static_cast<size_t>(got)) : "";
      holder.erase(std::remove(holder.begin(), holder.end(), '\n'), holder.end());
      close(lock_fd_);
      lock_fd_ = -1;
      if (err == EWOULDBLOCK) {
        throw StoreError(StoreError::kLocked, "tier store " + path_ + " is in use by another table (held by process " +
                                                  (holder.empty() ? std::string("unknown") : holder) +
                                                  "): each tiered table needs a directory of its own");
      }
      throw StoreError(StoreError::kIO, "tier store " + path_ + ": cannot lock " + lock_file + ": " + ErrnoText(err));
    }
    RegisterLockFd(lock_fd_);
    try {
      const std::string pid = std::to_string(getpid()) + "\n";
      if (ftruncate(lock_fd_, 0) != 0 || pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
        const int err = errno;
        throw StoreError(CodeOfErrno(err),
                         "tier store " + path_ + ": cannot write " + lock_file + ": " + ErrnoText(err));
      }
      // The marker goes first (a crash from here on leaves a directory the next open recognizes), then the wipe.
      const int marker_err = WriteFile(path_ + "/" + kMarkerName, kMarkerText);
      if (marker_err != 0) {
        throw StoreError(
            CodeOfErrno(marker_err),
            "tier store " + path_ + ": cannot write the marker " + kMarkerName + ": " +
                (marker_err == ENOSPC ? "no space left on device" : "not writable: " + ErrnoText(marker_err)));
      }
      for (const std::string& name : ListDir(path_, path_)) {
        if (name == kMarkerName || name == kLockName) continue;
        const int err = RemoveTree(path_ + "/" + name);
        if (err != 0) {
          throw StoreError(CodeOfErrno(err), "tier store " + path_ + ": cannot remove the previous store's " + name +
                                                 ": " + ErrnoText(err));
        }
      }
    } catch (...) {
      ReleaseDirectory();
      throw;
    }
  }

  void ReleaseDirectory() {
    if (lock_fd_ >= 0) {
      UnregisterLockFd(lock_fd_);
      close(lock_fd_);  // releases the flock
      lock_fd_ = -1;
    }
  }

  const std::string path_;
  const int64_t width_;
  const size_t value_bytes_;
  const int64_t write_buffer_bytes_;  // StoreOptions::write_buffer_bytes, at least RocksDB's smallest
  const int64_t write_buffers_;
  const int64_t block_cache_bytes_;
  const bool count_keys_;  // StoreOptions::count_keys: read presence before writes
  int lock_fd_ = -1;

  mutable std::mutex db_mu_;  // guards db_ and generation_
  std::shared_ptr<rocksdb::DB> db_;
  int64_t generation_ = 0;

  std::mutex write_mu_;    // serializes Put, Delete and Clear (num_keys_ stays exact)
  std::mutex compact_mu_;  // one CompactIfNeeded at a time
  std::atomic<int64_t> num_keys_{0};
  std::atomic<int64_t> deletes_since_compaction_{0};
};

}  // namespace
}  // namespace table
}  // namespace tfext

// The plugin's entry point (cold_store.h: OpenRocksDbStoreFn). Exceptions stop here.
extern "C" __attribute__((visibility("default"))) tfext::table::ColdStore* tfext_open_rocksdb_store(
    const tfext::table::StoreOptions* options, int* error_code, std::string* error_message) {
  using tfext::table::StoreError;
  try {
    if (options->path.empty()) throw StoreError(StoreError::kInvalid, "a tier store needs a directory path; got \"\"");
    if (options->width < 1 || options->width > tfext::table::kMaxWidth) {
      throw StoreError(StoreError::kInvalid, "tier store " + options->path + ": width must be in [1, 2^24]; got " +
                                                 std::to_string(options->width));
    }
    if (options->write_buffer_bytes < tfext::table::kMinWriteBufferBytes || options->write_buffers < 2 ||
        options->write_buffers > 64 || options->block_cache_bytes < 0) {
      throw StoreError(StoreError::kInvalid,
                       "tier store " + options->path +
                           ": write_buffer_bytes must be >= " + std::to_string(tfext::table::kMinWriteBufferBytes) +
                           ", write_buffers in [2, 64] and block_cache_bytes >= 0; got " +
                           std::to_string(options->write_buffer_bytes) + ", " + std::to_string(options->write_buffers) +
                           " and " + std::to_string(options->block_cache_bytes));
    }
    return new tfext::table::RocksDbStore(*options);
  } catch (const StoreError& e) {
    *error_code = e.code();
    *error_message = e.what();
  } catch (const std::exception& e) {
    *error_code = StoreError::kIO;
    *error_message = "tier store " + options->path + ": " + e.what();
  }
  return nullptr;
}

static_assert(std::is_same<decltype(&tfext_open_rocksdb_store), tfext::table::OpenRocksDbStoreFn>::value,
              "the plugin's entry point must match cold_store.h's OpenRocksDbStoreFn");

// The version of cold_store.h this plugin was built with; the loader refuses the plugin unless it is its own.
extern "C" __attribute__((visibility("default"))) int tfext_rocksdb_store_abi() { return tfext::table::kColdStoreAbi; }

static_assert(std::is_same<decltype(&tfext_rocksdb_store_abi), tfext::table::RocksDbStoreAbiFn>::value,
              "the plugin's version symbol must match cold_store.h's RocksDbStoreAbiFn");
