"""Mixed precision that switches between half and float32 per step by the loss state.

Pure Python/TensorFlow (TF1 graph mode); imports no custom ops.

Public API:

* :class:`MixedPrecision`: the controller (precision state, loss scale,
  policy); ``build`` / ``wrap_optimizer`` / ``add_summaries`` /
  ``logging_hook``.
* :func:`precision_scope`, :func:`compute_dtype`, :func:`cast_compute`,
  :func:`no_cast`, :func:`build_switched`: writing a model once for both
  precisions.
* :class:`MixedPrecisionOptimizer`: loss scaling and skip-on-overflow around
  any ``tf.compat.v1.train.Optimizer``.
* :class:`PolicyConfig`, :class:`SwitchingPolicy`, :func:`reference_step`,
  :func:`graph_step`: the switching policy.
* :class:`LossScaleConfig`, :class:`DynamicLossScale`.
* :class:`MixedPrecisionLoggingHook`, :class:`MixedPrecisionHealthHook`,
  :class:`NoTrainingProgressError`: logging, switch record and the training
  health check.
"""

from tensorflow_ext.mixed_precision.controller import MODES, MixedPrecision
from tensorflow_ext.mixed_precision.hooks import (
    MixedPrecisionHealthHook,
    MixedPrecisionLoggingHook,
    NoTrainingProgressError,
)
from tensorflow_ext.mixed_precision.loss_scale import DynamicLossScale, LossScaleConfig, reference_loss_scale_step
from tensorflow_ext.mixed_precision.optimizer import MixedPrecisionOptimizer
from tensorflow_ext.mixed_precision.policy import (
    FULL,
    HALF,
    REASONS,
    PolicyConfig,
    SwitchingPolicy,
    graph_step,
    initial_state,
    reference_step,
)
from tensorflow_ext.mixed_precision.precision import (
    HALF_DTYPES,
    build_in,
    build_switched,
    cast_compute,
    compute_dtype,
    is_half,
    no_cast,
    precision_scope,
)

__all__ = [
    "DynamicLossScale",
    "FULL",
    "HALF",
    "HALF_DTYPES",
    "LossScaleConfig",
    "MODES",
    "MixedPrecision",
    "MixedPrecisionHealthHook",
    "MixedPrecisionLoggingHook",
    "MixedPrecisionOptimizer",
    "NoTrainingProgressError",
    "PolicyConfig",
    "REASONS",
    "SwitchingPolicy",
    "build_in",
    "build_switched",
    "cast_compute",
    "compute_dtype",
    "graph_step",
    "initial_state",
    "is_half",
    "no_cast",
    "precision_scope",
    "reference_loss_scale_step",
    "reference_step",
]
