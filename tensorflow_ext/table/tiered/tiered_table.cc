// The tiered table: implementation of construction, batches (promotion) and
// demotion; the whole-table operations and the disk cap are in
// tiered_table_whole.cc. The contract, the lock order and the design are in
// tiered_table.h; this file explains only local choices.

#include "tensorflow_ext/table/tiered/tiered_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

namespace tfext {
namespace table {
namespace {

// Index bytes per key the budget reserves beside each row. Measured on the
// core (memory_bytes() / size() - row_bytes() of tables of 100K-3M keys, width
// 1, 16 and 64): 11-17 bytes (8-byte slots at a load factor between 0.4 and
// 0.8, plus arena chunk slack), up to 20 right after a shard's index doubled.
// The worst case is taken.
constexpr int64_t kIndexBytesPerKey = 20;
// A demotion pass over the rows at its threshold takes them in this many
// growing slices of the key hash (a divisor of 16), so that every shard gives
// its share (see DemoteLocked).
constexpr uint64_t kSpreadLevels = 8;

// Keys whose metadata a demotion round samples to choose its threshold.
constexpr int64_t kSampleKeys = 8192;
// The store's RAM, out of the budget (see "Budget" in the header): two
// write buffers and a block cache of a thirty-second of memory_bytes each,
// up to 16 MiB per buffer and 32 MiB of cache. Smaller write buffers cost
// compaction CPU (each row is rewritten more often): tiered_table_bench
// (300K keys, uniform, 25% in memory: a 28 MB budget; the whole run's
// process CPU) took 10.9 s with buffers of 0.9 MiB (this share), 10.2 s
// with 1.8 MiB, 8.7 s with 3.5 MiB, 8.0 s with 16 MiB, and 7.1-7.4 s with
// the earlier settings (48 MiB of memtables beside the budget). Buffers
// large enough to matter would take a large part of a small budget, whose
// rows then go to disk instead. The cache holds the store's index and
// filter blocks and repeated cold reads; a cold read misses it anyway
// (cold_store_bench: present-key gets at 0.17-0.19 Mkeys/s with 1 or 32
// MiB of cache at 1M rows).
constexpr int64_t kStoreShareDivisor = 32;
constexpr int64_t kMaxWriteBufferBytes = int64_t{16} << 20;
constexpr int64_t kMinBlockCacheBytes = int64_t{64} << 10;
constexpr int64_t kMaxBlockCacheBytes = int64_t{32} << 20;

}  // namespace

// ---------------------------------------------------------------- access lock

void TieredTable::AccessLock::lock_shared() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !writer_ && writers_waiting_ == 0; });
  ++readers_;
}

void TieredTable::AccessLock::unlock_shared() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--readers_ == 0 && writers_waiting_ > 0) cv_.notify_all();
}

void TieredTable::AccessLock::lock() {
  std::unique_lock<std::mutex> lock(mu_);
  ++writers_waiting_;
  cv_.wait(lock, [&] { return !writer_ && readers_ == 0; });
  --writers_waiting_;
  writer_ = true;
}

void TieredTable::AccessLock::unlock() {
  std::lock_guard<std::mutex> lock(mu_);
  writer_ = false;
  cv_.notify_all();
}

// ---------------------------------------------------------------- construction

int64_t TieredTable::BytesPerKey(int64_t row_bytes) {
  // The tier holds up to 1.1x budget_keys (past that, batches demote
  // themselves): that peak is what must fit in memory_bytes, as the memory
  // tier's arena keeps the most rows it ever held. Measured (width 64,
  // budgets of 20K and 100K keys, background demotion, batches of 2048): a
  // peak of 1.11-1.17x budget_keys at 304-314 bytes per key.
  return ((row_bytes + kIndexBytesPerKey) * 11 + 9) / 10;
}

StoreOptions TieredTable::StoreOptionsFor(const TierOptions& options, int64_t width) {
  StoreOptions store_options;
  store_options.path = options.path;
  store_options.width = width;
  store_options.count_keys = false;  // the tier counts its disk keys itself
  const int64_t share = std::max<int64_t>(options.memory_bytes, 0) / kStoreShareDivisor;
  store_options.write_buffer_bytes = std::min(kMaxWriteBufferBytes, std::max(kMinWriteBufferBytes, share));
  store_options.write_buffers = 2;
  store_options.block_cache_bytes = std::min(kMaxBlockCacheBytes, std::max(kMinBlockCacheBytes, share));
  return store_options;
}

