"""Golden tests of tiered storage: an embedding whose rows live in a tiny memory tier over an on-disk tier trains
bit for bit like the same embedding all in memory.

Each case builds the same model twice, in two graphs of its own (same seeds, same batches): once with
`storage=tf_ext.TieredStorage(...)` and a memory budget of a few dozen rows per shard, once without. The keys of a
run are several times the budget, so every step brings rows back from disk (cold reads) and pushes others out
(demotions): the settle op between steps makes those demotions happen before the next step, and the counters of
`emb.tier_stats()` say they did. After every step the losses are compared, and at the end every key, row, optimizer
slot, version and frequency (the exports of both tiers) and the dense weights, all bit for bit.
"""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding.tests.conftest import session_config

DIM = 4
V = 5000  # ids are drawn from [0, V): mostly fresh keys, plus some of earlier steps' (see _batches)
ROWS = 64  # rows the memory tier holds per shard (the fewest a budget may hold; set in bytes: _memory_bytes)
STEPS = 8
ROWS_PER_SHARD = 20  # a batch's rows per shard of the embedding: ~40 ids per shard, fewer distinct than ROWS


def _key(ids):
    return ids * 7919 + 13


def _optimizer(name):
    t = tf.compat.v1.train
    return {
        "sgd": lambda: t.GradientDescentOptimizer(0.3),
        "adagrad": lambda: t.AdagradOptimizer(0.2, initial_accumulator_value=0.3),
        "adam": lambda: t.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6),
        "ftrl": lambda: t.FtrlOptimizer(0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
        "rowwise_adagrad": lambda: tf_ext.RowwiseAdagradOptimizer(0.2, initial_accumulator_value=0.3),
        # No fused kernel: the update reads rows and slots with table ops and writes them back with others.
        "adadelta": lambda: t.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-4),
        "proximal_adagrad": lambda: t.ProximalAdagradOptimizer(
            0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
    }[name]()


def _batches(flavour, num_shards, seed, steps=STEPS):
    """`steps` feeds of 20 * num_shards rows: ids [rows, 2] ("lookup"), or sparse rows of 1-4 ids each with weights
    (one row empty). A quarter of a step's ids are ids of the steps before the previous one: keys that an LRU tier
    has moved to disk by then, so the step reads them back."""
    rng = np.random.RandomState(seed)
    rows = ROWS_PER_SHARD * num_shards
    out, seen = [], []
    for step in range(steps):
        old = np.concatenate(seen[: max(step - 1, 0)] or [np.zeros([0], np.int64)])

        def draw(n):
            ids = rng.randint(0, V, size=n).astype(np.int64)
            if len(old):
                reuse = rng.rand(n) < 0.25
                ids[reuse] = rng.choice(old, size=int(reuse.sum()))
            return ids

        labels = rng.normal(size=[rows, 1]).astype(np.float32)
        if flavour == "lookup":
            ids = draw(2 * rows)
            seen.append(ids)
            out.append((ids.reshape(rows, 2), labels))
            continue
        idx = [[r, c] for r in range(rows) if r != 2 for c in range(rng.randint(1, 5))]  # row 2 stays empty
        vals = draw(len(idx))
        seen.append(vals)
        wts = rng.uniform(0.5, 2.0, size=len(idx)).astype(np.float32)
        out.append(((np.array(idx, np.int64), vals, wts), labels))
    return out


def _stats(sess, emb):
    """The embedding's tier counters (summed over its shards) as python ints."""
    return {k: int(v) for k, v in sess.run(emb.tier_stats()).items() if k != "hit_rate"}


