"""Delta checkpoints: a full save and the deltas after it restore exactly the table the run had at each save."""

import glob
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.checkpoint import format as ckpt_format
from tensorflow_ext.embedding.tests.conftest import run_fresh as _run_fresh
from tensorflow_ext.embedding.tests.conftest import session_config

DIM = 4


def _build(num_shards=2, optimizer="adagrad"):
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding(
        "user", DIM, num_shards=num_shards, initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3)
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 0.5))
    opt = {
        "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
        "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    }[optimizer]()
    train = opt.minimize(loss, global_step=gs)
    remove_ids = tf.compat.v1.placeholder(tf.int64, [None], name="remove_ids")
    remove = emb.remove(remove_ids)
    evict = tf_ext.embedding.evict(emb, steps_to_live=4)
    return gs, emb, ids, train, remove_ids, remove, evict


def _state(sess, emb):
    """The whole table, sorted by key: keys, values, slots, versions, frequencies (numpy)."""
    exp = sess.run(emb.export(with_slots=True))
    order = np.argsort(exp.keys)
    return tuple(np.asarray(a)[order] for a in exp)


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y, what in zip(a, b, ("keys", "values", "slots", "versions", "frequencies")):
        np.testing.assert_array_equal(x, y, err_msg=what)


def _restore_state(path, num_shards=2, optimizer="adagrad"):
    with tf.Graph().as_default():
        _, emb, *_ = _build(num_shards, optimizer)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            return _state(sess, emb)


def _record(path, shard="user/part_0"):
    value = tf.compat.v1.train.NewCheckpointReader(path).get_tensor(shard + "-delta")
    return value.decode() if isinstance(value, bytes) else value


def _kind(path, shard="user/part_0"):
    return [line for line in _record(path, shard).split("\n") if line.startswith("kind=")][0][len("kind=") :]


def _rows(path, shard="user/part_0"):
    return tf.train.load_checkpoint(path).get_tensor(shard + "-keys").size


def _train_run(tmp_path, num_saves=7, full_every=3, optimizer="adagrad", max_to_keep=None):
    """Trains with removals and evictions between delta saves; returns [(path, state at the save)], listener."""
    rng = np.random.RandomState(0)
    out = []
    gs, emb, ids, train, remove_ids, remove, evict = _build(optimizer=optimizer)
    listener = tf_ext.embedding.delta_checkpoints(full_every=full_every)
    saver = tf.compat.v1.train.Saver(max_to_keep=max_to_keep if max_to_keep is not None else 100)
    prefix = str(tmp_path / "model.ckpt")
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for save in range(num_saves):
            for _ in range(3):
                # Mostly fresh keys, some repeated ones (their rows change again).
                batch = np.concatenate([rng.randint(0, 300, size=20), rng.randint(1000 * save, 1000 * save + 50, 10)])
                sess.run(train, {ids: batch})
            sess.run(remove, {remove_ids: rng.randint(0, 300, size=15)})
            if save % 2 == 1:
                sess.run(evict)
            path = listener.save(sess, saver, prefix, gs)
            out.append((path, _state(sess, emb)))
    return out, listener, saver


def test_full_and_deltas_restore_the_uninterrupted_table(graph, tmp_path):
    saves, _, _ = _train_run(tmp_path, num_saves=7, full_every=3)
    kinds = [_kind(p) for p, _ in saves]
    assert kinds == ["full", "delta", "delta", "full", "delta", "delta", "full"]
    for (path, state), kind in zip(saves, kinds):
        if kind == "delta":
            # Only the rows trained since the previous save: far fewer than the table.
            assert 0 < _rows(path) < len(state[0]) / 2 + 1
            removed = tf.train.load_checkpoint(path).get_tensor("user/part_0-removed")
            assert removed.size > 0
        _assert_same(_restore_state(path), state)


def _restore_error(path):
    with pytest.raises(tf.errors.OpError) as info:
        _restore_state(path)
    return str(info.value)


def _files(path):
    return glob.glob(path + ".*")


def test_missing_truncated_or_foreign_link_is_a_clear_error(graph, tmp_path):
    saves, _, _ = _train_run(tmp_path, num_saves=3, full_every=3)
    (full, _), (delta1, _), (delta2, _) = saves
    # A truncated delta in the chain: DataLoss naming its file.
    data = [f for f in _files(delta1) if ".data-" in f][0]
    with open(data, "rb") as f:
        content = f.read()
    with open(data, "wb") as f:
        f.write(content[: len(content) // 2])
    message = _restore_error(delta2)
    assert "truncated" in message and data in message
    with open(data, "wb") as f:
        f.write(content)
    _restore_state(delta2)
    # Another run's checkpoint under the name of a link: refused, naming both.
    with tf.Graph().as_default():
        other, _, _ = _train_run(tmp_path / "other", num_saves=2, full_every=3)
    originals = _files(delta1)
    for f in originals:
        os.rename(f, f + ".orig")
    for f in _files(other[1][0]):
        os.rename(f, f.replace(other[1][0], delta1))
    message = _restore_error(delta2)
    assert "another one" in message and delta1 in message and delta2 in message
    for f in originals:
        os.replace(f + ".orig", f)
    _restore_state(delta2)
    # The full save gone (e.g. deleted by hand): refused, naming it.
    for f in _files(full):
        os.remove(f)
    message = _restore_error(delta2)
    assert "needs checkpoint" in message and full in message and "missing" in message


def test_a_failed_restore_leaves_the_table_unchanged(graph, tmp_path):
    saves, _, _ = _train_run(tmp_path, num_saves=2, full_every=3)
    (full, state0), (delta, _) = saves
    for f in _files(full):
        os.remove(f)
    with tf.Graph().as_default():
        _, emb, *_ = _build()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(emb.insert(tf.constant([7, 8], tf.int64), tf.ones([2, DIM])))
            before = _state(sess, emb)
            with pytest.raises(tf.errors.InvalidArgumentError, match="needs checkpoint"):
                saver.restore(sess, delta)
            _assert_same(_state(sess, emb), before)


def test_keep_checkpoint_max_keeps_the_links_kept_deltas_need(graph, tmp_path):
    saves, _, saver = _train_run(tmp_path, num_saves=9, full_every=4, max_to_keep=2)
    states = dict(saves)
    listed = saver.last_checkpoints
    assert listed == [saves[-2][0], saves[-1][0]]
    # saves: F D D D F D D D F; the Saver lists the last two, whose links (none: 8 is full, 7 needs 4, 5, 6) stay.
    for path in listed:
        _assert_same(_restore_state(path), states[path])
    on_disk = sorted(p for p, _ in saves if _files(p))
    assert on_disk == sorted([saves[i][0] for i in (4, 5, 6, 7, 8)])
    # The links of deltas that left the list were deleted once nothing listed needed them.
    assert not _files(saves[0][0]) and not _files(saves[3][0])


def test_untracked_writes_make_the_next_save_full(graph, tmp_path):
    gs, emb, ids, train, _, _, _ = _build()
    listener = tf_ext.embedding.delta_checkpoints(full_every=10)
    saver = tf.compat.v1.train.Saver()
    prefix = str(tmp_path / "model.ckpt")
    preload = emb.insert(tf.constant([5000, 5001], tf.int64), tf.fill([2, DIM], 0.25))
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: [1, 2, 3]})
        kinds = [_kind(listener.save(sess, saver, prefix, gs))]
        sess.run(train, {ids: [3, 4]})
        kinds.append(_kind(listener.save(sess, saver, prefix, gs)))
        sess.run(preload)  # sets no version: a delta could not find these rows
        sess.run(train, {ids: [4, 5]})
        path = listener.save(sess, saver, prefix, gs)
        kinds.append(_kind(path))
        state = _state(sess, emb)
        sess.run(train, {ids: [6]})
        kinds.append(_kind(listener.save(sess, saver, prefix, gs)))
    assert kinds == ["full", "delta", "full", "delta"]
    _assert_same(_restore_state(path), state)


def test_bad_arguments():
    with pytest.raises(ValueError, match="full_every must be an int >= 1"):
        tf_ext.embedding.delta_checkpoints(full_every=0)
    with pytest.raises(ValueError, match="max_removed_keys"):
        tf_ext.embedding.delta_checkpoints(full_every=2, max_removed_keys=-1)
    with pytest.raises(TypeError, match="saver must be"):
        tf_ext.embedding.delta_checkpoints(full_every=2, saver="model.ckpt")


def test_saver_built_before_the_listener_is_refused(graph, tmp_path):
    gs, emb, ids, train, *_ = _build()
    saver = tf.compat.v1.train.Saver()
    listener = tf_ext.embedding.delta_checkpoints(full_every=2)
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(RuntimeError, match="Saver was built before"):
            listener.save(sess, saver, str(tmp_path / "m"), gs)


def _model_fn(features, labels, mode):
    del labels
    emb = tf_ext.get_dynamic_embedding("item", DIM, num_shards=2, initializer=0.05)
    pred = tf.reduce_sum(tf_ext.embedding_lookup(emb, features["items"]), axis=[1, 2])
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"p": pred})
    loss = tf.reduce_mean(tf.square(pred - tf.cast(features["items"][:, 0] % 3, tf.float32)))
    gs = tf.compat.v1.train.get_global_step()
    train = tf.compat.v1.train.FtrlOptimizer(0.1).minimize(loss, gs)
    with tf.control_dependencies([train]):
        # After the update (and the step's increment): an eviction every 4 steps.
        step = tf.identity(gs.read_value())
        train = tf.cond(
            tf.equal(step % 4, 3), lambda: tf.group(tf_ext.embedding.evict(emb, 3, global_step=step)), tf.no_op
        )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def _input_fn(offset):
    def fn():
        rng = np.random.RandomState(offset)
        items = (rng.randint(0, 40, size=[80, 3]) + np.arange(80)[:, None] * 5 + offset).astype(np.int64)
        return tf.compat.v1.data.Dataset.from_tensor_slices({"items": items}).batch(8)

    return fn


