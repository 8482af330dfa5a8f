// A tiny test framework (registry + CHECK macros) and a std::thread pool that
// provides the core's ParallelFor, for the core's C++ tests and benchmark.
// Header-only on purpose: the core's tests must build with a bare g++.

#ifndef TENSORFLOW_EXT_TABLE_CORE_TEST_UTIL_H_
#define TENSORFLOW_EXT_TABLE_CORE_TEST_UTIL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow_ext/table/core/hash_table.h"

namespace tfext_test {

struct TestCase {
  const char* name;
  void (*fn)();
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { Registry().push_back({name, fn}); }
};

// Thrown by a failed CHECK: ends the current test, the runner goes on.
struct CheckFailure : std::exception {};

inline std::mutex& PrintMutex() {
  static std::mutex mu;
  return mu;
}

[[noreturn]] inline void FailCheck(const char* file, int line, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(PrintMutex());
    std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what.c_str());
  }
  throw CheckFailure();
}

template <typename A, typename B>
std::string DescribeComparison(const char* expr_a, const char* op, const char* expr_b, const A& a, const B& b) {
  std::ostringstream os;
  os << expr_a << " " << op << " " << expr_b << " (" << a << " vs " << b << ")";
  return os.str();
}

// Runs every registered test whose name contains filter (all if empty) and
// prints "N passed, M failed". Returns the process exit code.
inline int RunAllTests(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  int passed = 0, failed = 0;
  for (const TestCase& t : Registry()) {
    if (!filter.empty() && std::string(t.name).find(filter) == std::string::npos) continue;
    std::printf("[ RUN  ] %s\n", t.name);
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    bool ok = true;
    try {
      t.fn();
    } catch (const CheckFailure&) {
      ok = false;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "uncaught exception: %s\n", e.what());
      ok = false;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("[ %s ] %s (%.0f ms)\n", ok ? " OK " : "FAIL", t.name, ms);
    ok ? ++passed : ++failed;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

// A fixed pool of worker threads. ParallelFor splits [0, total) into a few
// ranges per thread; the calling thread works too. Calls from several
// threads are serialized (one job at a time), which is all the tests need.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) : threads_(std::max(1, threads)) {
    for (int t = 1; t < threads_; ++t) workers_.emplace_back([this] { WorkerLoop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  void ParallelFor(int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    if (threads_ == 1 || total == 1) {
      fn(0, total);
      return;
    }
    std::lock_guard<std::mutex> one_job_at_a_time(job_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_fn_ = &fn;
      job_total_ = total;
      job_ranges_ = std::min<int64_t>(total, 4 * threads_);
      next_range_.store(0);
      ranges_done_ = 0;
      ++generation_;
    }
    wake_.notify_all();
    const int64_t mine = RunRanges();
    std::unique_lock<std::mutex> lock(mu_);
    ranges_done_ += mine;
    done_.wait(lock, [&] { return ranges_done_ == job_ranges_; });
    job_fn_ = nullptr;
  }

  tfext::table::ParallelFor AsParallelFor() {
    return [this](int64_t total, const std::function<void(int64_t, int64_t)>& fn) { ParallelFor(total, fn); };
  }

 private:
  // Claims and runs ranges of the current job; returns how many it ran.
  int64_t RunRanges() {
    int64_t ran = 0;
    for (;;) {
      const int64_t r = next_range_.fetch_add(1);
      if (r >= job_ranges_) break;
      const int64_t begin = job_total_ * r / job_ranges_;
      const int64_t end = job_total_ * (r + 1) / job_ranges_;
      if (begin < end) (*job_fn_)(begin, end);
      ++ran;
    }
    return ran;
  }

  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && job_fn_ != nullptr); });
        if (stopping_) return;
        seen = generation_;
      }
      const int64_t ran = RunRanges();
      std::lock_guard<std::mutex> lock(mu_);
      ranges_done_ += ran;
      if (ranges_done_ == job_ranges_) done_.notify_all();
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex job_mu_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  bool stopping_ = false;
  uint64_t generation_ = 0;
  const std::function<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_total_ = 0;
  int64_t job_ranges_ = 0;
  std::atomic<int64_t> next_range_{0};
  int64_t ranges_done_ = 0;
};

}  // namespace tfext_test

#define TFEXT_TEST(name)                                         \
  static void name();                                            \
  static ::tfext_test::Registrar name##_registrar(#name, &name); \
  static void name()

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) ::tfext_test::FailCheck(__FILE__, __LINE__, #cond); \
  } while (0)

#define TFEXT_CHECK_OP(a, op, b)                                                                                      \
  do {                                                                                                                \
    const auto& check_a_ = (a);                                                                                       \
    const auto& check_b_ = (b);                                                                                       \
    if (!(check_a_ op check_b_)) {                                                                                    \
      ::tfext_test::FailCheck(__FILE__, __LINE__, ::tfext_test::DescribeComparison(#a, #op, #b, check_a_, check_b_)); \
    }                                                                                                                 \
  } while (0)

#define CHECK_EQ(a, b) TFEXT_CHECK_OP(a, ==, b)
#define CHECK_NE(a, b) TFEXT_CHECK_OP(a, !=, b)
#define CHECK_LT(a, b) TFEXT_CHECK_OP(a, <, b)
#define CHECK_LE(a, b) TFEXT_CHECK_OP(a, <=, b)
#define CHECK_GT(a, b) TFEXT_CHECK_OP(a, >, b)
#define CHECK_GE(a, b) TFEXT_CHECK_OP(a, >=, b)

#endif  // TENSORFLOW_EXT_TABLE_CORE_TEST_UTIL_H_
