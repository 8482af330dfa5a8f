"""Feature admission (CountAdmission, BloomAdmission): golden parity with a model that never saw the keys not yet
admitted, counts that survive a checkpoint, inference that counts nothing, the Bloom filter's error rate."""

import collections
import contextlib
import json

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import run_fresh
from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext

DIM, MIN_COUNT = 3, 3
OPTIMIZERS = {
    "Adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.3, initial_accumulator_value=0.2),
    "Ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.2, l1_regularization_strength=0.01),
    "SGD": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.2),
}


def _batches(steps=8, batch=6, vocab=12, seed=0):
    """Per step: ids [batch, 2] (duplicates within and across examples) and labels [batch]."""
    rng = np.random.RandomState(seed)
    return [
        (rng.zipf(1.3, size=[batch, 2]).clip(max=vocab).astype(np.int64) * 7 - 5, rng.normal(size=[batch]))
        for _ in range(steps)
    ]


def _admitted_per_step(batches, min_count):
    """numpy reference of admission: per step, the set of keys that have a row during that step's lookup."""
    counts, has_row, out = collections.Counter(), set(), []
    for ids, _ in batches:
        for k in sorted(set(ids.ravel().tolist()) - has_row):
            counts[k] += 1  # once per lookup call
            if counts[k] >= min_count:
                has_row.add(k)
        out.append(set(has_row))
    return out


