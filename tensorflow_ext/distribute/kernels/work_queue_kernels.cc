// tensorflow_ext: work queues (TfExtWorkQueue* ops and CPU kernels), the parameter-server side of
// tf_ext.distribute.WorkQueue.
//
// A TfExtWorkQueueHandle resource lives on one task (a ps task in a cluster) and holds a WorkQueueState
// (work_queue.h: what is pending, held by which worker and done). Every worker's ops run on that task, so the queue
// outlives any worker: a restarted worker finds its progress there, and the slice of a worker that stopped renewing
// its lease is handed to another. The resource is empty until TfExtWorkQueueReset (the chief's initializer, or the
// restore of a checkpoint) fills it; every other op but IsInitialized fails with FailedPrecondition before that.
//
// Ops (all on the queue's task; each runs under the resource's mutex, in microseconds: none blocks):
//   TfExtWorkQueueHandle                                   -> queue
//   TfExtWorkQueueReset(queue, slices [S], restored_digest, restored_done [N])
//                      attrs num_epochs, shuffle, seed, lease_secs -> restored (bool)
//       A new state replaces the old one (every lease dropped). With a non-empty restored_digest equal to the new
//       state's digest, the items restored_done marks are done (restored = true); a different digest is a
//       checkpoint of other slices: logged, and the queue starts afresh (restored = false).
//   TfExtWorkQueueIsInitialized(queue)                     -> bool
//   TfExtWorkQueueTake(queue, worker, finished)            -> status (0 taken, 1 wait, 2 finished), slice, epoch,
//                                                             slice_index, wait_secs (WorkQueueState::Take)
//   TfExtWorkQueueRenew(queue, worker)                     -> holds (bool)
//   TfExtWorkQueueSave(queue)                              -> digest, done [N] (int8: 1 = done)
//   TfExtWorkQueueCounts(queue)                            -> [items, done, held, pending] (int64)

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow_ext/distribute/kernels/work_queue.h"

namespace tfext {
namespace {

using distribute::TakeResult;
using distribute::WorkQueueCounts;
using distribute::WorkQueueState;
using tensorflow::DEVICE_CPU;
using tensorflow::OkStatus;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::FailedPrecondition;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;

double NowSecs() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

class WorkQueueResource : public tensorflow::ResourceBase {
 public:
  explicit WorkQueueResource(std::string name) : name_(std::move(name)) {}

  std::string DebugString() const override { return "tf_ext work queue '" + name_ + "'"; }
  const std::string& name() const { return name_; }

  tensorflow::mutex* mu() { return &mu_; }
  // The state, or FailedPrecondition while the queue is empty. Call with mu() held.
  Status State(WorkQueueState** out) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (state_ == nullptr) {
      return FailedPrecondition("tf_ext work queue '", name_,
                                "' is not initialized: the chief fills it (its init op, e.g. the Scaffold's default, "
                                "runs every shared resource's initializer; or a restore from a checkpoint) before "
                                "the workers take work");
    }
    *out = state_.get();
    return OkStatus();
  }
  bool initialized() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_ != nullptr; }
  void Replace(std::unique_ptr<WorkQueueState> state) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) { state_ = std::move(state); }

 private:
  const std::string name_;
  tensorflow::mutex mu_;
  std::unique_ptr<WorkQueueState> state_ TF_GUARDED_BY(mu_);
};

Status GetQueue(OpKernelContext* ctx, RefCountPtr<WorkQueueResource>* out) {
  const Tensor& t = ctx->input(0);
  if (t.dtype() != tensorflow::DT_RESOURCE || t.NumElements() != 1) {
    return InvalidArgument("input 0 must be a scalar tf_ext work queue handle (resource), got ",
                           tensorflow::DataTypeString(t.dtype()), " of shape ", t.shape().DebugString());
  }
  const tensorflow::ResourceHandle& h = t.flat<tensorflow::ResourceHandle>()(0);
  if (h.hash_code() != tensorflow::TypeIndex::Make<WorkQueueResource>().hash_code()) {
    return InvalidArgument("input 0 is not a tf_ext work queue handle: it refers to '", h.name(), "' of type ",
                           h.maybe_type_name());
  }
  return tensorflow::LookupResource(ctx, h, out);
}

