// tensorflow_ext: the compression kernels of the dense gradient exchange (tensorflow_ext/horovod/allreduce.py),
// TensorFlow-independent: fused pack/unpack of fp16/bf16 buffers, Top-K selection with error feedback and the
// scatter-add of every rank's entries.
//
// Contract
//  * Wire formats: kFloat32 (4 bytes, the value itself), kFloat16 (IEEE binary16 bits), kBFloat16 (the top half of
//    the float32, as bits). The conversions are TensorFlow's tf.cast, bit for bit: round to nearest even, a finite
//    value beyond the 16-bit range becomes +-Inf (fp16: |x| >= 65520), +-Inf stays +-Inf, NaN becomes the quiet NaN
//    tf.cast makes (fp16: 0x7E00 with the sign kept; bf16: 0x7FC0, sign dropped). Subnormals round like any value
//    (no flush to zero), so the results do not depend on the CPU's denormal mode. 16 bits to float32 is exact.
//  * PackScaled / UnpackScaled are tf.cast(x * scale) and tf.cast(x) * scale, element by element (the multiply is
//    skipped when scale == 1, as allreduce.py skips it), in one pass. SumParts sums the ranks' 16-bit slices of a
//    reduce-scatter in float32 and rounds once.
//  * TopKSelect: acc = grad + residual; the k entries of largest |acc| (exactly k = min(k, n); equal magnitudes go
//    to the lower index; NaN counts as larger than Inf so that a non-finite gradient is always sent) are emitted in
//    ascending index order as (index + offset, wire(acc)); new_residual = acc, except at the emitted entries:
//    acc - float(wire(acc)) (0 for kFloat32; the rounding error of a 16-bit wire), or 0 where that is not finite
//    (an Inf or NaN was sent: keeping Inf - Inf = NaN would poison every later step). A threshold estimated from a
//    strided sample of acc (at twice the wanted fraction) picks the candidates in the same pass that writes
//    new_residual; only the candidates are ranked, and all n entries only when fewer than k pass it (never wrong,
//    only slower).
//  * ScatterAdd: dense[0, n) = 0, then dense[indices[j]] += float(values[j]) for j in order (the order of
//    tf.math.unsorted_segment_sum), then dense *= scale unless scale == 1; dense may be split into parts (the
//    gradients of a fused buffer, written in place). An index outside [0, n) is reported.
//  * Where two NaNs meet in an addition (the residual add, a sum over ranks), which one comes out (its sign and
//    payload) is unspecified, as in TensorFlow's own adds; every such result is a NaN.
//  * The loops are compiled for AVX-512 (x86-64-v4), AVX2 and baseline x86-64 (picked at load time from what the
//    CPU has) with floating-point contraction off: the instruction set never changes a value.

#ifndef TENSORFLOW_EXT_HOROVOD_KERNELS_COMPRESSION_H_
#define TENSORFLOW_EXT_HOROVOD_KERNELS_COMPRESSION_H_

#include <cstdint>
#include <vector>

namespace tfext {
namespace hvd {

enum class WireFormat : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Bytes of one element on the wire.
constexpr int64_t WireBytes(WireFormat f) { return f == WireFormat::kFloat32 ? 4 : 2; }

// The scalar conversions (the vector loops below compute the same bits).
uint16_t FloatToHalfBits(float x);
uint16_t FloatToBFloat16Bits(float x);
float HalfBitsToFloat(uint16_t h);
float BFloat16BitsToFloat(uint16_t h);

// dst[i] = wire(src[i] * scale) for i in [0, n); dst holds n elements of format f (dst may not alias src).
void PackScaled(const float* src, int64_t n, float scale, WireFormat f, void* dst);

// dst[i] = float(src[i]) * scale for i in [0, n); src holds n elements of format f.
void UnpackScaled(const void* src, WireFormat f, int64_t n, float scale, float* dst);

// Scratch memory of TopKSelect, kept between calls by the caller (one per thread).
struct TopKScratch {
  std::vector<uint32_t> sample;
  std::vector<int32_t> candidates;
  std::vector<uint32_t> keys;
};

// The receiving side of a 16-bit reduce-scatter: parts holds num_parts rows (one per rank, in rank order), row r
// at parts + r * stride; out[i] = wire(0 + float(row 0 [i]) + float(row 1 [i]) + ...) for i in [0, len), summed in
// float32 in rank order (the order and starting +0 of tf.reduce_sum over the rows) and rounded once; with
// num_parts == 1 out is row 0. f is kFloat16 or kBFloat16; out may not alias parts.
void SumParts(const uint16_t* parts, int64_t num_parts, int64_t stride, int64_t len, WireFormat f, uint16_t* out);

// The Top-K selection of one gradient (see the contract). grad, residual and new_residual hold n floats
// (new_residual may alias residual, not grad); indices and values receive min(k, n) entries (values in format f).
// n must be below 2^31 and offset + n at most 2^31 - 1 (the caller checks). Returns the number of entries written.
int64_t TopKSelect(const float* grad, const float* residual, int64_t n, int64_t k, int32_t offset, WireFormat f,
                   float* new_residual, int32_t* indices, void* values, TopKScratch* scratch);

// The dense sum of the entries, written into the parts of a buffer of starts[num_parts] floats: part p holds
// positions [starts[p], starts[p + 1]) (see the contract). Returns -1, or the position j of the first index outside
// [0, starts[num_parts]) (the parts are then unspecified).
int64_t ScatterAdd(const int32_t* indices, const void* values, WireFormat f, int64_t m, float scale,
                   float* const* parts, const int64_t* starts, int num_parts);

// For tests: whether TopKSelect collects its candidates with the portable loop even where the CPU has AVX-512
// (false by default). Both forms give the same results; this lets one machine check both.
void SetPortableCollectForTesting(bool portable);

}  // namespace hvd
}  // namespace tfext

#endif  // TENSORFLOW_EXT_HOROVOD_KERNELS_COMPRESSION_H_
