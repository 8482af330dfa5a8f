// tensorflow_ext: FillInitialRowsCpu (row_initializer_cpu.h).
//
// Built with -ffp-contract=off: the AVX-512 clone may use FMA instructions, and a contracted multiply-add rounds
// once where FillInitialRow rounds twice.

#include "tensorflow_ext/embedding/kernels/row_initializer_cpu.h"

namespace tfext {
namespace embedding {
namespace {

// x86-64-v4 is AVX-512 (F, DQ, VL, BW): 64-bit vector multiplies for the SplitMix64 streams.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define TFEXT_INIT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default"), flatten))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // GCC 11 has no arch= clones
#define TFEXT_INIT_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#else
#define TFEXT_INIT_CLONES
#endif

TFEXT_INIT_CLONES void GroupBits(const uint64_t* states, uint64_t block, uint32_t* bits) {
  InlineGroupBlocks().Bits(states, block, bits);
}

TFEXT_INIT_CLONES void GroupNormals(const uint64_t* states, uint64_t block, uint32_t* bits, float* z) {
  InlineGroupBlocks().Normals(states, block, bits, z);
}

struct MultiVersionGroupBlocks {
  void Bits(const uint64_t* states, uint64_t block, uint32_t* bits) const { GroupBits(states, block, bits); }
  void Normals(const uint64_t* states, uint64_t block, uint32_t* bits, float* z) const {
    GroupNormals(states, block, bits, z);
  }
};

}  // namespace

void FillInitialRowsCpu(const RowInitParams& p, const int64_t* keys, float* const* rows, int64_t n, int64_t dim) {
  FillInitialRows(p, keys, rows, n, dim, MultiVersionGroupBlocks());
}

}  // namespace embedding
}  // namespace tfext
