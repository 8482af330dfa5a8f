"""Compact rows (`value_dtype=tf.bfloat16 / tf.float16`) through the dynamic embedding API.

References: a float32 embedding trained side by side whose rows are rounded the same way after every step (numpy
round-to-nearest-even), numpy's float16 conversion, and the float32 values a checkpoint holds. Fresh graphs, small
tables: seconds.
"""

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import session_config

DIM = 4
KEYS = np.arange(20, dtype=np.int64)


def to_bf16(x):
    """float32 -> the nearest bfloat16 (ties to even), as float32: what a bfloat16 row stores (finite values)."""
    x = np.asarray(x, np.float32)
    bits = x.reshape(-1).view(np.uint32).astype(np.uint64)
    rounded = ((bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) << np.uint64(16)
    return rounded.astype(np.uint32).view(np.float32).reshape(x.shape)


def to_f16(x):
    """float32 -> the nearest float16 (numpy: ties to even), as float32."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


ROUND = {tf.bfloat16: to_bf16, tf.float16: to_f16}
OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.3),
    "adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.3),
    "rowwise_adagrad": lambda: tf_ext.RowwiseAdagradOptimizer(0.3),  # its one-column slot after the compact columns
}


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _sorted_export(sess, emb, with_slots=False):
    exp = sess.run(emb.export(with_slots=with_slots))
    order = np.argsort(exp.keys)
    return exp.keys[order], exp.values[order], exp.slots[order]


def _initial_rows(value_dtype, seed=0):
    return ROUND[value_dtype](np.random.RandomState(seed).uniform(-1, 1, (len(KEYS), DIM)))


def _batches(steps, seed=1):
    rng = np.random.RandomState(seed)
    # Repeated keys in a batch: their gradients are summed before the update, in both tables alike.
    return [(rng.randint(0, len(KEYS), 12), rng.uniform(-1, 1, (12, DIM)).astype(np.float32)) for _ in range(steps)]


def _model(emb, optimizer, global_step=None):
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    targets = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    rows = tf_ext.embedding_lookup(emb, ids)
    assert rows.dtype == tf.float32  # lookups return float32 whatever the rows are stored as
    train = optimizer.minimize(tf.reduce_sum(tf.square(rows - targets)), global_step=global_step)
    return ids, targets, train


@pytest.mark.parametrize("value_dtype", [tf.bfloat16, tf.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_nearest_rounding_trains_as_a_float32_table_rounded_the_same_way(graph, sess, value_dtype, optimizer):
    compact = tf_ext.get_dynamic_embedding("compact", DIM, value_dtype=value_dtype, rounding="nearest")
    ref = tf_ext.get_dynamic_embedding("ref", DIM)
    assert (compact.value_dtype, compact.dtype, compact.rounding) == (value_dtype, tf.float32, "nearest")
    model_compact = _model(compact, OPTIMIZERS[optimizer]())
    model_ref = _model(ref, OPTIMIZERS[optimizer]())
    keys = tf.compat.v1.placeholder(tf.int64, [None])
    rows = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    insert_compact, insert_ref = compact.insert(keys, rows), ref.insert(keys, rows)
    sess.run(tf.compat.v1.global_variables_initializer())
    start = _initial_rows(value_dtype)
    sess.run([insert_compact, insert_ref], {keys: KEYS, rows: start})
    for batch, target in _batches(6):
        for ids, targets, train in (model_compact, model_ref):
            sess.run(train, {ids: batch, targets: target})
        ref_keys, ref_values, _ = _sorted_export(sess, ref)
        sess.run(insert_ref, {keys: ref_keys, rows: ROUND[value_dtype](ref_values)})  # rounded as the table rounds
        got, want = _sorted_export(sess, compact, with_slots=True), _sorted_export(sess, ref, with_slots=True)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(_bits(got[1]), _bits(want[1]))  # bit for bit
        np.testing.assert_array_equal(_bits(got[2]), _bits(want[2]))  # float32 slots, the same float32 math
    assert not np.array_equal(want[1], start[np.argsort(KEYS)])  # it trained


def _train_compact(value_dtype, rounding, slot_dtype=None, lr=0.01, steps=8):
    """Trains a fresh compact embedding with Adagrad (the global step advancing); returns its sorted
    (keys, values, slots)."""
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding(
            "emb",
            DIM,
            value_dtype=value_dtype,
            slot_dtype=slot_dtype,
            rounding=rounding,
            initializer=tf.compat.v1.random_uniform_initializer(-1, 1, seed=4),
        )
        gs = tf.compat.v1.train.get_or_create_global_step()
        ids, targets, train = _model(emb, tf.compat.v1.train.AdagradOptimizer(lr), gs)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch, target in _batches(steps):
                sess.run(train, {ids: batch, targets: target})
            return _sorted_export(sess, emb, with_slots=True)


@pytest.mark.parametrize("value_dtype", [tf.bfloat16, tf.float16], ids=["bf16", "fp16"])
def test_stochastic_rounding_is_the_default_and_reproducible_run_to_run(value_dtype):
    first = _train_compact(value_dtype, rounding=None)
    again = _train_compact(value_dtype, rounding="stochastic")
    nearest = _train_compact(value_dtype, rounding="nearest")
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    np.testing.assert_array_equal(first[1], ROUND[value_dtype](first[1]))  # stored values, read back exactly
    # Updates smaller than half a step of the storage: nearest rounding drops some that stochastic keeps.
    assert not np.array_equal(first[1], nearest[1])


def test_compact_slots_store_the_optimizer_state_as_the_values(graph):
    keys, values, slots = _train_compact(tf.bfloat16, rounding="nearest", slot_dtype=tf.bfloat16)
    assert slots.shape == (len(keys), DIM)
    np.testing.assert_array_equal(slots, to_bf16(slots))
    np.testing.assert_array_equal(values, to_bf16(values))
    assert np.all(slots >= to_bf16(0.1)) and np.any(slots > 0.2)  # Adagrad's accumulators grew from 0.1


# ---- checkpoints ------------------------------------------------------------------------------------------------


def _checkpointed(value_dtype, num_shards=2):
    """A graph's embedding "emb" (Adagrad, so rows have slot columns), its Saver and its init op."""
    emb = tf_ext.get_dynamic_embedding(
        "emb",
        DIM,
        value_dtype=value_dtype,
        num_shards=num_shards,
        rounding=None if value_dtype == tf.float32 else "nearest",  # float32 rows take no rounding
        initializer=tf.compat.v1.random_uniform_initializer(-1, 1, seed=5),
    )
    ids, targets, train = _model(emb, tf.compat.v1.train.AdagradOptimizer(0.1))
    return emb, (ids, targets, train), tf.compat.v1.train.Saver()


def _save(tmp_path, value_dtype):
    """Trains an embedding of value_dtype, saves it; returns (path, its sorted export with slots)."""
    with tf.Graph().as_default():
        emb, (ids, targets, train), saver = _checkpointed(value_dtype)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch, target in _batches(3):
                sess.run(train, {ids: batch, targets: target})
            path = saver.save(sess, str(tmp_path / ("model_" + value_dtype.name)))
            return path, _sorted_export(sess, emb, with_slots=True)


def _restore(path, value_dtype):
    with tf.Graph().as_default():
        emb, _, saver = _checkpointed(value_dtype)
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)
            return _sorted_export(sess, emb, with_slots=True)


