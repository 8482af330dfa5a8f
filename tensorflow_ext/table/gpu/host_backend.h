// HostBackend: runs BucketTable's kernels on host threads over host memory, so that the CPU test suite exercises
// the CUDA table's per-key code (claims, probes, eviction, dedup) with real concurrency, without a GPU. Each
// ForEach is one "kernel": its calls run on several threads at once, interleaved in small chunks so that
// neighbouring batch entries race, and the call returns when all have finished (the kernel boundary).

#ifndef TENSORFLOW_EXT_TABLE_GPU_HOST_BACKEND_H_
#define TENSORFLOW_EXT_TABLE_GPU_HOST_BACKEND_H_

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace tfext {
namespace table {
namespace gpu {

struct HostBackend {
  int threads = 4;  // at least 2, to race

  std::string Alloc(void** p, size_t bytes) {
    *p = std::malloc(bytes > 0 ? bytes : 1);
    return *p ? "" : "host allocation of " + std::to_string(bytes) + " bytes failed";
  }
  void Free(void* p) { std::free(p); }
  std::string Memset(void* p, int value, size_t bytes) {
    std::memset(p, value, bytes);
    return "";
  }
  std::string CopyToHost(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return "";
  }
  std::string CopyToDevice(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return "";
  }

  template <class F>
  std::string ForEach(int64_t n, const F& f) {
    if (n <= 0) return "";
    constexpr int64_t kChunk = 16;
    std::atomic<int64_t> next{0};
    std::atomic<int> ready{0};
    auto work = [&] {
      // Start together, so that small batches race too (a thread started late would find no work left).
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      for (;;) {
        const int64_t begin = next.fetch_add(kChunk);
        if (begin >= n) return;
        const int64_t end = begin + kChunk < n ? begin + kChunk : n;
        for (int64_t i = begin; i < end; ++i) f(i);
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    return "";
  }

  // *a += |{i in [0, n) : pred(i)}| (and *b, if non-null).
  template <class P>
  std::string CountIf(int64_t n, const P& pred, unsigned long long* a, unsigned long long* b = nullptr) {
    std::atomic<unsigned long long> count{0};
    std::string err = ForEach(n, [&](int64_t i) {
      if (pred(i)) count.fetch_add(1, std::memory_order_relaxed);
    });
    *a += count.load();
    if (b) *b += count.load();
    return err;
  }
};

}  // namespace gpu
}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_GPU_HOST_BACKEND_H_