def _train(optimizer, batches, admission, keep=None, num_shards=2, combiner="sum", lookup="safe"):
    """Trains a pooled linear model; with `keep` (per step, the keys to keep) the ids not kept are dropped from
    the input instead. Returns {key: (row, slots)} and the losses."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "e",
            DIM,
            initializer=tf.compat.v1.random_normal_initializer(0.0, 0.5, seed=3),
            num_shards=num_shards,
            admission=admission,
        )
        sp = tf.compat.v1.sparse_placeholder(tf.int64)
        labels = tf.compat.v1.placeholder(tf.float32, [None])
        if lookup == "safe":
            pooled = tf_ext.safe_embedding_lookup_sparse(emb, sp, None, combiner=combiner)  # [batch, DIM], 0 if empty
        else:
            # Rows past the last example with an id are not in the output: zeros, as an empty example's.
            pooled = tf_ext.embedding_lookup_sparse(emb, sp, None, combiner=combiner)
            pooled = tf.concat([pooled, tf.zeros([tf.shape(labels)[0] - tf.shape(pooled)[0], DIM])], 0)
        w = tf.compat.v1.get_variable("w", [DIM, 1], initializer=tf.compat.v1.constant_initializer(0.7))
        pred = tf.reshape(tf.matmul(pooled, w), [-1])
        loss = tf.reduce_mean(tf.square(pred - labels))
        train = optimizer().minimize(loss, global_step=gs)
        exported = emb.export(with_slots=True)
        losses = []
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step, (ids, y) in enumerate(batches):
                indices, values = [], []
                for r, row in enumerate(ids):
                    c = 0
                    for k in row:
                        if keep is None or int(k) in keep[step]:
                            indices.append([r, c])
                            values.append(k)
                            c += 1
                value = tf.compat.v1.SparseTensorValue(
                    np.array(indices, np.int64).reshape([-1, 2]), np.array(values, np.int64), [len(ids), 2]
                )
                losses.append(sess.run([train, loss], {sp: value, labels: y})[1])
            e = sess.run(exported)
    return {int(k): (v, s) for k, v, s in zip(e.keys, e.values, e.slots)}, losses


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("policy", ["count", "bloom"])
def test_golden_not_admitted_keys_are_as_if_absent(optimizer, policy):
    """Training with admission == training on the input without the keys not admitted yet (rows, slots, loss)."""
    batches = _batches()
    admission = (
        tf_ext.embedding.CountAdmission(MIN_COUNT)
        if policy == "count"
        else tf_ext.embedding.BloomAdmission(MIN_COUNT, num_counters=1 << 16)  # no collisions among ~12 keys
    )
    got, got_losses = _train(OPTIMIZERS[optimizer], batches, admission)
    keep = _admitted_per_step(batches, MIN_COUNT)
    want, want_losses = _train(OPTIMIZERS[optimizer], batches, None, keep=keep)
    assert sorted(got) == sorted(want) == sorted(keep[-1])
    assert 0 < len(got) < len(set(np.concatenate([b[0].ravel() for b in batches])))  # some, not all, admitted
    for k in want:
        np.testing.assert_allclose(got[k][0], want[k][0], rtol=1e-6, atol=1e-7, err_msg="row of %d" % k)
        np.testing.assert_allclose(got[k][1], want[k][1], rtol=1e-6, atol=1e-7, err_msg="slots of %d" % k)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-6)


@pytest.mark.parametrize("lookup", ["safe", "sparse"])
@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
@pytest.mark.parametrize("policy", ["count", "bloom"])
def test_pooling_leaves_not_admitted_ids_out_of_the_denominators(policy, combiner, lookup):
    """mean / sqrtn pooling with admission == the same pooling of the input without the ids not admitted yet (they
    are not in the denominators; an example left without ids reads zeros, as an empty one)."""
    batches = _batches()
    admission = (
        tf_ext.embedding.CountAdmission(MIN_COUNT, default_value=0.25)  # the default row is not pooled either
        if policy == "count"
        else tf_ext.embedding.BloomAdmission(MIN_COUNT, num_counters=1 << 16)
    )
    kw = dict(combiner=combiner, lookup=lookup)
    got, got_losses = _train(OPTIMIZERS["Adagrad"], batches, admission, **kw)
    want, want_losses = _train(OPTIMIZERS["Adagrad"], batches, None, keep=_admitted_per_step(batches, MIN_COUNT), **kw)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k][0], want[k][0], rtol=1e-5, atol=1e-6, err_msg="row of %d" % k)
        np.testing.assert_allclose(got[k][1], want[k][1], rtol=1e-5, atol=1e-6, err_msg="slots of %d" % k)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)


def _count_model(admission, default_value_ids=None):
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5, admission=admission)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    rows = tf_ext.embedding_lookup(emb, ids)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(rows), global_step=gs)
    return emb, ids, rows, train


def test_counts_survive_a_checkpoint_and_admitted_keys_leave_the_count_table(tmp_path):
    ckpt = str(tmp_path / "m")
    policy = tf_ext.embedding.CountAdmission(3, default_value=-1.0)
    with tf.Graph().as_default():
        emb, ids, rows, train = _count_model(policy)
        pending = policy.pending_keys(emb)
        admitted = policy.admitted_keys_total(emb)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            first = sess.run([rows, train], {ids: [1, 2, 2, 3]})[0]
            np.testing.assert_array_equal(first, -np.ones([4, 2]))  # nothing admitted: the default
            sess.run(train, {ids: [1, 2]})
            assert sess.run([emb.size(), pending, admitted]) == [0, 3, 0]
            saver.save(sess, ckpt)
    with tf.Graph().as_default():
        emb, ids, rows, train = _count_model(tf_ext.embedding.CountAdmission(3, default_value=-1.0))
        policy2 = emb.admission
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, ckpt)
            # The third sighting of 1 and 2 after the restore admits them; 3 (two sightings) still waits.
            got = sess.run([rows, train], {ids: [1, 2, 3]})[0]
            np.testing.assert_array_equal(got, [[0.5, 0.5], [0.5, 0.5], [-1.0, -1.0]])
            assert sess.run([emb.size(), policy2.pending_keys(emb), policy2.admitted_keys_total(emb)]) == [2, 1, 2]
            # A training graph's lookup counts whenever it runs: this is the third sighting of 3.
            got = sess.run(rows, {ids: [1, 3]})
            np.testing.assert_allclose(got, [[0.4, 0.4], [0.5, 0.5]], rtol=1e-6)
            assert sess.run([emb.size(), policy2.pending_keys(emb)]) == [3, 0]


def test_inference_counts_nothing():
    policy = tf_ext.embedding.CountAdmission(2)
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5, admission=policy)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf_ext.embedding_lookup(emb, ids)  # no optimizer: an inference graph
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                np.testing.assert_array_equal(sess.run(rows, {ids: [1, 1, 2]}), np.zeros([3, 2]))
            assert sess.run([emb.size(), policy.pending_keys(emb)]) == [0, 0]


@pytest.mark.parametrize("m,n", [(4096, 1500), (16384, 2000)])
def test_bloom_false_positive_rate_matches_the_formula(m, n):
    """n distinct keys counted once each in one lookup: a key is admitted early (min_count 2) exactly when the other
    keys raised all of its counters, with the probability the formula gives."""
    k = 3
    policy = tf_ext.embedding.BloomAdmission(2, num_counters=m, num_hashes=k)
    with tf.Graph().as_default():
        emb, ids, rows, train = _count_model(policy)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: np.arange(n, dtype=np.int64) * 31 + 7})
            rate = sess.run(emb.size()) / float(n)
    expected = tf_ext.embedding.BloomAdmission.false_positive_rate(n - 1, m, k)
    assert abs(rate - expected) < 0.3 * expected, (rate, expected)


def test_bad_admission_arguments_are_named():
    with pytest.raises(ValueError, match="min_count must be an int"):
        tf_ext.embedding.CountAdmission(0)
    with pytest.raises(ValueError, match="num_hashes must be an int"):
        tf_ext.embedding.BloomAdmission(2, num_hashes=9)
    with pytest.raises(ValueError, match="num_counters must be an int"):
        tf_ext.embedding.BloomAdmission(2, num_counters=3)
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="admission of dynamic embedding 'e' must be"):
            tf_ext.get_dynamic_embedding("e", 2, admission=3)


@pytest.mark.parametrize("cls", ["CountAdmission", "BloomAdmission"])
def test_min_count_beyond_exact_counting_is_refused(cls):
    """Counts are exact up to 2^24 (CountAdmission's are float32): a larger min_count could never admit a key."""
    policy = getattr(tf_ext.embedding, cls)
    assert policy(1 << 24).min_count == 1 << 24
    for bad in ((1 << 24) + 1, 1 << 40):
        with pytest.raises(ValueError, match=r"min_count must be an int in \[1, 16777216\].*exact up to 2\^24"):
            policy(bad)


def test_count_admission_counts_exactly_up_to_its_largest_min_count():
    """A key counted 2^24 - 1 times is not admitted, at its 2^24-th sighting it is (the count's float32 is exact)."""
    policy = tf_ext.embedding.CountAdmission(1 << 24)
    with tf.Graph().as_default():
        emb, ids, rows, train = _count_model(policy)
        table = emb.admission_state["table"]
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(table.insert(tf.constant([5], tf.int64), tf.constant([[float((1 << 24) - 2)]])))
            sess.run(train, {ids: [5]})
            assert sess.run([emb.size(), table.size()]) == [0, 1]
            sess.run(train, {ids: [5]})
            assert sess.run([emb.size(), table.size()]) == [1, 0]


@pytest.mark.parametrize("cls", ["CountAdmission", "BloomAdmission"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e39, True])
def test_default_rows_that_are_not_finite_are_refused(cls, bad):
    with pytest.raises(ValueError, match="default_value must be a finite float32 number.*NaN"):
        getattr(tf_ext.embedding, cls)(2, default_value=bad)


def _admission_model(policy, frozen=False):
    ctx = tf_ext.serving.freeze_for_serving() if frozen else contextlib.nullcontext()
    with ctx:
        with tf.compat.v1.variable_scope("m"):
            emb = tf_ext.get_dynamic_embedding("user", 2, initializer=0.5, num_shards=2, admission=policy)
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        pred = tf.identity(tf.reduce_sum(tf_ext.embedding_lookup(emb, ids), axis=1), name="pred")
    return emb, ids, pred


@pytest.mark.parametrize("policy", ["count", "bloom"])
def test_models_with_admission_export_and_load_in_a_fresh_process(tmp_path, policy):
    """A SavedModel (plain and frozen) and the training checkpoint's MetaGraph of a model with admission load in a
    fresh process (the counts' saveable must name an element of the graph) and serve the trained rows."""
    make = lambda: (  # noqa: E731
        tf_ext.embedding.CountAdmission(2) if policy == "count" else tf_ext.embedding.BloomAdmission(2, 1 << 12)
    )
    ckpt = str(tmp_path / "ckpt" / "m")
    feed = np.array([1, 2, 4, 5], np.int64)  # 4 and 5: one sighting (this run of the training lookup)
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb, ids, pred = _admission_model(make())
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(pred), global_step=gs)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: [1, 2, 3]})
            sess.run(train, {ids: [1, 2]})  # 1 and 2 admitted, 3 waits
            expected = sess.run(pred, {ids: feed})
            tf.compat.v1.train.Saver().save(sess, ckpt)
    np.testing.assert_allclose(expected, [0.8, 0.8, 0.0, 0.0], rtol=1e-6)
    for name in ("plain", "frozen"):  # inference graphs restored from the checkpoint, as an export job builds them
        with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
            emb, ids, pred = _admission_model(make(), frozen=name == "frozen")
            tf.compat.v1.train.Saver().restore(sess, ckpt)
            builder = tf.compat.v1.saved_model.Builder(str(tmp_path / name))
            sig = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"pred": pred})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
            builder.save()
    np.save(str(tmp_path / "ids.npy"), feed)
    out = run_fresh(
        """
        import json
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext
        tf.compat.v1.disable_v2_behavior()
        ids = np.load("ids.npy")
        got = {}
        for name in ("plain", "frozen"):
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                meta = tf.compat.v1.saved_model.load(sess, ["serve"], name)
                sig = meta.signature_def["serving_default"]
                got[name] = sess.run(sig.outputs["pred"].name, {sig.inputs["ids"].name: ids}).tolist()
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            saver = tf.compat.v1.train.import_meta_graph("ckpt/m.meta")
            saver.restore(sess, "ckpt/m")
            # The training graph: its lookup counts, so only the admitted keys are compared.
            got["meta"] = sess.run("pred:0", {"ids:0": ids[:2]}).tolist()
        print(json.dumps(got))
        """,
        tmp_path,
    )
    got = json.loads(out.strip().splitlines()[-1])
    for name in ("plain", "frozen"):
        np.testing.assert_allclose(got[name], expected, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(got["meta"], expected[:2], rtol=1e-6)


def _lookup_flavours():
    """Every lookup with admission, each given ids [[7, 7], [7, 9]] (7 three times in one batch, in two examples)."""
    dense = lambda: tf.constant([[7, 7], [7, 9]], tf.int64)  # noqa: E731
    sparse = lambda: tf.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]], tf.constant([7, 7, 7, 9], tf.int64), [2, 2])
    sparse3 = lambda: tf.SparseTensor(  # noqa: E731
        [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]], tf.constant([7, 7, 7, 9], tf.int64), [2, 1, 2]
    )
    weights = lambda: tf.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]], [1.0, 2.0, 1.0, 1.0], [2, 2])  # noqa: E731
    return {
        "embedding_lookup": lambda e: tf_ext.embedding_lookup(e, dense()),
        "embedding_lookup_sparse": lambda e: tf_ext.embedding_lookup_sparse(e, sparse(), None, combiner="sum"),
        "embedding_lookup_sparse_weighted": lambda e: tf_ext.embedding_lookup_sparse(e, sparse(), weights()),
        "safe_embedding_lookup_sparse": lambda e: tf_ext.safe_embedding_lookup_sparse(e, sparse(), None),
        "safe_weighted_default_id": lambda e: tf_ext.safe_embedding_lookup_sparse(
            e, sparse(), weights(), combiner="sqrtn", default_id=9
        ),
        "safe_rank3": lambda e: tf_ext.safe_embedding_lookup_sparse(e, sparse3(), None, combiner="mean"),
        "tfra_safe_embedding_lookup_sparse": lambda e: tf_ext.tfra.safe_embedding_lookup_sparse(e, sparse(), None),
        "tfra_embedding_lookup_sparse": lambda e: tf_ext.tfra.embedding_lookup_sparse(e, sparse(), None),
    }