@pytest.mark.parametrize(
    "saved, restored, expect",
    [
        (tf.bfloat16, tf.bfloat16, lambda v: v),  # exact
        (tf.bfloat16, tf.float32, lambda v: v),  # exact: the checkpoint holds the decoded float32 values
        (tf.float32, tf.bfloat16, to_bf16),  # rounded to nearest
        (tf.float16, tf.bfloat16, to_bf16),
        (tf.float32, tf.float16, to_f16),
    ],
    ids=["bf16-bf16", "bf16-f32", "f32-bf16", "fp16-bf16", "f32-fp16"],
)
def test_a_checkpoint_restores_across_storages_rounding_to_nearest(tmp_path, saved, restored, expect):
    path, (keys, values, slots) = _save(tmp_path, saved)
    reader = tf.compat.v1.train.NewCheckpointReader(path)
    assert reader.get_variable_to_dtype_map()["emb/part_0-values"] == tf.float32
    storages = {n for n in reader.get_variable_to_shape_map() if n.endswith("-storage")}
    if saved == tf.float32:
        assert not storages  # float32 checkpoints are written as before
    else:
        assert storages == {"emb/part_0-storage", "emb/part_1-storage"}
        assert reader.get_tensor("emb/part_0-storage") == saved.name.encode()
    got_keys, got_values, got_slots = _restore(path, restored)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(_bits(got_values), _bits(expect(values)))
    np.testing.assert_array_equal(_bits(got_slots), _bits(slots))  # float32 slots restore exactly


