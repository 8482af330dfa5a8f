// Throughput of the cold store through OpenColdStore (the plugin, as the tier uses it): the operations of a
// tier's promote and demote paths on a store whose files sit in the OS page cache.
//   bazel build //tensorflow_ext/table/tiered:cold_store_bench   (builds the plugin beside it)
//   bazel-bin/tensorflow_ext/table/tiered/cold_store_bench [rows=1000000] [width=32] [dir=/var/tmp]
// Prints Mkeys per CPU-second of the calling thread, best of 3 passes each: Put of new keys in 16K-key batches (the
// demoter's chunks), Get of 1K-key batches of random present keys and of absent keys (a promote's MultiGet), Get +
// Delete of present keys (a promote), and the disk bytes per row. Load the machine lightly: figures move with other
// processes.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

// Keys spread over the int64 range (as hashed feature ids are).
int64_t KeyOf(int64_t i) { return static_cast<int64_t>(static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull); }

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1000000;
  const int64_t width = argc > 2 ? std::atoll(argv[2]) : 32;
  const std::string base = argc > 3 ? argv[3] : "/var/tmp";
  const std::string path = base + "/cold_store_bench." + std::to_string(getpid());
  constexpr int64_t kPutBatch = 16384, kGetBatch = 1024, kReads = 200000;

  tfext::table::StoreOptions options;
  options.path = path;
  options.width = width;
  options.block_cache_bytes = 8 << 20;  // far below the data: reads come from the page cache
  std::unique_ptr<ColdStore> store = tfext::table::OpenColdStore(options);

  std::vector<float> values(static_cast<size_t>(kPutBatch * width));
  std::vector<KeyMeta> meta(kPutBatch);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);  // trained embedding values
  for (float& v : values) v = normal(rng);
  std::vector<int64_t> keys(kPutBatch);
  double start = ThreadSeconds();
  for (int64_t b = 0; b < rows; b += kPutBatch) {
    const int64_t m = std::min(kPutBatch, rows - b);
    for (int64_t i = 0; i < m; ++i) {
      keys[i] = KeyOf(b + i);
      meta[i] = KeyMeta{b + i, 1};
    }
    store->Put(keys.data(), m, values.data(), meta.data());
  }
  const double put_s = ThreadSeconds() - start;
  store->CompactIfNeeded();  // no deletes yet: a no-op
  std::printf("rows %lld, width %lld: put %.2f Mkeys/s (16K-key batches, new keys), %.1f disk bytes/row\n",
              static_cast<long long>(rows), static_cast<long long>(width), rows / put_s / 1e6,
              static_cast<double>(store->disk_bytes()) / rows);

  std::vector<float> out(static_cast<size_t>(kGetBatch * width));
  std::vector<KeyMeta> out_meta(kGetBatch);
  std::unique_ptr<bool[]> found(new bool[kGetBatch]);
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  auto best_of_3 = [&](bool present) {
    double best = 0;
    for (int pass = 0; pass < 3; ++pass) {
      int64_t hits = 0, total = 0;
      const double t = ThreadSeconds();
      for (int64_t done = 0; done < kReads; done += kGetBatch) {
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
  std::printf("get present: %.2f Mkeys/s (1K-key batches, random keys)\n", best_of_3(true));
  std::printf("get absent:  %.2f Mkeys/s\n", best_of_3(false));

  // A promote: read a batch of present keys, then delete them. Each pass takes fresh keys (a third of the rows at
  // most per pass, so every key read is present).
  const int64_t per_pass = std::max<int64_t>(kGetBatch, std::min(kReads / 4, rows / 3) / kGetBatch * kGetBatch);
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
  std::printf("get + delete (a promote): %.2f Mkeys/s; %lld keys left\n", best,
              static_cast<long long>(store->num_keys()));
  store.reset();  // removes the database; the marker and lock file go with the directory
  unlink((path + "/TF_EXT_TIER_STORE").c_str());
  unlink((path + "/TF_EXT_TIER_STORE.lock").c_str());
  rmdir(path.c_str());
  return 0;
}
