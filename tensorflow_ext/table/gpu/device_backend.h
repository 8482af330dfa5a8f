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

inline std::string CudaError(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

struct DeviceBackend {
  cudaStream_t stream = nullptr;  // the default stream unless set
  int threads_per_block = 256;
  int multiprocessors = 0;  // of the current device, read at the first launch

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
    if (multiprocessors == 0) {
      int device = 0;
      if (cudaGetDevice(&device) != cudaSuccess ||
          cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
        multiprocessors = 80;
      }
    }
    // Enough blocks to fill the device several times over; a grid-stride loop covers the rest.
    const int64_t wanted = (n + threads_per_block - 1) / threads_per_block;
    const int64_t cap = static_cast<int64_t>(multiprocessors) * 32;
    const int blocks = static_cast<int>(wanted < cap ? wanted : cap);
    ForEachKernel<<<blocks, threads_per_block, 0, stream>>>(f, n);
    const cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? "" : CudaError("kernel launch", err);
  }
};

}  // namespace gpu
}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_GPU_DEVICE_BACKEND_H_
