// tensorflow_ext: the read-only table of served embeddings (frozen_table.h).

#include "tensorflow_ext/table/core/frozen_table.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tensorflow_ext/table/core/mix.h"
#include "tensorflow_ext/table/core/row_codec_host.h"

namespace tfext {
namespace table {

uint64_t FrozenTable::Bucket(int64_t key) const {
  // The top bits: a shift by 64 is undefined, so a one-bucket table maps every key to 0 explicitly.
  return bucket_bits_ == 0 ? 0 : Murmur3Fmix64(static_cast<uint64_t>(key)) >> (64 - bucket_bits_);
}

namespace {

// The storage's name as the ops spell it (table/kernels/storage_attrs.h), for messages.
const char* StorageName(RowStorage storage) {
  switch (storage) {
    case RowStorage::kFloat32:
      return "float32";
    case RowStorage::kBFloat16:
      return "bfloat16";
    case RowStorage::kFloat16:
      return "float16";
    case RowStorage::kInt8Row:
      return "int8_row";
  }
  return "unknown";
}

// Throws std::invalid_argument naming `key` when an int8 row cannot hold `row` within its error bound.
void CheckInt8Row(int64_t key, const float* row, int64_t dim) {
  constexpr float kFloat16Max = 65504.0f;
  for (int64_t c = 0; c < dim; ++c) {
    if (!RowIsFinite(row + c, 1)) {
      throw std::invalid_argument("frozen table: the row of key " + std::to_string(key) + " holds " +
                                  std::to_string(row[c]) + " in column " + std::to_string(c) +
                                  ": int8 rows hold finite values only");
    }
    if (row[c] > kFloat16Max || row[c] < -kFloat16Max) {
      throw std::invalid_argument("frozen table: the row of key " + std::to_string(key) + " holds " +
                                  std::to_string(row[c]) + " in column " + std::to_string(c) +
                                  ": int8 rows hold values in [-65504, 65504] only (their scale and bias are fp16)");
    }
  }
}

}  // namespace

std::shared_ptr<const FrozenTable> FrozenTable::Build(const int64_t* keys, const float* values, int64_t n, int64_t dim,
                                                      RowStorage storage) {
  if (dim < 1) throw std::invalid_argument("frozen table: dim must be >= 1, got " + std::to_string(dim));
  if (n < 0 || n > kMaxKeys) {
    throw std::invalid_argument("frozen table: the number of keys must be in [0, " + std::to_string(kMaxKeys) +
                                "], got " + std::to_string(n));
  }
  if (storage != RowStorage::kFloat32 && storage != RowStorage::kBFloat16 && storage != RowStorage::kFloat16 &&
      storage != RowStorage::kInt8Row) {
    throw std::invalid_argument("frozen table: unknown row storage " + std::to_string(static_cast<int>(storage)));
  }
  if (storage == RowStorage::kInt8Row) {
    for (int64_t i = 0; i < n; ++i) CheckInt8Row(keys[i], values + i * dim, dim);
  }
  return Lay(keys, n, dim, storage, [keys, values, dim, storage](int64_t i, float* area) {
    if (storage == RowStorage::kInt8Row) {
      EncodeInt8Row(values + i * dim, dim, area);
    } else {
      HostEncodeElements(storage, values + i * dim, 0, dim, area, Rounding::kNearest, keys[i], 0);
    }
  });
}

std::shared_ptr<const FrozenTable> FrozenTable::Lay(const int64_t* keys, int64_t n, int64_t dim, RowStorage storage,
                                                    const std::function<void(int64_t, float*)>& fill_row) {
  std::shared_ptr<FrozenTable> t(new FrozenTable());
  t->dim_ = dim;
  t->storage_ = storage;
  t->row_bytes_ = CompactBytes(storage, dim);
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
  const int64_t row_floats = t->row_bytes_ / 4;
  t->rows_.resize(static_cast<size_t>(n * row_floats));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t i = order[j];
    t->keys_[j] = keys[i];
    fill_row(i, t->rows_.data() + j * row_floats);
  }
  return t;
}

std::shared_ptr<const FrozenTable> FrozenTable::Merge(const FrozenTable& base, const FrozenTable* overlay,
                                                      const int64_t* removed, int64_t n_removed) {
  if (overlay != nullptr && (overlay->dim_ != base.dim_ || overlay->storage_ != base.storage_)) {
    throw std::invalid_argument("frozen table merge: the base has dim=" + std::to_string(base.dim_) +
                                ", storage=" + StorageName(base.storage_) + " but the overlay has dim=" +
                                std::to_string(overlay->dim_) + ", storage=" + StorageName(overlay->storage_));
  }
  // Sorted, so that each base key costs one binary search; removed lists are small next to a base.
  std::vector<int64_t> gone(removed, removed + std::max<int64_t>(n_removed, 0));
  std::sort(gone.begin(), gone.end());
  // The merged keys and where each one's stored row is: base rows first, then the overlay's.
  std::vector<int64_t> keys;
  std::vector<const float*> rows;
  const int64_t overlay_size = overlay != nullptr ? overlay->size() : 0;
  keys.reserve(static_cast<size_t>(base.size() + overlay_size));
  rows.reserve(keys.capacity());
  for (int64_t j = 0; j < base.size(); ++j) {
    const int64_t key = base.keys_[j];
    if (overlay != nullptr && overlay->Contains(key)) continue;
    if (std::binary_search(gone.begin(), gone.end(), key)) continue;
    keys.push_back(key);
    rows.push_back(static_cast<const float*>(base.stored_row(j)));
  }
  for (int64_t j = 0; j < overlay_size; ++j) {
    keys.push_back(overlay->keys_[j]);
    rows.push_back(static_cast<const float*>(overlay->stored_row(j)));
  }
  const int64_t n = static_cast<int64_t>(keys.size());
  if (n > kMaxKeys) {
    throw std::invalid_argument("frozen table merge: the merged table would hold " + std::to_string(n) +
                                " keys, more than " + std::to_string(kMaxKeys));
  }
  const size_t row_bytes = static_cast<size_t>(base.row_bytes_);
  return Lay(keys.data(), n, base.dim_, base.storage_,
             [&rows, row_bytes](int64_t i, float* area) { std::memcpy(area, rows[i], row_bytes); });
}

int64_t FrozenTable::IndexOf(int64_t key) const {
  if (keys_.empty()) return -1;
  const uint64_t b = Bucket(key);
  const uint32_t end = bucket_start_[b + 1];
  for (uint32_t j = bucket_start_[b]; j < end; ++j) {
    if (keys_[j] == key) return j;
    if (keys_[j] > key) break;  // sorted inside the bucket
  }
  return -1;
}

void FrozenTable::DecodeRow(RowStorage storage, int64_t index, float* out) const {
  const float* area = rows_.data() + index * (row_bytes_ / 4);
  if (storage == RowStorage::kInt8Row) {
    DecodeInt8Row(area, dim_, 0, dim_, out);
  } else {
    HostDecodeElements(storage, area, 0, dim_, out);
  }
}

// One instantiation per storage, so that the float32 lookup stays a plain copy with no per-row branch.
template <RowStorage kStorage>
void FrozenTable::FindStored(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = IndexOf(keys[i]);
    if (j >= 0) {
      DecodeRow(kStorage, j, out + i * dim_);
    } else {
      std::memcpy(out + i * dim_, default_row, sizeof(float) * dim_);
    }
    if (found != nullptr) found[i] = j >= 0;
  }
}

void FrozenTable::Find(const int64_t* keys, int64_t n, float* out, bool* found, const float* default_row) const {
  switch (storage_) {
    case RowStorage::kFloat32:
      return FindStored<RowStorage::kFloat32>(keys, n, out, found, default_row);
    case RowStorage::kBFloat16:
      return FindStored<RowStorage::kBFloat16>(keys, n, out, found, default_row);
    case RowStorage::kFloat16:
      return FindStored<RowStorage::kFloat16>(keys, n, out, found, default_row);
    case RowStorage::kInt8Row:
      return FindStored<RowStorage::kInt8Row>(keys, n, out, found, default_row);
  }
}

void FrozenTable::ExportRows(float* out) const {
  for (int64_t j = 0; j < size(); ++j) DecodeRow(storage_, j, out + j * dim_);
}

int64_t FrozenTable::memory_bytes() const {
  return static_cast<int64_t>(sizeof(FrozenTable) + bucket_start_.capacity() * sizeof(uint32_t) +
                              keys_.capacity() * sizeof(int64_t) + rows_.capacity() * sizeof(float));
}

}  // namespace table
}  // namespace tfext
