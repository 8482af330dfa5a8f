"""Dynamic embeddings looked up inside ``amp.build`` train in every mode.

In auto mode the table handle is captured by both branches of the precision
``tf.cond``. Golden comparisons: auto mode held in float32 (half) must train
the embedding rows, the dense layer and ``global_step`` exactly like
``mode="float32"`` (``"half"``), for the fused one-shard lookup, sharded
lookups and ``embedding_lookup_sparse``; an embedding stored in bf16/fp16 trains
through the precision switch like one stored in float32.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext import mixed_precision as mp

DIM = 4
STEPS = 6
IDS = np.array([[1, 2, 2], [3, 1, 9], [5, 7, 11], [2, 2, 4], [9, 13, 1], [6, 6, 6]], np.int64)
TARGETS = np.array([[1.0], [0.0], [1.0], [0.5], [-1.0], [0.25]], np.float32)
KERNEL = np.array([[0.5], [-0.25], [0.75], [0.1]], np.float32)

# Policies that never leave the initial precision.
STAY_FLOAT32 = mp.PolicyConfig(min_full_steps=10**6, max_full_steps=10**6, stable_steps=10**6)
STAY_HALF = mp.PolicyConfig(max_overflow_rate=1.0, warmup_steps=10**6)
# Leaves half precision on one non-finite step, returns after 2 stable ones.
FAST = mp.PolicyConfig(overflow_decay=0.0, max_overflow_rate=0.5, min_full_steps=2, stable_steps=2, warmup_steps=10**6)

OPTIMIZERS = {
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.3),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}


def _model(emb, lookup, poison=None):
    def fn(y):
        if lookup == "ids":
            e = tf.reduce_mean(tf_ext.embedding_lookup(emb, tf.constant(IDS)), axis=1)
        else:
            sp = tf.sparse.from_dense(tf.constant(IDS))
            e = tf_ext.embedding_lookup_sparse(emb, sp, None, combiner="sqrtn")
        e = mp.cast_compute(e)
        out = tf.compat.v1.layers.dense(e, 1, kernel_initializer=tf.compat.v1.constant_initializer(KERNEL), name="out")
        loss = tf.reduce_mean(tf.square(tf.cast(out, tf.float32) - tf.cast(y, tf.float32)))
        return loss if poison is None else loss * poison

    return fn


def _train(
    mode,
    lookup,
    num_shards,
    optimizer,
    policy=None,
    initial_precision="half",
    steps=STEPS,
    poison_at=(),
    value_dtype=tf.float32,
):
    """Trains; returns per-step snapshots and the final state."""
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        emb = tf_ext.get_dynamic_embedding(
            "emb",
            dim=DIM,
            num_shards=num_shards,
            initializer=tf.compat.v1.random_normal_initializer(0.0, 0.5, seed=7),
            value_dtype=value_dtype,
        )
        amp = mp.MixedPrecision(
            mode=mode,
            policy=policy,
            initial_precision=initial_precision,
            loss_scale=mp.LossScaleConfig(initial_scale=128.0),
        )
        poison = None
        if poison_at:
            total = amp.policy.variables["total_steps"].read_value()
            bad = tf.reduce_any(tf.equal(total, tf.constant(list(poison_at), tf.int64)))
            poison = tf.where(bad, tf.constant(np.inf, tf.float32), tf.constant(1.0))
        loss = amp.build(_model(emb, lookup, poison), tf.constant(TARGETS))
        gs = tf.compat.v1.train.get_or_create_global_step()
        train = amp.wrap_optimizer(OPTIMIZERS[optimizer]()).minimize(loss, global_step=gs)
        keys, values = emb.export()[:2]
        kernel = [v for v in tf.compat.v1.trainable_variables() if "out/kernel" in v.name][0]
        start = amp.step_start()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            snapshots = []
            for _ in range(steps):
                _, s = sess.run([train, start])
                k, v = sess.run([keys, values])
                order = np.argsort(k)
                snapshots.append(
                    {"precision": int(s["precision"]), "keys": k[order], "rows": v[order], "gs": int(sess.run(gs))}
                )
            final = {"kernel": sess.run(kernel), "metrics": sess.run(amp.metrics())}
    return snapshots, final


CASES = [
    ("ids", 1, "adagrad"),
    ("ids", 1, "adam"),
    ("ids", 3, "adagrad"),
    ("sparse", 1, "adam"),
    ("sparse", 3, "adagrad"),
]


@pytest.mark.parametrize("lookup,num_shards,optimizer", CASES)
def test_auto_held_in_float32_matches_float32_mode(lookup, num_shards, optimizer):
    got, got_final = _train("auto", lookup, num_shards, optimizer, policy=STAY_FLOAT32, initial_precision="float32")
    want, want_final = _train("float32", lookup, num_shards, optimizer)
    assert [s["precision"] for s in got] == [mp.FULL] * STEPS
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["keys"], w["keys"])
        np.testing.assert_allclose(g["rows"], w["rows"], rtol=1e-6, atol=1e-7)
        assert g["gs"] == w["gs"]
    assert [s["gs"] for s in got] == list(range(1, STEPS + 1))
    np.testing.assert_allclose(got_final["kernel"], want_final["kernel"], rtol=1e-6)
    # The rows really move, every step.
    for before, after in zip(got, got[1:]):
        assert np.abs(after["rows"] - before["rows"]).max() > 1e-4
    m = got_final["metrics"]
    assert m["total_steps"] == m["applied_steps"] == m["attempted_steps"] == STEPS


@pytest.mark.parametrize("lookup,num_shards,optimizer", CASES)
def test_auto_held_in_half_matches_half_mode(lookup, num_shards, optimizer):
    got, got_final = _train("auto", lookup, num_shards, optimizer, policy=STAY_HALF)
    want, want_final = _train("half", lookup, num_shards, optimizer)
    assert [s["precision"] for s in got] == [mp.HALF] * STEPS
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["keys"], w["keys"])
        np.testing.assert_allclose(g["rows"], w["rows"], rtol=1e-5, atol=1e-6)
        assert g["gs"] == w["gs"]
    assert got[-1]["gs"] == STEPS
    np.testing.assert_allclose(got_final["kernel"], want_final["kernel"], rtol=1e-5)
    for before, after in zip(got, got[1:]):
        assert np.abs(after["rows"] - before["rows"]).max() > 1e-4


@pytest.mark.parametrize("lookup,num_shards", [("ids", 1), ("sparse", 3)])
def test_switching_run_trains_the_embedding_in_both_branches(lookup, num_shards):
    # Step 2 (0-based) is poisoned: half -> float32 for 2 steps -> half.
    snaps, final = _train("auto", lookup, num_shards, "adagrad", policy=FAST, steps=8, poison_at=(2,))
    assert [s["precision"] for s in snaps] == [1, 1, 1, 0, 0, 1, 1, 1]
    previous = None
    for i, s in enumerate(snaps):
        moved = previous is None or np.abs(s["rows"] - previous).max() > 1e-4
        if i == 2:  # the skipped step leaves the table alone
            np.testing.assert_array_equal(s["rows"], previous)
        else:
            assert moved, "rows did not change at step %d" % i
        previous = s["rows"]
    assert [s["gs"] for s in snaps] == [1, 2, 2, 3, 4, 5, 6, 7]
    m = final["metrics"]
    assert m["num_switches"] == 2 and m["applied_steps"] == 7 and m["attempted_steps"] == 8


@pytest.mark.parametrize("value_dtype", [tf.bfloat16, tf.float16])
def test_half_rows_train_through_the_switch(value_dtype):
    """The switching run of an embedding stored in bf16/fp16 (lookups return float32 rows; the model casts them
    to its compute dtype): the same switches, steps and skipped step as with float32 rows, rows that hold values
    of the storage dtype and stay within a few of its units in the last place of the float32-row run."""
    snaps, final = _train("auto", "ids", 1, "adagrad", policy=FAST, steps=8, poison_at=(2,), value_dtype=value_dtype)
    ref, ref_final = _train("auto", "ids", 1, "adagrad", policy=FAST, steps=8, poison_at=(2,))
    assert [s["precision"] for s in snaps] == [s["precision"] for s in ref] == [1, 1, 1, 0, 0, 1, 1, 1]
    assert [s["gs"] for s in snaps] == [s["gs"] for s in ref]
    np.testing.assert_array_equal(snaps[2]["rows"], snaps[1]["rows"])  # the skipped step leaves the table alone
    ulp = 2.0 ** -{tf.bfloat16: 7, tf.float16: 10}[value_dtype]
    for i, (s, r) in enumerate(zip(snaps, ref)):
        np.testing.assert_array_equal(s["keys"], r["keys"])
        rows = s["rows"]
        np.testing.assert_array_equal(rows, rows.astype(value_dtype.as_numpy_dtype).astype(np.float32))
        # A new row is rounded once, and each update once more (stochastic rounding: less than an ulp each time).
        np.testing.assert_allclose(rows, r["rows"], rtol=(i + 2) * ulp, atol=1e-3, err_msg="step %d" % i)
        if i not in (0, 2):
            assert np.abs(rows - snaps[i - 1]["rows"]).max() > 1e-3, "rows did not change at step %d" % i
    assert final["metrics"]["num_switches"] == ref_final["metrics"]["num_switches"] == 2
    np.testing.assert_allclose(final["kernel"], ref_final["kernel"], rtol=0.05)


_SCRIPT = textwrap.dedent(
    """
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext
    from tensorflow_ext import mixed_precision as mp

    emb = tf_ext.get_dynamic_embedding("emb", dim=4)

    def model(ids):
        e = mp.cast_compute(tf_ext.embedding_lookup(emb, ids))
        return tf.reduce_mean(tf.square(tf.compat.v1.layers.dense(e, 1, name="out") - 1.0))

    tf.compat.v1.set_random_seed(0)
    # A small fixed loss scale: no loss-scale search, so every step applies.
    amp = mp.MixedPrecision(mode="auto", loss_scale=mp.LossScaleConfig(initial_scale=8.0))
    loss = amp.build(model, tf.constant([1, 2, 2, 3], tf.int64))
    gs = tf.compat.v1.train.get_or_create_global_step()
    train = amp.wrap_optimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(
        loss, global_step=gs)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train)
        print("global_step", sess.run(gs), "size", sess.run(emb.size()))
