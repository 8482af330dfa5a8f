// Tests of the tiered table (tiered_table.h) over the real RocksDB store,
// loaded the way the op library loads it: through OpenColdStore, from
// $TF_EXT_ROCKSDB_STORE_LIB (set by the BUILD target): training and
// concurrency against the untiered table, the budget, whole-table
// operations, the disk cap and the demotion policy. Failures and bad input
// are in tiered_table_faults_test.cc.
//   bazel test //tensorflow_ext/table/tiered:tiered_table_test
// The reference for every result is the untiered table (a plain HashTable
// given the same operations): rows, versions and frequencies must match it
// bit for bit. An optional argument runs only the tests whose name contains
// it.

#include "tensorflow_ext/table/tiered/tiered_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/tiered/tiered_test_util.h"

namespace {

using namespace ::tfext_tiered_test;  // NOLINT: the shared test helpers

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

// ---------------------------------------------------------------- promoted rows

// Rows a batch brings back from disk keep their old versions and
// frequencies (training must not change), so by rank they are the first a
// demotion would send back. The next round spares them: a prefetch's rows
// are all in memory for the step that uses them, though a round ran in
// between (started by the prefetch itself, or by other keys' batches), for
// both policies. Every row stays bit for bit that of the untiered table.
TFEXT_TEST(APrefetchedBatchIsAllHitsAfterADemotionRound) {
  for (const auto policy : {TierOptions::Policy::kLru, TierOptions::Policy::kLfu}) {
    for (const bool round_by_others : {false, true}) {
      TableOptions o;
      o.width = 4;
      HashTable memory(o), plain(o);
      const std::string dir = TempDir();
      TierOptions t = Tier(dir + "/store", BudgetFor(memory, 200), false);
      t.policy = policy;
      TieredTable tier(&memory, o, t);
      Fill(&tier, &plain, 1000, 50);  // versions 0..19: memory holds the newest
      tier.Settle();
      CHECK_EQ(memory.size(), 180);
      // The oldest keys, all on disk: a prefetch of 15 stays under the budget
      // (others' new keys then start a round), one of 40 goes over it (its
      // own batch starts a round).
      const int64_t p = round_by_others ? 15 : 40;
      std::vector<int64_t> prefetched(p);
      for (int64_t i = 0; i < p; ++i) prefetched[i] = i;
      const TierStats before = tier.stats();
      tier.WithKeys(prefetched.data(), p, PoolParallelFor(), [] {});
      CHECK_EQ(tier.stats().cold_reads - before.cold_reads, p);
      if (round_by_others) {
        std::vector<int64_t> others(30);
        std::vector<float> rows(30 * 4, 2.0f);
        for (int64_t i = 0; i < 30; ++i) others[i] = 5000 + i;
        tier.WithKeys(others.data(), 30, PoolParallelFor(), [&] {
          memory.Insert(others.data(), 30, 0, 4, rows.data(), nullptr, true, 30, PoolParallelFor());
        });
        plain.Insert(others.data(), 30, 0, 4, rows.data(), nullptr, true, 30, PoolParallelFor());
      }
      const TierStats between = tier.stats();
      CHECK_GT(between.demotions, before.demotions);  // a round ran between the prefetch and the step
      CHECK_LE(memory.size(), tier.budget_keys());
      // The step: a lookup that counts and stamps its keys, all in memory.
      std::vector<float> got(p * 4), want(p * 4);
      tier.WithKeys(prefetched.data(), p, PoolParallelFor(), [&] {
        memory.FindOrInsert(prefetched.data(), p, 0, 4, nullptr, nullptr, got.data(), nullptr, true, 31,
                            PoolParallelFor());
      });
      plain.FindOrInsert(prefetched.data(), p, 0, 4, nullptr, nullptr, want.data(), nullptr, true, 31,
                         PoolParallelFor());
      const TierStats after = tier.stats();
      CHECK_EQ(after.cold_reads, between.cold_reads);  // all hits
      CHECK_EQ(after.lookups - between.lookups, p);
      CHECK(SameBits(got.data(), want.data(), p * 4));
      tier.Settle();
      CHECK_EQ(tier.size(), plain.size());
      CheckSameContent(ContentOf(tier), ContentOf(plain));
    }
  }
}

// ---------------------------------------------------------------- counting

// size() and stats() while a chunk of rows is between memory and disk (its
// Put held): the chunk's rows, the rows batches take back from it and rows
// promoted from disk are each counted once; stats() splits the same total
// between the tiers (the chunk counts as disk: it has left memory).
TFEXT_TEST(SizeCountsAChunkBetweenMemoryAndDiskOnce) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), true), std::move(owned));
  const ReleaseAtExit release(store);
  const auto check_count = [&](int64_t want) {
    CHECK_EQ(tier.size(), want);
    const TierStats s = tier.stats();
    CHECK_EQ(s.memory_keys + s.disk_keys, want);
  };
  Fill(&tier, &plain, 600, 50);
  tier.Settle();
  check_count(600);
  CHECK_EQ(memory.size(), 180);  // a round leaves 90% of the budget
  // New keys up to just over the budget (not past 1.1x it: the demoter runs
  // the round, not this thread), and the round's first Put is held.
  store->HoldNextPut();
  {
    std::vector<int64_t> keys(25);
    std::vector<float> rows(25 * 4, 0.5f);
    for (int64_t i = 0; i < 25; ++i) keys[i] = 1000 + i;
    tier.WithKeys(keys.data(), 25, PoolParallelFor(),
                  [&] { memory.Insert(keys.data(), 25, 0, 4, rows.data(), nullptr, true, 100, PoolParallelFor()); });
    plain.Insert(keys.data(), 25, 0, 4, rows.data(), nullptr, true, 100, PoolParallelFor());
  }
  std::vector<int64_t> held = store->WaitForHeldPut();
  const int64_t h = static_cast<int64_t>(held.size());
  CHECK_GT(h, 0);
  CHECK_EQ(memory.size(), 205 - h);
  check_count(625);
  // A batch takes half of the chunk back from the outbox, and 5 rows from
  // disk.
  std::vector<int64_t> batch(held.begin(), held.begin() + (h + 1) / 2);
  for (int64_t key = 0; key < 600 && batch.size() < static_cast<size_t>((h + 1) / 2 + 5); ++key) {
    KeyMeta meta;
    bool found = false;
    memory.FindMeta(&key, 1, &meta, &found, PoolParallelFor());
    if (!found && std::find(held.begin(), held.end(), key) == held.end()) batch.push_back(key);
  }
  const int64_t b = static_cast<int64_t>(batch.size());
  const int64_t cold_reads = tier.stats().cold_reads;
  std::vector<float> got(b * 4), want(b * 4);
  tier.WithKeys(batch.data(), b, PoolParallelFor(),
                [&] { memory.Find(batch.data(), b, 0, 4, got.data(), nullptr, nullptr, PoolParallelFor()); });
  plain.Find(batch.data(), b, 0, 4, want.data(), nullptr, nullptr, PoolParallelFor());
  CHECK(SameBits(got.data(), want.data(), b * 4));
  CHECK_EQ(tier.stats().cold_reads - cold_reads, b);  // every one came from the outbox or the disk
  check_count(625);
  // Removing keys taken from the chunk counts them out once.
  tier.WithKeys(held.data(), 1, PoolParallelFor(),
                [&] { CHECK_EQ(memory.Remove(held.data(), 1, PoolParallelFor()), 1); });
  plain.Remove(held.data(), 1, PoolParallelFor());
  check_count(624);
  store->Release();
  tier.Settle();
  check_count(624);
  CHECK_EQ(tier.stats().disk_keys, store->num_keys());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
}

