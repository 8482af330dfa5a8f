// Limits of tensorflow_ext tables that more than one component enforces,
// defined once. Header-only and dependency-free (the CUDA table includes it).

#ifndef TENSORFLOW_EXT_TABLE_CORE_TABLE_LIMITS_H_
#define TENSORFLOW_EXT_TABLE_CORE_TABLE_LIMITS_H_

#include <cstdint>

namespace tfext {
namespace table {

// The largest number of keys a table may be asked to expect
// (TableOptions::initial_capacity, Reserve, the TF handle op's
// initial_capacity attr, the CUDA table's capacity): 2^40, far beyond any
// host's memory, so a larger value is a mistake worth reporting. Messages
// print it as "2^" + kMaxCapacityLog2. The Python layer checks the same bound
// before building ops.
constexpr int kMaxCapacityLog2 = 40;
constexpr int64_t kMaxCapacity = int64_t{1} << kMaxCapacityLog2;

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_TABLE_LIMITS_H_