"""
)


def test_fresh_process_auto_mode_no_dead_merge():
    """The documented usage in a fresh process: trains, and TF's "Merge op has
    more than one valid input" warning (the old symptom) is gone."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="0")
    r = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "global_step 3 size 3" in r.stdout
    assert "more than one valid input" not in r.stderr


def test_switch_gradient_rejects_unknown_gradient_shape():
    """A resource captured by both branches whose gradient has no static row
    shape gets a clear error instead of a silently dead gradient."""
    from tensorflow_ext.mixed_precision import precision

    with tf.Graph().as_default() as g:
        pred = tf.compat.v1.placeholder(tf.bool, [])
        handle = tf.raw_ops.MutableHashTableV2(key_dtype=tf.int64, value_dtype=tf.float32)
        with g.gradient_override_map({"Switch": precision._COND_SWITCH_GRAD}):
            tf.compat.v1.cond(
                pred,
                lambda: tf.raw_ops.LookupTableSizeV2(table_handle=handle),
                lambda: tf.raw_ops.LookupTableSizeV2(table_handle=handle),
            )
        switches = [op for op in g.get_operations() if op.type == "Switch" and op.inputs[0] is handle]
        assert len(switches) == 2
        assert all(op.get_attr("_gradient_op_type") == precision._COND_SWITCH_GRAD.encode() for op in switches)
        grad = tf.IndexedSlices(tf.compat.v1.placeholder(tf.float32, None), tf.compat.v1.placeholder(tf.int64, [None]))
        for op in switches:
            branch = op._get_control_flow_context().branch
            grads = [None, None]
            grads[branch] = grad
            with pytest.raises(ValueError, match="not statically known"):
                precision._cond_switch_grad(op, *grads)
