// tensorflow_ext table core: implementation. The design is described in
// hash_table.h; this file only explains the choices that are local to it.

#include "tensorflow_ext/table/core/hash_table.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tensorflow_ext/table/core/check.h"
#include "tensorflow_ext/table/core/row_codec_host.h"
#include "tensorflow_ext/table/core/test_peer.h"

namespace tfext {
namespace table {
namespace {

// ---------------------------------------------------------------------------
// Invariants. Every shard s satisfies these whenever its lock is free (a
// writer may break them only in the middle of an operation, under the write
// lock). CheckInvariants() verifies all of them; the TFEXT_DCHECKs below
// (check.h, debug-check builds only) verify the preconditions and
// postconditions each step relies on.
//
//  I1 Index shape. Either no index (capacity == 0, slots == g_empty_index,
//     mask == grow_at == 0), or capacity is a power of two in
//     [kMinIndexCapacity, kMaxIndexCapacity], mask == capacity - 1 and
//     grow_at == GrowAt(capacity) < capacity. Powers of two make the home
//     slot a mask of the tag and let doubling rehash from tags alone.
//  I2 Load. size <= grow_at < capacity (or size == 0 without an index): an
//     empty slot always exists, so every probe terminates.
//  I3 Slots. An occupied slot is {tag, id + 1} with id < rows_handed_out;
//     the row's key k hashes to this shard (ShardIndex(ProbeHash(k)) == s)
//     with TagOf(ProbeHash(k)) == tag. No two slots name the same row, no two
//     rows hold the same key, and occupied slots == size.
//  I4 No gaps (linear probing). For an occupied slot at p with home
//     h = tag & mask, every slot of the cyclic range [h, p] is occupied.
//     Probes rely on it to stop at the first empty slot; backward-shift
//     deletion (EraseAt) is what keeps it without tombstones.
//  I5 Arena. Row ids [0, rows_handed_out) are each either named by exactly
//     one slot or on the free list exactly once (the list is acyclic), so
//     size + free rows == rows_handed_out <= kMaxRowsPerShard, and the chunk
//     table covers every row handed out (ChunkStart(chunks.size()) >=
//     rows_handed_out). Chunks never move: a row pointer stays valid while its
//     shard lock is held.
// ---------------------------------------------------------------------------

static_assert(sizeof(size_t) == 8, "64-bit only: index arrays and arenas can exceed 4 GiB");

constexpr int kMaxShardBits = 12;
// Shards take the top shard_bits of the probe hash, tags its low 32 bits.
static_assert(kMaxShardBits <= 32,
              "shard bits and tag bits must not overlap: else all keys of a shard would share tag bits and "
              "crowd a fraction of its index");
constexpr int64_t kMaxWidth = int64_t{1} << 24;
constexpr double kMaxLoadFactorLimit = 0.95;
static_assert(kMaxLoadFactorLimit < 1.0, "a full index has no empty slot to end a probe (I2)");
static_assert(kMaxPresizedKeys <= kMaxCapacity, "pre-sizing is bounded by what initial_capacity may ask for");

// Row ids are 32-bit per shard and a slot stores id + 1 (0 = empty slot).
constexpr uint64_t kMaxRowsPerShard = 0xFFFFFFFEull;
static_assert(kMaxRowsPerShard + 1 <= std::numeric_limits<uint32_t>::max(),
              "a slot stores row id + 1 in 32 bits: the largest id + 1 must fit and never wrap to 0 (empty)");
// A slot's home is its 32-bit tag masked by the capacity, so a shard's index
// has at most 2^32 slots.
constexpr uint64_t kMaxIndexCapacity = uint64_t{1} << 32;
// Smallest index a shard allocates (one cache line of slots).
constexpr uint64_t kMinIndexCapacity = 8;
constexpr bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
static_assert(IsPowerOfTwo(kMinIndexCapacity) && IsPowerOfTwo(kMaxIndexCapacity),
              "index capacities are powers of two: home = tag & (capacity - 1), and doubling keeps that (I1)");
static_assert(kMaxIndexCapacity <= (uint64_t{1} << 32),
              "home = tag & mask with a 32-bit tag: a larger index would have slots that no key calls home");
static_assert(kMinIndexCapacity * sizeof(uint64_t) == 64, "the smallest index is one cache line of 8-byte slots");
// Arena chunks are ~16 KiB: small enough that the partly filled last chunk of
// each shard costs little memory, large enough that the chunk table stays
// small (a few KiB per shard at millions of keys).
constexpr size_t kTargetChunkBytes = size_t{16} << 10;
// A full chunk holds at least this many rows (more when rows are narrow).
constexpr uint64_t kMinChunkRows = 16;
// Small tables. A full chunk per shard would make a table's floor ~16 KiB per
// shard touched (~190 KiB for 100 keys over 16 shards), so a shard's first
// full chunk's worth of rows comes in small chunks that double: kFirstChunkRows
// rows, kFirstChunkRows, 2x, 4x, ... up to half a full chunk; full chunks
// follow. Row memory is then < 2x the rows handed out plus kFirstChunkRows
// rows per shard touched, and a table of many keys has only a few more
// (tiny) chunks per shard. Preallocating tables take full chunks from the
// first row on (their rows are meant to come from resident slabs).
constexpr uint64_t kFirstChunkRows = 4;
// Small chunks are 16-byte aligned (full ones 64): rows have a 4-byte stride
// anyway, and then a small chunk takes exactly its rows' bytes.
constexpr size_t kSmallChunkAlignment = 16;
static_assert(kFirstChunkRows * sizeof(float) % kSmallChunkAlignment == 0,
              "every small chunk (>= kFirstChunkRows rows of 20 + 4 * width bytes, a multiple of 4) is a multiple "
              "of its alignment, as aligned_alloc requires, so no padding goes uncounted by memory_bytes");
// initial_capacity pre-sizes the shards' indexes only from this many keys per
// shard on (see Impl's constructor); a preallocating table sizes for its keys
// whatever their number.
constexpr int64_t kMinPresizedKeysPerShard = 16;
static_assert(IsPowerOfTwo(kFirstChunkRows) && IsPowerOfTwo(kMinChunkRows),
              "chunk sizes are powers of two: a row's chunk is found from the bit width of its id (ChunkOf)");
static_assert(kFirstChunkRows >= 2 && kFirstChunkRows < kMinChunkRows,
              "the first small chunk has >= 2 rows (ChunkOf ors id with kFirstChunkRows - 1 so that __builtin_clz "
              "never sees 0) and fewer than a full chunk (else there are no small chunks)");

// How far ahead (in keys) the batched loops prefetch: the index slot of key
// j + kSlotAhead, then (once that slot has arrived) the row of key
// j + kRowAhead. Enough misses in flight to cover DRAM latency on one core;
// measured on the 2-core EPYC dev machines, 12..32 slots ahead all give the
// same throughput: the loops are bound by the core's outstanding misses
// (hence the L2 prefetches below).
constexpr int64_t kSlotAhead = 16;
constexpr int64_t kRowAhead = 8;
// Readers keep the hash and probe state of the keys in flight in rings of
// this many entries, indexed by key index & (kHashRing - 1).
constexpr int64_t kHashRing = 32;
static_assert(0 < kRowAhead && kRowAhead < kSlotAhead,
              "a key's row is prefetched from its slot, so the row stage must run behind the slot stage");
static_assert(IsPowerOfTwo(kHashRing) && kHashRing > kSlotAhead,
              "the reader's ring must hold every key in flight (keys j .. j + kSlotAhead) and be indexed by a mask");

// Writers bucket keys in blocks of this many keys (one histogram per block).
constexpr int64_t kBucketBlock = 16384;
// Below this many keys the work runs on the calling thread.
constexpr int64_t kSerialBatch = 2048;

// The hash the table shards and probes with (mix.h): deliberately different
// from HashKey, which callers may use to partition keys across tables.
inline uint64_t ProbeHash(int64_t key) { return Murmur3Fmix64(static_cast<uint64_t>(key)); }

// Index slot = {tag: high 32 bits, row id + 1: low 32 bits}; 0 is empty.
constexpr uint32_t SlotTag(uint64_t slot) { return static_cast<uint32_t>(slot >> 32); }
constexpr uint32_t SlotRow(uint64_t slot) { return static_cast<uint32_t>(slot) - 1; }
constexpr uint64_t MakeSlot(uint32_t tag, uint32_t row) {
  return (static_cast<uint64_t>(tag) << 32) | (static_cast<uint64_t>(row) + 1);
}
static_assert(MakeSlot(0, 0) != 0 && MakeSlot(0xFFFFFFFFu, kMaxRowsPerShard - 1) != 0,
              "an occupied slot is never 0, the empty marker, whatever its tag and row");
static_assert(SlotTag(MakeSlot(0xFFFFFFFFu, kMaxRowsPerShard - 1)) == 0xFFFFFFFFu &&
                  SlotRow(MakeSlot(0xFFFFFFFFu, kMaxRowsPerShard - 1)) == kMaxRowsPerShard - 1 &&
                  SlotTag(MakeSlot(7, 0)) == 7 && SlotRow(MakeSlot(7, 0)) == 0,
              "a slot round-trips its tag and row id");
constexpr uint32_t TagOf(uint64_t hash) { return static_cast<uint32_t>(hash); }

// A row reference (FindOrInsertWith's refs, UpdateRows): shard index and row
// id. Opaque to callers; UpdateRows trusts none it cannot verify.
constexpr uint64_t MakeRowRef(int64_t shard, uint32_t id) { return (static_cast<uint64_t>(shard) << 32) | id; }
constexpr uint64_t RowRefShard(uint64_t ref) { return ref >> 32; }
constexpr uint32_t RowRefId(uint64_t ref) { return static_cast<uint32_t>(ref); }
static_assert(kMaxShardBits <= 31 && RowRefShard(MakeRowRef(7, 0xFFFFFFFFu)) == 7 &&
                  RowRefId(MakeRowRef(7, 0xFFFFFFFFu)) == 0xFFFFFFFFu,
              "a row reference round-trips every shard index and 32-bit row id");

// Row layout (hash_table.h): [int64 key | values | int64 version | uint32
// frequency], packed, rows one stride (RowBytes) apart in chunks that are
// 64-byte aligned. The values are the compact area of the leading
// compact_cols columns (row_codec.h: CompactBytes, padded to 4 bytes), then
// the other columns as float32; a plain row has no compact area.
constexpr size_t kValuesOffset = sizeof(int64_t);
constexpr size_t ValuesBytes(RowStorage storage, int64_t compact_cols, int64_t width) {
  return static_cast<size_t>(CompactBytes(storage, compact_cols)) +
         sizeof(float) * static_cast<size_t>(width - compact_cols);
}
constexpr size_t VersionOffset(size_t values_bytes) { return kValuesOffset + values_bytes; }
constexpr size_t FrequencyOffset(size_t values_bytes) { return VersionOffset(values_bytes) + sizeof(int64_t); }
constexpr size_t RowBytes(size_t values_bytes) { return FrequencyOffset(values_bytes) + sizeof(uint32_t); }
constexpr size_t PlainRowBytes(int64_t width) { return RowBytes(ValuesBytes(RowStorage::kFloat32, 0, width)); }
static_assert(PlainRowBytes(1) == 24 && PlainRowBytes(64) == 276,
              "a float32 row is 20 + 4 * width bytes, as hash_table.h states (memory budgets and docs rely on it)");
static_assert(RowBytes(ValuesBytes(RowStorage::kBFloat16, 16, 17)) == 56 &&
                  RowBytes(ValuesBytes(RowStorage::kFloat16, 32, 32)) == 84 &&
                  RowBytes(ValuesBytes(RowStorage::kInt8Row, 16, 16)) == 40 &&
                  RowBytes(ValuesBytes(RowStorage::kFloat32, 16, 17)) == PlainRowBytes(17),
              "a compact row is 20 + CompactBytes(storage, compact_cols) + 4 * (width - compact_cols) bytes, as "
              "hash_table.h states (dim 16 in bf16 + a row-wise accumulator: 56 B)");
static_assert(sizeof(float) == 4 && kValuesOffset % alignof(float) == 0 && RowBytes(0) % alignof(float) == 0 &&
                  CompactBytes(RowStorage::kBFloat16, 1) % alignof(float) == 0 &&
                  CompactBytes(RowStorage::kInt8Row, 1) % alignof(float) == 0 && 64 % alignof(float) == 0,
              "every row's float32 columns are accessed as float*: the stride, the values offset and the compact "
              "area must keep them aligned in 64-byte aligned chunks (the 8-byte fields are read with memcpy)");

// Rows have a 4-byte stride, so 8-byte fields may be unaligned: memcpy is
// the portable way to say "unaligned load" and compiles to one mov on x86.
inline int64_t LoadI64(const char* p) {
  int64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreI64(char* p, int64_t v) { std::memcpy(p, &v, sizeof(v)); }
inline uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void StoreU32(char* p, uint32_t v) { std::memcpy(p, &v, sizeof(v)); }

// Software prefetch into all cache levels. On x86 it is an asm statement:
// GCC 12 at -O3 deleted __builtin_prefetch calls of the row prefetch loop
// below (measured: no prefetch instruction emitted), an asm volatile stays.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// Software prefetch into L2 (and L3), not L1: for the random index slots and
// rows of the batched loops. Those loops are bound by the core's outstanding
// misses; an L1 prefetch holds one of the few L1 miss buffers until its line
// arrives (perf: ~40% of Find's time sat on a blocked prefetcht0), while the
// L2 tracks many more misses, and the demand load a few keys later hits L2.
// Measured on the 2-core EPYC dev machine, 1 thread, 1M keys: Find -10%
// (width 16) and -18% (width 64) ns/key, Insert -10..-25%. The caller's own
// input/output rows keep PrefetchLine (L1): they are sequential-ish and few.
inline void PrefetchLineL2(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht2 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 1);
#endif
}

// Prefetches the cache lines of [p, p + bytes).
inline void PrefetchBytes(const void* p, size_t bytes) {
  if (bytes == 0) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
  for (uintptr_t line = begin & ~uintptr_t{63}; line < begin + bytes; line += 64) {
    PrefetchLine(reinterpret_cast<const void*>(line));
  }
}

// Copies n floats. Rows are short (tens of floats): fixed-size 16-byte moves
// inline beat a call into libc's size-dispatching memcpy.
inline void CopyFloats(float* dst, const float* src, int64_t n) {
  int64_t c = 0;
  for (; c + 4 <= n; c += 4) std::memcpy(dst + c, src + c, 4 * sizeof(float));
  for (; c < n; ++c) dst[c] = src[c];
}

// Per-thread float32 buffers for compact rows (see HashTable::Impl's
// columns section), one per use so that one never overwrites another in use:
// kRow, a row or column range an operation decodes, changes and encodes
// back (Update's fn sees it); kInit, FindOrInsertWith's batch of new rows
// for init; kCodec, an int8 row being requantized.
enum class Scratch { kRow = 0, kInit = 1, kCodec = 2 };
float* ThreadScratch(Scratch use, size_t floats) {
  thread_local std::vector<float> buffers[3];
  std::vector<float>& buffer = buffers[static_cast<int>(use)];
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

// A float32 row for one key's compact columns: on the stack up to
// kStackFloats floats, else ThreadScratch(use). Per-key paths take it so
// that the usual rows cost no thread-local lookup (a call through a shared
// library's TLS) per key.
class ScratchRow {
 public:
  static constexpr size_t kStackFloats = 128;
  ScratchRow(Scratch use, size_t floats) : data_(floats <= kStackFloats ? stack_ : ThreadScratch(use, floats)) {}
  ScratchRow(const ScratchRow&) = delete;
  ScratchRow& operator=(const ScratchRow&) = delete;
  float* data() const { return data_; }

 private:
  float stack_[kStackFloats];
  float* const data_;
};

// For the batched writers that have no per-key input or output rows.
constexpr auto kNoIo = [](int64_t) {};

[[noreturn]] void ThrowOutOfMemory(const char* what, uint64_t value) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "tf_ext table: %s (%llu)", what, static_cast<unsigned long long>(value));
  throw OutOfMemoryError(buf);
}

constexpr size_t kPageBytes = 4096;
constexpr size_t kHugePageBytes = size_t{2} << 20;
// Pre-sized index arrays from this size on are fresh mappings (see
// AllocateIndexMemory).
constexpr size_t kMappedIndexBytes = size_t{64} << 10;

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// Grows v's capacity (geometrically) so that one push_back cannot throw: an
// allocation that fails then fails before anything else changed.
template <typename Vector>
void MakeRoomForOne(Vector& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(4, 2 * v.capacity()));
}

// Runs pf(total, fn) so that an exception thrown by fn on any thread (a
// failed allocation) reaches the caller: the ParallelFor's threads must not
// see it (an exception leaving a thread-pool task terminates the process).
// The first exception is rethrown once pf has returned.
void RunParallel(const ParallelFor& pf, int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
  std::mutex mu;
  std::exception_ptr error;
  pf(total, [&](int64_t begin, int64_t end) {
    try {
      fn(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

// RunParallel when `parallel`, else fn(0, total) on the calling thread (small
// batches: handing them to the pool costs more than it saves).
void RunParallel(bool parallel, const ParallelFor& pf, int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
  if (parallel) {
    RunParallel(pf, total, fn);
  } else {
    fn(0, total);
  }
}

// Runs a cleanup (lock releases) when it goes out of scope, exception or not.
template <typename Fn>
class ScopeExit {
 public:
  explicit ScopeExit(Fn fn) : fn_(std::move(fn)) {}
  ~ScopeExit() { fn_(); }
  ScopeExit(const ScopeExit&) = delete;
  ScopeExit& operator=(const ScopeExit&) = delete;

 private:
  Fn fn_;
};

// Maps `bytes` (a multiple of the page size) of fresh anonymous memory
// aligned to `alignment` (a power of two >= the page size): over-maps by the
// alignment, then unmaps the unaligned head and the tail. The memory reads as
// zero and takes physical pages only where it is written.
void* MapAligned(size_t bytes, size_t alignment) {
  const size_t slack = alignment > kPageBytes ? alignment : 0;
  const size_t mapped = bytes + slack;
  if (mapped < bytes) ThrowOutOfMemory("cannot map memory, bytes requested", bytes);
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) ThrowOutOfMemory("cannot map memory, bytes requested", mapped);
  const uintptr_t raw_begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t begin = RoundUp(raw_begin, alignment > kPageBytes ? alignment : kPageBytes);
  if (begin > raw_begin) munmap(raw, begin - raw_begin);
  const uintptr_t end = begin + bytes;
  if (raw_begin + mapped > end) munmap(reinterpret_cast<void*>(end), raw_begin + mapped - end);
  return reinterpret_cast<void*>(begin);
}

// Whether large blocks are asked for transparent huge pages: the table's
// option unless TF_EXT_TABLE_HUGE_PAGES (0 or 1, read once) overrides it for
// the process (see TableOptions::huge_pages for the trade-off).
bool UseHugePages(bool option) {
  static const int env_override = [] {
    const char* env = std::getenv("TF_EXT_TABLE_HUGE_PAGES");
    if (env == nullptr || *env == '\0') return -1;
    return std::strcmp(env, "0") == 0 ? 0 : 1;
  }();
  return env_override < 0 ? option : env_override == 1;
}

// Zeroed, cache-line aligned memory for an index array; free with
// FreeIndexMemory(p, bytes, *mapped). Blocks of 2 MiB and more are 2 MiB
// aligned and asked for transparent huge pages: index probes are random
// accesses, where 4 KiB pages would add a TLB miss to most of them.
// With `lazy` (an index pre-sized for keys that have not arrived), blocks of
// kMappedIndexBytes and more are fresh mappings, zero without being written:
// they take physical memory only as keys land in them. Otherwise the block
// comes from the heap and is written at once: an index that grows is about to
// be filled, and the heap reuses the pages of the arrays it replaced (fresh
// mappings made growth from empty ~2x slower, page faults and all).
void* AllocateIndexMemory(size_t bytes, bool huge_pages, bool lazy, bool* mapped) {
  const bool huge = huge_pages && bytes >= kHugePageBytes;
  *mapped = lazy && bytes >= kMappedIndexBytes;
  if (*mapped) {
    const size_t rounded = RoundUp(bytes, kPageBytes);
    void* p = MapAligned(rounded, huge ? kHugePageBytes : kPageBytes);
#ifdef MADV_HUGEPAGE
    if (huge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
  }
  const size_t alignment = huge ? kHugePageBytes : 64;
  const size_t rounded = RoundUp(bytes, alignment);
  void* p = std::aligned_alloc(alignment, rounded);
  if (p == nullptr) ThrowOutOfMemory("cannot allocate an index, bytes requested", rounded);
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, rounded);
  return p;
}

void FreeIndexMemory(void* p, size_t bytes, bool mapped) {
  if (mapped) {
    munmap(p, RoundUp(bytes, kPageBytes));
  } else {
    std::free(p);
  }
}

uint64_t g_empty_index[1] = {0};  // shared by shards with no index yet; never written

// Whether tables prefault arena slabs in the background (see ChunkSource):
// off unless the environment variable TF_EXT_TABLE_PREFAULT is "1" (opt-in:
// ~2% of a training step on a 2-core machine, where the worker's CPU is not
// free). Read when a table is created, so that one process can hold tables
// with and without it (A/B benchmarks).
bool UsePrefault() {
  const char* env = std::getenv("TF_EXT_TABLE_PREFAULT");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

// Makes [p, p + bytes) resident and writable now: MADV_POPULATE_WRITE (Linux
// 5.14+) faults every page in one call; kernels without it (EINVAL) get one
// write per page. Returns false, with part of the range maybe resident, when
// the kernel refuses the memory (ENOMEM and the like): the caller gives it
// back instead of touching it page by page into the OOM killer.
bool PopulatePages(void* p, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) return false;
  volatile char* c = static_cast<volatile char*>(p);
  for (size_t off = 0; off < bytes; off += kPageBytes) c[off] = 0;
  return true;
}

// Bytes of memory this process could still take without pushing the machine
// into swap or the OOM killer: the kernel's MemAvailable, lowered to the
// headroom under a cgroup v2 memory limit if there is one. -1 if unknown.
int64_t AvailableMemoryBytes() {
  int64_t available = -1;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      long long kb = 0;
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
        available = static_cast<int64_t>(kb) * 1024;
        break;
      }
    }
    std::fclose(f);
  }
  long long limit = 0, used = 0;
  std::FILE* max_file = std::fopen("/sys/fs/cgroup/memory.max", "r");
  std::FILE* cur_file = std::fopen("/sys/fs/cgroup/memory.current", "r");
  if (max_file != nullptr && cur_file != nullptr && std::fscanf(max_file, "%lld", &limit) == 1 &&
      std::fscanf(cur_file, "%lld", &used) == 1) {  // "max" (no limit) does not parse
    const int64_t headroom = std::max<int64_t>(0, static_cast<int64_t>(limit) - static_cast<int64_t>(used));
    available = available < 0 ? headroom : std::min(available, headroom);
  }
  if (max_file != nullptr) std::fclose(max_file);
  if (cur_file != nullptr) std::fclose(cur_file);
  return available;
}

// An arena slab: a mapping carved into chunks.
struct Slab {
  void* base;
  size_t bytes;
};

// Maps a fresh slab of `bytes`, 2 MiB aligned (its first 2 MiB asked for a
// transparent huge page when `huge_pages`).
Slab MapSlab(size_t bytes, bool huge_pages) {
  void* begin = MapAligned(bytes, kHugePageBytes);
#ifdef MADV_HUGEPAGE
  if (huge_pages) madvise(begin, kHugePageBytes, MADV_HUGEPAGE);
#else
  (void)huge_pages;
#endif
  return {begin, bytes};
}

// MapSlab, made resident now (PopulatePages); {nullptr, 0} when the OS
// refuses the memory (nothing stays mapped). Throws as MapSlab.
Slab MapResidentSlab(size_t bytes, bool huge_pages) {
  Slab slab = MapSlab(bytes, huge_pages);
  if (!PopulatePages(slab.base, slab.bytes)) {
    munmap(slab.base, slab.bytes);
    return {nullptr, 0};
  }
  return slab;
}

// Slabs made resident ahead of need for one ChunkSource, shared with the
// prefault worker (below).
//
// Concurrency contract. `mu` guards every field. The worker maps a slab and
// faults its pages in without any lock, while the slab belongs to the worker
// alone; it then publishes the slab by appending it to `ready` under `mu`, and
// never touches it again. The ChunkSource takes a slab out of `ready` under
// `mu` (holding its own mutex too), after which only the ChunkSource's
// Allocate (under the ChunkSource mutex, called under a shard's write lock)
// carves chunks from it, exactly as from a slab it mapped itself. So no slab
// is ever written by the worker and a table writer alike. Once `abandoned`
// (the ChunkSource released its memory or was destroyed), the worker unmaps
// what it makes instead of publishing it, and nobody else looks at `ready`.
struct SpareSlabs {
  std::mutex mu;
  std::vector<Slab> ready;  // resident, not yet used
  int pending = 0;          // requests queued to or running on the worker
  bool abandoned = false;
  size_t slab_bytes = 0;
  bool huge_pages = false;
};

// One process-wide thread that prepares spare slabs, for all tables, one at a
// time. It is created on first use and never joined: it only ever waits on its
// queue or maps memory, so it may outlive every table (and `main`). The
// queue's entries are shared_ptrs, so a table may be destroyed while its
// request waits or runs (see SpareSlabs::abandoned).
class PrefaultWorker {
 public:
  static PrefaultWorker& Get() {
    // Leaked on purpose: no destructor may run while the detached thread
    // still waits on mu_ at exit.
    static PrefaultWorker* worker = new PrefaultWorker();
    return *worker;
  }

  // Queues a request for one slab; the caller has counted it in
  // spare->pending. Returns false (and queues nothing) if the worker thread
  // cannot be started or the queue cannot grow.
  bool Request(std::shared_ptr<SpareSlabs> spare) {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      if (!started_) {
        std::thread(&PrefaultWorker::Run, this).detach();
        started_ = true;
      }
      queue_.push_back(std::move(spare));
    } catch (...) {
      return false;
    }
    cv_.notify_one();
    return true;
  }

 private:
  PrefaultWorker() {
    // A child of fork() has no worker thread: it starts its own on first use.
    // Its copies of the mutex and the condition variable may record the
    // parent's threads (a waiter the child will never see), so it gets fresh
    // ones. The queued requests stay with the parent's worker (the child's
    // tables then map their slabs on demand, as without prefaulting).
    pthread_atfork([] { Get().mu_.lock(); }, [] { Get().mu_.unlock(); },
                   [] {
                     PrefaultWorker& w = Get();
                     new (&w.mu_) std::mutex();
                     new (&w.cv_) std::condition_variable();
                     new (&w.queue_) std::vector<std::shared_ptr<SpareSlabs>>();  // the old one leaks
                     w.started_ = false;
                   });
  }

  void Run() {
    pthread_setname_np(pthread_self(), "tfext_prefault");  // visible in top and perf
    for (;;) {
      std::shared_ptr<SpareSlabs> spare;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        spare = std::move(queue_.front());
        queue_.erase(queue_.begin());
      }
      size_t bytes;
      bool huge;
      {
        std::lock_guard<std::mutex> lock(spare->mu);
        if (spare->abandoned) {
          --spare->pending;
          continue;
        }
        bytes = spare->slab_bytes;
        huge = spare->huge_pages;
      }
      Slab slab{nullptr, 0};
      try {
        slab = MapResidentSlab(bytes, huge);
      } catch (...) {
        slab.base = nullptr;  // out of memory now: the table maps on demand
      }
      std::lock_guard<std::mutex> lock(spare->mu);
      --spare->pending;
      if (slab.base == nullptr) continue;
      bool published = false;
      if (!spare->abandoned) {
        try {
          spare->ready.push_back(slab);
          published = true;
        } catch (...) {
        }
      }
      if (!published) munmap(slab.base, slab.bytes);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<SpareSlabs>> queue_;
  bool started_ = false;
};

// The table-wide source of arena chunks. Rows are read at random over the
// whole arena (hundreds of MiB for wide rows), so with 4 KiB pages nearly
// every row access is also a TLB miss; measured here, huge pages make a
// width-64 Find ~1.8x faster. So once the arena is large, chunks are carved
// out of 2 MiB-aligned slabs that are asked for transparent huge pages.
// A slab is a whole number of chunks (its first 2 MiB are the huge page, the
// tail of less than one chunk stays in small pages), so carving wastes
// nothing; the only slack is the unused end of the current slab (< 2 MiB).
// Small tables allocate chunks one by one, so they never pay for a slab.
// Chunks are only released all together (Clear, destruction).
//
// Prefaulting. A growing table's first write to each fresh page is a page
// fault (the kernel zeroes the page), on the inserting thread, under a shard
// lock: for a training table that inserts tens of thousands of keys per step
// this was ~40% of the lookup's CPU. With `prefault`, each time the arena
// takes a new slab it asks the process-wide PrefaultWorker for the next ones,
// which it maps and faults in off the critical path; the next NewSlab takes a
// ready one if there is one, and maps its own otherwise (it never waits for
// the worker). Spare memory is capped at one slab per 16 slabs in use, at
// most kMaxSpareSlabs (<= 1/16 of the arena's slabs, at most 16 MiB per
// table: enough for the ~6 MiB a ctr26 training step adds), counting slabs
// queued and ready; so an arena starts prefaulting at 16 slabs (32 MiB past
// the slab threshold), and the memory budgets of narrow rows (1.5x the raw
// bytes, hash_table_test) still hold. Ready spare slabs are resident
// memory and are counted by bytes() (hence memory_bytes()); a slab the worker
// is still mapping is not.
//
// Preallocation (TableOptions::preallocate). Preallocate(bytes) maps and
// faults in enough slabs for `bytes` of chunks at once, on the caller's
// thread, and keeps them for NewSlab, which takes them before any spare or
// fresh mapping; chunks then come from slabs from the first one on (no
// one-by-one chunks below the slab threshold). They are resident memory,
// counted by bytes(), and released with the rest by ReleaseAll.
class ChunkSource {
 public:
  static constexpr size_t kMaxSpareSlabs = 8;

  ChunkSource(size_t chunk_bytes, size_t slab_threshold_bytes, bool huge_pages, bool prefault)
      : chunk_bytes_(chunk_bytes),
        chunks_per_slab_((kHugePageBytes + chunk_bytes - 1) / chunk_bytes),
        slab_threshold_bytes_(slab_threshold_bytes),
        huge_pages_(huge_pages),
        prefault_(prefault) {}
  ~ChunkSource() { ReleaseAll(); }
  ChunkSource(const ChunkSource&) = delete;
  ChunkSource& operator=(const ChunkSource&) = delete;

  // Thread-safe: shards allocate under their own locks. Throws
  // OutOfMemoryError (or std::bad_alloc) with nothing changed.
  char* Allocate() {
    std::lock_guard<std::mutex> lock(mu_);
    if (slab_left_ == 0 && (bytes_ >= slab_threshold_bytes_ || preallocate_)) NewSlab();
    if (slab_left_ > 0) {
      char* chunk = slab_next_;
      slab_next_ += chunk_bytes_;
      --slab_left_;
      return chunk;
    }
    MakeRoomForOne(single_chunks_);  // may throw; then nothing to undo
    char* chunk = static_cast<char*>(std::aligned_alloc(64, RoundUp(chunk_bytes_, 64)));
    if (chunk == nullptr) ThrowOutOfMemory("cannot allocate rows, bytes requested", chunk_bytes_);
    single_chunks_.push_back(chunk);
    bytes_ += RoundUp(chunk_bytes_, 64);
    return chunk;
  }

  // Makes slabs for `bytes` of chunks resident now, best effort: stops at
  // the first slab the OS refuses (the table then grows on demand past what
  // was had). Called before the source hands out any chunk.
  void Preallocate(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    TFEXT_DCHECK(bytes_ == 0 && slabs_.empty() && single_chunks_.empty(), "preallocation comes before any chunk");
    const size_t slabs = (bytes + chunks_per_slab_ * chunk_bytes_ - 1) / (chunks_per_slab_ * chunk_bytes_);
    try {
      preallocated_.reserve(slabs);
      for (size_t i = 0; i < slabs; ++i) {
        const Slab slab = MapResidentSlab(SlabBytes(), huge_pages_);
        if (slab.base == nullptr) break;
        preallocated_.push_back(slab);
      }
    } catch (const std::bad_alloc&) {
      // best effort: keep what was had
    }
    preallocated_.shrink_to_fit();  // bytes() counts the vector: only what was had
    preallocate_ = !preallocated_.empty();
    // Taken from the back: hand the slabs out in address order.
    std::reverse(preallocated_.begin(), preallocated_.end());
  }

  // Frees every chunk and every spare slab. The caller guarantees no shard
  // references a chunk.
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (char* chunk : single_chunks_) std::free(chunk);
    std::vector<char*>().swap(single_chunks_);
    for (const Slab& slab : slabs_) munmap(slab.base, slab.bytes);
    std::vector<Slab>().swap(slabs_);
    DropPreallocatedLocked();
    preallocate_ = false;  // the caller preallocates again if it wants to
    slab_next_ = nullptr;
    slab_left_ = 0;
    bytes_ = 0;
    spares_suspended_ = false;
    DropSparesLocked();  // a cleared table starts a new spare pool as it grows
  }

  // Bytes held, bookkeeping and ready spare slabs included.
  int64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t spare_bytes = preallocated_.size() * SlabBytes() + preallocated_.capacity() * sizeof(Slab);
    if (spare_ != nullptr) {
      std::lock_guard<std::mutex> spare_lock(spare_->mu);
      for (const Slab& slab : spare_->ready) spare_bytes += slab.bytes;
      spare_bytes += spare_->ready.capacity() * sizeof(Slab);
    }
    return static_cast<int64_t>(bytes_ + spare_bytes + single_chunks_.capacity() * sizeof(char*) +
                                slabs_.capacity() * sizeof(Slab));
  }

