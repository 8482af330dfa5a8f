"""Session-run hooks: logging of the mixed-precision state and the training health check."""

import math
import numbers

import numpy as np
import tensorflow as tf

from tensorflow_ext.mixed_precision import policy as policy_lib

__all__ = ["MixedPrecisionHealthHook", "MixedPrecisionLoggingHook", "NoTrainingProgressError"]

_KEYS = (
    "precision",
    "loss_scale",
    "num_switches",
    "half_fraction",
    "overflow_rate",
    "total_steps",
    "attempted_steps",
    "applied_steps",
    "skipped_streak",
    "applied_step_ratio",
)
_HEALTH_KEYS = ("attempted_steps", "applied_steps", "skipped_streak", "precision", "loss_scale", "overflow_rate")


class NoTrainingProgressError(RuntimeError):
    """Raised by :class:`MixedPrecisionHealthHook` when no training step is applied.

    Attributes:
      skipped_steps: train-op runs in a row without an applied update.
      attempted_steps: train-op runs so far.
      applied_steps: applied steps so far.
    """

    def __init__(self, message, skipped_steps=0, attempted_steps=0, applied_steps=0):
        super(NoTrainingProgressError, self).__init__(message)
        self.skipped_steps = int(skipped_steps)
        self.attempted_steps = int(attempted_steps)
        self.applied_steps = int(applied_steps)


