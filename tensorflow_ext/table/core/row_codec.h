// tensorflow_ext row codec: how a table stores float columns in fewer bytes.
//
// Every table (the CPU core, the frozen serving table, the CUDA table) presents
// rows as float32 columns to its callers. A table may store the leading
// `compact_cols` columns of a row in a compact storage instead; this header
// converts between the two, for host and device code alike.
//
// Contract
//  * RowStorage says how the compact columns are stored:
//     kFloat32   4 bytes per column (no compact columns: the default)
//     kBFloat16  2 bytes per column: the top half of the float32
//     kFloat16   2 bytes per column: IEEE binary16
//     kInt8Row   1 byte per column + a per-row fp16 scale and fp16 bias
//                (4 bytes): column j reads bias + scale * q[j], q in 0..255.
//    CompactBytes(storage, cols) is the size of that area, padded to 4 bytes,
//    so the float32 columns after it stay 4-byte aligned.
//  * Writes round. kNearest is round-to-nearest-even; kStochastic rounds up
//    with probability equal to the distance to the lower neighbour over the
//    gap, driven by 32 caller-given random bits per element
//    (StochasticBits(key, version, column): deterministic per key, step and
//    column, so a rerun of the same steps stores the same bits). kInt8Row
//    always rounds to nearest.
//  * Range: finite values never become infinite. A finite value beyond the
//    storage's largest finite value saturates to it (bf16: ~3.39e38, fp16:
//    65504, int8 rows: scale and bias are fp16, so a row's values are clamped
//    to [-65504, 65504]). NaN stays NaN and +-Inf stays +-Inf in bf16 and
//    fp16; an int8 row holding any NaN or Inf reads back as NaN in every
//    column (the row cannot be scaled). Writers that must not lose data
//    (serving exports) check rows with RowIsFinite first and report the key.
//  * Error bounds (row_codec_test.cc): bf16 nearest |x - x'| <= 2^-8 |x|
//    (8 significant bits), fp16 nearest <= 2^-11 |x| in the normal range
//    (2^-25 absolute below it); int8 rows |x - x'| <= scale / 2 (plus a few
//    float32 ulps of the values, from the float arithmetic of encode and
//    decode) for every column of a row whose values lie in the fp16 range.
//  * An int8 row is quantized as a whole: writing some of its columns decodes
//    the row, replaces them and encodes it again (the other columns may move
//    by up to scale / 2 of the new scale). Tables do that for the caller.

#ifndef TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_H_
#define TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_H_

#include <cstdint>
#include <cstring>

#include "tensorflow_ext/table/core/host_device.h"
#include "tensorflow_ext/table/core/mix.h"

namespace tfext {
namespace table {

enum class RowStorage : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kInt8Row = 3 };
enum class Rounding : int32_t { kNearest = 0, kStochastic = 1 };

// Bytes of an int8 row's scale and bias (two fp16).
constexpr int64_t kInt8RowParamBytes = 4;

// The size of `cols` compact columns in `storage`, padded to 4 bytes.
TFEXT_HOST_DEVICE constexpr int64_t CompactBytes(RowStorage storage, int64_t cols) {
  return storage == RowStorage::kFloat32   ? 4 * cols
         : storage == RowStorage::kInt8Row ? (cols + kInt8RowParamBytes + 3) / 4 * 4
                                           : (2 * cols + 3) / 4 * 4;
}
static_assert(CompactBytes(RowStorage::kBFloat16, 16) == 32 && CompactBytes(RowStorage::kFloat16, 9) == 20 &&
                  CompactBytes(RowStorage::kInt8Row, 16) == 20 && CompactBytes(RowStorage::kInt8Row, 1) == 8 &&
                  CompactBytes(RowStorage::kFloat32, 3) == 12,
              "compact areas are padded to 4 bytes so that the float32 columns after them stay aligned");

// Random bits for stochastic rounding of one element: a function of the key,
// the version the write sets (the training step) and the column only.
TFEXT_HOST_DEVICE constexpr uint32_t StochasticBits(int64_t key, int64_t version, int64_t column) {
  return static_cast<uint32_t>(Murmur3Fmix64(SplitMix64(static_cast<uint64_t>(key)) ^
                                             (static_cast<uint64_t>(version) * 0x9E3779B97F4A7C15ull) ^
                                             (static_cast<uint64_t>(column) * 0xC2B2AE3D27D4EB4Full)) >>
                               32);
}

namespace codec_internal {
TFEXT_HOST_DEVICE inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
TFEXT_HOST_DEVICE inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
// 2^-24 and 2^-32 as exact floats.
constexpr float kTwoToMinus24 = 5.9604644775390625e-08f;
constexpr float kTwoToMinus32 = 2.3283064365386963e-10f;
}  // namespace codec_internal

// ---- bfloat16 ----
constexpr uint16_t kBFloat16MaxFinite = 0x7F7F;

TFEXT_HOST_DEVICE inline float BFloat16ToFloat(uint16_t h) {
  return codec_internal::FromBits(static_cast<uint32_t>(h) << 16);
}

// `random` = 0x8000 in the low 16 bits would be round-half-up; nearest-even
// and stochastic rounding differ only in what is added below the kept bits.
TFEXT_HOST_DEVICE inline uint16_t FloatToBFloat16(float f, Rounding rounding, uint32_t random) {
  const uint32_t x = codec_internal::Bits(f);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN stays a (quiet) NaN
  if (a == 0x7F800000u) return static_cast<uint16_t>(x >> 16);          // +-Inf
  const uint32_t add = rounding == Rounding::kNearest ? 0x7FFFu + ((a >> 16) & 1u) : (random & 0xFFFFu);
  uint32_t r = (a + add) >> 16;
  if (r >= 0x7F80u) r = kBFloat16MaxFinite;  // a finite value saturates
  return static_cast<uint16_t>((sign >> 16) | r);
}

// ---- float16 (IEEE binary16) ----
constexpr uint16_t kFloat16MaxFinite = 0x7BFF;  // 65504

TFEXT_HOST_DEVICE inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float32
    const float v = static_cast<float>(m) * codec_internal::kTwoToMinus24;
    return sign ? -v : v;
  }
  if (e == 31) return codec_internal::FromBits(sign | 0x7F800000u | (m << 13));
  return codec_internal::FromBits(sign | ((e + 112u) << 23) | (m << 13));
}

