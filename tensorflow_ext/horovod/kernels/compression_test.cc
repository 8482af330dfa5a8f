// The compression kernels (compression.h) against independent references: the CPU's own F16C conversions for
// fp16, a rounding through double arithmetic for bf16, and a sort for Top-K; the vector loops (whichever clone this
// CPU selects) against the scalar conversions; Top-K with both candidate collections (AVX-512 and portable).
// TensorFlow's tf.cast is the reference of tensorflow_ext/horovod/tests/test_compression_kernels.py.

#include "tensorflow_ext/horovod/kernels/compression.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::hvd::TopKScratch;
using tfext::hvd::WireFormat;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// F16C rounds to nearest even with overflow to Inf, as tf.cast does; tf.cast's NaN is 0x7E00 with the sign.
__attribute__((target("f16c"))) uint16_t ReferenceHalf(float x) {
  if (std::isnan(x)) return static_cast<uint16_t>(((Bits(x) >> 16) & 0x8000u) | 0x7E00u);
  return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
}

__attribute__((target("f16c"))) float ReferenceHalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

// The nearer of the two bf16 neighbours of x, in double arithmetic; a tie goes to the even one; tf.cast's NaN.
uint16_t ReferenceBFloat16(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t u = Bits(x);
  const uint32_t down = u & 0xFFFF0000u;
  if (down == u || std::isinf(x)) return static_cast<uint16_t>(u >> 16);
  const double lo = FromBits(down);
  const double hi = (down & 0x7FFFFFFFu) == 0x7F7F0000u ? std::copysign(std::ldexp(1.0, 128), x)  // past FLT_MAX
                                                        : static_cast<double>(FromBits(down + 0x10000u));
  const double dl = std::fabs(static_cast<double>(x) - lo), dh = std::fabs(hi - x);
  const bool up = dh < dl || (dh == dl && ((down >> 16) & 1u));
  return static_cast<uint16_t>((up ? down + 0x10000u : down) >> 16);
}

// Every exponent and sign with low halves at the rounding boundaries of both formats, plus random low halves.
std::vector<float> Patterns() {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000,
                           0x7FFF, 0x8000, 0x8001, 0x9000, 0xE000, 0xEFFF, 0xF000, 0xFFFF};
  std::mt19937 rng(5);
  std::vector<float> out;
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (uint32_t low : lows) out.push_back(FromBits((high << 16) | low));
    for (int j = 0; j < 4; ++j) out.push_back(FromBits((high << 16) | (rng() & 0xFFFFu)));
  }
  return out;
}

TFEXT_TEST(ConversionsRoundLikeTheReferences) {
  const std::vector<float> x = Patterns();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> half(n), bf16(n);
  tfext::hvd::PackScaled(x.data(), n, 1.0f, WireFormat::kFloat16, half.data());
  tfext::hvd::PackScaled(x.data(), n, 1.0f, WireFormat::kBFloat16, bf16.data());
  for (int64_t i = 0; i < n; ++i) {
    CHECK_EQ(half[i], ReferenceHalf(x[i]));
    CHECK_EQ(tfext::hvd::FloatToHalfBits(x[i]), half[i]);
    CHECK_EQ(bf16[i], ReferenceBFloat16(x[i]));
    CHECK_EQ(tfext::hvd::FloatToBFloat16Bits(x[i]), bf16[i]);
  }
  // With a scale: the product rounds first (float32), then the conversion.
  std::vector<uint16_t> scaled(n);
  tfext::hvd::PackScaled(x.data(), n, 0.37f, WireFormat::kFloat16, scaled.data());
  for (int64_t i = 0; i < n; ++i) CHECK_EQ(scaled[i], ReferenceHalf(x[i] * 0.37f));
}

