"""Training health: runs in which no step is applied are reported, never silent."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import control_flow_ops

from tensorflow_ext import mixed_precision as mp

FAST = mp.PolicyConfig(overflow_decay=0.0, max_overflow_rate=0.5, min_full_steps=3, stable_steps=3, warmup_steps=1000)


def _net(x):
    h = tf.compat.v1.layers.dense(x, 4, tf.nn.relu, name="h")
    out = tf.compat.v1.layers.dense(h, 1, name="out")
    return tf.reduce_mean(tf.square(tf.cast(out, tf.float32) - 1.0))


def _build(mode="auto", broken=None, poison_at=(), policy=FAST):
    """A small model; ``broken``: "overflow" (loss inf every step) or "dead"
    (the loss goes through a Switch branch that never runs, so the step's
    update never runs: what a dead gradient does to a train op)."""
    tf.compat.v1.set_random_seed(0)
    amp = mp.MixedPrecision(mode=mode, policy=policy, loss_scale=mp.LossScaleConfig(initial_scale=1.0, dynamic=False))
    loss = amp.build(_net, tf.ones([8, 3]))
    if broken == "overflow":
        loss = loss * tf.constant(np.inf)
    elif broken == "dead":
        loss = control_flow_ops.switch(loss, tf.constant(False))[1]
    if poison_at:
        total = amp.policy.variables["total_steps"].read_value()
        bad = tf.reduce_any(tf.equal(total, tf.constant(list(poison_at), tf.int64)))
        loss = loss * tf.where(bad, tf.constant(np.inf), tf.constant(1.0))
    gs = tf.compat.v1.train.get_or_create_global_step()
    train = amp.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(0.01)).minimize(loss, global_step=gs)
    return amp, train, gs


def _run(amp, train, steps, hooks):
    errors = None
    with tf.compat.v1.train.SingularMonitoredSession(hooks=hooks) as sess:
        try:
            for _ in range(steps):
                sess.run(train)
        except mp.NoTrainingProgressError as e:
            errors = e
        metrics = sess.raw_session().run(amp.metrics())
    return errors, metrics


@pytest.mark.parametrize("broken", ["overflow", "dead"])
def test_health_hook_raises_when_no_step_is_applied(broken):
    with tf.Graph().as_default():
        amp, train, gs = _build(mode="half" if broken == "overflow" else "float32", broken=broken)
        logged = []
        hooks = [
            amp.health_hook(max_skipped_steps=6, every_n_iter=2),
            amp.logging_hook(every_n_iter=4, log_fn=lambda s: None, error_fn=logged.append),
        ]
        err, m = _run(amp, train, 50, hooks)
    assert isinstance(err, mp.NoTrainingProgressError) and isinstance(err, RuntimeError)
    assert err.skipped_steps == 6 and err.attempted_steps == 6 and err.applied_steps == 0
    assert "no training step applied in the last 6 steps" in str(err)
    assert m["attempted_steps"] == 6 and m["applied_steps"] == 0
    assert m["skipped_streak"] == 6 and m["applied_step_ratio"] == 0.0
    # The logging hook said so too, at its first line (after 4 runs).
    assert len(logged) == 1 and "no training step applied in the last 4 steps" in logged[0]
    if broken == "dead":
        # The policy update is dead as well: only the health counter moved.
        assert m["total_steps"] == 0


def test_health_hook_can_log_instead_of_raising():
    with tf.Graph().as_default():
        amp, train, _ = _build(mode="half", broken="overflow")
        logged = []
        hook = amp.health_hook(max_skipped_steps=3, every_n_iter=1, raise_error=False, error_fn=logged.append)
        err, m = _run(amp, train, 10, [hook])
    assert err is None and m["attempted_steps"] == 10
    # Logged once for the stretch, not on every check.
    assert len(logged) == 1 and hook.errors == logged
    assert "no training step applied in the last 3 steps" in logged[0]


def test_healthy_runs_are_not_flagged():
    with tf.Graph().as_default():
        # Two isolated skipped steps (a switch to float32 and back) are normal.
        amp, train, gs = _build(poison_at=(2, 9))
        logged = []
        health = amp.health_hook(max_skipped_steps=2, every_n_iter=1)
        log = amp.logging_hook(every_n_iter=5, log_fn=lambda s: None, error_fn=logged.append)
        err, m = _run(amp, train, 20, [health, log])
    assert err is None and health.errors == [] and logged == [] and log.errors == []
    assert m["attempted_steps"] == 20 and m["applied_steps"] == 18
    assert m["skipped_streak"] == 0
    np.testing.assert_allclose(m["applied_step_ratio"], 0.9)


def test_health_hook_rejects_bad_arguments():
    with tf.Graph().as_default():
        amp = mp.MixedPrecision()
        with pytest.raises(ValueError, match="max_skipped_steps"):
            amp.health_hook(max_skipped_steps=0)
        with pytest.raises(ValueError, match="every_n_iter"):
            amp.health_hook(every_n_iter=0)
        with pytest.raises(ValueError, match="tensors"):
            amp.logging_hook(tensors=[1])


@pytest.mark.parametrize(
    "value, error",
    [
        (float("nan"), ValueError),
        (np.float32("nan"), ValueError),
        (float("inf"), ValueError),
        (2.5, ValueError),
        (-3, ValueError),
        ("100", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
@pytest.mark.parametrize("argument", ["max_skipped_steps", "every_n_iter"])
def test_health_hook_names_a_bad_limit(argument, value, error):
    with tf.Graph().as_default():
        amp = mp.MixedPrecision()
        with pytest.raises(error, match="MixedPrecisionHealthHook\\(%s=.*%s must be" % (argument, argument)):
            amp.health_hook(**{argument: value})
        with pytest.raises(error, match="MixedPrecisionHealthHook\\(%s=" % argument):
            mp.MixedPrecisionHealthHook(amp, **{argument: value})
        if argument == "every_n_iter":
            with pytest.raises(error, match="MixedPrecisionLoggingHook\\(every_n_iter="):
                amp.logging_hook(every_n_iter=value)


def test_health_hook_checks_its_other_arguments():
    with tf.Graph().as_default():
        amp = mp.MixedPrecision()
        with pytest.raises(TypeError, match="raise_error must be True"):
            amp.health_hook(raise_error="no")
        with pytest.raises(TypeError, match="error_fn must be a callable"):
            amp.health_hook(error_fn="log")
        with pytest.raises(TypeError, match="log_fn must be a callable"):
            amp.logging_hook(log_fn="print")
        # Integral numbers of any type are accepted.
        hook = amp.health_hook(max_skipped_steps=np.int64(7), every_n_iter=1e1)
        assert hook._max == 7 and hook._every == 10  # pylint: disable=protected-access


class _Capture(logging.Handler):
    def __init__(self):
        super(_Capture, self).__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def tf_warnings():
    logger = tf.get_logger()
    handler = _Capture()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_warns_about_variables_the_loss_reads_without_gradient(tf_warnings):
    with tf.Graph().as_default():
        amp = mp.MixedPrecision()

        def fn(x):
            w = tf.compat.v1.get_variable("w", [3, 1])
            # Read only through an integer cast: no gradient, never trained.
            bucket = tf.compat.v1.get_variable("bucket", [1], initializer=tf.ones_initializer())
            frozen = tf.compat.v1.get_variable("frozen", [1])
            tf.compat.v1.get_variable("unused", [1])
            scale = tf.cast(tf.cast(bucket * 3.0, tf.int32), x.dtype)
            return tf.reduce_sum(tf.matmul(x, w)) * scale + tf.stop_gradient(frozen[0])

        loss = amp.build(fn, tf.ones([2, 3]))
        gvs = amp.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).compute_gradients(loss)
    none = sorted(v.op.name for g, v in gvs if g is None)
    assert none == ["bucket", "frozen", "unused"]
    flagged = [m for m in tf_warnings if "gradient is None" in m]
    # stop_gradient is intended and "unused" is not read: only "bucket".
    assert len(flagged) == 1 and "bucket:0" in flagged[0]


def test_logging_hook_warns_when_global_step_does_not_move(tf_warnings):
    with tf.Graph().as_default():
        amp = mp.MixedPrecision(mode="float32")
        loss = amp.build(_net, tf.ones([8, 3]))
        tf.compat.v1.train.get_or_create_global_step()
        train = amp.wrap_optimizer(tf.compat.v1.train.AdamOptimizer(0.01)).minimize(loss)
        hook = amp.logging_hook(every_n_iter=3, log_fn=lambda s: None)
        err, m = _run(amp, train, 3, [hook])
    assert err is None and m["applied_steps"] == 3
    assert any("global_step did not advance" in w for w in tf_warnings)
