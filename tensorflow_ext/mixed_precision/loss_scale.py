"""Dynamic loss scaling with hysteresis, in-graph and as a pure-Python reference.

Rules (one call per training step taken in half precision):

* finite gradients: ``good_steps += 1``; after ``growth_interval`` consecutive
  finite steps the scale is multiplied by ``growth_factor`` (capped at
  ``max_scale``), ``good_steps`` restarts at 0 and the overflow budget is
  refilled to ``hysteresis``.
* non-finite gradients: ``good_steps = 0``; if the overflow budget is above 1
  it is decremented (the overflow is tolerated), otherwise the scale is
  multiplied by ``backoff_factor`` (floored at ``min_scale``). As in DeepSpeed,
  the budget is refilled only when the scale grows, so after the first backoff
  every further overflow lowers the scale at once.
* a non-finite *loss* (the forward pass itself overflowed) leaves the scale
  alone: a smaller scale cannot fix a forward overflow. The step is skipped
  and the switching policy counts it.
* ``dynamic=False``: the scale stays at ``initial_scale`` (1.0 disables
  scaling, the default for bfloat16, whose range is float32's).
"""

import dataclasses

import tensorflow as tf

__all__ = ["LossScaleConfig", "DynamicLossScale", "reference_loss_scale_step"]


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    """Loss-scale settings; the defaults are TF1's (2^15, period 2000).

    Attributes:
      initial_scale: first scale (TF1 default 2**15; PyTorch uses 2**16).
      growth_interval: consecutive finite steps before the scale grows (2000).
      growth_factor: multiplier on growth (2.0).
      backoff_factor: multiplier on an overflow that exhausts the budget (0.5).
      hysteresis: overflows tolerated before the first backoff (2, DeepSpeed's
        default; 1 = back off on every overflow, as TF and PyTorch do).
      min_scale: floor of the scale (1.0).
      max_scale: cap of the scale (2**24).
      dynamic: False keeps the scale fixed at ``initial_scale``.

    Raises:
      ValueError: on construction, if a scale is not positive, ``max_scale`` <
        ``min_scale``, ``growth_interval`` or ``hysteresis`` < 1,
        ``growth_factor`` < 1 or ``backoff_factor`` not in (0, 1].
    """

    initial_scale: float = 2.0**15
    growth_interval: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    hysteresis: int = 2
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    dynamic: bool = True

    def __post_init__(self):
        if self.initial_scale <= 0 or self.min_scale <= 0 or self.max_scale < self.min_scale:
            raise ValueError("loss scales must be positive with min_scale <= max_scale")
        if self.growth_interval < 1 or self.hysteresis < 1:
            raise ValueError("growth_interval and hysteresis must be >= 1")
        if self.growth_factor < 1.0 or not 0.0 < self.backoff_factor <= 1.0:
            raise ValueError("need growth_factor >= 1 and 0 < backoff_factor <= 1")


def reference_loss_scale_step(cfg, state, grads_finite, loss_finite=True):
    """One loss-scale update in pure Python (the specification).

    Args:
      cfg: a :class:`LossScaleConfig`.
      state: dict with ``scale`` (float), ``good_steps`` (int) and
        ``budget`` (int).
      grads_finite: whether all gradients of the step were finite.
      loss_finite: whether the (unscaled) loss was finite.

    Returns:
      The new state dict.
    """
    s = dict(state)
    if not cfg.dynamic:
        return s
    if grads_finite and loss_finite:
        s["good_steps"] += 1
        if s["good_steps"] >= cfg.growth_interval:
            s["scale"] = min(s["scale"] * cfg.growth_factor, cfg.max_scale)
            s["good_steps"] = 0
            s["budget"] = cfg.hysteresis
    elif loss_finite:
        s["good_steps"] = 0
        if s["budget"] > 1:
            s["budget"] -= 1
        else:
            s["scale"] = max(s["scale"] * cfg.backoff_factor, cfg.min_scale)
    else:
        s["good_steps"] = 0
    return s


class DynamicLossScale(object):
    """Loss-scale state held in (non-trainable, checkpointed) variables.

    Args:
      config: a :class:`LossScaleConfig` (defaults if None).
      name: variable-scope name.

    Attributes:
      config: the :class:`LossScaleConfig` in use.
      scale_var: float32 variable holding the current loss scale.
      good_steps_var: int64 variable counting consecutive finite steps.
      budget_var: int64 variable holding the remaining overflow budget.
    """

    def __init__(self, config=None, name="loss_scale"):
        self.config = config or LossScaleConfig()
        with tf.compat.v1.variable_scope(None, default_name=name):
            kw = dict(trainable=False, use_resource=True, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
            self.scale_var = tf.compat.v1.get_variable(
                "scale", initializer=tf.constant(float(self.config.initial_scale)), **kw
            )
            self.good_steps_var = tf.compat.v1.get_variable("good_steps", initializer=tf.constant(0, tf.int64), **kw)
            self.budget_var = tf.compat.v1.get_variable(
                "budget", initializer=tf.constant(self.config.hysteresis, tf.int64), **kw
            )

    def read(self):
        """Reads the current loss scale.

        Returns:
          A scalar float32 tensor with the scale variable's value.
        """
        return self.scale_var.read_value()

    def update(self, grads_finite, loss_finite, active=True):
        """Builds the in-graph update (mirrors :func:`reference_loss_scale_step`).

        Args:
          grads_finite: scalar bool tensor.
          loss_finite: scalar bool tensor.
          active: scalar bool tensor (or Python bool); when False (a float32
            step) the state is left unchanged.

        Returns:
          An op that assigns the new state (a ``tf.no_op`` when the scale is
          not dynamic).
        """
        cfg = self.config
        if not cfg.dynamic:
            return tf.no_op()
        scale = self.scale_var.read_value()
        good = self.good_steps_var.read_value()
        budget = self.budget_var.read_value()
        ok = tf.logical_and(grads_finite, loss_finite)
        grad_overflow = tf.logical_and(tf.logical_not(grads_finite), loss_finite)
        good_inc = good + 1
        grow = tf.logical_and(ok, good_inc >= cfg.growth_interval)
        backoff = tf.logical_and(grad_overflow, budget <= 1)
        new_scale = tf.where(
            grow,
            tf.minimum(scale * cfg.growth_factor, cfg.max_scale),
            tf.where(backoff, tf.maximum(scale * cfg.backoff_factor, cfg.min_scale), scale),
        )
        new_good = tf.where(tf.logical_and(ok, tf.logical_not(grow)), good_inc, tf.zeros_like(good))
        new_budget = tf.where(
            grow,
            tf.constant(cfg.hysteresis, tf.int64),
            tf.where(tf.logical_and(grad_overflow, budget > 1), budget - 1, budget),
        )
        active = tf.convert_to_tensor(active, tf.bool)
        return tf.group(
            self.scale_var.assign(tf.where(active, new_scale, scale)),
            self.good_steps_var.assign(tf.where(active, new_good, good)),
            self.budget_var.assign(tf.where(active, new_budget, budget)),
            name="loss_scale_update",
        )