  // After an allocation failed: unmaps the unused preallocated and the ready spare slabs, lets the
  // requests in flight unmap theirs, and makes no more requests until the
  // table is cleared. Spares are an optimization, and a process out of memory
  // needs every byte back: what a failed allocation leaves free must not be
  // taken by the worker (the next allocation, maybe TensorFlow's own, would
  // fail too).
  void GiveBackSpares() {
    std::lock_guard<std::mutex> lock(mu_);
    spares_suspended_ = true;
    DropSparesLocked();
    DropPreallocatedLocked();
  }

  // Unmaps the preallocated slabs not used yet. Needs mu_.
  void DropPreallocatedLocked() {
    for (const Slab& slab : preallocated_) munmap(slab.base, slab.bytes);
    std::vector<Slab>().swap(preallocated_);
  }

  // Unmaps the ready spare slabs and detaches the pool: requests in flight
  // unmap their slab when they finish. Needs mu_.
  void DropSparesLocked() {
    if (spare_ == nullptr) return;
    std::lock_guard<std::mutex> spare_lock(spare_->mu);
    for (const Slab& slab : spare_->ready) munmap(slab.base, slab.bytes);
    std::vector<Slab>().swap(spare_->ready);
    spare_->abandoned = true;
    spare_.reset();
  }

