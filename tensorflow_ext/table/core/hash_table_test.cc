// Unit tests of the table core, run without TensorFlow:
//   bazel test //tensorflow_ext/table/core:hash_table_test
// or, from the repository root, with g++ alone:
//   g++ -O2 -std=c++17 -pthread -I. tensorflow_ext/table/core/hash_table.cc
//       tensorflow_ext/table/core/hash_table_test.cc -o /tmp/hash_table_test
// An optional argument runs only the tests whose name contains it.

#include "tensorflow_ext/table/core/hash_table.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tensorflow_ext/table/core/check.h"
#include "tensorflow_ext/table/core/test_peer.h"
#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::CompactBytes;
using tfext::table::DecodeElements;
using tfext::table::DecodeInt8Row;
using tfext::table::EncodeElements;
using tfext::table::EncodeInt8Row;
using tfext::table::HashKey;
using tfext::table::HashTable;
using tfext::table::HashTableTestPeer;
using tfext::table::InlineParallelFor;
using tfext::table::KeyMeta;
using tfext::table::OutOfMemoryError;
using tfext::table::ParallelFor;
using tfext::table::Rounding;
using tfext::table::RowStorage;
using tfext::table::TableOptions;
using tfext::table::ValidateOptions;

constexpr int64_t kMinKey = std::numeric_limits<int64_t>::min();
constexpr int64_t kMaxKey = std::numeric_limits<int64_t>::max();
constexpr uint32_t kMaxFreq = std::numeric_limits<uint32_t>::max();

// One pool for the whole test binary (2 threads + caller = real parallelism
// even on a 2-core machine).
tfext_test::ThreadPool& Pool() {
  static tfext_test::ThreadPool pool(3);
  return pool;
}
ParallelFor PoolParallelFor() { return Pool().AsParallelFor(); }

// Waits, polling, until `done()` holds: until a background thread (the
// prefault worker, a reader) has got somewhere the test needs. The bound is a
// guard against a hang only, far above what a busy machine needs, so it never
// decides a test's outcome. A template, not std::function: it runs in
// children whose address space is used up.
constexpr int kHangGuardSeconds = 300;
template <typename Done>
void WaitUntil(const Done& done, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHangGuardSeconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "  no progress in %d s waiting for %s: a hang\n", kHangGuardSeconds, what);
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// The table's spare slabs (ready, and taken by the arena so far) once the
// prefault worker has answered every request made so far.
void SettledSpareSlabs(const HashTable& t, int64_t* ready, int64_t* taken) {
  int64_t pending = 0;
  WaitUntil(
      [&] {
        HashTableTestPeer::SpareSlabs(t, ready, &pending, taken);
        return pending == 0;
      },
      "the prefault worker");
}

TableOptions Options(int64_t width, int shard_bits = -1, int64_t capacity = 0, double load = 0.8) {
  TableOptions o;
  o.width = width;
  o.shard_bits = shard_bits;
  o.initial_capacity = capacity;
  o.max_load_factor = load;
  return o;
}

// Reads all columns and metadata of the table into a std::map for comparison.
struct Entry {
  std::vector<float> row;
  int64_t version = 0;
  uint32_t frequency = 0;
  bool operator==(const Entry& o) const { return row == o.row && version == o.version && frequency == o.frequency; }
};

std::map<int64_t, Entry> Snapshot(const HashTable& t) {
  std::vector<int64_t> keys;
  std::vector<float> rows;
  std::vector<int64_t> versions;
  std::vector<uint32_t> freqs;
  t.Export(0, t.width(), [&](int64_t n) {
    keys.resize(n);
    rows.resize(n * t.width());
    versions.resize(n);
    freqs.resize(n);
    HashTable::ExportBuffers b;
    b.keys = keys.data();
    b.rows = rows.data();
    b.versions = versions.data();
    b.frequencies = freqs.data();
    return b;
  });
  std::map<int64_t, Entry> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry e;
    e.row.assign(rows.begin() + i * t.width(), rows.begin() + (i + 1) * t.width());
    e.version = versions[i];
    e.frequency = freqs[i];
    CHECK(out.emplace(keys[i], e).second);  // no key exported twice
  }
  return out;
}

// ---------------------------------------------------------------------------
// A reference model: the documented semantics, one key at a time, in batch
// order, on a std::unordered_map.
class Model {
 public:
  explicit Model(int64_t width) : width_(width) {}

  std::unordered_map<int64_t, Entry>& map() { return map_; }

  Entry NewEntry(const float* defaults) const {
    Entry e;
    e.row.assign(width_, 0.f);
    if (defaults != nullptr) e.row.assign(defaults, defaults + width_);
    return e;
  }
  static void Touch(Entry& e, bool count, int64_t version) {
    if (count && e.frequency != kMaxFreq) ++e.frequency;
    if (version >= 0) e.version = version;
  }
  static void InitMeta(Entry& e, bool count, int64_t version) {
    e.frequency = count ? 1 : 0;
    e.version = version >= 0 ? version : 0;
  }

  void Find(const int64_t* keys, int64_t n, int64_t cb, int64_t cols, float* out, bool* found, const float* def) {
    for (int64_t i = 0; i < n; ++i) {
      auto it = map_.find(keys[i]);
      if (it != map_.end()) {
        std::copy_n(it->second.row.data() + cb, cols, out + i * cols);
      } else if (def != nullptr) {
        std::copy_n(def, cols, out + i * cols);
      }
      found[i] = it != map_.end();
    }
  }
  void FindOrInsert(const int64_t* keys, int64_t n, int64_t cb, int64_t cols, const float* init, const float* defaults,
                    float* out, bool* inserted, bool count, int64_t version) {
    for (int64_t i = 0; i < n; ++i) {
      auto it = map_.find(keys[i]);
      const bool add = it == map_.end();
      if (add) {
        Entry e = NewEntry(defaults);
        std::copy_n(init + i * cols, cols, e.row.data() + cb);
        InitMeta(e, count, version);
        it = map_.emplace(keys[i], e).first;
      } else {
        Touch(it->second, count, version);
      }
      std::copy_n(it->second.row.data() + cb, cols, out + i * cols);
      inserted[i] = add;
    }
  }
  void Insert(const int64_t* keys, int64_t n, int64_t cb, int64_t cols, const float* values, const float* defaults,
              bool count, int64_t version) {
    for (int64_t i = 0; i < n; ++i) {
      auto it = map_.find(keys[i]);
      if (it == map_.end()) {
        Entry e = NewEntry(defaults);
        InitMeta(e, count, version);
        it = map_.emplace(keys[i], e).first;
      } else {
        Touch(it->second, count, version);
      }
      std::copy_n(values + i * cols, cols, it->second.row.data() + cb);
    }
  }
  void Accumulate(const int64_t* keys, int64_t n, int64_t cb, int64_t cols, const float* deltas, const float* defaults,
                  bool insert_missing, bool count, int64_t version) {
    for (int64_t i = 0; i < n; ++i) {
      auto it = map_.find(keys[i]);
      if (it == map_.end()) {
        if (!insert_missing) continue;
        Entry e = NewEntry(defaults);
        InitMeta(e, count, version);
        it = map_.emplace(keys[i], e).first;
      } else {
        Touch(it->second, count, version);
      }
      for (int64_t c = 0; c < cols; ++c) it->second.row[cb + c] += deltas[i * cols + c];
    }
  }
  int64_t Remove(const int64_t* keys, int64_t n) {
    int64_t removed = 0;
    for (int64_t i = 0; i < n; ++i) removed += static_cast<int64_t>(map_.erase(keys[i]));
    return removed;
  }
  void Import(const int64_t* keys, int64_t n, int64_t cb, int64_t cols, const float* rows, const float* defaults,
              const int64_t* versions, const uint32_t* freqs) {
    for (int64_t i = 0; i < n; ++i) {
      auto it = map_.find(keys[i]);
      if (it == map_.end()) it = map_.emplace(keys[i], NewEntry(defaults)).first;
      std::copy_n(rows + i * cols, cols, it->second.row.data() + cb);
      it->second.version = versions != nullptr ? versions[i] : 0;
      it->second.frequency = freqs != nullptr ? freqs[i] : 0;
    }
  }

 private:
  int64_t width_;
  std::unordered_map<int64_t, Entry> map_;
};

void CheckSameContents(const HashTable& t, Model& model) {
  CHECK_EQ(t.size(), static_cast<int64_t>(model.map().size()));
  const std::map<int64_t, Entry> snap = Snapshot(t);
  CHECK_EQ(snap.size(), model.map().size());
  for (const auto& kv : model.map()) {
    auto it = snap.find(kv.first);
    CHECK(it != snap.end());
    CHECK(it->second == kv.second);
  }
}

// ---------------------------------------------------------------------------

TFEXT_TEST(HashKeyIsAFixedBijectiveMixer) {
  // Pinned values: the Python layer partitions keys with the same function.
  CHECK_EQ(HashKey(0), uint64_t{0});
  CHECK_EQ(HashKey(1), uint64_t{0x5692161d100b05e5ULL});
  std::set<uint64_t> seen;
  int64_t bit_counts[64] = {0};
  for (int64_t k = -5000; k < 5000; ++k) {
    const uint64_t h = HashKey(k);
    CHECK(seen.insert(h).second);
    for (int b = 0; b < 64; ++b) bit_counts[b] += (h >> b) & 1;
  }
  for (int b = 0; b < 64; ++b) {
    CHECK_GT(bit_counts[b], 4500);
    CHECK_LT(bit_counts[b], 5500);
  }
}

TFEXT_TEST(ValidateOptionsNamesTheProblem) {
  CHECK_EQ(ValidateOptions(Options(16)), std::string());
  CHECK_EQ(ValidateOptions(Options(0)), std::string("width must be >= 1, got 0"));
  CHECK(ValidateOptions(Options(-3)).find("width must be >= 1, got -3") != std::string::npos);
  CHECK(ValidateOptions(Options(int64_t{1} << 30)).find("width must be <=") != std::string::npos);
  CHECK_EQ(ValidateOptions(Options(4, -1, -5)), std::string("initial_capacity must be >= 0, got -5"));
  CHECK(ValidateOptions(Options(4, -1, (int64_t{1} << 40) + 1)).find("initial_capacity must be <= 2^40") !=
        std::string::npos);
  CHECK_EQ(ValidateOptions(Options(4, -1, int64_t{1} << 40)), std::string());
  CHECK(ValidateOptions(Options(4, -2)).find("shard_bits") != std::string::npos);
  CHECK(ValidateOptions(Options(4, 13)).find("shard_bits") != std::string::npos);
  CHECK_EQ(ValidateOptions(Options(4, 12)), std::string());
  CHECK(ValidateOptions(Options(4, -1, 0, 0.0)).find("max_load_factor must be in (0, 0.95], got 0") !=
        std::string::npos);
  CHECK(ValidateOptions(Options(4, -1, 0, 1.0)).find("max_load_factor") != std::string::npos);
  CHECK(ValidateOptions(Options(4, -1, 0, -0.5)).find("max_load_factor") != std::string::npos);
  CHECK(ValidateOptions(Options(4, -1, 0, std::nan(""))).find("max_load_factor") != std::string::npos);
  CHECK_EQ(ValidateOptions(Options(4, -1, 0, 0.95)), std::string());
}

TFEXT_TEST(EmptyTableAndEmptyBatches) {
  HashTable t(Options(4));
  const ParallelFor pf = InlineParallelFor();
  CHECK_EQ(t.width(), int64_t{4});
  CHECK_EQ(t.size(), int64_t{0});
  CHECK_GT(t.memory_bytes(), int64_t{0});
  // Every batched op accepts n = 0 with null buffers.
  t.Find(nullptr, 0, 0, 4, nullptr, nullptr, nullptr, pf);
  t.FindOrInsert(nullptr, 0, 0, 4, nullptr, nullptr, nullptr, nullptr, true, 1, pf);
  t.Insert(nullptr, 0, 0, 4, nullptr, nullptr, true, 1, pf);
  t.Accumulate(nullptr, 0, 0, 4, nullptr, nullptr, true, true, 1, pf);
  t.Update(
      nullptr, 0, nullptr, [](int64_t, float*, KeyMeta*) { CHECK(false); }, pf);
  CHECK_EQ(t.Remove(nullptr, 0, pf), int64_t{0});
  t.FindMeta(nullptr, 0, nullptr, nullptr, pf);
  t.Import(nullptr, 0, 0, 4, nullptr, nullptr, nullptr, nullptr, pf);
  CHECK_EQ(t.RemoveIf([](int64_t, const float*, const KeyMeta&) { return true; }), int64_t{0});
  int64_t export_n = -1;
  t.Export(0, 4, [&](int64_t n) {
    export_n = n;
    return HashTable::ExportBuffers();
  });
  CHECK_EQ(export_n, int64_t{0});
  CHECK_EQ(t.size(), int64_t{0});
  // Lookups in an empty table miss and write the default.
  const int64_t keys[3] = {0, -1, 7};
  float out[12];
  bool found[3] = {true, true, true};
  const float def[4] = {1, 2, 3, 4};
  t.Find(keys, 3, 0, 4, out, found, def, pf);
  for (int i = 0; i < 3; ++i) {
    CHECK(!found[i]);
    for (int c = 0; c < 4; ++c) CHECK_EQ(out[i * 4 + c], def[c]);
  }
  // Remove of absent keys removes nothing.
  CHECK_EQ(t.Remove(keys, 3, pf), int64_t{0});
}

TFEXT_TEST(InsertFindOverwrite) {
  HashTable t(Options(3));
  const ParallelFor pf = InlineParallelFor();
  const int64_t keys[2] = {10, 20};
  const float vals[6] = {1, 2, 3, 4, 5, 6};
  t.Insert(keys, 2, 0, 3, vals, nullptr, false, -1, pf);
  CHECK_EQ(t.size(), int64_t{2});
  const int64_t q[3] = {20, 30, 10};
  float out[9] = {0};
  bool found[3];
  t.Find(q, 3, 0, 3, out, found, nullptr, pf);
  CHECK(found[0] && !found[1] && found[2]);
  CHECK_EQ(out[0], 4.f);
  CHECK_EQ(out[2], 6.f);
  CHECK_EQ(out[3], 0.f);  // miss without default: left untouched
  CHECK_EQ(out[6], 1.f);
  // Overwrite one key, add none.
  const float vals2[3] = {7, 8, 9};
  t.Insert(keys, 1, 0, 3, vals2, nullptr, false, -1, pf);
  CHECK_EQ(t.size(), int64_t{2});
  t.Find(keys, 1, 0, 3, out, nullptr, nullptr, pf);  // found may be null
  CHECK_EQ(out[0], 7.f);
  CHECK_EQ(out[2], 9.f);
}

TFEXT_TEST(DuplicateKeysInOneBatch) {
  const ParallelFor pf = InlineParallelFor();
  {  // Insert: the last occurrence wins.
    HashTable t(Options(2));
    const int64_t keys[4] = {5, 6, 5, 5};
    const float vals[8] = {1, 1, 2, 2, 3, 3, 4, 4};
    t.Insert(keys, 4, 0, 2, vals, nullptr, true, 9, pf);
    CHECK_EQ(t.size(), int64_t{2});
    float out[2];
    t.Find(keys, 1, 0, 2, out, nullptr, nullptr, pf);
    CHECK_EQ(out[0], 4.f);
    KeyMeta meta[2];
    t.FindMeta(keys, 2, meta, nullptr, pf);
    CHECK_EQ(meta[0].frequency, uint32_t{3});  // every occurrence counted
    CHECK_EQ(meta[1].frequency, uint32_t{1});
    CHECK_EQ(meta[0].version, int64_t{9});
  }
  {  // Accumulate: every occurrence is added, including the inserting one.
    HashTable t(Options(2));
    const int64_t keys[5] = {1, 1, 2, 1, 1};
    const float deltas[10] = {1, 10, 2, 20, 5, 50, 3, 30, 4, 40};
    const float defaults[2] = {100, 1000};
    t.Accumulate(keys, 5, 0, 2, deltas, defaults, /*insert_missing=*/true, true, -1, pf);
    float out[4];
    const int64_t q[2] = {1, 2};
    t.Find(q, 2, 0, 2, out, nullptr, nullptr, pf);
    CHECK_EQ(out[0], 110.f);
    CHECK_EQ(out[1], 1100.f);
    CHECK_EQ(out[2], 105.f);
    CHECK_EQ(out[3], 1050.f);
  }
  {  // FindOrInsert: the first occurrence inserts, later ones see its row.
    HashTable t(Options(1));
    const int64_t keys[4] = {3, 4, 3, 3};
    const float init[4] = {30, 40, 31, 32};
    float out[4];
    bool inserted[4];
    t.FindOrInsert(keys, 4, 0, 1, init, nullptr, out, inserted, true, 2, pf);
    CHECK(inserted[0] && inserted[1] && !inserted[2] && !inserted[3]);
    CHECK_EQ(out[0], 30.f);
    CHECK_EQ(out[1], 40.f);
    CHECK_EQ(out[2], 30.f);
    CHECK_EQ(out[3], 30.f);
    KeyMeta meta;
    t.FindMeta(keys, 1, &meta, nullptr, pf);
    CHECK_EQ(meta.frequency, uint32_t{3});
  }
  {  // Remove of a duplicated key counts it once.
    HashTable t(Options(1));
    const int64_t keys[3] = {8, 8, 9};
    const float v[3] = {1, 2, 3};
    t.Insert(keys, 3, 0, 1, v, nullptr, false, -1, pf);
    CHECK_EQ(t.Remove(keys, 3, pf), int64_t{2});
    CHECK_EQ(t.size(), int64_t{0});
  }
}

TFEXT_TEST(ExtremeKeys) {
  for (int shard_bits : {-1, 0, 4}) {
    HashTable t(Options(2, shard_bits));
    const ParallelFor pf = InlineParallelFor();
    const int64_t keys[6] = {kMinKey, kMaxKey, 0, -1, 1, kMinKey + 1};
    float vals[12];
    for (int i = 0; i < 12; ++i) vals[i] = static_cast<float>(i);
    t.Insert(keys, 6, 0, 2, vals, nullptr, false, -1, pf);
    CHECK_EQ(t.size(), int64_t{6});
    float out[12];
    bool found[6];
    t.Find(keys, 6, 0, 2, out, found, nullptr, pf);
    for (int i = 0; i < 6; ++i) CHECK(found[i]);
    for (int i = 0; i < 12; ++i) CHECK_EQ(out[i], vals[i]);
    const std::map<int64_t, Entry> snap = Snapshot(t);
    CHECK_EQ(snap.size(), size_t{6});
    CHECK(snap.count(kMinKey) == 1 && snap.count(kMaxKey) == 1 && snap.count(0) == 1);
    const int64_t gone[2] = {kMinKey, 0};
    CHECK_EQ(t.Remove(gone, 2, pf), int64_t{2});
    t.Find(keys, 6, 0, 2, out, found, nullptr, pf);
    CHECK(!found[0] && found[1] && !found[2] && found[3] && found[4] && found[5]);
    CHECK_EQ(out[2], 2.f);
  }
}

