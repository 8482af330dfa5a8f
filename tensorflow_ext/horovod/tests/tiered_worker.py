"""One rank of the tiered-storage Horovod test (run by horovodrun; see test_tiered_horovod.py).

Every rank trains its slice of the global batches twice with a model-parallel embedding of tensorflow_ext.horovod:
with tiered storage (a memory budget of 64 rows per shard, the rank's store under ROOT/rank_<r>/, settled after each
step) and all in memory. Its losses, the rows it owns (values, slots, versions, frequencies) and the dense weights
must be equal bit for bit; the tier counters must show rows read back from disk and moved to disk, and the rank's
store directory must be its own. Then rank 0 checkpoints the tiered embedding (the ranks gather their rows, from
both tiers) and every rank restores the checkpoint into a new tiered embedding: it gets back exactly the rows it
owns, most of them on disk again.

Usage: tiered_worker.py OPTIMIZER FLAVOUR VALUE_DTYPE ROOT
  FLAVOUR: lookup | sparse (embedding_lookup_sparse, mean)
"""

import os
import sys

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import tensorflow_ext as tf_ext  # noqa: E402  pylint: disable=wrong-import-position
import tensorflow_ext.horovod as tfe_hvd  # noqa: E402  pylint: disable=wrong-import-position
from tensorflow_ext.horovod import checkpoint as hvd_checkpoint  # noqa: E402  pylint: disable=wrong-import-position

DIM, PER_RANK, STEPS, IDS = 4, 16, 8, 3000
ROWS = 64  # the memory tier's rows per shard (the fewest a budget may hold)


def make_optimizer(name):
    t = tf.compat.v1.train
    return {
        "Adagrad": lambda: t.AdagradOptimizer(0.2, initial_accumulator_value=0.3),
        "Adam": lambda: t.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6),
    }[name]()


def global_batches(num_ranks):
    """The same on every rank: ids [num_ranks * PER_RANK, 3] per step, a quarter of them ids of the steps before the
    previous one (rows an LRU tier has moved to disk by then), and labels."""
    rng = np.random.RandomState(1234)
    out, seen = [], []
    for step in range(STEPS):
        ids = rng.randint(0, IDS, size=[num_ranks * PER_RANK, 3]).astype(np.int64)
        if step >= 2:
            old = np.concatenate(seen[: step - 1])
            reuse = rng.rand(*ids.shape) < 0.25
            ids[reuse] = rng.choice(old, size=int(reuse.sum()))
        seen.append(ids.reshape(-1))
        out.append((ids * 7919 + 13, rng.normal(size=[num_ranks * PER_RANK, 1]).astype(np.float32)))
    return out


def memory_bytes(root, value_dtype, opt_name):
    """A budget of about ROWS rows for one shard of this layout, from a probe table's budget_keys (the tier's own
    accounting of a row's bytes)."""
    probe = 1 << 20
    with tf.Graph().as_default():
        gs = tf.compat.v1.train.get_or_create_global_step()
        storage = tf_ext.TieredStorage(memory_bytes=probe, path=root + "_probe")
        emb = tf_ext.get_dynamic_embedding("probe", DIM, value_dtype=value_dtype, storage=storage, initializer=0.0)
        make_optimizer(opt_name).minimize(
            tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64))), global_step=gs
        )
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            budget_keys = int(sess.run(emb.tier_stats()["budget_keys"]))
    return -(-probe // budget_keys) * ROWS


def model(opt_name, flavour, value_dtype, storage):
    gs = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.compat.v1.placeholder(tf.int64, [None, 3])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    emb = tfe_hvd.get_dynamic_embedding(
        "emb",
        DIM,
        parallelism="model",
        value_dtype=value_dtype,
        storage=storage,
        initializer=tf.compat.v1.random_normal_initializer(0.0, 0.1, seed=7),
    )
    if flavour == "sparse":
        sp = tf.sparse.from_dense(ids + 1)  # every entry (no id is -1): shift back below
        x = tf_ext.embedding_lookup_sparse(emb, tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape), None)
    else:
        x = tf.reduce_sum(tf_ext.embedding_lookup(emb, ids), axis=1)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(np.linspace(-0.5, 0.5, DIM).reshape(DIM, 1), tf.float32))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - labels))
    train_op = tfe_hvd.DistributedOptimizer(make_optimizer(opt_name)).minimize(loss, global_step=gs)
    return dict(ids=ids, labels=labels, emb=emb, w=w, loss=loss, train_op=train_op)


def sorted_state(sess, emb):
    e = sess.run(emb.export(with_slots=True))
    order = np.argsort(e.keys)
    return [np.asarray(a)[order] for a in e]


