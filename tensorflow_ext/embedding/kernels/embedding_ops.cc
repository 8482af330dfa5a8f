// tensorflow_ext: op registrations of the embedding kernels (docs/design.md,
// "Embedding ops").
//
//   TfExtEmbeddingLookup(table_handle, keys, step) -> values [n, dim]
//   TfExtEmbeddingSparseApply<Opt>(table_handle, keys, grad, <hypers...>, step)
//   TfExtShardIndex(keys, num_shards) -> shard ids (int32, keys.shape)

#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow_ext/embedding/kernels/optimizer_registry.h"

namespace tfext {
namespace {

using tensorflow::InitOnStartupMarker;
using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

Status ScalarInput(InferenceContext* c, int index) {
  ShapeHandle unused;
  return c->WithRank(c->input(index), 0, &unused);
}

// table_handle: a scalar resource handle.
Status HandleInput(InferenceContext* c) { return ScalarInput(c, 0); }

// The initializer and bookkeeping attrs of both lookup ops (TfExtEmbeddingLookup
// and TfExtEmbeddingLookupIds), kept in one place so they cannot drift apart.
#define TFEXT_LOOKUP_ATTRS                                                                  \
  Attr("dim: int >= 1")                                                                     \
      .Attr("insert_missing: bool = false")                                                 \
      .Attr("count: bool = true")                                                           \
      .Attr(                                                                                \
          "init_kind: {'constant', 'random_normal', 'truncated_normal', 'random_uniform'} " \
          "= 'constant'")                                                                   \
      .Attr("init_a: float = 0.0")                                                          \
      .Attr("init_b: float = 1.0")                                                          \
      .Attr("seed: int = 0")                                                                \
      .Attr("seed2: int = 0")

// The multi-table lookups' attrs: N, and TFEXT_LOOKUP_ATTRS as lists with one
// entry per table (dim -> dims).
#define TFEXT_MULTI_LOOKUP_ATTRS          \
  Attr("N: int >= 1")                     \
      .Attr("dims: list(int)")            \
      .Attr("insert_missing: list(bool)") \
      .Attr("count: list(bool)")          \
      .Attr("init_kind: list(string)")    \
      .Attr("init_a: list(float)")        \
      .Attr("init_b: list(float)")        \
      .Attr("seed: list(int)")            \
      .Attr("seed2: list(int)")

// Attr N and the list attr dims of a multi-table lookup, checked to have N entries.
Status MultiDims(InferenceContext* c, const char* op, int64_t* n, std::vector<int64_t>* dims) {
  TF_RETURN_IF_ERROR(c->GetAttr("N", n));
  TF_RETURN_IF_ERROR(c->GetAttr("dims", dims));
  if (static_cast<int64_t>(dims->size()) != *n) {
    return tensorflow::errors::InvalidArgument(op, ": attr dims must have N=", *n, " entries, got ", dims->size());
  }
  return tensorflow::OkStatus();
}

// Shared by both lookup ops: (table_handle, a vector of keys/ids, scalar step)
// -> output 0 is [n, dim]. Returns the keys/ids vector shape in *keys.
Status LookupRowsShape(InferenceContext* c, ShapeHandle* keys) {
  TF_RETURN_IF_ERROR(HandleInput(c));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, keys));
  TF_RETURN_IF_ERROR(ScalarInput(c, 2));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(0, c->Matrix(c->Dim(*keys, 0), dim));
  return tensorflow::OkStatus();
}

REGISTER_OP("TfExtEmbeddingLookup")
    .Input("table_handle: resource")
    .Input("keys: int64")
    .Input("step: int64")
    .Output("values: float")
    .TFEXT_LOOKUP_ATTRS.SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      return LookupRowsShape(c, &keys);
    })
    .Doc(R"doc(
Looks up the embedding rows [n, dim] of a vector of unique int64 keys in a
tf_ext table. With insert_missing, keys not in the table are inserted with
their own draw of the initializer (init_kind: constant -> init_a;
random_normal / truncated_normal -> mean init_a, stddev init_b;
random_uniform -> [init_a, init_b)), drawn from a SplitMix64 stream determined
by (seed, seed2, key) (seed = seed2 = 0: a random seed per kernel). Without it,
missing keys read init_a (constant) or 0 (random kinds) and nothing is
inserted nor touched. count bumps the keys' frequency, step >= 0 sets their
version (insert_missing only).
)doc");

