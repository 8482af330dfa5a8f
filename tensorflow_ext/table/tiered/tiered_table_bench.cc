// Micro-benchmark of the tiered table (tiered_table.h; no TensorFlow): lookups
// of a table whose memory tier holds 25%, 50% or 100% of its keys, the rest
// in the RocksDB store, beside the same table all in memory (untiered).
//
// Workload: --keys rows of width 2 * --dim (an embedding of dim columns and
// as many Adagrad slot columns, float32), all present; batches of --batch
// distinct keys drawn from a Zipf distribution (exponent --zipf, key ranks
// scattered over the key space) or uniformly. Each case first runs --warmup
// training lookups (FindOrInsert with the step as version: LRU learns what
// is hot), then times --repeats passes of --batches batches (fresh
// batches for each pass and op):
//   find            HashTable::Find of the dim embedding columns
//   find_or_insert  HashTable::FindOrInsert of them, count and version (a
//                   training lookup; every key exists, so nothing is new)
// each through TieredTable::WithKeys (promotion of the batch's cold keys
// first), the untiered table called directly. A tiered pass ends with
// Settle(): the demotions its batches made necessary are in its time.
// Demotion runs on the tier's background thread, as in training. Each
// tiered pass runs right after the same pass on the untiered table, so that
// both see the same load. Prints one line per case: the best pass's Mkeys/s
// of each table (wall clock, and per CPU-second of the whole process: the
// machines here are shared), the median of the per-pass ratios, the fraction
// of keys in memory (after a round: 90% of the budget), per looked-up key the
// cold reads (rows promoted from disk) and demotions, and the store's size.
//
//   bazel build //tensorflow_ext/table/tiered:tiered_table_bench   (builds the RocksDB plugin beside it)
//   bazel-bin/tensorflow_ext/table/tiered/tiered_table_bench [--keys=1000000] [--dim=32] [--batch=4096]
//       [--warmup=250] [--batches=100] [--repeats=3] [--zipf=1.0] [--threads=1] [--path=/tmp/...]
//       [--fractions=25,50,100] [--dists=zipf,uniform]
// The plugin is loaded from next to the binary ($TF_EXT_ROCKSDB_STORE_LIB
// overrides); the store lives under --path (default a fresh directory in
// /tmp, removed at the end).

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/tiered/cold_store.h"
#include "tensorflow_ext/table/tiered/tiered_table.h"

