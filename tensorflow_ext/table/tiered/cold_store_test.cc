// Tests of the cold store (cold_store.h) on the RocksDB plugin, loaded the way the op library loads it: through
// OpenColdStore, from $TF_EXT_ROCKSDB_STORE_LIB (set by the BUILD target) or next to this binary.
//   bazel test //tensorflow_ext/table/tiered:cold_store_test
//
// Cases that need a process of their own (a second holder of a store, a missing or stale plugin, a private mount
// namespace, another user, a fresh heap to measure) re-execute this binary with --child-<case> <dir>. A full disk and a
// read-only file system are made with a tmpfs mounted in a private mount namespace (unshare(CLONE_NEWNS)): that needs
// root (CAP_SYS_ADMIN), which this project's machines and CI have; without it those two tests FAIL, saying so (they
// never skip).
#include "tensorflow_ext/table/tiered/cold_store.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tensorflow_ext/table/core/test_util.h"

namespace {

using tfext::table::ColdStore;
using tfext::table::KeyMeta;
using tfext::table::OpenColdStore;
using tfext::table::StoreError;
using tfext::table::StoreOptions;

std::string g_self;  // this binary, for the child processes

std::string CodeName(StoreError::Code c) {
  switch (c) {
    case StoreError::kNoSpace:
      return "kNoSpace";
    case StoreError::kIO:
      return "kIO";
    case StoreError::kCorrupt:
      return "kCorrupt";
    case StoreError::kLocked:
      return "kLocked";
    case StoreError::kForeign:
      return "kForeign";
    case StoreError::kInvalid:
      return "kInvalid";
    case StoreError::kUnavailable:
      return "kUnavailable";
    case StoreError::kPermission:
      return "kPermission";
  }
  return "?";
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs fn, which must throw StoreError with `code`; returns its message.
template <typename Fn>
std::string ExpectStoreError(StoreError::Code code, Fn&& fn) {
  try {
    fn();
  } catch (const StoreError& e) {
    if (e.code() != code) {
      ::tfext_test::FailCheck(__FILE__, __LINE__,
                              "expected " + CodeName(code) + ", got " + CodeName(e.code()) + ": " + e.what());
    }
    return e.what();
  }
  ::tfext_test::FailCheck(__FILE__, __LINE__, "expected StoreError " + CodeName(code) + ", nothing was thrown");
}

std::string TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/cold_store_test.XXXXXX";
  CHECK(mkdtemp(&tmpl[0]) != nullptr);
  return tmpl;
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

void WriteText(const std::string& file, const std::string& text) {
  FILE* f = std::fopen(file.c_str(), "w");
  CHECK(f != nullptr);
  CHECK_EQ(std::fwrite(text.data(), 1, text.size(), f), text.size());
  CHECK_EQ(std::fclose(f), 0);
}

std::string ReadText(const std::string& file) {
  FILE* f = std::fopen(file.c_str(), "r");
  CHECK(f != nullptr);
  std::string text;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
  std::fclose(f);
  return text;
}

std::set<std::string> ListNames(const std::string& dir) {
  std::set<std::string> names;
  std::unique_ptr<FILE, int (*)(FILE*)> ls(popen(("ls -A '" + dir + "'").c_str(), "r"), pclose);
  CHECK(ls != nullptr);
  char line[4096];
  while (std::fgets(line, sizeof(line), ls.get()) != nullptr) {
    std::string name(line);
    if (!name.empty() && name.back() == '\n') name.pop_back();
    names.insert(name);
  }
  return names;
}

std::unique_ptr<ColdStore> Open(const std::string& path, int64_t width) {
  StoreOptions o;
  o.path = path;
  o.width = width;
  o.block_cache_bytes = 1 << 20;
  return OpenColdStore(o);
}

// Row values with the bit patterns a lossy path would change: NaN payloads, -0, subnormals, infinities.
float RowValue(int64_t key, int64_t col, int salt = 0) {
  const uint64_t h = (static_cast<uint64_t>(key) + 0x9e3779b97f4a7c15ull * (col + 1) + salt) * 0xbf58476d1ce4e5b9ull;
  switch ((h >> 40) % 8) {
    case 0: {
      const uint32_t bits = 0x7fc00000u | static_cast<uint32_t>(h & 0x3fffff);  // quiet NaN with a payload
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case 1:
      return -0.0f;
    case 2:
      return std::numeric_limits<float>::denorm_min() * static_cast<float>(h % 1000 + 1);
    case 3:
      return (h & 1) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    default: {
      const uint32_t bits = static_cast<uint32_t>(h >> 8);
      float f;
      std::memcpy(&f, &bits, 4);
      return std::isnan(f) ? 1.5f : f;
    }
  }
}

struct Rows {
  std::vector<float> values;
  std::vector<KeyMeta> meta;
};

Rows MakeRows(const std::vector<int64_t>& keys, int64_t width, int salt = 0) {
  Rows r;
  r.values.resize(keys.size() * width);
  r.meta.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    for (int64_t c = 0; c < width; ++c) r.values[i * width + c] = RowValue(keys[i], c, salt);
    r.meta[i].version = keys[i] * 3 + salt;
    r.meta[i].frequency = static_cast<uint32_t>(keys[i] * 7 + salt);
  }
  return r;
}

void Put(ColdStore* s, const std::vector<int64_t>& keys, int64_t width, int salt = 0) {
  const Rows r = MakeRows(keys, width, salt);
  s->Put(keys.data(), static_cast<int64_t>(keys.size()), r.values.data(), r.meta.data());
}

// Every key must be present with exactly the row and meta written with `salt`.
void CheckPresent(ColdStore* s, const std::vector<int64_t>& keys, int64_t width, int salt = 0) {
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<float> rows(n * width);
  std::vector<KeyMeta> meta(n);
  std::unique_ptr<bool[]> found(new bool[n]);
  s->Get(keys.data(), n, rows.data(), meta.data(), found.get());
  const Rows want = MakeRows(keys, width, salt);
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) ::tfext_test::FailCheck(__FILE__, __LINE__, "key " + std::to_string(keys[i]) + " not found");
    if (std::memcmp(&rows[i * width], &want.values[i * width], width * sizeof(float)) != 0) {
      ::tfext_test::FailCheck(__FILE__, __LINE__, "row of key " + std::to_string(keys[i]) + " differs in its bits");
    }
    CHECK_EQ(meta[i].version, want.meta[i].version);
    CHECK_EQ(meta[i].frequency, want.meta[i].frequency);
  }
}

