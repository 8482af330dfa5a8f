// Failures and bad input of the tiered table (tiered_table.h) over the real
// RocksDB store, loaded as the op library loads it (OpenColdStore, from
// $TF_EXT_ROCKSDB_STORE_LIB, set by the BUILD target): batches over the
// budget, bad options, failed writes to the store (a wrapper store injects
// them, or freezes a demotion chunk between memory and disk), dead disk
// copies, and a full disk.
//   bazel test //tensorflow_ext/table/tiered:tiered_table_faults_test
// The reference for every result is the untiered table, bit for bit. A full
// disk is made with a tmpfs in a private mount namespace (a child process:
// unshare(CLONE_NEWNS) needs a single-threaded process and root, which this
// project's machines and CI have; without it that test FAILS, saying so).
// An optional argument runs only the tests whose name contains it.

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"
#include "tensorflow_ext/table/tiered/tiered_table.h"
#include "tensorflow_ext/table/tiered/tiered_test_util.h"

namespace {

using namespace ::tfext_tiered_test;  // NOLINT: the shared test helpers

std::string g_self;  // this binary, for the child processes

// ---------------------------------------------------------------- errors

TFEXT_TEST(ABatchLargerThanTheBudgetIsRefused) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o);
  const std::string dir = TempDir();
  const int64_t budget = BudgetFor(memory, 100);
  TieredTable tier(&memory, o, Tier(dir + "/store", budget, false));
  std::vector<int64_t> keys(101);
  for (int64_t i = 0; i < 101; ++i) keys[i] = i;
  bool ran = false;
  try {
    tier.WithKeys(keys.data(), 101, PoolParallelFor(), [&] { ran = true; });
    CHECK(false);
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kInvalid);
    const std::string msg = e.what();
    CHECK(Contains(msg, "memory_bytes=" + std::to_string(budget)));
    CHECK(Contains(msg, "holds 100 rows of " + std::to_string(tier.bytes_per_key()) + " bytes"));
    CHECK_EQ(tier.bytes_per_key(), ((memory.row_bytes() + 20) * 11 + 9) / 10);
    CHECK(Contains(msg, "this batch needs 101 rows"));
    CHECK(Contains(msg, dir + "/store"));
  }
  CHECK(!ran);
  // A long batch of few distinct keys fits.
  std::vector<int64_t> repeated(1000);
  for (int64_t i = 0; i < 1000; ++i) repeated[i] = i % 100;
  tier.WithKeys(repeated.data(), 1000, PoolParallelFor(), [&] {
    memory.FindOrInsert(repeated.data(), 1000, 0, 0, nullptr, nullptr, nullptr, nullptr, true, 1, PoolParallelFor());
  });
  CHECK_EQ(tier.size(), 100);
}

TFEXT_TEST(BadOptionsAreRefusedNamingTheProblem) {
  const std::string dir = TempDir();
  {
    TableOptions o;
    o.width = 8;
    o.storage = RowStorage::kInt8Row;
    o.compact_cols = 8;
    HashTable memory(o);
    const std::string msg = ExpectThrow([&] { TieredTable t(&memory, o, Tier(dir + "/a", 1 << 20, false)); });
    CHECK(Contains(msg, "int8_row"));
  }
  TableOptions o;
  o.width = 8;
  HashTable memory(o);
  std::string msg = ExpectThrow([&] { TieredTable t(&memory, o, Tier(dir + "/b", 1000, false)); });
  CHECK(Contains(msg, "memory_bytes=1000"));
  CHECK(Contains(msg, "at least 64 rows"));
  msg = ExpectThrow([&] { TieredTable t(&memory, o, Tier(dir + "/c", 0, false)); });
  CHECK(Contains(msg, "memory_bytes must be > 0"));
  TierOptions negative = Tier(dir + "/d", 1 << 20, false);
  negative.disk_bytes = -1;
  msg = ExpectThrow([&] { TieredTable t(&memory, o, negative); });
  CHECK(Contains(msg, "disk_bytes must be >= 0"));
  // One store directory, one table.
  TieredTable first(&memory, o, Tier(dir + "/e", 1 << 20, false));
  HashTable other(o);
  try {
    TieredTable second(&other, o, Tier(dir + "/e", 1 << 20, false));
    CHECK(false);
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kLocked);
    CHECK(Contains(e.what(), dir + "/e"));
  }
}