def train(opt_name, flavour, value_dtype, batches, rank, storage, ckpt=None):
    """Trains; returns the losses, the rank's sorted state, the dense weights and the tier counters after each step.
    With ckpt, also saves a checkpoint there (rank 0 writes it)."""
    with tf.Graph().as_default() as g:
        m = model(opt_name, flavour, value_dtype, storage)
        ids, labels, emb, w, loss, train_op = (m[k] for k in ("ids", "labels", "emb", "w", "loss", "train_op"))
        saver = tf.compat.v1.train.Saver() if ckpt else None
        gather = hvd_checkpoint.gather_op() if ckpt else None
        settle, stats = emb.tier_settle(), emb.tier_stats()
        losses, tier_stats = [], []
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
            for gids, glabels in batches:
                losses.append(sess.run([loss, train_op], {ids: gids[sl], labels: glabels[sl]})[0])
                sess.run(settle)
                tier_stats.append({k: int(v) for k, v in sess.run(stats).items() if k != "hit_rate"})
            state = sorted_state(sess, emb)
            if ckpt:
                if rank == 0:
                    os.makedirs(os.path.dirname(ckpt))
                    saver.save(sess, ckpt)
                else:
                    sess.run(gather)
            return np.array(losses), state, sess.run(w), tier_stats


def restore(opt_name, flavour, value_dtype, storage, ckpt):
    """The rank's sorted state and tier counters after restoring ckpt into a new model."""
    with tf.Graph().as_default():
        m = model(opt_name, flavour, value_dtype, storage)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, ckpt)
            sess.run(m["emb"].tier_settle())
            stats = {k: int(v) for k, v in sess.run(m["emb"].tier_stats()).items() if k != "hit_rate"}
            return sorted_state(sess, m["emb"]), stats


def bits(x):
    x = np.asarray(x)
    return x.view(np.uint32) if x.dtype == np.float32 else x


def main():
    opt_name, flavour, value_dtype, root = sys.argv[1], sys.argv[2], tf.as_dtype(sys.argv[3]), sys.argv[4]
    tfe_hvd.init()
    rank, num_ranks = tfe_hvd.rank(), tfe_hvd.size()
    batches = global_batches(num_ranks)
    budget = memory_bytes(root, value_dtype, opt_name)
    storage = tf_ext.TieredStorage(memory_bytes=budget, path=root)
    ckpt = os.path.join(root + "_ckpt", "model")
    got = train(opt_name, flavour, value_dtype, batches, rank, storage, ckpt)
    want = train(opt_name, flavour, value_dtype, batches, rank, None)
    np.testing.assert_array_equal(bits(got[0]), bits(want[0]), err_msg="rank %d losses" % rank)
    for field, a, b in zip(("keys", "values", "slots", "versions", "frequencies"), got[1], want[1]):
        np.testing.assert_array_equal(bits(a), bits(b), err_msg="rank %d %s" % (rank, field))
    np.testing.assert_array_equal(bits(got[2]), bits(want[2]), err_msg="rank %d dense weights" % rank)
    stats = got[3]
    for before, after in zip(stats[2:], stats[3:]):  # every step once the memory tier is full
        assert after["cold_reads"] > before["cold_reads"] and after["demotions"] > before["demotions"], (rank, stats)
    last = stats[-1]
    assert last["disk_keys"] > last["memory_keys"] and last["memory_keys"] <= last["budget_keys"], (rank, last)
    assert last["memory_keys"] + last["disk_keys"] == len(got[1][0]), (rank, last)
    # This rank's store, in a directory of its own.
    store = os.path.join(root, "rank_%d" % rank, "emb", "shard_0_of_1")
    assert "TF_EXT_TIER_STORE" in os.listdir(store), (rank, os.listdir(store))
    # The checkpoint of the tiered embedding (rank 0 wrote it before its in-memory run, whose collectives every
    # rank has run since) restores every key the rank owns, into both tiers of a new one.
    restored, restored_stats = restore(
        opt_name, flavour, value_dtype, tf_ext.TieredStorage(memory_bytes=budget, path=root + "_restored"), ckpt
    )
    for field, a, b in zip(("keys", "values", "slots", "versions", "frequencies"), restored, got[1]):
        np.testing.assert_array_equal(bits(a), bits(b), err_msg="rank %d restored %s" % (rank, field))
    assert restored_stats["disk_keys"] > restored_stats["memory_keys"], (rank, restored_stats)
    assert restored_stats["memory_keys"] + restored_stats["disk_keys"] == len(got[1][0]), (rank, restored_stats)
    print("RANK %d OK keys=%d disk_keys=%d" % (rank, len(got[1][0]), last["disk_keys"]), flush=True)


if __name__ == "__main__":
    main()
