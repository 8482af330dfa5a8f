"""Correctness of dynamic embeddings at the edges: negative ids, warm start across dims, checkpoints whose keys
sit in the wrong shard, per-shard sizes, and the docs' API references."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config, write_shard_tensors_checkpoint

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import feature_column as dfc
from tensorflow_ext.embedding.checkpoint import warm_start as warm_start_lib

fc_v1 = tf.compat.v1.feature_column
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Signed 64-bit ids, half of them negative (as hashed feature ids are), including the extremes and -1.
KEYS = np.array([-(2**63), -1, -7, -123456789012345, 0, 5, 2**62, 2**63 - 1], np.int64)
V = len(KEYS)


def _sparse(rows, values_of=lambda v: v, dtype=np.int64):
    """rows: list of lists of ints -> SparseTensor [len(rows), max_len] of values_of(ids)."""
    indices = [[i, j] for i, row in enumerate(rows) for j in range(len(row))]
    values = [values_of(v) for row in rows for v in row]
    width = max([len(r) for r in rows] + [1])
    return tf.SparseTensor(
        np.array(indices, np.int64).reshape(-1, 2), np.array(values, dtype), np.array([len(rows), width], np.int64)
    )


# ---- negative ids are keys, in every lookup flavour --------------------------------------------------------


def _flavour_outputs(flavour, emb, var):
    """(ours, theirs): the same lookup of KEYS[i] in emb and of i in the dense var."""
    idx_rows = [[0, 1, 1, 4], [2], [], [3, 7, 0], [6, 5, 2, 1]]  # duplicates, an empty row, every key
    if flavour == "lookup":
        idx = np.array([[0, 1, 2], [1, 3, 7], [6, 5, 4], [0, 0, 2]], np.int64)
        return tf_ext.embedding_lookup(emb, KEYS[idx]), tf.nn.embedding_lookup(var, idx)
    if flavour == "sparse":
        rows = [r for r in idx_rows if r]  # tf's non-safe lookup needs every row non-empty to compare shapes
        return (
            tf_ext.embedding_lookup_sparse(emb, _sparse(rows, lambda i: KEYS[i]), None, combiner="mean"),
            tf.compat.v1.nn.embedding_lookup_sparse(var, _sparse(rows), None, combiner="mean"),
        )
    weights = _sparse([[0.5 + 0.25 * j for j in range(len(r))] for r in idx_rows], dtype=np.float32)
    if flavour == "safe":
        return (
            tf_ext.safe_embedding_lookup_sparse(emb, _sparse(idx_rows, lambda i: KEYS[i]), weights, combiner="sqrtn"),
            tf.compat.v1.nn.safe_embedding_lookup_sparse(var, _sparse(idx_rows), weights, combiner="sqrtn"),
        )
    assert flavour == "safe_default_id"  # the empty row gets key -1's row
    return (
        tf_ext.safe_embedding_lookup_sparse(
            emb, _sparse(idx_rows, lambda i: KEYS[i]), None, combiner="sum", default_id=KEYS[1]
        ),
        tf.compat.v1.nn.safe_embedding_lookup_sparse(var, _sparse(idx_rows), None, combiner="sum", default_id=1),
    )


@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize("flavour", ["lookup", "sparse", "safe", "safe_default_id"])
def test_negative_ids_are_keys_and_train_like_dense(flavour, num_shards, graph, sess):
    emb = tf_ext.get_dynamic_embedding("emb", 3, num_shards=num_shards, initializer=0.1)
    var = tf.compat.v1.get_variable("dense", initializer=tf.fill([V, 3], 0.1))
    ours, theirs = _flavour_outputs(flavour, emb, var)
    # A different target per output element, so that the rows of the keys diverge.
    target = tf.reshape(tf.sin(tf.cast(tf.range(tf.size(theirs)), tf.float32)), tf.shape(theirs))
    loss = tf.reduce_sum(tf.square(ours - target)) + tf.reduce_sum(tf.square(theirs - target))
    opt = tf.compat.v1.train.AdagradOptimizer(0.3, initial_accumulator_value=0.2)
    train = opt.minimize(loss)
    rows = tf_ext.embedding_lookup(emb, KEYS, is_training=False)
    acc = emb.slot_values(opt, "accumulator", KEYS)
    exp = emb.export()
    sess.run(tf.compat.v1.global_variables_initializer())
    np.testing.assert_allclose(*sess.run([ours, theirs]), rtol=1e-6)
    for _ in range(3):
        sess.run(train)
    a, b = sess.run([ours, theirs])
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sess.run(rows), sess.run(var), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sess.run(acc), sess.run(opt.get_slot(var, "accumulator")), rtol=1e-5)
    # Every key got its own row in the table, the negative ones included.
    assert sorted(sess.run(exp).keys.tolist()) == sorted(KEYS.tolist())
    assert np.abs(sess.run(var) - 0.1).max() > 1e-3  # it did train


def _train_columns(feats_ours, feats_theirs, ours, theirs, steps=3):
    """input_layer(ours) on feats_ours and input_layer(theirs) on feats_theirs, trained side by side (Adagrad);
    returns (ours, theirs) outputs before and after, and the dynamic table's keys."""
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("ours"):
            out_a = fc_v1.input_layer(feats_ours(), [ours])
        with tf.compat.v1.variable_scope("theirs"):
            out_b = fc_v1.input_layer(feats_theirs(), [theirs])
        target = tf.constant(np.random.RandomState(0).normal(size=(1, out_a.shape[1])).astype(np.float32))
        loss = tf.reduce_sum(tf.square(out_a - target)) + tf.reduce_sum(tf.square(out_b - target))
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss)
        (emb,) = tf_ext.embedding.get_dynamic_embeddings()
        keys = emb.export().keys
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf.compat.v1.tables_initializer())
            before = sess.run([out_a, out_b])
            for _ in range(steps):
                sess.run(train)
            return before, sess.run([out_a, out_b]), sorted(sess.run(keys).tolist())


