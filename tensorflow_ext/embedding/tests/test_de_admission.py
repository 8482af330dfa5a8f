"""Feature admission (CountAdmission, BloomAdmission): golden parity with a model that never saw the keys not yet
admitted, counts that survive a checkpoint, inference that counts nothing, the Bloom filter's error rate."""

import collections

import numpy as np
import pytest
import tensorflow as tf

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


def _train(optimizer, batches, admission, keep=None, num_shards=2):
    """Trains a sum-pooled linear model; with `keep` (per step, the keys to keep) the ids not kept are dropped from
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
        pooled = tf_ext.safe_embedding_lookup_sparse(emb, sp, None, combiner="sum")  # [batch, DIM], 0 if empty
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
