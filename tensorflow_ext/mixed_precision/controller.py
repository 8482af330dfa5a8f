"""`MixedPrecision`: precision state, loss scale and policy of one model."""

import tensorflow as tf

from tensorflow_ext.mixed_precision import loss_scale as loss_scale_lib
from tensorflow_ext.mixed_precision import policy as policy_lib
from tensorflow_ext.mixed_precision import precision as precision_lib

__all__ = ["MixedPrecision", "MODES"]

MODES = ("auto", "half", "float32")


class MixedPrecision(object):
    """Per-step switched mixed precision for one TF1 graph.

    Create it in the graph of the model (in an Estimator, inside ``model_fn``).
    It creates non-trainable, checkpointed variables for the precision policy
    and the loss scale.

    Typical use::

        amp = mp.MixedPrecision()                       # auto, float16
        logits = amp.build(model_fn, features)          # both branches, one graph
        loss = tf.reduce_mean(...)                      # float32
        opt = amp.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(1e-3))
        train_op = opt.minimize(loss, global_step=global_step)
        amp.add_summaries()
        hooks = [amp.logging_hook(every_n_iter=100),
                 amp.health_hook(max_skipped_steps=100)]

    Args:
      mode: ``"auto"`` (the policy switches per step), ``"half"`` (always half
        precision, with loss scaling) or ``"float32"``.
      half_dtype: ``tf.float16`` (default; the GPU choice) or ``tf.bfloat16``.
      policy: a :class:`PolicyConfig` (defaults if None).
      loss_scale: a :class:`LossScaleConfig`; default: dynamic (2^15, period
        2000, hysteresis 2) for float16, fixed 1.0 (no scaling) for bfloat16.
      initial_precision: ``"half"`` or ``"float32"`` for the first step in
        ``auto`` mode.
      name: variable-scope name of the state variables.

    Attributes:
      mode: the mode (one of :data:`MODES`).
      half_dtype: the half ``tf.DType`` (``tf.float16`` or ``tf.bfloat16``).
      graph: the ``tf.Graph`` the controller was created in.
      scope_name: name of the variable scope holding the state variables.
      policy: the :class:`SwitchingPolicy`.
      loss_scale: the :class:`DynamicLossScale`.

    Raises:
      ValueError: on an unknown mode or a non-half ``half_dtype``.
    """

    def __init__(
        self,
        mode="auto",
        half_dtype=tf.float16,
        policy=None,
        loss_scale=None,
        initial_precision="half",
        name="mixed_precision",
    ):
        if mode not in MODES:
            raise ValueError("mode must be one of %s, got %r" % (MODES, mode))
        half_dtype = tf.as_dtype(half_dtype)
        if half_dtype not in precision_lib.HALF_DTYPES:
            raise ValueError("half_dtype must be float16 or bfloat16, got %s" % half_dtype.name)
        if loss_scale is None:
            loss_scale = (
                loss_scale_lib.LossScaleConfig()
                if half_dtype == tf.float16
                else loss_scale_lib.LossScaleConfig(initial_scale=1.0, dynamic=False)
            )
        self.mode = mode
        self.half_dtype = half_dtype
        if mode == "float32":
            initial_precision = "float32"
        elif mode == "half":
            initial_precision = "half"
        self.graph = tf.compat.v1.get_default_graph()
        with tf.compat.v1.variable_scope(None, default_name=name) as vs, tf.compat.v1.init_scope():
            self.scope_name = vs.name
            self.policy = policy_lib.SwitchingPolicy(policy, initial_precision, name="policy")
            self.loss_scale = loss_scale_lib.DynamicLossScale(loss_scale, name="loss_scale")
            # One read per step, shared by the model's cond, the loss scaling
            # and the updates, so the updates are ordered after it.
            self._precision = tf.identity(self.policy.variables["precision"].read_value(), name="precision")
            if mode == "auto":
                self._is_half = tf.equal(self._precision, policy_lib.HALF, name="is_half")
            else:
                self._is_half = tf.constant(mode == "half", name="is_half")
            # Pre-step reads of the switch state: the end-of-step update is
            # ordered after them, so fetched with a training step they hold
            # the state this step started from (the logging hook records
            # switches from them without an extra session.run).
            variables = self.policy.variables
            self._step_start = {
                "precision": self._precision,
                "total_steps": tf.identity(variables["total_steps"].read_value(), name="total_steps_at_start"),
                "last_reason": tf.identity(variables["last_reason"].read_value(), name="last_reason_at_start"),
            }
            self._health = self._build_health_variables()
            self._scale = tf.identity(self.loss_scale.read(), name="scale")
            self._effective_scale = tf.where(self._is_half, self._scale, tf.constant(1.0), name="effective_loss_scale")
            with tf.name_scope("metrics"):
                self._metrics = self._build_metrics()

    # ---- model building -------------------------------------------------
    @property
    def is_half(self):
        """Scalar bool tensor: does this step run in half precision?"""
        return self._is_half

    @property
    def effective_loss_scale(self):
        """Scalar float32 tensor: the loss scale applied this step (1 in float32)."""
        return self._effective_scale

    def build(self, model_fn, *args, **kwargs):
        """Builds ``model_fn(*args, **kwargs)`` for this controller's mode.

        In ``auto`` mode both branches (half and float32) are built in one
        ``tf.cond`` on the precision state; in fixed modes only one.

        Args:
          model_fn: function of tensors, written once (use
            :func:`compute_dtype` / :func:`cast_compute` for dtypes).
          *args: model inputs; floating ones are cast to the compute dtype.
          **kwargs: passed through unchanged.

        Returns:
          ``model_fn``'s outputs with floating tensors in float32.
        """
        if self.mode == "auto":
            return precision_lib.build_switched(self._is_half, self.half_dtype, model_fn, *args, **kwargs)
        dtype = self.half_dtype if self.mode == "half" else tf.float32
        return precision_lib.build_in(dtype, model_fn, *args, **kwargs)

    def wrap_optimizer(self, optimizer):
        """Returns ``optimizer`` wrapped with loss scaling and the policy update.

        Args:
          optimizer: any ``tf.compat.v1.train.Optimizer``.

        Returns:
          A :class:`MixedPrecisionOptimizer`.
        """
        from tensorflow_ext.mixed_precision.optimizer import MixedPrecisionOptimizer

        return MixedPrecisionOptimizer(optimizer, self)

    def update(self, loss, grads_finite):
        """Builds the end-of-step update of the loss scale and the policy.

        The policy sees a step as non-finite when its loss is non-finite (a
        forward overflow, which no loss scale fixes) or when its gradients are
        non-finite and loss scaling cannot help (float32 step, fixed scale, or
        dynamic scale already at ``min_scale``). Gradient overflows while the
        dynamic scale can still back off only lower the scale.

        Args:
          loss: the step's float32 loss (unscaled).
          grads_finite: scalar bool: all gradients finite.

        Returns:
          An op.
        """
        loss = tf.cast(loss, tf.float32)
        loss_finite = tf.math.is_finite(loss)
        ls = self.loss_scale.update(grads_finite, loss_finite, active=self._is_half)
        # A gradient overflow in a half step that loss scaling can still fix
        # (scale above its floor) is the loss scaler's business, not a reason
        # to leave half precision; everything else counts as non-finite.
        cfg = self.loss_scale.config
        if cfg.dynamic:
            fixable = tf.logical_and(self._is_half, self._scale > cfg.min_scale)
            grads_ok = tf.logical_or(grads_finite, fixable)
        else:
            grads_ok = grads_finite
        with tf.control_dependencies(list(self._step_start.values())):
            pol = self.policy.update(
                loss, tf.logical_and(grads_ok, loss_finite), precision=self._precision, advance=self.mode == "auto"
            )
        return tf.group(ls, pol, name="mixed_precision_update")

    # ---- training health ----------------------------------------------------
    def _build_health_variables(self):
        kw = dict(trainable=False, use_resource=True, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
        with tf.compat.v1.variable_scope("health"):
            return {
                # Train-op runs; counted by an op with no input from the
                # model, so it runs even when the rest of the step does not.
                "attempted_steps": tf.compat.v1.get_variable(
                    "attempted_steps", initializer=tf.constant(0, tf.int64), **kw
                ),
                "applied_steps": tf.compat.v1.get_variable("applied_steps", initializer=tf.constant(0, tf.int64), **kw),
                # attempted_steps at the last applied step.
                "last_applied_at": tf.compat.v1.get_variable(
                    "last_applied_at", initializer=tf.constant(0, tf.int64), **kw
                ),
            }

    def count_step(self, applied):
        """Builds the updates of the training-health counters for one step.

        ``attempted_steps`` is incremented by an op that depends on nothing
        from the model, so it counts every run of the train op, including
        steps whose update never ran (a dead branch of the graph, for
        example). ``applied_steps`` and ``last_applied_at`` only move when
        ``applied`` is computed and True. :meth:`metrics` derives
        ``skipped_streak`` (train-op runs since the last applied step) and
        ``applied_step_ratio`` from them. :class:`MixedPrecisionOptimizer`
        calls this once per step.

        Args:
          applied: scalar bool tensor: the step's update was applied.

        Returns:
          An op.
        """
        h = self._health
        attempted = h["attempted_steps"].assign_add(tf.constant(1, tf.int64))
        applied = tf.convert_to_tensor(applied, tf.bool)
        count = h["applied_steps"].assign_add(tf.cast(applied, tf.int64))
        last = h["last_applied_at"].assign(tf.where(applied, attempted, h["last_applied_at"].read_value()))
        return tf.group(attempted, count, last, name="health_update")

    # ---- observability ----------------------------------------------------
    def metrics(self):
        """Returns the observable state as a dict of scalar tensors.

        Keys: ``precision`` (1 = half, 0 = float32), ``loss_scale``,
        ``num_switches``, ``half_fraction`` (steps in half / all steps),
        ``half_steps``, ``total_steps``, ``overflow_rate``, ``last_reason``
        (0 none, 1 overflow, 2 spike, 3 divergence), and the training health
        counters of :class:`MixedPrecisionOptimizer`: ``attempted_steps``
        (train-op runs), ``applied_steps`` (steps whose update was applied),
        ``skipped_streak`` (train-op runs since the last applied step) and
        ``applied_step_ratio`` (applied / attempted; 1 before the first
        step).

        The tensors are built once, with the controller, so this works after
        the graph is finalized (e.g. inside a MonitoredTrainingSession).

        Returns:
          dict of str -> scalar tensor (read when evaluated).
        """
        return dict(self._metrics)

    def _build_metrics(self):
        v = self.policy.variables
        total = tf.cast(v["total_steps"].read_value(), tf.float32)
        half = tf.cast(v["half_steps"].read_value(), tf.float32)
        h = self._health
        attempted = h["attempted_steps"].read_value()
        applied = h["applied_steps"].read_value()
        return {
            "precision": tf.cast(v["precision"].read_value(), tf.float32),
            "loss_scale": self.loss_scale.read(),
            "num_switches": tf.cast(v["num_switches"].read_value(), tf.float32),
            "half_fraction": half / tf.maximum(total, 1.0),
            "half_steps": v["half_steps"].read_value(),
            "total_steps": v["total_steps"].read_value(),
            "overflow_rate": v["overflow_rate"].read_value(),
            "last_reason": v["last_reason"].read_value(),
            "attempted_steps": attempted,
            "applied_steps": applied,
            "skipped_streak": attempted - h["last_applied_at"].read_value(),
            "applied_step_ratio": tf.where(
                attempted > 0, tf.cast(applied, tf.float32) / tf.cast(tf.maximum(attempted, 1), tf.float32), 1.0
            ),
        }

    def add_summaries(self, family="mixed_precision"):
        """Adds TensorBoard scalar summaries of the observable state.

        Adds scalar summaries tagged exactly ``<family>/precision``,
        ``<family>/loss_scale``, ``<family>/num_switches``,
        ``<family>/half_fraction``, ``<family>/applied_step_ratio`` and
        ``<family>/skipped_streak`` to ``GraphKeys.SUMMARIES`` (like
        ``tf.compat.v1.summary.scalar``), so ``merge_all``, Estimator and
        MonitoredTrainingSession write them.

        Args:
          family: name prefix of the summaries.

        Returns:
          The list of summary tensors.
        """
        m = self.metrics()
        out = []
        for key in ("precision", "loss_scale", "num_switches", "half_fraction", "applied_step_ratio", "skipped_streak"):
            # ScalarSummary with an explicit tag: tf.summary.scalar would take
            # the tag from a (possibly uniquified) name scope.
            summary = tf.raw_ops.ScalarSummary(
                tags=tf.constant("%s/%s" % (family, key)), values=tf.cast(m[key], tf.float32), name="summary_" + key
            )
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SUMMARIES, summary)
            out.append(summary)
        return out

    def step_start(self):
        """Returns the switch state a step starts from, as scalar tensors.

        Keys: ``precision`` (the precision the step runs in), ``total_steps``
        (steps completed before it) and ``last_reason``. The end-of-step
        update is ordered after these reads, so fetched together with the
        train op they hold the values before the step (unlike
        :meth:`metrics`, which may see either side of the update).

        Returns:
          dict of str -> scalar int64 tensor.
        """
        return dict(self._step_start)

    def logging_hook(self, every_n_iter=100, log_fn=None, tensors=None, error_fn=None):
        """Returns a :class:`MixedPrecisionLoggingHook` for this controller.

        Args:
          every_n_iter: log every N training steps.
          log_fn: optional callable(str); default ``tf.compat.v1.logging.info``.
          tensors: optional dict name -> scalar tensor (e.g. the loss) logged
            with each line, fetched with the step that logs.
          error_fn: optional callable(str) for health errors; default
            ``tf.compat.v1.logging.error``.

        Returns:
          A ``tf.compat.v1.train.SessionRunHook``.
        """
        from tensorflow_ext.mixed_precision.hooks import MixedPrecisionLoggingHook

        return MixedPrecisionLoggingHook(
            self, every_n_iter=every_n_iter, log_fn=log_fn, tensors=tensors, error_fn=error_fn
        )

    def health_hook(self, max_skipped_steps=100, every_n_iter=10, raise_error=True, error_fn=None):
        """Returns a :class:`MixedPrecisionHealthHook` for this controller.

        Args:
          max_skipped_steps: train-op runs in a row without an applied update
            that count as a failed run.
          every_n_iter: check every N runs.
          raise_error: raise :class:`NoTrainingProgressError` (True) or only
            log the error (False).
          error_fn: optional callable(str); default
            ``tf.compat.v1.logging.error``.

        Returns:
          A ``tf.compat.v1.train.SessionRunHook``.
        """
        from tensorflow_ext.mixed_precision.hooks import MixedPrecisionHealthHook

        return MixedPrecisionHealthHook(
            self,
            max_skipped_steps=max_skipped_steps,
            every_n_iter=every_n_iter,
            raise_error=raise_error,
            error_fn=error_fn,
        )
