// tensorflow_ext: op registrations of the table engine (docs/design.md, "Ops").
//
// Shapes: the handle op records {key: [] int64, value: [dim] float} as the
// handle's shape-and-type data (like MutableHashTableOfTensorsV2), so the
// shape functions below (and TF's LookupTableFindV2) can resolve `cols = -1`
// (= dim) statically when the handle reaches them with that data; callers that
// know the layout (the Python wrapper) pass an explicit `cols`.
//
// Key/value inputs carry type attrs (Tkeys/Tvalues) so that a wrong dtype is
// reported by the kernel as an InvalidArgument naming the problem rather than
// as a missing-kernel error.

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfext {
namespace {

using tensorflow::OkStatus;
using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeAndType;
using tensorflow::shape_inference::ShapeHandle;

// The number of columns an op reads/writes: the `cols` attr, or the table's
// dim (from the handle's shape data) when cols == -1, else unknown.
Status ResolveCols(InferenceContext* c, DimensionHandle* cols_dim) {
  int64_t cols = -1;
  TF_RETURN_IF_ERROR(c->GetAttr("cols", &cols));
  if (cols >= 0) {
    *cols_dim = c->MakeDim(cols);
    return OkStatus();
  }
  *cols_dim = c->UnknownDim();
  const std::vector<ShapeAndType>* data = c->input_handle_shapes_and_types(0);
  if (data != nullptr && data->size() == 2) {
    ShapeHandle value_shape = (*data)[1].shape;
    if (c->RankKnown(value_shape) && c->Rank(value_shape) == 1) {
      *cols_dim = c->Dim(value_shape, 0);
    }
  }
  return OkStatus();
}

Status HandleInput(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

// keys.shape + [cols] (unknown when the keys' rank is). With rows_index >= 0,
// also checks that input's last dim against cols: rows may be keys.shape +
// [cols] or [n, cols], so the last dim is all that is sure.
Status RowsShape(InferenceContext* c, int rows_index, ShapeHandle* out) {
  DimensionHandle cols;
  TF_RETURN_IF_ERROR(ResolveCols(c, &cols));
  ShapeHandle keys = c->input(1);
  ShapeHandle expected;
  if (c->RankKnown(keys)) {
    TF_RETURN_IF_ERROR(c->Concatenate(keys, c->Vector(cols), &expected));
  } else {
    expected = c->UnknownShape();
  }
  if (rows_index >= 0) {
    ShapeHandle rows = c->input(rows_index);
    if (c->RankKnown(rows) && c->Rank(rows) >= 1) {
      DimensionHandle last = c->Dim(rows, -1);
      DimensionHandle merged;
      Status s = c->Merge(last, cols, &merged);
      if (!s.ok()) {
        return tensorflow::errors::InvalidArgument("row width mismatch: the last dimension of input ", rows_index,
                                                   " is ", c->Value(last), " but the op uses ", c->Value(cols),
                                                   " columns");
      }
    }
  }
  *out = expected;
  return OkStatus();
}

Status ScalarInput(InferenceContext* c, int index, const char* what) {
  ShapeHandle s = c->input(index);
  if (c->RankKnown(s) && c->Rank(s) != 0) {
    return tensorflow::errors::InvalidArgument(what, " must be a scalar, got rank ", c->Rank(s));
  }
  return OkStatus();
}

// Ops (handle, keys, rows, step): *values is keys.shape + [cols].
Status UpdateShape(InferenceContext* c, ShapeHandle* values) {
  TF_RETURN_IF_ERROR(HandleInput(c));
  TF_RETURN_IF_ERROR(ScalarInput(c, 3, "step"));
  return RowsShape(c, 2, values);
}

Status UpdateShapeNoOutput(InferenceContext* c) {
  ShapeHandle unused;
  return UpdateShape(c, &unused);
}

// Ops on the handle alone whose output 0 is an int64 scalar.
Status ScalarOutputShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleInput(c));
  c->set_output(0, c->Scalar());
  return OkStatus();
}

}  // namespace

#define TFEXT_COLUMN_ATTRS Attr("col_begin: int = 0").Attr("cols: int = -1")

// Inputs 0-2 (handle, keys, a per-key float input) and the key/value type and
// column attrs shared by the ops that address rows by key.
#define TFEXT_KEYED_ROWS_OP(rows_input) \
  Input("table_handle: resource")       \
      .Input("keys: Tkeys")             \
      .Input(rows_input ": Tvalues")    \
      .Attr("Tkeys: type = DT_INT64")   \
      .Attr("Tvalues: type = DT_FLOAT") \
      .TFEXT_COLUMN_ATTRS

