// tensorflow_ext: per-row update formulas of the fused embedding optimizers.
//
// Each struct below is one optimizer of TfExtEmbeddingSparseApply<Name>. The
// generic kernel (sparse_apply_kernels.cc) reads the struct's static table
// (op name, hyper-parameter input names, attrs, slot count), validates the
// inputs, and calls Apply() once per key under the table's shard lock with
// the key's whole row: var = row[0, dim), slot k = row[slot_offset +
// k*SlotWidth(dim), slot_offset + (k+1)*SlotWidth(dim)). SlotWidth(dim) is
// dim for the element-wise optimizers (one slot value per embedding column)
// and 1 for the row-wise ones (one slot value per row).
//
// Element-wise optimizers define ApplyElement (column j of a row of dim
// columns; dim picks TF's path where TF's scalar and vector paths differ)
// and Apply is the loop over j, once, in ElementwiseOptimizer. The GPU table
// runs ApplyElement one thread per element, so that a warp reads and writes
// whole rows. A row-wise optimizer (RowwiseAdagradOpt) reduces the whole row
// before it updates any column: it has Apply only and is no
// ElementwiseOptimizer, so a per-element launch cannot run it (a GPU caller
// runs its Apply one thread per row; gpu/gpu_embedding.h).
//
// The formulas reproduce TensorFlow 2.15's SPARSE update paths element by
// element, including the order of floating-point operations, so that a
// dynamic embedding trained with a stock tf.compat.v1.train optimizer matches
// a dense variable trained with the same optimizer:
//   GradientDescent  GradientDescentOptimizer on IndexedSlices:
//                    resource_scatter_add(var, idx, -grad * lr)
//   Momentum         SparseApplyMomentum (use_nesterov)
//   Adagrad          SparseApplyAdagrad (v1: no epsilon; update_slots=true)
//   Adam             TF1 AdamOptimizer._apply_sparse_shared (composed in
//                    Python): exact for the rows touched by the step. TF1's
//                    dense-variable Adam also decays m/v (and moves var) of
//                    the rows NOT in the batch; a lazy table cannot, so rows
//                    absent from a step are left unchanged (as in LazyAdam).
//   Ftrl             SparseApplyFtrl / SparseApplyFtrlV2 (l2_shrinkage > 0),
//                    the lr_power == -0.5 fast path and the general pow
//                    path, multiply_linear_by_lr.
//   RMSProp          SparseApplyRMSProp / SparseApplyCenteredRMSProp.
// RowwiseAdagrad has no TF kernel: it matches tf_ext.RowwiseAdagradOptimizer
// (tensorflow_ext/optimizers/rowwise_adagrad.py) on dense variables, bit for bit.
// TF's kernels use a vectorized (Eigen) path for rows of more than one
// element and a scalar path for dim == 1; where the two associate the
// arithmetic differently (Adagrad, Ftrl) we follow the same split.
//
// Hyper-parameters come in the order of TF's own ResourceSparseApply* ops
// (without var/slots/grad/indices).

#ifndef TENSORFLOW_EXT_EMBEDDING_KERNELS_OPTIMIZER_FUNCTORS_H_
#define TENSORFLOW_EXT_EMBEDDING_KERNELS_OPTIMIZER_FUNCTORS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "tensorflow_ext/table/core/host_device.h"