namespace {

using tfext::table::HashKey;
using tfext::table::HashTable;
using tfext::table::ParallelFor;
using tfext::table::TableOptions;
using tfext::table::TieredTable;
using tfext::table::TierOptions;
using tfext::table::TierStats;

std::string FlagString(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

int64_t FlagInt(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string value = FlagString(argc, argv, name, "");
  return value.empty() ? fallback : std::atoll(value.c_str());
}

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    if (end > begin) out.push_back(list.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// CPU time of every thread of the process: on a shared machine a pass's
// wall-clock time counts the other processes' turns too.
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// The key of popularity rank r (0 = the most popular): a bijective mixer,
// so that the hot keys are scattered over the table's shards as real ids are.
int64_t KeyOfRank(int64_t rank) { return static_cast<int64_t>(HashKey(rank)); }

// Batches of `batch` distinct keys: ranks drawn from Zipf(exponent) over
// num_keys ranks (inverse CDF by binary search), or uniformly; a rank drawn
// twice for one batch is drawn again.
std::vector<std::vector<int64_t>> MakeBatches(const std::string& dist, double exponent, int64_t num_keys, int64_t batch,
                                              int64_t count, uint64_t seed) {
  std::vector<double> cdf;
  if (dist == "zipf") {
    cdf.resize(num_keys);
    double sum = 0;
    for (int64_t r = 0; r < num_keys; ++r) cdf[r] = (sum += std::pow(static_cast<double>(r + 1), -exponent));
    for (double& c : cdf) c /= sum;
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::vector<int64_t>> batches(count);
  std::unordered_set<int64_t> seen;
  for (std::vector<int64_t>& keys : batches) {
    seen.clear();
    while (static_cast<int64_t>(keys.size()) < batch) {
      int64_t rank;
      if (cdf.empty()) {
        rank = static_cast<int64_t>(rng() % static_cast<uint64_t>(num_keys));
      } else {
        rank = std::upper_bound(cdf.begin(), cdf.end(), unit(rng)) - cdf.begin();
        rank = std::min(rank, num_keys - 1);
      }
      if (seen.insert(rank).second) keys.push_back(KeyOfRank(rank));
    }
  }
  return batches;
}

struct Config {
  int64_t num_keys, dim, width, batch, warmup, batches, repeats;
  ParallelFor pf;
};

// The table's operations a case times: reads of the embedding columns.
struct Ops {
  const Config& c;
  std::vector<float> out, init;
  explicit Ops(const Config& config)
      : c(config), out(config.batch * config.dim), init(config.batch * config.dim, 0.01f) {}
  void Find(HashTable& t, const std::vector<int64_t>& keys) {
    t.Find(keys.data(), static_cast<int64_t>(keys.size()), 0, c.dim, out.data(), nullptr, nullptr, c.pf);
  }
  void FindOrInsert(HashTable& t, const std::vector<int64_t>& keys, int64_t step) {
    t.FindOrInsert(keys.data(), static_cast<int64_t>(keys.size()), 0, c.dim, init.data(), nullptr, out.data(), nullptr,
                   true, step, c.pf);
  }
};

// Every key, rows of small random values (Adagrad slots at their initial
// 0.1), version 0.
void Prefill(const Config& c, const std::function<void(const int64_t*, int64_t, const float*)>& import) {
  const int64_t chunk = 65536;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::vector<int64_t> keys(chunk);
  std::vector<float> rows(chunk * c.width);
  for (int64_t begin = 0; begin < c.num_keys; begin += chunk) {
    const int64_t n = std::min(chunk, c.num_keys - begin);
    for (int64_t i = 0; i < n; ++i) {
      keys[i] = KeyOfRank(begin + i);
      for (int64_t col = 0; col < c.width; ++col) rows[i * c.width + col] = col < c.dim ? normal(rng) : 0.1f;
    }
    import(keys.data(), n, rows.data());
  }
}

// One timed pass: Mkeys/s by the wall clock and per CPU-second of the whole
// process (the tier's demoter and RocksDB's threads included).
struct Rate {
  double wall = 0, cpu = 0;
};

template <typename Pass>
Rate TimePass(const Config& c, TieredTable* tier, int64_t rep, const Pass& pass) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ProcessCpuSeconds();
  pass(rep);
  if (tier != nullptr) tier->Settle();
  const double keys = static_cast<double>(c.batches) * c.batch;
  return Rate{keys / Seconds(start) / 1e6, keys / (ProcessCpuSeconds() - cpu_start) / 1e6};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times `repeats` passes of the tiered table, each right after the same pass
// of the untiered table (so that both see the same load on a shared
// machine), and prints the case's line: the best pass of each, the median
// of the per-pass ratios, and the tier's counters over the tiered passes.
template <typename TieredPass, typename UntieredPass>
void RunCase(const Config& c, const std::string& dist, const char* op, const std::string& budget, TieredTable* tier,
             const TieredPass& tiered_pass, const UntieredPass& untiered_pass) {
  Rate best_tiered, best_untiered;
  std::vector<double> wall_ratio, cpu_ratio;
  TierStats delta;
  for (int64_t rep = 0; rep < c.repeats; ++rep) {
    const Rate u = TimePass(c, nullptr, rep, untiered_pass);
    const TierStats before = tier->stats();
    const Rate t = TimePass(c, tier, rep, tiered_pass);
    const TierStats after = tier->stats();
    delta.lookups += after.lookups - before.lookups;
    delta.cold_reads += after.cold_reads - before.cold_reads;
    delta.demotions += after.demotions - before.demotions;
    best_tiered.wall = std::max(best_tiered.wall, t.wall);
    best_tiered.cpu = std::max(best_tiered.cpu, t.cpu);
    best_untiered.wall = std::max(best_untiered.wall, u.wall);
    best_untiered.cpu = std::max(best_untiered.cpu, u.cpu);
    wall_ratio.push_back(t.wall / u.wall);
    cpu_ratio.push_back(t.cpu / u.cpu);
  }
  const TierStats now = tier->stats();
  const double looked_up = static_cast<double>(std::max<int64_t>(delta.lookups, 1));
  std::printf("%-8s %-15s %6s %6.1f%% %8.3f %8.3f %8.3f %8.3f %7.4fx %7.4fx %8.3f %8.3f %8.0f\n", dist.c_str(), op,
              budget.c_str(), 100.0 * now.memory_keys / c.num_keys, best_tiered.wall, best_tiered.cpu,
              best_untiered.wall, best_untiered.cpu, Median(wall_ratio), Median(cpu_ratio),
              delta.cold_reads / looked_up, delta.demotions / looked_up, now.disk_bytes / 1048576.0);
  std::fflush(stdout);
}

void RemoveTree(const std::string& path) {
  const std::string command = "rm -rf '" + path + "'";
  if (std::system(command.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  c.num_keys = FlagInt(argc, argv, "keys", 1000000);
  c.dim = FlagInt(argc, argv, "dim", 32);
  c.width = 2 * c.dim;
  c.batch = FlagInt(argc, argv, "batch", 4096);
  c.warmup = FlagInt(argc, argv, "warmup", 250);
  c.batches = FlagInt(argc, argv, "batches", 100);
  c.repeats = FlagInt(argc, argv, "repeats", 3);
  const double exponent = std::atof(FlagString(argc, argv, "zipf", "1.0").c_str());
  const int threads = static_cast<int>(FlagInt(argc, argv, "threads", 1));
  const std::vector<std::string> fractions = Split(FlagString(argc, argv, "fractions", "25,50,100"));
  const std::vector<std::string> dists = Split(FlagString(argc, argv, "dists", "zipf,uniform"));
  std::string root = FlagString(argc, argv, "path", "");
  const bool own_root = root.empty();
  if (own_root) root = "/tmp/tiered_table_bench." + std::to_string(getpid());
  if (c.num_keys < c.batch || c.batch < 1 || c.dim < 1 || c.repeats < 1 || c.batches < 1 || c.warmup < 0) {
    std::fprintf(stderr, "need keys >= batch >= 1, dim >= 1, repeats >= 1, batches >= 1, warmup >= 0\n");
    return 2;
  }
  // The plugin sits next to this binary in bazel-bin (the loader would look
  // next to the op library, which a benchmark does not have).
  if (std::getenv(tfext::table::kRocksDbStoreLibraryEnv) == nullptr) {
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len > 0) {
      self[len] = '\0';
      std::string dir(self);
      dir = dir.substr(0, dir.rfind('/') + 1);
      setenv(tfext::table::kRocksDbStoreLibraryEnv, (dir + tfext::table::kRocksDbStoreLibrary).c_str(), 1);
    }
  }
  tfext_test::ThreadPool pool(threads);
  c.pf = threads > 1 ? pool.AsParallelFor() : tfext::table::InlineParallelFor();
  TableOptions options;
  options.width = c.width;
  options.huge_pages = false;  // as the embedding tables
  const int64_t row_bytes = HashTable(options).row_bytes();

  std::printf(
      "tiered table: %lld keys, width %lld (dim %lld + %lld Adagrad slots, float32, %lld B rows), batches of %lld "
      "distinct keys, %d thread(s), %lld passes of %lld batches after %lld warm-up batches; zipf exponent "
      "%.2f\n",
      static_cast<long long>(c.num_keys), static_cast<long long>(c.width), static_cast<long long>(c.dim),
      static_cast<long long>(c.dim), static_cast<long long>(row_bytes), static_cast<long long>(c.batch), threads,
      static_cast<long long>(c.repeats), static_cast<long long>(c.batches), static_cast<long long>(c.warmup), exponent);
  std::printf("%-8s %-15s %6s %7s %17s %17s %17s %8s %8s %8s\n", "keys", "op", "budget", "in mem", "tiered Mkeys/s",
              "untiered Mkeys/s", "tiered/untiered", "cold", "demoted", "disk");
  std::printf("%-8s %-15s %6s %7s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "", "", "", "", "wall", "per CPU", "wall",
              "per CPU", "wall", "per CPU", "per key", "per key", "MiB");

  for (const std::string& dist : dists) {
    if (dist != "zipf" && dist != "uniform") {
      std::fprintf(stderr, "--dists takes zipf and uniform, got %s\n", dist.c_str());
      return 2;
    }
    const std::vector<std::vector<int64_t>> warmup = MakeBatches(dist, exponent, c.num_keys, c.batch, c.warmup, 1);
    // Fresh batches for every pass (a pass that replayed the previous one's
    // keys would find them promoted already), others for each op.
    std::vector<std::vector<std::vector<int64_t>>> find_batches, train_batches;
    for (int64_t rep = 0; rep < c.repeats; ++rep) {
      find_batches.push_back(MakeBatches(dist, exponent, c.num_keys, c.batch, c.batches, 100 + rep));
      train_batches.push_back(MakeBatches(dist, exponent, c.num_keys, c.batch, c.batches, 200 + rep));
    }
    Ops ops(c);
    // A pass runs the batches of pass `rep` through `via`: directly, or
    // inside TieredTable::WithKeys. `step` is the table's training step (the
    // version its lookups set).
    using Via = std::function<void(const std::vector<int64_t>&, const std::function<void()>&)>;
    const auto find_pass = [&](HashTable* t, Via via) {
      return [&ops, &find_batches, t, via](int64_t rep) {
        for (const std::vector<int64_t>& keys : find_batches[rep]) via(keys, [&] { ops.Find(*t, keys); });
      };
    };
    const auto train_pass = [&](HashTable* t, int64_t* step, Via via) {
      return [&ops, &train_batches, t, step, via](int64_t rep) {
        for (const std::vector<int64_t>& keys : train_batches[rep]) {
          const int64_t version = ++*step;
          via(keys, [&] { ops.FindOrInsert(*t, keys, version); });
        }
      };
    };
    const Via direct = [](const std::vector<int64_t>&, const std::function<void()>& op) { op(); };

    // The untiered table: all keys in memory, called directly.
    HashTable untiered(options);
    Prefill(c, [&](const int64_t* keys, int64_t n, const float* rows) {
      untiered.Import(keys, n, 0, c.width, rows, nullptr, nullptr, nullptr, c.pf);
    });
    int64_t untiered_step = 0;
    for (const std::vector<int64_t>& keys : warmup) ops.FindOrInsert(untiered, keys, ++untiered_step);

    for (const std::string& fraction : fractions) {
      const double f = std::atof(fraction.c_str()) / 100.0;
      if (!(f > 0)) {
        std::fprintf(stderr, "--fractions takes percentages > 0, got %s\n", fraction.c_str());
        return 2;
      }
      const std::string path = root + "/" + dist + "_" + fraction;
      HashTable memory(options);
      TierOptions tier_options;
      tier_options.path = path;
      // The budget in bytes that holds this many keys (rows + index, beside
      // the store's share). 100% holds every key with room to spare: nothing
      // demotes.
      const double keys_in_budget = f >= 1.0 ? c.num_keys * 1.2 : c.num_keys * f;
      tier_options.memory_bytes =
          TieredTable::MemoryBytesFor(static_cast<int64_t>(std::ceil(keys_in_budget)), memory.row_bytes());
      TieredTable tier(&memory, options, tier_options);
      Prefill(c, [&](const int64_t* keys, int64_t n, const float* rows) {
        tier.Import(keys, n, 0, c.width, rows, nullptr, nullptr, nullptr, false, c.pf);
      });
      tier.Settle();
      const Via through_tier = [&](const std::vector<int64_t>& keys, const std::function<void()>& op) {
        tier.WithKeys(keys.data(), static_cast<int64_t>(keys.size()), c.pf, op);
      };
      int64_t tiered_step = 0;
      for (const std::vector<int64_t>& keys : warmup) {
        const int64_t version = ++tiered_step;
        through_tier(keys, [&] { ops.FindOrInsert(memory, keys, version); });
      }
      tier.Settle();
      const std::string budget = fraction + "%";
      RunCase(c, dist, "find", budget, &tier, find_pass(&memory, through_tier), find_pass(&untiered, direct));
      RunCase(c, dist, "find_or_insert", budget, &tier, train_pass(&memory, &tiered_step, through_tier),
              train_pass(&untiered, &untiered_step, direct));
    }
  }
  if (own_root) RemoveTree(root);
  return 0;
}
