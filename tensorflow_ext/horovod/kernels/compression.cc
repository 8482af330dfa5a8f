// tensorflow_ext: the compression kernels of the dense gradient exchange (compression.h).
//
// Built with -ffp-contract=off: the AVX-512 clone must round a multiply and an add separately, as tf.cast(x * s)
// and acc - sent do in TensorFlow.

#include "tensorflow_ext/horovod/kernels/compression.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace tfext {
namespace hvd {
namespace {

// x86-64-v4 is AVX-512 (F, DQ, VL, BW). The conversions below are branch-free integer and float operations that
// GCC vectorizes in each clone.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define TFEXT_HVD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC 11 has no arch= clones
#define TFEXT_HVD_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define TFEXT_HVD_CLONES
#endif

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// |x| as an integer: orders like the magnitude for every non-NaN float, and puts NaN above +-Inf.
inline uint32_t Key(float x) { return Bits(x) & 0x7FFFFFFFu; }

inline uint16_t HalfBits(float x) {
  const uint32_t u = Bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal halves (|x| >= 2^-14): drop 13 mantissa bits rounding to nearest even (a carry into the exponent is
  // right) and rebias the exponent from 127 to 15.
  const uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u) - (112u << 23)) >> 13;
  // Below 2^-14: adding 0.5f puts |x| in 2^-24 steps of the float32 mantissa, rounded to nearest even by the
  // addition itself (a float32 subnormal is far below half a step: read as 0 under denormals-are-zero, it rounds
  // to 0 either way).
  const float small = FromBits(a < 0x38800000u ? a : 0u);
  const uint32_t subnormal = Bits(small + 0.5f) - Bits(0.5f);
  uint32_t magnitude = a < 0x38800000u ? subnormal : normal;
  magnitude = a >= 0x477FF000u ? 0x7C00u : magnitude;  // >= 65520 rounds to Inf (Inf stays Inf)
  magnitude = a > 0x7F800000u ? 0x7E00u : magnitude;   // NaN: tf.cast's quiet NaN, the sign kept
  return static_cast<uint16_t>(sign | magnitude);
}

inline uint16_t BFloat16Bits(float x) {
  const uint32_t u = Bits(x);
  // Round to nearest even on the whole pattern: |x| + 0x8000 < 2^31, so the sign bit never changes; the largest
  // finite values carry into the exponent and become Inf, as in tf.cast.
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : rounded);  // NaN: tf.cast's, no sign
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & 0x7FFFu) << 13;  // exponent and mantissa, float32-aligned
  const uint32_t exponent = shifted & 0x0F800000u;
  // Normal: the exponent rebiased from 15 to 127. Inf and NaN: the all-ones exponent; a NaN comes out quiet, as
  // from vcvtph2ps. Zero or subnormal: 2^-14 * (1 + m) - 2^-14, exact in float32 (and normal or zero).
  const uint32_t normal = shifted + (112u << 23);
  const uint32_t special = shifted | 0x7F800000u | (shifted > 0x0F800000u ? 0x00400000u : 0u);
  const uint32_t subnormal = Bits(FromBits(shifted + (113u << 23)) - FromBits(113u << 23));
  const uint32_t magnitude = exponent == 0 ? subnormal : (exponent == 0x0F800000u ? special : normal);
  return FromBits(sign | magnitude);
}