def _write_serving_checkpoint(path, with_training_tensors):
    """A checkpoint of "emb" (one shard) recorded as int8_row, as a Saver of a graph served from an int8 export
    writes it: keys, values, shard count and the storage record (the training tensors too if asked)."""
    keys = np.arange(3, dtype=np.int64)
    tensors = {
        "keys": keys,
        "values": np.ones((3, DIM), np.float32),
        "num_shards": np.int64(1),
        "storage": np.array(b"int8_row"),
    }
    if with_training_tensors:
        tensors.update(
            slots=np.full((3, DIM), 0.1, np.float32), versions=np.zeros(3, np.int64), freqs=np.ones(3, np.int64)
        )
    with tf.Graph().as_default():
        var_list = {
            "emb/part_0-" + suffix: tf.compat.v1.get_variable("v_" + suffix, initializer=tf.constant(value))
            for suffix, value in tensors.items()
        }
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, path)


@pytest.mark.parametrize("with_training_tensors", [True, False], ids=["full", "serving-tensors-only"])
def test_int8_row_values_are_refused_by_a_training_table_naming_both_storages(tmp_path, with_training_tensors):
    path = _write_serving_checkpoint(str(tmp_path / "served"), with_training_tensors)
    with tf.Graph().as_default():
        emb, _, saver = _checkpointed(tf.bfloat16, num_shards=1)
        with tf.compat.v1.Session(config=session_config()) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                saver.restore(sess, path)
            assert sess.run(emb.size()) == 0  # nothing imported
    msg = str(info.value)
    assert "emb/part_0-* hold int8_row values" in msg
    assert "training table storing bfloat16 rows" in msg
    assert "freeze_for_serving(value_dtype=tf.int8)" in msg


def test_a_checkpoint_of_a_graph_served_with_int8_rows_is_refused_by_a_training_table(tmp_path):
    path, _ = _save(tmp_path, tf.float32)
    with tf.Graph().as_default():
        with tf_ext.serving.freeze_for_serving(value_dtype=tf.int8):
            tf_ext.get_dynamic_embedding("emb", DIM, num_shards=2)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=session_config()) as sess:
            saver.restore(sess, path)  # int8 serving rows from the training checkpoint
            served = saver.save(sess, str(tmp_path / "served"))
    assert tf.compat.v1.train.NewCheckpointReader(served).get_tensor("emb/part_1-storage") == b"int8_row"
    with tf.Graph().as_default():
        _, _, saver = _checkpointed(tf.float32)
        with tf.compat.v1.Session(config=session_config()) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match="hold int8_row values .* storing float32 rows"):
                saver.restore(sess, served)


def test_values_saved_in_another_dtype_are_an_error_naming_the_tensor_and_both_dtypes(tmp_path):
    # A checkpoint's values are float32 whatever the table stores; half values (as TFRA's half tables save them)
    # are not converted silently.
    with tf.Graph().as_default():
        tensors = {
            "keys": tf.constant(np.arange(3, dtype=np.int64)),
            "values": tf.constant(np.ones((3, DIM)), tf.bfloat16),
            "slots": tf.zeros([3, DIM]),
            "versions": tf.zeros([3], tf.int64),
            "freqs": tf.zeros([3], tf.int64),
            "num_shards": tf.constant(1, tf.int64),
        }
        var_list = {"emb/part_0-" + k: tf.compat.v1.get_variable("v_" + k, initializer=v) for k, v in tensors.items()}
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            path = saver.save(sess, str(tmp_path / "half_values"))
    with tf.Graph().as_default():
        _, _, saver = _checkpointed(tf.bfloat16, num_shards=1)
        with tf.compat.v1.Session(config=session_config()) as sess:
            with pytest.raises(tf.errors.InvalidArgumentError) as info:
                saver.restore(sess, path)
    assert "emb/part_0-values; expected dtype float does not equal original dtype bfloat16" in str(info.value)


