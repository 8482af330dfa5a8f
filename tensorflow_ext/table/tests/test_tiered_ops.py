"""The table ops on tiered tables (memory tier over an on-disk store), through `refs.MutableTableRef`.

A tiered table must answer every operation exactly as the untiered table does while no key falls off its disk tier:
each test runs the same ops on an untiered twin and on a tiered table whose memory budget holds a fraction of the
keys, settles the tier between batches (so rows do move to disk and back: the tier's counters say so) and compares
the outputs and the full contents (rows, versions, frequencies) bit for bit. Also: the tier ops (stats, settle,
prefetch), the change log of keys dropped off a capped disk tier, the handle's tier attrs and the errors of the
store. TF1 graph mode; the fixtures are in conftest.py.
"""

import os
import types

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding import embedding_ops as eo
from tensorflow_ext.table import refs
from tensorflow_ext.utils import loader

# The index of each entry of tier_stats().
S = {name: i for i, name in enumerate(refs.TIER_STATS_FIELDS)}

DIM = 4
WIDTH = 8


def _tier(path, memory_bytes, disk_bytes=0, policy="lru"):
    return types.SimpleNamespace(path=str(path), memory_bytes=memory_bytes, disk_bytes=disk_bytes, policy=policy)


def _memory_for(rows, width):
    """A memory budget of about `rows` rows of `width` floats (the tier's own count is tier_stats' budget_keys)."""
    return rows * (4 * width + 64)


def _sorted_export(sess, table):
    keys, rows, versions, freqs = sess.run(table.export(full_rows=True))
    order = np.argsort(keys)
    return keys[order], rows[order], versions[order], freqs[order]


def _assert_same_contents(sess, plain, tiered):
    a, b = _sorted_export(sess, plain), _sorted_export(sess, tiered)
    for what, x, y in zip(("keys", "rows", "versions", "frequencies"), a, b):
        np.testing.assert_array_equal(x, y, err_msg=what)
    assert sess.run(plain.size()) == sess.run(tiered.size()) == len(a[0])


def _stats(sess, table):
    stats = sess.run(table.tier_stats())
    return {name: int(stats[i]) for name, i in S.items()}


class _Twin(object):
    """An untiered table and a tiered one of one layout, and the same ops on both, fed from placeholders."""

    def __init__(self, tmp_path, layout, name, memory_rows=100, policy="lru", disk_bytes=0):
        self.layout = layout
        self.path = os.path.join(str(tmp_path), name)
        self.plain = refs.MutableTableRef.create(layout, shared_name=name + "_plain")
        self.tiered = refs.MutableTableRef.create(
            layout,
            shared_name=name + "_tiered",
            tier=_tier(self.path, _memory_for(memory_rows, layout.width), disk_bytes, policy),
        )
        self.tables = (self.plain, self.tiered)
        self.keys = tf.compat.v1.placeholder(tf.int64, [None])
        self.rows = tf.compat.v1.placeholder(tf.float32, [None, layout.dim])
        self.extra = tf.compat.v1.placeholder(tf.float32, [None, layout.width - layout.dim])
        self.full = tf.compat.v1.placeholder(tf.float32, [None, layout.width])
        self.versions = tf.compat.v1.placeholder(tf.int64, [None])
        self.step = tf.compat.v1.placeholder(tf.int64, [])
        self.settle = self.tiered.tier_settle()

    def both(self, fn):
        return [fn(t) for t in self.tables]


def _key_batch(rng, key_space, size):
    return rng.choice(key_space, size=size, replace=False).astype(np.int64)


