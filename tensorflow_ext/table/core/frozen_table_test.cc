// Tests of the read-only serving table (frozen_table.h) against std::unordered_map, and of its compact storages
// against references computed independently of row_codec.h (bf16: float32 bits rounded to nearest even; fp16:
// GCC's _Float16 conversion, which numpy's float16 matches; int8 rows: the bound scale / 2).

#include "tensorflow_ext/table/core/frozen_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::FrozenTable;
using tfext::table::RowStorage;

constexpr RowStorage kAllStorages[] = {RowStorage::kFloat32, RowStorage::kBFloat16, RowStorage::kFloat16,
                                       RowStorage::kInt8Row};

// The row of `key` (dim floats) and whether it was found.
std::vector<float> FindOne(const FrozenTable& t, int64_t key, bool* found) {
  std::vector<float> row(t.dim());
  const std::vector<float> def(t.dim(), -7.f);
  t.Find(&key, 1, row.data(), found, def.data());
  return row;
}

// bfloat16 round to nearest even, from the float32 bits (finite inputs below the bf16 maximum).
float BFloat16Nearest(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

TFEXT_TEST(FrozenEmptyTableFindsNothing) {
  for (RowStorage storage : kAllStorages) {
    auto t = FrozenTable::Build(nullptr, nullptr, 0, 3, storage);
    CHECK_EQ(t->size(), 0);
    const int64_t key = 7;
    const float def[3] = {1.f, 2.f, 3.f};
    float out[3] = {0.f, 0.f, 0.f};
    bool found = true;
    t->Find(&key, 1, out, &found, def);
    CHECK(!found);
    CHECK_EQ(out[2], 3.f);
  }
}

TFEXT_TEST(FrozenMatchesAMapForManySizes) {
  std::mt19937_64 rng(3);
  for (int64_t n : {1, 2, 3, 5, 64, 1000, 100003}) {
    const int64_t dim = 4;
    std::unordered_map<int64_t, std::vector<float>> ref;
    std::vector<int64_t> keys;
    std::vector<float> values;
    while (static_cast<int64_t>(keys.size()) < n) {
      // Extreme keys included: every int64 is a key.
      int64_t k = keys.size() == 0 ? INT64_MIN : keys.size() == 1 ? -1 : static_cast<int64_t>(rng());
      if (ref.count(k)) continue;
      std::vector<float> row(dim);
      for (auto& v : row) v = static_cast<float>(rng() % 1000) / 7.f;
      ref[k] = row;
      keys.push_back(k);
      values.insert(values.end(), row.begin(), row.end());
    }
    auto t = FrozenTable::Build(keys.data(), values.data(), n, dim, RowStorage::kFloat32);
    CHECK_EQ(t->size(), n);
    for (const auto& kv : ref) {
      bool found = false;
      const std::vector<float> row = FindOne(*t, kv.first, &found);
      CHECK(found);
      for (int64_t c = 0; c < dim; ++c) CHECK_EQ(row[c], kv.second[c]);
    }
    for (int i = 0; i < 1000; ++i) {
      const int64_t k = static_cast<int64_t>(rng());
      bool found = false;
      FindOne(*t, k, &found);
      CHECK_EQ(found, ref.count(k) == 1);
    }
    // Export order holds the same pairs.
    std::vector<float> exported(n * dim);
    t->ExportRows(exported.data());
    for (int64_t j = 0; j < n; ++j) {
      const auto& row = ref.at(t->keys()[j]);
      for (int64_t c = 0; c < dim; ++c) CHECK_EQ(exported[j * dim + c], row[c]);
    }
    // No headroom: the arrays are the raw bytes plus a directory of at most 4 bytes per key.
    CHECK(t->memory_bytes() <= n * (8 + 4 * dim) + 4 * n + 4 + 256);
  }
}

TFEXT_TEST(FrozenRefusesDuplicatesAndBadSizes) {
  const int64_t keys[3] = {5, 9, 5};
  const float values[3] = {1.f, 2.f, 3.f};
  bool threw = false;
  try {
    FrozenTable::Build(keys, values, 3, 1, RowStorage::kFloat32);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("key 5") != std::string::npos;
  }
  CHECK(threw);
  threw = false;
  try {
    FrozenTable::Build(keys, values, 1, 0, RowStorage::kFloat32);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw);
}

TFEXT_TEST(FrozenConcurrentReadersAgree) {
  const int64_t n = 50000, dim = 8;
  std::vector<int64_t> keys(n);
  std::vector<float> values(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = i * 7919 - 12345;
    for (int64_t c = 0; c < dim; ++c) values[i * dim + c] = static_cast<float>(i + c);
  }
  std::shared_ptr<const FrozenTable> t = FrozenTable::Build(keys.data(), values.data(), n, dim, RowStorage::kFloat32);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> out(n * dim);
      std::vector<float> def(dim, -1.f);
      t->Find(keys.data(), n, out.data(), nullptr, def.data());
      for (int64_t i = w; i < n * dim; i += 8) {
        if (out[i] != values[i]) bad.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(bad.load(), 0);
}

// Rows of mixed magnitudes (the int8 bound depends on each row's range) with extreme columns: zeros, tiny
// (fp16 subnormal) values and values near the fp16 maximum.
std::vector<float> MixedRows(int64_t n, int64_t dim, std::mt19937_64* rng) {
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  std::vector<float> values(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    const float magnitude = std::ldexp(1.f, static_cast<int>((*rng)() % 30) - 20);  // 2^-20 .. 2^9
    for (int64_t c = 0; c < dim; ++c) values[i * dim + c] = magnitude * unit(*rng);
  }
  values[0] = 0.f;
  values[1] = 3e-7f;
  values[dim] = 65000.f;
  values[dim + 1] = -60000.f;
  return values;
}

TFEXT_TEST(FrozenStoragesDecodeAsTheReferenceRounding) {
  std::mt19937_64 rng(11);
  for (int64_t dim : {1, 3, 16, 37}) {
    const int64_t n = 2000;
    std::vector<int64_t> keys(n);
    for (int64_t i = 0; i < n; ++i) keys[i] = i * 1000003 - 77;
    const std::vector<float> values = MixedRows(n, dim, &rng);
    for (RowStorage storage : kAllStorages) {
      auto t = FrozenTable::Build(keys.data(), values.data(), n, dim, storage);
      CHECK(t->storage() == storage);
      std::vector<float> out(n * dim);
      std::unique_ptr<bool[]> found(new bool[n]);
      const std::vector<float> def(dim, 0.f);
      t->Find(keys.data(), n, out.data(), found.get(), def.data());
      for (int64_t i = 0; i < n; ++i) {
        CHECK(found[i]);
        const float* x = values.data() + i * dim;
        const float* y = out.data() + i * dim;
        if (storage == RowStorage::kInt8Row) {
          // scale is the smallest fp16 with bias + 255 * scale >= max, bias the largest fp16 <= min: at most
          // (max - min + one fp16 step of min) / 255, rounded up by one fp16 step (a factor 1 + 2^-10).
          const float lo = *std::min_element(x, x + dim), hi = *std::max_element(x, x + dim);
          const float lo_step =
              std::max(std::ldexp(1.f, std::ilogb(std::max(std::fabs(lo), 6.1e-5f)) - 10), std::ldexp(1.f, -24));
          const float scale_bound = (hi - lo + lo_step) / 255.f * (1.f + std::ldexp(1.f, -10)) + std::ldexp(1.f, -24);
          const float float_rounding = 2e-7f * std::max(std::fabs(lo), std::fabs(hi));
          for (int64_t c = 0; c < dim; ++c) CHECK(std::fabs(y[c] - x[c]) <= scale_bound / 2 + float_rounding);
          continue;
        }
        for (int64_t c = 0; c < dim; ++c) {
          const float expected = storage == RowStorage::kFloat32    ? x[c]
                                 : storage == RowStorage::kBFloat16 ? BFloat16Nearest(x[c])
                                                                    : static_cast<float>(static_cast<_Float16>(x[c]));
          CHECK_EQ(y[c], expected);
        }
      }
      // The export decodes the same rows, in the order of keys().
      std::vector<float> exported(n * dim);
      t->ExportRows(exported.data());
      std::unordered_map<int64_t, int64_t> index;
      for (int64_t i = 0; i < n; ++i) index[keys[i]] = i;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t i = index.at(t->keys()[j]);
        CHECK(std::memcmp(exported.data() + j * dim, out.data() + i * dim, sizeof(float) * dim) == 0);
      }
      // Memory: keys, the stored rows and a directory of at most 4 bytes per key.
      CHECK(t->memory_bytes() <= n * (8 + tfext::table::CompactBytes(storage, dim)) + 4 * n + 4 + 256);
    }
  }
}

TFEXT_TEST(FrozenInt8RowsKeepZeroAndConstantRowsExact) {
  const int64_t dim = 16;
  const int64_t keys[3] = {1, 2, 3};
  std::vector<float> values(3 * dim, 0.f);                          // key 1: all zeros
  std::fill(values.begin() + dim, values.begin() + 2 * dim, 0.5f);  // key 2: a constant fp16 value
  std::fill(values.begin() + 2 * dim, values.end(), -1024.f);       // key 3: another
  auto t = FrozenTable::Build(keys, values.data(), 3, dim, RowStorage::kInt8Row);
  for (int i = 0; i < 3; ++i) {
    bool found = false;
    const std::vector<float> row = FindOne(*t, keys[i], &found);
    CHECK(found);
    for (int64_t c = 0; c < dim; ++c) CHECK_EQ(row[c], values[i * dim + c]);
  }
}

TFEXT_TEST(FrozenInt8RefusesRowsItCannotHoldNamingTheKey) {
  const int64_t dim = 4;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1e5f}) {
    const int64_t keys[2] = {10, 4242};
    float values[2 * dim] = {0.f, 1.f, 2.f, 3.f, 0.f, 1.f, bad, 3.f};
    std::string message;
    try {
      FrozenTable::Build(keys, values, 2, dim, RowStorage::kInt8Row);
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    CHECK(message.find("key 4242") != std::string::npos);
    CHECK(message.find("int8 rows") != std::string::npos);
    // The elementwise storages keep such a value as the codec does (NaN, Inf kept; finite values saturate).
    auto t = FrozenTable::Build(keys, values, 2, dim, RowStorage::kFloat16);
    bool found = false;
    const float got = FindOne(*t, 4242, &found)[2];
    CHECK(std::isnan(bad) ? std::isnan(got) : (std::isinf(bad) ? got == bad : got == -65504.f));
  }
}

TFEXT_TEST(FrozenCompactRowsTakeFewerBytes) {
  // The targets of the serving storages at 2^16 keys (the directory's largest share, 4 bytes per key).
  const int64_t n = 1 << 16;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i;
  for (int64_t dim : {16, 64}) {
    const std::vector<float> values(n * dim, 0.25f);
    const int64_t f32 = FrozenTable::Build(keys.data(), values.data(), n, dim, RowStorage::kFloat32)->memory_bytes();
    const int64_t bf16 = FrozenTable::Build(keys.data(), values.data(), n, dim, RowStorage::kBFloat16)->memory_bytes();
    const int64_t int8 = FrozenTable::Build(keys.data(), values.data(), n, dim, RowStorage::kInt8Row)->memory_bytes();
    CHECK_EQ(f32 - bf16, n * 2 * dim);
    CHECK_EQ(bf16 - int8, n * (2 * dim - tfext::table::CompactBytes(RowStorage::kInt8Row, dim)));
    if (dim == 16) CHECK(int8 <= 40 * n);
    if (dim == 64) CHECK(int8 <= 0.3 * f32);
  }
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