def _identity_column(dim):
    return fc_v1.embedding_column(
        fc_v1.categorical_column_with_identity("ids", V), dim, initializer=tf.compat.v1.constant_initializer(0.25)
    )


@pytest.mark.parametrize("num_shards", [1, 2])
def test_feature_column_sparse_negative_ids_match_remapped_dense(num_shards):
    rows = [[0, 1, 2], [], [3, 3, 7], [1], [4, 5, 6, 0]]
    ours = dfc.categorical_column_with_dynamic_embedding("ids", 4, initializer=0.25, num_shards=num_shards)
    before, after, keys = _train_columns(
        lambda: {"ids": _sparse(rows, lambda i: KEYS[i])}, lambda: {"ids": _sparse(rows)}, ours, _identity_column(4)
    )
    np.testing.assert_allclose(*before, rtol=1e-6)
    np.testing.assert_allclose(*after, rtol=1e-5, atol=1e-6)
    assert np.abs(after[0] - before[0]).max() > 1e-3
    assert keys == sorted(KEYS.tolist())


def test_feature_column_dense_input_keeps_every_int_unless_ignore_value():
    idx = np.array([[0, 1, 2], [1, 1, 3], [7, 6, 5]], np.int64)  # KEYS[1] == -1
    ours = dfc.categorical_column_with_dynamic_embedding("ids", 3, initializer=0.25)
    before, after, keys = _train_columns(
        lambda: {"ids": tf.constant(KEYS[idx])}, lambda: {"ids": tf.constant(idx)}, ours, _identity_column(3)
    )
    np.testing.assert_allclose(*before, rtol=1e-6)
    np.testing.assert_allclose(*after, rtol=1e-5, atol=1e-6)
    assert keys == sorted(KEYS[np.unique(idx)].tolist())  # -1 and the other negative ids have rows

    # With ignore_value=-1, -1 pads dense input (dropped) and the other negative ids stay keys.
    ours = dfc.categorical_column_with_dynamic_embedding("ids", 3, initializer=0.25, ignore_value=-1)
    remapped = np.where(idx == 1, -1, idx)  # TF's dense input drops -1
    before, after, keys = _train_columns(
        lambda: {"ids": tf.constant(KEYS[idx])}, lambda: {"ids": tf.constant(remapped)}, ours, _identity_column(3)
    )
    np.testing.assert_allclose(*after, rtol=1e-5, atol=1e-6)
    assert keys == sorted(k for k in KEYS[np.unique(idx)].tolist() if k != -1)


