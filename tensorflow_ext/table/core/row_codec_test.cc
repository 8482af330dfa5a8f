// Unit tests of the row codec (row_codec.h), against references that do not
// share its code: GCC's _Float16 conversions for fp16, a nearest-even
// reference on the float32 bits for bf16, and the error bounds the header
// states for int8 rows.
//   bazel test //tensorflow_ext/table/core:row_codec_test

#include "tensorflow_ext/table/core/row_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensorflow_ext/table/core/row_codec_host.h"
#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::BFloat16ToFloat;
using tfext::table::CompactBytes;
using tfext::table::DecodeElements;
using tfext::table::DecodeInt8Row;
using tfext::table::EncodeElements;
using tfext::table::EncodeInt8Row;
using tfext::table::Float16ToFloat;
using tfext::table::FloatToBFloat16;
using tfext::table::FloatToFloat16;
using tfext::table::HostDecodeElements;
using tfext::table::HostEncodeElements;
using tfext::table::Int8RowParamsOf;
using tfext::table::kBFloat16MaxFinite;
using tfext::table::kFloat16MaxFinite;
using tfext::table::Rounding;
using tfext::table::RowIsFinite;
using tfext::table::RowStorage;
using tfext::table::StochasticBits;
using tfext::table::StochasticColumnBits;
using tfext::table::StochasticRowSeed;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// bf16 round-to-nearest-even from the float32 bits, with distances taken in
// double; a finite value that would round to infinity saturates.
float ReferenceBFloat16(float f) {
  const uint32_t u = ToBits(f);
  const float lo = FromBits(u & 0xFFFF0000u);
  const float hi = FromBits((u & 0xFFFF0000u) + 0x10000u);
  const double dl = std::fabs(static_cast<double>(f) - lo), dh = std::fabs(static_cast<double>(hi) - f);
  float r = dl < dh ? lo : (dh < dl ? hi : (((u >> 16) & 1u) ? hi : lo));
  if (std::isinf(r)) r = std::copysign(BFloat16ToFloat(kBFloat16MaxFinite), f);
  return r;
}

TFEXT_TEST(CompactBytesArePaddedToFourBytes) {
  CHECK_EQ(CompactBytes(RowStorage::kFloat32, 5), int64_t{20});
  CHECK_EQ(CompactBytes(RowStorage::kBFloat16, 16), int64_t{32});
  CHECK_EQ(CompactBytes(RowStorage::kFloat16, 1), int64_t{4});
  CHECK_EQ(CompactBytes(RowStorage::kFloat16, 3), int64_t{8});
  CHECK_EQ(CompactBytes(RowStorage::kInt8Row, 16), int64_t{20});
  CHECK_EQ(CompactBytes(RowStorage::kInt8Row, 1), int64_t{8});
  CHECK_EQ(CompactBytes(RowStorage::kInt8Row, 64), int64_t{68});
}

TFEXT_TEST(Float16NearestMatchesGccFloat16) {
  // Every half round-trips, and decodes as GCC's _Float16 does.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Float16ToFloat(static_cast<uint16_t>(h));
    _Float16 gcc;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&gcc, &bits, sizeof(gcc));
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(gcc)));
      continue;
    }
    CHECK_EQ(ToBits(f), ToBits(static_cast<float>(gcc)));
    CHECK_EQ(static_cast<uint32_t>(FloatToFloat16(f, Rounding::kNearest, 0)), h);
  }
  // Random float32 bit patterns (every exponent), and values near the fp16
  // range, encode as GCC's conversion, except that finite values beyond the
  // range saturate to +-65504 instead of becoming infinite.
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> near_range(-70000.f, 70000.f);
  for (int i = 0; i < 3000000; ++i) {
    const float f = i % 2 ? FromBits(static_cast<uint32_t>(rng())) : near_range(rng);
    if (std::isnan(f)) continue;
    const float mine = Float16ToFloat(FloatToFloat16(f, Rounding::kNearest, 0));
    const float gcc = static_cast<float>(static_cast<_Float16>(f));
    if (std::isinf(gcc) && !std::isinf(f)) {
      CHECK_EQ(mine, std::copysign(65504.f, f));
    } else {
      CHECK_EQ(ToBits(mine), ToBits(gcc));
    }
  }
}

