// tensorflow_ext: the per-key initial rows of dynamic embeddings, defined once for the CPU kernels and the CUDA
// table (host and device code).
//
// Contract: a key's initial row depends only on (initializer kind and parameters, seed, seed2, key), never on the
// batch, the thread, the shard or the device. The CPU lookup kernels and the GPU table call FillInitialRow with the
// same RowInitParams and get the same floats: every step below is an IEEE operation with one rounding (no fused
// multiply-add: the CUDA build compiles with --fmad=false; the CPU kernels' FillInitialRows with
// -ffp-contract=off, and other host builds target baseline x86-64, which has no FMA), in the same order. The CPU
// kernels fill a batch's new rows with FillInitialRows (row_initializer_cpu.h): keys in groups, for the vector units,
// and the same values as FillInitialRow key by key.
//
// How: each key gets its own random stream, SplitMix64 (Steele, Lea & Flood 2014) from the state
// SplitMix64(SplitMix64(key + SplitMix64(seed2)) + SplitMix64(seed)) (distinct for distinct keys: every step is a
// bijection of the key), read in blocks of 16 uint32. Normals come from TF's Box-Muller formula (BoxMullerFloat)
// with Cephes-style polynomials for log and sin/cos (within 5e-7 of libm over the ranges used: log on [1e-7, 1),
// sin/cos on [0, 2*pi)), written branch-free so that the CPU compiler vectorizes a block; truncated normals skip
// |z| >= 2 in stream order; uniforms are TF's 23-bit float conversion of each uint32.

#ifndef TENSORFLOW_EXT_EMBEDDING_KERNELS_ROW_INITIALIZER_H_
#define TENSORFLOW_EXT_EMBEDDING_KERNELS_ROW_INITIALIZER_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensorflow_ext/table/core/mix.h"

