"""Dynamic loss scale: reference rules, hysteresis, graph == reference."""

import pytest
import tensorflow as tf

from tensorflow_ext.mixed_precision import loss_scale as L


def reference(cfg, seq):
    state = {"scale": cfg.initial_scale, "good_steps": 0, "budget": cfg.hysteresis}
    out = []
    for grads_finite, loss_finite in seq:
        state = L.reference_loss_scale_step(cfg, state, grads_finite, loss_finite)
        out.append(dict(state))
    return out


def graph(cfg, seq, active=True):
    g = tf.Graph()
    with g.as_default():
        ls = L.DynamicLossScale(cfg)
        gf = tf.compat.v1.placeholder(tf.bool, [])
        lf = tf.compat.v1.placeholder(tf.bool, [])
        act = tf.compat.v1.placeholder(tf.bool, [])
        update = ls.update(gf, lf, active=act)
        read = {
            "scale": ls.scale_var.read_value(),
            "good_steps": ls.good_steps_var.read_value(),
            "budget": ls.budget_var.read_value(),
        }
        out = []
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for grads_finite, loss_finite in seq:
                sess.run(update, {gf: grads_finite, lf: loss_finite, act: active})
                out.append({k: v.item() for k, v in sess.run(read).items()})
    return out


def test_defaults_are_tf1s():
    cfg = L.LossScaleConfig()
    assert cfg.initial_scale == 2.0**15 and cfg.growth_interval == 2000
    assert cfg.hysteresis == 2 and cfg.min_scale == 1.0


def test_hysteresis_backoff_and_growth_exact():
    cfg = L.LossScaleConfig(initial_scale=64.0, growth_interval=3, hysteresis=2, min_scale=8.0, max_scale=256.0)
    T, F = (True, True), (False, True)
    seq = [F, F, F, T, T, T, F, F, F, F, T, T, T, T, T, T, T, T, T, T, T, T]
    scales = [s["scale"] for s in reference(cfg, seq)]
    # 1st overflow tolerated (budget 2->1), then halvings; growth every 3 good
    # steps refills the budget; floor 8, cap 256.
    assert scales == [64, 32, 16, 16, 16, 32, 32, 16, 8, 8, 8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 64, 128]
    assert graph(cfg, seq) == reference(cfg, seq)


def test_forward_overflow_leaves_scale_alone():
    cfg = L.LossScaleConfig(initial_scale=64.0, hysteresis=1)
    seq = [(False, False)] * 3 + [(False, True)]
    ref = reference(cfg, seq)
    assert [s["scale"] for s in ref] == [64, 64, 64, 32]
    assert graph(cfg, seq) == ref


def test_inactive_and_fixed_scale_do_not_change():
    cfg = L.LossScaleConfig(initial_scale=64.0, hysteresis=1, growth_interval=1)
    seq = [(False, True), (True, True)]
    assert [s["scale"] for s in graph(cfg, seq, active=False)] == [64, 64]
    fixed = L.LossScaleConfig(initial_scale=4.0, dynamic=False)
    assert [s["scale"] for s in reference(fixed, seq)] == [4, 4]
    assert [s["scale"] for s in graph(fixed, seq)] == [4, 4]


def test_validation():
    with pytest.raises(ValueError):
        L.LossScaleConfig(hysteresis=0)
    with pytest.raises(ValueError):
        L.LossScaleConfig(backoff_factor=2.0)