@pytest.mark.parametrize("flavour", sorted(_lookup_flavours()))
@pytest.mark.parametrize("policy", ["count", "bloom"])
@pytest.mark.parametrize("num_shards", [1, 2])
def test_every_lookup_counts_a_key_once_per_run_however_often_it_occurs(flavour, policy, num_shards):
    """One rule for every lookup: a training run of a lookup counts each distinct key of its batch once, however
    often it occurs (in one example or several). min_count=2: after one run nothing is admitted, after two all is."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        admission = (
            tf_ext.embedding.CountAdmission(2)
            if policy == "count"
            else tf_ext.embedding.BloomAdmission(2, num_counters=1 << 12)
        )
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5, num_shards=num_shards, admission=admission)
        out = _lookup_flavours()[flavour](emb)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(out), global_step=gs)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            assert sess.run(emb.size()) == 0
            if policy == "count":
                table = emb.admission_state["table"]
                keys, counts, _, _ = sess.run(table.export())
                assert dict(zip(keys.tolist(), counts.ravel().tolist())) == {7: 1.0, 9: 1.0}
            sess.run(train)
            assert sorted(sess.run(emb.export()[0]).tolist()) == [7, 9]


def _fresh_keys_run(admission, steps, batch=64, every_n_steps=2, probe=None):
    """Trains on `batch` never-seen keys per step (each key twice in its step's batch, in one lookup: counted once),
    with an eviction every `every_n_steps` steps that evicts nothing itself. Returns per step (embedding size,
    pending keys or None, admission memory bytes); `probe(sess, emb)` runs after the last step."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "e",
            2,
            initializer=0.5,
            num_shards=2,
            admission=admission,
            eviction=tf_ext.embedding.EvictionPolicy(steps_to_live=1 << 40, every_n_steps=every_n_steps),
        )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf_ext.embedding_lookup(emb, ids)), global_step=gs
        )
        pending = admission.pending_keys(emb) if isinstance(admission, tf_ext.embedding.CountAdmission) else None
        stats = [emb.size(), admission.memory_bytes(emb)] + ([pending] if pending is not None else [])
        out = []
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(steps):
                fresh = np.arange(batch, dtype=np.int64) + 1000003 * (step + 1)
                sess.run(train, {ids: np.concatenate([fresh, fresh])})
                out.append(sess.run(stats))
            if probe is not None:
                probe(sess, emb)
    return out


