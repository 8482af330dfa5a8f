"""A SavedModel of a tiered embedding served on another machine: `TF_EXT_TIER_ROOT` set in the serving process.

The export records the exporting machine's store directories (the handle ops' ``tier_path``) and the root they were
resolved under (``tier_root``). A serving process that sets `TF_EXT_TIER_ROOT` and only imports tensorflow_ext and
loads the SavedModel (``tf.compat.v1.saved_model.loader.load``) must keep its stores under its own root, with the
same layout below it, and predict exactly what the same model's in-memory export predicts. The exporting machine's
directories are gone by then (as on another machine), and must not be made again.
"""

import json
import os
import shutil

import numpy as np
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import run_fresh
from tensorflow_ext.embedding.tests.conftest import session_config

DIM = 4
IDS = 3000
MEMORY_BYTES = 48 << 10  # both shards: a few hundred of the 3000 rows each
MARKER = "TF_EXT_TIER_STORE"  # the file that marks a store directory


def _model(ids, storage):
    """Probability [batch] of int64 ids [batch]: a 2-shard embedding "user" and a dense weight."""
    emb = tf_ext.get_dynamic_embedding(
        "user",
        DIM,
        num_shards=2,
        initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3),
        storage=storage,
    )
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-1, 1, DIM).reshape(DIM, 1), tf.float32))
    return tf.identity(tf.sigmoid(tf.matmul(tf_ext.embedding_lookup(emb, ids), w))[:, 0], name="prob")


def _batch(step):
    return np.random.RandomState(step).randint(0, IDS, 256).astype(np.int64)


def _export(ckpt, export_dir, storage):
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        prob = _model(ids, storage)
        tf.compat.v1.train.Saver().restore(sess, ckpt)
        builder = tf.compat.v1.saved_model.Builder(export_dir)
        signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"prob": prob})
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    return export_dir


def _stores(root):
    """The store directories under `root` (relative to it), found by their marker files."""
    return sorted(os.path.relpath(d, str(root)) for d, _, files in os.walk(str(root)) if MARKER in files)


def test_a_served_tiered_model_keeps_its_stores_under_the_serving_machines_root(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_EXT_TIER_ROOT", raising=False)
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        gs = tf.compat.v1.train.get_or_create_global_step()
        storage = tf_ext.TieredStorage(memory_bytes=MEMORY_BYTES, path=str(tmp_path / "train_tiers"))
        prob = _model(ids, storage)
        loss = tf.reduce_mean(tf.square(prob - 0.8))
        train = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss, global_step=gs)
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(12):
                sess.run(train, {ids: _batch(step)})
            ckpt = tf.compat.v1.train.Saver().save(sess, str(tmp_path / "model"))
    exporting_root = tmp_path / "exporting_machine"
    exports = {
        "tiered": _export(
            ckpt,
            str(tmp_path / "export_tiered"),
            tf_ext.TieredStorage(memory_bytes=MEMORY_BYTES, path=str(exporting_root)),
        ),
        "in_memory": _export(ckpt, str(tmp_path / "export_in_memory"), None),
    }
    # The exporting process's restore made its stores; the serving machine has no such directory.
    assert _stores(exporting_root) == ["user/shard_0_of_2", "user/shard_1_of_2"]
    shutil.rmtree(str(exporting_root))
    serve_ids = np.concatenate([np.concatenate([_batch(s) for s in range(12)]), [IDS + 5, -7]])  # 2 never trained
    np.save(str(tmp_path / "ids.npy"), serve_ids)
    serving_root = tmp_path / "serving_machine"
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
                # Batches of 64: each fits the memory budget, the whole table does not.
                prob = np.concatenate([sess.run(sig.outputs["prob"].name, {sig.inputs["ids"].name: ids[i : i + 64]})
                                       for i in range(0, len(ids), 64)])
                handles = [op for op in g.get_operations() if op.type == "TfExtTableHandle"]
                stats = sess.run([load_ops().tf_ext_table_tier_stats(op.outputs[0]) for op in handles])
                attrs = [[op.get_attr(a).decode() for a in ("tier_path", "tier_root")] for op in handles]
            np.save(name + ".npy", prob)
            result[name] = dict(stats=np.sum(stats, 0).tolist(), attrs=sorted(attrs))
        print(json.dumps(result))
        """
        % json.dumps(exports),
        tmp_path,
        env={"TF_EXT_TIER_ROOT": str(serving_root)},
    )
    result = json.loads(out.strip().splitlines()[-1])
    tiered, in_memory = np.load(str(tmp_path / "tiered.npy")), np.load(str(tmp_path / "in_memory.npy"))
    np.testing.assert_array_equal(tiered.view(np.uint32), in_memory.view(np.uint32))
    # The graph still names the exporting machine's directories; the stores are under the serving machine's root,
    # in use (most served rows on disk), and the exporting machine's root was not made again.
    assert result["tiered"]["attrs"] == [
        [os.path.join(str(exporting_root), "user", "shard_%d_of_2" % i), str(exporting_root)] for i in range(2)
    ], result
    memory_keys, disk_keys = result["tiered"]["stats"][0], result["tiered"]["stats"][2]
    assert disk_keys > memory_keys > 0, result
    assert _stores(serving_root) == ["user/shard_0_of_2", "user/shard_1_of_2"]
    assert not os.path.exists(str(exporting_root))
    assert result["in_memory"]["attrs"] == [["", ""], ["", ""]] and result["in_memory"]["stats"][2] == 0, result
