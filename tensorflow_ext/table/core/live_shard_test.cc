// Tests of the live serving shard (live_shard.h) and FrozenTable::Merge: a LiveShard driven by random deltas, full
// updates and compactions must read exactly as a FrozenTable built afresh from a reference std::map of the live rows,
// for every row storage; Merge must copy stored rows byte for byte.

#include "tensorflow_ext/table/core/live_shard.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow_ext/table/core/frozen_table.h"
#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::FrozenTable;
using tfext::table::LiveShard;
using tfext::table::RowStorage;

constexpr RowStorage kAllStorages[] = {RowStorage::kFloat32, RowStorage::kBFloat16, RowStorage::kFloat16,
                                       RowStorage::kInt8Row};

using Reference = std::map<int64_t, std::vector<float>>;

std::vector<float> RandomRow(std::mt19937_64& rng, int64_t dim) {
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> row(dim);
  for (float& x : row) x = u(rng);
  return row;
}

// Where each key of `t` is stored.
std::unordered_map<int64_t, int64_t> IndexOfKeys(const FrozenTable& t) {
  std::unordered_map<int64_t, int64_t> index;
  for (int64_t j = 0; j < t.size(); ++j) index[t.keys()[j]] = j;
  return index;
}

// Checks that `shard` reads every key of `probe` exactly (bit for bit, found flags too) as a FrozenTable built from
// `ref` (the rows given to the shard, each encoded by one Build), and holds ref.size() keys.
void CheckReadsAsReference(const LiveShard& shard, const Reference& ref, const std::vector<int64_t>& probe) {
  const int64_t dim = shard.dim();
  std::vector<int64_t> keys;
  std::vector<float> values;
  for (const auto& kv : ref) {
    keys.push_back(kv.first);
    values.insert(values.end(), kv.second.begin(), kv.second.end());
  }
  auto expected_table =
      FrozenTable::Build(keys.data(), values.data(), static_cast<int64_t>(keys.size()), dim, shard.storage());
  CHECK_EQ(shard.size(), static_cast<int64_t>(ref.size()));
  const int64_t n = static_cast<int64_t>(probe.size());
  std::vector<float> def(dim);
  for (int64_t c = 0; c < dim; ++c) def[c] = -100.f - c;
  std::vector<float> want(n * dim), got(n * dim), got_nofound(n * dim);
  std::unique_ptr<bool[]> want_found(new bool[n]), got_found(new bool[n]);
  expected_table->Find(probe.data(), n, want.data(), want_found.get(), def.data());
  shard.Find(probe.data(), n, got.data(), got_found.get(), def.data());
  shard.Find(probe.data(), n, got_nofound.data(), nullptr, def.data());
  CHECK(std::memcmp(want.data(), got.data(), sizeof(float) * n * dim) == 0);
  CHECK(std::memcmp(want.data(), got_nofound.data(), sizeof(float) * n * dim) == 0);
  for (int64_t i = 0; i < n; ++i) {
    CHECK_EQ(got_found[i], want_found[i]);
    CHECK_EQ(got_found[i], ref.count(probe[i]) == 1);
  }
  // One key at a time too (a batch that is all overlay, all removed or all base takes other paths).
  for (int64_t i = 0; i < n; i += 7) {
    std::vector<float> one(dim);
    bool found = false;
    shard.Find(&probe[i], 1, one.data(), &found, def.data());
    CHECK(std::memcmp(one.data(), want.data() + i * dim, sizeof(float) * dim) == 0);
    CHECK_EQ(found, want_found[i]);
  }
}

TFEXT_TEST(MergeCopiesStoredRowsExactly) {
  std::mt19937_64 rng(11);
  for (RowStorage storage : kAllStorages) {
    const int64_t dim = 5;
    std::vector<int64_t> base_keys, overlay_keys;
    std::vector<float> base_values, overlay_values;
    for (int64_t k = 0; k < 300; ++k) {
      base_keys.push_back(k * 3);
      auto row = RandomRow(rng, dim);
      base_values.insert(base_values.end(), row.begin(), row.end());
    }
    for (int64_t k = 0; k < 100; ++k) {
      overlay_keys.push_back(k * 5);  // some in the base (multiples of 15), most not
      auto row = RandomRow(rng, dim);
      overlay_values.insert(overlay_values.end(), row.begin(), row.end());
    }
    auto base = FrozenTable::Build(base_keys.data(), base_values.data(), 300, dim, storage);
    auto overlay = FrozenTable::Build(overlay_keys.data(), overlay_values.data(), 100, dim, storage);
    // Removed: base keys, an overlay key (an overlay row wins over a removal), absent keys, a duplicate.
    const std::vector<int64_t> removed = {3, 6, 6, 9, 15, 100000, -4};
    auto merged = FrozenTable::Merge(*base, overlay.get(), removed.data(), static_cast<int64_t>(removed.size()));
    CHECK_EQ(merged->dim(), dim);
    CHECK(merged->storage() == storage);
    const auto base_index = IndexOfKeys(*base);
    const auto overlay_index = IndexOfKeys(*overlay);
    std::set<int64_t> want;
    for (int64_t k : base_keys) {
      if (k != 3 && k != 6 && k != 9) want.insert(k);
    }
    want.insert(overlay_keys.begin(), overlay_keys.end());
    CHECK_EQ(merged->size(), static_cast<int64_t>(want.size()));
    const int64_t row_bytes = merged->row_bytes();
    for (int64_t j = 0; j < merged->size(); ++j) {
      const int64_t key = merged->keys()[j];
      CHECK(want.count(key) == 1);
      auto from_overlay = overlay_index.find(key);
      const void* source = from_overlay != overlay_index.end() ? overlay->stored_row(from_overlay->second)
                                                               : base->stored_row(base_index.at(key));
      CHECK(std::memcmp(merged->stored_row(j), source, row_bytes) == 0);
    }
    // Every merged key is found (the directory is rebuilt, not copied).
    for (int64_t key : want) CHECK(merged->Contains(key));
    CHECK(!merged->Contains(3));
    // No overlay: base less the removed keys.
    auto pruned = FrozenTable::Merge(*base, nullptr, removed.data(), static_cast<int64_t>(removed.size()));
    CHECK_EQ(pruned->size(), 300 - 4);  // 3, 6, 9, 15
  }
}