void CheckAbsent(ColdStore* s, const std::vector<int64_t>& keys, int64_t width) {
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<float> rows(n * width, 42.0f);
  std::vector<KeyMeta> meta(n);
  std::unique_ptr<bool[]> found(new bool[n]);
  s->Get(keys.data(), n, rows.data(), meta.data(), found.get());
  for (int64_t i = 0; i < n; ++i) {
    if (found[i]) ::tfext_test::FailCheck(__FILE__, __LINE__, "key " + std::to_string(keys[i]) + " found");
  }
}

std::map<int64_t, std::vector<float>> Scan(const ColdStore& s, int64_t width) {
  std::map<int64_t, std::vector<float>> seen;
  s.ForEach([&](int64_t key, const float* row, const KeyMeta&) {
    CHECK(seen.emplace(key, std::vector<float>(row, row + width)).second);
    return true;
  });
  return seen;
}

std::vector<int64_t> Range(int64_t begin, int64_t end, int64_t step = 1) {
  std::vector<int64_t> keys;
  for (int64_t k = begin; k < end; k += step) keys.push_back(k);
  return keys;
}

// ---------------------------------------------------------------- child processes

struct Child {
  pid_t pid = -1;
  int to_child = -1;    // the child's stdin
  int from_child = -1;  // the child's stdout
};

// Starts this binary with `args`; with pipes, the child's stdin and stdout are ours to talk over.
Child Spawn(const std::vector<std::string>& args, bool pipes, const char* plugin_override = nullptr,
            const char* expect = nullptr) {
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (pipes) CHECK(pipe(in) == 0 && pipe(out) == 0);
  Child c;
  c.pid = fork();
  CHECK(c.pid >= 0);
  if (c.pid == 0) {
    if (pipes) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[0]);
      close(in[1]);
      close(out[0]);
      close(out[1]);
    }
    if (plugin_override != nullptr) setenv(tfext::table::kRocksDbStoreLibraryEnv, plugin_override, 1);
    if (expect != nullptr) setenv("COLD_STORE_TEST_EXPECT", expect, 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(g_self.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(g_self.c_str(), argv.data());
    _exit(127);
  }
  if (pipes) {
    close(in[0]);
    close(out[1]);
    c.to_child = in[1];
    c.from_child = out[0];
  }
  return c;
}

int Wait(pid_t pid) {
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ReadLine(int fd) {
  std::string line;
  char ch;
  while (read(fd, &ch, 1) == 1 && ch != '\n') line.push_back(ch);
  return line;
}

// A private mount namespace with a tmpfs of `size` at dir (the host's mounts are not touched).
void MountTmpfs(const std::string& dir, const char* size) {
  if (unshare(CLONE_NEWNS) != 0) {
    ::tfext_test::FailCheck(
        __FILE__, __LINE__,
        std::string("this test mounts a tmpfs and needs root (CAP_SYS_ADMIN): unshare(CLONE_NEWNS): ") +
            std::strerror(errno));
  }
  CHECK(mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0);
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, size) != 0) {
    ::tfext_test::FailCheck(
        __FILE__, __LINE__,
        "this test needs root (CAP_SYS_ADMIN) to mount a tmpfs at " + dir + ": " + std::strerror(errno));
  }
}

// Holds a store at dir until stdin closes, then checks that its rows survived the other opener's attempt.
int ChildHold(const std::string& dir) {
  std::unique_ptr<ColdStore> s = Open(dir, 3);
  Put(s.get(), Range(0, 100), 3);
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  char ch;
  while (read(0, &ch, 1) > 0) {
  }
  CheckPresent(s.get(), Range(0, 100), 3);
  CHECK_EQ(s->num_keys(), 100);
  return 0;
}

// The plugin at $TF_EXT_ROCKSDB_STORE_LIB cannot be loaded: kUnavailable naming it, what is missing
// ($COLD_STORE_TEST_EXPECT) and the package to install.
int ChildMissingPlugin(const std::string& dir) {
  const std::string msg = ExpectStoreError(StoreError::kUnavailable, [&] { Open(dir + "/store", 4); });
  CHECK(Contains(msg, "apt-get install librocksdb7.8"));
  CHECK(Contains(msg, std::getenv(tfext::table::kRocksDbStoreLibraryEnv)));
  CHECK(Contains(msg, std::getenv("COLD_STORE_TEST_EXPECT")));
  CHECK(!Exists(dir + "/store"));  // nothing was created
  return 0;
}