TFEXT_TEST(ColumnRangesAndColumnDefaults) {
  HashTable t(Options(5));
  const ParallelFor pf = InlineParallelFor();
  const float defaults[5] = {0.5f, 0.25f, 0.125f, 9.f, 10.f};
  // Insert columns [1, 3) of a new key: the others come from column_defaults.
  const int64_t k = 42;
  const float v[2] = {7, 8};
  t.Insert(&k, 1, 1, 2, v, defaults, false, -1, pf);
  float row[5];
  t.Find(&k, 1, 0, 5, row, nullptr, nullptr, pf);
  const float expect[5] = {0.5f, 7, 8, 9, 10};
  for (int c = 0; c < 5; ++c) CHECK_EQ(row[c], expect[c]);
  // Null column_defaults means zeros.
  const int64_t k2 = 43;
  t.Insert(&k2, 1, 4, 1, v, nullptr, false, -1, pf);
  t.Find(&k2, 1, 0, 5, row, nullptr, nullptr, pf);
  for (int c = 0; c < 4; ++c) CHECK_EQ(row[c], 0.f);
  CHECK_EQ(row[4], 7.f);
  // Read a sub-range, with a default for misses.
  const int64_t q[2] = {42, 44};
  float out[4];
  const float def[2] = {-1, -2};
  bool found[2];
  t.Find(q, 2, 3, 2, out, found, def, pf);
  CHECK(found[0] && !found[1]);
  CHECK_EQ(out[0], 9.f);
  CHECK_EQ(out[1], 10.f);
  CHECK_EQ(out[2], -1.f);
  CHECK_EQ(out[3], -2.f);
  // Accumulate into a sub-range only.
  const float d[1] = {1};
  t.Accumulate(&k, 1, 2, 1, d, defaults, false, false, -1, pf);
  t.Find(&k, 1, 0, 5, row, nullptr, nullptr, pf);
  CHECK_EQ(row[2], 9.f);
  CHECK_EQ(row[1], 7.f);
  // FindOrInsert of a sub-range: new key gets init there, defaults elsewhere.
  const int64_t k3 = 45;
  const float init[2] = {3, 4};
  float got[2];
  bool ins;
  t.FindOrInsert(&k3, 1, 3, 2, init, defaults, got, &ins, false, -1, pf);
  CHECK(ins);
  CHECK_EQ(got[0], 3.f);
  CHECK_EQ(got[1], 4.f);
  t.Find(&k3, 1, 0, 5, row, nullptr, nullptr, pf);
  CHECK_EQ(row[0], 0.5f);
  CHECK_EQ(row[2], 0.125f);
  CHECK_EQ(row[4], 4.f);
  // Export of a sub-range.
  std::vector<float> ex;
  std::vector<int64_t> ek;
  t.Export(1, 1, [&](int64_t n) {
    ex.resize(n);
    ek.resize(n);
    HashTable::ExportBuffers b;
    b.keys = ek.data();
    b.rows = ex.data();
    return b;
  });
  CHECK_EQ(ek.size(), size_t{3});
  for (size_t i = 0; i < ek.size(); ++i) {
    if (ek[i] == 42) CHECK_EQ(ex[i], 7.f);
    if (ek[i] == 43) CHECK_EQ(ex[i], 0.f);
    if (ek[i] == 45) CHECK_EQ(ex[i], 0.25f);
  }
}

TFEXT_TEST(MetadataVersionAndSaturatingFrequency) {
  HashTable t(Options(1));
  const ParallelFor pf = InlineParallelFor();
  const int64_t k = 7;
  const float v = 1;
  // version < 0 leaves the version alone (0 for a new key); count=false keeps frequency.
  t.Insert(&k, 1, 0, 1, &v, nullptr, false, -1, pf);
  KeyMeta m;
  bool found;
  t.FindMeta(&k, 1, &m, &found, pf);
  CHECK(found);
  CHECK_EQ(m.version, int64_t{0});
  CHECK_EQ(m.frequency, uint32_t{0});
  t.Insert(&k, 1, 0, 1, &v, nullptr, true, 100, pf);
  t.FindMeta(&k, 1, &m, &found, pf);
  CHECK_EQ(m.version, int64_t{100});
  CHECK_EQ(m.frequency, uint32_t{1});
  t.Accumulate(&k, 1, 0, 1, &v, nullptr, false, true, -1, pf);
  t.FindMeta(&k, 1, &m, &found, pf);
  CHECK_EQ(m.version, int64_t{100});
  CHECK_EQ(m.frequency, uint32_t{2});
  // Large versions round-trip exactly (the field is unaligned in the row).
  const int64_t big_version = (int64_t{1} << 62) + 12345;
  t.FindOrInsert(&k, 1, 0, 1, &v, nullptr, nullptr, nullptr, true, big_version, pf);
  t.FindMeta(&k, 1, &m, &found, pf);
  CHECK_EQ(m.version, big_version);
  CHECK_EQ(m.frequency, uint32_t{3});
  // Frequency saturates at 2^32 - 1.
  const int64_t ver = 5;
  const uint32_t freq = kMaxFreq - 1;
  t.Import(&k, 1, 0, 1, &v, nullptr, &ver, &freq, pf);
  for (int i = 0; i < 3; ++i) t.Insert(&k, 1, 0, 1, &v, nullptr, true, -1, pf);
  t.FindMeta(&k, 1, &m, &found, pf);
  CHECK_EQ(m.frequency, kMaxFreq);
  CHECK_EQ(m.version, int64_t{5});
  // Absent keys: zeros and found = false.
  const int64_t absent = 8;
  m.version = 3;
  m.frequency = 3;
  t.FindMeta(&absent, 1, &m, &found, pf);
  CHECK(!found);
  CHECK_EQ(m.version, int64_t{0});
  CHECK_EQ(m.frequency, uint32_t{0});
  // Update sees and writes metadata.
  t.Update(
      &k, 1, nullptr,
      [](int64_t, float* row, KeyMeta* meta) {
        CHECK_EQ(meta->version, int64_t{5});
        meta->version = 77;
        meta->frequency = 4;
        row[0] = 42;
      },
      pf);
  t.FindMeta(&k, 1, &m, &found, pf);
  CHECK_EQ(m.version, int64_t{77});
  CHECK_EQ(m.frequency, uint32_t{4});
  // Update inserts absent keys with column_defaults and zero metadata.
  const float defaults[1] = {6};
  const int64_t k2 = 9;
  t.Update(
      &k2, 1, defaults,
      [](int64_t i, float* row, KeyMeta* meta) {
        CHECK_EQ(i, int64_t{0});
        CHECK_EQ(row[0], 6.f);
        CHECK_EQ(meta->version, int64_t{0});
        CHECK_EQ(meta->frequency, uint32_t{0});
        row[0] += 1;
      },
      pf);
  float out;
  t.Find(&k2, 1, 0, 1, &out, nullptr, nullptr, pf);
  CHECK_EQ(out, 7.f);
}

TFEXT_TEST(FindOrInsertWithInitializesOnlyNewKeys) {
  for (const bool use_pool : {false, true}) {
    const ParallelFor pf = use_pool ? PoolParallelFor() : InlineParallelFor();
    HashTable t(Options(3));
    const float defaults[3] = {0.5f, 0.25f, 0.125f};
    const int64_t existing = 100;
    const float v[3] = {1, 2, 3};
    t.Insert(&existing, 1, 0, 3, v, nullptr, false, -1, pf);
    // 5000 keys (ParallelFor path when pooled), each new key twice, one old
    // key, then 300 new keys each twice in a row (a repeat while its own init
    // batch still waits).
    std::vector<int64_t> keys;
    for (int64_t k = 0; k < 2500; ++k) keys.push_back(1000 + k);
    for (int64_t k = 0; k < 2500; ++k) keys.push_back(1000 + k);
    keys.push_back(existing);
    for (int64_t k = 0; k < 300; ++k) {
      keys.push_back(9000 + k);
      keys.push_back(9000 + k);
    }
    const int64_t n = static_cast<int64_t>(keys.size());
    std::vector<std::atomic<int>> init_calls(n);
    std::atomic<int64_t> largest_batch{0};
    std::vector<float> out(n * 2);
    std::unique_ptr<bool[]> inserted(new bool[n]);
    t.FindOrInsertWith(
        keys.data(), n, 1, 2,
        [&](const int64_t* index, float* const* dst, int64_t count) {
          CHECK_GE(count, int64_t{1});
          CHECK_LE(count, HashTable::kInitBatch);
          int64_t seen = largest_batch.load();
          while (count > seen && !largest_batch.compare_exchange_weak(seen, count)) {
          }
          for (int64_t j = 0; j < count; ++j) {
            const int64_t i = index[j];
            ++init_calls[i];
            dst[j][0] = static_cast<float>(keys[i]);
            dst[j][1] = -static_cast<float>(keys[i]);
          }
        },
        defaults, out.data(), inserted.get(), true, 4, pf);
    // New keys are initialized in batches; the second occurrence of a key in
    // the same batch (or the batch it waits in) reads the initialized row.
    CHECK_EQ(largest_batch.load(), HashTable::kInitBatch);
    for (int64_t i = 0; i < n; ++i) {
      const bool first = i < 2500 || (i > 5000 && (i - 5001) % 2 == 0);
      CHECK_EQ(init_calls[i].load(), first ? 1 : 0);
      CHECK_EQ(inserted[i], first);
      if (keys[i] == existing) {
        CHECK_EQ(out[2 * i], 2.f);
        CHECK_EQ(out[2 * i + 1], 3.f);
      } else {
        CHECK_EQ(out[2 * i], static_cast<float>(keys[i]));
        CHECK_EQ(out[2 * i + 1], -static_cast<float>(keys[i]));
      }
    }
    const std::map<int64_t, Entry> snap = Snapshot(t);
    CHECK_EQ(snap.size(), size_t{2801});
    const Entry& e = snap.at(1000);
    CHECK_EQ(e.row[0], 0.5f);  // the column outside the range: column_defaults
    CHECK_EQ(e.row[1], 1000.f);
    CHECK_EQ(e.frequency, uint32_t{2});
    CHECK_EQ(e.version, int64_t{4});
    CHECK_EQ(snap.at(existing).frequency, uint32_t{1});
  }
}

// A small batch (below the parallel threshold) runs shard after shard on
// the calling thread with one pending batch for all shards: each shard's new
// rows must still be initialized, and out rows written, before the next shard.
TFEXT_TEST(FindOrInsertWithSmallBatchesAcrossShards) {
  HashTable t(Options(2, 3));
  for (const int64_t n : {1, 17, 600}) {
    std::vector<int64_t> keys;
    for (int64_t k = 0; k < n; ++k) {
      keys.push_back(n * 100000 + k);
      if (k % 3 == 0) keys.push_back(n * 100000 + k);  // a repeat while its batch may still wait
    }
    const int64_t m = static_cast<int64_t>(keys.size());
    std::vector<int> init_calls(m, 0);
    std::vector<float> out(m * 2, -7.0f);
    t.FindOrInsertWith(
        keys.data(), m, 0, 2,
        [&](const int64_t* index, float* const* dst, int64_t count) {
          for (int64_t j = 0; j < count; ++j) {
            ++init_calls[index[j]];
            dst[j][0] = static_cast<float>(keys[index[j]] % 977);
            dst[j][1] = 0.5f;
          }
        },
        nullptr, out.data(), nullptr, true, -1, InlineParallelFor());
    int64_t inits = 0;
    for (int64_t i = 0; i < m; ++i) {
      inits += init_calls[i];
      CHECK_EQ(out[2 * i], static_cast<float>(keys[i] % 977));
      CHECK_EQ(out[2 * i + 1], 0.5f);
    }
    CHECK_EQ(inits, n);
  }
  CHECK_EQ(t.CheckInvariants(), std::string());
}

TFEXT_TEST(RemoveAndRemoveIf) {
  HashTable t(Options(2, 2));
  const ParallelFor pf = InlineParallelFor();
  std::vector<int64_t> keys;
  std::vector<float> vals;
  std::vector<int64_t> versions;
  for (int64_t k = 0; k < 1000; ++k) {
    keys.push_back(k * 7919);
    vals.push_back(static_cast<float>(k));
    vals.push_back(static_cast<float>(-k));
    versions.push_back(k % 10);
  }
  t.Import(keys.data(), 1000, 0, 2, vals.data(), nullptr, versions.data(), nullptr, pf);
  CHECK_EQ(t.size(), int64_t{1000});
  // Evict by version (the eviction use case) and by value.
  int64_t calls = 0;
  const int64_t removed = t.RemoveIf([&](int64_t key, const float* row, const KeyMeta& m) {
    ++calls;
    CHECK_EQ(key % 7919, int64_t{0});
    CHECK_EQ(row[0], static_cast<float>(key / 7919));
    return m.version < 3 || row[0] >= 900;
  });
  CHECK_EQ(calls, int64_t{1000});  // the predicate sees every entry exactly once
  int64_t expected = 0;
  for (int64_t k = 0; k < 1000; ++k) expected += (k % 10 < 3 || k >= 900) ? 1 : 0;
  CHECK_EQ(removed, expected);
  CHECK_EQ(t.size(), 1000 - expected);
  std::vector<float> out(2000);
  std::unique_ptr<bool[]> found(new bool[1000]);
  t.Find(keys.data(), 1000, 0, 2, out.data(), found.get(), nullptr, pf);
  for (int64_t k = 0; k < 1000; ++k) {
    const bool gone = k % 10 < 3 || k >= 900;
    CHECK_EQ(found[k], !gone);
    if (!gone) CHECK_EQ(out[2 * k + 1], static_cast<float>(-k));
  }
  // Remove the rest in two batches, with absent keys mixed in.
  CHECK_EQ(t.Remove(keys.data(), 500, pf) + t.Remove(keys.data() + 500, 500, pf), 1000 - expected);
  CHECK_EQ(t.size(), int64_t{0});
  // Rows are recycled from the free list: re-inserting costs no memory.
  const int64_t before = t.memory_bytes();
  t.Import(keys.data(), 1000, 0, 2, vals.data(), nullptr, nullptr, nullptr, pf);
  CHECK_EQ(t.memory_bytes(), before);
  CHECK_EQ(t.RemoveIf([](int64_t, const float*, const KeyMeta&) { return true; }), int64_t{1000});
  CHECK_EQ(t.size(), int64_t{0});
}

