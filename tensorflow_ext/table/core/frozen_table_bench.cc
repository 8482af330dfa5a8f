// Micro-benchmark of the frozen serving table's lookups per row storage (no
// TensorFlow): a table of --keys random keys and rows, batches of --batch
// keys of which half are present, Find (which decodes compact rows) in
// Mkeys/s. Rounds alternate the storages (the machines here are shared and
// noisy) and each figure is the median of the rounds; bytes/key is
// memory_bytes() / keys.
//
//   g++ -O3 -std=c++17 -I. tensorflow_ext/table/core/frozen_table.cc
//       tensorflow_ext/table/core/frozen_table_bench.cc -o /tmp/frozen_table_bench
//   /tmp/frozen_table_bench [--keys=1048576] [--batch=1048576] [--dims=16,64] [--rounds=7]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensorflow_ext/table/core/frozen_table.h"

namespace {

using tfext::table::FrozenTable;
using tfext::table::RowStorage;

constexpr RowStorage kStorages[] = {RowStorage::kFloat32, RowStorage::kBFloat16, RowStorage::kFloat16,
                                    RowStorage::kInt8Row};
constexpr const char* kStorageNames[] = {"float32", "bfloat16", "float16", "int8_row"};

int64_t Flag(int argc, char** argv, const char* name, int64_t def) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return def;
}

std::vector<int64_t> Dims(int argc, char** argv) {
  std::string dims = "16,64";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--dims=", 7) == 0) dims = argv[i] + 7;
  }
  std::vector<int64_t> out;
  for (size_t start = 0; start < dims.size();) {
    size_t end = dims.find(',', start);
    if (end == std::string::npos) end = dims.size();
    out.push_back(std::atoll(dims.substr(start, end - start).c_str()));
    start = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = Flag(argc, argv, "keys", 1 << 20);
  const int64_t batch = Flag(argc, argv, "batch", 1 << 20);
  const int rounds = static_cast<int>(Flag(argc, argv, "rounds", 7));
  std::mt19937_64 rng(1);
  for (int64_t dim : Dims(argc, argv)) {
    std::vector<int64_t> keys(n);
    for (auto& k : keys) k = static_cast<int64_t>(rng());
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> values(n * dim);
    for (auto& v : values) v = normal(rng);
    std::vector<int64_t> queries(batch);
    for (auto& q : queries) q = (rng() & 1) ? keys[rng() % n] : static_cast<int64_t>(rng());
    std::vector<std::shared_ptr<const FrozenTable>> tables;
    for (RowStorage s : kStorages) tables.push_back(FrozenTable::Build(keys.data(), values.data(), n, dim, s));
    std::vector<float> out(batch * dim);
    const std::vector<float> def(dim, 0.f);
    std::vector<std::vector<double>> seconds(tables.size());
    for (int r = 0; r < rounds; ++r) {
      for (size_t s = 0; s < tables.size(); ++s) {
        const auto start = std::chrono::steady_clock::now();
        tables[s]->Find(queries.data(), batch, out.data(), nullptr, def.data());
        seconds[s].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
    for (size_t s = 0; s < tables.size(); ++s) {
      std::sort(seconds[s].begin(), seconds[s].end());
      std::printf("dim %3ld %-9s find %6.1f Mkeys/s (median of %d)  %6.1f bytes/key\n", static_cast<long>(dim),
                  kStorageNames[s], batch / seconds[s][rounds / 2] / 1e6, rounds,
                  static_cast<double>(tables[s]->memory_bytes()) / n);
    }
  }
  return 0;
}
