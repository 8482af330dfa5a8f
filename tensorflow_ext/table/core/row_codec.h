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

// Random bits for stochastic rounding: a function of the key, the version
// the write sets (the training step) and the column only. One full 64-bit
// mix per row (StochasticRowSeed), then a cheap 32-bit mix per column
// (StochasticColumnBits: Wellons' lowbias32 of the seed's low half plus a
// Weyl step per column, xor the seed's high half). For a given column the
// bits are a bijection of the seed's low half, so they are uniform whenever
// the seed is; row_codec_test checks that each bit is set half the time
// (bf16 rounding reads the low 16, fp16 the high 24) and that neighbouring
// columns round independently. 32-bit arithmetic per column, so a row's loop
// vectorizes on the host.
TFEXT_HOST_DEVICE constexpr uint64_t StochasticRowSeed(int64_t key, int64_t version) {
  return Murmur3Fmix64(SplitMix64(static_cast<uint64_t>(key)) ^
                       (static_cast<uint64_t>(version) * 0x9E3779B97F4A7C15ull));
}
TFEXT_HOST_DEVICE constexpr uint32_t StochasticColumnBits(uint64_t row_seed, int64_t column) {
  uint32_t x = static_cast<uint32_t>(row_seed) + static_cast<uint32_t>(column + 1) * 0x9E3779B9u;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x ^ static_cast<uint32_t>(row_seed >> 32);
}
TFEXT_HOST_DEVICE constexpr uint32_t StochasticBits(int64_t key, int64_t version, int64_t column) {
  return StochasticColumnBits(StochasticRowSeed(key, version), column);
}
// Published values: a rerun reproduces a run's rows only with the same bits,
// and tools/gpu/numpy_reference.py reimplements them.
static_assert(StochasticBits(0, 0, 0) == 0x01FCE552u && StochasticBits(7, 3, 5) == 0x65DC65BFu,
              "StochasticBits changed: update tools/gpu/numpy_reference.py's stochastic_bits with it");

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
// The converters below are written with selects instead of early returns so
// that loops over a row's columns vectorize (several times faster on x86).
TFEXT_HOST_DEVICE inline uint16_t FloatToBFloat16(float f, Rounding rounding, uint32_t random) {
  const uint32_t x = codec_internal::Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  const uint32_t add = rounding == Rounding::kNearest ? 0x7FFFu + ((a >> 16) & 1u) : (random & 0xFFFFu);
  uint32_t r = (a + add) >> 16;                         // no overflow: a + add < 2^31 + 2^16
  r = r > kBFloat16MaxFinite ? kBFloat16MaxFinite : r;  // a finite value saturates
  // NaN stays a (quiet) NaN, +-Inf stays +-Inf.
  const uint32_t special = (a >> 16) | (a > 0x7F800000u ? 0x40u : 0u);
  return static_cast<uint16_t>(sign | (a >= 0x7F800000u ? special : r));
}

// ---- float16 (IEEE binary16) ----
constexpr uint16_t kFloat16MaxFinite = 0x7BFF;  // 65504

TFEXT_HOST_DEVICE inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  // Zero or subnormal: em * 2^-24, exact in float32. Normal: the exponent
  // rebiased from 15 to 127. Inf and NaN: the all-ones exponent.
  const float subnormal = static_cast<float>(static_cast<int32_t>(em)) * codec_internal::kTwoToMinus24;
  const uint32_t normal = (em << 13) + (112u << 23);
  const uint32_t special = (em << 13) | 0x7F800000u;
  const uint32_t magnitude = em < 0x400u ? codec_internal::Bits(subnormal) : (em >= 0x7C00u ? special : normal);
  return codec_internal::FromBits(sign | magnitude);
}

namespace codec_internal {
// |f|'s bits a (finite, below 65520) to binary16 magnitude bits, rounded to
// nearest even. Normal halves drop 13 mantissa bits (a carry into the
// exponent is right) and rebias the exponent; below 2^-14 (subnormal
// halves), adding 0.5f puts the value in 2^-24 steps of the float32
// mantissa, rounded to nearest even by the addition itself. Other a give
// unspecified bits (the caller selects another result for them).
TFEXT_HOST_DEVICE inline uint32_t HalfMagnitudeNearest(uint32_t a) {
  const uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u) - (112u << 23)) >> 13;
  const float small = FromBits(a < 0x38800000u ? a : 0u);
  const uint32_t subnormal = Bits(small + 0.5f) - Bits(0.5f);
  return a < 0x38800000u ? subnormal : normal;
}
// The same, truncated (toward zero). Below 2^-14: |f| / 2^-24, exact in
// float32, truncated by the conversion.
TFEXT_HOST_DEVICE inline uint32_t HalfMagnitudeTruncated(uint32_t a) {
  const uint32_t normal = (a >> 13) - (112u << 10);
  const float small = FromBits(a < 0x38800000u ? a : 0u);
  const uint32_t subnormal = static_cast<uint32_t>(small * 16777216.0f);
  return a < 0x38800000u ? subnormal : normal;
}
}  // namespace codec_internal