int64_t TieredTable::StoreShareBytes(int64_t memory_bytes) {
  TierOptions options;
  options.memory_bytes = memory_bytes;
  // An eighth of the budget at most: from 48 MiB up, the store's whole bound
  // (3/32 of the budget + kStoreFixedMemoryBytes, at most 65.5 MiB) fits in
  // it; below, RocksDB's floors and the fixed cost exceed it, by up to 1.7
  // MiB.
  return std::min(StoreMemoryBytes(StoreOptionsFor(options, 1)), std::max<int64_t>(memory_bytes, 0) / 8);
}

int64_t TieredTable::BudgetKeys(int64_t memory_bytes, int64_t row_bytes) {
  return std::max<int64_t>(0, memory_bytes - StoreShareBytes(memory_bytes)) / BytesPerKey(row_bytes);
}

int64_t TieredTable::MemoryBytesFor(int64_t rows, int64_t row_bytes) {
  // From the rows' bytes plus the largest share up: the smallest budget
  // that holds them (BudgetKeys grows with memory_bytes, give or take a few
  // bytes at the share's rounding: checked on the way).
  const int64_t need = rows * BytesPerKey(row_bytes);
  int64_t lo = need, hi = need + need / 7 + 1;
  while (BudgetKeys(hi, row_bytes) < rows) hi += hi / 8 + BytesPerKey(row_bytes);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (BudgetKeys(mid, row_bytes) >= rows ? hi : lo) = mid;
  }
  return hi;
}

TieredTable::TieredTable(HashTable* memory, const TableOptions& table_options, const TierOptions& options)
    : TieredTable(memory, table_options, options, nullptr) {}

TieredTable::TieredTable(HashTable* memory, const TableOptions& table_options, const TierOptions& options,
                         std::unique_ptr<ColdStore> store)
    : memory_(memory), table_options_(table_options), options_(options), width_(table_options.width) {
  if (memory_ == nullptr) throw std::invalid_argument("a tiered table needs a memory tier; got null");
  if (memory_->width() != width_) {
    throw std::invalid_argument("tiered table at " + options.path + ": the memory tier has width " +
                                std::to_string(memory_->width()) + " but the options say " + std::to_string(width_));
  }
  if (table_options.storage == RowStorage::kInt8Row && table_options.compact_cols > 0) {
    throw std::invalid_argument("tiered table at " + options.path +
                                ": int8_row storage cannot be tiered (a row moved to disk and back would be "
                                "re-quantized, not restored exactly); use float32, bfloat16 or float16 storage");
  }
  if (options.memory_bytes <= 0) {
    throw std::invalid_argument("tiered table at " + options.path + ": memory_bytes must be > 0; got " +
                                std::to_string(options.memory_bytes));
  }
  if (options.disk_bytes < 0) {
    throw std::invalid_argument("tiered table at " + options.path + ": disk_bytes must be >= 0 (0 = no cap); got " +
                                std::to_string(options.disk_bytes));
  }
  if (options.policy != TierOptions::Policy::kLru && options.policy != TierOptions::Policy::kLfu) {
    throw std::invalid_argument("tiered table at " + options.path + ": unknown policy " +
                                std::to_string(static_cast<int>(options.policy)));
  }
  bytes_per_key_ = BytesPerKey(memory_->row_bytes());
  budget_keys_ = BudgetKeys(options.memory_bytes, memory_->row_bytes());
  if (budget_keys_ < kMinBudgetKeys) {
    throw std::invalid_argument(
        "tiered table at " + options.path + ": memory_bytes=" + std::to_string(options.memory_bytes) + " holds " +
        std::to_string(budget_keys_) + " rows of " + std::to_string(bytes_per_key_) +
        " bytes (row + index) beside the disk tier's " + std::to_string(StoreShareBytes(options.memory_bytes)) +
        " bytes; a tier needs room for at least " + std::to_string(kMinBudgetKeys) +
        " rows (memory_bytes >= " + std::to_string(MemoryBytesFor(kMinBudgetKeys, memory_->row_bytes())) + ")");
  }
  if (store != nullptr) {
    store_ = std::move(store);
  } else {
    store_ = OpenColdStore(StoreOptionsFor(options, width_));
  }
  if (options.background) demoter_ = std::thread([this] { DemoterLoop(); });
}

