"""get_dynamic_embedding: naming/reuse, sharding/placement, initializers, keys, errors, introspection."""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import GraphKeys
from tensorflow_ext.embedding.keys import hash_key_numpy


def test_variable_scope_naming_and_reuse(graph):
    with tf.compat.v1.variable_scope("tower"):
        a = tf_ext.get_dynamic_embedding("user", 4)
    assert a.name == "tower/user"
    assert [s.name for s in a.shards] == ["tower/user/part_0"]
    assert a.shards[0].op.name == "tower/user/part_0"
    with tf.compat.v1.variable_scope("tower", reuse=True):
        assert tf_ext.get_dynamic_embedding("user", 4) is a
    with tf.compat.v1.variable_scope("tower", reuse=tf.compat.v1.AUTO_REUSE):
        assert tf_ext.get_dynamic_embedding("user", 4) is a
        b = tf_ext.get_dynamic_embedding("item", 4)
    assert b.name == "tower/item"
    with pytest.raises(ValueError, match="tower/user already exists"):
        with tf.compat.v1.variable_scope("tower"):
            tf_ext.get_dynamic_embedding("user", 4)
    with pytest.raises(ValueError, match="other/user does not exist"):
        with tf.compat.v1.variable_scope("other", reuse=True):
            tf_ext.get_dynamic_embedding("user", 4)
    with pytest.raises(ValueError, match="specified dim 8 and found dim 4"):
        with tf.compat.v1.variable_scope("tower", reuse=True):
            tf_ext.get_dynamic_embedding("user", 8)
    tf.compat.v1.get_variable("dense", [2])
    with pytest.raises(ValueError, match="a variable of that name exists"):
        tf_ext.get_dynamic_embedding("dense", 2)


def test_collections(graph):
    a = tf_ext.get_dynamic_embedding("a", 2, num_shards=2)
    b = tf_ext.get_dynamic_embedding("b", 2, trainable=False)
    shards = graph.get_collection(GraphKeys.DYNAMIC_EMBEDDINGS)
    assert shards == a.shards + b.shards
    trainable = tf.compat.v1.trainable_variables()
    assert a.shards[0] in trainable and a.shards[1] in trainable and b.shards[0] not in trainable
    saveables = graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    assert [s.name for s in saveables] == ["a/part_0", "a/part_1", "b/part_0"]
    assert tf_ext.embedding.get_dynamic_embeddings() == [a, b]
    assert not tf.compat.v1.global_variables()  # tables need no initializer
    # A MetaGraphDef export does not choke on the shards in TRAINABLE_VARIABLES.
    tf.compat.v1.train.export_meta_graph()


def test_bad_arguments(graph):
    with pytest.raises(ValueError, match="dim of dynamic embedding 'x'"):
        tf_ext.get_dynamic_embedding("x", 0)
    with pytest.raises(ValueError, match="num_shards of dynamic embedding 'x'"):
        tf_ext.get_dynamic_embedding("x", 2, num_shards=0)
    with pytest.raises(TypeError, match="dim"):
        tf_ext.get_dynamic_embedding("x", 2.5)
    with pytest.raises(ValueError, match="key_dtype"):
        tf_ext.get_dynamic_embedding("x", 2, key_dtype=tf.float32)
    with pytest.raises(ValueError, match="value_dtype"):
        tf_ext.get_dynamic_embedding("x", 2, value_dtype=tf.float64)
    with pytest.raises(ValueError, match="initial_capacity"):
        tf_ext.get_dynamic_embedding("x", 2, initial_capacity=-1)
    emb = tf_ext.get_dynamic_embedding("ok", 2)
    with pytest.raises(TypeError, match=r"ids of dynamic embedding 'ok' .* got float32"):
        tf_ext.embedding_lookup(emb, tf.constant([1.0, 2.0]))
    with pytest.raises(TypeError, match="must be strings"):
        tf_ext.embedding_lookup(tf_ext.get_dynamic_embedding("s", 2, key_dtype=tf.string), tf.constant([1], tf.int64))
    with pytest.raises(TypeError, match="DynamicEmbedding"):
        tf_ext.embedding_lookup(tf.zeros([3, 2]), [1])
    with pytest.raises(ValueError, match="combiner"):
        tf_ext.embedding_lookup_sparse(
            emb, tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1]), None, combiner="max"
        )