REGISTER_OP("TfExtEmbeddingLookupIds")
    .Input("table_handle: resource")
    .Input("ids: int64")
    .Input("step: int64")
    .Output("values: float")
    .Output("unique_keys: int64")
    .Output("idx: int32")
    .TFEXT_LOOKUP_ATTRS.SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(LookupRowsShape(c, &ids));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, ids);
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
TfExtEmbeddingLookup of a vector of ids that may repeat, with the dedup and
the gather done in the kernel: unique_keys are the distinct ids in order of
first occurrence and ids[i] = unique_keys[idx[i]] (as tf.unique); each unique
key is looked up (and, with insert_missing, inserted with its own draw of the
initializer; count bumps its frequency) once, and values[i] is the row of
ids[i]. Attrs as TfExtEmbeddingLookup. The gradient w.r.t. the table is
IndexedSlices(TfExtEmbeddingLookupIdsGrad(d values, idx, unique_keys),
unique_keys).
)doc");

REGISTER_OP("TfExtEmbeddingLookupIdsGrad")
    .Input("grad: float")
    .Input("idx: int32")
    .Input("unique_keys: int64")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad, idx, keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &idx));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &keys));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(grad, 0), c->Dim(idx, 0), &n));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), c->Dim(grad, 1)));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
output[j] = sum of grad[i] over the i with idx[i] == j (j < size of
unique_keys), added in increasing i: the per-unique-key gradient of
TfExtEmbeddingLookupIds. idx values outside [0, size(unique_keys)) are an
InvalidArgument.
)doc");

// The combiners of the pooled lookup (TF's embedding_lookup_sparse).
#define TFEXT_COMBINER_ATTR "combiner: {'sum', 'mean', 'sqrtn'} = 'mean'"

REGISTER_OP("TfExtEmbeddingLookupSparse")
    .Input("table_handle: resource")
    .Input("indices: int64")
    .Input("ids: int64")
    .Input("dense_shape: int64")
    .Input("default_key: int64")
    .Input("step: int64")
    .Output("values: float")
    .Output("unique_keys: int64")
    .Output("idx: int32")
    .Output("entry_rows: int32")
    .Output("row_scale: float")
    .Output("unique_rows: float")
    .TFEXT_LOOKUP_ATTRS.Attr(TFEXT_COMBINER_ATTR)
    .Attr("fill_empty_rows: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle indices, ids, dense_shape, default_key;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &ids));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &dense_shape));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &default_key));
      TF_RETURN_IF_ERROR(ScalarInput(c, 5));
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Matrix(c->UnknownDim(), dim));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      c->set_output(3, c->Vector(c->UnknownDim()));
      c->set_output(4, c->Vector(c->UnknownDim()));
      c->set_output(5, c->Matrix(c->UnknownDim(), dim));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
A pooled lookup of a batch of sparse ids in one kernel: dedup, lookup (and,
with insert_missing, insertion) of each unique key once, and the combination
of each row's embeddings (tf.nn.embedding_lookup_sparse without weights).
indices [nnz, rank] and ids [nnz] are a SparseTensor's (row = indices[:, 0]).
values[r] = row_scale[r] * (sum of the rows of the ids in row r, in entry
order); row_scale is 1 (sum), 1/n (mean) or 1/sqrt(n) (sqrtn) for a row of n
ids, 0 for an empty row. With fill_empty_rows (safe_embedding_lookup_sparse)
values has dense_shape[0] rows and an empty row reads default_key's row
(default_key holds 0 or 1 key; 0 keys: zeros); without, values has
max(row) + 1 rows and default_key must be empty. unique_keys: the distinct
ids in order of first occurrence, then the default key if not among them;
unique_rows their rows. Entry e (the nnz entries and one per filled empty
row, ordered by row, stable) has key unique_keys[idx[e]] and row
entry_rows[e]. A row's rows are added in the order of TensorFlow's sparse
segment reductions, so values equal tf.nn.embedding_lookup_sparse's bit for
bit. Attrs as TfExtEmbeddingLookup.
The gradient w.r.t. the table is IndexedSlices(
TfExtEmbeddingLookupSparseGrad(d values, entry_rows, row_scale, idx,
unique_keys), unique_keys).
)doc");

REGISTER_OP("TfExtEmbeddingLookupSparseGrad")
    .Input("grad: float")
    .Input("entry_rows: int32")
    .Input("row_scale: float")
    .Input("idx: int32")
    .Input("unique_keys: int64")
    .Output("output: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle grad, rows, scale, idx, keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &grad));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &scale));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &idx));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &keys));
      DimensionHandle m;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(rows, 0), c->Dim(idx, 0), &m));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), c->Dim(grad, 1)));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
The per-unique-key gradient of TfExtEmbeddingLookupSparse: output[j] = sum of
row_scale[entry_rows[e]] * grad[entry_rows[e]] over the entries e with
idx[e] == j, added in increasing e.
)doc");