@pytest.mark.parametrize(
    "storage, policy", [("float32", "lru"), ("float32", "lfu"), ("bfloat16", "lru"), ("float16", "lfu")]
)
def test_keyed_ops_match_untiered(graph, sess, tmp_path, storage, policy):
    layout = refs.TableLayout(DIM, WIDTH, [0.5] * DIM + [0.25] * (WIDTH - DIM), storage=storage)
    twin = _Twin(tmp_path, layout, "keyed_%s_%s" % (storage, policy), policy=policy)
    budget = _stats(sess, twin.tiered)["budget_keys"]
    assert budget >= 64
    key_space = np.arange(6 * budget, dtype=np.int64) * 7919 - 3 * budget  # negative keys too
    batch = budget // 3
    ops = {
        "find_or_insert": twin.both(lambda t: t.find_or_insert(twin.keys, twin.rows, twin.step)),
        "insert_extra": twin.both(
            lambda t: t.insert(twin.keys, twin.extra, twin.step, count=True, col_begin=DIM, cols=WIDTH - DIM)
        ),
        "accumulate": twin.both(lambda t: t.accumulate(twin.keys, twin.rows, twin.step, count=True)),
        "accumulate_existing": twin.both(lambda t: t.accumulate(twin.keys, twin.rows, twin.step, insert_missing=False)),
        "remove": twin.both(lambda t: t.remove(twin.keys)),
        "find": twin.both(lambda t: t.find(twin.keys, tf.constant(-1.0), cols=WIDTH)),
    }
    rng = np.random.RandomState(11)
    # Fill first (more keys than the budget holds), then a random mix.
    plan = ["find_or_insert"] * 6 + list(rng.choice(sorted(ops), size=36))
    for step, kind in enumerate(plan):
        keys = _key_batch(rng, key_space, batch)
        feed = {
            twin.keys: keys,
            twin.rows: rng.randn(batch, DIM).astype(np.float32),
            twin.extra: rng.randn(batch, WIDTH - DIM).astype(np.float32),
            twin.step: step,
        }
        plain_out, tiered_out = sess.run(ops[kind], feed)
        if kind in ("find_or_insert", "remove"):
            np.testing.assert_array_equal(plain_out, tiered_out, err_msg="%s at step %d" % (kind, step))
        elif kind == "find":
            np.testing.assert_array_equal(plain_out[0], tiered_out[0], err_msg="find values at step %d" % step)
            np.testing.assert_array_equal(plain_out[1], tiered_out[1], err_msg="find found at step %d" % step)
        sess.run(twin.settle)
        if step % 8 == 7:
            _assert_same_contents(sess, twin.plain, twin.tiered)
    _assert_same_contents(sess, twin.plain, twin.tiered)
    stats = _stats(sess, twin.tiered)
    assert stats["demotions"] > 0 and stats["cold_reads"] > 0 and stats["disk_keys"] > 0, stats
    assert stats["memory_keys"] + stats["disk_keys"] == sess.run(twin.plain.size())
    assert stats["memory_keys"] <= stats["budget_keys"]
    assert stats["dropped"] == 0 and stats["errors"] == 0


