// tensorflow_ext: TfExtCheckpointReadOptionalString, reading one string
// tensor of a checkpoint that may not hold it.
//
//   TfExtCheckpointReadOptionalString(prefix) -> (value, found)
//
// A dynamic embedding's checkpoint records the row layout of each shard
// (`<shard>-layout`, a JSON string). Checkpoints written before that record
// existed lack the tensor, and RestoreV2 fails on a missing tensor; this op
// reads it where present and says found=false where not, so the restore can
// fall back to the checks an old checkpoint allows.
//
// It also checks that the bytes of each tensor named in `check_tensors` lie
// inside its data file: a truncated file is then a DataLoss error naming the
// file, its size and the tensor, where TF's own read says only "Read less
// bytes than requested". The restore runs it before the Saver's RestoreV2.
//
// With `num_shards_tensor` (the `-num_shards` tensor of the embedding's first
// shard) and `num_shards` (the graph's count): when the checkpoint lacks the
// first of `check_tensors` but holds `num_shards_tensor` with another count,
// the embedding was saved with another number of shards (a graph with more
// shards than the checkpoint): an InvalidArgument naming both counts, where
// the Saver's read would say only that a tensor is missing.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/io/path.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/core/protobuf/tensor_bundle.pb.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace tfext {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// OK if `name` is absent (the Saver names a missing tensor itself), sliced,
// or stored inside its data file; else DataLoss naming the problem.
Status CheckInDataFile(OpKernelContext* ctx, tensorflow::BundleReader* reader, const std::string& prefix,
                       const std::string& name) {
  if (!reader->Contains(name)) return tensorflow::OkStatus();
  // The entry's metadata (data file, offset, size): the value under its key
  // in the index (GetBundleEntryProto is private).
  reader->Seek(name);
  tensorflow::BundleEntryProto entry;
  if (!reader->Valid() || reader->key() != name) return tensorflow::OkStatus();
  const absl::string_view value = reader->value();
  if (!entry.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return tensorflow::errors::DataLoss("checkpoint ", prefix, ": the index entry of tensor ", name,
                                        " cannot be parsed (a damaged .index file)");
  }
  if (entry.slices_size() > 0) return tensorflow::OkStatus();
  // The data file is <prefix>.data-<shard>-of-<count>; the count is in the
  // bundle header, which BundleReader does not expose: find the file.
  char shard[32];
  std::snprintf(shard, sizeof(shard), ".data-%05d-of-", static_cast<int>(entry.shard_id()));
  const std::string dir(tensorflow::io::Dirname(prefix));
  const std::string stem = std::string(tensorflow::io::Basename(prefix)) + shard;
  std::vector<std::string> children;
  TF_RETURN_IF_ERROR(ctx->env()->GetChildren(dir.empty() ? "." : dir, &children));
  std::string file;
  for (const std::string& child : children) {
    if (child.compare(0, stem.size(), stem) == 0) file = tensorflow::io::JoinPath(dir, child);
  }
  if (file.empty()) {
    return tensorflow::errors::DataLoss("checkpoint ", prefix, " is incomplete: the data file ", prefix, shard,
                                        "* that holds tensor ", name, " is missing");
  }
  uint64_t size = 0;
  TF_RETURN_IF_ERROR(ctx->env()->GetFileSize(file, &size));
  const uint64_t end = static_cast<uint64_t>(entry.offset()) + static_cast<uint64_t>(entry.size());
  if (end > size) {
    return tensorflow::errors::DataLoss("checkpoint ", prefix, " is truncated: its data file ", file, " has ", size,
                                        " bytes, but tensor ", name, " is stored at bytes [", entry.offset(), ", ", end,
                                        ") (a copy or write cut short?). Restore another checkpoint.");
  }
  return tensorflow::OkStatus();
}

// Input 0 of the read ops, the checkpoint prefix: a scalar string.
Status GetPrefix(OpKernelContext* ctx, std::string* path) {
  const Tensor& prefix = ctx->input(0);
  if (prefix.dtype() != tensorflow::DT_STRING || prefix.NumElements() != 1) {
    return InvalidArgument("prefix must be a scalar string (a checkpoint prefix), got ",
                           tensorflow::DataTypeString(prefix.dtype()), " of shape ", prefix.shape().DebugString());
  }
  *path = prefix.flat<tensorflow::tstring>()(0);
  return tensorflow::OkStatus();
}

