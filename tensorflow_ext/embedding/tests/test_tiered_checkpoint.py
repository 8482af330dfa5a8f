"""Lifecycle of tiered embeddings: checkpoints (full and delta) hold both tiers, restore into tiered and in-memory
embeddings and other shard counts, eviction reaches the disk tier, a capped disk drops keys that delta checkpoints
record as removed, warm start, and serving exports.

The reference is always the same model with the embedding all in memory (`storage=None`), trained on the same
batches: tiered training is bit-identical to it while no key falls off a capped disk, so every state below is
compared bit for bit (keys, rows, optimizer slots, versions, frequencies). Memory budgets are a few dozen rows per
shard and the tiers are settled before saves, so most keys are on disk when a checkpoint is written.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import run_fresh
from tensorflow_ext.embedding.tests.conftest import session_config

DIM = 4
ROWS = 64  # the memory tier's rows per shard (the fewest a budget may hold)
IDS = 2000  # ids are drawn from [0, IDS)
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def _init():
    return tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3)


def _memory_bytes(tmp_path, num_shards):
    """A memory budget (all shards) of about ROWS rows per shard of the model's layout (Adagrad, DIM): the bytes a
    row costs are read from a probe table's budget_keys, the tier's own accounting."""
    probe = 1 << 20
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        storage = tf_ext.TieredStorage(memory_bytes=probe, path=str(tmp_path / "probe"))
        emb = tf_ext.get_dynamic_embedding("probe", DIM, storage=storage, initializer=0.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64)))
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            budget_keys = int(sess.run(emb.tier_stats()["budget_keys"]))
    return -(-probe // budget_keys) * ROWS * num_shards


def _storage(tmp_path, name, num_shards, **kwargs):
    return tf_ext.TieredStorage(memory_bytes=_memory_bytes(tmp_path, num_shards), path=str(tmp_path / name), **kwargs)


def _build(storage=None, num_shards=2, eviction=None):
    """A 2-shard (by default) Adagrad embedding "user" trained towards 0.5; returns a dict of the graph's parts."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding(
        "user", DIM, num_shards=num_shards, initializer=_init(), storage=storage, eviction=eviction
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 0.5))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    remove_ids = tf.compat.v1.placeholder(tf.int64, [None], name="remove_ids")
    return dict(
        gs=gs,
        emb=emb,
        ids=ids,
        loss=loss,
        train=train,
        remove_ids=remove_ids,
        remove=emb.remove(remove_ids),
        exported=emb.export(with_slots=True),
        size=emb.size(),
        stats=emb.tier_stats(),
        settle=emb.tier_settle(),
    )


def _batch(step, n=80):
    """The ids of a step: mostly fresh, a fifth of them ids of earlier steps (rows on disk by then)."""
    rng = np.random.RandomState(1000 + step)
    ids = rng.randint(0, IDS, size=n).astype(np.int64) * 7919 - 40000
    if step >= 2:
        old = _batch(rng.randint(0, step - 1), n)
        ids[: n // 5] = old[: n // 5]
    return ids


def _train(sess, m, steps):
    """Runs `steps` training steps from the current global step; settles the tiers after each."""
    for _ in range(steps):
        step = int(sess.run(m["gs"]))
        sess.run(m["train"], {m["ids"]: _batch(step)})
        sess.run(m["settle"])


def _state(sess, m):
    """The whole table, sorted by key: keys, values, slots, versions, frequencies. Checks that each key is there
    once and that size() counts them."""
    e, size = sess.run([m["exported"], m["size"]])
    order = np.argsort(e.keys)
    assert len(np.unique(e.keys)) == len(e.keys) == size, (len(np.unique(e.keys)), len(e.keys), size)
    return tuple(np.asarray(a)[order] for a in e)


def _stats(sess, m):
    return {k: int(v) for k, v in sess.run(m["stats"]).items() if k != "hit_rate"}


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint32) if x.dtype == np.float32 else x


def _assert_same(a, b, what=""):
    assert len(a) == len(b)
    for x, y, field in zip(a, b, ("keys", "values", "slots", "versions", "frequencies")):
        np.testing.assert_array_equal(_bits(x), _bits(y), err_msg="%s %s" % (what, field))


def _assert_mostly_on_disk(stats):
    assert stats["disk_keys"] > stats["memory_keys"] > 0, stats
    assert stats["memory_keys"] <= stats["budget_keys"], stats
    assert stats["errors"] == 0, stats


