"""A live model whose every served value tells its version, and serving updates written by hand for it.

The model: two dynamic embeddings, "user" (dim 4) and "item" (dim 3), of 2 shards each, and a dense variable "w" [4].
At version v every row and w hold `value(v, ...)`: v * 1024 plus a per-key, per-column offset below 1024, so any
value read back says which version it came from (`versions_of`), exactly (integers below 2**24 are exact float32).

`export_live` writes a checkpoint at a version and an updatable export of it (`freeze_for_serving(live_model=)`,
a Builder export with outputs user, item, w and version = `served_version()`). `write_update` writes a serving update
the way `update_format` describes it (a SaveV2 bundle and a manifest, in a temporary directory renamed when
complete): every key of every shard and w set to a version's values, with the metadata a test asks for (another
model's name, another layout, any from_step and to_step). The follower tests use these instead of a trainer so that
each update is exactly what the test needs (a gap, a foreign model); test_follow_cli.py runs a real trainer.
"""

import os
import uuid

import numpy as np
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.keys import hash_key_numpy
from tensorflow_ext.embedding.tests.conftest import session_config
from tensorflow_ext.serving import update_format

MODEL = "live_ctr"
NUM_SHARDS = 2
DIMS = {"user": 4, "item": 3}
KEYS = {"user": np.arange(200, dtype=np.int64) * 3 + 1, "item": np.arange(150, dtype=np.int64) * 5 + 7}
W_SHAPE = (4,)
_OFFSET = {"user": 0, "item": 512, "w": 800}  # keeps each value's low part distinct per table, below 1024
_SCALE = 1024


def value(version, table, keys, dim):
    """float32 [len(keys), dim]: the rows of `table` ("user" or "item") at `version`."""
    keys = np.asarray(keys, np.int64)
    low = _OFFSET[table] + (keys % 32)[:, None] * 8 + np.arange(dim)[None, :]
    return (version * _SCALE + low).astype(np.float32)


def w_value(version, shape=W_SHAPE):
    n = int(np.prod(shape, dtype=np.int64))
    return (version * _SCALE + _OFFSET["w"] + np.arange(n)).reshape(shape).astype(np.float32)


def feeds():
    """A request for every key of both embeddings (so every shard of each)."""
    return {"user_ids": KEYS["user"], "item_ids": KEYS["item"]}


def versions_of(outputs):
    """The sorted distinct versions the values of one response decode to (one element unless the response mixes)."""
    parts = [
        (outputs["user"] - value(0, "user", KEYS["user"], DIMS["user"])) / _SCALE,
        (outputs["item"] - value(0, "item", KEYS["item"], DIMS["item"])) / _SCALE,
        (outputs["w"] - w_value(0)) / _SCALE,
    ]
    return sorted(set(np.concatenate([p.ravel() for p in parts]).tolist()))


def model(user_ids, item_ids):
    """(user, item, w, user rows, item rows) of the model, built in the default graph."""
    user = tf_ext.get_dynamic_embedding("user", DIMS["user"], num_shards=NUM_SHARDS, initializer=-1.0)
    item = tf_ext.get_dynamic_embedding("item", DIMS["item"], num_shards=NUM_SHARDS, initializer=-1.0)
    w = tf.compat.v1.get_variable("w", initializer=tf.zeros(W_SHAPE))
    return user, item, w, tf_ext.embedding_lookup(user, user_ids), tf_ext.embedding_lookup(item, item_ids)


