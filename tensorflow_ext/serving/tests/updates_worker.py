"""The model of the serving-update writer tests, and a worker process that trains it and writes updates.

As a module: `build()` (the model), `replay()` (a reference follower: the updates of a directory applied in order to
dicts) and `table_state()` (the trainer's own tables). As a script (`updates_worker.py '<json config>'`), for the
scenarios that need a process of their own (a private tmpfs, a SIGKILL): trains `steps` steps, writes an update
after each step listed in `write_at`, optionally deletes `free_at_step`'s file, and writes a JSON result (the
manifests or None per write, the stats, the global step) and the final state (npz) into `out_dir`. With
`pause_at` = [stage, n] the writer's n-th arrival at that stage prints "READY <path>" and blocks (the test kills it).
"""

import json
import os
import sys

import numpy as np

DIM = 4
SHARDS = ("user/part_0", "user/part_1")
DENSE = ("dense/b", "dense/w")


def build(dim=DIM, num_shards=2, steps_to_live=3):
    """The model: (global step, embedding, ids placeholder, train op, remove ids placeholder, remove op, evict op,
    insert-without-version op)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import tensorflow_ext as tf_ext  # pylint: disable=import-outside-toplevel

    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tf_ext.get_dynamic_embedding(
        "user", dim, num_shards=num_shards, initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3)
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    with tf.compat.v1.variable_scope("dense"):
        w = tf.compat.v1.get_variable("w", [dim, 1], initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
        b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(tf_ext.embedding_lookup(emb, ids), w) + b
    loss = tf.reduce_sum(tf.square(logits - 1.0))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
    remove_ids = tf.compat.v1.placeholder(tf.int64, [None], name="remove_ids")
    remove = emb.remove(remove_ids)
    evict = tf_ext.embedding.evict(emb, steps_to_live=steps_to_live)
    # A write that sets no version (as a preload does): the change log cannot follow it.
    untracked = tf.group(
        *[s.table.insert(tf.constant([10**6 + i], tf.int64), tf.ones([1, dim]), -1) for i, s in enumerate(emb.shards)]
    )
    return gs, emb, ids, train, remove_ids, remove, evict, untracked


def table_state(sess, emb):
    """{shard name: {key: row}} of the trainer's tables, and {dense name: value} of its dense variables."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tables = {}
    for shard in emb.shards:
        keys, values = sess.run(shard.table.export()[:2])
        tables[shard.name] = {int(k): v for k, v in zip(keys, values)}
    dense = {}
    for v in tf.compat.v1.trainable_variables():
        if isinstance(v, tf.Variable) and v.name.startswith("dense/"):
            dense[v.op.name] = sess.run(v)
    return tables, dense


