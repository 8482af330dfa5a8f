// tensorflow_ext: TableResource (see table_resource.h).

#include "tensorflow_ext/table/kernels/table_resource.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>

#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/type_index.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/str_util.h"
#include "tensorflow/core/platform/threadpool.h"
#include "tensorflow_ext/table/kernels/storage_attrs.h"
#include "tensorflow_ext/table/kernels/tensor_checks.h"

namespace tfext {

using table_kernels_internal::CheckFloatTensor;
using table_kernels_internal::CheckKeysTensor;
using tensorflow::DataTypeString;
using tensorflow::DT_RESOURCE;
using tensorflow::OpKernelContext;
using tensorflow::ResourceHandle;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;

Status TableLayout::Validate() const {
  if (dim < 1) return InvalidArgument("dim must be >= 1, got ", dim);
  if (width < dim) {
    return InvalidArgument("width must be >= dim (", dim, "), got ", width);
  }
  if (width > (int64_t{1} << 24)) {
    return InvalidArgument("width is absurdly large: ", width);
  }
  if (!column_defaults.empty() && static_cast<int64_t>(column_defaults.size()) != width) {
    return InvalidArgument("column_defaults must be empty or have width (", width, ") entries, got ",
                           column_defaults.size());
  }
  if (storage == table::RowStorage::kFloat32) {
    if (compact_cols != 0) {
      return InvalidArgument("compact_cols must be 0 for storage \"float32\" (rows are all float32), got ",
                             compact_cols);
    }
    return tensorflow::OkStatus();
  }
  if (compact_cols < 1 || compact_cols > width) {
    return InvalidArgument("compact_cols must be in [1, width=", width, "] for storage \"", RowStorageName(storage),
                           "\", got ", compact_cols);
  }
  if (storage == table::RowStorage::kInt8Row && rounding != table::Rounding::kNearest) {
    return InvalidArgument("storage \"int8_row\" rounds to nearest only: rounding must be \"nearest\", got \"",
                           RoundingName(rounding), "\"");
  }
  return tensorflow::OkStatus();
}

const char* TierPolicyName(table::TierOptions::Policy policy) {
  return policy == table::TierOptions::Policy::kLfu ? "lfu" : "lru";
}

Status ParseTierPolicy(const std::string& name, table::TierOptions::Policy* out) {
  for (table::TierOptions::Policy p : {table::TierOptions::Policy::kLru, table::TierOptions::Policy::kLfu}) {
    if (name == TierPolicyName(p)) {
      *out = p;
      return tensorflow::OkStatus();
    }
  }
  return InvalidArgument("tier_policy must be \"lru\" or \"lfu\", got \"", name, "\"");
}

Status TierConfig::Validate(const TableLayout& layout) const {
  if (memory_bytes < 0) return InvalidArgument("tier_memory_bytes must be >= 0, got ", memory_bytes);
  if (disk_bytes < 0) return InvalidArgument("tier_disk_bytes must be >= 0 (0 = unbounded), got ", disk_bytes);
  if (!enabled()) {
    // Sizes without a directory would silently give an all-in-memory table.
    if (memory_bytes != 0 || disk_bytes != 0) {
      return InvalidArgument("tier_memory_bytes=", memory_bytes, " and tier_disk_bytes=", disk_bytes,
                             " need a tier_path (the directory of the disk tier); an untiered table takes neither");
    }
    return tensorflow::OkStatus();
  }
  if (memory_bytes == 0) {
    return InvalidArgument("tier_memory_bytes must be > 0 for a tiered table (tier_path \"", path,
                           "\"): it is the memory tier's budget");
  }
  if (layout.storage == table::RowStorage::kInt8Row) {
    return InvalidArgument("a tiered table (tier_path \"", path, "\") cannot store int8 rows (storage \"",
                           RowStorageName(layout.storage),
                           "\", a serving format: rows moving between the tiers would be re-quantized, which is not "
                           "exact); use storage \"float32\", \"bfloat16\" or \"float16\", or no tier_path");
  }
  return tensorflow::OkStatus();
}

bool TierConfig::SameAs(const TierConfig& other) const {
  return path == other.path && memory_bytes == other.memory_bytes && disk_bytes == other.disk_bytes &&
         (!enabled() || policy == other.policy);
}

std::string TierConfig::DebugString() const {
  if (!enabled()) return "untiered";
  return tensorflow::strings::StrCat("tier_path=", path, ", tier_memory_bytes=", memory_bytes,
                                     ", tier_disk_bytes=", disk_bytes, ", tier_policy=", TierPolicyName(policy));
}

static std::vector<float> EffectiveDefaults(const TableLayout& l) {
  if (!l.column_defaults.empty()) return l.column_defaults;
  return std::vector<float>(static_cast<size_t>(std::max<int64_t>(l.width, 0)), 0.0f);
}

// Equal values, or both NaN: a NaN default (e.g. a NaN constant initializer)
// is the same layout as itself, which `==` on floats would deny.
static bool SameDefault(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }

bool TableLayout::SameAs(const TableLayout& other) const {
  if (dim != other.dim || width != other.width) return false;
  if (storage != other.storage || compact_cols != other.compact_cols) return false;
  if (storage != table::RowStorage::kFloat32 && rounding != other.rounding) return false;
  const std::vector<float> a = EffectiveDefaults(*this);
  const std::vector<float> b = EffectiveDefaults(other);
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), SameDefault);
}

