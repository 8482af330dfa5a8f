// The CUDA table's per-key code (bucket_table.h) run on host threads (HostBackend) and checked against the CPU
// core (hash_table.h) and plain references: the same claims, probes, dedup, eviction, growth and element-wise
// updates that the device runs, with real concurrency, in the CPU test suite. New rows and updates come from the
// test functors below (the embedding layer's initializers and optimizers are checked in
// embedding/kernels/gpu/gpu_embedding_host_test.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/gpu/bucket_table.h"
#include "tensorflow_ext/table/gpu/bucket_table_test_util.h"
#include "tensorflow_ext/table/gpu/host_backend.h"

namespace {

using tfext::table::HashTable;
using tfext::table::InlineParallelFor;
using tfext::table::KeyMeta;
using tfext::table::SplitMix64;
using tfext::table::TableOptions;
using tfext::table::gpu::EvictPolicy;
using tfext::table::gpu::GpuTableOptions;
using tfext::table::gpu::GpuTableStats;
using tfext::table::gpu::HostBackend;
using tfext::table::gpu::testing::Options;
using tfext::table::gpu::testing::RandomKeys;
using tfext::table::gpu::testing::Snapshot;

using Table = tfext::table::gpu::testing::HostTable;

// New keys' initial columns (FindOrInsertWith's init): a function of the key and the seed alone, as an embedding
// initializer's, different in every column (multiples of 2^-20 in [-8, 8): exact floats).
struct KeyRow {
  uint64_t seed;
  int64_t cols;
  void operator()(int64_t /*first*/, int64_t key, float* dst) const {
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t bits = SplitMix64(static_cast<uint64_t>(key) + 31 * seed + static_cast<uint64_t>(c)) >> 40;
      dst[c] = static_cast<float>(bits) / 1048576.0f - 8.0f;
    }
  }
};

// The same rows for the CPU core's FindOrInsertWith.
HashTable::InitRows CpuInit(const KeyRow& init, const int64_t* keys) {
  return [init, keys](const int64_t* index, float* const* dst, int64_t count) {
    for (int64_t j = 0; j < count; ++j) init(index[j], keys[index[j]], dst[j]);
  };
}

struct ConstantRow {
  float value;
  int64_t cols;
  void operator()(int64_t /*first*/, int64_t /*key*/, float* dst) const {
    for (int64_t c = 0; c < cols; ++c) dst[c] = value;
  }
};

// An element-wise update (Update's fn) that reads and writes two columns of its own (j and j + cols), as a fused
// optimizer step with one slot: slot += g * g; var -= g * slot.
struct SquareAndStep {
  const float* grads;  // [n, cols]
  int64_t cols;
  void operator()(int64_t i, int64_t j, float* row) const {
    const float g = grads[i * cols + j];
    row[cols + j] += g * g;
    row[j] -= g * row[cols + j];
  }
};

