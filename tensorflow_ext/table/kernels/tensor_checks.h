// tensorflow_ext: dtype checks shared by the table kernels and TableResource,
// so that both report a wrong dtype in the same words. Private to
// //tensorflow_ext/table/kernels:table_kernels.

#ifndef TENSORFLOW_EXT_TABLE_KERNELS_TENSOR_CHECKS_H_
#define TENSORFLOW_EXT_TABLE_KERNELS_TENSOR_CHECKS_H_

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/core/status.h"

namespace tfext {
namespace table_kernels_internal {

inline tensorflow::Status CheckKeysTensor(const tensorflow::Tensor& keys) {
  if (keys.dtype() != tensorflow::DT_INT64) {
    return tensorflow::errors::InvalidArgument("keys must be int64, got ", tensorflow::DataTypeString(keys.dtype()));
  }
  return tensorflow::OkStatus();
}

// `what` names the input in the error message.
inline tensorflow::Status CheckFloatTensor(const tensorflow::Tensor& t, const char* what) {
  if (t.dtype() != tensorflow::DT_FLOAT) {
    return tensorflow::errors::InvalidArgument(what, " must be float32, got ", tensorflow::DataTypeString(t.dtype()));
  }
  return tensorflow::OkStatus();
}

}  // namespace table_kernels_internal
}  // namespace tfext

#endif  // TENSORFLOW_EXT_TABLE_KERNELS_TENSOR_CHECKS_H_