std::string TableLayout::DebugString() const {
  std::string s = tensorflow::strings::StrCat("dim=", dim, ", width=", width, ", column_defaults=[");
  const size_t n = column_defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 8 && i == 4) {
      tensorflow::strings::StrAppend(&s, "..., ");
      i = n - 3;
    }
    tensorflow::strings::StrAppend(&s, column_defaults[i], i + 1 < n ? ", " : "");
  }
  tensorflow::strings::StrAppend(&s, "], storage=", RowStorageName(storage));
  if (storage != table::RowStorage::kFloat32) {
    tensorflow::strings::StrAppend(&s, ", compact_cols=", compact_cols, ", rounding=", RoundingName(rounding));
  }
  return s;
}

namespace {

// The tier store directories held by this process's tables, by canonical path
// (CanonicalDir). The store's flock already refuses a directory held by anyone,
// this process included; this registry lets a table of this process see that
// a path is held HERE before opening it, and take a private sibling instead
// (TableResource::tier_dir()). Another process's directory stays refused:
// opening it would wipe the rows of a live process.
class HeldTierDirs {
 public:
  static HeldTierDirs& Get() {
    static HeldTierDirs* dirs = new HeldTierDirs();  // never destroyed: tables may close at exit
    return *dirs;
  }
  // True (and now held) if no table of this process holds `key`.
  bool Hold(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.insert(key).second;
  }
  void Release(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    held_.erase(key);
  }