Status ScalarInput(OpKernelContext* ctx, int index, const char* what) {
  const Tensor& t = ctx->input(index);
  if (!tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return InvalidArgument(what, " must be a scalar, got shape ", t.shape().DebugString());
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------
// TfExtWorkQueueHandle

class WorkQueueHandleOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  ~WorkQueueHandleOp() override {
    if (initialized_ && cinfo_.resource_is_private_to_kernel()) {
      cinfo_.resource_manager()->Delete<WorkQueueResource>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::mutex_lock l(mu_);
    if (!initialized_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/true));
      WorkQueueResource* queue = nullptr;
      const std::string name = cinfo_.name();
      OP_REQUIRES_OK(ctx, cinfo_.resource_manager()->LookupOrCreate<WorkQueueResource>(
                              cinfo_.container(), name, &queue, [&name](WorkQueueResource** ret) {
                                *ret = new WorkQueueResource(name);
                                return OkStatus();
                              }));
      queue->Unref();
      initialized_ = true;
    }
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::MakeResourceHandle<WorkQueueResource>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  tensorflow::mutex mu_;
  bool initialized_ TF_GUARDED_BY(mu_) = false;
  tensorflow::ContainerInfo cinfo_;
};

// ---------------------------------------------------------------------------
// TfExtWorkQueueReset

class WorkQueueResetOp : public OpKernel {
 public:
  explicit WorkQueueResetOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_epochs", &num_epochs_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shuffle", &shuffle_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("lease_secs", &lease_secs_));
  }

  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<WorkQueueResource> queue;
    OP_REQUIRES_OK(ctx, GetQueue(ctx, &queue));
    const Tensor& slices = ctx->input(1);
    OP_REQUIRES(ctx, slices.dims() == 1,
                InvalidArgument("slices must be a vector of strings, got shape ", slices.shape().DebugString()));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, "restored_digest"));
    const Tensor& done = ctx->input(3);
    OP_REQUIRES(ctx, done.dims() == 1,
                InvalidArgument("restored_done must be a vector, got shape ", done.shape().DebugString()));
    std::vector<std::string> names(slices.NumElements());
    for (int64_t i = 0; i < slices.NumElements(); ++i) names[i] = slices.flat<tensorflow::tstring>()(i);
    std::unique_ptr<WorkQueueState> state;
    try {
      state = std::make_unique<WorkQueueState>(std::move(names), num_epochs_, shuffle_, static_cast<uint64_t>(seed_),
                                               static_cast<double>(lease_secs_));
    } catch (const std::invalid_argument& e) {
      ctx->SetStatus(InvalidArgument("tf_ext work queue '", queue->name(), "': ", e.what()));
      return;
    }
    const std::string restored_digest(ctx->input(2).scalar<tensorflow::tstring>()());
    bool restored = false;
    if (!restored_digest.empty()) {
      if (restored_digest == state->digest()) {
        std::vector<uint8_t> mask(done.NumElements());
        for (int64_t i = 0; i < done.NumElements(); ++i) mask[i] = done.flat<int8_t>()(i) != 0;
        try {
          state->MarkDone(mask);
        } catch (const std::invalid_argument& e) {
          ctx->SetStatus(InvalidArgument("tf_ext work queue '", queue->name(), "': the checkpoint's progress does not ",
                                         "fit its own digest ", restored_digest, ": ", e.what()));
          return;
        }
        restored = true;
      } else {
        LOG(WARNING) << "tf_ext work queue '" << queue->name() << "': the checkpoint's queue was built from other "
                     << "slices, epochs, shuffle or seed (digest " << restored_digest << ", this queue's "
                     << state->digest() << "): its progress is dropped and every slice is handed out afresh";
      }
    }
    {
      tensorflow::mutex_lock l(*queue->mu());
      queue->Replace(std::move(state));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = restored;
  }

 private:
  int64_t num_epochs_ = 1;
  bool shuffle_ = true;
  int64_t seed_ = 0;
  float lease_secs_ = 60;
};

// ---------------------------------------------------------------------------
// TfExtWorkQueueIsInitialized

class WorkQueueIsInitializedOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<WorkQueueResource> queue;
    OP_REQUIRES_OK(ctx, GetQueue(ctx, &queue));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    tensorflow::mutex_lock l(*queue->mu());
    out->scalar<bool>()() = queue->initialized();
  }
};

// ---------------------------------------------------------------------------
// TfExtWorkQueueTake

class WorkQueueTakeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<WorkQueueResource> queue;
    OP_REQUIRES_OK(ctx, GetQueue(ctx, &queue));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "worker"));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, "finished"));
    const std::string worker(ctx->input(1).scalar<tensorflow::tstring>()());
    OP_REQUIRES(ctx, !worker.empty(), InvalidArgument("worker must name the taking worker, got an empty string"));
    const bool finished = ctx->input(2).scalar<bool>()();
    TakeResult r;
    std::string slice;
    {
      tensorflow::mutex_lock l(*queue->mu());
      WorkQueueState* state = nullptr;
      OP_REQUIRES_OK(ctx, queue->State(&state));
      r = state->Take(worker, finished, NowSecs());
      if (r.slice >= 0) slice = state->slice(r.slice);
    }
    for (const std::string& w : r.expired) {
      LOG(WARNING) << "tf_ext work queue '" << queue->name() << "': worker '" << w
                   << "' did not renew its lease in time (stopped or cut off): its slice is handed out again";
    }
    if (r.released) {
      LOG(WARNING) << "tf_ext work queue '" << queue->name() << "': worker '" << worker
                   << "' started again: the slice it held is handed out again";
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = static_cast<int32_t>(r.status);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = slice;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<int64_t>()() = r.epoch;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &out));
    out->scalar<int64_t>()() = r.slice;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({}), &out));
    out->scalar<float>()() = static_cast<float>(r.wait_secs);
  }
};

