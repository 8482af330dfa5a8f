// Tests of the tiered table (tiered_table.h) over the real RocksDB store,
// loaded the way the op library loads it: through OpenColdStore, from
// $TF_EXT_ROCKSDB_STORE_LIB (set by the BUILD target).
//   bazel test //tensorflow_ext/table/tiered:tiered_table_test
// The reference for every result is the untiered table (a plain HashTable
// given the same operations): rows, versions and frequencies must match it
// bit for bit. A full disk is made with a tmpfs in a private mount namespace
// (a child process: unshare(CLONE_NEWNS) needs a single-threaded process and
// root, which this project's machines and CI have; without it that test
// FAILS, saying so). Other store failures are injected by a wrapper store.
// An optional argument runs only the tests whose name contains it.

#include "tensorflow_ext/table/tiered/tiered_table.h"

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"

namespace {

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

std::string g_self;  // this binary, for the child processes

tfext_test::ThreadPool& Pool() {
  static tfext_test::ThreadPool pool(3);
  return pool;
}
ParallelFor PoolParallelFor() { return Pool().AsParallelFor(); }

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

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

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/tiered_table_test.XXXXXX";
  CHECK(mkdtemp(&tmpl[0]) != nullptr);
  return tmpl;
}

// A memory budget that holds `rows` rows of `table` (as the tier counts them).
int64_t BudgetFor(const HashTable& table, int64_t rows) { return rows * TieredTable::BytesPerKey(table.row_bytes()); }

TierOptions Tier(const std::string& path, int64_t memory_bytes, bool background) {
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

Content ContentOf(const HashTable& t) {
  return Collect(t.width(),
                 [&](const std::function<HashTable::ExportBuffers(int64_t)>& alloc) { t.Export(0, t.width(), alloc); });
}
Content ContentOf(const TieredTable& t) {
  return Collect(t.memory()->width(), [&](const std::function<HashTable::ExportBuffers(int64_t)>& alloc) {
    t.Export(0, t.memory()->width(), alloc);
  });
}

bool SameBits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

// Bit-identical contents: same keys, rows (bits), versions and frequencies.
void CheckSameContent(const Content& got, const Content& want) {
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
float Noise(int64_t key, int64_t a, int64_t b) {
  const uint64_t h = HashKey(key ^ static_cast<int64_t>(HashKey(a * 1000003 + b)));
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 - 0.5);
}

// ---------------------------------------------------------------- golden

// The same random training-like sequence on a tiered table with a tiny
// budget and on the untiered table: FindOrInsertWith (a lookup with
// initializer, counting, versioned), an Adagrad-like Update of the batch's
// distinct keys, Accumulate, Remove and Find. Every output and the final
// contents must be bit-identical, with many demotions and cold reads.
void RunGolden(RowStorage storage, Rounding rounding, bool background) {
  constexpr int64_t kDim = 8;
  constexpr int64_t kWidth = 2 * kDim;  // embedding + Adagrad accumulator
  constexpr int64_t kSteps = 120;
  constexpr int64_t kBatch = 192;
  TableOptions o;
  o.width = kWidth;
  if (storage != RowStorage::kFloat32) {
    o.storage = storage;
    o.compact_cols = kWidth;  // the accumulator too: every column rounds
    o.rounding = rounding;
  }
  HashTable plain(o), memory(o);
  const std::string dir = TempDir();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 256), background));
  CHECK_EQ(tier.budget_keys(), 256);
  const ParallelFor pf = PoolParallelFor();
  ZipfKeys zipf(6000, 1.1, 7);
  std::vector<float> column_defaults(kWidth, 0.0f);
  column_defaults[kDim] = 0.1f;  // Adagrad's initial accumulator

  for (int64_t step = 1; step <= kSteps; ++step) {
    std::vector<int64_t> ids(kBatch);
    for (int64_t& id : ids) id = zipf.Next();
    const int64_t n = kBatch;
    // Lookup: new keys drawn from (key, column).
    const HashTable::InitRows init = [&](const int64_t* key_indices, float* const* dst, int64_t count) {
      for (int64_t j = 0; j < count; ++j) {
        for (int64_t c = 0; c < kDim; ++c) dst[j][c] = Noise(ids[key_indices[j]], -1, c);
      }
    };
    std::vector<float> out_p(n * kDim), out_t(n * kDim);
    std::unique_ptr<bool[]> ins_p(new bool[n]), ins_t(new bool[n]);
    plain.FindOrInsertWith(ids.data(), n, 0, kDim, init, column_defaults.data(), out_p.data(), ins_p.get(), true, step,
                           pf);
    tier.WithKeys(ids.data(), n, pf, [&] {
      memory.FindOrInsertWith(ids.data(), n, 0, kDim, init, column_defaults.data(), out_t.data(), ins_t.get(), true,
                              step, pf);
    });
    CHECK(SameBits(out_p.data(), out_t.data(), n * kDim));
    for (int64_t i = 0; i < n; ++i) CHECK_EQ(ins_p[i], ins_t[i]);

    // Apply: Adagrad on the distinct keys, gradients from (key, step).
    std::vector<int64_t> uniq(ids);
    std::sort(uniq.begin(), uniq.end());
    uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
    const std::function<void(int64_t, float*, KeyMeta*)> adagrad = [&](int64_t i, float* row, KeyMeta* meta) {
      for (int64_t c = 0; c < kDim; ++c) {
        const float g = Noise(uniq[i], step, c);
        row[kDim + c] += g * g;
        row[c] -= 0.05f * g / std::sqrt(row[kDim + c]);
      }
      meta->version = step;
    };
    const int64_t u = static_cast<int64_t>(uniq.size());
    plain.Update(uniq.data(), u, column_defaults.data(), adagrad, pf);
    tier.WithKeys(uniq.data(), u, pf, [&] { memory.Update(uniq.data(), u, column_defaults.data(), adagrad, pf); });

    if (step % 3 == 0) {  // Accumulate into keys present or not, inserting or skipping the absent ones
      std::vector<int64_t> keys(64);
      for (int64_t& k : keys) k = zipf.Next();
      std::vector<float> deltas(64 * 2);
      for (size_t i = 0; i < deltas.size(); ++i) deltas[i] = Noise(keys[i / 2], step, 77);
      const bool insert = step % 2 == 0;
      plain.Accumulate(keys.data(), 64, 1, 2, deltas.data(), column_defaults.data(), insert, true, -1, pf);
      tier.WithKeys(keys.data(), 64, pf, [&] {
        memory.Accumulate(keys.data(), 64, 1, 2, deltas.data(), column_defaults.data(), insert, true, -1, pf);
      });
    }
    if (step % 5 == 0) {  // Remove keys, some on disk, some in memory, some nowhere
      std::vector<int64_t> keys(32);
      for (int64_t& k : keys) k = zipf.Next();
      keys.push_back(ZipfKeys::KeyOf(1 << 20));  // never inserted
      const int64_t m = static_cast<int64_t>(keys.size());
      const int64_t removed_p = plain.Remove(keys.data(), m, pf);
      int64_t removed_t = -1;
      tier.WithKeys(keys.data(), m, pf, [&] { removed_t = memory.Remove(keys.data(), m, pf); });
      CHECK_EQ(removed_p, removed_t);
    }
    if (step % 7 == 0) {  // Find, all columns, with a default row
      std::vector<int64_t> keys(100);
      for (int64_t& k : keys) k = zipf.Next();
      const int64_t m = static_cast<int64_t>(keys.size());
      std::vector<float> fp(m * kWidth), ft(m * kWidth), dflt(kWidth, -3.0f);
      std::unique_ptr<bool[]> found_p(new bool[m]), found_t(new bool[m]);
      plain.Find(keys.data(), m, 0, kWidth, fp.data(), found_p.get(), dflt.data(), pf);
      tier.WithKeys(keys.data(), m, pf,
                    [&] { memory.Find(keys.data(), m, 0, kWidth, ft.data(), found_t.get(), dflt.data(), pf); });
      CHECK(SameBits(fp.data(), ft.data(), m * kWidth));
      for (int64_t i = 0; i < m; ++i) CHECK_EQ(found_p[i], found_t[i]);
    }
  }
  tier.Settle();
  const TierStats s = tier.stats();
  CHECK_GT(s.demotions, 2000);  // rows went to disk, many times over the budget
  CHECK_GT(s.cold_reads, 500);  // and came back
  CHECK_GT(s.disk_keys, 1000);
  CHECK_LE(s.memory_keys, s.budget_keys);
  CHECK_EQ(s.dropped, 0);
  CHECK_EQ(s.errors, 0);
  CHECK_EQ(s.memory_keys + s.disk_keys, tier.size());
  CHECK_EQ(tier.size(), plain.size());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_EQ(memory.CheckInvariants(), "");
}

