// Helpers shared by the tiered table's tests (tiered_table_test.cc,
// tiered_table_faults_test.cc): the reference comparisons against the
// untiered table, key and value generators, and a store wrapper that
// injects failures or freezes a demotion chunk between memory and disk.

#ifndef TENSORFLOW_EXT_TABLE_TIERED_TIERED_TEST_UTIL_H_
#define TENSORFLOW_EXT_TABLE_TIERED_TIERED_TEST_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/tiered/tiered_table.h"

namespace tfext_tiered_test {

using tfext::table::ColdStore;
using tfext::table::HashKey;
using tfext::table::HashTable;
using tfext::table::KeyMeta;
using tfext::table::OpenColdStore;
using tfext::table::ParallelFor;
using tfext::table::Rounding;
using tfext::table::RowStorage;
using tfext::table::StoreError;
using tfext::table::StoreOptions;
using tfext::table::TableOptions;
using tfext::table::TieredTable;
using tfext::table::TierOptions;
using tfext::table::TierStats;

inline tfext_test::ThreadPool& Pool() {
  static tfext_test::ThreadPool pool(3);
  return pool;
}
inline ParallelFor PoolParallelFor() { return Pool().AsParallelFor(); }

inline bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Waits, polling, until `done()` holds: until the background demoter has got
// somewhere the test needs. The bound only guards against a hang, far above
// what a busy machine needs, so it never decides a test's outcome.
constexpr int kHangGuardSeconds = 300;
template <typename Done>
void WaitUntil(const Done& done, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHangGuardSeconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::tfext_test::FailCheck(__FILE__, __LINE__, std::string("gave up waiting for ") + what);
    }
    std::this_thread::yield();
  }
}

inline std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/tiered_table_test.XXXXXX";
  CHECK(mkdtemp(&tmpl[0]) != nullptr);
  return tmpl;
}

// A memory budget that holds `rows` rows of `table` (as the tier counts them, its store's share included).
inline int64_t BudgetFor(const HashTable& table, int64_t rows) {
  return TieredTable::MemoryBytesFor(rows, table.row_bytes());
}

inline TierOptions Tier(const std::string& path, int64_t memory_bytes, bool background) {
  TierOptions t;
  t.path = path;
  t.memory_bytes = memory_bytes;
  t.background = background;
  return t;
}

// The whole content of a table (or both tiers), by key.
struct Entry {
  std::vector<float> row;
  KeyMeta meta;
};
using Content = std::map<int64_t, Entry>;

template <typename ExportFn>
Content Collect(int64_t width, ExportFn&& export_fn) {
  std::vector<int64_t> keys;
  std::vector<float> rows;
  std::vector<int64_t> versions;
  std::vector<uint32_t> freqs;
  export_fn([&](int64_t n) {
    keys.resize(n);
    rows.resize(n * width);
    versions.resize(n);
    freqs.resize(n);
    HashTable::ExportBuffers b;
    b.keys = keys.data();
    b.rows = rows.data();
    b.versions = versions.data();
    b.frequencies = freqs.data();
    return b;
  });
  Content c;
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry e;
    e.row = std::vector<float>(rows.begin() + i * width, rows.begin() + (i + 1) * width);
    e.meta.version = versions[i];
    e.meta.frequency = freqs[i];
    const bool fresh = c.emplace(keys[i], e).second;
    CHECK(fresh);  // no key in both tiers, none twice
  }
  return c;
}

inline Content ContentOf(const HashTable& t) {
  return Collect(t.width(),
                 [&](const std::function<HashTable::ExportBuffers(int64_t)>& alloc) { t.Export(0, t.width(), alloc); });
}
inline Content ContentOf(const TieredTable& t) {
  return Collect(t.memory()->width(), [&](const std::function<HashTable::ExportBuffers(int64_t)>& alloc) {
    t.Export(0, t.memory()->width(), alloc);
  });
}

inline bool SameBits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

// Bit-identical contents: same keys, rows (bits), versions and frequencies.
inline void CheckSameContent(const Content& got, const Content& want) {
  CHECK_EQ(got.size(), want.size());
  auto g = got.begin();
  for (auto w = want.begin(); w != want.end(); ++w, ++g) {
    CHECK_EQ(g->first, w->first);
    CHECK(SameBits(g->second.row.data(), w->second.row.data(), static_cast<int64_t>(w->second.row.size())));
    CHECK_EQ(g->second.meta.version, w->second.meta.version);
    CHECK_EQ(g->second.meta.frequency, w->second.meta.frequency);
  }
}

// Zipf(s) ranks over [0, n) by inversion of the cumulative weights, mapped to
// scattered keys (negative ones too) so that a rank's key says nothing about
// its shard.
class ZipfKeys {
 public:
  ZipfKeys(int64_t n, double s, uint64_t seed) : rng_(seed), cdf_(n) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) cdf_[i] = (sum += 1.0 / std::pow(static_cast<double>(i + 1), s));
    for (double& c : cdf_) c /= sum;
  }
  static int64_t KeyOf(int64_t rank) { return static_cast<int64_t>(HashKey(rank) >> 3) - (int64_t{1} << 59); }
  int64_t Next() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    const int64_t rank = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return KeyOf(std::min<int64_t>(rank, static_cast<int64_t>(cdf_.size()) - 1));
  }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