TieredTable::~TieredTable() {
  if (demoter_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      stop_ = true;
    }
    wake_cv_.notify_all();
    demoter_.join();
  }
}

// ---------------------------------------------------------------- batches

std::string TieredTable::BatchTooBigMessage(int64_t rows) const {
  return "tiered table at " + options_.path + ": memory_bytes=" + std::to_string(options_.memory_bytes) + " holds " +
         std::to_string(budget_keys_) + " rows of " + std::to_string(bytes_per_key_) + " bytes; this batch needs " +
         std::to_string(rows) + " rows (raise memory_bytes or make the batch smaller)";
}

void TieredTable::BeforeBatch(const int64_t* keys, int64_t n) {
  RethrowPendingError();
  if (n <= budget_keys_) return;
  // Only a batch longer than the budget can need more rows than it: count its
  // distinct keys (a batch of ids repeats keys).
  std::vector<int64_t> distinct(keys, keys + n);
  std::sort(distinct.begin(), distinct.end());
  const int64_t rows = std::unique(distinct.begin(), distinct.end()) - distinct.begin();
  if (rows > budget_keys_) throw StoreError(StoreError::kInvalid, BatchTooBigMessage(rows));
}

void TieredTable::AfterBatch() {
  const int64_t size = memory_->size();
  if (size <= budget_keys_) return;
  if (!options_.background || size > budget_keys_ + budget_keys_ / 10) {
    // Far over budget (the demoter falls behind the batches) or no demoter:
    // this thread demotes, which also slows the writers down to the pace of
    // the disk.
    std::lock_guard<std::mutex> round(demote_mu_);
    DemoteLocked();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    wake_ = true;
  }
  wake_cv_.notify_one();
}