TFEXT_TEST(GoldenFloat32IsBitIdenticalToTheUntieredTable) {
  RunGolden(RowStorage::kFloat32, Rounding::kNearest, false);
}

TFEXT_TEST(GoldenBFloat16IsBitIdenticalToTheUntieredTable) {
  RunGolden(RowStorage::kBFloat16, Rounding::kStochastic, false);
}

TFEXT_TEST(GoldenFloat16IsBitIdenticalToTheUntieredTable) {
  RunGolden(RowStorage::kFloat16, Rounding::kNearest, false);
}

TFEXT_TEST(GoldenWithTheBackgroundDemoterIsBitIdentical) {
  RunGolden(RowStorage::kFloat32, Rounding::kNearest, true);
  RunGolden(RowStorage::kBFloat16, Rounding::kNearest, true);
}

// ---------------------------------------------------------------- concurrency

// Threads run batches (Accumulate +1, counting; FindOrInsert) while the
// background demoter moves rows out and batches bring them back; another
// thread exports both tiers meanwhile. Every key's count and frequency must
// be exact at the end, and no export may see a key twice or lose one.
TFEXT_TEST(ConcurrentBatchesWithTheDemoterKeepEveryCountExact) {
  constexpr int64_t kSpace = 4000;
  constexpr int kThreads = 3;
  constexpr int64_t kBatches = 150;
  constexpr int64_t kBatch = 128;
  TableOptions o;
  o.width = 4;
  HashTable memory(o);
  const std::string dir = TempDir();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 600), true));
  std::atomic<int64_t> clock{0};
  std::vector<std::vector<int64_t>> counts(kThreads, std::vector<int64_t>(kSpace, 0));
  std::vector<std::vector<int64_t>> touches(kThreads, std::vector<int64_t>(kSpace, 0));
  std::atomic<bool> failed{false};
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        ZipfKeys zipf(kSpace, 0.9, 100 + t);
        std::vector<int64_t> ranks(kBatch), keys(kBatch);
        std::vector<float> ones(kBatch, 1.0f);
        for (int64_t b = 0; b < kBatches; ++b) {
          for (int64_t i = 0; i < kBatch; ++i) {
            // Uniform half the time: the cold keys come back from disk.
            ranks[i] =
                (b % 2 == 0) ? static_cast<int64_t>(zipf.rng()() % kSpace) : static_cast<int64_t>(zipf.rng()() % 64);
            keys[i] = ZipfKeys::KeyOf(ranks[i]);
          }
          const int64_t version = ++clock;
          if (b % 4 == 3) {
            tier.WithKeys(keys.data(), kBatch, tfext::table::InlineParallelFor(), [&] {
              memory.FindOrInsert(keys.data(), kBatch, 0, 1, ones.data(), nullptr, nullptr, nullptr, true, version,
                                  tfext::table::InlineParallelFor());
            });
            // A key it inserts starts at 1 (init_rows), an existing one is unchanged.
            for (int64_t i = 0; i < kBatch; ++i) ++touches[t][ranks[i]];
          } else {
            tier.WithKeys(keys.data(), kBatch, tfext::table::InlineParallelFor(), [&] {
              memory.Accumulate(keys.data(), kBatch, 0, 1, ones.data(), nullptr, true, true, version,
                                tfext::table::InlineParallelFor());
            });
            for (int64_t i = 0; i < kBatch; ++i) {
              ++counts[t][ranks[i]];
              ++touches[t][ranks[i]];
            }
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "batch thread: %s\n", e.what());
        failed = true;
      }
      --running;
    });
  }
  // An exporter beside them: each export is one consistent view of both tiers.
  int64_t exports = 0;
  while (running.load() > 0 || exports < 2) {
    const Content c = ContentOf(tier);  // CHECKs that no key appears twice
    for (const auto& kv : c) CHECK_GE(kv.second.row[0], 0.0f);
    ++exports;
  }
  for (std::thread& th : threads) th.join();
  CHECK(!failed.load());
  tier.Settle();
  const Content c = ContentOf(tier);
  int64_t keys_touched = 0;
  for (int64_t r = 0; r < kSpace; ++r) {
    int64_t count = 0, touched = 0;
    for (int t = 0; t < kThreads; ++t) {
      count += counts[t][r];
      touched += touches[t][r];
    }
    const auto it = c.find(ZipfKeys::KeyOf(r));
    if (touched == 0) {
      CHECK(it == c.end());
      continue;
    }
    ++keys_touched;
    CHECK(it != c.end());
    // Accumulate adds 1 per occurrence; a FindOrInsert adds 1 only when it
    // inserts the key (init row 1), which happens at most once and only if no
    // Accumulate came first: so the value is count or count + 1.
    const float v = it->second.row[0];
    CHECK(v == static_cast<float>(count) || v == static_cast<float>(count + 1));
    CHECK_EQ(static_cast<int64_t>(it->second.meta.frequency), touched);
  }
  CHECK_EQ(static_cast<int64_t>(c.size()), keys_touched);
  CHECK_EQ(tier.size(), keys_touched);
  const TierStats s = tier.stats();
  CHECK_GT(s.demotions, 0);
  CHECK_GT(s.cold_reads, 0);
  CHECK_EQ(s.errors, 0);
  CHECK_LE(s.memory_keys, s.budget_keys);
  CHECK_EQ(memory.CheckInvariants(), "");
}