// Every operation of a growing table against the CPU core, on random batches with duplicates and the
// reserved-looking keys, from a tiny table (many rehashes under load) to a few thousand keys.
TFEXT_TEST(RandomOperationsMatchTheCpuCore) {
  const int64_t w = 6;
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(Options(w)), "");
  TableOptions co;
  co.width = w;
  HashTable c(co);
  const auto pf = InlineParallelFor();
  std::mt19937_64 rng(7);
  const uint64_t init_seed = 11;
  const std::vector<float> defaults = {-1, -2, -3, -4, -5, -6};
  int64_t version = 0;
  for (int round = 0; round < 60; ++round) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 400);
    const std::vector<int64_t> keys = RandomKeys(rng, n, 3000);
    const int64_t col_begin = static_cast<int64_t>(rng() % 3), cols = 1 + static_cast<int64_t>(rng() % (w - col_begin));
    ++version;
    const int op = static_cast<int>(rng() % 5);
    if (op == 0) {  // FindOrInsert with an initializer
      std::vector<float> go(n * cols), co_out(n * cols);
      std::vector<uint8_t> gi(n);
      std::vector<char> ci(n);
      const KeyRow row_init{init_seed, cols};
      CHECK_EQ(g.FindOrInsertWith(keys.data(), n, col_begin, cols, row_init, defaults.data(), go.data(), gi.data(),
                                  true, version),
               "");
      c.FindOrInsertWith(keys.data(), n, col_begin, cols, CpuInit(row_init, keys.data()), defaults.data(),
                         co_out.data(), reinterpret_cast<bool*>(ci.data()), true, version, pf);
      CHECK(go == co_out);
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(static_cast<int>(gi[i]), static_cast<int>(ci[i]));
    } else if (op == 1) {  // Insert: the last occurrence wins
      std::vector<float> vals(n * cols);
      for (auto& v : vals) v = static_cast<float>(rng() % 1000) / 8.0f;
      CHECK_EQ(g.Insert(keys.data(), n, col_begin, cols, vals.data(), defaults.data(), round % 2 == 0, version), "");
      c.Insert(keys.data(), n, col_begin, cols, vals.data(), defaults.data(), round % 2 == 0, version, pf);
    } else if (op == 2) {  // Accumulate (small integers: exact in any order of addition)
      std::vector<float> deltas(n * cols);
      for (auto& v : deltas) v = static_cast<float>(static_cast<int>(rng() % 9) - 4);
      const bool insert_missing = round % 3 != 0;
      CHECK_EQ(g.Accumulate(keys.data(), n, col_begin, cols, deltas.data(), defaults.data(), insert_missing, true, -1),
               "");
      c.Accumulate(keys.data(), n, col_begin, cols, deltas.data(), defaults.data(), insert_missing, true, -1, pf);
    } else if (op == 3) {  // Remove
      int64_t removed = -1;
      CHECK_EQ(g.Remove(keys.data(), n / 4 + 1, &removed), "");
      CHECK_EQ(removed, c.Remove(keys.data(), n / 4 + 1, pf));
    } else {  // Find with and without a default row
      std::vector<float> go(n * cols, 42.0f), co_out(n * cols, 42.0f);
      std::vector<uint8_t> gf(n);
      std::vector<char> cf(n);
      const float* def = round % 2 ? defaults.data() : nullptr;
      CHECK_EQ(g.Find(keys.data(), n, col_begin, cols, go.data(), gf.data(), def), "");
      c.Find(keys.data(), n, col_begin, cols, co_out.data(), reinterpret_cast<bool*>(cf.data()), def, pf);
      CHECK(go == co_out);
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(static_cast<int>(gf[i]), static_cast<int>(cf[i]));
    }
    GpuTableStats s;
    CHECK_EQ(g.Stats(&s), "");
    CHECK_EQ(s.size, c.size());
    CHECK_EQ(s.failed, 0);
  }
  CHECK(Snapshot(g) == Snapshot(c));
  GpuTableStats s;
  CHECK_EQ(g.Stats(&s), "");
  CHECK_GT(s.capacity, 128);  // it grew
  CHECK_EQ(g.Clear(), "");
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, 0);
  CHECK(Snapshot(g).empty());
}

// A batch of keys the table holds does not grow it, however close to the load limit; new keys past it do.
TFEXT_TEST(OnlyNewKeysGrowTheTable) {
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(Options(1)), "");  // 128 slots, rehash past 96 used
  std::vector<int64_t> keys(90);
  std::vector<float> vals(90, 1.0f);
  for (int64_t i = 0; i < 90; ++i) keys[i] = i * 1000003;
  CHECK_EQ(g.Insert(keys.data(), 90, 0, 1, vals.data(), nullptr, false, -1), "");
  CHECK_EQ(g.capacity(), 128);
  for (int r = 0; r < 3; ++r) CHECK_EQ(g.Insert(keys.data(), 90, 0, 1, vals.data(), nullptr, false, -1), "");
  CHECK_EQ(g.Accumulate(keys.data(), 90, 0, 1, vals.data(), nullptr, true, false, -1), "");
  CHECK_EQ(g.capacity(), 128);
  keys.push_back(-5);
  keys.push_back(-6);
  keys.push_back(-7);
  keys.push_back(-8);
  keys.push_back(-9);
  keys.push_back(-10);
  keys.push_back(-11);
  vals.resize(keys.size(), 2.0f);
  CHECK_EQ(g.Insert(keys.data(), keys.size(), 0, 1, vals.data(), nullptr, false, -1), "");
  CHECK_EQ(g.capacity(), 256);
  CHECK_EQ(static_cast<int64_t>(Snapshot(g).size()), 97);
}