def _checkpoint_state(model_dir, path):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        spec = _model_fn({"items": tf.zeros([1, 3], tf.int64)}, None, tf.estimator.ModeKeys.TRAIN)
        del spec
        emb = tf_ext.embedding.get_dynamic_embeddings()[0]
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            return _state(sess, emb)


def test_estimator_train_then_continue_equals_full_checkpoints(tmp_path):
    def run(model_dir, listeners):
        config = tf.estimator.RunConfig(
            model_dir=model_dir, save_checkpoints_steps=2, keep_checkpoint_max=2, session_config=session_config()
        )
        est = tf.estimator.Estimator(_model_fn, config=config)
        est.train(_input_fn(0), saving_listeners=listeners())
        est.train(_input_fn(1000), saving_listeners=listeners())  # restores the latest checkpoint, goes on
        return tf.train.latest_checkpoint(model_dir)

    plain = run(str(tmp_path / "plain"), lambda: [])
    delta_dir = str(tmp_path / "delta")
    latest = run(delta_dir, lambda: [tf_ext.embedding.delta_checkpoints(full_every=3)])
    assert os.path.basename(latest) == os.path.basename(plain) == "model.ckpt-20"
    prefixes = [p[: -len(".index")] for p in glob.glob(delta_dir + "/*.index")]
    kinds = {int(p.rsplit("-", 1)[1]): _kind(p, "item/part_0") for p in prefixes}
    # The second train() restored step 10 (a delta on the full save of step 6) and saved a full one there first;
    # saves every 2 steps, full every 3rd: 10 F, 12 D, 14 D, 16 F, 18 D, 20 D. keep_checkpoint_max=2 lists 18 and
    # 20; 16 stays as their base, the others are deleted.
    assert kinds == {16: "full", 18: "delta", 20: "delta"}
    _assert_same(_checkpoint_state(delta_dir, latest), _checkpoint_state(str(tmp_path / "plain"), plain))
    # Every checkpoint the Saver lists (keep_checkpoint_max=2) restores.
    for path in tf.train.get_checkpoint_state(delta_dir).all_model_checkpoint_paths:
        _checkpoint_state(delta_dir, path)


