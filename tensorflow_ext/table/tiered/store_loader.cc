// OpenColdStore: loads the RocksDB plugin (_tf_ext_rocksdb_store.so) with dlopen the first time a store is opened
// and forwards to its entry point. This file links no RocksDB: the op library that contains it imports on a machine
// without librocksdb, and only a tiered table needs the plugin (see cold_store.h).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "tensorflow_ext/table/tiered/cold_store.h"

namespace tfext {
namespace table {
namespace {

// Where the plugin is: $TF_EXT_ROCKSDB_STORE_LIB if set (tests run from Bazel's tree, where the two libraries are
// not side by side), else next to the shared object that holds this code (the op library, found with dladdr).
std::string PluginPath() {
  const char* env = std::getenv(kRocksDbStoreLibraryEnv);
  if (env != nullptr && env[0] != '\0') return env;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OpenColdStore), &info) != 0 && info.dli_fname != nullptr) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    if (slash != std::string::npos) return self.substr(0, slash + 1) + kRocksDbStoreLibrary;
  }
  // dladdr names no directory (an executable found through PATH): let the dynamic linker search.
  return kRocksDbStoreLibrary;
}

// Loads the plugin once; a failed load is retried on the next open (the missing package may have been installed
// meanwhile). The handle is never closed: stores made by it may live until exit.
OpenRocksDbStoreFn LoadPlugin() {
  static std::mutex mu;
  static OpenRocksDbStoreFn open_fn = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (open_fn != nullptr) return open_fn;
  const std::string path = PluginPath();
  // RTLD_LOCAL: RocksDB's symbols stay out of the process's global scope (TensorFlow's own libraries share it).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw StoreError(StoreError::kUnavailable,
                     "tiered storage cannot load its RocksDB store plugin " + path + ": " +
                         (why != nullptr ? why : "unknown dlopen error") +
                         " (tiered storage needs the system's RocksDB 7.8: apt-get install librocksdb7.8)");
  }
  // The interface version first: a plugin built from another cold_store.h would read our StoreOptions and
  // strings with its own layout (heap corruption), so nothing else of it runs unless the versions agree.
  void* abi_sym = dlsym(handle, kRocksDbStoreAbiSymbol);
  const int abi = abi_sym != nullptr ? reinterpret_cast<RocksDbStoreAbiFn>(abi_sym)() : 1;  // 1: before the symbol
  if (abi != kColdStoreAbi) {
    dlclose(handle);
    throw StoreError(StoreError::kUnavailable,
                     "the RocksDB store plugin " + path + " was built for cold store interface version " +
                         std::to_string(abi) +
                         (abi_sym == nullptr ? " (it exports no " + std::string(kRocksDbStoreAbiSymbol) + ")" : "") +
                         " but this library needs version " + std::to_string(kColdStoreAbi) +
                         ": a stale or foreign build; install the plugin built with this library (tensorflow_ext's " +
                         kRocksDbStoreLibrary + " from the same build)");
  }
  void* sym = dlsym(handle, kOpenRocksDbStoreSymbol);
  if (sym == nullptr) {
    dlclose(handle);
    throw StoreError(StoreError::kUnavailable, "the RocksDB store plugin " + path + " does not export " +
                                                   kOpenRocksDbStoreSymbol + " (a stale or foreign build?)");
  }
  open_fn = reinterpret_cast<OpenRocksDbStoreFn>(sym);
  return open_fn;
}

}  // namespace

std::unique_ptr<ColdStore> OpenColdStore(const StoreOptions& options) {
  // Checked here too, so bad options fail the same way with or without the plugin installed.
  if (options.path.empty()) throw StoreError(StoreError::kInvalid, "a tier store needs a directory path; got \"\"");
  if (options.width < 1) {
    throw StoreError(StoreError::kInvalid,
                     "tier store " + options.path + ": width must be >= 1; got " + std::to_string(options.width));
  }
  if (options.write_buffer_bytes < kMinWriteBufferBytes || options.write_buffers < 2 || options.write_buffers > 64 ||
      options.block_cache_bytes < 0) {
    throw StoreError(StoreError::kInvalid,
                     "tier store " + options.path + ": write_buffer_bytes must be >= " +
                         std::to_string(kMinWriteBufferBytes) + ", write_buffers in [2, 64] and " +
                         "block_cache_bytes >= 0; got " + std::to_string(options.write_buffer_bytes) + ", " +
                         std::to_string(options.write_buffers) + " and " + std::to_string(options.block_cache_bytes));
  }
  OpenRocksDbStoreFn open_fn = LoadPlugin();
  int code = StoreError::kIO;
  std::string message;
  ColdStore* store = open_fn(&options, &code, &message);
  if (store == nullptr) {
    if (code < StoreError::kNoSpace || code > StoreError::kPermission) code = StoreError::kIO;
    throw StoreError(static_cast<StoreError::Code>(code), message);
  }
  return std::unique_ptr<ColdStore>(store);
}

}  // namespace table
}  // namespace tfext
