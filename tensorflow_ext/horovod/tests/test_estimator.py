"""Estimator training under horovodrun: rank 0 writes, checkpoints hold every key, restarts at any rank count.

The worker (estimator_worker.py) trains a model with a model-parallel "user" embedding (2 local shards), a
data-parallel "item" embedding and a dense weight, and dumps each rank's tables; these tests compare the dumps, the
checkpoint and single-process restores.
"""

import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "estimator_worker.py")


def owner_of_numpy(keys, num_ranks):
    # Imported lazily: the test process itself never imports Horovod.
    from tensorflow_ext.horovod.embedding import owner_of_numpy as f  # pylint: disable=import-outside-toplevel

    return f(keys, num_ranks)


def run_worker(ranks, *args, out=None):
    if out is not None:
        os.makedirs(out, exist_ok=True)
        args = args + ("--out", str(out))
    code, text = horovodrun(ranks, WORKER, *[str(a) for a in args])
    assert code == 0, text[-6000:]
    return text


def single_process(*args):
    r = subprocess.run(
        [sys.executable, WORKER] + [str(a) for a in args] + ["--single"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return r.stdout


def load_dumps(out, ranks):
    return [dict(np.load(os.path.join(out, "rank%d.npz" % r))) for r in range(ranks)]


def checkpoint_table(model_dir, name, num_shards=2):
    """{key: (values, slots)} of an embedding in the latest checkpoint of model_dir."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    reader = tf.train.load_checkpoint(model_dir)
    table = {}
    for s in range(num_shards):
        prefix = "%s/part_%d" % (name, s)
        for k, v, sl in zip(
            reader.get_tensor(prefix + "-keys"),
            reader.get_tensor(prefix + "-values"),
            reader.get_tensor(prefix + "-slots"),
        ):
            assert int(k) not in table, "key %d saved twice" % k
            table[int(k)] = (v, sl)
    return table


def table_of(dump, name):
    return {int(k): (v, s) for k, v, s in zip(dump[name + "_keys"], dump[name + "_values"], dump[name + "_slots"])}


def assert_tables_equal(got, want, what):
    assert sorted(got) == sorted(want), (what, sorted(set(got) ^ set(want))[:10])
    for k in want:
        np.testing.assert_array_equal(got[k][0], want[k][0], err_msg="%s: row of key %d" % (what, k))
        np.testing.assert_array_equal(got[k][1], want[k][1], err_msg="%s: slots of key %d" % (what, k))


def assert_partitioned(dumps, want, name="user"):
    """Each rank holds exactly the keys it owns; together every key of `want` once, with its row and slots."""
    union = {}
    for r, d in enumerate(dumps):
        mine = table_of(d, name)
        owners = owner_of_numpy(np.array(sorted(mine), np.int64), len(dumps))
        assert (owners == r).all(), "rank %d holds keys it does not own" % r
        assert not set(mine) & set(union), "keys on two ranks"
        union.update(mine)
    assert_tables_equal(union, want, "union of %d ranks" % len(dumps))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """2 ranks, 4 steps, a checkpoint every 2 steps, then rank 0 exports a SavedModel."""
    base = tmp_path_factory.mktemp("trained")
    model_dir, out, export = base / "model", base / "dumps", base / "export"
    text = run_worker(2, "train", "--model-dir", model_dir, "--max-steps", 4, "--export-dir", export, out=out)
    return {"model_dir": str(model_dir), "out": str(out), "export": str(export), "log": text}


def test_rank0_writes_every_file_and_the_full_table(trained):
    model_dir, log = trained["model_dir"], trained["log"]
    assert "RANK 0 TRAINED step=4" in log and "RANK 1 TRAINED step=4" in log, log[-4000:]
    files = sorted(os.listdir(model_dir))
    # Only rank 0 writes summaries: one events file (the checkpoint hook's and the summary hook's writer).
    assert len([f for f in files if f.startswith("events.out.tfevents")]) == 1, files
    steps = sorted(int(m.group(1)) for m in (re.match(r"model\.ckpt-(\d+)\.index$", f) for f in files) if m)
    assert steps == [0, 2, 4], files
    dumps = load_dumps(trained["out"], 2)
    assert [int(d["global_step"]) for d in dumps] == [4, 4]
    # The model-parallel table: split across the ranks, saved whole.
    assert all(len(d["user_keys"]) > 0 for d in dumps)
    assert_partitioned(dumps, checkpoint_table(model_dir, "user"))
    # The data-parallel table and the dense weight: the same on every rank, saved as is.
    assert_tables_equal(table_of(dumps[1], "item"), table_of(dumps[0], "item"), "item replicas")
    assert_tables_equal(checkpoint_table(model_dir, "item", 1), table_of(dumps[0], "item"), "item checkpoint")
    np.testing.assert_array_equal(dumps[0]["w"], dumps[1]["w"])


def test_single_process_restores_every_key(trained, tmp_path):
    """A plain tf_ext.get_dynamic_embedding in one process (no Horovod) reads the distributed checkpoint."""
    out = str(tmp_path)
    text = single_process("restore", "--model-dir", trained["model_dir"], "--out", out)
    assert "RANK 0 RESTORED" in text
    single = load_dumps(out, 1)[0]
    dumps = load_dumps(trained["out"], 2)
    assert_partitioned(dumps, table_of(single, "user"))
    assert_tables_equal(table_of(single, "item"), table_of(dumps[0], "item"), "item")
    np.testing.assert_array_equal(single["w"], dumps[0]["w"])


def test_rank0_evaluates_the_distributed_checkpoint_as_one_process(trained, tmp_path):
    """Inside single_process() rank 0 evaluates with the whole table: the loss of a plain single process."""
    model_dir = tmp_path / "model"
    subprocess.run(["cp", "-r", trained["model_dir"], str(model_dir)], check=True)
    text = run_worker(2, "evaluate", "--model-dir", model_dir)
    got = re.findall(r"EVAL step=4 loss=(\S+)", text)
    assert len(got) == 1, text[-4000:]  # rank 0 only
    want = re.findall(r"EVAL step=4 loss=(\S+)", single_process("evaluate", "--model-dir", model_dir))
    assert got == want, (got, want)


@pytest.mark.parametrize("ranks", [1, 4])
def test_restore_at_another_rank_count_repartitions(trained, tmp_path, ranks):
    """2 ranks -> 1 or 4: every key lands on its new owner once, with its row and optimizer slots."""
    text = run_worker(ranks, "restore", "--model-dir", trained["model_dir"], out=tmp_path)
    for r in range(ranks):
        assert "RANK %d RESTORED" % r in text, text[-4000:]
    dumps = load_dumps(str(tmp_path), ranks)
    assert_partitioned(dumps, checkpoint_table(trained["model_dir"], "user"))
    for d in dumps:
        assert_tables_equal(table_of(d, "item"), checkpoint_table(trained["model_dir"], "item", 1), "item")


def test_half_rows_restore_at_another_rank_count(tmp_path):
    """Embeddings stored in bf16 trained on 2 ranks, restored on 3: every key of the model-parallel table lands on
    its new owner once, and both tables hold the checkpoint's rows (bf16 values) and slots exactly."""
    model_dir = tmp_path / "model"
    run_worker(2, "train", "--model-dir", model_dir, "--max-steps", 2, "--value-dtype", "bfloat16")
    text = run_worker(3, "restore", "--model-dir", model_dir, "--value-dtype", "bfloat16", out=tmp_path / "three")
    for r in range(3):
        assert "RANK %d RESTORED" % r in text, text[-4000:]
    dumps = load_dumps(str(tmp_path / "three"), 3)
    user = checkpoint_table(str(model_dir), "user")
    assert len(user) > 10
    values = np.array([v for v, _ in user.values()], np.float32)
    assert not (values.view(np.uint32) & 0xFFFF).any()  # bf16 values: float32s whose low 16 bits are zero
    assert_partitioned(dumps, user)
    for d in dumps:
        assert_tables_equal(table_of(d, "item"), checkpoint_table(str(model_dir), "item", 1), "item")


def test_restart_with_the_same_rank_count_continues_exactly(tmp_path):
    """Training 3 steps, stopping, and training 3 more equals 6 uninterrupted steps (tables, slots, weights)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_worker(2, "train", "--model-dir", straight, "--max-steps", 6, out=tmp_path / "straight_out")
    run_worker(2, "train", "--model-dir", resumed, "--max-steps", 3, out=tmp_path / "first_half")
    assert sorted(f for f in os.listdir(resumed) if f.endswith(".index"))[-1] == "model.ckpt-3.index"
    run_worker(2, "train", "--model-dir", resumed, "--max-steps", 6, out=tmp_path / "resumed_out")
    want, got = load_dumps(str(tmp_path / "straight_out"), 2), load_dumps(str(tmp_path / "resumed_out"), 2)
    for r in range(2):
        assert int(got[r]["global_step"]) == 6
        for name in ("user", "item"):
            assert_tables_equal(table_of(got[r], name), table_of(want[r], name), "rank %d %s" % (r, name))
        np.testing.assert_array_equal(got[r]["w"], want[r]["w"])


def test_training_goes_on_at_another_rank_count(trained, tmp_path):
    """A 2-rank checkpoint trained on by 1 rank, then by 2 ranks again: the keys stay whole and unique."""
    model_dir = tmp_path / "model"
    subprocess.run(["cp", "-r", trained["model_dir"], str(model_dir)], check=True)
    text = run_worker(1, "train", "--model-dir", model_dir, "--max-steps", 6, out=tmp_path / "one")
    assert "RANK 0 TRAINED step=6" in text, text[-4000:]
    one = load_dumps(str(tmp_path / "one"), 1)[0]
    assert set(table_of(one, "user")) >= set(checkpoint_table(trained["model_dir"], "user"))
    assert_tables_equal(checkpoint_table(str(model_dir), "user"), table_of(one, "user"), "1-rank checkpoint")
    text = run_worker(2, "train", "--model-dir", model_dir, "--max-steps", 8, out=tmp_path / "two")
    assert "RANK 1 TRAINED step=8" in text, text[-4000:]
    assert_partitioned(load_dumps(str(tmp_path / "two"), 2), checkpoint_table(str(model_dir), "user"))


def test_exported_saved_model_serves_every_key_in_a_plain_process(trained):
    """Rank 0's SavedModel holds the whole model-parallel table; a process that imports only tensorflow_ext
    serves it (no Horovod op in the graph)."""
    assert "RANK 0 EXPORTED" in trained["log"] and "RANK 1 EXPORTED None" in trained["log"]
    (version,) = os.listdir(trained["export"])
    table = checkpoint_table(trained["model_dir"], "user")
    keys = np.array(sorted(table), np.int64)
    np.save(os.path.join(trained["export"], "keys.npy"), keys)
    script = textwrap.dedent(
        """
        import sys
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext  # registers the ops
        export, keys = sys.argv[1], np.load(sys.argv[2])
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export)
            sig = meta.signature_def["serving_default"]
            ops = {n.op for n in sess.graph.as_graph_def().node}
            assert not any(o.startswith("Horovod") for o in ops), sorted(o for o in ops if "Horovod" in o)
            rows = sess.run(sig.outputs["user_rows"].name, {
                sig.inputs["user"].name: np.stack([keys, keys], 1),
                sig.inputs["item"].name: np.zeros([len(keys), 1], np.int64)})
        np.save(sys.argv[3], rows[:, 0, :])
        print("SERVED", len(keys), "horovod" in sys.modules)
    """
    )
    out = os.path.join(trained["export"], "rows.npy")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            os.path.join(trained["export"], version),
            os.path.join(trained["export"], "keys.npy"),
            out,
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, r.stderr[-6000:]
    assert "SERVED %d False" % len(keys) in r.stdout, r.stdout
    np.testing.assert_array_equal(np.load(out), np.stack([table[int(k)][0] for k in keys]))


def test_monitored_training_session_recipe(tmp_path):
    """The MonitoredTrainingSession recipe of docs/distributed.md: rank 0 writes every checkpoint, with every key."""
    script = tmp_path / "mts.py"
    script.write_text(
        textwrap.dedent(
            """
        import sys
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd

        tfe_hvd.init()
        model_dir = sys.argv[1]

        def element(i):
            return tf.random.stateless_uniform([4], seed=tf.stack([i, 0]), maxval=50, dtype=tf.int64)

        with tf.Graph().as_default(), tf.compat.v1.Session() as s:  # the ids of the 10 elements 5 steps read
            print("DISTINCT IDS", len(set(s.run(tf.map_fn(element, tf.range(10, dtype=tf.int64))).ravel())))

        ids = tfe_hvd.synchronized_next(tfe_hvd.input_shard(tf.data.Dataset.range(100).map(element)))
        emb = tfe_hvd.get_dynamic_embedding("user", 4, parallelism="model")
        loss = tf.reduce_sum(tf.square(tf_ext.embedding_lookup(emb, ids) - 1.0))
        gs = tf.compat.v1.train.get_or_create_global_step()
        opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        train_op = opt.minimize(loss, global_step=gs)
        hooks = tfe_hvd.training_hooks(model_dir=model_dir, save_checkpoints_steps=2)
        hooks.append(tf.compat.v1.train.StopAtStepHook(last_step=5))
        first = tfe_hvd.rank() == 0
        with tf.compat.v1.train.MonitoredTrainingSession(
                checkpoint_dir=model_dir, hooks=hooks, save_checkpoint_secs=None, save_checkpoint_steps=None,
                save_summaries_steps=100 if first else None, log_step_count_steps=100 if first else None) as sess:
            while not sess.should_stop():
                sess.run(train_op)
        print("RANK %d DONE" % tfe_hvd.rank())
    """
        )
    )
    code, out = horovodrun(2, str(script), str(tmp_path / "m"), cwd=str(tmp_path))
    assert code == 0 and "RANK 0 DONE" in out and "RANK 1 DONE" in out, out[-6000:]
    files = os.listdir(tmp_path / "m")
    assert sorted(f for f in files if f.endswith(".index")) == ["model.ckpt-%d.index" % s for s in (0, 2, 4, 5)]
    assert len([f for f in files if f.startswith("events.out.tfevents")]) == 1, files
    table = checkpoint_table(str(tmp_path / "m"), "user", num_shards=1)
    assert "DISTINCT IDS %d" % len(table) in out, (len(table), out[-3000:])