TFEXT_HOST_DEVICE inline uint16_t FloatToFloat16(float f, Rounding rounding, uint32_t random) {
  const uint32_t x = codec_internal::Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  uint32_t magnitude;
  if (rounding == Rounding::kNearest) {
    // >= 65520 saturates.
    magnitude = a >= 0x477FF000u ? kFloat16MaxFinite : codec_internal::HalfMagnitudeNearest(a);
  } else {
    const uint32_t down = codec_internal::HalfMagnitudeTruncated(a);
    const float lo = Float16ToFloat(static_cast<uint16_t>(down));
    const float hi = Float16ToFloat(static_cast<uint16_t>(down + 1));
    // Round up with probability (|f| - lo) / (hi - lo); 24 random bits are exact in a float.
    const float u = static_cast<float>(random >> 8) * codec_internal::kTwoToMinus24;
    const bool up = (codec_internal::FromBits(a) - lo) > u * (hi - lo);
    // >= 65504 saturates.
    magnitude = a >= 0x477FE000u ? kFloat16MaxFinite : (up ? down + 1 : down);
  }
  magnitude = a > 0x7F800000u ? 0x7E00u : (a == 0x7F800000u ? 0x7C00u : magnitude);  // NaN, +-Inf
  return static_cast<uint16_t>(sign | magnitude);
}

// ---- elementwise storages: a column range of a compact area ----
namespace codec_internal {
// The loops over a row's half columns. The area is bytes, which may alias
// anything: without __restrict__ a store to dst would force reloads of src
// and the loops would not vectorize. One 2-byte memcpy per element (an
// unaligned load or store; no call) keeps them free of library calls.
template <RowStorage kStorage>
TFEXT_HOST_DEVICE inline void DecodeHalves(const char* __restrict__ src, int64_t n, float* __restrict__ dst) {
  for (int64_t k = 0; k < n; ++k) {
    uint16_t h;
    std::memcpy(&h, src + 2 * k, sizeof(h));
    dst[k] = kStorage == RowStorage::kBFloat16 ? BFloat16ToFloat(h) : Float16ToFloat(h);
  }
}
// Columns [c0, c0 + n) of a row whose stochastic bits derive from `seed`
// (unused when rounding to nearest).
template <RowStorage kStorage, Rounding kRounding>
TFEXT_HOST_DEVICE inline void EncodeHalves(const float* __restrict__ src, int64_t n, char* __restrict__ dst,
                                           uint64_t seed, int64_t c0) {
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t random = kRounding == Rounding::kStochastic ? StochasticColumnBits(seed, c0 + k) : 0u;
    const uint16_t h = kStorage == RowStorage::kBFloat16 ? FloatToBFloat16(src[k], kRounding, random)
                                                         : FloatToFloat16(src[k], kRounding, random);
    std::memcpy(dst + 2 * k, &h, sizeof(h));
  }
}
}  // namespace codec_internal

// `area` is the compact area of one row (CompactBytes(storage, compact_cols)
// bytes); columns [c0, c0 + n) of it are read or written. For kFloat32 these
// are plain copies. `key` and `version` feed StochasticBits. The CPU tables
// call row_codec_host.h's HostDecodeElements / HostEncodeElements, which
// give the same results faster on x86.
TFEXT_HOST_DEVICE inline void DecodeElements(RowStorage storage, const void* area, int64_t c0, int64_t n, float* dst) {
  if (storage == RowStorage::kFloat32) {
    std::memcpy(dst, static_cast<const float*>(area) + c0, sizeof(float) * n);
    return;
  }
  const char* src = static_cast<const char*>(area) + 2 * c0;
  if (storage == RowStorage::kBFloat16) {
    codec_internal::DecodeHalves<RowStorage::kBFloat16>(src, n, dst);
  } else {
    codec_internal::DecodeHalves<RowStorage::kFloat16>(src, n, dst);
  }
}

