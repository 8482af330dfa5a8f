"""Eviction policies (steps_to_live / min_frequency), run at checkpoint saves."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.summaries import summary_tags
from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext


def _model():
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.1, num_shards=2)
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids)))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    return gs, ids, emb, train


def test_evict_by_steps_to_live_and_frequency(graph, sess):
    gs, ids, emb, train = _model()
    by_age = tf_ext.embedding.evict(emb, steps_to_live=2)
    by_freq = tf_ext.embedding.evict(steps_to_live=None, min_frequency=3)
    exported = emb.export(with_slots=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: [1, 2, 3]})  # step 0
    for _ in range(4):  # steps 1..4
        sess.run(train, {ids: [1, 2]})
    sess.run(train, {ids: [1, 4]})  # step 5
    # gs = 6: keep versions >= 4 -> 1 (5), 2 (4), 4 (5); 3 (version 0) goes.
    assert sess.run(by_age) == 1
    assert sorted(sess.run(exported).keys.tolist()) == [1, 2, 4]
    # frequencies: 1 -> 6, 2 -> 5, 4 -> 1: min_frequency 3 removes 4.
    assert sess.run(by_freq) == 1
    e = sess.run(exported)
    assert sorted(e.keys.tolist()) == [1, 2]
    assert e.slots.shape == (2, 2)  # slots go with their keys
    with pytest.raises(ValueError, match="policy"):
        tf_ext.embedding.evict(emb)


def test_eviction_listener_runs_before_checkpoint_save(tmp_path):
    with tf.Graph().as_default():
        gs, ids, emb, train = _model()
        listener = tf_ext.embedding.EvictionSaverListener(steps_to_live=1)
        size = emb.size()
        hooks = [tf.compat.v1.train.CheckpointSaverHook(str(tmp_path), save_steps=3, listeners=[listener])]
        with tf.compat.v1.train.MonitoredSession(
            hooks=hooks, session_creator=tf.compat.v1.train.ChiefSessionCreator(config=session_config())
        ) as sess:
            sess.run(train, {ids: [7, 8]})
            for _ in range(2):
                sess.run(train, {ids: [1]})  # step 2 -> the save at gs=3 evicts 7, 8
            assert listener.last_removed == 2
            assert sess.run(size) == 1
        reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(str(tmp_path)))
        keys = np.concatenate([reader.get_tensor("e/part_%d-keys" % i) for i in range(2)])
        assert keys.tolist() == [1]


def test_eviction_hook_every_n_steps(graph):
    gs, ids, emb, train = _model()
    hook = tf_ext.embedding.EvictionHook(every_n_steps=2, min_frequency=2)
    size = emb.size()
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
        sess.run(train, {ids: [1, 2]})
        assert hook.last_removed is None
        sess.run(train, {ids: [1]})
        assert hook.last_removed == 1  # key 2 seen once
        assert sess.run(size) == 1


# ---- EvictionPolicy: per embedding, in the training step and before saves --------------------------------------


def _policy_model(policy, num_shards=2, optimizer=None, admission=None):
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = tf_ext.get_dynamic_embedding(
        "e", 2, initializer=0.1, num_shards=num_shards, eviction=policy, admission=admission
    )
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 1.0))
    opt = optimizer or tf.compat.v1.train.AdagradOptimizer(0.1)
    train = opt.minimize(loss, global_step=gs)
    return gs, ids, emb, train


def test_policy_capacity_keeps_the_most_recently_trained_keys(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(capacity=4)
    gs, ids, emb, train = _policy_model(policy, num_shards=1)
    op = tf_ext.embedding.evict(emb)  # no criteria: the embedding's own policy
    sess.run(tf.compat.v1.global_variables_initializer())
    for step in range(6):
        sess.run(train, {ids: [10 + step, 20 + step]})  # keys of step s have version s
    assert sess.run(op) == 8
    e = sess.run(emb.export(with_slots=True))
    assert sorted(e.keys.tolist()) == [14, 15, 24, 25]
    assert e.slots.shape == (4, 2)
    assert sess.run(emb.eviction_state["evicted"]) == 8


def test_policy_min_l2_norm_removes_weak_rows(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(min_l2_norm=1.0)
    gs, ids, emb, train = _policy_model(policy, optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.2))
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(5):
        sess.run(train, {ids: [1, 2]})  # rows of 1 and 2 move from 0.1 towards 1
    sess.run(train, {ids: [3]})  # one step for 3: norm ~0.65
    e = sess.run(emb.export())
    norms = dict(zip(e.keys.tolist(), np.linalg.norm(e.values, axis=1)))
    want = sorted(k for k, n in norms.items() if n >= 1.0)
    assert sess.run(tf_ext.embedding.evict(emb)) == len(norms) - len(want) == 1
    assert sorted(sess.run(emb.export()).keys.tolist()) == want == [1, 2]


def test_policy_every_n_steps_evicts_inside_the_training_step(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(steps_to_live=1, every_n_steps=3)
    gs, ids, emb, train = _policy_model(policy)
    sizes = []
    sess.run(tf.compat.v1.global_variables_initializer())
    for step in range(7):
        sess.run(train, {ids: [100 + step]})  # one new key per step, never seen again
        sizes.append(int(sess.run(emb.size())))
    # Eviction runs after the update of the steps whose global step (before its increment) is 3 and 6: it keeps
    # versions >= step - 1, i.e. the keys of that step and the one before (2 of 4 keys go at 3, 3 of 5 at 6).
    assert sizes == [1, 2, 3, 2, 3, 4, 2], sizes
    assert sess.run(emb.eviction_state["evicted"]) == 2 + 3


def test_policy_keeps_memory_flat_over_a_long_run(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(capacity=2000, every_n_steps=10)
    gs, ids, emb, train = _policy_model(policy)
    mem = emb.memory_bytes()
    sess.run(tf.compat.v1.global_variables_initializer())
    rng = np.random.RandomState(0)
    seen = {}
    for step in range(1, 301):
        batch = rng.randint(0, 1 << 40, size=200)  # every step: 200 fresh ids
        sess.run(train, {ids: batch})
        if step in (60, 300):
            seen[step] = (int(sess.run(emb.size())), int(sess.run(mem)))
    # At most capacity + one interval of new keys, and the memory stays that of a table of about that many keys, not
    # of the 60,000 ids seen (megabytes without eviction). It may still rise a little after step 60: a shard's first
    # rows come in small chunks that grow with the most rows it has held (docs/table.md, "Small tables"), and those
    # high-water marks creep up before they settle (here +11% by step 210, then flat, where whole ~16 KiB chunks per
    # shard used to be taken from the first keys on).
    assert seen[300][0] <= 2000 + 10 * 200
    assert seen[300][1] <= seen[60][1] * 1.25, seen


def test_saver_listener_without_criteria_runs_each_embeddings_policy(tmp_path):
    model_dir = str(tmp_path)
    with tf.Graph().as_default():
        policy = tf_ext.embedding.EvictionPolicy(min_frequency=2)
        gs, ids, emb, train = _policy_model(policy)
        plain = tf_ext.get_dynamic_embedding("plain", 2, initializer=0.1)  # no policy: left alone
        touch = tf_ext.embedding_lookup(plain, ids, is_training=True)
        listener = tf_ext.embedding.EvictionSaverListener()
        hook = tf.compat.v1.train.CheckpointSaverHook(model_dir, save_steps=100, listeners=[listener])
        with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
            s.run([train, touch], {ids: [1, 1, 2]})
            s.run([train, touch], {ids: [1, 3]})
    reader = tf.train.load_checkpoint(model_dir)
    assert sorted(np.concatenate([reader.get_tensor("e/part_%d-keys" % i) for i in range(2)]).tolist()) == [1]
    assert sorted(reader.get_tensor("plain/part_0-keys").tolist()) == [1, 2, 3]
    assert listener.last_removed == 2


def test_eviction_and_admission_together_and_in_summaries(graph, sess):
    policy = tf_ext.embedding.EvictionPolicy(steps_to_live=0, every_n_steps=2)
    gs, ids, emb, train = _policy_model(policy, admission=tf_ext.embedding.CountAdmission(2))
    summaries = tf_ext.embedding.add_summaries(emb)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: [1, 2]})  # step 0: counted once
    sess.run(train, {ids: [1]})  # step 1: 1 admitted
    sess.run(train, {ids: [2]})  # step 2: 2 admitted; eviction keeps version >= 2: 1 goes
    assert sorted(sess.run(emb.export()).keys.tolist()) == [2]
    values = {}
    for s in sess.run(summaries):
        summary = tf.compat.v1.Summary.FromString(s)
        values.update({v.tag: v.simple_value for v in summary.value})
    assert values["tf_ext/e/admitted_keys"] == 2 and values["tf_ext/e/evicted_keys"] == 1, values
    assert set(summary_tags(emb)) == {"size", "memory_bytes", "bytes_per_key", "admitted_keys", "evicted_keys"}


def test_bad_policies_are_named():
    with pytest.raises(ValueError, match="at least one of"):
        tf_ext.embedding.EvictionPolicy(every_n_steps=3)
    with pytest.raises(ValueError, match=r"capacity must be an int in \[0, "):
        tf_ext.embedding.EvictionPolicy(capacity=-1)
    with pytest.raises(ValueError, match="min_l2_norm must be a finite number > 0"):
        tf_ext.embedding.EvictionPolicy(min_l2_norm=0)
    with pytest.raises(ValueError, match=r"every_n_steps must be an int in \[1, "):
        tf_ext.embedding.EvictionPolicy(capacity=3, every_n_steps=0)
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding(
            "e", 2, eviction=tf_ext.embedding.EvictionPolicy(capacity=1, every_n_steps=2)
        )
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64)))
        with pytest.raises(ValueError, match="create a global step first"):
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)


# ---- capacity over all shards, int64 arguments, policies as values ---------------------------------------------


def _keys_of_shards(emb, per_shard, start=1):
    """per_shard[i] keys that live in shard i (by the embedding's key partition), in increasing order."""
    want = list(per_shard)
    out = [[] for _ in want]
    key = start
    while any(len(o) < w for o, w in zip(out, want)):
        shard = int(emb.partition.part_ids_numpy(np.array([key], np.int64))[0])
        if len(out[shard]) < want[shard]:
            out[shard].append(key)
        key += 1
    return out


@pytest.mark.parametrize("capacity,num_shards", [(2**40, 2), (2**32 + 1, 1), (2**31, 1), (2**63 - 1, 3)])
def test_capacity_beyond_int32_keeps_every_key(graph, sess, capacity, num_shards):
    policy = tf_ext.embedding.EvictionPolicy(capacity=capacity, every_n_steps=1)
    gs, ids, emb, train = _policy_model(policy, num_shards=num_shards)
    op = tf_ext.embedding.evict(emb)
    restricted = tf_ext.embedding.restrict(emb, num_reserved=capacity)
    sess.run(tf.compat.v1.global_variables_initializer())
    for _ in range(3):
        sess.run(train, {ids: [1, 2, 3]})  # in-step eviction at steps 1 and 2
    assert sess.run(emb.size()) == 3
    assert sess.run(op) == 0 and sess.run(restricted) == 0
    assert sess.run(emb.size()) == 3


def test_int64_arguments_work_at_their_limits_and_are_named_beyond(graph, sess):
    big = 2**63 - 1
    policy = tf_ext.embedding.EvictionPolicy(steps_to_live=big, min_frequency=2**32 - 1, every_n_steps=big)
    gs, ids, emb, train = _policy_model(policy)
    keep_all = tf_ext.embedding.evict(emb, steps_to_live=big)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: [1, 2, 3]})
    assert sess.run(keep_all) == 0  # nobody is older than 2^63 - 1 steps
    assert sess.run(tf_ext.embedding.evict(emb)) == 3  # every key looked up fewer than 2^32 - 1 times
    for kwargs, message in [
        (
            dict(steps_to_live=2**63),
            r"steps_to_live must be an int in \[0, 9223372036854775807\], got 9223372036854775808",
        ),
        (dict(capacity=2**64), r"capacity must be an int in \[0, 9223372036854775807\]"),
        (dict(min_frequency=2**32), r"min_frequency must be an int in \[0, 4294967295\].*saturate"),
        (dict(capacity=1, every_n_steps=2**63), r"every_n_steps must be an int in \[1, 9223372036854775807\]"),
        (dict(steps_to_live=1.5), r"steps_to_live must be an int"),
        (dict(min_l2_norm=float("inf")), r"min_l2_norm must be a finite number > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            tf_ext.embedding.EvictionPolicy(**kwargs)
    with pytest.raises(ValueError, match=r"steps_to_live must be an int in \[0, 9223372036854775807\]"):
        tf_ext.embedding.evict(emb, steps_to_live=2**63)
    with pytest.raises(ValueError, match=r"num_reserved must be an int in \[0, 9223372036854775807\]"):
        tf_ext.embedding.restrict(emb, num_reserved=2**63)
    with pytest.raises(ValueError, match=r"min_frequency must be an int in \[0, 4294967295\]"):
        tf_ext.embedding.EvictionSaverListener(min_frequency=2**40)


@pytest.mark.parametrize("in_step", [False, True])
def test_capacity_keeps_the_most_recent_keys_of_all_shards(graph, sess, in_step):
    # Unbalanced shards: the 6 most recent keys all live in shard 0, shards 1..3 hold one old key each.
    policy = tf_ext.embedding.EvictionPolicy(capacity=7, every_n_steps=4 if in_step else None)
    gs, ids, emb, train = _policy_model(policy, num_shards=4)
    op = tf_ext.embedding.evict(emb)
    keys = _keys_of_shards(emb, [6, 1, 1, 1])
    old = [keys[1][0], keys[2][0], keys[3][0]]
    sess.run(tf.compat.v1.global_variables_initializer())
    for key in old:  # steps 0, 1, 2: versions 0, 1, 2
        sess.run(train, {ids: [key]})
    sess.run(train, {ids: keys[0]})  # step 3: version 3; the in-step eviction runs at step 4
    if in_step:
        sess.run(train, {ids: keys[0]})  # step 4: version 4, then eviction
    else:
        assert sess.run(op) == 2
    # At most 7 keys: the 6 newest (shard 0) and the newest old one; not 2 per shard (ceil(7 / 4)), which would
    # keep 1 + 1 + 1 old keys and only 2 of the 6 new ones, 5 keys under a capacity of 7.
    assert sorted(sess.run(emb.export()).keys.tolist()) == sorted(keys[0] + [old[2]])
    assert sess.run(emb.eviction_state["evicted"]) == 2


@pytest.mark.parametrize("in_step", [False, True])
def test_capacity_never_leaves_more_than_capacity_keys(graph, sess, in_step):
    # Balanced shards with more than capacity / num_shards keys each: ceil(5 / 4) = 2 per shard would keep 8.
    policy = tf_ext.embedding.EvictionPolicy(capacity=5, every_n_steps=1 if in_step else None)
    gs, ids, emb, train = _policy_model(policy, num_shards=4)
    op = tf_ext.embedding.evict(emb)
    keys = _keys_of_shards(emb, [3, 3, 3, 3])
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: sum(keys, [])})  # step 0: one version for all: ties go by key, the greatest kept
    if in_step:
        sess.run(train, {ids: [keys[0][0]]})  # step 1: evicts, keeping this key (the newest) and 4 others
        rest = sorted(k for k in sum(keys, []) if k != keys[0][0])
        assert sorted(sess.run(emb.export()).keys.tolist()) == sorted([keys[0][0]] + rest[-4:])
    else:
        assert sess.run(op) == 7
        assert sorted(sess.run(emb.export()).keys.tolist()) == sorted(sum(keys, []))[-5:]
    assert sess.run(emb.size()) == 5