def test_delta_checkpoints_of_a_compact_table_restore_the_table_at_each_save(tmp_path):
    saves = []
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding(
            "emb", DIM, value_dtype=tf.bfloat16, initializer=tf.compat.v1.random_uniform_initializer(-1, 1, seed=6)
        )
        ids, targets, train = _model(emb, tf.compat.v1.train.AdagradOptimizer(0.1), gs)
        listener = tf_ext.embedding.delta_checkpoints(full_every=3)
        saver = tf.compat.v1.train.Saver(max_to_keep=10)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            rng = np.random.RandomState(2)
            for save in range(3):
                for _ in range(2):
                    batch = np.concatenate([rng.randint(0, 20, 6), rng.randint(100 * save, 100 * save + 30, 6)])
                    sess.run(train, {ids: batch, targets: rng.uniform(-1, 1, (12, DIM))})
                path = listener.save(sess, saver, str(tmp_path / "model.ckpt"), gs)
                saves.append((path, _sorted_export(sess, emb, with_slots=True)))
    reader = tf.compat.v1.train.NewCheckpointReader(saves[-1][0])
    assert b"kind=delta" in reader.get_tensor("emb/part_0-delta")
    assert reader.get_tensor("emb/part_0-storage") == b"bfloat16"
    for path, state in saves:
        with tf.Graph().as_default():
            emb = tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=tf.bfloat16)
            _model(emb, tf.compat.v1.train.AdagradOptimizer(0.1), tf.compat.v1.train.get_or_create_global_step())
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session(config=session_config()) as sess:
                saver.restore(sess, path)
                for got, want in zip(_sorted_export(sess, emb, with_slots=True), state):
                    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "saved, started, expect", [(tf.float32, tf.bfloat16, to_bf16), (tf.bfloat16, tf.float32, lambda v: v)]
)
def test_warm_start_across_storages(tmp_path, saved, started, expect):
    path, (keys, values, _) = _save(tmp_path, saved)
    with tf.Graph().as_default():
        rounding = None if started == tf.float32 else "nearest"  # float32 rows take no rounding
        emb = tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=started, num_shards=3, rounding=rounding)
        tf_ext.embedding.warm_start_from_checkpoint(path)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf_ext.embedding.warm_start_op())
            got_keys, got_values, _ = _sorted_export(sess, emb)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(_bits(got_values), _bits(expect(values)))


@pytest.mark.parametrize("warm_start", ["tf_ext", "tf"])
def test_warm_start_refuses_int8_row_values_naming_both_storages(tmp_path, warm_start):
    # The checkpoint has every tensor a warm start reads (keys, values, versions, freqs): only its storage record
    # says the values are int8 rows of a serving export.
    path = _write_serving_checkpoint(str(tmp_path / "served"), with_training_tensors=True)
    with tf.Graph().as_default():
        tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=tf.bfloat16, num_shards=1)
        with pytest.raises(ValueError, match="emb/part_0-\\* hold int8_row values .* storing bfloat16 rows"):
            if warm_start == "tf_ext":
                tf_ext.embedding.warm_start_from_checkpoint(path)
            else:
                tf.compat.v1.train.warm_start(path, vars_to_warm_start=".*")


@pytest.mark.parametrize("export_dtype", [tf.int8, tf.float32, tf.bfloat16], ids=["int8", "f32", "bf16"])
def test_an_export_table_on_a_cluster_task_sends_the_values_it_stores(tmp_path, export_dtype):
    # A table on a task of a cluster job sends half rows as half values; the rows of an export's table of another
    # storage than the embedding's value_dtype are sent as they are decoded (int8 rows are not bfloat16 values).
    path, (keys, _, _) = _save(tmp_path, tf.float32)
    # An in-process server of a "ps" job (port 0: the server picks a free one).
    server = tf.distribute.Server(tf.train.ClusterSpec({"ps": ["localhost:0"]}), job_name="ps", task_index=0)
    rows = []
    for devices in (None, ["/job:ps/task:0"]):
        with tf.Graph().as_default():
            with tf_ext.serving.export_rows(export_dtype):
                emb = tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=tf.bfloat16, num_shards=2, devices=devices)
            lookup = tf_ext.embedding_lookup(emb, tf.constant(keys), is_training=False)
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session(server.target, config=session_config()) as sess:
                saver.restore(sess, path)
                rows.append(sess.run(lookup))
    np.testing.assert_array_equal(_bits(rows[1]), _bits(rows[0]))


