// Tests of the tiered table's budget arithmetic (tiered_table.h "Budget"): the disk tier's store takes its RAM out
// of memory_bytes, so that memory tier + store stay within it, and the demoter writes chunks that fit a write buffer.
//   bazel test //tensorflow_ext/table/tiered:tiered_budget_test
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorflow_ext/table/tiered/tiered_test_util.h"

namespace {

using namespace tfext_tiered_test;  // NOLINT: the shared helpers and tfext::table names

constexpr int64_t kMiB = int64_t{1} << 20;

TierOptions Budget(int64_t memory_bytes) {
  TierOptions t;
  t.memory_bytes = memory_bytes;
  return t;
}

// Budgets from a few KiB to 100 GiB, dense around the points where the shares meet their floors and caps.
std::vector<int64_t> Budgets() {
  std::vector<int64_t> out;
  for (int64_t m = 16 << 10; m <= (int64_t{100} << 30); m += m / 7 + 1) out.push_back(m);
  for (int64_t edge : {int64_t{2} * kMiB, 48 * kMiB, 512 * kMiB, 1024 * kMiB}) {
    for (int64_t d = -64; d <= 64; ++d) out.push_back(edge + d);
  }
  return out;
}

TFEXT_TEST(TheStoreTakesItsRamOutOfTheBudget) {
  for (const int64_t row_bytes : {int64_t{24}, int64_t{276}, int64_t{1040}}) {
    const int64_t per_key = TieredTable::BytesPerKey(row_bytes);
    for (const int64_t m : Budgets()) {
      const StoreOptions so = TieredTable::StoreOptionsFor(Budget(m), 8);
      const int64_t store = tfext::table::StoreMemoryBytes(so);
      const int64_t share = TieredTable::StoreShareBytes(m);
      const int64_t keys = TieredTable::BudgetKeys(m, row_bytes);
      CHECK_EQ(so.write_buffers, 2);
      // (Values, not std::min's reference to a temporary, into the CHECK.)
      const int64_t want_buffer = std::min<int64_t>(16 * kMiB, std::max(tfext::table::kMinWriteBufferBytes, m / 32));
      const int64_t want_cache = std::min<int64_t>(32 * kMiB, std::max<int64_t>(64 << 10, m / 32));
      CHECK_EQ(so.write_buffer_bytes, want_buffer);
      CHECK_EQ(so.block_cache_bytes, want_cache);
      CHECK(!so.count_keys);
      CHECK_EQ(keys, (m - share) / per_key);
      CHECK_LE(share, m / 8);
      if (m >= 48 * kMiB) {
        // The store's whole bound is subtracted: memory tier + store <= memory_bytes.
        CHECK_EQ(share, store);
        CHECK_LE(keys * per_key + store, m);
      } else {
        // Below, an eighth (linear up to near 48 MiB: a budget measured on one size scales), and the store exceeds it
        // by little.
        CHECK_EQ(share, std::min(store, m / 8));
        if (m < 47 * kMiB) CHECK_EQ(share, m / 8);
        CHECK_LE(store - share, 1741 << 10);  // 1.7 MiB
      }
    }
    // The largest share: both caps and the fixed cost.
    CHECK_EQ(TieredTable::StoreShareBytes(int64_t{100} << 30), 64 * kMiB + tfext::table::kStoreFixedMemoryBytes);
  }
}

TFEXT_TEST(MemoryBytesForIsTheSmallestBudgetThatHoldsTheRows) {
  for (const int64_t row_bytes : {int64_t{24}, int64_t{276}, int64_t{1040}}) {
    for (int64_t rows = 1; rows <= (int64_t{1} << 26); rows = rows * 3 + 1) {
      const int64_t m = TieredTable::MemoryBytesFor(rows, row_bytes);
      CHECK_GE(TieredTable::BudgetKeys(m, row_bytes), rows);
      CHECK_LT(TieredTable::BudgetKeys(m - 1, row_bytes), rows);
    }
  }
}

// A store that forwards to the RocksDB store and records the largest Put.
class RecordingStore : public ColdStore {
 public:
  explicit RecordingStore(std::unique_ptr<ColdStore> inner) : inner_(std::move(inner)) {}
  void Get(const int64_t* keys, int64_t n, float* rows, KeyMeta* meta, bool* found) override {
    inner_->Get(keys, n, rows, meta, found);
  }
  void Put(const int64_t* keys, int64_t n, const float* rows, const KeyMeta* meta) override {
    int64_t seen = largest_put.load();
    while (n > seen && !largest_put.compare_exchange_weak(seen, n)) {
    }
    ++puts;
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

  std::atomic<int64_t> largest_put{0};
  std::atomic<int64_t> puts{0};

 private:
  std::unique_ptr<ColdStore> inner_;
};

// A 4 MiB budget: the store gets write buffers of 128 KiB, so a demotion round of thousands of rows goes to disk
// in chunks of MaxPutRows (~370 rows of width 64), not in one Put that would grow a memtable to its size. Every row
// comes back exact.
TFEXT_TEST(DemotionWritesChunksThatFitAWriteBuffer) {
  TableOptions o;
  o.width = 64;
  HashTable plain(o), memory(o);
  const std::string dir = TempDir();
  TierOptions t = Tier(dir + "/store", 4 * kMiB, false);
  const StoreOptions so = TieredTable::StoreOptionsFor(t, o.width);
  CHECK_EQ(so.write_buffer_bytes, 128 << 10);
  const int64_t max_rows = tfext::table::MaxPutRows(so);
  CHECK_LT(max_rows * (o.width * 4 + 12), so.write_buffer_bytes);
  auto owned = std::make_unique<RecordingStore>(OpenColdStore(so));
  RecordingStore* store = owned.get();
  TieredTable tier(&memory, o, t, std::move(owned));
  CHECK_EQ(tier.budget_keys(), TieredTable::BudgetKeys(4 * kMiB, memory.row_bytes()));
  const int64_t n = 4 * tier.budget_keys();
  Fill(&tier, &plain, n, 2048);
  tier.Settle();
  const TierStats s = tier.stats();
  CHECK_LE(s.memory_keys, s.budget_keys);
  CHECK_GE(s.demotions, n - s.budget_keys);
  CHECK_GT(s.demotions, 8 * max_rows);  // rounds far larger than a chunk
  CHECK_LE(store->largest_put.load(), max_rows);
  CHECK_GE(store->puts.load(), s.demotions / max_rows);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