// The plugin at $TF_EXT_ROCKSDB_STORE_LIB was built for another interface version ($COLD_STORE_TEST_EXPECT: what
// the message says of it): kUnavailable naming the file and both versions, every time it is asked, and its entry
// point never runs (it would abort this process). Nothing is created.
int ChildStalePlugin(const std::string& dir) {
  const std::string theirs = std::getenv("COLD_STORE_TEST_EXPECT");
  const std::string ours = "needs version " + std::to_string(tfext::table::kColdStoreAbi);
  for (int attempt = 0; attempt < 2; ++attempt) {  // a refused plugin is not kept: the next open refuses it again
    const std::string msg = ExpectStoreError(StoreError::kUnavailable, [&] { Open(dir + "/store", 4); });
    CHECK(Contains(msg, std::getenv(tfext::table::kRocksDbStoreLibraryEnv)));
    CHECK(Contains(msg, "interface version " + theirs));
    CHECK(Contains(msg, ours));
    CHECK(Contains(msg, "stale"));
  }
  CHECK(!Exists(dir + "/store"));
  return 0;
}

// Another user (nobody) cannot write under a directory that root owns: kPermission naming the path, "not
// writable" and the system's reason, for a directory to create and for an existing one (its lock file). The plugin
// is loaded first, as root: the build tree that holds it may not be readable by nobody.
int ChildPermissionDenied(const std::string& dir) {
  Open(dir + "/warm", 2).reset();
  CHECK(chmod(dir.c_str(), 0755) == 0);
  CHECK(mkdir((dir + "/existing").c_str(), 0755) == 0);
  if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
    ::tfext_test::FailCheck(
        __FILE__, __LINE__,
        std::string("this test switches to the user nobody and needs root: ") + std::strerror(errno));
  }
  for (const std::string& path : {dir + "/new/store", dir + "/existing"}) {
    const std::string msg = ExpectStoreError(StoreError::kPermission, [&] { Open(path, 4); });
    CHECK(Contains(msg, path));
    CHECK(Contains(msg, "not writable"));
    CHECK(Contains(msg, "Permission denied"));
  }
  return 0;
}

// The resident memory of a process: its VmRSS, in bytes.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.compare(0, 6, "VmRSS:") == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  ::tfext_test::FailCheck(__FILE__, __LINE__, "no VmRSS in /proc/self/status");
}

// Stores with small write buffers and caches hold many more rows than those: each store's share of the process's
// resident memory stays within StoreMemoryBytes. A first store, written and read before the measure, takes the
// process-wide costs (RocksDB's code, its background threads and their buffers); then kStores more are written in
// round robin, in batches of MaxPutRows (as the tiered table writes), and read back.
int ChildMemoryBound(const std::string& dir) {
  constexpr int64_t kWidth = 64, kStores = 8, kRows = 100000, kGets = 20000;
  StoreOptions o;
  o.width = kWidth;
  o.write_buffer_bytes = 256 << 10;
  o.write_buffers = 2;
  o.block_cache_bytes = 256 << 10;
  const int64_t batch = tfext::table::MaxPutRows(o);
  CHECK_GT(batch, 100);
  CHECK_LT(batch * (kWidth * 4 + 12), o.write_buffer_bytes);
  std::vector<int64_t> keys = Range(0, batch);
  const Rows rows = MakeRows(keys, kWidth);
  std::vector<float> got(static_cast<size_t>(batch * kWidth));
  std::vector<KeyMeta> got_meta(batch);
  std::unique_ptr<bool[]> found(new bool[batch]);
  auto fill = [&](const std::vector<ColdStore*>& stores) {
    for (int64_t b = 0; b < kRows; b += batch) {
      for (int64_t i = 0; i < batch; ++i) keys[i] = (b + i) * 7919;
      for (ColdStore* s : stores) s->Put(keys.data(), batch, rows.values.data(), rows.meta.data());
    }
    for (int64_t g = 0; g < kGets; g += batch) {
      for (int64_t i = 0; i < batch; ++i) keys[i] = ((g * 31 + i * 17) % kRows) * 7919;
      for (ColdStore* s : stores) {
        s->Get(keys.data(), batch, got.data(), got_meta.data(), found.get());
        CHECK_EQ(std::count(found.get(), found.get() + batch, true), batch);
      }
    }
  };
  o.path = dir + "/first";
  std::unique_ptr<ColdStore> first = OpenColdStore(o);
  fill({first.get()});
  const int64_t before = ResidentBytes();
  std::vector<std::unique_ptr<ColdStore>> stores;
  std::vector<ColdStore*> raw;
  for (int64_t i = 0; i < kStores; ++i) {
    o.path = dir + "/store" + std::to_string(i);
    stores.push_back(OpenColdStore(o));
    raw.push_back(stores.back().get());
  }
  fill(raw);
  const int64_t per_store = (ResidentBytes() - before) / kStores;
  const int64_t bound = tfext::table::StoreMemoryBytes(o);
  std::printf("memory bound: %lld stores of %lld rows of width %lld: %lld bytes of RSS each; StoreMemoryBytes %lld\n",
              static_cast<long long>(kStores), static_cast<long long>(kRows), static_cast<long long>(kWidth),
              static_cast<long long>(per_store), static_cast<long long>(bound));
  CHECK_LE(per_store, bound);
  // Far more than the bound went through each store: its memtables were flushed many times over.
  CHECK_GT(kRows * (kWidth * 4 + 12), 10 * bound);
  CHECK_GT(stores[0]->disk_bytes(), kRows * kWidth * 4);
  return 0;
}

