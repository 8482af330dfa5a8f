// Tests of the read-only serving table (frozen_table.h) against std::unordered_map.

#include "tensorflow_ext/table/core/frozen_table.h"

#include <atomic>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::FrozenTable;

TFEXT_TEST(FrozenEmptyTableFindsNothing) {
  auto t = FrozenTable::Build(nullptr, nullptr, 0, 3);
  CHECK_EQ(t->size(), 0);
  const int64_t key = 7;
  const float def[3] = {1.f, 2.f, 3.f};
  float out[3] = {0.f, 0.f, 0.f};
  bool found = true;
  t->Find(&key, 1, out, &found, def);
  CHECK(!found);
  CHECK_EQ(out[2], 3.f);
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
    auto t = FrozenTable::Build(keys.data(), values.data(), n, dim);
    CHECK_EQ(t->size(), n);
    for (const auto& kv : ref) {
      const float* row = t->FindRow(kv.first);
      CHECK(row != nullptr);
      for (int64_t c = 0; c < dim; ++c) CHECK_EQ(row[c], kv.second[c]);
    }
    for (int i = 0; i < 1000; ++i) {
      const int64_t k = static_cast<int64_t>(rng());
      CHECK_EQ(t->FindRow(k) != nullptr, ref.count(k) == 1);
    }
    // Export order holds the same pairs.
    for (int64_t j = 0; j < n; ++j) {
      const auto& row = ref.at(t->keys()[j]);
      for (int64_t c = 0; c < dim; ++c) CHECK_EQ(t->values()[j * dim + c], row[c]);
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
    FrozenTable::Build(keys, values, 3, 1);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("key 5") != std::string::npos;
  }
  CHECK(threw);
  threw = false;
  try {
    FrozenTable::Build(keys, values, 1, 0);
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
  std::shared_ptr<const FrozenTable> t = FrozenTable::Build(keys.data(), values.data(), n, dim);
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

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