// The multi-table pooled lookup and its gradient: one list entry per table.
REGISTER_OP("TfExtEmbeddingLookupSparseMulti")
    .Input("table_handles: N * resource")
    .Input("indices: N * int64")
    .Input("ids: N * int64")
    .Input("dense_shape: N * int64")
    .Input("default_key: N * int64")
    .Input("steps: N * int64")
    .Output("values: N * float")
    .Output("unique_keys: N * int64")
    .Output("idx: N * int32")
    .Output("entry_rows: N * int32")
    .Output("row_scale: N * float")
    .Output("unique_rows: N * float")
    .TFEXT_MULTI_LOOKUP_ATTRS.Attr("combiner: list(string)")
    .Attr("fill_empty_rows: list(bool)")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(MultiDims(c, "TfExtEmbeddingLookupSparseMulti", &n, &dims));
      for (int64_t i = 0; i < n; ++i) {
        c->set_output(i, c->Matrix(c->UnknownDim(), dims[i]));
        for (int k = 1; k < 5; ++k) c->set_output(k * n + i, c->Vector(c->UnknownDim()));
        c->set_output(5 * n + i, c->Matrix(c->UnknownDim(), dims[i]));
      }
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
N TfExtEmbeddingLookupSparse in one kernel (table i with the i-th entry of
each list attr); the tables run in parallel on the intra-op threads. The
graph passes put it in place of N independent pooled lookups.
)doc");

REGISTER_OP("TfExtEmbeddingLookupSparseGradMulti")
    .Input("grad: N * float")
    .Input("entry_rows: N * int32")
    .Input("row_scale: N * float")
    .Input("idx: N * int32")
    .Input("unique_keys: N * int64")
    .Output("output: N * float")
    .Attr("N: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int64_t i = 0; i < n; ++i) {
        ShapeHandle grad, keys;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &grad));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(4 * n + i), 1, &keys));
        c->set_output(i, c->Matrix(c->Dim(keys, 0), c->Dim(grad, 1)));
      }
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
N TfExtEmbeddingLookupSparseGrad in one kernel (what the graph passes put in
place of N independent ones).
)doc");

// The multi-table lookup: one list entry per table, as TfExtEmbeddingLookup's attrs.
REGISTER_OP("TfExtEmbeddingLookupMulti")
    .Input("table_handles: N * resource")
    .Input("keys: N * int64")
    .Input("steps: N * int64")
    .Output("values: N * float")
    .TFEXT_MULTI_LOOKUP_ATTRS.SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      std::vector<int64_t> dims;
      TF_RETURN_IF_ERROR(MultiDims(c, "TfExtEmbeddingLookupMulti", &n, &dims));
      for (int64_t i = 0; i < n; ++i) {
        ShapeHandle keys;
        TF_RETURN_IF_ERROR(ScalarInput(c, i));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 1, &keys));
        TF_RETURN_IF_ERROR(ScalarInput(c, 2 * n + i));
        c->set_output(i, c->Matrix(c->Dim(keys, 0), dims[i]));
      }
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
N TfExtEmbeddingLookup in one kernel: values[i] are the rows of keys[i] (a
vector of unique int64 keys) in table_handles[i], looked up with steps[i] and
the i-th entry of each list attr (the attrs of TfExtEmbeddingLookup). The
tables run in parallel on the intra-op threads. The graph passes
(tf_ext.graph.enable_optimizations) put it in place of N independent lookups.
)doc");

REGISTER_OP("TfExtShardIndex")
    .Input("keys: int64")
    .Input("num_shards: int32")
    .Output("shard_ids: int32")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      c->set_output(0, c->input(0));
      return tensorflow::OkStatus();
    })
    .Doc(R"doc(
shard_ids = HashKey(keys) % num_shards (HashKey: the table core's bijective
64-bit mixer), the key partitioning of multi-shard dynamic embeddings.
)doc");

// Shape function shared by the apply ops: keys [n], grad [n, dim], scalar
// hyper-parameters and step.
template <class Opt>
Status ApplyShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleInput(c));
  ShapeHandle keys, grad;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &grad));
  DimensionHandle n;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(grad, 0), &n));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  DimensionHandle d;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(grad, 1), dim, &d));
  for (int k = 0; k <= Opt::kNumHypers; ++k) {  // hypers, then step
    TF_RETURN_IF_ERROR(ScalarInput(c, 3 + k));
  }
  return tensorflow::OkStatus();
}

