// tensorflow_ext: live serving models, updated in place by training's serving updates (ops and CPU kernels).
//
// A TfExtLiveModelHandle resource holds the served model's current ModelVersion: its version (the trainer's global
// step its state reflects), one table::LiveShard per frozen table slot and one tensor per dense slot. A version is
// immutable. An update builds a new version beside the current one (sharing every shard it does not change, and
// every shard's base) and publishes it with one pointer swap; compacting a shard publishes one more version of the
// same number and contents.
//
// A request pins a version once (TfExtLivePin: a variant holding a shared_ptr<const ModelVersion>) and reads every
// table and dense value from that pin (TfExtLiveFind, TfExtLiveDense, TfExtLiveVersion), so it sees all of them at
// one version however many updates run meanwhile; reads take no lock, and the version lives until the last tensor
// holding its pin is released.
//
// Updates (TfExtLiveCheckUpdate, TfExtLiveApply) follow the version rule of tensorflow_ext/serving/update_format.py:
// a delta (from_step a, to_step b) applies at a served version v with a <= v < b, a full update when v < b; b <= v is
// stale (changes nothing, not an error); a > v is a gap (FailedPrecondition). Appliers are serialized by the model's
// apply mutex; a failed apply publishes nothing.
//
// The model starts at the first run of any of these ops (all take the same model, tables, dense and global_step
// inputs): version 0 is each frozen table's current table (shared, not copied), a copy of each dense input and the
// global step input (0 without one). A frozen table restored later is not seen by the model: load a new SavedModel
// instead. Once a full update or a compaction has replaced a slot's starting rows, the model empties that frozen
// table so that those rows can be freed (live_model.h): the frozen tables are read through the model only.
//
// Slots: table slot i is the i-th `tables` input; dense slot j the j-th dense input. The `layout` attr is the model's
// layout lines (update_format.layout); they must describe the slots (the same table dims and dense dtypes and
// shapes, in any order), and every one of them must be in an update's layout for the update to apply.

#include <algorithm>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
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
#include "tensorflow/core/framework/tensor_util.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/framework/variant_encode_decode.h"
#include "tensorflow/core/framework/variant_tensor_data.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/util/work_sharder.h"
#include "tensorflow_ext/serving/kernels/live_model.h"
#include "tensorflow_ext/table/core/live_shard.h"

namespace tfext {
namespace {

using live::GetLiveModel;
using live::GetPin;
using live::LiveModelResource;
using live::LivePin;
using live::MaybeThrowForTest;
using live::ModelVersion;
using live::NeedsCompaction;
using live::UpdateMeta;
using table::LiveShard;
using tensorflow::DataType;
using tensorflow::DataTypeString;
using tensorflow::DEVICE_CPU;
using tensorflow::OkStatus;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::Variant;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::FailedPrecondition;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// ---------------------------------------------------------------------------
// TfExtLiveModelHandle

class LiveModelHandleOp : public OpKernel {
 public:
  explicit LiveModelHandleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("model_name", &model_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layout", &layout_));
  }

  ~LiveModelHandleOp() override {
    if (initialized_ && cinfo_.resource_is_private_to_kernel()) {
      cinfo_.resource_manager()->Delete<LiveModelResource>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::mutex_lock l(mu_);
    if (!initialized_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/false));
    }
    LiveModelResource* model = nullptr;
    const std::string model_name = model_name_;
    const std::string layout = layout_;
    OP_REQUIRES_OK(ctx, cinfo_.resource_manager()->LookupOrCreate<LiveModelResource>(
                            cinfo_.container(), cinfo_.name(), &model, [&model_name, &layout](LiveModelResource** ret) {
                              *ret = new LiveModelResource(model_name, layout);
                              return OkStatus();
                            }));
    tensorflow::core::ScopedUnref unref(model);
    OP_REQUIRES(ctx, model->model_name() == model_name_ && model->layout() == layout_,
                FailedPrecondition("tf_ext live model '", cinfo_.name(), "' already exists as model '",
                                   model->model_name(), "' with layout '", model->layout(),
                                   "' but this op asks for model '", model_name_, "' with layout '", layout_, "'"));
    initialized_ = true;
    Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle));
    handle->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::MakeResourceHandle<LiveModelResource>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  tensorflow::mutex mu_;
  bool initialized_ TF_GUARDED_BY(mu_) = false;
  tensorflow::ContainerInfo cinfo_;
  std::string model_name_;
  std::string layout_;
};