  // For tests: spare slabs ready now and requested (queued or being made),
  // and slabs taken from the spares so far.
  void SpareStats(int64_t* ready, int64_t* pending, int64_t* taken) const {
    std::lock_guard<std::mutex> lock(mu_);
    *ready = 0;
    *pending = 0;
    if (spare_ != nullptr) {
      std::lock_guard<std::mutex> spare_lock(spare_->mu);
      *ready = static_cast<int64_t>(spare_->ready.size());
      *pending = spare_->pending;
    }
    *taken = spare_slabs_taken_;
  }

 private:
  size_t SlabBytes() const { return RoundUp(chunks_per_slab_ * chunk_bytes_, kPageBytes); }

  void NewSpare() {
    try {
      spare_ = std::make_shared<SpareSlabs>();
      spare_->slab_bytes = SlabBytes();
      spare_->huge_pages = huge_pages_;
    } catch (const std::bad_alloc&) {
      spare_.reset();
    }
  }

  void NewSlab() {
    MakeRoomForOne(slabs_);  // may throw; then nothing to undo
    Slab slab{nullptr, 0};
    if (!preallocated_.empty()) {
      slab = preallocated_.back();
      preallocated_.pop_back();
    } else if (spare_ != nullptr) {
      std::lock_guard<std::mutex> spare_lock(spare_->mu);
      if (!spare_->ready.empty()) {
        slab = spare_->ready.back();
        spare_->ready.pop_back();
        ++spare_slabs_taken_;
      }
    }
    if (slab.base == nullptr) slab = MapSlab(SlabBytes(), huge_pages_);
    slabs_.push_back(slab);
    slab_next_ = static_cast<char*>(slab.base);
    slab_left_ = chunks_per_slab_;
    bytes_ += slab.bytes;
    RequestSpares();
  }

  // Tops the spares up to the cap (see the class comment). Never throws: a
  // request that cannot be queued is simply not made.
  void RequestSpares() {
    // Preallocated slabs are resident already: no spares while some are left.
    if (!prefault_ || spares_suspended_ || !preallocated_.empty()) return;
    if (spare_ == nullptr) NewSpare();
    if (spare_ == nullptr) return;
    const size_t cap = std::min(kMaxSpareSlabs, slabs_.size() / 16);
    for (;;) {
      {
        std::lock_guard<std::mutex> spare_lock(spare_->mu);
        if (spare_->ready.size() + static_cast<size_t>(spare_->pending) >= cap) return;
        ++spare_->pending;
      }
      if (!PrefaultWorker::Get().Request(spare_)) {
        std::lock_guard<std::mutex> spare_lock(spare_->mu);
        --spare_->pending;
        return;
      }
    }
  }

  const size_t chunk_bytes_;
  const size_t chunks_per_slab_;
  const size_t slab_threshold_bytes_;
  const bool huge_pages_;
  const bool prefault_;
  mutable std::mutex mu_;
  std::vector<char*> single_chunks_;
  std::vector<Slab> slabs_;
  std::vector<Slab> preallocated_;  // resident, not yet used (Preallocate)
  bool preallocate_ = false;        // slabs from the first chunk on
  char* slab_next_ = nullptr;
  size_t slab_left_ = 0;
  size_t bytes_ = 0;
  // Null without prefaulting. Shared with the worker's queue (SpareSlabs).
  std::shared_ptr<SpareSlabs> spare_;
  int64_t spare_slabs_taken_ = 0;
  bool spares_suspended_ = false;  // see GiveBackSpares
};

uint64_t NextPow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

ParallelFor InlineParallelFor() {
  return [](int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
    if (total > 0) fn(0, total);
  };
}

std::string ValidateOptions(const TableOptions& options) {
  char buf[256];
  if (options.width < 1) {
    std::snprintf(buf, sizeof(buf), "width must be >= 1, got %lld", static_cast<long long>(options.width));
    return buf;
  }
  if (options.width > kMaxWidth) {
    std::snprintf(buf, sizeof(buf), "width must be <= %lld, got %lld", static_cast<long long>(kMaxWidth),
                  static_cast<long long>(options.width));
    return buf;
  }
  if (options.compact_cols < 0 || options.compact_cols > options.width) {
    std::snprintf(buf, sizeof(buf), "compact_cols must be in [0, width=%lld], got %lld",
                  static_cast<long long>(options.width), static_cast<long long>(options.compact_cols));
    return buf;
  }
  if (static_cast<int32_t>(options.storage) < 0 || static_cast<int32_t>(options.storage) > 3) {
    std::snprintf(buf, sizeof(buf), "storage must be a RowStorage, got %d", static_cast<int>(options.storage));
    return buf;
  }
  if (options.storage == RowStorage::kInt8Row && options.rounding != Rounding::kNearest) {
    return "int8 rows round to nearest only (rounding must be kNearest)";
  }
  if (options.initial_capacity < 0) {
    std::snprintf(buf, sizeof(buf), "initial_capacity must be >= 0, got %lld",
                  static_cast<long long>(options.initial_capacity));
    return buf;
  }
  if (options.initial_capacity > kMaxCapacity) {
    std::snprintf(buf, sizeof(buf), "initial_capacity must be <= 2^%d (%lld), got %lld", kMaxCapacityLog2,
                  static_cast<long long>(kMaxCapacity), static_cast<long long>(options.initial_capacity));
    return buf;
  }
  if (options.shard_bits < -1 || options.shard_bits > kMaxShardBits) {
    std::snprintf(buf, sizeof(buf), "shard_bits must be -1 (auto) or in [0, %d], got %d", kMaxShardBits,
                  options.shard_bits);
    return buf;
  }
  // Written so that NaN fails too.
  if (!(options.max_load_factor > 0.0 && options.max_load_factor <= kMaxLoadFactorLimit)) {
    std::snprintf(buf, sizeof(buf), "max_load_factor must be in (0, %.2f], got %g", kMaxLoadFactorLimit,
                  options.max_load_factor);
    return buf;
  }
  return "";
}

namespace {

// One shard: a lock, an index and the table of its arena chunks (the chunks
// come from the table's ChunkSource). Aligned so that two shards' locks never
// share a cache line.
struct alignas(64) Shard {
  mutable std::shared_mutex mu;
  uint64_t* slots = g_empty_index;
  uint64_t mask = 0;
  uint64_t capacity = 0;      // 0: no index allocated (slots = g_empty_index)
  uint64_t grow_at = 0;       // the index doubles before holding more keys than this
  bool slots_mapped = false;  // slots is a mapping (see AllocateIndexMemory)
  std::atomic<int64_t> size{0};
  std::vector<char*> chunks;
  // chunks.data() + the number of small chunks - 1 (Impl::SyncChunks): the
  // full chunk of rows [k * 2^chunk_shift, (k+1) * 2^chunk_shift) is
  // full_chunks[k], k >= 1, found without an add on the lookup path.
  char** full_chunks = nullptr;
  uint64_t rows_handed_out = 0;  // row ids [0, rows_handed_out) have been used
  uint32_t free_head = 0;        // first free row id + 1 (0: free list empty)
};
static_assert(sizeof(Shard) % 64 == 0,
              "shards sit in an array: each must fill whole cache lines so that two shards' "
              "locks never share one (writers of different shards would contend)");

// Keys of a batch bucketed by shard: entries [begin[s], begin[s+1]) belong to
// shard s, in batch order (the counting sort is stable).
struct ShardPlan {
  std::unique_ptr<uint64_t[]> hash;
  std::unique_ptr<int64_t[]> index;
  std::vector<int64_t> begin;
};

}  // namespace

struct HashTable::Impl {
  explicit Impl(const TableOptions& opts);
  ~Impl();

  // ---- layout ----
  TableOptions options;
  int64_t width;
  size_t values_offset = kValuesOffset;  // row = [key | values | version | frequency]
  size_t version_offset;
  size_t frequency_offset;
  size_t stride;  // RowBytes(values_bytes)
  // Compact rows (TableOptions::storage): the values are the compact area
  // of columns [0, compact_cols) in `storage`, then float32 columns from
  // floats_offset on. compact is false for plain float32 rows (kFloat32 or
  // compact_cols 0): then values are width floats and compact_cols is 0.
  bool compact;
  RowStorage storage;
  int64_t compact_cols;
  size_t values_bytes;   // ValuesBytes(storage, compact_cols, width)
  size_t floats_offset;  // values_offset + CompactBytes(storage, compact_cols)
  // Chunks: a shard's rows [0, 2^chunk_shift) are in small chunks of
  // 2^first_chunk_shift rows, then doubling (see kFirstChunkRows); every
  // chunk after them holds 2^chunk_shift rows (chunk_bytes). Without small
  // chunks (preallocate), first_chunk_shift == chunk_shift.
  // (Ordered to fill the padding: the floor of a table counts sizeof(Impl).)
  int chunk_shift;
  int first_chunk_shift;
  size_t chunk_bytes;
  uint32_t first_chunk_mask;  // 2^first_chunk_shift - 1, >= 1
  int shard_bits;
  int shard_shift;  // hash >> shard_shift = shard (unused when shard_bits = 0)
  int64_t num_shards;
  uint64_t initial_keys_per_shard;
  std::unique_ptr<Shard[]> shards;
  std::unique_ptr<ChunkSource> chunk_source;
  bool huge_pages = true;  // resolved from the options and the environment
  // Bumped under every shard's write lock by Replace and Clear: a reader of
  // several blocks that sees it change was overtaken and reads again.
  std::atomic<uint64_t> generation{0};
  // Changes whenever a row may be freed or its memory released: every row a
  // removal frees (under the row's shard lock), Clear and Replace (under
  // every shard lock). Row references (UpdateRows) taken while it had one
  // value are exact while it keeps it: rows never move otherwise.
  mutable std::atomic<uint64_t> removal_epoch{0};