# ---- policies, memory ----------------------------------------------------------------------------------------


def test_l2_norm_eviction_reads_half_rows_as_a_float32_table_of_the_same_values(graph, sess):
    values = to_bf16(np.random.RandomState(7).uniform(-1, 1, (len(KEYS), DIM)))
    threshold = float(np.median(np.linalg.norm(values, axis=1)))
    policy = tf_ext.embedding.EvictionPolicy(min_l2_norm=threshold)
    tables = [tf_ext.get_dynamic_embedding(n, DIM, value_dtype=d, eviction=policy)
              for n, d in (("half", tf.bfloat16), ("full", tf.float32))]  # fmt: skip
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run([emb.insert(KEYS, values) for emb in tables])
    removed = sess.run(tf_ext.embedding.evict(tables))
    kept = [_sorted_export(sess, emb)[0] for emb in tables]
    np.testing.assert_array_equal(kept[0], kept[1])
    np.testing.assert_array_equal(kept[0], KEYS[np.linalg.norm(values, axis=1) >= threshold])
    assert removed == 2 * (len(KEYS) - len(kept[0])) > 0


def test_admission_gives_a_half_row_at_the_min_count_th_lookup(graph, sess):
    emb = tf_ext.get_dynamic_embedding(
        "emb",
        DIM,
        value_dtype=tf.float16,
        admission=tf_ext.embedding.CountAdmission(2),
        initializer=0.3,
        rounding="nearest",  # the initial row rounds by the table's rounding: nearest makes it to_f16's
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    rows = tf_ext.embedding_lookup(emb, ids, is_training=True)
    sess.run(tf.compat.v1.global_variables_initializer())
    first = sess.run(rows, {ids: [1, 2]})
    np.testing.assert_array_equal(first, np.zeros((2, DIM), np.float32))  # not admitted: the default value
    second = sess.run(rows, {ids: [1, 3]})
    np.testing.assert_array_equal(second[0], to_f16(np.full(DIM, 0.3)))  # admitted: its initial row, as stored
    np.testing.assert_array_equal(_sorted_export(sess, emb)[0], [1])


def test_half_rows_take_fewer_bytes_per_key(graph, sess):
    dim, n = 16, 20000
    tables = [tf_ext.get_dynamic_embedding(d.name, dim, value_dtype=d) for d in (tf.float32, tf.bfloat16)]
    keys = np.arange(n, dtype=np.int64)
    sess.run([emb.insert(keys, np.zeros((n, dim), np.float32)) for emb in tables])
    full, half = sess.run([emb.memory_bytes() for emb in tables])
    # A key's row shrinks by dim * 2 bytes; the index and metadata do not.
    assert full - half >= 0.9 * n * dim * 2, (full, half)


# ---- values out of range -------------------------------------------------------------------------------------


BF16_LARGEST = float(np.uint32(0x7F7F0000).view(np.float32))  # bfloat16's largest finite value, ~3.39e38


@pytest.mark.parametrize("value_dtype, largest", [(tf.bfloat16, BF16_LARGEST), (tf.float16, 65504.0)])
def test_nan_stays_nan_infinities_stay_and_finite_values_saturate(graph, sess, value_dtype, largest):
    emb = tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=value_dtype)
    big = np.float32(3.4e38)  # beyond bfloat16's largest finite value (rounds up to infinity by IEEE rules)
    written = np.array([[np.nan, np.inf, -np.inf, 0.0], [big, -big, 1e5, -1e6]], np.float32)
    sess.run(emb.insert([1, 2], written))
    got = sess.run(tf_ext.embedding_lookup(emb, [1, 2]))
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and got[0, 2] == -np.inf and got[0, 3] == 0.0
    want = [largest, -largest] + ([largest, -largest] if value_dtype == tf.float16 else [1e5, -1e6])
    np.testing.assert_array_equal(got[1], ROUND[value_dtype](np.array(want, np.float32)))