// ---------------------------------------------------------------------------
// TfExtWorkQueueRenew

class WorkQueueRenewOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<WorkQueueResource> queue;
    OP_REQUIRES_OK(ctx, GetQueue(ctx, &queue));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "worker"));
    const std::string worker(ctx->input(1).scalar<tensorflow::tstring>()());
    bool holds = false;
    {
      tensorflow::mutex_lock l(*queue->mu());
      WorkQueueState* state = nullptr;
      OP_REQUIRES_OK(ctx, queue->State(&state));
      holds = state->Renew(worker, NowSecs());
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = holds;
  }
};

// ---------------------------------------------------------------------------
// TfExtWorkQueueSave

class WorkQueueSaveOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<WorkQueueResource> queue;
    OP_REQUIRES_OK(ctx, GetQueue(ctx, &queue));
    std::string digest;
    std::vector<uint8_t> mask;
    {
      tensorflow::mutex_lock l(*queue->mu());
      WorkQueueState* state = nullptr;
      OP_REQUIRES_OK(ctx, queue->State(&state));
      digest = state->digest();
      mask = state->DoneMask();
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = digest;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({static_cast<int64_t>(mask.size())}), &out));
    auto flat = out->flat<int8_t>();
    for (size_t i = 0; i < mask.size(); ++i) flat(i) = static_cast<int8_t>(mask[i]);
  }
};

// ---------------------------------------------------------------------------
// TfExtWorkQueueCounts

class WorkQueueCountsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<WorkQueueResource> queue;
    OP_REQUIRES_OK(ctx, GetQueue(ctx, &queue));
    WorkQueueCounts c;
    {
      tensorflow::mutex_lock l(*queue->mu());
      WorkQueueState* state = nullptr;
      OP_REQUIRES_OK(ctx, queue->State(&state));
      c = state->counts();
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({4}), &out));
    auto flat = out->flat<int64_t>();
    flat(0) = c.items;
    flat(1) = c.done;
    flat(2) = c.held;
    flat(3) = c.pending;
  }
};

Status ScalarOutputs(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
  return OkStatus();
}

}  // namespace

REGISTER_OP("TfExtWorkQueueHandle")
    .Output("queue: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtWorkQueueReset")
    .Input("queue: resource")
    .Input("slices: string")
    .Input("restored_digest: string")
    .Input("restored_done: int8")
    .Output("restored: bool")
    .Attr("num_epochs: int >= 1")
    .Attr("shuffle: bool")
    .Attr("seed: int")
    .Attr("lease_secs: float")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtWorkQueueIsInitialized")
    .Input("queue: resource")
    .Output("initialized: bool")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtWorkQueueTake")
    .Input("queue: resource")
    .Input("worker: string")
    .Input("finished: bool")
    .Output("status: int32")
    .Output("slice: string")
    .Output("epoch: int64")
    .Output("slice_index: int64")
    .Output("wait_secs: float")
    .SetIsStateful()
    .SetShapeFn(ScalarOutputs);

REGISTER_OP("TfExtWorkQueueRenew")
    .Input("queue: resource")
    .Input("worker: string")
    .Output("holds: bool")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtWorkQueueSave")
    .Input("queue: resource")
    .Output("digest: string")
    .Output("done: int8")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      return OkStatus();
    });

REGISTER_OP("TfExtWorkQueueCounts")
    .Input("queue: resource")
    .Output("counts: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(4));
      return OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueHandle").Device(DEVICE_CPU), WorkQueueHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueReset").Device(DEVICE_CPU), WorkQueueResetOp);
REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueIsInitialized").Device(DEVICE_CPU), WorkQueueIsInitializedOp);
REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueTake").Device(DEVICE_CPU), WorkQueueTakeOp);
REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueRenew").Device(DEVICE_CPU), WorkQueueRenewOp);
REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueSave").Device(DEVICE_CPU), WorkQueueSaveOp);
REGISTER_KERNEL_BUILDER(Name("TfExtWorkQueueCounts").Device(DEVICE_CPU), WorkQueueCountsOp);

}  // namespace tfext