def test_lookup_shapes_and_initializers(graph, sess):
    const = tf_ext.get_dynamic_embedding("const", 3, initializer=0.25, num_shards=3)
    ids = tf.constant([[[5, 6], [5, -7]]], tf.int64)  # rank 3, duplicates, a negative key
    out = tf_ext.embedding_lookup(const, ids, is_training=True)
    assert out.shape.as_list() == [1, 2, 2, 3]
    np.testing.assert_allclose(sess.run(out), np.full([1, 2, 2, 3], 0.25))
    assert sess.run(const.size()) == 3

    rnd = tf_ext.get_dynamic_embedding(
        "rnd", 16, initializer=tf.compat.v1.random_normal_initializer(0.0, 1.0), num_shards=2
    )
    rows = sess.run(tf_ext.embedding_lookup(rnd, tf.range(50, dtype=tf.int64), is_training=True))
    assert rows.shape == (50, 16)
    assert len({tuple(r) for r in rows}) == 50  # every key has its own draw
    assert abs(rows.std() - 1.0) < 0.15
    # The rows stay what they were: a second lookup reads the stored rows.
    again = sess.run(tf_ext.embedding_lookup(rnd, tf.range(50, dtype=tf.int64), is_training=False))
    np.testing.assert_array_equal(rows, again)

    orth = tf_ext.get_dynamic_embedding("generic", 4, initializer=tf.compat.v1.orthogonal_initializer())
    g_rows = sess.run(tf_ext.embedding_lookup(orth, [1, 2, 3], is_training=True))
    assert g_rows.shape == (3, 4) and np.abs(g_rows).sum() > 0
    np.testing.assert_array_equal(g_rows, sess.run(tf_ext.embedding_lookup(orth, [1, 2, 3], is_training=False)))

    glorot = tf_ext.get_dynamic_embedding("glorot", 12, initializer=tf.compat.v1.glorot_uniform_initializer())
    gr = sess.run(tf_ext.embedding_lookup(glorot, tf.range(100, dtype=tf.int64), is_training=True))
    assert np.abs(gr).max() <= np.sqrt(3.0 / 12) + 1e-6

    with tf.compat.v1.variable_scope("scoped", initializer=tf.compat.v1.constant_initializer(2.0)):
        sc = tf_ext.get_dynamic_embedding("e", 2)
    np.testing.assert_allclose(sess.run(tf_ext.embedding_lookup(sc, [9], is_training=True)), [[2.0, 2.0]])


def test_inference_lookup_does_not_insert(graph, sess):
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5)
    find = tf_ext.embedding_lookup(emb, [1, 2])  # no optimizer in this graph: find-only
    np.testing.assert_allclose(sess.run(find), [[0.5, 0.5]] * 2)
    assert sess.run(emb.size()) == 0
    rnd = tf_ext.get_dynamic_embedding("r", 2)  # random init: missing keys read zeros
    np.testing.assert_allclose(sess.run(tf_ext.embedding_lookup(rnd, [1])), [[0.0, 0.0]])
    assert sess.run(rnd.size()) == 0


def test_training_flips_lookups_to_insert(graph, sess):
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5)
    out = tf_ext.embedding_lookup(emb, tf.constant([3, 4, 4], tf.int64))
    frozen = tf_ext.embedding_lookup(emb, tf.constant([100], tf.int64), is_training=False)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(out))
    sess.run(frozen)
    assert sess.run(emb.size()) == 0
    sess.run(train)
    assert sess.run(emb.size()) == 2
    np.testing.assert_allclose(
        sess.run(emb.slot_values if False else tf_ext.embedding_lookup(emb, [3, 4], is_training=False)),
        [[0.4, 0.4], [0.3, 0.3]],
        rtol=1e-6,
    )


def test_string_keys(graph, sess):
    emb = tf_ext.get_dynamic_embedding("words", 4, key_dtype=tf.string, initializer=0.0, num_shards=2)
    words = tf.constant([["a", "bb"], ["a", "ccc"]])
    out = tf_ext.embedding_lookup(emb, words)
    loss = tf.reduce_sum(out * tf.constant([[[1.0]], [[2.0]]]))
    train = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(loss)
    sess.run(train)
    vals = sess.run(tf_ext.embedding_lookup(emb, ["a", "bb", "ccc", "zz"], is_training=False))
    np.testing.assert_allclose(vals[:, 0], [-3.0, -1.0, -2.0, 0.0])
    keys = sess.run(tf_ext.embedding.string_to_key(["a", "bb"]))
    assert keys.dtype == np.int64
    fp = sess.run(tf.fingerprint(tf.constant(["a"])))
    assert keys[0] == np.frombuffer(fp.tobytes(), dtype=np.int64)[0]
    exported = sess.run(emb.export())
    assert sorted(exported.keys.tolist()) == sorted(
        sess.run(tf_ext.embedding.string_to_key(["a", "bb", "ccc"])).tolist()
    )