TFEXT_TEST(EverySixteenBitPatternConvertsBack) {
  std::vector<uint16_t> all(1 << 16);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> half(all.size()), bf16(all.size());
  tfext::hvd::UnpackScaled(all.data(), WireFormat::kFloat16, all.size(), 1.0f, half.data());
  tfext::hvd::UnpackScaled(all.data(), WireFormat::kBFloat16, all.size(), 0.5f, bf16.data());
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK_EQ(Bits(half[i]), Bits(ReferenceHalfToFloat(all[i])));  // NaN payloads quieted as by vcvtph2ps
    CHECK_EQ(Bits(tfext::hvd::HalfBitsToFloat(all[i])), Bits(half[i]));
    CHECK_EQ(Bits(bf16[i]), Bits(FromBits(static_cast<uint32_t>(all[i]) << 16) * 0.5f));
  }
}

TFEXT_TEST(SlicesOfTheRanksSumInFloat32AndRoundOnce) {
  std::mt19937 rng(3);
  const int64_t len = 5003, stride = 5010;  // rows longer than the summed range: only [0, len) is read
  for (WireFormat f : {WireFormat::kFloat16, WireFormat::kBFloat16}) {
    for (int64_t ranks : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}}) {
      std::vector<uint16_t> parts(ranks * stride), out(len);
      for (auto& p : parts) p = static_cast<uint16_t>(rng() & 0xFFFFu);
      tfext::hvd::SumParts(parts.data(), ranks, stride, len, f, out.data());
      for (int64_t i = 0; i < len; ++i) {
        const auto value = [&](int64_t r) {
          const uint16_t h = parts[r * stride + i];
          return f == WireFormat::kFloat16 ? ReferenceHalfToFloat(h) : FromBits(static_cast<uint32_t>(h) << 16);
        };
        float sum = ranks == 1 ? value(0) : 0.0f;  // one rank: its slice as it came
        for (int64_t r = 0; ranks > 1 && r < ranks; ++r) sum += value(r);
        const uint16_t want = f == WireFormat::kFloat16 ? ReferenceHalf(sum) : ReferenceBFloat16(sum);
        const uint16_t exponent_bits = f == WireFormat::kFloat16 ? 0x7C00 : 0x7F80;
        const auto is_nan = [&](uint16_t h) {
          return (h & exponent_bits) == exponent_bits && (h & ~exponent_bits & 0x7FFF);
        };
        if (ranks == 1) {
          CHECK_EQ(out[i], parts[i]);
        } else if (std::isnan(sum)) {
          CHECK(is_nan(out[i]));  // which NaN an addition of two NaNs returns is the compiler's choice
        } else {
          CHECK_EQ(out[i], want);
        }
      }
    }
  }
}

// The k largest magnitudes by a sort (ties to the lower index, NaN above Inf), ascending.
std::vector<int32_t> ReferenceTopK(const std::vector<float>& acc, int64_t k) {
  std::vector<int32_t> order(acc.size());
  std::iota(order.begin(), order.end(), 0);
  const auto key = [&](int32_t i) { return Bits(acc[i]) & 0x7FFFFFFFu; };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
  order.resize(std::min<size_t>(k, order.size()));
  std::sort(order.begin(), order.end());
  return order;
}

