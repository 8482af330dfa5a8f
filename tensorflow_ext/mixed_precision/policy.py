"""The switching policy: decide each step's precision from the loss state.

The policy sees, after every training step, the step's float32 loss and
whether the step was finite (loss and all gradients). It keeps:

* ``overflow_rate``: an exponential moving average (decay ``overflow_decay``)
  of non-finite steps, updated only in half precision (float32 steps say
  nothing about half-precision range);
* ``loss_mean`` / ``loss_var``: an EMA (decay ``loss_decay``) of the finite
  losses and of their variance, for a z-score of each new loss;
* ``loss_fast`` / ``loss_slow``: two EMAs (``fast_decay``, ``slow_decay``) of
  the loss whose gap measures the loss trend.

In **half** precision it switches to float32 at the end of a step when

1. ``overflow_rate > max_overflow_rate`` (reason 1, overflow), or
2. the loss is a spike: ``(loss - loss_mean) / std > spike_zscore`` with
   ``std = sqrt(loss_var) + min_rel_std * |loss_mean|`` (reason 2), or
3. the trend diverges: ``loss_fast - loss_slow > divergence_threshold *
   |loss_slow|`` for ``divergence_patience`` consecutive steps (reason 3).

Spikes and divergence are only judged after ``warmup_steps`` finite losses.

In **float32** it counts consecutive stable steps (finite, no spike, no
divergence) and returns to half precision once it has spent at least
``dwell`` steps in float32 **and** seen ``stable_steps`` stable steps in a row
(hysteresis). ``dwell`` starts at ``min_full_steps``; when half precision
fails again less than ``relapse_window`` steps after a return, the next dwell
is ``dwell * dwell_growth`` (capped at ``max_full_steps``), otherwise it is
reset to ``min_full_steps``. Returning to half precision clears the overflow
rate and the divergence streak.

The same step exists twice: :func:`reference_step` (pure Python, the
specification) and :func:`graph_step` (TensorFlow ops); tests assert that they
agree. :class:`SwitchingPolicy` keeps the state in variables, so Savers and
Estimator checkpoints save and restore it.
"""

import dataclasses
import math

import tensorflow as tf

__all__ = [
    "FULL",
    "HALF",
    "PolicyConfig",
    "REASONS",
    "SwitchingPolicy",
    "graph_step",
    "initial_state",
    "reference_step",
]

HALF = 1
FULL = 0
REASONS = {0: "none", 1: "overflow", 2: "spike", 3: "divergence"}
_TINY = 1e-12


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """Thresholds of the switching policy (all have documented defaults).

    Attributes:
      overflow_decay: EMA decay of the non-finite-step indicator (0.99, a
        window of about 100 half-precision steps).
      max_overflow_rate: switch to float32 when the overflow EMA exceeds this
        (0.1: about 10 non-finite steps in the last 100; a start-up loss-scale
        search of 7 overflows in a row reaches only 0.068).
      loss_decay: EMA decay of the loss mean and variance (0.98, ~50 steps).
      spike_zscore: z-score above which a loss is a spike (6.0).
      min_rel_std: floor of the std as a fraction of |mean| (0.01), so a
        perfectly flat loss does not make tiny changes spikes.
      warmup_steps: finite losses needed before spikes/divergence are judged
        (50).
      fast_decay: decay of the fast loss EMA (0.9, ~10 steps).
      slow_decay: decay of the slow loss EMA (0.99, ~100 steps).
      divergence_threshold: relative gap fast-over-slow that counts as an
        upward trend (0.2).
      divergence_patience: consecutive upward-trend steps that make a
        divergence (20).
      min_full_steps: K, minimum float32 steps after a switch (100).
      stable_steps: M, consecutive stable float32 steps needed to go back to
        half precision (100).
      dwell_growth: dwell multiplier on a relapse (2).
      max_full_steps: cap of the dwell (10000).
      relapse_window: a half-precision phase shorter than this that ends in a
        switch is a relapse (1000).

    Raises:
      ValueError: on construction, if a decay is outside [0, 1), a step count
        is negative, ``dwell_growth`` < 1 or ``max_full_steps`` <
        ``min_full_steps``.
    """

    overflow_decay: float = 0.99
    max_overflow_rate: float = 0.1
    loss_decay: float = 0.98
    spike_zscore: float = 6.0
    min_rel_std: float = 0.01
    warmup_steps: int = 50
    fast_decay: float = 0.9
    slow_decay: float = 0.99
    divergence_threshold: float = 0.2
    divergence_patience: int = 20
    min_full_steps: int = 100
    stable_steps: int = 100
    dwell_growth: int = 2
    max_full_steps: int = 10000
    relapse_window: int = 1000

    def __post_init__(self):
        for f in ("overflow_decay", "loss_decay", "fast_decay", "slow_decay"):
            if not 0.0 <= getattr(self, f) < 1.0:
                raise ValueError("%s must be in [0, 1)" % f)
        for f in (
            "warmup_steps",
            "divergence_patience",
            "min_full_steps",
            "stable_steps",
            "max_full_steps",
            "relapse_window",
        ):
            if getattr(self, f) < 0:
                raise ValueError("%s must be >= 0" % f)
        if self.dwell_growth < 1:
            raise ValueError("dwell_growth must be >= 1")
        if self.max_full_steps < self.min_full_steps:
            raise ValueError("max_full_steps must be >= min_full_steps")