namespace tfext {
namespace embedding {

constexpr int kBoxMullerPairs = 8;
constexpr int kBoxMullerValues = 2 * kBoxMullerPairs;  // one stream block: 16 uint32 -> 16 normals
constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

TFEXT_HOST_DEVICE inline float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

TFEXT_HOST_DEVICE inline uint32_t FloatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// [0, 1) from the low 23 bits (TF's Uint32ToFloat).
TFEXT_HOST_DEVICE inline float UnitFloat(uint32_t x) { return BitsToFloat(0x3f800000u | (x & 0x7fffffu)) - 1.0f; }

// Natural log of a positive normal float (Cephes logf), without branches (bit masks instead of selects).
TFEXT_HOST_DEVICE inline float PolyLog(float x) {
  const uint32_t b = FloatToBits(x);
  const float m0 = BitsToFloat((b & 0x007fffffu) | 0x3f000000u);  // x = m0 * 2^e, m0 in [0.5, 1)
  // low (m0 < sqrt(1/2), then use 2*m0 and e - 1) from the mantissa bits: 0x3f3504f3 is sqrt(1/2) with m0's
  // exponent.
  const uint32_t low_mask =
      static_cast<uint32_t>((static_cast<int32_t>(FloatToBits(m0)) - static_cast<int32_t>(0x3f3504f3u)) >> 31);
  const int32_t e = static_cast<int32_t>(b >> 23) - 126 + static_cast<int32_t>(low_mask);
  const float m = BitsToFloat((FloatToBits(m0 + m0) & low_mask) | (FloatToBits(m0) & ~low_mask)) - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  const float fe = static_cast<float>(e);
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  return (m + y) + 0.693359375f * fe;
}

// sin and cos of x in [0, 2*pi] (Cephes sinf/cosf: octant reduction).
TFEXT_HOST_DEVICE inline void PolySinCos(float x, float* s_out, float* c_out) {
  int32_t j = static_cast<int32_t>(x * 1.27323954473516f);  // 4 / pi
  j = (j + 1) & ~1;
  const float y = static_cast<float>(j);
  const float r = ((x - y * 0.78515625f) - y * 2.4187564849853515625e-4f) - y * 3.77489497744594108e-8f;
  const float z = r * r;
  const float ps = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * r + r;
  const float pc =
      ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
  // Quadrant q = j / 2: (sin, cos) = (ps, pc), (pc, -ps), (-ps, -pc), (-pc, ps).
  const uint32_t q = static_cast<uint32_t>(j >> 1);
  const uint32_t swap = 0u - (q & 1u);
  const uint32_t ps_bits = FloatToBits(ps), pc_bits = FloatToBits(pc);
  const uint32_t s_bits = (ps_bits & ~swap) | (pc_bits & swap);
  const uint32_t c_bits = (pc_bits & ~swap) | (ps_bits & swap);
  *s_out = BitsToFloat(s_bits ^ ((q & 2u) << 30));
  *c_out = BitsToFloat(c_bits ^ (((q + 1u) & 2u) << 30));
}

// TF's BoxMullerFloat on one pair of stream values: u1 = UnitFloat(x0) clamped to >= 1e-7, v1 = 2 pi UnitFloat(x1);
// *s and *c are the sin and cos branches. Branch-free (the clamp works on the bits of two positive floats), so
// loops over pairs vectorize.
TFEXT_HOST_DEVICE inline void BoxMullerPair(uint32_t x0, uint32_t x1, float* s, float* c) {
  const int32_t u_bits = static_cast<int32_t>(FloatToBits(UnitFloat(x0)));
  const int32_t eps_bits = static_cast<int32_t>(FloatToBits(1.0e-7f));
  const int32_t below = (u_bits - eps_bits) >> 31;  // all ones if u < 1e-7
  const float u1 = BitsToFloat(static_cast<uint32_t>((u_bits & ~below) | (eps_bits & below)));
  const float v1 = 6.28318530717958647692f * UnitFloat(x1);
  const float radius = std::sqrt(-2.0f * PolyLog(u1));
  float sin_v, cos_v;
  PolySinCos(v1, &sin_v, &cos_v);
  *s = sin_v * radius;
  *c = cos_v * radius;
}

// One stream block (16 uint32) -> 16 N(0, 1) values: the pairs (x[j], x[kBoxMullerPairs + j]) give out[j] (sin)
// and out[kBoxMullerPairs + j] (cos).
TFEXT_HOST_DEVICE inline void BoxMullerBlockInline(const uint32_t* x, float* out) {
  for (int j = 0; j < kBoxMullerPairs; ++j) {
    BoxMullerPair(x[j], x[kBoxMullerPairs + j], &out[j], &out[kBoxMullerPairs + j]);
  }
}

// kBlocks consecutive blocks at once, the same values as kBlocks calls of BoxMullerBlockInline. One loop over
// all their pairs: the log and sin/cos polynomials are long chains of dependent operations, and a CPU vector
// unit fed one block (8 pairs: one AVX2 register) waits on them; kBlocks independent chains keep it busy.
template <int kBlocks>
inline void BoxMullerBlocks(const uint32_t* x, float* out) {
  constexpr int kPairs = kBlocks * kBoxMullerPairs;
  uint32_t x0[kPairs], x1[kPairs];
  float s[kPairs], c[kPairs];
  for (int b = 0; b < kBlocks; ++b) {
    for (int j = 0; j < kBoxMullerPairs; ++j) {
      x0[b * kBoxMullerPairs + j] = x[b * kBoxMullerValues + j];
      x1[b * kBoxMullerPairs + j] = x[b * kBoxMullerValues + kBoxMullerPairs + j];
    }
  }
  for (int p = 0; p < kPairs; ++p) BoxMullerPair(x0[p], x1[p], &s[p], &c[p]);
  for (int b = 0; b < kBlocks; ++b) {
    for (int j = 0; j < kBoxMullerPairs; ++j) {
      out[b * kBoxMullerValues + j] = s[b * kBoxMullerPairs + j];
      out[b * kBoxMullerValues + kBoxMullerPairs + j] = c[b * kBoxMullerPairs + j];
    }
  }
}

// Block b of kKeys keys' streams (out[k * 16, k * 16 + 16): the stream of states[k]): the 64-bit outputs
// 8b+1 .. 8b+8, SplitMix64(state + k * golden gamma), split into low and high halves. All their 64-bit multiplies
// in one loop, which a CPU with 64-bit vector multiplies (AVX-512DQ) vectorizes.
template <int kKeys>
TFEXT_HOST_DEVICE inline void StreamBlocks(const uint64_t* states, uint64_t block, uint32_t* out) {
  constexpr int kHalf = kBoxMullerValues / 2;
  uint64_t r[kKeys * kHalf];
  for (int k = 0; k < kKeys; ++k) {
    for (int t = 0; t < kHalf; ++t) {
      r[k * kHalf + t] = table::SplitMix64(states[k] + (block * kHalf + t + 1) * kGoldenGamma);
    }
  }
  for (int q = 0; q < kKeys * kHalf; ++q) {
    out[2 * q] = static_cast<uint32_t>(r[q]);
    out[2 * q + 1] = static_cast<uint32_t>(r[q] >> 32);
  }
}

// Block b of one key's stream.
TFEXT_HOST_DEVICE inline void StreamBlock(uint64_t state, uint64_t block, uint32_t* out) {
  StreamBlocks<1>(&state, block, out);
}

// What an initializer is, as plain data (copied to the device by value).
struct RowInitParams {
  enum Kind : int32_t { kConstant = 0, kNormal = 1, kTruncatedNormal = 2, kUniform = 3 };
  Kind kind = kConstant;
  float a = 0;             // constant value, mean, or minval
  float b = 1;             // stddev, or maxval
  uint64_t seed_mix = 0;   // SplitMix64(seed)
  uint64_t seed2_mix = 0;  // SplitMix64(seed2)