void TieredTable::Promote(const int64_t* keys, int64_t n, const ParallelFor& pf) {
  if (n <= 0) return;
  lookups_.fetch_add(n, std::memory_order_relaxed);
  // Nothing outside memory: nothing to promote, and no probe spent. Read the
  // outbox first: a retired chunk adds to disk_keys_ before it leaves the
  // outbox, so at least one of the two reads sees its keys.
  if (outbox_keys_.load() == 0 && disk_keys_.load() == 0) return;

  std::vector<KeyMeta> meta(n);
  std::unique_ptr<bool[]> found(new bool[n]);
  memory_->FindMeta(keys, n, meta.data(), found.get(), pf);
  std::vector<int64_t> absent;
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) absent.push_back(keys[i]);
  }
  if (absent.empty()) return;
  std::sort(absent.begin(), absent.end());
  absent.erase(std::unique(absent.begin(), absent.end()), absent.end());

  std::lock_guard<std::mutex> promoting(promote_mu_);
  // Another promoter may have brought some of them in since the look-up.
  {
    const int64_t m = static_cast<int64_t>(absent.size());
    std::vector<KeyMeta> recheck(m);
    std::unique_ptr<bool[]> present(new bool[m]);
    memory_->FindMeta(absent.data(), m, recheck.data(), present.get(), pf);
    int64_t kept = 0;
    for (int64_t i = 0; i < m; ++i) {
      if (!present[i]) absent[kept++] = absent[i];
    }
    absent.resize(kept);
  }
  if (absent.empty()) return;

  // Rows to import: the outbox's first, then the store's.
  std::vector<int64_t> in_keys;
  std::vector<float> in_rows;
  std::vector<int64_t> in_versions;
  std::vector<uint32_t> in_freqs;
  std::vector<int64_t> outbox_hits;  // indices into outbox_
  std::vector<int64_t> candidates;   // absent in memory and the outbox, not stale
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    for (const int64_t key : absent) {
      const auto it = outbox_.at.find(key);
      if (it != outbox_.at.end()) {
        // Taken already: promoted earlier and since removed from memory, so
        // its copy (on its way to disk) is dead.
        if (outbox_.taken[it->second]) continue;
        const int64_t i = it->second;
        in_keys.push_back(key);
        in_rows.insert(in_rows.end(), outbox_.rows.begin() + i * width_, outbox_.rows.begin() + (i + 1) * width_);
        in_versions.push_back(outbox_.meta[i].version);
        in_freqs.push_back(outbox_.meta[i].frequency);
        outbox_hits.push_back(i);
      } else if (stale_.count(key) == 0) {
        candidates.push_back(key);
      }
    }
  }
  std::vector<int64_t> disk_hits;
  if (!candidates.empty() && disk_keys_.load() > 0) {
    const int64_t m = static_cast<int64_t>(candidates.size());
    std::vector<float> rows(m * width_);
    std::vector<KeyMeta> disk_meta(m);
    std::unique_ptr<bool[]> on_disk(new bool[m]);
    store_->Get(candidates.data(), m, rows.data(), disk_meta.data(), on_disk.get());
    for (int64_t i = 0; i < m; ++i) {
      if (!on_disk[i]) continue;
      in_keys.push_back(candidates[i]);
      in_rows.insert(in_rows.end(), rows.begin() + i * width_, rows.begin() + (i + 1) * width_);
      in_versions.push_back(disk_meta[i].version);
      in_freqs.push_back(disk_meta[i].frequency);
      disk_hits.push_back(candidates[i]);
    }
  }
  if (in_keys.empty()) return;

  {
    // The rows enter memory and leave the outbox's and the disk's counts in
    // one step for size().
    std::lock_guard<std::mutex> counting(count_mu_);
    // Whole decoded rows with their metadata: Import re-encodes to nearest,
    // which gives back the stored bits (see the header's contract).
    try {
      memory_->Import(in_keys.data(), static_cast<int64_t>(in_keys.size()), 0, width_, in_rows.data(), nullptr,
                      in_versions.data(), in_freqs.data(), pf);
    } catch (...) {
      // A partial import would leave keys in both tiers: take them out again
      // (nobody else can have inserted them: every batch promotes first,
      // under promote_mu_), so their rows stay where they were.
      memory_->Remove(in_keys.data(), static_cast<int64_t>(in_keys.size()), pf);
      throw;
    }
    if (!outbox_hits.empty()) {
      // The chunk may reach the disk with these rows: the demoter deletes
      // them again when it retires the chunk (it takes promote_mu_, so it
      // cannot retire between this promoter's look-up and this mark).
      std::lock_guard<std::mutex> lock(outbox_mu_);
      for (const int64_t i : outbox_hits) outbox_.taken[i] = 1;
      in_flight_ -= static_cast<int64_t>(outbox_hits.size());
    }
    disk_keys_.fetch_sub(static_cast<int64_t>(disk_hits.size()));
  }
  cold_reads_.fetch_add(static_cast<int64_t>(in_keys.size()), std::memory_order_relaxed);
  // Shielded from the next round (see "Promoted rows"), up to the cap.
  const int64_t room = budget_keys_ / 4 - static_cast<int64_t>(promoted_.size() + shield_.size());
  if (room > 0) {
    promoted_.insert(promoted_.end(), in_keys.begin(),
                     in_keys.begin() + std::min<int64_t>(room, static_cast<int64_t>(in_keys.size())));
  }
  if (!disk_hits.empty()) {
    // Their disk copies are dead now. Deleting them is left to the demoter
    // (after its next round, off the batches' path): a row that goes back to
    // disk before then is simply overwritten, with no tombstone. Past
    // kMaxStaleKeys the batch deletes its own (safe here: with the access
    // lock shared, no demotion can be writing these keys).
    const int64_t m = static_cast<int64_t>(disk_hits.size());
    bool defer = false;
    {
      std::lock_guard<std::mutex> lock(outbox_mu_);
      if (static_cast<int64_t>(stale_.size()) + m <= kMaxStaleKeys) {
        stale_.insert(disk_hits.begin(), disk_hits.end());
        defer = true;
      }
    }
    if (!defer) {
      try {
        store_->Delete(disk_hits.data(), m);
      } catch (const StoreError&) {
        // The rows are in memory, which is what counts: their disk copies
        // stay dead (stale) until a later round deletes them.
        std::lock_guard<std::mutex> lock(outbox_mu_);
        stale_.insert(disk_hits.begin(), disk_hits.end());
        errors_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

// ---------------------------------------------------------------- demotion

bool TieredTable::RankLE(const KeyMeta& a, const KeyMeta& b) const {
  if (options_.policy == TierOptions::Policy::kLfu && a.frequency != b.frequency) return a.frequency < b.frequency;
  return a.version <= b.version;
}

void TieredTable::DemoteLocked() {
  ReturnOutboxLocked();
  if (memory_->size() > budget_keys_) {
    RollShieldLocked();
    const int64_t target = budget_keys_ - budget_keys_ / 10;
    // Each pass samples the memory tier and picks the rank below which the
    // excess lies; a pass whose threshold moves nothing (ties, or rows that
    // were touched since the sample) widens the quantile, and after a few
    // such passes takes any row.
    int widen = 0;
    for (;;) {
      const int64_t size = memory_->size();
      if (size <= target) break;
      const int64_t need = size - target;
      const KeyMeta threshold = ChooseThreshold(need, widen);
      // Strictly below the threshold first, then at it: ties at the
      // threshold (many rows of one version) must not push out rows that
      // rank above rows below it. The last resort (any) takes shielded rows
      // too.
      const bool any = widen >= 4;
      int64_t moved_total = 0;
      int64_t left = need;
      // Passes: strictly below the threshold, then at it in kSpreadLevels
      // growing slices of the key hash. Evacuate fills a chunk from the
      // shard at its cursor on, so a pass that matches many more rows than
      // it needs (ties: a preload's rows all share one version) would empty
      // a few shards and leave the others full; their arenas would then
      // grow while the emptied shards' free rows wait unused (measured: the
      // memory tier at 1.5-2x its budget after a preload). A slice of the
      // hash (independent of the shard) takes the rows evenly from every
      // shard.
      for (uint64_t pass = 0; pass <= kSpreadLevels; ++pass) {
        const bool inclusive = pass > 0;
        const uint64_t slice = (inclusive ? pass : kSpreadLevels) * (16 / kSpreadLevels);
        const std::function<bool(int64_t, const KeyMeta&)> pred = [this, threshold, any, inclusive, slice](
                                                                      int64_t key, const KeyMeta& m) {
          if ((HashKey(key) >> 60) >= slice) return false;
          return any || ((inclusive ? RankLE(m, threshold) : !RankLE(threshold, m)) && !Shielded(key));
        };
        while (left > 0) {
          // Chunks no larger than a write buffer: a larger Put would make
          // its memtable as large (cold_store.h "Memory").
          const int64_t ask = std::min({kDemoteChunk, MaxPutRows(StoreOptionsFor(options_, width_)), left});
          const int64_t moved = DemoteChunk(ask, pred);
          moved_total += moved;
          left -= moved;
          if (moved < ask) break;  // a whole sweep matched fewer
        }
        if (left <= 0) break;
      }
      widen = moved_total == 0 ? widen + 1 : 0;
      if (widen > 4) break;  // nothing left to move (every row is in a batch's hands)
    }
  }
  // After the round: the rows it wrote overwrote the dead copies of their
  // keys, which need no deletion then.
  DeleteStaleLocked();
  EnforceDiskCapLocked();
}

KeyMeta TieredTable::ChooseThreshold(int64_t need, int widen) {
  const auto rank_less = [this](const KeyMeta& a, const KeyMeta& b) { return RankLE(a, b) && !RankLE(b, a); };
  std::vector<KeyMeta> sample;
  memory_->SampleMeta(kSampleKeys, &sample);
  if (sample.empty()) return KeyMeta();
  std::sort(sample.begin(), sample.end(), rank_less);
  const int64_t size = memory_->size();
  const int64_t s = static_cast<int64_t>(sample.size());
  // The shielded rows, by rank: up to kSampleKeys of their keys, spread
  // evenly over both lists, each standing for `weight` keys (a key no longer
  // in memory counts for nothing).
  std::vector<int64_t> keys;
  int64_t shielded = 0;
  {
    std::lock_guard<std::mutex> promoting(promote_mu_);  // promoters append to promoted_
    const int64_t old = static_cast<int64_t>(shield_.size());
    shielded = old + static_cast<int64_t>(promoted_.size());
    const int64_t stride = std::max<int64_t>(1, (shielded + kSampleKeys - 1) / kSampleKeys);
    for (int64_t i = 0; i < shielded; i += stride) keys.push_back(i < old ? shield_[i] : promoted_[i - old]);
  }
  std::vector<KeyMeta> spared;
  if (!keys.empty()) {
    const int64_t m = static_cast<int64_t>(keys.size());
    std::vector<KeyMeta> meta(m);
    std::unique_ptr<bool[]> found(new bool[m]);
    memory_->FindMeta(keys.data(), m, meta.data(), found.get(), InlineParallelFor());
    for (int64_t i = 0; i < m; ++i) {
      if (found[i]) spared.push_back(meta[i]);
    }
    std::sort(spared.begin(), spared.end(), rank_less);
  }
  const double weight = keys.empty() ? 0.0 : static_cast<double>(shielded) / static_cast<double>(keys.size());
  // The first sampled rank at which the movable rows at or below it (all the
  // rows at or below it, less the shielded ones) reach need * 2^widen. With
  // nothing shielded: the need/size quantile.
  const double want = std::ldexp(static_cast<double>(need), widen);
  size_t below = 0;  // shielded rows (of their sample) at or below sample[j]
  for (int64_t j = 0; j < s; ++j) {
    while (below < spared.size() && RankLE(spared[below], sample[j])) ++below;
    const double movable = static_cast<double>(size) * static_cast<double>(j + 1) / static_cast<double>(s) -
                           weight * static_cast<double>(below);
    if (movable >= want) return sample[j];
  }
  return sample[s - 1];
}

void TieredTable::RollShieldLocked() {
  std::lock_guard<std::mutex> promoting(promote_mu_);
  shield_.swap(promoted_);
  promoted_.clear();
  promoted_sorted_ = 0;
  std::sort(shield_.begin(), shield_.end());
  shield_.erase(std::unique(shield_.begin(), shield_.end()), shield_.end());
}

bool TieredTable::Shielded(int64_t key) const {
  return std::binary_search(shield_.begin(), shield_.end(), key) ||
         std::binary_search(promoted_.begin(), promoted_.begin() + promoted_sorted_, key);
}

int64_t TieredTable::DemoteChunk(int64_t max_keys, const std::function<bool(int64_t, const KeyMeta&)>& pred) {
  std::vector<int64_t> keys;
  std::vector<float> rows;
  std::vector<KeyMeta> meta;
  keys.reserve(max_keys);
  rows.reserve(max_keys * width_);
  meta.reserve(max_keys);
  {
    ExclusiveAccess lock(access_);
    // The keys promoted since the last chunk join the sorted part of the
    // shield (no promoter runs now).
    if (promoted_sorted_ < static_cast<int64_t>(promoted_.size())) {
      std::sort(promoted_.begin() + promoted_sorted_, promoted_.end());
      std::inplace_merge(promoted_.begin(), promoted_.begin() + promoted_sorted_, promoted_.end());
      promoted_sorted_ = static_cast<int64_t>(promoted_.size());
    }
    // The rows leave memory's count and enter the outbox's in one step.
    std::lock_guard<std::mutex> counting(count_mu_);
    memory_->Evacuate(max_keys, &evacuate_cursor_, pred, [&](int64_t key, const float* row, const KeyMeta& m) {
      keys.push_back(key);
      rows.insert(rows.end(), row, row + width_);
      meta.push_back(m);
    });
    if (keys.empty()) return 0;
    // Published before the lock is released: a batch that comes next finds
    // the rows here until they are on disk.
    std::lock_guard<std::mutex> outbox_lock(outbox_mu_);
    outbox_.keys = std::move(keys);
    outbox_.rows = std::move(rows);
    outbox_.meta = std::move(meta);
    outbox_.taken.assign(outbox_.keys.size(), 0);
    outbox_.at.clear();
    outbox_.at.reserve(outbox_.keys.size());
    for (size_t i = 0; i < outbox_.keys.size(); ++i) outbox_.at.emplace(outbox_.keys[i], static_cast<int64_t>(i));
    outbox_keys_.store(static_cast<int64_t>(outbox_.keys.size()));
    in_flight_ = static_cast<int64_t>(outbox_.keys.size());
  }
  const int64_t n = static_cast<int64_t>(outbox_.keys.size());
  // Written with no lock held: promoters only read keys, rows and meta (they
  // change under promote_mu_ + outbox_mu_ only, by this thread, below). In
  // the store's key order (big-endian bytes: unsigned order): RocksDB's
  // memtable skip list inserts a sorted batch faster, reusing the previous
  // insert's position (measured: 2.9 instead of 5.0 us of CPU per row, width
  // 64, batches of 16K random keys, the store's presence check included).
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return static_cast<uint64_t>(outbox_.keys[a]) < static_cast<uint64_t>(outbox_.keys[b]);
  });
  std::vector<int64_t> put_keys(n);
  std::vector<float> put_rows(n * width_);
  std::vector<KeyMeta> put_meta(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = order[j];
    put_keys[j] = outbox_.keys[i];
    std::memcpy(&put_rows[j * width_], &outbox_.rows[i * width_], sizeof(float) * width_);
    put_meta[j] = outbox_.meta[i];
  }
  try {
    store_->Put(put_keys.data(), n, put_rows.data(), put_meta.data());
  } catch (const StoreError&) {
    ReturnOutboxLocked();
    throw;
  }
  std::vector<int64_t> taken;
  {
    std::lock_guard<std::mutex> promoting(promote_mu_);
    std::lock_guard<std::mutex> counting(count_mu_);  // in flight -> disk, in one step
    std::lock_guard<std::mutex> lock(outbox_mu_);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = outbox_.keys[i];
      if (outbox_.taken[i]) {
        taken.push_back(key);
        stale_.insert(key);  // dead on disk until deleted below
      } else {
        stale_.erase(key);  // the Put overwrote an older dead copy
      }
    }
    disk_keys_.fetch_add(n - static_cast<int64_t>(taken.size()));
    outbox_ = Outbox();
    outbox_keys_.store(0);
    in_flight_ = 0;
  }
  demotions_.fetch_add(n - static_cast<int64_t>(taken.size()), std::memory_order_relaxed);
  if (!taken.empty()) {
    try {
      store_->Delete(taken.data(), static_cast<int64_t>(taken.size()));
      std::lock_guard<std::mutex> lock(outbox_mu_);
      for (const int64_t key : taken) stale_.erase(key);
    } catch (const StoreError&) {
      errors_.fetch_add(1, std::memory_order_relaxed);  // they stay stale; the next round retries
    }
  }
  return n;
}