// Batches of Accumulate (new keys, and old keys brought back from disk)
// through a tier whose Puts fail from some point on, with no demoter: a batch
// that leaves memory over budget demotes, fails and throws after its op ran.
// The failed chunks' rows go back to memory: every row is kept, exactly.
TFEXT_TEST(AFailedPutKeepsEveryRow) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), false), std::move(owned));
  Fill(&tier, &plain, 1000, 50);
  CHECK_GT(tier.stats().disk_keys, 700);
  store->fail_puts_ = true;
  int64_t thrown = 0;
  std::mt19937_64 rng(3);
  for (int64_t b = 0; b < 30; ++b) {
    std::vector<int64_t> keys(50);
    for (int64_t i = 0; i < 50; ++i) keys[i] = (b % 2 == 0) ? 1000 + b * 50 + i : static_cast<int64_t>(rng() % 1000);
    std::vector<float> deltas(50 * 4, 1.5f);
    bool ran = false;
    try {
      tier.WithKeys(keys.data(), 50, PoolParallelFor(), [&] {
        ran = true;
        memory.Accumulate(keys.data(), 50, 0, 4, deltas.data(), nullptr, true, true, 100 + b, PoolParallelFor());
      });
    } catch (const StoreError& e) {
      CHECK_EQ(e.code(), StoreError::kNoSpace);
      CHECK(Contains(e.what(), "no space left on device"));
      CHECK(Contains(e.what(), dir + "/store"));
      ++thrown;
    }
    CHECK(ran);  // the failure is the demotion's, after the op
    plain.Accumulate(keys.data(), 50, 0, 4, deltas.data(), nullptr, true, true, 100 + b, PoolParallelFor());
  }
  CHECK_EQ(thrown, 30);
  CHECK_EQ(store->failed_puts_.load(), 30);
  CHECK_GT(memory.size(), tier.budget_keys() + 500);  // nothing could leave
  // Every row, exactly, while the disk still refuses writes.
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  // Space again: the tier settles under budget with nothing lost.
  store->fail_puts_ = false;
  tier.Settle();
  CHECK_LE(memory.size(), tier.budget_keys());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_EQ(tier.stats().errors, 0);  // no background failure: each was thrown to its batch
  CHECK_EQ(memory.CheckInvariants(), "");
}

// The demoter's Put fails: its rows go back to memory, the error is counted
// and thrown once, by the next batch, before that batch's op.
TFEXT_TEST(AFailedBackgroundPutIsReportedOnceAndKeepsEveryRow) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), true), std::move(owned));
  Fill(&tier, &plain, 1000, 50);
  tier.Settle();
  CHECK_GT(tier.stats().disk_keys, 700);
  store->fail_puts_ = true;
  const auto insert_one = [&](int64_t key, bool* ran) {
    const float one = 1.0f;
    tier.WithKeys(&key, 1, PoolParallelFor(), [&] {
      *ran = true;
      memory.Accumulate(&key, 1, 0, 1, &one, nullptr, true, true, 7, PoolParallelFor());
    });
    plain.Accumulate(&key, 1, 0, 1, &one, nullptr, true, true, 7, PoolParallelFor());
  };
  // One key at a time until memory is just over budget: that batch wakes the
  // demoter (under 1.1x the budget, it does not demote itself).
  int64_t next = 5000;
  while (memory.size() <= tier.budget_keys()) {
    bool ran = false;
    insert_one(next++, &ran);
    CHECK(ran);
  }
  // The demoter's Put fails; once its error is counted, it is pending.
  WaitUntil([&] { return tier.stats().errors >= 1; }, "the demoter's failure");
  CHECK_EQ(store->failed_puts_.load(), 1);
  bool ran = false;
  try {
    insert_one(next, &ran);
    CHECK(false);
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kNoSpace);
    CHECK(Contains(e.what(), dir + "/store"));
  }
  CHECK(!ran);  // thrown before the op
  int64_t throws = 1;
  // Once: with space again, later batches run. (A round that was already
  // writing may still fail, once more: a demoter woken before the test began
  // can run a round beside the one this test woke. That failure is reported
  // once too.)
  store->fail_puts_ = false;
  int64_t ran_count = 0;
  for (int i = 0; i < 3; ++i) {
    bool later = false;
    try {
      insert_one(next++, &later);
      CHECK(later);
      ++ran_count;
    } catch (const StoreError& e) {
      CHECK_EQ(e.code(), StoreError::kNoSpace);
      CHECK(!later);
      ++throws;
    }
  }
  CHECK_GE(ran_count, 2);
  try {
    tier.Settle();
  } catch (const StoreError& e) {
    CHECK_EQ(e.code(), StoreError::kNoSpace);
    ++throws;
    tier.Settle();
  }
  CHECK_LE(throws, tier.stats().errors);  // no failure reported twice
  CHECK_LE(tier.stats().errors, 2);
  CHECK_LE(memory.size(), tier.budget_keys());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_EQ(memory.CheckInvariants(), "");
}