def test_restore_graph_is_one_chain_op_per_shard():
    """Following a delta's chain is one op per shard and Saver (no loop or cond of TF ops, which cost ~0.6 s of graph
    construction per shard: seconds per Saver for a model with dozens of tables)."""
    with tf.Graph().as_default() as g:
        _build(num_shards=3)
        tf.compat.v1.train.Saver()
        types = [op.type for op in g.get_operations()]
    assert types.count("TfExtCheckpointRestoreRows") == 3
    assert not {"Enter", "Exit", "NextIteration", "While", "StatelessWhile"} & set(types)


# ---- the whole chain wherever a checkpoint is read; saves that cannot lose keys or delete links ------------------


def _full_then_delta(tmp_path, num_shards=2):
    """A full save of 120 keys, then a delta after training 60 new keys and 20 old ones: (full, delta, state)."""
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = _build(num_shards)
        listener = tf_ext.embedding.delta_checkpoints(full_every=5)
        saver = tf.compat.v1.train.Saver()
        prefix = str(tmp_path / "model.ckpt")
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for start in (0, 40, 80):
                sess.run(train, {ids: np.arange(start, start + 40)})
            full = listener.save(sess, saver, prefix, gs)
            sess.run(train, {ids: np.concatenate([np.arange(1000, 1060), np.arange(0, 20)])})
            delta = listener.save(sess, saver, prefix, gs)
            state = _state(sess, emb)
    assert _kind(full) == "full" and _kind(delta) == "delta"
    return full, delta, state