def test_count_admission_pending_keys_stay_bounded_over_a_long_run_of_fresh_keys():
    """Every key is new and seen once: none is admitted, and without decay the table of waiting keys would hold
    them all. An eviction halves the counts of the keys not seen since the previous one and forgets the keys at 0,
    so a key seen once is forgotten at the second eviction after its sighting: the table holds at most the keys of
    the last two periods, and its memory stops growing with the keys."""
    batch, period, steps = 64, 2, 120
    out = _fresh_keys_run(tf_ext.embedding.CountAdmission(3), steps, batch, period)
    assert all(size == 0 for size, _, _ in out)
    pending = [p for _, _, p in out]
    assert max(pending) <= 2 * period * batch, max(pending)
    memory = [m for _, m, _ in out]
    # The table reuses the memory of forgotten keys: the second half of the run's 3840 fresh keys would need at
    # least 8 bytes each (30 KB); the table's buckets grow by a few hundred bytes at most (their fullest one).
    half = steps - steps // 2
    assert memory[-1] - memory[steps // 2] < half * batch, memory[steps // 2 :]


def test_count_admission_forgets_waiting_keys_that_have_a_row():
    """A waiting key that got its row elsewhere (another data-parallel rank's gradient, a restore) leaves the
    table of waiting keys at the next eviction."""

    def probe(sess, emb):
        table = emb.admission_state["table"]
        sess.run(table.accumulate(tf.constant([11, 12], tf.int64), tf.constant([[2.0], [2.0]])))
        sess.run(emb.insert(tf.constant([11], tf.int64), tf.ones([1, 2])))  # 11 has a row now, 12 waits
        sess.run(tf_ext.embedding.evict(emb))
        keys, counts, _, _ = sess.run(table.export())
        got = dict(zip(keys.tolist(), counts.ravel().tolist()))
        assert 11 not in got and got[12] == 1.0, got  # 12: not seen since the last eviction, halved

    _fresh_keys_run(tf_ext.embedding.CountAdmission(3), 2, probe=probe)


def test_bloom_filter_decays_instead_of_filling_up():
    """Without decay, a filter that counted many more distinct keys than it has counters reads every key as seen:
    each fresh key would be admitted at its first sighting, admission switched off. Halved at each eviction, it
    holds the recent keys' counts: fresh keys keep waiting (their rate of early admission is the false positive
    rate of the keys of about two periods)."""
    num_counters, batch, period, steps = 4096, 64, 2, 100  # 6400 distinct keys, 1.6 per counter
    policy = tf_ext.embedding.BloomAdmission(2, num_counters=num_counters, num_hashes=3)
    out = _fresh_keys_run(policy, steps, batch, period)
    sizes = [size for size, _ in out]
    admitted_last_half = (sizes[-1] - sizes[steps // 2]) / float(batch * (steps - steps // 2 - 1))
    # The formula's rate for 4 periods of keys (the halved counts of older ones rarely reach 2 together).
    bound = tf_ext.embedding.BloomAdmission.false_positive_rate(4 * period * batch, num_counters, 3)
    assert admitted_last_half < max(3 * bound, 0.05), (admitted_last_half, bound)
    assert all(m == 4 * num_counters for _, m in out)


def test_bloom_filter_memory_is_its_counters(tmp_path):
    """The filter's int32 counters are the memory it adds to a process: 4 bytes per counter (not twice that: the
    zeros it starts from must not stay in the graph as a constant the session keeps). Measured in a fresh process
    with TensorFlow's plain CPU allocator (oneDNN's pools freed buffers for later tensors, see docs/embedding.md)."""
    out = run_fresh(
        """
        import os
        import tensorflow as tf
        import tensorflow_ext as tf_ext
        tf.compat.v1.disable_v2_behavior()

        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        n = 1 << 24
        policy = tf_ext.embedding.BloomAdmission(2, num_counters=n)
        emb = tf_ext.get_dynamic_embedding("e", 2, admission=policy)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf_ext.embedding_lookup(emb, ids, is_training=True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.reduce_sum(tf.range(10)))  # the session's own start-up memory, before the filter exists
            before = rss()
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(rows, {ids: [1, 2, 3]})
            grown = rss() - before
            print("grown", grown, "memory_bytes", sess.run(policy.memory_bytes(emb)))
        """,
        tmp_path,
        env={"TF_ENABLE_ONEDNN_OPTS": "0"},
    )
    words = out.split()
    grown, memory = int(words[words.index("grown") + 1]), int(words[words.index("memory_bytes") + 1])
    assert memory == 4 << 24
    assert memory * 0.9 < grown < memory * 1.4, (grown, memory)


@pytest.mark.parametrize("every_n_steps", [1, 2])
def test_count_admission_admits_a_key_seen_in_every_eviction_period(every_n_steps):
    """Decay forgets keys that stopped coming, not keys that keep coming: a key seen once per step reaches
    min_count at its min_count-th sighting however often evictions run (halving every count at each eviction kept a
    key seen once per period at a count of 1: with eviction every step, nothing was ever admitted)."""
    min_count = 4
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "e",
            2,
            initializer=0.5,
            admission=tf_ext.embedding.CountAdmission(min_count),
            eviction=tf_ext.embedding.EvictionPolicy(steps_to_live=1 << 40, every_n_steps=every_n_steps),
        )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf_ext.embedding_lookup(emb, ids)), global_step=gs
        )
        pending = emb.admission.pending_keys(emb)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sizes = []
            for step in range(min_count + 2 * every_n_steps):
                # 7 in every step; a fresh key once (it must still be forgotten, two periods after its sighting).
                sess.run(train, {ids: [7, 100 + step]})
                sizes.append(sess.run([emb.size(), pending]))
    assert [s for s, _ in sizes[: min_count - 1]] == [0] * (min_count - 1), sizes
    assert sizes[min_count - 1][0] == 1, sizes  # 7, at its min_count-th sighting
    assert max(p for _, p in sizes) <= 2 * every_n_steps + 1, sizes  # fresh keys still expire