# ---- full checkpoints ------------------------------------------------------------------------------------------


def _run_and_save(tmp_path, storage, steps, prefix):
    """Trains a fresh model `steps` steps and saves it; returns (checkpoint path, state, tier stats)."""
    with tf.Graph().as_default():
        m = _build(storage)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _train(sess, m, steps)
            path = tf.compat.v1.train.Saver().save(sess, str(tmp_path / prefix), global_step=m["gs"])
            return path, _state(sess, m), _stats(sess, m)


def _restore_and_continue(path, storage, steps, num_shards=2):
    """Restores `path` into a fresh model; returns (state after the restore, stats, state after `steps` more)."""
    with tf.Graph().as_default():
        m = _build(storage, num_shards)
        with tf.compat.v1.Session(config=session_config()) as sess:
            tf.compat.v1.train.Saver().restore(sess, path)
            sess.run(m["settle"])
            restored, stats = _state(sess, m), _stats(sess, m)
            _train(sess, m, steps)
            return restored, stats, _state(sess, m)


def _checkpoint_rows(path, num_shards=2):
    """The checkpoint's rows of all shards, sorted by key (keys, values, slots, versions, frequencies)."""
    reader = tf.train.load_checkpoint(path)
    parts = [
        [reader.get_tensor("user/part_%d-%s" % (i, s)) for s in ("keys", "values", "slots", "versions", "freqs")]
        for i in range(num_shards)
    ]
    cat = [np.concatenate(p) for p in zip(*parts)]
    assert len(np.unique(cat[0])) == len(cat[0]), "a key saved twice in %s" % path
    order = np.argsort(cat[0])
    return tuple(a[order] for a in cat)


def test_full_checkpoint_holds_both_tiers_and_restores_into_tiered_and_in_memory_tables(tmp_path):
    path, saved, stats = _run_and_save(tmp_path, _storage(tmp_path, "train", 2), 6, "tiered")
    _assert_mostly_on_disk(stats)
    assert stats["memory_keys"] + stats["disk_keys"] == len(saved[0])
    # The in-memory model trained on the same batches saves the same checkpoint, and it holds every key.
    ref_path, ref_saved, _ = _run_and_save(tmp_path, None, 6, "in_memory")
    _assert_same(saved, ref_saved, "tiered run")
    _assert_same(_checkpoint_rows(path), saved, "checkpoint")
    _assert_same(_checkpoint_rows(ref_path), saved, "in-memory checkpoint")
    # Uninterrupted: 9 steps in memory.
    with tf.Graph().as_default():
        m = _build(None)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _train(sess, m, 9)
            uninterrupted = _state(sess, m)
    # Restored into a tiered model (a restore larger than its budget: most rows go to disk) and into an in-memory
    # one, both continue exactly as the uninterrupted run.
    for storage in (_storage(tmp_path, "restored", 2), None):
        restored, restored_stats, continued = _restore_and_continue(path, storage, 3)
        _assert_same(restored, saved, "restored (tiered=%s)" % (storage is not None))
        _assert_same(continued, uninterrupted, "continued (tiered=%s)" % (storage is not None))
        if storage is not None:
            _assert_mostly_on_disk(restored_stats)
            assert restored_stats["memory_keys"] + restored_stats["disk_keys"] == len(saved[0])


def test_restore_over_a_trained_table_replaces_both_tiers(tmp_path):
    """A restore in the session that kept training after the save: keys trained since (in memory and on disk) are
    gone, and the rows of the others are the saved ones again."""
    with tf.Graph().as_default():
        m = _build(_storage(tmp_path, "train", 2))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            _train(sess, m, 5)
            path = saver.save(sess, str(tmp_path / "model"))
            saved = _state(sess, m)
            _train(sess, m, 4)
            later = _state(sess, m)
            assert len(set(later[0].tolist()) - set(saved[0].tolist())) > _stats(sess, m)["memory_keys"]
            saver.restore(sess, path)
            sess.run(m["settle"])
            _assert_same(_state(sess, m), saved, "restored over the trained table")
            stats = _stats(sess, m)
            assert stats["memory_keys"] + stats["disk_keys"] == len(saved[0]), stats
            _assert_mostly_on_disk(stats)


