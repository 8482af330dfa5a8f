// Micro-benchmark of the table core (no TensorFlow), used to tune it. The
// workload mirrors the TF benchmark: 1M keys prefilled, batches of 131072
// existing keys drawn uniformly. Prints Mkeys/s (best of several repeats: the
// machines here are shared and noisy) and bytes/key.
//
//   g++ -O3 -std=c++17 -pthread -I. tensorflow_ext/table/core/hash_table.cc
//       tensorflow_ext/table/core/hash_table_bench.cc -o /tmp/hash_table_bench
//   /tmp/hash_table_bench [--keys=1048576] [--batch=131072] [--repeats=5]
//   /tmp/hash_table_bench --growth=1 [--repeats=5]   (a growing training table, prefault off vs on)
//   /tmp/hash_table_bench --codec=1 [--repeats=300]  (the row codec alone: encode / decode per storage)
// Compact rows (TableOptions::storage): the speed and memory sections for one
// width, its leading compact_cols columns stored as bfloat16, float16 or
// int8_row (default: float32 rows), e.g. dim 16 in bf16 + a row-wise
// accumulator against float32 rows of the same width:
//   /tmp/hash_table_bench --width=17 --storage=bfloat16 --compact_cols=16 [--rounding=stochastic]
//   /tmp/hash_table_bench --width=17
// --speed=0 or --memory=0 skips that section.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow_ext/table/core/hash_table.h"
#include "tensorflow_ext/table/core/row_codec_host.h"
#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::HashTable;
using tfext::table::KeyMeta;
using tfext::table::ParallelFor;
using tfext::table::Rounding;
using tfext::table::RowStorage;
using tfext::table::TableOptions;

int64_t FlagValue(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      return std::atoll(argv[i] + prefix.size());
    }
  }
  return fallback;
}