inline float BFloat16ToFloat(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

// ---- pack / unpack ----

template <bool kScaled>
TFEXT_HVD_CLONES void PackHalfLoop(const float* src, int64_t n, float scale, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfBits(kScaled ? src[i] * scale : src[i]);
}

template <bool kScaled>
TFEXT_HVD_CLONES void PackBFloat16Loop(const float* src, int64_t n, float scale, uint16_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16Bits(kScaled ? src[i] * scale : src[i]);
}

TFEXT_HVD_CLONES void ScaleLoop(const float* src, int64_t n, float scale, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
}

template <bool kScaled>
TFEXT_HVD_CLONES void UnpackHalfLoop(const uint16_t* src, int64_t n, float scale, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = kScaled ? HalfToFloat(src[i]) * scale : HalfToFloat(src[i]);
}

template <bool kScaled>
TFEXT_HVD_CLONES void UnpackBFloat16Loop(const uint16_t* src, int64_t n, float scale, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = kScaled ? BFloat16ToFloat(src[i]) * scale : BFloat16ToFloat(src[i]);
}

// ---- the sum of the ranks' 16-bit slices ----

template <bool kHalf>
TFEXT_HVD_CLONES void SumPartsBlock(const uint16_t* parts, int64_t num_parts, int64_t stride, int64_t len, float* acc,
                                    uint16_t* out) {
  for (int64_t i = 0; i < len; ++i) acc[i] = 0.0f;
  for (int64_t r = 0; r < num_parts; ++r) {
    const uint16_t* row = parts + r * stride;
    for (int64_t i = 0; i < len; ++i) acc[i] += kHalf ? HalfToFloat(row[i]) : BFloat16ToFloat(row[i]);
  }
  for (int64_t i = 0; i < len; ++i) out[i] = kHalf ? HalfBits(acc[i]) : BFloat16Bits(acc[i]);
}

// ---- Top-K ----

// acc[i] = grad[i] + residual[i] for i in [0, n), and the candidates among them: appends base + i to `above` for
// every i with Key(acc[i]) > t, and to `at` for those equal to t while fewer than at_cap are there. `above` must
// have room for n + kCollectSlack more entries, `at` for at_cap + kCollectSlack. Portable version: branch-free
// (the index is always written, the count advances only for a match).
constexpr int64_t kCollectSlack = 16;

TFEXT_HVD_CLONES void AddLoop(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void AccumulateCollectPortable(const float* grad, const float* residual, int64_t n, int32_t base, uint32_t t,
                               float* acc, int32_t* above, int64_t* n_above, int32_t* at, int64_t* n_at,
                               int64_t at_cap) {
  AddLoop(grad, residual, n, acc);
  int64_t na = *n_above, ne = *n_at;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = Key(acc[i]);
    const int32_t index = base + static_cast<int32_t>(i);
    above[na] = index;
    na += key > t;
    at[ne] = index;
    ne += (key == t) & (ne < at_cap);
  }
  *n_above = na;
  *n_at = ne;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define TFEXT_HVD_HAVE_AVX512 1
// The same with AVX-512: 16 entries per step, the matches compacted in a register (vpcompressd to memory is slow
// on some CPUs) and stored whole (hence the slack).
__attribute__((target("avx512f,popcnt"))) void AccumulateCollectAvx512(const float* grad, const float* residual,
                                                                       int64_t n, int32_t base, uint32_t t, float* acc,
                                                                       int32_t* above, int64_t* n_above, int32_t* at,
                                                                       int64_t* n_at, int64_t at_cap) {
  int64_t na = *n_above, ne = *n_at;
  const __m512i threshold = _mm512_set1_epi32(static_cast<int32_t>(t));
  const __m512i no_sign = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i index = _mm512_add_epi32(_mm512_set1_epi32(base),
                                   _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_add_ps(_mm512_loadu_ps(grad + i), _mm512_loadu_ps(residual + i));
    _mm512_storeu_ps(acc + i, a);
    const __m512i key = _mm512_and_si512(_mm512_castps_si512(a), no_sign);
    const __mmask16 greater = _mm512_cmpgt_epu32_mask(key, threshold);
    const __mmask16 equal = _mm512_cmpeq_epu32_mask(key, threshold);
    if (greater) {
      _mm512_storeu_si512(above + na, _mm512_maskz_compress_epi32(greater, index));
      na += __builtin_popcount(greater);
    }
    if (equal && ne < at_cap) {
      _mm512_storeu_si512(at + ne, _mm512_maskz_compress_epi32(equal, index));
      ne = std::min<int64_t>(at_cap, ne + __builtin_popcount(equal));  // the first ones: the lower indices
    }
    index = _mm512_add_epi32(index, step);
  }
  *n_above = na;
  *n_at = ne;
  if (i < n) {
    AccumulateCollectPortable(grad + i, residual + i, n - i, base + static_cast<int32_t>(i), t, acc + i, above, n_above,
                              at, n_at, at_cap);
  }
}

inline bool CpuHasAvx512Now() {
  __builtin_cpu_init();  // may run before libgcc's own initialization
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("popcnt");
}
const bool kCpuHasAvx512 = CpuHasAvx512Now();
#else
#define TFEXT_HVD_HAVE_AVX512 0
#endif

std::atomic<bool> force_portable_collect{false};

void AccumulateCollect(const float* grad, const float* residual, int64_t n, int32_t base, uint32_t t, float* acc,
                       int32_t* above, int64_t* n_above, int32_t* at, int64_t* n_at, int64_t at_cap) {
#if TFEXT_HVD_HAVE_AVX512
  if (kCpuHasAvx512 && !force_portable_collect.load(std::memory_order_relaxed)) {
    return AccumulateCollectAvx512(grad, residual, n, base, t, acc, above, n_above, at, n_at, at_cap);
  }
#endif
  AccumulateCollectPortable(grad, residual, n, base, t, acc, above, n_above, at, n_at, at_cap);
}

// Below this many entries (or above this fraction) every entry is ranked: the sample would not pay.
constexpr int64_t kPreselectMinElements = int64_t{1} << 16;
constexpr int64_t kSample = 16384;
// acc is produced and scanned in blocks that stay in the L1/L2 cache between the two loops.
constexpr int64_t kBlock = 4096;

// The threshold key: the keep-th largest key of a strided sample of acc = grad + residual, for an expected 2k
// entries at or above it.
uint32_t SampledThreshold(const float* grad, const float* residual, int64_t n, int64_t k,
                          std::vector<uint32_t>* sample) {
  const int64_t stride = std::max<int64_t>(1, n / kSample);
  const int64_t m = (n + stride - 1) / stride;
  const int64_t keep = std::min<int64_t>(m, std::max<int64_t>(1, (2 * k * m + n - 1) / n));
  sample->resize(m);
  for (int64_t j = 0; j < m; ++j) (*sample)[j] = Key(grad[j * stride] + residual[j * stride]);
  std::nth_element(sample->begin(), sample->begin() + (keep - 1), sample->end(), std::greater<uint32_t>());
  return (*sample)[keep - 1];
}

// Emits the k largest of the candidates: walks them in ascending index order (a merge of two sorted lists) and takes
// every key above `t_k` (the k-th largest key) and the first `need_at` keys equal to it.
template <typename W, typename Encode, typename Decode>
void Emit(const int32_t* a, int64_t na, const int32_t* b, int64_t nb, uint32_t t_k, int64_t need_at, int32_t offset,
          Encode encode, Decode decode, float* acc, int32_t* indices, W* values) {
  int64_t ia = 0, ib = 0, out = 0, taken_at = 0;
  while (ia < na || ib < nb) {
    const int32_t i = ib >= nb || (ia < na && a[ia] < b[ib]) ? a[ia++] : b[ib++];
    const uint32_t key = Key(acc[i]);
    if (key < t_k || (key == t_k && taken_at == need_at)) continue;
    taken_at += key == t_k;
    const float x = acc[i];
    const W w = encode(x);
    indices[out] = i + offset;
    values[out] = w;
    ++out;
    const float rest = x - decode(w);
    acc[i] = rest - rest == 0.0f ? rest : 0.0f;  // finite: the rounding error stays; else 0 (Inf or NaN was sent)
  }
}

template <typename W, typename Encode, typename Decode>
void EmitAll(int64_t n, int32_t offset, Encode encode, Decode decode, float* acc, int32_t* indices, W* values) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = acc[i];
    const W w = encode(x);
    indices[i] = static_cast<int32_t>(i) + offset;
    values[i] = w;
    const float rest = x - decode(w);
    acc[i] = rest - rest == 0.0f ? rest : 0.0f;
  }
}

}  // namespace