// A long run of batches over 5x the budget's keys: the memory tier's bytes
// (its arena keeps the most rows it ever held) stay within the budget + 10%,
// with the demoter in the background and without.
TFEXT_TEST(TheMemoryTierStaysWithinItsBudget) {
  for (const bool background : {false, true}) {
    TableOptions o;
    o.width = 16;
    HashTable memory(o);
    const std::string dir = TempDir();
    const int64_t budget = BudgetFor(memory, 30000);
    TieredTable tier(&memory, o, Tier(dir + "/store", budget, background));
    std::mt19937_64 rng(5);
    std::vector<int64_t> keys(1024);
    int64_t most = 0;
    for (int64_t b = 0; b < 300; ++b) {
      for (int64_t& k : keys) k = static_cast<int64_t>(rng() % (5 * 30000));
      tier.WithKeys(keys.data(), 1024, tfext::table::InlineParallelFor(), [&] {
        memory.FindOrInsert(keys.data(), 1024, 0, 0, nullptr, nullptr, nullptr, nullptr, true, b,
                            tfext::table::InlineParallelFor());
        most = std::max(most, memory.size());
      });
    }
    tier.Settle();
    const TierStats s = tier.stats();
    CHECK_GT(s.disk_keys, 3 * s.budget_keys);
    CHECK_LE(most, s.budget_keys + s.budget_keys / 10 + 1024);  // 1.1x + a batch
    CHECK_LE(s.memory_bytes, budget + budget / 10);
  }
}

// ---------------------------------------------------------------- whole-table operations

// Keys 0..n-1 inserted in batches of 50 with version = batch index and rows
// from (key, column); memory holds `budget` of them, disk the rest (LRU: the
// lowest versions).
void Fill(TieredTable* tier, HashTable* plain, int64_t n, int64_t batch) {
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

TFEXT_TEST(ExportAndExportSinceCoverBothTiers) {
  TableOptions o;
  o.width = 4;
  HashTable plain(o), memory(o);
  const std::string dir = TempDir();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 100), false));
  Fill(&tier, &plain, 1000, 50);
  const TierStats s = tier.stats();
  CHECK_GT(s.disk_keys, 850);
  CHECK_LE(s.memory_keys, 100);
  CHECK_EQ(tier.size(), 1000);
  CheckSameContent(ContentOf(tier), ContentOf(plain));

  // A column range.
  std::vector<int64_t> keys;
  std::vector<float> rows;
  tier.Export(1, 2, [&](int64_t n) {
    keys.resize(n);
    rows.resize(n * 2);
    HashTable::ExportBuffers b;
    b.keys = keys.data();
    b.rows = rows.data();
    return b;
  });
  CHECK_EQ(keys.size(), 1000u);
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK_EQ(rows[i * 2], Noise(keys[i], 0, 1));
    CHECK_EQ(rows[i * 2 + 1], Noise(keys[i], 0, 2));
  }

  // Since version 5 (keys 250..999): most of them on disk, the newest in memory.
  for (const int64_t since : {int64_t{0}, int64_t{5}, int64_t{19}, int64_t{20}}) {
    const Content got = Collect(4, [&](const std::function<HashTable::ExportBuffers(int64_t)>& alloc) {
      tier.ExportSince(since, 0, 4, alloc);
    });
    const Content want = Collect(4, [&](const std::function<HashTable::ExportBuffers(int64_t)>& alloc) {
      plain.ExportSince(since, 0, 4, alloc);
    });
    const int64_t expected = std::max<int64_t>(0, 1000 - since * 50);
    CHECK_EQ(static_cast<int64_t>(want.size()), expected);
    CheckSameContent(got, want);
  }
  // Exports read; they bring nothing back to memory.
  CHECK_EQ(tier.stats().disk_keys, s.disk_keys);
}