// A chunk frozen between memory and disk (its Put held): batches take its
// rows back from the outbox, one of them removes some; after the Put the
// removed keys do not come back from disk, and every other row is exact.
TFEXT_TEST(RowsTakenFromTheOutboxDoNotComeBackFromDisk) {
  TableOptions o;
  o.width = 4;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 4));
  ControlledStore* store = owned.get();
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 200), true), std::move(owned));
  const ReleaseAtExit release(store);
  Fill(&tier, &plain, 200, 50);  // at the budget: no demotion yet
  CHECK_EQ(tier.stats().demotions, 0);
  store->HoldNextPut();
  // 20 new keys: over budget (not past 1.1x), the background demoter runs and
  // its first chunk's Put is held.
  Fill(&tier, &plain, 220, 50);
  std::vector<int64_t> held = store->WaitForHeldPut();
  CHECK_GE(held.size(), 2u);  // the first slice of the round's rows (DemoteLocked)
  std::sort(held.begin(), held.end());
  const int64_t h = static_cast<int64_t>(held.size());
  // Read them all (promoted from the outbox), then remove half of them.
  std::vector<float> out(h * 4), want(h * 4);
  std::unique_ptr<bool[]> found(new bool[h]), found_plain(new bool[h]);
  tier.WithKeys(held.data(), h, PoolParallelFor(),
                [&] { memory.Find(held.data(), h, 0, 4, out.data(), found.get(), nullptr, PoolParallelFor()); });
  plain.Find(held.data(), h, 0, 4, want.data(), found_plain.get(), nullptr, PoolParallelFor());
  for (int64_t i = 0; i < h; ++i) CHECK(found[i]);
  CHECK(SameBits(out.data(), want.data(), h * 4));
  std::vector<int64_t> doomed(held.begin(), held.begin() + h / 2);
  const int64_t d = static_cast<int64_t>(doomed.size());
  int64_t removed = 0;
  tier.WithKeys(doomed.data(), d, PoolParallelFor(),
                [&] { removed = memory.Remove(doomed.data(), d, PoolParallelFor()); });
  CHECK_EQ(removed, d);
  plain.Remove(doomed.data(), d, PoolParallelFor());
  store->Release();
  tier.Settle();
  CHECK_EQ(tier.size(), plain.size());
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  // A lookup of the removed keys finds nothing (their disk copies are dead).
  std::unique_ptr<bool[]> again(new bool[d]);
  tier.WithKeys(doomed.data(), d, PoolParallelFor(),
                [&] { memory.Find(doomed.data(), d, 0, 4, out.data(), again.get(), nullptr, PoolParallelFor()); });
  for (int64_t i = 0; i < d; ++i) CHECK(!again[i]);
  CHECK_EQ(tier.stats().disk_keys, store->num_keys());
}

// More promotions than TieredTable::kMaxStaleKeys between two demotion
// rounds: past that many dead disk copies, batches delete their own. Every
// row stays exact, and once settled the store holds exactly the live keys.
TFEXT_TEST(ManyPromotionsWithoutARoundDeleteTheirOwnDeadCopies) {
  TableOptions o;
  o.width = 1;
  HashTable memory(o), plain(o);
  const std::string dir = TempDir();
  auto owned = std::make_unique<ControlledStore>(OpenStore(dir + "/store", 1));  // counts its keys exactly
  ControlledStore* store = owned.get();
  const int64_t budget_keys = TieredTable::kMaxStaleKeys + 20000;
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, budget_keys), false), std::move(owned));
  Fill(&tier, &plain, 2 * budget_keys, 10000);
  // Empty the memory tier (every key there removed), so that promotions fill
  // it back without going over budget: no round runs.
  std::vector<int64_t> in_memory, on_disk;
  {
    std::vector<int64_t> all(2 * budget_keys);
    for (int64_t i = 0; i < 2 * budget_keys; ++i) all[i] = i;
    std::vector<KeyMeta> meta(all.size());
    std::unique_ptr<bool[]> found(new bool[all.size()]);
    memory.FindMeta(all.data(), static_cast<int64_t>(all.size()), meta.data(), found.get(), PoolParallelFor());
    for (const int64_t key : all) (found[key] ? in_memory : on_disk).push_back(key);
  }
  CHECK_GT(static_cast<int64_t>(on_disk.size()), TieredTable::kMaxStaleKeys + 10000);
  for (size_t off = 0; off < in_memory.size(); off += 10000) {
    const int64_t m = std::min<int64_t>(10000, static_cast<int64_t>(in_memory.size() - off));
    const int64_t* keys = in_memory.data() + off;
    tier.WithKeys(keys, m, PoolParallelFor(), [&] { memory.Remove(keys, m, PoolParallelFor()); });
    plain.Remove(keys, m, PoolParallelFor());
  }
  CHECK_EQ(memory.size(), 0);
  const int64_t demotions = tier.stats().demotions;
  const int64_t promote = TieredTable::kMaxStaleKeys + 10000;
  for (int64_t off = 0; off < promote; off += 10000) {
    const int64_t m = std::min<int64_t>(10000, promote - off);
    const int64_t* keys = on_disk.data() + off;
    std::vector<float> got(m), want(m);
    tier.WithKeys(keys, m, PoolParallelFor(),
                  [&] { memory.Find(keys, m, 0, 1, got.data(), nullptr, nullptr, PoolParallelFor()); });
    plain.Find(keys, m, 0, 1, want.data(), nullptr, nullptr, PoolParallelFor());
    CHECK(SameBits(got.data(), want.data(), m));
  }
  CHECK_EQ(memory.size(), promote);
  CHECK_EQ(tier.stats().demotions, demotions);  // no round ran
  CHECK_EQ(tier.stats().disk_keys, static_cast<int64_t>(on_disk.size()) - promote);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  tier.Settle();  // deletes the dead copies still waiting
  CHECK_EQ(store->num_keys(), tier.stats().disk_keys);
  CheckSameContent(ContentOf(tier), ContentOf(plain));
}

