// The embedding layer's operations on the CUDA table (gpu_embedding.h), run on host threads (HostBackend) and checked
// against the CPU core with the CPU kernels' formulas: lookups insert FillInitialRow's rows, and the fused applies
// give what the CPU core's Update gives with the same optimizer, bit for bit, on float32 rows and on compact
// (bfloat16 / float16) rows alike (the CPU core with the same storage).
// (The device itself is checked by tools/gpu/test_gpu_table.py on a GPU machine.)
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tensorflow_ext/embedding/kernels/gpu/gpu_embedding.h"
#include "tensorflow_ext/embedding/kernels/optimizer_functors.h"
#include "tensorflow_ext/embedding/kernels/row_initializer.h"
#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/gpu/bucket_table_test_util.h"
#include "tensorflow_ext/table/gpu/host_backend.h"

namespace {

using tfext::embedding::AdagradOpt;
using tfext::embedding::AdamOpt;
using tfext::embedding::FillInitialRow;
using tfext::embedding::FtrlOpt;
using tfext::embedding::GradientDescentOpt;
using tfext::embedding::InlineBoxMuller;
using tfext::embedding::MomentumOpt;
using tfext::embedding::OptimizerFlags;
using tfext::embedding::RMSPropOpt;
using tfext::embedding::RowInitParams;
using tfext::embedding::RowwiseAdagradOpt;
using tfext::embedding::gpu::FindOrInitialize;
using tfext::embedding::gpu::SparseApply;
using tfext::table::HashTable;
using tfext::table::InlineParallelFor;
using tfext::table::KeyMeta;
using tfext::table::Rounding;
using tfext::table::RowStorage;
using tfext::table::SplitMix64;
using tfext::table::gpu::GpuTableOptions;
using tfext::table::gpu::HostBackend;
using tfext::table::gpu::testing::CompactOptions;
using tfext::table::gpu::testing::CoreOptions;
using tfext::table::gpu::testing::Options;
using tfext::table::gpu::testing::RandomKeys;
using tfext::table::gpu::testing::Snapshot;

using Table = tfext::table::gpu::testing::HostTable;

RowInitParams Initializer(RowInitParams::Kind kind, uint64_t seed) {
  RowInitParams p;
  p.kind = kind;
  p.a = 0.5f;
  p.b = 0.1f;
  p.seed_mix = SplitMix64(seed);
  p.seed2_mix = SplitMix64(seed + 1);
  return p;
}

// Lookups that insert equal the CPU core's FindOrInsertWith filled by FillInitialRow (the CPU kernels' rows), for
// every initializer kind, on random batches with duplicates, the keys a table might reserve, and growth.
// The same on compact rows (new rows round by the table's rounding), against the core with the same storage.
void CheckInitializedLookups(const GpuTableOptions& options) {
  const int64_t w = options.width;
  const std::vector<float> defaults = {-1.1f, -2.2f, -3.3f, -4.4f, -5.5f, -6.6f};
  for (RowInitParams::Kind kind :
       {RowInitParams::kConstant, RowInitParams::kNormal, RowInitParams::kTruncatedNormal, RowInitParams::kUniform}) {
    const RowInitParams init = Initializer(kind, 11);
    Table g(HostBackend{4});
    CHECK_EQ(g.Init(options), "");
    HashTable c(CoreOptions(options));
    std::mt19937_64 rng(7);
    for (int round = 0; round < 20; ++round) {
      const int64_t n = 1 + static_cast<int64_t>(rng() % 400);
      const std::vector<int64_t> keys = RandomKeys(rng, n, 3000);
      const int64_t col_begin = static_cast<int64_t>(rng() % 3);
      const int64_t cols = 1 + static_cast<int64_t>(rng() % (w - col_begin));
      std::vector<float> go(n * cols), co_out(n * cols);
      std::vector<uint8_t> gi(n);
      std::vector<char> ci(n);
      CHECK_EQ(FindOrInitialize(&g, keys.data(), n, col_begin, cols, init, defaults.data(), go.data(), gi.data(), true,
                                round),
               "");
      c.FindOrInsertWith(
          keys.data(), n, col_begin, cols,
          [&](const int64_t* index, float* const* dst, int64_t count) {
            for (int64_t j = 0; j < count; ++j) FillInitialRow(init, keys[index[j]], dst[j], cols, InlineBoxMuller());
          },
          defaults.data(), co_out.data(), reinterpret_cast<bool*>(ci.data()), true, round, InlineParallelFor());
      CHECK(go == co_out);
      for (int64_t i = 0; i < n; ++i) CHECK_EQ(static_cast<int>(gi[i]), static_cast<int>(ci[i]));
    }
    CHECK(Snapshot(g) == Snapshot(c));
  }
}

TFEXT_TEST(InitializedLookupsMatchTheCpuCore) {
  CheckInitializedLookups(Options(6));
  CheckInitializedLookups(CompactOptions(6, RowStorage::kBFloat16, 6, Rounding::kStochastic));
  CheckInitializedLookups(CompactOptions(6, RowStorage::kFloat16, 3, Rounding::kNearest));
}

// A key a capped table cannot store (its bucket all touched by the batch) still gets the initializer's row.
TFEXT_TEST(UnstoredKeysGetTheInitializersRow) {
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(Options(1, 0, 128)), "");  // one bucket
  std::vector<int64_t> batch(129);
  for (int64_t i = 0; i < 129; ++i) batch[i] = 1000 + i;
  const RowInitParams init = Initializer(RowInitParams::kTruncatedNormal, 2);
  std::vector<float> out(batch.size());
  CHECK_EQ(FindOrInitialize(&g, batch.data(), batch.size(), 0, 1, init, nullptr, out.data(), nullptr, false, 1), "");
  tfext::table::gpu::GpuTableStats s;
  CHECK_EQ(g.Stats(&s), "");
  CHECK_EQ(s.size, 128);
  CHECK_EQ(s.failed, 1);
  for (size_t i = 0; i < batch.size(); ++i) {
    float want = 0;
    FillInitialRow(init, batch[i], &want, 1, InlineBoxMuller());
    CHECK_EQ(out[i], want);
  }
}