int ChildReadOnly(const std::string& dir) {
  MountTmpfs(dir, "size=1m");
  CHECK(mkdir((dir + "/empty").c_str(), 0755) == 0);
  CHECK(mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);
  std::string msg = ExpectStoreError(StoreError::kPermission, [&] { Open(dir + "/empty", 4); });
  CHECK(Contains(msg, dir + "/empty"));
  CHECK(Contains(msg, "not writable"));
  CHECK(Contains(msg, "Read-only file system"));
  msg = ExpectStoreError(StoreError::kPermission, [&] { Open(dir + "/new/store", 4); });
  CHECK(Contains(msg, dir + "/new/store"));
  CHECK(Contains(msg, "not writable"));
  CHECK(Contains(msg, "Read-only file system"));
  return 0;
}

// A full disk: writes fail with kNoSpace naming the path, every row written before stays readable, and writes
// succeed again once space is freed.
int ChildNoSpace(const std::string& dir) {
  constexpr int64_t kWidth = 64;
  constexpr int64_t kChunk = 4096;  // ~1.1 MB of rows per Put
  MountTmpfs(dir, "size=160m");
  {
    // Leaves ~10 MB free: less than the memtables hold, so the first flush finds the disk full.
    const int fd = open((dir + "/filler").c_str(), O_WRONLY | O_CREAT, 0644);
    CHECK(fd >= 0);
    std::vector<char> mb(1 << 20, 1);
    for (int i = 0; i < 150; ++i) CHECK_EQ(write(fd, mb.data(), mb.size()), static_cast<ssize_t>(mb.size()));
    CHECK_EQ(close(fd), 0);
  }
  const std::string path = dir + "/store";
  std::unique_ptr<ColdStore> s = Open(path, kWidth);
  int64_t written = 0;
  std::string msg;
  // The bound is far above what fills the disk (~10 MB; RocksDB holds at most 3 memtables of 16 MB).
  for (int chunk = 0; chunk < 400 && msg.empty(); ++chunk) {
    const std::vector<int64_t> keys = Range(written, written + kChunk);
    try {
      Put(s.get(), keys, kWidth);
      written += kChunk;
    } catch (const StoreError& e) {
      CHECK_EQ(CodeName(e.code()), CodeName(StoreError::kNoSpace));
      msg = e.what();
    }
  }
  CHECK(!msg.empty());
  CHECK(Contains(msg, path));
  CHECK(Contains(msg, "no space left on device"));
  CHECK_GT(written, 0);
  // Still full: writes keep failing, reads work.
  ExpectStoreError(StoreError::kNoSpace, [&] { Put(s.get(), Range(written, written + kChunk), kWidth); });
  CHECK_EQ(s->num_keys(), written);
  CheckPresent(s.get(), Range(0, written), kWidth);
  CheckAbsent(s.get(), Range(written, written + kChunk), kWidth);
  CHECK_EQ(static_cast<int64_t>(Scan(*s, kWidth).size()), written);
  // Space comes back: the next write resumes the store.
  CHECK_EQ(unlink((dir + "/filler").c_str()), 0);
  Put(s.get(), Range(written, written + kChunk), kWidth);
  written += kChunk;
  CHECK_EQ(s->num_keys(), written);
  CheckPresent(s.get(), Range(0, written), kWidth);
  std::printf("no space after %lld rows: %s\n", static_cast<long long>(written - kChunk), msg.c_str());
  return 0;
}

int RunChild(const std::string& which, const std::string& dir) {
  try {
    if (which == "--child-hold") return ChildHold(dir);
    if (which == "--child-missing-plugin") return ChildMissingPlugin(dir);
    if (which == "--child-stale-plugin") return ChildStalePlugin(dir);
    if (which == "--child-permission-denied") return ChildPermissionDenied(dir);
    if (which == "--child-memory-bound") return ChildMemoryBound(dir);
    if (which == "--child-readonly") return ChildReadOnly(dir);
    if (which == "--child-nospace") return ChildNoSpace(dir);
  } catch (const ::tfext_test::CheckFailure&) {
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: uncaught exception: %s\n", which.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown child case %s\n", which.c_str());
  return 2;
}

// ---------------------------------------------------------------- tests

TFEXT_TEST(RoundTripIsBitExact) {
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir + "/store", 5);
  CHECK_EQ(s->path(), dir + "/store");
  std::vector<int64_t> keys = {0, -1, 1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  for (int64_t i = 0; i < 3000; ++i) keys.push_back(i * 1000003 - 1500000000);
  Put(s.get(), std::vector<int64_t>(keys.begin(), keys.begin() + 1000), 5);
  Put(s.get(), std::vector<int64_t>(keys.begin() + 1000, keys.end()), 5);
  CHECK_EQ(s->num_keys(), static_cast<int64_t>(keys.size()));
  CheckPresent(s.get(), keys, 5);
  // The scan returns the same bits, every key once.
  const auto seen = Scan(*s, 5);
  CHECK_EQ(seen.size(), keys.size());
  const Rows want = MakeRows(keys, 5);
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(std::memcmp(seen.at(keys[i]).data(), &want.values[i * 5], 5 * sizeof(float)) == 0);
  }
}