# name -> (dtype, python type)
STATE_FIELDS = {
    "precision": tf.int64,
    "steps_in_mode": tf.int64,
    "stable_streak": tf.int64,
    "overflow_rate": tf.float32,
    "loss_count": tf.int64,
    "loss_mean": tf.float32,
    "loss_var": tf.float32,
    "loss_fast": tf.float32,
    "loss_slow": tf.float32,
    "divergence_streak": tf.int64,
    "dwell": tf.int64,
    "num_switches": tf.int64,
    "half_steps": tf.int64,
    "total_steps": tf.int64,
    "last_reason": tf.int64,
}


def initial_state(cfg, precision=HALF):
    """Returns the initial policy state as a dict of Python numbers.

    Args:
      cfg: a :class:`PolicyConfig`.
      precision: :data:`HALF` (1) or :data:`FULL` (0).

    Returns:
      A dict with one entry per field of :data:`STATE_FIELDS`.
    """
    s = {k: (0.0 if v == tf.float32 else 0) for k, v in STATE_FIELDS.items()}
    s["precision"] = int(precision)
    s["dwell"] = int(cfg.min_full_steps)
    return s


def reference_step(cfg, state, loss, finite):
    """One policy step in pure Python: the specification of :func:`graph_step`.

    Args:
      cfg: a :class:`PolicyConfig`.
      state: the state dict before the step (see :func:`initial_state`).
      loss: the step's float32 loss (any float; may be inf/nan).
      finite: whether the loss and all gradients of the step were finite.

    Returns:
      The state dict after the step; ``precision`` is the next step's.
    """
    s = dict(state)
    was_half = s["precision"] == HALF
    s["total_steps"] += 1
    if was_half:
        s["half_steps"] += 1
    ok = bool(finite) and math.isfinite(loss)
    if was_half:
        d = cfg.overflow_decay
        s["overflow_rate"] = d * s["overflow_rate"] + (1.0 - d) * (0.0 if ok else 1.0)
    warm = s["loss_count"] >= cfg.warmup_steps
    spike = False
    if ok:
        if s["loss_count"] == 0:
            s["loss_mean"], s["loss_var"] = loss, 0.0
            s["loss_fast"] = s["loss_slow"] = loss
        else:
            std = math.sqrt(s["loss_var"]) + cfg.min_rel_std * abs(s["loss_mean"]) + _TINY
            spike = warm and (loss - s["loss_mean"]) / std > cfg.spike_zscore
            a = 1.0 - cfg.loss_decay
            delta = loss - s["loss_mean"]
            s["loss_mean"] += a * delta
            s["loss_var"] = cfg.loss_decay * (s["loss_var"] + a * delta * delta)
            s["loss_fast"] = cfg.fast_decay * s["loss_fast"] + (1 - cfg.fast_decay) * loss
            s["loss_slow"] = cfg.slow_decay * s["loss_slow"] + (1 - cfg.slow_decay) * loss
        s["loss_count"] += 1
    trend_up = (
        warm and ok and (s["loss_fast"] - s["loss_slow"] > cfg.divergence_threshold * (abs(s["loss_slow"]) + _TINY))
    )
    s["divergence_streak"] = s["divergence_streak"] + 1 if trend_up else 0
    diverging = s["divergence_streak"] >= cfg.divergence_patience
    if was_half:
        reason = 0
        if s["overflow_rate"] > cfg.max_overflow_rate:
            reason = 1
        elif spike:
            reason = 2
        elif diverging:
            reason = 3
        if reason:
            relapse = s["num_switches"] > 0 and s["steps_in_mode"] + 1 < cfg.relapse_window
            s["dwell"] = min(s["dwell"] * cfg.dwell_growth, cfg.max_full_steps) if relapse else cfg.min_full_steps
            s["precision"] = FULL
            s["num_switches"] += 1
            s["steps_in_mode"] = 0
            s["stable_streak"] = 0
            s["last_reason"] = reason
        else:
            s["steps_in_mode"] += 1
    else:
        unstable = (not ok) or spike or diverging
        s["stable_streak"] = 0 if unstable else s["stable_streak"] + 1
        s["steps_in_mode"] += 1
        if s["steps_in_mode"] >= s["dwell"] and s["stable_streak"] >= cfg.stable_steps:
            s["precision"] = HALF
            s["num_switches"] += 1
            s["steps_in_mode"] = 0
            s["stable_streak"] = 0
            s["overflow_rate"] = 0.0
            s["divergence_streak"] = 0
    return s