TFEXT_TEST(BFloat16NearestMatchesReference) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 3000000; ++i) {
    const float f = FromBits(static_cast<uint32_t>(rng()));
    if (std::isnan(f) || std::isinf(f)) continue;
    const float mine = BFloat16ToFloat(FloatToBFloat16(f, Rounding::kNearest, 0));
    CHECK_EQ(ToBits(mine), ToBits(ReferenceBFloat16(f)));
    // The stated bound in the normal range: |x - x'| <= 2^-8 |x|.
    if (std::fabs(f) >= std::numeric_limits<float>::min()) {
      CHECK_LE(std::fabs(static_cast<double>(mine) - f), std::ldexp(std::fabs(static_cast<double>(f)), -8));
    }
  }
}

TFEXT_TEST(NanAndInfinityArePreservedAndFiniteValuesSaturate) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  for (const Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
    for (const uint32_t random : {0u, 0xFFFFFFFFu, 0x12345678u}) {
      CHECK(std::isnan(BFloat16ToFloat(FloatToBFloat16(nan, r, random))));
      CHECK(std::isnan(Float16ToFloat(FloatToFloat16(nan, r, random))));
      CHECK(std::isnan(BFloat16ToFloat(FloatToBFloat16(-nan, r, random))));
      CHECK_EQ(BFloat16ToFloat(FloatToBFloat16(inf, r, random)), inf);
      CHECK_EQ(BFloat16ToFloat(FloatToBFloat16(-inf, r, random)), -inf);
      CHECK_EQ(Float16ToFloat(FloatToFloat16(inf, r, random)), inf);
      CHECK_EQ(Float16ToFloat(FloatToFloat16(-inf, r, random)), -inf);
      // Finite values never become infinite.
      CHECK_EQ(BFloat16ToFloat(FloatToBFloat16(big, r, random)), BFloat16ToFloat(kBFloat16MaxFinite));
      CHECK_EQ(BFloat16ToFloat(FloatToBFloat16(-big, r, random)), -BFloat16ToFloat(kBFloat16MaxFinite));
      for (const float v : {65504.f, 65519.f, 65520.f, 70000.f, 1e10f, big}) {
        CHECK_EQ(Float16ToFloat(FloatToFloat16(v, r, random)), 65504.f);
        CHECK_EQ(Float16ToFloat(FloatToFloat16(-v, r, random)), -65504.f);
      }
    }
  }
  CHECK_EQ(Float16ToFloat(kFloat16MaxFinite), 65504.f);
  // An int8 row holding a NaN or an Inf reads NaN in every column.
  for (const float bad : {nan, inf, -inf}) {
    const float row[4] = {1.f, bad, -2.f, 0.5f};
    CHECK(!RowIsFinite(row, 4));
    unsigned char area[8];
    EncodeInt8Row(row, 4, area);
    float back[4];
    DecodeInt8Row(area, 4, 0, 4, back);
    for (const float v : back) CHECK(std::isnan(v));
  }
  // int8 rows clamp their values to the fp16 range.
  const float wide[3] = {-1e9f, 0.f, 1e9f};
  unsigned char area[8];
  EncodeInt8Row(wide, 3, area);
  float back[3];
  DecodeInt8Row(area, 3, 0, 3, back);
  CHECK_EQ(back[0], -65504.f);
  CHECK_GE(back[2], 65504.f - Int8RowParamsOf(area, 3).scale / 2);
  CHECK(RowIsFinite(back, 3));
}

