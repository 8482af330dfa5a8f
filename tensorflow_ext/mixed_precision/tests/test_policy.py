"""The switching policy: exact switches on fixed sequences, Python == graph."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.mixed_precision import policy as P


def run_reference(cfg, seq, precision=P.HALF):
    state = P.initial_state(cfg, precision)
    states = []
    for loss, finite in seq:
        state = P.reference_step(cfg, state, loss, finite)
        states.append(state)
    return states


class GraphPolicy(object):
    """graph_step fed through placeholders, one session for many steps."""

    def __init__(self, cfg):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.ph = {k: tf.compat.v1.placeholder(d, []) for k, d in P.STATE_FIELDS.items()}
            self.loss = tf.compat.v1.placeholder(tf.float32, [])
            self.finite = tf.compat.v1.placeholder(tf.bool, [])
            self.out = P.graph_step(cfg, self.ph, self.loss, self.finite)
        self.sess = tf.compat.v1.Session(graph=self.graph)
        self.cfg = cfg

    def run(self, seq, precision=P.HALF):
        state = P.initial_state(self.cfg, precision)
        states = []
        for loss, finite in seq:
            feed = {self.ph[k]: v for k, v in state.items()}
            feed[self.loss] = loss
            feed[self.finite] = finite
            state = {k: v.item() for k, v in self.sess.run(self.out, feed).items()}
            states.append(state)
        return states


def switches(states, initial=P.HALF):
    """1-based step indices at whose end the precision changed."""
    out, prev = [], initial
    for i, s in enumerate(states, 1):
        if s["precision"] != prev:
            out.append(i)
        prev = s["precision"]
    return out


def both(cfg, seq, precision=P.HALF):
    ref = run_reference(cfg, seq, precision)
    graph = GraphPolicy(cfg).run(seq, precision)
    assert_agree(ref, graph)
    return ref


def assert_agree(ref, graph):
    assert len(ref) == len(graph)
    for i, (a, b) in enumerate(zip(ref, graph)):
        for k in P.STATE_FIELDS:
            if P.STATE_FIELDS[k] == tf.float32:
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (i, k, a, b)
            else:
                assert a[k] == b[k], (i, k, a, b)


def test_overflow_rate_defaults_switch_and_return():
    cfg = P.PolicyConfig()
    # 1 - 0.99**10 = 0.0956 <= 0.1 < 1 - 0.99**11 = 0.1047: the 11th overflow
    # in a row switches; then exactly max(K, M) = 100 stable float32 steps.
    seq = [(float("inf"), False)] * 11 + [(1.0, True)] * 150
    states = both(cfg, seq)
    assert switches(states) == [11, 111]
    assert states[10]["last_reason"] == 1
    assert states[-1]["num_switches"] == 2
    assert states[-1]["half_steps"] == 11 + 50
    assert states[-1]["total_steps"] == 161
    assert states[-1]["overflow_rate"] == 0.0  # cleared on return to half


def test_startup_loss_scale_search_does_not_switch():
    # Seven overflows in a row (loss-scale search from 2^15) stay below 0.1.
    cfg = P.PolicyConfig()
    seq = [(1.0, False)] * 7 + [(1.0, True)] * 50
    assert switches(both(cfg, seq)) == []


def test_spike_switches_after_warmup_only():
    cfg = P.PolicyConfig(warmup_steps=20)
    flat = [(1.0 + 0.01 * (i % 2), True) for i in range(30)]
    # A spike during warm-up (step 5) is ignored; one at step 31 switches.
    seq = flat[:4] + [(50.0, True)] + flat[5:] + [(50.0, True)] + [(1.0, True)] * 5
    states = both(cfg, seq)
    assert switches(states) == [31]
    assert states[30]["last_reason"] == 2


def test_small_change_of_flat_loss_is_not_a_spike():
    cfg = P.PolicyConfig(warmup_steps=5)
    seq = [(1.0, True)] * 20 + [(1.05, True)] + [(1.0, True)] * 5  # 5% < 6 * 1%
    assert switches(both(cfg, seq)) == []


def test_divergence_of_trend():
    cfg = P.PolicyConfig(
        warmup_steps=3,
        spike_zscore=1e9,
        fast_decay=0.0,
        slow_decay=0.5,
        divergence_threshold=0.2,
        divergence_patience=3,
    )
    # After 3 flat losses, the loss doubles each step: gap fast-slow exceeds
    # 0.2*|slow| at steps 4, 5, 6 (0.5 > 0.3, 1.25 > 0.55, 2.625 > 1.075).
    seq = [(1.0, True)] * 3 + [(2.0**k, True) for k in range(1, 6)]
    states = both(cfg, seq)
    assert switches(states) == [6]
    assert states[5]["last_reason"] == 3
    assert [s["divergence_streak"] for s in states[:6]] == [0, 0, 0, 1, 2, 3]


def test_hysteresis_dwell_doubles_on_relapse_and_resets():
    cfg = P.PolicyConfig(
        overflow_decay=0.0, max_overflow_rate=0.5, min_full_steps=3, stable_steps=2, relapse_window=5, warmup_steps=1000
    )
    bad, good = (float("nan"), False), (1.0, True)
    seq = (
        [bad]
        + [good] * 3  # 1: to fp32 (dwell 3), 4: back to half
        + [bad]
        + [good] * 6  # 5: relapse -> dwell 6, 11: back
        + [good] * 6
        + [bad]  # 18: after 7 half steps -> dwell reset to 3
        + [good, bad, good, good]  # 20: unstable in fp32 resets the streak
        + [good] * 3
    )
    states = both(cfg, seq)
    assert switches(states) == [1, 4, 5, 11, 18, 22]
    assert [states[i - 1]["dwell"] for i in (1, 5, 18)] == [3, 6, 3]


def test_starts_in_float32_and_moves_to_half():
    cfg = P.PolicyConfig(min_full_steps=10, stable_steps=5)
    states = both(cfg, [(1.0, True)] * 12, precision=P.FULL)
    assert switches(states, initial=P.FULL) == [10]


def test_reference_and_graph_agree_on_random_sequences():
    cfg = P.PolicyConfig(
        warmup_steps=10,
        min_full_steps=15,
        stable_steps=8,
        spike_zscore=3.0,
        divergence_patience=4,
        relapse_window=40,
        overflow_decay=0.8,
        max_overflow_rate=0.3,
    )
    rng = np.random.RandomState(0)
    seq, level = [], 5.0
    for i in range(500):
        level *= math.exp(rng.normal(0.0, 0.05) + (0.08 if (i // 60) % 3 == 2 else -0.01))
        loss = level * (1.0 + 0.1 * rng.randn()) * (8.0 if rng.rand() < 0.03 else 1.0)
        finite = rng.rand() > (0.3 if (i // 50) % 4 == 1 else 0.02)
        seq.append((float(np.float32(loss)) if finite else float("inf"), bool(finite)))
    states = both(cfg, seq)
    reasons = {s["last_reason"] for s in states}
    assert len(switches(states)) >= 6 and reasons >= {1, 2}


def test_config_validation():
    with pytest.raises(ValueError):
        P.PolicyConfig(overflow_decay=1.0)
    with pytest.raises(ValueError):
        P.PolicyConfig(max_full_steps=1, min_full_steps=5)
    with pytest.raises(ValueError):
        P.SwitchingPolicy(initial_precision="fp8")