def test_size_export_and_slots(graph, sess):
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding("e", 3, initializer=1.0, num_shards=3)
    out = tf_ext.embedding_lookup(emb, tf.constant([10, 20, 30, 10], tf.int64))
    opt = tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.5)
    train = opt.minimize(tf.reduce_sum(out), global_step=gs)
    assert emb.slot_names(opt) == ["accumulator"]
    assert emb.shards[0].width == 6
    exp = emb.export(with_slots=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train)
    sess.run(train)
    e = sess.run(exp)
    assert sorted(e.keys.tolist()) == [10, 20, 30]
    order = np.argsort(e.keys)
    np.testing.assert_allclose(e.slots[order][:, 0], [0.5 + 4 + 4, 0.5 + 1 + 1, 0.5 + 1 + 1])
    assert e.values.shape == (3, 3) and e.slots.shape == (3, 3)
    assert sorted(e.frequencies.tolist()) == [2, 2, 2]
    assert set(e.versions.tolist()) <= {0, 1, 2}
    acc = sess.run(emb.slot_values(opt, "accumulator", [10, 99]))
    np.testing.assert_allclose(acc, [[8.5] * 3, [0.5] * 3])
    # Layout is frozen once exported with slots.
    with pytest.raises(ValueError, match="layout was frozen"):
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9).minimize(tf.reduce_sum(out))
    with pytest.raises(ValueError, match="no slot"):
        emb.slot_values(opt, "nope", [1])


def test_replica_device_setter_places_shards_on_ps(graph):
    setter = tf.compat.v1.train.replica_device_setter(ps_tasks=2, ps_device="/job:ps", worker_device="/job:worker")
    with tf.compat.v1.device(setter):
        emb = tf_ext.get_dynamic_embedding("e", 4, num_shards=3)
        out = tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64))
        loss = tf.reduce_sum(out)
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)
    devices = [s.device for s in emb.shards]
    assert devices == ["/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:0"], devices
    assert out.device.startswith("/job:worker")
    explicit = tf_ext.get_dynamic_embedding("x", 2, devices=["/cpu:0", "/cpu:0"])
    assert explicit.num_shards == 2 and all(s.device.endswith("CPU:0") for s in explicit.shards)


def test_partitioner_sets_num_shards(graph):
    emb = tf_ext.get_dynamic_embedding("e", 4, partitioner=tf.compat.v1.fixed_size_partitioner(4))
    assert emb.num_shards == 4


def test_size_based_partitioner_is_asked_about_initial_capacity(graph):
    # 1 MiB shards of a [initial_capacity, 64] float table: 2^20 keys * 256 bytes = 256 MiB -> 256 shards, not the
    # 2^40-row table's count (clipped to the partitioner's maximum).
    by_size = tf.compat.v1.variable_axis_size_partitioner(max_shard_bytes=1 << 20, max_shards=4096)
    emb = tf_ext.get_dynamic_embedding("e", 64, partitioner=by_size, initial_capacity=1 << 20)
    assert emb.num_shards == 256
    small = tf.compat.v1.min_max_variable_partitioner(max_partitions=64, min_slice_size=1 << 20)
    assert tf_ext.get_dynamic_embedding("s", 64, partitioner=small, initial_capacity=1 << 14).num_shards == 4
    with pytest.raises(
        ValueError,
        match=r"partitioner of dynamic embedding 'n' gives a shard count that depends on "
        r"the table's size .* pass initial_capacity .* or num_shards",
    ):
        tf_ext.get_dynamic_embedding("n", 64, partitioner=by_size)
    with tf.compat.v1.variable_scope("scoped", partitioner=tf.compat.v1.fixed_size_partitioner(3)):
        assert tf_ext.get_dynamic_embedding("f", 4).num_shards == 3  # a fixed count needs no size
    with tf.compat.v1.variable_scope("dense", partitioner=small):  # a scope's partitioner meant for dense variables
        with pytest.raises(ValueError, match=r"the variable scope's partitioner \(.*\) of dynamic embedding 'd' gives"):
            tf_ext.get_dynamic_embedding("d", 64)
        assert tf_ext.get_dynamic_embedding("d", 64, initial_capacity=1 << 14).num_shards == 4
    with pytest.raises(ValueError, match=r"partitioner of dynamic embedding 'z' gives 0 shards .* pass num_shards"):
        tf_ext.get_dynamic_embedding("z", 4, partitioner=lambda shape, dtype: [0, 1])