// storage/compact_cols/rounding: how the leading compact_cols columns of each
// row are stored (storage_attrs.h names the choices; TableLayout in
// table_resource.h the rules). Every op still reads and writes float32.
// tier_*: a non-empty tier_path makes a tiered table (TierConfig in
// table_resource.h): at most tier_memory_bytes of rows in memory, the others
// in an on-disk store in that directory (at most tier_disk_bytes of files
// there, 0 = unbounded; tier_policy "lru" or "lfu" picks the rows that leave
// memory and, past the cap, the disk). tier_root: the directory tier_path
// was resolved under (a prefix of it; "" = none): when the environment
// variable TF_EXT_TIER_ROOT is set (non-empty) as the kernel is created
// (the first run of the op in a session, which creates the table), that
// prefix of tier_path is replaced by it (made absolute), so a graph built
// elsewhere (a SavedModel served on another machine) puts its stores under
// this machine's root. A tier_root that is not a directory prefix of
// tier_path is an InvalidArgument naming both.
REGISTER_OP("TfExtTableHandle")
    .Output("table_handle: resource")
    .Attr("dim: int")
    .Attr("width: int = -1")
    .Attr("column_defaults: list(float) = []")
    .Attr("storage: string = 'float32'")
    .Attr("compact_cols: int = 0")
    .Attr("rounding: string = 'nearest'")
    .Attr("initial_capacity: int = 0")
    .Attr("shard_bits: int = -1")
    .Attr("huge_pages: bool = true")
    .Attr("preallocate: bool = false")
    .Attr("tier_path: string = ''")
    .Attr("tier_memory_bytes: int = 0")
    .Attr("tier_disk_bytes: int = 0")
    .Attr("tier_policy: string = 'lru'")
    .Attr("tier_root: string = ''")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      int64_t dim = -1;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      // Layout errors are reported by the kernel (InvalidArgument at run).
      DimensionHandle d = dim >= 1 ? c->MakeDim(dim) : c->UnknownDim();
      c->set_output_handle_shapes_and_types(
          0, std::vector<ShapeAndType>{{c->Scalar(), tensorflow::DT_INT64}, {c->Vector(d), tensorflow::DT_FLOAT}});
      return OkStatus();
    });

REGISTER_OP("TfExtTableFind")
    .TFEXT_KEYED_ROWS_OP("default_value")
    .Output("values: float")
    .Output("found: bool")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      ShapeHandle values;
      TF_RETURN_IF_ERROR(RowsShape(c, -1, &values));
      ShapeHandle d = c->input(2);
      if (c->RankKnown(d) && c->Rank(d) > 1) {
        return tensorflow::errors::InvalidArgument("default_value must be a scalar or a vector of cols, got rank ",
                                                   c->Rank(d));
      }
      c->set_output(0, values);
      c->set_output(1, c->input(1));
      return OkStatus();
    });

REGISTER_OP("TfExtTableFindOrInsert")
    .TFEXT_KEYED_ROWS_OP("init_values")
    .Input("step: int64")
    .Output("values: float")
    .Attr("count: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle values;
      TF_RETURN_IF_ERROR(UpdateShape(c, &values));
      c->set_output(0, values);
      return OkStatus();
    });

REGISTER_OP("TfExtTableInsert")
    .TFEXT_KEYED_ROWS_OP("values")
    .Input("step: int64")
    .Attr("count: bool = false")
    .SetIsStateful()
    .SetShapeFn(UpdateShapeNoOutput);

REGISTER_OP("TfExtTableAccumulate")
    .TFEXT_KEYED_ROWS_OP("deltas")
    .Input("step: int64")
    .Attr("insert_missing: bool = true")
    .Attr("count: bool = false")
    .SetIsStateful()
    .SetShapeFn(UpdateShapeNoOutput);

REGISTER_OP("TfExtTableRemove")
    .Input("table_handle: resource")
    .Input("keys: Tkeys")
    .Output("num_removed: int64")
    .Attr("Tkeys: type = DT_INT64")
    .SetIsStateful()
    .SetShapeFn(ScalarOutputShape);