TFEXT_TEST(ImportLargerThanTheBudgetNeverHoldsItAllInMemory) {
  constexpr int64_t kKeys = 20000;
  TableOptions o;
  o.width = 8;
  HashTable plain(o), memory(o);
  const std::string dir = TempDir();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 500), false));
  std::vector<int64_t> keys(kKeys), versions(kKeys);
  std::vector<uint32_t> freqs(kKeys);
  std::vector<float> rows(kKeys * 8);
  for (int64_t i = 0; i < kKeys; ++i) {
    keys[i] = ZipfKeys::KeyOf(i);
    versions[i] = i % 977;
    freqs[i] = static_cast<uint32_t>(i % 13);
    for (int64_t c = 0; c < 8; ++c) rows[i * 8 + c] = Noise(keys[i], 1, c);
  }
  Fill(&tier, nullptr, 300, 50);  // replaced by the restore
  tier.Import(keys.data(), kKeys, 0, 8, rows.data(), nullptr, versions.data(), freqs.data(), true, PoolParallelFor());
  plain.Import(keys.data(), kKeys, 0, 8, rows.data(), nullptr, versions.data(), freqs.data(), PoolParallelFor());
  CHECK_LE(memory.size(), tier.budget_keys());
  CHECK_EQ(tier.size(), kKeys);
  // The arena follows the most keys memory ever held: about the budget, not
  // the restore (the untiered table takes 40x the rows).
  CHECK_LT(memory.memory_bytes(), plain.memory_bytes() / 10);
  CheckSameContent(ContentOf(tier), ContentOf(plain));

  // A restore of some columns into keys on disk keeps their other columns
  // (and the keys in memory, and inserts new ones with the defaults).
  std::vector<int64_t> some;
  std::vector<float> cols;
  for (int64_t i = 0; i < kKeys; i += 7) some.push_back(keys[i]);
  some.push_back(ZipfKeys::KeyOf(kKeys + 5));  // new
  for (size_t i = 0; i < some.size() * 3; ++i) cols.push_back(static_cast<float>(i));
  const std::vector<float> defaults(8, 0.25f);
  const int64_t m = static_cast<int64_t>(some.size());
  tier.Import(some.data(), m, 2, 3, cols.data(), defaults.data(), nullptr, nullptr, false, PoolParallelFor());
  plain.Import(some.data(), m, 2, 3, cols.data(), defaults.data(), nullptr, nullptr, PoolParallelFor());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_LE(memory.size(), tier.budget_keys());
}

TFEXT_TEST(RemoveIfCoversBothTiers) {
  TableOptions o;
  o.width = 4;
  HashTable plain(o), memory(o);
  const std::string dir = TempDir();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 100), false));
  Fill(&tier, &plain, 1000, 10);  // versions 0..99, 10 keys each
  std::set<int64_t> in_memory;
  {
    std::vector<int64_t> keys(1000);
    for (int64_t i = 0; i < 1000; ++i) keys[i] = i;
    std::vector<KeyMeta> meta(1000);
    std::unique_ptr<bool[]> found(new bool[1000]);
    memory.FindMeta(keys.data(), 1000, meta.data(), found.get(), PoolParallelFor());
    for (int64_t i = 0; i < 1000; ++i) {
      if (found[i]) in_memory.insert(i);
    }
  }
  CHECK_GT(in_memory.size(), 50u);
  const auto pred = [](int64_t key, const float* row, const KeyMeta& meta) {
    return meta.version % 3 == 0 || (key % 10 == 1 && row[0] > 0.0f);
  };
  std::vector<int64_t> removed_disk;
  const int64_t removed = tier.RemoveIf(pred, &removed_disk);
  const int64_t removed_plain = plain.RemoveIf(pred);
  CHECK_EQ(removed, removed_plain);
  CHECK_GT(static_cast<int64_t>(removed_disk.size()), 300);
  for (const int64_t key : removed_disk) CHECK(in_memory.count(key) == 0);
  CHECK_LT(static_cast<int64_t>(removed_disk.size()), removed);  // some came from memory
  CHECK_EQ(tier.size(), 1000 - removed);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  // Removed disk keys stay gone: a lookup does not find them.
  for (size_t off = 0; off < removed_disk.size(); off += 100) {
    const int64_t m = std::min<int64_t>(100, static_cast<int64_t>(removed_disk.size() - off));
    const int64_t* keys = removed_disk.data() + off;
    std::vector<float> out(m * 4);
    std::unique_ptr<bool[]> found(new bool[m]);
    tier.WithKeys(keys, m, PoolParallelFor(),
                  [&] { memory.Find(keys, m, 0, 4, out.data(), found.get(), nullptr, PoolParallelFor()); });
    for (int64_t i = 0; i < m; ++i) CHECK(!found[i]);
  }
}