// Stochastic rounding stores one of the two neighbours of x, is a function of
// (key, version, column) only, and is unbiased: the mean over many versions
// is x, where round-to-nearest keeps a constant error.
TFEXT_TEST(StochasticRoundingIsUnbiasedAndDeterministic) {
  struct Case {
    RowStorage storage;
    float x;
  };
  // Values 30% or 10% of a gap above a representable one (the last an fp16 subnormal).
  for (const Case c :
       {Case{RowStorage::kBFloat16, 1.0f + 0.3f * 0x1p-7f}, Case{RowStorage::kBFloat16, -0.25f - 0.1f * 0x1p-9f},
        Case{RowStorage::kFloat16, 1.0f + 0.3f * 0x1p-10f}, Case{RowStorage::kFloat16, 50.3f * 0x1p-24f}}) {
    const auto round = [&](Rounding r, uint32_t random) {
      return c.storage == RowStorage::kBFloat16 ? BFloat16ToFloat(FloatToBFloat16(c.x, r, random))
                                                : Float16ToFloat(FloatToFloat16(c.x, r, random));
    };
    const float nearest = round(Rounding::kNearest, 0);
    float lo = nearest, hi = nearest;
    const int n = 200000;
    double sum = 0;
    for (int v = 0; v < n; ++v) {
      const uint32_t bits = StochasticBits(7, v, 3);
      CHECK_EQ(bits, StochasticBits(7, v, 3));
      const float r = round(Rounding::kStochastic, bits);
      lo = std::min(lo, r);
      hi = std::max(hi, r);
      sum += r;
    }
    CHECK(lo < c.x && c.x < hi);  // both neighbours occur, nothing else
    const double gap = static_cast<double>(hi) - lo;
    CHECK_LE(std::fabs(sum / n - c.x), 0.01 * gap);                       // unbiased within 1% of a gap
    CHECK_GE(std::fabs(static_cast<double>(nearest) - c.x), 0.05 * gap);  // nearest is not
    for (int v = 0; v < 1000; ++v) {
      const float r = round(Rounding::kStochastic, StochasticBits(7, v, 3));
      CHECK(r == lo || r == hi);
    }
  }
  // The random bits depend on every input.
  int differ_key = 0, differ_version = 0, differ_column = 0;
  for (int i = 0; i < 1000; ++i) {
    differ_key += StochasticBits(i, 5, 2) != StochasticBits(i + 1, 5, 2);
    differ_version += StochasticBits(5, i, 2) != StochasticBits(5, i + 1, 2);
    differ_column += StochasticBits(5, 2, i) != StochasticBits(5, 2, i + 1);
  }
  CHECK_GE(differ_key, 995);
  CHECK_GE(differ_version, 995);
  CHECK_GE(differ_column, 995);
  // A value already representable is stored exactly whatever the bits.
  for (uint32_t random : {0u, 0xFFFFu, 0xFFFFFFFFu}) {
    CHECK_EQ(BFloat16ToFloat(FloatToBFloat16(1.5f, Rounding::kStochastic, random)), 1.5f);
    CHECK_EQ(Float16ToFloat(FloatToFloat16(-0.75f, Rounding::kStochastic, random)), -0.75f);
  }
}

// The per-column bits of one row seed: each bit that rounding reads (the low
// 16 for bf16, the high 24 for fp16) is set half the time, the low 16 bits are
// uniform, and neighbouring columns decide independently: over many rows, a
// value rounded up with probability 0.3 goes up in 30% of the rows per column
// and in 9% for two adjacent columns together.
TFEXT_TEST(StochasticColumnBitsAreUniformAndIndependent) {
  const int rows = 100000, cols = 20;
  std::vector<int> set(32, 0), low_buckets(256, 0), mid_buckets(256, 0);
  std::vector<int> up(cols, 0), up_pair(cols - 1, 0);
  const uint32_t threshold = static_cast<uint32_t>(0.3 * 4294967296.0);
  for (int r = 0; r < rows; ++r) {
    const uint64_t seed = StochasticRowSeed(r, 12);
    bool prev_up = false;
    for (int c = 0; c < cols; ++c) {
      const uint32_t bits = StochasticColumnBits(seed, c);
      CHECK_EQ(bits, StochasticBits(r, 12, c));
      for (int b = 0; b < 32; ++b) set[b] += (bits >> b) & 1u;
      ++low_buckets[bits & 0xFFu];
      ++mid_buckets[(bits >> 8) & 0xFFu];
      // Up with probability 0.3, read from the bits as the two roundings do.
      const bool this_up = (c % 2 == 0 ? (bits & 0xFFFFu) << 16 : (bits >> 8) << 8) < threshold;
      up[c] += this_up;
      if (c > 0) up_pair[c - 1] += this_up && prev_up;
      prev_up = this_up;
    }
  }
  const double n = static_cast<double>(rows) * cols;
  for (int b = 0; b < 32; ++b) CHECK_LE(std::fabs(set[b] / n - 0.5), 0.005);
  // Chi-square over 256 buckets (255 degrees of freedom): far below 400 for uniform bits.
  for (const std::vector<int>* buckets : {&low_buckets, &mid_buckets}) {
    double chi2 = 0;
    for (const int count : *buckets) chi2 += (count - n / 256) * (count - n / 256) / (n / 256);
    CHECK_LE(chi2, 400.0);
  }
  for (int c = 0; c < cols; ++c) CHECK_LE(std::fabs(up[c] / static_cast<double>(rows) - 0.3), 0.006);
  for (int c = 0; c + 1 < cols; ++c) CHECK_LE(std::fabs(up_pair[c] / static_cast<double>(rows) - 0.09), 0.004);
}

