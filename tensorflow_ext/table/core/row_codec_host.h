// Host-only fast paths of the row codec (row_codec.h) for the CPU tables
// (hash_table.cc, frozen_table.cc).
//
// Contract
//  * HostDecodeElements / HostEncodeElements have exactly the contract and the
//    results of row_codec.h's DecodeElements / EncodeElements, bit for bit:
//    callers may use either. The one difference: a signalling-NaN half (which
//    no encode produces: NaN is stored as 0x7E00) decodes to a quiet NaN here.
//  * On x86-64 CPUs with F16C (and AVX), float16 columns convert 8 at a time
//    with vcvtph2ps / vcvtps2ph, chosen at run time (the library is built
//    for any x86-64, no -march); elsewhere, and for the other storages, the
//    row_codec.h loops run.
//  * vcvtps2ph differs from row_codec.h in three ways, each handled here:
//    it rounds a finite value beyond 65520 to Inf (we convert the magnitude
//    clamped to 65504, which saturates as row_codec.h does), it keeps a NaN's
//    payload (NaN lanes are set to 0x7E00) and it converts the sign with the
//    value (the magnitude is converted and the sign bit put back, so -0 and
//    NaN signs match). Stochastic rounding truncates with vcvtps2ph and rounds
//    up with the same float comparison as FloatToFloat16, so the random bits
//    decide identically.
//  * Not for device code: nvcc never sees this header (the CUDA table uses
//    row_codec.h).

#ifndef TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_HOST_H_
#define TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_HOST_H_

#include <cstdint>
#include <cstring>

#include "tensorflow_ext/table/core/row_codec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TFEXT_ROW_CODEC_F16C 1
#else
#define TFEXT_ROW_CODEC_F16C 0
#endif

namespace tfext {
namespace table {

#if TFEXT_ROW_CODEC_F16C
namespace codec_internal {

// Whether this CPU (and its OS) runs AVX and F16C instructions: asked once,
// when the library loads (a plain load on the hot path, no guarded static).
// A call made by another library's static initializer before that reads
// false and takes the portable loops: the same results.
inline bool CpuHasF16cNow() {
  __builtin_cpu_init();  // may run before libgcc's own initialization
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
inline const bool kCpuHasF16c = CpuHasF16cNow();

#define TFEXT_F16C_TARGET __attribute__((target("avx,f16c")))

// 8 float16 of src (unaligned) to float32.
TFEXT_F16C_TARGET inline void Float16x8ToFloat(const char* src, float* dst) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  _mm256_storeu_ps(dst, _mm256_cvtph_ps(h));
}

// 8 float32 to float16 as FloatToFloat16 rounds them; `random` (8 values) is
// read for kStochastic only.
template <Rounding kRounding>
TFEXT_F16C_TARGET inline void FloatToFloat16x8(const float* src, const uint32_t* random, char* dst) {
  const __m256 x = _mm256_loadu_ps(src);
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);  // |x|
  // min() returns its second operand for a NaN first: NaN and Inf lanes
  // become 65504 here and are replaced below; finite lanes saturate.
  const __m256 clamped = _mm256_min_ps(a, _mm256_set1_ps(65504.0f));
  __m128i magnitude;
  if (kRounding == Rounding::kNearest) {
    magnitude = _mm256_cvtps_ph(clamped, _MM_FROUND_TO_NEAREST_INT);
  } else {
    // Truncated, then up with probability (|x| - lo) / (hi - lo), as FloatToFloat16.
    const __m128i down = _mm256_cvtps_ph(clamped, _MM_FROUND_TO_ZERO);
    const __m128i next = _mm_add_epi16(down, _mm_set1_epi16(1));
    const __m256 lo = _mm256_cvtph_ps(down);
    const __m256 hi = _mm256_cvtph_ps(next);
    const __m128i r0 = _mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(random)), 8);
    const __m128i r1 = _mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(random + 4)), 8);
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_insertf128_si256(_mm256_castsi128_si256(r0), r1, 1)),
                                   _mm256_set1_ps(kTwoToMinus24));
    const __m256 up = _mm256_cmp_ps(_mm256_sub_ps(clamped, lo), _mm256_mul_ps(u, _mm256_sub_ps(hi, lo)), _CMP_GT_OQ);
    const __m256i up32 = _mm256_castps_si256(up);
    const __m128i up16 = _mm_packs_epi32(_mm256_castsi256_si128(up32), _mm256_extractf128_si256(up32, 1));
    magnitude = _mm_sub_epi16(down, up16);  // up16 is -1 where rounding up
  }
  // NaN -> 0x7E00, +-Inf -> 0x7C00 (before the sign).
  const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  const __m256i inf32 = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(__builtin_inff()), _CMP_EQ_OQ));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extractf128_si256(nan32, 1));
  const __m128i inf16 = _mm_packs_epi32(_mm256_castsi256_si128(inf32), _mm256_extractf128_si256(inf32, 1));
  const __m128i special16 = _mm_or_si128(nan16, inf16);
  magnitude = _mm_or_si128(
      _mm_andnot_si128(special16, magnitude),
      _mm_or_si128(_mm_and_si128(inf16, _mm_set1_epi16(0x7C00)), _mm_and_si128(nan16, _mm_set1_epi16(0x7E00))));
  // The sign: the top 16 bits of each float, arithmetic-shifted so that the pack keeps them.
  const __m256i xi = _mm256_castps_si256(x);
  const __m128i sign16 = _mm_and_si128(_mm_packs_epi32(_mm_srai_epi32(_mm256_castsi256_si128(xi), 16),
                                                       _mm_srai_epi32(_mm256_extractf128_si256(xi, 1), 16)),
                                       _mm_set1_epi16(static_cast<short>(0x8000)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_or_si128(magnitude, sign16));
}