void TieredTable::ReturnOutboxLocked() {
  std::lock_guard<std::mutex> promoting(promote_mu_);
  std::lock_guard<std::mutex> counting(count_mu_);  // in flight -> memory, in one step
  std::lock_guard<std::mutex> lock(outbox_mu_);
  const int64_t n = static_cast<int64_t>(outbox_.keys.size());
  if (n == 0) return;
  // The rows nobody took go back to memory, exactly as they left (a taken
  // row is in memory already, or was removed since). No batch can have
  // inserted one of them meanwhile: a batch promotes first, which takes the
  // row from here.
  std::vector<int64_t> keys;
  std::vector<float> rows;
  std::vector<int64_t> versions;
  std::vector<uint32_t> freqs;
  for (int64_t i = 0; i < n; ++i) {
    if (outbox_.taken[i]) continue;
    keys.push_back(outbox_.keys[i]);
    rows.insert(rows.end(), outbox_.rows.begin() + i * width_, outbox_.rows.begin() + (i + 1) * width_);
    versions.push_back(outbox_.meta[i].version);
    freqs.push_back(outbox_.meta[i].frequency);
  }
  // If memory cannot be had the rows stay in the outbox (still readable by
  // promoters) and the next round tries again.
  memory_->Import(keys.data(), static_cast<int64_t>(keys.size()), 0, width_, rows.data(), nullptr, versions.data(),
                  freqs.data(), InlineParallelFor());
  outbox_ = Outbox();
  outbox_keys_.store(0);
  in_flight_ = 0;
}

