// DeviceBackend: runs BucketTable's kernels on a CUDA device (nvcc only). Arrays are cudaMalloc'ed; every
// operation is enqueued on one stream, in call order; ForEach is a grid-stride kernel with one thread per index.

#ifndef TENSORFLOW_EXT_TABLE_GPU_DEVICE_BACKEND_H_
#define TENSORFLOW_EXT_TABLE_GPU_DEVICE_BACKEND_H_

#if !defined(__CUDACC__)
#error "device_backend.h is CUDA code: include it from a .cu.cc file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <string>

namespace tfext {
namespace table {
namespace gpu {

template <class F>
__global__ void ForEachKernel(F f, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

// Adds the number of i in [0, n) with pred(i) to *a (and *b if non-null): a block sums its threads' counts, then
// one thread adds them (same-address atomics from every thread, even once per warp, serialize at the memory).
// Every thread of a block reaches the reduction (blockDim.x is a multiple of 32).
template <class P>
__global__ void CountIfKernel(P pred, int64_t n, unsigned long long* a, unsigned long long* b) {
  __shared__ unsigned long long warp_sums[32];
  unsigned long long c = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) c += pred(i);
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
    if (total > 0) {
      atomicAdd(a, total);
      if (b) atomicAdd(b, total);
    }
  }
}

inline std::string CudaError(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

struct DeviceBackend {
  cudaStream_t stream = nullptr;  // the default stream unless set
  int threads_per_block = 256;    // a multiple of 32 (CountIf sums whole warps)
  int multiprocessors = 0;        // of the current device, read at the first launch

  std::string Alloc(void** p, size_t bytes) {
    const cudaError_t err = cudaMalloc(p, bytes > 0 ? bytes : 1);
    if (err != cudaSuccess) {
      *p = nullptr;
      return CudaError(("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str(), err);
    }
    return "";
  }
  void Free(void* p) { cudaFree(p); }
  std::string Memset(void* p, int value, size_t bytes) {
    const cudaError_t err = cudaMemsetAsync(p, value, bytes, stream);
    return err == cudaSuccess ? "" : CudaError("cudaMemsetAsync", err);
  }
  // Device to host; waits for the stream (the host reads the result next).
  std::string CopyToHost(void* dst, const void* src, size_t bytes) {
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    return err == cudaSuccess ? "" : CudaError("copy to host", err);
  }
  std::string CopyToDevice(void* dst, const void* src, size_t bytes) {
    const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
    return err == cudaSuccess ? "" : CudaError("copy to device", err);
  }

  template <class F>
  std::string ForEach(int64_t n, const F& f) {
    if (n <= 0) return "";
    // Enough blocks to fill the device several times over; a grid-stride loop covers the rest.
    ForEachKernel<<<Blocks(n, 32), threads_per_block, 0, stream>>>(f, n);
    return LaunchError();
  }

  // *a += |{i in [0, n) : pred(i)}| (and *b, if non-null), with one atomic per block.
  template <class P>
  std::string CountIf(int64_t n, const P& pred, unsigned long long* a, unsigned long long* b = nullptr) {
    if (n <= 0) return "";
    if (threads_per_block % 32 != 0 || threads_per_block < 32 || threads_per_block > 1024) {
      return "CountIf: threads_per_block must be a multiple of 32 in [32, 1024] (the block sum uses whole warps), "
             "got " +
             std::to_string(threads_per_block);
    }
    CountIfKernel<<<Blocks(n, 4), threads_per_block, 0, stream>>>(pred, n, a, b);
    return LaunchError();
  }

 private:
  static std::string LaunchError() {
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? "" : CudaError("kernel launch", err);
  }

  // Blocks for n indices, at most per_multiprocessor blocks per multiprocessor.
  int Blocks(int64_t n, int per_multiprocessor) {
    if (multiprocessors == 0) {
      int device = 0;
      if (cudaGetDevice(&device) != cudaSuccess ||
          cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        multiprocessors = 80;
      }
    }
    const int64_t wanted = (n + threads_per_block - 1) / threads_per_block;
    const int64_t cap = static_cast<int64_t>(multiprocessors) * per_multiprocessor;
    return static_cast<int>(wanted < cap ? wanted : cap);
  }
};

}  // namespace gpu
}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_GPU_DEVICE_BACKEND_H_