def test_restore_in_a_fresh_process_rebuilds_the_store_the_training_run_left(tmp_path):
    """The training run's store directory is left marked when its session closes; a new process whose table opens
    the same directory wipes it and restores every key of the checkpoint into both tiers."""
    storage = _storage(tmp_path, "train", 2)
    path, saved, _ = _run_and_save(tmp_path, storage, 6, "tiered")
    store = os.path.join(storage.path, "user", "shard_0_of_2")
    assert os.listdir(store), store  # the training run's files are still there
    out = str(tmp_path / "restored.npz")
    run_fresh(
        """
        import sys
        sys.path.insert(0, %r)
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        from tensorflow_ext.embedding.tests import test_tiered_checkpoint as t
        storage = tf_ext.TieredStorage(memory_bytes=%d, path=%r)
        with tf.Graph().as_default():
            m = t._build(storage)
            with tf.compat.v1.Session() as sess:
                tf.compat.v1.train.Saver().restore(sess, %r)
                sess.run(m["settle"])
                np.savez(%r, *t._state(sess, m), stats=np.array([t._stats(sess, m)[k] for k in
                         ("memory_keys", "disk_keys", "budget_keys")]))
        """
        % (_ROOT, storage.memory_bytes, storage.path, path, out),
        tmp_path,
    )
    got = np.load(out)
    _assert_same([got["arr_%d" % i] for i in range(5)], saved, "fresh-process restore")
    memory_keys, disk_keys, budget_keys = got["stats"]
    assert disk_keys > memory_keys > 0 and memory_keys <= budget_keys
    assert memory_keys + disk_keys == len(saved[0])


def _warm_start(path, storage, num_shards):
    """A fresh model of `num_shards` shards warm-started from `path`; returns its state."""
    with tf.Graph().as_default():
        m = _build(storage, num_shards)
        tf.compat.v1.train.warm_start(path, vars_to_warm_start=".*user.*")
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf_ext.embedding.warm_start_op())
            sess.run(m["settle"])
            return _state(sess, m), _stats(sess, m)


def test_other_shard_counts_and_warm_start_from_a_tiered_checkpoint(tmp_path):
    """A checkpoint of a tiered 2-shard embedding warm-starts 1- and 3-shard embeddings, tiered or not: every key
    with its row, version and frequency (slots start afresh, as TF's warm start leaves them)."""
    path, saved, stats = _run_and_save(tmp_path, _storage(tmp_path, "train", 2), 6, "tiered")
    _assert_mostly_on_disk(stats)
    for num_shards, tiered in ((3, True), (1, False), (1, True), (3, False)):
        storage = _storage(tmp_path, "warm_%d_%s" % (num_shards, tiered), num_shards) if tiered else None
        got, got_stats = _warm_start(path, storage, num_shards)
        what = "warm start into %d shards (tiered=%s)" % (num_shards, tiered)
        for i, field in ((0, "keys"), (1, "values"), (3, "versions"), (4, "frequencies")):
            np.testing.assert_array_equal(_bits(got[i]), _bits(saved[i]), err_msg="%s: %s" % (what, field))
        np.testing.assert_array_equal(got[2], np.full_like(saved[2], 0.1), err_msg=what + ": slots")  # Adagrad's
        if tiered:
            _assert_mostly_on_disk(got_stats)


# ---- delta checkpoints -----------------------------------------------------------------------------------------


def _delta_run(tmp_path, storage, num_saves=5, full_every=3, disk_cap_stats=None):
    """Trains with removals and evictions between saves (delta checkpoints); returns [(path, state at the save,
    stats at the save, rows in the save)]."""
    out = []
    with tf.Graph().as_default():
        m = _build(storage)
        evict = tf_ext.embedding.evict(m["emb"], steps_to_live=6)
        listener = tf_ext.embedding.delta_checkpoints(full_every=full_every)
        saver = tf.compat.v1.train.Saver(max_to_keep=100)
        ckpt_dir = tmp_path / ("tiered" if storage is not None else "in_memory")
        ckpt_dir.mkdir()
        prefix = str(ckpt_dir / "model.ckpt")
        rng = np.random.RandomState(0)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for save in range(num_saves):
                _train(sess, m, 3)
                # Removals of keys trained long ago (on disk) and recently (in memory), some absent.
                sess.run(
                    m["remove"],
                    {
                        m["remove_ids"]: np.concatenate(
                            [_batch(0)[rng.randint(0, 80, 10)], _batch(3 * save + 2)[:5], [12345]]
                        )
                    },
                )
                if save % 2 == 1:
                    sess.run(evict)
                sess.run(m["settle"])
                stats = _stats(sess, m)
                path = listener.save(sess, saver, prefix, m["gs"])
                out.append((path, _state(sess, m), stats))
    return out