TFEXT_HOST_DEVICE inline void EncodeElements(RowStorage storage, const float* src, int64_t c0, int64_t n, void* area,
                                             Rounding rounding, int64_t key, int64_t version) {
  if (storage == RowStorage::kFloat32) {
    std::memcpy(static_cast<float*>(area) + c0, src, sizeof(float) * n);
    return;
  }
  char* dst = static_cast<char*>(area) + 2 * c0;
  // One loop per (storage, rounding). GCC vectorizes the bf16 ones, not the
  // fp16 encodes (their subnormal case): row_codec_host.h has F16C for those.
  if (rounding == Rounding::kNearest) {
    if (storage == RowStorage::kBFloat16) {
      codec_internal::EncodeHalves<RowStorage::kBFloat16, Rounding::kNearest>(src, n, dst, 0, c0);
    } else {
      codec_internal::EncodeHalves<RowStorage::kFloat16, Rounding::kNearest>(src, n, dst, 0, c0);
    }
  } else {
    const uint64_t seed = StochasticRowSeed(key, version);
    if (storage == RowStorage::kBFloat16) {
      codec_internal::EncodeHalves<RowStorage::kBFloat16, Rounding::kStochastic>(src, n, dst, seed, c0);
    } else {
      codec_internal::EncodeHalves<RowStorage::kFloat16, Rounding::kStochastic>(src, n, dst, seed, c0);
    }
  }
}

// ---- int8 rows ----
// Layout of the area: q[cols] (uint8) | fp16 scale | fp16 bias | padding.
struct Int8RowParams {
  float scale;
  float bias;
};

TFEXT_HOST_DEVICE inline bool RowIsFinite(const float* row, int64_t n) {
  bool finite = true;  // no early exit, so the loop vectorizes (rows are finite almost always)
  for (int64_t j = 0; j < n; ++j) finite &= row[j] - row[j] == 0.0f;  // NaN or +-Inf give NaN
  return finite;
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

namespace codec_internal {
// q = round((clamp(v, -65504, 65504) - bias) / divisor) clamped to [0, 255]
// for a finite row. The clamps compare float bits as integers, which equals
// the float comparisons here (finite values; a negative q, -0 included,
// becomes +0) and, unlike them, lets GCC vectorize the loop (a float compare
// may raise an FP exception, so -ftrapping-math keeps selects on it branches).
TFEXT_HOST_DEVICE inline void QuantizeInt8s(const float* __restrict__ src, int64_t n, float bias, float divisor,
                                            unsigned char* __restrict__ out) {
  constexpr uint32_t kMaxBits = 0x477FE000u;  // 65504.0f
  constexpr int32_t k255Bits = 0x437F0000;    // 255.0f
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t x = Bits(src[j]);
    const uint32_t magnitude = x & 0x7FFFFFFFu;
    const float v = FromBits((x & 0x80000000u) | (magnitude > kMaxBits ? kMaxBits : magnitude));
    int32_t q = static_cast<int32_t>(Bits((v - bias) / divisor));
    q = q < 0 ? 0 : (q > k255Bits ? k255Bits : q);
    out[j] = static_cast<unsigned char>(static_cast<int>(FromBits(static_cast<uint32_t>(q)) + 0.5f));
  }
}
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
  // A zero scale means a constant row equal to the bias (v - bias is 0): any
  // divisor gives q = 0 then.
  codec_internal::QuantizeInt8s(src, cols, bias, scale > 0.0f ? scale : 1.0f, reinterpret_cast<unsigned char*>(out));
  params[0] = s;
  params[1] = b;
  std::memcpy(out + cols, params, sizeof(params));
}

namespace codec_internal {
// bias + scale * q for n codes; __restrict__ as for DecodeHalves (the codes
// are bytes), so the loop vectorizes.
TFEXT_HOST_DEVICE inline void DecodeInt8s(const unsigned char* __restrict__ q, int64_t n, Int8RowParams p,
                                          float* __restrict__ dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = p.bias + p.scale * static_cast<float>(q[j]);
}
}  // namespace codec_internal

// Columns [c0, c0 + n) of an int8 row of `cols` columns.
TFEXT_HOST_DEVICE inline void DecodeInt8Row(const void* area, int64_t cols, int64_t c0, int64_t n, float* dst) {
  const Int8RowParams p = Int8RowParamsOf(area, cols);
  codec_internal::DecodeInt8s(static_cast<const unsigned char*>(area) + c0, n, p, dst);
}

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_H_