void SetPortableCollectForTesting(bool portable) { force_portable_collect.store(portable); }

uint16_t FloatToHalfBits(float x) { return HalfBits(x); }
uint16_t FloatToBFloat16Bits(float x) { return BFloat16Bits(x); }
float HalfBitsToFloat(uint16_t h) { return HalfToFloat(h); }
float BFloat16BitsToFloat(uint16_t h) { return BFloat16ToFloat(h); }

void PackScaled(const float* src, int64_t n, float scale, WireFormat f, void* dst) {
  const bool scaled = scale != 1.0f;
  switch (f) {
    case WireFormat::kFloat32:
      if (scaled) {
        ScaleLoop(src, n, scale, static_cast<float*>(dst));
      } else if (n > 0) {
        std::memcpy(dst, src, sizeof(float) * n);
      }
      return;
    case WireFormat::kFloat16:
      return scaled ? PackHalfLoop<true>(src, n, scale, static_cast<uint16_t*>(dst))
                    : PackHalfLoop<false>(src, n, scale, static_cast<uint16_t*>(dst));
    case WireFormat::kBFloat16:
      return scaled ? PackBFloat16Loop<true>(src, n, scale, static_cast<uint16_t*>(dst))
                    : PackBFloat16Loop<false>(src, n, scale, static_cast<uint16_t*>(dst));
  }
}