def write_checkpoint(path, version):
    """A checkpoint of the model at `version` (global step and every value); returns its prefix."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        user, item, w, _, _ = model(tf.constant([0], tf.int64), tf.constant([0], tf.int64))
        fill = [
            user.insert(KEYS["user"], value(version, "user", KEYS["user"], DIMS["user"])),
            item.insert(KEYS["item"], value(version, "item", KEYS["item"], DIMS["item"])),
            w.assign(w_value(version)),
            step.assign(version),
        ]
        with tf.compat.v1.Session(config=session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(fill)
            return tf.compat.v1.train.Saver().save(sess, path)


def export_live(work, version, model_name=MODEL, ckpt=None):
    """Writes the updatable export <work>/export_<version> of `ckpt` (default: a checkpoint written at `version`,
    <work>/ckpt-<version>); returns the export's path."""
    if ckpt is None:
        ckpt = write_checkpoint(os.path.join(str(work), "ckpt-%d" % version), version)
    export_dir = os.path.join(str(work), "export_%d" % version)
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        with tf_ext.serving.freeze_for_serving(live_model=model_name):
            tf.compat.v1.train.get_or_create_global_step()
            user_ids = tf.compat.v1.placeholder(tf.int64, [None], name="user_ids")
            item_ids = tf.compat.v1.placeholder(tf.int64, [None], name="item_ids")
            _, _, w, user_rows, item_rows = model(user_ids, item_ids)
            outputs = {
                "user": user_rows,
                "item": item_rows,
                "w": tf.identity(w),
                "version": tf_ext.serving.served_version(),
            }
            tf.compat.v1.train.Saver().restore(sess, ckpt)
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            signature = tf.compat.v1.saved_model.predict_signature_def(
                {"user_ids": user_ids, "item_ids": item_ids}, outputs
            )
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return export_dir


def write_update(
    updates_dir, layout, kind, from_step, to_step, values_at=None, model_name=MODEL, name_step=None, snapshot=False
):
    """Publishes one update (all keys of every table line of `layout` and its dense values at version `values_at`,
    default to_step) as `update-<name_step or to_step>` (`full-<...>` with `snapshot`); returns its directory.

    `layout` is written into the bundle and the manifest, and decides the shapes (a table line of another dim writes
    rows of that dim)."""
    values_at = to_step if values_at is None else values_at
    tables, dense = update_format.parse_layout(layout)
    tensors = {
        update_format.META_MODEL_NAME: np.array(model_name.encode(), object),
        update_format.META_LAYOUT: np.array(layout.encode(), object),
        update_format.META_KIND: np.array(kind.encode(), object),
        update_format.META_FROM_STEP: np.int64(from_step),
        update_format.META_TO_STEP: np.int64(to_step),
    }
    n_keys = 0
    for shard, dim in tables.items():
        table, index = shard.rsplit("/part_", 1)
        keys = KEYS[table][hash_key_numpy(KEYS[table]) % np.uint64(NUM_SHARDS) == np.uint64(int(index))]
        tensors[update_format.keys_name(shard)] = keys
        tensors[update_format.values_name(shard)] = value(values_at, table, keys, dim)
        tensors[update_format.removed_name(shard)] = np.zeros([0], np.int64)
        n_keys += len(keys)
    for variable, (_, shape) in dense.items():
        tensors[update_format.dense_name(variable)] = w_value(values_at, shape)
    os.makedirs(updates_dir, exist_ok=True)
    tmp = os.path.join(updates_dir, update_format.TMP_PREFIX + uuid.uuid4().hex)
    os.makedirs(tmp)
    names = sorted(tensors)
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        sess.run(
            tf.raw_ops.SaveV2(
                prefix=update_format.bundle_prefix(tmp),
                tensor_names=names,
                shape_and_slices=[""] * len(names),
                tensors=[tf.constant(tensors[n]) for n in names],
            )
        )
    update_format.write_manifest(
        tmp,
        dict(
            format=update_format.FORMAT_VERSION,
            model_name=model_name,
            kind=kind,
            from_step=int(from_step),
            to_step=int(to_step),
            layout=layout,
            created_unix=float(os.path.getmtime(tmp)),
            keys=n_keys,
            removed=0,
        ),
    )
    dir_name = update_format.snapshot_dir_name if snapshot else update_format.update_dir_name
    path = os.path.join(updates_dir, dir_name(to_step if name_step is None else name_step))
    os.rename(tmp, path)
    return path


def delta(updates_dir, layout, from_step, to_step, **kw):
    return write_update(updates_dir, layout, update_format.KIND_DELTA, from_step, to_step, **kw)


def full(updates_dir, layout, to_step, **kw):
    return write_update(updates_dir, layout, update_format.KIND_FULL, 0, to_step, **kw)


def snapshot(updates_dir, layout, to_step, **kw):
    """A full snapshot beside the chain (`full-<to_step>`)."""
    return full(updates_dir, layout, to_step, snapshot=True, **kw)


def data_file(update_dir):
    """The bundle's (only) data file."""
    (name,) = [n for n in os.listdir(update_dir) if n.startswith(update_format.BUNDLE_NAME + ".data-")]
    return os.path.join(update_dir, name)