def _kind(path):
    record = tf.train.load_checkpoint(path).get_tensor("user/part_0-delta")
    record = record.decode() if isinstance(record, bytes) else record
    return [line for line in record.split("\n") if line.startswith("kind=")][0][len("kind=") :]


def _restore(path, storage, num_shards=2):
    with tf.Graph().as_default():
        m = _build(storage, num_shards)
        with tf.compat.v1.Session(config=session_config()) as sess:
            tf.compat.v1.train.Saver().restore(sess, path)
            sess.run(m["settle"])
            return _state(sess, m), _stats(sess, m)


def test_delta_checkpoints_hold_rows_of_both_tiers(tmp_path):
    saves = _delta_run(tmp_path, _storage(tmp_path, "train", 2))
    ref = _delta_run(tmp_path, None)
    assert [_kind(p) for p, _, _ in saves] == ["full", "delta", "delta", "full", "delta"]
    for i, ((path, state, stats), (_, ref_state, _)) in enumerate(zip(saves, ref)):
        _assert_same(state, ref_state, "save %d against the in-memory run" % i)
        if i > 0:  # the first save comes after 3 steps: the tiers hold about as many keys each
            _assert_mostly_on_disk(stats)
        assert stats["disk_keys"] > 0 and stats["memory_keys"] <= stats["budget_keys"], stats
        if _kind(path) == "delta":
            rows = _checkpoint_rows(path)[0]
            # The rows trained since the previous save: more than memory holds, so some came from the disk tier.
            assert stats["memory_keys"] < len(rows) < len(state[0]), (len(rows), stats)
            assert tf.train.load_checkpoint(path).get_tensor("user/part_0-removed").size > 0
        _assert_same(_restore(path, None)[0], state, "save %d restored in memory" % i)
        restored, restored_stats = _restore(path, _storage(tmp_path, "restore_%d" % i, 2))
        _assert_same(restored, state, "save %d restored tiered" % i)
        assert restored_stats["memory_keys"] + restored_stats["disk_keys"] == len(state[0]), restored_stats
        assert restored_stats["disk_keys"] > 0 and restored_stats["memory_keys"] <= restored_stats["budget_keys"]


# ---- eviction ---------------------------------------------------------------------------------------------------


def _eviction_run(storage, steps=8):
    """Trains with an in-step capacity policy (every 2 steps), then evicts by age; returns the states after each
    step and after the eviction, the policy's evicted counter, and the stats before and after the eviction."""
    with tf.Graph().as_default():
        m = _build(storage, eviction=tf_ext.embedding.EvictionPolicy(capacity=300, every_n_steps=2))
        by_age = tf_ext.embedding.evict(m["emb"], steps_to_live=2)
        evicted = m["emb"].eviction_state["evicted"]
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            states = []
            for _ in range(steps):
                _train(sess, m, 1)
                states.append(_state(sess, m))
            before = _stats(sess, m)
            removed = int(sess.run(by_age))
            sess.run(m["settle"])
            states.append(_state(sess, m))
            return states, int(sess.run(evicted)), removed, before, _stats(sess, m)


def test_eviction_removes_keys_of_both_tiers_as_in_memory(tmp_path):
    tiered = _eviction_run(_storage(tmp_path, "train", 2))
    plain = _eviction_run(None)
    for i, (a, b) in enumerate(zip(tiered[0], plain[0])):
        _assert_same(a, b, "after step %d" % i)
    assert tiered[1] == plain[1] > 0  # the capacity policy's evicted-keys counter
    assert max(len(s[0]) for s in tiered[0][:-1]) <= 300 + 80
    removed, before, after = tiered[2:]
    _assert_mostly_on_disk(before)
    # The keys not trained in the last 2 steps went: more than memory held, so keys on disk went too.
    assert removed == plain[2] > before["memory_keys"], (removed, before)
    assert (
        after["memory_keys"] + after["disk_keys"]
        == len(tiered[0][-1][0])
        == before["memory_keys"] + before["disk_keys"] - removed
    )
    assert after["disk_keys"] < before["disk_keys"]


