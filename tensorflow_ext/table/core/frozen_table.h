// tensorflow_ext: the read-only table of served embeddings.
//
// A FrozenTable maps int64 keys to `dim` float32 values and is immutable once
// built: every member function is const and there is no insert, remove or
// grow. Serving code holds a `std::shared_ptr<const FrozenTable>`, so the
// compiler refuses any write. Having no writer, lookups take no lock.
//
// Storage (row_codec.h): the table stores each row as `dim` float32
// (RowStorage::kFloat32), bfloat16 or float16 columns (kBFloat16, kFloat16:
// rounded to nearest even when built), or as an int8 row (kInt8Row: dim uint8
// codes and a per-row fp16 scale and bias; column j reads bias + scale * q[j]
// and differs from the value it was built from by at most scale / 2, plus the
// float32 rounding of that decode; an all-zero row reads exact zeros). Callers
// always see float32: Find and ExportRows decode inside the read.
//  * bf16 and fp16 follow the codec's range rules: finite values beyond the
//    storage's range saturate to its largest finite value, NaN and +-Inf are
//    kept.
//  * int8 rows cannot hold NaN, +-Inf or values beyond the fp16 range
//    (|x| > 65504: the scale and bias are fp16) within the error bound, so
//    Build refuses such a row (std::invalid_argument naming its key).
//
// Memory: the keys (8 bytes each) and rows (CompactBytes(storage, dim) bytes
// each: 4 * dim for float32, 2 * dim rounded up to 4 bytes for bf16 and fp16,
// dim + 4 rounded up to 4 bytes for int8 rows) in two flat arrays with no
// per-key metadata and no growth headroom, plus a bucket directory of 4 bytes
// per 1 to 2 keys. Keys are ordered by bucket (the top bits of
// Murmur3Fmix64(key)) and by key inside a bucket; a lookup reads one
// directory entry and scans its bucket's keys (about 1.5 on average), which
// are contiguous.

#ifndef TENSORFLOW_EXT_TABLE_CORE_FROZEN_TABLE_H_
#define TENSORFLOW_EXT_TABLE_CORE_FROZEN_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tensorflow_ext/table/core/row_codec.h"

namespace tfext {
namespace table {

class FrozenTable {
 public:
  // The most keys one table holds (bucket offsets are 32-bit).
  static constexpr int64_t kMaxKeys = (int64_t{1} << 32) - 2;

  // Builds a table from `n` distinct keys and their rows (`values`, n * dim
  // floats, row-major), stored as `storage`. Throws std::invalid_argument
  // when dim < 1, n < 0, n > kMaxKeys, a key occurs twice, or (kInt8Row) a
  // row holds a value that is not finite or beyond the fp16 range (the
  // message names the key), and std::bad_alloc when memory runs out.
  static std::shared_ptr<const FrozenTable> Build(const int64_t* keys, const float* values, int64_t n, int64_t dim,
                                                  RowStorage storage);

  // A table holding base's keys that are neither in `overlay` (may be null:
  // empty) nor among removed[0..n_removed) (any order, duplicates allowed),
  // plus every key of `overlay`, each with the row of the table it comes from
  // copied in its stored form: no decode and re-encode, so a merged row reads
  // exactly as it did in its source. Throws std::invalid_argument when
  // overlay's dim or storage differs from base's (naming both), and
  // std::bad_alloc when memory runs out. Memory: the new table plus 24 bytes
  // per key while it is built; neither source is copied beforehand.
  static std::shared_ptr<const FrozenTable> Merge(const FrozenTable& base, const FrozenTable* overlay,
                                                  const int64_t* removed, int64_t n_removed);

  // Writes the decoded row of each of keys[0..n) to out[i * dim ..]
  // (default_row, dim floats, for a key that is absent) and, when `found` is
  // not null, whether the key is present. Thread-safe.
  void Find(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const;

  // Whether `key` is in the table. Thread-safe.
  bool Contains(int64_t key) const { return IndexOf(key) >= 0; }

  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  int64_t dim() const { return dim_; }
  RowStorage storage() const { return storage_; }
  // Bytes held by the arrays.
  int64_t memory_bytes() const;
  // The keys [size()] in the table's order.
  const int64_t* keys() const { return keys_.data(); }
  // Writes the decoded rows [size(), dim] in the order of keys() to `out`.
  void ExportRows(float* out) const;
  // The stored form of row `index` (of keys()[index]): row_bytes() bytes, as row_codec.h encodes `storage()`.
  const void* stored_row(int64_t index) const { return rows_.data() + index * (row_bytes_ / 4); }
  int64_t row_bytes() const { return row_bytes_; }

 private:
  FrozenTable() = default;
  FrozenTable(const FrozenTable&) = delete;
  FrozenTable& operator=(const FrozenTable&) = delete;

  // A table of dim, storage holding keys[0..n), the row of keys[i] written into its stored area by
  // fill_row(i, area) (Build encodes, Merge copies). Throws std::invalid_argument for a duplicate key.
  static std::shared_ptr<const FrozenTable> Lay(const int64_t* keys, int64_t n, int64_t dim, RowStorage storage,
                                                const std::function<void(int64_t, float*)>& fill_row);

  uint64_t Bucket(int64_t key) const;
  // The position of `key` in keys_, or -1.
  int64_t IndexOf(int64_t key) const;
  // Decodes row `index` (stored as `storage`, which is storage_) into out[0..dim).
  void DecodeRow(RowStorage storage, int64_t index, float* out) const;
  // Find for a table of storage kStorage (a constant, so that a float32 lookup is a plain copy).
  template <RowStorage kStorage>
  void FindStored(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const;

  int64_t dim_ = 1;
  RowStorage storage_ = RowStorage::kFloat32;
  // Bytes of one stored row: CompactBytes(storage_, dim_).
  int64_t row_bytes_ = 4;
  int bucket_bits_ = 0;
  // Bucket b holds keys_[bucket_start_[b] .. bucket_start_[b + 1]).
  std::vector<uint32_t> bucket_start_;
  std::vector<int64_t> keys_;
  // Row j (of keys_[j]) is rows_[j * row_bytes_ .. (j + 1) * row_bytes_); float32-aligned.
  std::vector<float> rows_;
};

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_FROZEN_TABLE_H_