namespace tfext {
namespace embedding {

// Boolean attrs of the apply ops (only the ones an optimizer declares are
// read; the others stay false).
struct OptimizerFlags {
  bool use_nesterov = false;           // Momentum
  bool centered = false;               // RMSProp
  bool multiply_linear_by_lr = false;  // Ftrl
};

// Returns an empty string when the hyper-parameters are valid, else a message
// naming the problem (the kernel turns it into InvalidArgument).
using HyperCheck = std::string;

// std::min / std::max for host and device code, with their results for every input (NaN included):
// ClampMin(a, b) = std::min(a, b), ClampMax(a, b) = std::max(a, b).
TFEXT_HOST_DEVICE inline float ClampMin(float a, float b) { return (b < a) ? b : a; }
TFEXT_HOST_DEVICE inline float ClampMax(float a, float b) { return (a < b) ? b : a; }

// The row loop of every element-wise optimizer (CRTP): Derived::ApplyElement does column j. Each slot takes dim
// columns.
template <class Derived>
struct ElementwiseOptimizer {
  static int64_t SlotWidth(int64_t dim) { return dim; }
  TFEXT_HOST_DEVICE void Apply(float* var, float* slots, int64_t slot_stride, const float* g, int64_t dim) const {
    const Derived& self = static_cast<const Derived&>(*this);
    for (int64_t j = 0; j < dim; ++j) self.ApplyElement(var, slots, slot_stride, g, j, dim);
  }
};

// ---------------------------------------------------------------------------
struct GradientDescentOpt : ElementwiseOptimizer<GradientDescentOpt> {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyGradientDescent";
  static constexpr int kNumHypers = 1;
  static constexpr const char* kHypers[kNumHypers] = {"lr"};
  static constexpr int kNumFlags = 0;
  static constexpr const char* kFlagAttrs[1] = {nullptr};
  static int NumSlots(const OptimizerFlags&) { return 0; }

  float lr = 0;
  HyperCheck Prepare(const float* h, const OptimizerFlags&) {
    lr = h[0];
    return "";
  }
  TFEXT_HOST_DEVICE void ApplyElement(float* var, float* /*slots*/, int64_t /*slot_stride*/, const float* g, int64_t j,
                                      int64_t /*dim*/) const {
    var[j] += (-g[j]) * lr;  // var += (-g) * lr
  }
};

// ---------------------------------------------------------------------------
struct MomentumOpt : ElementwiseOptimizer<MomentumOpt> {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyMomentum";
  static constexpr int kNumHypers = 2;
  static constexpr const char* kHypers[kNumHypers] = {"lr", "momentum"};
  static constexpr int kNumFlags = 1;
  static constexpr const char* kFlagAttrs[kNumFlags] = {"use_nesterov: bool = false"};
  static int NumSlots(const OptimizerFlags&) { return 1; }  // [momentum]

  float lr = 0, momentum = 0;
  bool nesterov = false;
  HyperCheck Prepare(const float* h, const OptimizerFlags& f) {
    lr = h[0];
    momentum = h[1];
    nesterov = f.use_nesterov;
    return "";
  }
  TFEXT_HOST_DEVICE void ApplyElement(float* var, float* slots, int64_t /*slot_stride*/, const float* g, int64_t j,
                                      int64_t /*dim*/) const {
    float* a = slots;
    a[j] = a[j] * momentum + g[j];
    if (nesterov) {
      var[j] -= lr * g[j] + (lr * momentum) * a[j];
    } else {
      var[j] -= lr * a[j];
    }
  }
};

// ---------------------------------------------------------------------------
struct AdagradOpt : ElementwiseOptimizer<AdagradOpt> {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyAdagrad";
  static constexpr int kNumHypers = 1;
  static constexpr const char* kHypers[kNumHypers] = {"lr"};
  static constexpr int kNumFlags = 0;
  static constexpr const char* kFlagAttrs[1] = {nullptr};
  static int NumSlots(const OptimizerFlags&) { return 1; }  // [accumulator]