def test_feature_column_ignore_value_checks():
    with pytest.raises(ValueError, match="ignore_value applies to integer ids"):
        dfc.categorical_column_with_dynamic_embedding("s", 2, dtype=tf.string, ignore_value="")
    with pytest.raises(ValueError, match="ignore_value must be None or an int, got 'x'"):
        dfc.categorical_column_with_dynamic_embedding("i", 2, ignore_value="x")


@pytest.mark.parametrize("combiner", ["mean", "sum"])
def test_embedding_column_still_drops_tf_missing_bucket_ids_with_weights(combiner):
    # A vocabulary column maps out-of-vocabulary words to -1 (TF: missing): dropped with their weights, as TF does.
    vocab = ["a", "b", "c"]

    def cat():
        return tf.feature_column.weighted_categorical_column(
            fc_v1.categorical_column_with_vocabulary_list("w", vocab, default_value=-1), "wt"
        )

    def feats():
        return {
            "w": _sparse([["a", "zz", "b"], ["zz"], ["c", "a"]], dtype=object),
            "wt": _sparse([[1.0, 3.0, 0.5], [2.0], [1.5, 1.0]], dtype=np.float32),
        }

    ours = dfc.embedding_column(cat(), 3, combiner=combiner, initializer=0.25)
    theirs = fc_v1.embedding_column(cat(), 3, combiner=combiner, initializer=tf.compat.v1.constant_initializer(0.25))
    before, after, keys = _train_columns(feats, feats, ours, theirs)
    np.testing.assert_allclose(*before, rtol=1e-6)
    np.testing.assert_allclose(*after, rtol=1e-5, atol=1e-6)
    assert keys == [0, 1, 2]


# ---- warm start across dims -----------------------------------------------------------------------------------

WS_KEYS = np.concatenate([KEYS, np.arange(-30, 30, 3, dtype=np.int64) * 1000003])


def _ws_checkpoint(tmp_path, dim, num_shards):
    """A checkpoint of embedding "emb" (dim, num_shards) holding WS_KEYS with distinct rows; returns (path, rows)."""
    rows = np.random.RandomState(dim).normal(size=[len(WS_KEYS), dim]).astype(np.float32)
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", dim, num_shards=num_shards)
        insert = emb.insert(WS_KEYS, rows)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(insert)
            path = saver.save(sess, str(tmp_path / ("d%d_s%d" % (dim, num_shards)) / "m"))
    return path, dict(zip(WS_KEYS.tolist(), rows))


def _warm_started(path, dim, num_shards, initializer=0.5, **kw):
    """Warm-starts a new "emb" (dim, num_shards) from path; returns {key: row}."""
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", dim, num_shards=num_shards, initializer=initializer)
        if kw:
            tf_ext.embedding.warm_start_from_checkpoint(path, ".*", **kw)
        else:
            tf.compat.v1.train.warm_start(path, ".*")
        exp = emb.export()
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf_ext.embedding.warm_start_op())
            e = sess.run(exp)
    assert len(e.keys) == len(set(e.keys.tolist()))
    return dict(zip(e.keys.tolist(), e.values))


SHARDINGS = [(1, 1), (2, 2), (2, 3), (3, 1)]


