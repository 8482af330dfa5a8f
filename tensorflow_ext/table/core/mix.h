// The 64-bit mixers of tensorflow_ext, each defined once here and used by the
// table core, the embedding kernels and the CUDA table.
//
// Both are bijections of uint64 with full avalanche. They are deliberately two
// different functions: callers partition keys across tables with
// SplitMix64(key) % num_tables (HashKey, TfExtShardIndex), while a table
// shards and probes with Murmur3Fmix64(key). Were they the same, the keys of
// one partition would agree on the low bits of the probe hash and crowd a
// fraction of the table's index.
//
// Header-only and dependency-free, so nvcc compiles it for the device too.

#ifndef TENSORFLOW_EXT_TABLE_CORE_MIX_H_
#define TENSORFLOW_EXT_TABLE_CORE_MIX_H_

#include <cstdint>

#include "tensorflow_ext/table/core/host_device.h"

namespace tfext {
namespace table {

// The splitmix64 finalizer (Steele, Lea & Flood 2014, constants of Vigna's
// splitmix64.c). The Python layer reimplements it bit for bit to partition
// keys (tensorflow_ext/embedding), and the embedding kernels' random streams
// are built on it: changing it changes partitions and initial values.
TFEXT_HOST_DEVICE constexpr uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// MurmurHash3's 64-bit finalizer (fmix64). The probe hash of the CPU and the
// CUDA table: the CPU table shards by its top bits and tags index slots with
// its low 32 bits.
TFEXT_HOST_DEVICE constexpr uint64_t Murmur3Fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// Published values, so that a change to either mixer fails to compile.
static_assert(SplitMix64(0) == 0 && SplitMix64(1) == 0x5692161d100b05e5ULL,
              "SplitMix64 must stay the splitmix64 finalizer: Python partitions keys with the same function");
static_assert(Murmur3Fmix64(1) == 0xb456bcfc34c2cb2cULL, "Murmur3Fmix64 must stay MurmurHash3's fmix64");

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_MIX_H_
