// The tiered table: its operations over the whole table (both tiers: size,
// exports, restore, clear, eviction, settling, statistics) and the disk cap,
// the parts that scan the disk tier. Construction, batches and demotion are in
// tiered_table.cc. The contract, the lock order and the design are in
// tiered_table.h; this file explains only local choices.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow_ext/table/tiered/tiered_table.h"

namespace tfext {
namespace table {
namespace {

// Keys a disk-cap pass samples (a reservoir over one scan of the store).
constexpr int64_t kDiskSampleKeys = 65536;
// Bytes an entry takes in the store's files beside its key and value: RocksDB's
// internal key suffix (8), its share of the block index and Bloom filter and
// block slack (measured ~8 at 4 KiB blocks).
constexpr int64_t kDiskEntryOverhead = 16;

}  // namespace

// ---------------------------------------------------------------- disk tier

void TieredTable::ForEachDisk(const std::function<bool(int64_t, const float*, const KeyMeta&)>& fn) const {
  std::vector<int64_t> stale;
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    stale.assign(stale_.begin(), stale_.end());
  }
  std::sort(stale.begin(), stale.end());
  store_->ForEach([&](int64_t key, const float* row, const KeyMeta& meta) {
    if (!stale.empty() && std::binary_search(stale.begin(), stale.end(), key)) return true;
    return fn(key, row, meta);
  });
}

void TieredTable::EnforceDiskCapLocked() {
  if (options_.disk_bytes <= 0 || disk_keys_.load() == 0) return;
  // The cap is kept in keys: disk_keys * bytes per entry <= disk_bytes. Bytes
  // alone cannot drive the drops: the store's files also hold garbage (the
  // rows promoted back, overwritten copies, tombstones) until a compaction,
  // and each drop adds a tombstone, so dropping until the files shrink could
  // empty the tier. Bytes per entry are the entry's size in an SST file,
  // unless the files take more than the cap even after CompactIfNeeded: then
  // what they measure per key, up to twice that (garbage may then cost up to
  // half of the keys the cap allows, until compaction reclaims it and the
  // next pass uses the entry's size again).
  const int64_t nominal = kDiskEntryOverhead + 8 + 4 * width_ + 12;
  int64_t entry_bytes = nominal;
  int64_t keys = disk_keys_.load();
  if (keys * entry_bytes <= options_.disk_bytes) {
    if (store_->disk_bytes() <= options_.disk_bytes) return;
    store_->CompactIfNeeded();
    const int64_t bytes = store_->disk_bytes();
    keys = disk_keys_.load();
    if (bytes <= options_.disk_bytes || keys == 0) return;
    entry_bytes = std::max(nominal, std::min(2 * nominal, (bytes + keys - 1) / keys));
    if (keys * entry_bytes <= options_.disk_bytes) return;
  }
  // Drop down to 90% of the cap, so that the next pass is ~10% of the cap's
  // writes away (each pass scans the store twice).
  const int64_t keep = options_.disk_bytes / entry_bytes * 9 / 10;
  const int64_t drop = keys - keep;
  if (drop <= 0) return;

  // A reservoir sample of the disk rows' metadata (one scan, bounded memory),
  // then the rank of the drop-th lowest. Deterministic: a fixed-seed LCG.
  std::vector<KeyMeta> sample;
  sample.reserve(std::min<int64_t>(keys, kDiskSampleKeys));
  uint64_t seen = 0, rng = 0x9E3779B97F4A7C15ull;
  ForEachDisk([&](int64_t, const float*, const KeyMeta& meta) {
    ++seen;
    if (static_cast<int64_t>(sample.size()) < kDiskSampleKeys) {
      sample.push_back(meta);
    } else {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const uint64_t j = (rng >> 11) % seen;
      if (j < static_cast<uint64_t>(kDiskSampleKeys)) sample[j] = meta;
    }
    return true;
  });
  if (sample.empty()) return;
  std::sort(sample.begin(), sample.end(),
            [this](const KeyMeta& a, const KeyMeta& b) { return RankLE(a, b) && !RankLE(b, a); });
  const double fraction = std::min(1.0, static_cast<double>(drop) / keys);
  const int64_t at =
      std::min<int64_t>(static_cast<int64_t>(sample.size()) - 1,
                        std::max<int64_t>(0, static_cast<int64_t>(std::ceil(fraction * sample.size())) - 1));
  const KeyMeta threshold = sample[at];

  // The keys below it, then those at it, at most `drop` in all (ties are cut
  // in key order).
  std::vector<int64_t> doomed, at_threshold;
  ForEachDisk([&](int64_t key, const float*, const KeyMeta& meta) {
    if (!RankLE(threshold, meta)) {
      doomed.push_back(key);
    } else if (RankLE(meta, threshold) && static_cast<int64_t>(at_threshold.size()) < drop) {
      at_threshold.push_back(key);
    }
    return static_cast<int64_t>(doomed.size()) < drop;
  });
  for (size_t i = 0; i < at_threshold.size() && static_cast<int64_t>(doomed.size()) < drop; ++i) {
    doomed.push_back(at_threshold[i]);
  }

  // Dropped in chunks under promote_mu_: a key promoted since the scan is no
  // longer on disk (Get says so) and is kept; no demotion runs (demote_mu_).
  for (size_t off = 0; off < doomed.size(); off += kDemoteChunk) {
    const int64_t m = std::min<int64_t>(kDemoteChunk, static_cast<int64_t>(doomed.size() - off));
    std::vector<float> rows(m * width_);
    std::vector<KeyMeta> meta(m);
    std::unique_ptr<bool[]> on_disk(new bool[m]);
    std::vector<int64_t> gone;
    std::lock_guard<std::mutex> promoting(promote_mu_);
    store_->Get(doomed.data() + off, m, rows.data(), meta.data(), on_disk.get());
    {
      std::lock_guard<std::mutex> lock(outbox_mu_);
      for (int64_t i = 0; i < m; ++i) {
        if (on_disk[i] && stale_.count(doomed[off + i]) == 0) gone.push_back(doomed[off + i]);
      }
    }
    if (gone.empty()) continue;
    store_->Delete(gone.data(), static_cast<int64_t>(gone.size()));
    disk_keys_.fetch_sub(static_cast<int64_t>(gone.size()));
    dropped_.fetch_add(static_cast<int64_t>(gone.size()), std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(dropped_mu_);
    dropped_keys_.insert(dropped_keys_.end(), gone.begin(), gone.end());
  }
  store_->CompactIfNeeded();
}

// ---------------------------------------------------------------- whole table

int64_t TieredTable::size() const {
  std::lock_guard<std::mutex> counting(count_mu_);
  return memory_->size() + in_flight_ + disk_keys_.load();
}

void TieredTable::Export(int64_t col_begin, int64_t cols,
                         const std::function<HashTable::ExportBuffers(int64_t)>& alloc) const {
  ExportSince(std::numeric_limits<int64_t>::min(), col_begin, cols, alloc);
}

void TieredTable::ExportSince(int64_t min_version, int64_t col_begin, int64_t cols,
                              const std::function<HashTable::ExportBuffers(int64_t)>& alloc) const {
  TieredTable& self = const_cast<TieredTable&>(*this);  // the locks; nothing else changes
  std::lock_guard<std::mutex> round(self.demote_mu_);
  self.ReturnOutboxLocked();
  ExclusiveAccess lock(access_);
  const bool all = min_version == std::numeric_limits<int64_t>::min();
  int64_t on_disk = 0;
  if (all) {
    on_disk = disk_keys_.load();
  } else if (disk_keys_.load() > 0) {
    ForEachDisk([&](int64_t, const float*, const KeyMeta& meta) {
      if (meta.version >= min_version) ++on_disk;
      return true;
    });
  }
  HashTable::ExportBuffers out;
  int64_t in_memory = 0;
  bool allocated = false;
  auto wrap = [&](int64_t n) {
    in_memory = n;
    out = alloc(n + on_disk);
    allocated = true;
    return out;
  };
  if (all) {
    memory_->Export(col_begin, cols, wrap);
  } else {
    memory_->ExportSince(min_version, col_begin, cols, wrap);
  }
  if (!allocated) wrap(0);
  if (on_disk == 0) return;
  int64_t i = in_memory;
  const int64_t end = in_memory + on_disk;
  ForEachDisk([&](int64_t key, const float* row, const KeyMeta& meta) {
    if (meta.version < min_version) return true;
    if (i == end) {
      ++i;  // more than counted: reported below
      return false;
    }
    if (out.keys != nullptr) out.keys[i] = key;
    if (out.rows != nullptr) std::memcpy(out.rows + i * cols, row + col_begin, sizeof(float) * cols);
    if (out.versions != nullptr) out.versions[i] = meta.version;
    if (out.frequencies != nullptr) out.frequencies[i] = meta.frequency;
    ++i;
    return true;
  });
  if (i != end) {
    throw StoreError(StoreError::kCorrupt, "tiered table at " + options_.path + ": the disk tier holds " +
                                               (i > end ? "more" : "fewer") + " rows than the " +
                                               std::to_string(on_disk) +
                                               " it counted (was the store changed by "
                                               "another process?)");
  }
}

void TieredTable::Import(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* rows,
                         const float* column_defaults, const int64_t* versions, const uint32_t* frequencies,
                         bool clear_first, const ParallelFor& pf) {
  if (clear_first) Clear();
  // Chunks of a quarter of the budget: each is promoted and written like a
  // batch, then memory is brought back under budget before the next.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(budget_keys_ / 4, 65536));
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t m = std::min(chunk, n - off);
    {
      SharedAccess lock(access_);
      Promote(keys + off, m, pf);
      memory_->Import(keys + off, m, col_begin, cols, rows + off * cols, column_defaults,
                      versions != nullptr ? versions + off : nullptr,
                      frequencies != nullptr ? frequencies + off : nullptr, pf);
    }
    if (memory_->size() > budget_keys_) {
      std::lock_guard<std::mutex> round(demote_mu_);
      DemoteLocked();
    }
  }
}

void TieredTable::Clear() {
  std::lock_guard<std::mutex> round(demote_mu_);
  ExclusiveAccess lock(access_);
  memory_->Clear();
  store_->Clear();
  std::lock_guard<std::mutex> promoting(promote_mu_);
  std::lock_guard<std::mutex> counting(count_mu_);
  std::lock_guard<std::mutex> outbox_lock(outbox_mu_);
  outbox_ = Outbox();
  outbox_keys_.store(0);
  in_flight_ = 0;
  stale_.clear();
  disk_keys_.store(0);
  promoted_.clear();
  promoted_sorted_ = 0;
  shield_.clear();
}

int64_t TieredTable::RemoveIf(const std::function<bool(int64_t, const float*, const KeyMeta&)>& pred,
                              std::vector<int64_t>* removed_disk_keys) {
  std::lock_guard<std::mutex> round(demote_mu_);
  ReturnOutboxLocked();
  ExclusiveAccess lock(access_);
  int64_t removed = memory_->RemoveIf(pred);
  if (disk_keys_.load() == 0) return removed;
  std::vector<int64_t> doomed;
  ForEachDisk([&](int64_t key, const float* row, const KeyMeta& meta) {
    if (pred(key, row, meta)) doomed.push_back(key);
    return true;
  });
  for (size_t off = 0; off < doomed.size(); off += kDemoteChunk) {
    const int64_t m = std::min<int64_t>(kDemoteChunk, static_cast<int64_t>(doomed.size() - off));
    store_->Delete(doomed.data() + off, m);
    disk_keys_.fetch_sub(m);
    removed += m;
    if (removed_disk_keys != nullptr)
      removed_disk_keys->insert(removed_disk_keys->end(), doomed.begin() + off, doomed.begin() + off + m);
  }
  return removed;
}

void TieredTable::Settle() {
  RethrowPendingError();
  std::lock_guard<std::mutex> round(demote_mu_);
  DemoteLocked();
}

TierStats TieredTable::stats() const {
  TierStats s;
  {
    std::lock_guard<std::mutex> counting(count_mu_);
    s.memory_keys = memory_->size();
    s.disk_keys = in_flight_ + disk_keys_.load();
  }
  s.memory_bytes = memory_->memory_bytes();
  s.disk_bytes = store_->disk_bytes();
  s.budget_keys = budget_keys_;
  s.lookups = lookups_.load(std::memory_order_relaxed);
  s.cold_reads = cold_reads_.load(std::memory_order_relaxed);
  s.demotions = demotions_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  return s;
}

std::vector<int64_t> TieredTable::TakeDroppedKeys() {
  std::lock_guard<std::mutex> lock(dropped_mu_);
  std::vector<int64_t> keys;
  keys.swap(dropped_keys_);
  return keys;
}

}  // namespace table
}  // namespace tfext