namespace codec_internal {
// |f| (finite, below 65520) to binary16 magnitude bits, rounded to nearest
// even (toward_zero: truncated).
TFEXT_HOST_DEVICE inline uint32_t HalfMagnitude(uint32_t a, bool toward_zero) {
  if (a < 0x38800000u) {            // below 2^-14: a subnormal half, round(a / 2^-24)
    if (a < 0x33000000u) return 0;  // below 2^-25: rounds (ties to even) or truncates to 0
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;  // value = m * 2^(e - 150)
    const uint32_t shift = 126u - e;                 // 14..24
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (!toward_zero && (rem > half || (rem == half && (q & 1u)))) ++q;
    return q;
  }
  uint32_t h = (a >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  const uint32_t rem = a & 0x1FFFu;
  if (!toward_zero && (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))) ++h;
  return h;
}
}  // namespace codec_internal

TFEXT_HOST_DEVICE inline uint16_t FloatToFloat16(float f, Rounding rounding, uint32_t random) {
  const uint32_t x = codec_internal::Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (a == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // +-Inf
  if (rounding == Rounding::kNearest) {
    if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | kFloat16MaxFinite);  // >= 65520 saturates
    return static_cast<uint16_t>(sign | codec_internal::HalfMagnitude(a, false));
  }
  if (a >= 0x477FE000u) return static_cast<uint16_t>(sign | kFloat16MaxFinite);  // >= 65504 saturates
  const uint32_t down = codec_internal::HalfMagnitude(a, true);
  const float lo = Float16ToFloat(static_cast<uint16_t>(down));
  const float hi = Float16ToFloat(static_cast<uint16_t>(down + 1));
  const float mag = codec_internal::FromBits(a);
  // Round up with probability (mag - lo) / (hi - lo); 24 random bits are exact in a float.
  const float u = static_cast<float>(random >> 8) * codec_internal::kTwoToMinus24;
  const bool up = (mag - lo) > u * (hi - lo);
  return static_cast<uint16_t>(sign | (up ? down + 1 : down));
}

// ---- elementwise storages: a column range of a compact area ----
// `area` is the compact area of one row (CompactBytes(storage, compact_cols)
// bytes); columns [c0, c0 + n) of it are read or written. For kFloat32 these
// are plain copies. `key` and `version` feed StochasticBits.
TFEXT_HOST_DEVICE inline void DecodeElements(RowStorage storage, const void* area, int64_t c0, int64_t n, float* dst) {
  if (storage == RowStorage::kFloat32) {
    std::memcpy(dst, static_cast<const float*>(area) + c0, sizeof(float) * n);
    return;
  }
  uint16_t h[16];
  const char* src = static_cast<const char*>(area) + 2 * c0;
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t m = n - j < 16 ? n - j : 16;
    std::memcpy(h, src + 2 * j, 2 * m);
    if (storage == RowStorage::kBFloat16) {
      for (int64_t k = 0; k < m; ++k) dst[j + k] = BFloat16ToFloat(h[k]);
    } else {
      for (int64_t k = 0; k < m; ++k) dst[j + k] = Float16ToFloat(h[k]);
    }
  }
}