// Growing tables count claims after each pass (CountIf over the inserted flags), not in the claim: size and used
// follow every writing operation (duplicates in a batch count once), removals leave used, a rehash drops them.
TFEXT_TEST(CountsFollowClaimsRemovalsAndRehash) {
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(Options(4)), "");  // 128 slots
  GpuTableStats s;
  std::vector<int64_t> keys = {5, 6, 7, 5, 6, 8};  // 4 distinct
  std::vector<float> vals(keys.size() * 4, 1.0f);
  CHECK_EQ(g.Insert(keys.data(), keys.size(), 0, 4, vals.data(), nullptr, false, -1), "");
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, 4);
  CHECK_EQ(s.used, 4);
  std::vector<float> out(keys.size() * 4);
  std::vector<int64_t> more = {8, 9, 9, 10};  // 2 new
  CHECK_EQ(g.FindOrInsertWith(more.data(), more.size(), 0, 4, KeyRow{3, 4}, nullptr, out.data(), nullptr, false, -1),
           "");
  CHECK_EQ(g.Accumulate(more.data(), more.size(), 0, 4, vals.data(), nullptr, true, false, -1), "");  // none new
  std::vector<int64_t> acc = {11, 11};  // 1 new through accumulate's insert_missing
  CHECK_EQ(g.Accumulate(acc.data(), acc.size(), 0, 4, vals.data(), nullptr, true, false, -1), "");
  std::vector<int64_t> applied = {12, 5};  // 1 new through the update
  std::vector<float> grads(2 * 2, 0.5f);
  CHECK_EQ(g.Update(applied.data(), 2, 2, SquareAndStep{grads.data(), 2}, nullptr, -1), "");
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, 8);
  CHECK_EQ(s.used, 8);
  int64_t removed = 0;
  CHECK_EQ(g.Remove(keys.data(), 3, &removed), "");  // 5, 6, 7
  CHECK_EQ(removed, 3);
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, 5);
  CHECK_EQ(s.used, 8);
  CHECK_EQ(g.Reserve(1000), "");  // rehash: removed slots dropped
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, 5);
  CHECK_EQ(s.used, 5);
  CHECK_EQ(static_cast<int64_t>(Snapshot(g).size()), 5);
}

// Many threads claiming at once: every distinct key lands once, duplicates read the row of their key.
TFEXT_TEST(ConcurrentClaimsStoreEachKeyOnce) {
  Table g(HostBackend{8});
  CHECK_EQ(g.Init(Options(2, 1000)), "");
  std::mt19937_64 rng(3);
  const int64_t n = 200000;
  std::vector<int64_t> keys(n);
  for (auto& k : keys) k = static_cast<int64_t>(rng() % 50000) - 25000;
  const std::set<int64_t> distinct(keys.begin(), keys.end());
  const KeyRow init{5, 2};
  std::vector<float> out(n * 2);
  std::vector<uint8_t> inserted(n);
  CHECK_EQ(g.FindOrInsertWith(keys.data(), n, 0, 2, init, nullptr, out.data(), inserted.data(), true, 1), "");
  GpuTableStats s;
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, static_cast<int64_t>(distinct.size()));
  int64_t flagged = 0;
  std::map<int64_t, int64_t> first;
  for (int64_t i = 0; i < n; ++i) {
    flagged += inserted[i];
    if (first.emplace(keys[i], i).second) CHECK_EQ(static_cast<int>(inserted[i]), 1);
    float want[2];
    init(i, keys[i], want);
    CHECK_EQ(out[2 * i], want[0]);
    CHECK_EQ(out[2 * i + 1], want[1]);
  }
  CHECK_EQ(flagged, static_cast<int64_t>(distinct.size()));
  std::map<int64_t, int64_t> counts;
  for (int64_t k : keys) ++counts[k];
  for (const auto& [k, e] : Snapshot(g)) CHECK_EQ(static_cast<int64_t>(e.frequency), counts[k]);
}