@pytest.mark.parametrize("old_shards,new_shards", SHARDINGS)
def test_warm_start_dim_mismatch_is_an_error_by_default(tmp_path, old_shards, new_shards):
    for old_dim, new_dim in [(6, 4), (4, 6)]:
        path, _ = _ws_checkpoint(tmp_path, old_dim, old_shards)
        pattern = r"emb \(dim=%d\) from emb in checkpoint .* \(dim=%d\): the dims differ" % (new_dim, old_dim)
        with pytest.raises(ValueError, match=pattern):
            _warm_started(path, new_dim, new_shards)  # tf.compat.v1.train.warm_start (as Estimator's warm_start_from)
        with pytest.raises(ValueError, match=pattern):
            _warm_started(path, new_dim, new_shards, dim_mismatch="error")


@pytest.mark.parametrize("old_shards,new_shards", SHARDINGS)
def test_warm_start_truncate_keeps_the_prefix(tmp_path, old_shards, new_shards):
    path, old = _ws_checkpoint(tmp_path, 6, old_shards)
    new = _warm_started(path, 4, new_shards, dim_mismatch="truncate")
    assert sorted(new) == sorted(old)
    for k in old:
        np.testing.assert_array_equal(new[k], old[k][:4], err_msg=str(k))


@pytest.mark.parametrize("old_shards,new_shards", SHARDINGS)
def test_warm_start_pad_fills_new_columns_from_the_initializer(tmp_path, old_shards, new_shards):
    path, old = _ws_checkpoint(tmp_path, 4, old_shards)
    new = _warm_started(path, 6, new_shards, dim_mismatch="pad")
    assert sorted(new) == sorted(old)
    for k in old:
        np.testing.assert_array_equal(new[k][:4], old[k], err_msg=str(k))
        np.testing.assert_array_equal(new[k][4:], [0.5, 0.5], err_msg=str(k))


def test_warm_start_pad_with_a_random_initializer(tmp_path):
    path, old = _ws_checkpoint(tmp_path, 3, 2)
    new = _warm_started(
        path, 8, 3, dim_mismatch="pad", initializer=tf.compat.v1.truncated_normal_initializer(1.0, 0.1, seed=3)
    )
    pads = np.stack([new[k][3:] for k in sorted(old)])
    for k in old:
        np.testing.assert_array_equal(new[k][:3], old[k])
    assert pads.shape == (len(old), 5)
    assert np.all(np.abs(pads - 1.0) <= 0.2 + 1e-6) and pads.std() > 0.03  # truncated normal draws, not constant


def test_warm_start_same_dim_is_copied_with_any_policy(tmp_path):
    path, old = _ws_checkpoint(tmp_path, 4, 2)
    for policy in ("error", "truncate", "pad"):
        new = _warm_started(path, 4, 3, dim_mismatch=policy)
        assert sorted(new) == sorted(old)
        for k in old:
            np.testing.assert_array_equal(new[k], old[k])


def test_warm_start_policy_in_the_wrong_direction_or_unknown_is_an_error(tmp_path):
    wide, _ = _ws_checkpoint(tmp_path, 6, 2)
    narrow, _ = _ws_checkpoint(tmp_path, 4, 2)
    with pytest.raises(ValueError, match=r"dim_mismatch='pad' cannot convert rows of dim 6 to dim 4"):
        _warm_started(wide, 4, 2, dim_mismatch="pad")
    with pytest.raises(ValueError, match=r"dim_mismatch='truncate' cannot convert rows of dim 4 to dim 6"):
        _warm_started(narrow, 6, 2, dim_mismatch="truncate")
    with pytest.raises(ValueError, match=r"dim_mismatch must be one of 'error', 'truncate', 'pad', got 'crop'"):
        _warm_started(narrow, 6, 2, dim_mismatch="crop")
    assert not hasattr(warm_start_lib._options, "dim_mismatch")  # pylint: disable=protected-access


# ---- restore places keys by the current partition --------------------------------------------------------------