// Reads tensor `name` of the checkpoint at `path`; an error keeps its code and
// names the checkpoint and the tensor (a damaged data file: a checksum
// mismatch, a short read).
Status LookupTensor(tensorflow::BundleReader* reader, const std::string& path, const std::string& name, Tensor* t) {
  const Status read = reader->Lookup(name, t);
  if (read.ok()) return tensorflow::OkStatus();
  return Status(read.code(),
                tensorflow::strings::StrCat("checkpoint ", path, ": cannot read tensor ", name, ": ", read.message()));
}

// The shapes of the optional-read ops: a scalar prefix in; `value` and a
// scalar `found` out.
Status ReadOptionalShape(InferenceContext* c, ShapeHandle value) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  c->set_output(0, value);
  c->set_output(1, c->Scalar());
  return tensorflow::OkStatus();
}

REGISTER_OP("TfExtCheckpointReadOptionalString")
    .Input("prefix: string")
    .Attr("tensor_name: string")
    .Attr("check_tensors: list(string) = []")
    .Attr("num_shards_tensor: string = ''")
    .Attr("num_shards: int = -1")
    .Output("value: string")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ReadOptionalShape(c, c->Scalar()); });

class CheckpointReadOptionalStringOp : public OpKernel {
 public:
  explicit CheckpointReadOptionalStringOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_tensors", &check_tensors_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards_tensor", &num_shards_tensor_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string path;
    OP_REQUIRES_OK(ctx, GetPrefix(ctx, &path));
    Tensor* value = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &value));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &found));
    value->scalar<tensorflow::tstring>()() = "";
    found->scalar<bool>()() = false;
    tensorflow::BundleReader reader(ctx->env(), path);
    // A checkpoint that cannot be opened: the same error the Saver's own
    // reads report (missing or damaged index file).
    OP_REQUIRES_OK(ctx, reader.status());
    OP_REQUIRES_OK(ctx, CheckNumShards(&reader, path));
    for (const std::string& name : check_tensors_) {
      OP_REQUIRES_OK(ctx, CheckInDataFile(ctx, &reader, path, name));
    }
    if (!reader.Contains(tensor_name_)) return;
    Tensor t;
    OP_REQUIRES_OK(ctx, LookupTensor(&reader, path, tensor_name_, &t));
    OP_REQUIRES(ctx, t.dtype() == tensorflow::DT_STRING && t.NumElements() == 1,
                InvalidArgument("checkpoint tensor ", tensor_name_, " of ", path, " must be a scalar string, got ",
                                tensorflow::DataTypeString(t.dtype()), " of shape ", t.shape().DebugString()));
    value->scalar<tensorflow::tstring>()() = t.flat<tensorflow::tstring>()(0);
    found->scalar<bool>()() = true;
  }

 private:
  // See the op's comment: another shard count, seen from a shard the checkpoint lacks.
  Status CheckNumShards(tensorflow::BundleReader* reader, const std::string& path) const {
    if (num_shards_tensor_.empty() || check_tensors_.empty() || reader->Contains(check_tensors_[0]) ||
        !reader->Contains(num_shards_tensor_)) {
      return tensorflow::OkStatus();
    }
    Tensor t;
    if (!reader->Lookup(num_shards_tensor_, &t).ok() || t.NumElements() != 1) return tensorflow::OkStatus();
    int64_t saved = -1;
    if (t.dtype() == tensorflow::DT_INT64) saved = t.flat<int64_t>()(0);
    if (t.dtype() == tensorflow::DT_INT32) saved = t.flat<int32_t>()(0);
    if (saved < 0 || saved == num_shards_) return tensorflow::OkStatus();
    const std::string suffix = "/part_0-num_shards";
    std::string embedding = num_shards_tensor_;
    if (embedding.size() > suffix.size() &&
        embedding.compare(embedding.size() - suffix.size(), suffix.size(), suffix) == 0) {
      embedding.resize(embedding.size() - suffix.size());
    }
    return InvalidArgument("Checkpoint ", path, " holds dynamic embedding ", embedding,
                           " saved with num_shards=", saved, " (", num_shards_tensor_, "), but ", embedding,
                           " has num_shards=", num_shards_, " here, so the checkpoint has no tensors ",
                           check_tensors_[0],
                           " (a different number of shards). Build the embedding with num_shards=", saved,
                           " to restore this checkpoint, or reshard it by warm-starting from it "
                           "(tf_ext.embedding.warm_start_from_checkpoint or tf.compat.v1.train.warm_start).");
  }

  std::string tensor_name_;
  std::vector<std::string> check_tensors_;
  std::string num_shards_tensor_;
  int64_t num_shards_ = -1;
};