 private:
  std::mutex mu_;
  std::set<std::string> held_;
};

// `path` made absolute and normalized ("." and ".." and repeated or trailing
// slashes removed), with its longest existing prefix resolved by realpath
// (symbolic links), so that two spellings of one directory are one key even
// before the directory exists. A path that reaches the directory through a
// link created after the first table opened it is not recognized: that
// table is then refused by the store's lock, as before, naming the path.
std::string CanonicalDir(const std::string& path) {
  std::string absolute = path;
  if (absolute.empty() || absolute[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) absolute = std::string(cwd) + "/" + absolute;
  }
  std::vector<std::string> parts;
  for (tensorflow::StringPiece part : tensorflow::str_util::Split(absolute, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.emplace_back(part);
  }
  for (size_t existing = parts.size();; --existing) {
    std::string prefix = "/";
    for (size_t i = 0; i < existing; ++i) tensorflow::strings::StrAppend(&prefix, i > 0 ? "/" : "", parts[i]);
    char resolved[PATH_MAX];
    if (realpath(prefix.c_str(), resolved) != nullptr || existing == 0) {
      std::string out = existing == 0 ? "/" : std::string(resolved);
      for (size_t i = existing; i < parts.size(); ++i) {
        tensorflow::strings::StrAppend(&out, out.back() == '/' ? "" : "/", parts[i]);
      }
      return out;
    }
  }
}

// How many private siblings held by OTHER processes (their store lock) a
// table skips before giving up: one per live table of the model elsewhere.
constexpr int kMaxLockedSiblings = 64;

}  // namespace

TableResource::TableResource(const TableLayout& layout, table::TableOptions options, const TierConfig& tier,
                             const std::string& name)
    : layout_(layout), options_(options), tier_config_(tier), name_(name) {
  options_.width = layout_.width;
  options_.storage = layout_.storage;
  options_.compact_cols = layout_.compact_cols;
  options_.rounding = layout_.rounding;
  column_defaults_ = EffectiveDefaults(layout_);
  table_ = std::make_unique<table::HashTable>(options_);
  if (tier_config_.enabled()) OpenTier();
}

void TableResource::OpenTier() {
  table::TierOptions tier_options;
  tier_options.memory_bytes = tier_config_.memory_bytes;
  tier_options.disk_bytes = tier_config_.disk_bytes;
  tier_options.policy = tier_config_.policy;
  std::string base = tier_config_.path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string base_key = CanonicalDir(base);
  int locked_siblings = 0;
  for (int64_t k = 0;; ++k) {
    // k = 0: the path itself; then the siblings "<path>.<k>".
    const std::string suffix = k == 0 ? "" : tensorflow::strings::StrCat(".", k);
    const std::string key = base_key + suffix;
    if (!HeldTierDirs::Get().Hold(key)) continue;  // a table of this process has it
    tier_options.path = k == 0 ? tier_config_.path : base + suffix;
    try {
      tier_ = std::make_unique<table::TieredTable>(table_.get(), options_, tier_options);
    } catch (const table::StoreError& e) {
      HeldTierDirs::Get().Release(key);
      // A sibling held by another process (the same model's second table
      // there, whose first table has closed): the next one. The path itself
      // held by another process is refused: it is that process's store.
      if (k > 0 && e.code() == table::StoreError::kLocked && ++locked_siblings < kMaxLockedSiblings) continue;
      throw;
    } catch (...) {
      HeldTierDirs::Get().Release(key);
      throw;
    }
    tier_dir_ = tier_options.path;
    tier_dir_key_ = key;
    tier_dir_private_ = k > 0;
    if (tier_dir_private_) {
      LOG(INFO) << "tf_ext table '" << name_ << "': its tier store " << tier_config_.path
                << " is held by another table of this process, so this table keeps its disk tier in the private "
                   "directory "
                << tier_dir_ << " (deleted when the table closes)";
    }
    return;
  }
}

TableResource::~TableResource() {
  if (tier_dir_.empty()) return;
  tier_.reset();  // closes the store and its lock before the directory is deleted or released
  if (tier_dir_private_) {
    int64_t undeleted_files = 0, undeleted_dirs = 0;
    const Status s = tensorflow::Env::Default()->DeleteRecursively(tier_dir_, &undeleted_files, &undeleted_dirs);
    if (!s.ok() || undeleted_files != 0 || undeleted_dirs != 0) {
      LOG(WARNING) << "tf_ext table '" << name_ << "': cannot delete its private tier store directory " << tier_dir_
                   << " (" << undeleted_files << " files and " << undeleted_dirs << " directories left): " << s;
    }
  }
  HeldTierDirs::Get().Release(tier_dir_key_);
}

namespace {

// The status code of a StoreError (see StoreErrorStatus).
template <typename... Args>
Status StoreStatus(table::StoreError::Code code, Args&&... args) {
  switch (code) {
    case table::StoreError::kNoSpace:
      return tensorflow::errors::ResourceExhausted(std::forward<Args>(args)...);
    case table::StoreError::kLocked:
    case table::StoreError::kForeign:
    case table::StoreError::kUnavailable:
      return tensorflow::errors::FailedPrecondition(std::forward<Args>(args)...);
    case table::StoreError::kCorrupt:
      return tensorflow::errors::DataLoss(std::forward<Args>(args)...);
    case table::StoreError::kInvalid:
      return tensorflow::errors::InvalidArgument(std::forward<Args>(args)...);
    case table::StoreError::kPermission:
      return tensorflow::errors::PermissionDenied(std::forward<Args>(args)...);
    case table::StoreError::kIO:
      break;
  }
  return tensorflow::errors::Internal(std::forward<Args>(args)...);
}

}  // namespace

Status TableResource::Create(const TableLayout& layout, const table::TableOptions& options, const TierConfig& tier,
                             const std::string& name, TableResource** out) {
  *out = nullptr;
  try {
    *out = new TableResource(layout, options, tier, name);
  } catch (const std::invalid_argument& e) {
    return InvalidArgument("tf_ext table '", name, "' (", layout.DebugString(), ", ", tier.DebugString(),
                           "): ", e.what());
  } catch (const std::bad_alloc& e) {
    return tensorflow::errors::ResourceExhausted("tf_ext table '", name, "' (", layout.DebugString(),
                                                 "): cannot allocate the table (", e.what(), ")");
  } catch (const table::StoreError& e) {
    return StoreStatus(e.code(), "tf_ext table '", name, "': cannot open its disk tier at ", tier.path, ": ", e.what());
  } catch (const std::exception& e) {  // e.g. the tier's thread cannot be started: never out of a kernel
    return tensorflow::errors::Internal("tf_ext table '", name, "' (", layout.DebugString(), ", ", tier.DebugString(),
                                        "): cannot be created: ", e.what());
  }
  return tensorflow::OkStatus();
}

Status StoreErrorStatus(const TableResource& table, const char* what, const table::StoreError& error) {
  const char* hint = "";
  if (error.code() == table::StoreError::kNoSpace) {
    hint =
        " (free space on that device or lower the tier's disk_bytes; the table is still usable and the last "
        "checkpoint still holds every key it saved)";
  }
  return StoreStatus(error.code(), "tf_ext table '", table.name(), "' ", what, " failed in its disk tier at ",
                     table.tier_dir(), ": ", error.what(), hint);
}

Status TableMemoryError(const TableResource& table, const char* what, const std::exception& error) {
  // The core's messages start with "tf_ext table: ", which this one says.
  tensorflow::StringPiece detail(error.what());
  tensorflow::str_util::ConsumePrefix(&detail, "tf_ext table: ");
  return tensorflow::errors::ResourceExhausted(
      "tf_ext table ", what, " ran out of memory: ", detail, " [table: ", table.layout().DebugString(), ", ",
      table.table()->size(), table.tier() != nullptr ? " keys in memory, " : " keys, ", table.table()->memory_bytes(),
      " bytes held]. The table is still usable; part of the batch may have been applied.");
}

Status TableResource::Find(OpKernelContext* ctx, const Tensor& keys, Tensor* values, const Tensor& default_value) {
  TF_RETURN_IF_ERROR(CheckKeysTensor(keys));
  TF_RETURN_IF_ERROR(CheckFloatTensor(default_value, "default_value"));
  const int64_t n = keys.NumElements();
  const int64_t dim = layout_.dim;
  if (values->NumElements() != n * dim) {
    return InvalidArgument("values must hold ", n * dim, " floats, got ", values->NumElements());
  }
  if (n == 0) return tensorflow::OkStatus();
  const int64_t* k = keys.flat<int64_t>().data();
  float* out = values->flat<float>().data();
  auto pf = MakeParallelFor(ctx);
  const int64_t dn = default_value.NumElements();
  if (dn == 1 || dn == dim) {
    std::vector<float> row(dim, default_value.flat<float>()(0));
    if (dn == dim) {
      std::copy_n(default_value.flat<float>().data(), dim, row.data());
    }
    return WithKeys("find", k, n, pf, [&] { table_->Find(k, n, 0, dim, out, nullptr, row.data(), pf); });
  }
  if (dn != n * dim) {
    return InvalidArgument("default_value must be a scalar, [", dim, "] or keys.shape + [", dim, "], got shape ",
                           default_value.shape().DebugString());
  }
  std::unique_ptr<bool[]> found(new (std::nothrow) bool[n]);
  if (found == nullptr) {
    return tensorflow::errors::ResourceExhausted("tf_ext table find: cannot allocate ", n, " found flags");
  }
  TF_RETURN_IF_ERROR(WithKeys("find", k, n, pf, [&] { table_->Find(k, n, 0, dim, out, found.get(), nullptr, pf); }));
  const float* d = default_value.flat<float>().data();
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) std::copy_n(d + i * dim, dim, out + i * dim);
  }
  return tensorflow::OkStatus();
}