  // ---- addressing ----
  int64_t ShardIndex(uint64_t hash) const { return shard_bits == 0 ? 0 : static_cast<int64_t>(hash >> shard_shift); }
  Shard& ShardFor(uint64_t hash) const { return shards[ShardIndex(hash)]; }
  // The chunk that holds row `id`. Past the first 2^chunk_shift rows (every
  // row but a few of a large table: a well-predicted branch), one chunk per
  // 2^chunk_shift rows, numbered on from the small ones. Below, chunk 0 for
  // ids below 2^first_chunk_shift, else bit_width(id) - first_chunk_shift
  // (chunk sizes double); the | gives the first chunk's ids its bit width
  // (and __builtin_clz a nonzero argument).
  uint64_t ChunkOf(uint64_t id) const {
    const uint64_t full = id >> chunk_shift;
    if (__builtin_expect(full != 0, 1)) return full + static_cast<uint64_t>(chunk_shift - first_chunk_shift);
    return static_cast<uint64_t>(32 - first_chunk_shift - __builtin_clz(static_cast<uint32_t>(id) | first_chunk_mask));
  }
  // The first row id of chunk c (c may be one past the last: then the end of
  // the rows the chunk table covers), and the rows chunk c holds.
  uint64_t ChunkStart(uint64_t c) const {
    if (IsSmallChunk(c)) return c == 0 ? 0 : uint64_t{1} << (first_chunk_shift + c - 1);
    return (c - static_cast<uint64_t>(chunk_shift - first_chunk_shift)) << chunk_shift;
  }
  uint64_t ChunkRows(uint64_t c) const { return ChunkStart(c + 1) - ChunkStart(c); }
  // Chunks before the first full one: chunk_shift - first_chunk_shift + 1, or 0.
  bool IsSmallChunk(uint64_t c) const {
    return first_chunk_shift < chunk_shift && c <= static_cast<uint64_t>(chunk_shift - first_chunk_shift);
  }
  size_t SmallChunkBytes(uint64_t c) const { return ChunkRows(c) * stride; }
  // s.chunks[c] holds chunk c's memory minus ChunkStart(c) rows, so that a
  // row is one add away whatever its chunk's size.
  static char* BiasChunk(char* memory, uint64_t start, size_t stride) {
    return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(memory) - start * stride);
  }
  char* ChunkMemory(const Shard& s, uint64_t c) const {
    return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(s.chunks[c]) + ChunkStart(c) * stride);
  }
  // After every change to s.chunks' buffer (push_back, reserve, swap).
  void SyncChunks(Shard& s) const {
    s.full_chunks = reinterpret_cast<char**>(reinterpret_cast<uintptr_t>(s.chunks.data()) +
                                             static_cast<uintptr_t>(chunk_shift - first_chunk_shift) * sizeof(char*));
  }
  char* Row(const Shard& s, uint32_t id) const {
    TFEXT_DCHECK(id < s.rows_handed_out, "row id out of the arena (I3, I5)");
    TFEXT_DCHECK(s.chunks.empty() || s.full_chunks == s.chunks.data() + (chunk_shift - first_chunk_shift),
                 "full_chunks follows the chunk table (SyncChunks)");
    const uint64_t full = id >> chunk_shift;
    const char* chunk = __builtin_expect(full != 0, 1) ? s.full_chunks[full] : s.chunks[ChunkOf(id)];
    return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(chunk) + static_cast<uintptr_t>(id) * stride);
  }
  // The width floats of a plain row (compact rows go through ReadColumns /
  // WriteColumns).
  float* Values(char* row) const {
    TFEXT_DCHECK(!compact, "only a plain row's values are floats");
    return reinterpret_cast<float*>(row + values_offset);
  }
  const float* Values(const char* row) const {
    TFEXT_DCHECK(!compact, "only a plain row's values are floats");
    return reinterpret_cast<const float*>(row + values_offset);
  }
  KeyMeta LoadMeta(const char* row) const {
    KeyMeta m;
    m.version = LoadI64(row + version_offset);
    m.frequency = LoadU32(row + frequency_offset);
    return m;
  }
  void StoreMeta(char* row, const KeyMeta& m) const {
    StoreI64(row + version_offset, m.version);
    StoreU32(row + frequency_offset, m.frequency);
  }
  // The per-call metadata update shared by the write ops.
  void TouchMeta(char* row, bool count, int64_t version) const {
    if (count) {
      uint32_t f = LoadU32(row + frequency_offset);
      if (f != std::numeric_limits<uint32_t>::max()) StoreU32(row + frequency_offset, f + 1);
    }
    if (version >= 0) StoreI64(row + version_offset, version);
  }
  // Metadata of a freshly inserted row.
  void InitMeta(char* row, bool count, int64_t version) const {
    StoreI64(row + version_offset, version >= 0 ? version : 0);
    StoreU32(row + frequency_offset, count ? 1 : 0);
  }

  // ---- columns ----
  // Every read and write of a row's values goes through ReadColumns and
  // WriteColumns (and InitValues for a new row's defaults): plain rows are
  // copied, compact rows are decoded and encoded (row_codec.h). The plain
  // branch comes first and inline, so float32 tables run the same copies as
  // before compact rows existed.
  //
  // Reads columns [c0, c0 + n) of the row into dst as float32.
  void ReadColumns(const char* row, int64_t c0, int64_t n, float* dst) const {
    if (__builtin_expect(!compact, 1)) {
      CopyFloats(dst, Values(row) + c0, n);
      return;
    }
    ReadCompactColumns(row, c0, n, dst);
  }
  // Writes src into columns [c0, c0 + n) of the row. Compact columns round
  // with `rounding`, stochastic rounding seeded by the row's key and the
  // version stored in the row: so a writer stores the metadata first.
  void WriteColumns(char* row, int64_t c0, int64_t n, const float* src, Rounding rounding) const {
    if (__builtin_expect(!compact, 1)) {
      CopyFloats(Values(row) + c0, src, n);
      return;
    }
    EncodeColumns(row + values_offset, c0, n, src, rounding, LoadI64(row), LoadI64(row + version_offset));
  }
  void ReadCompactColumns(const char* row, int64_t c0, int64_t n, float* dst) const;
  // Encodes src into columns [c0, c0 + n) of a values area (a row's, or a
  // default row's image). An int8 row is quantized as a whole: a write of
  // part of its compact columns decodes the others and encodes them again.
  void EncodeColumns(char* values, int64_t c0, int64_t n, const float* src, Rounding rounding, int64_t key,
                     int64_t version) const;
  // Bytes [*first, *end) of a row that columns [c0, c0 + max(n, 1)) take
  // (an int8 column needs its row's scale and bias: the whole compact area).
  void ColumnBytes(int64_t c0, int64_t n, size_t* first, size_t* end) const;

  // The values of a new row: column_defaults (width floats; null means
  // zeros) as the row stores them, rounded to nearest. Made once per batch.
  struct DefaultValues {
    const void* bytes = nullptr;  // values_bytes bytes, or null: all-zero bytes (zeros in every storage)
    std::vector<char> encoded;    // the compact image, when column_defaults is given for a compact table
  };
  void MakeDefaultValues(const float* column_defaults, DefaultValues* defaults) const {
    if (!compact || column_defaults == nullptr) {
      defaults->bytes = column_defaults;
      return;
    }
    defaults->encoded.assign(values_bytes, 0);
    EncodeColumns(defaults->encoded.data(), 0, width, column_defaults, Rounding::kNearest, 0, 0);
    defaults->bytes = defaults->encoded.data();
  }
  void InitValues(char* row, const DefaultValues& defaults) const {
    if (defaults.bytes != nullptr) {
      std::memcpy(row + values_offset, defaults.bytes, values_bytes);
    } else {
      std::memset(row + values_offset, 0, values_bytes);
    }
  }
  // Runs fn (Update's callback) on the row's width floats and stores the
  // metadata fn leaves. A compact row is decoded into a per-thread scratch
  // row, which is encoded back with the table's rounding, seeded by the
  // version fn set.
  void ApplyToRow(char* row, int64_t i, KeyMeta* meta, const std::function<void(int64_t, float*, KeyMeta*)>& fn) const {
    if (__builtin_expect(!compact, 1)) {
      fn(i, Values(row), meta);
      StoreMeta(row, *meta);
      return;
    }
    const ScratchRow scratch(Scratch::kRow, static_cast<size_t>(width));
    ReadCompactColumns(row, 0, width, scratch.data());
    fn(i, scratch.data(), meta);
    StoreMeta(row, *meta);
    WriteColumns(row, 0, width, scratch.data(), options.rounding);
  }
  // FindOrInsertWith (hash_table.h), the init's columns of new rows rounded
  // with `init_rounding` (FindOrInsert's init_rows: to nearest).
  void FindOrInsertWith(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const InitRows& init,
                        const float* column_defaults, float* out, bool* inserted, bool count, int64_t version,
                        const ParallelFor& pf, uint64_t* refs, Rounding init_rounding) const;

  uint64_t GrowAt(uint64_t capacity) const {
    TFEXT_DCHECK(IsPowerOfTwo(capacity), "index capacities are powers of two (I1)");
    uint64_t g = static_cast<uint64_t>(static_cast<double>(capacity) * options.max_load_factor);
    return std::min(g, capacity - 1);  // always keep an empty slot: probes terminate
  }
  uint64_t IndexCapacityFor(uint64_t keys) const {
    if (keys == 0) return 0;
    uint64_t cap = kMinIndexCapacity;
    while (GrowAt(cap) < keys) cap <<= 1;
    TFEXT_DCHECK(IsPowerOfTwo(cap) && GrowAt(cap) >= keys, "an index sized for keys holds them below its load (I2)");
    return cap;
  }
  // Keys the fullest shard is expected to hold when the table holds `total`:
  // the mean plus a margin of a few standard deviations of the binomial.
  uint64_t KeysPerShardFor(int64_t total) const {
    if (total <= 0) return 0;
    double mean = static_cast<double>(total) / static_cast<double>(num_shards);
    if (num_shards == 1) return static_cast<uint64_t>(total);
    return static_cast<uint64_t>(mean + 4.0 * std::sqrt(mean) + 8.0);
  }

  // ---- index ----
  // `lazy`: the new index is for keys still to come (see AllocateIndexMemory).
  void RehashIndex(Shard& s, uint64_t new_capacity, bool lazy = false) const;
  void EnsureIndexFor(Shard& s, uint64_t keys, bool lazy = false) const {
    if (keys > s.grow_at) RehashIndex(s, IndexCapacityFor(keys), lazy);
  }
  void ReleaseShard(Shard& s) const;
  // Sizes the shard's index for initial_keys_per_shard keys, best effort.
  void PresizeShard(Shard& s) const;
  // With options.preallocate: makes the index and the rows of
  // initial_capacity keys resident now, best effort (see TableOptions).
  // Needs every shard's write lock, or no other user of the table.
  void Preallocate() const;

  // Finds key in the shard: returns its row (or nullptr) and sets *pos to its
  // slot (or to the empty slot that ends the probe).
  char* Probe(const Shard& s, int64_t key, uint32_t tag, uint64_t* pos) const {
    return ProbeFrom(s, key, tag, tag & s.mask, pos);
  }
  // Probe that starts at slot `start`, which must lie on the key's probe
  // sequence with no slot before it holding the key (see PrefetchRow).
  char* ProbeFrom(const Shard& s, int64_t key, uint32_t tag, uint64_t start, uint64_t* pos) const {
    TFEXT_DCHECK(start <= s.mask, "a probe starts inside the index");
    TFEXT_DCHECK(static_cast<uint64_t>(s.size.load(std::memory_order_relaxed)) <= s.grow_at || s.capacity == 0,
                 "an empty slot ends every probe (I2)");
    uint64_t steps = 0;  // counted in debug-check builds only
    uint64_t p = start;
    for (;;) {
      if constexpr (kDebugChecks) {
        ++steps;
        TFEXT_DCHECK(steps <= s.capacity + 1, "a probe went round the whole index without an empty slot (I2)");
      }
      const uint64_t slot = s.slots[p];
      if (slot == 0) {
        *pos = p;
        return nullptr;
      }
      if (SlotTag(slot) == tag) {
        char* row = Row(s, SlotRow(slot));
        if (LoadI64(row) == key) {
          *pos = p;
          return row;
        }
      }
      p = (p + 1) & s.mask;
    }
  }
  // Returns the key's row, adding a row (key set, everything else for the
  // caller to initialize) when absent. Needs the shard's write lock.
  // Sets *id (if given) to the row's id.
  char* FindOrAddRow(Shard& s, int64_t key, uint32_t tag, bool* added, uint32_t* id_out = nullptr) const {
    uint64_t pos;
    char* row = Probe(s, key, tag, &pos);
    if (row != nullptr) {
      *added = false;
      if (id_out != nullptr) *id_out = SlotRow(s.slots[pos]);
      return row;
    }
    const uint64_t new_size = static_cast<uint64_t>(s.size.load(std::memory_order_relaxed)) + 1;
    if (new_size > s.grow_at) {
      RehashIndex(s, std::max(s.capacity * 2, IndexCapacityFor(new_size)));
      pos = tag & s.mask;
      while (s.slots[pos] != 0) pos = (pos + 1) & s.mask;
    }
    // The key goes into the first empty slot from its home: with no gap
    // before it, a later probe finds it (I4); growth came first, so the
    // index keeps an empty slot after it (I2).
    TFEXT_DCHECK(s.slots[pos] == 0 && new_size <= s.grow_at, "insertion needs an empty slot below the load (I2)");
    const uint32_t id = AllocateRow(s);
    row = Row(s, id);
    StoreI64(row, key);
    s.slots[pos] = MakeSlot(tag, id);
    s.size.store(static_cast<int64_t>(new_size), std::memory_order_relaxed);
    *added = true;
    if (id_out != nullptr) *id_out = id;
    return row;
  }
  // Removes the entry in slot `pos` (backward-shift deletion).
  void EraseAt(Shard& s, uint64_t pos) const;
  bool EraseKey(Shard& s, int64_t key, uint32_t tag) const {
    uint64_t pos;
    if (Probe(s, key, tag, &pos) == nullptr) return false;
    EraseAt(s, pos);
    return true;
  }

  // ---- arena ----
  uint32_t AllocateRow(Shard& s) const {
    if (s.free_head != 0) {
      const uint32_t id = s.free_head - 1;
      TFEXT_DCHECK(id < s.rows_handed_out, "the free list holds only rows handed out before (I5)");
      s.free_head = LoadU32(Row(s, id));  // a free row stores the next free id + 1
      return id;
    }
    if (s.rows_handed_out >= kMaxRowsPerShard) {
      ThrowOutOfMemory("a shard is full (too many keys for one shard: use more shards), rows", s.rows_handed_out);
    }
    const uint64_t id = s.rows_handed_out;
    const uint64_t c = ChunkOf(id);
    if (c >= s.chunks.size()) {
      TFEXT_DCHECK(c == s.chunks.size() && ChunkStart(c) == id,
                   "rows are handed out in order, so a new chunk is needed only at the start of the next one (I5)");
      // Room in the chunk table first, then the chunk: a failure in either
      // leaves the shard as it was.
      MakeRoomForOne(s.chunks);
      char* memory;
      if (IsSmallChunk(c)) {
        memory = static_cast<char*>(std::aligned_alloc(kSmallChunkAlignment, SmallChunkBytes(c)));
        if (memory == nullptr) ThrowOutOfMemory("cannot allocate rows, bytes requested", SmallChunkBytes(c));
      } else {
        memory = chunk_source->Allocate();
      }
      s.chunks.push_back(BiasChunk(memory, id, stride));
      SyncChunks(s);
    }
    TFEXT_DCHECK(ChunkOf(id) < s.chunks.size(), "the chunk table covers every row handed out (I5)");
    ++s.rows_handed_out;
    return static_cast<uint32_t>(id);
  }
  void FreeRow(Shard& s, uint32_t id) const {
    TFEXT_DCHECK(id < s.rows_handed_out, "only a row handed out can be freed (I5)");
    StoreU32(Row(s, id), s.free_head);
    s.free_head = id + 1;
    removal_epoch.fetch_add(1, std::memory_order_relaxed);  // under s's lock: see UpdateRows
  }

  // ---- prefetching ----
  void PrefetchSlot(const Shard& s, uint64_t hash) const { PrefetchLineL2(&s.slots[TagOf(hash) & s.mask]); }
  // Looks for the key's tag in the first slots of its probe (which an earlier
  // PrefetchSlot brought in) and prefetches the row's key line and the lines
  // of bytes [first, end) of the row. A hint only: never wrong, at worst idle.
  // Returns where a probe for the key may resume: the matching slot, the
  // empty slot that ends the probe, or the first slot not looked at.
  // If `candidate` is given, it is set to the row of the matching slot (or
  // nullptr): the row the key most likely lives in.
  uint64_t PrefetchRow(const Shard& s, uint64_t hash, size_t first, size_t end,
                       const char** candidate = nullptr) const {
    const uint32_t tag = TagOf(hash);
    uint64_t p = tag & s.mask;
    if (candidate != nullptr) *candidate = nullptr;
    for (int step = 0; step < 4; ++step) {
      const uint64_t slot = s.slots[p];
      if (slot == 0) return p;
      if (SlotTag(slot) == tag) {
        const char* row = Row(s, SlotRow(slot));
        if (candidate != nullptr) *candidate = row;
        const uintptr_t base = reinterpret_cast<uintptr_t>(row);
        uintptr_t line = base & ~uintptr_t{63};
        const uintptr_t first_line = (base + first) & ~uintptr_t{63};
        const uintptr_t last_line = (base + end - 1) & ~uintptr_t{63};
        if (line < first_line) PrefetchLineL2(reinterpret_cast<const void*>(line));
        for (line = first_line; line <= last_line; line += 64) {
          PrefetchLineL2(reinterpret_cast<const void*>(line));
        }
        return p;
      }
      p = (p + 1) & s.mask;
    }
    return p;
  }

  // ---- batch drivers ----
  ShardPlan Bucket(const int64_t* keys, int64_t n, const ParallelFor& pf) const;

  // Runs op(shard, key_index, hash) for every key, shard by shard under the
  // shard's write lock, in batch order within a shard, rows prefetched, and
  // after_shard(shard) after a shard's last key, still under its lock.
  // Within a shard the keys come in bucketed order, so the caller's per-key
  // input/output rows are random accesses too: prefetch_io(key_index) is
  // called a few keys ahead to prefetch them.
  struct NothingAfterShard {
    void operator()(Shard&) const {}
  };
  template <typename PrefetchIo, typename Op, typename AfterShard = NothingAfterShard>
  void ForEachKeyExclusive(const int64_t* keys, int64_t n, const ParallelFor& pf, const PrefetchIo& prefetch_io,
                           const Op& op, const AfterShard& after_shard = AfterShard()) const {
    if (n <= 0) return;
    const ShardPlan plan = Bucket(keys, n, pf);
    auto run_shards = [&](int64_t first_shard, int64_t end_shard) {
      for (int64_t si = first_shard; si < end_shard; ++si) {
        const int64_t b = plan.begin[si], e = plan.begin[si + 1];
        if (b == e) continue;
        Shard& s = shards[si];
        std::unique_lock<std::shared_mutex> lock(s.mu);
        try {
          for (int64_t j = b; j < e; ++j) {
            if (j + kSlotAhead < e) PrefetchSlot(s, plan.hash[j + kSlotAhead]);
            if (j + kRowAhead < e) {
              PrefetchRow(s, plan.hash[j + kRowAhead], 0, stride);
              prefetch_io(plan.index[j + kRowAhead]);
            }
            op(s, plan.index[j], plan.hash[j]);
          }
        } catch (...) {
          // A key that failed (out of memory) must not leave the shard's
          // earlier keys unfinished: after_shard still runs for them.
          try {
            after_shard(s);
          } catch (...) {
          }
          throw;
        }
        after_shard(s);
      }
    };
    try {
      RunParallel(n >= kSerialBatch, pf, num_shards, run_shards);  // FindOrInsertWith relies on this rule
    } catch (const std::bad_alloc&) {
      // Out of memory: the prefaulted spares go back first (every shard lock
      // is released here; Replace swaps chunk_source under shard 0's lock too).
      std::shared_lock<std::shared_mutex> lock(shards[0].mu);
      chunk_source->GiveBackSpares();
      throw;
    }
  }

  // Runs visit(key_index, row or nullptr) for keys [begin, end) in order.
  // The caller holds every shard's read lock. [first, end_byte) is the part
  // of the row visit will read (prefetched with the key).
  template <typename Visit>
  void VisitKeysShared(const int64_t* keys, int64_t begin, int64_t end, size_t first_byte, size_t end_byte,
                       const Visit& visit) const {
    // Per key in flight: its hash, then where its probe resumes. Nothing
    // moves under the read locks, so the slots PrefetchRow already looked at
    // need not be read again.
    uint64_t ring_hash[kHashRing];
    uint64_t ring_resume[kHashRing];
    const char* ring_row[kHashRing];
    auto stage_slot = [&](int64_t j) {
      const uint64_t h = ProbeHash(keys[j]);
      ring_hash[j & (kHashRing - 1)] = h;
      PrefetchSlot(ShardFor(h), h);
    };
    auto stage_row = [&](int64_t j) {
      const uint64_t h = ring_hash[j & (kHashRing - 1)];
      ring_resume[j & (kHashRing - 1)] =
          PrefetchRow(ShardFor(h), h, first_byte, end_byte, &ring_row[j & (kHashRing - 1)]);
    };
    const int64_t warm_slots = std::min(end, begin + kSlotAhead);
    for (int64_t j = begin; j < warm_slots; ++j) stage_slot(j);
    const int64_t warm_rows = std::min(end, begin + kRowAhead);
    for (int64_t j = begin; j < warm_rows; ++j) stage_row(j);
    for (int64_t j = begin; j < end; ++j) {
      if (j + kSlotAhead < end) stage_slot(j + kSlotAhead);
      if (j + kRowAhead < end) stage_row(j + kRowAhead);
      // Most keys are in the candidate row PrefetchRow found: check it
      // directly; else (absent key, tag collision, long probe) resume the
      // probe where PrefetchRow stopped.
      const int64_t r = j & (kHashRing - 1);
      const char* row = ring_row[r];
      if (row == nullptr || LoadI64(row) != keys[j]) {
        const uint64_t h = ring_hash[r];
        uint64_t pos;
        row = ProbeFrom(ShardFor(h), keys[j], TagOf(h), ring_resume[r], &pos);
      }
      visit(j, row);
    }
  }

  // Runs read(begin, end) over blocks of the batch through pf, each block
  // under the read locks of the shards its keys fall in: all shards for big
  // blocks, only the needed ones for small batches (a single-key lookup
  // must not pay for hundreds of locks on a many-core machine). Locks are
  // always taken in shard order.
  template <typename Read>
  void ForEachBlockShared(const int64_t* keys, int64_t n, const ParallelFor& pf, const Read& read) const {
    if (n <= 0) return;
    auto run_blocks = [&](int64_t first_block, int64_t end_block) {
      const int64_t begin = first_block * kReadBlock;
      const int64_t end = std::min(n, end_block * kReadBlock);
      if (end - begin >= 4 * num_shards) {
        for (int64_t si = 0; si < num_shards; ++si) shards[si].mu.lock_shared();
        ScopeExit unlock([this] {
          for (int64_t si = num_shards - 1; si >= 0; --si) shards[si].mu.unlock_shared();
        });
        read(begin, end);
        return;
      }
      std::vector<int64_t> needed;
      needed.reserve(end - begin);
      for (int64_t i = begin; i < end; ++i) needed.push_back(ShardIndex(ProbeHash(keys[i])));
      std::sort(needed.begin(), needed.end());
      needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
      for (const int64_t si : needed) shards[si].mu.lock_shared();
      ScopeExit unlock([this, &needed] {
        for (auto it = needed.rbegin(); it != needed.rend(); ++it) shards[*it].mu.unlock_shared();
      });
      read(begin, end);
    };
    const int64_t blocks = (n + kReadBlock - 1) / kReadBlock;
    if (blocks == 1) {
      run_blocks(0, 1);
      return;
    }
    // The blocks run under separate lock acquisitions: a Replace or Clear
    // between two of them would mix the old contents and the new ones in one
    // batch. Such a batch is read again (the reads only write outputs); after
    // a few overtaken tries it is read under every shard's lock at once.
    for (int attempt = 0; attempt < 3; ++attempt) {
      const uint64_t before = generation.load(std::memory_order_seq_cst);
      RunParallel(pf, blocks, run_blocks);
      if (generation.load(std::memory_order_seq_cst) == before) return;
    }
    for (int64_t si = 0; si < num_shards; ++si) shards[si].mu.lock_shared();
    ScopeExit unlock([this] {
      for (int64_t si = num_shards - 1; si >= 0; --si) shards[si].mu.unlock_shared();
    });
    read(0, n);
  }

  // Swaps the contents (indexes, arenas, sizes) of this table and `other`,
  // which must have the same layout and shard count. The caller holds every
  // shard's write lock of both.
  void SwapContentsLocked(Impl& other) {
    removal_epoch.fetch_add(1, std::memory_order_relaxed);
    other.removal_epoch.fetch_add(1, std::memory_order_relaxed);
    for (int64_t si = 0; si < num_shards; ++si) {
      Shard& a = shards[si];
      Shard& b = other.shards[si];
      std::swap(a.slots, b.slots);
      std::swap(a.mask, b.mask);
      std::swap(a.capacity, b.capacity);
      std::swap(a.grow_at, b.grow_at);
      std::swap(a.slots_mapped, b.slots_mapped);
      const int64_t a_size = a.size.load(std::memory_order_relaxed);
      a.size.store(b.size.load(std::memory_order_relaxed), std::memory_order_relaxed);
      b.size.store(a_size, std::memory_order_relaxed);
      a.chunks.swap(b.chunks);
      std::swap(a.full_chunks, b.full_chunks);  // the same layout (Replace checks it)
      std::swap(a.rows_handed_out, b.rows_handed_out);
      std::swap(a.free_head, b.free_head);
    }
    // The rows live in the chunk sources: they move with the shards.
    chunk_source.swap(other.chunk_source);
    generation.fetch_add(1, std::memory_order_seq_cst);
    other.generation.fetch_add(1, std::memory_order_seq_cst);
  }
};