def test_removing_more_keys_than_the_budget_holds(tmp_path):
    """`remove` (and the evictions built on it: a capacity, restrict, an L2 norm) may name more keys than the memory
    tier holds, most of them on disk: they are removed as from an in-memory table."""
    states = []
    for storage in (_storage(tmp_path, "train", 2), None):
        with tf.Graph().as_default():
            m = _build(storage)
            restrict = tf_ext.embedding.restrict(m["emb"], num_reserved=50, policy="frequency")
            with tf.compat.v1.Session(config=session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                _train(sess, m, 6)
                keys = _state(sess, m)[0]
                removed = sess.run(m["remove"], {m["remove_ids"]: keys[::2]})  # ~200 keys, 64 rows per shard
                assert removed == len(keys[::2])
                sess.run(restrict)
                states.append(_state(sess, m))
                if storage is not None:
                    stats = _stats(sess, m)
    assert len(states[0][0]) == 50
    assert stats["memory_keys"] + stats["disk_keys"] == 50 and stats["errors"] == 0, stats
    # restrict keeps the 50 most frequent keys, ties broken arbitrarily: the same count, and every key kept is as
    # frequent as any key the in-memory table kept.
    assert states[0][4].min() >= states[1][4].min() and states[1][4].min() >= states[0][4].min()


# ---- a capped disk tier -----------------------------------------------------------------------------------------


DISK_ROWS = 150  # about what the disk tier of a shard holds under the cap below


def test_capped_disk_drops_the_oldest_keys_counted_and_delta_checkpoints_record_them(tmp_path):
    entry = 16 + 8 + 4 * 2 * DIM + 12  # a disk entry's nominal bytes: overhead, key, values + Adagrad slots, metadata
    storage = _storage(tmp_path, "train", 2, disk_bytes=2 * DISK_ROWS * entry)
    trained = {}  # key -> the step of its last update (its version)
    with tf.Graph().as_default():
        m = _build(storage)
        listener = tf_ext.embedding.delta_checkpoints(full_every=10)
        saver = tf.compat.v1.train.Saver(max_to_keep=100)
        (tmp_path / "ckpt").mkdir()
        prefix = str(tmp_path / "ckpt" / "model.ckpt")
        saves = []
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for save in range(3):
                for _ in range(4):
                    step = int(sess.run(m["gs"]))
                    trained.update({int(k): step for k in _batch(step)})
                    _train(sess, m, 1)
                saves.append((listener.save(sess, saver, prefix, m["gs"]), _state(sess, m), _stats(sess, m)))
    assert [_kind(p) for p, _, _ in saves] == ["full", "delta", "delta"]
    path, state, stats = saves[-1]
    kept = set(state[0].tolist())
    dropped = set(trained) - kept
    # Nothing else removed keys: the keys missing were dropped, and counted (a key dropped and trained again later is
    # a new key, counted once it was dropped), and the disk tier is within its cap.
    assert stats["dropped"] >= len(dropped) > 0, stats
    assert stats["memory_keys"] + stats["disk_keys"] == len(kept)
    assert stats["disk_keys"] <= 2 * DISK_ROWS, stats
    # LRU: the keys dropped are the least recently trained: none of the last 2 steps', and older ones than those
    # kept on average (rows leave memory by a sampled threshold of versions: not in exact order).
    last = max(trained.values())
    assert not [k for k in dropped if trained[k] >= last - 1]
    assert np.mean([trained[k] for k in dropped]) + 3 < np.mean([trained[k] for k in kept])
    # Each delta lists the keys dropped since the previous save (that the previous save held) as removed, so a
    # restore of the chain has exactly the table of the run at that save.
    for (prev_path, prev_state, _), (delta_path, delta_state, _) in zip(saves, saves[1:]):
        removed = np.concatenate(
            [tf.train.load_checkpoint(delta_path).get_tensor("user/part_%d-removed" % i) for i in range(2)]
        )
        gone = set(prev_state[0].tolist()) - set(delta_state[0].tolist())
        assert gone and gone <= set(removed.tolist()), (len(gone), len(removed))
        _assert_same(_restore(delta_path, None)[0], delta_state, "delta restored in memory")
        _assert_same(_restore(delta_path, _storage(tmp_path, "restore", 2))[0], delta_state, "delta restored tiered")


# ---- serving -----------------------------------------------------------------------------------------------------


def _serving_model(ids, storage):
    """Probability [batch] of int64 ids [batch]."""
    emb = tf_ext.get_dynamic_embedding("user", DIM, num_shards=2, initializer=_init(), storage=storage)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-1, 1, DIM).reshape(DIM, 1), tf.float32))
    return tf.identity(tf.sigmoid(tf.matmul(tf_ext.embedding_lookup(emb, ids), w))[:, 0], name="prob")