def test_warm_start_from_a_delta_checkpoint_reads_its_whole_chain(tmp_path):
    """Warm start (same and other shard counts) from a delta: every key of the table saved, with its row."""
    _, delta, state = _full_then_delta(tmp_path)
    assert _rows(delta) + _rows(delta, "user/part_1") < len(state[0])  # the delta alone lacks most keys
    out = str(tmp_path / "warm.npz")
    _run_fresh(
        """
        import numpy as np
        import tensorflow as tf
        import tensorflow_ext as tf_ext
        tf.compat.v1.disable_v2_behavior()
        result = {}
        for num_shards in (1, 2, 3):
            with tf.Graph().as_default():
                emb = tf_ext.get_dynamic_embedding("user", %d, num_shards=num_shards, initializer=0.0)
                tf_ext.embedding.warm_start_from_checkpoint(%r)
                exp = emb.export()
                with tf.compat.v1.Session() as sess:
                    sess.run(tf_ext.embedding.warm_start_op())
                    got = sess.run([exp.keys, exp.values, exp.versions, exp.frequencies])
            for name, value in zip(("keys", "values", "versions", "freqs"), got):
                result["%%s_%%d" %% (name, num_shards)] = value
        np.savez(%r, **result)
        """
        % (DIM, delta, out),
        tmp_path,
    )
    got = np.load(out)
    keys, values, _, versions, freqs = state
    for num_shards in (1, 2, 3):
        order = np.argsort(got["keys_%d" % num_shards])
        np.testing.assert_array_equal(got["keys_%d" % num_shards][order], keys)
        np.testing.assert_array_equal(got["values_%d" % num_shards][order], values)
        np.testing.assert_array_equal(got["versions_%d" % num_shards][order], versions)
        np.testing.assert_array_equal(got["freqs_%d" % num_shards][order], freqs)


def test_restore_into_another_shard_count_names_both_counts(graph, tmp_path):
    _, delta, _ = _full_then_delta(tmp_path)
    for num_shards in (1, 3):
        with tf.Graph().as_default():
            tf_ext.get_dynamic_embedding("user", DIM, num_shards=num_shards)
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session(config=session_config()) as sess:
                with pytest.raises(tf.errors.InvalidArgumentError) as info:
                    saver.restore(sess, delta)
        message = str(info.value)
        assert "warm_start" in message, message
        if num_shards == 1:
            assert "has num_shards=1 here" in message and "Checkpoint num_shards: 2" in message, message
        else:  # more shards than saved: the counts and what to do, not a missing tensor
            assert "saved with num_shards=2" in message and "has num_shards=3 here" in message, message


def test_deltas_at_a_global_step_that_does_not_advance_keep_every_key(graph, tmp_path):
    """Checkpoints named by steps 1..4 while the graph's global step stays 0: every key saved comes back."""
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding("user", DIM, num_shards=2, initializer=0.1)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 0.5))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)  # the global step is not incremented
    listener = tf_ext.embedding.delta_checkpoints(full_every=10)
    saver = tf.compat.v1.train.Saver(max_to_keep=10)
    prefix = str(tmp_path / "model.ckpt")
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(1, 5):
            sess.run(train, {ids: np.arange(10 * step, 10 * step + 10)})
            path = listener.save(sess, saver, prefix, step)
        state = _state(sess, emb)
        assert sess.run(gs) == 0
    assert len(state[0]) == 40
    _assert_same(_restore_state(path), state)