  // The value of missing keys when nothing is inserted.
  TFEXT_HOST_DEVICE float MissingValue() const { return kind == kConstant ? a : 0.0f; }
};

// The start of a key's random stream.
TFEXT_HOST_DEVICE inline uint64_t StreamState(const RowInitParams& p, int64_t key) {
  return table::SplitMix64(table::SplitMix64(static_cast<uint64_t>(key) + p.seed2_mix) + p.seed_mix);
}

// Writes the values of stream block `block` (16: uniforms or normals, per p.kind) that the row still needs into
// out[*j, dim), advancing *j: truncated normals skip |z| >= 2 (in stream order), the other kinds take them all.
// `z` holds the block's normals (kNormal, kTruncatedNormal) or nothing (kUniform reads `bits`).
TFEXT_HOST_DEVICE inline void TakeBlock(const RowInitParams& p, const uint32_t* bits, const float* z, float* out,
                                        int64_t dim, int64_t* j) {
  int64_t at = *j;
  switch (p.kind) {
    case RowInitParams::kUniform: {
      // TF: random_uniform(...) * (maxval - minval) + minval
      const float range = p.b - p.a;
      for (int t = 0; t < kBoxMullerValues && at < dim; ++t, ++at) out[at] = UnitFloat(bits[t]) * range + p.a;
      break;
    }
    case RowInitParams::kNormal:
      // TF: random_normal(...) * stddev + mean
      for (int t = 0; t < kBoxMullerValues && at < dim; ++t, ++at) out[at] = z[t] * p.b + p.a;
      break;
    case RowInitParams::kTruncatedNormal:
      // TF: truncated_normal(...) * stddev + mean: normals with |z| < 2, in stream order (the rejected ~4.6% are
      // skipped).
      for (int t = 0; t < kBoxMullerValues && at < dim; ++t) {
        if (std::fabs(z[t]) < 2.0f) out[at++] = z[t] * p.b + p.a;
      }
      break;
    default:  // not a kind: the row stays as it is (and the callers' loops end)
      at = dim;
      break;
  }
  *j = at;
}

// The key's initial row (dim floats) into out. BoxMuller(const uint32_t* bits, float* z) turns a block of the
// stream into 16 normals (BoxMullerBlockInline). The device's form: a thread per key.
template <class BoxMuller>
TFEXT_HOST_DEVICE inline void FillInitialRow(const RowInitParams& p, int64_t key, float* out, int64_t dim,
                                             BoxMuller box_muller) {
  if (p.kind == RowInitParams::kConstant) {
    for (int64_t j = 0; j < dim; ++j) out[j] = p.a;
    return;
  }
  const uint64_t state = StreamState(p, key);
  uint32_t bits[kBoxMullerValues];
  float z[kBoxMullerValues];
  int64_t j = 0;
  for (uint64_t block = 0; j < dim; ++block) {
    StreamBlock(state, block, bits);
    if (p.kind != RowInitParams::kUniform) box_muller(bits, z);
    TakeBlock(p, bits, z, out, dim, &j);
  }
}

// The keys per group of FillInitialRows.
constexpr int kInitGroupKeys = 8;

// Block `block` of the streams of kInitGroupKeys keys, the same values as StreamBlock and BoxMullerBlockInline
// key by key, for FillInitialRows. A CPU build compiles this for several instruction sets (see the kernels).
struct InlineGroupBlocks {
  void Bits(const uint64_t* states, uint64_t block, uint32_t* bits) const {
    StreamBlocks<kInitGroupKeys>(states, block, bits);
  }
  void Normals(const uint64_t* states, uint64_t block, uint32_t* bits, float* z) const {
    StreamBlocks<kInitGroupKeys>(states, block, bits);
    BoxMullerBlocks<kInitGroupKeys>(bits, z);
  }
};

// The initial rows of n keys: rows[i][0, dim) = what FillInitialRow writes for keys[i], computed kInitGroupKeys
// keys at a time (GroupBlocks: InlineGroupBlocks or a multi-versioned copy of it). The host's form.
template <class GroupBlocks>
inline void FillInitialRows(const RowInitParams& p, const int64_t* keys, float* const* rows, int64_t n, int64_t dim,
                            const GroupBlocks& group) {
  if (dim <= 0) return;
  if (p.kind == RowInitParams::kConstant) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < dim; ++j) rows[i][j] = p.a;
    }
    return;
  }
  constexpr int G = kInitGroupKeys;
  uint64_t states[G];
  uint32_t bits[G * kBoxMullerValues];
  float z[G * kBoxMullerValues];
  int64_t filled[G];
  for (int64_t first = 0; first < n; first += G) {
    const int m = static_cast<int>(n - first < G ? n - first : G);
    for (int k = 0; k < G; ++k) {
      states[k] = StreamState(p, keys[first + (k < m ? k : m - 1)]);  // a short group repeats its last key
      filled[k] = 0;
    }
    // Rows of the normal and uniform kinds need the same number of blocks; a truncated normal row needs more
    // blocks the more values it rejects: the group's blocks go on until every row is full.
    for (uint64_t block = 0;; ++block) {
      if (p.kind == RowInitParams::kUniform) {
        group.Bits(states, block, bits);
      } else {
        group.Normals(states, block, bits, z);
      }
      bool full = true;
      for (int k = 0; k < m; ++k) {
        if (filled[k] < dim) {
          TakeBlock(p, bits + k * kBoxMullerValues, z + k * kBoxMullerValues, rows[first + k], dim, &filled[k]);
          full = full && filled[k] >= dim;
        }
      }
      if (full) break;
    }
  }
}

// The device (and plain host) form of the block transform, as a functor for FillInitialRow.
struct InlineBoxMuller {
  TFEXT_HOST_DEVICE void operator()(const uint32_t* bits, float* z) const { BoxMullerBlockInline(bits, z); }
};

}  // namespace embedding
}  // namespace tfext

#endif  // TENSORFLOW_EXT_EMBEDDING_KERNELS_ROW_INITIALIZER_H_