TFEXT_TEST(MergeRefusesAnotherDimOrStorage) {
  const int64_t key = 1;
  const float row[4] = {1.f, 2.f, 3.f, 4.f};
  auto base = FrozenTable::Build(&key, row, 1, 4, RowStorage::kFloat32);
  auto other_dim = FrozenTable::Build(&key, row, 1, 2, RowStorage::kFloat32);
  auto other_storage = FrozenTable::Build(&key, row, 1, 4, RowStorage::kFloat16);
  for (const FrozenTable* overlay : {other_dim.get(), other_storage.get()}) {
    std::string message;
    try {
      FrozenTable::Merge(*base, overlay, nullptr, 0);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    CHECK(message.find("the base has dim=4, storage=float32") != std::string::npos);
    CHECK(message.find(overlay == other_dim.get() ? "overlay has dim=2, storage=float32"
                                                  : "overlay has dim=4, storage=float16") != std::string::npos);
  }
}

// Random deltas (new keys, rewritten keys, removed keys present and absent, keys removed and set in one delta), full
// updates and compactions; after each step the shard and every older shard still held read as their references.
TFEXT_TEST(LiveShardMatchesReferenceUnderRandomUpdates) {
  for (RowStorage storage : kAllStorages) {
    std::mt19937_64 rng(1234 + static_cast<int>(storage));
    const int64_t dim = 3;
    const int64_t universe = 600;
    std::vector<int64_t> probe;
    for (int64_t k = -20; k < universe + 20; ++k) probe.push_back(k);
    std::shuffle(probe.begin(), probe.end(), rng);

    Reference ref;
    std::vector<int64_t> keys;
    std::vector<float> values;
    for (int64_t k = 0; k < universe; k += 2) {
      ref[k] = RandomRow(rng, dim);
      keys.push_back(k);
      values.insert(values.end(), ref[k].begin(), ref[k].end());
    }
    auto base = FrozenTable::Build(keys.data(), values.data(), static_cast<int64_t>(keys.size()), dim, storage);
    std::shared_ptr<const LiveShard> shard = LiveShard::FromBase(base);
    CHECK(shard->base() == base);  // shared, not copied
    CheckReadsAsReference(*shard, ref, probe);

    // Older shards and their references: an update must never change a shard already made.
    std::vector<std::pair<std::shared_ptr<const LiveShard>, Reference>> history;
    int compactions = 0, fulls = 0;
    for (int step = 0; step < 80; ++step) {
      const int what = static_cast<int>(rng() % 10);
      if (what == 0) {
        // Full update: a new random set of keys.
        ref.clear();
        keys.clear();
        values.clear();
        for (int64_t k = 0; k < universe; ++k) {
          if (rng() % 3 != 0) continue;
          ref[k] = RandomRow(rng, dim);
          keys.push_back(k);
          values.insert(values.end(), ref[k].begin(), ref[k].end());
        }
        shard = LiveShard::FromRows(keys.data(), values.data(), static_cast<int64_t>(keys.size()), dim, storage);
        CHECK_EQ(shard->overlay_size(), 0);
        ++fulls;
      } else if (what == 1) {
        shard = shard->Compacted();
        CHECK_EQ(shard->overlay_size(), 0);
        CHECK_EQ(shard->removed_size(), 0);
        CHECK_EQ(shard->base_size(), static_cast<int64_t>(ref.size()));
        ++compactions;
      } else {
        // Delta: removals first, then rows.
        std::vector<int64_t> removed;
        const int64_t m = static_cast<int64_t>(rng() % 40);
        for (int64_t i = 0; i < m; ++i) removed.push_back(static_cast<int64_t>(rng() % (universe + 10)));
        std::set<int64_t> set_keys;
        const int64_t n = static_cast<int64_t>(rng() % 60);
        for (int64_t i = 0; i < n; ++i) set_keys.insert(static_cast<int64_t>(rng() % universe));
        if (!removed.empty() && rng() % 2 == 0) set_keys.insert(removed[0] % universe);  // removed and set again
        keys.assign(set_keys.begin(), set_keys.end());
        std::shuffle(keys.begin(), keys.end(), rng);
        values.clear();
        for (int64_t k : removed) ref.erase(k);
        for (int64_t k : keys) {
          ref[k] = RandomRow(rng, dim);
          values.insert(values.end(), ref[k].begin(), ref[k].end());
        }
        auto before = shard;
        shard = shard->ApplyDelta(keys.data(), values.data(), static_cast<int64_t>(keys.size()), removed.data(), m);
        CHECK(shard->base() == before->base());  // a delta never copies the base
        CHECK_LE(shard->removed_size(), shard->base_size());
      }
      CheckReadsAsReference(*shard, ref, probe);
      if (step % 10 == 0) history.emplace_back(shard, ref);
    }
    for (const auto& old : history) CheckReadsAsReference(*old.first, old.second, probe);
    CHECK_GT(compactions, 0);
    CHECK_GT(fulls, 0);
  }
}

TFEXT_TEST(LiveShardRemovedThenSetKeyIsPresent) {
  const int64_t base_keys[3] = {1, 2, 3};
  const float base_rows[3] = {10.f, 20.f, 30.f};
  auto shard = LiveShard::FromBase(FrozenTable::Build(base_keys, base_rows, 3, 1, RowStorage::kFloat32));
  const int64_t removed[3] = {2, 3, 9};
  const int64_t keys[1] = {3};
  const float rows[1] = {33.f};
  auto next = shard->ApplyDelta(keys, rows, 1, removed, 3);
  CHECK_EQ(next->size(), 2);
  CHECK_EQ(next->removed_size(), 1);  // 2 only: 3 is set again, 9 was never there
  CHECK_EQ(next->overlay_size(), 1);
  const int64_t probe[4] = {1, 2, 3, 9};
  float out[4];
  bool found[4];
  const float def = -1.f;
  next->Find(probe, 4, out, found, &def);
  CHECK_EQ(out[0], 10.f);
  CHECK_EQ(out[1], -1.f);
  CHECK_EQ(out[2], 33.f);
  CHECK_EQ(out[3], -1.f);
  CHECK(found[0] && !found[1] && found[2] && !found[3]);
  // The shard it came from is unchanged.
  shard->Find(probe, 4, out, found, &def);
  CHECK_EQ(out[1], 20.f);
  CHECK_EQ(out[2], 30.f);
  // Removing an overlay-only key drops it from the overlay, not into removed.
  const int64_t new_key = 50;
  const float new_row = 5.f;
  auto with_new = next->ApplyDelta(&new_key, &new_row, 1, nullptr, 0);
  CHECK_EQ(with_new->size(), 3);
  auto without = with_new->ApplyDelta(nullptr, nullptr, 0, &new_key, 1);
  CHECK_EQ(without->size(), 2);
  CHECK_EQ(without->removed_size(), 1);
  CHECK_EQ(without->overlay_size(), 1);
  // An empty delta shares every part.
  auto same = without->ApplyDelta(nullptr, nullptr, 0, nullptr, 0);
  CHECK(same->overlay() == without->overlay());
  CHECK_EQ(same->size(), without->size());
}

TFEXT_TEST(LiveShardDeltaRefusesDuplicateKeys) {
  for (RowStorage storage : kAllStorages) {
    const int64_t base_key = 1;
    const float base_row[2] = {1.f, 2.f};
    auto shard = LiveShard::FromBase(FrozenTable::Build(&base_key, base_row, 1, 2, storage));
    const int64_t keys[3] = {5, 7, 5};
    const float rows[6] = {1.f, 1.f, 2.f, 2.f, 3.f, 3.f};
    std::string message;
    try {
      shard->ApplyDelta(keys, rows, 3, nullptr, 0);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    CHECK(message.find("key 5 occurs more than once") != std::string::npos);
    message.clear();
    try {
      LiveShard::FromRows(keys, rows, 3, 2, storage);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    CHECK(message.find("key 5 occurs more than once") != std::string::npos);
    CHECK_EQ(shard->size(), 1);
  }
}

TFEXT_TEST(LiveShardMemoryCountsEveryPart) {
  std::vector<int64_t> keys(1000);
  for (int64_t i = 0; i < 1000; ++i) keys[i] = i;
  const std::vector<float> rows(1000 * 4, 0.5f);
  auto base = FrozenTable::Build(keys.data(), rows.data(), 1000, 4, RowStorage::kFloat32);
  auto shard = LiveShard::FromBase(base);
  CHECK_GE(shard->memory_bytes(), base->memory_bytes());
  const int64_t removed[2] = {3, 4};
  auto next = shard->ApplyDelta(keys.data() + 990, rows.data(), 10, removed, 2);
  CHECK_GE(next->memory_bytes(), base->memory_bytes() + next->overlay()->memory_bytes() + 2 * 8);
  // Compacted: one base of the 998 live keys, no overlay.
  auto compact = next->Compacted();
  CHECK_EQ(compact->base_size(), 998);
  CHECK(compact->overlay() == nullptr);
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