// Replace swaps in contents built aside: the new keys with their metadata,
// none of the old ones, a consistent index; a fill that throws changes nothing.
TFEXT_TEST(ReplaceSwapsContentsAndKeepsOldOnFailure) {
  const ParallelFor pf = PoolParallelFor();
  HashTable t(Options(2));
  std::vector<int64_t> old_keys(5000), new_keys(7000);
  for (size_t i = 0; i < old_keys.size(); ++i) old_keys[i] = static_cast<int64_t>(i);
  for (size_t i = 0; i < new_keys.size(); ++i) new_keys[i] = static_cast<int64_t>(i) + 3000;  // overlap 3000..4999
  std::vector<float> old_rows(old_keys.size() * 2, 1.f), new_rows(new_keys.size() * 2, 2.f);
  std::vector<int64_t> versions(new_keys.size(), 7);
  std::vector<uint32_t> freqs(new_keys.size(), 3);
  t.Import(old_keys.data(), old_keys.size(), 0, 2, old_rows.data(), nullptr, nullptr, nullptr, pf);
  const std::map<int64_t, Entry> before = Snapshot(t);
  bool threw = false;
  try {
    t.Replace(new_keys.size(), [&](HashTable& staging) {
      staging.Import(new_keys.data(), new_keys.size(), 0, 2, new_rows.data(), nullptr, nullptr, nullptr, pf);
      throw std::bad_alloc();
    });
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  CHECK(threw);
  CHECK(Snapshot(t) == before);
  t.Replace(new_keys.size(), [&](HashTable& staging) {
    CHECK_EQ(staging.size(), int64_t{0});
    staging.Import(new_keys.data(), new_keys.size(), 0, 2, new_rows.data(), nullptr, versions.data(), freqs.data(), pf);
  });
  const std::map<int64_t, Entry> after = Snapshot(t);
  CHECK_EQ(after.size(), new_keys.size());
  CHECK_EQ(t.size(), static_cast<int64_t>(new_keys.size()));
  for (const int64_t k : new_keys) {
    const Entry& e = after.at(k);
    CHECK(e.row == std::vector<float>({2.f, 2.f}));
    CHECK_EQ(e.version, int64_t{7});
    CHECK_EQ(e.frequency, uint32_t{3});
  }
  CHECK_EQ(t.CheckInvariants(), std::string());
  // The table stays writable: its arena is the staging table's now.
  const int64_t extra = -1;
  const float extra_row[2] = {5.f, 6.f};
  t.Insert(&extra, 1, 0, 2, extra_row, nullptr, false, -1, pf);
  CHECK_EQ(t.size(), static_cast<int64_t>(new_keys.size()) + 1);
  CHECK_EQ(t.CheckInvariants(), std::string());
  CHECK_GT(t.memory_bytes(), int64_t{0});
}

// Readers running while the contents are replaced again and again see, in
// every batch (several read blocks large), all old rows or all new rows.
TFEXT_TEST(ReplaceIsAtomicForConcurrentReaders) {
  HashTable t(Options(1));
  const int64_t n = 3 * tfext::table::kReadBlock + 5;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i * 7919;
  std::vector<float> ones(n, 1.f), twos(n, 2.f);
  const ParallelFor pf = PoolParallelFor();
  t.Import(keys.data(), n, 0, 1, ones.data(), nullptr, nullptr, nullptr, pf);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> bad{0}, reads{0}, big_reads{0}, small_reads{0};
  auto reader = [&](bool big) {
    const int64_t m = big ? n : 100;
    std::vector<float> out(m);
    std::unique_ptr<bool[]> found(new bool[m]);
    const ParallelFor rpf = InlineParallelFor();  // blocks one after another: the widest window
    while (!stop.load()) {
      t.Find(keys.data(), m, 0, 1, out.data(), found.get(), nullptr, rpf);
      for (int64_t i = 0; i < m; ++i) {
        if (!found[i] || out[i] != out[0]) {
          ++bad;
          break;
        }
      }
      ++reads;
      ++(big ? big_reads : small_reads);
    }
  };
  std::thread big_reader(reader, true), small_reader(reader, false);
  int64_t big_before = 0, small_before = 0;
  for (int round = 0; round < 60; ++round) {
    // Each reader reads between two replaces, however the threads are
    // scheduled (and goes on reading during the next one).
    WaitUntil([&] { return big_reads.load() > big_before && small_reads.load() > small_before; }, "the readers");
    big_before = big_reads.load();
    small_before = small_reads.load();
    const std::vector<float>& rows = round % 2 == 0 ? twos : ones;
    t.Replace(n, [&](HashTable& staging) {
      staging.Import(keys.data(), n, 0, 1, rows.data(), nullptr, nullptr, nullptr, InlineParallelFor());
    });
  }
  stop = true;
  big_reader.join();
  small_reader.join();
  CHECK_GT(reads.load(), int64_t{0});
  CHECK_EQ(bad.load(), int64_t{0});
  CHECK_EQ(t.CheckInvariants(), std::string());
  // Deterministically: a Replace between two read blocks of one Find (run by
  // its ParallelFor, where the Find holds no lock) makes the Find read the
  // batch again, all of it from the new contents.
  bool replaced = false;
  const ParallelFor replace_after_first_block = [&](int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
    for (int64_t b = 0; b < total; ++b) {
      fn(b, b + 1);
      if (!replaced) {
        replaced = true;
        t.Replace(n, [&](HashTable& staging) {
          staging.Import(keys.data(), n, 0, 1, twos.data(), nullptr, nullptr, nullptr, InlineParallelFor());
        });
      }
    }
  };
  t.Replace(n, [&](HashTable& staging) {
    staging.Import(keys.data(), n, 0, 1, ones.data(), nullptr, nullptr, nullptr, InlineParallelFor());
  });
  std::vector<float> out(n);
  t.Find(keys.data(), n, 0, 1, out.data(), nullptr, nullptr, replace_after_first_block);
  CHECK(replaced);
  for (int64_t i = 0; i < n; ++i) CHECK_EQ(out[i], 2.f);
}

TFEXT_TEST(ExportImportRoundTrip) {
  const ParallelFor pf = PoolParallelFor();
  HashTable a(Options(3));
  std::mt19937_64 rng(1);
  std::vector<int64_t> keys(20000);
  std::vector<float> vals(keys.size() * 3);
  std::vector<int64_t> versions(keys.size());
  std::vector<uint32_t> freqs(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = static_cast<int64_t>(rng());
    versions[i] = static_cast<int64_t>(rng() % 1000);
    freqs[i] = static_cast<uint32_t>(rng());
  }
  for (float& v : vals) v = static_cast<float>(rng() % 1000) / 8.f;
  a.Import(keys.data(), keys.size(), 0, 3, vals.data(), nullptr, versions.data(), freqs.data(), pf);
  const std::map<int64_t, Entry> snap_a = Snapshot(a);
  CHECK_EQ(snap_a.size(), keys.size());
  // Export everything, import into a table with another shard layout.
  std::vector<int64_t> ek, ev;
  std::vector<float> er;
  std::vector<uint32_t> ef;
  a.Export(0, 3, [&](int64_t n) {
    ek.resize(n);
    ev.resize(n);
    er.resize(n * 3);
    ef.resize(n);
    HashTable::ExportBuffers b{ek.data(), er.data(), ev.data(), ef.data()};
    return b;
  });
  HashTable b(Options(3, 0));
  b.Import(ek.data(), ek.size(), 0, 3, er.data(), nullptr, ev.data(), ef.data(), pf);
  CHECK(Snapshot(b) == snap_a);
  // Import of columns only: versions/frequencies null mean 0, other columns defaults.
  HashTable c(Options(3));
  const float defaults[3] = {1, 2, 3};
  std::vector<float> col2(ek.size());
  for (size_t i = 0; i < ek.size(); ++i) col2[i] = er[i * 3 + 2];
  c.Import(ek.data(), ek.size(), 2, 1, col2.data(), defaults, nullptr, nullptr, pf);
  const std::map<int64_t, Entry> snap_c = Snapshot(c);
  for (const auto& kv : snap_c) {
    CHECK_EQ(kv.second.row[0], 1.f);
    CHECK_EQ(kv.second.row[1], 2.f);
    CHECK_EQ(kv.second.row[2], snap_a.at(kv.first).row[2]);
    CHECK_EQ(kv.second.version, int64_t{0});
    CHECK_EQ(kv.second.frequency, uint32_t{0});
  }
  // Export with some outputs skipped (null pointers).
  int64_t seen = 0;
  a.Export(0, 3, [&](int64_t n) {
    seen = n;
    ek.assign(n, 0);
    HashTable::ExportBuffers bufs;
    bufs.keys = ek.data();
    return bufs;
  });
  CHECK_EQ(seen, static_cast<int64_t>(keys.size()));
}

TFEXT_TEST(ClearAndReserve) {
  const ParallelFor pf = InlineParallelFor();
  HashTable t(Options(4, -1, 1000));
  const int64_t initial_bytes = t.memory_bytes();
  std::vector<int64_t> keys(100000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i) * 31 - 5000;
  std::vector<float> vals(keys.size() * 4, 1.f);
  t.Insert(keys.data(), keys.size(), 0, 4, vals.data(), nullptr, false, -1, pf);
  CHECK_EQ(t.size(), int64_t{100000});
  CHECK_GT(t.memory_bytes(), initial_bytes);
  t.Clear();
  CHECK_EQ(t.size(), int64_t{0});
  CHECK_EQ(t.memory_bytes(), initial_bytes);  // back to the initial capacity
  bool found = true;
  float out[4];
  t.Find(keys.data(), 1, 0, 4, out, &found, nullptr, pf);
  CHECK(!found);
  // Usable after Clear.
  t.Insert(keys.data(), 10, 0, 4, vals.data(), nullptr, false, -1, pf);
  CHECK_EQ(t.size(), int64_t{10});
  t.Clear();
  // Reserve: the index is sized up front, so inserting the reserved number
  // of keys grows only the arena, by whole chunks.
  t.Reserve(100000);
  t.Reserve(10);  // never shrinks
  const int64_t reserved = t.memory_bytes();
  CHECK_GT(reserved, initial_bytes);
  t.Insert(keys.data(), keys.size(), 0, 4, vals.data(), nullptr, false, -1, pf);
  const int64_t arena_bytes = t.memory_bytes() - reserved;
  const int64_t row_bytes = 8 + 4 * 4 + 12;
  CHECK_LE(arena_bytes, static_cast<int64_t>(keys.size()) * row_bytes * 5 / 4 + (1 << 20));
  // Contents are correct after all of that.
  Model model(4);
  model.Insert(keys.data(), keys.size(), 0, 4, vals.data(), nullptr, false, -1);
  CheckSameContents(t, model);
}

// Random operations against the model: many seeds, several layouts, inline
// and thread-pool ParallelFor, small key universes (many hits, duplicates
// within batches, growth and shrink of shards).
void RunRandomOps(uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  const int64_t widths[4] = {1, 2, 5, 16};
  const int64_t width = widths[uniform(0, 3)];
  const int shard_bits_choice[4] = {-1, 0, 1, 3};
  const double loads[3] = {0.5, 0.8, 0.95};
  TableOptions opts =
      Options(width, shard_bits_choice[uniform(0, 3)], uniform(0, 1) ? 0 : uniform(0, 500), loads[uniform(0, 2)]);
  HashTable t(opts);
  Model model(width);
  const ParallelFor pf = uniform(0, 1) ? InlineParallelFor() : PoolParallelFor();
  const int64_t universe = uniform(1, 3) == 1 ? 20 : uniform(50, 3000);
  const int64_t extremes[5] = {kMinKey, kMaxKey, 0, -1, kMinKey + 1};
  auto random_key = [&]() -> int64_t {
    if (uniform(0, 30) == 0) return extremes[uniform(0, 4)];
    return (uniform(0, universe - 1) - universe / 2) * 1000003;
  };
  std::vector<float> defaults(width);
  for (float& d : defaults) d = static_cast<float>(uniform(-8, 8)) / 4.f;
  auto random_float = [&]() { return static_cast<float>(uniform(-64, 64)) / 8.f; };

  for (int op = 0; op < ops; ++op) {
    // Batches up to a few thousand keys so that both the serial and the
    // ParallelFor paths of the batch drivers run.
    const int64_t n = uniform(0, 6) == 0 ? uniform(2048, 5000) : uniform(0, 40);
    std::vector<int64_t> keys(n);
    for (int64_t& k : keys) k = random_key();
    const int64_t cb = uniform(0, width - 1);
    const int64_t cols = uniform(0, 10) == 0 ? 0 : uniform(1, width - cb);
    std::vector<float> data(n * cols);
    for (float& v : data) v = random_float();
    const bool count = uniform(0, 1);
    const int64_t version = uniform(0, 2) == 0 ? -1 : uniform(0, 1000);
    const float* defaults_or_null = uniform(0, 3) == 0 ? nullptr : defaults.data();
    const int kind = static_cast<int>(uniform(0, 99));
    if (kind < 20) {  // Find
      std::vector<float> def(cols);
      for (float& d : def) d = random_float();
      const bool with_default = uniform(0, 1);
      std::vector<float> got(n * cols, 123.f), want(n * cols, 123.f);
      std::unique_ptr<bool[]> got_found(new bool[n + 1]), want_found(new bool[n + 1]);
      t.Find(keys.data(), n, cb, cols, got.data(), got_found.get(), with_default ? def.data() : nullptr, pf);
      model.Find(keys.data(), n, cb, cols, want.data(), want_found.get(), with_default ? def.data() : nullptr);
      CHECK(got == want);
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(got_found[i], want_found[i]);
    } else if (kind < 35) {  // FindOrInsert
      std::vector<float> got(n * cols), want(n * cols);
      std::unique_ptr<bool[]> got_ins(new bool[n + 1]), want_ins(new bool[n + 1]);
      t.FindOrInsert(keys.data(), n, cb, cols, data.data(), defaults_or_null, got.data(), got_ins.get(), count, version,
                     pf);
      model.FindOrInsert(keys.data(), n, cb, cols, data.data(), defaults_or_null, want.data(), want_ins.get(), count,
                         version);
      CHECK(got == want);
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(got_ins[i], want_ins[i]);
    } else if (kind < 50) {  // Insert
      t.Insert(keys.data(), n, cb, cols, data.data(), defaults_or_null, count, version, pf);
      model.Insert(keys.data(), n, cb, cols, data.data(), defaults_or_null, count, version);
    } else if (kind < 63) {  // Accumulate
      const bool insert_missing = uniform(0, 1);
      t.Accumulate(keys.data(), n, cb, cols, data.data(), defaults_or_null, insert_missing, count, version, pf);
      model.Accumulate(keys.data(), n, cb, cols, data.data(), defaults_or_null, insert_missing, count, version);
    } else if (kind < 70) {  // Update (duplicates included: batch order per key)
      auto fn = [&](int64_t i, float* row, KeyMeta* meta) {
        for (int64_t c = 0; c < width; ++c) row[c] = row[c] * 0.5f + static_cast<float>(i % 7);
        meta->version += 3;
        meta->frequency = meta->frequency * 2 + 1;
      };
      // The per-key input rows are only a prefetch hint: same results either way.
      const bool hint = uniform(0, 1) == 1;
      t.Update(keys.data(), n, defaults_or_null, fn, pf, hint ? data.data() : nullptr, hint ? cols : 0);
      for (int64_t i = 0; i < n; ++i) {
        auto it = model.map().find(keys[i]);
        if (it == model.map().end()) it = model.map().emplace(keys[i], model.NewEntry(defaults_or_null)).first;
        KeyMeta meta;
        meta.version = it->second.version;
        meta.frequency = it->second.frequency;
        fn(i, it->second.row.data(), &meta);
        it->second.version = meta.version;
        it->second.frequency = meta.frequency;
      }
    } else if (kind < 85) {  // Remove
      CHECK_EQ(t.Remove(keys.data(), n, pf), model.Remove(keys.data(), n));
    } else if (kind < 88) {  // RemoveIf
      const int64_t bound = uniform(0, 1000);
      auto pred = [&](int64_t key, const float* row, const KeyMeta& m) {
        return m.version < bound / 2 || (key & 3) == 1 || row[0] > 3.f;
      };
      int64_t want = 0;
      for (auto it = model.map().begin(); it != model.map().end();) {
        KeyMeta m;
        m.version = it->second.version;
        m.frequency = it->second.frequency;
        if (pred(it->first, it->second.row.data(), m)) {
          it = model.map().erase(it);
          ++want;
        } else {
          ++it;
        }
      }
      CHECK_EQ(t.RemoveIf(pred), want);
    } else if (kind < 93) {  // FindMeta
      std::vector<KeyMeta> meta(n);
      std::unique_ptr<bool[]> found(new bool[n + 1]);
      t.FindMeta(keys.data(), n, meta.data(), found.get(), pf);
      for (int64_t i = 0; i < n; ++i) {
        auto it = model.map().find(keys[i]);
        CHECK_EQ(found[i], it != model.map().end());
        CHECK_EQ(meta[i].version, it != model.map().end() ? it->second.version : 0);
        CHECK_EQ(meta[i].frequency, it != model.map().end() ? it->second.frequency : 0u);
      }
    } else if (kind < 97) {  // Import
      std::vector<int64_t> versions(n);
      std::vector<uint32_t> freqs(n);
      for (int64_t i = 0; i < n; ++i) {
        versions[i] = uniform(-5, 5000);
        freqs[i] = static_cast<uint32_t>(rng());
      }
      const bool with_meta = uniform(0, 1);
      t.Import(keys.data(), n, cb, cols, data.data(), defaults_or_null, with_meta ? versions.data() : nullptr,
               with_meta ? freqs.data() : nullptr, pf);
      model.Import(keys.data(), n, cb, cols, data.data(), defaults_or_null, with_meta ? versions.data() : nullptr,
                   with_meta ? freqs.data() : nullptr);
    } else if (kind < 98) {
      t.Clear();
      model.map().clear();
    } else {
      t.Reserve(uniform(0, 5000));
    }
    CHECK_EQ(t.size(), static_cast<int64_t>(model.map().size()));
    CHECK_EQ(t.CheckInvariants(), std::string());
    if (op % 50 == 49) CheckSameContents(t, model);
  }
  CheckSameContents(t, model);
}

TFEXT_TEST(RandomOperationsAgainstModel) {
  for (uint64_t seed = 1; seed <= 120; ++seed) RunRandomOps(seed, 300);
}

// Growth from 0 to a few million keys, through the thread pool, then half
// removed, with the contents checked at each stage.
// Runs with and without huge pages: the slab and index allocation paths
// differ (madvise, alignment) and both must hold the same contents.
static void CheckGrowthFromZeroToMillions(bool huge_pages) {
  const ParallelFor pf = PoolParallelFor();
  TableOptions options = Options(2);
  options.huge_pages = huge_pages;
  HashTable t(options);
  const int64_t empty_bytes = t.memory_bytes();
  const int64_t total = 3000000;  // 84 MB of rows: the huge-page slab path runs too
  std::vector<int64_t> keys(total);
  std::mt19937_64 rng(7);
  for (int64_t i = 0; i < total; ++i) keys[i] = static_cast<int64_t>(rng());
  std::vector<float> vals(total * 2);
  for (int64_t i = 0; i < total; ++i) {
    vals[2 * i] = static_cast<float>(i);
    vals[2 * i + 1] = static_cast<float>(-i);
  }
  int64_t last_memory = t.memory_bytes();
  for (int64_t done = 0; done < total; done += 100000) {
    t.Insert(keys.data() + done, 100000, 0, 2, vals.data() + 2 * done, nullptr, false, -1, pf);
    CHECK_EQ(t.size(), done + 100000);
    CHECK_GE(t.memory_bytes(), last_memory);
    last_memory = t.memory_bytes();
  }
  std::vector<float> out(total * 2);
  std::unique_ptr<bool[]> found(new bool[total]);
  t.Find(keys.data(), total, 0, 2, out.data(), found.get(), nullptr, pf);
  for (int64_t i = 0; i < total; ++i) {
    CHECK(found[i]);
    CHECK_EQ(out[2 * i], static_cast<float>(i));
    CHECK_EQ(out[2 * i + 1], static_cast<float>(-i));
  }
  // Keys never inserted miss.
  std::vector<int64_t> absent(100000);
  for (int64_t i = 0; i < 100000; ++i) absent[i] = static_cast<int64_t>(rng());
  t.Find(absent.data(), 100000, 0, 2, out.data(), found.get(), nullptr, pf);
  for (int64_t i = 0; i < 100000; ++i) CHECK(!found[i]);
  CHECK_EQ(t.CheckInvariants(), std::string());
  // Remove every other key (backward shifts everywhere), check the rest.
  std::vector<int64_t> even;
  for (int64_t i = 0; i < total; i += 2) even.push_back(keys[i]);
  CHECK_EQ(t.Remove(even.data(), even.size(), pf), static_cast<int64_t>(even.size()));
  CHECK_EQ(t.size(), total - static_cast<int64_t>(even.size()));
  CHECK_EQ(t.CheckInvariants(), std::string());
  t.Find(keys.data(), total, 0, 2, out.data(), found.get(), nullptr, pf);
  for (int64_t i = 0; i < total; ++i) {
    CHECK_EQ(found[i], i % 2 == 1);
    if (i % 2 == 1) CHECK_EQ(out[2 * i], static_cast<float>(i));
  }
  // Re-inserting the removed half reuses the freed rows: no arena growth.
  const int64_t before_reinsert = t.memory_bytes();
  std::vector<float> even_vals(even.size() * 2, 7.f);
  t.Insert(even.data(), even.size(), 0, 2, even_vals.data(), nullptr, false, -1, pf);
  CHECK_EQ(t.size(), total);
  CHECK_LE(t.memory_bytes(), before_reinsert);
  // Clear releases the arena (huge-page slabs included) down to the start.
  t.Clear();
  CHECK_EQ(t.size(), int64_t{0});
  CHECK_EQ(t.memory_bytes(), empty_bytes);
  CHECK_EQ(t.CheckInvariants(), std::string());
  t.Insert(keys.data(), 1000, 0, 2, vals.data(), nullptr, false, -1, pf);
  t.Find(keys.data(), 1000, 0, 2, out.data(), found.get(), nullptr, pf);
  for (int64_t i = 0; i < 1000; ++i) CHECK(found[i] && out[2 * i] == static_cast<float>(i));
}

TFEXT_TEST(GrowthFromZeroToMillions) {
  CheckGrowthFromZeroToMillions(/*huge_pages=*/true);
  CheckGrowthFromZeroToMillions(/*huge_pages=*/false);
}

TFEXT_TEST(VeryLargeBatch) {
  const ParallelFor pf = PoolParallelFor();
  HashTable t(Options(1));
  const int64_t n = 2000000;
  std::vector<int64_t> keys(n);
  // Every key twice: Accumulate must add both occurrences.
  for (int64_t i = 0; i < n; ++i) keys[i] = (i % (n / 2)) * 2654435761LL;
  std::vector<float> ones(n, 1.f);
  t.Accumulate(keys.data(), n, 0, 1, ones.data(), nullptr, true, true, 3, pf);
  CHECK_EQ(t.size(), n / 2);
  std::vector<float> out(n);
  t.Find(keys.data(), n, 0, 1, out.data(), nullptr, nullptr, pf);
  for (int64_t i = 0; i < n; ++i) CHECK_EQ(out[i], 2.f);
  std::vector<KeyMeta> meta(n / 2);
  t.FindMeta(keys.data(), n / 2, meta.data(), nullptr, pf);
  for (int64_t i = 0; i < n / 2; ++i) {
    CHECK_EQ(meta[i].frequency, uint32_t{2});
    CHECK_EQ(meta[i].version, int64_t{3});
  }
  std::unique_ptr<bool[]> inserted(new bool[n]);
  t.FindOrInsert(keys.data(), n, 0, 1, ones.data(), nullptr, out.data(), inserted.get(), false, -1, pf);
  for (int64_t i = 0; i < n; ++i) CHECK(!inserted[i]);
  CHECK_EQ(t.Remove(keys.data(), n, pf), n / 2);
  CHECK_EQ(t.size(), int64_t{0});
}

// Several threads hammer overlapping keys at once. Accumulate keys are never
// removed, so every add must be in the final sums (and in the frequencies);
// churn keys are inserted and removed by others in the same shards, which
// moves index slots (backward shifts, growth) under the accumulators.
TFEXT_TEST(ConcurrentStressLosesNoUpdate) {
  HashTable t(Options(2, 3));
  const int kThreads = 4;
  const int64_t kAccKeys = 512;
  const int64_t kChurnKeys = 20000;
  const int kRounds = 15000;
  std::vector<std::vector<int64_t>> adds(kThreads, std::vector<int64_t>(kAccKeys, 0));
  std::atomic<bool> failed{false};
  auto acc_key = [](int64_t k) { return k * 3 + 1; };
  auto churn_key = [](int64_t k) { return -(k * 5 + 2); };
  auto worker = [&](int tid) {
    std::mt19937_64 rng(100 + tid);
    // Thread 0 uses the pool: ParallelFor paths run concurrently with inline ones.
    const ParallelFor pf = tid == 0 ? PoolParallelFor() : InlineParallelFor();
    std::vector<int64_t> keys;
    std::vector<float> vals, out;
    for (int round = 0; round < kRounds; ++round) {
      const int kind = static_cast<int>(rng() % 4);
      const int64_t n = 1 + static_cast<int64_t>(rng() % (round % 10 == 0 ? 3000 : 64));
      keys.resize(n);
      vals.assign(n * 2, 1.f);
      out.assign(n * 2, 0.f);
      if (kind == 0) {  // accumulate +1 (duplicates allowed) on the never-removed keys
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = static_cast<int64_t>(rng() % kAccKeys);
          keys[i] = acc_key(k);
          ++adds[tid][k];
        }
        t.Accumulate(keys.data(), n, 0, 1, vals.data(), nullptr, true, true, round, pf);
      } else if (kind == 1) {  // find_or_insert churn keys
        for (int64_t i = 0; i < n; ++i) keys[i] = churn_key(static_cast<int64_t>(rng() % kChurnKeys));
        t.FindOrInsert(keys.data(), n, 1, 1, vals.data(), nullptr, out.data(), nullptr, false, -1, pf);
        for (int64_t i = 0; i < n; ++i) {
          if (out[i] != 1.f) failed = true;
        }
      } else if (kind == 2) {  // remove churn keys
        for (int64_t i = 0; i < n; ++i) keys[i] = churn_key(static_cast<int64_t>(rng() % kChurnKeys));
        t.Remove(keys.data(), n, pf);
      } else {  // find both kinds; accumulated values are whole numbers >= 0
        for (int64_t i = 0; i < n; ++i) {
          keys[i] = rng() % 2 ? acc_key(static_cast<int64_t>(rng() % kAccKeys))
                              : churn_key(static_cast<int64_t>(rng() % kChurnKeys));
        }
        std::unique_ptr<bool[]> found(new bool[n]);
        t.Find(keys.data(), n, 0, 2, out.data(), found.get(), nullptr, pf);
        for (int64_t i = 0; i < n; ++i) {
          if (!found[i]) continue;
          const float v = out[2 * i];
          if (keys[i] > 0 && (v < 0.f || v != std::floor(v) || out[2 * i + 1] != 0.f)) failed = true;
          if (keys[i] < 0 && (v != 0.f || out[2 * i + 1] != 1.f)) failed = true;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int tid = 0; tid < kThreads; ++tid) threads.emplace_back(worker, tid);
  for (std::thread& th : threads) th.join();
  CHECK(!failed.load());
  std::vector<int64_t> keys(kAccKeys);
  for (int64_t k = 0; k < kAccKeys; ++k) keys[k] = acc_key(k);
  std::vector<float> sums(kAccKeys);
  std::unique_ptr<bool[]> found(new bool[kAccKeys]);
  std::vector<KeyMeta> meta(kAccKeys);
  t.Find(keys.data(), kAccKeys, 0, 1, sums.data(), found.get(), nullptr, InlineParallelFor());
  t.FindMeta(keys.data(), kAccKeys, meta.data(), nullptr, InlineParallelFor());
  for (int64_t k = 0; k < kAccKeys; ++k) {
    int64_t total = 0;
    for (int tid = 0; tid < kThreads; ++tid) total += adds[tid][k];
    if (total == 0) continue;
    CHECK(found[k]);
    CHECK_EQ(static_cast<int64_t>(sums[k]), total);
    CHECK_EQ(static_cast<int64_t>(meta[k].frequency), total);
  }
  // Structural check: every key exported once, size consistent.
  const std::map<int64_t, Entry> snap = Snapshot(t);
  CHECK_EQ(static_cast<int64_t>(snap.size()), t.size());
  CHECK_EQ(t.CheckInvariants(), std::string());
}

// The ParallelFor path gives the same results as the inline path.
TFEXT_TEST(ParallelForMatchesInline) {
  HashTable a(Options(4)), b(Options(4));
  std::mt19937_64 rng(3);
  const int64_t n = 200000;
  std::vector<int64_t> keys(n);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 150000);
  std::vector<float> vals(n * 4);
  for (float& v : vals) v = static_cast<float>(rng() % 100);
  a.Accumulate(keys.data(), n, 0, 4, vals.data(), nullptr, true, true, 1, InlineParallelFor());
  b.Accumulate(keys.data(), n, 0, 4, vals.data(), nullptr, true, true, 1, PoolParallelFor());
  a.Insert(keys.data(), n / 2, 1, 2, vals.data(), nullptr, true, 2, InlineParallelFor());
  b.Insert(keys.data(), n / 2, 1, 2, vals.data(), nullptr, true, 2, PoolParallelFor());
  CHECK_EQ(a.Remove(keys.data() + n / 2, n / 4, InlineParallelFor()),
           b.Remove(keys.data() + n / 2, n / 4, PoolParallelFor()));
  CHECK(Snapshot(a) == Snapshot(b));
  std::vector<float> fa(n * 4), fb(n * 4);
  a.Find(keys.data(), n, 0, 4, fa.data(), nullptr, vals.data(), InlineParallelFor());
  b.Find(keys.data(), n, 0, 4, fb.data(), nullptr, vals.data(), PoolParallelFor());
  CHECK(fa == fb);
}

// memory_bytes() / size() stays within 1.5x the raw bytes (8 + 4 * width)
// at every size from 2^18 to 2^20 keys, right after index growth steps
// included, for an embedding of dim 16 with 0, 1 and 2 optimizer slots.
TFEXT_TEST(MemoryPerKeyWithinBudget) {
  const ParallelFor pf = PoolParallelFor();
  for (int64_t width : {16, 32, 48}) {
    HashTable t(Options(width));
    std::mt19937_64 rng(width);
    const int64_t step = 4096;
    std::vector<int64_t> keys(step);
    std::vector<float> vals(step * width, 0.5f);
    double worst = 0;
    const double raw = 8.0 + 4.0 * width;
    for (int64_t size = step; size <= (int64_t{1} << 20); size += step) {
      for (int64_t& k : keys) k = static_cast<int64_t>(rng());
      t.Insert(keys.data(), step, 0, width, vals.data(), nullptr, false, -1, pf);
      if (size >= (int64_t{1} << 18)) {
        worst = std::max(worst, static_cast<double>(t.memory_bytes()) / t.size() / raw);
      }
    }
    std::printf("  width %lld: worst memory/raw over [2^18, 2^20] keys = %.3f, at 2^20: %.1f bytes/key\n",
                static_cast<long long>(width), worst, static_cast<double>(t.memory_bytes()) / t.size());
    CHECK_LE(worst, 1.5);
  }
}

// A small table's memory is a fixed floor (the table and its shards'
// bookkeeping) plus bytes per key: a shard's first rows come in small chunks
// that double, so a key costs at most its share of a small chunk (4 rows at
// worst) and of an index slot line, not a 16 KiB chunk per shard touched
// (before: ~15 KiB for 1 key, ~190 KiB for 100 keys at width 18). A restore
// (Replace of a table sized for its keys) of 2 keys stays within the same
// floor. Margins, not exact bytes.
TFEXT_TEST(SmallTableMemoryIsAFloorPlusBytesPerKey) {
  const ParallelFor pf = InlineParallelFor();
  const int64_t width = 18;                        // dim 9 + Adagrad
  const int64_t stride = 20 + 4 * width;           // row bytes (hash_table.h)
  const int64_t per_key_bound = 4 * stride + 160;  // a 4-row first chunk, an index line, chunk table slots
  for (int shard_bits : {4, -1}) {
    const int64_t empty = HashTable(Options(width, shard_bits)).memory_bytes();
    if (shard_bits == 4) CHECK_LE(empty, int64_t{8} << 10);  // 16 shards' bookkeeping: ~3 KiB here
    for (int64_t n : {1, 2, 10, 100}) {
      HashTable t(Options(width, shard_bits));
      std::vector<int64_t> keys(n);
      for (int64_t i = 0; i < n; ++i) keys[i] = i * 7919 + 1;
      std::vector<float> vals(n * width, 0.5f);
      t.Insert(keys.data(), n, 0, width, vals.data(), nullptr, false, -1, pf);
      const int64_t bytes = t.memory_bytes();
      std::printf("  shard_bits %d: %lld keys take %lld bytes (empty table: %lld)\n", shard_bits,
                  static_cast<long long>(n), static_cast<long long>(bytes), static_cast<long long>(empty));
      CHECK_LE(bytes - empty, n * per_key_bound);
      // A restore of the same keys into a table sized for them takes no more.
      t.Replace(n, [&](HashTable& staging) {
        staging.Import(keys.data(), n, 0, width, vals.data(), nullptr, nullptr, nullptr, pf);
      });
      CHECK_EQ(t.size(), n);
      CHECK_LE(t.memory_bytes(), bytes);
      CHECK_EQ(t.CheckInvariants(), std::string());
    }
  }
}

// Rows cross from the small, doubling chunks of a shard into its full chunks
// (one shard, so every row id is walked): every key keeps its row through the
// growth, after removals (the free list links rows across chunk kinds) and
// after Clear; without and with preallocation (full chunks from row 0).
TFEXT_TEST(RowsSpanSmallAndFullChunks) {
  const ParallelFor pf = InlineParallelFor();
  for (bool preallocate : {false, true}) {
    for (int64_t width : {1, 18, 300}) {
      TableOptions options = Options(width, /*shard_bits=*/0, /*capacity=*/preallocate ? 64 : 0);
      options.preallocate = preallocate;
      HashTable t(options);
      const int64_t n = 1500;  // past the first full chunk for every width here (16..1024 rows a chunk)
      std::vector<int64_t> keys(n);
      std::vector<float> vals(n * width);
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = i * 31 + 5;
        for (int64_t c = 0; c < width; ++c) vals[i * width + c] = static_cast<float>(i * 1000 + c);
      }
      for (int round = 0; round < 2; ++round) {
        for (int64_t i = 0; i < n; ++i) {
          t.Insert(&keys[i], 1, 0, width, &vals[i * width], nullptr, false, -1, pf);
          if ((i & (i + 1)) == 0) CHECK_EQ(t.CheckInvariants(), std::string());  // at 2^k - 1 rows
        }
        std::vector<float> out(n * width);
        std::unique_ptr<bool[]> found(new bool[n]);
        t.Find(keys.data(), n, 0, width, out.data(), found.get(), nullptr, pf);
        for (int64_t i = 0; i < n; ++i) CHECK(found[i]);
        CHECK(out == vals);
        std::vector<int64_t> odd;
        for (int64_t i = 1; i < n; i += 2) odd.push_back(keys[i]);
        CHECK_EQ(t.Remove(odd.data(), odd.size(), pf), static_cast<int64_t>(odd.size()));
        t.Insert(odd.data(), 1, 0, width, &vals[width], nullptr, false, -1, pf);  // reuses a freed row
        CHECK_EQ(t.CheckInvariants(), std::string());
        t.Clear();
        CHECK_EQ(t.size(), int64_t{0});
      }
    }
  }
}

// Resident and virtual memory of this process, in bytes (/proc/self/statm).
static int64_t ResidentBytes() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  CHECK(f != nullptr);
  CHECK_EQ(std::fscanf(f, "%ld %ld", &pages_total, &pages_resident), 2);
  std::fclose(f);
  return static_cast<int64_t>(pages_resident) * sysconf(_SC_PAGESIZE);
}
static int64_t VirtualBytes() {
  long pages_total = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  CHECK(f != nullptr);
  CHECK_EQ(std::fscanf(f, "%ld", &pages_total), 1);
  std::fclose(f);
  return static_cast<int64_t>(pages_total) * sysconf(_SC_PAGESIZE);
}