def graph_step(cfg, state, loss, finite):
    """One policy step with TensorFlow ops (mirrors :func:`reference_step`).

    Args:
      cfg: a :class:`PolicyConfig`.
      state: dict of scalar tensors (dtypes as in :data:`STATE_FIELDS`).
      loss: scalar float32 tensor.
      finite: scalar bool tensor.

    Returns:
      The dict of new-state tensors.
    """
    i64 = lambda v: tf.constant(v, tf.int64)  # noqa: E731
    f32 = lambda v: tf.constant(v, tf.float32)  # noqa: E731
    s = dict(state)
    loss = tf.cast(loss, tf.float32)
    was_half = tf.equal(s["precision"], HALF)
    was_half_i = tf.cast(was_half, tf.int64)
    s["total_steps"] = state["total_steps"] + 1
    s["half_steps"] = state["half_steps"] + was_half_i
    ok = tf.logical_and(tf.convert_to_tensor(finite, tf.bool), tf.math.is_finite(loss))
    safe_loss = tf.where(ok, loss, f32(0.0))
    d = cfg.overflow_decay
    rate = d * state["overflow_rate"] + (1.0 - d) * tf.where(ok, f32(0.0), f32(1.0))
    rate = tf.where(was_half, rate, state["overflow_rate"])
    warm = state["loss_count"] >= cfg.warmup_steps
    first = tf.equal(state["loss_count"], 0)
    mean, var = state["loss_mean"], state["loss_var"]
    std = tf.sqrt(var) + cfg.min_rel_std * tf.abs(mean) + _TINY
    spike = tf.logical_and(
        tf.logical_and(ok, warm), tf.logical_and(tf.logical_not(first), (safe_loss - mean) / std > cfg.spike_zscore)
    )
    a = 1.0 - cfg.loss_decay
    delta = safe_loss - mean
    new_mean = tf.where(first, safe_loss, mean + a * delta)
    new_var = tf.where(first, f32(0.0), cfg.loss_decay * (var + a * delta * delta))
    new_fast = tf.where(first, safe_loss, cfg.fast_decay * state["loss_fast"] + (1 - cfg.fast_decay) * safe_loss)
    new_slow = tf.where(first, safe_loss, cfg.slow_decay * state["loss_slow"] + (1 - cfg.slow_decay) * safe_loss)
    s["loss_mean"] = tf.where(ok, new_mean, mean)
    s["loss_var"] = tf.where(ok, new_var, var)
    s["loss_fast"] = tf.where(ok, new_fast, state["loss_fast"])
    s["loss_slow"] = tf.where(ok, new_slow, state["loss_slow"])
    s["loss_count"] = state["loss_count"] + tf.cast(ok, tf.int64)
    trend_up = tf.logical_and(
        tf.logical_and(warm, ok),
        s["loss_fast"] - s["loss_slow"] > cfg.divergence_threshold * (tf.abs(s["loss_slow"]) + _TINY),
    )
    div_streak = tf.where(trend_up, state["divergence_streak"] + 1, i64(0))
    diverging = div_streak >= cfg.divergence_patience

    # Half precision: switch to float32?
    reason = tf.where(
        rate > cfg.max_overflow_rate, i64(1), tf.where(spike, i64(2), tf.where(diverging, i64(3), i64(0)))
    )
    to_full = tf.logical_and(was_half, reason > 0)
    relapse = tf.logical_and(state["num_switches"] > 0, state["steps_in_mode"] + 1 < cfg.relapse_window)
    grown = tf.minimum(state["dwell"] * cfg.dwell_growth, i64(cfg.max_full_steps))
    # Float32: back to half?
    unstable = tf.logical_or(tf.logical_not(ok), tf.logical_or(spike, diverging))
    stable = tf.where(unstable, i64(0), state["stable_streak"] + 1)
    steps = state["steps_in_mode"] + 1
    to_half = tf.logical_and(
        tf.logical_not(was_half), tf.logical_and(steps >= state["dwell"], stable >= cfg.stable_steps)
    )
    switch = tf.logical_or(to_full, to_half)

    s["precision"] = tf.where(to_full, i64(FULL), tf.where(to_half, i64(HALF), state["precision"]))
    s["num_switches"] = state["num_switches"] + tf.cast(switch, tf.int64)
    s["steps_in_mode"] = tf.where(switch, i64(0), steps)
    s["stable_streak"] = tf.where(switch, i64(0), tf.where(was_half, state["stable_streak"], stable))
    s["dwell"] = tf.where(to_full, tf.where(relapse, grown, i64(cfg.min_full_steps)), state["dwell"])
    s["last_reason"] = tf.where(to_full, reason, state["last_reason"])
    s["overflow_rate"] = tf.where(to_half, f32(0.0), rate)
    s["divergence_streak"] = tf.where(to_half, i64(0), div_streak)
    return s