REGISTER_KERNEL_BUILDER(Name("TfExtCheckpointReadOptionalString").Device(tensorflow::DEVICE_CPU),
                        CheckpointReadOptionalStringOp);

// ---------------------------------------------------------------------------
// TfExtCheckpointReadOptional(prefix) -> (value, found)
//
// One tensor of any dtype from the checkpoint at `prefix`, if it holds it:
// value = the tensor and found = true; else value = an empty [0] tensor and
// found = false. The state of a feature-admission or eviction policy
// (admission.py, eviction.py) is restored with it, so that a model given a
// policy restores a checkpoint written before it had one (the state then
// starts empty), where the Saver's RestoreV2 fails on the missing tensor.
// A tensor of another dtype, or stored outside its data file (a truncated
// file), is an error naming the checkpoint and the tensor.
REGISTER_OP("TfExtCheckpointReadOptional")
    .Input("prefix: string")
    .Attr("tensor_name: string")
    .Attr("dtype: type")
    .Output("value: dtype")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ReadOptionalShape(c, c->UnknownShape()); });

class CheckpointReadOptionalOp : public OpKernel {
 public:
  explicit CheckpointReadOptionalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string path;
    OP_REQUIRES_OK(ctx, GetPrefix(ctx, &path));
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &found));
    found->scalar<bool>()() = false;
    tensorflow::BundleReader reader(ctx->env(), path);
    OP_REQUIRES_OK(ctx, reader.status());
    if (!reader.Contains(tensor_name_)) {
      Tensor* value = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({0}), &value));
      return;
    }
    OP_REQUIRES_OK(ctx, CheckInDataFile(ctx, &reader, path, tensor_name_));
    Tensor t;
    OP_REQUIRES_OK(ctx, LookupTensor(&reader, path, tensor_name_, &t));
    OP_REQUIRES(
        ctx, t.dtype() == dtype_,
        InvalidArgument("checkpoint tensor ", tensor_name_, " of ", path, " is ", tensorflow::DataTypeString(t.dtype()),
                        ", but the graph restores it as ", tensorflow::DataTypeString(dtype_)));
    ctx->set_output(0, t);
    found->scalar<bool>()() = true;
  }

 private:
  std::string tensor_name_;
  tensorflow::DataType dtype_;
};

REGISTER_KERNEL_BUILDER(Name("TfExtCheckpointReadOptional").Device(tensorflow::DEVICE_CPU), CheckpointReadOptionalOp);

// ---------------------------------------------------------------------------
// TfExtCheckpointRestoreRows(prefix, keys, values, slots, versions, freqs)
//     -> (keys, values, slots, versions, freqs)
//
// The rows a restore of one shard imports (delta.py, "delta checkpoints"): the
// rows the Saver read from `prefix` as they are, unless `prefix` holds a delta
// record for the shard; then the rows of the chain the record names, oldest
// first (the full save, then each delta's removals and rows), and last the
// delta's own removals and rows. Every link is checked before anything is
// merged: a missing link, a link that is another checkpoint (its record's id
// or kind differ), or a truncated data file is an error naming the files.
// The attrs name the shard's tensors in a checkpoint (the Python layer defines
// them): its delta record, its removed keys, and its five row tensors (keys,
// values, slots, versions, freqs). `with_slots=false` (serving exports, warm
// start: the embedding only) ignores the slots input, reads no link's slots
// and outputs slots of 0 columns.
// One op per shard: building the same logic from TF ops took ~0.6 s of graph
// construction per shard and Saver.
REGISTER_OP("TfExtCheckpointRestoreRows")
    .Input("prefix: string")
    .Input("keys: int64")
    .Input("values: float")
    .Input("slots: float")
    .Input("versions: int64")
    .Input("freqs: int64")
    .Attr("record_tensor: string")
    .Attr("removed_tensor: string")
    .Attr("row_tensors: list(string)")
    .Attr("with_slots: bool = true")
    .Output("out_keys: int64")
    .Output("out_values: float")
    .Output("out_slots: float")
    .Output("out_versions: int64")
    .Output("out_freqs: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      c->set_output(2, c->Matrix(InferenceContext::kUnknownDim, InferenceContext::kUnknownDim));
      c->set_output(3, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(4, c->Vector(InferenceContext::kUnknownDim));
      return tensorflow::OkStatus();
    });

