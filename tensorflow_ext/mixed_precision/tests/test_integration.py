"""Checkpoints, MonitoredTrainingSession, Estimator, summaries and the hook."""

import glob
import os

import numpy as np
import tensorflow as tf

from tensorflow_ext import mixed_precision as mp

# Fast-switching policy for short runs: one non-finite step leaves half
# precision, 3 stable float32 steps return to it.
FAST = mp.PolicyConfig(overflow_decay=0.0, max_overflow_rate=0.5, min_full_steps=3, stable_steps=3, warmup_steps=1000)
NO_SCALING = mp.LossScaleConfig(initial_scale=1.0, dynamic=False)


def _net(x, poison):
    h = tf.compat.v1.layers.dense(x, 4, tf.nn.relu, name="h")
    out = tf.compat.v1.layers.dense(h, 1, name="out")
    return tf.reduce_mean(tf.square(out)) * poison


def _build(poison_fn):
    """Model whose loss is inf on steps where poison_fn(global_step) says so."""
    tf.compat.v1.set_random_seed(0)
    amp = mp.MixedPrecision(policy=FAST, loss_scale=NO_SCALING)
    gs = tf.compat.v1.train.get_or_create_global_step()
    x = tf.ones([8, 3])
    poison = poison_fn(amp.policy.variables["total_steps"].read_value())
    loss = amp.build(_net, x, poison)
    train = amp.wrap_optimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss, global_step=gs)
    return amp, loss, train, gs


def _poison_at(steps):
    def fn(total):
        bad = tf.reduce_any(tf.equal(total, tf.constant(steps, tf.int64)))
        return tf.where(bad, tf.constant(np.inf), tf.constant(1.0))

    return fn


def test_saver_restores_policy_and_loss_scale(tmp_path):
    path = str(tmp_path / "ckpt")
    with tf.Graph().as_default():
        amp, _, train, _ = _build(_poison_at([1]))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            sess.run(amp.policy.variables["loss_mean"].assign(3.5))
            sess.run(amp.loss_scale.scale_var.assign(64.0))
            saved = sess.run(amp.policy.read())
            saver.save(sess, path)
    assert saved["precision"] == mp.FULL and saved["num_switches"] == 1
    with tf.Graph().as_default():
        amp, _, _, _ = _build(_poison_at([1]))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, path)
            restored = sess.run(amp.policy.read())
            assert sess.run(amp.loss_scale.read()) == 64.0
    assert restored == saved


def test_monitored_training_session_hook_summaries_and_resume(tmp_path):
    ckpt = str(tmp_path / "mts")
    logs = []
    with tf.Graph().as_default():
        amp, _, train, gs = _build(_poison_at([2]))
        amp.add_summaries()
        hook = amp.logging_hook(every_n_iter=5, log_fn=logs.append)
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=ckpt,
            hooks=[hook],
            save_summaries_steps=1,
            save_checkpoint_steps=1000,
            save_checkpoint_secs=None,
            log_step_count_steps=None,
        ) as sess:
            for _ in range(10):
                sess.run(train)
            assert sess.run(gs) == 9  # the poisoned step was skipped
        # 1 step half, step 3 poisoned -> fp32 for 3 steps, back to half at step 6.
        assert hook.last_values["num_switches"] == 2
        assert hook.last_values["precision"] == 1.0
        assert abs(hook.last_values["half_fraction"] - 0.7) < 1e-6
        lines = [l for l in logs if "step=" in l]
        assert len(lines) == 2 and "num_switches=2" in lines[-1] and "float16" in lines[-1]
        # The poisoned step 3 was skipped: 4 of the first 5 runs applied.
        assert "applied=4/5" in lines[0] and "applied=5/5" in lines[1]
        # Each switch is logged and recorded when it happens.
        assert hook.switches == [
            {"step": 3, "from": "float16", "to": "float32", "reason": "overflow"},
            {"step": 6, "from": "float32", "to": "float16", "reason": "stable"},
        ]
        assert [l for l in logs if "switch after" in l] == [
            "mixed_precision: switch after step 3: float16 -> float32 (overflow)",
            "mixed_precision: switch after step 6: float32 -> float16 (stable)",
        ]
        assert hook.errors == []
    events = glob.glob(os.path.join(ckpt, "events.out.tfevents.*"))
    tags = set()
    for path in events:
        for e in tf.compat.v1.train.summary_iterator(path):
            for v in e.summary.value:
                tags.add(v.tag)
    assert {
        "mixed_precision/precision",
        "mixed_precision/loss_scale",
        "mixed_precision/num_switches",
        "mixed_precision/half_fraction",
        "mixed_precision/applied_step_ratio",
        "mixed_precision/skipped_streak",
    } <= tags
    # Resume: the restored policy continues from the checkpointed counters.
    with tf.Graph().as_default():
        amp, _, train, gs = _build(_poison_at([]))
        metrics = amp.metrics()
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=ckpt, save_checkpoint_secs=None, save_summaries_steps=None
        ) as sess:
            assert sess.run(gs) == 9
            assert sess.run(metrics["total_steps"]) == 10
            assert sess.run(metrics["num_switches"]) == 2


_ESTIMATOR_LOGS = []  # Estimator deep-copies params: log through a module list


def _model_fn(features, labels, mode, params):
    amp = mp.MixedPrecision(policy=FAST)
    loss = amp.build(
        lambda x, y: tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(x, 1, name="out") - y)), features["x"], labels
    )
    if mode != tf.estimator.ModeKeys.TRAIN:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    opt = amp.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    amp.add_summaries()
    return tf.estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=train_op,
        training_hooks=[amp.logging_hook(every_n_iter=2, log_fn=_ESTIMATOR_LOGS.append)],
    )


def test_estimator_trains_evaluates_and_restores_state(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.randn(64, 2).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0]], np.float32)).astype(np.float32)

    def input_fn():
        ds = tf.compat.v1.data.Dataset.from_tensor_slices(({"x": x}, y))
        return ds.repeat().batch(16)

    del _ESTIMATOR_LOGS[:]
    config = tf.estimator.RunConfig(model_dir=str(tmp_path), save_summary_steps=2, log_step_count_steps=1000)
    est = tf.estimator.Estimator(_model_fn, config=config)
    est.train(input_fn, steps=6)
    first = est.get_variable_value("mixed_precision/policy/total_steps")
    est.train(input_fn, steps=4)
    total = est.get_variable_value("mixed_precision/policy/total_steps")
    # Loss-scale overflows (scale 2^15 at start) are skipped steps: they run
    # but do not count in global_step; the policy state is restored and goes on.
    assert est.get_variable_value("global_step") == 10
    assert first >= 6 and total >= first + 4
    assert est.get_variable_value("mixed_precision/policy/half_steps") == total
    assert est.get_variable_value("mixed_precision/policy/num_switches") == 0
    loss = est.evaluate(input_fn, steps=2)["loss"]
    assert np.isfinite(loss) and loss < float(np.mean(y**2))
    assert _ESTIMATOR_LOGS and "precision=float16" in _ESTIMATOR_LOGS[-1]
    tags = set()
    for path in glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*")):
        for e in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in e.summary.value)
    assert "mixed_precision/half_fraction" in tags and "mixed_precision/loss_scale" in tags