def test_devices_and_initial_capacity_errors_say_what_to_pass(graph):
    with pytest.raises(
        TypeError,
        match=r"devices of dynamic embedding 'x' must be a list of devices .* got 'c': " r"pass \['c'\] for one device",
    ):
        tf_ext.get_dynamic_embedding("x", 2, devices="c")
    with pytest.raises(TypeError, match=r"pass \['/cpu:0'\]"):
        tf_ext.get_dynamic_embedding("x", 2, devices="/cpu:0")  # not 6 shards on devices '/', 'c', 'p', ...
    with pytest.raises(
        ValueError,
        match=r"devices of dynamic embedding 'x': 'c' is not a device string .* " r"e.g. '/job:ps/task:0', '/cpu:0'",
    ):
        tf_ext.get_dynamic_embedding("x", 2, devices=["/cpu:0", "c"])
    with pytest.raises(TypeError, match=r"must be device strings .* got 3"):
        tf_ext.get_dynamic_embedding("x", 2, devices=[3])
    assert tf_ext.get_dynamic_embedding("ok", 2, devices=("/cpu:0", tf.DeviceSpec(device_type="CPU"))).num_shards == 2
    with pytest.raises(
        ValueError,
        match=r"initial_capacity of dynamic embedding 'x' must be in \[0, 2\^40\] \(the "
        r"expected number of keys .* pass 0 if unknown\), got -1",
    ):
        tf_ext.get_dynamic_embedding("x", 2, initial_capacity=-1)
    with pytest.raises(ValueError, match=r"initial_capacity \(TFRA's init_size\) of dynamic embedding 'x' .* got -1"):
        tf_ext.get_dynamic_embedding("x", 2, init_size=-1)
    with pytest.raises(TypeError, match=r"initial_capacity of dynamic embedding 'x' must be an int .* got 1.5"):
        tf_ext.get_dynamic_embedding("x", 2, initial_capacity=1.5)


def test_var_list_with_dynamic_embedding_and_global_step_once(graph, sess):
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.0, num_shards=2)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2, 3], tf.int64)))
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    train = opt.minimize(loss, global_step=gs, var_list=[emb])
    beta1_power, beta2_power = opt._get_beta_accumulators()  # pylint: disable=protected-access
    assert beta1_power.device == emb.shards[0].device  # colocated with a shard (no dense variable here)
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(3):
        sess.run(train)
    assert sess.run(gs) == 3
    np.testing.assert_allclose(sess.run([beta1_power, beta2_power]), [0.9**4, 0.999**4], rtol=1e-6)


def test_unsupported_optimizer_message(graph):
    emb = tf_ext.get_dynamic_embedding("e", 2)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, [1]))

    class MyOpt(tf.compat.v1.train.Optimizer):
        def __init__(self):
            super().__init__(False, "MyOpt")

    with pytest.raises(TypeError, match="MyOpt .* cannot train dynamic embeddings"):
        MyOpt().minimize(loss)


def test_linear_model_new_keys_get_initial_rows_before_update(graph, sess):
    # The gradient of a linear model does not depend on the looked-up values; the
    # update must still see the row the lookup inserted.
    emb = tf_ext.get_dynamic_embedding("lin", 1, initializer=0.5, num_shards=2)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5, 6], tf.int64)))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    sess.run(train)
    np.testing.assert_allclose(sess.run(tf_ext.embedding_lookup(emb, [5, 6], is_training=False)), [[0.4], [0.4]])
    e = sess.run(emb.export())
    assert sorted(e.frequencies.tolist()) == [1, 1]


