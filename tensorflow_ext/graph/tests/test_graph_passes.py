"""The graph passes (tf_ext.graph): multi-table fusion of lookups and sparse updates.

Every model is built twice, in fresh graphs with the same seeds, and run in a session with the passes on and one
with them off: losses, outputs and every trained row (values, optimizer slots, versions, frequencies) must be
equal bit for bit, and the optimized graph must hold the fused ops (read from the partition graphs the session
ran, and from the passes' counters).
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.examples import ctr, synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BATCH = 64
PARAMS = dict(
    model="deepfm",
    dim=4,
    hidden_units=[16],
    optimizer="adagrad",
    learning_rate=0.3,
    num_shards=1,
    string_ids=False,
    init_stddev=0.05,
    log_every=1000,
    batch_size=BATCH,
    progress=False,
)
STREAM = synthetic.CriteoLikeStream(seed=5, max_ids=5000)
# The main test trains the example's model with all 26 fields (26 tables); the others train it on the first
# FEW_FIELDS fields only: the same graph shapes, built in a quarter of the time.
FEW_FIELDS = 6
# The pooled lookup of a feature (embedding_lookup_sparse, feature columns) and its gradient, one op each, and the
# multi-table ops the passes put in place of N of them.
POOLED, POOLED_MULTI = "TfExtEmbeddingLookupSparse", "TfExtEmbeddingLookupSparseMulti"
GRAD, GRAD_MULTI = "TfExtEmbeddingLookupSparseGrad", "TfExtEmbeddingLookupSparseGradMulti"


@pytest.fixture
def few_fields(monkeypatch):
    """The example's model (and this file's feeds) on the first FEW_FIELDS categorical fields."""
    monkeypatch.setattr(synthetic, "CATEGORICAL_KEYS", synthetic.CATEGORICAL_KEYS[:FEW_FIELDS])
    monkeypatch.setattr(synthetic, "NUM_CATEGORICAL", FEW_FIELDS)
    return FEW_FIELDS


def _config(passes):
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    return tf_ext.graph.enable_optimizations(config) if passes else config


def _features(batch):
    feats = {k: tf.compat.v1.placeholder(tf.int64, [batch], name=k) for k in synthetic.CATEGORICAL_KEYS}
    for k in synthetic.DENSE_KEYS:
        feats[k] = tf.compat.v1.placeholder(tf.float32, [batch], name=k)
    return feats, tf.compat.v1.placeholder(tf.float32, [batch], name="labels")


def _feed(feats, labels, index, batch=None):
    f, l, _ = STREAM.batch(index, batch or BATCH)
    feed = {feats[k]: f[k] for k in synthetic.CATEGORICAL_KEYS}
    for k in synthetic.DENSE_KEYS:
        feed[feats[k]] = synthetic.log_counts(f[k])
    if labels is not None:
        feed[labels] = l
    return feed


def _exports(with_slots=True):
    """Sorted numpy snapshots of every dynamic embedding of the default graph: {name: (keys, values, slots, ...)}."""
    return {e.name: e.export(with_slots=with_slots) for e in tf_ext.embedding.get_dynamic_embeddings()}


def _sorted(snapshot):
    keys = snapshot[0]
    order = np.argsort(keys)
    return [np.asarray(part)[order] for part in snapshot]


def _assert_same_tables(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        for x, y in zip(_sorted(a[name]), _sorted(b[name])):
            np.testing.assert_array_equal(x, y, err_msg=name)


def _op_types(run_metadata):
    ops = []
    for g in run_metadata.partition_graphs:
        ops += [n.op for n in g.node]
    return ops


def _train_ctr(passes, steps=4, saver_dir=None, restore=False):
    """Trains the CTR example's DeepFM (26 feature-column tables) for `steps` steps.

    Returns (losses, table snapshots, op types of the train step's partition graphs, stats delta).
    """
    before = tf_ext.graph.pass_stats()
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        feats, labels = _features(BATCH)
        spec = ctr.model_fn(feats, labels, tf.estimator.ModeKeys.TRAIN, dict(PARAMS))
        exports = _exports()
        saver = tf.compat.v1.train.Saver()
        init = tf.compat.v1.global_variables_initializer()
        losses = []
        with tf.compat.v1.Session(config=_config(passes)) as sess:
            if restore:
                saver.restore(sess, tf.train.latest_checkpoint(saver_dir))
            else:
                sess.run(init)
            md = tf.compat.v1.RunMetadata()
            opts = tf.compat.v1.RunOptions(output_partition_graphs=True)
            start = 100 if restore else 0
            for i in range(steps):
                kw = dict(options=opts, run_metadata=md) if i == 0 else {}
                _, loss = sess.run([spec.train_op, spec.loss], _feed(feats, labels, start + i), **kw)
                losses.append(loss)
            tables = sess.run(exports)
            if saver_dir is not None and not restore:
                saver.save(sess, os.path.join(saver_dir, "model"), global_step=steps)
    after = tf_ext.graph.pass_stats()
    delta = {k: after[k] - before[k] for k in after}
    return np.array(losses), tables, _op_types(md), delta


def test_ctr_training_is_bit_exact_and_fused():
    losses_on, tables_on, ops_on, delta_on = _train_ctr(True)
    losses_off, tables_off, ops_off, delta_off = _train_ctr(False)
    np.testing.assert_array_equal(losses_on, losses_off)
    _assert_same_tables(tables_on, tables_off)
    assert len(tables_on) == 26 and all(len(t[0]) > 0 for t in tables_on.values())

    # Without the passes: 26 pooled lookups, their 26 gradients and 26 updates. With: one multi-table op each, no
    # single-table op left.
    assert ops_off.count(POOLED) == 26 and ops_off.count(GRAD) == 26
    assert ops_off.count("TfExtEmbeddingSparseApplyAdagrad") == 26
    assert POOLED_MULTI not in ops_off
    assert ops_on.count(POOLED_MULTI) == 1 and ops_on.count(GRAD_MULTI) == 1
    assert ops_on.count("TfExtEmbeddingSparseApplyAdagradMulti") == 1
    assert ops_on.count(POOLED) == 0 and ops_on.count(GRAD) == 0
    assert ops_on.count("TfExtEmbeddingSparseApplyAdagrad") == 0
    assert len(ops_on) < len(ops_off) - 70
    assert delta_on["lookups_fused"] >= 26 and delta_on["applies_fused"] >= 26
    assert delta_on["lookup_grads_fused"] >= 26 and delta_on["fused_lookup_grad_ops"] >= 1
    assert delta_on["fused_lookup_ops"] >= 1 and delta_on["fused_apply_ops"] >= 1
    assert delta_off == {k: 0 for k in delta_off}


@pytest.mark.parametrize("optimizer", ["adam", "ftrl", "momentum"])
def test_other_optimizers_bit_exact(optimizer, few_fields):
    """Updates with hyper-parameters and flags of other optimizers fuse and stay exact."""
    global PARAMS
    saved = PARAMS
    PARAMS = dict(saved, optimizer=optimizer, learning_rate=0.01, model="wide_deep")
    try:
        losses_on, tables_on, ops_on, _ = _train_ctr(True, steps=3)
        losses_off, tables_off, _, _ = _train_ctr(False, steps=3)
    finally:
        PARAMS = saved
    np.testing.assert_array_equal(losses_on, losses_off)
    _assert_same_tables(tables_on, tables_off)
    multi = [op for op in ops_on if op.startswith("TfExtEmbeddingSparseApply")]
    assert multi and all(op.endswith("Multi") for op in multi)
    # Wide&Deep has a wide and a deep table per field.
    assert ops_on.count(POOLED_MULTI) == 1 and len(tables_on) == 2 * few_fields


def test_saver_restore_continues_bit_exact(tmp_path, few_fields):
    """Save after training with the passes on, restore in a new graph and session, train on: equal to the same
    without the passes."""
    on_dir, off_dir = tmp_path / "on", tmp_path / "off"
    _train_ctr(True, steps=3, saver_dir=str(on_dir))
    _train_ctr(False, steps=3, saver_dir=str(off_dir))
    losses_on, tables_on, ops_on, _ = _train_ctr(True, steps=3, saver_dir=str(on_dir), restore=True)
    losses_off, tables_off, _, _ = _train_ctr(False, steps=3, saver_dir=str(off_dir), restore=True)
    np.testing.assert_array_equal(losses_on, losses_off)
    _assert_same_tables(tables_on, tables_off)
    assert ops_on.count(POOLED_MULTI) == 1


def _run_graph(build, passes, fetch_names=None):
    """Builds `build()` -> fetches in a fresh graph, runs it once with or without the passes."""
    with tf.Graph().as_default() as g:
        tf.compat.v1.set_random_seed(3)
        fetches = build()
        init = tf.compat.v1.global_variables_initializer()
        md = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=_config(passes)) as sess:
            sess.run(init)
            if fetch_names is not None:
                fetches = [g.get_tensor_by_name(n) for n in fetch_names(fetches)]
            out = sess.run(fetches, options=tf.compat.v1.RunOptions(output_partition_graphs=True), run_metadata=md)
    return out, _op_types(md)


def _tables(n, dim=3):
    return [
        tf_ext.get_dynamic_embedding("t%d" % i, dim, initializer=tf.compat.v1.random_normal_initializer(seed=i + 1))
        for i in range(n)
    ]


def test_untouched_graphs_stay_untouched():
    """A graph without tf_ext lookups, and one with a single lookup, run the same op multiset either way."""

    def plain():
        x = tf.compat.v1.get_variable("x", [4, 3])
        return tf.reduce_sum(tf.matmul(x, x, transpose_b=True))

    def single():
        (t,) = _tables(1)
        return tf_ext.embedding_lookup(t, tf.constant([[1, 2], [2, 9]], tf.int64), is_training=True)

    for build in (plain, single):
        before = tf_ext.graph.pass_stats()
        out_on, ops_on = _run_graph(build, True)
        out_off, ops_off = _run_graph(build, False)
        after = tf_ext.graph.pass_stats()
        np.testing.assert_array_equal(out_on, out_off)
        assert sorted(ops_on) == sorted(ops_off)
        assert after["graphs_optimized"] > before["graphs_optimized"]  # the pass ran ...
        assert after["graphs_rewritten"] == before["graphs_rewritten"]  # ... and changed nothing


def _multi_shard_lookups():
    """Three embeddings, pooled: two of one shard (one pooled-lookup op each), one of two shards (tf.unique and one
    lookup op per shard)."""
    tables = _tables(2) + [
        tf_ext.get_dynamic_embedding(
            "sharded", 5, num_shards=2, initializer=tf.compat.v1.truncated_normal_initializer(seed=9)
        )
    ]
    ids = tf.constant([3, 7, 3, 11, 2**40, -5], tf.int64)
    return [tf_ext.embedding_lookup_sparse(t, _sparse(ids), None, combiner="sum", is_training=True) for t in tables]


def _sparse(ids):
    n = ids.shape[0]
    return tf.SparseTensor(tf.constant([[i // 2, i % 2] for i in range(n)], tf.int64), ids, [n // 2 + 1, 2])


def test_lookups_of_several_embeddings_and_shards_fuse():
    out_on, ops_on = _run_graph(_multi_shard_lookups, True)
    out_off, ops_off = _run_graph(_multi_shard_lookups, False)
    for a, b in zip(out_on, out_off):
        np.testing.assert_array_equal(a, b)
    assert ops_off.count(POOLED) == 2 and ops_off.count("TfExtEmbeddingLookup") == 2
    assert ops_on.count(POOLED_MULTI) == 1 and ops_on.count("TfExtEmbeddingLookupMulti") == 1
    assert POOLED not in ops_on and "TfExtEmbeddingLookup" not in ops_on


def test_dependent_lookups_are_not_fused_together():
    """Lookup B reads keys computed from lookup A's rows: one op in place of both would be a cycle."""

    def chain():
        a, b, c = _tables(3)
        ra = tf_ext.embedding_lookup_sparse(a, _sparse(tf.constant([1, 2, 3, 4], tf.int64)), None, is_training=True)
        derived = tf.cast(tf.abs(ra[:, 0]) * 1e6, tf.int64)  # keys from A's values
        derived = tf.reshape(tf.concat([derived, derived + 1], 0), [4])
        rb = tf_ext.embedding_lookup_sparse(b, _sparse(derived), None, is_training=True)
        rc = tf_ext.embedding_lookup_sparse(c, _sparse(tf.constant([8, 9, 8, 1], tf.int64)), None, is_training=True)
        return [ra, rb, rc]

    out_on, ops_on = _run_graph(chain, True)
    out_off, _ = _run_graph(chain, False)
    for x, y in zip(out_on, out_off):
        np.testing.assert_array_equal(x, y)
    # A and C (or B and C) fuse; A and B cannot: one multi-table op and one single lookup remain.
    assert ops_on.count(POOLED_MULTI) == 1
    assert ops_on.count(POOLED) == 1


def test_lookups_under_control_flow_are_left_alone():
    def cond_graph():
        a, b = _tables(2)
        pred = tf.random.uniform([]) > -1.0  # always True, but not foldable: the cond stays in the graph
        keys = tf.constant([1, 2, 3, 4], tf.int64)
        ra = tf.compat.v1.cond(
            pred,
            lambda: tf_ext.embedding_lookup_sparse(a, _sparse(keys), None, is_training=True),
            lambda: tf.zeros([3, 3]),
        )
        rb = tf_ext.embedding_lookup_sparse(b, _sparse(keys + 1), None, is_training=True)
        return [ra, rb]

    out_on, ops_on = _run_graph(cond_graph, True)
    out_off, ops_off = _run_graph(cond_graph, False)
    for x, y in zip(out_on, out_off):
        np.testing.assert_array_equal(x, y)
    assert POOLED_MULTI not in ops_on
    assert sorted(ops_on) == sorted(ops_off)


def test_fetching_a_fused_lookup_by_name():
    """A lookup op's output fetched by its own name still resolves (the pass keeps the name)."""

    def names(outs):
        g = tf.compat.v1.get_default_graph()
        lookups = [op for op in g.get_operations() if op.type in ("TfExtEmbeddingLookup", POOLED)]
        assert len(lookups) == 4
        # Every output of the pooled lookups (rows, unique keys, ...), and the rows of the per-shard lookups.
        return [t.name for op in lookups for t in op.outputs] + [t.name for t in outs]

    out_on, ops_on = _run_graph(_multi_shard_lookups, True, fetch_names=names)
    out_off, _ = _run_graph(_multi_shard_lookups, False, fetch_names=names)
    assert len(out_on) == 2 * 6 + 2 + 3
    for x, y in zip(out_on, out_off):
        np.testing.assert_array_equal(x, y)
    assert ops_on.count(POOLED_MULTI) == 1 and ops_on.count("TfExtEmbeddingLookupMulti") == 1


def test_enable_optimizations_arguments():
    config = tf.compat.v1.ConfigProto()
    assert tf_ext.graph.enable_optimizations(config) is config
    tf_ext.graph.enable_optimizations(config, fuse_applies=False)  # idempotent: one entry, updated
    custom = config.graph_options.rewrite_options.custom_optimizers
    assert [c.name for c in custom] == [tf_ext.graph.OPTIMIZER_NAME]
    assert custom[0].parameter_map["fuse_applies"].b is False
    assert tf_ext.graph.optimizations_enabled(config)
    assert not tf_ext.graph.optimizations_enabled(tf.compat.v1.ConfigProto())

    run_config = tf.estimator.RunConfig(model_dir=None)
    new = tf_ext.graph.enable_optimizations(run_config)
    assert isinstance(new, tf.estimator.RunConfig) and run_config.session_config is None
    assert tf_ext.graph.optimizations_enabled(new)
    assert new.session_config.allow_soft_placement  # the Estimator's default session config, plus the passes

    with pytest.raises(TypeError, match="ConfigProto"):
        tf_ext.graph.enable_optimizations("yes")
    off = tf.compat.v1.ConfigProto()
    off.graph_options.rewrite_options.disable_meta_optimizer = True
    with pytest.raises(ValueError, match="disable_meta_optimizer"):
        tf_ext.graph.enable_optimizations(off)


_ENV_SCRIPT = r"""
import numpy as np, tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import tensorflow_ext as tf_ext
ts = [tf_ext.get_dynamic_embedding("e%d" % i, 2) for i in range(3)]
out = [tf_ext.embedding_lookup(t, tf.constant([1, 2, 3], tf.int64) + i, is_training=True)
       for i, t in enumerate(ts)]
ids = tf.constant([1, 2, 1], tf.int64)
out += [tf_ext.embedding_lookup_sparse(t, tf.SparseTensor([[0, 0], [0, 1], [1, 0]], ids, [2, 2]), None,
                                       is_training=True) for t in ts]
with tf.compat.v1.Session(config=tf_ext.graph.enable_optimizations()) as s:
    s.run(out)
print(tf_ext.graph.pass_stats()["lookups_fused"])
"""


@pytest.mark.parametrize("env,expect_fused", [("0", False), ("1", True), (None, True)])
def test_environment_override(env, expect_fused):
    environ = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    environ.pop("TF_EXT_GRAPH_PASSES", None)
    if env is not None:
        environ["TF_EXT_GRAPH_PASSES"] = env
    r = subprocess.run(
        [sys.executable, "-c", _ENV_SCRIPT], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    fused = int(r.stdout.strip().splitlines()[-1])
    assert (fused >= 3) if expect_fused else (fused == 0)


def _estimator_run(model_dir, export_dir, passes):
    """Train, evaluate, predict and export the CTR example's Estimator; serve the export in a session with the same
    pass setting. Returns (eval metrics, predictions, served predictions, stats delta of train+predict)."""
    config = tf.estimator.RunConfig(model_dir=model_dir, tf_random_seed=11)
    if passes:
        config = tf_ext.graph.enable_optimizations(config)
    est = tf.estimator.Estimator(ctr.model_fn, config=config, params=dict(PARAMS))
    before = tf_ext.graph.pass_stats()
    est.train(lambda: STREAM.dataset(BATCH, 3), steps=3)
    metrics = est.evaluate(lambda: STREAM.dataset(BATCH, 2, split="eval"), steps=2)
    predictions = np.array([p["logit"] for p in est.predict(lambda: STREAM.dataset(BATCH, 1, split="eval"))])
    after = tf_ext.graph.pass_stats()
    path = est.export_saved_model(export_dir, ctr.serving_input_fn(False)).decode()
    with tf.Graph().as_default() as g:
        with tf.compat.v1.Session(graph=g, config=_config(passes)) as sess:
            meta = tf.compat.v1.saved_model.load(sess, ["serve"], path)
            sig = meta.signature_def["serving_default"]
            raw = _feed({k: k for k in synthetic.CATEGORICAL_KEYS + synthetic.DENSE_KEYS}, None, 0)
            feed = {sig.inputs[k].name: v for k, v in raw.items()}
            md = tf.compat.v1.RunMetadata()
            served = sess.run(
                sig.outputs["logit"].name,
                feed,
                options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                run_metadata=md,
            )
    delta = {k: after[k] - before[k] for k in after}
    return metrics, predictions, served, _op_types(md), delta


def test_estimator_train_evaluate_predict_and_export(tmp_path, few_fields):
    m_on, p_on, s_on, ops_on, d_on = _estimator_run(str(tmp_path / "on"), str(tmp_path / "x_on"), True)
    m_off, p_off, s_off, ops_off, d_off = _estimator_run(str(tmp_path / "off"), str(tmp_path / "x_off"), False)
    assert m_on.keys() == m_off.keys()
    for k in m_on:
        np.testing.assert_array_equal(m_on[k], m_off[k], err_msg=k)
    np.testing.assert_array_equal(p_on, p_off)
    np.testing.assert_array_equal(s_on, s_off)
    # The serving graph (find-only lookups of the exported tables) is fused too; the export itself holds the
    # graph as built (single-table ops), so a server without the passes reads it as well.
    assert ops_on.count(POOLED_MULTI) == 1 and POOLED not in ops_on
    assert ops_off.count(POOLED) == few_fields
    # train (lookups + updates), evaluate and predict (lookups) were all rewritten.
    assert d_on["graphs_rewritten"] >= 3 and d_on["applies_fused"] >= few_fields
    assert d_on["lookups_fused"] >= 3 * few_fields
    assert d_off["graphs_rewritten"] == 0


def test_one_session_running_different_fetch_sets():
    """Each fetch set gets its own optimized graph, and a session shares stateful kernels between them by node
    name: fused ops of different tables must not share a name (else a run reads the wrong tables' attrs)."""

    def build():
        tables = [
            tf_ext.get_dynamic_embedding(
                "d%d" % i, 2 + i, initializer=tf.compat.v1.truncated_normal_initializer(seed=10 + i)
            )
            for i in range(3)
        ]
        ids = tf.constant([4, 5, 4, 6], tf.int64)
        return [
            tf_ext.embedding_lookup_sparse(t, _sparse(ids + i), None, is_training=True) for i, t in enumerate(tables)
        ]

    results = {}
    for passes in (True, False):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(1)
            a, b, c = build()
            with tf.compat.v1.Session(config=_config(passes)) as sess:
                # Fresh keys in each run: what a run inserts comes from its own kernel's initializer attrs.
                results[passes] = [sess.run([a, b]), sess.run([c, a]), sess.run([b, c]), sess.run([a, b, c])]
    for x, y in zip(results[True], results[False]):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


def test_a_fed_lookup_is_not_fused():
    """Feeding a lookup's output replaces it for its consumers, with the passes on as without."""
    results = {}
    for passes in (True, False):
        with tf.Graph().as_default():
            a, b, c = _tables(3)
            keys = tf.constant([1, 2, 3, 4], tf.int64)
            ra, rb, rc = [
                tf_ext.embedding_lookup_sparse(t, _sparse(keys + i), None, is_training=True)
                for i, t in enumerate((a, b, c))
            ]
            total = tf.reduce_sum(ra) + tf.reduce_sum(rb) + tf.reduce_sum(rc)
            md = tf.compat.v1.RunMetadata()
            with tf.compat.v1.Session(config=_config(passes)) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                results[passes] = sess.run(
                    [total, rb],
                    {ra: np.full([3, 3], 100.0, np.float32)},
                    options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                    run_metadata=md,
                )
        if passes:
            ops_on = _op_types(md)
    total_on, rb_on = results[True]
    total_off, rb_off = results[False]
    np.testing.assert_array_equal(rb_on, rb_off)
    assert total_on == total_off
    assert total_on > 800.0  # the fed 3x3 block of 100s counts
    # The other two still fuse.
    assert ops_on.count(POOLED_MULTI) == 1 and ops_on.count(POOLED) == 0


def _train_with_in_step_eviction(passes):
    """Two embeddings of two shards and one of one, each with an in-step eviction by norm and capacity: returns the
    tables after each step, the op types the first step ran and the passes' counters' change."""
    before = tf_ext.graph.pass_stats()
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(11)
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        tables = [
            tf_ext.get_dynamic_embedding(
                "evicting%d" % i,
                3,
                num_shards=shards,
                initializer=tf.compat.v1.random_normal_initializer(seed=i + 1),
                eviction=tf_ext.embedding.EvictionPolicy(min_l2_norm=0.8, capacity=12, every_n_steps=2),
            )
            for i, shards in enumerate((2, 2, 1))
        ]
        loss = tf.add_n([tf.reduce_sum(tf.square(tf_ext.embedding_lookup(t, ids) - 0.5)) for t in tables])
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=gs)
        exports = _exports()
        snapshots = []
        md = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(config=_config(passes)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(6):
                kw = dict(options=tf.compat.v1.RunOptions(output_partition_graphs=True), run_metadata=md)
                sess.run(train, {ids: np.arange(step * 5, step * 5 + 10)}, **(kw if step == 0 else {}))
                snapshots.append(sess.run(exports))
    after = tf_ext.graph.pass_stats()
    return snapshots, _op_types(md), {k: after[k] - before[k] for k in after}


def test_in_step_eviction_with_fused_updates():
    """An embedding's capacity eviction runs after all its shards' updates, which the passes fuse into one
    multi-table update: same tables bit for bit, and the updates are still fused."""
    on, ops_on, delta_on = _train_with_in_step_eviction(True)
    off, ops_off, _ = _train_with_in_step_eviction(False)
    for a, b in zip(on, off):
        _assert_same_tables(a, b)
    sizes = [sum(len(s[0]) for s in snapshot.values()) for snapshot in off]
    assert sizes[2] <= 3 * 12 and sizes[4] <= 3 * 12 < sizes[5]  # evicted at global steps 2 and 4
    assert ops_off.count("TfExtEmbeddingSparseApplyAdagrad") == 5
    assert ops_on.count("TfExtEmbeddingSparseApplyAdagradMulti") == 1 and delta_on["applies_fused"] >= 5