  float lr = 0;
  HyperCheck Prepare(const float* h, const OptimizerFlags&) {
    lr = h[0];
    return "";
  }
  TFEXT_HOST_DEVICE void ApplyElement(float* var, float* slots, int64_t /*slot_stride*/, const float* g, int64_t j,
                                      int64_t dim) const {
    float* a = slots;
    a[j] += g[j] * g[j];
    if (dim == 1) {  // TF's scalar path
      var[j] -= lr * g[j] / std::sqrt(a[j]);
    } else {
      var[j] -= lr * g[j] * (1.0f / std::sqrt(a[j]));
    }
  }
};

// ---------------------------------------------------------------------------
// TF1 AdamOptimizer, sparse path:
//   lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
//   m = m * beta1 + g * (1 - beta1);  v = v * beta2 + (g * g) * (1 - beta2)
//   var -= lr_t * m / (sqrt(v) + epsilon)
struct AdamOpt : ElementwiseOptimizer<AdamOpt> {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyAdam";
  static constexpr int kNumHypers = 6;
  static constexpr const char* kHypers[kNumHypers] = {"beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon"};
  static constexpr int kNumFlags = 0;
  static constexpr const char* kFlagAttrs[1] = {nullptr};
  static int NumSlots(const OptimizerFlags&) { return 2; }  // [m, v]

  float lr_t = 0, beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, epsilon = 0;
  HyperCheck Prepare(const float* h, const OptimizerFlags&) {
    const float beta1_power = h[0], beta2_power = h[1], lr = h[2];
    beta1 = h[3];
    beta2 = h[4];
    epsilon = h[5];
    lr_t = lr * std::sqrt(1.0f - beta2_power) / (1.0f - beta1_power);
    one_minus_beta1 = 1.0f - beta1;
    one_minus_beta2 = 1.0f - beta2;
    return "";
  }
  TFEXT_HOST_DEVICE void ApplyElement(float* var, float* slots, int64_t slot_stride, const float* g, int64_t j,
                                      int64_t /*dim*/) const {
    const float gj = g[j];
    const float m = slots[j] * beta1 + gj * one_minus_beta1;
    const float v = slots[slot_stride + j] * beta2 + (gj * gj) * one_minus_beta2;
    slots[j] = m;
    slots[slot_stride + j] = v;
    var[j] -= (lr_t * m) / (std::sqrt(v) + epsilon);
  }
};

// ---------------------------------------------------------------------------
// SparseApplyFtrl (l2_shrinkage == 0) / SparseApplyFtrlV2 (l2_shrinkage > 0).
struct FtrlOpt : ElementwiseOptimizer<FtrlOpt> {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyFtrl";
  static constexpr int kNumHypers = 5;
  static constexpr const char* kHypers[kNumHypers] = {"lr", "l1", "l2", "l2_shrinkage", "lr_power"};
  static constexpr int kNumFlags = 1;
  static constexpr const char* kFlagAttrs[kNumFlags] = {"multiply_linear_by_lr: bool = false"};
  static int NumSlots(const OptimizerFlags&) { return 2; }  // [accum, linear]

  float lr = 0, l1 = 0, l2 = 0, l2_shrinkage = 0, lr_power = 0;
  bool mult = false;
  HyperCheck Prepare(const float* h, const OptimizerFlags& f) {
    lr = h[0];
    l1 = h[1];
    l2 = h[2];
    l2_shrinkage = h[3];
    lr_power = h[4];
    mult = f.multiply_linear_by_lr;
    if (!(lr > 0)) return "lr is not a positive scalar: " + std::to_string(lr);
    if (!(l1 >= 0)) {
      return "l1 regularization strength is not a non-negative scalar: " + std::to_string(l1);
    }
    if (!(l2 >= 0)) {
      return "l2 regularization strength is not a non-negative scalar: " + std::to_string(l2);
    }
    if (!(l2_shrinkage >= 0)) {
      return "l2 shrinkage regularization strength is not a non-negative scalar: " + std::to_string(l2_shrinkage);
    }
    if (!(lr_power <= 0)) {
      return "lr_power is not a non-positive scalar: " + std::to_string(lr_power);
    }
    return "";
  }

