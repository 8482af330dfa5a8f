"""The Python API of tiered storage: `tf_ext.TieredStorage`, `get_dynamic_embedding(storage=...)` and the paths that
carry it (feature columns, the TFRA module, serving scopes), the per-shard directories and budgets, the
`TF_EXT_TIER_ROOT` override, `emb.tier_stats()` / `prefetch()` / `tier_settle()`, the summaries, the CTR example's
flags and its docs page.

The tiers' exactness (training equal to the in-memory table) is checked against untiered twins here for what this
layer adds (prefetch, the summaries' counts); the golden and lifecycle tests cover training and checkpoints.
"""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config

import tensorflow_ext as tf_ext
from tensorflow_ext.table import tiered

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _scalars(serialized):
    """tag -> value of a serialized Summary proto."""
    summary = tf.compat.v1.Summary()
    summary.ParseFromString(serialized)
    return {v.tag: v.simple_value for v in summary.value}


def _tier_attrs(shard):
    op = shard.op
    return {name: op.get_attr(name) for name in ("tier_path", "tier_memory_bytes", "tier_disk_bytes", "tier_policy")}


# ---- TieredStorage: values, units, errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given,expected",
    [
        (1, 1),
        (4096, 4096),
        (np.int64(1 << 33), 1 << 33),
        (1.5e9, 1500000000),
        (1.5 * 2**30, 1610612736),
        ("4096", 4096),
        ("4096B", 4096),
        ("1.5GB", 1500000000),
        ("1.5 gb", 1500000000),
        ("512MiB", 512 << 20),
        ("2KiB", 2048),
        ("0.5KB", 500),
        ("3TB", 3 * 10**12),
        ("1TiB", 1 << 40),
    ],
)
def test_sizes_in_bytes_or_with_a_unit(given, expected):
    storage = tf_ext.TieredStorage(memory_bytes=given, path="/tiers", disk_bytes=given)
    assert storage.memory_bytes == expected and storage.disk_bytes == expected
    assert isinstance(storage.memory_bytes, int)


@pytest.mark.parametrize(
    "kwargs,error,pattern",
    [
        (dict(memory_bytes=0), ValueError, r"memory_bytes must be at least 1 byte, got 0"),
        (dict(memory_bytes=-5), ValueError, r"memory_bytes must be at least 1 byte, got -5"),
        (dict(memory_bytes="0.1B"), ValueError, r"memory_bytes must be at least 1 byte, got '0.1B'"),
        (dict(memory_bytes="1.5XB"), ValueError, r"memory_bytes must be a size such as .*got '1.5XB'"),
        (dict(memory_bytes="GB"), ValueError, r"memory_bytes must be a size .*got 'GB'"),
        (dict(memory_bytes=True), TypeError, r"memory_bytes must be a number of bytes .*got True"),
        (dict(memory_bytes=None), TypeError, r"memory_bytes must be a number of bytes .*got None"),
        (dict(memory_bytes=float("inf")), ValueError, r"memory_bytes must be a finite number of bytes, got inf"),
        (dict(memory_bytes=float("nan")), ValueError, r"memory_bytes must be a finite number of bytes, got nan"),
        (dict(disk_bytes=0), ValueError, r"disk_bytes must be at least 1 byte, got 0"),
        (dict(disk_bytes="lots"), ValueError, r"disk_bytes must be a size such as .*got 'lots'"),
        (dict(path=""), ValueError, r"path must be a non-empty directory name, got ''"),
        (dict(path=3), TypeError, r"path must be a directory name \(a str or os.PathLike\), got 3"),
        (dict(path=b"/tiers"), TypeError, r"path must be a directory name .*got b'/tiers'"),
        (dict(path="/ti\0ers"), ValueError, r"path must not contain a NUL character"),
        (dict(policy="fifo"), ValueError, r"policy must be one of 'lru', 'lfu', got 'fifo'"),
        (dict(policy="LRU"), ValueError, r"policy must be one of 'lru', 'lfu', got 'LRU'"),
    ],
)
def test_bad_arguments_name_the_argument_and_the_value(kwargs, error, pattern):
    args = dict(memory_bytes="1MB", path="/tiers")
    args.update(kwargs)
    with pytest.raises(error, match="^TieredStorage " + pattern):
        tf_ext.TieredStorage(**args)


