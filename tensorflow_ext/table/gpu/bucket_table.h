// tensorflow_ext CUDA table: a bucketed hash table from int64 keys to rows of float32, with per-key metadata,
// written once for the device and for a host emulation that runs the same per-key code on threads.
//
// Contract
//  * Keys: every int64 value is a key (no reserved empty, deleted or locked key). Rows: width() floats per key
//    (embedding + optimizer slots side by side, as in the CPU core), 1 <= width <= kMaxGpuWidth; every read and
//    write names a column range [col_begin, col_begin + cols).
//  * Row storage (GpuTableOptions::storage, compact_cols, rounding; the CPU core's TableOptions fields): rows are
//    float32, or their leading compact_cols columns are stored as bfloat16 or float16 (row_codec.h; RowFormat says
//    where each column lies). Callers always read and write float32 columns: reads decode, writes round, with the
//    CPU core's rules, so that both tables hold bit-identical rows: Update (the fused optimizer steps) and
//    FindOrInsertWith's initialized rows round by the table's rounding (stochastic: StochasticBits(key, the version
//    the write leaves in the row, column)); Insert, FindOrInsert's given rows, column defaults and Accumulate
//    (after every addition) round to nearest. int8 rows (a serving format) are refused.
//  * Metadata: version (int64, set by writers given version >= 0) and frequency (uint32, saturating, +1 per
//    occurrence when count is set), as the CPU core's KeyMeta.
//  * Two modes, chosen at creation:
//     - growing (capacity_limit = 0, the CPU core's semantics): the table doubles (rehash on device) before a
//       write batch would take it past max_load_factor; a write fails only when device memory runs out.
//     - capped (capacity_limit > 0): a fixed number of slots; a key lives in its bucket of 128 slots, and an
//       insert into a full bucket evicts the bucket's entry with the lowest score (LRU: version, LFU: frequency),
//       never one that the same batch touched. When every slot of a bucket was touched by the batch, the key is
//       not stored (counted in stats().failed; FindOrInsert still returns its initial row).
//  * Batches: duplicates within a batch are handled as in the CPU core: Insert keeps the last occurrence's row,
//    FindOrInsert inserts once (the first occurrence reports inserted) and every occurrence reads the row,
//    frequency counts every occurrence. Accumulate adds every occurrence, in an unspecified order (float sums of
//    duplicates may differ from the CPU core's batch order in the last bits). Update takes unique keys only.
//  * What rows hold is the caller's: the table knows nothing of embeddings. New keys' initial columns come from an
//    initializer the caller passes to FindOrInsertWith, and per-element row updates from the function it passes to
//    Update, as functors that run in device code (as the CPU core's FindOrInsertWith and Update take callbacks).
//    The embedding layer's initializers and fused optimizer steps are such functors
//    (embedding/kernels/gpu/gpu_embedding.h); nothing here includes the embedding layer.
//  * Concurrency: every operation of a table runs on the table's stream, in call order; a reader never overlaps a
//    writer. Device code sees the table through two types: ReadView (const pointers: probe and read only) and
//    MutableView (claims, removes, writes). Kernels of read-only operations are given a ReadView, so a read path
//    cannot write the table by mistake: the compiler refuses it.
//  * Errors: operations return an empty string on success, else a message naming the problem (bad argument,
//    device allocation failure with its size, a CUDA error). After a failed write the table is consistent but may
//    hold part of the batch (and, if a kernel launch failed between the claim pass and the count of its claims,
//    size and used may miss the keys it claimed).
//
// Limitations
//  * Removed entries leave tombstones that growing tables reclaim only at the next rehash (Clear or growth); capped
//    tables reuse them. Memory does not shrink until destruction.
//  * Export writes entries in an unspecified order.
//  * Capped mode serializes the keys of one batch that fall into the same bucket (a per-bucket spin lock).
//  * The epoch that protects a batch's own keys from eviction is 32 bits: it wraps after 2^32 write batches.
//
// Design
//  * Rows: one array of capacity x row_bytes bytes (RowFormat::row_bytes: 4 x width for float32 rows, 2 bytes per
//    compact column padded to 4, then the float32 columns). A compact table's Update gives fn a float32 copy of the
//    row in a scratch array of n x width floats ([decode, fn, encode] per thread, on the thread's own columns); a
//    compact column's atomic addition (Accumulate) is a compare-and-swap of the 32-bit word that holds it.
//  * Slots are grouped in buckets of 128. Per slot: a 1-byte digest (0 empty, 1 removed, 2 being claimed, 3..255
//    occupied: a digest of the key's hash), the key, the row, version, frequency and (capped mode) a batch epoch,
//    each in its own array (structure of arrays: a probe reads digests, then one key, then the row).
//  * A key's probe starts at its home word of 8 digests (from Murmur3Fmix64, the CPU core's probe hash) and
//    compares all 8 digests at once (SWAR), then only the keys whose digest matches. Growing tables probe linearly
//    across words (and buckets); capped tables wrap within the home bucket. An empty digest ends a probe.
//  * Lock-free claims (growing mode): a thread claims an empty slot by a 64-bit compare-and-swap of its digest
//    word (empty -> being claimed), writes the key, then publishes the final digest (release). Batches are
//    deduplicated first (a scratch set of batch indices, which needs no reserved key), so no two threads of a
//    kernel ever claim the same key, and a thread never mistakes a slot being claimed for its own key.
//  * Capped mode: a first pass stamps the slots of the batch's stored keys with the batch's epoch, so no key of the
//    batch evicts another whatever order the threads run in; then each key takes its bucket's spin lock around
//    find-claim-evict (a new slot is stamped under the lock, so the row write after it races with no eviction).
//  * Writes take two passes: one thread per key finds or claims the slot, then one thread per element writes the
//    rows (consecutive columns across a warp); outputs are gathered the same way, from the slot each batch entry
//    resolved to. The exception is Accumulate's new rows (column defaults, written by the claiming thread: the
//    element pass adds to them atomically). Growing tables count claims after the pass (CountIf), not per thread.
//
// Backend: BucketTable<Backend> is host code parameterized by where the arrays live and how a kernel runs:
// DeviceBackend (device_backend.h, nvcc only: cudaMalloc and a grid-stride kernel on a stream) or HostBackend
// (host_backend.h: malloc and std::threads), which the CPU test suite uses to test the very same per-key code
// against the CPU core (bucket_table_host_test.cc).

#ifndef TENSORFLOW_EXT_TABLE_GPU_BUCKET_TABLE_H_
#define TENSORFLOW_EXT_TABLE_GPU_BUCKET_TABLE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "tensorflow_ext/table/core/host_device.h"
#include "tensorflow_ext/table/core/mix.h"
#include "tensorflow_ext/table/core/row_codec.h"
#include "tensorflow_ext/table/core/table_limits.h"

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

namespace tfext {
namespace table {
namespace gpu {

constexpr int kBucketSlots = 128;
constexpr int kDigestsPerWord = 8;  // one uint64 of digests, compared at once
constexpr int kWordsPerBucket = kBucketSlots / kDigestsPerWord;
constexpr int64_t kMaxGpuWidth = int64_t{1} << 24;  // the CPU core's limit too
constexpr uint32_t kEmptyDigest = 0, kRemovedDigest = 1, kClaimingDigest = 2, kFirstDigest = 3;
static_assert(kBucketSlots % kDigestsPerWord == 0, "a bucket is a whole number of digest words");
static_assert((kBucketSlots & (kBucketSlots - 1)) == 0, "bucket and word indices come from the hash's low bits");
static_assert(kFirstDigest + 253 == 256, "occupied digests are 3..255: 0, 1 and 2 mark empty, removed, claiming");

enum class EvictPolicy : int32_t { kLru = 0, kLfu = 1 };

struct GpuTableOptions {
  int64_t width = 1;
  // Growing tables: expected keys (pre-sizes the arrays for them at max_load_factor). Capped tables: ignored.
  int64_t initial_capacity = 0;
  // Growing tables: the load factor (occupied + removed slots) that triggers a rehash to twice the slots.
  double max_load_factor = 0.75;
  // 0: grow on demand. > 0: a fixed table of capacity_limit slots (rounded up to a power of two >= 128) that
  // evicts by `policy` when a bucket is full.
  int64_t capacity_limit = 0;
  EvictPolicy policy = EvictPolicy::kLru;
  // Compact rows (row_codec.h), as the CPU core's TableOptions: the leading compact_cols columns of every row are
  // stored as bfloat16 or float16, the others as float32 (kFloat32 or compact_cols = 0: float32 rows). Callers
  // still read and write float32; writes round: Update and FindOrInsertWith's initialized rows with `rounding`
  // (stochastic bits from StochasticBits(key, the version the write leaves, column)), every other write to
  // nearest. int8 rows are a serving format: not stored here.
  RowStorage storage = RowStorage::kFloat32;
  int64_t compact_cols = 0;
  Rounding rounding = Rounding::kNearest;
};

// Empty when valid, else a message naming the first problem.
inline std::string ValidateGpuTableOptions(const GpuTableOptions& o) {
  if (o.width < 1 || o.width > kMaxGpuWidth) {
    return "width must be in [1, 2^24], got " + std::to_string(o.width);
  }
  if (o.initial_capacity < 0 || o.initial_capacity > kMaxCapacity) {
    return "initial_capacity must be in [0, 2^" + std::to_string(kMaxCapacityLog2) + "], got " +
           std::to_string(o.initial_capacity);
  }
  if (!(o.max_load_factor > 0.0 && o.max_load_factor <= 0.95)) {
    return "max_load_factor must be in (0, 0.95], got " + std::to_string(o.max_load_factor);
  }
  if (o.capacity_limit < 0 || o.capacity_limit > kMaxCapacity) {
    return "capacity_limit must be 0 (grow) or in [1, 2^" + std::to_string(kMaxCapacityLog2) + "], got " +
           std::to_string(o.capacity_limit);
  }
  if (o.policy != EvictPolicy::kLru && o.policy != EvictPolicy::kLfu) return "policy must be LRU or LFU";
  if (o.storage == RowStorage::kInt8Row) {
    return "storage int8_row is a serving format: the CUDA table stores float32, bfloat16 or float16 columns";
  }
  if (o.storage != RowStorage::kFloat32 && o.storage != RowStorage::kBFloat16 && o.storage != RowStorage::kFloat16) {
    return "storage must be float32, bfloat16 or float16, got " + std::to_string(static_cast<int32_t>(o.storage));
  }
  if (o.compact_cols < 0 || o.compact_cols > o.width) {
    return "compact_cols must be in [0, width=" + std::to_string(o.width) + "], got " + std::to_string(o.compact_cols);
  }
  if (o.rounding != Rounding::kNearest && o.rounding != Rounding::kStochastic) {
    return "rounding must be nearest or stochastic, got " + std::to_string(static_cast<int32_t>(o.rounding));
  }
  return "";
}

// How a row's float32 columns lie in its bytes: [compact area CompactBytes(storage, compact_cols) | (width -
// compact_cols) float32], row_bytes in all (a multiple of 4, so every row and its float32 columns stay 4-byte
// aligned). Float32 tables have no compact area: column c is the float at byte 4c, as before compact rows.
struct RowFormat {
  RowStorage storage = RowStorage::kFloat32;
  Rounding rounding = Rounding::kNearest;
  int64_t width = 0;
  int64_t compact_cols = 0;   // 0 for float32 tables
  int64_t compact_bytes = 0;  // CompactBytes(storage, compact_cols)
  int64_t row_bytes = 0;