// Caps this process's address space at what it maps now plus `headroom`
// bytes (for out-of-memory tests, in a child process); *saved gets the old
// limit for RestoreAddressSpace. False if the limit cannot be set.
static bool LimitAddressSpace(int64_t headroom, rlimit* saved) {
  if (getrlimit(RLIMIT_AS, saved) != 0) return false;
  rlimit limit = *saved;
  limit.rlim_cur = static_cast<rlim_t>(VirtualBytes() + headroom);
  return setrlimit(RLIMIT_AS, &limit) == 0;
}

static bool RestoreAddressSpace(const rlimit& saved) { return setrlimit(RLIMIT_AS, &saved) == 0; }

// Runs child() in a forked process and checks that it exits with status 0
// (not killed by an abort, not failing one of its numbered checks).
static void ExpectChildSucceeds(const std::function<int()>& child) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) _exit(child());
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
}

// Any initial_capacity in the documented range [0, 2^40] is a hint: the table
// is created without touching memory for it (the pre-sized index is bounded
// and not written until keys arrive), works, and grows on demand.
TFEXT_TEST(HugeInitialCapacityIsAHint) {
  const ParallelFor pf = PoolParallelFor();
  for (const int64_t capacity : {int64_t{1} << 30, int64_t{1} << 36, int64_t{1} << 40}) {
    for (const int shard_bits : {-1, 0, 4}) {
      const int64_t rss_before = ResidentBytes();
      HashTable t(Options(4, shard_bits, capacity));
      CHECK_LT(ResidentBytes() - rss_before, int64_t{32} << 20);
      // The reserved index is bounded by the pre-size cap.
      CHECK_LT(t.memory_bytes(), int64_t{128} << 20);
      std::vector<int64_t> keys(5000);
      for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i * 7919) - 99;
      std::vector<float> vals(keys.size() * 4);
      for (size_t i = 0; i < vals.size(); ++i) vals[i] = static_cast<float>(i);
      t.Insert(keys.data(), keys.size(), 0, 4, vals.data(), nullptr, false, -1, pf);
      CHECK_EQ(t.size(), static_cast<int64_t>(keys.size()));
      std::vector<float> out(vals.size());
      std::unique_ptr<bool[]> found(new bool[keys.size()]);
      t.Find(keys.data(), keys.size(), 0, 4, out.data(), found.get(), nullptr, pf);
      for (size_t i = 0; i < keys.size(); ++i) CHECK(found[i]);
      CHECK(out == vals);
      CHECK_LT(ResidentBytes() - rss_before, int64_t{96} << 20);
      std::printf("  capacity 2^%d, shard_bits %d: %.1f MiB reserved, %.1f MiB more resident\n",
                  static_cast<int>(std::log2(static_cast<double>(capacity))), shard_bits, t.memory_bytes() / 1048576.0,
                  (ResidentBytes() - rss_before) / 1048576.0);
      t.Clear();
      CHECK_EQ(t.size(), int64_t{0});
    }
  }
  // Invalid options throw instead of aborting.
  bool threw = false;
  try {
    HashTable bad(Options(0));
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("width must be >= 1, got 0") != std::string::npos;
  }
  CHECK(threw);
}

// An exception thrown on a ParallelFor thread (here by Update's callback)
// reaches the caller, and every shard lock is released: the table goes on.
TFEXT_TEST(ExceptionOnAWorkerThreadReachesTheCaller) {
  const ParallelFor pf = PoolParallelFor();
  HashTable t(Options(2));
  const int64_t n = 50000;  // above the serial-batch size: shards run on the pool
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i * 13 + 1;
  bool caught = false;
  try {
    t.Update(
        keys.data(), n, nullptr,
        [&](int64_t i, float* row, KeyMeta*) {
          if (i == n / 2) throw std::runtime_error("callback failed");
          row[0] = 1.f;
        },
        pf);
  } catch (const std::runtime_error& e) {
    caught = std::string(e.what()) == "callback failed";
  }
  CHECK(caught);
  // Rows the failed call added are complete (metadata zero, not garbage).
  for (const auto& entry : Snapshot(t)) {
    CHECK_EQ(entry.second.version, int64_t{0});
    CHECK_EQ(entry.second.frequency, uint32_t{0});
  }
  // Every lock is free again: writers and readers run, the key count matches
  // what Export sees.
  std::vector<float> vals(n * 2, 3.f);
  t.Insert(keys.data(), n, 0, 2, vals.data(), nullptr, false, -1, pf);
  CHECK_EQ(t.size(), n);
  std::vector<float> out(n * 2);
  t.Find(keys.data(), n, 0, 2, out.data(), nullptr, nullptr, pf);
  CHECK(out == vals);
  CHECK_EQ(static_cast<int64_t>(Snapshot(t).size()), n);
  // Export's alloc callback may throw too.
  caught = false;
  try {
    t.Export(0, 2, [](int64_t) -> HashTable::ExportBuffers { throw std::runtime_error("alloc"); });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  CHECK(caught);
  t.Clear();
  CHECK_EQ(t.size(), int64_t{0});
}

// Out of memory (address space limited in a child process): a write throws
// OutOfMemoryError instead of aborting, and the table stays consistent and
// usable. Runs inline and through a thread pool, and with the arena
// prefaulted (wider rows: the arena takes slabs and prefaults well before
// memory runs out), where the failure must also give the spare slabs back.
static int OutOfMemoryChild(bool pooled, bool prefault) {
  if (prefault) setenv("TF_EXT_TABLE_PREFAULT", "1", 1);  // this child only
  tfext_test::ThreadPool pool(2);                         // threads before the limit
  const ParallelFor pf = pooled ? pool.AsParallelFor() : InlineParallelFor();
  const int64_t batch = 1 << 16;
  const int width = prefault ? 32 : 4;
  std::vector<int64_t> keys(batch);
  std::vector<float> vals(batch * width, 0.5f);
  std::vector<float> out(batch * width);
  std::unique_ptr<bool[]> found(new bool[batch]);
  TableOptions options = Options(width, 4);
  options.huge_pages = false;
  HashTable t(options);
  rlimit unlimited;
  if (!LimitAddressSpace(int64_t{prefault ? 192 : 96} << 20, &unlimited)) return 2;
  int64_t inserted = 0;
  bool threw = false;
  std::string message;
  for (int b = 0; b < 400 && !threw; ++b) {
    for (int64_t i = 0; i < batch; ++i) keys[i] = b * batch + i;
    try {
      t.Insert(keys.data(), batch, 0, width, vals.data(), nullptr, false, -1, pf);
      inserted += batch;
      // The worker prepares the slabs asked for before the next batch needs
      // them, so the arena takes spares however slow the worker's thread.
      int64_t ready = 0, taken = 0;
      if (prefault) SettledSpareSlabs(t, &ready, &taken);
    } catch (const OutOfMemoryError& e) {
      threw = true;
      message = e.what();
    } catch (const std::bad_alloc& e) {
      threw = true;
      message = e.what();
    }
  }
  if (!threw) return 3;
  if (inserted == 0) return 4;
  if (prefault) {
    // The spares went back (requests in flight unmap theirs) and no more are asked for.
    int64_t ready = 0, taken = 0;
    SettledSpareSlabs(t, &ready, &taken);
    if (taken == 0) return 10;  // prefaulting never started: the test would prove nothing
    if (ready != 0) return 11;
  }
  // The fully inserted batches are all there, and the size counts exactly
  // the keys present (the failed batch may be partly applied).
  const int64_t size = t.size();
  if (size < inserted || size > inserted + batch) return 5;
  for (int64_t b = 0; b * batch < inserted; ++b) {
    for (int64_t i = 0; i < batch; ++i) keys[i] = b * batch + i;
    t.Find(keys.data(), batch, 0, width, out.data(), found.get(), nullptr, pf);
    for (int64_t i = 0; i < batch; ++i) {
      if (!found[i] || out[i * width] != 0.5f) return 6;
    }
  }
  // Usable: remove a batch, then re-insert it into the freed rows.
  for (int64_t i = 0; i < batch; ++i) keys[i] = i;
  if (t.Remove(keys.data(), batch, pf) != batch) return 7;
  t.Insert(keys.data(), batch, 0, width, vals.data(), nullptr, false, -1, pf);
  if (t.size() != size) return 8;
  // Consistent: every invariant holds after the failed batch (checked with
  // memory back, as the check allocates).
  if (!RestoreAddressSpace(unlimited)) return 2;
  const std::string broken = t.CheckInvariants();
  if (!broken.empty()) {
    std::fprintf(stderr, "  invariant broken after out of memory: %s\n", broken.c_str());
    return 9;
  }
  if (prefault) {
    // With memory back the table grows by new slabs without spares (none are asked for until Clear), then
    // prefaults again after Clear.
    auto grow = [&](int64_t first, int64_t batches) {
      for (int64_t b = first; b < first + batches; ++b) {
        for (int64_t i = 0; i < batch; ++i) keys[i] = b * batch + i;
        t.Insert(keys.data(), batch, 0, width, vals.data(), nullptr, false, -1, pf);
      }
    };
    auto spares = [&](int64_t* ready, int64_t* taken) { SettledSpareSlabs(t, ready, taken); };
    int64_t ready = 0, taken_at_oom = 0, taken = 0;
    spares(&ready, &taken_at_oom);
    grow(1000, 8);
    spares(&ready, &taken);
    if (ready != 0 || taken != taken_at_oom) return 12;
    t.Clear();
    grow(2000, 8);
    spares(&ready, &taken);
    if (ready == 0 && taken == taken_at_oom) return 13;
  }
  std::fprintf(stderr, "  (%s%s) out of memory after %lld keys: %s\n", pooled ? "pool" : "inline",
               prefault ? ", prefault" : "", static_cast<long long>(inserted), message.c_str());
  return 0;
}

TFEXT_TEST(OutOfMemoryThrowsAndTheTableStaysUsable) {
  for (const bool prefault : {false, true}) {
    for (const bool pooled : {false, true}) ExpectChildSucceeds([=] { return OutOfMemoryChild(pooled, prefault); });
  }
}

// Out of memory in FindOrInsertWith: new rows wait for their initializer in
// per-shard batches, so a key that fails mid-shard must not leave the earlier
// new keys of its shard with column defaults only. Every key present after
// the failure holds its initializer's values.
static int OutOfMemoryFindOrInsertChild(bool pooled) {
  tfext_test::ThreadPool pool(2);
  const ParallelFor pf = pooled ? pool.AsParallelFor() : InlineParallelFor();
  const int64_t batch = 1 << 16;
  const int width = 4;
  const auto value = [](int64_t key, int64_t c) { return static_cast<float>(key % 1000) + 0.25f * c; };
  std::vector<int64_t> keys(batch);
  std::vector<float> out(batch * width);
  std::unique_ptr<bool[]> found(new bool[batch]);
  const std::vector<float> defaults(width, -1.0f);
  TableOptions options = Options(width, 4);
  options.huge_pages = false;
  HashTable t(options);
  const HashTable::InitRows init = [&](const int64_t* index, float* const* dst, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t c = 0; c < width; ++c) dst[j][c] = value(keys[index[j]], c);
    }
  };
  rlimit unlimited;
  if (!LimitAddressSpace(int64_t{96} << 20, &unlimited)) return 2;
  int64_t batches = 0;
  bool threw = false;
  for (int b = 0; b < 400 && !threw; ++b) {
    for (int64_t i = 0; i < batch; ++i) keys[i] = b * batch + i;
    ++batches;
    try {
      t.FindOrInsertWith(keys.data(), batch, 0, width, init, defaults.data(), out.data(), nullptr, true, -1, pf);
    } catch (const std::bad_alloc&) {  // OutOfMemoryError included
      threw = true;
    }
  }
  if (!RestoreAddressSpace(unlimited)) return 2;
  if (!threw) return 3;
  int64_t present = 0;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t i = 0; i < batch; ++i) keys[i] = b * batch + i;
    t.Find(keys.data(), batch, 0, width, out.data(), found.get(), nullptr, pf);
    for (int64_t i = 0; i < batch; ++i) {
      if (!found[i]) continue;
      ++present;
      for (int64_t c = 0; c < width; ++c) {
        if (out[i * width + c] != value(keys[i], c)) return 4;  // a row left with column defaults
      }
    }
  }
  if (present != t.size() || present < (batches - 1) * batch) return 5;  // the batches before the failure
  if (!t.CheckInvariants().empty()) return 6;
  return 0;
}

