// TFEXT_HOST_DEVICE: marks a function that nvcc compiles for the host and the device alike (the mixers, the
// initial-row math, the optimizer formulas, the CUDA table's per-key algorithms); a plain C++ compiler sees an
// ordinary inline function. One definition of each formula serves the CPU kernels and the GPU table.

#ifndef TENSORFLOW_EXT_TABLE_CORE_HOST_DEVICE_H_
#define TENSORFLOW_EXT_TABLE_CORE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define TFEXT_HOST_DEVICE __host__ __device__
#else
#define TFEXT_HOST_DEVICE
#endif

#endif  // TENSORFLOW_EXT_TABLE_CORE_HOST_DEVICE_H_