// The fused optimizer apply on the table equals the CPU core's Update with the same functor, new keys included, with
// the same row storage (compact storage: compact_cols = dim, the variable; slots_too: the whole row).
template <class Opt>
void CheckApply(const float* hypers, int num_slots, const OptimizerFlags& flags,
                RowStorage storage = RowStorage::kFloat32, Rounding rounding = Rounding::kNearest,
                bool slots_too = false) {
  const int64_t dim = 5, slot_width = Opt::SlotWidth(dim), w = dim + num_slots * slot_width;
  Opt opt;
  CHECK_EQ(opt.Prepare(hypers, flags), "");
  CHECK_EQ(Opt::NumSlots(flags), num_slots);
  const int64_t compact_cols = storage == RowStorage::kFloat32 ? 0 : (slots_too ? w : dim);
  const GpuTableOptions options = CompactOptions(w, storage, compact_cols, rounding);
  Table g(HostBackend{4});
  CHECK_EQ(g.Init(options), "");
  HashTable c(CoreOptions(options));
  std::vector<float> defaults(w, 0.0f);
  for (int64_t j = dim; j < w; ++j) defaults[j] = 0.1f;  // accumulators start positive
  std::mt19937_64 rng(1);
  for (int step = 0; step < 5; ++step) {
    std::vector<int64_t> keys;
    std::set<int64_t> seen;
    while (keys.size() < 200) {
      const int64_t k = static_cast<int64_t>(rng() % 400) - 200;
      if (seen.insert(k).second) keys.push_back(k);
    }
    std::vector<float> grads(keys.size() * dim);
    std::normal_distribution<float> nd;
    for (auto& x : grads) x = nd(rng);
    CHECK_EQ(SparseApply(&g, keys.data(), keys.size(), grads.data(), dim, num_slots, opt, defaults.data(), step), "");
    c.Update(
        keys.data(), keys.size(), defaults.data(),
        [&](int64_t i, float* row, KeyMeta* meta) {
          opt.Apply(row, row + dim, slot_width, grads.data() + i * dim, dim);
          meta->version = step;
        },
        InlineParallelFor());
  }
  CHECK(Snapshot(g) == Snapshot(c));
  // Keys given twice are refused, not applied twice.
  const int64_t dup[] = {3, 3};
  std::vector<float> g2(2 * dim, 1.0f);
  CHECK(SparseApply(&g, dup, 2, g2.data(), dim, num_slots, opt, defaults.data(), 9).find("distinct") !=
        std::string::npos);
}