TFEXT_TEST(OutOfMemoryInFindOrInsertWithLeavesNoRowUninitialized) {
  for (const bool pooled : {false, true}) ExpectChildSucceeds([=] { return OutOfMemoryFindOrInsertChild(pooled); });
}

// CheckInvariants holds after random workloads in every layout (also checked
// after each operation of RandomOperationsAgainstModel), and it reports each
// kind of damage to an index: the check itself must not be vacuous.
TFEXT_TEST(CheckInvariantsHoldsAndCatchesDamage) {
  for (const int shard_bits : {0, 2}) {
    for (const double load : {0.5, 0.95}) {
      HashTable t(Options(3, shard_bits, 0, load));
      std::mt19937_64 rng(11 + shard_bits);
      std::vector<int64_t> keys(3000);
      std::vector<float> vals(keys.size() * 3, 1.f);
      for (int round = 0; round < 20; ++round) {
        for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 5000) - 2500;
        t.Insert(keys.data(), 3000, 0, 3, vals.data(), nullptr, true, round, PoolParallelFor());
        CHECK_GT(t.Remove(keys.data(), 1000, InlineParallelFor()), int64_t{0});
        CHECK_EQ(t.CheckInvariants(), std::string());
      }
      CHECK_GT(t.size(), int64_t{0});

      // Each damage below breaks one invariant; CheckInvariants names it, and
      // the table is whole again once the slot is restored.
      auto expect_reported = [&](uint64_t* slot, uint64_t damaged, const char* invariant) {
        const uint64_t saved = *slot;
        *slot = damaged;
        const std::string found = t.CheckInvariants();
        *slot = saved;
        if (found.find(invariant) == std::string::npos) {
          std::fprintf(stderr, "damage not reported as \"%s\": \"%s\"\n", invariant, found.c_str());
        }
        CHECK(found.find(invariant) != std::string::npos);
        CHECK_EQ(t.CheckInvariants(), std::string());
      };
      bool gap = false, tag = false, row = false, count = false;
      for (int64_t si = 0; si < HashTableTestPeer::NumShards(t); ++si) {
        uint64_t capacity = 0;
        uint64_t* slots = HashTableTestPeer::Slots(t, si, &capacity);
        if (slots == nullptr) continue;
        const uint64_t mask = capacity - 1;
        for (uint64_t p = 0; p < capacity; ++p) {
          const uint64_t slot = slots[p];
          if (slot == 0) {
            if (!row) {  // a slot (at its own home) naming a row never handed out
              expect_reported(&slots[p], (p << 32) | 0xFFFFFFF0u, "I3: a slot names a row never handed out");
              row = true;
            }
            continue;
          }
          if (!tag) {  // a tag that is not its key's
            expect_reported(&slots[p], slot ^ (uint64_t{1} << 63), "I3: a slot's tag is not its key's");
            tag = true;
          }
          const uint64_t home = (slot >> 32) & mask;
          if (!gap && home != p) {  // an empty slot between a displaced key and its home
            expect_reported(&slots[home], 0, "I4");
            gap = true;
          }
          if (!count && home == p && slots[(p + 1) & mask] == 0) {
            // A key dropped from the end of its cluster: the other keys stay
            // reachable, but the count no longer matches the size.
            expect_reported(&slots[p], 0, "I3: occupied slots != size");
            count = true;
          }
        }
      }
      CHECK(gap && tag && row && count);
    }
  }
}

// ---------------------------------------------------------------------------
// Arena prefaulting (TF_EXT_TABLE_PREFAULT). Width 32 rows are 148 bytes, so
// the arena moves from single chunks to 2 MiB slabs at 16 MiB (~113K keys),
// and prefaults from 16 slabs on (~340K keys); the tests below insert past
// that, across dozens of slab and thousands of chunk boundaries.

constexpr int64_t kPrefaultWidth = 32;

// A table created with TF_EXT_TABLE_PREFAULT set to `value` (read when the
// table is created), the variable restored afterwards.
std::unique_ptr<HashTable> TableWithPrefault(const char* value, const TableOptions& options) {
  const char* old = std::getenv("TF_EXT_TABLE_PREFAULT");
  const std::string saved = old != nullptr ? old : "";
  setenv("TF_EXT_TABLE_PREFAULT", value, 1);
  std::unique_ptr<HashTable> t(new HashTable(options));
  if (old != nullptr) {
    setenv("TF_EXT_TABLE_PREFAULT", saved.c_str(), 1);
  } else {
    unsetenv("TF_EXT_TABLE_PREFAULT");
  }
  return t;
}

// Inserts keys [first, first + n) in batches with FindOrInsert (rows derived
// from the key), counting and versioning them; returns nothing, checks the
// inserted flags.
void InsertRange(HashTable& t, int64_t first, int64_t n, int64_t batch, const ParallelFor& pf,
                 bool pause_between_batches) {
  std::vector<int64_t> keys;
  std::vector<float> init;
  std::vector<float> out;
  std::unique_ptr<bool[]> inserted(new bool[batch]);
  for (int64_t b = first; b < first + n; b += batch) {
    const int64_t m = std::min(batch, first + n - b);
    keys.resize(m);
    init.resize(m * kPrefaultWidth);
    out.resize(m * kPrefaultWidth);
    for (int64_t i = 0; i < m; ++i) {
      keys[i] = static_cast<int64_t>(HashKey(b + i));  // spread over the shards
      for (int64_t c = 0; c < kPrefaultWidth; ++c) init[i * kPrefaultWidth + c] = static_cast<float>((b + i) % 977 + c);
    }
    t.FindOrInsert(keys.data(), m, 0, kPrefaultWidth, init.data(), nullptr, out.data(), inserted.get(), true, b, pf);
    for (int64_t i = 0; i < m; ++i) CHECK(inserted[i]);
    CHECK(out == init);
    // Lets the background worker finish the slabs it was asked for, as the
    // rest of a training step does: the next batch finds them ready however
    // slow the worker's thread (a failed mapping is no error: the table then
    // maps its own slabs).
    int64_t ready = 0, taken = 0;
    if (pause_between_batches) SettledSpareSlabs(t, &ready, &taken);
  }
}

// Growth through prefaulted slabs gives exactly the contents of growth
// through slabs mapped on demand, and the spare slabs are really used (and
// counted in memory_bytes, within their cap).
TFEXT_TEST(PrefaultedGrowthMatchesOnDemandGrowth) {
  const TableOptions options = Options(kPrefaultWidth, 2);
  std::unique_ptr<HashTable> on = TableWithPrefault("1", options);
  std::unique_ptr<HashTable> off = TableWithPrefault("0", options);
  const int64_t n = 450000;  // ~64 MiB of rows: ~24 slabs
  InsertRange(*on, 0, n, 4096, PoolParallelFor(), true);
  InsertRange(*off, 0, n, 4096, PoolParallelFor(), true);
  CHECK_EQ(on->size(), n);
  CHECK_EQ(on->CheckInvariants(), std::string());
  CHECK_EQ(off->CheckInvariants(), std::string());
  CHECK(Snapshot(*on) == Snapshot(*off));
  int64_t ready = 0, pending = 0, taken = 0;
  HashTableTestPeer::SpareSlabs(*off, &ready, &pending, &taken);
  CHECK_EQ(ready, 0);
  CHECK_EQ(taken, 0);
  HashTableTestPeer::SpareSlabs(*on, &ready, &pending, &taken);
  std::printf("  prefaulted slabs taken: %lld, ready: %lld\n", static_cast<long long>(taken),
              static_cast<long long>(ready));
  CHECK_GT(taken, 0);
  // The same slabs in use either way; the difference is the ready spares
  // (one per 16 slabs in use: here at most 1, of 2 MiB plus one chunk, and
  // their bookkeeping).
  const int64_t slab_bytes = (int64_t{2} << 20) + (int64_t{16} << 10);
  CHECK_GE(on->memory_bytes(), off->memory_bytes());
  CHECK_LE(on->memory_bytes(), off->memory_bytes() + slab_bytes + 4096);
  // Reads and overwrites of rows in prefaulted slabs.
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(HashKey(i));
  std::vector<float> a(n * kPrefaultWidth), b(n * kPrefaultWidth);
  on->Find(keys.data(), n, 0, kPrefaultWidth, a.data(), nullptr, nullptr, PoolParallelFor());
  off->Find(keys.data(), n, 0, kPrefaultWidth, b.data(), nullptr, nullptr, PoolParallelFor());
  CHECK(a == b);
}

// Writers on several threads grow one prefaulting table at once (each batch
// spans every shard, so the shards take slabs concurrently while the worker
// prepares more) with a reader running beside them: every key lands once
// with its row.
TFEXT_TEST(PrefaultedGrowthUnderConcurrentWriters) {
  std::unique_ptr<HashTable> t = TableWithPrefault("1", Options(kPrefaultWidth, 3));
  const int threads = 4;
  const int64_t per_thread = 110000;
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0};
  std::thread reader([&] {
    std::vector<int64_t> keys(512);
    std::vector<float> out(512 * kPrefaultWidth);
    std::unique_ptr<bool[]> found(new bool[512]);
    while (!done.load()) {
      for (int64_t i = 0; i < 512; ++i) keys[i] = static_cast<int64_t>(HashKey(i * 997));
      t->Find(keys.data(), 512, 0, kPrefaultWidth, out.data(), found.get(), nullptr, InlineParallelFor());
      for (int64_t i = 0; i < 512; ++i) {
        if (found[i]) CHECK_EQ(out[i * kPrefaultWidth + 1], static_cast<float>((i * 997) % 977 + 1));
      }
      reads.fetch_add(1);
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < threads; ++w) {
    // Each writer finishes only after the reader has read during the growth.
    writers.emplace_back([&, w] {
      InsertRange(*t, w * per_thread, per_thread / 2, 2048, InlineParallelFor(), false);
      WaitUntil([&] { return reads.load() > 0; }, "the reader");
      InsertRange(*t, w * per_thread + per_thread / 2, per_thread - per_thread / 2, 2048, InlineParallelFor(), false);
    });
  }
  for (std::thread& w : writers) w.join();
  done.store(true);
  reader.join();
  CHECK_GT(reads.load(), 0);
  CHECK_EQ(t->size(), threads * per_thread);
  CHECK_EQ(t->CheckInvariants(), std::string());
  const std::map<int64_t, Entry> snap = Snapshot(*t);
  CHECK_EQ(static_cast<int64_t>(snap.size()), threads * per_thread);
  for (int64_t k = 0; k < threads * per_thread; ++k) {
    auto it = snap.find(static_cast<int64_t>(HashKey(k)));
    CHECK(it != snap.end());
    CHECK_EQ(it->second.row[0], static_cast<float>(k % 977));
    CHECK_EQ(it->second.row[kPrefaultWidth - 1], static_cast<float>(k % 977 + kPrefaultWidth - 1));
    CHECK_EQ(it->second.frequency, 1u);
  }
}

// Clear releases the spare slabs with the arena (memory back to a new
// table's), also while the worker is still preparing some, and a table may be
// destroyed with requests in flight; a cleared table grows (and prefaults)
// again.
TFEXT_TEST(PrefaultedSlabsAreReleasedByClearAndDestruction) {
  const TableOptions options = Options(kPrefaultWidth, 2);
  const int64_t fresh_bytes = HashTable(options).memory_bytes();
  for (int round = 0; round < 3; ++round) {
    std::unique_ptr<HashTable> t = TableWithPrefault("1", options);
    InsertRange(*t, 0, 400000, 8192, PoolParallelFor(), false);
    t->Clear();  // the worker may be mapping a slab for this table right now
    CHECK_EQ(t->size(), 0);
    CHECK_EQ(t->memory_bytes(), fresh_bytes);
    InsertRange(*t, 1000000, 400000, 8192, PoolParallelFor(), round == 0);
    CHECK_EQ(t->size(), 400000);
    CHECK_EQ(t->CheckInvariants(), std::string());
    if (round == 0) {
      int64_t ready = 0, pending = 0, taken = 0;
      HashTableTestPeer::SpareSlabs(*t, &ready, &pending, &taken);
      CHECK_GT(taken, 0);  // prefaulting restarted after Clear
    }
    // Destroyed right after growing: requests may still be queued or running.
  }
}

// Minor page faults taken by the calling thread so far.
int64_t ThreadMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return static_cast<int64_t>(usage.ru_minflt);
}

// A preallocated table holds the memory of initial_capacity keys from its
// construction: inserting that many keys takes no index growth, no new arena
// memory and (nearly) no page fault, and leaves the same contents as a table
// that grew on demand. Past its capacity it grows as usual; Clear
// preallocates again and Replace keeps the headroom.
TFEXT_TEST(PreallocatedTableHoldsItsCapacityUpFront) {
  const int64_t capacity = 200000;
  TableOptions lazy_options = Options(kPrefaultWidth, 2, capacity);
  lazy_options.huge_pages = false;
  TableOptions options = lazy_options;
  options.preallocate = true;
  HashTable lazy(lazy_options);
  HashTable pre(options);
  const int64_t row_bytes = 20 + 4 * kPrefaultWidth;
  const int64_t start = pre.memory_bytes();
  std::printf("  preallocated %lld bytes for %lld keys (on demand: %lld)\n", static_cast<long long>(start),
              static_cast<long long>(capacity), static_cast<long long>(lazy.memory_bytes()));
  CHECK_GE(start, lazy.memory_bytes() + capacity * row_bytes);
  // At most one chunk per shard and one slab of slack beyond the rows.
  CHECK_LE(start, lazy.memory_bytes() + capacity * row_bytes + 4 * (int64_t{16} << 10) + (int64_t{2} << 20) + 4096);

  const int64_t faults_before = ThreadMinorFaults();
  InsertRange(pre, 0, capacity, 4096, InlineParallelFor(), false);
  const int64_t faults = ThreadMinorFaults() - faults_before;
  const int64_t row_pages = capacity * row_bytes / 4096;
  std::printf("  page faults inserting %lld keys: %lld (rows span %lld pages)\n", static_cast<long long>(capacity),
              static_cast<long long>(faults), static_cast<long long>(row_pages));
  CHECK_LT(faults, row_pages / 20);
  // What grows is the shards' tables of chunk pointers: a chunk holds 64 rows
  // of this width, and a table at most doubles past what it holds.
  const int64_t chunk_tables = 2 * (capacity / 64 + 4) * static_cast<int64_t>(sizeof(char*));
  CHECK_LE(pre.memory_bytes(), start + chunk_tables);
  InsertRange(lazy, 0, capacity, 4096, InlineParallelFor(), false);
  CHECK_EQ(pre.CheckInvariants(), std::string());
  CHECK(Snapshot(pre) == Snapshot(lazy));

  // Past the capacity: grows on demand.
  InsertRange(pre, capacity, capacity / 2, 4096, PoolParallelFor(), false);
  CHECK_EQ(pre.size(), capacity + capacity / 2);
  CHECK_GT(pre.memory_bytes(), start + (capacity / 2) * row_bytes / 2);
  CHECK_EQ(pre.CheckInvariants(), std::string());

  // A restore of fewer keys keeps the preallocated headroom.
  pre.Replace(1000, [](HashTable& staging) { InsertRange(staging, 7, 1000, 512, InlineParallelFor(), false); });
  CHECK_EQ(pre.size(), 1000);
  CHECK_GE(pre.memory_bytes(), start);
  CHECK_LE(pre.memory_bytes(), start + chunk_tables);
  // Clear preallocates again, as a new table.
  pre.Clear();
  CHECK_EQ(pre.size(), 0);
  CHECK_EQ(pre.memory_bytes(), start);
  InsertRange(pre, 0, capacity, 4096, PoolParallelFor(), false);
  CHECK_LE(pre.memory_bytes(), start + chunk_tables);
  CHECK_EQ(pre.CheckInvariants(), std::string());
}

// A capacity beyond what the machine has is not preallocated (faulting it
// in would end in the OOM killer, not in an error): the table is the one a
// plain capacity hint makes, and works.
TFEXT_TEST(PreallocationBeyondAvailableMemoryIsSkipped) {
  TableOptions options = Options(kPrefaultWidth, -1, tfext::table::kMaxCapacity);
  options.huge_pages = false;
  HashTable hint(options);
  options.preallocate = true;
  HashTable pre(options);
  CHECK_EQ(pre.memory_bytes(), hint.memory_bytes());
  InsertRange(pre, 0, 5000, 1024, InlineParallelFor(), false);
  CHECK_EQ(pre.size(), 5000);
  CHECK_EQ(pre.CheckInvariants(), std::string());
}

