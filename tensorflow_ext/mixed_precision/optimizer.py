"""Optimizer wrapper: loss scaling, skip-on-overflow and the policy update."""

import tensorflow as tf

__all__ = ["MixedPrecisionOptimizer"]


def _unscale(grad, inv_scale, dtype):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        values = tf.cast(grad.values, dtype) * tf.cast(inv_scale, dtype)
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return tf.cast(grad, dtype) * tf.cast(inv_scale, dtype)


def _all_finite(grads):
    checks = []
    for g in grads:
        if g is None:
            continue
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        checks.append(tf.reduce_all(tf.math.is_finite(values)))
    if not checks:
        return tf.constant(True)
    return tf.reduce_all(tf.stack(checks), name="grads_finite")


# Ops through which a missing gradient is intended, not a sign of a broken graph.
_NO_GRADIENT_OPS = ("StopGradient", "PreventGradient")


def _var_op(var):
    """The op that produces ``var``'s value or handle (variable, resource or table)."""
    op = getattr(var, "op", None)
    if op is None and hasattr(var, "handle"):
        op = var.handle.op
    return op


def _ops_loss_reads(loss):
    """Ops whose outputs reach ``loss`` through data edges, not through stop_gradient."""
    seen = set()
    stack = [loss.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op.type in _NO_GRADIENT_OPS:
            continue
        stack.extend(t.op for t in op.inputs)
    return seen


def _warn_missing_gradients(loss, grads_and_vars):
    """Warns about variables the loss reads but that got no gradient.

    Such a variable is never trained although the model uses it: its value
    reaches the loss only through ops without a gradient (a cast to an integer
    type, ``argmax``, a custom op without a registered gradient, ...).

    Returns:
      The list of those variables.
    """
    missing = [v for g, v in grads_and_vars if g is None]
    if not missing:
        return []
    reads = _ops_loss_reads(loss)
    suspicious = [v for v in missing if _var_op(v) in reads]
    for v in suspicious:
        tf.compat.v1.logging.warning(
            "MixedPrecisionOptimizer: the loss depends on %s but its gradient is None: it "
            "will not be trained. Its value reaches the loss only through ops without a "
            "gradient (an integer cast, argmax, an op with no registered gradient, ...); "
            "use tf.stop_gradient if that is intended, or leave it out of var_list.",
            getattr(v, "name", v),
        )
    return suspicious


class MixedPrecisionOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a ``tf.compat.v1.train.Optimizer`` for switched mixed precision.

    * ``compute_gradients`` multiplies the loss by the step's loss scale (the
      dynamic scale in half-precision steps, 1 in float32 steps) and divides
      the gradients by it (dense and ``IndexedSlices`` alike; gradients are
      cast to their float32 master variable's dtype).
    * ``apply_gradients`` applies them only when the loss and every gradient
      are finite; otherwise the wrapped optimizer is not run at all (no slot
      update, ``global_step`` not incremented). Then it updates the loss scale
      and the switching policy.
    * It counts train-op runs and applied steps (the training health
      counters of :meth:`MixedPrecision.metrics`, watched by
      :class:`MixedPrecisionHealthHook`), and warns at graph-build time about
      variables the loss reads that get no gradient.

    Args:
      optimizer: the optimizer to wrap.
      mixed_precision: the :class:`MixedPrecision` controller.
      name: optional name.

    Raises:
      TypeError: if ``optimizer`` is not a ``tf.compat.v1.train.Optimizer``.
    """

    def __init__(self, optimizer, mixed_precision, name=None):
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise TypeError("optimizer must be a tf.compat.v1.train.Optimizer, got %r" % type(optimizer).__name__)
        super(MixedPrecisionOptimizer, self).__init__(
            use_locking=False, name=name or "MixedPrecision" + optimizer.get_name()
        )
        self._optimizer = optimizer
        self._mp = mixed_precision
        self._loss = None

    @property
    def inner_optimizer(self):
        """The wrapped optimizer."""
        return self._optimizer

    def compute_gradients(self, loss, var_list=None, **kwargs):
        """Scaled-loss gradients, unscaled. Same arguments as the base class.

        Args:
          loss: the float32 loss tensor (not scaled).
          var_list: variables to differentiate (default: trainable variables).
          **kwargs: passed to the wrapped optimizer's ``compute_gradients``.

        Returns:
          A list of (gradient, variable) pairs, gradients in the variables' dtype.
          A variable that the loss reads but that gets no gradient is logged
          as a warning (it would silently never be trained).

        Raises:
          ValueError: if ``loss`` is a callable (eager-style losses are not
            supported in graph mode).
        """
        if callable(loss):
            raise ValueError("callable losses are not supported in graph mode")
        self._loss = loss
        scale = self._mp.effective_loss_scale
        scaled = loss * tf.cast(scale, loss.dtype)
        gvs = self._optimizer.compute_gradients(scaled, var_list=var_list, **kwargs)
        _warn_missing_gradients(loss, gvs)
        inv = tf.math.reciprocal(scale)
        return [(_unscale(g, inv, v.dtype.base_dtype), v) for g, v in gvs]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, loss=None):
        """Applies finite gradients, then updates loss scale and policy.

        Args:
          grads_and_vars: list of (gradient, variable) pairs from
            :meth:`compute_gradients`.
          global_step: optional variable incremented only when applied.
          name: optional op name.
          loss: the step's loss; defaults to the one given to
            :meth:`compute_gradients`.

        Returns:
          An op running the (conditional) update and the state updates.

        Raises:
          ValueError: if no loss is known.
        """
        grads_and_vars = list(grads_and_vars)
        loss = loss if loss is not None else self._loss
        if loss is None:
            raise ValueError("apply_gradients needs the loss: call compute_gradients " "first or pass loss=")
        loss = tf.cast(loss, tf.float32)
        finite = _all_finite([g for g, _ in grads_and_vars])
        ok = tf.logical_and(finite, tf.math.is_finite(loss))

        def _apply():
            op = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
            with tf.control_dependencies([op]):
                return tf.constant(True)

        applied = tf.compat.v1.cond(ok, _apply, lambda: tf.constant(False), name="apply_if_finite")
        with tf.control_dependencies([applied]):
            update = self._mp.update(loss, finite)
        health = self._mp.count_step(applied)
        return tf.group(applied, update, health, name=name or "mixed_precision_train")

    # Slot access and variables delegate to the wrapped optimizer.
    def get_slot(self, var, name):
        """Returns a slot of the wrapped optimizer.

        Args:
          var: the variable the slot was created for.
          name: the slot name (see :meth:`get_slot_names`).

        Returns:
          The slot variable, or None if the wrapped optimizer has no such slot.
        """
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        """Returns the slot names of the wrapped optimizer.

        Returns:
          A list of strings.
        """
        return self._optimizer.get_slot_names()

    def variables(self):
        """Returns the variables of the wrapped optimizer.

        The loss-scale and policy variables belong to the
        :class:`MixedPrecision` controller and are not included.

        Returns:
          A list of variables.
        """
        return self._optimizer.variables()