def test_capacity_zero_removes_every_key(graph, sess):
    gs, ids, emb, train = _policy_model(tf_ext.embedding.EvictionPolicy(capacity=0), num_shards=2)
    op = tf_ext.embedding.evict(emb)
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: [1, 2, 3]})
    assert sess.run(op) == 3 and sess.run(emb.size()) == 0


def test_policies_are_values():
    a = tf_ext.embedding.EvictionPolicy(capacity=3, every_n_steps=2)
    b = tf_ext.embedding.EvictionPolicy(capacity=3, every_n_steps=2)
    assert a == b and hash(a) == hash(b) and not a != b
    assert a != tf_ext.embedding.EvictionPolicy(capacity=3) and a != "EvictionPolicy(capacity=3)"
    with pytest.raises(AttributeError, match="cannot be changed"):
        a.capacity = 4
    import pickle  # pylint: disable=import-outside-toplevel

    assert pickle.loads(pickle.dumps(a)) == a


def test_equal_policies_are_accepted_under_auto_reuse(graph):
    def make(capacity=3, min_count=2):
        with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
            return tf_ext.get_dynamic_embedding(
                "e",
                2,
                eviction=tf_ext.embedding.EvictionPolicy(capacity=capacity),
                admission=tf_ext.embedding.CountAdmission(min_count),
            )

    first = make()
    assert make() is first  # equal policies, other objects
    with pytest.raises(ValueError, match="with eviction=EvictionPolicy\\(capacity=4\\), but it has"):
        make(capacity=4)
    with pytest.raises(ValueError, match="with admission=CountAdmission\\(min_count=3.*but it has"):
        make(min_count=3)
    with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
        bloom = tf_ext.embedding.BloomAdmission(2, num_counters=64)
        other = tf_ext.get_dynamic_embedding("b", 2, admission=bloom)
        assert (
            tf_ext.get_dynamic_embedding("b", 2, admission=tf_ext.embedding.BloomAdmission(2, num_counters=64)) is other
        )
        with pytest.raises(ValueError, match="but it has"):
            tf_ext.get_dynamic_embedding("b", 2, admission=tf_ext.embedding.BloomAdmission(2, num_counters=128))