Status TableResource::Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values) {
  TF_RETURN_IF_ERROR(CheckKeysTensor(keys));
  TF_RETURN_IF_ERROR(CheckFloatTensor(values, "values"));
  const int64_t n = keys.NumElements();
  if (values.NumElements() != n * layout_.dim) {
    return InvalidArgument("values must have shape keys.shape + [", layout_.dim, "] (", n * layout_.dim,
                           " floats), got shape ", values.shape().DebugString());
  }
  if (n == 0) return tensorflow::OkStatus();
  NoteUntrackedWrite();  // no version is set
  const int64_t* k = keys.flat<int64_t>().data();
  const table::ParallelFor pf = MakeParallelFor(ctx);
  return WithKeys("insert", k, n, pf, [&] {
    table_->Insert(k, n, 0, layout_.dim, values.flat<float>().data(), column_defaults_.data(),
                   /*count=*/false, /*version=*/-1, pf);
  });
}

namespace {

// Position-sensitive (the references are by position) and cheap: the terms
// are independent, so the loop pipelines (~1 ns a key).
uint64_t KeysFingerprint(const int64_t* keys, int64_t n) {
  uint64_t h = table::SplitMix64(static_cast<uint64_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    h += table::SplitMix64(static_cast<uint64_t>(keys[i]) ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull));
  }
  return h;
}

}  // namespace

