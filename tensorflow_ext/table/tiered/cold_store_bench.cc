// Throughput and memory of the cold store through OpenColdStore (the plugin, as the tier uses it): the operations
// of a tier's promote and demote paths on a store whose files sit in the OS page cache.
//   bazel build //tensorflow_ext/table/tiered:cold_store_bench   (builds the plugin beside it)
//   bazel-bin/tensorflow_ext/table/tiered/cold_store_bench [--rows=1000000] [--width=32] [--dir=/var/tmp]
//       [--reads=200000] [--write_buffer=16777216] [--write_buffers=2] [--block_cache=8388608]
//       [--put_batch=16384] [--stores=0] [--store_rows=0]
// Store options as named (StoreOptions); --put_batch=0 writes batches as the tiered table does: 16K rows, or fewer
// if that is more than a write buffer holds (MaxPutRows).
// --stores=N first opens N more stores with the same options and prints the RAM each takes empty
// (kStoreFixedMemoryBytes), then after --store_rows rows were put into each (round robin, as many tables' demoters
// do), beside StoreMemoryBytes.
// Prints, best of 3 passes each: Put of new keys in batches (the demoter's chunks), Get of 1K-key batches
// of random present keys and of absent keys (a promote's MultiGet), Get + Delete of present keys (a promote), in
// Mkeys per CPU-second of the calling thread; for Put also per wall second and per CPU-second of the whole process
// (RocksDB's flushes and compactions run on threads of their own: the process figure includes the part of them
// that ran meanwhile). Then the disk bytes per row and the process's resident memory: VmHWM (its peak) before the
// store opens (the benchmark's own buffers) and after each phase, so the store's RAM is the growth. Load the
// machine lightly: figures move with other processes.
#include <malloc.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tensorflow_ext/table/tiered/cold_store.h"

namespace {

using tfext::table::ColdStore;
using tfext::table::KeyMeta;

// CPU seconds of the calling thread: on a shared machine, a steadier measure than the wall clock (RocksDB's
// background flushes and compactions run on threads of their own and are not counted).
double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// CPU seconds of every thread of the process (RocksDB's included).
double ProcessSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A field of /proc/self/status in MiB (VmHWM: the peak resident set; VmRSS: the resident set now).
double StatusMiB(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(status, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) return std::atof(line.c_str() + prefix.size()) / 1024.0;
  }
  return -1;
}

void PrintMemory(const char* when) {
  const struct mallinfo2 heap = mallinfo2();
  std::printf("  memory %-22s VmHWM %7.1f MiB, VmRSS %7.1f MiB (malloc: %.1f MiB in use, %.1f MiB held)\n", when,
              StatusMiB("VmHWM"), StatusMiB("VmRSS"), (heap.uordblks + heap.hblkhd) / 1048576.0,
              (heap.arena + heap.hblkhd) / 1048576.0);
  std::fflush(stdout);
}

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return fallback;
}