TFEXT_TEST(ClearEmptiesBothTiers) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o);
  const std::string dir = TempDir();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 100), false));
  Fill(&tier, nullptr, 500, 50);
  CHECK_GT(tier.stats().disk_keys, 0);
  tier.Clear();
  CHECK_EQ(tier.size(), 0);
  CHECK_EQ(tier.stats().disk_keys, 0);
  CHECK_EQ(ContentOf(tier).size(), 0u);
  // Keys of before are gone from both tiers; the table works as new.
  HashTable plain(o);
  Fill(&tier, &plain, 300, 50);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
}

// ---------------------------------------------------------------- disk cap

TFEXT_TEST(DiskCapDropsTheLowestVersionsAndCountsThem) {
  constexpr int64_t kKeys = 8000;
  TableOptions o;
  o.width = 8;  // an entry: 8 key + 44 value + 16 = 68 bytes
  HashTable memory(o);
  const std::string dir = TempDir();
  TierOptions t = Tier(dir + "/store", BudgetFor(memory, 200), false);
  t.disk_bytes = 68 * 2000;
  TieredTable tier(&memory, o, t);
  Fill(&tier, nullptr, kKeys, 100);  // versions 0..79
  tier.Settle();
  const TierStats s = tier.stats();
  CHECK_GT(s.dropped, 0);
  // The cap holds in entries (their size in the store's files). The files'
  // bytes include what RocksDB has not compacted away yet: at this size, the
  // memtable's shadowed rows and tombstones (see tiered_table.h).
  CHECK_LE(s.disk_keys * 68, t.disk_bytes);
  CHECK_GE(s.disk_keys * 68, t.disk_bytes / 3);  // and keeps a good part of what the cap allows
  CHECK_EQ(s.disk_keys + s.memory_keys + s.dropped, kKeys);
  CHECK_EQ(tier.size(), kKeys - s.dropped);
  const std::vector<int64_t> dropped = tier.TakeDroppedKeys();
  CHECK_EQ(static_cast<int64_t>(dropped.size()), s.dropped);
  CHECK(tier.TakeDroppedKeys().empty());
  // The dropped keys are the oldest: every one has a lower version than
  // every key kept (LRU, versions rising with the key).
  const Content kept = ContentOf(tier);
  CHECK_EQ(static_cast<int64_t>(kept.size()), kKeys - s.dropped);
  int64_t oldest_kept = INT64_MAX;
  for (const auto& kv : kept) oldest_kept = std::min(oldest_kept, kv.second.meta.version);
  std::set<int64_t> dropped_set(dropped.begin(), dropped.end());
  CHECK_EQ(dropped_set.size(), dropped.size());
  for (const int64_t key : dropped) {
    CHECK(kept.count(key) == 0);
    CHECK_LE(key / 100, oldest_kept);  // its version (ties at the threshold version may go either way)
  }
  int64_t newest_dropped = -1;
  for (const int64_t key : dropped) newest_dropped = std::max(newest_dropped, key / 100);
  CHECK_LE(newest_dropped, oldest_kept);
  // Every key of a version below the newest dropped one is gone.
  for (const auto& kv : kept) CHECK_GE(kv.second.meta.version, newest_dropped);
}

TFEXT_TEST(LfuDemotesTheLeastFrequentFirst) {
  TableOptions o;
  o.width = 2;
  HashTable memory(o);
  const std::string dir = TempDir();
  TierOptions t = Tier(dir + "/store", BudgetFor(memory, 100), false);
  t.policy = TierOptions::Policy::kLfu;
  TieredTable tier(&memory, o, t);
  // Keys 0..99 touched 5 times (version 0), then 200 new keys once each
  // (newer versions): LFU keeps the frequent old keys in memory.
  std::vector<int64_t> hot(100);
  for (int64_t i = 0; i < 100; ++i) hot[i] = i;
  for (int r = 0; r < 5; ++r) {
    tier.WithKeys(hot.data(), 100, PoolParallelFor(), [&] {
      memory.FindOrInsert(hot.data(), 100, 0, 0, nullptr, nullptr, nullptr, nullptr, true, 0, PoolParallelFor());
    });
  }
  for (int64_t b = 0; b < 4; ++b) {
    std::vector<int64_t> cold(50);
    for (int64_t i = 0; i < 50; ++i) cold[i] = 1000 + b * 50 + i;
    tier.WithKeys(cold.data(), 50, PoolParallelFor(), [&] {
      memory.FindOrInsert(cold.data(), 50, 0, 0, nullptr, nullptr, nullptr, nullptr, true, 1 + b, PoolParallelFor());
    });
  }
  tier.Settle();
  std::vector<KeyMeta> meta(100);
  std::unique_ptr<bool[]> found(new bool[100]);
  memory.FindMeta(hot.data(), 100, meta.data(), found.get(), PoolParallelFor());
  int64_t hot_in_memory = 0;
  for (int64_t i = 0; i < 100; ++i) hot_in_memory += found[i] ? 1 : 0;
  CHECK_GE(hot_in_memory, 85);  // 90 fit after a round; the frequent keys are kept
  CHECK_EQ(tier.size(), 300);
}

// ---------------------------------------------------------------- errors

template <typename Fn>
std::string ExpectThrow(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  ::tfext_test::FailCheck(__FILE__, __LINE__, "expected an exception, nothing was thrown");
}