  static RowFormat Of(const GpuTableOptions& o) {
    RowFormat f;
    f.width = o.width;
    if (o.storage != RowStorage::kFloat32 && o.compact_cols > 0) {
      f.storage = o.storage;
      f.compact_cols = o.compact_cols;
      f.compact_bytes = CompactBytes(o.storage, o.compact_cols);
      f.rounding = o.rounding;
    }
    f.row_bytes = f.compact_bytes + 4 * (o.width - f.compact_cols);
    return f;
  }

  // The same rows: the same columns stored the same way and rounded the same way. Of() leaves the storage and the
  // rounding of a table without compact columns at their defaults, so options that differ only in those (float32
  // rows round nothing) give the same format, as the CPU table's TableLayout::SameAs decides.
  bool SameAs(const RowFormat& o) const {
    return width == o.width && storage == o.storage && compact_cols == o.compact_cols && rounding == o.rounding;
  }

  TFEXT_HOST_DEVICE bool compact() const { return compact_cols > 0; }

  // Column c of a row, as float32.
  TFEXT_HOST_DEVICE float Read(const char* row, int64_t c) const {
    if (c >= compact_cols) return reinterpret_cast<const float*>(row + compact_bytes)[c - compact_cols];
    float v;
    DecodeElements(storage, row, c, 1, &v);
    return v;
  }

