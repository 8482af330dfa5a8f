// The CPU kernels' batched initial rows (FillInitialRowsCpu, on whichever instruction set this CPU selects) must
// equal FillInitialRow key by key (the form the CUDA table runs), bit for bit, for every initializer kind, row
// widths around the 16-value stream block, group remainders and extreme keys.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "tensorflow_ext/embedding/kernels/row_initializer_cpu.h"
#include "tensorflow_ext/table/core/mix.h"
#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::embedding::FillInitialRow;
using tfext::embedding::FillInitialRowsCpu;
using tfext::embedding::InlineBoxMuller;
using tfext::embedding::RowInitParams;
using tfext::table::SplitMix64;

RowInitParams Params(RowInitParams::Kind kind, float a, float b, uint64_t seed, uint64_t seed2) {
  RowInitParams p;
  p.kind = kind;
  p.a = a;
  p.b = b;
  p.seed_mix = SplitMix64(seed);
  p.seed2_mix = SplitMix64(seed2);
  return p;
}

std::vector<int64_t> Keys(int64_t n) {
  std::vector<int64_t> keys;
  const int64_t extremes[] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), -1, 0, 1};
  for (int64_t k : extremes) keys.push_back(k);
  for (int64_t i = 0; static_cast<int64_t>(keys.size()) < n; ++i) {
    keys.push_back(static_cast<int64_t>(SplitMix64(static_cast<uint64_t>(i) + 99)));
  }
  keys.resize(static_cast<size_t>(n));
  return keys;
}

// The library's grouped rows (FillInitialRowsCpu).
struct LibraryRows {
  void operator()(const RowInitParams& p, const int64_t* keys, float* const* rows, int64_t n, int64_t dim) const {
    FillInitialRowsCpu(p, keys, rows, n, dim);
  }
};

// Fills n keys' rows key by key and with fill_rows(p, keys, rows, n, dim); the same bits, and the padding after
// each row untouched.
template <typename FillRows = LibraryRows>
void ExpectSameRows(const RowInitParams& p, int64_t n, int64_t dim, const FillRows& fill_rows = FillRows()) {
  const std::vector<int64_t> keys = Keys(n);
  const int64_t stride = dim + 3;
  const float kPad = -12345.0f;
  std::vector<float> want(static_cast<size_t>(n * stride), kPad), got(static_cast<size_t>(n * stride), kPad);
  std::vector<float*> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    FillInitialRow(p, keys[i], want.data() + i * stride, dim, InlineBoxMuller());
    rows[i] = got.data() + i * stride;
  }
  fill_rows(p, keys.data(), rows.data(), n, dim);
  for (int64_t i = 0; i < n * stride; ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(float)) != 0) {
      CHECK_EQ(want[i], got[i]);  // names the values
      CHECK(false);               // equal as numbers, different bits (e.g. -0.0 and 0.0)
    }
  }
}

TFEXT_TEST(BatchedRowsEqualKeyByKeyRowsForEveryKind) {
  const RowInitParams::Kind kinds[] = {RowInitParams::kConstant, RowInitParams::kNormal,
                                       RowInitParams::kTruncatedNormal, RowInitParams::kUniform};
  for (RowInitParams::Kind kind : kinds) {
    for (int64_t dim : {1, 3, 8, 15, 16, 17, 31, 32, 33, 64, 100}) {
      for (int64_t n : {0, 1, 7, 8, 9, 1000}) {
        ExpectSameRows(Params(kind, 0.5f, 0.25f, 11, 12), n, dim);
      }
    }
  }
}

TFEXT_TEST(BatchedRowsEqualKeyByKeyRowsForOtherParameters) {
  ExpectSameRows(Params(RowInitParams::kNormal, 0.0f, 1.0f, 0, 0), 333, 16);
  ExpectSameRows(Params(RowInitParams::kNormal, -3.0f, 0.0f, 5, 6), 100, 9);  // stddev 0
  ExpectSameRows(Params(RowInitParams::kTruncatedNormal, 1.0f, 100.0f, ~0ULL, 1), 500, 48);
  ExpectSameRows(Params(RowInitParams::kUniform, -1e30f, 1e30f, 3, ~0ULL), 77, 5);
}

// Truncated normals take more blocks per row the more values a row rejects, so the keys of a group finish after
// different numbers of blocks: a row that needs many (a long row) must not stop early or run over.
TFEXT_TEST(TruncatedNormalRowsOfUnequalBlockCounts) {
  ExpectSameRows(Params(RowInitParams::kTruncatedNormal, 0.0f, 1.0f, 7, 8), 4096, 160);
}

// The library's clones are picked by the CPU at load time, so the test above checks one of them. The same grouped
// code compiled here for each instruction set (with the library's flags) must give the same bits too: this runs
// every one this CPU can.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define TFEXT_GROUP_FOR(name, target_attr)                                                                     \
  __attribute__((target(target_attr), flatten)) void name##Bits(const uint64_t* s, uint64_t b, uint32_t* x) {  \
    tfext::embedding::InlineGroupBlocks().Bits(s, b, x);                                                       \
  }                                                                                                            \
  __attribute__((target(target_attr), flatten)) void name##Normals(const uint64_t* s, uint64_t b, uint32_t* x, \
                                                                   float* z) {                                 \
    tfext::embedding::InlineGroupBlocks().Normals(s, b, x, z);                                                 \
  }                                                                                                            \
  struct name {                                                                                                \
    void Bits(const uint64_t* s, uint64_t b, uint32_t* x) const { name##Bits(s, b, x); }                       \
    void Normals(const uint64_t* s, uint64_t b, uint32_t* x, float* z) const { name##Normals(s, b, x, z); }    \
  };
TFEXT_GROUP_FOR(GroupsAvx512, "arch=x86-64-v4")
TFEXT_GROUP_FOR(GroupsAvx2, "avx2")

template <typename Groups>
void ExpectSameRowsWith(const Groups& groups) {
  const auto grouped = [&groups](const RowInitParams& p, const int64_t* keys, float* const* rows, int64_t n,
                                 int64_t dim) { tfext::embedding::FillInitialRows(p, keys, rows, n, dim, groups); };
  const RowInitParams::Kind kinds[] = {RowInitParams::kNormal, RowInitParams::kTruncatedNormal,
                                       RowInitParams::kUniform};
  for (RowInitParams::Kind kind : kinds) {
    for (int64_t dim : {1, 16, 17, 64}) ExpectSameRows(Params(kind, 0.5f, 0.25f, 21, 22), 999, dim, grouped);
  }
}

TFEXT_TEST(EveryInstructionSetThisCpuHasGivesTheSameRows) {
  __builtin_cpu_init();
  ExpectSameRowsWith(tfext::embedding::InlineGroupBlocks());  // baseline x86-64
  if (__builtin_cpu_supports("avx2")) {
    ExpectSameRowsWith(GroupsAvx2());
  } else {
    std::fprintf(stderr, "  (no AVX2 on this CPU: its form not checked)\n");
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw")) {
    ExpectSameRowsWith(GroupsAvx512());  // the form with FMA instructions available
  } else {
    std::fprintf(stderr, "  (no AVX-512 on this CPU: its form not checked)\n");
  }
}
#endif

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