def read_update(path):
    """(manifest, {tensor name: numpy value}) of an update directory."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tensorflow_ext.serving import update_format  # pylint: disable=import-outside-toplevel

    manifest = update_format.read_manifest(path)
    reader = tf.train.load_checkpoint(update_format.bundle_prefix(path))
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    return manifest, tensors


def replay(paths, tables=None, dense=None):
    """A reference follower: the updates at `paths` applied in order (checking the version rule) onto `tables`
    ({shard: {key: row}}) and `dense`; returns (tables, dense, version)."""
    from tensorflow_ext.serving import update_format as uf  # pylint: disable=import-outside-toplevel

    tables = {name: dict(rows) for name, rows in (tables or {}).items()}
    dense = dict(dense or {})
    version = None
    for path in paths:
        manifest, tensors = read_update(path)
        if manifest["kind"] == uf.KIND_DELTA and version is not None:
            assert manifest["from_step"] <= version < manifest["to_step"], (path, manifest, version)
        shard_names, dense_entries = uf.parse_layout(manifest["layout"])
        for shard in shard_names:
            rows = tables.setdefault(shard, {})
            if manifest["kind"] == uf.KIND_FULL:
                rows.clear()
            for k in tensors[uf.removed_name(shard)]:
                rows.pop(int(k), None)
            for k, row in zip(tensors[uf.keys_name(shard)], tensors[uf.values_name(shard)]):
                rows[int(k)] = row
        for name in dense_entries:
            dense[name] = tensors[name]
        version = manifest["to_step"]
    return tables, dense, version


def assert_same_state(got, want):
    (got_tables, got_dense), (want_tables, want_dense) = got, want
    assert sorted(got_tables) == sorted(want_tables)
    for shard in want_tables:
        assert sorted(got_tables[shard]) == sorted(want_tables[shard]), shard
        for k, row in want_tables[shard].items():
            np.testing.assert_array_equal(got_tables[shard][k], row, err_msg="%s key %d" % (shard, k))
    assert sorted(got_dense) == sorted(want_dense)
    for name, value in want_dense.items():
        np.testing.assert_array_equal(got_dense[name], value, err_msg=name)


def batch(step, size):
    return np.random.RandomState(step).randint(0, 4 * size, size=size).astype(np.int64)


def _pause_hook(stage, n):
    seen = [0]

    def hook(at, path):
        if at == stage:
            seen[0] += 1
            if seen[0] == n:
                sys.stdout.write("READY %s\n" % path)
                sys.stdout.flush()
                sys.stdin.read()  # blocks until the test kills this process

    return hook


def main(cfg):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.compat.v1.disable_v2_behavior()
    from tensorflow_ext.serving import updates  # pylint: disable=import-outside-toplevel

    if cfg.get("pause_at"):
        updates._test_hook = _pause_hook(*cfg["pause_at"])  # pylint: disable=protected-access
    gs, emb, ids, train, *_ = build(dim=cfg.get("dim", DIM))
    writer = updates.ServingUpdateWriter(cfg["updates_dir"], full_every=cfg.get("full_every", 1000), keep=None)
    result = {"writes": []}
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        writer.start(sess)
        sizes = cfg.get("batch_sizes", {})
        for step in range(cfg["steps"]):
            sess.run(train, {ids: batch(step, int(sizes.get(str(step), cfg.get("batch", 8))))})
            if step in cfg.get("write_at", ()):
                result["writes"].append(writer.write(sess))
            if step == cfg.get("free_at_step"):
                os.remove(cfg["free_path"])
        result["global_step"] = int(sess.run(gs))
        result["stats"] = writer.stats
        tables, dense = table_state(sess, emb)
    from tensorflow_ext.serving import update_format  # pylint: disable=import-outside-toplevel

    # What a follower of the directory would hold (the directory may not outlive this process: a private tmpfs).
    result["listing"] = sorted(os.listdir(cfg["updates_dir"]))
    try:
        assert_same_state(replay([p for _, p in update_format.list_updates(cfg["updates_dir"])])[:2], (tables, dense))
        result["replay_error"] = None
    except AssertionError as e:
        result["replay_error"] = str(e) or repr(e)
    np.savez(
        os.path.join(cfg["out_dir"], "state.npz"),
        # "/" is a zip path separator: names carry "~" instead.
        **{("%s|%d" % (s, k)).replace("/", "~"): row for s, rows in tables.items() for k, row in rows.items()},
        **{("dense|" + n).replace("/", "~"): v for n, v in dense.items()},
    )
    with open(os.path.join(cfg["out_dir"], "result.json"), "w") as f:
        json.dump(result, f)


def load_state(out_dir):
    """The (tables, dense) a worker saved."""
    tables, dense = {s: {} for s in SHARDS}, {}
    with np.load(os.path.join(out_dir, "state.npz")) as npz:
        for name in npz.files:
            kind, rest = name.replace("~", "/").split("|", 1)
            if kind == "dense":
                dense[rest] = npz[name]
            else:
                tables[kind][int(rest)] = npz[name]
    return tables, dense


if __name__ == "__main__":
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path.insert(0, _root)
    main(json.loads(sys.argv[1]))
