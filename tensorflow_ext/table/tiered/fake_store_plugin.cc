// Stand-ins for a stale RocksDB store plugin, for cold_store_test: a plugin built from another version of
// cold_store.h must be refused before any of its code runs on the loader's types. Built twice (BUILD):
//   FAKE_PLUGIN_ABI defined: exports tfext_rocksdb_store_abi returning it (a plugin of another interface version);
//   undefined: exports no version (a plugin built before the version symbol existed).
// Its tfext_open_rocksdb_store aborts the process: the loader must never call it.
#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" __attribute__((visibility("default"))) void* tfext_open_rocksdb_store(const void*, int*, std::string*) {
  std::fprintf(stderr, "fake_store_plugin: tfext_open_rocksdb_store was called; the loader must refuse this plugin\n");
  std::abort();
}

#ifdef FAKE_PLUGIN_ABI
extern "C" __attribute__((visibility("default"))) int tfext_rocksdb_store_abi() { return FAKE_PLUGIN_ABI; }
#endif