def test_hook_every_n_steps_takes_numpy_ints_and_names_its_range():
    assert tf_ext.embedding.EvictionHook(np.int64(3), min_frequency=2)._every == 3  # pylint: disable=protected-access
    for bad in (0, 2**63, 1.5, None):
        with pytest.raises(ValueError, match=r"every_n_steps must be an int in \[1, 9223372036854775807\]"):
            tf_ext.embedding.EvictionHook(bad, min_frequency=2)


def test_capacity_does_not_count_keys_the_per_key_criteria_remove(graph, sess):
    """In-step, a shard applies capacity while another shard's per-key eviction may not have run yet: the keys that
    eviction removes must not count, or the first shard evicts keys that are among the capacity most recent."""
    policy = tf_ext.embedding.EvictionPolicy(min_frequency=2, capacity=3)
    gs, ids, emb, train = _policy_model(policy, num_shards=2)
    keys = _keys_of_shards(emb, [3, 1])
    shard0, shard1 = emb.shards
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train, {ids: keys[0]})
    sess.run(train, {ids: keys[0]})  # shard 0: 3 keys looked up twice
    sess.run(train, {ids: keys[1]})  # shard 1: the newest key, looked up once: min_frequency removes it
    # The order of an in-step eviction where shard 0 runs first: its criteria, its capacity, then shard 1's criteria.
    assert sess.run(policy.shard_op(shard0)) == 0
    assert sess.run(policy.capacity_op(emb, [shard0])) == 0
    assert sess.run(policy.shard_op(shard1)) == 1
    assert sorted(sess.run(emb.export()).keys.tolist()) == sorted(keys[0])