// A capped table keeps its slots and evicts the lowest score of a full bucket, never a key of the same batch.
TFEXT_TEST(CappedTableEvictsByPolicy) {
  for (EvictPolicy policy : {EvictPolicy::kLru, EvictPolicy::kLfu}) {
    Table g(HostBackend{4});
    CHECK_EQ(g.Init(Options(1, 0, 128, policy)), "");  // one bucket
    CHECK_EQ(g.capacity(), 128);
    std::vector<int64_t> keys(128);
    std::vector<float> vals(128);
    for (int64_t i = 0; i < 128; ++i) {
      keys[i] = 1000 + i;
      vals[i] = static_cast<float>(i);
      // version i + 1; frequency 128 - i (the key inserted last is the least frequent): one batch that names the
      // key 128 - i times
      const std::vector<int64_t> copies(128 - i, keys[i]);
      const std::vector<float> copy_vals(128 - i, vals[i]);
      CHECK_EQ(g.Insert(copies.data(), copies.size(), 0, 1, copy_vals.data(), nullptr, true, i + 1), "");
    }
    GpuTableStats s;
    CHECK_EQ(g.Stats(&s), "");
    CHECK_EQ(s.size, 128);
    CHECK_EQ(s.evicted, 0);
    const int64_t fresh = 5;
    const float v = 99;
    CHECK_EQ(g.Insert(&fresh, 1, 0, 1, &v, nullptr, true, 500), "");
    CHECK_EQ(g.Stats(&s), "");
    CHECK_EQ(s.size, 128);
    CHECK_EQ(s.evicted, 1);
    const int64_t victim = policy == EvictPolicy::kLru ? 1000 : 1127;
    const auto snap = Snapshot(g);
    CHECK(snap.count(victim) == 0);
    CHECK(snap.count(fresh) == 1);
    CHECK_EQ(snap.at(fresh).row[0], 99.0f);
    // A batch that touches all 128 stored keys and a new one: the new key cannot be stored (no victim outside the
    // batch), the stored keys stay, the output still holds the new key's initial row.
    std::vector<int64_t> batch;
    for (const auto& [k, e] : snap) batch.push_back(k);
    batch.push_back(777);
    const KeyRow init{2, 1};
    std::vector<float> out(batch.size());
    std::vector<uint8_t> ins(batch.size());
    CHECK_EQ(g.FindOrInsertWith(batch.data(), batch.size(), 0, 1, init, nullptr, out.data(), ins.data(), false, 600),
             "");
    CHECK_EQ(g.Stats(&s), "");
    CHECK_EQ(s.failed, 1);
    CHECK_EQ(s.size, 128);
    float want = 0;
    init(batch.size() - 1, 777, &want);
    CHECK_EQ(out.back(), want);
    CHECK_EQ(static_cast<int>(ins.back()), 0);
    const auto after = Snapshot(g);
    CHECK(after.count(777) == 0);
    for (const auto& [k, e] : snap) CHECK_EQ(after.at(k).row[0], e.row[0]);
  }
}

// A stored key of a batch is never the victim of a new key of the same batch, even when the new key's thread runs
// first and the stored key has the lowest score.
TFEXT_TEST(CappedTableNeverEvictsAKeyOfTheSameBatch) {
  Table g(HostBackend{1});  // one thread: the batch's keys are claimed in batch order, the new key first
  CHECK_EQ(g.Init(Options(1, 0, 128)), "");
  for (int64_t i = 0; i < 128; ++i) {
    const int64_t k = 1000 + i;
    const float v = static_cast<float>(i);
    CHECK_EQ(g.Insert(&k, 1, 0, 1, &v, nullptr, false, i + 1), "");  // key 1000 is the oldest
  }
  const int64_t batch[] = {5, 1000};
  float out[2];
  uint8_t ins[2];
  CHECK_EQ(g.FindOrInsertWith(batch, 2, 0, 1, ConstantRow{42.0f, 1}, nullptr, out, ins, false, 500), "");
  CHECK_EQ(out[0], 42.0f);
  CHECK_EQ(static_cast<int>(ins[0]), 1);
  CHECK_EQ(out[1], 0.0f);  // key 1000's own row, not a fresh one
  CHECK_EQ(static_cast<int>(ins[1]), 0);
  GpuTableStats s;
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.evicted, 1);
  const auto snap = Snapshot(g);
  CHECK(snap.count(1000) == 1 && snap.count(5) == 1);
  CHECK(snap.count(1001) == 0);  // the oldest key outside the batch went
}

// Many buckets under churn: a capped table never holds more keys than slots, never a key twice, and every key it
// holds has the row last written for it; removed slots are reused.
TFEXT_TEST(CappedTableUnderChurnKeepsRowsRight) {
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(Options(3, 0, 1024)), "");
  std::mt19937_64 rng(9);
  std::map<int64_t, float> last;
  for (int round = 0; round < 40; ++round) {
    const std::vector<int64_t> keys = RandomKeys(rng, 300, 5000);
    std::vector<float> vals(keys.size() * 3);
    for (size_t i = 0; i < keys.size(); ++i) {
      const float v = static_cast<float>(round * 1000 + static_cast<int>(i));
      vals[3 * i] = vals[3 * i + 1] = vals[3 * i + 2] = v;
      last[keys[i]] = v;
    }
    CHECK_EQ(g.Insert(keys.data(), keys.size(), 0, 3, vals.data(), nullptr, true, round), "");
    int64_t removed = 0;
    CHECK_EQ(g.Remove(keys.data(), 20, &removed), "");
    for (int i = 0; i < 20; ++i) last.erase(keys[i]);
    const auto snap = Snapshot(g);
    CHECK_LE(static_cast<int64_t>(snap.size()), 1024);
    for (const auto& [k, e] : snap) {
      CHECK(last.count(k) == 1);
      CHECK_EQ(e.row[0], last.at(k));
      CHECK_EQ(e.row[2], last.at(k));
    }
  }
  GpuTableStats s;
  CHECK_EQ(g.Stats(&s), "");
  CHECK_GT(s.evicted, 0);
  CHECK_LE(s.used, 1024);
}