void UnpackScaled(const void* src, WireFormat f, int64_t n, float scale, float* dst) {
  const bool scaled = scale != 1.0f;
  switch (f) {
    case WireFormat::kFloat32:
      if (scaled) {
        ScaleLoop(static_cast<const float*>(src), n, scale, dst);
      } else if (n > 0 && src != dst) {
        std::memcpy(dst, src, sizeof(float) * n);
      }
      return;
    case WireFormat::kFloat16:
      return scaled ? UnpackHalfLoop<true>(static_cast<const uint16_t*>(src), n, scale, dst)
                    : UnpackHalfLoop<false>(static_cast<const uint16_t*>(src), n, scale, dst);
    case WireFormat::kBFloat16:
      return scaled ? UnpackBFloat16Loop<true>(static_cast<const uint16_t*>(src), n, scale, dst)
                    : UnpackBFloat16Loop<false>(static_cast<const uint16_t*>(src), n, scale, dst);
  }
}

void SumParts(const uint16_t* parts, int64_t num_parts, int64_t stride, int64_t len, WireFormat f, uint16_t* out) {
  if (num_parts == 1) {
    if (len > 0) std::memcpy(out, parts, sizeof(uint16_t) * len);
    return;
  }
  // Blocks whose float32 sums stay in the L1 cache while every rank's row is added.
  constexpr int64_t kSumBlock = 2048;
  float acc[kSumBlock];
  for (int64_t i = 0; i < len; i += kSumBlock) {
    const int64_t n = std::min(kSumBlock, len - i);
    if (f == WireFormat::kFloat16) {
      SumPartsBlock<true>(parts + i, num_parts, stride, n, acc, out + i);
    } else {
      SumPartsBlock<false>(parts + i, num_parts, stride, n, acc, out + i);
    }
  }
}

