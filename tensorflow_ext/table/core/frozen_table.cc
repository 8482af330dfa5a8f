// tensorflow_ext: the read-only table of served embeddings (frozen_table.h).

#include "tensorflow_ext/table/core/frozen_table.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tensorflow_ext/table/core/mix.h"

namespace tfext {
namespace table {

uint64_t FrozenTable::Bucket(int64_t key) const {
  // The top bits: a shift by 64 is undefined, so a one-bucket table maps every key to 0 explicitly.
  return bucket_bits_ == 0 ? 0 : Murmur3Fmix64(static_cast<uint64_t>(key)) >> (64 - bucket_bits_);
}

std::shared_ptr<const FrozenTable> FrozenTable::Build(const int64_t* keys, const float* values, int64_t n,
                                                      int64_t dim) {
  if (dim < 1) throw std::invalid_argument("frozen table: dim must be >= 1, got " + std::to_string(dim));
  if (n < 0 || n > kMaxKeys) {
    throw std::invalid_argument("frozen table: the number of keys must be in [0, " + std::to_string(kMaxKeys) +
                                "], got " + std::to_string(n));
  }
  std::shared_ptr<FrozenTable> t(new FrozenTable());
  t->dim_ = dim;
  // About 1 to 2 keys per bucket: 2 to 4 directory bytes per key.
  int bits = 0;
  while ((int64_t{1} << (bits + 1)) <= n) ++bits;
  t->bucket_bits_ = bits;
  const uint64_t num_buckets = uint64_t{1} << bits;

  // Counting sort by bucket, then by key inside each bucket, through a permutation (rows move once).
  std::vector<uint32_t> bucket_of(static_cast<size_t>(n));
  t->bucket_start_.assign(num_buckets + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t b = t->Bucket(keys[i]);
    bucket_of[i] = static_cast<uint32_t>(b);
    ++t->bucket_start_[b + 1];
  }
  for (uint64_t b = 0; b < num_buckets; ++b) t->bucket_start_[b + 1] += t->bucket_start_[b];
  std::vector<uint32_t> order(static_cast<size_t>(n));
  {
    std::vector<uint32_t> cursor(t->bucket_start_.begin(), t->bucket_start_.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[cursor[bucket_of[i]]++] = static_cast<uint32_t>(i);
  }
  std::vector<uint32_t>().swap(bucket_of);
  for (uint64_t b = 0; b < num_buckets; ++b) {
    auto first = order.begin() + t->bucket_start_[b];
    auto last = order.begin() + t->bucket_start_[b + 1];
    if (last - first > 1) {
      std::sort(first, last, [keys](uint32_t x, uint32_t y) { return keys[x] < keys[y]; });
      for (auto it = first + 1; it != last; ++it) {
        if (keys[*it] == keys[*(it - 1)]) {
          throw std::invalid_argument("frozen table: key " + std::to_string(keys[*it]) +
                                      " occurs more than once in the keys it is built from");
        }
      }
    }
  }
  t->keys_.resize(static_cast<size_t>(n));
  t->values_.resize(static_cast<size_t>(n * dim));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = order[j];
    t->keys_[j] = keys[i];
    std::memcpy(t->values_.data() + j * dim, values + i * dim, sizeof(float) * dim);
  }
  return t;
}

const float* FrozenTable::FindRow(int64_t key) const {
  if (keys_.empty()) return nullptr;
  const uint64_t b = Bucket(key);
  const uint32_t end = bucket_start_[b + 1];
  for (uint32_t j = bucket_start_[b]; j < end; ++j) {
    if (keys_[j] == key) return values_.data() + static_cast<int64_t>(j) * dim_;
    if (keys_[j] > key) break;  // sorted inside the bucket
  }
  return nullptr;
}

void FrozenTable::Find(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = FindRow(keys[i]);
    std::memcpy(out + i * dim_, row != nullptr ? row : default_row, sizeof(float) * dim_);
    if (found != nullptr) found[i] = row != nullptr;
  }
}

int64_t FrozenTable::memory_bytes() const {
  return static_cast<int64_t>(sizeof(FrozenTable) + bucket_start_.capacity() * sizeof(uint32_t) +
                              keys_.capacity() * sizeof(int64_t) + values_.capacity() * sizeof(float));
}

}  // namespace table
}  // namespace tfext