  TFEXT_HOST_DEVICE void ApplyElement(float* var, float* slots, int64_t slot_stride, const float* g, int64_t j,
                                      int64_t dim) const {
    float* accum = slots;
    float* linear = slots + slot_stride;
    const bool shrink = l2_shrinkage > 0;
    if (dim == 1) {
      ApplyScalar(var + j, accum + j, linear + j, g[j], shrink);
      return;
    }
    const bool fast = lr_power == -0.5f;
    const float two_l2 = 2.0f * l2;
    const float two_l2_lr = 2.0f * l2 * lr;
    const float two_shrink = 2.0f * l2_shrinkage;
    const float l1_lr = l1 * lr;
    const float gj = g[j];
    const float gs = shrink ? gj + two_shrink * var[j] : gj;
    const float a = accum[j];
    const float na = a + gj * gj;
    float lin = linear[j];
    float y;
    if (mult) {
      const float sigma = fast ? (std::sqrt(na) - std::sqrt(a)) : (std::pow(na, -lr_power) - std::pow(a, -lr_power));
      lin = lin + (gs * lr - sigma * var[j]);
      const float adj = ClampMax(ClampMin(lin, l1_lr), -l1_lr);
      y = (fast ? std::sqrt(na) : std::pow(na, -lr_power)) + two_l2_lr;
      var[j] = (adj - lin) / y;
    } else {
      const float sigma = fast ? (std::sqrt(na) - std::sqrt(a)) : (std::pow(na, -lr_power) - std::pow(a, -lr_power));
      lin = lin + (gs - sigma / lr * var[j]);
      const float adj = ClampMax(ClampMin(lin, l1), -l1);
      y = (fast ? std::sqrt(na) : std::pow(na, -lr_power)) / lr + two_l2;
      var[j] = (adj - lin) / y;
    }
    linear[j] = lin;
    accum[j] = a + gj * gj;
  }

  // TF's scalar path (inner dimension 1): FtrlCompute.
  TFEXT_HOST_DEVICE void ApplyScalar(float* var, float* accum, float* linear, float g0, bool shrink) const {
    float& a = *accum;
    float& l = *linear;
    float& v = *var;
    const float g = shrink ? g0 + (2.0f * l2_shrinkage * v) : g0;
    const float updated_a = a + g0 * g0;
    float sigma = std::pow(updated_a, -lr_power) - std::pow(a, -lr_power);
    if (!mult) sigma /= lr;
    const float updated_l = mult ? l + g * lr - sigma * v : l + g - sigma * v;
    float quadratic;
    float adj;
    if (mult) {
      quadratic = (lr_power == -0.5f ? std::sqrt(updated_a) : std::pow(updated_a, -lr_power)) + 2.0f * l2 * lr;
      adj = ClampMax(ClampMin(updated_l, l1 * lr), -l1 * lr);
    } else {
      quadratic = (lr_power == -0.5f ? std::sqrt(updated_a) : std::pow(updated_a, -lr_power)) / lr + 2.0f * l2;
      adj = ClampMax(ClampMin(updated_l, l1), -l1);
    }
    v = (adj - updated_l) / quadratic;
    a = updated_a;
    l = updated_l;
  }
};

// ---------------------------------------------------------------------------
// SparseApplyRMSProp / SparseApplyCenteredRMSProp. Slots [rms, momentum] or,
// centered, [rms, momentum, mg].
struct RMSPropOpt : ElementwiseOptimizer<RMSPropOpt> {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyRMSProp";
  static constexpr int kNumHypers = 4;
  static constexpr const char* kHypers[kNumHypers] = {"lr", "rho", "momentum", "epsilon"};
  static constexpr int kNumFlags = 1;
  static constexpr const char* kFlagAttrs[kNumFlags] = {"centered: bool = false"};
  static int NumSlots(const OptimizerFlags& f) { return f.centered ? 3 : 2; }