// Update equals the CPU core's Update with the same step, new keys included (they get column_defaults first).
TFEXT_TEST(UpdatesMatchTheCpuCore) {
  const int64_t cols = 5, w = 2 * cols + 1;  // the last column: fn leaves it alone, new rows get its default
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(Options(w)), "");
  TableOptions co;
  co.width = w;
  HashTable c(co);
  std::vector<float> defaults(w, 0.0f);
  for (int64_t j = cols; j < w; ++j) defaults[j] = 0.1f;
  std::mt19937_64 rng(1);
  for (int step = 0; step < 5; ++step) {
    std::vector<int64_t> keys;
    std::set<int64_t> seen;
    while (keys.size() < 200) {
      const int64_t k = static_cast<int64_t>(rng() % 400) - 200;
      if (seen.insert(k).second) keys.push_back(k);
    }
    std::vector<float> grads(keys.size() * cols);
    std::normal_distribution<float> nd;
    for (auto& x : grads) x = nd(rng);
    const SquareAndStep fn{grads.data(), cols};
    CHECK_EQ(g.Update(keys.data(), keys.size(), cols, fn, defaults.data(), step), "");
    c.Update(
        keys.data(), keys.size(), defaults.data(),
        [&](int64_t i, float* row, KeyMeta* meta) {
          for (int64_t j = 0; j < cols; ++j) fn(i, j, row);
          meta->version = step;
        },
        InlineParallelFor());
  }
  CHECK(Snapshot(g) == Snapshot(c));
  // Keys given twice are refused, not updated twice.
  const int64_t dup[] = {3, 3};
  std::vector<float> g2(2 * cols, 1.0f);
  CHECK(g.Update(dup, 2, cols, SquareAndStep{g2.data(), cols}, defaults.data(), 9).find("distinct") !=
        std::string::npos);
}

// ---- compact rows (bfloat16 / float16 columns) ----
using tfext::table::Rounding;
using tfext::table::RowStorage;
using tfext::table::gpu::RowFormat;
using tfext::table::gpu::testing::CompactOptions;
using tfext::table::gpu::testing::CoreOptions;

// New keys' initial columns that every storage holds exactly: small integers, a function of the key and column.
struct IntegerRow {
  int64_t cols;
  void operator()(int64_t /*first*/, int64_t key, float* dst) const {
    for (int64_t c = 0; c < cols; ++c) {
      dst[c] = static_cast<float>(static_cast<int64_t>(SplitMix64(static_cast<uint64_t>(key) + c) % 33) - 16);
    }
  }
};