// The value of the record's line "<field>=..." (not its first line, the header), or "" if absent.
std::string RecordField(const std::string& record, const std::string& field) {
  const std::string key = "\n" + field + "=";
  const size_t at = record.find(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  const size_t end = record.find('\n', begin);
  return record.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// A shard's rows in host vectors: keys, values [n, value_cols], slots [n, slot_cols], versions, freqs.
struct Rows {
  std::vector<int64_t> keys;
  std::vector<float> values, slots;
  std::vector<int64_t> versions, freqs;
  int64_t value_cols = -1, slot_cols = -1;  // -1: not known yet (no rows seen)
};

// Columns per row of a [n, ...] tensor (0 rows: its dims after the first, or 0).
int64_t RowCols(const Tensor& t) {
  if (t.dims() == 0) return 1;
  const int64_t n = t.dim_size(0);
  if (n > 0) return t.NumElements() / n;
  int64_t cols = 1;
  for (int d = 1; d < t.dims(); ++d) cols *= t.dim_size(d);
  return t.dims() > 1 ? cols : 0;
}

// Checks that `got_rows` rows of `got` columns can join `have_rows` rows of `*have` columns (rows of another
// width would be copied out of bounds); sets `*have` from the first rows seen.
Status CheckCols(int64_t* have, size_t have_rows, int64_t got, size_t got_rows, const std::string& what,
                 const std::string& path) {
  if (got_rows == 0) {
    if (*have < 0) *have = got;
    return tensorflow::OkStatus();
  }
  if (have_rows == 0 || *have < 0) {
    *have = got;
    return tensorflow::OkStatus();
  }
  if (got != *have) {
    return InvalidArgument("delta checkpoint chain: ", what, " of ", path, " have ", got,
                           " columns, the earlier links ", *have);
  }
  return tensorflow::OkStatus();
}

// Drops the rows whose key is in `drop` (the delta's removals and its rewritten keys), then appends `delta`.
void Merge(Rows* state, const Rows& delta, const std::vector<int64_t>& removed) {
  std::unordered_set<int64_t> drop(removed.begin(), removed.end());
  drop.insert(delta.keys.begin(), delta.keys.end());
  const int64_t vc = state->value_cols, sc = state->slot_cols;
  size_t out = 0;
  for (size_t i = 0; i < state->keys.size(); ++i) {
    if (drop.count(state->keys[i])) continue;
    if (out != i) {
      state->keys[out] = state->keys[i];
      std::copy_n(state->values.begin() + i * vc, vc, state->values.begin() + out * vc);
      std::copy_n(state->slots.begin() + i * sc, sc, state->slots.begin() + out * sc);
      state->versions[out] = state->versions[i];
      state->freqs[out] = state->freqs[i];
    }
    ++out;
  }
  state->keys.resize(out);
  state->values.resize(out * vc);
  state->slots.resize(out * sc);
  state->versions.resize(out);
  state->freqs.resize(out);
  state->keys.insert(state->keys.end(), delta.keys.begin(), delta.keys.end());
  state->values.insert(state->values.end(), delta.values.begin(), delta.values.end());
  state->slots.insert(state->slots.end(), delta.slots.begin(), delta.slots.end());
  state->versions.insert(state->versions.end(), delta.versions.begin(), delta.versions.end());
  state->freqs.insert(state->freqs.end(), delta.freqs.begin(), delta.freqs.end());
}

template <class T>
void Append(const Tensor& t, std::vector<T>* out) {
  const auto flat = t.flat<T>();
  out->insert(out->end(), flat.data(), flat.data() + flat.size());
}

class CheckpointRestoreRowsOp : public OpKernel {
 public:
  explicit CheckpointRestoreRowsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("record_tensor", &record_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("removed_tensor", &removed_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_tensors", &row_names_));
    OP_REQUIRES(ctx, row_names_.size() == 5,
                InvalidArgument("row_tensors must name 5 tensors (keys, values, slots, versions, freqs), got ",
                                row_names_.size()));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("with_slots", &with_slots_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& prefix_t = ctx->input(0);
    OP_REQUIRES(ctx, prefix_t.NumElements() == 1,
                InvalidArgument("prefix must be a scalar string (a checkpoint prefix), got shape ",
                                prefix_t.shape().DebugString()));
    const std::string prefix = prefix_t.flat<tensorflow::tstring>()(0);
    tensorflow::BundleReader reader(ctx->env(), prefix);
    OP_REQUIRES_OK(ctx, reader.status());
    std::string record;
    OP_REQUIRES_OK(ctx, ReadRecord(&reader, prefix, &record));
    if (RecordField(record, "kind") != "delta") {
      for (int i = 0; i < 5; ++i) ctx->set_output(i, ctx->input(i + 1));  // a full save: its rows as read
      return;
    }
    // The links, oldest first: "link=<id> <file name in the checkpoint's directory>".
    std::vector<std::pair<std::string, std::string>> links;
    for (size_t pos = 0; pos < record.size();) {
      size_t end = record.find('\n', pos);
      if (end == std::string::npos) end = record.size();
      const std::string line = record.substr(pos, end - pos);
      pos = end + 1;
      if (line.compare(0, 5, "link=") != 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || space == 5 || space + 1 >= line.size()) continue;
      links.emplace_back(line.substr(5, space - 5), line.substr(space + 1));
    }
    OP_REQUIRES(ctx, !links.empty(),
                InvalidArgument("Delta checkpoint ", prefix,
                                " names no full checkpoint to apply to (a damaged record): ", record));
    const size_t slash = prefix.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : prefix.substr(0, slash + 1);
    Rows state;
    for (size_t i = 0; i < links.size(); ++i) {
      const std::string path = dir + links[i].second;
      const bool full = i == 0;
      Rows rows;
      std::vector<int64_t> removed;
      OP_REQUIRES_OK(ctx, ReadLink(ctx, prefix, path, i, links[i].first, full, &rows, &removed));
      if (full) {
        state = std::move(rows);
      } else {
        OP_REQUIRES_OK(
            ctx, CheckCols(&state.value_cols, state.keys.size(), rows.value_cols, rows.keys.size(), "values", path));
        OP_REQUIRES_OK(ctx,
                       CheckCols(&state.slot_cols, state.keys.size(), rows.slot_cols, rows.keys.size(), "slots", path));
        Merge(&state, rows, removed);
      }
    }
    // The delta's own rows (as the Saver read them) and removals.
    Rows own;
    own.value_cols = RowCols(ctx->input(2));
    own.slot_cols = with_slots_ ? RowCols(ctx->input(3)) : 0;
    Append<int64_t>(ctx->input(1), &own.keys);
    Append<float>(ctx->input(2), &own.values);
    if (with_slots_) Append<float>(ctx->input(3), &own.slots);
    Append<int64_t>(ctx->input(4), &own.versions);
    Append<int64_t>(ctx->input(5), &own.freqs);
    std::vector<int64_t> own_removed;
    Tensor removed_t;
    OP_REQUIRES_OK(ctx, ReadTensor(&reader, prefix, removed_name_, tensorflow::DT_INT64, &removed_t));
    Append<int64_t>(removed_t, &own_removed);
    OP_REQUIRES_OK(ctx,
                   CheckCols(&state.value_cols, state.keys.size(), own.value_cols, own.keys.size(), "values", prefix));
    OP_REQUIRES_OK(ctx,
                   CheckCols(&state.slot_cols, state.keys.size(), own.slot_cols, own.keys.size(), "slots", prefix));
    Merge(&state, own, own_removed);
    Output(ctx, state);
  }

 private:
  static Status ReadTensor(tensorflow::BundleReader* reader, const std::string& path, const std::string& name,
                           tensorflow::DataType dtype, Tensor* t) {
    TF_RETURN_IF_ERROR(LookupTensor(reader, path, name, t));
    if (t->dtype() != dtype) {
      return InvalidArgument("checkpoint ", path, ": tensor ", name, " is ", tensorflow::DataTypeString(t->dtype()),
                             ", expected ", tensorflow::DataTypeString(dtype));
    }
    return tensorflow::OkStatus();
  }

  // The shard's delta record in the checkpoint of `reader`, or "" where it has none (a full save of a graph
  // without delta checkpoints).
  Status ReadRecord(tensorflow::BundleReader* reader, const std::string& path, std::string* record) const {
    record->clear();
    if (!reader->Contains(record_name_)) return tensorflow::OkStatus();
    Tensor t;
    TF_RETURN_IF_ERROR(ReadTensor(reader, path, record_name_, tensorflow::DT_STRING, &t));
    if (t.NumElements() == 1) *record = t.flat<tensorflow::tstring>()(0);
    return tensorflow::OkStatus();
  }

  // Reads link i (path) of the chain of `prefix`: checks that it exists, is intact and is the checkpoint the
  // record names (id and kind), then its rows (and, for a delta, its removals).
  Status ReadLink(OpKernelContext* ctx, const std::string& prefix, const std::string& path, size_t i,
                  const std::string& id, bool full, Rows* rows, std::vector<int64_t>* removed) const {
    const char* kind = full ? "full" : "delta";
    if (!ctx->env()->FileExists(path + ".index").ok()) {
      return InvalidArgument("Delta checkpoint ", prefix, " needs checkpoint ", path, " (link ", i,
                             " of its chain: the full save and the deltas after it, oldest first), which is "
                             "missing: it was deleted or not copied with the others. Restore an older full "
                             "checkpoint, or copy the chain back.");
    }
    tensorflow::BundleReader reader(ctx->env(), path);
    TF_RETURN_IF_ERROR(reader.status());
    for (const std::string& name : row_names_) TF_RETURN_IF_ERROR(CheckInDataFile(ctx, &reader, path, name));
    TF_RETURN_IF_ERROR(CheckInDataFile(ctx, &reader, path, removed_name_));
    TF_RETURN_IF_ERROR(CheckInDataFile(ctx, &reader, path, record_name_));
    std::string link_record;
    TF_RETURN_IF_ERROR(ReadRecord(&reader, path, &link_record));
    if (RecordField(link_record, "kind") != kind || RecordField(link_record, "id") != id) {
      return InvalidArgument("Delta checkpoint ", prefix, " was written on checkpoint ", path, " with id ", id,
                             " and kind ", kind,
                             ", but that checkpoint is another one (a checkpoint of another run under the same "
                             "name?). Its record: ",
                             link_record);
    }
    Tensor keys, values, slots, versions, freqs;
    TF_RETURN_IF_ERROR(ReadTensor(&reader, path, row_names_[0], tensorflow::DT_INT64, &keys));
    TF_RETURN_IF_ERROR(ReadTensor(&reader, path, row_names_[1], tensorflow::DT_FLOAT, &values));
    if (with_slots_) TF_RETURN_IF_ERROR(ReadTensor(&reader, path, row_names_[2], tensorflow::DT_FLOAT, &slots));
    TF_RETURN_IF_ERROR(ReadTensor(&reader, path, row_names_[3], tensorflow::DT_INT64, &versions));
    TF_RETURN_IF_ERROR(ReadTensor(&reader, path, row_names_[4], tensorflow::DT_INT64, &freqs));
    const int64_t n = keys.NumElements();
    if (versions.NumElements() != n || freqs.NumElements() != n || (values.dims() > 0 && values.dim_size(0) != n) ||
        (with_slots_ && slots.dims() > 0 && slots.dim_size(0) != n)) {
      return tensorflow::errors::DataLoss("checkpoint ", path, ": the row tensors ", row_names_[0],
                                          " ... disagree on the number of rows (a damaged checkpoint)");
    }
    rows->value_cols = RowCols(values);
    rows->slot_cols = with_slots_ ? RowCols(slots) : 0;
    Append<int64_t>(keys, &rows->keys);
    Append<float>(values, &rows->values);
    if (with_slots_) Append<float>(slots, &rows->slots);
    Append<int64_t>(versions, &rows->versions);
    Append<int64_t>(freqs, &rows->freqs);
    if (!full) {
      Tensor t;
      TF_RETURN_IF_ERROR(ReadTensor(&reader, path, removed_name_, tensorflow::DT_INT64, &t));
      Append<int64_t>(t, removed);
    }
    return tensorflow::OkStatus();
  }

  static void Output(OpKernelContext* ctx, const Rows& s) {
    const int64_t n = static_cast<int64_t>(s.keys.size());
    const int64_t vc = s.value_cols < 0 ? 0 : s.value_cols, sc = s.slot_cols < 0 ? 0 : s.slot_cols;
    Tensor* t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &t));
    std::copy(s.keys.begin(), s.keys.end(), t->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, vc}), &t));
    std::copy(s.values.begin(), s.values.end(), t->flat<float>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n, sc}), &t));
    std::copy(s.slots.begin(), s.slots.end(), t->flat<float>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({n}), &t));
    std::copy(s.versions.begin(), s.versions.end(), t->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({n}), &t));
    std::copy(s.freqs.begin(), s.freqs.end(), t->flat<int64_t>().data());
  }

  std::string record_name_, removed_name_;
  std::vector<std::string> row_names_;
  bool with_slots_ = true;
};

REGISTER_KERNEL_BUILDER(Name("TfExtCheckpointRestoreRows").Device(tensorflow::DEVICE_CPU), CheckpointRestoreRowsOp);

}  // namespace
}  // namespace tfext