// ---------------------------------------------------------------------------
// TfExtLivePin: model, tables, dense, global_step -> pin (starts the model at its first run)

class LivePinOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<LiveModelResource> model;
    OP_REQUIRES_OK(ctx, GetLiveModel(ctx, &model));
    OP_REQUIRES_OK(ctx, model->StartIfNeeded(ctx, "dense"));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    LivePin pin;
    pin.model = model->Current();
    out->scalar<Variant>()() = std::move(pin);
  }
};

// ---------------------------------------------------------------------------
// TfExtLiveFind: pin, keys (any shape), default_value (scalar or [dim]) -> values, found (as TfExtFrozenTableFind)

class LiveFindOp : public OpKernel {
 public:
  explicit LiveFindOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot", &slot_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
  }

  void Compute(OpKernelContext* ctx) override {
    const ModelVersion* v = nullptr;
    OP_REQUIRES_OK(ctx, GetPin(ctx, &v));
    OP_REQUIRES(
        ctx, slot_ >= 0 && slot_ < static_cast<int64_t>(v->tables.size()),
        InvalidArgument("table slot ", slot_, " is out of range: the live model has ", v->tables.size(), " tables"));
    const LiveShard& shard = *v->tables[slot_];
    const int64_t dim = shard.dim();
    OP_REQUIRES(
        ctx, dim == dim_,
        InvalidArgument("table slot ", slot_, " of the live model has dim=", dim, ", this find asks for dim=", dim_));
    const Tensor& keys = ctx->input(1);
    const Tensor& def = ctx->input(2);
    OP_REQUIRES(ctx, def.NumElements() == 1 || (def.dims() == 1 && def.dim_size(0) == dim),
                InvalidArgument("default_value must be a scalar or a vector of ", dim, " floats, got shape ",
                                def.shape().DebugString()));
    TensorShape out_shape = keys.shape();
    out_shape.AddDim(dim);
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &values));
    if (ctx->output_required(1)) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &found));
    }
    const int64_t n = keys.NumElements();
    if (n == 0) return;
    std::vector<float> default_row(dim, def.flat<float>()(0));
    if (def.NumElements() == dim) std::memcpy(default_row.data(), def.flat<float>().data(), dim * sizeof(float));
    const int64_t* k = keys.flat<int64_t>().data();
    float* out = values->flat<float>().data();
    bool* f = found != nullptr ? found->flat<bool>().data() : nullptr;
    auto work = [&](int64_t begin, int64_t end) {
      shard.Find(k + begin, end - begin, out + begin * dim, f != nullptr ? f + begin : nullptr, default_row.data());
    };
    // Small batches (a serving request) run inline: the request threads are the parallelism.
    if (n < 16384) {
      work(0, n);
    } else {
      auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
      tensorflow::Shard(workers->num_threads, workers->workers, n, 200 + 4 * dim, work);
    }
  }

 private:
  int64_t slot_ = 0;
  int64_t dim_ = 1;
};

// ---------------------------------------------------------------------------
// TfExtLiveDense: pin -> the dense slot's value (shares the version's buffer: no copy)

class LiveDenseOp : public OpKernel {
 public:
  explicit LiveDenseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot", &slot_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shape", &shape_));
  }

  void Compute(OpKernelContext* ctx) override {
    const ModelVersion* v = nullptr;
    OP_REQUIRES_OK(ctx, GetPin(ctx, &v));
    OP_REQUIRES(ctx, slot_ >= 0 && slot_ < static_cast<int64_t>(v->dense.size()),
                InvalidArgument("dense slot ", slot_, " is out of range: the live model has ", v->dense.size(),
                                " dense values"));
    const Tensor& value = v->dense[slot_];
    OP_REQUIRES(ctx, value.dtype() == dtype_ && shape_.IsCompatibleWith(value.shape()),
                InvalidArgument("dense slot ", slot_, " of the live model is ", DataTypeString(value.dtype()), " ",
                                value.shape().DebugString(), ", this read asks for ", DataTypeString(dtype_), " ",
                                shape_.DebugString()));
    ctx->set_output(0, value);
  }

 private:
  int64_t slot_ = 0;
  DataType dtype_ = tensorflow::DT_FLOAT;
  tensorflow::PartialTensorShape shape_;
};

// ---------------------------------------------------------------------------
// TfExtLiveVersion: pin -> version

class LiveVersionOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const ModelVersion* v = nullptr;
    OP_REQUIRES_OK(ctx, GetPin(ctx, &v));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = v->version;
  }
};