def test_a_storage_is_a_frozen_value(tmp_path):
    a = tf_ext.TieredStorage("1MB", tmp_path, disk_bytes="1GB", policy="lfu")
    b = tf_ext.TieredStorage(10**6, str(tmp_path), disk_bytes=10**9, policy="lfu")
    assert a == b and hash(a) == hash(b) and a.path == str(tmp_path)  # os.PathLike becomes its str
    assert a != tf_ext.TieredStorage("1MB", tmp_path, disk_bytes="1GB")  # another policy
    with pytest.raises(AttributeError):
        a.memory_bytes = 5
    assert tf_ext.TieredStorage("1MB", "/t").disk_bytes is None and tf_ext.TieredStorage("1MB", "/t").policy == "lru"


# ---- per-shard directories and budgets ----------------------------------------------------------------------------


def test_each_shard_gets_its_directory_and_an_even_share(monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    storage = tf_ext.TieredStorage(memory_bytes=1000, path="/ssd/tiers", disk_bytes=10**6 + 2, policy="lfu")
    tiers = [storage.shard_tier("towers/user_emb", i, 3) for i in range(3)]
    assert [t.path for t in tiers] == ["/ssd/tiers/towers/user_emb/shard_%d_of_3" % i for i in range(3)]
    assert {t.memory_bytes for t in tiers} == {333} and {t.disk_bytes for t in tiers} == {333334}
    assert {t.policy for t in tiers} == {"lfu"}
    unbounded = tf_ext.TieredStorage(memory_bytes=1000, path="/ssd/tiers").shard_tier("e", 0, 1)
    assert unbounded.disk_bytes is None and unbounded.memory_bytes == 1000


def test_a_relative_path_is_made_absolute_when_the_graph_is_built(monkeypatch, tmp_path):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    monkeypatch.chdir(tmp_path)
    tier = tf_ext.TieredStorage("1MB", "stores").shard_tier("emb", 0, 2)
    assert tier.path == os.path.join(str(tmp_path), "stores", "emb", "shard_0_of_2")


def test_env_root_replaces_the_path(monkeypatch):
    monkeypatch.setenv(tiered.ENV_ROOT, "/serving/ssd")
    storage = tf_ext.TieredStorage("1MB", "/training/ssd")
    assert storage.shard_tier("emb", 1, 2).path == "/serving/ssd/emb/shard_1_of_2"
    monkeypatch.setenv(tiered.ENV_ROOT, "")  # empty: not set
    assert storage.shard_tier("emb", 1, 2).path == "/training/ssd/emb/shard_1_of_2"


def test_a_horovod_rank_gets_its_own_directory(monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    state = {"initialized": False}
    fake = types.SimpleNamespace(is_initialized=lambda: state["initialized"], rank=lambda: 3)
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", fake)
    storage = tf_ext.TieredStorage("1MB", "/t")
    assert storage.shard_tier("emb", 0, 1).path == "/t/emb/shard_0_of_1"  # imported, not initialized
    state["initialized"] = True
    assert storage.shard_tier("emb", 0, 1).path == "/t/rank_3/emb/shard_0_of_1"
    assert storage.shard_tier("emb", 0, 1, rank=-1).path == "/t/emb/shard_0_of_1"


def test_budgets_too_small_for_the_shards_are_refused(graph):
    with pytest.raises(ValueError, match=r"'emb'.*memory_bytes=3 is split over its 4 shards.*at least 4 bytes"):
        tf_ext.get_dynamic_embedding("emb", dim=4, num_shards=4, storage=tf_ext.TieredStorage(3, "/t"))
    with pytest.raises(ValueError, match=r"'emb'.*disk_bytes=2 is split over its 3 shards"):
        tf_ext.get_dynamic_embedding("emb", dim=4, num_shards=3, storage=tf_ext.TieredStorage("1MB", "/t", 2))


# ---- get_dynamic_embedding(storage=...) and what carries it ------------------------------------------------------


def test_each_shard_handle_carries_its_tier(graph, tmp_path, monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    storage = tf_ext.TieredStorage(memory_bytes="3MB", path=tmp_path, disk_bytes="30MB", policy="lfu")
    with tf.compat.v1.variable_scope("tower"):
        emb = tf_ext.get_dynamic_embedding("user", dim=8, num_shards=3, storage=storage)
    plain = tf_ext.get_dynamic_embedding("plain", dim=8)
    assert emb.storage == storage and plain.storage is None
    for i, shard in enumerate(emb.shards):
        assert _tier_attrs(shard) == {
            "tier_path": os.path.join(str(tmp_path), "tower", "user", "shard_%d_of_3" % i).encode(),
            "tier_memory_bytes": 10**6,
            "tier_disk_bytes": 10**7,
            "tier_policy": b"lfu",
        }
    assert _tier_attrs(plain.shards[0]) == {
        "tier_path": b"",
        "tier_memory_bytes": 0,
        "tier_disk_bytes": 0,
        "tier_policy": b"lru",
    }


def test_env_root_applies_when_the_graph_is_built(graph, monkeypatch):
    monkeypatch.setenv(tiered.ENV_ROOT, "/elsewhere")
    emb = tf_ext.get_dynamic_embedding("e", dim=2, storage=tf_ext.TieredStorage("1MB", "/t"))
    assert _tier_attrs(emb.shards[0])["tier_path"] == b"/elsewhere/e/shard_0_of_1"


@pytest.mark.parametrize(
    "storage,error,pattern",
    [
        ("/tiers", TypeError, r"storage of dynamic embedding 'e' must be None .* or a tf_ext.TieredStorage"),
        (dict(memory_bytes=1, path="/t"), TypeError, r"storage of dynamic embedding 'e' must be"),
    ],
)
def test_storage_of_another_type_is_refused(graph, storage, error, pattern):
    with pytest.raises(error, match=pattern):
        tf_ext.get_dynamic_embedding("e", dim=2, storage=storage)


def test_tiered_shards_on_a_gpu_are_refused(graph):
    storage = tf_ext.TieredStorage("1MB", "/t")
    with pytest.raises(ValueError, match=r"'e'.*host memory.*'/device:GPU:0' is a GPU: place its shards on CPU"):
        tf_ext.get_dynamic_embedding("e", dim=2, devices=["/cpu:0", "/device:GPU:0"], storage=storage)
    tf_ext.get_dynamic_embedding("on_cpu", dim=2, devices=["/cpu:0", "/job:ps/task:1"], storage=storage)


def test_reuse_compares_a_given_storage(graph):
    a = tf_ext.TieredStorage("1MB", "/t")
    with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
        emb = tf_ext.get_dynamic_embedding("e", dim=2, storage=a)
        assert tf_ext.get_dynamic_embedding("e", dim=2, storage=tf_ext.TieredStorage(10**6, "/t")) is emb
        assert tf_ext.get_dynamic_embedding("e", dim=2) is emb  # not given: not compared
        with pytest.raises(ValueError, match=r"share dynamic embedding s/e with storage=TieredStorage\(.*'/u'"):
            tf_ext.get_dynamic_embedding("e", dim=2, storage=tf_ext.TieredStorage("1MB", "/u"))


def test_feature_columns_pass_storage_on(graph, tmp_path, monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    storage = tf_ext.TieredStorage("1MB", tmp_path)
    column = tf_ext.feature_column.categorical_column_with_dynamic_embedding("ad", dim=4, storage=storage)
    tf.compat.v1.feature_column.input_layer({"ad": tf.constant([[1], [2]], tf.int64)}, [column])
    (emb,) = tf_ext.embedding.get_dynamic_embeddings()
    assert emb.storage == storage
    path = _tier_attrs(emb.shards[0])["tier_path"].decode()
    assert path == os.path.join(str(tmp_path), *emb.name.split("/"), "shard_0_of_1")


def test_tfra_module_takes_storage_and_a_tiered_kv_creator(graph, tmp_path):
    from tensorflow_ext import tfra as de  # pylint: disable=import-outside-toplevel

    storage = tf_ext.TieredStorage("1MB", tmp_path)
    assert de.get_variable("a", dim=2, storage=storage).storage == storage
    assert de.get_variable("b", dim=2, kv_creator=storage).storage == storage
    assert de.Variable(dim=2, name="c", storage=storage).storage == storage
    with pytest.raises(ValueError, match=r"pass the TieredStorage once"):
        de.get_variable("d", dim=2, kv_creator=storage, storage=storage)
    with pytest.raises(ValueError, match=r"kv_creator=.*storage=tf_ext.TieredStorage"):
        de.get_variable("e", dim=2, kv_creator=object())


def test_serving_scopes_frozen_tables_are_in_memory_and_int8_rows_are_refused(graph, monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    storage = tf_ext.TieredStorage("1MB", "/t")
    with tf_ext.serving.freeze_for_serving(value_dtype=tf.int8):
        frozen = tf_ext.get_dynamic_embedding("frozen", dim=4, storage=storage)
    assert frozen.shards[0].frozen and frozen.storage == storage  # the config is kept; the table is in memory
    assert "tier_path" not in frozen.shards[0].op.node_def.attr
    with tf_ext.serving.export_rows(tf.bfloat16):
        half = tf_ext.get_dynamic_embedding("half", dim=4, storage=storage)
    assert _tier_attrs(half.shards[0])["tier_path"] == b"/t/half/shard_0_of_1"
    with tf_ext.serving.export_rows(tf.int8):
        with pytest.raises(ValueError, match=r"'int8'.*tiered storage.*int8 rows.*cannot be tiered"):
            tf_ext.get_dynamic_embedding("int8", dim=4, storage=storage)


# ---- tier_stats, prefetch, settle and the summaries, on running tables -------------------------------------------


def _budget(tmp_path, name, **kwargs):
    # 64 KB: some hundreds of dim-8 rows per shard, more than a test's batch.
    return tf_ext.TieredStorage(memory_bytes=kwargs.pop("memory_bytes", 64 << 10), path=tmp_path / name, **kwargs)


def test_prefetch_brings_disk_rows_in_and_changes_nothing(graph, tmp_path):
    dim, n = 8, 6000
    keys = np.arange(n, dtype=np.int64) * 7919 + 3
    values = np.random.RandomState(0).standard_normal([n, dim]).astype(np.float32)
    emb = tf_ext.get_dynamic_embedding("e", dim=dim, num_shards=2, storage=_budget(tmp_path, "e"))
    twin = tf_ext.get_dynamic_embedding("twin", dim=dim, num_shards=2)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    rows = tf.compat.v1.placeholder(tf.float32, [None, dim])
    inserts = [emb.insert(ids, rows), twin.insert(ids, rows)]
    stats, settle, prefetch = emb.tier_stats(), emb.tier_settle(), emb.prefetch(ids)
    exports = [emb.export(), twin.export()]
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        for i in range(0, n, 200):
            sess.run(inserts, {ids: keys[i : i + 200], rows: values[i : i + 200]})
        sess.run(settle)
        before = sess.run(stats)
        assert before["memory_keys"] + before["disk_keys"] == n
        assert before["disk_keys"] > n // 2 and before["demotions"] >= before["disk_keys"]
        assert before["memory_keys"] <= before["budget_keys"]
        # Most keys are on disk: a prefetch of 200 of them reads some (each once) and inserts none.
        some = keys[::30]
        sess.run(prefetch, {ids: np.concatenate([some, some, [-1, 5]])})  # duplicates, absent keys: ignored
        after = sess.run(stats)
        assert 0 < after["cold_reads"] - before["cold_reads"] <= len(some)
        assert after["memory_keys"] + after["disk_keys"] == n
        assert after["lookups"] > before["lookups"]
        # No row, version or frequency changed; nothing was inserted.
        (k1, v1, _, ver1, f1), (k2, v2, _, ver2, f2) = sess.run(exports)
    o1, o2 = np.argsort(k1), np.argsort(k2)
    np.testing.assert_array_equal(k1[o1], k2[o2])
    np.testing.assert_array_equal(v1[o1], v2[o2])
    np.testing.assert_array_equal(ver1[o1], ver2[o2])
    np.testing.assert_array_equal(f1[o1], f2[o2])
    assert after["hit_rate"] == pytest.approx(1.0 - after["cold_reads"] / after["lookups"])


def test_stats_of_an_in_memory_embedding_are_its_memory_numbers(graph):
    emb = tf_ext.get_dynamic_embedding("e", dim=4, num_shards=2)
    fill = emb.insert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, 4]))
    stats, memory = emb.tier_stats(), emb.memory_bytes()
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        sess.run(fill)
        sess.run([emb.prefetch(tf.constant([1, 9], tf.int64)), emb.tier_settle()])  # no-ops
        got, mem = sess.run([stats, memory])
    assert got["memory_keys"] == 3 and got["memory_bytes"] == mem
    assert all(got[k] == 0 for k in ("disk_keys", "disk_bytes", "lookups", "cold_reads", "demotions", "dropped"))
    assert got["hit_rate"] == 1.0


def test_prefetch_checks_the_ids(graph, tmp_path):
    emb = tf_ext.get_dynamic_embedding("e", dim=4, storage=_budget(tmp_path, "e"))
    with pytest.raises(TypeError, match=r"ids of dynamic embedding 'e' .* must be int64 or int32, got float32"):
        emb.prefetch(tf.constant([1.0]))


def test_summaries_exist_and_move(graph, tmp_path):
    dim, n = 8, 4000
    emb = tf_ext.get_dynamic_embedding("user", dim=dim, storage=_budget(tmp_path, "user"))
    plain = tf_ext.get_dynamic_embedding("plain", dim=dim)
    out = tf_ext.embedding.add_summaries()
    assert len(out) == (3 + 6) + 3  # the tiered one: 3 + its 6 tier summaries; the plain one: 3
    assert tf_ext.embedding.add_summaries() == out  # again: nothing new
    tags = set(tf_ext.embedding.summaries.summary_tags(emb).values())
    assert tags == {"tf_ext/user/%s" % k for k in ("size", "memory_bytes", "bytes_per_key")} | {
        "tf_ext/user/tier/%s" % k
        for k in ("memory_bytes", "disk_bytes", "hit_rate", "cold_reads_per_sec", "demotions_per_sec", "dropped_keys")
    }
    assert "tf_ext/plain/tier/hit_rate" not in tf_ext.embedding.summaries.summary_tags(plain).values()
    merged = tf.compat.v1.summary.merge_all()
    keys = np.arange(n, dtype=np.int64) * 104729 + 1
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    fill = emb.insert(ids, tf.ones([tf.size(ids), dim]))
    read = tf_ext.embedding_lookup(emb, ids)
    settle = emb.tier_settle()
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        first = _scalars(sess.run(merged))
        assert first["tf_ext/user/tier/disk_bytes"] == 0 and first["tf_ext/user/tier/hit_rate"] == 1.0
        assert first["tf_ext/user/tier/demotions_per_sec"] == 0  # no previous value: no rate yet
        for i in range(0, n, 200):
            sess.run(fill, {ids: keys[i : i + 200]})
        sess.run(settle)
        second = _scalars(sess.run(merged))
        assert second["tf_ext/user/tier/demotions_per_sec"] > 0
        assert second["tf_ext/user/tier/disk_bytes"] > 0
        assert 0 < second["tf_ext/user/tier/memory_bytes"] <= second["tf_ext/user/memory_bytes"]
        assert second["tf_ext/user/size"] == n  # both tiers
        sess.run(read, {ids: keys[:300]})  # the oldest keys: on disk
        third = _scalars(sess.run(merged))
        assert third["tf_ext/user/tier/cold_reads_per_sec"] > 0
        assert third["tf_ext/user/tier/hit_rate"] < 1.0
        assert third["tf_ext/user/tier/dropped_keys"] == 0


def test_dropped_keys_summary_counts_keys_off_a_capped_disk(graph, tmp_path):
    dim, n = 8, 20000
    emb = tf_ext.get_dynamic_embedding("capped", dim=dim, storage=_budget(tmp_path, "capped", disk_bytes="64KB"))
    tags = tf_ext.embedding.summaries.summary_tags(emb)
    merged = tf.compat.v1.summary.merge(tf_ext.embedding.add_summaries(emb, collections=[]))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    fill, settle, size = emb.insert(ids, tf.ones([tf.size(ids), dim])), emb.tier_settle(), emb.size()
    keys = np.arange(n, dtype=np.int64) + 1
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        for i in range(0, n, 200):
            sess.run(fill, {ids: keys[i : i + 200]})
            sess.run(settle)
        got, kept = _scalars(sess.run(merged)), sess.run(size)
    assert got[tags["tier/dropped_keys"]] > 0
    assert kept + got[tags["tier/dropped_keys"]] == n


# ---- the CTR example ----------------------------------------------------------------------------------------------


def test_ctr_tier_flags():
    from tensorflow_ext.examples import ctr  # pylint: disable=import-outside-toplevel

    a = ctr.parse_args(["--memory_budget", "1.5GB", "--disk_budget", "6GiB", "--tier_policy", "lfu"])
    assert (a.memory_budget, a.disk_budget, a.tier_policy, a.tier_path) == (1500000000, 6 << 30, "lfu", None)
    assert ctr.parse_args([]).memory_budget is None
    for bad in (
        ["--memory_budget", "lots"],
        ["--memory_budget", "0"],
        ["--tier_path", "/t"],
        ["--disk_budget", "1GB"],
        ["--no_prefetch"],
        ["--tier_policy", "lfu"],
        ["--memory_budget", "1GB", "--static_buckets", "100"],
        ["--memory_budget", "1GB", "--serve_dtype", "int8"],
    ):
        with pytest.raises(SystemExit):
            ctr.parse_args(bad)
    ctr.parse_args(["--memory_budget", "1GB", "--serve_dtype", "int8", "--serve_frozen"])


def test_ctr_table_budgets_fill_the_small_tables_first():
    from tensorflow_ext.examples import synthetic  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.examples.ctr import tiers  # pylint: disable=import-outside-toplevel

    params = dict(
        model="deepfm",
        dim=8,
        optimizer="adagrad",
        memory_budget=64 << 20,
        disk_budget=1 << 30,
        tier_path="/t",
        tier_policy="lru",
        cardinalities=synthetic.CRITEO_CARDINALITIES,
    )
    storages = tiers.storages(params)
    assert sorted(storages) == sorted("%s_emb" % k for k in synthetic.CATEGORICAL_KEYS)
    assert sum(s.memory_bytes for s in storages.values()) <= params["memory_budget"]
    assert sum(s.memory_bytes for s in storages.values()) > 0.99 * params["memory_budget"]
    per_key = tiers.key_bytes(9, "adagrad")
    # C9 has 3 ids: it gets what 128 rows need (a tier holds at least 64); the 10-million-id tables share the rest.
    assert storages["C9_emb"].memory_bytes == int(1.25 * 128 * per_key)
    assert storages["C3_emb"].memory_bytes == storages["C12_emb"].memory_bytes > 1 << 20
    assert storages["C3_emb"].disk_bytes > storages["C9_emb"].disk_bytes
    assert sum(s.disk_bytes for s in storages.values()) <= params["disk_budget"]
    params.update(model="wide_deep", memory_budget=None)
    assert tiers.storages(params) is None


@pytest.mark.parametrize("string_ids", [False, True])
def test_ctr_batches_carry_the_next_batch_ids(graph, string_ids):
    from tensorflow_ext.examples import synthetic  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.examples.ctr import data  # pylint: disable=import-outside-toplevel

    # 5 batches; the last one shorter (a file's end): its successor's ids are padded with missing values.
    sizes = [4, 4, 4, 4, 2]
    dtype = tf.string if string_ids else tf.int64

    def ids(b, f, n):
        values = np.arange(n, dtype=np.int64) + 1000 * b + 100 * f
        return values.astype(str).astype(object) if string_ids else values

    batches = [
        ({key: ids(b, f, n) for f, key in enumerate(synthetic.CATEGORICAL_KEYS)}, np.full([n], b, np.float32))
        for b, n in enumerate(sizes)
    ]

    def gen():
        yield from batches

    spec = (
        {key: tf.TensorSpec([None], dtype) for key in synthetic.CATEGORICAL_KEYS},
        tf.TensorSpec([None], tf.float32),
    )
    dataset = data.with_next_ids(tf.data.Dataset.from_generator(gen, output_signature=spec))
    features, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with tf.compat.v1.Session(graph=graph, config=session_config()) as sess:
        got = []
        while True:
            try:
                got.append(sess.run([features, labels]))
            except tf.errors.OutOfRangeError:
                break
    assert len(got) == len(batches)
    missing = b"" if string_ids else -1
    for b, (f, l) in enumerate(got):
        np.testing.assert_array_equal(l, batches[b][1])  # the batch itself, unchanged
        for key in synthetic.CATEGORICAL_KEYS:
            expected = [v.encode() for v in batches[b][0][key]] if string_ids else batches[b][0][key]
            np.testing.assert_array_equal(f[key], expected)
            following = batches[min(b + 1, len(batches) - 1)][0][key]
            following = [v.encode() for v in following] if string_ids else list(following)
            width = max(sizes[b], sizes[min(b + 1, len(sizes) - 1)]) if b + 1 < len(sizes) else sizes[b]
            np.testing.assert_array_equal(f[data.NEXT_PREFIX + key], following + [missing] * (width - len(following)))


def _run_ctr(tmp_path, name, *flags):
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop(tiered.ENV_ROOT, None)
    proc = subprocess.run(
        [sys.executable, "-m", "tensorflow_ext.examples.ctr", "--quick", "--model_dir", str(tmp_path / name)]
        + list(flags),
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, "ctr failed:\n%s\n%s" % (proc.stdout[-3000:], proc.stderr[-6000:])
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_ctr_with_a_memory_budget_trains_as_in_memory(tmp_path):
    common = ["--steps", "40", "--eval_steps", "3", "--log_every", "20", "--batch_size", "256", "--max_ids", "50000"]
    plain, _ = _run_ctr(tmp_path, "plain", *common, "--no_export")
    tiers_dir = tmp_path / "stores"
    tiered_run, log = _run_ctr(
        tmp_path, "tiered", *common, "--memory_budget", "2MB", "--tier_path", str(tiers_dir), "--served_auc"
    )
    # The same model, bit for bit: the same losses and AUC.
    assert tiered_run["auc"] == plain["auc"] and tiered_run["loss"] == plain["loss"]
    assert tiered_run["total_keys"] == plain["total_keys"]
    tiers = tiered_run["tiers"]
    assert tiered_run["memory_budget"] == 2 * 10**6 and tiered_run["tier_prefetch"] is True
    assert tiers["demotions"] > 0 and tiers["cold_reads"] > 0 and tiers["dropped"] == 0
    assert tiers["memory_keys"] + tiers["disk_keys"] == tiered_run["total_keys"]
    assert 0 < tiers["hit_rate"] < 1
    progress = [line for line in log.splitlines() if line.startswith("ctr: step ")]
    assert len(progress) == 2 and all(
        " table keys; tiers: " in line and " cold reads/step, " in line for line in progress
    )
    assert "ctr: tiers: %d keys in memory" % tiers["memory_keys"] in log
    assert "tiered: memory budget 1.9 MiB" in log
    # The export is tiered too; served, it predicts as the trained model does.
    assert abs(tiered_run["served_auc"] - tiered_run["auc"]) < 0.02
    assert (tiers_dir / "embeddings").is_dir()


# ---- the docs page ------------------------------------------------------------------------------------------------


def test_docs_page_examples_are_run_by_the_docs_test():
    sys.path.insert(0, os.path.join(_ROOT, "tests"))
    try:
        import test_docs  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    ids = [p.id for p in test_docs.BLOCKS if p.id.startswith(os.path.join("docs", "tiered_storage.md"))]
    assert len(ids) >= 2, ids
