// tensorflow_ext: one embedding shard of a live serving model, updated by replacement.
//
// A LiveShard is immutable, like the FrozenTable it is made of: a version of a
// served model holds a `std::shared_ptr<const LiveShard>` per shard, and an
// update makes a new LiveShard instead of writing into the old one, so a
// lookup reads with no lock and a request that pinned an older version keeps
// reading it whole. Consecutive versions share what did not change.
//
// Contents: a large `base` table, a small `overlay` table of the rows changed
// since the base was built (null when empty), and `removed`, the sorted keys
// of the base that updates removed. Invariants: removed is a subset of the
// base's keys and holds no overlay key. A key reads
//   overlay's row when in the overlay; else the default row when removed;
//   else base's row when in the base; else the default row.
//
// Memory: a delta (ApplyDelta) never copies the base: it builds a new overlay
// from the old overlay's rows (copied in their stored form) and the delta's
// rows, so it costs O(overlay + delta). Compacted() folds the overlay and the
// removed keys into a new base: O(base), done by the caller when the overlay
// has grown large next to the base (one shard at a time, so that only one
// shard's base exists twice at once).
//
// Errors: std::invalid_argument (a key twice in one delta, an int8 row that
// cannot be stored: FrozenTable::Build's messages), std::bad_alloc.

#ifndef TENSORFLOW_EXT_TABLE_CORE_LIVE_SHARD_H_
#define TENSORFLOW_EXT_TABLE_CORE_LIVE_SHARD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "tensorflow_ext/table/core/frozen_table.h"
#include "tensorflow_ext/table/core/row_codec.h"

namespace tfext {
namespace table {

class LiveShard {
 public:
  // A shard reading exactly `base` (which must not be null): no overlay, nothing removed. Shares `base`.
  static std::shared_ptr<const LiveShard> FromBase(std::shared_ptr<const FrozenTable> base);

  // A shard holding exactly keys[0..n) with their rows (n * dim floats), stored as `storage`: a full update.
  static std::shared_ptr<const LiveShard> FromRows(const int64_t* keys, const float* values, int64_t n, int64_t dim,
                                                   RowStorage storage);

  // This shard with removed[0..m) removed (any order, duplicates allowed; absent keys are ignored), then keys[0..n)
  // set to their rows (n * dim() floats; the keys distinct): a key both removed and set ends present with its new
  // row. Shares the base.
  std::shared_ptr<const LiveShard> ApplyDelta(const int64_t* keys, const float* values, int64_t n,
                                              const int64_t* removed, int64_t m) const;

  // The same contents with the overlay and the removed keys folded into a new base (rows copied in their stored
  // form: every key reads exactly as before).
  std::shared_ptr<const LiveShard> Compacted() const;

  // FrozenTable::Find's contract: the row of each of keys[0..n) into out[i * dim ..] (default_row, dim floats, when
  // absent) and, when `found` is not null, whether present. Thread-safe, takes no lock.
  void Find(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const;

  // The keys a lookup finds.
  int64_t size() const { return size_; }
  int64_t overlay_size() const { return overlay_ != nullptr ? overlay_->size() : 0; }
  int64_t base_size() const { return base_->size(); }
  int64_t removed_size() const { return static_cast<int64_t>(removed_->size()); }
  // Bytes held by the base, the overlay and the removed keys.
  int64_t memory_bytes() const;
  int64_t dim() const { return base_->dim(); }
  RowStorage storage() const { return base_->storage(); }

  const std::shared_ptr<const FrozenTable>& base() const { return base_; }
  // Null when empty.
  const std::shared_ptr<const FrozenTable>& overlay() const { return overlay_; }

 private:
  LiveShard() = default;
  LiveShard(const LiveShard&) = delete;
  LiveShard& operator=(const LiveShard&) = delete;

  // A shard of these parts (the invariants above hold); computes size_.
  static std::shared_ptr<const LiveShard> Make(std::shared_ptr<const FrozenTable> base,
                                               std::shared_ptr<const FrozenTable> overlay,
                                               std::shared_ptr<const std::vector<int64_t>> removed);
  bool IsRemoved(int64_t key) const;

  std::shared_ptr<const FrozenTable> base_;
  std::shared_ptr<const FrozenTable> overlay_;
  // Sorted, distinct, a subset of base_'s keys, none in overlay_.
  std::shared_ptr<const std::vector<int64_t>> removed_;
  int64_t size_ = 0;
};

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_LIVE_SHARD_H_