@pytest.mark.parametrize("cls", ["CountAdmission", "BloomAdmission"])
def test_policies_that_differ_in_their_default_row_are_told_apart(cls):
    """The repr names every argument that differs (the Horovod model check and the reuse error compare and print
    it): two policies with other default rows are not shown as the same policy."""
    policy = getattr(tf_ext.embedding, cls)
    assert repr(policy(2)) != repr(policy(2, default_value=0.5))
    assert "default_value=0.5" in repr(policy(2, default_value=0.5))
    assert "default_value" not in repr(policy(2))
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
            tf_ext.get_dynamic_embedding("e", 2, admission=policy(2))
            with pytest.raises(ValueError, match=r"default_value=0\.5\).*but it has .*\(min_count=2[,)]"):
                tf_ext.get_dynamic_embedding("e", 2, admission=policy(2, default_value=0.5))


@pytest.mark.parametrize("lookup", ["embedding_lookup_sparse", "safe_embedding_lookup_sparse"])
def test_pooled_lookups_with_admission_take_weights_of_any_float_dtype(lookup):
    """float64 weights (a tf.data pipeline's) pool as without admission (TensorFlow casts them to the rows' dtype);
    the not-admitted mask must not require float32 weights."""
    got = []
    for admission in (None, tf_ext.embedding.CountAdmission(2)):
        with tf.Graph().as_default():
            emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5, admission=admission)
            sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 2, 3], tf.int64), [2, 2])
            w = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1.0, 3.0, 2.0], tf.float64), [2, 2])
            out = getattr(tf_ext, lookup)(emb, sp, w, combiner="mean", is_training=True)
            with tf.compat.v1.Session(config=session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                if admission is not None:
                    sess.run(out)  # first sighting: nothing admitted yet
                got.append(sess.run(out))
    np.testing.assert_allclose(got[1], got[0])


@pytest.mark.parametrize("min_count,admitted", [(3, True), (4, False)])
def test_bloom_admission_needs_min_count_below_twice_the_sightings_per_eviction_period(min_count, admitted):
    """As documented: the filter halves every counter at each eviction, so a key seen s times per eviction period
    counts at most 2 * s - 1 (here s = 2: eviction every 2 steps, the key in every step)."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "e",
            2,
            initializer=0.5,
            admission=tf_ext.embedding.BloomAdmission(min_count, num_counters=1 << 12),
            eviction=tf_ext.embedding.EvictionPolicy(steps_to_live=1 << 40, every_n_steps=2),
        )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf_ext.embedding_lookup(emb, ids)), global_step=gs
        )
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(12):
                sess.run(train, {ids: [7]})
            assert sess.run(emb.size()) == int(admitted)


@pytest.mark.parametrize("min_count,warned", [(3, False), (4, True)])
def test_bloom_admission_that_in_step_eviction_keeps_out_is_warned_about(caplog, min_count, warned):
    """BloomAdmission(min_count >= 2 * every_n_steps) with an in-step EvictionPolicy: a key looked up once per step
    can never be admitted; the graph's build says so (a warning: several lookups per step count more)."""
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "e",
            2,
            admission=tf_ext.embedding.BloomAdmission(min_count, num_counters=1 << 12),
            eviction=tf_ext.embedding.EvictionPolicy(steps_to_live=100, every_n_steps=2),
        )
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64)))
        with caplog.at_level("WARNING", logger="tensorflow"):
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=gs)
    messages = [r.getMessage() for r in caplog.records if "never reach" in r.getMessage()]
    assert len(messages) == int(warned), messages
    if warned:
        assert "dynamic embedding e" in messages[0] and "CountAdmission" in messages[0], messages