# ---- in-step capacity: once per embedding, after every shard's update ------------------------------------------


def _record_shard_updates(monkeypatch):
    """Records, in build order, each shard's optimizer update op and what its processor returned (the update plus
    what the in-step eviction adds to it)."""
    from tensorflow_ext.embedding import optimizers  # pylint: disable=import-outside-toplevel

    applies, results = [], []
    apply_to_shard, update_op = optimizers._apply_to_shard, optimizers.ShardProcessor.update_op

    def recording_apply(opt, shard, grad):
        op = apply_to_shard(opt, shard, grad)
        applies.append((shard, getattr(op, "op", op)))
        return op

    def recording_update_op(self, opt, grad):
        op = update_op(self, opt, grad)
        results.append((self._v, getattr(op, "op", op)))
        return op

    monkeypatch.setattr(optimizers, "_apply_to_shard", recording_apply)
    monkeypatch.setattr(optimizers.ShardProcessor, "update_op", recording_update_op)
    return applies, results


def _norm_and_capacity_model(monkeypatch):
    """Two shards, rows of 1.0; a weight of 1 moves a key's row to 0.4 (below min_l2_norm 0.5), a weight of 0 keeps
    it. Eviction runs at every step (from global step 1)."""
    applies, results = _record_shard_updates(monkeypatch)
    policy = tf_ext.embedding.EvictionPolicy(min_l2_norm=0.5, capacity=1, every_n_steps=1)
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    weights = tf.compat.v1.placeholder(tf.float32, [None])
    emb = tf_ext.get_dynamic_embedding("e", 1, initializer=1.0, num_shards=2, eviction=policy)
    loss = tf.reduce_sum(tf.squeeze(tf_ext.embedding_lookup(emb, ids), 1) * weights)
    train = tf.compat.v1.train.GradientDescentOptimizer(0.6).minimize(loss, global_step=gs)
    assert [s for s, _ in applies] == [s for s, _ in results] and len(applies) == 2
    return gs, ids, weights, emb, train, applies, results


