"""Tests of the embedding kernels (tensorflow_ext/embedding/kernels): TfExtEmbeddingLookup, the fused
TfExtEmbeddingSparseApply* ops (against TF's own sparse optimizer kernels on dense resource variables) and
TfExtShardIndex. TF1 graph mode, one graph + session per test.

$TF_EXT_OPS_PATH points the loader at another build of _tf_ext_ops.so.
"""

import os
import sys
import zlib

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_v2_behavior()

from tensorflow_ext.embedding import embedding_ops as eo  # noqa: E402

RTOL = 1e-5
ATOL = 1e-6


def _ops():
    return eo.load_ops()


@pytest.fixture
def graph():
    g = tf.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def sess(graph):
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
    with tf.compat.v1.Session(graph=graph, config=config) as s:
        yield s


_counter = [0]


def _table(dim, width=None, column_defaults=(), shard_bits=-1):
    _counter[0] += 1
    return _ops().tf_ext_table_handle(
        dim=dim,
        width=width if width is not None else dim,
        column_defaults=list(column_defaults),
        shard_bits=shard_bits,
        shared_name="emb_kernel_test_%d" % _counter[0],
    )


def _export(sess, handle, width):
    keys, values, versions, freqs = sess.run(_ops().tf_ext_table_export(handle, col_begin=0, cols=width))
    order = np.argsort(keys)
    return keys[order], values[order], versions[order], freqs[order]


def _rows_by_key(sess, handle, width):
    keys, values, _, _ = _export(sess, handle, width)
    return dict(zip(keys.tolist(), values))


# ---------------------------------------------------------------------------------------------------------------
# Fused optimizers vs TF's sparse kernels on dense resource variables.


def _dense_var(name, value):
    return tf.compat.v1.get_variable(name, initializer=tf.constant(value), use_resource=True)


class _Case(object):
    """One optimizer configuration: slot defaults, the fused op and the TF reference update."""

    def __init__(self, name, slot_defaults, fused, reference, hypers):
        self.name = name
        self.slot_defaults = slot_defaults  # initial value of each slot (column default)
        self.fused = fused  # fn(handle, keys, grad, hypers, dim, slot_offset) -> op
        self.reference = reference  # fn(var, slots, grad, indices, hypers) -> op
        self.hypers = hypers

    def __repr__(self):
        return self.name