R_KEYS = np.unique(np.concatenate([KEYS, np.random.RandomState(5).randint(-(2**62), 2**62, size=60)]))
R_DIM = 3


def _misplaced_checkpoint(tmp_path, num_shards, assign):
    """Writes, with a plain Saver of tf.Variables, the tensors of a num_shards-shard Adagrad embedding "emb" whose
    keys are put in the shard tensors given by assign(keys) (not their hash shard). Returns (path, truth)."""
    rng = np.random.RandomState(7)
    n = len(R_KEYS)
    truth = dict(
        values=rng.normal(size=[n, R_DIM]).astype(np.float32),
        slots=rng.uniform(0.1, 2.0, size=[n, R_DIM]).astype(np.float32),
        versions=rng.randint(0, 100, size=n).astype(np.int64),
        freqs=rng.randint(1, 50, size=n).astype(np.int64),
    )
    path = write_shard_tensors_checkpoint(str(tmp_path / "misplaced" / "m"), R_KEYS, assign(R_KEYS), truth, num_shards)
    return path, truth


def _hash_shards(keys, num_shards):
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        return sess.run(tf_ext.embedding.keys.hash_key_shard_ids(tf.constant(keys), num_shards))


def _restore_and_read(path, num_shards, saver_kind):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", R_DIM, num_shards=num_shards, initializer=9.0)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([11, -11], tf.int64)))
        opt = tf.compat.v1.train.AdagradOptimizer(0.1, initial_accumulator_value=0.3)
        train = opt.minimize(loss)
        saveables = emb.saveables
        if saver_kind == "reversed":
            saver = tf.compat.v1.train.Saver(var_list=saveables[::-1])
        else:
            saver = tf.compat.v1.train.Saver(var_list=saveables, sharded=(saver_kind == "sharded"))
        keys = tf.constant(R_KEYS)
        rows = tf_ext.embedding_lookup(emb, keys, is_training=False)
        slots = emb.slot_values(opt, "accumulator", keys)
        exp = emb.export()
        sizes = [emb.size(i) for i in range(num_shards)]
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(train)  # keys 11 and -11 are in the tables before the restore, not in the checkpoint
            saver.restore(sess, path)
            return sess.run(dict(rows=rows, slots=slots, exp=exp, sizes=sizes, total=emb.size()))


@pytest.mark.parametrize("saver_kind", ["plain", "reversed", "sharded"])
@pytest.mark.parametrize("num_shards,layout", [(2, "all_in_0"), (2, "random"), (3, "random"), (3, "rotated")])
def test_restore_places_misplaced_keys_by_the_current_partition(tmp_path, num_shards, layout, saver_kind):
    right = _hash_shards(R_KEYS, num_shards)
    assign = {
        "all_in_0": lambda k: np.zeros(len(k), np.int64),
        "random": lambda k: np.random.RandomState(3).randint(0, num_shards, size=len(k)),
        "rotated": lambda k: (right + 1) % num_shards,
    }[layout]
    assert np.mean(assign(R_KEYS) != right) > 0.3  # the checkpoint really has keys in the wrong shards
    path, truth = _misplaced_checkpoint(tmp_path, num_shards, assign)
    got = _restore_and_read(path, num_shards, saver_kind)
    np.testing.assert_array_equal(got["rows"], truth["values"])
    np.testing.assert_array_equal(got["slots"], truth["slots"])
    e = got["exp"]
    order = np.argsort(e.keys)
    np.testing.assert_array_equal(e.keys[order], R_KEYS)  # exactly the checkpoint's keys: 11 and -11 are gone
    np.testing.assert_array_equal(e.versions[order], truth["versions"])
    np.testing.assert_array_equal(e.frequencies[order], truth["freqs"])
    assert got["total"] == len(R_KEYS)
    assert got["sizes"] == [int(np.sum(right == i)) for i in range(num_shards)]