// UpdateRows gives Update's results. With the references of the same keys'
// FindOrInsertWith it goes straight to the rows; references of another batch
// (positions rotated), references from before a removal or a Clear, and keys
// absent from the table (inserted) go through the probe instead.
TFEXT_TEST(UpdateRowsMatchesUpdate) {
  const int64_t width = 8, n = 6000;
  HashTable a(Options(width, 2)), b(Options(width, 2));
  std::mt19937_64 rng(17);
  std::vector<int64_t> keys(n);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 40000) - 20000;
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::shuffle(keys.begin(), keys.end(), rng);
  const int64_t m = static_cast<int64_t>(keys.size());
  const auto fill = [&](const int64_t* index, float* const* dst, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t c = 0; c < 4; ++c) dst[j][c] = static_cast<float>(keys[index[j]] % 97) + 0.25f * c;
    }
  };
  const auto apply = [&](int64_t i, float* row, KeyMeta* meta) {
    for (int64_t c = 0; c < width; ++c) row[c] += 0.5f * static_cast<float>(i % 13) + c;
    meta->version = 7 + i % 3;
  };
  auto run = [&](const std::vector<uint64_t>& refs, uint64_t epoch) {
    const int64_t direct = a.UpdateRows(keys.data(), refs.data(), epoch, m, nullptr, apply, PoolParallelFor());
    b.Update(keys.data(), m, nullptr, apply, PoolParallelFor());
    CHECK(Snapshot(a) == Snapshot(b));
    CHECK_EQ(a.CheckInvariants(), std::string());
    return direct;
  };
  std::vector<uint64_t> refs(m);
  uint64_t epoch = a.removal_epoch();
  a.FindOrInsertWith(keys.data(), m, 0, 4, fill, nullptr, nullptr, nullptr, true, 3, PoolParallelFor(), refs.data());
  b.FindOrInsertWith(keys.data(), m, 0, 4, fill, nullptr, nullptr, nullptr, true, 3, PoolParallelFor());
  CHECK_EQ(run(refs, epoch), m);  // every key straight to its row
  CHECK_EQ(run(refs, epoch), m);  // inserts do not move rows: still exact

  // References of other positions: no row holds the key its position asks for.
  std::vector<uint64_t> rotated(refs.begin() + 1, refs.end());
  rotated.push_back(refs[0]);
  CHECK_EQ(run(rotated, epoch), 0);

  // A removal (in either table alike) changes the epoch: references from
  // before it are not used, and the removed keys come back through the probe.
  a.Remove(keys.data(), 100, PoolParallelFor());
  b.Remove(keys.data(), 100, PoolParallelFor());
  CHECK(a.removal_epoch() != epoch);
  CHECK_EQ(run(refs, epoch), 0);
  CHECK_EQ(a.size(), m);

  // Fresh references after the removal are exact again; Clear voids them.
  epoch = a.removal_epoch();
  a.FindOrInsertWith(keys.data(), m, 0, 4, fill, nullptr, nullptr, nullptr, true, 3, PoolParallelFor(), refs.data());
  b.FindOrInsertWith(keys.data(), m, 0, 4, fill, nullptr, nullptr, nullptr, true, 3, PoolParallelFor());
  CHECK_EQ(run(refs, epoch), m);
  a.Clear();
  b.Clear();
  CHECK_EQ(run(refs, epoch), 0);  // every key absent: inserted through the probe
  CHECK_EQ(a.size(), m);
  CHECK_EQ(a.UpdateRows(keys.data(), nullptr, 0, m, nullptr, apply, InlineParallelFor()), 0);
}

// ---------------------------------------------------------------------------
// Compact rows (TableOptions::storage). The reference is a float32 table fed
// the same operations whose written rows are then rounded as the compact
// table stores them (RoundAsStored, to nearest): after every operation the
// two must hold bit-identical contents, and every read must return the same
// floats. Batches have unique keys: with a key repeated in a batch, a compact
// table rounds after each occurrence (as documented), which a single rounding
// of the reference's result would not reproduce.

TableOptions CompactOptions(int64_t width, RowStorage storage, int64_t compact_cols,
                            Rounding rounding = Rounding::kNearest, int shard_bits = -1) {
  TableOptions o = Options(width, shard_bits);
  o.storage = storage;
  o.compact_cols = compact_cols;
  o.rounding = rounding;
  return o;
}

const char* StorageName(RowStorage storage) {
  switch (storage) {
    case RowStorage::kFloat32:
      return "float32";
    case RowStorage::kBFloat16:
      return "bfloat16";
    case RowStorage::kFloat16:
      return "float16";
    case RowStorage::kInt8Row:
      return "int8_row";
  }
  return "?";
}

// The row as a compact table stores it: columns [0, compact_cols) rounded to
// nearest, an int8 row quantized as a whole; the others unchanged.
void RoundAsStored(RowStorage storage, int64_t compact_cols, float* row) {
  std::vector<char> area(CompactBytes(storage, compact_cols));
  if (storage == RowStorage::kInt8Row) {
    EncodeInt8Row(row, compact_cols, area.data());
    DecodeInt8Row(area.data(), compact_cols, 0, compact_cols, row);
  } else {
    EncodeElements(storage, row, 0, compact_cols, area.data(), Rounding::kNearest, 0, 0);
    DecodeElements(storage, area.data(), 0, compact_cols, row);
  }
}

// Rounds the rows of `keys` (those present) in the float32 reference table as
// a compact table stores them; metadata unchanged.
void RoundRowsAsStored(HashTable& reference, RowStorage storage, int64_t compact_cols,
                       const std::vector<int64_t>& keys) {
  const int64_t width = reference.width();
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<float> rows(n * width);
  std::unique_ptr<bool[]> found(new bool[n + 1]);
  reference.Find(keys.data(), n, 0, width, rows.data(), found.get(), nullptr, InlineParallelFor());
  std::vector<int64_t> present;
  std::vector<float> rounded;
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) continue;
    RoundAsStored(storage, compact_cols, &rows[i * width]);
    present.push_back(keys[i]);
    rounded.insert(rounded.end(), rows.begin() + i * width, rows.begin() + (i + 1) * width);
  }
  reference.Insert(present.data(), static_cast<int64_t>(present.size()), 0, width, rounded.data(), nullptr, false, -1,
                   InlineParallelFor());
}

std::map<int64_t, std::vector<float>> ExportRange(const HashTable& t, int64_t cb, int64_t cols, int64_t min_version) {
  std::vector<int64_t> keys;
  std::vector<float> rows;
  const auto alloc = [&](int64_t n) {
    keys.resize(n);
    rows.resize(n * cols);
    HashTable::ExportBuffers b;
    b.keys = keys.data();
    b.rows = rows.data();
    return b;
  };
  if (min_version < 0) {
    t.Export(cb, cols, alloc);
  } else {
    t.ExportSince(min_version, cb, cols, alloc);
  }
  std::map<int64_t, std::vector<float>> out;
  for (size_t i = 0; i < keys.size(); ++i) out[keys[i]].assign(rows.begin() + i * cols, rows.begin() + (i + 1) * cols);
  return out;
}

// Bitwise equality of float vectors (NaN-safe, and -0 differs from +0).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

void RunCompactOpsAgainstFloat32(RowStorage storage, int64_t width, int64_t compact_cols, uint64_t seed, int ops) {
  std::printf("  %s, width %lld, compact_cols %lld, seed %llu\n", StorageName(storage), static_cast<long long>(width),
              static_cast<long long>(compact_cols), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  std::normal_distribution<float> normal(0.f, 1.f);
  const float scales[4] = {0.01f, 0.3f, 1.f, 40.f};
  auto random_float = [&]() { return normal(rng) * scales[uniform(0, 3)]; };
  HashTable compact(CompactOptions(width, storage, compact_cols, Rounding::kNearest, uniform(0, 1) ? -1 : 2));
  HashTable reference(Options(width));
  // Rounds the rows a write reached (an int8 row is encoded again only when
  // its compact columns are written: a row decoded and encoded again may
  // move, so the reference must not round rows the table leaves alone).
  const auto round_written = [&](const std::vector<int64_t>& keys) {
    RoundRowsAsStored(reference, storage, compact_cols, keys);
  };
  // Defaults the compact table stores exactly (an int8 row's compact part is
  // constant: a constant row quantizes exactly).
  std::vector<float> defaults(width);
  for (float& d : defaults) d = random_float();
  if (storage == RowStorage::kInt8Row) std::fill(defaults.begin(), defaults.begin() + compact_cols, 0.25f);
  RoundAsStored(storage, compact_cols, defaults.data());
  const auto same_contents = [&]() {
    const std::map<int64_t, Entry> a = Snapshot(compact), b = Snapshot(reference);
    CHECK_EQ(a.size(), b.size());
    for (const auto& kv : b) {
      auto it = a.find(kv.first);
      CHECK(it != a.end());
      CHECK(SameBits(it->second.row, kv.second.row));
      CHECK_EQ(it->second.version, kv.second.version);
      CHECK_EQ(it->second.frequency, kv.second.frequency);
    }
  };
  const int64_t universe = uniform(200, 6000);
  for (int op = 0; op < ops; ++op) {
    const ParallelFor pf = uniform(0, 1) ? InlineParallelFor() : PoolParallelFor();
    const int64_t wanted = uniform(0, 9) == 0 ? uniform(2048, 2500) : uniform(0, 40);
    std::set<int64_t> unique;
    while (static_cast<int64_t>(unique.size()) < std::min(wanted, universe)) {
      unique.insert((uniform(0, universe - 1) - universe / 2) * 7919);
    }
    std::vector<int64_t> keys(unique.begin(), unique.end());
    std::shuffle(keys.begin(), keys.end(), rng);
    const int64_t n = static_cast<int64_t>(keys.size());
    // Column ranges inside the compact area, across its end, or after it.
    const int64_t cb = uniform(0, width - 1);
    const int64_t cols = uniform(0, 10) == 0 ? 0 : uniform(1, width - cb);
    const bool writes_compact = cb < compact_cols && cols > 0;
    std::vector<float> data(n * cols);
    for (float& v : data) v = random_float();
    const bool count = uniform(0, 1);
    const int64_t version = uniform(0, 2) == 0 ? -1 : uniform(0, 1000);
    const float* defaults_or_null = uniform(0, 3) == 0 ? nullptr : defaults.data();
    const int kind = static_cast<int>(uniform(0, 99));
    if (kind < 15) {  // Find, absent keys with a default row
      std::vector<float> def(cols, 7.f), got(n * cols, 1.f), want(n * cols, 1.f);
      std::unique_ptr<bool[]> got_found(new bool[n + 1]), want_found(new bool[n + 1]);
      compact.Find(keys.data(), n, cb, cols, got.data(), got_found.get(), def.data(), pf);
      reference.Find(keys.data(), n, cb, cols, want.data(), want_found.get(), def.data(), pf);
      CHECK(SameBits(got, want));
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(got_found[i], want_found[i]);
    } else if (kind < 35) {  // FindOrInsert (init_rows) or FindOrInsertWith (an init function)
      std::vector<float> got(n * cols), want(n * cols);
      std::unique_ptr<bool[]> got_ins(new bool[n + 1]), want_ins(new bool[n + 1]);
      if (kind < 25) {
        compact.FindOrInsert(keys.data(), n, cb, cols, data.data(), defaults_or_null, got.data(), got_ins.get(), count,
                             version, pf);
        reference.FindOrInsert(keys.data(), n, cb, cols, data.data(), defaults_or_null, nullptr, want_ins.get(), count,
                               version, pf);
      } else {
        const auto init = [&](const int64_t* index, float* const* dst, int64_t k) {
          for (int64_t j = 0; j < k; ++j) {
            for (int64_t c = 0; c < cols; ++c) dst[j][c] = data[index[j] * cols + c] * 0.5f + dst[j][c];
          }
        };
        compact.FindOrInsertWith(keys.data(), n, cb, cols, init, defaults_or_null, got.data(), got_ins.get(), count,
                                 version, pf);
        reference.FindOrInsertWith(keys.data(), n, cb, cols, init, defaults_or_null, nullptr, want_ins.get(), count,
                                   version, pf);
      }
      std::vector<int64_t> inserted;
      for (int64_t i = 0; i < n; ++i) {
        CHECK_EQ(got_ins[i], want_ins[i]);
        if (want_ins[i]) inserted.push_back(keys[i]);
      }
      round_written(inserted);
      // out is the row as stored: the reference's rounded row.
      reference.Find(keys.data(), n, cb, cols, want.data(), nullptr, nullptr, pf);
      CHECK(SameBits(got, want));
    } else if (kind < 50) {  // Insert
      compact.Insert(keys.data(), n, cb, cols, data.data(), defaults_or_null, count, version, pf);
      reference.Insert(keys.data(), n, cb, cols, data.data(), defaults_or_null, count, version, pf);
      if (writes_compact) round_written(keys);
    } else if (kind < 62) {  // Accumulate
      const bool insert_missing = uniform(0, 1);
      compact.Accumulate(keys.data(), n, cb, cols, data.data(), defaults_or_null, insert_missing, count, version, pf);
      reference.Accumulate(keys.data(), n, cb, cols, data.data(), defaults_or_null, insert_missing, count, version, pf);
      if (writes_compact) round_written(keys);
    } else if (kind < 72) {  // Update, or UpdateRows through a lookup's references
      const auto fn = [&](int64_t i, float* row, KeyMeta* meta) {
        for (int64_t c = 0; c < width; ++c) row[c] = row[c] * 0.75f + 0.01f * static_cast<float>(i % 7) + 0.001f * c;
        meta->version += 1;
      };
      if (kind < 67) {
        compact.Update(keys.data(), n, defaults_or_null, fn, pf);
      } else {
        std::vector<uint64_t> refs(n);
        const uint64_t epoch = compact.removal_epoch();
        std::vector<float> ignored(n * cols);
        compact.FindOrInsertWith(
            keys.data(), n, cb, cols, [](const int64_t*, float* const*, int64_t) {}, defaults_or_null, nullptr, nullptr,
            false, -1, pf, refs.data());
        reference.FindOrInsertWith(
            keys.data(), n, cb, cols, [](const int64_t*, float* const*, int64_t) {}, defaults_or_null, nullptr, nullptr,
            false, -1, pf);
        CHECK_EQ(compact.UpdateRows(keys.data(), refs.data(), epoch, n, defaults_or_null, fn, pf), n);
      }
      reference.Update(keys.data(), n, defaults_or_null, fn, pf);
      round_written(keys);
    } else if (kind < 80) {  // Remove
      CHECK_EQ(compact.Remove(keys.data(), n, pf), reference.Remove(keys.data(), n, pf));
    } else if (kind < 84) {  // RemoveIf: the predicate sees the decoded rows
      const float bound = random_float();
      const auto pred = [&](int64_t key, const float* row, const KeyMeta& m) {
        float norm = 0;
        for (int64_t c = 0; c < width; ++c) norm += row[c] * row[c];
        return (key & 7) == 3 || m.version % 5 == 1 || row[0] > bound || norm > 900.f;
      };
      CHECK_EQ(compact.RemoveIf(pred), reference.RemoveIf(pred));
    } else if (kind < 92) {  // Import
      std::vector<int64_t> versions(n);
      std::vector<uint32_t> freqs(n);
      for (int64_t i = 0; i < n; ++i) {
        versions[i] = uniform(0, 5000);
        freqs[i] = static_cast<uint32_t>(rng());
      }
      compact.Import(keys.data(), n, cb, cols, data.data(), defaults_or_null, versions.data(), freqs.data(), pf);
      reference.Import(keys.data(), n, cb, cols, data.data(), defaults_or_null, versions.data(), freqs.data(), pf);
      if (writes_compact) round_written(keys);
    } else if (kind < 97) {  // Export and ExportSince of a column range
      const int64_t since = uniform(0, 1) ? -1 : uniform(0, 1000);
      const auto a = ExportRange(compact, cb, cols, since), b = ExportRange(reference, cb, cols, since);
      CHECK_EQ(a.size(), b.size());
      for (const auto& kv : b) CHECK(a.count(kv.first) == 1 && SameBits(a.at(kv.first), kv.second));
    } else {  // Replace with the table's own decoded contents, written again (an int8 row is requantized)
      const std::map<int64_t, Entry> before = Snapshot(compact);
      std::vector<int64_t> all;
      compact.Replace(static_cast<int64_t>(before.size()), [&](HashTable& staging) {
        for (const auto& kv : before) {
          staging.Import(&kv.first, 1, 0, width, kv.second.row.data(), nullptr, &kv.second.version,
                         &kv.second.frequency, InlineParallelFor());
          all.push_back(kv.first);
        }
      });
      round_written(all);
    }
    CHECK_EQ(compact.size(), reference.size());
    CHECK_EQ(compact.CheckInvariants(), std::string());
    if (op % 25 == 24) same_contents();
  }
  same_contents();
}

TFEXT_TEST(CompactRowsMatchAFloat32TableFedRoundedValues) {
  struct Config {
    RowStorage storage;
    int64_t width, compact_cols;
  };
  const Config configs[] = {
      {RowStorage::kBFloat16, 17, 16}, {RowStorage::kBFloat16, 7, 7}, {RowStorage::kBFloat16, 7, 5},
      {RowStorage::kFloat16, 9, 3},    {RowStorage::kFloat16, 4, 4},  {RowStorage::kInt8Row, 9, 8},
      {RowStorage::kInt8Row, 5, 5},    {RowStorage::kInt8Row, 6, 1},  {RowStorage::kFloat32, 6, 3},
  };
  uint64_t seed = 1;
  for (const Config& c : configs) RunCompactOpsAgainstFloat32(c.storage, c.width, c.compact_cols, seed++, 100);
  // Rows wider than the on-stack scratch row (128 floats): the per-thread buffers.
  RunCompactOpsAgainstFloat32(RowStorage::kBFloat16, 200, 150, seed++, 30);
  RunCompactOpsAgainstFloat32(RowStorage::kInt8Row, 140, 130, seed++, 30);
}

TFEXT_TEST(CompactOptionsAreValidated) {
  CHECK_EQ(ValidateOptions(CompactOptions(17, RowStorage::kBFloat16, 16, Rounding::kStochastic)), std::string());
  CHECK_EQ(ValidateOptions(CompactOptions(4, RowStorage::kInt8Row, 4)), std::string());
  CHECK(ValidateOptions(CompactOptions(4, RowStorage::kBFloat16, 5))
            .find("compact_cols must be in [0, width=4], got 5") != std::string::npos);
  CHECK(ValidateOptions(CompactOptions(4, RowStorage::kBFloat16, -1)).find("compact_cols") != std::string::npos);
  CHECK(ValidateOptions(CompactOptions(4, RowStorage::kInt8Row, 4, Rounding::kStochastic)).find("int8 rows") !=
        std::string::npos);
  CHECK(ValidateOptions(CompactOptions(4, static_cast<RowStorage>(9), 4)).find("storage") != std::string::npos);
  bool threw = false;
  try {
    HashTable t(CompactOptions(4, RowStorage::kFloat16, 6));
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("compact_cols") != std::string::npos;
  }
  CHECK(threw);
}

// Update and FindOrInsertWith's new rows round with the table's rounding.
// Stochastic rounding is seeded by key, the version the write leaves and the
// column: two tables fed the same steps hold the same bits, other versions
// give other bits, and small updates that round-to-nearest loses accumulate
// on average (bf16 at 1.0 has a gap of 2^-7; 1e-3 per step is below half).
TFEXT_TEST(StochasticRoundingIsDeterministicAndKeepsSmallUpdates) {
  for (const RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    const float step_delta = storage == RowStorage::kBFloat16 ? 1e-3f : 1.2e-4f;  // fp16 gap at 1.0: 2^-10
    const int64_t width = 5, compact_cols = 4, n = 2000, steps = 40;
    HashTable a(CompactOptions(width, storage, compact_cols, Rounding::kStochastic));
    HashTable b(CompactOptions(width, storage, compact_cols, Rounding::kStochastic, 1));
    HashTable other_versions(CompactOptions(width, storage, compact_cols, Rounding::kStochastic));
    HashTable nearest(CompactOptions(width, storage, compact_cols, Rounding::kNearest));
    HashTable plain(Options(width));
    std::vector<int64_t> keys(n);
    for (int64_t i = 0; i < n; ++i) keys[i] = i * 104729 - 77;
    std::vector<float> ones(n * width, 1.f);
    for (HashTable* t : {&a, &b, &other_versions, &nearest, &plain}) {
      t->Insert(keys.data(), n, 0, width, ones.data(), nullptr, false, 0, PoolParallelFor());
    }
    for (int64_t step = 1; step <= steps; ++step) {
      for (HashTable* t : {&a, &b, &other_versions, &nearest, &plain}) {
        const int64_t version = t == &other_versions ? step + 1000 : step;
        t->Update(
            keys.data(), n, nullptr,
            [&](int64_t, float* row, KeyMeta* meta) {
              for (int64_t c = 0; c < width; ++c) row[c] += step_delta;
              meta->version = version;
            },
            PoolParallelFor());
      }
    }
    CHECK(Snapshot(a) == Snapshot(b));
    const std::map<int64_t, Entry> sa = Snapshot(a), so = Snapshot(other_versions), sn = Snapshot(nearest),
                                   sp = Snapshot(plain);
    int64_t differ = 0;
    double mean = 0;
    for (const auto& kv : sa) {
      differ += kv.second.row != so.at(kv.first).row;
      for (int64_t c = 0; c < compact_cols; ++c) mean += kv.second.row[c];
      CHECK_EQ(sn.at(kv.first).row[0], 1.f);               // nearest loses every update
      CHECK_EQ(kv.second.row[4], sp.at(kv.first).row[4]);  // the float32 column is exact
    }
    mean /= static_cast<double>(n * compact_cols);
    const double exact = 1.0 + steps * static_cast<double>(step_delta);
    std::printf("  %s: stochastic mean %.5f, exact %.5f, nearest 1.0; rows differing by version: %lld of %lld\n",
                StorageName(storage), mean, exact, static_cast<long long>(differ), static_cast<long long>(n));
    CHECK_LE(std::fabs(mean - exact), 0.1 * (exact - 1.0));
    CHECK_GT(differ, n / 2);
    CHECK_EQ(a.CheckInvariants(), std::string());
  }
  // FindOrInsertWith's init is rounded stochastically (seeded by the version
  // the lookup sets), FindOrInsert's init_rows and Insert to nearest.
  const float x = 1.0f + 0.3f * 0x1p-7f;  // 30% of a bf16 gap above 1
  const int64_t n = 4000;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i;
  const auto init = [&](const int64_t*, float* const* dst, int64_t k) {
    for (int64_t j = 0; j < k; ++j) dst[j][0] = x;
  };
  HashTable s1(CompactOptions(2, RowStorage::kBFloat16, 1, Rounding::kStochastic));
  HashTable s2(CompactOptions(2, RowStorage::kBFloat16, 1, Rounding::kStochastic));
  s1.FindOrInsertWith(keys.data(), n, 0, 1, init, nullptr, nullptr, nullptr, false, 9, PoolParallelFor());
  s2.FindOrInsertWith(keys.data(), n, 0, 1, init, nullptr, nullptr, nullptr, false, 9, InlineParallelFor());
  CHECK(Snapshot(s1) == Snapshot(s2));
  int64_t up = 0;
  for (const auto& kv : Snapshot(s1)) {
    CHECK(kv.second.row[0] == 1.f || kv.second.row[0] == 1.f + 0x1p-7f);
    up += kv.second.row[0] > 1.f;
  }
  CHECK_GT(up, n / 5);
  CHECK_LT(up, 2 * n / 5);
  std::vector<float> xs(n, x), out(n);
  HashTable s3(CompactOptions(2, RowStorage::kBFloat16, 1, Rounding::kStochastic));
  s3.FindOrInsert(keys.data(), n, 0, 1, xs.data(), nullptr, out.data(), nullptr, false, 9, PoolParallelFor());
  for (const float v : out) CHECK_EQ(v, 1.f);
  s3.Insert(keys.data(), n, 0, 1, xs.data(), nullptr, false, 10, PoolParallelFor());
  s3.Find(keys.data(), n, 0, 1, out.data(), nullptr, nullptr, PoolParallelFor());
  for (const float v : out) CHECK_EQ(v, 1.f);
}

// An int8 row is quantized as a whole: writing one column requantizes the
// others with the new row's scale, each within scale / 2 of what it read
// before; the float32 columns after the compact area are untouched.
TFEXT_TEST(Int8RowsAreRequantizedAsAWhole) {
  const int64_t width = 9, compact_cols = 8;
  HashTable t(CompactOptions(width, RowStorage::kInt8Row, compact_cols));
  const ParallelFor pf = InlineParallelFor();
  const int64_t key = 42;
  float row[9] = {0.f, 0.01f, 0.02f, 0.03f, 0.04f, 0.05f, 0.06f, 0.07f, 123.456f};
  t.Insert(&key, 1, 0, width, row, nullptr, false, 1, pf);
  float before[9];
  t.Find(&key, 1, 0, width, before, nullptr, nullptr, pf);
  const float small_scale = 0.07f / 255.f;
  for (int c = 0; c < 8; ++c) CHECK_LE(std::fabs(before[c] - row[c]), small_scale / 2 * 1.01f + 1e-7f);
  CHECK_EQ(before[8], 123.456f);
  // Column 3 becomes 10: the row's range grows, so does its scale.
  const float ten = 10.f;
  t.Insert(&key, 1, 3, 1, &ten, nullptr, false, 2, pf);
  float after[9];
  t.Find(&key, 1, 0, width, after, nullptr, nullptr, pf);
  float expected[9];
  std::copy(before, before + 9, expected);
  expected[3] = 10.f;
  float want[9];
  std::copy(expected, expected + 9, want);
  RoundAsStored(RowStorage::kInt8Row, compact_cols, want);
  const float big_scale = 10.f / 255.f;
  int moved = 0;
  for (int c = 0; c < 8; ++c) {
    CHECK_EQ(after[c], want[c]);
    CHECK_LE(std::fabs(after[c] - expected[c]), big_scale / 2 * 1.01f);
    moved += after[c] != before[c];
  }
  CHECK_GE(moved, 4);            // requantized: the small values moved to the coarser grid
  CHECK_EQ(after[8], 123.456f);  // the float32 column is not part of the int8 row
  // A partial read decodes with the row's own scale and bias.
  float part[2];
  t.Find(&key, 1, 6, 3, part, nullptr, nullptr, pf);  // reads past the compact area into the float column
  CHECK_EQ(part[0], after[6]);
  CHECK_EQ(part[1], after[7]);
  // Accumulate requantizes too; a write of only the float column does not touch the int8 row.
  const float delta = -9.5f;
  t.Accumulate(&key, 1, 3, 1, &delta, nullptr, false, false, -1, pf);
  float acc[9];
  t.Find(&key, 1, 0, width, acc, nullptr, nullptr, pf);
  std::copy(after, after + 9, want);
  want[3] += delta;
  RoundAsStored(RowStorage::kInt8Row, compact_cols, want);
  for (int c = 0; c < 9; ++c) CHECK_EQ(acc[c], want[c]);
  const float seven = 7.f;
  t.Insert(&key, 1, 8, 1, &seven, nullptr, false, -1, pf);
  float last[9];
  t.Find(&key, 1, 0, width, last, nullptr, nullptr, pf);
  for (int c = 0; c < 8; ++c) CHECK_EQ(last[c], acc[c]);
  CHECK_EQ(last[8], 7.f);
  // A new key's zero row is exact zeros.
  const int64_t fresh = 7;
  float zeros[9];
  t.FindOrInsert(&fresh, 1, 8, 1, &seven, nullptr, zeros, nullptr, false, -1, pf);
  t.Find(&fresh, 1, 0, width, zeros, nullptr, nullptr, pf);
  for (int c = 0; c < 8; ++c) CHECK_EQ(zeros[c], 0.f);
}

// RemoveIf's predicate sees the decoded rows: an L2-norm eviction of a bf16
// table evicts what the same eviction of the decoded float32 rows would.
TFEXT_TEST(RemoveIfSeesDecodedRows) {
  const int64_t width = 3;
  HashTable t(CompactOptions(width, RowStorage::kBFloat16, 2));
  const ParallelFor pf = InlineParallelFor();
  std::vector<int64_t> keys;
  std::vector<float> rows;
  for (int64_t k = 0; k < 1000; ++k) {
    keys.push_back(k);
    // 1 + k * 2^-10: bf16 keeps 1 + 2^-7 * round(k / 8): the norm the
    // predicate sees changes only every 8 keys.
    rows.push_back(1.f + static_cast<float>(k) * 0x1p-10f);
    rows.push_back(0.f);
    rows.push_back(static_cast<float>(k));
  }
  t.Insert(keys.data(), 1000, 0, width, rows.data(), nullptr, false, 1, pf);
  int64_t calls = 0;
  const int64_t removed = t.RemoveIf([&](int64_t key, const float* row, const KeyMeta&) {
    ++calls;
    float stored = row[0];
    RoundAsStored(RowStorage::kBFloat16, 1, &stored);
    CHECK_EQ(row[0], stored);                        // a value bf16 can hold
    CHECK_EQ(row[2], static_cast<float>(key));       // the float32 column as written
    return row[0] * row[0] + row[1] * row[1] > 2.f;  // norm^2 > 2: row[0] > 1.4142
  });
  CHECK_EQ(calls, int64_t{1000});
  // Stored row[0] = 1 + 2^-7 * m, m = round-half-even(k / 8): > sqrt(2) from m = 54 on.
  int64_t expected = 0;
  for (int64_t k = 0; k < 1000; ++k) {
    float v = 1.f + static_cast<float>(k) * 0x1p-10f;
    RoundAsStored(RowStorage::kBFloat16, 1, &v);
    expected += v * v > 2.f;
  }
  CHECK_EQ(removed, expected);
  CHECK_GT(expected, int64_t{500});
  CHECK_EQ(t.size(), 1000 - expected);
  CHECK_EQ(t.CheckInvariants(), std::string());
}

// Compact rows are smaller rows: at the same keys (one shard, so that the
// last chunk's slack, < 16 KiB, is < 0.25 B/key), memory_bytes differs from
// the float32 table's by the row bytes the storage saves, per key.
TFEXT_TEST(CompactRowsTakeFewerBytesPerKey) {
  const int64_t width = 17, n = int64_t{1} << 16;
  std::vector<int64_t> keys(n);
  std::mt19937_64 rng(5);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng());
  std::vector<float> values(n * width, 0.5f);
  HashTable plain(Options(width, 0));
  plain.Insert(keys.data(), n, 0, width, values.data(), nullptr, false, -1, InlineParallelFor());
  const double plain_per_key = static_cast<double>(plain.memory_bytes()) / n;
  struct Case {
    RowStorage storage;
    int64_t compact_cols;
    int64_t row_bytes;  // 20 + CompactBytes + 4 * (width - compact_cols)
  };
  for (const Case c :
       {Case{RowStorage::kBFloat16, 16, 56}, Case{RowStorage::kFloat16, 16, 56}, Case{RowStorage::kBFloat16, 17, 56},
        Case{RowStorage::kInt8Row, 16, 44}, Case{RowStorage::kFloat16, 1, 88}}) {
    HashTable t(CompactOptions(width, c.storage, c.compact_cols, Rounding::kNearest, 0));
    t.Insert(keys.data(), n, 0, width, values.data(), nullptr, false, -1, InlineParallelFor());
    const double per_key = static_cast<double>(t.memory_bytes()) / n;
    const double saved = plain_per_key - per_key;
    std::printf("  %s, compact_cols %lld: %.1f B/key (float32 rows: %.1f): saves %.2f B/key, rows %lld B shorter\n",
                StorageName(c.storage), static_cast<long long>(c.compact_cols), per_key, plain_per_key, saved,
                static_cast<long long>(20 + 4 * width - c.row_bytes));
    CHECK_LE(std::fabs(saved - static_cast<double>(20 + 4 * width - c.row_bytes)), 2.0 * 16384 / n);
    CHECK_EQ(t.CheckInvariants(), std::string());
  }
}

