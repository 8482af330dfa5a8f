"""Where a tiered table keeps its store: the handle op's ``tier_root`` attr and `TF_EXT_TIER_ROOT`.

A shard's `TieredStorage` (`shard_tier`) records the root its path was resolved under; the handle op carries it as
``tier_root``, and the kernel replaces that prefix of ``tier_path`` with `TF_EXT_TIER_ROOT` when the variable is set
as the table is created (in-process here: the variable is set after the graph is built, before it first runs). The
store directory is found on disk by its marker file. TF1 graph mode; fixtures in conftest.py.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table import refs
from tensorflow_ext.table import tiered
from tensorflow_ext.utils import loader

MARKER = "TF_EXT_TIER_STORE"  # the file that marks a store directory (cold_store.h)
LAYOUT = refs.TableLayout(dim=4)


def _stores(root):
    """The store directories under `root` (relative to it), found by their marker files."""
    found = []
    for d, _, files in os.walk(str(root)):
        if MARKER in files:
            found.append(os.path.relpath(d, str(root)))
    return sorted(found)


def _tiered_table(storage, name="emb", shard=0, num_shards=1):
    tier = storage.shard_tier(name, shard, num_shards, rank=-1)
    return refs.MutableTableRef.create(LAYOUT, shared_name="%s_%d" % (name, shard), tier=tier), tier


def _use(sess, table):
    """Inserts 3x the keys the memory budget holds and settles: the store gets rows. Returns the tier stats."""
    budget_keys = int(sess.run(table.tier_stats())[refs.TIER_STATS_FIELDS.index("budget_keys")])
    keys = np.arange(3 * budget_keys, dtype=np.int64) * 7919
    rows = np.repeat(keys[:, None].astype(np.float32), LAYOUT.dim, axis=1)
    k = tf.compat.v1.placeholder(tf.int64, [None])
    insert = table.insert(k, tf.tile(tf.cast(k, tf.float32)[:, None], [1, LAYOUT.dim]), step=1)
    find = table.find(k, tf.zeros([LAYOUT.dim]))[0]
    chunk = budget_keys // 2  # a batch must fit in the budget
    for i in range(0, len(keys), chunk):
        sess.run(insert, {k: keys[i : i + chunk]})
    sess.run(table.tier_settle())
    found = np.concatenate([sess.run(find, {k: keys[i : i + chunk]}) for i in range(0, len(keys), chunk)])
    np.testing.assert_array_equal(found, rows)
    stats = sess.run(table.tier_stats())
    return {name: int(stats[i]) for i, name in enumerate(refs.TIER_STATS_FIELDS)}


def test_a_shard_tier_records_its_root(graph, tmp_path, monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    table, tier = _tiered_table(tiered.TieredStorage(memory_bytes=64 << 10, path=str(tmp_path / "a")), "t/u")
    attrs = table.handle.op.node_def.attr
    assert attrs["tier_path"].s.decode() == os.path.join(str(tmp_path), "a", "t", "u", "shard_0_of_1")
    assert attrs["tier_root"].s.decode() == str(tmp_path / "a") == tier.resolved_root
    # Built under TF_EXT_TIER_ROOT: both name that root.
    monkeypatch.setenv(tiered.ENV_ROOT, str(tmp_path / "b"))
    table, tier = _tiered_table(tiered.TieredStorage(memory_bytes=64 << 10, path=str(tmp_path / "a")), "v")
    attrs = table.handle.op.node_def.attr
    assert attrs["tier_path"].s.decode() == os.path.join(str(tmp_path), "b", "v", "shard_0_of_1")
    assert attrs["tier_root"].s.decode() == str(tmp_path / "b")
    # A user's storage has none (only shard_tier resolves a path), nor has an untiered table's handle.
    assert tiered.TieredStorage(memory_bytes=1, path="/t").resolved_root is None
    plain = refs.MutableTableRef.create(LAYOUT, shared_name="plain")
    assert plain.handle.op.get_attr("tier_root") == b""


def test_without_the_variable_the_store_is_where_the_graph_says(graph, sess, tmp_path, monkeypatch):
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    table, _ = _tiered_table(tiered.TieredStorage(memory_bytes=64 << 10, path=str(tmp_path / "a")), num_shards=2)
    stats = _use(sess, table)
    assert stats["disk_keys"] > stats["memory_keys"] > 0, stats
    assert _stores(tmp_path) == [os.path.join("a", "emb", "shard_0_of_2")]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_the_variable_at_table_creation_moves_the_store_under_it(graph, sess, tmp_path, monkeypatch, relative):
    """The graph was built for <tmp>/a; the variable, set before the table is created, moves its store to <tmp>/b
    (a relative value against the current directory), keeping the path below the root; <tmp>/a is never made."""
    monkeypatch.delenv(tiered.ENV_ROOT, raising=False)
    storage = tiered.TieredStorage(memory_bytes=64 << 10, path=str(tmp_path / "a"))
    tables = [_tiered_table(storage, "tower/user", i, 2)[0] for i in range(2)]
    if relative:
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv(tiered.ENV_ROOT, "b")
    else:
        monkeypatch.setenv(tiered.ENV_ROOT, str(tmp_path / "b") + "/")
    for table in tables:
        stats = _use(sess, table)
        assert stats["disk_keys"] > stats["memory_keys"] > 0, stats
        # The graph still records the path it was built with.
        assert table.handle.op.get_attr("tier_path").decode().startswith(str(tmp_path / "a") + os.sep)
    assert _stores(tmp_path) == [os.path.join("b", "tower", "user", "shard_%d_of_2" % i) for i in range(2)]
    assert not os.path.exists(str(tmp_path / "a"))


def test_a_handle_without_tier_root_ignores_the_variable(graph, sess, tmp_path, monkeypatch):
    """An older graph (or a tier without resolved_root) has no tier_root: its tier_path is used as it is."""
    monkeypatch.setenv(tiered.ENV_ROOT, str(tmp_path / "b"))
    handle = loader.load_ops().tf_ext_table_handle(
        dim=LAYOUT.dim, tier_path=str(tmp_path / "a" / "s"), tier_memory_bytes=64 << 10, shared_name="old"
    )
    table = refs.MutableTableRef(handle, LAYOUT)
    _use(sess, table)
    assert _stores(tmp_path) == [os.path.join("a", "s")]


@pytest.mark.parametrize(
    "path,root,pattern",
    [
        ("/x/ab/s", "/x/a", r'tier_root "/x/a" is not a directory above tier_path "/x/ab/s"'),
        ("/y/s", "/x", r'tier_root "/x" is not a directory above tier_path "/y/s"'),
        ("", "/x", r'tier_root "/x" needs a tier_path'),
    ],
)
def test_a_tier_root_that_is_not_above_the_path_is_refused(graph, sess, monkeypatch, path, root, pattern):
    monkeypatch.setenv(tiered.ENV_ROOT, "/elsewhere")
    handle = loader.load_ops().tf_ext_table_handle(
        dim=LAYOUT.dim, tier_path=path, tier_memory_bytes=(64 << 10) if path else 0, tier_root=root, shared_name="bad"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
        sess.run(handle)