// Every operation of a compact table against the CPU core with the same storage, on random batches with duplicates,
// with values every storage holds exactly (small integers, so that the order in which Accumulate adds a key's
// occurrences cannot matter): the layout (odd and partial compact areas, float32 columns after them), decoding in
// find and export, defaults, rehash copies and Accumulate's compare-and-swap on the two halves of one 32-bit word,
// under races.
TFEXT_TEST(CompactRowsMatchTheCpuCoreOnRandomBatches) {
  const int64_t w = 7;
  for (RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    for (int64_t compact_cols : {int64_t{1}, int64_t{4}, w}) {
      const GpuTableOptions options = CompactOptions(w, storage, compact_cols, Rounding::kStochastic);
      Table g(HostBackend{4});
      CHECK_EQ(g.Init(options), "");
      CHECK_EQ(g.row_bytes(), (2 * compact_cols + 3) / 4 * 4 + 4 * (w - compact_cols));
      HashTable c(CoreOptions(options));
      const auto pf = InlineParallelFor();
      std::mt19937_64 rng(static_cast<uint64_t>(compact_cols) * 3 + static_cast<uint64_t>(storage));
      const std::vector<float> defaults = {-1, -2, -3, -4, -5, -6, -7};
      for (int round = 0; round < 50; ++round) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % 300);
        const std::vector<int64_t> keys = RandomKeys(rng, n, 1500);
        const int64_t col_begin = static_cast<int64_t>(rng() % 3);
        const int64_t cols = 1 + static_cast<int64_t>(rng() % (w - col_begin));
        const int op = static_cast<int>(rng() % 5);
        if (op == 0) {  // FindOrInsertWith: exact values, so the stochastic rounding leaves them
          std::vector<float> go(n * cols), co_out(n * cols);
          const IntegerRow init{cols};
          CHECK_EQ(g.FindOrInsertWith(keys.data(), n, col_begin, cols, init, defaults.data(), go.data(), nullptr, true,
                                      round),
                   "");
          c.FindOrInsertWith(
              keys.data(), n, col_begin, cols,
              [&](const int64_t* index, float* const* dst, int64_t count) {
                for (int64_t j = 0; j < count; ++j) init(index[j], keys[index[j]], dst[j]);
              },
              defaults.data(), co_out.data(), nullptr, true, round, pf);
          CHECK(go == co_out);
        } else if (op == 1) {  // Insert
          std::vector<float> vals(n * cols);
          for (auto& v : vals) v = static_cast<float>(static_cast<int>(rng() % 129) - 64);
          CHECK_EQ(g.Insert(keys.data(), n, col_begin, cols, vals.data(), defaults.data(), true, round), "");
          c.Insert(keys.data(), n, col_begin, cols, vals.data(), defaults.data(), true, round, pf);
        } else if (op == 2) {  // Accumulate, duplicates racing
          std::vector<float> deltas(n * cols);
          for (auto& v : deltas) v = static_cast<float>(static_cast<int>(rng() % 9) - 4);
          CHECK_EQ(g.Accumulate(keys.data(), n, col_begin, cols, deltas.data(), defaults.data(), true, true, -1), "");
          c.Accumulate(keys.data(), n, col_begin, cols, deltas.data(), defaults.data(), true, true, -1, pf);
        } else if (op == 3) {
          int64_t removed = -1;
          CHECK_EQ(g.Remove(keys.data(), n / 4 + 1, &removed), "");
          CHECK_EQ(removed, c.Remove(keys.data(), n / 4 + 1, pf));
        } else {
          std::vector<float> go(n * cols, 42.0f), co_out(n * cols, 42.0f);
          CHECK_EQ(g.Find(keys.data(), n, col_begin, cols, go.data(), nullptr, defaults.data()), "");
          c.Find(keys.data(), n, col_begin, cols, co_out.data(), nullptr, defaults.data(), pf);
          CHECK(go == co_out);
        }
      }
      const auto snap = Snapshot(g);
      CHECK(snap == Snapshot(c));
      for (const auto& [k, e] : snap) {
        for (float v : e.row) CHECK(std::fabs(v) < 256.0f);  // exact in bfloat16 too: the comparison was exact
      }
      GpuTableStats s;
      CHECK_EQ(g.Stats(&s), "");
      CHECK_GT(s.capacity, 128);  // it grew: rehash copied compact rows
    }
  }
}

