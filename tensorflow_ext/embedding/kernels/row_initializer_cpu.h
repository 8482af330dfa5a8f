// tensorflow_ext: the CPU kernels' initial rows of new keys (row_initializer.h), many keys per call.
//
// FillInitialRowsCpu writes the rows FillInitialRow would, key by key, bit for bit: the same IEEE operations in
// the same order, compiled for AVX-512, AVX2 and baseline x86-64 (the loader picks the best the CPU has) with
// floating-point contraction off, so no instruction set changes a value. Groups of kInitGroupKeys keys go
// through the vector units together: 1.3-2.2x the throughput of one key at a time (docs/benchmarks.md).

#ifndef TENSORFLOW_EXT_EMBEDDING_KERNELS_ROW_INITIALIZER_CPU_H_
#define TENSORFLOW_EXT_EMBEDDING_KERNELS_ROW_INITIALIZER_CPU_H_

#include <cstdint>

#include "tensorflow_ext/embedding/kernels/row_initializer.h"

namespace tfext {
namespace embedding {

// rows[i][0, dim) = the initial row of keys[i] under p, for i in [0, n).
void FillInitialRowsCpu(const RowInitParams& p, const int64_t* keys, float* const* rows, int64_t n, int64_t dim);

}  // namespace embedding
}  // namespace tfext

#endif  // TENSORFLOW_EXT_EMBEDDING_KERNELS_ROW_INITIALIZER_CPU_H_
