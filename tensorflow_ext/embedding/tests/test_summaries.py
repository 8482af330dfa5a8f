"""`DynamicEmbedding.memory_bytes` and `tf_ext.embedding.add_summaries` (TensorBoard scalars)."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext


def _scalars(serialized):
    """tag -> value of a serialized Summary proto."""
    summary = tf.compat.v1.Summary()
    summary.ParseFromString(serialized)
    return {v.tag: v.simple_value for v in summary.value}


def _fill(emb, keys):
    return emb.insert(tf.constant(keys, tf.int64), tf.ones([len(keys), emb.dim]))


@pytest.mark.parametrize("num_shards", [1, 3])
def test_merged_summary_has_size_memory_and_bytes_per_key(graph, num_shards):
    dim = 8
    emb = tf_ext.get_dynamic_embedding("user_emb", dim=dim, num_shards=num_shards)
    other = tf_ext.get_dynamic_embedding("item_emb", dim=4)
    with tf.name_scope("some_scope"):  # tags do not depend on the name scope
        out = tf_ext.embedding.add_summaries()
    assert len(out) == 6
    merged = tf.compat.v1.summary.merge_all()
    small = np.arange(1, 101, dtype=np.int64) * 7919
    large = np.arange(1, 200001, dtype=np.int64) * 104729 - 3
    fill_small, fill_large = _fill(emb, small), _fill(emb, large)
    fill_other = _fill(other, [5, -5, 2**62])
    mem = emb.memory_bytes()
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        empty = _scalars(sess.run(merged))
        assert empty["tf_ext/user_emb/size"] == 0
        assert empty["tf_ext/user_emb/bytes_per_key"] == 0
        assert empty["tf_ext/user_emb/memory_bytes"] > 0  # an empty table has its structures

        sess.run([fill_small, fill_other])
        s1 = _scalars(sess.run(merged))
        mem1 = sess.run(mem)
        sess.run(fill_large)
        s2 = _scalars(sess.run(merged))
        mem2 = sess.run(mem)

    assert set(s1) == {
        "tf_ext/%s/%s" % (n, k) for n in ("user_emb", "item_emb") for k in ("size", "memory_bytes", "bytes_per_key")
    }
    assert s1["tf_ext/user_emb/size"] == 100 and s1["tf_ext/item_emb/size"] == 3
    assert s2["tf_ext/user_emb/size"] == 100 + 200000
    # The summary reads what memory_bytes() says; it grows with the keys and holds at least the
    # raw keys and rows (8 + 4 * dim bytes per key).
    assert s1["tf_ext/user_emb/memory_bytes"] == pytest.approx(mem1, rel=1e-6)
    assert s2["tf_ext/user_emb/memory_bytes"] == pytest.approx(mem2, rel=1e-6)
    assert mem2 > mem1 > 0
    assert mem2 >= 200100 * (8 + 4 * dim)
    assert s2["tf_ext/user_emb/bytes_per_key"] == pytest.approx(mem2 / 200100.0, rel=1e-6)
    assert (8 + 4 * dim) <= s2["tf_ext/user_emb/bytes_per_key"] < 3 * (8 + 4 * dim)


def test_memory_bytes_counts_optimizer_slots(graph):
    keys = np.arange(50000, dtype=np.int64) * 31 + 1
    plain = tf_ext.get_dynamic_embedding("plain", dim=16)
    trained = tf_ext.get_dynamic_embedding("trained", dim=16)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(trained, tf.constant(keys[:4])))
    train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)  # m and v: rows 3x as wide
    fills = [_fill(plain, keys), _fill(trained, keys)]
    sizes = [plain.size(), trained.size()]
    mems = [plain.memory_bytes(), trained.memory_bytes()]
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(fills)
        sess.run(train)
        (n_plain, n_trained), (m_plain, m_trained) = sess.run([sizes, mems])
    assert n_plain == n_trained == len(keys)
    assert m_plain >= len(keys) * (8 + 4 * 16)
    assert m_trained >= len(keys) * (8 + 4 * 48)
    assert m_trained > 2 * m_plain - len(keys) * 8


def test_add_summaries_selected_embeddings_collections_and_repeats(graph):
    a = tf_ext.get_dynamic_embedding("a", dim=2)
    b = tf_ext.get_dynamic_embedding("scope/b", dim=2)
    out = tf_ext.embedding.add_summaries(b, collections=["mine"])
    assert len(out) == 3
    assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES) == []
    assert tf.compat.v1.get_collection("mine") == out
    # Again: the same tensors, no duplicate tag (merge_summary refuses duplicates).
    assert tf_ext.embedding.add_summaries([b], collections=["mine"]) == out
    assert len(tf.compat.v1.get_collection("mine")) == 3
    # [] adds the summaries to no collection.
    loose = tf_ext.embedding.add_summaries([a], collections=[])
    assert len(loose) == 3 and len(tf.compat.v1.get_collection("mine")) == 3
    merged = tf.compat.v1.summary.merge(tf.compat.v1.get_collection("mine") + loose)
    fill = _fill(b, [1, 2, 3, 4])
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(fill)
        values = _scalars(sess.run(merged))
    assert values["tf_ext/scope/b/size"] == 4 and values["tf_ext/a/size"] == 0
    assert tf_ext.embedding.summaries.summary_tags(b) == {
        "size": "tf_ext/scope/b/size",
        "memory_bytes": "tf_ext/scope/b/memory_bytes",
        "bytes_per_key": "tf_ext/scope/b/bytes_per_key",
    }


def test_add_summaries_bad_arguments(graph):
    emb = tf_ext.get_dynamic_embedding("e", dim=2)
    with pytest.raises(TypeError, match=r"embeddings\[1\].*DynamicEmbedding.*Variable"):
        tf_ext.embedding.add_summaries([emb, tf.compat.v1.get_variable("v", [2])])
    with pytest.raises(TypeError, match="embeddings of add_summaries"):
        tf_ext.embedding.add_summaries("e")
    with pytest.raises(TypeError, match="collections.*string"):
        tf_ext.embedding.add_summaries(emb, collections="summaries")
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="'e' belongs to another graph"):
            tf_ext.embedding.add_summaries(emb)
    # No embedding: nothing to add.
    with tf.Graph().as_default():
        assert tf_ext.embedding.add_summaries() == []
