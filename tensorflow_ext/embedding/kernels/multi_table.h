// tensorflow_ext: running one kernel's work over several tables (the
// multi-table ops that the graph passes put in place of N per-table ops).
//
// RunPerTable(ctx, work, fn) calls fn(i, pf) for every table i once and
// returns the first error by table index. With one table, or one worker
// thread, the tables run one after the other and each gets the op's
// ParallelFor (as the per-table op would). Otherwise the tables themselves are
// spread over the intra-op threads (largest first, each thread taking the
// next table when done) and each runs on one thread (pf is inline): the
// tables are independent, so the results are those of running them one after
// the other.

#ifndef TENSORFLOW_EXT_EMBEDDING_KERNELS_MULTI_TABLE_H_
#define TENSORFLOW_EXT_EMBEDDING_KERNELS_MULTI_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/status.h"
#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/kernels/table_resource.h"

namespace tfext {

// work[i]: an estimate of table i's work (e.g. keys * row width), used to
// order the tables (largest first) and to run tiny batches inline.
inline tensorflow::Status RunPerTable(tensorflow::OpKernelContext* ctx, const std::vector<int64_t>& work,
                                      const std::function<tensorflow::Status(int, const table::ParallelFor&)>& fn) {
  const int n = static_cast<int>(work.size());
  const tensorflow::DeviceBase::CpuWorkerThreads* workers = ctx->device()->tensorflow_cpu_worker_threads();
  const int threads = (workers == nullptr || workers->workers == nullptr) ? 1 : workers->num_threads;
  const int64_t total = std::accumulate(work.begin(), work.end(), int64_t{0});
  // Below this many row elements in all, handing tables to other threads
  // costs more than it saves.
  constexpr int64_t kMinParallelWork = 4096;
  if (n <= 1 || threads <= 1 || total < kMinParallelWork) {
    const table::ParallelFor pf = MakeParallelFor(ctx);
    for (int i = 0; i < n; ++i) TF_RETURN_IF_ERROR(fn(i, pf));
    return tensorflow::OkStatus();
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&work](int a, int b) { return work[a] > work[b]; });
  std::vector<tensorflow::Status> status(n);
  std::atomic<int> next{0};
  const table::ParallelFor inline_pf = table::InlineParallelFor();
  const int parts = std::min(threads, n);
  // One unit per thread, each costing "a lot" so that ParallelFor gives every
  // unit its own thread; each unit then takes tables until none is left.
  workers->workers->ParallelFor(parts, int64_t{1} << 30, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int j = next.fetch_add(1); j < n; j = next.fetch_add(1)) {
        status[order[j]] = fn(order[j], inline_pf);
      }
    }
  });
  for (int i = 0; i < n; ++i) TF_RETURN_IF_ERROR(status[i]);
  return tensorflow::OkStatus();
}

}  // namespace tfext

#endif  // TENSORFLOW_EXT_EMBEDDING_KERNELS_MULTI_TABLE_H_