// ---------------------------------------------------------------- a full disk

// In a child: a tiered table on a 2 MiB tmpfs runs until its store is full,
// then every row is still there, exactly, and the error names the path.
int ChildFullDisk(const std::string& dir) {
  if (unshare(CLONE_NEWNS) != 0) {
    std::fprintf(stderr, "this test mounts a tmpfs and needs root (CAP_SYS_ADMIN): unshare(CLONE_NEWNS): %s\n",
                 std::strerror(errno));
    return 2;
  }
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=2m") != 0) {
    std::fprintf(stderr, "this test needs root (CAP_SYS_ADMIN) to mount a tmpfs at %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    return 2;
  }
  TableOptions o;
  o.width = 32;
  HashTable memory(o), plain(o);
  TieredTable tier(&memory, o, Tier(dir + "/store", BudgetFor(memory, 500), false));
  const ParallelFor inline_pf = tfext::table::InlineParallelFor();
  std::string error;
  int64_t batches = 0;
  for (int64_t b = 0; b < 2000 && error.empty(); ++b) {
    std::vector<int64_t> keys(100);
    std::vector<float> rows(100 * 32);
    for (int64_t i = 0; i < 100; ++i) {
      keys[i] = b * 100 + i;
      for (int64_t c = 0; c < 32; ++c) rows[i * 32 + c] = Noise(keys[i], 2, c);
    }
    bool ran = false;
    try {
      tier.WithKeys(keys.data(), 100, inline_pf, [&] {
        ran = true;
        memory.Insert(keys.data(), 100, 0, 32, rows.data(), nullptr, true, b, inline_pf);
      });
    } catch (const StoreError& e) {
      if (e.code() != StoreError::kNoSpace) {
        std::fprintf(stderr, "expected kNoSpace, got %d: %s\n", static_cast<int>(e.code()), e.what());
        return 1;
      }
      error = e.what();
    }
    if (ran) plain.Insert(keys.data(), 100, 0, 32, rows.data(), nullptr, true, b, inline_pf);
    ++batches;
  }
  if (error.empty()) {
    std::fprintf(stderr, "2000 batches of 100 rows of 140 bytes never filled a 2 MiB tmpfs\n");
    return 1;
  }
  std::printf("full after %ld batches: %s\n", static_cast<long>(batches), error.c_str());
  CHECK(Contains(error, dir + "/store"));
  CHECK(Contains(error, "no space left on device"));
  CheckSameContent(ContentOf(tier), ContentOf(plain));
  CHECK_GT(tier.stats().disk_keys, 0);
  return 0;
}

TFEXT_TEST(AFullDiskKeepsEveryRowAndNamesThePath) {
  const std::string dir = TempDir();
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    execl(g_self.c_str(), g_self.c_str(), "--child-full-disk", dir.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
}

}  // namespace

int main(int argc, char** argv) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) {
    std::perror("readlink /proc/self/exe");
    return 1;
  }
  g_self.assign(self, static_cast<size_t>(len));
  MakePluginPathAbsolute();  // the children run from another directory
  if (argc == 3 && std::strcmp(argv[1], "--child-full-disk") == 0) {
    try {
      return ChildFullDisk(argv[2]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      return 1;
    }
  }
  return tfext_test::RunAllTests(argc, argv);
}