// A deterministic value of (key, a, b): initial rows, gradients.
inline float Noise(int64_t key, int64_t a, int64_t b) {
  const uint64_t h = HashKey(key ^ static_cast<int64_t>(HashKey(a * 1000003 + b)));
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 - 0.5);
}

// Keys 0..n-1 inserted in batches of 50 with version = batch index and rows
// from (key, column); memory holds `budget` of them, disk the rest (LRU: the
// lowest versions).
inline void Fill(TieredTable* tier, HashTable* plain, int64_t n, int64_t batch) {
  HashTable& memory = *tier->memory();
  const int64_t width = memory.width();
  for (int64_t off = 0; off < n; off += batch) {
    const int64_t m = std::min(batch, n - off);
    std::vector<int64_t> keys(m);
    std::vector<float> rows(m * width);
    for (int64_t i = 0; i < m; ++i) {
      keys[i] = off + i;
      for (int64_t c = 0; c < width; ++c) rows[i * width + c] = Noise(keys[i], 0, c);
    }
    const int64_t version = off / batch;
    tier->WithKeys(keys.data(), m, PoolParallelFor(), [&] {
      memory.Insert(keys.data(), m, 0, width, rows.data(), nullptr, true, version, PoolParallelFor());
    });
    if (plain != nullptr)
      plain->Insert(keys.data(), m, 0, width, rows.data(), nullptr, true, version, PoolParallelFor());
  }
}

template <typename Fn>
std::string ExpectThrow(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ::tfext_test::FailCheck(__FILE__, __LINE__, "expected an exception, nothing was thrown");
}

// A store that forwards to the RocksDB store and fails Puts on demand, or
// holds a Put until released (to freeze a chunk in the outbox), or calls a
// test's hook at the start of each Get, Put and Delete (to look at the table
// from inside the tier's store calls, on the tier's thread).
class ControlledStore : public ColdStore {
 public:
  explicit ControlledStore(std::unique_ptr<ColdStore> inner) : inner_(std::move(inner)) {}
  void Get(const int64_t* keys, int64_t n, float* rows, KeyMeta* meta, bool* found) override {
    if (on_call_) on_call_("Get");
    inner_->Get(keys, n, rows, meta, found);
  }
  void Put(const int64_t* keys, int64_t n, const float* rows, const KeyMeta* meta) override {
    if (on_call_) on_call_("Put");
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (hold_) {
        held_keys_.assign(keys, keys + n);
        holding_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !hold_; });
        holding_ = false;
      }
    }
    if (fail_puts_.load()) {
      ++failed_puts_;
      throw StoreError(StoreError::kNoSpace, inner_->path() + ": no space left on device (injected)");
    }
    inner_->Put(keys, n, rows, meta);
  }
  void Delete(const int64_t* keys, int64_t n) override {
    if (on_call_) on_call_("Delete");
    inner_->Delete(keys, n);
  }
  void ForEach(const std::function<bool(int64_t, const float*, const KeyMeta&)>& fn) const override {
    inner_->ForEach(fn);
  }
  int64_t num_keys() const override { return inner_->num_keys(); }
  int64_t disk_bytes() const override { return inner_->disk_bytes(); }
  void Clear() override { inner_->Clear(); }
  void CompactIfNeeded() override { inner_->CompactIfNeeded(); }
  const std::string& path() const override { return inner_->path(); }

  std::atomic<bool> fail_puts_{false};
  std::atomic<int64_t> failed_puts_{0};
  // Set before the tier uses the store; must not throw.
  std::function<void(const char* op)> on_call_;

  // Makes the next Put wait; returns once one waits, with its keys.
  void HoldNextPut() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = true;
  }
  std::vector<int64_t> WaitForHeldPut() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return holding_; });
    return held_keys_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = false;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<ColdStore> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  bool holding_ = false;
  std::vector<int64_t> held_keys_;
};

// Releases a store's held Put when it goes out of scope: declared after the
// table, so that a failed CHECK does not leave the demoter waiting in the Put
// while the table's destructor joins it.
class ReleaseAtExit {
 public:
  explicit ReleaseAtExit(ControlledStore* store) : store_(store) {}
  ~ReleaseAtExit() { store_->Release(); }
  ReleaseAtExit(const ReleaseAtExit&) = delete;
  ReleaseAtExit& operator=(const ReleaseAtExit&) = delete;

 private:
  ControlledStore* store_;
};

inline std::unique_ptr<ColdStore> OpenStore(const std::string& path, int64_t width) {
  StoreOptions so;
  so.path = path;
  so.width = width;
  so.block_cache_bytes = 1 << 20;
  return OpenColdStore(so);
}

// The plugin's path as an absolute one (the BUILD target passes one relative
// to the runfiles), for child processes that run elsewhere.
inline void MakePluginPathAbsolute() {
  const char* plugin = std::getenv(tfext::table::kRocksDbStoreLibraryEnv);
  if (plugin != nullptr && plugin[0] != '\0' && plugin[0] != '/') {
    char abs[4096];
    if (realpath(plugin, abs) != nullptr) setenv(tfext::table::kRocksDbStoreLibraryEnv, abs, 1);
  }
}

}  // namespace tfext_tiered_test

#endif  // TENSORFLOW_EXT_TABLE_TIERED_TIERED_TEST_UTIL_H_