// ---------------------------------------------------------------------------
// Tiered storage: row_bytes, SampleMeta and Evacuate, the core's part of a
// memory tier over a disk tier. A row moved out by Evacuate and imported
// back must be the row it was, bit for bit, metadata included.

// The shard a key lives in (hash_table.h, "Design": the top shard_bits of
// the probe hash, Murmur3Fmix64). Checked against the index by
// ShardSizesFromIndex where a test relies on it.
int64_t ShardOf(int64_t key, int shard_bits) {
  return shard_bits == 0
             ? 0
             : static_cast<int64_t>(tfext::table::Murmur3Fmix64(static_cast<uint64_t>(key)) >> (64 - shard_bits));
}

std::vector<int64_t> ShardSizesFromIndex(HashTable& t) {
  std::vector<int64_t> sizes(HashTableTestPeer::NumShards(t), 0);
  for (size_t s = 0; s < sizes.size(); ++s) {
    uint64_t capacity = 0;
    const uint64_t* slots = HashTableTestPeer::Slots(t, static_cast<int64_t>(s), &capacity);
    for (uint64_t p = 0; p < capacity; ++p) sizes[s] += slots[p] != 0 ? 1 : 0;
  }
  return sizes;
}

// n distinct keys, shuffled, with distinct rows of random floats (exact
// zeros, signed zeros and tiny values among them) and metadata.
struct TierRows {
  std::vector<int64_t> keys;
  std::vector<float> rows;
  std::vector<int64_t> versions;
  std::vector<uint32_t> freqs;
};
TierRows MakeTierRows(int64_t n, int64_t width, uint64_t seed) {
  TierRows r;
  std::mt19937_64 rng(seed);
  std::set<int64_t> seen;
  while (static_cast<int64_t>(r.keys.size()) < n) {
    const int64_t k = static_cast<int64_t>(rng());
    if (seen.insert(k).second) r.keys.push_back(k);
  }
  std::normal_distribution<float> normal(0.f, 3.f);
  r.rows.resize(n * width);
  for (int64_t i = 0; i < n * width; ++i) {
    const uint64_t pick = rng() % 16;
    r.rows[i] = pick == 0 ? 0.f : pick == 1 ? -0.f : pick == 2 ? 1e-30f * normal(rng) : normal(rng);
  }
  for (int64_t i = 0; i < n; ++i) {
    r.versions.push_back(static_cast<int64_t>(rng() % 1000) - 10);  // negative versions are values like any other
    r.freqs.push_back(i % 50 == 0 ? kMaxFreq : static_cast<uint32_t>(rng() % 100));
  }
  return r;
}

TFEXT_TEST(RowBytesIsTheDocumentedStride) {
  for (const int64_t width : {int64_t{1}, int64_t{2}, int64_t{17}, int64_t{64}}) {
    CHECK_EQ(HashTable(Options(width)).row_bytes(), 20 + 4 * width);
  }
  struct Case {
    int64_t width;
    RowStorage storage;
    int64_t compact_cols;
    int64_t bytes;  // as hash_table.h's examples state
  };
  for (const Case c : {Case{17, RowStorage::kBFloat16, 16, 56}, Case{32, RowStorage::kFloat16, 32, 84},
                       Case{16, RowStorage::kInt8Row, 16, 40}, Case{17, RowStorage::kFloat32, 16, 88},
                       Case{64, RowStorage::kBFloat16, 3, 20 + 8 + 4 * 61}}) {
    const HashTable t(CompactOptions(c.width, c.storage, c.compact_cols));
    CHECK_EQ(t.row_bytes(), c.bytes);
    CHECK_EQ(t.row_bytes(), 20 +
                                CompactBytes(c.storage == RowStorage::kFloat32 ? RowStorage::kFloat32 : c.storage,
                                             c.storage == RowStorage::kFloat32 ? 0 : c.compact_cols) +
                                4 * (c.width - (c.storage == RowStorage::kFloat32 ? 0 : c.compact_cols)));
  }
  // The stride is what a key's row costs: memory_bytes() grows by about that
  // plus the index share per key (8-byte slots at a load between 0.4 and 0.8).
  const int64_t width = 24, n = 200000;
  HashTable t(Options(width, 2));
  const int64_t empty = t.memory_bytes();
  const TierRows r = MakeTierRows(n, width, 3);
  t.Import(r.keys.data(), n, 0, width, r.rows.data(), nullptr, nullptr, nullptr, InlineParallelFor());
  const double per_key = static_cast<double>(t.memory_bytes() - empty) / n;
  std::printf("  width %lld: row_bytes %lld, memory %.1f B/key\n", static_cast<long long>(width),
              static_cast<long long>(t.row_bytes()), per_key);
  CHECK_GE(per_key, static_cast<double>(t.row_bytes()) + 8 / 0.8);
  CHECK_LE(per_key, static_cast<double>(t.row_bytes()) * 1.05 + 8 / 0.4 + 1);
}

// Evacuate hands sink each matching key's row (all columns, a compact row
// decoded) and metadata exactly as stored, removes those keys and only
// those, and importing the handed-over rows back restores the table bit for
// bit (a decoded bf16/fp16 row re-encodes to the same bits).
TFEXT_TEST(EvacuateHandsOverExactRowsAndRemovesThem) {
  struct Case {
    RowStorage storage;
    int64_t compact_cols;
  };
  const int64_t width = 24, n = 20000;
  for (const Case c : {Case{RowStorage::kFloat32, 0}, Case{RowStorage::kBFloat16, 16}, Case{RowStorage::kFloat16, 24},
                       Case{RowStorage::kInt8Row, 16}}) {
    std::printf("  %s, compact_cols %lld\n", StorageName(c.storage), static_cast<long long>(c.compact_cols));
    // Stochastic rounding where the storage takes it: the hand-over must not
    // depend on how a row was rounded when written.
    const Rounding rounding = c.storage == RowStorage::kInt8Row ? Rounding::kNearest : Rounding::kStochastic;
    HashTable t(CompactOptions(width, c.storage, c.compact_cols, rounding, 3));
    const TierRows r = MakeTierRows(n, width, 11);
    t.Import(r.keys.data(), n, 0, width, r.rows.data(), nullptr, r.versions.data(), r.freqs.data(), PoolParallelFor());
    const std::map<int64_t, Entry> before = Snapshot(t);
    const auto doomed = [](int64_t key, const KeyMeta& m) { return m.version < 300 || (key & 7) == 3; };
    int64_t expected = 0;
    for (const auto& kv : before) {
      KeyMeta m;
      m.version = kv.second.version;
      m.frequency = kv.second.frequency;
      expected += doomed(kv.first, m) ? 1 : 0;
    }
    CHECK_GT(expected, n / 5);
    CHECK_LT(expected, n * 4 / 5);

    // Nothing matches: nothing removed, no reference voided.
    const uint64_t epoch = t.removal_epoch();
    int64_t cursor = 0, seen = 0;
    CHECK_EQ(t.Evacuate(
                 n, &cursor, [&](int64_t, const KeyMeta&) { return ++seen, false; },
                 [](int64_t, const float*, const KeyMeta&) { CHECK(false); }),
             int64_t{0});
    CHECK_EQ(seen, n);  // a call that removes fewer than max_keys looks at every key
    CHECK_EQ(t.removal_epoch(), epoch);

    std::map<int64_t, Entry> sunk;
    cursor = 0;
    const int64_t removed = t.Evacuate(n, &cursor, doomed, [&](int64_t key, const float* row, const KeyMeta& m) {
      Entry e;
      e.row.assign(row, row + width);
      e.version = m.version;
      e.frequency = m.frequency;
      CHECK(sunk.emplace(key, e).second);  // each key once
    });
    CHECK_EQ(removed, expected);
    CHECK_EQ(static_cast<int64_t>(sunk.size()), expected);
    CHECK(t.removal_epoch() != epoch);
    CHECK_EQ(t.size(), n - expected);
    CHECK_EQ(t.CheckInvariants(), std::string());
    const std::map<int64_t, Entry> after = Snapshot(t);
    for (const auto& kv : before) {
      KeyMeta m;
      m.version = kv.second.version;
      m.frequency = kv.second.frequency;
      const bool gone = doomed(kv.first, m);
      CHECK_EQ(after.count(kv.first), size_t{gone ? 0u : 1u});
      CHECK_EQ(sunk.count(kv.first), size_t{gone ? 1u : 0u});
      const Entry& e = gone ? sunk.at(kv.first) : after.at(kv.first);
      CHECK(SameBits(e.row, kv.second.row));  // the decoded row as Export reads it
      CHECK_EQ(e.version, kv.second.version);
      CHECK_EQ(e.frequency, kv.second.frequency);
    }
    // A second call finds nothing left to take.
    CHECK_EQ(t.Evacuate(n, &cursor, doomed, [](int64_t, const float*, const KeyMeta&) { CHECK(false); }), int64_t{0});

    // Back in: the table is what it was (int8 rows are re-quantized, so only
    // the other storages promise the same bits).
    std::vector<int64_t> keys;
    std::vector<float> rows;
    std::vector<int64_t> versions;
    std::vector<uint32_t> freqs;
    for (const auto& kv : sunk) {
      keys.push_back(kv.first);
      rows.insert(rows.end(), kv.second.row.begin(), kv.second.row.end());
      versions.push_back(kv.second.version);
      freqs.push_back(kv.second.frequency);
    }
    t.Import(keys.data(), expected, 0, width, rows.data(), nullptr, versions.data(), freqs.data(), PoolParallelFor());
    if (c.storage != RowStorage::kInt8Row) {
      CHECK(Snapshot(t) == before);
      const std::map<int64_t, Entry> restored = Snapshot(t);
      for (const auto& kv : before) CHECK(SameBits(restored.at(kv.first).row, kv.second.row));
    } else {
      CHECK_EQ(Snapshot(t).size(), before.size());
    }
    CHECK_EQ(t.CheckInvariants(), std::string());
  }
}

