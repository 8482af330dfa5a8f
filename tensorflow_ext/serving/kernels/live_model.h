// tensorflow_ext: the live serving model's state (live_model_kernels.cc has its ops): the resource, its immutable
// versions, the pin a request reads from, and the version rule of serving updates.

#ifndef TENSORFLOW_EXT_SERVING_KERNELS_LIVE_MODEL_H_
#define TENSORFLOW_EXT_SERVING_KERNELS_LIVE_MODEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/variant_tensor_data.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow_ext/serving/kernels/frozen_table_resource.h"
#include "tensorflow_ext/table/core/live_shard.h"

namespace tfext {
namespace live {

using table::LiveShard;
using tensorflow::OkStatus;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;

// One published state of a live model. Immutable: an update makes a new one.
struct ModelVersion {
  int64_t version = 0;
  std::vector<std::shared_ptr<const LiveShard>> tables;
  std::vector<Tensor> dense;
};

// The variant a TfExtLivePin outputs: the request's version. Copies share it. It cannot be serialized (a pin is only
// meaningful inside the process holding the model): Encode writes the type name and the version number only, for
// debugging, and Decode refuses.
struct LivePin {
  std::shared_ptr<const ModelVersion> model;

  static constexpr const char kTypeName[] = "tensorflow_ext.LivePin";
  std::string TypeName() const { return kTypeName; }
  void Encode(tensorflow::VariantTensorData* data) const {
    data->set_type_name(kTypeName);
    data->set_metadata(model != nullptr ? std::to_string(model->version) : std::string("none"));
  }
  bool Decode(tensorflow::VariantTensorData data) { return false; }
  std::string DebugString() const {
    return model != nullptr ? "tf_ext live model pin (version " + std::to_string(model->version) + ")"
                            : "tf_ext live model pin (empty)";
  }
};

// The resource of a TfExtLiveModelHandle: the model's name and layout (attrs), its current version (null until the
// first op that takes the model runs), the appliers' mutex and the counters of TfExtLiveStats.
//
// Memory: a slot starts from its frozen table's rows without copying them, so the frozen table's resource and the
// model share them. Once no version being published reads them any more (a full update or a compaction of the slot
// replaced its base), the model empties that frozen table (if it still holds those rows), so that the rows are
// freed when the last request pinning an older version ends: serving memory stays one set of tables, not two. A
// frozen table is read through its live model only.
class LiveModelResource : public tensorflow::ResourceBase {
 public:
  LiveModelResource(std::string model_name, std::string layout)
      : model_name_(std::move(model_name)), layout_(std::move(layout)) {}

  const std::string& model_name() const { return model_name_; }
  const std::string& layout() const { return layout_; }

  // The current version (null before the model starts). The caller reads it with no lock held.
  std::shared_ptr<const ModelVersion> Current() const {
    tensorflow::tf_shared_lock l(mu_);
    return current_;
  }

  // Makes `v` current: one pointer swap. The old version is released outside the lock (or by the last request
  // still pinning it).
  void Publish(std::shared_ptr<const ModelVersion> v) {
    std::shared_ptr<const ModelVersion> old;
    {
      tensorflow::mutex_lock l(mu_);
      old.swap(current_);
      current_ = std::move(v);
    }
  }

  // Starts the model from the op's inputs unless it has started: model, tables, `dense_input` (the dense list's
  // name), global_step. Appliers hold apply_mu while they read and publish; so does the start.
  Status StartIfNeeded(OpKernelContext* ctx, const char* dense_input) {
    if (Current() != nullptr) return OkStatus();
    std::lock_guard<std::mutex> l(apply_mu);
    return StartLocked(ctx, dense_input);
  }

  // StartIfNeeded with apply_mu held by the caller.
  Status StartLocked(OpKernelContext* ctx, const char* dense_input);

  // Empties each frozen table the model started from whose rows `v` (the current version) no longer reads. Call
  // with apply_mu held.
  void ReleaseReplacedSources(const ModelVersion& v);

  std::string DebugString() const override {
    auto v = Current();
    return "tf_ext live model '" + model_name_ + "' (" +
           (v != nullptr ? "version " + std::to_string(v->version) + ", " + std::to_string(v->tables.size()) +
                               " tables, " + std::to_string(v->dense.size()) + " dense"
                         : std::string("not started")) +
           ")";
  }

  int64_t MemoryUsed() const override {
    auto v = Current();
    int64_t bytes = 0;
    if (v != nullptr) {
      for (const auto& t : v->tables) bytes += t->memory_bytes();
      for (const Tensor& d : v->dense) bytes += d.TotalBytes();
    }
    return bytes;
  }

  // Serializes appliers (and the start): held from the version check to the last publish of an apply.
  std::mutex apply_mu;
  std::atomic<int64_t> applies{0};
  std::atomic<int64_t> stale{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> compactions{0};

 private:
  const std::string model_name_;
  const std::string layout_;
  mutable tensorflow::mutex mu_;
  std::shared_ptr<const ModelVersion> current_ TF_GUARDED_BY(mu_);
  // Per table slot (set at the start, under apply_mu): the frozen table it started from and those rows (weak: the
  // model does not keep them alive; null once released).
  std::vector<tensorflow::core::RefCountPtr<FrozenTableResource>> sources_;
  std::vector<std::weak_ptr<const table::FrozenTable>> source_tables_;
};

// The model whose handle is input 0 of the kernel's op.
Status GetLiveModel(OpKernelContext* ctx, tensorflow::core::RefCountPtr<LiveModelResource>* out);

// The version the pin in input 0 holds (alive while that input is).
Status GetPin(OpKernelContext* ctx, const ModelVersion** out);

// A serving update's metadata: the scalar inputs model_name, layout, kind, from_step and to_step.
struct UpdateMeta {
  std::string model_name, layout, kind;
  int64_t from_step = 0, to_step = 0;
  bool full() const { return kind == "full"; }
};

Status ReadUpdateMeta(OpKernelContext* ctx, UpdateMeta* u);

// The version rule (update_format.py): OK with *apply (false: stale, nothing to do), or why the update cannot apply
// to `model` served at version `served` (InvalidArgument: another model, a layout that lacks one of the model's
// lines, a bad kind or steps; FailedPrecondition: a gap).
Status CheckUpdate(const LiveModelResource& model, int64_t served, const UpdateMeta& u, bool* apply);

// update_format.layout_difference: "" when every line of `model` is in `update`, else each missing line with the
// update's line of the same name (or that it has none).
std::string LayoutDifference(const std::string& model, const std::string& update);

// Whether a shard's overlay and removed keys have grown large enough next to its base to fold them in.
bool NeedsCompaction(const LiveShard& s);

// Tests only: with the environment variable TF_EXT_LIVE_MODEL_TEST_THROW set to `where` ("start", "build" or
// "compact"), throws a std::runtime_error there, as a failure that no check foresees would (the model must turn it
// into an error status and publish nothing, or keep serving what it published). Read at each of those points.
void MaybeThrowForTest(const char* where);

}  // namespace live
}  // namespace tfext

#endif  // TENSORFLOW_EXT_SERVING_KERNELS_LIVE_MODEL_H_
