// Helpers for the host tests of the CUDA table's code (BucketTable<HostBackend>): whole-table snapshots of the GPU
// table and of the CPU core in one form, so that a test compares them with ==, table options in one line (and the
// CPU core's for the same rows), and
// random batches that repeat keys and name the keys a table might reserve. Used
// by the table's own test (bucket_table_host_test.cc) and the embedding layer's (gpu_embedding_host_test.cc).

#ifndef TENSORFLOW_EXT_TABLE_GPU_BUCKET_TABLE_TEST_UTIL_H_
#define TENSORFLOW_EXT_TABLE_GPU_BUCKET_TABLE_TEST_UTIL_H_

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/gpu/bucket_table.h"
#include "tensorflow_ext/table/gpu/host_backend.h"

namespace tfext {
namespace table {
namespace gpu {
namespace testing {

using HostTable = BucketTable<HostBackend>;

// One key's entry: its whole row and metadata.
struct Entry {
  std::vector<float> row;
  int64_t version = 0;
  uint32_t frequency = 0;
  bool operator==(const Entry& o) const { return row == o.row && version == o.version && frequency == o.frequency; }
};

inline std::map<int64_t, Entry> Snapshot(HostTable& t) {
  GpuTableStats s;
  CHECK_EQ(t.Stats(&s), "");
  const int64_t w = t.width();
  std::vector<int64_t> keys(s.size), versions(s.size);
  std::vector<float> rows(s.size * w);
  std::vector<uint32_t> freqs(s.size);
  int64_t n = -1;
  CHECK_EQ(t.Export(0, w, s.size, keys.data(), rows.data(), versions.data(), freqs.data(), &n), "");
  CHECK_EQ(n, s.size);
  std::map<int64_t, Entry> out;
  for (int64_t i = 0; i < n; ++i) {
    Entry e{std::vector<float>(rows.begin() + i * w, rows.begin() + (i + 1) * w), versions[i], freqs[i]};
    CHECK(out.emplace(keys[i], e).second);  // no key twice
  }
  return out;
}

inline std::map<int64_t, Entry> Snapshot(const HashTable& t) {
  std::vector<int64_t> keys, versions;
  std::vector<float> rows;
  std::vector<uint32_t> freqs;
  const int64_t w = t.width();
  t.Export(0, w, [&](int64_t n) {
    keys.resize(n);
    rows.resize(n * w);
    versions.resize(n);
    freqs.resize(n);
    return HashTable::ExportBuffers{keys.data(), rows.data(), versions.data(), freqs.data()};
  });
  std::map<int64_t, Entry> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    out[keys[i]] = Entry{std::vector<float>(rows.begin() + i * w, rows.begin() + (i + 1) * w), versions[i], freqs[i]};
  }
  return out;
}

inline GpuTableOptions Options(int64_t width, int64_t initial = 0, int64_t cap_limit = 0,
                               EvictPolicy policy = EvictPolicy::kLru) {
  GpuTableOptions o;
  o.width = width;
  o.initial_capacity = initial;
  o.capacity_limit = cap_limit;
  o.policy = policy;
  return o;
}

inline GpuTableOptions CompactOptions(int64_t width, RowStorage storage, int64_t compact_cols, Rounding rounding) {
  GpuTableOptions o = Options(width);
  o.storage = storage;
  o.compact_cols = compact_cols;
  o.rounding = rounding;
  return o;
}

// The CPU core's options for the same rows (width and row storage) as a GPU table's.
inline TableOptions CoreOptions(const GpuTableOptions& o) {
  TableOptions co;
  co.width = o.width;
  co.storage = o.storage;
  co.compact_cols = o.compact_cols;
  co.rounding = o.rounding;
  return co;
}

// Keys from a small pool (so batches repeat keys and hit earlier ones), with the values a table might reserve.
inline std::vector<int64_t> RandomKeys(std::mt19937_64& rng, int64_t n, int64_t pool) {
  constexpr int64_t kMinKey = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMaxKey = std::numeric_limits<int64_t>::max();
  const int64_t special[] = {kMinKey, kMaxKey, -1, 0, kMinKey + 1, 1};
  std::vector<int64_t> keys(n);
  for (auto& k : keys) {
    const uint64_t r = rng();
    k = (r % 17 == 0) ? special[r % 6] : static_cast<int64_t>(SplitMix64(r % pool));
  }
  return keys;
}

}  // namespace testing
}  // namespace gpu
}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_GPU_BUCKET_TABLE_TEST_UTIL_H_