  // Writes v to column c of a row; a compact column rounds by `r` (stochastic: with the bits of the key and the
  // version the row holds, which the caller passes).
  TFEXT_HOST_DEVICE void Write(char* row, int64_t c, float v, Rounding r, int64_t key, int64_t version) const {
    if (c >= compact_cols) {
      reinterpret_cast<float*>(row + compact_bytes)[c - compact_cols] = v;
    } else {
      EncodeElements(storage, &v, c, 1, row, r, key, version);
    }
  }
};

// Device-side counters of a table (one struct in device memory).
struct TableCounters {
  unsigned long long size;        // occupied slots
  unsigned long long used;        // occupied + removed slots (growing tables rehash on it)
  unsigned long long failed;      // keys a write could not store (capped: bucket all touched; growing: full)
  unsigned long long evicted;     // entries evicted (capped)
  unsigned long long duplicates;  // set (to 1) by a deduplication that was asked to flag duplicate keys
  unsigned long long cursor;      // export / compaction cursor
};

// ------------------------------------------------------------------------------------------------------------
// Atomics and bit tricks, one definition for both compilers.
namespace hd {

TFEXT_HOST_DEVICE inline uint32_t Cas32(uint32_t* p, uint32_t expected, uint32_t desired) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(reinterpret_cast<unsigned int*>(p), expected, desired);
#else
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;
#endif
}

TFEXT_HOST_DEVICE inline long long Cas64(long long* p, long long expected, long long desired) {
#if defined(__CUDA_ARCH__)
  return static_cast<long long>(atomicCAS(reinterpret_cast<unsigned long long*>(p),
                                          static_cast<unsigned long long>(expected),
                                          static_cast<unsigned long long>(desired)));
#else
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;
#endif
}

// Digest words are only ever changed by 64-bit atomics on the whole word (readers load whole words: atomics and
// loads of one size pair up in the PTX memory model).
TFEXT_HOST_DEVICE inline uint64_t CasWord(uint64_t* p, uint64_t expected, uint64_t desired) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(reinterpret_cast<unsigned long long*>(p), expected, desired);
#else
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  return expected;
#endif
}

TFEXT_HOST_DEVICE inline void XorWordRelease(uint64_t* p, uint64_t v) {  // publishes the writes before it
#if defined(__CUDA_ARCH__)
  __threadfence();
  atomicXor(reinterpret_cast<unsigned long long*>(p), v);
#else
  __atomic_fetch_xor(p, v, __ATOMIC_RELEASE);
#endif
}

// Adds v to a counter that many threads of a kernel may update (removals, failures, cursors) and returns the value
// before this thread's share. On the device, same-address atomics serialize (one per key cost ~0.3 ms per million
// keys on an H100), so the threads of a warp that arrive together add once: the group's first thread adds
// v * size and each thread gets base + v * rank. v must be the same for the whole group (each call site passes a
// constant). Even once per warp, same-address atomics cost ~0.1 ms per million threads on an H100: counts that
// every key of a batch contributes to go through Backend::CountIf (one atomic per block) instead.
TFEXT_HOST_DEVICE inline unsigned long long CounterAdd(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  const cooperative_groups::coalesced_group g = cooperative_groups::coalesced_threads();
  unsigned long long base = 0;
  if (g.thread_rank() == 0) base = atomicAdd(p, v * g.size());
  return g.shfl(base, 0) + v * g.thread_rank();
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

// Sets a flag that any number of threads may set at once (all store the same value).
TFEXT_HOST_DEVICE inline void SetFlag(unsigned long long* p) {
#if defined(__CUDA_ARCH__)
  *p = 1;
#else
  __atomic_store_n(p, 1ULL, __ATOMIC_RELAXED);
#endif
}

TFEXT_HOST_DEVICE inline uint32_t Add32(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(reinterpret_cast<unsigned int*>(p), v);
#else
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

TFEXT_HOST_DEVICE inline void MinI64(long long* p, long long v) {
#if defined(__CUDA_ARCH__)
  atomicMin(p, v);
#else
  long long cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < cur && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

TFEXT_HOST_DEVICE inline void MaxI64(long long* p, long long v) {
#if defined(__CUDA_ARCH__)
  atomicMax(p, v);
#else
  long long cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > cur && !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

TFEXT_HOST_DEVICE inline void AddF32(float* p, float v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  uint32_t* bits = reinterpret_cast<uint32_t*>(p);
  uint32_t cur = __atomic_load_n(bits, __ATOMIC_RELAXED);
  for (;;) {
    float f;
    std::memcpy(&f, &cur, sizeof(f));
    f += v;
    uint32_t next;
    std::memcpy(&next, &f, sizeof(next));
    if (__atomic_compare_exchange_n(bits, &cur, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return;
  }
#endif
}

// Orders the loads after it after the (volatile) load before it: with a publisher's release (XorWordRelease), what
// it wrote before publishing is visible. Only taken where a digest matched, not on every probed word.
TFEXT_HOST_DEVICE inline void AcquireFence() {
#if defined(__CUDA_ARCH__)
  __threadfence();
#else
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

// A load that sees what another thread of the same kernel wrote (on the device, L1 caches are not coherent between
// multiprocessors: a plain load may return a line cached before the other thread's write).
template <class T>
TFEXT_HOST_DEVICE inline T LoadShared(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile T*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

TFEXT_HOST_DEVICE inline void Lock(uint32_t* lock) {
  while (Cas32(lock, 0u, 1u) != 0u) {
#if defined(__CUDA_ARCH__)
    __nanosleep(32);
#endif
  }
#if defined(__CUDA_ARCH__)
  __threadfence();
#endif
}

TFEXT_HOST_DEVICE inline void Unlock(uint32_t* lock) {
#if defined(__CUDA_ARCH__)
  __threadfence();
  atomicExch(reinterpret_cast<unsigned int*>(lock), 0u);
#else
  __atomic_store_n(lock, 0u, __ATOMIC_RELEASE);
#endif
}

TFEXT_HOST_DEVICE inline int LowestSetByte(uint64_t m) {  // m != 0, high bits of bytes set
#if defined(__CUDA_ARCH__)
  return (__ffsll(static_cast<long long>(m)) - 1) >> 3;
#else
  return __builtin_ctzll(m) >> 3;
#endif
}

constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7FULL;
constexpr uint64_t kOnes = 0x0101010101010101ULL;

// The high bit of every zero byte of x (exact: no false positives).
TFEXT_HOST_DEVICE inline uint64_t ZeroBytes(uint64_t x) { return ~(((x & kLow7) + kLow7) | x | kLow7); }
// The high bit of every byte of word equal to b.
TFEXT_HOST_DEVICE inline uint64_t MatchBytes(uint64_t word, uint32_t b) { return ZeroBytes(word ^ (kOnes * b)); }

}  // namespace hd

// ------------------------------------------------------------------------------------------------------------
// The table's arrays (device memory for DeviceBackend), as the views and the host class share them.
struct TableArrays {
  uint64_t* digests = nullptr;  // [capacity / 8]: 8 one-byte digests per word
  int64_t* keys = nullptr;      // [capacity]
  char* rows = nullptr;         // [capacity * format.row_bytes]
  int64_t* versions = nullptr;  // [capacity]
  uint32_t* freqs = nullptr;    // [capacity]
  uint32_t* epochs = nullptr;   // [capacity], capped tables: the last write batch that touched the slot
  uint32_t* locks = nullptr;    // [capacity / 128], capped tables: one spin lock per bucket
  TableCounters* counters = nullptr;
  int64_t capacity = 0;  // slots: a power of two >= kBucketSlots
  int64_t width = 0;
  RowFormat format;
  bool capped = false;
  EvictPolicy policy = EvictPolicy::kLru;
};

// e = i * cols + c, in 32-bit arithmetic where it fits (a 64-bit division costs the device dozens of instructions).
TFEXT_HOST_DEVICE inline void SplitIndex(int64_t e, int64_t cols, int64_t* i, int64_t* c) {
  if (e <= 0xffffffffLL && cols <= 0xffffffffLL) {
    const uint32_t q = static_cast<uint32_t>(e) / static_cast<uint32_t>(cols);
    *i = q;
    *c = e - static_cast<int64_t>(q) * cols;
  } else {
    *i = e / cols;
    *c = e % cols;
  }
}

// The digest of an occupied slot, from hash bits the home position does not use (capacity <= 2^40).
TFEXT_HOST_DEVICE inline uint32_t DigestOf(uint64_t h) {
  return kFirstDigest + static_cast<uint32_t>((h >> kMaxCapacityLog2) % (256u - kFirstDigest));
}

// The i-th digest word a probe that starts at home_word visits.
TFEXT_HOST_DEVICE inline int64_t ProbeWord(int64_t home_word, int64_t i, int64_t num_words, bool capped) {
  if (capped) {
    const int64_t base = home_word & ~static_cast<int64_t>(kWordsPerBucket - 1);
    return base + ((home_word + i) & (kWordsPerBucket - 1));
  }
  return (home_word + i) & (num_words - 1);
}

TFEXT_HOST_DEVICE inline uint32_t DigestByte(uint64_t word, int j) {
  return static_cast<uint32_t>(word >> (8 * j)) & 0xffu;
}

// Read-only view: probes and reads. Every pointer is const, so a kernel given a ReadView cannot write the table.
class ReadView {
 public:
  TFEXT_HOST_DEVICE explicit ReadView(const TableArrays& a)
      : digests_(a.digests),
        keys_(a.keys),
        rows_(a.rows),
        versions_(a.versions),
        freqs_(a.freqs),
        capacity_(a.capacity),
        width_(a.width),
        format_(a.format),
        capped_(a.capped) {}

  // The slot holding key, or -1.
  TFEXT_HOST_DEVICE int64_t FindSlot(int64_t key) const {
    const uint64_t h = Murmur3Fmix64(static_cast<uint64_t>(key));
    const uint32_t d = DigestOf(h);
    const int64_t num_words = capacity_ / kDigestsPerWord;
    const int64_t home = static_cast<int64_t>(h & static_cast<uint64_t>(capacity_ - 1)) / kDigestsPerWord;
    const int64_t probe_len = capped_ ? kWordsPerBucket : num_words;
    for (int64_t i = 0; i < probe_len; ++i) {
      const int64_t w = ProbeWord(home, i, num_words, capped_);
      const uint64_t word = digests_[w];
      for (uint64_t m = hd::MatchBytes(word, d); m != 0; m &= m - 1) {
        const int64_t s = w * kDigestsPerWord + hd::LowestSetByte(m);
        if (keys_[s] == key) return s;
      }
      if (hd::ZeroBytes(word) != 0) return -1;  // an empty slot ends every probe
    }
    return -1;
  }

  TFEXT_HOST_DEVICE bool Occupied(int64_t slot) const {
    return DigestByte(digests_[slot / kDigestsPerWord], static_cast<int>(slot % kDigestsPerWord)) >= kFirstDigest;
  }
  // Column c of the slot's row, as float32 (decoded from a compact column).
  TFEXT_HOST_DEVICE float Column(int64_t slot, int64_t c) const { return format_.Read(Row(slot), c); }
  TFEXT_HOST_DEVICE const char* Row(int64_t slot) const { return rows_ + slot * format_.row_bytes; }
  TFEXT_HOST_DEVICE const RowFormat& format() const { return format_; }
  TFEXT_HOST_DEVICE int64_t Key(int64_t slot) const { return keys_[slot]; }
  TFEXT_HOST_DEVICE int64_t Version(int64_t slot) const { return versions_[slot]; }
  TFEXT_HOST_DEVICE uint32_t Frequency(int64_t slot) const { return freqs_[slot]; }
  TFEXT_HOST_DEVICE int64_t capacity() const { return capacity_; }
  TFEXT_HOST_DEVICE int64_t width() const { return width_; }

 private:
  const uint64_t* digests_;
  const int64_t* keys_;
  const char* rows_;
  const int64_t* versions_;
  const uint32_t* freqs_;
  int64_t capacity_;
  int64_t width_;
  RowFormat format_;
  bool capped_;
};

// Mutable view: claims, evicts, removes and writes. Within one kernel, the keys given to FindOrClaim must be
// distinct (the host class deduplicates every batch first).
class MutableView {
 public:
  TFEXT_HOST_DEVICE explicit MutableView(const TableArrays& a) : a_(a) {}

  TFEXT_HOST_DEVICE ReadView read() const { return ReadView(a_); }

  // The slot of key, claiming one if it is absent (*inserted = true; the caller writes its row and metadata). In a
  // capped table the slot is stamped with epoch, so no other key of the same batch evicts it, and the claim is
  // counted (size, used, evicted); in a growing table the caller counts its claims after the kernel
  // (BucketTable::CountClaims). Returns -1 when the key cannot be stored (counted in counters->failed).
  TFEXT_HOST_DEVICE int64_t FindOrClaim(int64_t key, uint32_t epoch, bool* inserted) const {
    *inserted = false;
    const uint64_t h = Murmur3Fmix64(static_cast<uint64_t>(key));
    const uint32_t d = DigestOf(h);
    const int64_t num_words = a_.capacity / kDigestsPerWord;
    const int64_t home = static_cast<int64_t>(h & static_cast<uint64_t>(a_.capacity - 1)) / kDigestsPerWord;
    if (a_.capped) return FindOrClaimCapped(key, d, home, num_words, epoch, inserted);
    const int64_t s = ProbeOrClaim(key, d, home, num_words, inserted);
    if (s < 0) hd::CounterAdd(&a_.counters->failed, 1);
    return s;
  }

  // Removes key; true if it was present.
  TFEXT_HOST_DEVICE bool Remove(int64_t key) const {
    const uint64_t h = Murmur3Fmix64(static_cast<uint64_t>(key));
    const uint32_t d = DigestOf(h);
    const int64_t home = static_cast<int64_t>(h & static_cast<uint64_t>(a_.capacity - 1)) / kDigestsPerWord;
    uint32_t* lock = a_.capped ? &a_.locks[home / kWordsPerBucket] : nullptr;
    if (lock) hd::Lock(lock);
    const int64_t s = read().FindSlot(key);
    bool removed = false;
    if (s >= 0) {
      uint64_t* word = &a_.digests[s / kDigestsPerWord];
      const int shift = 8 * static_cast<int>(s % kDigestsPerWord);
      // Only one of two threads removing the same key wins (a batch may name a key twice).
      uint64_t cur = hd::LoadShared(word);
      while (((cur >> shift) & 0xffu) == d) {
        const uint64_t seen = hd::CasWord(word, cur, cur ^ (uint64_t{d ^ kRemovedDigest} << shift));
        if (seen == cur) {
          removed = true;
          break;
        }
        cur = seen;
      }
    }
    if (removed) hd::CounterAdd(&a_.counters->size, ~0ULL);  // - 1
    if (lock) hd::Unlock(lock);
    return removed;
  }

  // Capped tables: marks the slot of a stored key as touched by the batch of `epoch` (no lock: the kernel that calls
  // it changes no digest or key, and its keys are distinct).
  TFEXT_HOST_DEVICE void Stamp(int64_t key, uint32_t epoch) const {
    const int64_t s = read().FindSlot(key);
    if (s >= 0) a_.epochs[s] = epoch;
  }

  TFEXT_HOST_DEVICE char* Row(int64_t slot) const { return a_.rows + slot * a_.format.row_bytes; }
  TFEXT_HOST_DEVICE int64_t width() const { return a_.width; }
  TFEXT_HOST_DEVICE const RowFormat& format() const { return a_.format; }
  // Writes v to column c of the slot's row (compact columns round by r; stochastic bits from the slot's key and
  // version, so the slot's metadata must be final: writers run after the pass that touched it).
  TFEXT_HOST_DEVICE void SetColumn(int64_t slot, int64_t c, float v, Rounding r) const {
    const bool stochastic = r == Rounding::kStochastic && c < a_.format.compact_cols;
    a_.format.Write(Row(slot), c, v, r, stochastic ? a_.keys[slot] : 0, stochastic ? a_.versions[slot] : 0);
  }
  // Column c of the slot's row += delta, atomically (other threads of the kernel may add to the same column or, in
  // a compact row, to the other half of its 32-bit word). A compact column rounds to nearest at every addition.
  TFEXT_HOST_DEVICE void AddToColumn(int64_t slot, int64_t c, float delta) const {
    const RowFormat& f = a_.format;
    char* row = Row(slot);
    if (c >= f.compact_cols) {
      hd::AddF32(reinterpret_cast<float*>(row + f.compact_bytes) + (c - f.compact_cols), delta);
      return;
    }
    // The 16-bit column is half of an aligned 32-bit word (rows and compact areas are 4-byte aligned): a
    // compare-and-swap of the word, little-endian (x86-64 and CUDA devices).
    uint32_t* word = reinterpret_cast<uint32_t*>(row + 4 * (c / 2));
    const int shift = 16 * static_cast<int>(c % 2);
    uint32_t cur = hd::LoadShared(word);
    for (;;) {
      const uint16_t half = static_cast<uint16_t>(cur >> shift);
      const bool bf16 = f.storage == RowStorage::kBFloat16;
      const float v = (bf16 ? BFloat16ToFloat(half) : Float16ToFloat(half)) + delta;
      const uint16_t rounded =
          bf16 ? FloatToBFloat16(v, Rounding::kNearest, 0) : FloatToFloat16(v, Rounding::kNearest, 0);
      const uint32_t next = (cur & ~(uint32_t{0xffffu} << shift)) | (static_cast<uint32_t>(rounded) << shift);
      const uint32_t seen = hd::Cas32(word, cur, next);
      if (seen == cur) return;
      cur = seen;
    }
  }
  // Metadata of a slot this thread claimed or found (no other thread of the kernel touches it).
  TFEXT_HOST_DEVICE void ResetMeta(int64_t slot) const {
    a_.versions[slot] = 0;
    a_.freqs[slot] = 0;
  }
  TFEXT_HOST_DEVICE void Touch(int64_t slot, uint32_t occurrences, int64_t version) const {
    if (occurrences > 0) {
      const uint32_t f = a_.freqs[slot];
      a_.freqs[slot] = f > 0xffffffffu - occurrences ? 0xffffffffu : f + occurrences;  // saturating, as the CPU core
    }
    if (version >= 0) a_.versions[slot] = version;
  }
  // FindOrClaim, then the metadata of the key's slot: reset if claimed, then touched (Touch).
  TFEXT_HOST_DEVICE int64_t FindOrClaimTouched(int64_t key, uint32_t epoch, uint32_t occurrences, int64_t version,
                                               bool* inserted) const {
    const int64_t s = FindOrClaim(key, epoch, inserted);
    if (s >= 0) {
      if (*inserted) ResetMeta(s);
      Touch(s, occurrences, version);
    }
    return s;
  }
  // Copies an entry of another table into the slot this thread claimed (rehash).
  TFEXT_HOST_DEVICE void CopyEntry(int64_t slot, const ReadView& from, int64_t from_slot) const {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(from.Row(from_slot));  // the same format: 4-byte words
    uint32_t* dst = reinterpret_cast<uint32_t*>(Row(slot));
    for (int64_t w = 0; w < a_.format.row_bytes / 4; ++w) dst[w] = src[w];
    a_.versions[slot] = from.Version(from_slot);
    a_.freqs[slot] = from.Frequency(from_slot);
  }
  TFEXT_HOST_DEVICE TableCounters* counters() const { return a_.counters; }

 private:
  // Growing tables: linear probing over digest words from home; claims the first empty slot if key is absent.
  // Counts nothing (FindOrClaim does).
  TFEXT_HOST_DEVICE int64_t ProbeOrClaim(int64_t key, uint32_t d, int64_t home, int64_t num_words,
                                         bool* inserted) const {
    for (int64_t i = 0; i < num_words; ++i) {
      const int64_t w = ProbeWord(home, i, num_words, false);
      for (;;) {
        const uint64_t word = hd::LoadShared(&a_.digests[w]);
        uint64_t m = hd::MatchBytes(word, d);
        if (m != 0) hd::AcquireFence();  // the keys of published digests are visible
        for (; m != 0; m &= m - 1) {
          const int64_t s = w * kDigestsPerWord + hd::LowestSetByte(m);
          if (hd::LoadShared(&a_.keys[s]) == key) return s;
        }
        const uint64_t empty = hd::ZeroBytes(word);
        if (empty == 0) break;  // no free slot here: next word
        const int j = hd::LowestSetByte(empty);
        const int shift = 8 * j;
        if (hd::CasWord(&a_.digests[w], word, word | (uint64_t{kClaimingDigest} << shift)) == word) {
          const int64_t s = w * kDigestsPerWord + j;
          a_.keys[s] = key;
          // release: the key is visible before the final digest
          hd::XorWordRelease(&a_.digests[w], uint64_t{kClaimingDigest ^ d} << shift);
          *inserted = true;
          return s;
        }
        // Another thread changed the word: look at it again.
      }
    }
    return -1;  // full
  }

  // Capped tables: find, else claim a free (empty or removed) slot of the bucket, else evict the entry of lowest
  // score that this batch has not touched; all under the bucket's lock.
  TFEXT_HOST_DEVICE int64_t FindOrClaimCapped(int64_t key, uint32_t d, int64_t home, int64_t num_words, uint32_t epoch,
                                              bool* inserted) const {
    uint32_t* lock = &a_.locks[home / kWordsPerBucket];
    hd::Lock(lock);
    volatile uint64_t* digests = a_.digests;
    int64_t found = -1, free_slot = -1;
    bool free_was_empty = false;
    for (int64_t i = 0; i < kWordsPerBucket && found < 0; ++i) {
      const int64_t w = ProbeWord(home, i, num_words, true);
      const uint64_t word = digests[w];
      for (uint64_t m = hd::MatchBytes(word, d); m != 0; m &= m - 1) {
        const int64_t s = w * kDigestsPerWord + hd::LowestSetByte(m);
        if (hd::LoadShared(&a_.keys[s]) == key) {
          found = s;
          break;
        }
      }
      if (found >= 0) break;
      const uint64_t empty = hd::ZeroBytes(word);
      if (free_slot < 0) {
        const uint64_t f = empty | hd::MatchBytes(word, kRemovedDigest);
        if (f != 0) {
          const int j = hd::LowestSetByte(f);
          free_slot = w * kDigestsPerWord + j;
          free_was_empty = DigestByte(word, j) == kEmptyDigest;
        }
      }
      if (empty != 0) break;
    }
    int64_t slot = found;
    if (slot < 0) {
      slot = free_slot;
      if (slot >= 0) {
        hd::CounterAdd(&a_.counters->size, 1);
        if (free_was_empty) hd::CounterAdd(&a_.counters->used, 1);
      } else {
        slot = Victim(home, epoch);
        if (slot >= 0) hd::CounterAdd(&a_.counters->evicted, 1);
      }
      if (slot >= 0) {
        a_.keys[slot] = key;
        reinterpret_cast<volatile uint8_t*>(a_.digests)[slot] = static_cast<uint8_t>(d);
        *inserted = true;
      } else {
        hd::CounterAdd(&a_.counters->failed, 1);
      }
    }
    if (slot >= 0) a_.epochs[slot] = epoch;
    hd::Unlock(lock);
    return slot;
  }

  // The bucket's occupied slot of lowest score not stamped with epoch, or -1 (the batch touched all of them).
  TFEXT_HOST_DEVICE int64_t Victim(int64_t home, uint32_t epoch) const {
    const int64_t first = (home / kWordsPerBucket) * kBucketSlots;
    int64_t best = -1;
    int64_t best_score = 0;
    for (int64_t s = first; s < first + kBucketSlots; ++s) {
      if (hd::LoadShared(&a_.epochs[s]) == epoch) continue;
      const int64_t score = a_.policy == EvictPolicy::kLru ? hd::LoadShared(&a_.versions[s])
                                                           : static_cast<int64_t>(hd::LoadShared(&a_.freqs[s]));
      if (best < 0 || score < best_score) {
        best = s;
        best_score = score;
      }
    }
    return best;
  }

  TableArrays a_;
};

// ------------------------------------------------------------------------------------------------------------
// Kernels: one functor per pass, f(i) for i in [0, n). The backend runs them on the device (one thread per i) or
// on host threads.
namespace kernels {

// A batch entry whose key could not be stored: FindOrInsert wrote its initial row straight into the output.
constexpr int64_t kRowInOutput = -2;

// Deduplicates a batch: rep[i] is the batch index that represents keys[i] (the first to claim it in the scratch
// set); first/last/mult of a representative (each only if non-null: one atomic per entry each): lowest and highest
// batch index of its key, and how many times it occurs. The set stores batch indices (-1 = free), so every int64
// stays a valid key.
struct Dedup {
  const int64_t* keys;
  long long* set;
  int64_t set_mask;
  long long* rep;
  long long* first;
  long long* last;
  uint32_t* mult;
  unsigned long long* duplicates;  // set to 1 if a key occurs twice (null: not asked)
  TFEXT_HOST_DEVICE void operator()(int64_t i) const {
    const int64_t key = keys[i];
    int64_t p = static_cast<int64_t>(SplitMix64(static_cast<uint64_t>(key)) & static_cast<uint64_t>(set_mask));
    long long r;
    for (;;) {
      long long cur = hd::LoadShared(&set[p]);  // a batch index; keys[] is the immutable input
      if (cur < 0) {
        cur = hd::Cas64(&set[p], -1, i);
        if (cur < 0) {
          r = i;
          break;
        }
      }
      if (keys[cur] == key) {
        r = cur;
        break;
      }
      p = (p + 1) & set_mask;
    }
    rep[i] = r;
    if (duplicates && r != i) hd::SetFlag(duplicates);
    if (first) hd::MinI64(&first[r], i);
    if (last) hd::MaxI64(&last[r], i);
    if (mult) hd::Add32(&mult[r], 1);
  }
};

// Entry i is a representative whose key the table does not hold (EnsureRoom counts them).
struct IsMissingRep {
  ReadView t;
  const int64_t* keys;
  const long long* rep;  // null: every entry is its own representative
  TFEXT_HOST_DEVICE bool operator()(int64_t i) const {
    return (rep == nullptr || rep[i] == i) && t.FindSlot(keys[i]) < 0;
  }
};

// Growing tables, after a claim pass: entry i is a representative whose key the pass inserted.
struct IsNewRep {
  const long long* rep;  // null: every entry is its own representative
  const uint8_t* rep_inserted;
  TFEXT_HOST_DEVICE bool operator()(int64_t i) const { return (rep == nullptr || rep[i] == i) && rep_inserted[i]; }
};

// Capped tables, before a write batch: stamps the stored keys of the batch, so that no key of the batch evicts
// another one whatever order the threads take the bucket locks in.
struct StampBatch {
  MutableView t;
  const int64_t* keys;
  const long long* rep;
  uint32_t epoch;
  TFEXT_HOST_DEVICE void operator()(int64_t i) const {
    if (rep[i] == i) t.Stamp(keys[i], epoch);
  }
};

struct Find {
  ReadView t;
  const int64_t* keys;
  long long* slot_of;
  TFEXT_HOST_DEVICE void operator()(int64_t i) const { slot_of[i] = t.FindSlot(keys[i]); }
};

// The columns x = c, c + step, c + 2 * step, ... of a new row outside [skip_begin, skip_end) get column_defaults
// (or zeros; compact columns round to nearest): the threads c in [0, step) of one row together write every column
// outside the range.
TFEXT_HOST_DEVICE inline void WriteDefaultColumns(const MutableView& t, int64_t slot, const float* defaults, int64_t c,
                                                  int64_t step, int64_t skip_begin, int64_t skip_end) {
  for (int64_t x = c; x < t.width(); x += step) {
    if (x < skip_begin || x >= skip_end) t.SetColumn(slot, x, defaults ? defaults[x] : 0.0f, Rounding::kNearest);
  }
}

// FindOrInsert, pass 1 (representatives): find or claim. The initial row of a new key (init: the caller's
// initializer, or the given rows of RowOfFirstOccurrence) goes to the key's own output row, contiguous for the
// thread; pass 2 (WriteColumns) copies it into the table a warp-wide row at a time.
template <class InitRow>
struct FindOrInsert {
  MutableView t;
  const int64_t* keys;
  const long long* rep;
  const long long* first;
  const uint32_t* mult;
  InitRow init;
  int64_t cols;
  bool count;
  int64_t version;
  uint32_t epoch;
  long long* slot_of;
  uint8_t* rep_inserted;
  float* out;  // [n, cols]: initial rows of the keys this pass inserted or could not store
  TFEXT_HOST_DEVICE void operator()(int64_t i) const {
    if (rep[i] != i) return;
    const int64_t key = keys[i];
    bool inserted = false;
    const int64_t s = t.FindOrClaimTouched(key, epoch, count ? mult[i] : 0, version, &inserted);
    if (s < 0 || inserted) init(first[i], key, out + i * cols);
    slot_of[i] = s >= 0 ? s : kRowInOutput;
    rep_inserted[i] = inserted ? 1 : 0;
  }
};

// FindOrInsert's initial rows given as data: a new key's row is rows[first occurrence] ([n, cols]).
struct RowOfFirstOccurrence {
  const float* rows;
  int64_t cols;
  TFEXT_HOST_DEVICE void operator()(int64_t first, int64_t /*key*/, float* dst) const {
    const float* src = rows + first * cols;
    for (int64_t c = 0; c < cols; ++c) dst[c] = src[c];
  }
};

// Output rows, one element per call (e = i * cols + c): from the slot batch entry i resolved to (through its
// representative when rep is non-null); default_row (or untouched, if null) for missing keys. found / inserted
// flags are written with the first column. A new key's row that FindOrInsert left in the output is kept there in a
// float32 table; a compact table's is read back as stored (rounded).
struct Gather {
  ReadView t;
  const long long* rep;  // null: entry i is its own representative
  const long long* slot_of;
  int64_t col_begin, cols;
  const float* default_row;
  float* out;
  uint8_t* found;               // Find
  const uint8_t* rep_inserted;  // FindOrInsert
  const long long* first;
  uint8_t* inserted;
  TFEXT_HOST_DEVICE void operator()(int64_t e) const {
    int64_t i, c;
    SplitIndex(e, cols, &i, &c);
    const int64_t r = rep ? rep[i] : i;
    const int64_t s = slot_of[r];
    const bool row_in_output = rep_inserted && r == i && rep_inserted[r] && !t.format().compact();
    if (s >= 0 && !row_in_output) {
      out[e] = t.Column(s, col_begin + c);
    } else if (s == kRowInOutput) {
      if (r != i) out[e] = out[r * cols + c];
    } else if (default_row) {
      out[e] = default_row[c];
    }
    if (c == 0) {
      if (found) found[i] = s >= 0 ? 1 : 0;
      if (inserted) inserted[i] = (rep_inserted[r] && first[r] == i) ? 1 : 0;
    }
  }
};

// Writes take two passes: one thread per key finds or claims the slot (ClaimSlots, FindOrInsert), then one thread
// per element writes the row (WriteColumns, UpdateElements), so that a warp's loads and stores cover consecutive
// columns of one row. With one thread writing a whole row, each access of a warp touched 32 rows: on an H100, 86% of
// the sectors a fused Adam apply moved were wasted and it ran 30x slower than a find of the same keys.

// Pass 1 (one key per call; representatives only when rep is non-null): the slot of each key, claimed if absent,
// its metadata reset (new keys) and touched. slot_of[i] = -1 for a key that could not be stored.
struct ClaimSlots {
  MutableView t;
  const int64_t* keys;
  const long long* rep;  // null: the keys are distinct
  const uint32_t* mult;
  bool count;
  int64_t version;
  uint32_t epoch;
  long long* slot_of;
  uint8_t* rep_inserted;
  TFEXT_HOST_DEVICE void operator()(int64_t i) const {
    if (rep && rep[i] != i) return;
    bool inserted = false;
    slot_of[i] = t.FindOrClaimTouched(keys[i], epoch, count ? mult[i] : 0, version, &inserted);
    rep_inserted[i] = inserted ? 1 : 0;
  }
};

// Pass 2 of Insert and FindOrInsert (one element per call: e = i * cols + c): the representative's row gets column c
// of src[src_row[i]] (src_row null: src[i]), compact columns rounded by `rounding`; a row pass 1 claimed gets
// column_defaults (or zeros) elsewhere. new_rows_only: rows pass 1 found keep their values (FindOrInsert).
struct WriteColumns {
  MutableView t;
  const long long* rep;
  const long long* slot_of;
  const uint8_t* rep_inserted;
  const long long* src_row;
  const float* src;
  const float* defaults;
  int64_t col_begin, cols;
  bool new_rows_only;
  Rounding rounding;
  TFEXT_HOST_DEVICE void operator()(int64_t e) const {
    int64_t i, c;
    SplitIndex(e, cols, &i, &c);
    if (rep[i] != i) return;
    const int64_t s = slot_of[i];
    const bool fresh = rep_inserted[i] != 0;
    if (s < 0 || (new_rows_only && !fresh)) return;
    if (fresh) WriteDefaultColumns(t, s, defaults, c, cols, col_begin, col_begin + cols);
    t.SetColumn(s, col_begin + c, src[(src_row ? src_row[i] : i) * cols + c], rounding);
  }
};

// Accumulate, pass 1 (representatives): the slot of each key (inserted with column_defaults if insert_missing).
struct AccumulateSlots {
  MutableView t;
  const int64_t* keys;
  const long long* rep;
  const uint32_t* mult;
  const float* defaults;
  bool insert_missing, count;
  int64_t version;
  uint32_t epoch;
  long long* slot_of;
  uint8_t* rep_inserted;
  TFEXT_HOST_DEVICE void operator()(int64_t i) const {
    if (rep[i] != i) return;
    const uint32_t occurrences = count ? mult[i] : 0;
    int64_t s;
    if (insert_missing) {
      bool inserted = false;
      s = t.FindOrClaimTouched(keys[i], epoch, occurrences, version, &inserted);
      if (inserted) WriteDefaultColumns(t, s, defaults, 0, 1, 0, 0);
      rep_inserted[i] = inserted ? 1 : 0;
    } else {
      s = t.read().FindSlot(keys[i]);
      if (s >= 0) t.Touch(s, occurrences, version);
    }
    slot_of[i] = s;
  }
};

// Accumulate, pass 2 (one element per call): row += delta, atomically (duplicates add in any order; a compact
// column rounds to nearest after each addition, as the CPU core's).
struct AccumulateAdd {
  MutableView t;
  const long long* rep;
  const long long* slot_of;
  const float* deltas;
  int64_t col_begin, cols;
  TFEXT_HOST_DEVICE void operator()(int64_t e) const {
    int64_t i, c;
    SplitIndex(e, cols, &i, &c);
    const int64_t s = slot_of[rep[i]];
    if (s >= 0) t.AddToColumn(s, col_begin + c, deltas[e]);
  }
};

struct Remove {
  MutableView t;
  const int64_t* keys;
  unsigned long long* removed;
  TFEXT_HOST_DEVICE void operator()(int64_t i) const {
    if (t.Remove(keys[i])) hd::CounterAdd(removed, 1);
  }
};

// Update, pass 2 (one element per call: e = i * cols + j; the keys are distinct): a new row (ClaimSlots) gets
// column_defaults in its columns x with x % cols == j first, as the CPU core's Update does before fn, then
// fn(i, j, row). Every column this thread writes has x % cols == j, so the threads of one row never write the same
// column. A float32 table's fn works on the stored row. A compact table's works on a float32 copy (scratch, [n,
// width]): the thread decodes its columns there, runs fn and writes them back rounded by the table's rounding (the
// CPU core's Update: decode, fn, encode).
template <class ElementFn>
struct UpdateElements {
  MutableView t;
  const long long* slot_of;
  const uint8_t* rep_inserted;
  int64_t cols;
  const float* defaults;
  float* scratch;  // compact tables: [n, width]
  ElementFn fn;
  TFEXT_HOST_DEVICE void operator()(int64_t e) const {
    int64_t i, j;
    SplitIndex(e, cols, &i, &j);
    const int64_t s = slot_of[i];
    if (s < 0) return;
    if (rep_inserted[i]) WriteDefaultColumns(t, s, defaults, j, cols, 0, 0);
    const RowFormat& f = t.format();
    if (!f.compact()) {
      fn(i, j, reinterpret_cast<float*>(t.Row(s)));
      return;
    }
    float* row = scratch + i * f.width;
    const ReadView r = t.read();
    for (int64_t x = j; x < f.width; x += cols) row[x] = r.Column(s, x);
    fn(i, j, row);
    for (int64_t x = j; x < f.width; x += cols) t.SetColumn(s, x, row[x], f.rounding);
  }
};

// Export (one slot per call): occupied slots are appended at counters->cursor.
struct Export {
  ReadView t;
  TableCounters* counters;
  int64_t col_begin, cols, max_n;
  int64_t* keys;
  float* rows;
  int64_t* versions;
  uint32_t* freqs;
  TFEXT_HOST_DEVICE void operator()(int64_t s) const {
    if (!t.Occupied(s)) return;
    const int64_t o = static_cast<int64_t>(hd::CounterAdd(&counters->cursor, 1));
    if (o >= max_n) return;
    if (keys) keys[o] = t.Key(s);
    if (rows) {
      for (int64_t c = 0; c < cols; ++c) rows[o * cols + c] = t.Column(s, col_begin + c);
    }
    if (versions) versions[o] = t.Version(s);
    if (freqs) freqs[o] = t.Frequency(s);
  }
};

// Rehash (one old slot per call): every entry moves to the new arrays (keys are distinct: no dedup needed).
struct Rehash {
  ReadView from;
  MutableView to;
  TFEXT_HOST_DEVICE void operator()(int64_t s) const {
    if (!from.Occupied(s)) return;
    bool inserted = false;
    const int64_t d = to.FindOrClaim(from.Key(s), 0, &inserted);
    if (d >= 0) to.CopyEntry(d, from, s);
  }
};

}  // namespace kernels

// ------------------------------------------------------------------------------------------------------------
struct GpuTableStats {
  int64_t size = 0;      // keys
  int64_t used = 0;      // occupied + removed slots
  int64_t failed = 0;    // keys writes could not store, since creation or Clear
  int64_t evicted = 0;   // entries evicted (capped tables), since creation or Clear
  int64_t capacity = 0;  // slots
};

// The host side of a table: owns the arrays through Backend and runs each operation as a few passes. Pointers
// given to operations (keys, rows, outputs) are Backend memory (device memory for DeviceBackend). Not thread-safe:
// one host thread drives a table (the device work of its operations is ordered on the backend's stream).
template <class Backend>
class BucketTable {
 public:
  explicit BucketTable(Backend backend = Backend()) : b_(backend) {}
  ~BucketTable() {
    FreeArrays(&a_);
    FreeScratch();
    if (counters_) b_.Free(counters_);
  }
  BucketTable(const BucketTable&) = delete;
  BucketTable& operator=(const BucketTable&) = delete;

  std::string Init(const GpuTableOptions& options) {
    std::string err = ValidateGpuTableOptions(options);
    if (!err.empty()) return err;
    o_ = options;
    int64_t slots;
    if (o_.capacity_limit > 0) {
      slots = RoundUpSlots(o_.capacity_limit);
    } else {
      slots = RoundUpSlots(static_cast<int64_t>(static_cast<double>(o_.initial_capacity) / o_.max_load_factor) + 1);
    }
    void* c = nullptr;
    err = b_.Alloc(&c, sizeof(TableCounters));
    if (!err.empty()) return "table counters: " + err;
    counters_ = static_cast<TableCounters*>(c);
    err = b_.Memset(counters_, 0, sizeof(TableCounters));
    if (!err.empty()) return err;
    return AllocArrays(slots, &a_);
  }

  ReadView read_view() const { return ReadView(a_); }
  MutableView mutable_view() { return MutableView(a_); }
  int64_t width() const { return a_.width; }
  // Bytes of one row as stored (4 * width for float32 rows).
  int64_t row_bytes() const { return a_.format.row_bytes; }
  int64_t capacity() const { return a_.capacity; }
  bool capped() const { return a_.capped; }
  Backend& backend() { return b_; }

  std::string Stats(GpuTableStats* s) {
    TableCounters c;
    std::string err = b_.CopyToHost(&c, counters_, sizeof(c));
    if (!err.empty()) return err;
    s->size = static_cast<int64_t>(c.size);
    s->used = static_cast<int64_t>(c.used);
    s->failed = static_cast<int64_t>(c.failed);
    s->evicted = static_cast<int64_t>(c.evicted);
    s->capacity = a_.capacity;
    return "";
  }

  // out[i] = columns of keys[i], found[i] = 1; missing keys: default_row (or out untouched if null), found[i] = 0.
  std::string Find(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, float* out, uint8_t* found,
                   const float* default_row) {
    std::string err = CheckBatch("Find", n, col_begin, cols);
    if (!err.empty() || n == 0) return err;
    if ((err = PrepareScratch(n)) != "") return err;
    if ((err = b_.ForEach(n, kernels::Find{read_view(), keys, s_.slot_of})) != "") return err;
    kernels::Gather g{read_view(), nullptr, s_.slot_of, col_begin, cols,   default_row,
                      out,         found,   nullptr,    nullptr,   nullptr};
    return b_.ForEach(n * cols, g);
  }

  // Missing keys are inserted: columns [col_begin, col_begin + cols) from init_rows[first occurrence] ([n, cols]),
  // the other columns from column_defaults (null: zeros). out[i] gets the key's columns; inserted[i] (may be null)
  // is 1 for the first occurrence of a key this call inserted.
  // Compact columns of new rows round to nearest (given data, as Insert).
  std::string FindOrInsert(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* init_rows,
                           const float* column_defaults, float* out, uint8_t* inserted, bool count, int64_t version) {
    if (init_rows == nullptr) return "FindOrInsert: init_rows must not be null";
    return FindOrInsertRounded(keys, n, col_begin, cols, kernels::RowOfFirstOccurrence{init_rows, cols},
                               column_defaults, out, inserted, count, version, Rounding::kNearest);
  }

  // FindOrInsert with the columns [col_begin, col_begin + cols) of new keys from an initializer (as the CPU core's
  // FindOrInsertWith): init(i, key, dst) writes the cols initial columns of key, whose first occurrence is batch
  // entry i, to dst (device code: one thread per new key, many at once). Compact columns of new rows round by the
  // table's rounding; out gets the rows as stored. Keys a capped table cannot store get init's row (unrounded) in
  // out.
  template <class InitRow>
  std::string FindOrInsertWith(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const InitRow& init,
                               const float* column_defaults, float* out, uint8_t* inserted, bool count,
                               int64_t version) {
    return FindOrInsertRounded(keys, n, col_begin, cols, init, column_defaults, out, inserted, count, version,
                               a_.format.rounding);
  }

  // Inserts or overwrites the columns (the last occurrence of a key wins); compact columns round to nearest.
  std::string Insert(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* values,
                     const float* column_defaults, bool count, int64_t version) {
    std::string err = CheckBatch("Insert", n, col_begin, cols);
    if (!err.empty() || n == 0) return err;
    uint32_t epoch = 0;
    if ((err = Dedup(keys, n, kLast | (count ? kMult : 0))) != "" || (err = EnsureRoom(keys, n)) != "" ||
        (err = BeginWrite(keys, n, &epoch)) != "") {
      return err;
    }
    kernels::ClaimSlots claim{mutable_view(), keys,  s_.rep,     s_.mult,        count,
                              version,        epoch, s_.slot_of, s_.rep_inserted};
    if ((err = b_.ForEach(n, claim)) != "" || (err = CountClaims(n, s_.rep)) != "") return err;
    kernels::WriteColumns w{mutable_view(),  s_.rep,    s_.slot_of, s_.rep_inserted, s_.last,           values,
                            column_defaults, col_begin, cols,       false,           Rounding::kNearest};
    return b_.ForEach(n * cols, w);
  }

  // row[cols] += deltas[i] for every occurrence; absent keys are inserted with column_defaults first if
  // insert_missing, else skipped.
  std::string Accumulate(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* deltas,
                         const float* column_defaults, bool insert_missing, bool count, int64_t version) {
    std::string err = CheckBatch("Accumulate", n, col_begin, cols);
    if (!err.empty() || n == 0) return err;
    if ((err = Dedup(keys, n, count ? kMult : kRepOnly)) != "") return err;
    uint32_t epoch = 0;
    if (insert_missing && (err = EnsureRoom(keys, n)) != "") return err;
    if ((err = BeginWrite(keys, insert_missing ? n : 0, &epoch)) != "") return err;
    kernels::AccumulateSlots f{mutable_view(), keys,    s_.rep, s_.mult,    column_defaults, insert_missing,
                               count,          version, epoch,  s_.slot_of, s_.rep_inserted};
    if ((err = b_.ForEach(n, f)) != "") return err;
    if (insert_missing && (err = CountClaims(n, s_.rep)) != "") return err;
    return b_.ForEach(n * cols, kernels::AccumulateAdd{mutable_view(), s_.rep, s_.slot_of, deltas, col_begin, cols});
  }

  std::string Remove(const int64_t* keys, int64_t n, int64_t* removed) {
    if (n < 0) return "Remove: n must be >= 0, got " + std::to_string(n);
    *removed = 0;
    if (n == 0) return "";
    std::string err = b_.Memset(&counters_->cursor, 0, sizeof(counters_->cursor));
    if (err.empty()) err = b_.ForEach(n, kernels::Remove{mutable_view(), keys, &counters_->cursor});
    if (!err.empty()) return err;
    unsigned long long r = 0;
    err = b_.CopyToHost(&r, &counters_->cursor, sizeof(r));
    *removed = static_cast<int64_t>(r);
    return err;
  }

  // Updates the rows of distinct keys element by element (as the CPU core's Update, a key at a time): each key's
  // slot is found or claimed (a new row gets column_defaults, null: zeros; version as in Insert), then
  // fn(i, j, row) runs once for each batch entry i and each j in [0, cols), one thread per element, the elements of
  // a row at once: fn may read and write only the columns x of row with x % cols == j (the fused optimizer steps
  // keep column j of the variable and of each slot there). A batch that names a key twice is refused, whole. In a
  // compact table fn sees the row as float32 (a scratch copy of n x width floats, kept for later batches) and its
  // compact columns are stored back rounded by the table's rounding.
  template <class ElementFn>
  std::string Update(const int64_t* keys, int64_t n, int64_t cols, const ElementFn& fn, const float* column_defaults,
                     int64_t version) {
    static_assert(std::is_trivially_copyable<ElementFn>::value,
                  "fn travels to the device by value, in a kernel's parameters: it may hold device pointers and plain "
                  "values only");
    static_assert(std::is_invocable_r<void, const ElementFn&, int64_t, int64_t, float*>::value,
                  "fn(i, j, row) updates element j of batch entry i's row");
    if (n < 0) return "Update: n must be >= 0, got " + std::to_string(n);
    if (cols < 1 || cols > a_.width) {
      return "Update: cols must be in [1, " + std::to_string(a_.width) + "], got " + std::to_string(cols);
    }
    if (n == 0) return "";
    std::string err = Dedup(keys, n, kFlagDuplicates);
    TableCounters c;
    if (err.empty()) err = b_.CopyToHost(&c, counters_, sizeof(c));
    if (!err.empty()) return err;
    if (c.duplicates) return "Update: keys must be distinct (combine the entries of a key first)";
    uint32_t epoch = 0;
    if ((err = EnsureRoom(keys, n, &c)) != "" || (err = BeginWrite(keys, n, &epoch)) != "") return err;
    kernels::ClaimSlots claim{mutable_view(), keys,  nullptr,    nullptr,        false,
                              version,        epoch, s_.slot_of, s_.rep_inserted};
    if ((err = b_.ForEach(n, claim)) != "" || (err = CountClaims(n, nullptr)) != "") return err;
    if (a_.format.compact() && (err = PrepareUpdateRows(n)) != "") return err;
    return b_.ForEach(n * cols, kernels::UpdateElements<ElementFn>{mutable_view(), s_.slot_of, s_.rep_inserted, cols,
                                                                   column_defaults, s_.update_rows, fn});
  }

  // Writes up to max_n entries (keys, rows of the column range, versions, frequencies; any may be null) and their
  // number into *n; an error if the table holds more than max_n.
  std::string Export(int64_t col_begin, int64_t cols, int64_t max_n, int64_t* keys, float* rows, int64_t* versions,
                     uint32_t* freqs, int64_t* n) {
    std::string err = CheckBatch("Export", 0, col_begin, cols);
    if (!err.empty()) return err;
    err = b_.Memset(&counters_->cursor, 0, sizeof(counters_->cursor));
    kernels::Export f{read_view(), counters_, col_begin, cols, max_n, keys, rows, versions, freqs};
    if (err.empty()) err = b_.ForEach(a_.capacity, f);
    if (!err.empty()) return err;
    unsigned long long written = 0;
    if ((err = b_.CopyToHost(&written, &counters_->cursor, sizeof(written))) != "") return err;
    *n = static_cast<int64_t>(written);
    if (*n > max_n) {
      return "Export: the table holds " + std::to_string(*n) + " entries, room was given for " + std::to_string(max_n);
    }
    return "";
  }

  // Removes every key (keeps the slots).
  std::string Clear() {
    std::string err = b_.Memset(a_.digests, 0, static_cast<size_t>(a_.capacity));
    if (err.empty() && a_.epochs) err = b_.Memset(a_.epochs, 0, static_cast<size_t>(a_.capacity) * sizeof(uint32_t));
    if (err.empty()) err = b_.Memset(counters_, 0, sizeof(TableCounters));
    return err;
  }

  // Growing tables: sizes the slots for at least `keys` keys at max_load_factor (a rehash when needed).
  std::string Reserve(int64_t keys) {
    if (keys < 0 || keys > kMaxCapacity) return "Reserve: keys must be in [0, 2^40], got " + std::to_string(keys);
    if (a_.capped) return "";
    const int64_t want = RoundUpSlots(static_cast<int64_t>(static_cast<double>(keys) / o_.max_load_factor) + 1);
    return want > a_.capacity ? RehashTo(want) : "";
  }

 private:
  // FindOrInsert(With), compact columns of new rows rounded by `rounding`.
  template <class InitRow>
  std::string FindOrInsertRounded(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const InitRow& init,
                                  const float* column_defaults, float* out, uint8_t* inserted, bool count,
                                  int64_t version, Rounding rounding) {
    static_assert(std::is_trivially_copyable<InitRow>::value,
                  "init travels to the device by value, in a kernel's parameters: it may hold device pointers and "
                  "plain values only");
    static_assert(std::is_invocable_r<void, const InitRow&, int64_t, int64_t, float*>::value,
                  "init(i, key, dst) writes the initial columns of a new key");
    std::string err = CheckBatch("FindOrInsert", n, col_begin, cols);
    if (err.empty() && out == nullptr) err = "FindOrInsert: out must not be null";
    if (!err.empty() || n == 0) return err;
    uint32_t epoch = 0;
    if ((err = Dedup(keys, n, kFirst | (count ? kMult : 0))) != "" || (err = EnsureRoom(keys, n)) != "" ||
        (err = BeginWrite(keys, n, &epoch)) != "") {
      return err;
    }
    kernels::FindOrInsert<InitRow> f{mutable_view(), keys,    s_.rep, s_.first,   s_.mult,         init, cols,
                                     count,          version, epoch,  s_.slot_of, s_.rep_inserted, out};
    if ((err = b_.ForEach(n, f)) != "" || (err = CountClaims(n, s_.rep)) != "") return err;
    kernels::WriteColumns w{mutable_view(), s_.rep, s_.slot_of, s_.rep_inserted, nullptr, out, column_defaults,
                            col_begin,      cols,   true,       rounding};
    if ((err = b_.ForEach(n * cols, w)) != "") return err;
    kernels::Gather g{read_view(), s_.rep,  s_.slot_of,      col_begin, cols,    nullptr,
                      out,         nullptr, s_.rep_inserted, s_.first,  inserted};
    return b_.ForEach(n * cols, g);
  }

  struct Scratch {
    int64_t n = 0;        // entries the batch arrays hold
    int64_t n_batch = 0;  // entries of the batch last deduplicated
    long long* set = nullptr;
    long long* rep = nullptr;
    long long* first = nullptr;
    long long* last = nullptr;
    long long* slot_of = nullptr;
    uint32_t* mult = nullptr;
    uint8_t* rep_inserted = nullptr;
    int64_t update_rows_n = 0;     // entries update_rows holds
    float* update_rows = nullptr;  // compact tables' Update: [update_rows_n, width] float32 rows
  };

  // Slots of the dedup set of a batch of n keys: a power of two, at most half full.
  static int64_t SetSlotsFor(int64_t n) {
    int64_t slots = 64;
    while (slots < 2 * n) slots <<= 1;
    return slots;
  }

  static int64_t RoundUpSlots(int64_t want) {
    int64_t slots = kBucketSlots;
    while (slots < want && slots < kMaxCapacity) slots <<= 1;
    return slots;
  }

  // A write batch's epoch; capped tables stamp the batch's stored keys with it first (StampBatch). n = 0: nothing
  // to stamp (a batch that claims no slot).
  std::string BeginWrite(const int64_t* keys, int64_t n, uint32_t* epoch) {
    *epoch = NextEpoch();
    if (!a_.capped || n == 0) return "";
    return b_.ForEach(n, kernels::StampBatch{mutable_view(), keys, s_.rep, *epoch});
  }

  uint32_t NextEpoch() {
    if (++epoch_ == 0) epoch_ = 1;  // 0 is the epoch of never-touched slots
    return epoch_;
  }

  std::string CheckBatch(const char* op, int64_t n, int64_t col_begin, int64_t cols) const {
    if (n < 0) return std::string(op) + ": n must be >= 0, got " + std::to_string(n);
    if (col_begin < 0 || cols < 1 || col_begin + cols > a_.width) {
      return std::string(op) + ": columns [" + std::to_string(col_begin) + ", " + std::to_string(col_begin + cols) +
             ") are not a non-empty range of a row of width " + std::to_string(a_.width);
    }
    return "";
  }

  std::string AllocArrays(int64_t slots, TableArrays* a) {
    TableArrays t;
    t.capacity = slots;
    t.width = o_.width;
    t.format = RowFormat::Of(o_);
    t.capped = o_.capacity_limit > 0;
    t.policy = o_.policy;
    t.counters = counters_;
    const size_t n = static_cast<size_t>(slots);
    // The row array's bytes must not wrap (2^40 slots x 2^24 columns would).
    if (slots > (int64_t{1} << 61) / t.format.row_bytes) {
      return "a table of " + std::to_string(slots) + " slots of width " + std::to_string(o_.width) +
             " needs more memory than a device has";
    }
    std::string err;
    auto alloc = [&](auto** p, size_t bytes) {
      void* v = nullptr;
      if (err.empty()) err = b_.Alloc(&v, bytes);
      *p = static_cast<std::remove_reference_t<decltype(*p)>>(v);
    };
    alloc(&t.digests, n);
    alloc(&t.keys, n * sizeof(int64_t));
    alloc(&t.rows, n * static_cast<size_t>(t.format.row_bytes));
    alloc(&t.versions, n * sizeof(int64_t));
    alloc(&t.freqs, n * sizeof(uint32_t));
    if (t.capped) {
      alloc(&t.epochs, n * sizeof(uint32_t));
      alloc(&t.locks, n / kBucketSlots * sizeof(uint32_t));
    }
    if (err.empty()) err = b_.Memset(t.digests, 0, n);
    if (err.empty() && t.capped) err = b_.Memset(t.epochs, 0, n * sizeof(uint32_t));
    if (err.empty() && t.capped) err = b_.Memset(t.locks, 0, n / kBucketSlots * sizeof(uint32_t));
    if (!err.empty()) {
      FreeArrays(&t);
      return "cannot allocate a table of " + std::to_string(slots) + " slots of width " + std::to_string(o_.width) +
             ": " + err;
    }
    *a = t;
    return "";
  }

  void FreeArrays(TableArrays* a) {
    void* ptrs[] = {a->digests, a->keys, a->rows, a->versions, a->freqs, a->epochs, a->locks};
    for (void* p : ptrs) {
      if (p) b_.Free(p);
    }
    *a = TableArrays();
  }

  void FreeScratch() {
    void* ptrs[] = {s_.set, s_.rep, s_.first, s_.last, s_.slot_of, s_.mult, s_.rep_inserted, s_.update_rows};
    for (void* p : ptrs) {
      if (p) b_.Free(p);
    }
    s_ = Scratch();
  }

  // Compact tables' Update: float32 rows for n entries (kept and reused: they only grow).
  std::string PrepareUpdateRows(int64_t n) {
    if (n <= s_.update_rows_n) return "";
    if (s_.update_rows) b_.Free(s_.update_rows);
    s_.update_rows = nullptr;
    s_.update_rows_n = 0;
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(a_.width) * sizeof(float);
    const std::string err = b_.Alloc(&p, bytes);
    if (!err.empty()) return "cannot allocate the float32 rows of an update of " + std::to_string(n) + " keys: " + err;
    s_.update_rows = static_cast<float*>(p);
    s_.update_rows_n = n;
    return "";
  }

  // Batch arrays for n entries (kept and reused: they only grow).
  std::string PrepareScratch(int64_t n) {
    if (n <= s_.n) return "";
    FreeScratch();  // the update rows too: they grow again on the next compact Update
    const int64_t set_slots = SetSlotsFor(n);
    std::string err;
    auto alloc = [&](auto** p, size_t bytes) {
      void* v = nullptr;
      if (err.empty()) err = b_.Alloc(&v, bytes);
      *p = static_cast<std::remove_reference_t<decltype(*p)>>(v);
    };
    const size_t m = static_cast<size_t>(n);
    alloc(&s_.set, static_cast<size_t>(set_slots) * sizeof(long long));
    alloc(&s_.rep, m * sizeof(long long));
    alloc(&s_.first, m * sizeof(long long));
    alloc(&s_.last, m * sizeof(long long));
    alloc(&s_.slot_of, m * sizeof(long long));
    alloc(&s_.mult, m * sizeof(uint32_t));
    alloc(&s_.rep_inserted, m);
    if (!err.empty()) {
      FreeScratch();
      return "cannot allocate the scratch arrays of a batch of " + std::to_string(n) + " keys: " + err;
    }
    s_.n = n;
    return "";
  }

  // What a deduplication computes besides rep (first, last, mult: an atomic per entry each).
  enum DedupOutputs : unsigned { kRepOnly = 0, kFirst = 1, kLast = 2, kMult = 4, kFlagDuplicates = 8 };

  // Deduplicates keys[0, n) into the scratch arrays (s_.rep). s_.first / s_.last / s_.mult hold meaningful values
  // only when asked for in `outputs`; kFlagDuplicates sets counters_->duplicates if a key occurs twice. Nothing
  // is read back: no count of distinct keys (a count every key adds to costs more than the whole pass).
  std::string Dedup(const int64_t* keys, int64_t n, unsigned outputs) {
    std::string err = PrepareScratch(n);
    if (!err.empty()) return err;
    const int64_t set_slots = SetSlotsFor(n);  // this batch's set: a prefix of the scratch set
    const size_t m = static_cast<size_t>(n);
    if (err.empty()) err = b_.Memset(s_.set, 0xff, static_cast<size_t>(set_slots) * sizeof(long long));  // -1
    const bool first = outputs & kFirst, last = outputs & kLast, mult = outputs & kMult;
    if (err.empty() && first) err = b_.Memset(s_.first, 0x7f, m * sizeof(long long));  // a large positive index
    if (err.empty() && last) err = b_.Memset(s_.last, 0xff, m * sizeof(long long));    // -1
    if (err.empty() && mult) err = b_.Memset(s_.mult, 0, m * sizeof(uint32_t));
    const bool flag = outputs & kFlagDuplicates;
    if (err.empty() && flag) err = b_.Memset(&counters_->duplicates, 0, sizeof(counters_->duplicates));
    kernels::Dedup d{keys,
                     s_.set,
                     set_slots - 1,
                     s_.rep,
                     first ? s_.first : nullptr,
                     last ? s_.last : nullptr,
                     mult ? s_.mult : nullptr,
                     flag ? &counters_->duplicates : nullptr};
    s_.n_batch = n;
    if (err.empty()) err = b_.ForEach(n, d);
    return err;
  }

  // Growing tables: the keys a claim pass over n entries inserted (rep_inserted of its representatives; rep null:
  // every entry) join size and used. Capped tables count in the claim itself (under the bucket's lock).
  std::string CountClaims(int64_t n, const long long* rep) {
    if (a_.capped) return "";
    return b_.CountIf(n, kernels::IsNewRep{rep, s_.rep_inserted}, &counters_->size, &counters_->used);
  }

  // Growing tables: rehashes before the batch just deduplicated (n keys) would take the table past
  // max_load_factor. Only when its keys could: then a probe pass counts the distinct ones that are new. known:
  // the counters if the caller has just read them.
  std::string EnsureRoom(const int64_t* keys, int64_t n, const TableCounters* known = nullptr) {
    if (a_.capped) return "";
    TableCounters s;
    std::string err;
    if (known) {
      s = *known;
    } else if ((err = b_.CopyToHost(&s, counters_, sizeof(s))) != "") {
      return err;
    }
    const double limit = o_.max_load_factor * static_cast<double>(a_.capacity);
    if (static_cast<double>(s.used + n) <= limit) return "";
    err = b_.Memset(&counters_->cursor, 0, sizeof(counters_->cursor));
    if (err.empty()) err = b_.CountIf(s_.n_batch, kernels::IsMissingRep{read_view(), keys, s_.rep}, &counters_->cursor);
    unsigned long long fresh = 0;
    if (err.empty()) err = b_.CopyToHost(&fresh, &counters_->cursor, sizeof(fresh));
    if (!err.empty()) return err;
    const int64_t new_keys = static_cast<int64_t>(fresh);
    if (static_cast<double>(s.used + new_keys) <= limit) return "";
    // Room for the live keys and the new ones (removed slots are dropped): twice the slots or more when the live
    // keys call for it, the same slots when removed ones filled the table.
    const double needed = static_cast<double>(s.size + new_keys) / o_.max_load_factor;
    return RehashTo(std::max(RoundUpSlots(static_cast<int64_t>(needed) + 1), a_.capacity));
  }

  std::string RehashTo(int64_t slots) {
    if (slots > kMaxCapacity) return "the table cannot grow past 2^40 slots";
    TableArrays fresh;
    std::string err = AllocArrays(slots, &fresh);
    if (!err.empty()) return "growing the table: " + err;
    // Every live entry moves (the new arrays have more room than it takes) and removed slots are dropped: used
    // becomes size. Claims in a growing table count nothing themselves (see FindOrClaim).
    TableCounters before;
    err = b_.CopyToHost(&before, counters_, sizeof(before));
    if (err.empty()) err = b_.ForEach(a_.capacity, kernels::Rehash{read_view(), MutableView(fresh)});
    TableCounters after = before;
    after.used = before.size;
    if (err.empty()) err = b_.CopyToDevice(counters_, &after, sizeof(after));
    if (!err.empty()) {
      FreeArrays(&fresh);
      b_.CopyToDevice(counters_, &before, sizeof(before));  // the old arrays stay: so do their counts
      return "growing the table: " + err;
    }
    FreeArrays(&a_);
    a_ = fresh;
    return "";
  }

  Backend b_;
  GpuTableOptions o_;
  TableArrays a_;
  TableCounters* counters_ = nullptr;
  Scratch s_;
  uint32_t epoch_ = 0;
};

}  // namespace gpu
}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_GPU_BUCKET_TABLE_H_