void TableResource::SetLastLookupRefs(const int64_t* keys, int64_t n, std::shared_ptr<RowRefs> refs) {
  refs->fingerprint = KeysFingerprint(keys, n);
  tensorflow::mutex_lock lock(refs_mu_);
  last_refs_ = std::move(refs);
}

std::shared_ptr<const TableResource::RowRefs> TableResource::LastLookupRefs(const int64_t* keys, int64_t n) const {
  std::shared_ptr<const RowRefs> refs;
  {
    tensorflow::mutex_lock lock(refs_mu_);
    refs = last_refs_;
  }
  // The fingerprint only when the count matches: no pass over the keys for
  // an update that cannot be the lookup's.
  if (refs == nullptr || static_cast<int64_t>(refs->refs.size()) != n ||
      refs->fingerprint != KeysFingerprint(keys, n)) {
    return nullptr;
  }
  return refs;
}

Status TableResource::Remove(OpKernelContext* ctx, const Tensor& keys) {
  TF_RETURN_IF_ERROR(CheckKeysTensor(keys));
  const int64_t n = keys.NumElements();
  if (n == 0) return tensorflow::OkStatus();
  int64_t removed = 0;
  return RemoveKeys(keys.flat<int64_t>().data(), n, MakeParallelFor(ctx), &removed);
}

Status TableResource::RemoveKeys(const int64_t* keys, int64_t n, const table::ParallelFor& pf, int64_t* removed) {
  *removed = 0;
  const int64_t chunk = tier_ == nullptr ? n : std::max<int64_t>(1, tier_->budget_keys() / 4);
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t* k = keys + off;
    const int64_t m = std::min(chunk, n - off);
    int64_t count = 0;
    TF_RETURN_IF_ERROR(WithKeys("remove", k, m, pf, [&] { count = table_->Remove(k, m, pf); }));
    if (count > 0) LogRemovedKeys(k, m);
    *removed += count;
  }
  return tensorflow::OkStatus();
}

size_t TableResource::size() const { return static_cast<size_t>(Size()); }

Status TableResource::ExportValues(OpKernelContext* ctx) {
  const int64_t dim = layout_.dim;
  Status st;
  TF_RETURN_IF_ERROR(CallTable(*this, "export", [&] {
    Export(0, dim, [&](int64_t n) {
      table::HashTable::ExportBuffers b;
      Tensor* keys = nullptr;
      Tensor* values = nullptr;
      st = ctx->allocate_output("keys", TensorShape({n}), &keys);
      if (st.ok()) st = ctx->allocate_output("values", TensorShape({n, dim}), &values);
      if (!st.ok()) return b;
      b.keys = keys->flat<int64_t>().data();
      b.rows = values->flat<float>().data();
      return b;
    });
  }));
  return st;
}

Status TableResource::ImportValues(OpKernelContext* ctx, const Tensor& keys, const Tensor& values) {
  TF_RETURN_IF_ERROR(CheckKeysTensor(keys));
  TF_RETURN_IF_ERROR(CheckFloatTensor(values, "values"));
  const int64_t n = keys.NumElements();
  if (values.NumElements() != n * layout_.dim) {
    return InvalidArgument("values must have ", n, " rows of ", layout_.dim, " floats, got shape ",
                           values.shape().DebugString());
  }
  NoteUntrackedWrite();  // new contents, versions not kept
  // Untiered: built aside and swapped in at once, so concurrent finds never
  // see the table empty or partly filled (see Import).
  return CallTable(*this, "import", [&] {
    Import(keys.flat<int64_t>().data(), n, 0, layout_.dim, values.flat<float>().data(), nullptr, nullptr,
           /*clear_first=*/true, MakeParallelFor(ctx));
  });
}

int64_t TableResource::Size() const { return tier_ != nullptr ? tier_->size() : table_->size(); }