  float lr = 0, rho = 0, momentum = 0, epsilon = 0, one_minus_rho = 0;
  bool centered = false;
  HyperCheck Prepare(const float* h, const OptimizerFlags& f) {
    lr = h[0];
    rho = h[1];
    momentum = h[2];
    epsilon = h[3];
    one_minus_rho = 1.0f - rho;
    centered = f.centered;
    return "";
  }
  TFEXT_HOST_DEVICE void ApplyElement(float* var, float* slots, int64_t slot_stride, const float* g, int64_t j,
                                      int64_t /*dim*/) const {
    float* ms = slots;
    float* mom = slots + slot_stride;
    const float gj = g[j];
    ms[j] = ms[j] * rho + (gj * gj) * one_minus_rho;
    if (centered) {
      float* mg = slots + 2 * slot_stride;
      mg[j] = mg[j] * rho + gj * one_minus_rho;
      const float denom = (ms[j] + epsilon) - mg[j] * mg[j];
      mom[j] = mom[j] * momentum + ((1.0f / std::sqrt(denom)) * lr) * gj;
    } else {
      mom[j] = mom[j] * momentum + ((1.0f / std::sqrt(ms[j] + epsilon)) * lr) * gj;
    }
    var[j] -= mom[j];
  }
};

// ---------------------------------------------------------------------------
// The mean of g[j]^2 over j in [0, dim), the sum taken pairwise: the squares, padded with zeros to the smallest
// power of two >= dim, are added in adjacent pairs, the pair sums in adjacent pairs, ... (a balanced binary tree
// over the columns in order), then multiplied by the float nearest 1/dim (TF's graph optimizer rewrites a division
// by a constant into that multiplication, so the dense side can only compute this). One rounding per operation, in
// an order that tf_ext.RowwiseAdagradOptimizer reproduces with whole-tensor ops (x[:, 0::2] + x[:, 1::2] per tree
// level) on dense variables, so both give the same float. dim < 2^62.
TFEXT_HOST_DEVICE inline float RowMeanSquare(const float* g, int64_t dim) {
  int levels = 0;
  while ((int64_t{1} << levels) < dim) ++levels;
  // pending[l]: the sum of a completed block of 2^l leaves whose right sibling block is not complete yet.
  float pending[64];
  for (int64_t k = 0; k < (int64_t{1} << levels); ++k) {
    float sum = k < dim ? g[k] * g[k] : 0.0f;
    int level = 0;
    for (int64_t c = k; c & 1; c >>= 1, ++level) sum = pending[level] + sum;
    pending[level] = sum;
  }
  return pending[levels] * (1.0f / static_cast<float>(dim));
}

// ---------------------------------------------------------------------------
// Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD without weight decay): one accumulator per row,
//   acc += mean_j(g_j^2)   (RowMeanSquare)
//   var_j -= lr * g_j / sqrt(acc)
// with the float operations in this order (tf_ext.RowwiseAdagradOptimizer does the same on dense variables). The
// slot is one column: row[slot_offset].
struct RowwiseAdagradOpt {
  static constexpr const char* kOpName = "TfExtEmbeddingSparseApplyRowwiseAdagrad";
  static constexpr int kNumHypers = 1;
  static constexpr const char* kHypers[kNumHypers] = {"lr"};
  static constexpr int kNumFlags = 0;
  static constexpr const char* kFlagAttrs[1] = {nullptr};
  static int NumSlots(const OptimizerFlags&) { return 1; }  // [accumulator], one column
  static int64_t SlotWidth(int64_t /*dim*/) { return 1; }

  float lr = 0;
  HyperCheck Prepare(const float* h, const OptimizerFlags&) {
    lr = h[0];
    return "";
  }
  TFEXT_HOST_DEVICE void Apply(float* var, float* slots, int64_t /*slot_stride*/, const float* g, int64_t dim) const {
    float& acc = slots[0];
    acc = acc + RowMeanSquare(g, dim);
    const float root = std::sqrt(acc);
    for (int64_t j = 0; j < dim; ++j) var[j] = var[j] - (lr * g[j]) / root;
  }
};

}  // namespace embedding
}  // namespace tfext

#endif  // TENSORFLOW_EXT_EMBEDDING_KERNELS_OPTIMIZER_FUNCTORS_H_
