"""Golden tests: a dynamic embedding trains exactly like a dense embedding.

A dense `tf.Variable` [V, dim] looked up with `tf.nn.*embedding_lookup*` and a
dynamic embedding holding the same initial rows (under other int64 keys:
key = id * 7919 + 13) are trained side by side, in one graph, by ONE stock
optimizer instance, on the same batches of ids (with duplicates). After N
steps every row and every optimizer slot must be equal (rtol 1e-5).
"""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import _ops

V = 10
STEPS = 4
RTOL = 1e-5
ATOL = 1e-6


def _key(ids):
    return ids * 7919 + 13


def _gs_optimizer(name, gs):
    t = tf.compat.v1.train
    return {
        "GradientDescent": lambda: t.GradientDescentOptimizer(0.3),
        "Momentum": lambda: t.MomentumOptimizer(0.1, 0.9),
        "MomentumNesterov": lambda: t.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
        "Adagrad": lambda: t.AdagradOptimizer(0.2, initial_accumulator_value=0.3),
        "AdagradDA": lambda: t.AdagradDAOptimizer(
            0.2, gs, l1_regularization_strength=0.001, l2_regularization_strength=0.01
        ),
        "Adam": lambda: t.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6),
        "Ftrl": lambda: t.FtrlOptimizer(
            0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
            l2_shrinkage_regularization_strength=0.03,
        ),
        "FtrlPlain": lambda: t.FtrlOptimizer(0.2, learning_rate_power=-0.6, initial_accumulator_value=0.2),
        "RMSProp": lambda: t.RMSPropOptimizer(0.05, decay=0.85, momentum=0.5, epsilon=1e-3),
        "RMSPropCentered": lambda: t.RMSPropOptimizer(0.05, decay=0.85, momentum=0.5, epsilon=1e-3, centered=True),
        "Adadelta": lambda: t.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-4),
        "ProximalAdagrad": lambda: t.ProximalAdagradOptimizer(
            0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
        "ProximalGradientDescent": lambda: t.ProximalGradientDescentOptimizer(
            0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
        # learning rates as tensors and callables, as TF allows
        "AdamDecayedLR": lambda: t.AdamOptimizer(t.exponential_decay(0.05, gs, 1, 0.7)),
        "MomentumCallableLR": lambda: t.MomentumOptimizer(lambda: tf.constant(0.1) * 0.5, 0.9),
    }[name]()


SLOTS = {
    "GradientDescent": [],
    "Momentum": ["momentum"],
    "MomentumNesterov": ["momentum"],
    "Adagrad": ["accumulator"],
    "AdagradDA": ["gradient_accumulator", "gradient_squared_accumulator"],
    "Adam": ["m", "v"],
    "Ftrl": ["accum", "linear"],
    "FtrlPlain": ["accum", "linear"],
    "RMSProp": ["rms", "momentum"],
    "RMSPropCentered": ["rms", "momentum", "mg"],
    "Adadelta": ["accum", "accum_update"],
    "ProximalAdagrad": ["accumulator"],
    "ProximalGradientDescent": [],
}
ALL = sorted(SLOTS)
SLOTS.update({"AdamDecayedLR": ["m", "v"], "MomentumCallableLR": ["momentum"]})


def _batches(rng, shape, all_ids):
    out = []
    for _ in range(STEPS):
        ids = rng.randint(0, V, size=shape).astype(np.int64)
        if all_ids:  # every id present (TF1's dense Adam moves every row every step)
            flat = ids.reshape(-1)
            flat[:V] = rng.permutation(V)
            ids = flat.reshape(shape)
        out.append(ids)
    return out


def _run_golden(opt_name, num_shards, dim, flavour="lookup", combiner="mean", generic=False, seed=0):
    rng = np.random.RandomState(seed)
    init = rng.normal(0.0, 0.5, size=[V, dim]).astype(np.float32)
    all_ids = opt_name.startswith("Adam")
    old = _ops.force_generic(generic)
    try:
        g = tf.Graph()
        with g.as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            dense = tf.compat.v1.get_variable("dense", initializer=tf.constant(init), use_resource=True)
            emb = tf_ext.get_dynamic_embedding("dyn", dim, num_shards=num_shards, initializer=0.0)
            if flavour in ("lookup", "two_lookups"):
                shape = [4, 5]
                ids_ph = tf.compat.v1.placeholder(tf.int64, shape)
                d_out = tf.nn.embedding_lookup(dense, ids_ph)
                if flavour == "lookup":
                    e_out = tf_ext.embedding_lookup(emb, _key(ids_ph))
                else:  # the same keys in two lookups: their gradients are summed across lookups
                    e_out = tf.concat(
                        [
                            tf_ext.embedding_lookup(emb, _key(ids_ph[:2])),
                            tf_ext.embedding_lookup(emb, _key(ids_ph[2:])),
                        ],
                        0,
                    )
                w = tf.constant(rng.normal(size=shape + [dim]).astype(np.float32))
                feeds = [{ids_ph: b} for b in _batches(rng, shape, all_ids)]
            else:
                # sparse: 5 rows, up to 4 ids per row; row 2 empty; some -1 ids (safe only)
                idx_ph = tf.compat.v1.placeholder(tf.int64, [None, 2])
                val_ph = tf.compat.v1.placeholder(tf.int64, [None])
                wt_ph = tf.compat.v1.placeholder(tf.float32, [None])
                sp = tf.SparseTensor(idx_ph, val_ph, [5, 4])
                sp_w = tf.SparseTensor(idx_ph, wt_ph, [5, 4])
                e_vals = tf.where(val_ph >= 0, _key(val_ph), val_ph)
                sp_e = tf.SparseTensor(idx_ph, e_vals, [5, 4])
                if flavour == "sparse":
                    d_out = tf.compat.v1.nn.embedding_lookup_sparse(dense, sp, sp_w, combiner=combiner)
                    e_out = tf_ext.embedding_lookup_sparse(emb, sp_e, sp_w, combiner=combiner)
                else:
                    # TF prunes the -1 ids; a dynamic embedding takes every int64 as a key, so
                    # its input leaves the missing entries out (the documented way).
                    present = val_ph >= 0
                    d_out = tf.compat.v1.nn.safe_embedding_lookup_sparse(dense, sp, sp_w, combiner=combiner)
                    e_out = tf_ext.safe_embedding_lookup_sparse(
                        emb, tf.sparse.retain(sp_e, present), tf.sparse.retain(sp_w, present), combiner=combiner
                    )
                w = tf.constant(rng.normal(size=[5, dim]).astype(np.float32))
                feeds = []
                for _ in range(STEPS):
                    idx, vals, wts = [], [], []
                    for r in (0, 1, 3, 4):  # row 2 stays empty
                        k = rng.randint(1, 5)
                        for c in range(k):
                            idx.append([r, c])
                            vals.append(rng.randint(0, V) if (flavour == "sparse" or rng.rand() > 0.2) else -1)
                            wts.append(rng.uniform(0.5, 2.0))
                    feeds.append(
                        {
                            idx_ph: np.array(idx, np.int64),
                            val_ph: np.array(vals, np.int64),
                            wt_ph: np.array(wts, np.float32),
                        }
                    )
            loss = tf.reduce_sum(tf.square(d_out * w - 0.3)) + tf.reduce_sum(tf.square(e_out * w - 0.3))
            opt = _gs_optimizer(opt_name, gs)
            train = opt.minimize(loss, global_step=gs)
            all_keys = _key(tf.range(V, dtype=tf.int64))
            preload = emb.insert(all_keys, init)
            e_rows = tf_ext.embedding_lookup(emb, all_keys, is_training=False)
            e_slots = [emb.slot_values(opt, s, all_keys) for s in SLOTS[opt_name]]
            d_slots = [opt.get_slot(dense, s) for s in SLOTS[opt_name]]
            with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(preload)
                for feed in feeds:
                    d_loss = sess.run(train, feed)
                    del d_loss
                assert sess.run(gs) == STEPS
                d_val, e_val = sess.run([dense, e_rows])
                np.testing.assert_allclose(e_val, d_val, rtol=RTOL, atol=ATOL, err_msg="rows differ")
                assert not np.allclose(d_val, init), "nothing trained"
                for name, ds, es in zip(SLOTS[opt_name], sess.run(d_slots), sess.run(e_slots)):
                    np.testing.assert_allclose(es, ds, rtol=RTOL, atol=ATOL, err_msg="slot %s differs" % name)
                size = sess.run(emb.size())
                assert size == V
    finally:
        _ops.force_generic(old)


@pytest.mark.parametrize("opt_name", ALL)
@pytest.mark.parametrize("num_shards,dim", [(1, 8), (3, 1)])
def test_golden_every_optimizer(opt_name, num_shards, dim):
    _run_golden(opt_name, num_shards, dim)


FUSED = ["GradientDescent", "Momentum", "MomentumNesterov", "Adagrad", "Adam", "Ftrl", "RMSProp", "RMSPropCentered"]


@pytest.mark.parametrize("opt_name", FUSED)
def test_golden_generic_path_of_fused_optimizers(opt_name):
    _run_golden(opt_name, 2, 4, generic=True, seed=1)


@pytest.mark.parametrize("opt_name", ["Adagrad", "Ftrl"])
@pytest.mark.parametrize("combiner", ["mean", "sqrtn", "sum"])
def test_golden_embedding_lookup_sparse(opt_name, combiner):
    _run_golden(opt_name, 2, 4, flavour="sparse", combiner=combiner, seed=2)


@pytest.mark.parametrize("opt_name", ["Adagrad", "GradientDescent"])
@pytest.mark.parametrize("combiner", ["mean", "sum"])
def test_golden_safe_embedding_lookup_sparse(opt_name, combiner):
    _run_golden(opt_name, 3, 4, flavour="safe", combiner=combiner, seed=3)


@pytest.mark.parametrize("opt_name", ["Adagrad", "Adam", "Ftrl"])
def test_golden_two_lookups_of_one_embedding(opt_name):
    _run_golden(opt_name, 3, 4, flavour="two_lookups", seed=4)


@pytest.mark.parametrize("opt_name", ["AdamDecayedLR", "MomentumCallableLR"])
def test_golden_learning_rate_tensors_and_callables(opt_name):
    _run_golden(opt_name, 2, 4, seed=5)