void TableResource::Export(int64_t col_begin, int64_t cols,
                           const std::function<table::HashTable::ExportBuffers(int64_t)>& alloc) const {
  if (tier_ != nullptr) {
    tier_->Export(col_begin, cols, alloc);
  } else {
    table_->Export(col_begin, cols, alloc);
  }
}

void TableResource::ExportSince(int64_t min_version, int64_t col_begin, int64_t cols,
                                const std::function<table::HashTable::ExportBuffers(int64_t)>& alloc) const {
  if (tier_ != nullptr) {
    tier_->ExportSince(min_version, col_begin, cols, alloc);
  } else {
    table_->ExportSince(min_version, col_begin, cols, alloc);
  }
}

void TableResource::Import(const int64_t* keys, int64_t n, int64_t col_begin, int64_t cols, const float* rows,
                           const int64_t* versions, const uint32_t* frequencies, bool clear_first,
                           const table::ParallelFor& pf) {
  if (tier_ != nullptr) {
    tier_->Import(keys, n, col_begin, cols, rows, column_defaults_.data(), versions, frequencies, clear_first, pf);
    LogDroppedKeys();
    return;
  }
  auto import_into = [&](table::HashTable& t) {
    if (n == 0) return;
    t.Import(keys, n, col_begin, cols, rows, column_defaults_.data(), versions, frequencies, pf);
  };
  if (clear_first) {
    // A failure (out of memory) leaves the old contents.
    table_->Replace(n, import_into);
  } else {
    import_into(*table_);
  }
}

void TableResource::Clear() {
  if (tier_ != nullptr) {
    tier_->Clear();
  } else {
    table_->Clear();
  }
}

int64_t TableResource::RemoveIf(const std::function<bool(int64_t, const float*, const table::KeyMeta&)>& pred) {
  // Both RemoveIfs remove every key pred accepts (a tiered table's, of
  // either tier), so the keys it accepts are the keys removed. The lock only
  // keeps the collection safe should a RemoveIf call pred from two threads.
  std::mutex removed_mu;
  std::vector<int64_t> removed;
  auto collect = [&](int64_t key, const float* row, const table::KeyMeta& meta) {
    const bool remove = pred(key, row, meta);
    if (remove) {
      std::lock_guard<std::mutex> lock(removed_mu);
      removed.push_back(key);
    }
    return remove;
  };
  const int64_t count = tier_ != nullptr ? tier_->RemoveIf(collect, nullptr) : table_->RemoveIf(collect);
  LogRemovedKeys(removed.data(), static_cast<int64_t>(removed.size()));
  return count;
}

table::TierStats TableResource::tier_stats() const {
  if (tier_ != nullptr) return tier_->stats();
  table::TierStats stats{};
  stats.memory_keys = table_->size();
  stats.memory_bytes = table_->memory_bytes();
  return stats;
}

void TableResource::Settle() {
  if (tier_ == nullptr) return;
  tier_->Settle();
  LogDroppedKeys();
}

void TableResource::LogDroppedKeys() {
  if (tier_ == nullptr) return;
  const std::vector<int64_t> dropped = tier_->TakeDroppedKeys();
  LogRemovedKeys(dropped.data(), static_cast<int64_t>(dropped.size()));
}

void TableResource::StartChangeLog(const std::string& channel, int64_t capacity) {
  tensorflow::mutex_lock l(log_mu_);
  ChangeLogChannel& log = log_channels_[channel];
  log = ChangeLogChannel();  // frees the old keys' memory too
  log.capacity = capacity < 0 ? 0 : capacity;
  log_enabled_.store(true, std::memory_order_release);
}

void TableResource::LogRemovedKeys(const int64_t* keys, int64_t n) {
  if (n <= 0 || !log_enabled_.load(std::memory_order_acquire)) return;
  tensorflow::mutex_lock l(log_mu_);
  for (auto& entry : log_channels_) {
    ChangeLogChannel& log = entry.second;
    ++log.seq;
    if (log.overflow_seq != 0 && log.overflow_seq > log.read_seq) continue;  // its next save is full anyway
    if (static_cast<int64_t>(log.removed.size()) + n > log.capacity) {
      // Past the bound: forget the keys (the next save must be full) and free their memory.
      log.overflow_seq = log.seq;
      log.removed.clear();
      log.removed.shrink_to_fit();
      log.read_size = 0;
      continue;
    }
    log.removed.insert(log.removed.end(), keys, keys + n);
  }
}