// ---------------------------------------------------------------------------
// TfExtLiveCheckUpdate: model, tables, dense, global_step, update metadata -> apply

class LiveCheckUpdateOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<LiveModelResource> model;
    OP_REQUIRES_OK(ctx, GetLiveModel(ctx, &model));
    OP_REQUIRES_OK(ctx, model->StartIfNeeded(ctx, "dense"));
    UpdateMeta u;
    OP_REQUIRES_OK(ctx, ReadUpdateMeta(ctx, &u));
    bool apply = false;
    const Status s = CheckUpdate(*model, model->Current()->version, u, &apply);
    if (!s.ok()) {
      model->refused.fetch_add(1);
      ctx->CtxFailure(s);
      return;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = apply;
  }
};

// ---------------------------------------------------------------------------
// TfExtLiveApply: model, tables, dense_in, global_step, update metadata, keys, values, removed, dense ->
// version, applied

// Hands the heap's free pages back to the system. An apply frees an update's tensors, the overlays it replaced and
// each compacted slot's old base; glibc keeps such blocks in its arenas once its mmap threshold has grown past them
// (it grows to the size of a freed mapping), so without this a serving process's memory would ratchet up by about
// an update's size at every apply instead of returning to its steady state.
void ReturnFreedMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

class LiveApplyOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<LiveModelResource> model;
    OP_REQUIRES_OK(ctx, GetLiveModel(ctx, &model));
    UpdateMeta u;
    OP_REQUIRES_OK(ctx, ReadUpdateMeta(ctx, &u));
    std::lock_guard<std::mutex> l(model->apply_mu);
    OP_REQUIRES_OK(ctx, model->StartLocked(ctx, "dense_in"));
    std::shared_ptr<const ModelVersion> current = model->Current();
    bool apply = false;
    std::shared_ptr<ModelVersion> next;
    Status s = CheckUpdate(*model, current->version, u, &apply);
    if (s.ok() && apply) {
      // Build names the slot of a failure it foresees; anything else thrown while building fails the apply too
      // (nothing is published yet), and is never let through the kernel.
      try {
        s = Build(ctx, *current, u, &next);
      } catch (const std::bad_alloc&) {
        s = tensorflow::errors::ResourceExhausted("live model '", model->model_name(),
                                                  "': out of memory building "
                                                  "version ",
                                                  u.to_step);
      } catch (const std::exception& e) {
        s = tensorflow::errors::Internal("live model '", model->model_name(), "': building version ", u.to_step,
                                         " failed: ", e.what());
      }
    }
    if (!s.ok()) {
      model->refused.fetch_add(1);
      ctx->CtxFailure(s);
      return;
    }
    if (!apply) model->stale.fetch_add(1);
    Tensor* version = nullptr;
    Tensor* applied = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &version));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &applied));
    version->scalar<int64_t>()() = apply ? next->version : current->version;
    applied->scalar<bool>()() = apply;
    if (!apply) return;
    model->Publish(next);
    model->ReleaseReplacedSources(*next);
    model->applies.fetch_add(1);
    // The version before the update shares the bases being compacted below: let it go (requests pinning it keep it
    // alive as long as they need it), so that a compacted base exists twice only while its compaction runs.
    current.reset();
    // Then the shards whose overlays grew large, one at a time (one base exists twice at most), each published as a
    // version of the same number and contents.
    for (size_t i = 0; i < next->tables.size(); ++i) {
      if (!NeedsCompaction(*next->tables[i])) continue;
      std::shared_ptr<ModelVersion> compacted;
      try {
        MaybeThrowForTest("compact");
        compacted = std::make_shared<ModelVersion>(*next);
        compacted->tables[i] = next->tables[i]->Compacted();
      } catch (const std::exception& e) {
        // Nothing of it is published. The update is applied and served (the op reports it so: failing the op now
        // would tell the applier that the update did not apply); the shard keeps its overlay, and the next apply
        // tries again.
        LOG(WARNING) << "tf_ext live model '" << model->model_name() << "': compacting table slot " << i << " ("
                     << next->tables[i]->base_size() << " keys in its base, " << next->tables[i]->overlay_size()
                     << " in its overlay) failed, it stays uncompacted: " << e.what();
        continue;
      }
      next = std::move(compacted);
      model->Publish(next);
      model->ReleaseReplacedSources(*next);
      model->compactions.fetch_add(1);
      ReturnFreedMemory();
    }
    ReturnFreedMemory();
  }

 private:
  // The version `u` makes of `current`, from the kernel's update inputs (checked before anything is built).
  Status Build(OpKernelContext* ctx, const ModelVersion& current, const UpdateMeta& u,
               std::shared_ptr<ModelVersion>* out) {
    OpInputList keys, values, removed, dense;
    TF_RETURN_IF_ERROR(ctx->input_list("keys", &keys));
    TF_RETURN_IF_ERROR(ctx->input_list("values", &values));
    TF_RETURN_IF_ERROR(ctx->input_list("removed", &removed));
    TF_RETURN_IF_ERROR(ctx->input_list("dense", &dense));
    const int num_tables = static_cast<int>(current.tables.size());
    if (keys.size() != num_tables || static_cast<size_t>(dense.size()) != current.dense.size()) {
      return InvalidArgument("the update has ", keys.size(), " tables and ", dense.size(),
                             " dense values, the live model has ", num_tables, " and ", current.dense.size());
    }
    for (int i = 0; i < num_tables; ++i) {
      const int64_t dim = current.tables[i]->dim();
      if (keys[i].dims() != 1) {
        return InvalidArgument("table slot ", i, ": keys must be a vector, got shape ", keys[i].shape().DebugString());
      }
      const int64_t n = keys[i].dim_size(0);
      if (values[i].dims() != 2 || values[i].dim_size(0) != n || values[i].dim_size(1) != dim) {
        return InvalidArgument("table slot ", i, ": values must be [", n, ", ", dim, "] (one row of dim=", dim,
                               " floats per key), got shape ", values[i].shape().DebugString());
      }
      if (removed[i].dims() != 1) {
        return InvalidArgument("table slot ", i, ": removed must be a vector, got shape ",
                               removed[i].shape().DebugString());
      }
      if (u.full() && removed[i].NumElements() != 0) {
        return InvalidArgument("table slot ", i, ": a full update removes no keys, got ", removed[i].NumElements(),
                               " removed keys");
      }
    }
    for (int j = 0; j < dense.size(); ++j) {
      const Tensor& served = current.dense[j];
      if (dense[j].dtype() != served.dtype() || dense[j].shape() != served.shape()) {
        return InvalidArgument("dense slot ", j, ": the update's value is ", DataTypeString(dense[j].dtype()), " ",
                               dense[j].shape().DebugString(), ", the live model's is ", DataTypeString(served.dtype()),
                               " ", served.shape().DebugString());
      }
    }
    auto next = std::make_shared<ModelVersion>();
    next->version = u.to_step;
    next->tables.resize(num_tables);
    for (int i = 0; i < num_tables; ++i) {
      const LiveShard& shard = *current.tables[i];
      const int64_t n = keys[i].dim_size(0);
      const int64_t m = removed[i].dim_size(0);
      const int64_t* k = keys[i].flat<int64_t>().data();
      const float* rows = values[i].flat<float>().data();
      try {
        MaybeThrowForTest("build");
        if (u.full()) {
          next->tables[i] = LiveShard::FromRows(k, rows, n, shard.dim(), shard.storage());
        } else if (n == 0 && m == 0) {
          next->tables[i] = current.tables[i];
        } else {
          next->tables[i] = shard.ApplyDelta(k, rows, n, removed[i].flat<int64_t>().data(), m);
        }
      } catch (const std::invalid_argument& e) {
        return InvalidArgument("table slot ", i, ": ", e.what());
      } catch (const std::bad_alloc&) {
        return tensorflow::errors::ResourceExhausted("table slot ", i, ": out of memory applying ", n, " rows and ", m,
                                                     " removed keys");
      } catch (const std::exception& e) {
        return tensorflow::errors::Internal("table slot ", i, ": applying ", n, " rows and ", m,
                                            " removed keys failed: ", e.what());
      }
    }
    // A dense value nothing else holds (the update's restored tensor, whose only reference is this op's input, in
    // memory the tensor owns) becomes the version's as it is: no one can change it any more. That is TF's own test
    // for letting an op overwrite its input in place (Tensor::RefCountIsOne). Any other is copied, as at the start:
    // it may share a buffer that its producer changes later (a variable's, or a fed array the tensor does not own).
    for (const Tensor& d : dense) next->dense.push_back(d.RefCountIsOne() ? d : tensorflow::tensor::DeepCopy(d));
    *out = std::move(next);
    return OkStatus();
  }
};