def _export(ckpt, export_dir, storage):
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        prob = _serving_model(ids, storage)
        tf.compat.v1.train.Saver().restore(sess, ckpt)
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"prob": prob})
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    return export_dir


def test_serving_export_of_a_tiered_embedding_predicts_as_in_memory(tmp_path):
    """A tiered model's SavedModel, loaded by a fresh process that only imports tensorflow_ext, keeps its tiers (most
    served rows on disk) and predicts exactly what the in-memory model's export predicts."""
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        gs = tf.compat.v1.train.get_or_create_global_step()
        prob = _serving_model(ids, _storage(tmp_path, "train", 2))
        emb = tf_ext.embedding.get_dynamic_embeddings()[0]
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(tf.reduce_mean(tf.square(prob - 0.8)), global_step=gs)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(6):
                sess.run(train, {ids: _batch(step)})
            sess.run(emb.tier_settle())
            _assert_mostly_on_disk({k: int(v) for k, v in sess.run(emb.tier_stats()).items() if k != "hit_rate"})
            ckpt = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model"))
            serve_ids = np.concatenate([np.concatenate([_batch(s) for s in range(6)]), [5, -7]])  # 2 never trained
            want = np.concatenate([sess.run(prob, {ids: serve_ids[i : i + 64]}) for i in range(0, len(serve_ids), 64)])
    serving = tf_ext.TieredStorage(memory_bytes=_memory_bytes(tmp_path, 2), path=str(tmp_path / "serving_tiers"))
    exports = {
        "tiered": _export(ckpt, str(tmp_path / "export_tiered"), serving),
        "in_memory": _export(ckpt, str(tmp_path / "export_in_memory"), None),
    }
    np.save(str(tmp_path / "ids.npy"), serve_ids)
    out = run_fresh(
        """
        import json
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext
        from tensorflow_ext.utils.loader import load_ops
        tf.compat.v1.disable_v2_behavior()
        ids = np.load("ids.npy")
        result = {}
        for name, path in %s.items():
            with tf.Graph().as_default() as g, tf.compat.v1.Session() as sess:
                meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
                sig = meta.signature_def["serving_default"]
                # Batches of 64: each fits the serving budget, the whole table does not.
                prob = np.concatenate([sess.run(sig.outputs["prob"].name, {sig.inputs["ids"].name: ids[i : i + 64]})
                                       for i in range(0, len(ids), 64)])
                handles = [op.outputs[0] for op in g.get_operations() if op.type == "TfExtTableHandle"]
                stats = sess.run([load_ops().tf_ext_table_tier_stats(h) for h in handles])
                tier_paths = [op.get_attr("tier_path").decode() for op in g.get_operations()
                              if op.type == "TfExtTableHandle"]
            np.save(name + ".npy", prob)
            result[name] = dict(stats=np.sum(stats, 0).tolist(), tier_paths=sorted(tier_paths))
        print(json.dumps(result))
        """
        % json.dumps(exports),
        tmp_path,
    )
    result = json.loads(out.strip().splitlines()[-1])
    tiered, in_memory = np.load(str(tmp_path / "tiered.npy")), np.load(str(tmp_path / "in_memory.npy"))
    np.testing.assert_array_equal(_bits(tiered), _bits(in_memory))
    # The training graph's own predictions of the trained ids (its lookups of the 2 new ids inserted random rows).
    np.testing.assert_allclose(tiered[:-2], want[:-2], rtol=1e-6, atol=1e-7)
    fields = dict(zip(("memory_keys", "memory_bytes", "disk_keys"), result["tiered"]["stats"]))
    assert fields["disk_keys"] > fields["memory_keys"] > 0, result
    assert result["tiered"]["tier_paths"] == [
        os.path.join(serving.path, "user", "shard_%d_of_2" % i) for i in range(2)
    ], result
    assert result["in_memory"]["tier_paths"] == ["", ""] and result["in_memory"]["stats"][2] == 0, result