void TieredTable::DeleteStaleLocked() {
  std::vector<int64_t> stale;
  {
    std::lock_guard<std::mutex> lock(outbox_mu_);
    if (stale_.empty()) return;
    stale.assign(stale_.begin(), stale_.end());
  }
  // Only a demotion (this thread: demote_mu_ is held) makes a stale key live
  // again, so the set cannot gain a live key while the deletion runs. A
  // failure (a full disk) loses nothing: the keys stay stale, the next round
  // tries again.
  try {
    store_->Delete(stale.data(), static_cast<int64_t>(stale.size()));
  } catch (const StoreError&) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::lock_guard<std::mutex> lock(outbox_mu_);
  for (const int64_t key : stale) stale_.erase(key);
}

void TieredTable::DemoterLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      wake_cv_.wait(lock, [&] { return wake_ || stop_; });
      if (stop_) return;
      wake_ = false;
    }
    try {
      std::lock_guard<std::mutex> round(demote_mu_);
      DemoteLocked();
    } catch (...) {
      RecordBackgroundError(std::current_exception());
    }
  }
}

void TieredTable::RecordBackgroundError(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  pending_error_ = std::move(error);
  // Counted once the error is pending: whoever sees the count can rely on
  // the next batch getting the error.
  errors_.fetch_add(1);
}

void TieredTable::RethrowPendingError() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    if (!pending_error_) return;
    std::swap(error, pending_error_);
  }
  std::rethrow_exception(error);
}

}  // namespace table
}  // namespace tfext