HashTable::Impl::Impl(const TableOptions& opts) : options(opts) {
  const std::string error = ValidateOptions(opts);
  if (!error.empty()) throw std::invalid_argument("tf_ext table: invalid options: " + error);
  width = opts.width;
  compact = opts.storage != RowStorage::kFloat32 && opts.compact_cols > 0;
  storage = compact ? opts.storage : RowStorage::kFloat32;
  compact_cols = compact ? opts.compact_cols : 0;
  values_bytes = ValuesBytes(storage, compact_cols, width);
  floats_offset = values_offset + static_cast<size_t>(CompactBytes(storage, compact_cols));
  version_offset = VersionOffset(values_bytes);
  frequency_offset = FrequencyOffset(values_bytes);
  stride = RowBytes(values_bytes);

  // Largest power-of-two row count whose chunk fits the target (at least 16).
  uint64_t rows = kMinChunkRows;
  while (rows * 2 * stride <= kTargetChunkBytes) rows *= 2;
  chunk_shift = 0;
  while ((uint64_t{1} << chunk_shift) < rows) ++chunk_shift;
  chunk_bytes = rows * stride;
  TFEXT_DCHECK(rows >= kMinChunkRows, "a full chunk holds more rows than the small ones");
  first_chunk_shift = opts.preallocate ? chunk_shift : 0;
  while (!opts.preallocate && (uint64_t{1} << first_chunk_shift) < kFirstChunkRows) ++first_chunk_shift;
  first_chunk_mask = static_cast<uint32_t>((uint64_t{1} << first_chunk_shift) - 1);
  // Slabs start once one partly used slab (< 2 MiB) is a small fraction of
  // the arena: for narrow rows, whose memory budget (1.5x the raw bytes with
  // the index included) is tight, only from 64 MiB on (< 3.2% slack); for
  // rows of 128 bytes and more, from 16 MiB on.
  const size_t slab_threshold = stride >= 128 ? (size_t{16} << 20) : (size_t{64} << 20);
  huge_pages = UseHugePages(opts.huge_pages);
  chunk_source.reset(new ChunkSource(chunk_bytes, slab_threshold, huge_pages, UsePrefault()));

  if (opts.shard_bits >= 0) {
    shard_bits = opts.shard_bits;
  } else {
    // Enough shards that writers on all hardware threads rarely meet on one
    // lock, few enough that per-shard slack (last index step, last chunk)
    // stays small: 8 per thread, at least 16, at most 256.
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    uint64_t wanted = std::min<uint64_t>(256, std::max<uint64_t>(16, NextPow2(8 * threads)));
    // Raised so that initial_capacity keys fit: a shard holds at most
    // min(GrowAt(2^32), kMaxRowsPerShard) keys; plan for half of that, so
    // that the fullest shard keeps room.
    const uint64_t shard_keys = std::min(GrowAt(kMaxIndexCapacity), kMaxRowsPerShard) / 2;
    const uint64_t capacity = static_cast<uint64_t>(opts.initial_capacity);
    wanted = std::max(wanted, NextPow2((capacity + shard_keys - 1) / std::max<uint64_t>(shard_keys, 1)));
    wanted = std::min<uint64_t>(wanted, uint64_t{1} << kMaxShardBits);
    shard_bits = 0;
    while ((uint64_t{1} << shard_bits) < wanted) ++shard_bits;
  }
  num_shards = int64_t{1} << shard_bits;
  shard_shift = 64 - shard_bits;
  shards.reset(new Shard[num_shards]);
  // A small initial_capacity pre-sizes nothing: the per-shard margin of
  // KeysPerShardFor (+8 keys and more) would make every shard's index several
  // times what its keys need (a restore of 2 keys, a staging table sized for
  // them, took 2 KiB of index over 16 shards), and an index that small grows
  // in a few cheap doublings.
  const int64_t presized = std::min<int64_t>(opts.initial_capacity, kMaxPresizedKeys);
  initial_keys_per_shard = presized < kMinPresizedKeysPerShard * num_shards ? 0 : KeysPerShardFor(presized);
  for (int64_t si = 0; si < num_shards; ++si) PresizeShard(shards[si]);
  Preallocate();
}

void HashTable::Impl::Preallocate() const {
  if (!options.preallocate || options.initial_capacity <= 0) return;
  const uint64_t keys_per_shard = KeysPerShardFor(options.initial_capacity);
  // What it takes: the index of each shard, the rows of initial_capacity keys
  // and each shard's partly used last chunk. Faulting memory in is not
  // refused by the OS the way a mapping is: past what the machine has, it
  // ends in the OOM killer. So nothing is preallocated beyond half of the
  // memory available now (a capacity typo must not take the machine).
  const long double index_bytes = static_cast<long double>(IndexCapacityFor(keys_per_shard)) * sizeof(uint64_t) *
                                  static_cast<long double>(num_shards);
  const long double rows_bytes =
      static_cast<long double>(options.initial_capacity) * stride + static_cast<long double>(num_shards) * chunk_bytes;
  const int64_t available = AvailableMemoryBytes();
  if (available < 0 || index_bytes + rows_bytes > static_cast<long double>(available) / 2) return;
  try {
    for (int64_t si = 0; si < num_shards; ++si) {
      Shard& s = shards[si];
      // Not capped at kMaxPresizedKeys: the caller asked for this memory.
      EnsureIndexFor(s, keys_per_shard, /*lazy=*/true);
      // A lazy index is a fresh mapping (or a written heap block): fault it in.
      if (s.slots_mapped && !PopulatePages(s.slots, s.capacity * sizeof(uint64_t))) break;
    }
  } catch (const std::bad_alloc&) {
    // best effort, as pre-sizing: the index grows on demand
  }
  chunk_source->Preallocate(static_cast<size_t>(rows_bytes));  // < available memory: fits a size_t
}

void HashTable::Impl::PresizeShard(Shard& s) const {
  // initial_capacity is a hint: if its memory cannot be had now, the shard
  // starts without an index and grows on demand (where a failure reaches the
  // writing operation).
  try {
    EnsureIndexFor(s, initial_keys_per_shard, /*lazy=*/true);
  } catch (const std::bad_alloc&) {
  }
}

HashTable::Impl::~Impl() {
  for (int64_t si = 0; si < num_shards; ++si) ReleaseShard(shards[si]);
}

