// tensorflow_ext: the table of fused embedding optimizers.
//
// One line per optimizer: both the op registrations (embedding_ops.cc) and
// the kernel registrations (sparse_apply_kernels.cc) expand this list, so an
// optimizer is added by writing its functor in optimizer_functors.h and
// listing it here.

#ifndef TENSORFLOW_EXT_EMBEDDING_KERNELS_OPTIMIZER_REGISTRY_H_
#define TENSORFLOW_EXT_EMBEDDING_KERNELS_OPTIMIZER_REGISTRY_H_

#include <string>

#include "tensorflow_ext/embedding/kernels/optimizer_functors.h"

#define TFEXT_FOR_EACH_EMBEDDING_OPTIMIZER(X) \
  X(::tfext::embedding::GradientDescentOpt)   \
  X(::tfext::embedding::MomentumOpt)          \
  X(::tfext::embedding::AdagradOpt)           \
  X(::tfext::embedding::AdamOpt)              \
  X(::tfext::embedding::FtrlOpt)              \
  X(::tfext::embedding::RMSPropOpt)           \
  X(::tfext::embedding::RowwiseAdagradOpt)

namespace tfext {

// The multi-table variant of an optimizer's apply op: "<kOpName>Multi" (e.g.
// TfExtEmbeddingSparseApplyAdagradMulti), N tables updated in one kernel.
template <class Opt>
const char* MultiApplyOpName() {
  static const std::string* name = new std::string(std::string(Opt::kOpName) + "Multi");
  return name->c_str();
}

}  // namespace tfext

#endif  // TENSORFLOW_EXT_EMBEDDING_KERNELS_OPTIMIZER_REGISTRY_H_
