// The op-attr names of a table's row storage and rounding (row_codec.h's
// RowStorage and Rounding), read the same way by every op that takes them:
// TfExtTableHandle (table_kernels.cc) and the frozen serving table's ops.
//
//   storage:  "float32" | "bfloat16" | "float16" | "int8_row"
//   rounding: "nearest" | "stochastic"
//
// These strings are also the names Python uses (tensorflow_ext/table/refs.py
// storage_name / storage_dtype) and the ones checkpoints record; they must not
// change. Header-only, TF headers only (nvcc may compile it too).

#ifndef TENSORFLOW_EXT_TABLE_KERNELS_STORAGE_ATTRS_H_
#define TENSORFLOW_EXT_TABLE_KERNELS_STORAGE_ATTRS_H_

#include <string>

#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"
#include "tensorflow_ext/table/core/row_codec.h"

namespace tfext {

inline const char* RowStorageName(table::RowStorage storage) {
  switch (storage) {
    case table::RowStorage::kFloat32:
      return "float32";
    case table::RowStorage::kBFloat16:
      return "bfloat16";
    case table::RowStorage::kFloat16:
      return "float16";
    case table::RowStorage::kInt8Row:
      return "int8_row";
  }
  return "invalid";
}

inline const char* RoundingName(table::Rounding rounding) {
  return rounding == table::Rounding::kStochastic ? "stochastic" : "nearest";
}

// OK and *out, or InvalidArgument naming the choices.
inline tensorflow::Status ParseRowStorage(const std::string& name, table::RowStorage* out) {
  for (table::RowStorage s : {table::RowStorage::kFloat32, table::RowStorage::kBFloat16, table::RowStorage::kFloat16,
                              table::RowStorage::kInt8Row}) {
    if (name == RowStorageName(s)) {
      *out = s;
      return tensorflow::OkStatus();
    }
  }
  return tensorflow::errors::InvalidArgument(
      "storage must be one of \"float32\", \"bfloat16\", \"float16\", \"int8_row\", got \"", name, "\"");
}

// OK and *out, or InvalidArgument naming the choices.
inline tensorflow::Status ParseRounding(const std::string& name, table::Rounding* out) {
  for (table::Rounding r : {table::Rounding::kNearest, table::Rounding::kStochastic}) {
    if (name == RoundingName(r)) {
      *out = r;
      return tensorflow::OkStatus();
    }
  }
  return tensorflow::errors::InvalidArgument("rounding must be \"nearest\" or \"stochastic\", got \"", name, "\"");
}

}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_KERNELS_STORAGE_ATTRS_H_