TFEXT_TEST(GetReportsAbsentKeysAndLeavesTheirRowsAlone) {
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir + "/store", 3);
  Put(s.get(), Range(0, 6000, 2), 3);  // even keys
  // 5000 queries (several MultiGet batches): present, absent, repeated.
  std::vector<int64_t> q;
  for (int64_t i = 0; i < 5000; ++i) q.push_back((i * 7) % 6500 - 100);
  const int64_t n = static_cast<int64_t>(q.size());
  std::vector<float> rows(n * 3, 42.0f);
  std::vector<KeyMeta> meta(n, KeyMeta{-5, 9});
  std::unique_ptr<bool[]> found(new bool[n]);
  s->Get(q.data(), n, rows.data(), meta.data(), found.get());
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool should = q[i] >= 0 && q[i] < 6000 && q[i] % 2 == 0;
    CHECK_EQ(found[i], should);
    if (should) {
      ++hits;
      for (int64_t c = 0; c < 3; ++c) {
        const float want = RowValue(q[i], c);
        CHECK(std::memcmp(&rows[i * 3 + c], &want, sizeof(float)) == 0);
      }
      CHECK_EQ(meta[i].version, q[i] * 3);
    } else {
      for (int64_t c = 0; c < 3; ++c) CHECK_EQ(rows[i * 3 + c], 42.0f);
      CHECK_EQ(meta[i].version, -5);
      CHECK_EQ(meta[i].frequency, 9u);
    }
  }
  CHECK_GT(hits, 1000);
  CHECK_LT(hits, n);
  s->Get(q.data(), 0, nullptr, nullptr, nullptr);  // n = 0 is a no-op
}

TFEXT_TEST(NumKeysIsExactAcrossOverwritesRepeatsAndDeletes) {
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir + "/store", 2);
  std::map<int64_t, int> ref;  // key -> salt of its last write
  auto put = [&](const std::vector<int64_t>& keys, int salt) {
    Put(s.get(), keys, 2, salt);
    for (int64_t k : keys) ref[k] = salt;
    CHECK_EQ(s->num_keys(), static_cast<int64_t>(ref.size()));
  };
  auto del = [&](const std::vector<int64_t>& keys) {
    s->Delete(keys.data(), static_cast<int64_t>(keys.size()));
    for (int64_t k : keys) ref.erase(k);
    CHECK_EQ(s->num_keys(), static_cast<int64_t>(ref.size()));
  };
  put(Range(0, 2000), 0);
  put(Range(1000, 3000), 1);         // half overwrites
  put({5000, 5000, 5001, 5000}, 2);  // repeats in one batch
  del({0, 1, 1, 2, 99999, -7});      // present, repeated, absent
  del(Range(2500, 4000));            // partly absent
  put(Range(0, 10), 3);              // deleted keys come back
  del({});
  CHECK_EQ(s->num_keys(), 2502);  // 0..2999 and 5000, 5001; less 0..2 and 2500..2999; plus 0..9
  // Contents equal the reference: each key's last write, nothing deleted.
  const auto seen = Scan(*s, 2);
  CHECK_EQ(seen.size(), ref.size());
  for (const auto& kv : ref) {
    const auto it = seen.find(kv.first);
    CHECK(it != seen.end());
    for (int64_t c = 0; c < 2; ++c) {
      const float want = RowValue(kv.first, c, kv.second);
      CHECK(std::memcmp(&it->second[c], &want, sizeof(float)) == 0);
    }
  }
  // The last occurrence of a repeated key wins.
  std::vector<int64_t> dup = {77777, 77777};
  Rows r = MakeRows(dup, 2);
  r.values[2] = 1.0f;
  r.values[3] = 2.0f;
  r.meta[1].version = 123;
  s->Put(dup.data(), 2, r.values.data(), r.meta.data());
  float row[2];
  KeyMeta m;
  bool found = false;
  s->Get(dup.data(), 1, row, &m, &found);
  CHECK(found);
  CHECK_EQ(row[0], 1.0f);
  CHECK_EQ(row[1], 2.0f);
  CHECK_EQ(m.version, 123);
  CHECK_EQ(s->num_keys(), static_cast<int64_t>(ref.size()) + 1);
}

TFEXT_TEST(ForEachVisitsASnapshot) {
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir + "/store", 4);
  const std::vector<int64_t> keys = Range(0, 5000);
  Put(s.get(), keys, 4);
  // Writes from inside the visit (new keys, deletes, overwrites) are not seen by it.
  std::map<int64_t, std::vector<float>> seen;
  bool wrote = false;
  s->ForEach([&](int64_t key, const float* row, const KeyMeta& meta) {
    if (!wrote) {
      wrote = true;
      Put(s.get(), Range(10000, 11000), 4);
      const std::vector<int64_t> gone = Range(0, 5000, 5);
      s->Delete(gone.data(), static_cast<int64_t>(gone.size()));
      Put(s.get(), Range(1, 5000, 5), 4, /*salt=*/9);
    }
    CHECK_EQ(meta.version, key * 3);
    CHECK(seen.emplace(key, std::vector<float>(row, row + 4)).second);
    return true;
  });
  CHECK_EQ(seen.size(), keys.size());
  const Rows want = MakeRows(keys, 4);
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(std::memcmp(seen.at(keys[i]).data(), &want.values[i * 4], 4 * sizeof(float)) == 0);
  }
  // A later visit sees the writes; fn returning false stops the visit.
  CHECK_EQ(Scan(*s, 4).size(), 5000u - 1000u + 1000u);
  int visited = 0;
  s->ForEach([&](int64_t, const float*, const KeyMeta&) { return ++visited < 10; });
  CHECK_EQ(visited, 10);
}