def _on_disk(directory):
    return sorted(p[: -len(".index")] for p in tf.io.gfile.glob(os.path.join(str(directory), "*.index")))


def _listed_and_links(listed):
    """The checkpoints `listed` and every link their records name."""
    out = set(listed)
    for path in listed:
        out.update(p for _, p in ckpt_format.delta_record_links(_record(path), os.path.dirname(path)))
    return sorted(out)


def _save_full_delta_delta(gs, emb, ids, train, prefix):
    """Trains and saves 3 times (full, delta, delta; max_to_keep=2); returns (the 3 paths, the state saved last)."""
    listener = tf_ext.embedding.delta_checkpoints(full_every=4)
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        paths = []
        for i in range(3):
            sess.run(train, {ids: np.arange(20 * i, 20 * i + 30)})
            paths.append(listener.save(sess, saver, prefix, gs))
        state = _state(sess, emb)
    assert [_kind(p) for p in paths] == ["full", "delta", "delta"]
    return paths, state


@pytest.mark.parametrize("filesystem", ["local", "ram"])
def test_a_record_that_cannot_be_read_deletes_no_link(graph, tmp_path, monkeypatch, filesystem):
    """A transient read error on a kept delta's record: its links stay (and go once it can be read).

    Also on a filesystem that Python's own file functions cannot see (TF's ram://, like gs:// or hdfs://): the kept
    links are found and deleted there too, and an unreadable record is not taken for a deleted checkpoint.
    """
    if filesystem == "ram":
        tmp_path = "ram://delta_%s" % uuid.uuid4().hex
        tf.io.gfile.makedirs(tmp_path)
    prefix = os.path.join(str(tmp_path), "model.ckpt")
    gs, emb, ids, train, *_ = _build()
    paths, state = _save_full_delta_delta(gs, emb, ids, train, prefix)
    full, delta1, delta2 = paths
    # A later run (a new graph and listener) lists the last two; reading delta2's record fails once.
    original = tf.compat.v1.train.NewCheckpointReader
    failing = {delta2}

    def flaky_reader(path):
        if path in failing:
            raise tf.errors.UnavailableError(None, None, "injected: filesystem unavailable")
        return original(path)

    monkeypatch.setattr(tf.compat.v1.train, "NewCheckpointReader", flaky_reader)
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = _build()
        listener = tf_ext.embedding.delta_checkpoints(full_every=4)
        saver = tf.compat.v1.train.Saver(max_to_keep=2)
        saver.recover_last_checkpoints([delta1, delta2])
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, delta2)
            sess.run(train, {ids: [500, 501]})
            listener.save(sess, saver, prefix, gs)  # a full save; the Saver's max_to_keep drops delta1
            _assert_same(_restore_state(delta2), state)
            failing.clear()
            sess.run(train, {ids: [502]})
            listener.save(sess, saver, prefix, gs)
            sess.run(train, {ids: [503]})
            listener.save(sess, saver, prefix, gs)
            listed = saver.last_checkpoints
    # Once readable, what nothing listed needs is deleted as usual.
    assert _on_disk(tmp_path) == _listed_and_links(listed)
    assert not {full, delta1, delta2} & set(_on_disk(tmp_path))


def test_links_left_by_a_save_killed_before_its_clean_up_go_at_the_next_save(graph, tmp_path):
    """A run killed between the Saver's write and the listener's clean-up: the next run's first save cleans up."""
    prefix = str(tmp_path / "model.ckpt")
    gs, emb, ids, train, *_ = _build()
    listener = tf_ext.embedding.delta_checkpoints(full_every=3)
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(5):  # full, delta, delta, full, then a delta whose clean-up never runs
            sess.run(train, {ids: np.arange(10 * i, 10 * i + 15)})
            if i < 4:
                listener.save(sess, saver, prefix, gs)
            else:
                step = int(sess.run(gs))
                listener.before_save(sess, step)
                saver.save(sess, prefix, global_step=step)  # killed here: after_save never runs
    assert len(_on_disk(tmp_path)) > 3
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = _build()
        listener = tf_ext.embedding.delta_checkpoints(full_every=3)
        saver = tf.compat.v1.train.Saver(max_to_keep=2)
        saver.recover_last_checkpoints(tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths)
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, tf.train.latest_checkpoint(str(tmp_path)))
            sess.run(train, {ids: [100, 101]})
            listener.save(sess, saver, prefix, gs)
            listed = saver.last_checkpoints
    assert _on_disk(tmp_path) == _listed_and_links(listed)
    for path in listed:
        _restore_state(path)