void ExpectTopK(const std::vector<float>& g, const std::vector<float>& r, int64_t k, WireFormat f) {
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<float> acc(n);
  for (int64_t i = 0; i < n; ++i) acc[i] = g[i] + r[i];
  const std::vector<int32_t> want = ReferenceTopK(acc, k);
  for (bool portable : {false, true}) {
    tfext::hvd::SetPortableCollectForTesting(portable);
    std::vector<float> res(n);
    std::vector<int32_t> idx(want.size());
    std::vector<uint16_t> v16(want.size());
    std::vector<float> v32(want.size());
    TopKScratch scratch;
    void* values = f == WireFormat::kFloat32 ? static_cast<void*>(v32.data()) : static_cast<void*>(v16.data());
    const int64_t got =
        tfext::hvd::TopKSelect(g.data(), r.data(), n, k, 7, f, res.data(), idx.data(), values, &scratch);
    CHECK_EQ(got, static_cast<int64_t>(want.size()));
    std::vector<float> want_res = acc;
    for (size_t j = 0; j < want.size(); ++j) {
      CHECK_EQ(idx[j], want[j] + 7);
      const float a = acc[want[j]];
      const float sent = f == WireFormat::kFloat32   ? v32[j]
                         : f == WireFormat::kFloat16 ? tfext::hvd::HalfBitsToFloat(v16[j])
                                                     : tfext::hvd::BFloat16BitsToFloat(v16[j]);
      if (f == WireFormat::kFloat16) CHECK_EQ(v16[j], ReferenceHalf(a));
      if (f == WireFormat::kBFloat16) CHECK_EQ(v16[j], ReferenceBFloat16(a));
      if (f == WireFormat::kFloat32) CHECK_EQ(Bits(v32[j]), Bits(a));
      const float rest = a - sent;
      want_res[want[j]] = std::isfinite(rest) ? rest : 0.0f;
    }
    for (int64_t i = 0; i < n; ++i) CHECK_EQ(Bits(res[i]), Bits(want_res[i]));
  }
  tfext::hvd::SetPortableCollectForTesting(false);
}

TFEXT_TEST(TopKIsExactWithBothCandidateCollections) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{65536}, int64_t{65551}, int64_t{200003}}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<float> g(n), r(n);
      for (int64_t i = 0; i < n; ++i) {
        g[i] = normal(rng);
        r[i] = 0.1f * normal(rng);
      }
      if (pattern == 1) {  // many ties at every magnitude
        for (int64_t i = 0; i < n; ++i) g[i] = std::round(g[i] * 2.0f) / 2.0f, r[i] = 0.0f;
      }
      if (pattern == 2) {  // mostly zeros: the sampled threshold is 0
        for (int64_t i = 0; i < n; ++i) g[i] = (i % 211 == 0) ? g[i] : 0.0f, r[i] = 0.0f;
      }
      if (pattern == 3 && n >= 17) {  // non-finite entries, and spikes the strided sample over-represents
        for (int64_t i = 0; i < n; i += 18) g[i] = 10.0f + static_cast<float>(i % 7);
        g[3] = std::numeric_limits<float>::infinity();
        g[5] = -std::numeric_limits<float>::infinity();
        r[9] = std::numeric_limits<float>::quiet_NaN();
      }
      for (double ratio : {0.0001, 0.01, 0.2, 0.6, 1.0}) {
        const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio * n)));
        for (WireFormat f : {WireFormat::kFloat32, WireFormat::kFloat16, WireFormat::kBFloat16}) ExpectTopK(g, r, k, f);
      }
    }
  }
}

TFEXT_TEST(ScatterAddSumsInOrderIntoTheParts) {
  std::vector<float> a(3), b(4);
  float* parts[] = {a.data(), b.data()};
  const int64_t starts[] = {0, 3, 7};
  const int32_t idx[] = {6, 0, 3, 6, 2};
  const float vals[] = {1e8f, 1.0f, -0.0f, -1e8f, 2.5f};
  CHECK_EQ(tfext::hvd::ScatterAdd(idx, vals, WireFormat::kFloat32, 5, 0.5f, parts, starts, 2), int64_t{-1});
  CHECK_EQ(a[0], 0.5f);
  CHECK_EQ(a[2], 1.25f);
  CHECK_EQ(Bits(b[0]), Bits(0.0f));  // 0 + -0 is +0, as in unsorted_segment_sum
  CHECK_EQ(b[3], 0.0f);              // (0 + 1e8) + -1e8
  const int32_t bad[] = {1, 7};
  CHECK_EQ(tfext::hvd::ScatterAdd(bad, vals, WireFormat::kFloat32, 2, 1.0f, parts, starts, 2), int64_t{1});
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