def _memory_bytes(path, num_shards, value_dtype, opt_name):
    """A memory budget (all shards) of about ROWS rows per shard for this layout: the bytes one row costs are read
    from a probe table's budget_keys (the tier's own accounting), so the test does not restate it."""
    probe = 1 << 20
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding(
            "probe",
            DIM,
            value_dtype=value_dtype,
            storage=tf_ext.TieredStorage(memory_bytes=probe, path=path),
            initializer=0.0,
        )
        gs = tf.compat.v1.train.get_or_create_global_step()
        _optimizer(opt_name).minimize(
            tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64))), global_step=gs
        )  # the slot columns widen the rows
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            budget_keys = _stats(sess, emb)["budget_keys"]
    per_row = -(-probe // budget_keys)
    return per_row * ROWS * num_shards


def _train(
    flavour,
    opt_name,
    num_shards,
    value_dtype,
    storage,
    combiner="mean",
    seed=0,
    settle=True,
    admission=None,
    steps=STEPS,
):
    """Trains `steps` steps; returns the losses, the sorted export (keys, values, slots, versions, frequencies), the
    dense weights and, for a tiered embedding, the tier counters after each step (settle: the tiers settled after
    each step; else only at the end, rows moving in the background while the steps run)."""
    with tf.Graph().as_default() as g:
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "emb",
            DIM,
            num_shards=num_shards,
            value_dtype=value_dtype,
            storage=storage,
            admission=admission,
            initializer=tf.compat.v1.random_normal_initializer(0.0, 0.5, seed=7),
        )
        rows = ROWS_PER_SHARD * num_shards
        labels = tf.compat.v1.placeholder(tf.float32, [rows, 1])
        if flavour == "lookup":
            ids = tf.compat.v1.placeholder(tf.int64, [rows, 2])
            x = tf.reduce_sum(tf_ext.embedding_lookup(emb, _key(ids)), axis=1)
            placeholders = (ids,)
        else:
            idx = tf.compat.v1.placeholder(tf.int64, [None, 2])
            vals = tf.compat.v1.placeholder(tf.int64, [None])
            wts = tf.compat.v1.placeholder(tf.float32, [None])
            sp = tf.SparseTensor(idx, _key(vals), [rows, 4])
            # "sparse": weighted; "pooled": unweighted (one shard: the one-kernel pooled lookup).
            weights = tf.SparseTensor(idx, wts, [rows, 4]) if flavour == "sparse" else None
            x = tf_ext.embedding_lookup_sparse(emb, sp, weights, combiner=combiner)
            placeholders = (idx, vals, wts)
        w = tf.compat.v1.get_variable(
            "w", initializer=tf.constant(np.linspace(-0.5, 0.5, DIM).reshape(DIM, 1), tf.float32)
        )
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
        train = _optimizer(opt_name).minimize(loss, global_step=gs)
        exported = emb.export(with_slots=True)
        settle_op = emb.tier_settle() if storage is not None else tf.no_op()
        stats = []
        losses = []
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i, (feed, y) in enumerate(_batches(flavour, num_shards, seed, steps)):
                feed = feed if isinstance(feed, tuple) else (feed,)
                fd = dict(zip(placeholders, feed))
                fd[labels] = y
                losses.append(sess.run([loss, train], fd)[0])
                if storage is not None and (settle or i == steps - 1):
                    sess.run(settle_op)
                    stats.append(_stats(sess, emb))
            e = sess.run(exported)
            order = np.argsort(e.keys)
            state = [np.asarray(a)[order] for a in (e.keys, e.values, e.slots, e.versions, e.frequencies)]
            return np.array(losses), state, sess.run(w), stats


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint32) if x.dtype == np.float32 else x


def _assert_bit_identical(tiered, plain):
    np.testing.assert_array_equal(_bits(tiered[0]), _bits(plain[0]), err_msg="losses")
    for what, a, b in zip(("keys", "values", "slots", "versions", "frequencies"), tiered[1], plain[1]):
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=what)
    np.testing.assert_array_equal(_bits(tiered[2]), _bits(plain[2]), err_msg="dense weights")
    assert not np.allclose(plain[2], np.linspace(-0.5, 0.5, DIM).reshape(DIM, 1)), "nothing trained"


def _assert_tiers_worked(stats, num_keys, num_shards):
    """Every step from the third on read rows back from disk and moved rows out; the memory tier ends within its
    budget with most keys on disk, and no key fell off the disk tier (no disk cap)."""
    for before, after in zip(stats[1:], stats[2:]):
        assert after["cold_reads"] > before["cold_reads"], stats
        assert after["demotions"] > before["demotions"], stats
    last = stats[-1]
    assert ROWS * num_shards <= last["budget_keys"] <= (ROWS + 1) * num_shards, last
    assert last["memory_keys"] <= last["budget_keys"], last
    assert last["memory_keys"] + last["disk_keys"] == num_keys, last
    assert last["disk_keys"] > last["memory_keys"], last
    assert last["dropped"] == 0 and last["errors"] == 0, last
    assert last["lookups"] >= last["cold_reads"] > 0, last


def _golden(tmp_path, flavour, opt_name, num_shards, value_dtype=tf.float32, policy="lru", **kwargs):
    path = str(tmp_path / "tier")
    memory_bytes = _memory_bytes(str(tmp_path / "probe"), num_shards, value_dtype, opt_name)
    storage = tf_ext.TieredStorage(memory_bytes=memory_bytes, path=path, policy=policy)
    tiered = _train(flavour, opt_name, num_shards, value_dtype, storage, **kwargs)
    plain = _train(flavour, opt_name, num_shards, value_dtype, None, **kwargs)
    _assert_bit_identical(tiered, plain)
    _assert_tiers_worked(tiered[3], len(plain[1][0]), num_shards)


@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad"])
def test_lookup_trains_bit_identical(tmp_path, opt_name, num_shards):
    _golden(tmp_path, "lookup", opt_name, num_shards)


@pytest.mark.parametrize(
    "opt_name,num_shards,combiner", [("adagrad", 3, "mean"), ("ftrl", 1, "sqrtn"), ("adam", 3, "sum")]
)
def test_weighted_sparse_lookup_trains_bit_identical(tmp_path, opt_name, num_shards, combiner):
    _golden(tmp_path, "sparse", opt_name, num_shards, combiner=combiner, seed=1)


