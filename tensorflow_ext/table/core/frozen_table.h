// tensorflow_ext: the read-only table of served embeddings.
//
// A FrozenTable maps int64 keys to `dim` float32 values and is immutable once
// built: every member function is const and there is no insert, remove or
// grow. Serving code holds a `std::shared_ptr<const FrozenTable>`, so the
// compiler refuses any write. Having no writer, lookups take no lock.
//
// Memory: the keys (8 bytes each) and values (4 * dim bytes each) in two flat
// arrays with no per-key metadata and no growth headroom, plus a bucket
// directory of 4 bytes per 1 to 2 keys. Keys are ordered by bucket (the top
// bits of Murmur3Fmix64(key)) and by key inside a bucket; a lookup reads one
// directory entry and scans its bucket's keys (about 1.5 on average), which
// are contiguous.

#ifndef TENSORFLOW_EXT_TABLE_CORE_FROZEN_TABLE_H_
#define TENSORFLOW_EXT_TABLE_CORE_FROZEN_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace tfext {
namespace table {

class FrozenTable {
 public:
  // The most keys one table holds (bucket offsets are 32-bit).
  static constexpr int64_t kMaxKeys = (int64_t{1} << 32) - 2;

  // Builds a table from `n` distinct keys and their rows (`values`, n * dim
  // floats, row-major). Throws std::invalid_argument when dim < 1, n < 0,
  // n > kMaxKeys or a key occurs twice (the message names the key), and
  // std::bad_alloc when memory runs out.
  static std::shared_ptr<const FrozenTable> Build(const int64_t* keys, const float* values, int64_t n, int64_t dim);

  // Writes the row of each of keys[0..n) to out[i * dim ..] (default_row,
  // dim floats, for a key that is absent) and, when `found` is not null,
  // whether the key is present. Thread-safe.
  void Find(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const;

  // The row of `key` (dim floats), or nullptr.
  const float* FindRow(int64_t key) const;

  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  int64_t dim() const { return dim_; }
  // Bytes held by the arrays.
  int64_t memory_bytes() const;
  // The keys [size()] and rows [size(), dim] in the table's order.
  const int64_t* keys() const { return keys_.data(); }
  const float* values() const { return values_.data(); }

 private:
  FrozenTable() = default;
  FrozenTable(const FrozenTable&) = delete;
  FrozenTable& operator=(const FrozenTable&) = delete;

  uint64_t Bucket(int64_t key) const;

  int64_t dim_ = 1;
  int bucket_bits_ = 0;
  // Bucket b holds keys_[bucket_start_[b] .. bucket_start_[b + 1]).
  std::vector<uint32_t> bucket_start_;
  std::vector<int64_t> keys_;
  std::vector<float> values_;
};

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_FROZEN_TABLE_H_