TFEXT_TEST(ABatchLargerThanTheBudgetIsRefused) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o);
  const std::string dir = TempDir();
  const int64_t budget = BudgetFor(memory, 100);
  TieredTable tier(&memory, o, Tier(dir + "/store", budget, false));
  std::vector<int64_t> keys(101);
  for (int64_t i = 0; i < 101; ++i) keys[i] = i;
  bool ran = false;
  try {
    tier.WithKeys(keys.data(), 101, PoolParallelFor(), [&] { ran = true; });
    CHECK(false);
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kInvalid);
    const std::string msg = e.what();
    CHECK(Contains(msg, "memory_bytes=" + std::to_string(budget)));
    CHECK(Contains(msg, "holds 100 rows of " + std::to_string(tier.bytes_per_key()) + " bytes"));
    CHECK_EQ(tier.bytes_per_key(), ((memory.row_bytes() + 20) * 11 + 9) / 10);
    CHECK(Contains(msg, "this batch needs 101 rows"));
    CHECK(Contains(msg, dir + "/store"));
  }
  CHECK(!ran);
  // A long batch of few distinct keys fits.
  std::vector<int64_t> repeated(1000);
  for (int64_t i = 0; i < 1000; ++i) repeated[i] = i % 100;
  tier.WithKeys(repeated.data(), 1000, PoolParallelFor(), [&] {
    memory.FindOrInsert(repeated.data(), 1000, 0, 0, nullptr, nullptr, nullptr, nullptr, true, 1, PoolParallelFor());
  });
  CHECK_EQ(tier.size(), 100);
}

TFEXT_TEST(BadOptionsAreRefusedNamingTheProblem) {
  const std::string dir = TempDir();
  {
    TableOptions o;
    o.width = 8;
    o.storage = RowStorage::kInt8Row;
    o.compact_cols = 8;
    HashTable memory(o);
    const std::string msg = ExpectThrow([&] { TieredTable t(&memory, o, Tier(dir + "/a", 1 << 20, false)); });
    CHECK(Contains(msg, "int8_row"));
  }
  TableOptions o;
  o.width = 8;
  HashTable memory(o);
  std::string msg = ExpectThrow([&] { TieredTable t(&memory, o, Tier(dir + "/b", 1000, false)); });
  CHECK(Contains(msg, "memory_bytes=1000"));
  CHECK(Contains(msg, "at least 64 rows"));
  msg = ExpectThrow([&] { TieredTable t(&memory, o, Tier(dir + "/c", 0, false)); });
  CHECK(Contains(msg, "memory_bytes must be > 0"));
  TierOptions negative = Tier(dir + "/d", 1 << 20, false);
  negative.disk_bytes = -1;
  msg = ExpectThrow([&] { TieredTable t(&memory, o, negative); });
  CHECK(Contains(msg, "disk_bytes must be >= 0"));
  // One store directory, one table.
  TieredTable first(&memory, o, Tier(dir + "/e", 1 << 20, false));
  HashTable other(o);
  try {
    TieredTable second(&other, o, Tier(dir + "/e", 1 << 20, false));
    CHECK(false);
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kLocked);
    CHECK(Contains(e.what(), dir + "/e"));
  }
}

// A store that forwards to the RocksDB store and fails Puts on demand, or
// holds a Put until released (to freeze a chunk in the outbox).
class ControlledStore : public ColdStore {
 public:
  explicit ControlledStore(std::unique_ptr<ColdStore> inner) : inner_(std::move(inner)) {}
  void Get(const int64_t* keys, int64_t n, float* rows, KeyMeta* meta, bool* found) override {
    inner_->Get(keys, n, rows, meta, found);
  }
  void Put(const int64_t* keys, int64_t n, const float* rows, const KeyMeta* meta) override {
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
  void Delete(const int64_t* keys, int64_t n) override { inner_->Delete(keys, n); }
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

std::unique_ptr<ColdStore> OpenStore(const std::string& path, int64_t width) {
  StoreOptions so;
  so.path = path;
  so.width = width;
  so.block_cache_bytes = 1 << 20;
  return OpenColdStore(so);
}

// Batches of Accumulate (new keys, and old keys brought back from disk)
// through a tier whose Puts fail from some point on, with no demoter: a batch
// that leaves memory over budget demotes, fails and throws after its op ran.
// The failed chunks' rows go back to memory: every row is kept, exactly.
TFEXT_TEST(AFailedPutKeepsEveryRow) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), false), std::move(owned));
  Fill(&tier, &plain, 1000, 50);
  CHECK_GT(tier.stats().disk_keys, 700);
  store->fail_puts_ = true;
  int64_t thrown = 0;
  std::mt19937_64 rng(3);
  for (int64_t b = 0; b < 30; ++b) {
    std::vector<int64_t> keys(50);
    for (int64_t i = 0; i < 50; ++i) keys[i] = (b % 2 == 0) ? 1000 + b * 50 + i : static_cast<int64_t>(rng() % 1000);
    std::vector<float> deltas(50 * 4, 1.5f);
    bool ran = false;
    try {
      tier.WithKeys(keys.data(), 50, PoolParallelFor(), [&] {
        ran = true;
        memory.Accumulate(keys.data(), 50, 0, 4, deltas.data(), nullptr, true, true, 100 + b, PoolParallelFor());
      });
    } catch (const StoreError& e) {
      CHECK_EQ(e.code(), StoreError::kNoSpace);
      CHECK(Contains(e.what(), "no space left on device"));
      CHECK(Contains(e.what(), dir + "/store"));
      ++thrown;
    }
    CHECK(ran);  // the failure is the demotion's, after the op
    plain.Accumulate(keys.data(), 50, 0, 4, deltas.data(), nullptr, true, true, 100 + b, PoolParallelFor());
  }
  CHECK_EQ(thrown, 30);
  CHECK_EQ(store->failed_puts_.load(), 30);
  CHECK_GT(memory.size(), tier.budget_keys() + 500);  // nothing could leave
  // Every row, exactly, while the disk still refuses writes.
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  // Space again: the tier settles under budget with nothing lost.
  store->fail_puts_ = false;
  tier.Settle();
  CHECK_LE(memory.size(), tier.budget_keys());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_EQ(tier.stats().errors, 0);  // no background failure: each was thrown to its batch
  CHECK_EQ(memory.CheckInvariants(), "");
}