std::string FlagString(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

// Keys spread over the int64 range (as hashed feature ids are).
int64_t KeyOf(int64_t i) { return static_cast<int64_t>(static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull); }

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = Flag(argc, argv, "rows", 1000000);
  const int64_t width = Flag(argc, argv, "width", 32);
  const int64_t reads = Flag(argc, argv, "reads", 200000);
  const std::string base = FlagString(argc, argv, "dir", "/var/tmp");
  const std::string path = base + "/cold_store_bench." + std::to_string(getpid());
  constexpr int64_t kGetBatch = 1024;

  tfext::table::StoreOptions options;
  options.path = path;
  options.width = width;
  options.write_buffer_bytes = Flag(argc, argv, "write_buffer", options.write_buffer_bytes);
  options.write_buffers = Flag(argc, argv, "write_buffers", options.write_buffers);
  options.block_cache_bytes = Flag(argc, argv, "block_cache", 8 << 20);  // far below the data: the page cache
  int64_t put_batch = Flag(argc, argv, "put_batch", 16384);
  if (put_batch <= 0) put_batch = std::min<int64_t>(16384, tfext::table::MaxPutRows(options));
  const int64_t stores = Flag(argc, argv, "stores", 0);
  const int64_t store_rows = Flag(argc, argv, "store_rows", 0);
  const int64_t buffer_rows = std::max(put_batch, kGetBatch);
  std::printf(
      "store: %lld rows of width %lld; write buffers %lld x %lld bytes, block cache %lld bytes: "
      "StoreMemoryBytes %.1f MiB; puts of %lld rows\n",
      static_cast<long long>(rows), static_cast<long long>(width), static_cast<long long>(options.write_buffers),
      static_cast<long long>(options.write_buffer_bytes), static_cast<long long>(options.block_cache_bytes),
      tfext::table::StoreMemoryBytes(options) / 1048576.0, static_cast<long long>(put_batch));

  std::vector<float> values(static_cast<size_t>(buffer_rows * width));
  std::vector<KeyMeta> meta(buffer_rows);
  std::vector<int64_t> keys(buffer_rows);
  std::vector<float> out(static_cast<size_t>(kGetBatch * width));
  std::vector<KeyMeta> out_meta(kGetBatch);
  std::unique_ptr<bool[]> found(new bool[kGetBatch]);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);  // trained embedding values
  for (float& v : values) v = normal(rng);
  std::fill(out.begin(), out.end(), 0.0f);
  PrintMemory("before the store");
  std::vector<std::unique_ptr<ColdStore>> empty_stores;
  if (stores > 0) {
    // The first open loads the plugin and RocksDB (process-wide costs): measure the stores after it.
    tfext::table::StoreOptions o = options;
    o.path = path + ".empty0";
    empty_stores.push_back(tfext::table::OpenColdStore(o));
    const double before = StatusMiB("VmRSS");
    for (int64_t i = 1; i <= stores; ++i) {
      o.path = path + ".empty" + std::to_string(i);
      empty_stores.push_back(tfext::table::OpenColdStore(o));
    }
    std::printf("  %lld empty stores: %.3f MiB of RSS each\n", static_cast<long long>(stores),
                (StatusMiB("VmRSS") - before) / stores);
    for (int64_t b = 0; b < store_rows; b += put_batch) {
      const int64_t m = std::min(put_batch, store_rows - b);
      for (int64_t s = 1; s <= stores; ++s) {
        for (int64_t i = 0; i < m; ++i) {
          keys[i] = KeyOf(b + i);
          meta[i] = KeyMeta{b + i, 1};
        }
        empty_stores[s]->Put(keys.data(), m, values.data(), meta.data());
      }
    }
    if (store_rows > 0) {
      std::printf("  %lld stores of %lld rows: %.3f MiB of RSS each (peak %.3f), StoreMemoryBytes %.3f MiB\n",
                  static_cast<long long>(stores), static_cast<long long>(store_rows),
                  (StatusMiB("VmRSS") - before) / stores, (StatusMiB("VmHWM") - before) / stores,
                  tfext::table::StoreMemoryBytes(options) / 1048576.0);
    }
  }
  std::unique_ptr<ColdStore> store = tfext::table::OpenColdStore(options);
  PrintMemory("store open");

  double start = ThreadSeconds(), start_process = ProcessSeconds(), start_wall = WallSeconds();
  for (int64_t b = 0; b < rows; b += put_batch) {
    const int64_t m = std::min(put_batch, rows - b);
    for (int64_t i = 0; i < m; ++i) {
      keys[i] = KeyOf(b + i);
      meta[i] = KeyMeta{b + i, 1};
    }
    store->Put(keys.data(), m, values.data(), meta.data());
  }
  const double put_s = ThreadSeconds() - start, put_process_s = ProcessSeconds() - start_process;
  const double put_wall_s = WallSeconds() - start_wall;
  store->CompactIfNeeded();  // no deletes yet: a no-op
  std::printf("put: %.3f Mkeys/s (new keys; %.3f per wall s, %.3f per process CPU-s)\n", rows / put_s / 1e6,
              rows / put_wall_s / 1e6, rows / put_process_s / 1e6);
  std::printf("disk: %.1f bytes/row\n", static_cast<double>(store->disk_bytes()) / rows);
  PrintMemory("after the puts");

  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  auto best_of_3 = [&](bool present) {
    double best = 0;
    for (int pass = 0; pass < 3; ++pass) {
      int64_t hits = 0, total = 0;
      const double t = ThreadSeconds();
      for (int64_t done = 0; done < reads; done += kGetBatch) {
        for (int64_t i = 0; i < kGetBatch; ++i) keys[i] = present ? KeyOf(pick(rng)) : KeyOf(rows + pick(rng));
        store->Get(keys.data(), kGetBatch, out.data(), out_meta.data(), found.get());
        hits += std::count(found.get(), found.get() + kGetBatch, true);
        total += kGetBatch;
      }
      if (hits != (present ? total : 0)) {
        std::fprintf(stderr, "unexpected hits %lld\n", static_cast<long long>(hits));
        std::exit(1);
      }
      best = std::max(best, total / (ThreadSeconds() - t) / 1e6);
    }
    return best;
  };
  std::printf("get present: %.3f Mkeys/s (1K-key batches, random keys)\n", best_of_3(true));
  std::printf("get absent:  %.3f Mkeys/s\n", best_of_3(false));
  PrintMemory("after the gets");

  // A promote: read a batch of present keys, then delete them. Each pass takes fresh keys (a third of the rows at
  // most per pass, so every key read is present).
  const int64_t per_pass = std::max<int64_t>(kGetBatch, std::min(reads / 4, rows / 3) / kGetBatch * kGetBatch);
  double best = 0;
  int64_t next = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const double t = ThreadSeconds();
    for (int64_t done = 0; done < per_pass; done += kGetBatch) {
      for (int64_t i = 0; i < kGetBatch; ++i) keys[i] = KeyOf((next++ * 7919) % rows);
      store->Get(keys.data(), kGetBatch, out.data(), out_meta.data(), found.get());
      store->Delete(keys.data(), kGetBatch);
    }
    best = std::max(best, per_pass / (ThreadSeconds() - t) / 1e6);
  }
  std::printf("get + delete (a promote): %.3f Mkeys/s; %lld keys left\n", best,
              static_cast<long long>(store->num_keys()));
  PrintMemory("after get + delete");
  std::printf("process CPU: %.1f s in all\n", ProcessSeconds());
  for (size_t i = 0; i < empty_stores.size(); ++i) {
    const std::string p = empty_stores[i]->path();
    empty_stores[i].reset();
    unlink((p + "/TF_EXT_TIER_STORE").c_str());
    unlink((p + "/TF_EXT_TIER_STORE.lock").c_str());
    rmdir(p.c_str());
  }
  store.reset();  // removes the database; the marker and lock file go with the directory
  unlink((path + "/TF_EXT_TIER_STORE").c_str());
  unlink((path + "/TF_EXT_TIER_STORE.lock").c_str());
  rmdir(path.c_str());
  return 0;
}