// The host fast paths (row_codec_host.h: F16C where the CPU has it) store and
// read the same bits as row_codec.h, for every half, for floats across the
// whole range (specials, saturation, subnormals, the rounding boundaries) and
// for column ranges of every length (the 8-wide blocks and their tails).
TFEXT_TEST(HostCodecEqualsPortableCodec) {
  std::printf("  (F16C fast path %s)\n", tfext::table::codec_internal::kCpuHasF16c ? "on" : "off");
  for (const RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    // Twice the halves' size: GCC checks DecodeElements' (unreached) float32 copy against the buffer.
    std::vector<uint16_t> halves(2 * 65536);
    for (uint32_t h = 0; h < 65536; ++h) halves[h] = static_cast<uint16_t>(h);
    std::vector<float> portable(65536), host(65536);
    DecodeElements(storage, halves.data(), 0, 65536, portable.data());
    HostDecodeElements(storage, halves.data(), 0, 65536, host.data());
    for (uint32_t h = 0; h < 65536; ++h) {
      if (std::isnan(portable[h])) {
        CHECK(std::isnan(host[h]));  // a signalling NaN half may come back quiet
      } else {
        CHECK_EQ(ToBits(host[h]), ToBits(portable[h]));
      }
    }
  }
  std::mt19937_64 rng(11);
  std::vector<float> values;
  for (const float special : {0.f, -0.f, 65504.f, 65519.99f, 65520.f, 65536.f, 1e30f, 3.4e38f, 0x1p-24f, 0x1p-25f,
                              0x1.8p-25f, 0x1p-14f, 0x1p-130f, std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), FromBits(0x7F800001u), FromBits(0x7FBFFFFFu)}) {
    values.push_back(special);
    values.push_back(-special);
  }
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> exponent(-30.f, 17.f);
  while (values.size() < 400000) {
    values.push_back(FromBits(any_bits(rng)));
    const float v = std::exp2(exponent(rng)) * (1.f + static_cast<float>(any_bits(rng) >> 9) * 0x1p-23f);
    values.push_back(any_bits(rng) & 1u ? -v : v);
  }
  for (const RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    for (const Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      int64_t key = 0;
      for (size_t start = 0; start < values.size(); ++key) {
        const int64_t c0 = key % 5, n = std::min<int64_t>(1 + key % 37, values.size() - start);
        std::vector<char> portable(CompactBytes(storage, c0 + n), 0), host(portable.size(), 0);
        EncodeElements(storage, values.data() + start, c0, n, portable.data(), rounding, key, key * 3);
        HostEncodeElements(storage, values.data() + start, c0, n, host.data(), rounding, key, key * 3);
        CHECK_EQ(std::memcmp(portable.data(), host.data(), portable.size()), 0);
        start += n;
      }
    }
  }
}