TFEXT_TEST(FusedAppliesMatchTheCpuCore) {
  const float adagrad[] = {0.05f};
  CheckApply<AdagradOpt>(adagrad, 1, OptimizerFlags());
  const float adam[] = {0.9f, 0.999f, 0.001f, 0.9f, 0.999f, 1e-7f};
  CheckApply<AdamOpt>(adam, 2, OptimizerFlags());
  const float ftrl[] = {0.1f, 0.01f, 0.02f, 0.0f, -0.5f};
  CheckApply<FtrlOpt>(ftrl, 2, OptimizerFlags());
  const float sgd[] = {0.1f};
  CheckApply<GradientDescentOpt>(sgd, 0, OptimizerFlags());
  OptimizerFlags nesterov;
  nesterov.use_nesterov = true;
  const float momentum[] = {0.1f, 0.9f};
  CheckApply<MomentumOpt>(momentum, 1, nesterov);
  OptimizerFlags centered;
  centered.centered = true;
  const float rmsprop[] = {0.01f, 0.9f, 0.5f, 1e-6f};
  CheckApply<RMSPropOpt>(rmsprop, 3, centered);
  const float rowwise_adagrad[] = {0.05f};  // one accumulator column per row: the step runs a thread per row
  CheckApply<RowwiseAdagradOpt>(rowwise_adagrad, 1, OptimizerFlags());
}

TFEXT_TEST(FusedAppliesOnCompactRowsMatchTheCpuCore) {
  const float adagrad[] = {0.05f};
  const float adam[] = {0.9f, 0.999f, 0.001f, 0.9f, 0.999f, 1e-7f};
  const float ftrl[] = {0.1f, 0.01f, 0.02f, 0.0f, -0.5f};
  for (RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      for (bool slots_too : {false, true}) {
        CheckApply<AdagradOpt>(adagrad, 1, OptimizerFlags(), storage, rounding, slots_too);
        CheckApply<AdamOpt>(adam, 2, OptimizerFlags(), storage, rounding, slots_too);
        CheckApply<RowwiseAdagradOpt>(adagrad, 1, OptimizerFlags(), storage, rounding, slots_too);
      }
    }
  }
  CheckApply<FtrlOpt>(ftrl, 2, OptimizerFlags(), RowStorage::kBFloat16, Rounding::kStochastic, true);
}

TFEXT_TEST(BadArgumentsAreNamed) {
  Table t;
  CHECK_EQ(t.Init(Options(4)), "");
  const int64_t k = 1;
  float out[4];
  RowInitParams bad;
  bad.kind = static_cast<RowInitParams::Kind>(7);
  CHECK(FindOrInitialize(&t, &k, 1, 0, 4, bad, nullptr, out, nullptr, false, -1).find("unknown initializer kind 7") !=
        std::string::npos);
  AdamOpt adam;
  const float hypers[] = {0.9f, 0.999f, 0.001f, 0.9f, 0.999f, 1e-7f};
  CHECK_EQ(adam.Prepare(hypers, OptimizerFlags()), "");
  const float grad[2] = {1, 1};
  CHECK(SparseApply(&t, &k, 1, grad, 2, 2, adam, nullptr, -1).find("does not fit rows of width 4") !=
        std::string::npos);
  RowwiseAdagradOpt rowwise;
  CHECK_EQ(rowwise.Prepare(hypers, OptimizerFlags()), "");
  const float grad4[4] = {1, 1, 1, 1};
  CHECK(SparseApply(&t, &k, 1, grad4, 4, 1, rowwise, nullptr, -1).find("1 slots of 1 columns does not fit") !=
        std::string::npos);
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