REGISTER_OP("TfExtTableSize")
    .Input("table_handle: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(ScalarOutputShape);

REGISTER_OP("TfExtTableExport")
    .Input("table_handle: resource")
    .Output("keys: int64")
    .Output("values: float")
    .Output("versions: int64")
    .Output("frequencies: int64")
    .TFEXT_COLUMN_ATTRS.SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      DimensionHandle cols;
      TF_RETURN_IF_ERROR(ResolveCols(c, &cols));
      DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, cols));
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Vector(n));
      return OkStatus();
    });

REGISTER_OP("TfExtTableImport")
    .TFEXT_KEYED_ROWS_OP("values")
    .Input("versions: int64")
    .Input("frequencies: int64")
    .Attr("clear_first: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      // keys [n], as TfExtTableExport returns them.
      ShapeHandle keys = c->input(1);
      if (c->RankKnown(keys) && c->Rank(keys) != 1) {
        return tensorflow::errors::InvalidArgument(
            "import: keys must be a vector [n] (as export returns them), got rank ", c->Rank(keys));
      }
      ShapeHandle unused;
      return RowsShape(c, 2, &unused);
    });

REGISTER_OP("TfExtTableClear").Input("table_handle: resource").SetIsStateful().SetShapeFn([](InferenceContext* c) {
  return HandleInput(c);
});

REGISTER_OP("TfExtTableMemoryBytes")
    .Input("table_handle: resource")
    .Output("bytes: int64")
    .SetIsStateful()
    .SetShapeFn(ScalarOutputShape);

REGISTER_OP("TfExtTableEvict")
    .Input("table_handle: resource")
    .Input("min_version: int64")
    .Input("min_frequency: int64")
    .Output("num_removed: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1, "min_version"));
      TF_RETURN_IF_ERROR(ScalarInput(c, 2, "min_frequency"));
      c->set_output(0, c->Scalar());
      return OkStatus();
    });

REGISTER_OP("TfExtTableExportSince")
    .Input("table_handle: resource")
    .Input("min_version: int64")
    .Output("keys: int64")
    .Output("values: float")
    .Output("versions: int64")
    .Output("frequencies: int64")
    .TFEXT_COLUMN_ATTRS.SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1, "min_version"));
      DimensionHandle cols;
      TF_RETURN_IF_ERROR(ResolveCols(c, &cols));
      DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, cols));
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Vector(n));
      return OkStatus();
    });

// The change log (TableResource::ReadChangeLog): `channel` names the reader
// ("checkpoint": delta checkpoints; "serving": serving updates); each channel
// has its own capacity, read marks and commit, and sees every removal.
REGISTER_OP("TfExtTableChangeLog")
    .Input("table_handle: resource")
    .Output("removed_keys: int64")
    .Output("enabled: bool")
    .Output("untracked: bool")
    .Output("overflow: bool")
    .Attr("read_keys: bool = true")
    .Attr("channel: string = 'checkpoint'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Scalar());
      c->set_output(3, c->Scalar());
      return OkStatus();
    });

REGISTER_OP("TfExtTableChangeLogStart")
    .Input("table_handle: resource")
    .Input("capacity: int64")
    .Attr("channel: string = 'checkpoint'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      return ScalarInput(c, 1, "capacity");
    });

REGISTER_OP("TfExtTableChangeLogCommit")
    .Input("table_handle: resource")
    .Attr("channel: string = 'checkpoint'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return HandleInput(c); });

// The tier's counters, in this order: memory_keys, memory_bytes, disk_keys,
// disk_bytes, budget_keys, lookups, cold_reads, demotions, dropped, errors
// (table::TierStats). An untiered table: its keys and bytes, then zeros.
REGISTER_OP("TfExtTableTierStats")
    .Input("table_handle: resource")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HandleInput(c));
      c->set_output(0, c->Vector(10));
      return OkStatus();
    });

// Waits until the memory tier is within its budget and no demotion is in
// flight (no-op untiered).
REGISTER_OP("TfExtTableTierSettle").Input("table_handle: resource").SetIsStateful().SetShapeFn([](InferenceContext* c) {
  return HandleInput(c);
});

// Brings the cold rows of keys (any shape) into memory, changing nothing
// else (no insert, count or version): run with one step, for the keys of the
// next, so that their disk reads overlap the step's work. No-op untiered.
REGISTER_OP("TfExtTablePrefetch")
    .Input("table_handle: resource")
    .Input("keys: Tkeys")
    .Attr("Tkeys: type = DT_INT64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return HandleInput(c); });

}  // namespace tfext