// A pred or sink that throws: the keys sink already took are gone from the
// table, the key that threw and every other key stay, the table is sound.
TFEXT_TEST(EvacuateThatThrowsKeepsEveryRowInOnePlace) {
  const int64_t width = 3, n = 3000;
  for (const bool in_sink : {false, true}) {
    HashTable t(Options(width, 0));
    const TierRows r = MakeTierRows(n, width, 5);
    t.Import(r.keys.data(), n, 0, width, r.rows.data(), nullptr, r.versions.data(), r.freqs.data(), PoolParallelFor());
    std::vector<int64_t> taken;
    int64_t thrower = 0;
    int64_t cursor = 0;
    bool threw = false;
    try {
      t.Evacuate(
          n, &cursor,
          [&](int64_t key, const KeyMeta&) {
            if (!in_sink && taken.size() == 5) {
              thrower = key;
              throw std::runtime_error("pred");
            }
            return true;
          },
          [&](int64_t key, const float*, const KeyMeta&) {
            if (in_sink && taken.size() == 5) {
              thrower = key;
              throw std::runtime_error("sink");
            }
            taken.push_back(key);
          });
    } catch (const std::runtime_error&) {
      threw = true;
    }
    CHECK(threw);
    CHECK_EQ(taken.size(), size_t{5});
    CHECK_EQ(t.size(), n - 5);
    std::unique_ptr<bool[]> found(new bool[6]);
    taken.push_back(thrower);
    t.FindMeta(taken.data(), 6, std::vector<KeyMeta>(6).data(), found.get(), InlineParallelFor());
    for (int i = 0; i < 5; ++i) CHECK(!found[i]);
    CHECK(found[5]);
    CHECK_EQ(t.CheckInvariants(), std::string());
  }
}

// Many small calls sweep the table: each resumes where the last stopped
// (its shard is *cursor % num_shards), every matching key is handed over
// exactly once, each call takes exactly min(max_keys, what is left), and the
// sweep reads each row about once (not a shard's head again every call).
TFEXT_TEST(EvacuateResumesAtTheCursorAndSweepsEveryKeyOnce) {
  const int64_t width = 2, n = 30000;
  const int shard_bits = 3;
  for (const int64_t max_keys : {int64_t{1}, int64_t{97}, int64_t{4096}}) {
    for (const bool all : {true, false}) {
      HashTable t(Options(width, shard_bits));
      const TierRows r = MakeTierRows(n, width, 21);
      t.Import(r.keys.data(), n, 0, width, r.rows.data(), nullptr, r.versions.data(), r.freqs.data(),
               InlineParallelFor());
      if (max_keys == 1 && all) {
        std::vector<int64_t> from_keys(HashTableTestPeer::NumShards(t), 0);
        for (const int64_t k : r.keys) ++from_keys[ShardOf(k, shard_bits)];
        CHECK(ShardSizesFromIndex(t) == from_keys);  // ShardOf is the table's shard
      }
      const auto match = [&](int64_t key) { return all || (key & 3) == 1; };
      int64_t matching = 0;
      for (const int64_t k : r.keys) matching += match(k) ? 1 : 0;
      std::set<int64_t> handed;
      int64_t pred_calls = 0, calls = 0, cursor = 0;
      for (;;) {
        int64_t last_shard = -1;
        const int64_t left = matching - static_cast<int64_t>(handed.size());
        const int64_t got = t.Evacuate(
            max_keys, &cursor,
            [&](int64_t key, const KeyMeta&) {
              ++pred_calls;
              return match(key);
            },
            [&](int64_t key, const float*, const KeyMeta&) {
              CHECK(handed.insert(key).second);
              last_shard = ShardOf(key, shard_bits);
            });
        ++calls;
        CHECK_EQ(got, std::min(max_keys, left));
        CHECK_GE(cursor, int64_t{0});
        if (got == max_keys) {
          // Stopped in the shard of the last key it took: the next call resumes there.
          CHECK_EQ(cursor % HashTableTestPeer::NumShards(t), last_shard);
        }
        if (got < max_keys) break;
      }
      CHECK_EQ(static_cast<int64_t>(handed.size()), matching);
      CHECK_EQ(t.size(), n - matching);
      for (const int64_t k : r.keys) CHECK_EQ(handed.count(k), size_t{match(k) ? 1u : 0u});
      CHECK_EQ(t.CheckInvariants(), std::string());
      // Each filled call resumes where the last one stopped (at the start of
      // its last key's cluster): the sweep reads the table about once, plus
      // the closing call's full round (up to one more) and a short cluster
      // per call -- not a shard's head again every call (~calls * n / 16:
      // 2.5 n at 4096 keys a call, 5 n at 97, 470 n at 1).
      std::printf("  max_keys %lld, %s: %lld calls, pred saw %.2f x the keys\n", static_cast<long long>(max_keys),
                  all ? "all keys" : "a quarter", static_cast<long long>(calls), static_cast<double>(pred_calls) / n);
      CHECK_GE(pred_calls, n);
      CHECK_LE(pred_calls, max_keys == 4096 ? 2 * n : 3 * n);
    }
  }
  // A cursor from elsewhere (negative, or past every shard's index) is a
  // start like any other: the call still looks at every key.
  for (const int64_t start : {int64_t{-5}, int64_t{1} << 40}) {
    HashTable t(Options(width, shard_bits));
    const TierRows r = MakeTierRows(1000, width, 22);
    t.Import(r.keys.data(), 1000, 0, width, r.rows.data(), nullptr, nullptr, nullptr, InlineParallelFor());
    int64_t cursor = start, seen = 0;
    std::set<int64_t> keys_seen;
    CHECK_EQ(t.Evacuate(
                 10, &cursor,
                 [&](int64_t key, const KeyMeta&) {
                   ++seen;
                   keys_seen.insert(key);
                   return false;
                 },
                 [](int64_t, const float*, const KeyMeta&) {}),
             int64_t{0});
    CHECK_EQ(keys_seen.size(), size_t{1000});
    CHECK_LE(seen, int64_t{2000});
  }
}

// Evacuate frees rows: references a FindOrInsertWith made before it are not
// used (the epoch moved), and UpdateRows' results equal Update's on a table
// from which the same keys were removed.
TFEXT_TEST(EvacuateVoidsRowReferences) {
  const int64_t width = 6, n = 5000;
  HashTable a(Options(width, 2)), b(Options(width, 2));
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i * 7 - 9000;
  const auto fill = [&](const int64_t* index, float* const* dst, int64_t count) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t c = 0; c < 3; ++c) dst[j][c] = static_cast<float>(keys[index[j]] % 31) + 0.5f * c;
    }
  };
  const auto apply = [&](int64_t i, float* row, KeyMeta* meta) {
    for (int64_t c = 0; c < width; ++c) row[c] += 0.25f * static_cast<float>(i % 5) + c;
    meta->version = 40 + i % 3;
  };
  std::vector<uint64_t> refs(n);
  const uint64_t epoch = a.removal_epoch();
  a.FindOrInsertWith(keys.data(), n, 0, 3, fill, nullptr, nullptr, nullptr, true, 3, PoolParallelFor(), refs.data());
  b.FindOrInsertWith(keys.data(), n, 0, 3, fill, nullptr, nullptr, nullptr, true, 3, PoolParallelFor());
  std::vector<int64_t> moved;
  int64_t cursor = 0;
  CHECK_EQ(a.Evacuate(
               300, &cursor, [](int64_t key, const KeyMeta&) { return key % 2 == 0; },
               [&](int64_t key, const float*, const KeyMeta&) { moved.push_back(key); }),
           int64_t{300});
  CHECK(a.removal_epoch() != epoch);
  CHECK_EQ(b.Remove(moved.data(), 300, InlineParallelFor()), int64_t{300});
  CHECK_EQ(a.UpdateRows(keys.data(), refs.data(), epoch, n, nullptr, apply, PoolParallelFor()), int64_t{0});
  b.Update(keys.data(), n, nullptr, apply, PoolParallelFor());
  CHECK(Snapshot(a) == Snapshot(b));  // the moved keys came back as new rows, in both
  CHECK_EQ(a.size(), n);
  CHECK_EQ(a.CheckInvariants(), std::string());
}

// Evacuate beside writers and readers: every row is in exactly one place
// (the table or the sink) with its exact contents, a reader never sees a
// torn or foreign row, and the index stays sound throughout.
TFEXT_TEST(ConcurrentEvacuateKeepsEveryRowInOnePlace) {
  const int64_t width = 4;
  const int kWriters = 2;
  const int64_t kKeysPerWriter = 40000, kBatch = 400;
  HashTable t(Options(width, 3));
  const auto row_of = [](int64_t key, int64_t c) { return static_cast<float>(key % 1000) + 0.125f * c; };
  const auto key_of = [](int writer, int64_t i) { return (i * kWriters + writer) * 13 + 5; };
  std::mutex sink_mu;
  std::map<int64_t, Entry> sunk;
  std::atomic<bool> failed{false};
  std::atomic<int> writers_left{kWriters};
  std::atomic<int64_t> inserted{0};
  const auto pred = [](int64_t key, const KeyMeta& m) { return key % 3 != 0 && m.version % 4 != 1; };
  const auto sink = [&](int64_t key, const float* row, const KeyMeta& m) {
    Entry e;
    e.row.assign(row, row + width);
    e.version = m.version;
    e.frequency = m.frequency;
    std::lock_guard<std::mutex> lock(sink_mu);
    if (!sunk.emplace(key, e).second) failed = true;  // handed over twice
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      const ParallelFor pf = w == 0 ? PoolParallelFor() : InlineParallelFor();
      std::vector<int64_t> keys(kBatch);
      std::vector<float> rows(kBatch * width);
      for (int64_t b = 0; b < kKeysPerWriter / kBatch; ++b) {
        for (int64_t i = 0; i < kBatch; ++i) {
          keys[i] = key_of(w, b * kBatch + i);
          for (int64_t c = 0; c < width; ++c) rows[i * width + c] = row_of(keys[i], c);
        }
        t.Insert(keys.data(), kBatch, 0, width, rows.data(), nullptr, true, b, pf);
        inserted += kBatch;
      }
      --writers_left;
    });
  }
  // Readers: random keys of either writer, found or not; a found row is its key's.
  threads.emplace_back([&] {
    std::mt19937_64 rng(8);
    std::vector<int64_t> keys(256);
    std::vector<float> out(256 * width);
    std::vector<KeyMeta> meta(256);
    std::unique_ptr<bool[]> found(new bool[256]);
    for (int round = 0; writers_left.load() > 0; ++round) {
      for (int64_t& k : keys)
        k = key_of(static_cast<int>(rng() % kWriters), static_cast<int64_t>(rng() % kKeysPerWriter));
      t.Find(keys.data(), 256, 0, width, out.data(), found.get(), nullptr, InlineParallelFor());
      for (int64_t i = 0; i < 256; ++i) {
        if (!found[i]) continue;
        for (int64_t c = 0; c < width; ++c) {
          if (out[i * width + c] != row_of(keys[i], c)) failed = true;
        }
      }
      t.FindMeta(keys.data(), 256, meta.data(), found.get(), InlineParallelFor());
      for (int64_t i = 0; i < 256; ++i) {
        if (found[i] && meta[i].frequency != 1) failed = true;
      }
      if (round % 64 == 0 && !t.CheckInvariants().empty()) failed = true;
    }
  });
  // Evacuators: two sweeps of their own, small calls, racing each other.
  for (int e = 0; e < 2; ++e) {
    threads.emplace_back([&, e] {
      int64_t cursor = e * 5;
      while (writers_left.load() > 0) t.Evacuate(e == 0 ? 64 : 1000, &cursor, pred, sink);
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(!failed.load());
  CHECK_EQ(inserted.load(), kWriters * kKeysPerWriter);
  const size_t during = sunk.size();
  // A last sweep takes what the race left behind.
  int64_t cursor = 0;
  t.Evacuate(kWriters * kKeysPerWriter, &cursor, pred, sink);
  CHECK_EQ(t.CheckInvariants(), std::string());
  const std::map<int64_t, Entry> left = Snapshot(t);
  CHECK_EQ(static_cast<int64_t>(left.size() + sunk.size()), kWriters * kKeysPerWriter);
  int64_t matching = 0;
  for (int w = 0; w < kWriters; ++w) {
    for (int64_t i = 0; i < kKeysPerWriter; ++i) {
      const int64_t key = key_of(w, i);
      const auto in_table = left.find(key);
      const auto in_sink = sunk.find(key);
      CHECK((in_table == left.end()) != (in_sink == sunk.end()));  // exactly one place
      const Entry& e = in_table != left.end() ? in_table->second : in_sink->second;
      KeyMeta m;
      m.version = e.version;
      CHECK_EQ(e.version, i / kBatch);
      CHECK_EQ(e.frequency, 1u);
      for (int64_t c = 0; c < width; ++c) CHECK_EQ(e.row[c], row_of(key, c));
      CHECK_EQ(in_sink != sunk.end(), pred(key, m));  // every match taken, nothing else
      matching += pred(key, m) ? 1 : 0;
    }
  }
  CHECK_EQ(static_cast<int64_t>(sunk.size()), matching);
  std::printf("  %zu of %zu rows moved out while the writers ran\n", during, sunk.size());
}

// SampleMeta: min(size, max_samples) entries, each shard contributing in
// proportion to its keys (within one), the same samples on every call, and
// spread enough that a quantile of the samples estimates the table's.
TFEXT_TEST(SampleMetaSpreadsOverShardsAndIsDeterministic) {
  const int shard_bits = 4;
  const int64_t n = 100000;
  HashTable t(Options(1, shard_bits));
  std::vector<KeyMeta> samples;
  t.SampleMeta(100, &samples);
  CHECK(samples.empty());
  std::vector<int64_t> keys(n), versions(n);
  std::vector<uint32_t> freqs(n);
  std::vector<float> rows(n, 1.f);
  std::mt19937_64 rng(9);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = static_cast<int64_t>(rng());
    versions[i] = ShardOf(keys[i], shard_bits);   // which shard a sample came from
    freqs[i] = static_cast<uint32_t>(rng() % n);  // a uniform value to estimate quantiles of
  }
  t.Import(keys.data(), n, 0, 1, rows.data(), nullptr, versions.data(), freqs.data(), PoolParallelFor());
  const std::vector<int64_t> shard_sizes = ShardSizesFromIndex(t);
  {
    std::vector<int64_t> from_keys(shard_sizes.size(), 0);
    for (const int64_t k : keys) ++from_keys[ShardOf(k, shard_bits)];
    CHECK(shard_sizes == from_keys);
  }
  for (const int64_t max_samples : {int64_t{1}, int64_t{37}, int64_t{1000}, int64_t{4096}}) {
    t.SampleMeta(max_samples, &samples);
    CHECK_EQ(static_cast<int64_t>(samples.size()), max_samples);
    std::vector<int64_t> per_shard(shard_sizes.size(), 0);
    for (const KeyMeta& m : samples) ++per_shard[m.version];
    for (size_t s = 0; s < shard_sizes.size(); ++s) {
      const double expected = static_cast<double>(max_samples) * shard_sizes[s] / n;
      CHECK_LE(std::fabs(static_cast<double>(per_shard[s]) - expected), 1.0);
    }
    std::vector<KeyMeta> again;
    t.SampleMeta(max_samples, &again);
    CHECK_EQ(again.size(), samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      CHECK_EQ(again[i].version, samples[i].version);
      CHECK_EQ(again[i].frequency, samples[i].frequency);
    }
  }
  // The tenth-percentile of 1000 samples is near the table's.
  t.SampleMeta(1000, &samples);
  std::vector<uint32_t> f;
  for (const KeyMeta& m : samples) f.push_back(m.frequency);
  std::sort(f.begin(), f.end());
  CHECK_LE(std::fabs(static_cast<double>(f[100]) - 0.1 * n), 0.04 * n);
  // More samples asked for than keys: every key's metadata, once; and a
  // previous content of *out is replaced.
  HashTable small(Options(1, shard_bits));
  small.Import(keys.data(), 500, 0, 1, rows.data(), nullptr, versions.data(), freqs.data(), InlineParallelFor());
  small.SampleMeta(100000, &samples);
  CHECK_EQ(samples.size(), size_t{500});
  std::multiset<uint32_t> got, want(freqs.begin(), freqs.begin() + 500);
  for (const KeyMeta& m : samples) got.insert(m.frequency);
  CHECK(got == want);
  small.SampleMeta(0, &samples);
  CHECK(samples.empty());
}

// In a debug-check build a damaged index stops the process at the first
// operation that meets it, naming the broken invariant, instead of reading
// memory out of bounds. The optimized build has no checks to run here.
TFEXT_TEST(DebugChecksStopAtADamagedIndex) {
  std::printf("  debug checks %s in this build\n", tfext::table::kDebugChecks ? "on" : "off");
  if (!tfext::table::kDebugChecks) return;
  std::fflush(nullptr);
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    HashTable t(Options(1, 0));
    const int64_t key = 42;
    const float one = 1.f;
    t.Insert(&key, 1, 0, 1, &one, nullptr, false, -1, InlineParallelFor());
    uint64_t capacity = 0;
    uint64_t* slots = HashTableTestPeer::Slots(t, 0, &capacity);
    for (uint64_t p = 0; p < capacity; ++p) {
      if (slots[p] != 0) slots[p] = (slots[p] & ~uint64_t{0xFFFFFFFFu}) | 0xFFFFFFF0u;  // row id out of the arena
    }
    float out = 0.f;
    t.Find(&key, 1, 0, 1, &out, nullptr, nullptr, InlineParallelFor());
    _exit(0);  // not reached: the check aborts
  }
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