// ---------------------------------------------------------------------------
// TfExtLiveStats: model -> [version, applies, stale, refused, live keys, overlay keys, memory bytes, compactions]

class LiveStatsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    RefCountPtr<LiveModelResource> model;
    OP_REQUIRES_OK(ctx, GetLiveModel(ctx, &model));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({8}), &out));
    auto s = out->flat<int64_t>();
    const std::shared_ptr<const ModelVersion> v = model->Current();
    int64_t keys = 0, overlay = 0, bytes = 0;
    if (v != nullptr) {
      for (const auto& t : v->tables) {
        keys += t->size();
        overlay += t->overlay_size();
        bytes += t->memory_bytes();
      }
    }
    s(0) = v != nullptr ? v->version : -1;
    s(1) = model->applies.load();
    s(2) = model->stale.load();
    s(3) = model->refused.load();
    s(4) = keys;
    s(5) = overlay;
    s(6) = bytes;
    s(7) = model->compactions.load();
  }
};

Status ScalarInput(InferenceContext* c, int index) {
  ShapeHandle h;
  return c->WithRank(c->input(index), 0, &h);
}

}  // namespace

REGISTER_OP("TfExtLiveModelHandle")
    .Output("model: resource")
    .Attr("model_name: string")
    .Attr("layout: string")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtLivePin")
    .Input("model: resource")
    .Input("tables: N_tables * resource")
    .Input("dense: dense_dtypes")
    .Input("global_step: N_step * int64")
    .Output("pin: variant")
    .Attr("N_tables: int >= 0")
    .Attr("dense_dtypes: list(type) >= 0")
    .Attr("N_step: int >= 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtLiveFind")
    .Input("pin: variant")
    .Input("keys: int64")
    .Input("default_value: float")
    .Output("values: float")
    .Output("found: bool")
    .Attr("slot: int")
    .Attr("dim: int")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      int64_t dim = -1;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      ShapeHandle values;
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), c->Vector(dim), &values));
      c->set_output(0, values);
      c->set_output(1, c->input(1));
      return OkStatus();
    });