// The demoter's Put fails: its rows go back to memory, the error is counted
// and thrown once, by the next batch, before that batch's op.
TFEXT_TEST(AFailedBackgroundPutIsReportedOnceAndKeepsEveryRow) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), true), std::move(owned));
  Fill(&tier, &plain, 1000, 50);
  tier.Settle();
  CHECK_GT(tier.stats().disk_keys, 700);
  store->fail_puts_ = true;
  const auto insert_one = [&](int64_t key, bool* ran) {
    const float one = 1.0f;
    tier.WithKeys(&key, 1, PoolParallelFor(), [&] {
      *ran = true;
      memory.Accumulate(&key, 1, 0, 1, &one, nullptr, true, true, 7, PoolParallelFor());
    });
    plain.Accumulate(&key, 1, 0, 1, &one, nullptr, true, true, 7, PoolParallelFor());
  };
  // One key at a time until memory is just over budget: that batch wakes the
  // demoter (under 1.1x the budget, it does not demote itself).
  int64_t next = 5000;
  while (memory.size() <= tier.budget_keys()) {
    bool ran = false;
    insert_one(next++, &ran);
    CHECK(ran);
  }
  // The demoter's Put fails; once its error is counted, it is pending.
  WaitUntil([&] { return tier.stats().errors >= 1; }, "the demoter's failure");
  CHECK_EQ(store->failed_puts_.load(), 1);
  bool ran = false;
  try {
    insert_one(next, &ran);
    CHECK(false);
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kNoSpace);
    CHECK(Contains(e.what(), dir + "/store"));
  }
  CHECK(!ran);  // thrown before the op
  int64_t throws = 1;
  // Once: with space again, later batches run. (A round that was already
  // writing may still fail, once more: a demoter woken before the test began
  // can run a round beside the one this test woke. That failure is reported
  // once too.)
  store->fail_puts_ = false;
  int64_t ran_count = 0;
  for (int i = 0; i < 3; ++i) {
    bool later = false;
    try {
      insert_one(next++, &later);
      CHECK(later);
      ++ran_count;
    } catch (const StoreError& e) {
      CHECK_EQ(e.code(), StoreError::kNoSpace);
      CHECK(!later);
      ++throws;
    }
  }
  CHECK_GE(ran_count, 2);
  try {
    tier.Settle();
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kNoSpace);
    ++throws;
    tier.Settle();
  }
  CHECK_LE(throws, tier.stats().errors);  // no failure reported twice
  CHECK_LE(tier.stats().errors, 2);
  CHECK_LE(memory.size(), tier.budget_keys());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_EQ(memory.CheckInvariants(), "");
}

// A chunk frozen between memory and disk (its Put held): batches take its
// rows back from the outbox, one of them removes some; after the Put the
// removed keys do not come back from disk, and every other row is exact.
TFEXT_TEST(RowsTakenFromTheOutboxDoNotComeBackFromDisk) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), true), std::move(owned));
  Fill(&tier, &plain, 200, 50);  // at the budget: no demotion yet
  CHECK_EQ(tier.stats().demotions, 0);
  store->HoldNextPut();
  // 20 new keys: over budget (not past 1.1x), the background demoter runs and
  // its first chunk's Put is held.
  Fill(&tier, &plain, 220, 50);
  std::vector<int64_t> held = store->WaitForHeldPut();
  CHECK_GT(held.size(), 10u);
  std::sort(held.begin(), held.end());
  const int64_t h = static_cast<int64_t>(held.size());
  // Read them all (promoted from the outbox), then remove half of them.
  std::vector<float> out(h * 4), want(h * 4);
  std::unique_ptr<bool[]> found(new bool[h]), found_plain(new bool[h]);
  tier.WithKeys(held.data(), h, PoolParallelFor(),
                [&] { memory.Find(held.data(), h, 0, 4, out.data(), found.get(), nullptr, PoolParallelFor()); });
  plain.Find(held.data(), h, 0, 4, want.data(), found_plain.get(), nullptr, PoolParallelFor());
  for (int64_t i = 0; i < h; ++i) CHECK(found[i]);
  CHECK(SameBits(out.data(), want.data(), h * 4));
  std::vector<int64_t> doomed(held.begin(), held.begin() + h / 2);
  const int64_t d = static_cast<int64_t>(doomed.size());
  int64_t removed = 0;
  tier.WithKeys(doomed.data(), d, PoolParallelFor(),
                [&] { removed = memory.Remove(doomed.data(), d, PoolParallelFor()); });
  CHECK_EQ(removed, d);
  plain.Remove(doomed.data(), d, PoolParallelFor());
  store->Release();
  tier.Settle();
  CHECK_EQ(tier.size(), plain.size());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  // A lookup of the removed keys finds nothing (their disk copies are dead).
  std::unique_ptr<bool[]> again(new bool[d]);
  tier.WithKeys(doomed.data(), d, PoolParallelFor(),
                [&] { memory.Find(doomed.data(), d, 0, 4, out.data(), again.get(), nullptr, PoolParallelFor()); });
  for (int64_t i = 0; i < d; ++i) CHECK(!again[i]);
  CHECK_EQ(tier.stats().disk_keys, store->num_keys());
}