void TableResource::NoteUntrackedWrite() {
  if (!log_enabled_.load(std::memory_order_acquire)) return;
  tensorflow::mutex_lock l(log_mu_);
  for (auto& entry : log_channels_) {
    ChangeLogChannel& log = entry.second;
    log.untracked_seq = ++log.seq;
  }
}

TableResource::ChangeLogState TableResource::ReadChangeLog(const std::string& channel, std::vector<int64_t>* removed) {
  LogDroppedKeys();  // outside log_mu_: LogRemovedKeys takes it
  tensorflow::mutex_lock l(log_mu_);
  ChangeLogState state;
  auto it = log_channels_.find(channel);
  if (it == log_channels_.end()) {
    if (removed != nullptr) removed->clear();
    return state;  // never started: disabled, nothing logged
  }
  ChangeLogChannel& log = it->second;
  state.enabled = true;
  state.untracked = log.untracked_seq != 0;
  state.overflow = log.overflow_seq != 0;
  if (removed == nullptr) return state;  // the flags only: nothing is marked as read
  *removed = log.removed;
  log.read_seq = log.seq;
  log.read_size = log.removed.size();
  return state;
}

void TableResource::CommitChangeLog(const std::string& channel) {
  tensorflow::mutex_lock l(log_mu_);
  auto it = log_channels_.find(channel);
  if (it == log_channels_.end()) return;
  ChangeLogChannel& log = it->second;
  const size_t drop = std::min(log.read_size, log.removed.size());
  log.removed.erase(log.removed.begin(), log.removed.begin() + drop);
  if (log.untracked_seq <= log.read_seq) log.untracked_seq = 0;
  if (log.overflow_seq <= log.read_seq) log.overflow_seq = 0;
  log.read_size = 0;
}

int64_t TableResource::MemoryUsed() const { return table_->memory_bytes(); }

std::string TableResource::DebugString() const {
  if (tier_ == nullptr) {
    return tensorflow::strings::StrCat("tf_ext HashTable(", layout_.DebugString(), ", size=", table_->size(), ")");
  }
  return tensorflow::strings::StrCat("tf_ext HashTable(", layout_.DebugString(), ", ", tier_config_.DebugString(),
                                     tier_dir_private_ ? ", private tier_dir=" : "", tier_dir_private_ ? tier_dir_ : "",
                                     ", memory keys=", table_->size(), ")");
}

table::ParallelFor MakeParallelFor(OpKernelContext* ctx, int64_t cost_per_unit) {
  const tensorflow::DeviceBase::CpuWorkerThreads* workers =
      ctx == nullptr ? nullptr : ctx->device()->tensorflow_cpu_worker_threads();
  if (workers == nullptr || workers->workers == nullptr || workers->num_threads <= 1) {
    return table::InlineParallelFor();
  }
  tensorflow::thread::ThreadPool* pool = workers->workers;
  return [pool, cost_per_unit](int64_t total, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    if (total == 1) {
      fn(0, 1);
      return;
    }
    pool->ParallelFor(total, cost_per_unit, fn);
  };
}

Status GetTableResource(OpKernelContext* ctx, int input_index, tensorflow::core::RefCountPtr<TableResource>* out) {
  const Tensor& t = ctx->input(input_index);
  if (t.dtype() != DT_RESOURCE || t.NumElements() != 1) {
    return InvalidArgument("input ", input_index, " must be a scalar tf_ext table handle (resource), got ",
                           DataTypeString(t.dtype()), " of shape ", t.shape().DebugString());
  }
  const ResourceHandle& h = t.flat<ResourceHandle>()(0);
  if (h.hash_code() != tensorflow::TypeIndex::Make<tensorflow::lookup::LookupInterface>().hash_code()) {
    return InvalidArgument("input ", input_index, " is not a tf_ext table handle: it refers to '", h.name(),
                           "' of type ", h.maybe_type_name());
  }
  tensorflow::core::RefCountPtr<tensorflow::lookup::LookupInterface> base;
  TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, h, &base));
  auto* table = dynamic_cast<TableResource*>(base.get());
  if (table == nullptr) {
    return InvalidArgument("input ", input_index, " is a lookup table but not a tf_ext table: '", h.name(), "' (",
                           base->DebugString(), ")");
  }
  base.release();
  out->reset(table);
  return tensorflow::OkStatus();
}

}  // namespace tfext