def test_restore_of_one_shard_alone_routes_its_misplaced_keys(tmp_path):
    # A Saver restoring only shard 0's tensors: its keys that hash to shard 1 still land in shard 1.
    right = _hash_shards(R_KEYS, 2)
    path, truth = _misplaced_checkpoint(tmp_path, 2, lambda k: np.zeros(len(k), np.int64))
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("emb", R_DIM, num_shards=2, initializer=9.0)
        rows = tf_ext.embedding_lookup(emb, tf.constant(R_KEYS), is_training=False)
        saver = tf.compat.v1.train.Saver(var_list=[emb.saveables[0]])
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            np.testing.assert_array_equal(sess.run(rows), truth["values"])
            assert sess.run([emb.size(0), emb.size(1)]) == [int(np.sum(right == 0)), int(np.sum(right == 1))]


def test_restore_of_a_normal_checkpoint_is_unchanged(tmp_path, graph, sess):
    emb = tf_ext.get_dynamic_embedding("emb", 2, num_shards=3, initializer=1.0)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant(R_KEYS)))
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    train = opt.minimize(loss)
    exp = emb.export(with_slots=True)
    saver = tf.compat.v1.train.Saver()
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train)
    before = sess.run(exp)
    path = saver.save(sess, str(tmp_path / "m"))
    sess.run(train)
    saver.restore(sess, path)
    after = sess.run(exp)
    a, b = np.argsort(before.keys), np.argsort(after.keys)
    for field in ("keys", "values", "slots", "versions", "frequencies"):
        np.testing.assert_array_equal(getattr(after, field)[b], getattr(before, field)[a], err_msg=field)


# ---- size(shard_index) -----------------------------------------------------------------------------------------


def test_size_of_one_shard_or_all(graph, sess):
    emb = tf_ext.get_dynamic_embedding("emb", 2, num_shards=3)
    sess.run(emb.insert(R_KEYS, np.zeros([len(R_KEYS), 2], np.float32)))
    right = _hash_shards(R_KEYS, 3)
    expected = [int(np.sum(right == i)) for i in range(3)]
    assert min(expected) > 0
    assert sess.run([emb.size(i) for i in range(3)]) == expected
    assert sess.run(emb.size(np.int64(2))) == expected[2]
    assert sess.run(emb.size(shard_index=0)) == expected[0]  # TFRA's size(index): shard 0, not the total
    assert sess.run(emb.size()) == sess.run(emb.size(None)) == len(R_KEYS)
    named = emb.size(name="how_many")
    assert named.name.startswith("how_many") and sess.run(named) == len(R_KEYS)
    assert sess.run(emb.size(1, name="one")) == expected[1]
    with pytest.raises(ValueError, match=r"shard_index of 'emb'.size\(\) must be in \[0, 3\) \(num_shards=3\), got 3"):
        emb.size(3)
    with pytest.raises(ValueError, match=r"must be in \[0, 3\).*got -1"):
        emb.size(-1)
    with pytest.raises(TypeError, match=r"must be None or an int, got 'total' \(pass a name scope as size\(name"):
        emb.size("total")
    with pytest.raises(TypeError, match="got True"):
        emb.size(True)


# ---- docs name only APIs that exist ----------------------------------------------------------------------------

_TF_NAME = re.compile(r"\btf\.compat\.v1(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _resolves(dotted):
    obj = tf
    for part in dotted.split(".")[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_docs_and_docstrings_name_existing_tf_apis():
    with open(os.path.join(_ROOT, "docs", "embedding.md"), encoding="utf-8") as f:
        texts = {"docs/embedding.md": f.read()}
    texts["warm_start module"] = warm_start_lib.__doc__
    for fn in (warm_start_lib.warm_start_op, warm_start_lib.warm_start_from_checkpoint):
        texts[fn.__name__] = fn.__doc__
    missing = sorted(
        {
            "%s: %s" % (where, name)
            for where, text in texts.items()
            for name in _TF_NAME.findall(text)
            if not _resolves(name)
        }
    )
    assert missing == []
