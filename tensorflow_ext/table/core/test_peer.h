// Test-only access to a HashTable's index, so that tests can break an
// invariant on purpose and check that HashTable::CheckInvariants() notices,
// and to its prefaulted arena slabs.
// Nothing outside tests may use it.

#ifndef TENSORFLOW_EXT_TABLE_CORE_TEST_PEER_H_
#define TENSORFLOW_EXT_TABLE_CORE_TEST_PEER_H_

#include <cstdint>

#include "tensorflow_ext/table/core/hash_table.h"

namespace tfext {
namespace table {

struct HashTableTestPeer {
  static int64_t NumShards(const HashTable& table);
  // Shard `shard`'s index slots (*capacity of them), or nullptr when it has
  // no index. Slot = {tag: high 32 bits, row id + 1: low 32 bits}, 0 = empty.
  // The caller must not run other operations on the table meanwhile.
  static uint64_t* Slots(HashTable& table, int64_t shard, uint64_t* capacity);
  // Arena slabs prefaulted in the background: how many are ready now, how
  // many are requested (queued or being made), and how many the table has
  // taken into use so far.
  static void SpareSlabs(const HashTable& table, int64_t* ready, int64_t* pending, int64_t* taken);
};

}  // namespace table
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_CORE_TEST_PEER_H_