TFEXT_TEST(ClearDropsEverythingAndAVisitInFlightKeepsItsSnapshot) {
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir + "/store", 8);
  Put(s.get(), Range(0, 3000), 8);
  int64_t visited = 0;
  s->ForEach([&](int64_t, const float*, const KeyMeta&) {
    if (visited++ == 0) {
      s->Clear();
      CHECK_EQ(s->num_keys(), 0);
      CheckAbsent(s.get(), {0, 1, 2999}, 8);
    }
    return true;
  });
  CHECK_EQ(visited, 3000);
  CHECK_EQ(s->num_keys(), 0);
  CHECK_EQ(Scan(*s, 8).size(), 0u);
  CheckAbsent(s.get(), Range(0, 3000), 8);
  // One database directory is left: the cleared one was removed when the visit let it go.
  int dbs = 0;
  for (const std::string& name : ListNames(dir + "/store")) dbs += name.rfind("db-", 0) == 0;
  CHECK_EQ(dbs, 1);
  Put(s.get(), Range(100, 200), 8, 4);
  CHECK_EQ(s->num_keys(), 100);
  CheckPresent(s.get(), Range(100, 200), 8, 4);
}

TFEXT_TEST(ReopeningAMarkedDirectoryWipesIt) {
  const std::string dir = TempDir();
  const std::string path = dir + "/a/b/store";  // parents are created
  {
    std::unique_ptr<ColdStore> s = Open(path, 3);
    Put(s.get(), Range(0, 500), 3);
    CHECK(Exists(path + "/TF_EXT_TIER_STORE"));
    CHECK(Contains(ReadText(path + "/TF_EXT_TIER_STORE"), "tf_ext tier store"));
  }
  CHECK(Exists(path + "/TF_EXT_TIER_STORE"));  // closed: still marked, its database gone
  // What a killed process might leave behind.
  CHECK(mkdir((path + "/db-7").c_str(), 0755) == 0);
  WriteText(path + "/db-7/CURRENT", "MANIFEST-000099\n");
  WriteText(path + "/leftover.sst", "garbage");
  std::unique_ptr<ColdStore> s = Open(path, 3);
  CHECK_EQ(s->num_keys(), 0);
  CheckAbsent(s.get(), Range(0, 500), 3);
  CHECK_EQ(Scan(*s, 3).size(), 0u);
  CHECK(!Exists(path + "/db-7"));
  CHECK(!Exists(path + "/leftover.sst"));
  Put(s.get(), Range(0, 10), 3);
  CheckPresent(s.get(), Range(0, 10), 3);
}

TFEXT_TEST(AForeignDirectoryIsRefusedAndLeftUntouched) {
  const std::string dir = TempDir();
  WriteText(dir + "/precious.txt", "keep me");
  CHECK(mkdir((dir + "/photos").c_str(), 0755) == 0);
  const std::set<std::string> before = ListNames(dir);
  const std::string msg = ExpectStoreError(StoreError::kForeign, [&] { Open(dir, 4); });
  CHECK(Contains(msg, dir));
  CHECK(Contains(msg, "not a tf_ext tier store"));
  CHECK(Contains(msg, "refusing to delete its files"));
  CHECK(ListNames(dir) == before);  // no marker, no lock file, nothing removed
  CHECK_EQ(ReadText(dir + "/precious.txt"), std::string("keep me"));
  // A path that is a file is not a directory to use.
  const std::string msg2 = ExpectStoreError(StoreError::kPermission, [&] { Open(dir + "/precious.txt/store", 4); });
  CHECK(Contains(msg2, dir + "/precious.txt/store"));
  CHECK(Contains(msg2, "not writable"));
  CHECK(Contains(msg2, dir + "/precious.txt is a file, not a directory"));
  CHECK_EQ(ReadText(dir + "/precious.txt"), std::string("keep me"));
}