// EncodeElements / DecodeElements on a column range: elementwise, seeded by
// the table column, and they leave the other columns alone.
TFEXT_TEST(ElementRangesRoundEachColumn) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (const RowStorage storage : {RowStorage::kBFloat16, RowStorage::kFloat16}) {
    const int64_t cols = 37;
    std::vector<float> src(cols);
    for (float& v : src) v = normal(rng);
    std::vector<char> area(CompactBytes(storage, cols), 0);
    EncodeElements(storage, src.data(), 0, cols, area.data(), Rounding::kNearest, 0, 0);
    const std::vector<char> before = area;
    // Columns [5, 21) stochastically, seeded by key 9, version 4.
    EncodeElements(storage, src.data() + 5, 5, 16, area.data(), Rounding::kStochastic, 9, 4);
    std::vector<float> back(cols);
    DecodeElements(storage, area.data(), 0, cols, back.data());
    for (int64_t c = 0; c < cols; ++c) {
      const Rounding r = c >= 5 && c < 21 ? Rounding::kStochastic : Rounding::kNearest;
      const uint32_t bits = r == Rounding::kStochastic ? StochasticBits(9, 4, c) : 0;
      const float expected = storage == RowStorage::kBFloat16 ? BFloat16ToFloat(FloatToBFloat16(src[c], r, bits))
                                                              : Float16ToFloat(FloatToFloat16(src[c], r, bits));
      CHECK_EQ(back[c], expected);
      if (c < 5 || c >= 21) CHECK_EQ(std::memcmp(&area[2 * c], &before[2 * c], 2), 0);
    }
    std::vector<float> part(4);
    DecodeElements(storage, area.data(), 30, 4, part.data());
    for (int64_t c = 0; c < 4; ++c) CHECK_EQ(part[c], back[30 + c]);
  }
}

// int8 rows: every column within scale / 2 of its value (plus the float32
// rounding of bias + scale * q), the scale no larger than needed to cover the
// row's range, and the degenerate rows exact.
TFEXT_TEST(Int8RowErrorIsWithinHalfAScale) {
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.f, 0.05f);
  for (int t = 0; t < 100000; ++t) {
    const int64_t cols = 1 + t % 64;
    float row[64], back[64];
    const float spread = static_cast<float>(t % 7 + 1) * (t % 11 == 0 ? 1000.f : 1.f);
    const float offset = t % 5 == 0 ? 3.f : 0.f;
    for (int64_t j = 0; j < cols; ++j) row[j] = offset + normal(rng) * spread;
    unsigned char area[68];
    EncodeInt8Row(row, cols, area);
    DecodeInt8Row(area, cols, 0, cols, back);
    const auto p = Int8RowParamsOf(area, cols);
    float lo = row[0], hi = row[0];
    for (int64_t j = 0; j < cols; ++j) {
      lo = std::min(lo, row[j]);
      hi = std::max(hi, row[j]);
      const double err = std::fabs(static_cast<double>(back[j]) - row[j]);
      // A few float32 ulps of the quantities the encode and decode compute with.
      const double float_rounding =
          4.0 * std::ldexp(std::fabs(static_cast<double>(row[j])) + std::fabs(p.bias) + 255.0 * p.scale, -24);
      CHECK_LE(err, p.scale / 2.0 + float_rounding);
    }
    // The scale covers the range with at most one fp16 step of slack (and
    // the bias below the row's minimum by less than an fp16 step of it).
    CHECK_LE(p.bias, lo);
    CHECK_GE(p.bias + 255.f * p.scale, hi);
    // A column range decodes as the whole row does.
    if (cols > 3) {
      float part[2];
      DecodeInt8Row(area, cols, 2, 2, part);
      CHECK_EQ(part[0], back[2]);
      CHECK_EQ(part[1], back[3]);
    }
  }
  // An all-zero row decodes to exact zeros; a constant row to its value.
  for (const float constant : {0.f, 0.5f, -3.25f}) {
    float row[16], back[16];
    for (float& v : row) v = constant;
    unsigned char area[20];
    EncodeInt8Row(row, 16, area);
    DecodeInt8Row(area, 16, 0, 16, back);
    for (const float v : back) CHECK_EQ(ToBits(v), ToBits(constant));
  }
  // All-zero bytes are the all-zero row (a table's zeroed new rows rely on it).
  unsigned char zeros[20] = {0};
  float back[16];
  DecodeInt8Row(zeros, 16, 0, 16, back);
  for (const float v : back) CHECK_EQ(ToBits(v), 0u);
}

}  // namespace

int main(int argc, char** argv) { return tfext_test::RunAllTests(argc, argv); }