// More promotions than TieredTable::kMaxStaleKeys between two demotion
// rounds: past that many dead disk copies, batches delete their own. Every
// row stays exact, and once settled the store holds exactly the live keys.
TFEXT_TEST(ManyPromotionsWithoutARoundDeleteTheirOwnDeadCopies) {
  TableOptions o;
  o.width = 1;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 1));  // counts its keys exactly
  ControlledStore* store = owned.get();
  const int64_t budget_keys = TieredTable::kMaxStaleKeys + 20000;
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, budget_keys), false), std::move(owned));
  Fill(&tier, &plain, 2 * budget_keys, 10000);
  // Empty the memory tier (every key there removed), so that promotions fill
  // it back without going over budget: no round runs.
  std::vector<int64_t> in_memory, on_disk;
  {
    std::vector<int64_t> all(2 * budget_keys);
    for (int64_t i = 0; i < 2 * budget_keys; ++i) all[i] = i;
    std::vector<KeyMeta> meta(all.size());
    std::unique_ptr<bool[]> found(new bool[all.size()]);
    memory.FindMeta(all.data(), static_cast<int64_t>(all.size()), meta.data(), found.get(), PoolParallelFor());
    for (const int64_t key : all) (found[key] ? in_memory : on_disk).push_back(key);
  }
  CHECK_GT(static_cast<int64_t>(on_disk.size()), TieredTable::kMaxStaleKeys + 10000);
  for (size_t off = 0; off < in_memory.size(); off += 10000) {
    const int64_t m = std::min<int64_t>(10000, static_cast<int64_t>(in_memory.size() - off));
    const int64_t* keys = in_memory.data() + off;
    tier.WithKeys(keys, m, PoolParallelFor(), [&] { memory.Remove(keys, m, PoolParallelFor()); });
    plain.Remove(keys, m, PoolParallelFor());
  }
  CHECK_EQ(memory.size(), 0);
  const int64_t demotions = tier.stats().demotions;
  const int64_t promote = TieredTable::kMaxStaleKeys + 10000;
  for (int64_t off = 0; off < promote; off += 10000) {
    const int64_t m = std::min<int64_t>(10000, promote - off);
    const int64_t* keys = on_disk.data() + off;
    std::vector<float> got(m), want(m);
    tier.WithKeys(keys, m, PoolParallelFor(),
                  [&] { memory.Find(keys, m, 0, 1, got.data(), nullptr, nullptr, PoolParallelFor()); });
    plain.Find(keys, m, 0, 1, want.data(), nullptr, nullptr, PoolParallelFor());
    CHECK(SameBits(got.data(), want.data(), m));
  }
  CHECK_EQ(memory.size(), promote);
  CHECK_EQ(tier.stats().demotions, demotions);  // no round ran
  CHECK_EQ(tier.stats().disk_keys, static_cast<int64_t>(on_disk.size()) - promote);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  tier.Settle();  // deletes the dead copies still waiting
  CHECK_EQ(store->num_keys(), tier.stats().disk_keys);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
}

// ---------------------------------------------------------------- a full disk

// In a child: a tiered table on a 2 MiB tmpfs runs until its store is full,
// then every row is still there, exactly, and the error names the path.
int ChildFullDisk(const std::string& dir) {
  if (unshare(CLONE_NEWNS) != 0) {
    std::fprintf(stderr, "this test mounts a tmpfs and needs root (CAP_SYS_ADMIN): unshare(CLONE_NEWNS): %s\n",
                 std::strerror(errno));
    return 2;
  }
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=2m") != 0) {
    std::fprintf(stderr, "this test needs root (CAP_SYS_ADMIN) to mount a tmpfs at %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    return 2;
  }
  TableOptions o;
  o.width = 32;
  HashTable memory(o), plain(o);
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 500), false));
  const ParallelFor inline_pf = tfext::table::InlineParallelFor();
  std::string error;
  int64_t batches = 0;
  for (int64_t b = 0; b < 2000 && error.empty(); ++b) {
    std::vector<int64_t> keys(100);
    std::vector<float> rows(100 * 32);
    for (int64_t i = 0; i < 100; ++i) {
      keys[i] = b * 100 + i;
      for (int64_t c = 0; c < 32; ++c) rows[i * 32 + c] = Noise(keys[i], 2, c);
    }
    bool ran = false;
    try {
      tier.WithKeys(keys.data(), 100, inline_pf, [&] {
        ran = true;
        memory.Insert(keys.data(), 100, 0, 32, rows.data(), nullptr, true, b, inline_pf);
      });
    } catch (const StoreError& e) {
      if (e.code() != StoreError::kNoSpace) {
        std::fprintf(stderr, "expected kNoSpace, got %d: %s\n", static_cast<int>(e.code()), e.what());
        return 1;
      }
      error = e.what();
    }
    if (ran) plain.Insert(keys.data(), 100, 0, 32, rows.data(), nullptr, true, b, inline_pf);
    ++batches;
  }
  if (error.empty()) {
    std::fprintf(stderr, "2000 batches of 100 rows of 140 bytes never filled a 2 MiB tmpfs\n");
    return 1;
  }
  std::printf("full after %ld batches: %s\n", static_cast<long>(batches), error.c_str());
  CHECK(Contains(error, dir + "/store"));
  CHECK(Contains(error, "no space left on device"));
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_GT(tier.stats().disk_keys, 0);
  return 0;
}

TFEXT_TEST(AFullDiskKeepsEveryRowAndNamesThePath) {
  const std::string dir = TempDir();
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    execl(g_self.c_str(), g_self.c_str(), "--child-full-disk", dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
}

}  // namespace

int main(int argc, char** argv) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    std::perror("readlink /proc/self/exe");
    return 1;
  }
  g_self.assign(self, static_cast<size_t>(len));
  // Children get an absolute plugin path (the BUILD target passes one relative to the runfiles).
  const char* plugin = std::getenv(tfext::table::kRocksDbStoreLibraryEnv);
  if (plugin != nullptr && plugin[0] != '\0' && plugin[0] != '/') {
    char abs[4096];
    if (realpath(plugin, abs) != nullptr) setenv(tfext::table::kRocksDbStoreLibraryEnv, abs, 1);
  }
  if (argc == 3 && std::strcmp(argv[1], "--child-full-disk") == 0) {
    try {
      return ChildFullDisk(argv[2]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      return 1;
    }
  }
  return tfext_test::RunAllTests(argc, argv);
}