TFEXT_TEST(ASecondOpenOfAPathIsRefused) {
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir, 2);
  Put(s.get(), Range(0, 50), 2);
  const std::string msg = ExpectStoreError(StoreError::kLocked, [&] { Open(dir, 2); });
  CHECK(Contains(msg, dir));
  CHECK(Contains(msg, "process " + std::to_string(getpid())));
  CheckPresent(s.get(), Range(0, 50), 2);  // the refused open wiped nothing
  // A forked child (as Python's multiprocessing makes) is refused too.
  const pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    try {
      Open(dir, 2);
    } catch (const StoreError& e) {
      _exit(e.code() == StoreError::kLocked ? 0 : 10 + e.code());
    }
    _exit(99);  // opened: the lock did not hold
  }
  CHECK_EQ(Wait(pid), 0);
  CheckPresent(s.get(), Range(0, 50), 2);
  // A forked child that outlives the store does not keep its directory locked: the reopen below runs while the
  // child still lives (it waits for the pipe to close). The child's copy of the lock file is closed by a fork
  // handler that runs in the child, so the parent waits for the child's first byte (sent after the handlers ran)
  // before it closes the store: until then the child still shares the lock.
  int release[2];
  int started[2];
  CHECK(pipe(release) == 0);
  CHECK(pipe(started) == 0);
  const pid_t lingering = fork();
  CHECK(lingering >= 0);
  if (lingering == 0) {
    close(release[1]);
    close(started[0]);
    const char one = 1;
    if (write(started[1], &one, 1) != 1) _exit(98);
    char ch;
    while (read(release[0], &ch, 1) > 0) {
    }
    _exit(0);
  }
  close(release[0]);
  close(started[1]);
  char ch = 0;
  CHECK_EQ(read(started[0], &ch, 1), 1);
  close(started[0]);
  s.reset();
  s = Open(dir, 2);  // free again once closed
  CHECK_EQ(s->num_keys(), 0);
  close(release[1]);
  CHECK_EQ(Wait(lingering), 0);
}

TFEXT_TEST(APathHeldByAnotherProcessIsRefused) {
  const std::string dir = TempDir();
  Child c = Spawn({"--child-hold", dir}, /*pipes=*/true);
  const std::string line = ReadLine(c.from_child);
  CHECK_EQ(line, "ready " + std::to_string(c.pid));
  const std::string msg = ExpectStoreError(StoreError::kLocked, [&] { Open(dir, 3); });
  CHECK(Contains(msg, dir));
  CHECK(Contains(msg, "process " + std::to_string(c.pid)));
  close(c.to_child);  // the child checks its rows survived, closes its store and exits
  CHECK_EQ(Wait(c.pid), 0);
  close(c.from_child);
  std::unique_ptr<ColdStore> s = Open(dir, 3);  // the lock went with the child
  CHECK_EQ(s->num_keys(), 0);
}

TFEXT_TEST(BadOptionsAndAMissingPluginAreClearErrors) {
  const std::string dir = TempDir();
  std::string msg = ExpectStoreError(StoreError::kInvalid, [&] { Open(dir + "/w0", 0); });
  CHECK(Contains(msg, "width"));
  CHECK(Contains(msg, "0"));
  msg = ExpectStoreError(StoreError::kInvalid, [&] { Open("", 4); });
  CHECK(Contains(msg, "path"));
  // No plugin at all.
  Child c = Spawn({"--child-missing-plugin", dir}, /*pipes=*/false, "/nonexistent/_tf_ext_rocksdb_store.so",
                  "No such file or directory");
  CHECK_EQ(Wait(c.pid), 0);
  // A plugin whose RocksDB is not installed: a copy of the plugin that needs "librocksdx.so.7.8" instead.
  const char* env = std::getenv(tfext::table::kRocksDbStoreLibraryEnv);
  const std::string plugin = env != nullptr && env[0] != '\0'
                                 ? std::string(env)
                                 : g_self.substr(0, g_self.rfind('/') + 1) + tfext::table::kRocksDbStoreLibrary;
  std::string bytes = ReadText(plugin);
  const std::string needed = "librocksdb.so.7.8";
  size_t at = bytes.find(needed);
  CHECK(at != std::string::npos);
  for (; at != std::string::npos; at = bytes.find(needed, at)) bytes[at + 9] = 'x';
  const std::string patched = dir + "/no_rocksdb/_tf_ext_rocksdb_store.so";
  CHECK(mkdir((dir + "/no_rocksdb").c_str(), 0755) == 0);
  WriteText(patched, bytes);
  c = Spawn({"--child-missing-plugin", dir}, /*pipes=*/false, patched.c_str(), "librocksdx.so.7.8");
  CHECK_EQ(Wait(c.pid), 0);
}

TFEXT_TEST(AnUnwritablePathIsAPermissionError) {
  const std::string dir = TempDir();
  Child c = Spawn({"--child-readonly", dir}, /*pipes=*/false);
  CHECK_EQ(Wait(c.pid), 0);
  const std::string dir2 = TempDir();
  c = Spawn({"--child-permission-denied", dir2}, /*pipes=*/false);
  CHECK_EQ(Wait(c.pid), 0);
}

// A plugin of another interface version, or from before the version symbol, is refused before its entry point runs
// (theirs abort the process); the real plugin exports this header's version.
TFEXT_TEST(AStalePluginIsRefusedNamingBothVersions) {
  const std::string dir = TempDir();
  const char* other = std::getenv("COLD_STORE_TEST_PLUGIN_OTHER_ABI");
  const char* none = std::getenv("COLD_STORE_TEST_PLUGIN_NO_ABI");
  CHECK(other != nullptr && none != nullptr);  // set by the BUILD target
  Child c = Spawn({"--child-stale-plugin", dir}, /*pipes=*/false, other, "1002");
  CHECK_EQ(Wait(c.pid), 0);
  c = Spawn({"--child-stale-plugin", dir}, /*pipes=*/false, none,
            (std::string("1 (it exports no ") + tfext::table::kRocksDbStoreAbiSymbol + ")").c_str());
  CHECK_EQ(Wait(c.pid), 0);
  const char* real = std::getenv(tfext::table::kRocksDbStoreLibraryEnv);
  void* handle = dlopen(real, RTLD_NOW | RTLD_LOCAL);
  CHECK(handle != nullptr);
  void* abi = dlsym(handle, tfext::table::kRocksDbStoreAbiSymbol);
  CHECK(abi != nullptr);
  CHECK_EQ(reinterpret_cast<tfext::table::RocksDbStoreAbiFn>(abi)(), tfext::table::kColdStoreAbi);
}

