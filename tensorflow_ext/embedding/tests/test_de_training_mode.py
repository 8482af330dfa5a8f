"""Training mode of lookups built with is_training=None: a lookup turns inserting when an optimizer applies a gradient
that flows through it, and only then; eval towers and exports built in a training graph stay find-only; an optimizer
built after a Session holds the graph is refused (TensorFlow would ignore the change)."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import shard_lookups

# (embedding kwargs, lookup) per lookup flavour: the one-kernel lookup of one shard, the per-shard lookups of two
# shards, the find / find-or-insert pair of an initializer drawn in the graph, the one-kernel pooled lookup.
_ORTHO = tf.compat.v1.orthogonal_initializer(seed=1)
FLAVOURS = {
    "fused": (dict(initializer=0.5), lambda emb, ids: tf_ext.embedding_lookup(emb, ids)),
    "sharded": (dict(initializer=0.5, num_shards=2), lambda emb, ids: tf_ext.embedding_lookup(emb, ids)),
    "graph_initializer": (dict(initializer=_ORTHO), lambda emb, ids: tf_ext.embedding_lookup(emb, ids)),
    "sparse": (
        dict(initializer=0.5),
        lambda emb, ids: tf_ext.embedding_lookup_sparse(
            emb, tf.sparse.from_dense(tf.reshape(ids + 1, [-1, 1])), None, combiner="sum"
        ),
    ),
}


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_eval_lookups_in_a_training_graph_stay_find_only(flavour):
    kwargs, lookup = FLAVOURS[flavour]
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, **kwargs)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        eval_ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(lookup(emb, ids))
        eval_before = lookup(emb, eval_ids)  # an eval tower built before minimize, in the training graph
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        eval_after = lookup(emb, eval_ids)  # and one built after
        size = emb.size()
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run([eval_before, eval_after], {eval_ids: [100, 101, 102]})
            assert sess.run(size) == 0  # eval data grows no table
            sess.run(train, {ids: [1, 2, 2]})  # the training lookup inserts (the usual build-then-minimize)
            assert sess.run(size) == 2
            sess.run([eval_before, eval_after], {eval_ids: [100, 101, 1]})
            assert sess.run(size) == 2


def test_eval_lookups_in_a_training_graph_count_nothing_for_admission():
    policy = tf_ext.embedding.CountAdmission(2)
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5, admission=policy)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        eval_ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids))
        eval_rows = tf_ext.embedding_lookup(emb, eval_ids)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(eval_rows, {eval_ids: [7, 8]})
            assert sess.run([emb.size(), policy.pending_keys(emb)]) == [0, 0]
            sess.run(train, {ids: [7]})  # the first training sighting of 7: counted once, not admitted
            assert sess.run([emb.size(), policy.pending_keys(emb)]) == [0, 1]
            sess.run(train, {ids: [7]})
            assert sess.run(emb.size()) == 1


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_an_optimizer_built_after_a_session_ran_the_lookup_is_refused(flavour):
    kwargs, lookup = FLAVOURS[flavour]
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, **kwargs)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(lookup(emb, ids))
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(loss, {ids: [1]})
            with pytest.raises(shard_lookups.LookupModeError) as info:
                tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
            first_line = str(info.value).splitlines()[0]
            assert "after a Session ran its graph" in first_line
            assert "before the first session.run" in first_line and "is_training=True" in first_line
        # With that Session closed, a new one gets the graph as it is now: building the optimizer works and trains.
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {ids: [1, 2]})
            assert sess.run(emb.size()) == 2


def test_forced_modes_and_an_optimizer_built_before_the_first_run_are_not_refused():
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids, is_training=True))
        frozen = tf_ext.embedding_lookup(emb, ids, is_training=False)
        with tf.compat.v1.Session(graph=g, config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(frozen, {ids: [5]})
            # Nothing to turn inserting (the modes are fixed), no slot columns: nothing the Session would ignore.
            train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
            sess.run(train, {ids: [1, 2]})
            sess.run(frozen, {ids: [5]})
            assert sess.run(emb.size()) == 2