# ---- other APIs ---------------------------------------------------------------------------------------------


def test_tfra_get_variable_and_variable_take_a_half_value_dtype(graph, sess):
    emb = tf_ext.tfra.get_variable("t", key_dtype=tf.int64, value_dtype=tf.bfloat16, dim=DIM)
    other = tf_ext.tfra.Variable(key_dtype=tf.int64, value_dtype=tf.float16, dim=DIM, name="v")
    assert (emb.value_dtype, emb.dtype, other.value_dtype) == (tf.bfloat16, tf.float32, tf.float16)
    values = np.random.RandomState(8).uniform(-1, 1, (3, DIM)).astype(np.float32)
    sess.run([emb.upsert([1, 2, 3], values), other.upsert([1, 2, 3], values)])
    got, got_other = sess.run([emb.lookup([1, 2, 3]), other.lookup([1, 2, 3])])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, to_bf16(values))
    np.testing.assert_array_equal(got_other, to_f16(values))


def test_feature_columns_take_value_dtype(graph, sess):
    columns = [
        tf_ext.feature_column.categorical_column_with_dynamic_embedding(
            "a", DIM, value_dtype=tf.bfloat16, rounding="nearest", initializer=0.3
        ),
        tf_ext.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_identity("b", 10),
            DIM,
            value_dtype=tf.float16,
            rounding="nearest",
            initializer=0.3,
        ),
    ]
    features = {"a": tf.constant([[5], [6]], tf.int64), "b": tf.constant([[1], [2]], tf.int64)}
    out = tf.compat.v1.feature_column.input_layer(features, columns)
    assert out.dtype == tf.float32
    dtypes = sorted(emb.value_dtype.name for emb in tf_ext.embedding.get_dynamic_embeddings())
    assert dtypes == ["bfloat16", "float16"]
    train = tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(tf.reduce_sum(out))  # inserts the keys
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(train)
    got = sess.run(out)  # the stored rows: the initial value rounded into each storage
    want = np.concatenate([to_bf16(np.full((2, DIM), 0.3)), to_f16(np.full((2, DIM), 0.3))], axis=1)
    np.testing.assert_array_equal(got, want)


# ---- unsupported arguments ------------------------------------------------------------------------------------


def test_unsupported_row_storage_arguments_are_clear_errors(graph):
    with pytest.raises(
        ValueError, match=r"int8 rows .* are a serving format.*freeze_for_serving\(value_dtype=tf.int8\)"
    ):
        tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.int8)
    with pytest.raises(ValueError, match="must be one of tf.float32, tf.bfloat16, tf.float16.*got float64"):
        tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.float64)
    with pytest.raises(
        ValueError, match=r"slot_dtype .* must be None or tf.float32 \(float32 optimizer slots\) or its"
    ):
        tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.bfloat16, slot_dtype=tf.float16)
    f32_slots = tf_ext.get_dynamic_embedding("f32_slots", DIM, value_dtype=tf.bfloat16, slot_dtype=tf.float32)
    assert (f32_slots.slot_dtype, f32_slots.config.compact_slots) == (None, False)  # what None asks for
    with pytest.raises(ValueError, match="slot_dtype .* got tf.bfloat16"):
        tf_ext.get_dynamic_embedding("x", DIM, slot_dtype=tf.bfloat16)  # float32 values
    with pytest.raises(ValueError, match="rounding .* one of 'nearest', 'stochastic', got 'up'"):
        tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.bfloat16, rounding="up")
    for rounding in ("stochastic", "nearest"):  # float32 rows are never rounded: value_dtype left out?
        with pytest.raises(ValueError, match="rounding='%s' of dynamic embedding 'x' applies to half" % rounding):
            tf_ext.get_dynamic_embedding("x", DIM, rounding=rounding)
    with pytest.raises(TypeError, match="value_dtype of dynamic embedding 'x' must be a tf.DType"):
        tf_ext.get_dynamic_embedding("x", DIM, value_dtype=object())