TFEXT_TEST(BadMemoryOptionsAreRefused) {
  const std::string dir = TempDir();
  StoreOptions o;
  o.path = dir + "/store";
  o.width = 4;
  o.write_buffer_bytes = tfext::table::kMinWriteBufferBytes - 1;
  std::string msg = ExpectStoreError(StoreError::kInvalid, [&] { OpenColdStore(o); });
  CHECK(Contains(msg, "write_buffer_bytes must be >= 65536"));
  CHECK(Contains(msg, std::to_string(tfext::table::kMinWriteBufferBytes - 1)));
  o.write_buffer_bytes = tfext::table::kMinWriteBufferBytes;
  o.write_buffers = 1;
  msg = ExpectStoreError(StoreError::kInvalid, [&] { OpenColdStore(o); });
  CHECK(Contains(msg, "write_buffers in [2, 64]"));
  o.write_buffers = 2;
  o.block_cache_bytes = -1;
  msg = ExpectStoreError(StoreError::kInvalid, [&] { OpenColdStore(o); });
  CHECK(Contains(msg, "block_cache_bytes >= 0"));
  CHECK(!Exists(dir + "/store"));
  // The smallest sizes work; the bound counts them.
  o.block_cache_bytes = 0;
  std::unique_ptr<ColdStore> s = OpenColdStore(o);
  Put(s.get(), Range(0, 5000), 4);
  CheckPresent(s.get(), Range(0, 5000), 4);
  CHECK_EQ(tfext::table::StoreMemoryBytes(o), 2 * (64 << 10) + tfext::table::kStoreFixedMemoryBytes);
}

TFEXT_TEST(AStoreKeepsItsMemoryWithinStoreMemoryBytes) {
  const std::string dir = TempDir();
  Child c = Spawn({"--child-memory-bound", dir}, /*pipes=*/false);
  CHECK_EQ(Wait(c.pid), 0);
}

TFEXT_TEST(AFullDiskIsNoSpaceAndTheStoreStaysReadable) {
  const std::string dir = TempDir();
  Child c = Spawn({"--child-nospace", dir}, /*pipes=*/false);
  CHECK_EQ(Wait(c.pid), 0);
}

TFEXT_TEST(DiskBytesGrowsWithRowsAndShrinksAfterDeletesAndClear) {
  constexpr int64_t kWidth = 64;
  constexpr int64_t kValueBytes = kWidth * 4 + 12;
  const std::string dir = TempDir();
  std::unique_ptr<ColdStore> s = Open(dir, kWidth);
  const int64_t empty = s->disk_bytes();
  CHECK_LT(empty, 64 << 10);
  Put(s.get(), Range(0, 20000), kWidth);
  const int64_t full = s->disk_bytes();
  CHECK_GE(full, 20000 * kValueBytes);
  CHECK_LT(full, 2 * 20000 * kValueBytes);
  // A few deletes do not warrant a compaction; most of the rows deleted do, and their space comes back.
  const std::vector<int64_t> few = Range(0, 100);
  s->Delete(few.data(), 100);
  s->CompactIfNeeded();
  const int64_t after_few = s->disk_bytes();
  CHECK_GE(after_few, 19900 * kValueBytes);
  const std::vector<int64_t> most = Range(100, 15000);
  s->Delete(most.data(), static_cast<int64_t>(most.size()));
  s->CompactIfNeeded();
  const int64_t after_most = s->disk_bytes();
  CHECK_GE(after_most, 5000 * kValueBytes);
  CHECK_LT(after_most, 2 * 5000 * kValueBytes);
  CHECK_EQ(s->num_keys(), 5000);
  CheckPresent(s.get(), Range(15000, 20000), kWidth);
  s->Clear();
  CHECK_LT(s->disk_bytes(), 64 << 10);
  std::printf("disk_bytes: empty %lld, 20000 rows %lld, 19900 %lld, 5000 %lld (rows of %lld bytes)\n",
              static_cast<long long>(empty), static_cast<long long>(full), static_cast<long long>(after_few),
              static_cast<long long>(after_most), static_cast<long long>(kValueBytes));
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
  // Children get an absolute plugin path (the BUILD target passes one relative to the runfiles).
  for (const char* env :
       {tfext::table::kRocksDbStoreLibraryEnv, "COLD_STORE_TEST_PLUGIN_OTHER_ABI", "COLD_STORE_TEST_PLUGIN_NO_ABI"}) {
    const char* plugin = std::getenv(env);
    if (plugin != nullptr && plugin[0] != '\0' && plugin[0] != '/') {
      char abs[4096];
      if (realpath(plugin, abs) != nullptr) setenv(env, abs, 1);
    }
  }
  if (argc == 3 && std::strncmp(argv[1], "--child-", 8) == 0) return RunChild(argv[1], argv[2]);
  return tfext_test::RunAllTests(argc, argv);
}