void HashTable::Impl::ReleaseShard(Shard& s) const {
  if (s.capacity != 0) FreeIndexMemory(s.slots, s.capacity * sizeof(uint64_t), s.slots_mapped);
  s.slots = g_empty_index;
  s.slots_mapped = false;
  s.capacity = 0;
  s.mask = 0;
  s.grow_at = 0;
  // The small chunks are the shard's own; the full ones belong to chunk_source.
  for (uint64_t c = 0; c < s.chunks.size() && IsSmallChunk(c); ++c) std::free(ChunkMemory(s, c));
  std::vector<char*>().swap(s.chunks);
  SyncChunks(s);
  s.rows_handed_out = 0;
  s.free_head = 0;
  s.size.store(0, std::memory_order_relaxed);
}

void HashTable::Impl::RehashIndex(Shard& s, uint64_t new_capacity, bool lazy) const {
  if (new_capacity <= s.capacity) return;
  TFEXT_DCHECK(IsPowerOfTwo(new_capacity) && new_capacity >= kMinIndexCapacity, "index capacities (I1)");
  if (new_capacity > kMaxIndexCapacity) {
    ThrowOutOfMemory("a shard is full (its index would exceed 2^32 slots: use more shards), slots", new_capacity);
  }
  // Allocate first: on failure the shard is unchanged.
  bool mapped = false;
  uint64_t* fresh =
      static_cast<uint64_t*>(AllocateIndexMemory(new_capacity * sizeof(uint64_t), huge_pages, lazy, &mapped));
  const uint64_t mask = new_capacity - 1;
  // Each slot's home comes from its stored tag: no row is read. Without
  // removals during the rehash, any insertion order yields a valid table.
  uint64_t moved = 0;  // counted in debug-check builds only
  for (uint64_t i = 0; i < s.capacity; ++i) {
    const uint64_t slot = s.slots[i];
    if (slot == 0) continue;
    uint64_t p = SlotTag(slot) & mask;
    while (fresh[p] != 0) p = (p + 1) & mask;
    fresh[p] = slot;
    if constexpr (kDebugChecks) ++moved;
  }
  TFEXT_DCHECK(moved == static_cast<uint64_t>(s.size.load(std::memory_order_relaxed)),
               "a rehash moves every key, once (I3)");
  TFEXT_DCHECK(moved <= GrowAt(new_capacity), "the grown index holds its keys below its load (I2)");
  if (s.capacity != 0) FreeIndexMemory(s.slots, s.capacity * sizeof(uint64_t), s.slots_mapped);
  s.slots = fresh;
  s.slots_mapped = mapped;
  s.capacity = new_capacity;
  s.mask = mask;
  s.grow_at = GrowAt(new_capacity);
}

void HashTable::Impl::ReadCompactColumns(const char* row, int64_t c0, int64_t n, float* dst) const {
  TFEXT_DCHECK(compact && c0 >= 0 && n >= 0 && c0 + n <= width, "a column range of a compact row");
  const char* area = row + values_offset;
  const int64_t in_area = std::min(n, std::max<int64_t>(compact_cols - c0, 0));
  if (in_area > 0) {
    if (storage == RowStorage::kInt8Row) {
      DecodeInt8Row(area, compact_cols, c0, in_area, dst);
    } else {
      HostDecodeElements(storage, area, c0, in_area, dst);
    }
  }
  if (n > in_area) {
    const float* floats = reinterpret_cast<const float*>(row + floats_offset);
    CopyFloats(dst + in_area, floats + (c0 + in_area - compact_cols), n - in_area);
  }
}

void HashTable::Impl::EncodeColumns(char* values, int64_t c0, int64_t n, const float* src, Rounding rounding,
                                    int64_t key, int64_t version) const {
  TFEXT_DCHECK(compact && c0 >= 0 && n >= 0 && c0 + n <= width, "a column range of a compact row");
  const int64_t in_area = std::min(n, std::max<int64_t>(compact_cols - c0, 0));
  if (in_area > 0) {
    if (storage != RowStorage::kInt8Row) {
      HostEncodeElements(storage, src, c0, in_area, values, rounding, key, version);
    } else if (c0 == 0 && in_area == compact_cols) {
      EncodeInt8Row(src, compact_cols, values);
    } else {
      const ScratchRow whole(Scratch::kCodec, static_cast<size_t>(compact_cols));
      DecodeInt8Row(values, compact_cols, 0, compact_cols, whole.data());
      std::copy(src, src + in_area, whole.data() + c0);
      EncodeInt8Row(whole.data(), compact_cols, values);
    }
  }
  if (n > in_area) {
    float* floats = reinterpret_cast<float*>(values + (floats_offset - values_offset));
    CopyFloats(floats + (c0 + in_area - compact_cols), src + in_area, n - in_area);
  }
}

void HashTable::Impl::ColumnBytes(int64_t c0, int64_t n, size_t* first, size_t* end) const {
  const int64_t c1 = c0 + std::max<int64_t>(n, 1);
  const size_t compact_column_bytes = storage == RowStorage::kInt8Row ? 0 : 2;  // int8: the whole area
  *first = c0 >= compact_cols ? floats_offset + sizeof(float) * (c0 - compact_cols)
                              : values_offset + compact_column_bytes * c0;
  if (c1 > compact_cols) {
    *end = floats_offset + sizeof(float) * (c1 - compact_cols);
  } else {
    *end = storage == RowStorage::kInt8Row ? floats_offset : values_offset + 2 * c1;
  }
}

void HashTable::Impl::EraseAt(Shard& s, uint64_t pos) const {
  TFEXT_DCHECK(pos <= s.mask && s.slots[pos] != 0 && s.size.load(std::memory_order_relaxed) > 0,
               "only an occupied slot can be erased");
  FreeRow(s, SlotRow(s.slots[pos]));
  // Backward shift: walk the rest of the cluster and move back into the hole
  // every entry whose home is not between the hole and its current slot, so
  // that every remaining key is still reachable from its home without gaps.
  uint64_t hole = pos;
  uint64_t next = (pos + 1) & s.mask;
  for (;;) {
    const uint64_t slot = s.slots[next];
    if (slot == 0) break;
    const uint64_t home = SlotTag(slot) & s.mask;
    if (((next - home) & s.mask) >= ((next - hole) & s.mask)) {
      s.slots[hole] = slot;
      hole = next;
    }
    next = (next + 1) & s.mask;
  }
  s.slots[hole] = 0;
  s.size.fetch_sub(1, std::memory_order_relaxed);
  if constexpr (kDebugChecks) {
    // Postcondition (I4): every entry left between the new hole and the end
    // of the cluster has its home after the hole, so no probe crosses it.
    for (uint64_t q = (hole + 1) & s.mask; s.slots[q] != 0; q = (q + 1) & s.mask) {
      const uint64_t home = SlotTag(s.slots[q]) & s.mask;
      TFEXT_DCHECK(((q - home) & s.mask) < ((q - hole) & s.mask),
                   "backward-shift deletion left a key behind the hole, unreachable from its home (I4)");
    }
  }
}

ShardPlan HashTable::Impl::Bucket(const int64_t* keys, int64_t n, const ParallelFor& pf) const {
  ShardPlan plan;
  plan.hash.reset(new uint64_t[n]);
  plan.index.reset(new int64_t[n]);
  plan.begin.assign(num_shards + 1, 0);
  if (num_shards == 1) {
    for (int64_t i = 0; i < n; ++i) {
      plan.hash[i] = ProbeHash(keys[i]);
      plan.index[i] = i;
    }
    plan.begin[1] = n;
    return plan;
  }
  // Stable counting sort by shard, in parallel over blocks of keys: each
  // block counts its keys per shard, a prefix sum (shard-major, block-minor)
  // gives every (block, shard) its output range, then each block scatters.
  // Hashes are recomputed in the scatter: cheaper than storing them.
  const int64_t blocks = (n + kBucketBlock - 1) / kBucketBlock;
  std::vector<int64_t> offsets(static_cast<size_t>(blocks * num_shards), 0);
  auto count = [&](int64_t first_block, int64_t end_block) {
    for (int64_t b = first_block; b < end_block; ++b) {
      int64_t* counts = &offsets[b * num_shards];
      const int64_t end = std::min(n, (b + 1) * kBucketBlock);
      for (int64_t i = b * kBucketBlock; i < end; ++i) {
        ++counts[shard_bits == 0 ? 0 : ProbeHash(keys[i]) >> shard_shift];
      }
    }
  };
  auto scatter = [&](int64_t first_block, int64_t end_block) {
    for (int64_t b = first_block; b < end_block; ++b) {
      int64_t* next = &offsets[b * num_shards];
      const int64_t end = std::min(n, (b + 1) * kBucketBlock);
      for (int64_t i = b * kBucketBlock; i < end; ++i) {
        const uint64_t h = ProbeHash(keys[i]);
        const int64_t at = next[h >> shard_shift]++;
        plan.hash[at] = h;
        plan.index[at] = i;
      }
    }
  };
  const bool parallel = blocks > 1;
  RunParallel(parallel, pf, blocks, count);
  int64_t running = 0;
  for (int64_t si = 0; si < num_shards; ++si) {
    plan.begin[si] = running;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c = offsets[b * num_shards + si];
      offsets[b * num_shards + si] = running;
      running += c;
    }
  }
  plan.begin[num_shards] = running;
  TFEXT_DCHECK(running == n, "bucketing places every key once");
  RunParallel(parallel, pf, blocks, scatter);
  if constexpr (kDebugChecks) {
    // Postcondition: each shard's range holds its own keys in batch order
    // (the batch-order semantics of duplicate keys rest on this).
    for (int64_t si = 0; si < num_shards; ++si) {
      for (int64_t j = plan.begin[si]; j < plan.begin[si + 1]; ++j) {
        TFEXT_DCHECK(ShardIndex(plan.hash[j]) == si && plan.hash[j] == ProbeHash(keys[plan.index[j]]),
                     "a bucketed key sits in its own shard's range");
        TFEXT_DCHECK(j == plan.begin[si] || plan.index[j - 1] < plan.index[j], "bucketing is stable");
      }
    }
  }
  return plan;
}

// ---------------------------------------------------------------------------

HashTable::HashTable(const TableOptions& options) : impl_(new Impl(options)) {}
HashTable::~HashTable() = default;

int64_t HashTable::width() const { return impl_->width; }

int64_t HashTable::size() const {
  int64_t total = 0;
  for (int64_t si = 0; si < impl_->num_shards; ++si) {
    total += impl_->shards[si].size.load(std::memory_order_relaxed);
  }
  return total;
}

int64_t HashTable::memory_bytes() const {
  const Impl& m = *impl_;
  int64_t bytes = sizeof(HashTable) + sizeof(Impl) + m.num_shards * sizeof(Shard);
  for (int64_t si = 0; si < m.num_shards; ++si) {
    const Shard& s = m.shards[si];
    std::shared_lock<std::shared_mutex> lock(s.mu);
    bytes += static_cast<int64_t>(s.capacity * sizeof(uint64_t));
    bytes += static_cast<int64_t>(s.chunks.capacity() * sizeof(char*));
    for (uint64_t c = 0; c < s.chunks.size() && m.IsSmallChunk(c); ++c) {
      bytes += static_cast<int64_t>(m.SmallChunkBytes(c));
    }
  }
  // Under a shard lock: Replace swaps chunk_source under every shard's lock
  // (and the old one is destroyed after).
  std::shared_lock<std::shared_mutex> lock(m.shards[0].mu);
  return bytes + m.chunk_source->bytes();
}

void HashTable::Find(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, float* out, bool* found,
                     const float* default_row, const ParallelFor& pf) const {
  const Impl& m = *impl_;
  size_t first_byte, end_byte;
  m.ColumnBytes(col_begin, cols, &first_byte, &end_byte);
  m.ForEachBlockShared(keys, n, pf, [&](int64_t begin, int64_t end) {
    m.VisitKeysShared(keys, begin, end, first_byte, end_byte, [&](int64_t i, const char* row) {
      float* dst = out + i * cols;
      if (row != nullptr) {
        m.ReadColumns(row, col_begin, cols, dst);
      } else if (default_row != nullptr) {
        CopyFloats(dst, default_row, cols);
      }
      if (found != nullptr) found[i] = row != nullptr;
    });
  });
}

void HashTable::FindMeta(const int64_t* keys, int64_t n, KeyMeta* meta, bool* found, const ParallelFor& pf) const {
  const Impl& m = *impl_;
  m.ForEachBlockShared(keys, n, pf, [&](int64_t begin, int64_t end) {
    m.VisitKeysShared(keys, begin, end, m.version_offset, m.stride, [&](int64_t i, const char* row) {
      if (meta != nullptr) meta[i] = row != nullptr ? m.LoadMeta(row) : KeyMeta();
      if (found != nullptr) found[i] = row != nullptr;
    });
  });
}

void HashTable::FindOrInsert(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* init_rows,
                             const float* column_defaults, float* out, bool* inserted, bool count, int64_t version,
                             const ParallelFor& pf) {
  // The same probe as FindOrInsertWith; a new key's columns come from its
  // init_rows row (one indirect call per batch of inserted keys, none per
  // found key).
  InitRows copy_init;
  if (init_rows != nullptr) {
    copy_init = [init_rows, cols](const int64_t* index, float* const* dst, int64_t count) {
      for (int64_t j = 0; j < count; ++j) CopyFloats(dst[j], init_rows + index[j] * cols, cols);
    };
  }
  impl_->FindOrInsertWith(keys, n, col_begin, cols, copy_init, column_defaults, out, inserted, count, version, pf,
                          nullptr, Rounding::kNearest);
}

void HashTable::Insert(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* values,
                       const float* column_defaults, bool count, int64_t version, const ParallelFor& pf) {
  const Impl& m = *impl_;
  const size_t row_bytes = sizeof(float) * cols;
  Impl::DefaultValues defaults;
  m.MakeDefaultValues(column_defaults, &defaults);
  const auto prefetch_io = [&](int64_t i) { PrefetchBytes(values + i * cols, row_bytes); };
  m.ForEachKeyExclusive(keys, n, pf, prefetch_io, [&](Shard& s, int64_t i, uint64_t h) {
    bool added;
    char* row = m.FindOrAddRow(s, keys[i], TagOf(h), &added);
    if (added) {
      if (cols != m.width) m.InitValues(row, defaults);
      m.InitMeta(row, count, version);
    } else {
      m.TouchMeta(row, count, version);
    }
    m.WriteColumns(row, col_begin, cols, values + i * cols, Rounding::kNearest);
  });
}

void HashTable::Accumulate(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* deltas,
                           const float* column_defaults, bool insert_missing, bool count, int64_t version,
                           const ParallelFor& pf) {
  const Impl& m = *impl_;
  Impl::DefaultValues defaults;
  m.MakeDefaultValues(column_defaults, &defaults);
  const auto prefetch_io = [&](int64_t i) { PrefetchBytes(deltas + i * cols, sizeof(float) * cols); };
  m.ForEachKeyExclusive(keys, n, pf, prefetch_io, [&](Shard& s, int64_t i, uint64_t h) {
    char* row;
    if (insert_missing) {
      bool added;
      row = m.FindOrAddRow(s, keys[i], TagOf(h), &added);
      if (added) {
        m.InitValues(row, defaults);
        m.InitMeta(row, count, version);
      } else {
        m.TouchMeta(row, count, version);
      }
    } else {
      uint64_t pos;
      row = m.Probe(s, keys[i], TagOf(h), &pos);
      if (row == nullptr) return;
      m.TouchMeta(row, count, version);
    }
    const float* delta = deltas + i * cols;
    if (__builtin_expect(!m.compact, 1)) {
      float* dst = m.Values(row) + col_begin;
      for (int64_t c = 0; c < cols; ++c) dst[c] += delta[c];
      return;
    }
    const ScratchRow sum(Scratch::kRow, static_cast<size_t>(cols));
    m.ReadCompactColumns(row, col_begin, cols, sum.data());
    for (int64_t c = 0; c < cols; ++c) sum.data()[c] += delta[c];
    m.WriteColumns(row, col_begin, cols, sum.data(), Rounding::kNearest);
  });
}