int64_t TopKSelect(const float* grad, const float* residual, int64_t n, int64_t k, int32_t offset, WireFormat f,
                   float* new_residual, int32_t* indices, void* values, TopKScratch* scratch) {
  k = std::min(k, n);
  if (k <= 0) {
    AddLoop(grad, residual, n, new_residual);
    return 0;
  }
  const auto emit = [&](const int32_t* a, int64_t na, const int32_t* b, int64_t nb, uint32_t t_k, int64_t need_at) {
    switch (f) {
      case WireFormat::kFloat32:
        return Emit<float>(
            a, na, b, nb, t_k, need_at, offset, [](float x) { return x; }, [](float w) { return w; }, new_residual,
            indices, static_cast<float*>(values));
      case WireFormat::kFloat16:
        return Emit<uint16_t>(a, na, b, nb, t_k, need_at, offset, HalfBits, HalfToFloat, new_residual, indices,
                              static_cast<uint16_t*>(values));
      case WireFormat::kBFloat16:
        return Emit<uint16_t>(a, na, b, nb, t_k, need_at, offset, BFloat16Bits, BFloat16ToFloat, new_residual, indices,
                              static_cast<uint16_t*>(values));
    }
  };
  if (k == n) {
    AddLoop(grad, residual, n, new_residual);
    switch (f) {
      case WireFormat::kFloat32:
        EmitAll<float>(
            n, offset, [](float x) { return x; }, [](float w) { return w; }, new_residual, indices,
            static_cast<float*>(values));
        break;
      case WireFormat::kFloat16:
        EmitAll<uint16_t>(n, offset, HalfBits, HalfToFloat, new_residual, indices, static_cast<uint16_t*>(values));
        break;
      case WireFormat::kBFloat16:
        EmitAll<uint16_t>(n, offset, BFloat16Bits, BFloat16ToFloat, new_residual, indices,
                          static_cast<uint16_t*>(values));
        break;
    }
    return k;
  }
  std::vector<int32_t>& cand = scratch->candidates;
  std::vector<uint32_t>& keys = scratch->keys;
  if (n >= kPreselectMinElements && 4 * k <= n) {
    const uint32_t t = SampledThreshold(grad, residual, n, k, &scratch->sample);
    // Candidates: the entries above t, and the first k entries equal to t (equal keys go to the lower index, so no
    // later entry equal to t can be among the k largest). About 2k are expected above t: past 8k + kBlock the
    // sample misled, and every entry is ranked instead.
    const int64_t cap = std::min(n, 8 * k + kBlock);
    cand.resize(cap + kBlock + kCollectSlack + k + kCollectSlack);
    int32_t* above = cand.data();
    int32_t* at = cand.data() + cap + kBlock + kCollectSlack;
    int64_t n_above = 0, n_at = 0;
    int64_t i = 0;
    for (; i < n && n_above <= cap; i += kBlock) {
      const int64_t len = std::min(kBlock, n - i);
      AccumulateCollect(grad + i, residual + i, len, static_cast<int32_t>(i), t, new_residual + i, above, &n_above, at,
                        &n_at, k);
    }
    if (i < n) AddLoop(grad + i, residual + i, n - i, new_residual + i);
    if (n_above <= cap && n_above + n_at >= k) {
      // The k-th largest key among the candidates, and how many entries equal to it are taken.
      keys.resize(n_above + n_at);
      for (int64_t j = 0; j < n_above; ++j) keys[j] = Key(new_residual[above[j]]);
      for (int64_t j = 0; j < n_at; ++j) keys[n_above + j] = t;
      std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint32_t>());
      const uint32_t t_k = keys[k - 1];
      const int64_t n_greater =
          std::count_if(keys.begin(), keys.begin() + (k - 1), [&](uint32_t x) { return x > t_k; });
      emit(above, n_above, at, n_at, t_k, k - n_greater);
      return k;
    }
  } else {
    AddLoop(grad, residual, n, new_residual);
  }
  // Every entry ranked.
  keys.resize(n);
  cand.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = Key(new_residual[i]);
    cand[i] = static_cast<int32_t>(i);
  }
  std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint32_t>());
  const uint32_t t_k = keys[k - 1];
  const int64_t n_greater = std::count_if(keys.begin(), keys.begin() + (k - 1), [&](uint32_t x) { return x > t_k; });
  emit(cand.data(), n, nullptr, 0, t_k, k - n_greater);
  return k;
}

int64_t ScatterAdd(const int32_t* indices, const void* values, WireFormat f, int64_t m, float scale,
                   float* const* parts, const int64_t* starts, int num_parts) {
  const int64_t n = starts[num_parts];
  for (int p = 0; p < num_parts; ++p) std::fill(parts[p], parts[p] + (starts[p + 1] - starts[p]), 0.0f);
  int p = 0;  // the part of the previous entry: each rank's entries ascend, so it mostly holds the next one too
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = indices[j];
    if (i < 0 || i >= n) return j;
    if (i < starts[p] || i >= starts[p + 1]) {
      p = static_cast<int>(std::upper_bound(starts, starts + num_parts + 1, i) - starts) - 1;
    }
    float v;
    switch (f) {
      case WireFormat::kFloat32:
        v = static_cast<const float*>(values)[j];
        break;
      case WireFormat::kFloat16:
        v = HalfToFloat(static_cast<const uint16_t*>(values)[j]);
        break;
      default:
        v = BFloat16ToFloat(static_cast<const uint16_t*>(values)[j]);
        break;
    }
    parts[p][i - starts[p]] += v;
  }
  if (scale != 1.0f) {
    for (int q = 0; q < num_parts; ++q) ScaleLoop(parts[q], starts[q + 1] - starts[q], scale, parts[q]);
  }
  return -1;
}

}  // namespace hvd
}  // namespace tfext
