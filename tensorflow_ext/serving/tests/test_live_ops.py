"""The live model's ops (`TfExtLive*`) in a graph built by hand: frozen tables restored with TfExtFrozenTableBuild, a
dense variable, one pin per request, and updates fed as tensors (no files).

Every read is compared with a reference kept in Python dicts and numpy (float16 rows: numpy's float16 rounding, which
the table's nearest-even rounding matches): random deltas, full updates, compactions, stale updates, gaps and
resyncs, refused updates (foreign model, other layout, bad shapes, a key twice) that publish nothing, a request
whose reads straddle an apply, and two threads applying one update.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.serving import live_ops
from tensorflow_ext.serving import update_format
from tensorflow_ext.utils.loader import load_ops

MODEL = "ctr"
# Two table slots (float32 rows and float16 rows) and one dense slot.
DIMS = (3, 2)
STORAGES = ("float32", "float16")
SHARDS = ("emb/part_0", "emb/part_1")
DENSE_SHAPE = (2, 3)
START_STEP = 100
WAIT_SECS = 60  # a bound on event waits, so that a broken test fails instead of hanging


def _layout():
    return update_format.layout(
        [update_format.table_entry(name, dim) for name, dim in zip(SHARDS, DIMS)]
        + [update_format.dense_entry("dense/w:0", "float32", DENSE_SHAPE)]
    )


def _stored(slot, rows):
    """The rows as table slot `slot` reads them back."""
    rows = np.asarray(rows, np.float32).reshape(-1, DIMS[slot])
    return rows.astype(np.float16).astype(np.float32) if STORAGES[slot] == "float16" else rows


class LiveGraph:
    """A served graph over a live model, with fed apply and check ops and a Python reference of its contents."""

    def __init__(self, ref_variable=False, layout=None, global_step=True):
        self.graph = tf.Graph()
        ops = load_ops()
        with self.graph.as_default():
            self.tables = [
                ops.tf_ext_frozen_table_handle(dim=dim, storage=storage, name="table%d" % i)
                for i, (dim, storage) in enumerate(zip(DIMS, STORAGES))
            ]
            self.build_keys = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in DIMS]
            self.build_values = [tf.compat.v1.placeholder(tf.float32, [None, dim]) for dim in DIMS]
            self.build = [
                ops.tf_ext_frozen_table_build(t, k, v)
                for t, k, v in zip(self.tables, self.build_keys, self.build_values)
            ]
            with tf.compat.v1.variable_scope("dense"):
                self.w = tf.compat.v1.get_variable(
                    "w", initializer=tf.zeros(DENSE_SHAPE), use_resource=not ref_variable
                )
            self.w_value = tf.compat.v1.placeholder(tf.float32, DENSE_SHAPE)
            self.assign_w = tf.compat.v1.assign(self.w, self.w_value)
            w_read = tf.identity(self.w) if ref_variable else self.w.read_value()
            step = [tf.constant(START_STEP, tf.int64)] if global_step else []
            self.model = live_ops.model_handle(MODEL, _layout() if layout is None else layout)
            start = (self.tables, [w_read], step)
            self.pin = live_ops.pin(self.model, *start)
            self.keys = tf.compat.v1.placeholder(tf.int64, [None])
            self.finds = [live_ops.find(self.pin, self.keys, -1.0, slot=slot, dim=dim) for slot, dim in enumerate(DIMS)]
            self.dense = live_ops.dense(self.pin, 0, tf.float32, DENSE_SHAPE)
            self.version = live_ops.version(self.pin)
            self.stats = live_ops.stats(self.model)
            # The update's tensors, fed.
            self.meta = {
                "model_name": tf.compat.v1.placeholder(tf.string, []),
                "layout": tf.compat.v1.placeholder(tf.string, []),
                "kind": tf.compat.v1.placeholder(tf.string, []),
                "from_step": tf.compat.v1.placeholder(tf.int64, []),
                "to_step": tf.compat.v1.placeholder(tf.int64, []),
            }
            self.up_keys = [tf.compat.v1.placeholder(tf.int64, None) for _ in DIMS]
            self.up_values = [tf.compat.v1.placeholder(tf.float32, None) for _ in DIMS]
            self.up_removed = [tf.compat.v1.placeholder(tf.int64, None) for _ in DIMS]
            self.up_dense = tf.compat.v1.placeholder(tf.float32, None)
            meta = [self.meta[k] for k in ("model_name", "layout", "kind", "from_step", "to_step")]
            self.check = live_ops.check_update(self.model, *start, *meta)
            self.apply = live_ops.apply(
                self.model, *start, *meta, self.up_keys, self.up_values, self.up_removed, [self.up_dense]
            )
        self.session = tf.compat.v1.Session(
            graph=self.graph, config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
        )
        # The reference: {key: row} per slot, the dense value and the version.
        self.rows = [{}, {}]
        self.w_ref = np.zeros(DENSE_SHAPE, np.float32)
        self.version_ref = START_STEP if global_step else 0

    def restore(self, rng, n=(40, 30), w=None):
        """Fills the frozen tables (and the dense variable) as a SavedModel restore would."""
        feeds = {}
        for slot in range(len(DIMS)):
            keys = rng.choice(1000, n[slot], replace=False).astype(np.int64)
            values = rng.standard_normal((n[slot], DIMS[slot])).astype(np.float32)
            feeds[self.build_keys[slot]] = keys
            feeds[self.build_values[slot]] = values
            self.rows[slot] = dict(zip(keys.tolist(), _stored(slot, values)))
        self.w_ref = rng.standard_normal(DENSE_SHAPE).astype(np.float32) if w is None else w
        self.session.run(self.build, feeds)
        self.session.run(self.assign_w, {self.w_value: self.w_ref})

    def update_feeds(self, kind, from_step, to_step, keys, values, removed, w, model_name=MODEL, layout=None):
        feeds = {
            self.meta["model_name"]: model_name,
            self.meta["layout"]: _layout() if layout is None else layout,
            self.meta["kind"]: kind,
            self.meta["from_step"]: from_step,
            self.meta["to_step"]: to_step,
            self.up_dense: w,
        }
        for slot in range(len(DIMS)):
            feeds[self.up_keys[slot]] = np.asarray(keys[slot], np.int64)
            feeds[self.up_values[slot]] = np.asarray(values[slot], np.float32).reshape(-1, DIMS[slot])
            feeds[self.up_removed[slot]] = np.asarray(removed[slot], np.int64)
        return feeds

    def apply_update(self, kind, from_step, to_step, keys, values, removed, w, **kwargs):
        """Runs the apply op; on success updates the reference the way the update format says."""
        version, applied = self.session.run(
            self.apply, self.update_feeds(kind, from_step, to_step, keys, values, removed, w, **kwargs)
        )
        if applied:
            self.record(kind, to_step, keys, values, removed, w)
        return version, applied

    def record(self, kind, to_step, keys, values, removed, w):
        """Applies an update to the reference: removals first, then rows (a full update replaces every row)."""
        for slot in range(len(DIMS)):
            if kind == update_format.KIND_FULL:
                self.rows[slot] = {}
            for k in removed[slot]:
                self.rows[slot].pop(int(k), None)
            stored = _stored(slot, values[slot])
            for i, k in enumerate(keys[slot]):
                self.rows[slot][int(k)] = stored[i]
        self.w_ref = np.asarray(w, np.float32)
        self.version_ref = to_step

    def expected(self, slot, probe):
        rows = [self.rows[slot].get(int(k)) for k in probe]
        values = np.stack([r if r is not None else np.full(DIMS[slot], -1.0, np.float32) for r in rows])
        return values, np.array([r is not None for r in rows])

    def check_reads(self, probe):
        """One request (one pin): every table, the dense value and the version equal the reference."""
        (v0, f0), (v1, f1), dense, version = self.session.run(
            [self.finds[0], self.finds[1], self.dense, self.version], {self.keys: probe}
        )
        for slot, (values, found) in enumerate(((v0, f0), (v1, f1))):
            want_values, want_found = self.expected(slot, probe)
            np.testing.assert_array_equal(values, want_values)
            np.testing.assert_array_equal(found, want_found)
        np.testing.assert_array_equal(dense, self.w_ref)
        assert version == self.version_ref
        stats = dict(zip(live_ops.STATS_FIELDS, self.session.run(self.stats)))
        assert stats["version"] == self.version_ref
        assert stats["live_keys"] == sum(len(r) for r in self.rows)
        return stats

    def close(self):
        self.session.close()


@pytest.fixture
def live():
    graphs = []

    def make(**kwargs):
        g = LiveGraph(**kwargs)
        graphs.append(g)
        return g

    yield make
    for g in graphs:
        g.close()


def _random_delta(g, rng, max_rows=25, max_removed=10):
    keys, values, removed = [], [], []
    for slot in range(len(DIMS)):
        present = sorted(g.rows[slot])
        gone = list(rng.choice(present, min(len(present), int(rng.integers(0, max_removed))), replace=False))
        gone += rng.integers(0, 1200, 2).tolist()  # absent keys too
        new = set(rng.integers(0, 1200, int(rng.integers(0, max_rows))).tolist())
        if gone and rng.random() < 0.5:
            new.add(int(gone[0]))  # removed and set again: present with its new row
        keys.append(sorted(new))
        values.append(rng.standard_normal((len(new), DIMS[slot])).astype(np.float32))
        removed.append([int(k) for k in gone])
    return keys, values, removed


def _probe(rng):
    return np.concatenate([np.arange(0, 1200), rng.integers(-50, 5000, 100)]).astype(np.int64)


def test_starts_from_the_frozen_tables_dense_value_and_global_step(live):
    rng = np.random.default_rng(1)
    g = live()
    assert g.session.run(g.stats)[0] == -1  # not started before a pin
    g.restore(rng)
    stats = g.check_reads(_probe(rng))
    assert stats["applies"] == stats["stale"] == stats["refused"] == stats["overlay_keys"] == 0
    assert stats["memory_bytes"] > 0


def test_without_global_step_the_version_starts_at_zero(live):
    rng = np.random.default_rng(2)
    g = live(global_step=False)
    g.restore(rng)
    g.check_reads(_probe(rng))
    assert g.version_ref == 0


def test_random_deltas_full_updates_and_compactions_match_the_reference(live):
    rng = np.random.default_rng(3)
    g = live()
    g.restore(rng, n=(300, 200))
    probe = _probe(rng)
    g.check_reads(probe)
    step = START_STEP
    fulls = 0
    for i in range(30):
        if i % 11 == 10:
            keys = [rng.choice(1200, 150, replace=False) for _ in DIMS]
            values = [rng.standard_normal((150, dim)).astype(np.float32) for dim in DIMS]
            version, applied = g.apply_update(
                "full", 0, step + 7, keys, values, [[], []], rng.standard_normal(DENSE_SHAPE)
            )
            fulls += 1
        else:
            keys, values, removed = _random_delta(g, rng)
            # A delta from any step up to the served version applies.
            version, applied = g.apply_update(
                "delta",
                int(rng.integers(0, step + 1)),
                step + 7,
                keys,
                values,
                removed,
                rng.standard_normal(DENSE_SHAPE),
            )
        step += 7
        assert applied and version == step
        stats = g.check_reads(probe)
    assert stats["applies"] == 30
    # The overlays grew past a quarter of their bases more than once: compactions ran, with identical reads.
    assert stats["compactions"] > 0
    assert fulls == 2


def test_stale_update_changes_nothing(live):
    rng = np.random.default_rng(4)
    g = live()
    g.restore(rng)
    probe = _probe(rng)
    keys, values, removed = _random_delta(g, rng)
    for from_step, to_step in ((0, START_STEP), (50, 80)):
        feeds = g.update_feeds("delta", from_step, to_step, keys, values, removed, np.ones(DENSE_SHAPE))
        assert not g.session.run(g.check, feeds)
        version, applied = g.session.run(g.apply, feeds)
        assert (version, applied) == (START_STEP, False)
    full = g.update_feeds("full", 0, START_STEP, keys, values, [[], []], np.ones(DENSE_SHAPE))
    assert tuple(g.session.run(g.apply, full)) == (START_STEP, False)
    stats = g.check_reads(probe)
    assert stats["stale"] == 3 and stats["applies"] == 0 and stats["refused"] == 0


def test_gap_is_refused_until_a_full_update_resyncs(live):
    rng = np.random.default_rng(5)
    g = live()
    g.restore(rng)
    probe = _probe(rng)
    keys, values, removed = _random_delta(g, rng)
    feeds = g.update_feeds("delta", START_STEP + 5, START_STEP + 9, keys, values, removed, np.ones(DENSE_SHAPE))
    message = (
        "served version 100, the update holds changes from step 105 to 109: apply the updates before it, "
        "or a full update"
    )
    with pytest.raises(tf.errors.FailedPreconditionError, match=message):
        g.session.run(g.check, feeds)
    with pytest.raises(tf.errors.FailedPreconditionError, match=message):
        g.session.run(g.apply, feeds)
    stats = g.check_reads(probe)
    assert stats["refused"] == 2 and stats["applies"] == 0
    # The missing delta arrives: then the refused one applies.
    g.apply_update("delta", START_STEP, START_STEP + 5, *_random_delta(g, rng), np.full(DENSE_SHAPE, 2.0))
    g.apply_update("delta", START_STEP + 5, START_STEP + 9, keys, values, removed, np.ones(DENSE_SHAPE))
    g.check_reads(probe)
    # A later gap, resynced by a full update.
    with pytest.raises(tf.errors.FailedPreconditionError, match="served version 109, "):
        g.apply_update("delta", 200, 210, *_random_delta(g, rng), np.ones(DENSE_SHAPE))
    keys = [rng.choice(1200, 50, replace=False) for _ in DIMS]
    values = [rng.standard_normal((50, dim)) for dim in DIMS]
    assert g.apply_update("full", 0, 210, keys, values, [[], []], np.full(DENSE_SHAPE, 3.0)) == (210, True)
    g.check_reads(probe)


def test_foreign_model_and_other_layout_are_refused_naming_both(live):
    rng = np.random.default_rng(6)
    g = live()
    g.restore(rng)
    probe = _probe(rng)
    update = _random_delta(g, rng)
    with pytest.raises(tf.errors.InvalidArgumentError, match="update for model 'other', this model is 'ctr'"):
        g.apply_update("delta", 0, 200, *update, np.ones(DENSE_SHAPE), model_name="other")
    other = _layout().replace("table emb/part_1 2", "table emb/part_1 4")
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="update for model 'ctr' has another layout: the model has 'table emb/part_1 2', "
        "the update has 'table emb/part_1 4'",
    ):
        g.session.run(g.check, g.update_feeds("delta", 0, 200, *update, np.ones(DENSE_SHAPE), layout=other))
    missing = "\n".join(line for line in _layout().splitlines() if not line.startswith("dense"))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="the model has 'dense dense/w float32 2,3', the update has no such entry"
    ):
        g.apply_update("delta", 0, 200, *update, np.ones(DENSE_SHAPE), layout=missing)
    stats = g.check_reads(probe)
    assert stats["refused"] == 3 and stats["applies"] == 0
    # More lines in the update than the model reads is fine (the trainer writes variables it does not serve).
    more = update_format.layout(_layout().splitlines() + ["dense global_step int64 scalar"])
    assert g.apply_update("delta", 0, 200, *update, np.ones(DENSE_SHAPE), layout=more) == (200, True)
    g.check_reads(probe)


def test_bad_shapes_and_duplicate_keys_publish_nothing(live):
    rng = np.random.default_rng(7)
    g = live()
    g.restore(rng)
    probe = _probe(rng)
    keys, values, removed = _random_delta(g, rng)
    keys[0] = [1, 2]
    values[0] = np.ones((2, DIMS[0]), np.float32)
    good_w = np.ones(DENSE_SHAPE)

    def refused(error, match, feeds):
        with pytest.raises(error, match=match):
            g.session.run(g.apply, feeds)

    feeds = g.update_feeds("delta", 0, 200, keys, values, removed, good_w)
    feeds[g.up_values[0]] = np.ones((2, DIMS[0] + 1), np.float32)
    refused(
        tf.errors.InvalidArgumentError,
        r"table slot 0: values must be \[2, 3\] \(one row of dim=3 floats per key\), got shape \[2,4\]",
        feeds,
    )
    feeds = g.update_feeds("delta", 0, 200, keys, values, removed, good_w)
    feeds[g.up_keys[1]] = np.zeros((2, 2), np.int64)
    refused(tf.errors.InvalidArgumentError, r"table slot 1: keys must be a vector, got shape \[2,2\]", feeds)
    feeds = g.update_feeds("delta", 0, 200, keys, values, removed, np.ones((3, 2)))
    refused(
        tf.errors.InvalidArgumentError,
        r"dense slot 0: the update's value is float \[3,2\], the live model's is float \[2,3\]",
        feeds,
    )
    full = g.update_feeds("full", 0, 200, keys, values, removed, good_w)
    refused(tf.errors.InvalidArgumentError, r"table slot 0: a full update removes no keys, got \d+ removed keys", full)
    feeds = g.update_feeds("delta", 0, 200, keys, values, removed, good_w)
    feeds[g.meta["kind"]] = "partial"
    refused(tf.errors.InvalidArgumentError, "update kind must be 'delta' or 'full', got 'partial'", feeds)
    # A key twice in slot 1, after slot 0 would have applied: nothing is published.
    dup_keys = [keys[0], [5, 6, 5]]
    dup_values = [values[0], np.ones((3, DIMS[1]), np.float32)]
    feeds = g.update_feeds("delta", 0, 200, dup_keys, dup_values, removed, good_w)
    refused(tf.errors.InvalidArgumentError, "table slot 1: frozen table: key 5 occurs more than once", feeds)
    stats = g.check_reads(probe)
    assert stats["refused"] == 6 and stats["applies"] == 0
    # The same update with its shapes right applies.
    assert g.apply_update("delta", 0, 200, keys, values, removed, good_w) == (200, True)
    g.check_reads(probe)


def test_reads_from_a_pin_are_bad_slot_or_dim_errors(live):
    rng = np.random.default_rng(8)
    g = live()
    g.restore(rng)
    with g.graph.as_default():
        bad_slot = live_ops.find(g.pin, g.keys, 0.0, slot=2, dim=3)
        bad_dim = live_ops.find(g.pin, g.keys, 0.0, slot=1, dim=3)
        bad_dense = live_ops.dense(g.pin, 0, tf.float32, [3, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="table slot 2 is out of range: the live model has 2"):
        g.session.run(bad_slot, {g.keys: [1]})
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="table slot 1 of the live model has dim=2, this find asks for dim=3"
    ):
        g.session.run(bad_dim, {g.keys: [1]})
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dense slot 0 of the live model is float \[2,3\]"):
        g.session.run(bad_dense)


def test_a_layout_that_does_not_describe_the_inputs_is_refused(live):
    rng = np.random.default_rng(9)
    layout = _layout().replace("table emb/part_0 3", "table emb/part_0 5")
    g = live(layout=layout)
    g.restore(rng)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"live model 'ctr': its layout does not describe its inputs: the inputs are \['dense float32 2,3', "
        r"'table 2', 'table 3'\], the layout's lines \(names left out\) are \['dense float32 2,3', 'table 2', "
        r"'table 5'\]",
    ):
        g.session.run(g.version)


def test_a_published_version_never_changes_after_start(live):
    # A ref variable's read shares its buffer: an assignment after the start must not reach the served value, and a
    # frozen table restored after the start is not seen (a new SavedModel is how to serve it).
    rng = np.random.default_rng(10)
    g = live(ref_variable=True)
    g.restore(rng)
    probe = _probe(rng)
    g.check_reads(probe)
    saved_rows = [dict(r) for r in g.rows]
    saved_w = g.w_ref.copy()
    g.restore(rng)  # new frozen tables and a new dense value
    g.rows, g.w_ref = saved_rows, saved_w
    g.check_reads(probe)


def test_a_request_straddling_an_apply_reads_one_version(live):
    # One request: find in slot 0, then (gated) find in slot 1, the dense value and the version. The gate lets an
    # apply from another thread publish a new version between the request's reads; every read must still come from
    # the version the request pinned.
    rng = np.random.default_rng(11)
    g = live()
    g.restore(rng)
    probe = _probe(rng)
    pinned, applied = threading.Event(), threading.Event()

    def gate(x):
        pinned.set()
        if not applied.wait(WAIT_SECS):
            raise RuntimeError("the apply did not finish")
        return x

    with g.graph.as_default():
        first, _ = g.finds[0]
        gated = tf.compat.v1.py_func(gate, [g.keys], tf.int64, stateful=True)
        gated.set_shape([None])
        with tf.control_dependencies([first]):
            gated = tf.identity(gated)
        with tf.control_dependencies([gated]):
            later = [
                live_ops.find(g.pin, gated, -1.0, slot=1, dim=DIMS[1])[0],
                live_ops.dense(g.pin, 0, tf.float32, DENSE_SHAPE),
                live_ops.version(g.pin),
            ]
    before = ([g.expected(0, probe)[0], g.expected(1, probe)[0], g.w_ref.copy()], g.version_ref)
    result = {}

    def request():
        result["out"] = g.session.run([first] + later, {g.keys: probe})

    t = threading.Thread(target=request)
    t.start()
    assert pinned.wait(WAIT_SECS)
    keys = [rng.choice(1200, 500, replace=False) for _ in DIMS]
    values = [rng.standard_normal((500, dim)).astype(np.float32) for dim in DIMS]
    assert g.apply_update("full", 0, 300, keys, values, [[], []], np.full(DENSE_SHAPE, 9.0)) == (300, True)
    applied.set()
    t.join(WAIT_SECS)
    assert not t.is_alive()
    v0, v1, dense, version = result["out"]
    np.testing.assert_array_equal(v0, before[0][0])
    np.testing.assert_array_equal(v1, before[0][1])
    np.testing.assert_array_equal(dense, before[0][2])
    assert version == before[1] == START_STEP
    # A new request reads the new version.
    g.check_reads(probe)


def test_two_threads_applying_one_update_apply_it_once(live):
    rng = np.random.default_rng(12)
    g = live()
    g.restore(rng)
    probe = _probe(rng)
    update = _random_delta(g, rng, max_rows=200)
    w = np.full(DENSE_SHAPE, 4.0)
    feeds = g.update_feeds("delta", START_STEP, 150, *update, w)
    barrier = threading.Barrier(2)
    results = [None, None]

    def applier(i):
        barrier.wait(WAIT_SECS)
        results[i] = tuple(g.session.run(g.apply, feeds))

    threads = [threading.Thread(target=applier, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_SECS)
    assert sorted(results) == [(150, False), (150, True)]
    g.record("delta", 150, *update, w)
    stats = g.check_reads(probe)
    assert stats["applies"] == 1 and stats["stale"] == 1


def test_frozen_tables_give_up_their_rows_once_no_version_reads_them(live):
    # The model starts from the frozen tables' rows without a copy; once a full update (or a compaction) replaced a
    # slot's base, that frozen table is emptied so the rows can be freed (one set of tables in memory, not two).
    rng = np.random.default_rng(13)
    g = live()
    g.restore(rng, n=(40, 30))
    probe = _probe(rng)
    with g.graph.as_default():
        sizes = [load_ops().tf_ext_frozen_table_size(t) for t in g.tables]
    g.check_reads(probe)
    # A small delta: no compaction (overlays under a quarter of the bases), both frozen tables still hold their rows.
    update = ([[1], [2]], [np.ones((1, 3)), np.ones((1, 2))], [[], []])
    g.apply_update("delta", START_STEP, START_STEP + 1, *update, np.ones(DENSE_SHAPE))
    stats = g.check_reads(probe)
    assert stats["compactions"] == 0
    assert g.session.run(sizes) == [40, 30]
    # A delta of 20 new keys in slot 0: its overlay passes a quarter of its base and the slot is compacted.
    update = ([np.arange(2000, 2020), []], [np.ones((20, 3)), np.ones((0, 2))], [[], []])
    g.apply_update("delta", START_STEP + 1, START_STEP + 2, *update, np.ones(DENSE_SHAPE))
    stats = g.check_reads(probe)
    assert stats["compactions"] == 1 and stats["overlay_keys"] == 1  # slot 1's key 2 is still in its overlay
    assert g.session.run(sizes) == [0, 30]
    # A full update replaces both bases.
    keys = [rng.choice(1200, 20, replace=False) for _ in DIMS]
    values = [rng.standard_normal((20, dim)) for dim in DIMS]
    g.apply_update("full", 0, START_STEP + 3, keys, values, [[], []], np.ones(DENSE_SHAPE))
    g.check_reads(probe)
    assert g.session.run(sizes) == [0, 0]
