// tensorflow_ext: the live serving model's state (live_model.h).

#include "tensorflow_ext/serving/kernels/live_model.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <set>
#include <stdexcept>

#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/tensor_util.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow_ext/serving/kernels/frozen_table_resource.h"

namespace tfext {
namespace live {

using tensorflow::DataType;
using tensorflow::DataTypeString;
using tensorflow::OpInputList;
using tensorflow::TensorShape;
using tensorflow::Variant;
using tensorflow::core::RefCountPtr;
using tensorflow::errors::FailedPrecondition;
using tensorflow::errors::InvalidArgument;

namespace {

// The dtype name of a layout line: Python's tf.DType.name (update_format.dense_entry), which differs from
// DataTypeString for the float types.
std::string LayoutDTypeName(DataType dtype) {
  switch (dtype) {
    case tensorflow::DT_FLOAT:
      return "float32";
    case tensorflow::DT_DOUBLE:
      return "float64";
    case tensorflow::DT_HALF:
      return "float16";
    default:
      return DataTypeString(dtype);
  }
}

std::string LayoutShape(const TensorShape& shape) {
  if (shape.dims() == 0) return "scalar";
  std::string s;
  for (int d = 0; d < shape.dims(); ++d) s += (d ? "," : "") + std::to_string(shape.dim_size(d));
  return s;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::vector<std::string> SplitWords(const std::string& line) {
  std::vector<std::string> words;
  size_t start = 0;
  while (true) {
    const size_t end = line.find(' ', start);
    words.push_back(line.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return words;
    start = end + 1;
  }
}

}  // namespace

std::string LayoutDifference(const std::string& model, const std::string& update) {
  const std::vector<std::string> have = SplitLines(update);
  const std::set<std::string> have_set(have.begin(), have.end());
  std::map<std::string, std::string> by_name;
  for (const std::string& line : have) {
    const std::vector<std::string> words = SplitWords(line);
    if (words.size() >= 3) by_name[words[1]] = line;
  }
  std::string parts;
  for (const std::string& line : SplitLines(model)) {
    if (have_set.count(line)) continue;
    const std::vector<std::string> words = SplitWords(line);
    auto other = words.size() >= 2 ? by_name.find(words[1]) : by_name.end();
    if (!parts.empty()) parts += "; ";
    parts += "the model has '" + line + "', the update " +
             (other != by_name.end() ? "has '" + other->second + "'" : std::string("has no such entry"));
  }
  return parts;
}

// Compaction: a shard's overlay and removed keys are folded into a new base when they hold more than a quarter of
// the base's keys, or more than 64K keys and a sixteenth. Why: every delta copies the whole overlay into the next
// one (O(overlay)) and every lookup of a key it lacks probes it (and the removed keys) first, while a compaction
// copies the whole base once (O(base)).
// Compacting at a fixed fraction of the base bounds the overlay's extra memory to that fraction and the copying per
// changed key to a constant; past 64K keys the per-delta copy of the overlay becomes the larger cost of an apply
// (milliseconds per delta), so large shards compact at the smaller fraction.
constexpr int64_t kCompactOverlayKeys = int64_t{64} << 10;
bool NeedsCompaction(const LiveShard& s) {
  const int64_t pending = s.overlay_size() + s.removed_size();
  const int64_t base = s.base_size();
  return pending > base / 4 || (pending > kCompactOverlayKeys && pending > base / 16);
}

void MaybeThrowForTest(const char* where) {
  const char* what = std::getenv("TF_EXT_LIVE_MODEL_TEST_THROW");
  if (what != nullptr && std::strcmp(what, where) == 0) {
    throw std::runtime_error(std::string("a failure injected at '") + where + "' (TF_EXT_LIVE_MODEL_TEST_THROW)");
  }
}

Status LiveModelResource::StartLocked(OpKernelContext* ctx, const char* dense_input) {
  if (Current() != nullptr) return OkStatus();
  auto v = std::make_shared<ModelVersion>();
  int tables_start = 0, tables_stop = 0;
  TF_RETURN_IF_ERROR(ctx->op_kernel().InputRange("tables", &tables_start, &tables_stop));
  std::multiset<std::string> slot_lines;  // the slots' layout lines without names
  std::vector<RefCountPtr<FrozenTableResource>> sources;
  std::vector<std::weak_ptr<const table::FrozenTable>> source_tables;
  OpInputList dense;
  TF_RETURN_IF_ERROR(ctx->input_list(dense_input, &dense));
  // Nothing is published before the end: a failure anywhere (an allocation) leaves the model unstarted, and the
  // next op that takes it tries again.
  try {
    MaybeThrowForTest("start");
    for (int i = tables_start; i < tables_stop; ++i) {
      RefCountPtr<FrozenTableResource> table;
      TF_RETURN_IF_ERROR(GetFrozenTable(ctx, i, &table));
      std::shared_ptr<const table::FrozenTable> rows = table->Get();
      source_tables.push_back(rows);
      v->tables.push_back(LiveShard::FromBase(std::move(rows)));
      slot_lines.insert("table " + std::to_string(table->dim()));
      sources.push_back(std::move(table));
    }
    for (const Tensor& d : dense) {
      // A copy: the input may share the buffer of a variable (a ref variable's read does) that a later assignment
      // changes in place, and a published version never changes.
      v->dense.push_back(tensorflow::tensor::DeepCopy(d));
      slot_lines.insert("dense " + LayoutDTypeName(d.dtype()) + " " + LayoutShape(d.shape()));
    }
  } catch (const std::bad_alloc&) {
    return tensorflow::errors::ResourceExhausted("live model '", model_name_, "': out of memory starting it");
  } catch (const std::exception& e) {
    return tensorflow::errors::Internal("live model '", model_name_, "': starting it failed: ", e.what());
  }
  OpInputList step;
  TF_RETURN_IF_ERROR(ctx->input_list("global_step", &step));
  if (step.size() > 1) return InvalidArgument("global_step takes at most one tensor, got ", step.size());
  if (step.size() == 1) {
    if (!tensorflow::TensorShapeUtils::IsScalar(step[0].shape())) {
      return InvalidArgument("global_step must be a scalar, got shape ", step[0].shape().DebugString());
    }
    v->version = step[0].scalar<int64_t>()();
  }
  // The layout must describe these slots: the same entries but for their names.
  std::multiset<std::string> layout_lines;
  for (const std::string& line : SplitLines(layout_)) {
    std::vector<std::string> words = SplitWords(line);
    if (words.size() == 3 && words[0] == "table") {
      layout_lines.insert("table " + words[2]);
    } else if (words.size() == 4 && words[0] == "dense") {
      layout_lines.insert("dense " + words[2] + " " + words[3]);
    } else {
      return InvalidArgument("live model '", model_name_, "': not a layout line: '", line, "'");
    }
  }
  if (layout_lines != slot_lines) {
    std::string slots, lines;
    for (const std::string& s : slot_lines) slots += (slots.empty() ? "'" : ", '") + s + "'";
    for (const std::string& s : layout_lines) lines += (lines.empty() ? "'" : ", '") + s + "'";
    return InvalidArgument("live model '", model_name_, "': its layout does not describe its inputs: the inputs are [",
                           slots, "], the layout's lines (names left out) are [", lines, "]");
  }
  sources_ = std::move(sources);
  source_tables_ = std::move(source_tables);
  Publish(std::move(v));
  return OkStatus();
}

void LiveModelResource::ReleaseReplacedSources(const ModelVersion& v) {
  for (size_t i = 0; i < sources_.size() && i < v.tables.size(); ++i) {
    std::shared_ptr<const table::FrozenTable> rows = source_tables_[i].lock();
    if (rows == nullptr || v.tables[i]->base() == rows) continue;
    sources_[i]->ReleaseIfCurrent(rows.get());
    source_tables_[i].reset();
  }
}

Status GetLiveModel(OpKernelContext* ctx, RefCountPtr<LiveModelResource>* out) {
  const Tensor& t = ctx->input(0);
  if (t.dtype() != tensorflow::DT_RESOURCE || t.NumElements() != 1) {
    return InvalidArgument("input 0 must be a scalar tf_ext live model handle (resource), got ",
                           DataTypeString(t.dtype()), " of shape ", t.shape().DebugString());
  }
  const tensorflow::ResourceHandle& h = t.flat<tensorflow::ResourceHandle>()(0);
  if (h.hash_code() != tensorflow::TypeIndex::Make<LiveModelResource>().hash_code()) {
    return InvalidArgument("input 0 is not a tf_ext live model handle: it refers to '", h.name(), "' of type ",
                           h.maybe_type_name());
  }
  return tensorflow::LookupResource(ctx, h, out);
}

// The version a pin input (input 0) holds.
Status GetPin(OpKernelContext* ctx, const ModelVersion** out) {
  const Tensor& t = ctx->input(0);
  if (t.dtype() != tensorflow::DT_VARIANT || t.NumElements() != 1) {
    return InvalidArgument("input 0 must be a scalar tf_ext live model pin (variant), got ", DataTypeString(t.dtype()),
                           " of shape ", t.shape().DebugString());
  }
  const LivePin* pin = t.flat<Variant>()(0).get<LivePin>();
  if (pin == nullptr || pin->model == nullptr) {
    return InvalidArgument("input 0 is not a tf_ext live model pin: it holds ", t.flat<Variant>()(0).TypeName());
  }
  *out = pin->model.get();
  return OkStatus();
}

Status ReadUpdateMeta(OpKernelContext* ctx, UpdateMeta* u) {
  const char* kStrings[] = {"model_name", "layout", "kind"};
  std::string* strings[] = {&u->model_name, &u->layout, &u->kind};
  for (int i = 0; i < 3; ++i) {
    const Tensor* t = nullptr;
    TF_RETURN_IF_ERROR(ctx->input(kStrings[i], &t));
    if (!tensorflow::TensorShapeUtils::IsScalar(t->shape())) {
      return InvalidArgument("the update's ", kStrings[i], " must be a scalar, got shape ", t->shape().DebugString());
    }
    *strings[i] = t->scalar<tensorflow::tstring>()();
  }
  const char* kSteps[] = {"from_step", "to_step"};
  int64_t* steps[] = {&u->from_step, &u->to_step};
  for (int i = 0; i < 2; ++i) {
    const Tensor* t = nullptr;
    TF_RETURN_IF_ERROR(ctx->input(kSteps[i], &t));
    if (!tensorflow::TensorShapeUtils::IsScalar(t->shape())) {
      return InvalidArgument("the update's ", kSteps[i], " must be a scalar, got shape ", t->shape().DebugString());
    }
    *steps[i] = t->scalar<int64_t>()();
  }
  return OkStatus();
}

Status CheckUpdate(const LiveModelResource& model, int64_t served, const UpdateMeta& u, bool* apply) {
  if (u.model_name != model.model_name()) {
    return InvalidArgument("update for model '", u.model_name, "', this model is '", model.model_name(), "'");
  }
  const std::string difference = LayoutDifference(model.layout(), u.layout);
  if (!difference.empty()) {
    return InvalidArgument("update for model '", u.model_name, "' has another layout: ", difference);
  }
  if (u.kind != "delta" && u.kind != "full") {
    return InvalidArgument("update kind must be 'delta' or 'full', got '", u.kind, "'");
  }
  if (u.from_step < 0 || u.from_step > u.to_step) {
    return InvalidArgument("update steps must satisfy 0 <= from_step <= to_step, got from_step ", u.from_step,
                           " and to_step ", u.to_step);
  }
  if (u.to_step <= served) {
    *apply = false;
    return OkStatus();
  }
  if (!u.full() && u.from_step > served) {
    return FailedPrecondition("served version ", served, ", the update holds changes from step ", u.from_step, " to ",
                              u.to_step, ": apply the updates before it, or a full update");
  }
  *apply = true;
  return OkStatus();
}

}  // namespace live
}  // namespace tfext
