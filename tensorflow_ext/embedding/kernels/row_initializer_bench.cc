// Micro-benchmark of the CPU kernels' initial rows: FillInitialRowsCpu (groups of keys through the vector units)
// against FillInitialRow key by key with its block transform compiled for AVX2 (what the kernels ran before),
// on the new keys of a ctr26-like step (52,000 keys). Checks that both give the same bits. Single-threaded.
//
//   g++ -O3 -std=c++17 -fno-math-errno -ffp-contract=off -I. tensorflow_ext/embedding/kernels/row_initializer_cpu.cc
//       tensorflow_ext/embedding/kernels/row_initializer_bench.cc -o /tmp/row_initializer_bench
//   /tmp/row_initializer_bench [--keys=52000] [--dim=16]   (or bazel run ...:row_initializer_bench)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow_ext/embedding/kernels/row_initializer_cpu.h"
#include "tensorflow_ext/table/core/mix.h"

namespace {

using tfext::embedding::FillInitialRow;
using tfext::embedding::FillInitialRowsCpu;
using tfext::embedding::RowInitParams;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default"), flatten))
#endif
void BoxMullerBlockAvx2(const uint32_t* x, float* out) {
  tfext::embedding::BoxMullerBlockInline(x, out);
}

struct KeyByKey {
  void operator()(const uint32_t* bits, float* z) const { BoxMullerBlockAvx2(bits, z); }
};

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return fallback;
}

template <typename Fn>
double BestMs(int repeats, const Fn& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = Flag(argc, argv, "keys", 52000), dim = Flag(argc, argv, "dim", 16);
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(tfext::table::SplitMix64(i + 1));
  std::vector<float> a(n * dim), b(n * dim);
  std::vector<float*> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = b.data() + i * dim;
  const char* names[] = {"random_normal", "truncated_normal", "random_uniform"};
  const RowInitParams::Kind kinds[] = {RowInitParams::kNormal, RowInitParams::kTruncatedNormal,
                                       RowInitParams::kUniform};
  std::printf("%lld keys, dim %lld, one thread, best of 20 (ms)\n", static_cast<long long>(n),
              static_cast<long long>(dim));
  std::printf("%-18s %12s %12s %8s  %s\n", "initializer", "key by key", "in groups", "speedup", "same bits");
  for (int k = 0; k < 3; ++k) {
    RowInitParams p;
    p.kind = kinds[k];
    p.a = 0.0f;
    p.b = 0.01f;
    p.seed_mix = tfext::table::SplitMix64(11);
    p.seed2_mix = tfext::table::SplitMix64(12);
    const double one = BestMs(20, [&] {
      for (int64_t i = 0; i < n; ++i) FillInitialRow(p, keys[i], a.data() + i * dim, dim, KeyByKey());
    });
    const double grouped = BestMs(20, [&] {
      for (int64_t i = 0; i < n; i += 16)
        FillInitialRowsCpu(p, keys.data() + i, rows.data() + i, std::min<int64_t>(16, n - i), dim);
    });
    const bool same = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    std::printf("%-18s %12.3f %12.3f %7.2fx  %s\n", names[k], one, grouped, one / grouped, same ? "yes" : "NO");
    if (!same) return 1;
  }
  return 0;
}