TFEXT_HOST_DEVICE inline void EncodeElements(RowStorage storage, const float* src, int64_t c0, int64_t n, void* area,
                                             Rounding rounding, int64_t key, int64_t version) {
  if (storage == RowStorage::kFloat32) {
    std::memcpy(static_cast<float*>(area) + c0, src, sizeof(float) * n);
    return;
  }
  uint16_t h[16];
  char* dst = static_cast<char*>(area) + 2 * c0;
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t m = n - j < 16 ? n - j : 16;
    for (int64_t k = 0; k < m; ++k) {
      const uint32_t random = rounding == Rounding::kStochastic ? StochasticBits(key, version, c0 + j + k) : 0u;
      h[k] = storage == RowStorage::kBFloat16 ? FloatToBFloat16(src[j + k], rounding, random)
                                              : FloatToFloat16(src[j + k], rounding, random);
    }
    std::memcpy(dst + 2 * j, h, 2 * m);
  }
}

// ---- int8 rows ----
// Layout of the area: q[cols] (uint8) | fp16 scale | fp16 bias | padding.
struct Int8RowParams {
  float scale;
  float bias;
};

TFEXT_HOST_DEVICE inline bool RowIsFinite(const float* row, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (!(row[j] - row[j] == 0.0f)) return false;  // NaN or +-Inf
  }
  return true;
}

TFEXT_HOST_DEVICE inline Int8RowParams Int8RowParamsOf(const void* area, int64_t cols) {
  uint16_t p[2];
  std::memcpy(p, static_cast<const char*>(area) + cols, sizeof(p));
  return Int8RowParams{Float16ToFloat(p[0]), Float16ToFloat(p[1])};
}

namespace codec_internal {
// The next binary16 toward -Inf (h finite and not the lowest finite).
TFEXT_HOST_DEVICE inline uint16_t Float16StepDown(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
// The next binary16 toward +Inf (h finite, non-negative and not the largest finite).
TFEXT_HOST_DEVICE inline uint16_t Float16StepUp(uint16_t h) { return static_cast<uint16_t>(h + 1); }
}  // namespace codec_internal

// Quantizes a whole row of `cols` floats into `area`.
TFEXT_HOST_DEVICE inline void EncodeInt8Row(const float* src, int64_t cols, void* area) {
  char* out = static_cast<char*>(area);
  uint16_t params[2];
  if (!RowIsFinite(src, cols)) {
    params[0] = params[1] = 0x7E00u;  // NaN scale and bias: the row reads NaN
    std::memset(out, 0, cols);
    std::memcpy(out + cols, params, sizeof(params));
    return;
  }
  const float kMax = 65504.0f;
  float lo = kMax, hi = -kMax;
  for (int64_t j = 0; j < cols; ++j) {
    const float v = src[j] < -kMax ? -kMax : (src[j] > kMax ? kMax : src[j]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  // bias: the largest fp16 <= lo; scale: the smallest fp16 with bias + 255 * scale >= hi.
  uint16_t b = FloatToFloat16(lo, Rounding::kNearest, 0);
  if (Float16ToFloat(b) > lo) b = codec_internal::Float16StepDown(b);
  const float bias = Float16ToFloat(b);
  uint16_t s = FloatToFloat16((hi - bias) / 255.0f, Rounding::kNearest, 0);
  while (s < kFloat16MaxFinite && bias + 255.0f * Float16ToFloat(s) < hi) s = codec_internal::Float16StepUp(s);
  const float scale = Float16ToFloat(s);
  for (int64_t j = 0; j < cols; ++j) {
    const float v = src[j] < -kMax ? -kMax : (src[j] > kMax ? kMax : src[j]);
    float q = scale > 0.0f ? (v - bias) / scale : 0.0f;
    q = q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q);
    out[j] = static_cast<char>(static_cast<uint8_t>(static_cast<int>(q + 0.5f)));
  }
  params[0] = s;
  params[1] = b;
  std::memcpy(out + cols, params, sizeof(params));
}

// Columns [c0, c0 + n) of an int8 row of `cols` columns.
TFEXT_HOST_DEVICE inline void DecodeInt8Row(const void* area, int64_t cols, int64_t c0, int64_t n, float* dst) {
  const Int8RowParams p = Int8RowParamsOf(area, cols);
  const unsigned char* q = static_cast<const unsigned char*>(area);
  for (int64_t j = 0; j < n; ++j) dst[j] = p.bias + p.scale * static_cast<float>(q[c0 + j]);
}

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_H_