class SwitchingPolicy(object):
    """The policy state in variables, plus the in-graph update.

    The variables are non-trainable global variables (saved by ``tf.train.Saver``
    and Estimator checkpoints) under a variable scope named ``name``.

    Args:
      config: a :class:`PolicyConfig` (defaults if None).
      initial_precision: ``"half"`` or ``"float32"``: the first step's precision.
      name: variable-scope name.

    Attributes:
      config: the :class:`PolicyConfig` in use.
      variables: dict mapping each :data:`STATE_FIELDS` name to its resource
        variable.

    Raises:
      ValueError: on an unknown ``initial_precision``.
    """

    def __init__(self, config=None, initial_precision="half", name="switching_policy"):
        if initial_precision not in ("half", "float32"):
            raise ValueError("initial_precision must be 'half' or 'float32'")
        self.config = config or PolicyConfig()
        init = initial_state(self.config, HALF if initial_precision == "half" else FULL)
        self.variables = {}
        with tf.compat.v1.variable_scope(None, default_name=name):
            for key, dtype in STATE_FIELDS.items():
                self.variables[key] = tf.compat.v1.get_variable(
                    key,
                    initializer=tf.constant(init[key], dtype),
                    trainable=False,
                    use_resource=True,
                    collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES],
                )

    def read(self):
        """Reads every state variable.

        Returns:
          A dict mapping each :data:`STATE_FIELDS` name to a scalar tensor
          holding the variable's current value.
        """
        return {k: v.read_value() for k, v in self.variables.items()}

    def update(self, loss, finite, precision=None, advance=True):
        """Builds the op that runs one policy step.

        Args:
          loss: scalar float loss of the step.
          finite: scalar bool, True when the loss and all gradients are finite.
          precision: optional int64 tensor with the precision read that the
            step's model used (so the update is ordered after that read).
          advance: False only updates the step counters (fixed-precision modes).

        Returns:
          An op assigning the new state.
        """
        state = self.read()
        if precision is not None:
            state["precision"] = precision
        if advance:
            new = graph_step(self.config, state, loss, finite)
            assigns = [self.variables[k].assign(new[k]) for k in self.variables]
        else:
            is_half = tf.cast(tf.equal(state["precision"], HALF), tf.int64)
            assigns = [
                self.variables["total_steps"].assign_add(tf.constant(1, tf.int64)),
                self.variables["half_steps"].assign_add(is_half),
            ]
        return tf.group(*assigns, name="policy_update")