def _count_argument(hook, name, value):
    """`value` as an int >= 1, or an error naming the argument (NaN, strings, None, 2.5, True are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            "%s(%s=%r): %s must be an integer >= 1 (a number of train-op runs), got a %s"
            % (hook, name, value, name, type(value).__name__)
        )
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif math.isfinite(value) and float(value).is_integer():
        value = int(value)  # 100.0 or 1e3
    else:
        raise ValueError(
            "%s(%s=%r): %s must be an integer >= 1 (a number of train-op runs), got %r"
            % (hook, name, value, name, value)
        )
    if value < 1:
        raise ValueError("%s(%s=%r): %s must be >= 1, got %r" % (hook, name, value, name, value))
    return value


def _callable_argument(hook, name, value):
    if value is not None and not callable(value):
        raise TypeError(
            "%s(%s=%r): %s must be a callable(str) or None, got a %s" % (hook, name, value, name, type(value).__name__)
        )
    return value


def _precision_name(mp, value):
    return mp.half_dtype.name if value >= 1 else "float32"


def _no_progress_message(mp, skipped, values):
    return (
        "mixed_precision: no training step applied in the last %d steps (%d of %d train-op "
        "runs applied so far; precision=%s loss_scale=%g overflow_rate=%.3f). Every step is "
        "skipped (non-finite loss or gradients) or its update never runs (a dead branch of "
        "the graph): the model is not training."
        % (
            skipped,
            values["applied_steps"],
            values["attempted_steps"],
            _precision_name(mp, values["precision"]),
            values["loss_scale"],
            values["overflow_rate"],
        )
    )


class MixedPrecisionLoggingHook(tf.compat.v1.train.SessionRunHook):
    """Logs the mixed-precision state, every switch, and runs that train nothing.

    * Every ``every_n_iter`` runs it reads the state *after* the step (one
      small extra ``session.run`` of scalar reads) and logs a line such as
      ``mixed_precision: step=200 precision=float16 loss_scale=32768
      num_switches=2 half_fraction=0.850 overflow_rate=0.000 applied=100/100``
      (``applied``: steps applied / train-op runs since the previous line),
      followed by the values of ``tensors``, fetched with that step.
    * If none of the train-op runs since the previous line applied an update,
      it logs an error through ``error_fn``: ``mixed_precision: no training
      step applied in the last N steps ...``. If steps were applied but
      ``global_step`` did not move, it logs a warning that ``global_step`` was
      not passed to ``minimize`` / ``apply_gradients``.
    * It logs every precision switch when it happens (``mixed_precision:
      switch after step 11: float16 -> float32 (overflow)``) and keeps them in
      :attr:`switches`. The reason of a switch to float32 is the policy's
      (``overflow``, ``spike``, ``divergence``); a return to half precision
      has reason ``stable``. This costs no extra ``session.run``: the state
      the step started from is fetched with it (:meth:`MixedPrecision.step_start`).

    Works with ``MonitoredTrainingSession(hooks=...)`` and as an Estimator
    training hook.

    Args:
      mixed_precision: the :class:`MixedPrecision` controller (its graph must be
        the one the session runs).
      every_n_iter: log every N runs (>= 1).
      log_fn: callable(str); default ``tf.compat.v1.logging.info``.
      tensors: optional dict name -> scalar tensor (e.g. the loss) fetched with
        every N-th step and appended to its line as ``name=value``.
      error_fn: callable(str) for the no-progress error; default
        ``tf.compat.v1.logging.error``. The ``global_step`` warning goes to
        ``tf.compat.v1.logging.warning``.

    Attributes:
      last_values: dict of the last logged values (None before the first log),
        including ``applied_in_interval`` and ``attempted_in_interval``.
      switches: list of dicts ``{"step", "from", "to", "reason"}``, one per
        switch seen (``step``: steps completed when it switched).
      errors: list of the error messages logged.

    Raises:
      ValueError: if ``every_n_iter`` is not an integer >= 1 (NaN, 2.5, 0) or
        ``tensors`` is not a dict.
      TypeError: if ``every_n_iter`` is not a number (a string, None) or
        ``log_fn`` / ``error_fn`` is not callable.
    """

    def __init__(self, mixed_precision, every_n_iter=100, log_fn=None, tensors=None, error_fn=None):
        every_n_iter = _count_argument("MixedPrecisionLoggingHook", "every_n_iter", every_n_iter)
        _callable_argument("MixedPrecisionLoggingHook", "log_fn", log_fn)
        _callable_argument("MixedPrecisionLoggingHook", "error_fn", error_fn)
        if tensors is not None and not isinstance(tensors, dict):
            raise ValueError("tensors must be a dict name -> tensor, got %r" % type(tensors).__name__)
        self._mp = mixed_precision
        self._every = every_n_iter
        self._log_fn = log_fn or tf.compat.v1.logging.info
        self._error_fn = error_fn or tf.compat.v1.logging.error
        self._tensors = dict(tensors or {})
        self._iter = 0
        self._metrics = None
        self._global_step = None
        self._step_start = None
        self._previous = None
        self._last_precision = None
        self.last_values = None
        self.switches = []
        self.errors = []

    def begin(self):
        """Collects the tensors to read and resets the run counter.

        Called once before the graph is finalized.
        """
        self._metrics = {k: v for k, v in self._mp.metrics().items() if k in _KEYS}
        self._global_step = tf.compat.v1.train.get_global_step()
        self._step_start = self._mp.step_start()
        self._iter = 0
        self._previous = None
        self._last_precision = None

    def after_create_session(self, session, coord):
        """Reads the counters the first interval is measured from.

        Args:
          session: the new ``tf.compat.v1.Session``.
          coord: the coordinator (unused).
        """
        del coord
        self._previous = session.run(self._counters())

    def _counters(self):
        fetches = {k: self._metrics[k] for k in ("attempted_steps", "applied_steps")}
        if self._global_step is not None:
            fetches["global_step"] = self._global_step
        return fetches

    def before_run(self, run_context):
        """Fetches the state the step starts from, and ``tensors`` on logging steps.

        Args:
          run_context: the ``tf.compat.v1.train.SessionRunContext``.

        Returns:
          ``tf.compat.v1.train.SessionRunArgs``.
        """
        fetches = {"start": self._step_start}
        if self._tensors and (self._iter + 1) % self._every == 0:
            fetches["tensors"] = self._tensors
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        """Records switches; every ``every_n_iter`` runs, reads the state and logs.

        Args:
          run_context: the ``tf.compat.v1.train.SessionRunContext``; its
            session is used for the extra read.
          run_values: the ``tf.compat.v1.train.SessionRunValues``.
        """
        self._iter += 1
        self._record_switch(run_values.results["start"])
        if self._iter % self._every:
            return
        fetches = dict(self._metrics)
        if self._global_step is not None:
            fetches["global_step"] = self._global_step
        values = run_context.session.run(fetches)
        counters = {
            k: values.pop(k) if k == "global_step" else values[k]
            for k in ("attempted_steps", "applied_steps", "global_step")
            if k in values
        }
        previous = self._previous or {k: 0 for k in counters}
        attempted = counters["attempted_steps"] - previous["attempted_steps"]
        applied = counters["applied_steps"] - previous["applied_steps"]
        self._previous = counters
        values["attempted_in_interval"] = attempted
        values["applied_in_interval"] = applied
        extra = run_values.results.get("tensors") or {}
        values.update(extra)
        self.last_values = values
        line = (
            "mixed_precision: step=%d precision=%s loss_scale=%g num_switches=%d "
            "half_fraction=%.3f overflow_rate=%.3f applied=%d/%d"
            % (
                values["total_steps"],
                _precision_name(self._mp, values["precision"]),
                values["loss_scale"],
                values["num_switches"],
                values["half_fraction"],
                values["overflow_rate"],
                applied,
                attempted,
            )
        )
        for name in sorted(extra):
            line += " %s=%s" % (name, _format(extra[name]))
        self._log_fn(line)
        if attempted > 0 and applied == 0:
            message = _no_progress_message(self._mp, int(values["skipped_streak"]), values)
            self.errors.append(message)
            self._error_fn(message)
        elif applied > 0 and "global_step" in counters and counters["global_step"] == previous.get("global_step"):
            tf.compat.v1.logging.warning(
                "mixed_precision: %d steps were applied but global_step did not advance: "
                "pass global_step= to minimize() / apply_gradients()",
                applied,
            )

    def _record_switch(self, start):
        precision = int(start["precision"])
        last = self._last_precision
        self._last_precision = precision
        if last is None or last == precision:
            return
        reason = (
            policy_lib.REASONS.get(int(start["last_reason"]), "unknown") if precision == policy_lib.FULL else "stable"
        )
        record = {
            "step": int(start["total_steps"]),
            "from": _precision_name(self._mp, last),
            "to": _precision_name(self._mp, precision),
            "reason": reason,
        }
        self.switches.append(record)
        self._log_fn(
            "mixed_precision: switch after step %d: %s -> %s (%s)"
            % (record["step"], record["from"], record["to"], reason)
        )


def _format(value):
    try:
        return "%.6g" % value
    except TypeError:
        return str(value)


class MixedPrecisionHealthHook(tf.compat.v1.train.SessionRunHook):
    """Stops a run in which no training step is applied any more.

    Every ``every_n_iter`` runs it reads the training health counters of the
    :class:`MixedPrecisionOptimizer` after the step (one small extra
    ``session.run``). When ``max_skipped_steps`` or more train-op runs in a
    row applied no update -- every step skipped for a non-finite loss or
    gradient, or the step's update never running at all -- it raises
    :class:`NoTrainingProgressError` (``raise_error=True``) or logs the error
    once per such stretch.

    A healthy run skips a few steps now and then (loss-scale search, a rare
    overflow; a switch to float32 needs about 11 non-finite steps in a row by
    default), far fewer in a row than the default of 100.

    Args:
      mixed_precision: the :class:`MixedPrecision` controller.
      max_skipped_steps: train-op runs in a row without an applied update that
        fail the run (>= 1).
      every_n_iter: check every N runs (>= 1).
      raise_error: raise (True) or only log through ``error_fn`` (False).
      error_fn: callable(str); default ``tf.compat.v1.logging.error``.

    Attributes:
      errors: list of the error messages (raised or logged).

    Raises:
      ValueError: if ``max_skipped_steps`` or ``every_n_iter`` is not an
        integer >= 1 (NaN, 2.5, 0).
      TypeError: if ``max_skipped_steps`` or ``every_n_iter`` is not a number
        (a string, None), ``raise_error`` is not a bool, or ``error_fn`` is not
        callable.
    """

    def __init__(self, mixed_precision, max_skipped_steps=100, every_n_iter=10, raise_error=True, error_fn=None):
        max_skipped_steps = _count_argument("MixedPrecisionHealthHook", "max_skipped_steps", max_skipped_steps)
        every_n_iter = _count_argument("MixedPrecisionHealthHook", "every_n_iter", every_n_iter)
        if not isinstance(raise_error, (bool, np.bool_)):
            raise TypeError(
                "MixedPrecisionHealthHook(raise_error=%r): raise_error must be True (raise NoTrainingProgressError) "
                "or False (only log the error), got a %s" % (raise_error, type(raise_error).__name__)
            )
        _callable_argument("MixedPrecisionHealthHook", "error_fn", error_fn)
        self._mp = mixed_precision
        self._max = max_skipped_steps
        self._every = every_n_iter
        self._raise = bool(raise_error)
        self._error_fn = error_fn or tf.compat.v1.logging.error
        self._iter = 0
        self._metrics = None
        self._reported = False
        self.errors = []

    def begin(self):
        """Collects the counters to read. Called before the graph is finalized."""
        self._metrics = {k: v for k, v in self._mp.metrics().items() if k in _HEALTH_KEYS}
        self._iter = 0
        self._reported = False

    def after_run(self, run_context, run_values):
        """Every ``every_n_iter`` runs, checks the skipped-step streak.

        Args:
          run_context: the ``tf.compat.v1.train.SessionRunContext``.
          run_values: the ``tf.compat.v1.train.SessionRunValues`` (unused).

        Raises:
          NoTrainingProgressError: with ``raise_error``, when the streak reaches
            ``max_skipped_steps``.
        """
        del run_values
        self._iter += 1
        if self._iter % self._every:
            return
        values = run_context.session.run(self._metrics)
        skipped = int(values["skipped_streak"])
        if skipped < self._max:
            self._reported = False
            return
        message = _no_progress_message(self._mp, skipped, values)
        if self._raise:
            self.errors.append(message)
            raise NoTrainingProgressError(message, skipped, values["attempted_steps"], values["applied_steps"])
        if not self._reported:
            self._reported = True
            self.errors.append(message)
            self._error_fn(message)