def test_whole_table_ops_match_untiered(graph, sess, tmp_path):
    layout = refs.TableLayout(DIM, WIDTH, [0.0] * DIM + [0.1] * (WIDTH - DIM))
    twin = _Twin(tmp_path, layout, "whole")
    budget = _stats(sess, twin.tiered)["budget_keys"]
    fill = twin.both(lambda t: t.find_or_insert(twin.keys, twin.rows, twin.step))
    rng = np.random.RandomState(5)
    batch = budget // 2
    all_keys = np.arange(10 * batch, dtype=np.int64) + 1000
    for step in range(10):
        keys = all_keys[step * batch : (step + 1) * batch]
        sess.run(fill, {twin.keys: keys, twin.rows: rng.randn(batch, DIM).astype(np.float32), twin.step: step})
        sess.run(twin.settle)
    _assert_same_contents(sess, twin.plain, twin.tiered)
    assert _stats(sess, twin.tiered)["disk_keys"] > 0

    # export_since reads both tiers.
    since = twin.both(lambda t: t.export_since(tf.constant(6, tf.int64), full_rows=True))
    a, b = sess.run(since)
    order_a, order_b = np.argsort(a[0]), np.argsort(b[0])
    assert len(a[0]) == 4 * batch
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x[order_a], y[order_b])

    # Evict removes from both tiers (the oldest rows are on disk) and logs every removed key.
    sess.run(twin.both(lambda t: t.change_log_start(tf.constant(10**6, tf.int64))))
    disk_before = _stats(sess, twin.tiered)["disk_keys"]
    removed = sess.run(twin.both(lambda t: t.evict(tf.constant(3, tf.int64), tf.constant(-1, tf.int64))))
    assert removed[0] == removed[1] == 3 * batch
    assert _stats(sess, twin.tiered)["disk_keys"] < disk_before
    logs = sess.run(twin.both(lambda t: t.change_log()[0]))
    assert set(logs[0].tolist()) == set(logs[1].tolist()) == set(all_keys[: 3 * batch].tolist())
    _assert_same_contents(sess, twin.plain, twin.tiered)

    # A partial import (embedding columns only) keeps the other columns of keys on disk, and inserts new keys.
    keys = np.concatenate([all_keys[3 * batch : 4 * batch], np.arange(batch, dtype=np.int64) + 50000])
    partial = twin.both(
        lambda t: t.import_(twin.keys, twin.rows, twin.versions, tf.zeros([0], tf.int64), clear_first=False)
    )
    sess.run(
        partial,
        {twin.keys: keys, twin.rows: rng.randn(len(keys), DIM).astype(np.float32), twin.versions: np.arange(len(keys))},
    )
    _assert_same_contents(sess, twin.plain, twin.tiered)

    # A restore larger than the budget: the overflow goes to disk while it is imported.
    keys = np.arange(6 * budget, dtype=np.int64) * 3 + 7
    restore = twin.both(
        lambda t: t.import_(twin.keys, twin.full, twin.versions, twin.versions, clear_first=True, full_rows=True)
    )
    sess.run(
        restore,
        {
            twin.keys: keys,
            twin.full: rng.randn(len(keys), WIDTH).astype(np.float32),
            twin.versions: rng.randint(0, 100, len(keys)),
        },
    )
    stats = _stats(sess, twin.tiered)
    assert stats["disk_keys"] > 0 and stats["memory_keys"] + stats["disk_keys"] == len(keys), stats
    _assert_same_contents(sess, twin.plain, twin.tiered)

    # TF's LookupInterface paths (LookupTableFindV2 / ImportV2 / SizeV2) reach both tiers too.
    find_v2 = twin.both(
        lambda t: tf.raw_ops.LookupTableFindV2(
            table_handle=t.handle, keys=twin.keys, default_value=tf.fill([DIM], -2.0)
        )
    )
    probe = np.concatenate([keys[:: len(keys) // 20], [1, 2]])
    a, b = sess.run(find_v2, {twin.keys: probe})
    np.testing.assert_array_equal(a, b)
    import_v2 = twin.both(
        lambda t: tf.raw_ops.LookupTableImportV2(table_handle=t.handle, keys=twin.keys, values=twin.rows)
    )
    keys = np.arange(3 * budget, dtype=np.int64) + 9
    sess.run(import_v2, {twin.keys: keys, twin.rows: rng.randn(len(keys), DIM).astype(np.float32)})
    _assert_same_contents(sess, twin.plain, twin.tiered)
    remove_v2 = twin.both(lambda t: tf.raw_ops.LookupTableRemoveV2(table_handle=t.handle, keys=twin.keys))
    sess.run(remove_v2, {twin.keys: keys[::3]})
    sess.run(twin.settle)
    export_v2 = twin.both(
        lambda t: tf.raw_ops.LookupTableExportV2(table_handle=t.handle, Tkeys=tf.int64, Tvalues=tf.float32)
    )
    (ka, va), (kb, vb) = sess.run(export_v2)
    assert len(ka) == len(keys) - len(keys[::3])
    np.testing.assert_array_equal(ka[np.argsort(ka)], kb[np.argsort(kb)])
    np.testing.assert_array_equal(va[np.argsort(ka)], vb[np.argsort(kb)])
    assert sess.run(twin.both(lambda t: tf.raw_ops.LookupTableSizeV2(table_handle=t.handle))) == [len(ka)] * 2
    assert _stats(sess, twin.tiered)["disk_keys"] > 0

    sess.run(twin.both(lambda t: t.clear()))
    stats = _stats(sess, twin.tiered)
    assert stats["memory_keys"] == 0 and stats["disk_keys"] == 0
    assert sess.run(twin.both(lambda t: t.size())) == [0, 0]


def test_tier_stats_settle_and_prefetch(graph, sess, tmp_path):
    layout = refs.TableLayout(DIM, WIDTH)
    twin = _Twin(tmp_path, layout, "stats")
    stats_t = twin.tiered.tier_stats()
    assert stats_t.shape.as_list() == [10]

    # Untiered: its keys and bytes, zeros elsewhere; settle and prefetch do nothing.
    insert = twin.both(lambda t: t.insert(twin.keys, twin.rows, twin.step))
    sess.run(insert[0], {twin.keys: [1, 2, 3], twin.rows: np.ones((3, DIM), np.float32), twin.step: 0})
    sess.run([twin.plain.tier_settle(), twin.plain.prefetch(tf.constant([1, 2, 99], tf.int64))])
    plain = sess.run(twin.plain.tier_stats())
    np.testing.assert_array_equal(plain, [3, sess.run(twin.plain.memory_bytes()), 0, 0, 0, 0, 0, 0, 0, 0])

    # Tiered: batches of distinct versions, settled; LRU keeps the newest rows in memory.
    stats = _stats(sess, twin.tiered)
    budget = stats["budget_keys"]
    assert budget >= 64 and stats["memory_keys"] == stats["disk_keys"] == stats["lookups"] == 0
    batch = budget // 4
    batches = [np.arange(batch, dtype=np.int64) + 100 * (i + 1) * batch for i in range(8)]
    for step, keys in enumerate(batches):
        sess.run(insert[1], {twin.keys: keys, twin.rows: np.full((batch, DIM), step, np.float32), twin.step: step})
        sess.run(twin.settle)
    stats = _stats(sess, twin.tiered)
    assert stats["lookups"] == 8 * batch
    assert stats["memory_keys"] + stats["disk_keys"] == 8 * batch == sess.run(twin.tiered.size())
    assert 0 < stats["memory_keys"] <= budget and stats["demotions"] >= stats["disk_keys"] > 0
    assert stats["memory_bytes"] == sess.run(twin.tiered.memory_bytes())

    # Prefetch of a few of the oldest keys (on disk) brings them back without changing them; memory stays within
    # the budget (it is at most 90% of it after a round), so nothing else moves.
    before = _sorted_export(sess, twin.tiered)
    few = batches[0][:5]
    prefetch = twin.tiered.prefetch(twin.keys)
    sess.run(prefetch, {twin.keys: few})
    after = _stats(sess, twin.tiered)
    assert after["cold_reads"] - stats["cold_reads"] == 5
    assert after["memory_keys"] - stats["memory_keys"] == 5 and stats["disk_keys"] - after["disk_keys"] == 5
    assert after["lookups"] - stats["lookups"] == 5
    for x, y in zip(before, _sorted_export(sess, twin.tiered)):
        np.testing.assert_array_equal(x, y)
    # Now in memory: another prefetch reads nothing from disk; a key that exists nowhere is not inserted.
    sess.run(prefetch, {twin.keys: np.concatenate([few, [-5]])})
    again = _stats(sess, twin.tiered)
    assert again["cold_reads"] == after["cold_reads"] and sess.run(twin.tiered.size()) == 8 * batch


def test_dropped_disk_keys_are_logged_as_removed(graph, sess, tmp_path):
    # Wide rows and a small disk cap: keys fall off the disk tier, and the change log lists them as removed.
    width = 64
    layout = refs.TableLayout(width)
    table = refs.MutableTableRef.create(
        layout,
        shared_name="capped",
        tier=_tier(tmp_path / "capped", _memory_for(100, width), disk_bytes=512 << 10),
    )
    sess.run(table.change_log_start(tf.constant(10**6, tf.int64)))
    keys_ph = tf.compat.v1.placeholder(tf.int64, [None])
    step_ph = tf.compat.v1.placeholder(tf.int64, [])
    rows_ph = tf.compat.v1.placeholder(tf.float32, [None, width])
    insert = table.insert(keys_ph, rows_ph, step_ph)
    settle = table.tier_settle()
    batch = 50
    inserted = []
    rng = np.random.RandomState(2)
    for step in range(120):  # 6000 random rows of ~280 bytes: ~1.7 MB on disk, over 3x the cap
        keys = np.arange(batch, dtype=np.int64) + step * batch
        sess.run(insert, {keys_ph: keys, rows_ph: rng.randn(batch, width).astype(np.float32), step_ph: step})
        sess.run(settle)
        inserted.extend(keys.tolist())
    stats = _stats(sess, table)
    assert stats["dropped"] > 0, stats
    kept = set(sess.run(table.export()[0]).tolist())
    removed, enabled, untracked, overflow = sess.run(table.change_log())
    assert enabled and not untracked and not overflow
    assert len(kept) == len(inserted) - stats["dropped"] == sess.run(table.size())
    assert set(removed.tolist()) == set(inserted) - kept
    # LRU: what fell off is the oldest.
    assert max(removed) < min(kept)


def test_tier_attrs_are_validated(graph, sess, tmp_path):
    layout = refs.TableLayout(2)
    path = str(tmp_path / "t")
    # Graph construction (refs), each error naming the field.
    for tier, message in [
        (_tier(path, 0), "memory_bytes must be >= 1"),
        (_tier(path, 10**6, disk_bytes=-1), "disk_bytes must be >= 0"),
        (_tier(path, 1.5e6), "memory_bytes must be an integer"),
        (_tier(path, 10**6, policy="mru"), "policy must be one of lru, lfu"),
        (_tier("", 10**6), "non-empty directory"),
    ]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            refs.MutableTableRef.create(layout, tier=tier)
    with pytest.raises(TypeError, match="attributes path, memory_bytes"):
        refs.MutableTableRef.create(layout, tier={"path": path})
    with pytest.raises(tf.errors.InvalidArgumentError, match="cannot store int8 rows"):
        refs.MutableTableRef.create(refs.TableLayout(2, storage="int8_row"), tier=_tier(path, 10**6))

    # The kernel checks the attrs itself (other callers of the op).
    ops = loader.load_ops()
    for attrs, message in [
        (dict(tier_path=path, tier_memory_bytes=0), "tier_memory_bytes must be > 0"),
        (dict(tier_path=path, tier_memory_bytes=-1), "tier_memory_bytes must be >= 0"),
        (dict(tier_path=path, tier_memory_bytes=10**6, tier_disk_bytes=-5), "tier_disk_bytes must be >= 0"),
        (dict(tier_path=path, tier_memory_bytes=10**6, tier_policy="fifo"), 'tier_policy must be "lru" or "lfu"'),
        (dict(tier_memory_bytes=10**6), "need a tier_path"),
        (
            dict(tier_path=path, tier_memory_bytes=10**6, storage="int8_row", compact_cols=2),
            'cannot store int8 rows \\(storage "int8_row"',
        ),
        # The tier's own floor: a budget of a few rows.
        (dict(tier_path=path, tier_memory_bytes=100), "memory_bytes"),
    ]:
        handle = ops.tf_ext_table_handle(dim=2, **attrs)
        with pytest.raises(tf.errors.InvalidArgumentError, match=message) as err:
            sess.run(ops.tf_ext_table_size(handle))
        if "tier_path" in attrs and "storage" in attrs:
            assert path in str(err.value)


def test_store_errors_name_the_table_and_path(graph, sess, tmp_path):
    layout = refs.TableLayout(DIM)
    path = str(tmp_path / "shared_dir")
    memory = _memory_for(100, DIM)
    first = refs.MutableTableRef.create(layout, shared_name="owner", tier=_tier(path, memory))
    second = refs.MutableTableRef.create(layout, shared_name="intruder", tier=_tier(path, memory))
    sess.run(first.size())
    # One store directory per table: a second table of this process on the path takes the private sibling
    # "<path>.1" (another process is refused: test_tiered_faults), and its keys are its own.
    sess.run(second.insert(tf.constant([7], tf.int64), tf.ones([1, DIM]), tf.constant(0, tf.int64)))
    assert sess.run([first.size(), second.size()]) == [0, 1]
    assert os.path.isfile(os.path.join(path + ".1", "TF_EXT_TIER_STORE"))

    # A directory that holds other files is not wiped.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    table = refs.MutableTableRef.create(layout, shared_name="foreign", tier=_tier(foreign, memory))
    with pytest.raises(tf.errors.FailedPreconditionError) as err:
        sess.run(table.size())
    assert str(foreign) in str(err.value)
    assert (foreign / "precious.txt").read_text() == "keep me"

    # A batch with more distinct keys than the budget holds.
    budget = _stats(sess, first)["budget_keys"]
    keys = tf.range(2 * budget, dtype=tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="memory_bytes") as err:
        sess.run(first.find_or_insert(keys, tf.zeros([2 * budget, DIM]), tf.constant(0, tf.int64)))
    assert "owner" in str(err.value)
    assert sess.run(first.size()) == 0

    # One shared table, one tier: another budget under the same shared_name is refused.
    other = refs.MutableTableRef.create(layout, shared_name="owner", tier=_tier(path, 2 * memory))
    with pytest.raises(tf.errors.FailedPreconditionError, match="already exists with tier"):
        sess.run(other.size())
    untiered = refs.MutableTableRef.create(layout, shared_name="owner")
    with pytest.raises(tf.errors.FailedPreconditionError, match="already exists with tier"):
        sess.run(untiered.size())


def _adam_hypers():
    return dict(beta1_power=0.9, beta2_power=0.999, lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7)


@pytest.mark.parametrize("optimizer", ["Adagrad", "Adam", "Ftrl"])
def test_lookup_and_fused_apply_match_untiered(graph, sess, tmp_path, optimizer):
    dim = 8
    hypers = {
        "Adagrad": dict(lr=0.1),
        "Adam": _adam_hypers(),
        "Ftrl": dict(lr=0.05, l1=0.001, l2=0.01, l2_shrinkage=0.0, lr_power=-0.5),
    }[optimizer]
    width = dim * (1 + eo.num_slots(optimizer))
    layout = refs.TableLayout(dim, width, [0.0] * dim + [0.1] * (width - dim), storage="bfloat16")
    twin = _Twin(tmp_path, layout, "apply_" + optimizer)
    budget = _stats(sess, twin.tiered)["budget_keys"]

    def step_ops(t):
        values = eo.embedding_lookup_unique(
            t.handle, twin.keys, dim, step=twin.step, insert_missing=True, init_kind="random_normal", seed=1, seed2=2
        )
        grad = values * 0.5 + tf.cast(tf.reshape(twin.keys % 7, [-1, 1]), tf.float32) * 0.01
        with tf.control_dependencies([values]):
            apply = eo.sparse_apply(optimizer, t.handle, twin.keys, grad, hypers, step=twin.step, dim=dim)
        return values, apply

    ops = twin.both(step_ops)
    rng = np.random.RandomState(3)
    key_space = np.arange(5 * budget, dtype=np.int64)
    for step in range(24):
        keys = _key_batch(rng, key_space, budget // 2)
        (a, _), (b, _) = sess.run(ops, {twin.keys: keys, twin.step: step})
        np.testing.assert_array_equal(a, b, err_msg="lookup at step %d" % step)
        if step % 3 != 2:  # else the background demoter runs beside the next step
            sess.run(twin.settle)
    sess.run(twin.settle)
    _assert_same_contents(sess, twin.plain, twin.tiered)
    stats = _stats(sess, twin.tiered)
    assert stats["cold_reads"] > 0 and stats["demotions"] > 0, stats


def test_pooled_ids_and_multi_table_kernels_match_untiered(graph, sess, tmp_path):
    dim = 4
    width = 2 * dim
    ops = loader.load_ops()
    layout = refs.TableLayout(dim, width)
    twins = [_Twin(tmp_path, layout, "multi_%d" % i) for i in range(2)]
    budget = _stats(sess, twins[0].tiered)["budget_keys"]
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    indices = tf.compat.v1.placeholder(tf.int64, [None, 2])
    step = tf.compat.v1.placeholder(tf.int64, [])
    init = dict(insert_missing=True, count=True, init_kind="random_uniform", init_a=-1.0, init_b=1.0, seed=4, seed2=9)

    def graph_for(side):
        tables = [twin.tables[side] for twin in twins]
        out = {}
        values, unique_keys, _ = ops.tf_ext_embedding_lookup_ids(tables[0].handle, ids, step, dim=dim, **init)
        out["ids"] = values
        pooled = ops.tf_ext_embedding_lookup_sparse(
            tables[1].handle,
            indices,
            ids,
            tf.constant([64, 16], tf.int64),
            tf.zeros([0], tf.int64),
            step,
            dim=dim,
            combiner="sqrtn",
            **init,
        )
        out["pooled"] = pooled[0]
        multi_keys = [unique_keys, pooled[1]]
        multi = ops.tf_ext_embedding_lookup_multi(
            [t.handle for t in tables],
            multi_keys,
            [step, step],
            dims=[dim, dim],
            **{k: [v, v] for k, v in init.items()},
        )
        out["multi"] = multi
        with tf.control_dependencies(list(multi) + [values, pooled[0]]):
            grads = [m * 0.25 + 0.5 for m in multi]
            out["apply"] = ops.tf_ext_embedding_sparse_apply_adagrad_multi(
                [t.handle for t in tables],
                multi_keys,
                grads,
                [tf.constant(0.1)] * 2,
                [step, step],
                dims=[dim, dim],
                slot_offsets=[-1, -1],
            )
        return out

    graphs = [graph_for(0), graph_for(1)]
    rng = np.random.RandomState(8)
    for s in range(16):
        n = budget // 2
        feed_ids = rng.randint(0, 6 * budget, size=n).astype(np.int64)  # duplicates too
        rows = np.sort(rng.randint(0, 64, size=n))
        cols = np.zeros(n, np.int64)
        for i in range(1, n):
            cols[i] = cols[i - 1] + 1 if rows[i] == rows[i - 1] else 0
        feed = {ids: feed_ids, indices: np.stack([rows, np.minimum(cols, 15)], 1), step: s}
        # Unique (row, col) pairs: a row holds at most 16 ids, so cap the ids per row.
        keep = cols < 16
        feed[ids], feed[indices] = feed_ids[keep], feed[indices][keep]
        a, b = sess.run(graphs, feed)
        for name in ("ids", "pooled", "multi"):
            np.testing.assert_array_equal(a[name], b[name], err_msg="%s at step %d" % (name, s))
        if s % 2 == 0:
            for twin in twins:
                sess.run(twin.settle)
    for twin in twins:
        sess.run(twin.settle)
        _assert_same_contents(sess, twin.plain, twin.tiered)
        stats = _stats(sess, twin.tiered)
        assert stats["cold_reads"] > 0 and stats["demotions"] > 0, stats


def test_apply_after_its_rows_left_memory(graph, sess, tmp_path):
    # The optimizer's apply of a lookup's keys, after a demotion moved those rows to disk between the two (the row
    # references the lookup handed over are stale then): the apply brings the rows back and updates them exactly.
    dim = 4
    width = 2 * dim
    layout = refs.TableLayout(dim, width, [0.0] * dim + [0.1] * dim)
    twin = _Twin(tmp_path, layout, "apply_after_demotion")
    budget = _stats(sess, twin.tiered)["budget_keys"]
    others = tf.compat.v1.placeholder(tf.int64, [None])

    def ops_for(t):
        values = eo.embedding_lookup_unique(t.handle, twin.keys, dim, step=twin.step, insert_missing=True)
        crowd = t.find_or_insert(others, tf.ones(tf.stack([tf.size(others), dim])), twin.step + 1)
        grad = tf.fill(tf.stack([tf.size(twin.keys), dim]), 0.5)  # not from the lookup: the apply runs alone
        apply = eo.sparse_apply_adagrad(t.handle, twin.keys, grad, 0.1, step=twin.step + 2, dim=dim)
        return values, crowd, apply

    ops = twin.both(ops_for)
    keys = np.arange(budget // 4, dtype=np.int64) * 5
    crowd = np.arange(budget, dtype=np.int64) + 10**6
    for r in range(3):
        step = 10 * r
        sess.run([o[0] for o in ops], {twin.keys: keys, twin.step: step})
        # Newer rows push the looked-up ones (the oldest) out of memory.
        sess.run([o[1] for o in ops], {others: crowd + r * budget, twin.step: step})
        sess.run(twin.settle)
        before = _stats(sess, twin.tiered)
        sess.run([o[2] for o in ops], {twin.keys: keys, twin.step: step})
        after = _stats(sess, twin.tiered)
        assert after["cold_reads"] - before["cold_reads"] == len(keys), (before, after)
        _assert_same_contents(sess, twin.plain, twin.tiered)