REGISTER_OP("TfExtLiveDense")
    .Input("pin: variant")
    .Output("value: dtype")
    .Attr("slot: int")
    .Attr("dtype: type")
    .Attr("shape: shape")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return OkStatus();
    });

REGISTER_OP("TfExtLiveVersion")
    .Input("pin: variant")
    .Output("version: int64")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtLiveCheckUpdate")
    .Input("model: resource")
    .Input("tables: N_tables * resource")
    .Input("dense: dense_dtypes")
    .Input("global_step: N_step * int64")
    .Input("model_name: string")
    .Input("layout: string")
    .Input("kind: string")
    .Input("from_step: int64")
    .Input("to_step: int64")
    .Output("apply: bool")
    .Attr("N_tables: int >= 0")
    .Attr("dense_dtypes: list(type) >= 0")
    .Attr("N_step: int >= 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfExtLiveApply")
    .Input("model: resource")
    .Input("tables: N_tables * resource")
    .Input("dense_in: dense_dtypes")
    .Input("global_step: N_step * int64")
    .Input("model_name: string")
    .Input("layout: string")
    .Input("kind: string")
    .Input("from_step: int64")
    .Input("to_step: int64")
    .Input("keys: N_tables * int64")
    .Input("values: N_tables * float")
    .Input("removed: N_tables * int64")
    .Input("dense: dense_dtypes")
    .Output("version: int64")
    .Output("applied: bool")
    .Attr("N_tables: int >= 0")
    .Attr("dense_dtypes: list(type) >= 0")
    .Attr("N_step: int >= 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    });

REGISTER_OP("TfExtLiveStats")
    .Input("model: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(8));
      return OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("TfExtLiveModelHandle").Device(DEVICE_CPU), LiveModelHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLivePin").Device(DEVICE_CPU), LivePinOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLiveFind").Device(DEVICE_CPU), LiveFindOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLiveDense").Device(DEVICE_CPU), LiveDenseOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLiveVersion").Device(DEVICE_CPU), LiveVersionOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLiveCheckUpdate").Device(DEVICE_CPU), LiveCheckUpdateOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLiveApply").Device(DEVICE_CPU), LiveApplyOp);
REGISTER_KERNEL_BUILDER(Name("TfExtLiveStats").Device(DEVICE_CPU), LiveStatsOp);

}  // namespace tfext