void HashTable::Update(const int64_t* keys, int64_t n, const float* column_defaults,
                       const std::function<void(int64_t, float*, KeyMeta*)>& fn, const ParallelFor& pf,
                       const float* in_rows, int64_t in_cols) {
  const Impl& m = *impl_;
  // fn's input rows (e.g. gradients) are read in shard order, i.e. at random:
  // prefetch them with the table rows (measured: the fused Adagrad apply of
  // the ctr26 step was ~35% faster on one thread).
  const size_t in_bytes = sizeof(float) * static_cast<size_t>(in_cols > 0 ? in_cols : 0);
  const auto prefetch_io = [&](int64_t i) {
    if (in_rows != nullptr && in_bytes != 0) PrefetchBytes(in_rows + i * in_cols, in_bytes);
  };
  Impl::DefaultValues defaults;
  m.MakeDefaultValues(column_defaults, &defaults);
  m.ForEachKeyExclusive(keys, n, pf, prefetch_io, [&](Shard& s, int64_t i, uint64_t h) {
    bool added;
    char* row = m.FindOrAddRow(s, keys[i], TagOf(h), &added);
    KeyMeta meta;
    if (added) {
      m.InitValues(row, defaults);
      m.StoreMeta(row, meta);  // a complete row even if fn throws
    } else {
      meta = m.LoadMeta(row);
    }
    m.ApplyToRow(row, i, &meta, fn);
  });
}

int64_t HashTable::Remove(const int64_t* keys, int64_t n, const ParallelFor& pf) {
  const Impl& m = *impl_;
  std::atomic<int64_t> removed{0};
  m.ForEachKeyExclusive(keys, n, pf, kNoIo, [&](Shard& s, int64_t i, uint64_t h) {
    if (m.EraseKey(s, keys[i], TagOf(h))) removed.fetch_add(1, std::memory_order_relaxed);
  });
  return removed.load();
}

int64_t HashTable::RemoveIf(const std::function<bool(int64_t, const float*, const KeyMeta&)>& pred) {
  const Impl& m = *impl_;
  int64_t removed = 0;
  std::vector<int64_t> doomed;
  std::vector<float> decoded(m.compact ? m.width : 0);  // pred sees a compact row decoded
  for (int64_t si = 0; si < m.num_shards; ++si) {
    Shard& s = m.shards[si];
    std::unique_lock<std::shared_mutex> lock(s.mu);
    // Decide first, erase after: erasing shifts slots under the scan.
    doomed.clear();
    for (uint64_t p = 0; p < s.capacity; ++p) {
      const uint64_t slot = s.slots[p];
      if (slot == 0) continue;
      const char* row = m.Row(s, SlotRow(slot));
      const int64_t key = LoadI64(row);
      const float* values;
      if (m.compact) {
        m.ReadCompactColumns(row, 0, m.width, decoded.data());
        values = decoded.data();
      } else {
        values = m.Values(row);
      }
      if (pred(key, values, m.LoadMeta(row))) doomed.push_back(key);
    }
    for (const int64_t key : doomed) {
      const bool erased = m.EraseKey(s, key, TagOf(ProbeHash(key)));
      TFEXT_DCHECK(erased, "a key seen in the scan is found by its probe (I3, I4)");
      if (erased) ++removed;
    }
  }
  return removed;
}

int64_t HashTable::row_bytes() const { return static_cast<int64_t>(impl_->stride); }

void HashTable::SampleMeta(int64_t max_samples, std::vector<KeyMeta>* out) const {
  const Impl& m = *impl_;
  out->clear();
  if (max_samples <= 0) return;
  // Bresenham spacing over the live rows in shard and index order: a row is
  // taken whenever the running sum of max_samples passes another multiple
  // of the size, so the samples are size / max_samples rows apart wherever
  // they fall (no shard is over- or under-represented), and exactly
  // min(size, max_samples) when no writer runs. size() is read once, before
  // the shards: a writer may make the scan see more or fewer rows.
  const uint64_t total = static_cast<uint64_t>(std::max<int64_t>(size(), 1));
  const uint64_t limit = static_cast<uint64_t>(max_samples);
  const uint64_t step = std::min(limit, total);  // step == total: every row
  out->reserve(static_cast<size_t>(step));
  uint64_t acc = total - 1;  // the first live row is taken
  for (int64_t si = 0; si < m.num_shards && out->size() < limit; ++si) {
    const Shard& s = m.shards[si];
    std::shared_lock<std::shared_mutex> lock(s.mu);
    for (uint64_t p = 0; p < s.capacity && out->size() < limit; ++p) {
      const uint64_t slot = s.slots[p];
      if (slot == 0) continue;
      acc += step;
      if (acc < total) continue;
      acc %= total;
      out->push_back(m.LoadMeta(m.Row(s, SlotRow(slot))));
    }
  }
}

int64_t HashTable::Evacuate(int64_t max_keys, int64_t* cursor, const std::function<bool(int64_t, const KeyMeta&)>& pred,
                            const std::function<void(int64_t, const float*, const KeyMeta&)>& sink) {
  const Impl& m = *impl_;
  if (max_keys <= 0) return 0;
  // The cursor is position * num_shards + shard: its shard is *cursor %
  // num_shards as hash_table.h promises, and the position lets a sweep of
  // many small calls read each row of a large shard about once instead of
  // rescanning the shard from its start every call. A position past the
  // index (it was cleared or replaced since) reads nothing of that shard;
  // the call's last visit covers it.
  const uint64_t shards = static_cast<uint64_t>(m.num_shards);
  const uint64_t at = *cursor < 0 ? 0 : static_cast<uint64_t>(*cursor);
  const uint64_t first = at % shards;
  const uint64_t resume = at / shards;
  const uint64_t visits = shards + (resume > 0 ? 1 : 0);  // the first shard's head last, if the call began inside it
  int64_t removed = 0;
  std::vector<int64_t> doomed;
  std::vector<float> decoded(m.compact ? m.width : 0);
  // Keys are handed to sink during the scan (the rows are in place: nothing
  // moves under the write lock) and erased after it: erasing shifts slots
  // back under the scan (backward-shift deletion), which would skip or
  // repeat keys.
  auto erase_doomed = [&](Shard& s) {
    for (const int64_t key : doomed) {
      const bool erased = m.EraseKey(s, key, TagOf(ProbeHash(key)));
      TFEXT_DCHECK(erased, "a key seen in the scan is found by its probe (I3, I4)");
      if (erased) ++removed;
    }
    doomed.clear();
  };
  for (uint64_t v = 0; v < visits; ++v) {
    const uint64_t si = (first + v) % shards;
    Shard& s = m.shards[si];
    std::unique_lock<std::shared_mutex> lock(s.mu);
    const int64_t quota = max_keys - removed;
    uint64_t p = v == 0 ? std::min(resume, s.capacity) : 0;
    bool filled = false;
    try {
      for (; p < s.capacity; ++p) {
        // The scan reads each live row's key and metadata (two lines apart
        // for a wide row) in index order, i.e. rows at random: prefetch a
        // few slots ahead.
        if (p + kRowAhead < s.capacity) {
          const uint64_t ahead = s.slots[p + kRowAhead];
          if (ahead != 0) {
            const char* row = m.Row(s, SlotRow(ahead));
            PrefetchLineL2(row);
            PrefetchLineL2(row + m.version_offset);
          }
        }
        const uint64_t slot = s.slots[p];
        if (slot == 0) continue;
        const char* row = m.Row(s, SlotRow(slot));
        const int64_t key = LoadI64(row);
        const KeyMeta meta = m.LoadMeta(row);
        if (!pred(key, meta)) continue;
        const float* values;
        if (m.compact) {
          m.ReadCompactColumns(row, 0, m.width, decoded.data());
          values = decoded.data();
        } else {
          values = m.Values(row);
        }
        sink(key, values, meta);
        doomed.push_back(key);
        if (static_cast<int64_t>(doomed.size()) == quota) {
          filled = true;
          break;
        }
      }
    } catch (...) {
      // What sink has taken must leave the table, or a row would live in
      // both places.
      erase_doomed(s);
      throw;
    }
    if (filled) {
      // The next call resumes at the start of the cluster (the run of
      // occupied slots) of the last key taken, at p: erasing its keys shifts
      // the cluster's later entries, not yet looked at, back into slots
      // before p, and only this cluster reaches past p (I4). A cluster that
      // wraps round the index end resumes at 0: its part at the end comes
      // before the holes (cyclically) and does not move.
      while (p > 0 && s.slots[p - 1] != 0) --p;
      erase_doomed(s);
      *cursor = static_cast<int64_t>(p * shards + si);
      return removed;
    }
    erase_doomed(s);
  }
  // A whole sweep found fewer than max_keys: the next call starts a new one
  // at the next shard.
  *cursor = static_cast<int64_t>((first + 1) % shards);
  return removed;
}

void HashTable::Export(int64_t col_begin, int64_t cols, const std::function<ExportBuffers(int64_t n)>& alloc) const {
  const Impl& m = *impl_;
  // Hold every read lock for the whole export: a consistent snapshot, and the
  // count given to alloc matches what is written.
  for (int64_t si = 0; si < m.num_shards; ++si) m.shards[si].mu.lock_shared();
  ScopeExit unlock([&m] {
    for (int64_t si = m.num_shards - 1; si >= 0; --si) m.shards[si].mu.unlock_shared();
  });
  int64_t total = 0;
  for (int64_t si = 0; si < m.num_shards; ++si) {
    total += m.shards[si].size.load(std::memory_order_relaxed);
  }
  const ExportBuffers out = alloc(total);
  int64_t k = 0;
  for (int64_t si = 0; si < m.num_shards; ++si) {
    const Shard& s = m.shards[si];
    for (uint64_t p = 0; p < s.capacity; ++p) {
      const uint64_t slot = s.slots[p];
      if (slot == 0) continue;
      const char* row = m.Row(s, SlotRow(slot));
      if (out.keys != nullptr) out.keys[k] = LoadI64(row);
      if (out.rows != nullptr) m.ReadColumns(row, col_begin, cols, out.rows + k * cols);
      if (out.versions != nullptr) out.versions[k] = LoadI64(row + m.version_offset);
      if (out.frequencies != nullptr) out.frequencies[k] = LoadU32(row + m.frequency_offset);
      ++k;
    }
  }
  TFEXT_DCHECK(k == total, "occupied slots == size, so alloc's n is what is written (I3)");
}

void HashTable::ExportSince(int64_t min_version, int64_t col_begin, int64_t cols,
                            const std::function<ExportBuffers(int64_t n)>& alloc) const {
  const Impl& m = *impl_;
  for (int64_t si = 0; si < m.num_shards; ++si) m.shards[si].mu.lock_shared();
  ScopeExit unlock([&m] {
    for (int64_t si = m.num_shards - 1; si >= 0; --si) m.shards[si].mu.unlock_shared();
  });
  // One pass over the metadata, remembering the rows to copy (the locks are held throughout, so they stay put):
  // a delta reads each untouched row's version only once.
  std::vector<const char*> picked;
  for (int64_t si = 0; si < m.num_shards; ++si) {
    const Shard& s = m.shards[si];
    for (uint64_t p = 0; p < s.capacity; ++p) {
      const uint64_t slot = s.slots[p];
      if (slot == 0) continue;
      const char* row = m.Row(s, SlotRow(slot));
      if (LoadI64(row + m.version_offset) >= min_version) picked.push_back(row);
    }
  }
  const int64_t total = static_cast<int64_t>(picked.size());
  const ExportBuffers out = alloc(total);
  for (int64_t k = 0; k < total; ++k) {
    const char* row = picked[k];
    if (out.keys != nullptr) out.keys[k] = LoadI64(row);
    if (out.rows != nullptr) m.ReadColumns(row, col_begin, cols, out.rows + k * cols);
    if (out.versions != nullptr) out.versions[k] = LoadI64(row + m.version_offset);
    if (out.frequencies != nullptr) out.frequencies[k] = LoadU32(row + m.frequency_offset);
  }
}

void HashTable::Import(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* rows,
                       const float* column_defaults, const int64_t* versions, const uint32_t* frequencies,
                       const ParallelFor& pf) {
  const Impl& m = *impl_;
  const size_t row_bytes = sizeof(float) * cols;
  Impl::DefaultValues defaults;
  m.MakeDefaultValues(column_defaults, &defaults);
  const auto prefetch_io = [&](int64_t i) { PrefetchBytes(rows + i * cols, row_bytes); };
  m.ForEachKeyExclusive(keys, n, pf, prefetch_io, [&](Shard& s, int64_t i, uint64_t h) {
    bool added;
    char* row = m.FindOrAddRow(s, keys[i], TagOf(h), &added);
    if (added && cols != m.width) m.InitValues(row, defaults);
    m.WriteColumns(row, col_begin, cols, rows + i * cols, Rounding::kNearest);
    KeyMeta meta;
    meta.version = versions != nullptr ? versions[i] : 0;
    meta.frequency = frequencies != nullptr ? frequencies[i] : 0;
    m.StoreMeta(row, meta);
  });
}

void HashTable::Clear() {
  Impl& m = *impl_;
  // Every shard at once (in shard order, like readers): the chunks are shared
  // by the shards and can only be released together.
  for (int64_t si = 0; si < m.num_shards; ++si) m.shards[si].mu.lock();
  ScopeExit unlock([&m] {
    for (int64_t si = m.num_shards - 1; si >= 0; --si) m.shards[si].mu.unlock();
  });
  for (int64_t si = 0; si < m.num_shards; ++si) m.ReleaseShard(m.shards[si]);
  m.chunk_source->ReleaseAll();
  for (int64_t si = 0; si < m.num_shards; ++si) m.PresizeShard(m.shards[si]);
  m.Preallocate();  // as a new table
  m.generation.fetch_add(1, std::memory_order_seq_cst);
  m.removal_epoch.fetch_add(1, std::memory_order_relaxed);
}

void HashTable::Replace(int64_t expected_keys, const std::function<void(HashTable& staging)>& fill) {
  Impl& m = *impl_;
  TableOptions options = m.options;
  // The same shard count, whatever expected_keys would pick: the shards are
  // swapped one for one.
  options.shard_bits = m.shard_bits;
  options.initial_capacity = std::min(std::max<int64_t>(expected_keys, 0), kMaxCapacity);
  // A preallocated table keeps its headroom across a restore: the staging
  // table preallocates for the larger of the two.
  if (options.preallocate) options.initial_capacity = std::max(options.initial_capacity, m.options.initial_capacity);
  HashTable staging(options);
  fill(staging);
  Impl& o = *staging.impl_;
  TFEXT_DCHECK(o.num_shards == m.num_shards && o.width == m.width && o.stride == m.stride &&
                   o.chunk_bytes == m.chunk_bytes && o.first_chunk_shift == m.first_chunk_shift &&
                   o.shard_shift == m.shard_shift,
               "Replace: the staging table has this table's layout");
  {
    // Readers lock shards in shard order within one table; the staging table
    // has no other user, so taking this table's locks first cannot deadlock.
    for (int64_t si = 0; si < m.num_shards; ++si) m.shards[si].mu.lock();
    for (int64_t si = 0; si < o.num_shards; ++si) o.shards[si].mu.lock();
    ScopeExit unlock([&m, &o] {
      for (int64_t si = o.num_shards - 1; si >= 0; --si) o.shards[si].mu.unlock();
      for (int64_t si = m.num_shards - 1; si >= 0; --si) m.shards[si].mu.unlock();
    });
    m.SwapContentsLocked(o);
  }
  // `staging` now holds the old contents and frees them here, outside the
  // locks, so readers wait only for the swap.
}