// Writes round as the CPU core's do (row_codec.h): Insert, FindOrInsert's given rows, defaults and Accumulate to
// nearest; FindOrInsertWith's initialized rows and Update by the table's rounding, stochastic bits from the key,
// the version the write leaves in the row and the column. Values that no storage holds exactly; the reference is the
// CPU core with the same storage, bit for bit.
TFEXT_TEST(CompactRowsRoundAsTheCpuCore) {
  const int64_t cols = 4, w = 2 * cols + 1;
  for (RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      for (int64_t compact_cols : {int64_t{3}, int64_t{cols}, w}) {
        const GpuTableOptions options = CompactOptions(w, storage, compact_cols, rounding);
        Table g(HostBackend{4});
        CHECK_EQ(g.Init(options), "");
        HashTable c(CoreOptions(options));
        const auto pf = InlineParallelFor();
        std::vector<float> defaults(w);
        for (int64_t x = 0; x < w; ++x) defaults[x] = 0.1f + 0.01f * static_cast<float>(x);
        std::mt19937_64 rng(5);
        std::normal_distribution<float> nd;
        // Initialized rows (KeyRow: 20-bit fractions, inexact in both storages), version 3.
        std::vector<int64_t> keys(300);
        for (auto& k : keys) k = static_cast<int64_t>(rng() % 1000) - 500;
        const KeyRow init{17, cols};
        std::vector<float> go(keys.size() * cols), co_out(keys.size() * cols);
        CHECK_EQ(
            g.FindOrInsertWith(keys.data(), keys.size(), 0, cols, init, defaults.data(), go.data(), nullptr, false, 3),
            "");
        c.FindOrInsertWith(keys.data(), keys.size(), 0, cols, CpuInit(init, keys.data()), defaults.data(),
                           co_out.data(), nullptr, false, 3, pf);
        CHECK(go == co_out);  // the output holds the rows as stored
        CHECK(Snapshot(g) == Snapshot(c));
        // Insert and Accumulate (one occurrence per key: the order of additions cannot matter) round to nearest.
        std::vector<int64_t> distinct;
        std::set<int64_t> seen;
        for (int64_t k : keys) {
          if (seen.insert(k).second) distinct.push_back(k);
        }
        const int64_t n = static_cast<int64_t>(distinct.size());
        std::vector<float> vals(n * 2), deltas(n * 2);
        for (auto& v : vals) v = nd(rng);
        for (auto& v : deltas) v = nd(rng) * 0.01f;
        CHECK_EQ(g.Insert(distinct.data(), n, 2, 2, vals.data(), defaults.data(), false, 4), "");
        c.Insert(distinct.data(), n, 2, 2, vals.data(), defaults.data(), false, 4, pf);
        CHECK_EQ(g.Accumulate(distinct.data(), n, 1, 2, deltas.data(), defaults.data(), true, false, -1), "");
        c.Accumulate(distinct.data(), n, 1, 2, deltas.data(), defaults.data(), true, false, -1, pf);
        CHECK(Snapshot(g) == Snapshot(c));
        // Update steps, new keys among them (they start from the defaults as stored).
        for (int64_t step = 5; step < 9; ++step) {
          std::vector<int64_t> batch;
          std::set<int64_t> in_batch;
          while (batch.size() < 200) {
            const int64_t k = static_cast<int64_t>(rng() % 1200) - 600;
            if (in_batch.insert(k).second) batch.push_back(k);
          }
          std::vector<float> grads(batch.size() * cols);
          for (auto& x : grads) x = nd(rng);
          const SquareAndStep fn{grads.data(), cols};
          CHECK_EQ(g.Update(batch.data(), batch.size(), cols, fn, defaults.data(), step), "");
          c.Update(
              batch.data(), batch.size(), defaults.data(),
              [&](int64_t i, float* row, KeyMeta* meta) {
                for (int64_t j = 0; j < cols; ++j) fn(i, j, row);
                meta->version = step;
              },
              pf);
        }
        CHECK(Snapshot(g) == Snapshot(c));
      }
    }
  }
}

// Stochastic rounding is deterministic (two tables fed the same steps hold the same bits), depends on the step, and
// keeps the small updates that round-to-nearest loses in bfloat16 on average.
TFEXT_TEST(StochasticRoundingIsDeterministicAndKeepsSmallUpdates) {
  const int64_t cols = 8;
  std::vector<int64_t> keys(512);
  for (int64_t i = 0; i < 512; ++i) keys[i] = i * 7919;
  std::vector<float> grads(keys.size() * cols, 1e-3f);
  struct Step {  // var -= g (an update far below a bfloat16 ulp of 1.0)
    const float* grads;
    int64_t cols;
    void operator()(int64_t i, int64_t j, float* row) const { row[j] -= grads[i * cols + j]; }
  };
  std::vector<float> ones(cols, 1.0f);
  std::map<int64_t, tfext::table::gpu::testing::Entry> snaps[3];
  const Rounding roundings[3] = {Rounding::kStochastic, Rounding::kStochastic, Rounding::kNearest};
  for (int t = 0; t < 3; ++t) {
    Table g(HostBackend{4});
    CHECK_EQ(g.Init(CompactOptions(cols, RowStorage::kBFloat16, cols, roundings[t])), "");
    for (int64_t step = 1; step <= 100; ++step) {
      CHECK_EQ(g.Update(keys.data(), keys.size(), cols, Step{grads.data(), cols}, ones.data(), step), "");
    }
    snaps[t] = Snapshot(g);
  }
  CHECK(snaps[0] == snaps[1]);
  double stochastic_mean = 0, nearest_mean = 0;
  for (const auto& [k, e] : snaps[0]) {
    for (float v : e.row) stochastic_mean += v;
  }
  for (const auto& [k, e] : snaps[2]) {
    for (float v : e.row) nearest_mean += v;
  }
  stochastic_mean /= static_cast<double>(keys.size() * cols);
  nearest_mean /= static_cast<double>(keys.size() * cols);
  CHECK_EQ(nearest_mean, 1.0);                     // every 1 - 1e-3 rounds back to 1
  CHECK(std::fabs(stochastic_mean - 0.9) < 0.01);  // 100 steps of -1e-3 kept on average
}