@pytest.mark.parametrize("generic", ["no_fused_update", "forced"])
def test_the_generic_update_path_refuses_stochastic_rounding(generic):
    # Its write back (an insert) rounds to nearest: a 1e-4 step of a bfloat16 weight of 1.0 would vanish.
    from tensorflow_ext.embedding import _ops

    make = (
        (lambda: tf.compat.v1.train.ProximalGradientDescentOptimizer(1e-4))
        if generic == "no_fused_update"
        else (lambda: tf.compat.v1.train.GradientDescentOptimizer(1e-4))
    )
    old = _ops.force_generic(generic == "forced")
    try:
        with tf.Graph().as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
            emb = tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=tf.bfloat16, initializer=1.0)
            loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant(KEYS)))
            with pytest.raises(ValueError, match="through the generic path .* rounds to nearest, not stochastically"):
                make().minimize(loss, gs)
        with tf.Graph().as_default():  # rounding="nearest" asks for what the path does
            emb = tf_ext.get_dynamic_embedding("emb", DIM, value_dtype=tf.bfloat16, initializer=1.0, rounding="nearest")
            rows = tf_ext.embedding_lookup(emb, tf.constant(KEYS))
            train = make().minimize(tf.reduce_sum(rows))
            with tf.compat.v1.Session(config=session_config()) as sess:
                sess.run(train)
                np.testing.assert_array_equal(sess.run(rows), np.ones((len(KEYS), DIM)))  # the step rounds away
    finally:
        _ops.force_generic(old)


def test_reuse_compares_the_row_storage_given(graph):
    emb = tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.bfloat16, slot_dtype=tf.bfloat16)
    assert (emb.slot_dtype, emb.rounding, emb.config.compact_slots) == (tf.bfloat16, "stochastic", True)
    assert repr(emb) == "<tf_ext.DynamicEmbedding 'x' dim=4 key_dtype=int64 value_dtype=bfloat16 shards=1>"
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
        assert tf_ext.get_dynamic_embedding("x", DIM) is emb  # what is left out is not compared
        assert tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.bfloat16, rounding="stochastic") is emb
        assert tf_ext.get_dynamic_embedding("x", DIM, slot_dtype=tf.bfloat16, rounding="stochastic") is emb
        with pytest.raises(ValueError, match="with value_dtype=tf.float16, but it has tf.bfloat16"):
            tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.float16)
        with pytest.raises(ValueError, match="with rounding='nearest', but it has 'stochastic'"):
            tf_ext.get_dynamic_embedding("x", DIM, value_dtype=tf.bfloat16, rounding="nearest")
    plain = tf_ext.get_dynamic_embedding("plain", DIM)
    assert (plain.value_dtype, plain.slot_dtype, plain.rounding) == (tf.float32, None, "nearest")


def test_stochastic_rounding_without_a_global_step_is_an_error_naming_the_fix(graph):
    # Without a step every update of a key would draw the same rounding bits: small updates would be lost for good.
    emb = tf_ext.get_dynamic_embedding("no_step", dim=4, value_dtype=tf.bfloat16, rounding="stochastic")
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
    with pytest.raises(ValueError, match=r"stochastic rounding, which needs the training step.*global_step"):
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    nearest = tf_ext.get_dynamic_embedding("no_step_nearest", dim=4, value_dtype=tf.bfloat16, rounding="nearest")
    loss = tf.reduce_sum(tf_ext.embedding_lookup(nearest, tf.constant([1, 2], tf.int64)))
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)  # nearest rounding needs no step


@pytest.mark.parametrize("optimizer", ["Adam", "RMSProp"])
def test_float16_slots_are_refused_where_a_second_moment_would_underflow(graph, optimizer):
    emb = tf_ext.get_dynamic_embedding("fp16_slots", dim=4, value_dtype=tf.float16, slot_dtype=tf.float16)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
    opt = getattr(tf.compat.v1.train, optimizer + "Optimizer")(0.01)
    with pytest.raises(ValueError, match=r"float16 slots.*underflows.*bfloat16"):
        opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    bf16 = tf_ext.get_dynamic_embedding("bf16_slots", dim=4, value_dtype=tf.bfloat16, slot_dtype=tf.bfloat16)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(bf16, tf.constant([1, 2], tf.int64)))
    opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())  # bfloat16 slots keep the range