def _cases():
    f32 = np.float32
    cases = []
    # GradientDescent: TF1 GradientDescentOptimizer on IndexedSlices = resource_scatter_add(var, idx, -grad * lr).
    cases.append(
        _Case(
            "gd",
            [],
            lambda h, k, g, p, d, so: eo.sparse_apply_gradient_descent(h, k, g, p["lr"], dim=d),
            lambda v, s, g, i, p: tf.raw_ops.ResourceScatterAdd(resource=v.handle, indices=i, updates=-g * p["lr"]),
            {"lr": f32(0.3)},
        )
    )
    for nesterov in (False, True):
        cases.append(
            _Case(
                "momentum_nesterov=%s" % nesterov,
                [0.0],
                lambda h, k, g, p, d, so, n=nesterov: eo.sparse_apply_momentum(
                    h, k, g, p["lr"], p["momentum"], dim=d, slot_offset=so, use_nesterov=n
                ),
                lambda v, s, g, i, p, n=nesterov: tf.raw_ops.ResourceSparseApplyMomentum(
                    var=v.handle,
                    accum=s[0].handle,
                    lr=p["lr"],
                    grad=g,
                    indices=i,
                    momentum=p["momentum"],
                    use_nesterov=n,
                ),
                {"lr": f32(0.05), "momentum": f32(0.9)},
            )
        )
    cases.append(
        _Case(
            "adagrad",
            [0.1],
            lambda h, k, g, p, d, so: eo.sparse_apply_adagrad(h, k, g, p["lr"], dim=d, slot_offset=so),
            lambda v, s, g, i, p: tf.raw_ops.ResourceSparseApplyAdagrad(
                var=v.handle, accum=s[0].handle, lr=p["lr"], grad=g, indices=i, update_slots=True
            ),
            {"lr": f32(0.2)},
        )
    )
    ftrl_configs = [
        ("ftrl", dict(lr=0.1, l1=0.0, l2=0.0, l2_shrinkage=0.0, lr_power=-0.5), False),
        ("ftrl_l1l2", dict(lr=0.1, l1=0.05, l2=0.1, l2_shrinkage=0.0, lr_power=-0.5), False),
        ("ftrl_shrinkage", dict(lr=0.1, l1=0.02, l2=0.1, l2_shrinkage=0.3, lr_power=-0.5), False),
        ("ftrl_pow", dict(lr=0.1, l1=0.02, l2=0.05, l2_shrinkage=0.0, lr_power=-0.7), False),
        ("ftrl_pow_shrinkage", dict(lr=0.1, l1=0.02, l2=0.05, l2_shrinkage=0.2, lr_power=-0.3), False),
        ("ftrl_mult_lr", dict(lr=0.1, l1=0.02, l2=0.05, l2_shrinkage=0.0, lr_power=-0.5), True),
        ("ftrl_mult_lr_pow_shrinkage", dict(lr=0.1, l1=0.02, l2=0.05, l2_shrinkage=0.2, lr_power=-0.6), True),
    ]
    for name, hp, mult in ftrl_configs:
        hp = {k: f32(v) for k, v in hp.items()}

        def ref(v, s, g, i, p, mult=mult, shrink=hp["l2_shrinkage"] > 0):
            if shrink:
                return tf.raw_ops.ResourceSparseApplyFtrlV2(
                    var=v.handle,
                    accum=s[0].handle,
                    linear=s[1].handle,
                    grad=g,
                    indices=i,
                    lr=p["lr"],
                    l1=p["l1"],
                    l2=p["l2"],
                    l2_shrinkage=p["l2_shrinkage"],
                    lr_power=p["lr_power"],
                    multiply_linear_by_lr=mult,
                )
            return tf.raw_ops.ResourceSparseApplyFtrl(
                var=v.handle,
                accum=s[0].handle,
                linear=s[1].handle,
                grad=g,
                indices=i,
                lr=p["lr"],
                l1=p["l1"],
                l2=p["l2"],
                lr_power=p["lr_power"],
                multiply_linear_by_lr=mult,
            )

        cases.append(
            _Case(
                name,
                [0.1, 0.0],
                lambda h, k, g, p, d, so, mult=mult: eo.sparse_apply_ftrl(
                    h,
                    k,
                    g,
                    p["lr"],
                    p["l1"],
                    p["l2"],
                    p["lr_power"],
                    l2_shrinkage=p["l2_shrinkage"],
                    dim=d,
                    slot_offset=so,
                    multiply_linear_by_lr=mult,
                ),
                ref,
                hp,
            )
        )
    rms_hp = {"lr": f32(0.01), "rho": f32(0.9), "momentum": f32(0.5), "epsilon": f32(1e-7)}
    cases.append(
        _Case(
            "rmsprop",
            [1.0, 0.0],
            lambda h, k, g, p, d, so: eo.sparse_apply_rmsprop(
                h, k, g, p["lr"], p["rho"], p["momentum"], p["epsilon"], dim=d, slot_offset=so
            ),
            lambda v, s, g, i, p: tf.raw_ops.ResourceSparseApplyRMSProp(
                var=v.handle,
                ms=s[0].handle,
                mom=s[1].handle,
                lr=p["lr"],
                rho=p["rho"],
                momentum=p["momentum"],
                epsilon=p["epsilon"],
                grad=g,
                indices=i,
            ),
            rms_hp,
        )
    )
    cases.append(
        _Case(
            "rmsprop_centered",
            [1.0, 0.0, 0.0],  # [rms, momentum, mg]
            lambda h, k, g, p, d, so: eo.sparse_apply_rmsprop(
                h, k, g, p["lr"], p["rho"], p["momentum"], p["epsilon"], dim=d, slot_offset=so, centered=True
            ),
            lambda v, s, g, i, p: tf.raw_ops.ResourceSparseApplyCenteredRMSProp(
                var=v.handle,
                mg=s[2].handle,
                ms=s[0].handle,
                mom=s[1].handle,
                lr=p["lr"],
                rho=p["rho"],
                momentum=p["momentum"],
                epsilon=p["epsilon"],
                grad=g,
                indices=i,
            ),
            rms_hp,
        )
    )
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("dim,gap", [(1, 0), (8, 0), (8, 3)], ids=["dim1", "dim8", "dim8_gap"])
def test_fused_apply_matches_tf(graph, sess, case, dim, gap):
    """Rows and slots of the table equal TF's sparse update of dense variables after several steps.

    Half of the keys are in the table before the first step (with the dense rows' values); the other half are
    missing and get inserted by the fused op with the column defaults (the dense rows start at those defaults).
    `gap` puts unused columns between the embedding and the slots (slot_offset = dim + gap).
    """
    rng = np.random.RandomState(zlib.crc32(case.name.encode()) % 1000 + dim + gap)
    n_rows, steps = 40, 6
    nslots = len(case.slot_defaults)
    slot_offset = dim + gap
    width = slot_offset + nslots * dim + 2  # 2 trailing unused columns
    defaults = [0.0] * width
    for j in range(gap):
        defaults[dim + j] = 7.0
    for k, d in enumerate(case.slot_defaults):
        defaults[slot_offset + k * dim : slot_offset + (k + 1) * dim] = [d] * dim
    defaults[-2:] = [-3.0, -4.0]
    keys_of_row = np.unique(rng.randint(-(10**12), 10**12, n_rows * 2, dtype=np.int64))[:n_rows]
    rng.shuffle(keys_of_row)

    present = n_rows // 2
    var0 = np.zeros([n_rows, dim], np.float32)
    var0[:present] = rng.randn(present, dim).astype(np.float32)
    slots0 = [np.full([n_rows, dim], d, np.float32) for d in case.slot_defaults]
    for s in slots0:  # perturb the present rows' slots a little (positive: accumulators stay valid)
        s[:present] += np.abs(rng.randn(present, dim).astype(np.float32)) * 0.1

    handle = _table(dim, width, defaults)
    init_rows = np.tile(np.array(defaults, np.float32), (present, 1))
    init_rows[:, :dim] = var0[:present]
    for k in range(nslots):
        init_rows[:, slot_offset + k * dim : slot_offset + (k + 1) * dim] = slots0[k][:present]
    insert = _ops().tf_ext_table_insert(
        handle, keys_of_row[:present], init_rows, tf.constant(-1, tf.int64), col_begin=0, cols=width
    )

    var = _dense_var("var", var0)
    slot_vars = [_dense_var("slot%d" % k, s) for k, s in enumerate(slots0)]
    idx_ph = tf.compat.v1.placeholder(tf.int64, [None])
    grad_ph = tf.compat.v1.placeholder(tf.float32, [None, dim])
    hypers = {k: tf.constant(v) for k, v in case.hypers.items()}
    ref_op = case.reference(var, slot_vars, grad_ph, idx_ph, hypers)
    keys_t = tf.gather(tf.constant(keys_of_row), idx_ph)
    fused_op = case.fused(handle, keys_t, grad_ph, hypers, dim, slot_offset)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(insert)

    touched = set(range(present))
    for _ in range(steps):
        m = rng.randint(n_rows // 3, n_rows + 1)
        idx = rng.choice(n_rows, m, replace=False).astype(np.int64)
        grad = (rng.randn(m, dim) * 0.5).astype(np.float32)
        feed = {idx_ph: idx, grad_ph: grad}
        sess.run(ref_op, feed)
        sess.run(fused_op, feed)
        touched.update(idx.tolist())

    rows = _rows_by_key(sess, handle, width)
    assert len(rows) == len(touched)
    var_v = sess.run(var)
    slot_v = sess.run(slot_vars)
    for r in sorted(touched):
        row = rows[int(keys_of_row[r])]
        np.testing.assert_allclose(
            row[:dim], var_v[r], rtol=RTOL, atol=ATOL, err_msg="%s: embedding of row %d" % (case.name, r)
        )
        for k in range(nslots):
            np.testing.assert_allclose(
                row[slot_offset + k * dim : slot_offset + (k + 1) * dim],
                slot_v[k][r],
                rtol=RTOL,
                atol=ATOL,
                err_msg="%s: slot %d of row %d" % (case.name, k, r),
            )
        # Columns outside the embedding and the optimizer's slots keep their defaults.
        np.testing.assert_array_equal(row[dim:slot_offset], defaults[dim:slot_offset])
        np.testing.assert_array_equal(row[-2:], defaults[-2:])


@pytest.mark.parametrize("dim", [1, 8])
def test_adam_matches_tf1_adam_on_touched_rows(graph, sess, dim):
    """Adam vs tf.compat.v1.train.AdamOptimizer's sparse path when every row is touched every step (then the lazy
    and the dense-variable updates coincide), and vs the TF1 formula in numpy."""
    rng = np.random.RandomState(dim)
    n_rows, steps = 30, 6
    lr, beta1, beta2, eps = 0.01, 0.9, 0.999, 1e-8
    width = dim * 3
    handle = _table(dim, width, [0.0] * width)
    keys_of_row = (np.arange(n_rows, dtype=np.int64) * 7919 + 3) ** 2
    var0 = rng.randn(n_rows, dim).astype(np.float32)
    init = np.zeros([n_rows, width], np.float32)
    init[:, :dim] = var0
    insert = _ops().tf_ext_table_insert(handle, keys_of_row, init, tf.constant(-1, tf.int64), col_begin=0, cols=width)
    var = _dense_var("var", var0)
    opt = tf.compat.v1.train.AdamOptimizer(lr, beta1, beta2, eps)
    idx_ph = tf.compat.v1.placeholder(tf.int64, [n_rows])
    grad_ph = tf.compat.v1.placeholder(tf.float32, [n_rows, dim])
    train = opt.apply_gradients([(tf.IndexedSlices(grad_ph, idx_ph, tf.constant([n_rows, dim])), var)])
    b1p, b2p = opt._get_beta_accumulators()  # pylint: disable=protected-access
    step_ph = tf.compat.v1.placeholder(tf.int64, [])
    fused = eo.sparse_apply_adam(
        handle,
        tf.gather(tf.constant(keys_of_row), idx_ph),
        grad_ph,
        b1p,
        b2p,
        lr,
        beta1,
        beta2,
        eps,
        step=step_ph,
        dim=dim,
    )
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(insert)

    m_np = np.zeros([n_rows, dim], np.float32)
    v_np = np.zeros([n_rows, dim], np.float32)
    var_np = var0.copy()
    f = np.float32
    for t in range(steps):
        idx = rng.permutation(n_rows).astype(np.int64)
        grad = rng.randn(n_rows, dim).astype(np.float32)
        feed = {idx_ph: idx, grad_ph: grad, step_ph: t + 10}
        b1, b2 = sess.run([b1p, b2p])
        sess.run(fused, feed)  # reads the beta powers before the TF step advances them
        sess.run(train, feed)
        g = np.zeros_like(grad)
        g[idx] = grad
        lr_t = f(lr) * np.sqrt(f(1) - b2) / (f(1) - b1)
        m_np = m_np * f(beta1) + g * (f(1) - f(beta1))
        v_np = v_np * f(beta2) + (g * g) * (f(1) - f(beta2))
        var_np = var_np - lr_t * m_np / (np.sqrt(v_np) + f(eps))

    keys, values, versions, _ = _export(sess, handle, width)
    pos = {k: i for i, k in enumerate(keys.tolist())}
    order = [pos[int(k)] for k in keys_of_row]
    rows = values[order]
    var_tf = sess.run(var)
    np.testing.assert_allclose(rows[:, :dim], var_tf, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rows[:, dim : 2 * dim], sess.run(opt.get_slot(var, "m")), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rows[:, 2 * dim :], sess.run(opt.get_slot(var, "v")), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rows[:, :dim], var_np, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rows[:, dim : 2 * dim], m_np, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(rows[:, 2 * dim :], v_np, rtol=RTOL, atol=ATOL)
    assert (versions == steps - 1 + 10).all()


def test_adam_is_lazy_for_untouched_rows(graph, sess):
    """Rows absent from a step keep their embedding and slots (the documented difference from TF1 dense Adam)."""
    dim = 4
    handle = _table(dim, 3 * dim, [0.0] * (3 * dim))
    g = tf.ones([2, dim])
    step1 = eo.sparse_apply_adam(handle, [1, 2], g, 0.9, 0.999, 0.1, 0.9, 0.999, 1e-8, dim=dim)
    step2 = eo.sparse_apply_adam(handle, [1, 3], g, 0.81, 0.998, 0.1, 0.9, 0.999, 1e-8, dim=dim)
    sess.run(step1)
    before = _rows_by_key(sess, handle, 3 * dim)[2]
    sess.run(step2)
    np.testing.assert_array_equal(_rows_by_key(sess, handle, 3 * dim)[2], before)


def test_apply_sets_version_not_frequency(graph, sess):
    dim = 2
    handle = _table(dim, 2 * dim, [0.0, 0.0, 0.1, 0.1])
    sess.run(eo.sparse_apply_adagrad(handle, [5, 6], tf.ones([2, dim]), 0.1, step=42, dim=dim))
    sess.run(eo.sparse_apply_adagrad(handle, [5], tf.ones([1, dim]), 0.1, step=-1, dim=dim))
    keys, _, versions, freqs = _export(sess, handle, 2 * dim)
    assert keys.tolist() == [5, 6]
    assert versions.tolist() == [42, 42]
    assert freqs.tolist() == [0, 0]


def test_apply_empty_batch(graph, sess):
    handle = _table(3, 6)
    sess.run(eo.sparse_apply_adagrad(handle, tf.zeros([0], tf.int64), tf.zeros([0, 3]), 0.1, dim=3))
    assert sess.run(_ops().tf_ext_table_size(handle)) == 0


# ---------------------------------------------------------------------------------------------------------------
# TfExtEmbeddingLookup


def _lookup(handle, keys, dim, **kw):
    return eo.embedding_lookup_unique(handle, tf.constant(np.asarray(keys, np.int64)), dim, **kw)


def test_lookup_random_normal_statistics_and_distinct_draws(graph, sess):
    dim, n = 8, 4000
    handle = _table(dim)
    keys = np.arange(n, dtype=np.int64) * 3 + 1
    vals = sess.run(
        _lookup(
            handle, keys, dim, insert_missing=True, init_kind="random_normal", init_a=0.5, init_b=2.0, seed=3, seed2=4
        )
    )
    assert vals.shape == (n, dim)
    assert len(np.unique(vals[:, 0])) == n  # every key its own draw
    assert len(np.unique(vals.reshape(-1))) > 0.999 * n * dim
    assert abs(vals.mean() - 0.5) < 0.05
    assert abs(vals.std() - 2.0) < 0.05
    # columns are not correlated copies of each other
    assert abs(np.corrcoef(vals[:, 0], vals[:, 1])[0, 1]) < 0.05
    assert sess.run(_ops().tf_ext_table_size(handle)) == n


def test_lookup_truncated_normal_and_uniform(graph, sess):
    dim, n = 4, 5000
    keys = np.arange(n, dtype=np.int64) - 2500
    h1, h2 = _table(dim), _table(dim)
    tn = sess.run(
        _lookup(
            h1, keys, dim, insert_missing=True, init_kind="truncated_normal", init_a=1.0, init_b=0.1, seed=1, seed2=1
        )
    )
    assert np.all(np.abs(tn - 1.0) <= 0.2 + 1e-6)
    assert abs(tn.mean() - 1.0) < 0.005
    assert abs(tn.std() - 0.1 * 0.8796) < 0.005  # std of a N(0,1) truncated at +-2
    un = sess.run(
        _lookup(
            h2, keys, dim, insert_missing=True, init_kind="random_uniform", init_a=-3.0, init_b=1.0, seed=1, seed2=1
        )
    )
    assert un.min() >= -3.0 and un.max() < 1.0
    assert abs(un.mean() - (-1.0)) < 0.05
    assert abs(un.std() - 4.0 / np.sqrt(12.0)) < 0.05


def test_lookup_constant(graph, sess):
    handle = _table(3)
    vals = sess.run(_lookup(handle, [7, 8], 3, insert_missing=True, init_kind="constant", init_a=0.25))
    np.testing.assert_array_equal(vals, np.full([2, 3], 0.25, np.float32))


def test_lookup_reproducible_and_order_independent(sess):
    """Same seeds -> same rows for the same key, whatever the batch order or batching; other seeds -> others."""
    dim = 6
    keys = np.arange(200, dtype=np.int64) * 1000003

    def run(key_batches, seed, seed2):
        g = tf.Graph()
        with g.as_default(), tf.compat.v1.Session(graph=g) as s:
            h = _table(dim)
            out = {}
            for kb in key_batches:
                vals = s.run(
                    _lookup(
                        h,
                        kb,
                        dim,
                        insert_missing=True,
                        init_kind="random_normal",
                        init_a=0.0,
                        init_b=1.0,
                        seed=seed,
                        seed2=seed2,
                    )
                )
                out.update(zip(kb.tolist(), vals))
            return out

    a = run([keys], 11, 12)
    rng = np.random.RandomState(0)
    perm = rng.permutation(keys)
    b = run([perm[:50], perm[50:120], perm[120:]], 11, 12)
    c = run([keys], 11, 13)
    for k in keys.tolist():
        np.testing.assert_array_equal(a[k], b[k])
        assert not np.array_equal(a[k], c[k])


def test_lookup_graph_seed_reproducible():
    """seed=None follows TF's graph-level seed, like tf.random ops."""

    def run():
        g = tf.Graph()
        with g.as_default(), tf.compat.v1.Session(graph=g) as s:
            tf.compat.v1.set_random_seed(1234)
            h = _table(4)
            return s.run(
                eo.embedding_lookup_unique(
                    h,
                    tf.constant([1, 2, 3], tf.int64),
                    4,
                    insert_missing=True,
                    init_kind="random_uniform",
                    init_a=0.0,
                    init_b=1.0,
                )
            )

    np.testing.assert_array_equal(run(), run())


def test_lookup_existing_keys_untouched(graph, sess):
    dim = 4
    width = 3 * dim
    handle = _table(dim, width, [0.0] * dim + [0.1] * dim + [0.2] * dim)
    existing = np.array([10, 20, 30], np.int64)
    rows = np.arange(3 * width, dtype=np.float32).reshape(3, width)
    sess.run(_ops().tf_ext_table_insert(handle, existing, rows, tf.constant(-1, tf.int64), col_begin=0, cols=width))
    keys = np.array([20, 99, 10, 98, 30], np.int64)
    vals = sess.run(
        _lookup(
            handle, keys, dim, insert_missing=True, init_kind="random_normal", init_a=0.0, init_b=1.0, seed=5, seed2=6
        )
    )
    np.testing.assert_array_equal(vals[0], rows[1, :dim])
    np.testing.assert_array_equal(vals[2], rows[0, :dim])
    np.testing.assert_array_equal(vals[4], rows[2, :dim])
    assert not np.array_equal(vals[1], vals[3])
    after = _rows_by_key(sess, handle, width)
    assert sorted(after) == [10, 20, 30, 98, 99]
    for i, k in enumerate(existing.tolist()):
        np.testing.assert_array_equal(after[k], rows[i])  # whole rows, slots included
    for k, v in ((99, vals[1]), (98, vals[3])):
        np.testing.assert_array_equal(after[k][:dim], v)
        np.testing.assert_array_equal(after[k][dim:], np.float32([0.1] * dim + [0.2] * dim))  # column defaults


def test_lookup_count_and_step(graph, sess):
    handle = _table(2)
    step = tf.compat.v1.placeholder(tf.int64, [])
    op = eo.embedding_lookup_unique(handle, tf.constant([1, 2], tf.int64), 2, step=step, insert_missing=True)
    op_nocount = eo.embedding_lookup_unique(
        handle, tf.constant([1], tf.int64), 2, step=step, insert_missing=True, count=False
    )
    sess.run(op, {step: 5})
    sess.run(op, {step: 9})
    sess.run(op_nocount, {step: 11})
    sess.run(op_nocount, {step: -1})
    keys, _, versions, freqs = _export(sess, handle, 2)
    assert keys.tolist() == [1, 2]
    assert versions.tolist() == [11, 9]
    assert freqs.tolist() == [2, 2]


@pytest.mark.parametrize(
    "kind,a,expected",
    [("constant", 0.5, 0.5), ("random_normal", 0.5, 0.0), ("truncated_normal", 0.5, 0.0), ("random_uniform", 0.5, 0.0)],
)
def test_lookup_without_insert(graph, sess, kind, a, expected):
    dim = 3
    handle = _table(dim, 2 * dim)
    sess.run(_ops().tf_ext_table_insert(handle, [4], [[1.0, 2.0, 3.0]], tf.constant(7, tf.int64)))
    vals = sess.run(
        _lookup(handle, [4, 5, 6], dim, insert_missing=False, init_kind=kind, init_a=a, init_b=1.0, step=100)
    )
    np.testing.assert_array_equal(vals[0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(vals[1:], np.full([2, dim], expected, np.float32))
    keys, _, versions, freqs = _export(sess, handle, dim)
    assert keys.tolist() == [4]  # nothing inserted
    assert versions.tolist() == [7] and freqs.tolist() == [0]  # nor touched


def test_lookup_empty_and_shape(graph, sess):
    handle = _table(5)
    out = eo.embedding_lookup_unique(handle, tf.zeros([0], tf.int64), 5, insert_missing=True)
    assert out.shape.as_list() == [0, 5]
    assert sess.run(out).shape == (0, 5)
    ph = tf.compat.v1.placeholder(tf.int64, [None])
    assert eo.embedding_lookup_unique(handle, ph, 5).shape.as_list() == [None, 5]


def test_lookup_gradient_reaches_handle(graph, sess):
    dim = 3
    handle = _table(dim)
    keys = tf.constant([3, 1, 2], tf.int64)
    vals = eo.embedding_lookup_unique(handle, keys, dim, insert_missing=True)
    w = tf.constant(np.arange(9, dtype=np.float32).reshape(3, 3))
    loss = tf.reduce_sum(vals * w)
    (g,) = tf.gradients(loss, [handle])
    assert isinstance(g, tf.IndexedSlices)
    gv, gi, gs = sess.run([g.values, g.indices, g.dense_shape])
    np.testing.assert_array_equal(gi, [3, 1, 2])
    np.testing.assert_array_equal(gv, sess.run(w))
    assert gs.tolist() == [2**62, dim]
    # An IndexedSlices gradient of the values (e.g. through a gather with duplicates) is summed per key.
    pos = tf.constant([0, 2, 0, 0])
    loss2 = tf.reduce_sum(tf.gather(vals, pos))
    (g2,) = tf.gradients(loss2, [handle])
    np.testing.assert_array_equal(sess.run(g2.values), [[3.0] * 3, [0.0] * 3, [1.0] * 3])
    np.testing.assert_array_equal(sess.run(g2.indices), [3, 1, 2])
    # no gradient for keys or step
    assert tf.gradients(loss, [keys])[0] is None


# ---------------------------------------------------------------------------------------------------------------
# TfExtShardIndex


def test_shard_index_deterministic_balanced(graph, sess):
    keys = np.arange(200000, dtype=np.int64)
    out = eo.shard_index(keys, 8)
    a, b = sess.run([out, eo.shard_index(keys, 8)])
    assert a.dtype == np.int32
    np.testing.assert_array_equal(a, b)
    counts = np.bincount(a, minlength=8)
    assert counts.min() > 0.97 * 25000 and counts.max() < 1.03 * 25000
    # strided keys (e.g. field-hashed ids) are balanced too
    strided = sess.run(eo.shard_index(keys * 1024, 4))
    counts = np.bincount(strided, minlength=4)
    assert counts.min() > 0.97 * 50000 and counts.max() < 1.03 * 50000
    np.testing.assert_array_equal(sess.run(eo.shard_index(keys, 1)), np.zeros_like(a))


def test_shard_index_is_hashkey_mod(graph, sess):
    """HashKey is the splitmix64 finalizer (hash_table.h), so Python can reproduce the partition."""
    from tensorflow_ext.embedding.keys import hash_key_numpy  # pylint: disable=import-outside-toplevel

    keys = np.array([0, 1, -1, 2**62, -(2**63), 2**63 - 1, 123456789], np.int64)
    got = sess.run(eo.shard_index(keys, 7))
    np.testing.assert_array_equal(got, (hash_key_numpy(keys) % np.uint64(7)).astype(np.int32))


def test_shard_index_any_shape(graph, sess):
    keys = tf.constant(np.arange(24, dtype=np.int64).reshape(2, 3, 4))
    out = eo.shard_index(keys, 3)
    assert out.shape.as_list() == [2, 3, 4]
    v = sess.run(out)
    assert v.shape == (2, 3, 4) and v.min() >= 0 and v.max() < 3


# ---------------------------------------------------------------------------------------------------------------
# Bad input: InvalidArgumentError naming the problem.


def _raises(sess, fetch, feed, *fragments):
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        sess.run(fetch, feed)
    for f in fragments:
        assert f in str(e.value), str(e.value)


def test_bad_lookup_inputs(graph, sess):
    handle = _table(4)
    ph = tf.compat.v1.placeholder(tf.int64)
    _raises(
        sess, eo.embedding_lookup_unique(handle, ph, 4, insert_missing=True), {ph: [[1, 2]]}, "keys must be a vector"
    )
    _raises(sess, eo.embedding_lookup_unique(handle, [1, 2], 5, insert_missing=True), None, "dim=5", "table's dim=4")
    step = tf.compat.v1.placeholder(tf.int64)
    _raises(sess, eo.embedding_lookup_unique(handle, [1], 4, step=step), {step: [1, 2]}, "step must be")
    var = tf.compat.v1.get_variable("v", [3, 4], use_resource=True)
    _raises(sess, _ops().tf_ext_embedding_lookup(var.handle, [1], -1, dim=4), None, "not a tf_ext table")
    with pytest.raises(ValueError):
        eo.embedding_lookup_unique(handle, [1], 4, init_kind="glorot")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        sess.run(
            _ops().tf_ext_embedding_lookup(
                handle, [1], -1, dim=4, init_kind="random_normal", init_b=-1.0, insert_missing=True
            )
        )


def test_bad_apply_inputs(graph, sess):
    dim = 4
    handle = _table(dim, 2 * dim + 1)
    keys = tf.compat.v1.placeholder(tf.int64)
    grad = tf.compat.v1.placeholder(tf.float32)
    lr = tf.compat.v1.placeholder(tf.float32)
    ok = {keys: [1, 2], grad: np.ones([2, dim], np.float32), lr: 0.1}
    op = eo.sparse_apply_adagrad(handle, keys, grad, lr, dim=dim)
    sess.run(op, ok)
    _raises(sess, op, {**ok, keys: [[1, 2]]}, "keys must be a vector")
    _raises(sess, op, {**ok, grad: np.ones([3, dim], np.float32)}, "grad must have shape [2, 4]")
    _raises(sess, op, {**ok, grad: np.ones([2, dim + 1], np.float32)}, "grad must have shape [2, 4]")
    _raises(sess, op, {**ok, lr: [0.1, 0.2]}, "lr must be a float32 scalar")
    # Adam needs 2 slot blocks: columns [4, 12) > width 9
    adam = eo.sparse_apply_adam(handle, [1], tf.ones([1, dim]), 0.9, 0.99, 0.1, 0.9, 0.99, 1e-8, dim=dim)
    _raises(sess, adam, None, "need width >= 12", "width is 9")
    _raises(
        sess,
        eo.sparse_apply_adagrad(handle, [1], tf.ones([1, dim]), 0.1, dim=dim, slot_offset=2),
        None,
        "slot_offset=2 overlaps the embedding",
    )
    _raises(sess, eo.sparse_apply_adagrad(handle, [1], tf.ones([1, 8]), 0.1, dim=8), None, "table's dim=4")
    # int8 rows are a serving format: a fused step (which would re-quantize the row each time) is refused.
    _counter[0] += 1
    int8_handle = _ops().tf_ext_table_handle(
        dim=dim, width=dim + 1, storage="int8_row", compact_cols=dim, shared_name="emb_kernel_test_%d" % _counter[0]
    )
    for apply in (eo.sparse_apply_adagrad, eo.sparse_apply_rowwise_adagrad):
        _raises(sess, apply(int8_handle, [1], tf.ones([1, dim]), 0.1, dim=dim), None, "int8_row", "serving format")
    ftrl_handle = _table(dim, 3 * dim)
    ftrl = lambda **kw: eo.sparse_apply_ftrl(  # noqa: E731
        ftrl_handle,
        [1],
        tf.ones([1, dim]),
        kw.get("lr", 0.1),
        kw.get("l1", 0.0),
        kw.get("l2", 0.0),
        kw.get("lr_power", -0.5),
        l2_shrinkage=kw.get("l2_shrinkage", 0.0),
        dim=dim,
    )
    _raises(sess, ftrl(lr=-0.1), None, "lr is not a positive scalar")
    _raises(sess, ftrl(l1=-1.0), None, "l1 regularization strength")
    _raises(sess, ftrl(l2=-1.0), None, "l2 regularization strength")
    _raises(sess, ftrl(l2_shrinkage=-1.0), None, "l2 shrinkage")
    _raises(sess, ftrl(lr_power=0.5), None, "lr_power is not a non-positive scalar")
    # static shapes are checked at graph construction
    with pytest.raises(ValueError):
        eo.sparse_apply_adagrad(handle, [1, 2], tf.ones([3, dim]), 0.1, dim=dim)
    with pytest.raises(ValueError):
        eo.sparse_apply("Momentum", handle, [1], tf.ones([1, dim]), {"lr": 0.1}, dim=dim)
    var = tf.compat.v1.get_variable("v", [3, 4], use_resource=True)
    _raises(sess, eo.sparse_apply_adagrad(var.handle, [1], tf.ones([1, dim]), 0.1, dim=dim), None, "not a tf_ext table")


def test_bad_shard_index_inputs(graph, sess):
    n = tf.compat.v1.placeholder(tf.int32)
    op = eo.shard_index([1, 2, 3], n)
    _raises(sess, op, {n: 0}, "num_shards must be >= 1")
    _raises(sess, op, {n: [2, 3]}, "num_shards must be an int32 scalar")


# ---- TfExtEmbeddingLookupIds / TfExtEmbeddingLookupIdsGrad (dedup + lookup + gather in one kernel) ----


@pytest.mark.parametrize("n,vocab,dim", [(0, 5, 3), (1, 5, 3), (50, 7, 4), (5000, 300, 16), (70000, 100000, 8)])
def test_lookup_ids_matches_unique_lookup_gather(graph, sess, n, vocab, dim):
    rng = np.random.RandomState(n)
    ids = (rng.randint(0, vocab, n).astype(np.int64) * 7919 - 12345) if n else np.zeros([0], np.int64)
    h1, h2 = _table(dim), _table(dim)
    kw = dict(insert_missing=True, init_kind="random_normal", init_a=0.0, init_b=1.0, seed=3, seed2=4)
    values, keys, idx = eo.embedding_lookup_ids(h1, ids, dim, step=7, **kw)
    uniq, ref_idx = tf.unique(tf.constant(ids), out_idx=tf.int32)
    ref = tf.gather(eo.embedding_lookup_unique(h2, uniq, dim, step=7, **kw), ref_idx)
    v, k, i, rv, ru, ri = sess.run([values, keys, idx, ref, uniq, ref_idx])
    assert v.shape == (n, dim) and i.dtype == np.int32
    np.testing.assert_array_equal(k, ru)  # first-occurrence order, as tf.unique
    np.testing.assert_array_equal(i, ri)
    np.testing.assert_array_equal(v, rv)  # same rows (a key's draw depends only on seeds and key)
    k1, _, _, f1 = _export(sess, h1, dim)
    k2, _, _, f2 = _export(sess, h2, dim)
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_array_equal(f1, f2)  # each unique key counted once per call
    assert len(f1) == 0 or f1.max() == 1


def test_lookup_ids_without_insert_and_existing_rows(graph, sess):
    dim = 3
    handle = _table(dim)
    rows = np.arange(6, dtype=np.float32).reshape(2, dim)
    sess.run(
        _ops().tf_ext_table_insert(
            handle, np.array([10, 20], np.int64), rows, tf.constant(-1, tf.int64), col_begin=0, cols=dim
        )
    )
    values, keys, idx = eo.embedding_lookup_ids(
        handle, [20, 5, 10, 20, 5], dim, insert_missing=False, init_kind="constant", init_a=0.5
    )
    v, k, i = sess.run([values, keys, idx])
    np.testing.assert_array_equal(k, [20, 5, 10])
    np.testing.assert_array_equal(i, [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(v, [rows[1], [0.5] * 3, rows[0], rows[1], [0.5] * 3])
    assert sess.run(_ops().tf_ext_table_size(handle)) == 2  # nothing inserted


@pytest.mark.parametrize("n,u,dim", [(0, 0, 4), (1, 1, 1), (300, 17, 5), (40000, 900, 16)])
def test_lookup_ids_grad_matches_unsorted_segment_sum(graph, sess, n, u, dim):
    rng = np.random.RandomState(u)
    grad = rng.randn(n, dim).astype(np.float32)
    idx = np.concatenate([np.arange(u), rng.randint(0, max(u, 1), max(n - u, 0))]).astype(np.int32)[:n]
    rng.shuffle(idx)
    keys = np.arange(u, dtype=np.int64) * 3
    out = sess.run(eo.lookup_ids_grad(grad, idx, keys))
    ref = sess.run(tf.math.unsorted_segment_sum(grad, idx, u))
    assert out.shape == (u, dim)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_lookup_ids_gradient_is_per_unique_key_sum(graph, sess):
    dim = 2
    handle = _table(dim)
    ids = tf.constant([4, 9, 4, 4, 7], tf.int64)
    values, keys, _ = eo.embedding_lookup_ids(handle, ids, dim, insert_missing=True, init_kind="constant", init_a=1.0)
    w = tf.constant(np.arange(10, dtype=np.float32).reshape(5, dim))
    (g,) = tf.gradients(tf.reduce_sum(values * w), [handle])
    assert isinstance(g, tf.IndexedSlices)
    gv, gi, k = sess.run([g.values, g.indices, keys])
    np.testing.assert_array_equal(gi, [4, 9, 7])
    np.testing.assert_array_equal(k, gi)
    np.testing.assert_allclose(gv, [[0 + 4 + 6, 1 + 5 + 7], [2, 3], [8, 9]])


def test_bad_lookup_ids_inputs(graph, sess):
    handle = _table(4)
    ph = tf.compat.v1.placeholder(tf.int64)
    _raises(
        sess, eo.embedding_lookup_ids(handle, ph, 4, insert_missing=True)[0], {ph: [[1, 2]]}, "ids must be a vector"
    )
    _raises(sess, eo.embedding_lookup_ids(handle, [1, 2], 5, insert_missing=True)[0], None, "dim=5", "table's dim=4")
    step = tf.compat.v1.placeholder(tf.int64)
    _raises(sess, eo.embedding_lookup_ids(handle, [1], 4, step=step)[0], {step: [1, 2]}, "step must be")
    var = tf.compat.v1.get_variable("v_ids", [3, 4], use_resource=True)
    _raises(sess, _ops().tf_ext_embedding_lookup_ids(var.handle, [1], -1, dim=4)[0], None, "not a tf_ext table")
    with pytest.raises(ValueError):
        eo.embedding_lookup_ids(handle, [1], 4, init_kind="glorot")
    g = tf.compat.v1.placeholder(tf.float32)
    i = tf.compat.v1.placeholder(tf.int32)
    k = tf.compat.v1.placeholder(tf.int64)
    out = eo.lookup_ids_grad(g, i, k)
    ok = {g: np.ones([3, 2], np.float32), i: [0, 1, 0], k: [5, 6]}
    sess.run(out, ok)
    _raises(sess, out, {**ok, i: [0, 2, 0]}, "idx[1] = 2 is not in [0, 2)")
    _raises(sess, out, {**ok, i: [0, -1, 0]}, "idx[1] = -1")
    _raises(sess, out, {**ok, i: [[0, 1, 0]]}, "idx must be an int32 vector")
    _raises(sess, out, {**ok, k: [[5, 6]]}, "unique_keys must be an int64 vector")
    _raises(sess, out, {**ok, g: np.ones([4, 2], np.float32)}, "grad must have shape [3, dim]")


@pytest.mark.parametrize("kind", ["random_normal", "truncated_normal", "random_uniform"])
def test_lookup_rows_wider_than_one_random_block(graph, sess, kind):
    """dim > 16 takes several blocks of a key's stream: columns stay independent draws of the distribution."""
    dim, n = 40, 3000
    handle = _table(dim)
    keys = np.arange(n, dtype=np.int64) * 11 - 7
    vals = sess.run(
        _lookup(
            handle,
            keys,
            dim,
            insert_missing=True,
            init_kind=kind,
            init_a=(-1.0 if kind == "random_uniform" else 0.0),
            init_b=1.0,
            seed=9,
            seed2=10,
        )
    )
    # (uniforms have 23 random bits, so ~0.7% of 120000 draws collide by chance)
    assert len(np.unique(vals.reshape(-1))) > (0.99 if kind == "random_uniform" else 0.999) * n * dim
    corr = np.corrcoef(vals.T)
    assert np.abs(corr - np.eye(dim)).max() < 0.1  # no column repeats another (e.g. across blocks)
    if kind == "random_normal":
        assert abs(vals.mean()) < 0.02 and abs(vals.std() - 1.0) < 0.02
        assert abs((vals > 2).mean() - 0.02275) < 0.003  # the tails are there
    elif kind == "truncated_normal":
        assert np.abs(vals).max() < 2.0 and abs(vals.std() - 0.8796) < 0.01
    else:
        assert vals.min() >= -1.0 and vals.max() < 1.0 and abs(vals.mean()) < 0.02