@pytest.mark.parametrize(
    "opt_name,num_shards,combiner", [("adagrad", 1, "mean"), ("adam", 1, "sum"), ("ftrl", 3, "sqrtn")]
)
def test_pooled_lookup_trains_bit_identical(tmp_path, opt_name, num_shards, combiner):
    _golden(tmp_path, "pooled", opt_name, num_shards, combiner=combiner, seed=2)


@pytest.mark.parametrize(
    "flavour,opt_name,num_shards",
    [("lookup", "adagrad", 1), ("lookup", "adam", 3), ("pooled", "rowwise_adagrad", 1), ("sparse", "sgd", 3)],
)
def test_bfloat16_rows_train_bit_identical(tmp_path, flavour, opt_name, num_shards):
    """bf16 rows (stochastic rounding, drawn from the key and the step) move between the tiers as float32 and are
    re-encoded exactly."""
    _golden(tmp_path, flavour, opt_name, num_shards, value_dtype=tf.bfloat16, seed=3)


@pytest.mark.parametrize("opt_name,num_shards", [("adadelta", 1), ("proximal_adagrad", 3)])
def test_optimizers_without_a_fused_kernel_train_bit_identical(tmp_path, opt_name, num_shards):
    _golden(tmp_path, "lookup", opt_name, num_shards, seed=7)


@pytest.mark.parametrize("opt_name,flavour", [("adam", "lookup"), ("ftrl", "pooled")])
def test_generic_path_of_fused_optimizers_trains_bit_identical(tmp_path, opt_name, flavour):
    """The table-op path of the fused optimizers (and lookups): several ops per step, each bringing its keys in."""
    old = _ops.force_generic(True)
    try:
        _golden(tmp_path, flavour, opt_name, 1, seed=8)
    finally:
        _ops.force_generic(old)


@pytest.mark.parametrize("tiered", [False, True], ids=["in_memory", "tiered"])
def test_generic_path_updates_a_new_keys_initial_row(tmp_path, tiered):
    """On the table-op path, the update of a key in its first step starts from the row its lookup inserted (the
    update's read of the rows waits for the lookup), in memory and tiered alike."""
    storage = tf_ext.TieredStorage(memory_bytes=1 << 20, path=str(tmp_path / "tier")) if tiered else None
    old = _ops.force_generic(True)
    try:
        with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
            gs = tf.compat.v1.train.get_or_create_global_step()
            emb = tf_ext.get_dynamic_embedding(
                "emb", DIM, storage=storage, initializer=tf.compat.v1.random_normal_initializer(0.0, 0.5, seed=7)
            )
            keys = tf.constant(_key(np.arange(12)), tf.int64)
            rows = tf_ext.embedding_lookup(emb, keys)
            train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(tf.reduce_sum(rows), global_step=gs)
            sess.run(tf.compat.v1.global_variables_initializer())
            initial, _ = sess.run([rows, train])  # the keys are new: inserted and updated in this step
            after = sess.run(tf_ext.embedding_lookup(emb, keys, is_training=False))
    finally:
        _ops.force_generic(old)
    assert np.all(initial != 0)
    np.testing.assert_array_equal(after, initial - np.float32(0.5))


def test_lfu_policy_trains_bit_identical(tmp_path):
    _golden(tmp_path, "lookup", "adagrad", 3, policy="lfu", seed=4)


def test_training_while_rows_move_in_the_background(tmp_path):
    """No settling between steps: the demoter moves rows out while the next steps look rows up and update them
    (a row may leave memory between a step's lookup and its update, which brings it back)."""
    path = str(tmp_path / "tier")
    memory_bytes = _memory_bytes(str(tmp_path / "probe"), 3, tf.float32, "adam")
    storage = tf_ext.TieredStorage(memory_bytes=memory_bytes, path=path)
    tiered = _train("lookup", "adam", 3, tf.float32, storage, seed=5, settle=False, steps=16)
    plain = _train("lookup", "adam", 3, tf.float32, None, seed=5, steps=16)
    _assert_bit_identical(tiered, plain)
    (last,) = tiered[3]
    assert last["cold_reads"] > 0 and last["demotions"] > last["disk_keys"] > last["memory_keys"], last
    assert last["memory_keys"] + last["disk_keys"] == len(plain[1][0]) and last["errors"] == 0, last


def test_admission_policy_trains_bit_identical(tmp_path):
    """A key gets a row at its second training lookup (counted outside the table) in both tiers alike."""
    memory_bytes = _memory_bytes(str(tmp_path / "probe"), 1, tf.float32, "adagrad")
    storage = tf_ext.TieredStorage(memory_bytes=memory_bytes, path=str(tmp_path / "tier"))
    admission = tf_ext.embedding.CountAdmission(2)
    tiered = _train("lookup", "adagrad", 1, tf.float32, storage, seed=6, admission=admission, steps=24)
    plain = _train("lookup", "adagrad", 1, tf.float32, None, seed=6, admission=admission, steps=24)
    _assert_bit_identical(tiered, plain)
    last = tiered[3][-1]
    assert last["cold_reads"] > 0 and last["disk_keys"] > last["memory_keys"], last
    assert last["memory_keys"] + last["disk_keys"] == len(plain[1][0]) and last["errors"] == 0, last