@pytest.mark.parametrize("eviction_first", [False, True], ids=["delta_first", "eviction_first"])
def test_listener_order_with_eviction_is_irrelevant(tmp_path, eviction_first):
    """An eviction at a save that removes more keys than the delta's log holds: a full save, in either order."""
    ckpt_dir = str(tmp_path)
    states = {}
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = _build()
        exported = emb.export(with_slots=True)

        class Capture(tf.compat.v1.train.CheckpointSaverListener):
            def after_save(self, session, global_step_value):
                exp = session.run(exported)
                order = np.argsort(exp.keys)
                states[global_step_value] = tuple(np.asarray(a)[order] for a in exp)

        delta = tf_ext.embedding.delta_checkpoints(full_every=10, max_removed_keys=2)
        evict = tf_ext.embedding.EvictionSaverListener(steps_to_live=1)
        listeners = [evict, delta] if eviction_first else [delta, evict]
        hook = tf.compat.v1.train.CheckpointSaverHook(ckpt_dir, save_steps=2, listeners=listeners + [Capture()])
        creator = tf.compat.v1.train.ChiefSessionCreator(config=session_config())
        with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
            for step in range(8):
                sess.run(train, {ids: np.arange(10 * step, 10 * step + 10)})
    assert evict.last_removed > 2
    paths = tf.train.get_checkpoint_state(ckpt_dir).all_model_checkpoint_paths
    assert len(paths) >= 3
    for path in paths:
        assert _kind(path) == "full", path  # each save's eviction overflowed the removal log: full saves
        _assert_same(_restore_state(path), states[int(path.rsplit("-", 1)[1])])


def test_a_link_not_deleted_for_a_transient_error_goes_at_a_later_save(graph, tmp_path, monkeypatch):
    """The clean-up cannot tell whether a link it no longer needs exists (a transient error): it goes later."""
    prefix = str(tmp_path / "model.ckpt")
    gs, emb, ids, train, *_ = _build()
    listener = tf_ext.embedding.delta_checkpoints(full_every=3)
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    original = tf.io.gfile.exists
    failing = []

    def flaky_exists(path):
        if failing:
            raise tf.errors.UnavailableError(None, None, "injected: filesystem unavailable")
        return original(path)

    monkeypatch.setattr(tf.io.gfile, "exists", flaky_exists)
    with tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for i in range(6):  # full, delta, delta, full, delta (after which links 1-2 are not needed), delta
            failing[:] = [True] if i == 4 else []
            sess.run(train, {ids: np.arange(10 * i, 10 * i + 15)})
            listener.save(sess, saver, prefix, gs)
        listed = saver.last_checkpoints
    assert _on_disk(tmp_path) == _listed_and_links(listed)


def test_a_later_run_reads_the_record_of_a_saved_embedding_when_the_first_is_not_saved(graph, tmp_path):
    """The first embedding of the graph is kept out of checkpoints (TFRA's checkpoint=False): a later run finds the
    records in the saved embedding's tensors, so the links a kept delta needs are kept."""
    from tensorflow_ext import tfra  # pylint: disable=import-outside-toplevel

    prefix = str(tmp_path / "model.ckpt")

    def build():
        tfra.get_variable("scratch", dim=DIM, checkpoint=False)  # first in the graph, never saved
        return _build()

    gs, emb, ids, train, *_ = build()
    paths, state = _save_full_delta_delta(gs, emb, ids, train, prefix)
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = build()
        listener = tf_ext.embedding.delta_checkpoints(full_every=4)
        saver = tf.compat.v1.train.Saver(max_to_keep=2)
        saver.recover_last_checkpoints(paths[1:])
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, paths[2])
            sess.run(train, {ids: [500, 501]})
            listener.save(sess, saver, prefix, gs)  # the Saver's max_to_keep drops paths[1], which paths[2] needs
    _assert_same(_restore_state(paths[2]), state)