// Batches promote rows from disk (and from the outbox) while the background
// demoter moves rows out, and nothing inserts or removes a key: size() and
// stats() must say the same number of keys at every instant, looked at by a
// thread that polls them and from inside every store call the tier makes
// (while a promoter or the demoter is in the middle of a move).
TFEXT_TEST(SizeIsExactAtEveryInstantWhileRowsMove) {
  constexpr int64_t kKeys = 3000;
  constexpr int kThreads = 2;
  TableOptions o;
  o.width = 4;
  HashTable memory(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 300), true), std::move(owned));
  Fill(&tier, nullptr, kKeys, 100);
  tier.Settle();
  std::atomic<int64_t> looks{0}, wrong{0}, last_wrong{0};
  const auto look = [&] {
    const int64_t size = tier.size();
    const TierStats s = tier.stats();
    ++looks;
    if (size != kKeys || s.memory_keys + s.disk_keys != kKeys) {
      ++wrong;
      last_wrong = size != kKeys ? size : s.memory_keys + s.disk_keys;
    }
  };
  std::atomic<int64_t> store_looks{0};
  store->on_call_ = [&](const char*) {
    ++store_looks;
    look();
  };
  std::atomic<int> running{kThreads};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        std::mt19937_64 rng(40 + t);
        std::vector<int64_t> keys(64);
        std::vector<float> out(64 * 4);
        for (int b = 0; b < 150; ++b) {
          for (int64_t& k : keys) k = static_cast<int64_t>(rng() % kKeys);
          tier.WithKeys(keys.data(), 64, tfext::table::InlineParallelFor(), [&] {
            memory.Find(keys.data(), 64, 0, 4, out.data(), nullptr, nullptr, tfext::table::InlineParallelFor());
          });
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "batch thread: %s\n", e.what());
        failed = true;
      }
      --running;
    });
  }
  while (running.load() > 0) look();
  for (std::thread& th : threads) th.join();
  store->on_call_ = nullptr;
  CHECK(!failed.load());
  tier.Settle();
  look();
  if (wrong.load() != 0) {
    std::fprintf(stderr, "%ld of %ld looks were wrong (the last: %ld keys of %ld)\n", static_cast<long>(wrong.load()),
                 static_cast<long>(looks.load()), static_cast<long>(last_wrong.load()), static_cast<long>(kKeys));
  }
  CHECK_EQ(wrong.load(), 0);
  CHECK_GT(store_looks.load(), 0);
  const TierStats s = tier.stats();
  CHECK_GT(s.cold_reads, 1000);
  CHECK_GT(s.demotions, 1000);
  CHECK_EQ(s.errors, 0);
  CHECK_EQ(tier.size(), kKeys);
}

// ---------------------------------------------------------------- whole-table operations

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

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