// A string flag's value, or fallback.
std::string FlagString(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

// The row storage named by --storage, with the compact_cols and rounding
// flags applied to `options` (compact_cols capped at the width).
void ApplyStorageFlags(const std::string& storage, int64_t compact_cols, const std::string& rounding,
                       TableOptions* options) {
  if (storage == "float32") {
    options->storage = RowStorage::kFloat32;
  } else if (storage == "bfloat16") {
    options->storage = RowStorage::kBFloat16;
  } else if (storage == "float16") {
    options->storage = RowStorage::kFloat16;
  } else if (storage == "int8_row") {
    options->storage = RowStorage::kInt8Row;
  } else {
    std::fprintf(stderr, "--storage must be float32, bfloat16, float16 or int8_row, got %s\n", storage.c_str());
    std::exit(2);
  }
  options->compact_cols = options->storage == RowStorage::kFloat32 ? 0 : std::min(compact_cols, options->width);
  options->rounding = rounding == "stochastic" ? Rounding::kStochastic : Rounding::kNearest;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct Workload {
  std::vector<int64_t> keys;                  // the prefilled keys
  std::vector<std::vector<int64_t>> batches;  // drawn uniformly from keys
};

Workload MakeWorkload(int64_t num_keys, int64_t batch, int num_batches) {
  Workload w;
  std::mt19937_64 rng(12345);
  w.keys.resize(num_keys);
  for (int64_t& k : w.keys) k = static_cast<int64_t>(rng());
  for (int b = 0; b < num_batches; ++b) {
    std::vector<int64_t> keys(batch);
    for (int64_t& k : keys) k = w.keys[rng() % num_keys];
    w.batches.push_back(std::move(keys));
  }
  return w;
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Throughput of one op: wall-clock Mkeys/s, and Mkeys per CPU-second of the
// whole process (what 1 thread would do on an idle core; on a loaded machine
// wall-clock figures undercount).
struct Rate {
  double wall = 0;
  double per_cpu = 0;
};

// Runs op over every batch, `repeats` times; returns the best rates.
template <typename Op>
Rate BestRate(const Workload& w, int repeats, const Op& op) {
  Rate best;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ProcessCpuSeconds();
    int64_t done = 0;
    for (const std::vector<int64_t>& batch : w.batches) {
      op(batch);
      done += static_cast<int64_t>(batch.size());
    }
    best.wall = std::max(best.wall, done / Seconds(start) / 1e6);
    best.per_cpu = std::max(best.per_cpu, done / (ProcessCpuSeconds() - cpu_start) / 1e6);
  }
  return best;
}

// --growth=1: a training table that grows every step, as in the ctr26
// benchmark (docs/benchmarks.md, section 3): width 32 (dim 16 + one optimizer
// slot), 50 steps of 50K keys of which ~85% are new (2.1M keys at the end),
// one FindOrInsert per step on the calling thread, then a pause standing for
// the rest of the step. Arena prefaulting off and on alternate, each table
// created fresh; prints the median ns per key of each over the repeats.
int GrowthMain(int repeats) {
  const int64_t width = 32, batch = 50000, steps = 50;
  std::vector<int64_t> keys(batch);
  std::vector<float> init(batch * width, 0.5f), out(batch * width);
  std::vector<double> ns_per_key[2];
  for (int r = 0; r < repeats; ++r) {
    for (int prefault = 0; prefault < 2; ++prefault) {
      setenv("TF_EXT_TABLE_PREFAULT", prefault ? "1" : "0", 1);  // read when the table is created
      TableOptions options;
      options.width = width;
      options.huge_pages = false;  // as the dynamic-embedding tables
      HashTable table(options);
      std::mt19937_64 rng(99);
      int64_t next_new = 0;
      double seconds = 0;
      for (int64_t step = 0; step < steps; ++step) {
        for (int64_t& k : keys) {
          const bool old = next_new > 0 && rng() % 100 < 15;
          k = static_cast<int64_t>(tfext::table::HashKey(old ? rng() % next_new : next_new++));
        }
        const auto start = std::chrono::steady_clock::now();
        table.FindOrInsert(keys.data(), batch, 0, width, init.data(), nullptr, out.data(), nullptr, true, step,
                           tfext::table::InlineParallelFor());
        seconds += Seconds(start);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      ns_per_key[prefault].push_back(1e9 * seconds / (batch * steps));
    }
  }
  unsetenv("TF_EXT_TABLE_PREFAULT");
  for (int prefault = 0; prefault < 2; ++prefault) {
    std::vector<double>& v = ns_per_key[prefault];
    std::sort(v.begin(), v.end());
    std::printf("growth, prefault %s: median %.1f ns/key over %d repeats (min %.1f, max %.1f)\n",
                prefault ? "on " : "off", v[v.size() / 2], repeats, v.front(), v.back());
  }
  return 0;
}

// --codec=1: the row codec alone, as the CPU table calls it (row_codec_host.h
// for bf16 / fp16 columns, whole int8 rows): 4096 rows of random-normal
// values (cache-resident: no table, no memory latency) encoded and decoded,
// best of `repeats` passes, in Mrows/s, for dim 16 and 64. What a compact
// row's conversion costs, free of the noise of the table benchmarks.
int CodecMain(int repeats) {
  const int64_t rows = 4096;
  struct Case {
    RowStorage storage;
    Rounding rounding;
    const char* name;
  };
  const Case cases[] = {{RowStorage::kBFloat16, Rounding::kNearest, "bfloat16 nearest   "},
                        {RowStorage::kBFloat16, Rounding::kStochastic, "bfloat16 stochastic"},
                        {RowStorage::kFloat16, Rounding::kNearest, "float16 nearest    "},
                        {RowStorage::kFloat16, Rounding::kStochastic, "float16 stochastic "},
                        {RowStorage::kInt8Row, Rounding::kNearest, "int8_row           "}};
  std::printf("row codec, %lld cache-resident rows, best of %d passes (F16C %s)\n", static_cast<long long>(rows),
              repeats, tfext::table::codec_internal::kCpuHasF16c ? "on" : "off");
  for (const int64_t dim : {int64_t{16}, int64_t{64}}) {
    std::vector<float> values(rows * dim), back(rows * dim);
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.f, 0.05f);
    for (float& v : values) v = normal(rng);
    for (const Case& c : cases) {
      const int64_t area_bytes = tfext::table::CompactBytes(c.storage, dim);
      std::vector<char> areas(rows * area_bytes);
      const auto best_mrows = [&](const auto& pass) {
        double best = 0;
        for (int r = 0; r < repeats; ++r) {
          const auto start = std::chrono::steady_clock::now();
          pass();
          best = std::max(best, rows / Seconds(start) / 1e6);
        }
        return best;
      };
      const double encode = best_mrows([&] {
        for (int64_t i = 0; i < rows; ++i) {
          if (c.storage == RowStorage::kInt8Row) {
            tfext::table::EncodeInt8Row(&values[i * dim], dim, &areas[i * area_bytes]);
          } else {
            tfext::table::HostEncodeElements(c.storage, &values[i * dim], 0, dim, &areas[i * area_bytes], c.rounding, i,
                                             7);
          }
        }
      });
      const double decode = best_mrows([&] {
        for (int64_t i = 0; i < rows; ++i) {
          if (c.storage == RowStorage::kInt8Row) {
            tfext::table::DecodeInt8Row(&areas[i * area_bytes], dim, 0, dim, &back[i * dim]);
          } else {
            tfext::table::HostDecodeElements(c.storage, &areas[i * area_bytes], 0, dim, &back[i * dim]);
          }
        }
      });
      std::printf("dim %2lld %s encode %7.1f  decode %7.1f Mrows/s\n", static_cast<long long>(dim), c.name, encode,
                  decode);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (FlagValue(argc, argv, "growth", 0) != 0) return GrowthMain(static_cast<int>(FlagValue(argc, argv, "repeats", 5)));
  if (FlagValue(argc, argv, "codec", 0) != 0) return CodecMain(static_cast<int>(FlagValue(argc, argv, "repeats", 300)));
  const int64_t num_keys = FlagValue(argc, argv, "keys", 1 << 20);
  const int64_t batch = FlagValue(argc, argv, "batch", 131072);
  const int repeats = static_cast<int>(FlagValue(argc, argv, "repeats", 5));
  const int64_t only_width = FlagValue(argc, argv, "width", 0);
  const std::string storage = FlagString(argc, argv, "storage", "float32");
  const int64_t compact_cols = FlagValue(argc, argv, "compact_cols", only_width);
  const std::string rounding = FlagString(argc, argv, "rounding", "nearest");
  const bool speed = FlagValue(argc, argv, "speed", 1) != 0;
  const bool memory = FlagValue(argc, argv, "memory", 1) != 0;
  const std::vector<int64_t> speed_widths =
      only_width != 0 ? std::vector<int64_t>{only_width} : std::vector<int64_t>{16, 64};
  const std::vector<int64_t> memory_widths =
      only_width != 0 ? std::vector<int64_t>{only_width} : std::vector<int64_t>{16, 32, 48};
  const Workload w = MakeWorkload(num_keys, batch, 8);

  std::printf("keys=%lld batch=%lld repeats=%d storage=%s compact_cols=%lld rounding=%s (best of repeats)\n",
              static_cast<long long>(num_keys), static_cast<long long>(batch), repeats, storage.c_str(),
              static_cast<long long>(storage == "float32" ? 0 : compact_cols), rounding.c_str());
  for (int64_t width : speed_widths) {
    if (!speed) break;
    TableOptions options;
    options.width = width;
    options.initial_capacity = num_keys;
    ApplyStorageFlags(storage, compact_cols, rounding, &options);
    HashTable table(options);
    {
      tfext_test::ThreadPool pool(2);
      std::vector<float> init(w.keys.size() * width, 0.25f);
      table.Insert(w.keys.data(), w.keys.size(), 0, width, init.data(), nullptr, false, -1, pool.AsParallelFor());
    }
    std::vector<float> out(batch * width), values(batch * width, 1.f);
    {
      // Calibration under the same load: a dense gather of random rows of a
      // [num_keys, width] array (the no-hashing limit, like tf.gather).
      std::vector<float> dense(num_keys * width, 1.f);
      std::vector<std::vector<int64_t>> rows_of;
      std::mt19937_64 rng(7);
      Workload dw;
      for (size_t b = 0; b < w.batches.size(); ++b) {
        std::vector<int64_t> idx(batch);
        for (int64_t& r : idx) r = static_cast<int64_t>(rng() % num_keys);
        dw.batches.push_back(std::move(idx));
      }
      for (int threads : {1, 2}) {
        tfext_test::ThreadPool pool(threads);
        const Rate gather = BestRate(dw, repeats, [&](const std::vector<int64_t>& idx) {
          pool.ParallelFor(static_cast<int64_t>(idx.size()), [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
              std::memcpy(&out[i * width], &dense[idx[i] * width], sizeof(float) * width);
            }
          });
        });
        std::printf("width %2lld threads %d: dense gather %5.1f (%5.1f/cpu) Mkeys/s\n", static_cast<long long>(width),
                    threads, gather.wall, gather.per_cpu);
      }
    }
    std::unique_ptr<bool[]> found(new bool[batch]);
    for (int threads : {1, 2}) {
      tfext_test::ThreadPool pool(threads);
      const ParallelFor pf = pool.AsParallelFor();
      const Rate find = BestRate(w, repeats, [&](const std::vector<int64_t>& keys) {
        table.Find(keys.data(), keys.size(), 0, width, out.data(), found.get(), nullptr, pf);
      });
      const Rate insert = BestRate(w, repeats, [&](const std::vector<int64_t>& keys) {
        table.Insert(keys.data(), keys.size(), 0, width, values.data(), nullptr, true, 1, pf);
      });
      const Rate accumulate = BestRate(w, repeats, [&](const std::vector<int64_t>& keys) {
        table.Accumulate(keys.data(), keys.size(), 0, width, values.data(), nullptr, false, false, -1, pf);
      });
      const Rate find_or_insert = BestRate(w, repeats, [&](const std::vector<int64_t>& keys) {
        table.FindOrInsert(keys.data(), keys.size(), 0, width, values.data(), nullptr, out.data(), nullptr, false, -1,
                           pf);
      });
      // A fused optimizer apply: every column of the row read and written.
      int64_t step = 0;
      const Rate update = BestRate(w, repeats, [&](const std::vector<int64_t>& keys) {
        ++step;
        table.Update(
            keys.data(), keys.size(), nullptr,
            [&](int64_t, float* row, KeyMeta* meta) {
              for (int64_t c = 0; c < width; ++c) row[c] = row[c] * 0.999f + 0.001f;
              meta->version = step;
            },
            pf);
      });
      std::printf(
          "width %2lld threads %d: find %5.1f (%5.1f/cpu)  upsert %5.1f (%5.1f/cpu)  "
          "accumulate %5.1f (%5.1f/cpu)  find_or_insert %5.1f (%5.1f/cpu)  update %5.1f (%5.1f/cpu) Mkeys/s\n",
          static_cast<long long>(width), threads, find.wall, find.per_cpu, insert.wall, insert.per_cpu, accumulate.wall,
          accumulate.per_cpu, find_or_insert.wall, find_or_insert.per_cpu, update.wall, update.per_cpu);
      std::fflush(stdout);
    }
    {
      // Latency of one-key calls (serving-style lookups, tiny updates).
      const int calls = 200000;
      const ParallelFor inline_pf = tfext::table::InlineParallelFor();
      auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) {
        table.Find(&w.batches[0][c % batch], 1, 0, width, out.data(), found.get(), nullptr, inline_pf);
      }
      const double find_ns = Seconds(start) / calls * 1e9;
      start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) {
        table.Insert(&w.batches[0][c % batch], 1, 0, width, values.data(), nullptr, true, 1, inline_pf);
      }
      const double insert_ns = Seconds(start) / calls * 1e9;
      std::printf("width %2lld one-key calls: find %.0f ns, upsert %.0f ns\n", static_cast<long long>(width), find_ns,
                  insert_ns);
    }
  }

  // Memory: bytes per key after inserting num_keys random keys into a table
  // created empty, and the worst ratio seen from num_keys/4 on (growth steps).
  for (int64_t width : memory_widths) {
    if (!memory) break;
    TableOptions options;
    options.width = width;
    ApplyStorageFlags(storage, compact_cols, rounding, &options);
    HashTable table(options);
    tfext_test::ThreadPool pool(2);
    const int64_t step = 8192;
    std::vector<float> init(step * width, 0.5f);
    // Key + values as stored (the compact area, then float32 columns).
    const double raw = 8.0 + static_cast<double>(tfext::table::CompactBytes(options.storage, options.compact_cols)) +
                       4.0 * static_cast<double>(width - options.compact_cols);
    double worst = 0;
    for (int64_t at = 0; at < num_keys; at += step) {
      const int64_t n = std::min(step, num_keys - at);
      table.Insert(w.keys.data() + at, n, 0, width, init.data(), nullptr, false, -1, pool.AsParallelFor());
      if (at + n >= num_keys / 4) {
        worst = std::max(worst, static_cast<double>(table.memory_bytes()) / table.size());
      }
    }
    const double per_key = static_cast<double>(table.memory_bytes()) / table.size();
    std::printf(
        "width %2lld: %.1f bytes/key at %lld keys (raw %.0f, %.3fx); worst from %lld keys: "
        "%.1f (%.3fx)\n",
        static_cast<long long>(width), per_key, static_cast<long long>(table.size()), raw, per_key / raw,
        static_cast<long long>(num_keys / 4), worst, worst / raw);
  }
  return 0;
}
