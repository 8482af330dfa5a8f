// tensorflow_ext: the resource of a TfExtFrozenTableHandle (the read-only serving table), shared by the frozen
// table's kernels (frozen_table_kernels.cc) and the live model's (live_model_kernels.cc), which reads a table's
// current FrozenTable as the base of its first version.
//
// It holds a `std::shared_ptr<const table::FrozenTable>`: a reader copies the pointer under a short lock and then
// reads the immutable table with no lock at all. TfExtFrozenTableBuild builds a new table aside and swaps the
// pointer (Set): readers running meanwhile finish on the old table.

#ifndef TENSORFLOW_EXT_SERVING_KERNELS_FROZEN_TABLE_RESOURCE_H_
#define TENSORFLOW_EXT_SERVING_KERNELS_FROZEN_TABLE_RESOURCE_H_

#include <memory>
#include <string>
#include <utility>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow_ext/table/core/frozen_table.h"
#include "tensorflow_ext/table/kernels/storage_attrs.h"

namespace tfext {

class FrozenTableResource : public tensorflow::ResourceBase {
 public:
  FrozenTableResource(int64_t dim, table::RowStorage storage)
      : dim_(dim), storage_(storage), table_(table::FrozenTable::Build(nullptr, nullptr, 0, dim, storage)) {}

  int64_t dim() const { return dim_; }
  table::RowStorage storage() const { return storage_; }

  // The current table; the caller reads it with no lock held.
  std::shared_ptr<const table::FrozenTable> Get() const {
    tensorflow::tf_shared_lock l(mu_);
    return table_;
  }

  void Set(std::shared_ptr<const table::FrozenTable> t) {
    std::shared_ptr<const table::FrozenTable> old;
    {
      tensorflow::mutex_lock l(mu_);
      old.swap(table_);
      table_ = std::move(t);
    }
    // `old` is released here, outside the lock (or by the last lookup still reading it).
  }

  // Replaces the table with an empty one if it is still `expected` (a live model gives up the rows it started from:
  // live_model.h). Returns whether it did.
  bool ReleaseIfCurrent(const table::FrozenTable* expected) {
    std::shared_ptr<const table::FrozenTable> empty = table::FrozenTable::Build(nullptr, nullptr, 0, dim_, storage_);
    std::shared_ptr<const table::FrozenTable> old;
    {
      tensorflow::mutex_lock l(mu_);
      if (table_.get() != expected) return false;
      old.swap(table_);
      table_ = std::move(empty);
    }
    return true;
  }

  std::string DebugString() const override {
    auto t = Get();
    return "tf_ext frozen table (dim=" + std::to_string(dim_) + ", storage=" + RowStorageName(storage_) + ", " +
           std::to_string(t->size()) + " keys)";
  }

  int64_t MemoryUsed() const override { return Get()->memory_bytes(); }

 private:
  const int64_t dim_;
  const table::RowStorage storage_;
  mutable tensorflow::mutex mu_;
  std::shared_ptr<const table::FrozenTable> table_ TF_GUARDED_BY(mu_);
};

// The frozen table whose handle is input `index` of the kernel's op (a scalar resource tensor).
inline tensorflow::Status GetFrozenTable(tensorflow::OpKernelContext* ctx, int index,
                                         tensorflow::core::RefCountPtr<FrozenTableResource>* out) {
  const tensorflow::Tensor& t = ctx->input(index);
  if (t.dtype() != tensorflow::DT_RESOURCE || t.NumElements() != 1) {
    return tensorflow::errors::InvalidArgument(
        "input ", index, " must be a scalar tf_ext frozen table handle (resource), got ",
        tensorflow::DataTypeString(t.dtype()), " of shape ", t.shape().DebugString());
  }
  const tensorflow::ResourceHandle& h = t.flat<tensorflow::ResourceHandle>()(0);
  if (h.hash_code() != tensorflow::TypeIndex::Make<FrozenTableResource>().hash_code()) {
    return tensorflow::errors::InvalidArgument("input ", index, " is not a tf_ext frozen table handle: it refers to '",
                                               h.name(), "' of type ", h.maybe_type_name());
  }
  return tensorflow::LookupResource(ctx, h, out);
}

}  // namespace tfext

#endif  // TENSORFLOW_EXT_SERVING_KERNELS_FROZEN_TABLE_RESOURCE_H_