def test_in_kernel_initial_rows_depend_only_on_seed_and_key():
    assert tf_ext.embedding._ops.use_fused(), "the fused TfExtEmbeddingLookup path is switched off"

    def rows(keys, num_shards):
        with tf.Graph().as_default():
            emb = tf_ext.get_dynamic_embedding(
                "e", 4, num_shards=num_shards, initializer=tf.compat.v1.truncated_normal_initializer(0.0, 1.0, seed=7)
            )
            out = tf_ext.embedding_lookup(emb, tf.constant(keys, tf.int64), is_training=True)
            with tf.compat.v1.Session() as s:
                return s.run(out)

    a = rows([1, 2, 3], 1)
    b = rows([3, 9, 1, 2], 3)
    np.testing.assert_array_equal(a, b[[2, 3, 0]])
    assert np.abs(a).max() <= 2.0 + 1e-6 and len({tuple(r) for r in a}) == 3


def test_shard_partition_is_hash_key_mod_num_shards(graph, sess):
    keys = [0, 1, -5, 123456789012345, -(2**63), 2**63 - 1, 7919]
    expected = (hash_key_numpy(keys) % np.uint64(3)).astype(np.int32).tolist()
    t = tf.constant(keys, tf.int64)
    assert sess.run(tf_ext.embedding.keys.hash_key_shard_ids(t, 3)).tolist() == expected
    emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=3)
    assert sess.run(emb.shard_ids(t)).tolist() == expected  # TfExtShardIndex when built, else the in-graph mixer


def _exported_rows(sess, emb):
    e = sess.run(emb.export(with_slots=True))
    order = np.argsort(e.keys)
    return e.keys[order], e.values[order], e.slots[order]


def test_preallocate_holds_memory_up_front_trains_identically_and_survives_a_restore(tmp_path):
    """preallocate=True: the tables hold initial_capacity keys' memory from creation, train exactly as
    tables that grow on demand, and keep that memory across a checkpoint restore in a new graph."""
    capacity, dim = 20000, 8
    row_bytes = 20 + 4 * 2 * dim  # embedding + Adagrad accumulator columns, key and metadata

    def build(preallocate):
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "emb", dim, initializer=0.1, num_shards=2, initial_capacity=capacity, preallocate=preallocate
        )
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 1.0))
        train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
        return emb, ids, train

    rng = np.random.default_rng(5)
    batches = [rng.integers(0, 50000, 3000) for _ in range(4)]
    results, memory = {}, {}
    for preallocate in (True, False):
        with tf.Graph().as_default():
            emb, ids, train = build(preallocate)
            assert all(s.op.get_attr("preallocate") == preallocate for s in emb.shards)
            mem = emb.memory_bytes()
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                memory[preallocate] = [sess.run(mem)]
                for b in batches:
                    sess.run(train, {ids: b})
                memory[preallocate].append(sess.run(mem))
                results[preallocate] = _exported_rows(sess, emb)
                if preallocate:
                    path = saver.save(sess, str(tmp_path / "ckpt"))
    assert memory[True][0] >= memory[False][0] + capacity * row_bytes
    # ~11K keys trained: within the preallocated memory (the shards' chunk tables aside).
    assert memory[True][1] <= memory[True][0] + 16384
    assert memory[False][1] > memory[False][0] + 5000 * row_bytes
    for a, b in zip(results[True], results[False]):
        np.testing.assert_array_equal(a, b)

    with tf.Graph().as_default():
        emb, _, _ = build(True)
        mem = emb.memory_bytes()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            created = sess.run(mem)
            saver.restore(sess, path)
            for a, b in zip(_exported_rows(sess, emb), results[True]):
                np.testing.assert_array_equal(a, b)
            assert sess.run(mem) >= created  # the restore kept the preallocated headroom


def test_preallocate_errors(graph):
    with pytest.raises(ValueError, match=r"dynamic embedding 'a': preallocate=True needs initial_capacity > 0"):
        tf_ext.get_dynamic_embedding("a", 2, preallocate=True)
    with pytest.raises(TypeError, match="preallocate must be True or False, got 'yes'"):
        tf_ext.get_dynamic_embedding("b", 2, initial_capacity=10, preallocate="yes")
    with pytest.raises(ValueError, match="preallocate=True needs initial_capacity"):
        tf_ext.HashTable(dim=2, preallocate=True)
    table = tf_ext.HashTable(dim=2, initial_capacity=1000, preallocate=True)
    assert table.resource_handle.op.get_attr("preallocate")