void HashTable::Reserve(int64_t n) {
  Impl& m = *impl_;
  if (n <= 0) return;
  const uint64_t per_shard = m.KeysPerShardFor(std::min(n, kMaxCapacity));
  for (int64_t si = 0; si < m.num_shards; ++si) {
    Shard& s = m.shards[si];
    std::unique_lock<std::shared_mutex> lock(s.mu);
    m.EnsureIndexFor(s, per_shard);
    const uint64_t rows = std::min<uint64_t>(per_shard, kMaxRowsPerShard);
    if (rows > 0) s.chunks.reserve(m.ChunkOf(rows - 1) + 1);
    m.SyncChunks(s);
  }
}

// Added for the embedding kernels (TfExtEmbeddingLookup): see hash_table.h.
void HashTable::FindOrInsertWith(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const InitRows& init,
                                 const float* column_defaults, float* out, bool* inserted, bool count, int64_t version,
                                 const ParallelFor& pf, uint64_t* refs) {
  impl_->FindOrInsertWith(keys, n, col_begin, cols, init, column_defaults, out, inserted, count, version, pf, refs,
                          impl_->options.rounding);
}

void HashTable::Impl::FindOrInsertWith(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols,
                                       const InitRows& init, const float* column_defaults, float* out, bool* inserted,
                                       bool count, int64_t version, const ParallelFor& pf, uint64_t* refs,
                                       Rounding init_rounding) const {
  const Impl& m = *this;
  const size_t row_bytes = sizeof(float) * cols;
  DefaultValues defaults;
  m.MakeDefaultValues(column_defaults, &defaults);
  const auto prefetch_io = [&](int64_t i) {
    if (out != nullptr) PrefetchBytes(out + i * cols, row_bytes);
  };
  // New rows wait for init in per-shard batches (a shard is one thread's at
  // a time), which run before the shard's lock is released. While a batch
  // waits, out rows wait too, found keys' included: a key may repeat in the
  // batch, and its row is not final before init. init writes a plain row's
  // columns in place; a compact row's go to a per-thread scratch row (a
  // thread has one shard's batch pending at a time), encoded after init.
  constexpr int64_t kMaxOutRows = 2 * kInitBatch;
  struct alignas(64) PendingRows {  // a cache line apart: neighbouring shards run on other threads
    int64_t fresh = 0;              // new rows
    int64_t fresh_index[kInitBatch];
    char* fresh_rows[kInitBatch];
    float* fresh_values[kInitBatch];  // what init writes
    int64_t outs = 0;                 // out rows to write after init
    int64_t out_index[kMaxOutRows];
    const char* out_rows[kMaxOutRows];
  };
  // A small batch runs on the calling thread, shard after shard (see
  // ForEachKeyExclusive): one buffer, empty at each shard's end, serves all.
  const bool one_thread = n < kSerialBatch;
  std::unique_ptr<PendingRows[]> pending(init ? new PendingRows[one_thread ? 1 : m.num_shards] : nullptr);
  const auto pending_of = [&](const Shard& s) -> PendingRows& { return pending[one_thread ? 0 : &s - &m.shards[0]]; };
  const auto write_out = [&](int64_t i, const char* row) { m.ReadColumns(row, col_begin, cols, out + i * cols); };
  const auto run_pending = [&](Shard& s) {
    PendingRows& p = pending_of(s);
    const int64_t fresh = p.fresh, outs = p.outs;
    p.fresh = p.outs = 0;  // before init: a throwing init leaves no batch behind
    if (fresh > 0) {
      init(p.fresh_index, p.fresh_values, fresh);
      if (m.compact) {
        for (int64_t j = 0; j < fresh; ++j) {
          m.WriteColumns(p.fresh_rows[j], col_begin, cols, p.fresh_values[j], init_rounding);
        }
      }
    }
    for (int64_t j = 0; j < outs; ++j) write_out(p.out_index[j], p.out_rows[j]);
  };
  const auto after_shard = [&](Shard& s) {
    if (init) run_pending(s);
  };
  m.ForEachKeyExclusive(
      keys, n, pf, prefetch_io,
      [&](Shard& s, int64_t i, uint64_t h) {
        bool added;
        uint32_t id;
        char* row = m.FindOrAddRow(s, keys[i], TagOf(h), &added, &id);
        if (refs != nullptr) refs[i] = MakeRowRef(&s - &m.shards[0], id);
        if (inserted != nullptr) inserted[i] = added;
        if (added) {
          m.InitValues(row, defaults);
          m.InitMeta(row, count, version);  // before init: a complete row even if init throws
        } else {
          m.TouchMeta(row, count, version);
        }
        if (!init) {
          if (out != nullptr) write_out(i, row);
          return;
        }
        PendingRows& p = pending_of(s);
        if (added) {
          float* values;
          if (m.compact) {
            // The scratch rows hold the defaults, as a plain row does before init.
            values = ThreadScratch(Scratch::kInit, static_cast<size_t>(kInitBatch * cols)) + p.fresh * cols;
            m.ReadCompactColumns(row, col_begin, cols, values);
          } else {
            values = m.Values(row) + col_begin;
          }
          p.fresh_index[p.fresh] = i;
          p.fresh_rows[p.fresh] = row;
          p.fresh_values[p.fresh++] = values;
        }
        if (out != nullptr) {
          if (p.fresh == 0) {
            write_out(i, row);  // nothing waits: final now
          } else {
            p.out_index[p.outs] = i;
            p.out_rows[p.outs++] = row;
          }
        }
        if (p.fresh == kInitBatch || p.outs == kMaxOutRows) run_pending(s);
      },
      after_shard);
}

uint64_t HashTable::removal_epoch() const { return impl_->removal_epoch.load(std::memory_order_acquire); }

int64_t HashTable::UpdateRows(const int64_t* keys, const uint64_t* refs, uint64_t epoch, int64_t n,
                              const float* column_defaults, const std::function<void(int64_t, float*, KeyMeta*)>& fn,
                              const ParallelFor& pf, const float* in_rows, int64_t in_cols) {
  const Impl& m = *impl_;
  if (n <= 0) return 0;
  if (refs == nullptr || epoch != removal_epoch()) {
    Update(keys, n, column_defaults, fn, pf, in_rows, in_cols);
    return 0;
  }
  // Positions bucketed by their reference's shard (stable counting sort, no
  // hashing); a reference naming no shard (bucket num_shards) goes straight
  // to the probe.
  const auto bucket_of = [&](int64_t i) {
    return static_cast<int64_t>(std::min<uint64_t>(RowRefShard(refs[i]), static_cast<uint64_t>(m.num_shards)));
  };
  std::vector<int64_t> begin(m.num_shards + 2, 0);
  for (int64_t i = 0; i < n; ++i) ++begin[bucket_of(i) + 1];
  for (int64_t si = 0; si <= m.num_shards; ++si) begin[si + 1] += begin[si];
  std::unique_ptr<int64_t[]> order(new int64_t[n]);
  {
    std::vector<int64_t> next(begin.begin(), begin.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[next[bucket_of(i)]++] = i;
  }
  // A position whose reference does not hold its key (another batch's
  // references, or a stale one) is marked here and probed afterwards.
  std::unique_ptr<bool[]> missed(new bool[n]());
  for (int64_t j = begin[m.num_shards]; j < n; ++j) missed[order[j]] = true;
  const size_t in_bytes = sizeof(float) * static_cast<size_t>(in_cols > 0 ? in_cols : 0);
  auto run_shards = [&](int64_t first_shard, int64_t end_shard) {
    for (int64_t si = first_shard; si < end_shard; ++si) {
      const int64_t b = begin[si], e = begin[si + 1];
      if (b == e) continue;
      Shard& s = m.shards[si];
      std::unique_lock<std::shared_mutex> lock(s.mu);
      // Under s's lock: a row of s freed since `epoch` was read has changed
      // it (FreeRow bumps it under this lock), and so have Clear and Replace.
      const bool valid = m.removal_epoch.load(std::memory_order_relaxed) == epoch;
      auto row_of = [&](int64_t i) -> char* {
        const uint32_t id = RowRefId(refs[i]);
        return valid && id < s.rows_handed_out ? m.Row(s, id) : nullptr;
      };
      for (int64_t j = b; j < e; ++j) {
        if (j + kRowAhead < e) {
          const int64_t ahead = order[j + kRowAhead];
          if (const char* r = row_of(ahead)) PrefetchBytes(r, m.stride);
          if (in_rows != nullptr && in_bytes != 0) PrefetchBytes(in_rows + ahead * in_cols, in_bytes);
        }
        const int64_t i = order[j];
        char* row = row_of(i);
        if (row == nullptr || LoadI64(row) != keys[i]) {
          missed[i] = true;
          continue;
        }
        KeyMeta meta = m.LoadMeta(row);
        m.ApplyToRow(row, i, &meta, fn);
      }
    }
  };
  RunParallel(n >= kSerialBatch, pf, m.num_shards, run_shards);
  // The probe for the rest, with their own positions.
  std::vector<int64_t> pos;
  std::vector<int64_t> rest;
  for (int64_t i = 0; i < n; ++i) {
    if (missed[i]) {
      pos.push_back(i);
      rest.push_back(keys[i]);
    }
  }
  const int64_t left = static_cast<int64_t>(pos.size());
  if (left == 0) return n;
  Update(
      rest.data(), static_cast<int64_t>(rest.size()), column_defaults,
      [&](int64_t k, float* row, KeyMeta* meta) { fn(pos[k], row, meta); }, pf);
  return n - left;
}

std::string HashTable::CheckInvariants() const {
  const Impl& m = *impl_;
  for (int64_t si = 0; si < m.num_shards; ++si) m.shards[si].mu.lock_shared();
  ScopeExit unlock([&m] {
    for (int64_t si = m.num_shards - 1; si >= 0; --si) m.shards[si].mu.unlock_shared();
  });
  int64_t shard_index = 0;
  auto violation = [&shard_index](const char* what, uint64_t a, uint64_t b) {
    char buf[320];
    std::snprintf(buf, sizeof(buf), "shard %lld: %s (%llu, %llu)", static_cast<long long>(shard_index), what,
                  static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
    return std::string(buf);
  };
  if (g_empty_index[0] != 0) return violation("the shared empty index was written", g_empty_index[0], 0);
  enum : uint8_t { kUnseen = 0, kInSlot = 1, kFree = 2 };
  std::vector<uint8_t> row_state;
  for (; shard_index < m.num_shards; ++shard_index) {
    const Shard& s = m.shards[shard_index];
    const uint64_t size = static_cast<uint64_t>(s.size.load(std::memory_order_relaxed));
    // I1, I2
    if (s.capacity == 0) {
      if (s.slots != g_empty_index || s.mask != 0 || s.grow_at != 0) {
        return violation("I1: a shard without an index must have the empty index, mask 0, grow_at 0", s.mask,
                         s.grow_at);
      }
      if (size != 0) return violation("I2: keys in a shard without an index", size, 0);
    } else {
      if (!IsPowerOfTwo(s.capacity) || s.capacity < kMinIndexCapacity || s.capacity > kMaxIndexCapacity) {
        return violation("I1: capacity is not a power of two in [kMinIndexCapacity, kMaxIndexCapacity]", s.capacity, 0);
      }
      if (s.mask != s.capacity - 1) return violation("I1: mask != capacity - 1", s.mask, s.capacity);
      if (s.grow_at != m.GrowAt(s.capacity)) return violation("I1: grow_at != GrowAt(capacity)", s.grow_at, 0);
      if (size > s.grow_at) return violation("I2: more keys than the index's load allows", size, s.grow_at);
    }
    // I5 bounds
    if (s.rows_handed_out > kMaxRowsPerShard) {
      return violation("I5: more rows handed out than a shard may hold", s.rows_handed_out, kMaxRowsPerShard);
    }
    if (s.rows_handed_out > m.ChunkStart(s.chunks.size())) {
      return violation("I5: rows handed out beyond the chunk table", s.rows_handed_out, s.chunks.size());
    }
    row_state.assign(s.rows_handed_out, kUnseen);
    // I3, I4: one pass over the slots in cyclic order from an empty slot (one
    // exists by I2), remembering the last empty slot: a key's home must lie
    // after it (no gap between home and slot).
    uint64_t occupied = 0;
    if (s.capacity != 0) {
      uint64_t empty = 0;
      while (empty < s.capacity && s.slots[empty] != 0) ++empty;
      if (empty == s.capacity) return violation("I2: the index has no empty slot", s.capacity, size);
      uint64_t last_empty = empty;
      for (uint64_t i = 1; i <= s.capacity; ++i) {
        const uint64_t p = (empty + i) & s.mask;
        const uint64_t slot = s.slots[p];
        if (slot == 0) {
          last_empty = p;
          continue;
        }
        ++occupied;
        const uint32_t id = SlotRow(slot);
        if (id >= s.rows_handed_out) return violation("I3: a slot names a row never handed out", p, id);
        if (row_state[id] != kUnseen) return violation("I3: two slots name the same row", p, id);
        row_state[id] = kInSlot;
        const char* row = m.Row(s, id);
        const int64_t key = LoadI64(row);
        const uint64_t h = ProbeHash(key);
        if (m.ShardIndex(h) != shard_index) {
          return violation("I3: a key sits in another shard than its hash", p, m.ShardIndex(h));
        }
        if (TagOf(h) != SlotTag(slot)) return violation("I3: a slot's tag is not its key's", p, SlotTag(slot));
        const uint64_t home = SlotTag(slot) & s.mask;
        if (((p - home) & s.mask) >= ((p - last_empty) & s.mask)) {
          return violation("I4: an empty slot lies between a key's home and its slot", p, home);
        }
        uint64_t found_at = 0;
        if (m.Probe(s, key, SlotTag(slot), &found_at) != row || found_at != p) {
          return violation("I3: a key is held twice (its probe ends at another slot)", p, found_at);
        }
      }
    }
    if (occupied != size) return violation("I3: occupied slots != size", occupied, size);
    // I5: the free list names each remaining row once, and nothing else.
    uint64_t free_rows = 0;
    for (uint32_t head = s.free_head; head != 0; head = LoadU32(m.Row(s, head - 1))) {
      const uint32_t id = head - 1;
      if (id >= s.rows_handed_out) return violation("I5: the free list names a row never handed out", id, 0);
      if (row_state[id] == kInSlot) return violation("I5: a free row is still named by a slot", id, 0);
      if (row_state[id] == kFree) return violation("I5: the free list has a cycle", id, free_rows);
      row_state[id] = kFree;
      ++free_rows;
    }
    if (size + free_rows != s.rows_handed_out) {
      return violation("I5: rows neither named by a slot nor free (leaked)", s.rows_handed_out - size - free_rows,
                       s.rows_handed_out);
    }
  }
  return std::string();
}

int64_t HashTableTestPeer::NumShards(const HashTable& table) { return table.impl_->num_shards; }

void HashTableTestPeer::SpareSlabs(const HashTable& table, int64_t* ready, int64_t* pending, int64_t* taken) {
  std::shared_lock<std::shared_mutex> lock(table.impl_->shards[0].mu);  // Replace swaps chunk_source under it
  table.impl_->chunk_source->SpareStats(ready, pending, taken);
}

uint64_t* HashTableTestPeer::Slots(HashTable& table, int64_t shard, uint64_t* capacity) {
  Shard& s = table.impl_->shards[shard];
  *capacity = s.capacity;
  return s.capacity == 0 ? nullptr : s.slots;
}

}  // namespace table
}  // namespace tfext
