// tensorflow_ext: one embedding shard of a live serving model (live_shard.h).

#include "tensorflow_ext/table/core/live_shard.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace tfext {
namespace table {

namespace {

const std::shared_ptr<const std::vector<int64_t>>& NoKeys() {
  static const auto* const kEmpty =
      new std::shared_ptr<const std::vector<int64_t>>(std::make_shared<const std::vector<int64_t>>());
  return *kEmpty;
}

}  // namespace

std::shared_ptr<const LiveShard> LiveShard::Make(std::shared_ptr<const FrozenTable> base,
                                                 std::shared_ptr<const FrozenTable> overlay,
                                                 std::shared_ptr<const std::vector<int64_t>> removed) {
  std::shared_ptr<LiveShard> s(new LiveShard());
  if (overlay != nullptr && overlay->size() == 0) overlay = nullptr;  // the lookup's fast path reads the base only
  // Live keys: the base's, less the removed ones (all in the base), plus the overlay's that the base lacks.
  int64_t size = base->size() - static_cast<int64_t>(removed->size());
  if (overlay != nullptr) {
    const int64_t* keys = overlay->keys();
    for (int64_t j = 0; j < overlay->size(); ++j) size += base->Contains(keys[j]) ? 0 : 1;
  }
  s->base_ = std::move(base);
  s->overlay_ = std::move(overlay);
  s->removed_ = std::move(removed);
  s->size_ = size;
  return s;
}

std::shared_ptr<const LiveShard> LiveShard::FromBase(std::shared_ptr<const FrozenTable> base) {
  if (base == nullptr) throw std::invalid_argument("live shard: the base table must not be null");
  return Make(std::move(base), nullptr, NoKeys());
}

std::shared_ptr<const LiveShard> LiveShard::FromRows(const int64_t* keys, const float* values, int64_t n, int64_t dim,
                                                     RowStorage storage) {
  return FromBase(FrozenTable::Build(keys, values, n, dim, storage));
}

std::shared_ptr<const LiveShard> LiveShard::ApplyDelta(const int64_t* keys, const float* values, int64_t n,
                                                       const int64_t* removed, int64_t m) const {
  if (n < 0 || m < 0) {
    throw std::invalid_argument("live shard delta: counts must be >= 0, got " + std::to_string(n) + " rows and " +
                                std::to_string(m) + " removed keys");
  }
  if (n == 0 && m == 0) return Make(base_, overlay_, removed_);
  // The delta's rows as a table first: refuses a key given twice (and an int8 row it cannot store).
  std::shared_ptr<const FrozenTable> rows = FrozenTable::Build(keys, values, n, dim(), storage());
  // The old overlay less the removed keys, then the new rows (which win over both).
  std::shared_ptr<const FrozenTable> overlay =
      overlay_ == nullptr ? rows : FrozenTable::Merge(*overlay_, rows.get(), removed, m);
  // Removed: the old ones and the new ones that are in the base and not set again.
  std::vector<int64_t> gone;
  gone.reserve(removed_->size() + static_cast<size_t>(m));
  for (int64_t key : *removed_) {
    if (!rows->Contains(key)) gone.push_back(key);
  }
  for (int64_t i = 0; i < m; ++i) {
    if (base_->Contains(removed[i]) && !overlay->Contains(removed[i])) gone.push_back(removed[i]);
  }
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  std::shared_ptr<const std::vector<int64_t>> gone_ptr =
      gone.empty() ? NoKeys() : std::make_shared<const std::vector<int64_t>>(std::move(gone));
  return Make(base_, std::move(overlay), std::move(gone_ptr));
}

std::shared_ptr<const LiveShard> LiveShard::Compacted() const {
  if (overlay_ == nullptr && removed_->empty()) return Make(base_, nullptr, NoKeys());
  return FromBase(FrozenTable::Merge(*base_, overlay_.get(), removed_->data(), removed_size()));
}

bool LiveShard::IsRemoved(int64_t key) const { return std::binary_search(removed_->begin(), removed_->end(), key); }

void LiveShard::Find(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const {
  if (overlay_ == nullptr && removed_->empty()) return base_->Find(keys, n, out, found, default_row);
  const int64_t d = dim();
  // Overlay first for every key; then the keys it lacks, gathered, from the base (unless removed).
  std::unique_ptr<bool[]> in_overlay(new bool[n]());
  if (overlay_ != nullptr) overlay_->Find(keys, n, out, in_overlay.get(), default_row);
  std::vector<int64_t> rest;  // positions to read from the base
  for (int64_t i = 0; i < n; ++i) {
    if (in_overlay[i]) {
      if (found != nullptr) found[i] = true;
    } else if (IsRemoved(keys[i])) {
      std::memcpy(out + i * d, default_row, sizeof(float) * d);
      if (found != nullptr) found[i] = false;
    } else {
      rest.push_back(i);
    }
  }
  if (rest.empty()) return;
  if (static_cast<int64_t>(rest.size()) == n) return base_->Find(keys, n, out, found, default_row);
  std::vector<int64_t> rest_keys(rest.size());
  for (size_t r = 0; r < rest.size(); ++r) rest_keys[r] = keys[rest[r]];
  std::vector<float> rest_out(rest.size() * static_cast<size_t>(d));
  std::unique_ptr<bool[]> rest_found(new bool[rest.size()]());
  base_->Find(rest_keys.data(), static_cast<int64_t>(rest.size()), rest_out.data(), rest_found.get(), default_row);
  for (size_t r = 0; r < rest.size(); ++r) {
    std::memcpy(out + rest[r] * d, rest_out.data() + r * d, sizeof(float) * d);
    if (found != nullptr) found[rest[r]] = rest_found[r];
  }
}

int64_t LiveShard::memory_bytes() const {
  return static_cast<int64_t>(sizeof(LiveShard)) + base_->memory_bytes() +
         (overlay_ != nullptr ? overlay_->memory_bytes() : 0) +
         static_cast<int64_t>(removed_->capacity() * sizeof(int64_t));
}

}  // namespace table
}  // namespace tfext