def _keys_for_order(emb, first, last):
    """b in shard `first`, a in shard `last`, a > b."""
    keys = _keys_of_shards(emb, [4, 4])
    b = min(keys[emb.shards.index(first)])
    a = min(k for k in keys[emb.shards.index(last)] if k > b)
    return a, b


def test_in_step_capacity_waits_for_every_shards_update(graph, monkeypatch):
    """With min_l2_norm and capacity, the capacity step must see every shard after its update: a row read before
    its update still has its old norm, counts among the kept, and pushes a key that should stay out. The bad
    order is forced: the last shard's update runs only after everything the first shard's processor built (before
    the fix, that held the first shard's capacity eviction, which read the last shard before its update)."""
    gs, ids, weights, emb, train, applies, results = _norm_and_capacity_model(monkeypatch)
    (first, _), (last, last_apply) = applies
    a, b = _keys_for_order(emb, first, last)
    last_apply._add_control_input(results[0][1])  # pylint: disable=protected-access
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(gs.assign(1))
        # Step 1: a and b are inserted with version 1; a's update takes its norm to 0.4, so min_l2_norm removes it,
        # and capacity 1 keeps b. Counting a as it was before its update (norm 1, and a > b) would remove b too.
        sess.run(train, {ids: [b, a], weights: [0.0, 1.0]})
        assert sess.run(emb.export()).keys.tolist() == [b]
        assert sess.run(emb.eviction_state["evicted"]) == 1


def test_in_step_capacity_reads_each_shard_once(graph):
    """The in-step eviction reads every shard once per step (its per-key criteria and capacity share nothing to
    read twice only when they are in one step: here capacity alone), not once per shard and shard."""
    policy = tf_ext.embedding.EvictionPolicy(capacity=5, every_n_steps=1)
    before = len(graph.get_operations())
    gs, ids, emb, train = _policy_model(policy, num_shards=3)
    built = graph.get_operations()[before:]
    exports = [op for op in built if op.type == "TfExtTableExport"]
    assert len(exports) == 3, [op.name for op in exports]
    # Every read is downstream of every shard's update.
    update_types = [op for op in built if op.type.startswith("TfExtEmbeddingSparseApply")]
    assert len(update_types) == 3
    for export in exports:
        seen, todo = set(), [export]
        while todo:
            op = todo.pop()
            if op in seen:
                continue
            seen.add(op)
            todo.extend(i.op for i in op.inputs)
            todo.extend(op.control_inputs)
        assert all(u in seen for u in update_types), export.name