template <class Opt>
InitOnStartupMarker RegisterApplyOp() {
  tensorflow::register_op::OpDefBuilderWrapper w(Opt::kOpName);
  w.Input("table_handle: resource").Input("keys: int64").Input("grad: float");
  for (const char* h : Opt::kHypers) w.Input(std::string(h) + ": float");
  w.Input("step: int64");
  w.Attr("dim: int >= 1").Attr("slot_offset: int = -1");  // -1: dim
  for (int k = 0; k < Opt::kNumFlags; ++k) w.Attr(Opt::kFlagAttrs[k]);
  w.SetIsStateful();
  w.SetShapeFn(ApplyShapeFn<Opt>);
  w.Doc(
      "Fused sparse optimizer update of a tf_ext table: for each (unique) key, "
      "one probe updates the embedding row[0, dim) and the slot columns "
      "row[slot_offset + k*w, slot_offset + (k+1)*w), w = dim (w = 1 for a "
      "row-wise optimizer: one slot value per row; slot_offset -1 means "
      "dim: the slots follow the embedding) with TensorFlow's "
      "sparse update formula (RowwiseAdagrad: tf_ext.RowwiseAdagradOptimizer's). "
      "Missing keys are inserted with the table's "
      "column defaults first. step >= 0 sets the keys' version.");
  return w();
}

// Shape function of the multi-table apply ops: N of everything ApplyShapeFn checks.
template <class Opt>
Status ApplyMultiShapeFn(InferenceContext* c) {
  int64_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  std::vector<int64_t> dims, offsets;
  TF_RETURN_IF_ERROR(c->GetAttr("dims", &dims));
  TF_RETURN_IF_ERROR(c->GetAttr("slot_offsets", &offsets));
  if (static_cast<int64_t>(dims.size()) != n || static_cast<int64_t>(offsets.size()) != n) {
    return tensorflow::errors::InvalidArgument(MultiApplyOpName<Opt>(), ": attrs dims and slot_offsets must have N=", n,
                                               " entries, got ", dims.size(), " and ", offsets.size());
  }
  for (int64_t i = 0; i < n; ++i) {
    ShapeHandle keys, grad;
    TF_RETURN_IF_ERROR(ScalarInput(c, i));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 1, &keys));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n + i), 2, &grad));
    DimensionHandle rows, d;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(grad, 0), &rows));
    TF_RETURN_IF_ERROR(c->WithValue(c->Dim(grad, 1), dims[i], &d));
    for (int k = 0; k <= Opt::kNumHypers; ++k) {  // hypers, then steps
      TF_RETURN_IF_ERROR(ScalarInput(c, (3 + k) * n + i));
    }
  }
  return tensorflow::OkStatus();
}

template <class Opt>
InitOnStartupMarker RegisterApplyMultiOp() {
  tensorflow::register_op::OpDefBuilderWrapper w(MultiApplyOpName<Opt>());
  w.Input("table_handles: N * resource").Input("keys: N * int64").Input("grads: N * float");
  for (const char* h : Opt::kHypers) w.Input(std::string(h) + ": N * float");
  w.Input("steps: N * int64");
  w.Attr("N: int >= 1").Attr("dims: list(int)").Attr("slot_offsets: list(int)");
  for (int k = 0; k < Opt::kNumFlags; ++k) w.Attr(Opt::kFlagAttrs[k]);
  w.SetIsStateful();
  w.SetShapeFn(ApplyMultiShapeFn<Opt>);
  w.Doc(
      "N fused sparse optimizer updates in one kernel: table_handles[i] is "
      "updated with keys[i], grads[i], the i-th entry of each hyper-parameter "
      "list, steps[i], dims[i] and slot_offsets[i], as the single-table op "
      "does (the optimizer flags are shared). The tables run in parallel on "
      "the intra-op threads. The graph passes (tf_ext.graph.enable_optimizations) "
      "put it in place of N independent updates.");
  return w();
}

#define TFEXT_CONCAT_INNER_(a, b) a##b
#define TFEXT_CONCAT_(a, b) TFEXT_CONCAT_INNER_(a, b)
#define TFEXT_REGISTER_APPLY_OP(Opt)                                                                     \
  static const InitOnStartupMarker TFEXT_CONCAT_(tfext_apply_op_reg_, __COUNTER__) TF_ATTRIBUTE_UNUSED = \
      InitOnStartupMarker{} << RegisterApplyOp<Opt>;

#define TFEXT_REGISTER_APPLY_MULTI_OP(Opt)                                                                     \
  static const InitOnStartupMarker TFEXT_CONCAT_(tfext_apply_multi_op_reg_, __COUNTER__) TF_ATTRIBUTE_UNUSED = \
      InitOnStartupMarker{} << RegisterApplyMultiOp<Opt>;

TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER(TFEXT_REGISTER_APPLY_OP)
TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER(TFEXT_REGISTER_APPLY_MULTI_OP)

}  // namespace
}  // namespace tfext
