// The column range of the table ops that address part of a row (attrs col_begin, cols; cols = -1 means dim),
// read and resolved the same way by the CPU kernels (table_kernels.cc) and the GPU kernels
// (../gpu/gpu_table_kernels.cu.cc). Header-only: nvcc compiles it too.

#ifndef TENSORFLOW_EXT_TABLE_KERNELS_COLUMN_RANGE_H_
#define TENSORFLOW_EXT_TABLE_KERNELS_COLUMN_RANGE_H_

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tfext {

struct ColumnRange {
  int64_t col_begin = 0;
  int64_t cols_attr = -1;  // -1: the table's dim

  // Reads and checks the attrs.
  tensorflow::Status Read(tensorflow::OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("col_begin", &col_begin));
    TF_RETURN_IF_ERROR(ctx->GetAttr("cols", &cols_attr));
    if (col_begin < 0) return tensorflow::errors::InvalidArgument("col_begin must be >= 0, got ", col_begin);
    if (cols_attr < 1 && cols_attr != -1) {
      return tensorflow::errors::InvalidArgument("cols must be >= 1 or -1 (= dim), got ", cols_attr);
    }
    return tensorflow::OkStatus();
  }

  // The number of columns for a table of (dim, width), described by `table` in the error when the range does not
  // fit its rows.
  tensorflow::Status Resolve(int64_t dim, int64_t width, const std::string& table, int64_t* cols) const {
    const int64_t c = cols_attr < 0 ? dim : cols_attr;
    if (col_begin + c > width) {
      return tensorflow::errors::InvalidArgument("column range [", col_begin, ", ", col_begin + c,
                                                 ") is out of the row [0, ", width, ") of table (", table, ")");
    }
    *cols = c;
    return tensorflow::OkStatus();
  }
};

}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_KERNELS_COLUMN_RANGE_H_