TFEXT_TEST(CompactOptionsAreChecked) {
  Table g;
  GpuTableOptions o = CompactOptions(4, RowStorage::kInt8Row, 4, Rounding::kNearest);
  CHECK(g.Init(o).find("serving format") != std::string::npos);
  o = CompactOptions(4, RowStorage::kBFloat16, 5, Rounding::kNearest);
  Table g2;
  CHECK(g2.Init(o).find("compact_cols must be in [0, width=4], got 5") != std::string::npos);
  o = CompactOptions(4, static_cast<RowStorage>(9), 4, Rounding::kNearest);
  Table g3;
  CHECK(g3.Init(o).find("storage must be") != std::string::npos);
  // A float32 storage ignores compact_cols: float32 rows.
  Table g4;
  CHECK_EQ(g4.Init(CompactOptions(4, RowStorage::kFloat32, 4, Rounding::kStochastic)), "");
  CHECK_EQ(g4.row_bytes(), 16);
  Table g5;  // dim 16 bfloat16 values + one float32 accumulator
  CHECK_EQ(g5.Init(CompactOptions(17, RowStorage::kBFloat16, 16, Rounding::kStochastic)), "");
  CHECK_EQ(g5.row_bytes(), 36);
}

// Two option sets describe the same rows (a shared table reopened by another op) when their formats agree: the
// storage and rounding of a table without compact columns do not matter, as for the CPU table's TableLayout.
TFEXT_TEST(RowFormatsCompareTheStoredRows) {
  const auto same = [](const GpuTableOptions& a, const GpuTableOptions& b) {
    return RowFormat::Of(a).SameAs(RowFormat::Of(b)) && RowFormat::Of(b).SameAs(RowFormat::Of(a));
  };
  const GpuTableOptions plain = CompactOptions(5, RowStorage::kFloat32, 0, Rounding::kNearest);
  CHECK(same(plain, CompactOptions(5, RowStorage::kFloat32, 0, Rounding::kStochastic)));
  CHECK(same(plain, CompactOptions(5, RowStorage::kFloat32, 4, Rounding::kStochastic)));
  CHECK(same(plain, CompactOptions(5, RowStorage::kBFloat16, 0, Rounding::kStochastic)));
  CHECK(!same(plain, CompactOptions(6, RowStorage::kFloat32, 0, Rounding::kNearest)));
  const GpuTableOptions bf16 = CompactOptions(5, RowStorage::kBFloat16, 4, Rounding::kStochastic);
  CHECK(same(bf16, bf16));
  CHECK(!same(bf16, plain));
  CHECK(!same(bf16, CompactOptions(5, RowStorage::kBFloat16, 4, Rounding::kNearest)));
  CHECK(!same(bf16, CompactOptions(5, RowStorage::kBFloat16, 5, Rounding::kStochastic)));
  CHECK(!same(bf16, CompactOptions(5, RowStorage::kFloat16, 4, Rounding::kStochastic)));
}

TFEXT_TEST(BadArgumentsAreNamed) {
  Table g;
  CHECK(g.Init(Options(0)).find("width") != std::string::npos);
  GpuTableOptions o = Options(4);
  o.max_load_factor = 1.5;
  Table g2;
  CHECK(g2.Init(o).find("max_load_factor") != std::string::npos);
  Table t;
  CHECK_EQ(t.Init(Options(4)), "");
  const int64_t k = 1;
  float out[4];
  CHECK(t.Find(&k, 1, 2, 3, out, nullptr, nullptr).find("columns [2, 5)") != std::string::npos);
  CHECK(t.Find(&k, -1, 0, 4, out, nullptr, nullptr).find("n must be >= 0") != std::string::npos);
  CHECK(t.FindOrInsert(&k, 1, 0, 4, nullptr, nullptr, out, nullptr, false, -1).find("init_rows") != std::string::npos);
  const float grad[5] = {};
  CHECK(t.Update(&k, 1, 5, SquareAndStep{grad, 5}, nullptr, -1).find("cols must be in [1, 4]") != std::string::npos);
  int64_t n = 0;
  const float v[4] = {1, 2, 3, 4};
  CHECK_EQ(t.Insert(&k, 1, 0, 4, v, nullptr, false, -1), "");
  int64_t key_out = 0;
  CHECK_EQ(t.Export(0, 4, 1, &key_out, out, nullptr, nullptr, &n), "");
  CHECK_EQ(n, 1);
  CHECK_EQ(key_out, 1);
  const int64_t k2 = 2;
  CHECK_EQ(t.Insert(&k2, 1, 0, 4, v, nullptr, false, -1), "");
  CHECK(t.Export(0, 4, 1, &key_out, out, nullptr, nullptr, &n).find("room was given for 1") != std::string::npos);
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