TFEXT_F16C_TARGET inline void DecodeFloat16F16c(const char* src, int64_t n, float* dst) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) Float16x8ToFloat(src + 2 * k, dst + k);
  if (k < n) {  // the tail through 8-wide buffers: never reads or writes past the range
    char in[16] = {0};
    float out[8];
    std::memcpy(in, src + 2 * k, 2 * (n - k));
    Float16x8ToFloat(in, out);
    std::memcpy(dst + k, out, sizeof(float) * (n - k));
  }
}

template <Rounding kRounding>
TFEXT_F16C_TARGET inline void EncodeFloat16F16c(const float* src, int64_t c0, int64_t n, char* dst, uint64_t seed) {
  uint32_t random[8] = {0};
  const auto fill_random = [&](int64_t k, int64_t count) {
    if (kRounding == Rounding::kStochastic) {
      for (int64_t i = 0; i < count; ++i) random[i] = StochasticColumnBits(seed, c0 + k + i);
    }
  };
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    fill_random(k, 8);
    FloatToFloat16x8<kRounding>(src + k, random, dst + 2 * k);
  }
  if (k < n) {
    float in[8] = {0};
    char out[16];
    std::memcpy(in, src + k, sizeof(float) * (n - k));
    fill_random(k, n - k);
    FloatToFloat16x8<kRounding>(in, random, out);
    std::memcpy(dst + 2 * k, out, 2 * (n - k));
  }
}

#undef TFEXT_F16C_TARGET

}  // namespace codec_internal
#else
namespace codec_internal {
inline const bool kCpuHasF16c = false;
}  // namespace codec_internal
#endif  // TFEXT_ROW_CODEC_F16C

#if TFEXT_ROW_CODEC_F16C
namespace codec_internal {
// The float16 paths out of line, so that the callers below stay small enough
// for GCC to inline row_codec.h's loops into them for the other storages.
__attribute__((noinline)) inline void DecodeFloat16Host(const void* area, int64_t c0, int64_t n, float* dst) {
  DecodeFloat16F16c(static_cast<const char*>(area) + 2 * c0, n, dst);
}
__attribute__((noinline)) inline void EncodeFloat16Host(const float* src, int64_t c0, int64_t n, void* area,
                                                        Rounding rounding, int64_t key, int64_t version) {
  char* dst = static_cast<char*>(area) + 2 * c0;
  if (rounding == Rounding::kNearest) {
    EncodeFloat16F16c<Rounding::kNearest>(src, c0, n, dst, 0);
  } else {
    EncodeFloat16F16c<Rounding::kStochastic>(src, c0, n, dst, StochasticRowSeed(key, version));
  }
}
}  // namespace codec_internal
#endif  // TFEXT_ROW_CODEC_F16C

// DecodeElements (row_codec.h), float16 columns through F16C where the CPU has it.
inline void HostDecodeElements(RowStorage storage, const void* area, int64_t c0, int64_t n, float* dst) {
#if TFEXT_ROW_CODEC_F16C
  if (storage == RowStorage::kFloat16 && codec_internal::kCpuHasF16c) {
    return codec_internal::DecodeFloat16Host(area, c0, n, dst);
  }
#endif
  DecodeElements(storage, area, c0, n, dst);
}

// EncodeElements (row_codec.h), float16 columns through F16C where the CPU has it.
inline void HostEncodeElements(RowStorage storage, const float* src, int64_t c0, int64_t n, void* area,
                               Rounding rounding, int64_t key, int64_t version) {
#if TFEXT_ROW_CODEC_F16C
  if (storage == RowStorage::kFloat16 && codec_internal::kCpuHasF16c) {
    return codec_internal::EncodeFloat16Host(src, c0, n, area, rounding, key, version);
  }
#endif
  EncodeElements(storage, src, c0, n, area, rounding, key, version);
}

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_ROW_CODEC_HOST_H_
