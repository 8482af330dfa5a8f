"""A rank killed with Top-K compression on: the job stops in bounded time, and a restart from the last checkpoint
resumes every rank from its own residuals, so it goes on exactly as a job that was never interrupted; at another
rank count the residuals are redistributed (2 ranks -> 1: dropped; 1 -> 2: start at zero) with a warning.

The worker is estimator_worker.py (Estimator, training hooks, checkpoints every 2 steps) with Top-K on through the
environment: 25% of every gradient with at least one entry (the dense weight w has 8).
"""

import os
import shutil

import numpy as np
import pytest

from tensorflow_ext.horovod.tests.test_estimator import assert_tables_equal
from tensorflow_ext.horovod.tests.test_estimator import load_dumps
from tensorflow_ext.horovod.tests.test_estimator import run_worker
from tensorflow_ext.horovod.tests.test_estimator import table_of
from tensorflow_ext.horovod.tests.test_failures import BOUND_S
from tensorflow_ext.horovod.tests.test_failures import timed_run
from tensorflow_ext.horovod.tests.test_helpers import run as run_code

TOPK_ENV = {"TF_EXT_HVD_TOPK_RATIO": "0.25", "TF_EXT_HVD_TOPK_MIN_ELEMENTS": "1"}


def residuals(dump):
    """{residual variable name: value} of a worker dump."""
    return {k[len("residual:") :].replace("|", "/"): v for k, v in dump.items() if k.startswith("residual:")}


def checkpoint(model_dir, step):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf.train.load_checkpoint(os.path.join(str(model_dir), "model.ckpt-%d" % step))


def start_dumps(out, ranks):
    return [dict(np.load(os.path.join(str(out), "rank%d_start.npz" % r))) for r in range(ranks)]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """An uninterrupted 2-rank run to step 6, and a run whose rank 1 dies after step 5 (checkpoint at step 4)."""
    env = pytest.MonkeyPatch()
    for k, v in TOPK_ENV.items():
        env.setenv(k, v)
    base = tmp_path_factory.mktemp("killed")
    straight = run_worker(2, "train", "--model-dir", base / "straight", "--max-steps", 6, out=base / "straight_out")
    code, out, elapsed = timed_run(
        2,
        "train",
        "--model-dir",
        base / "killed",
        "--max-steps",
        6,
        "--die-at-step",
        5,
        since="RANK 1 EXITS AT STEP",
    )
    yield {"base": base, "env": env, "straight_log": straight, "code": code, "out": out, "elapsed": elapsed}
    env.undo()


def test_killed_rank_stops_the_job_with_topk(killed):
    code, out, elapsed = killed["code"], killed["out"], killed["elapsed"]
    assert "RANK 1 EXITS AT STEP 5" in out, out[-4000:]
    assert code != 0 and "Exit code: 3" in out, out[-4000:]
    assert elapsed < BOUND_S, elapsed
    assert sorted(f for f in os.listdir(killed["base"] / "killed") if f.endswith(".index"))[-1] == "model.ckpt-4.index"
    print("job ended %.1f s after rank 1 exited" % elapsed)


def test_checkpoint_holds_each_ranks_residuals(killed):
    """`<name>/by_rank` holds both ranks' residuals (they differ: each rank's own gradients), `<name>` their mean."""
    reader = checkpoint(killed["base"] / "killed", 4)
    names = [k[: -len("/by_rank")] for k in reader.get_variable_to_shape_map() if k.endswith("/by_rank")]
    assert any(n.startswith("w/") for n in names), names
    for n in names:
        by_rank = reader.get_tensor(n + "/by_rank")
        assert by_rank.shape[0] == 2, (n, by_rank.shape)
        assert np.abs(by_rank).sum() > 0 and not np.array_equal(by_rank[0], by_rank[1]), (n, by_rank)
        np.testing.assert_allclose(reader.get_tensor(n), by_rank.mean(axis=0), rtol=1e-6, err_msg=n)


def test_restart_resumes_each_ranks_residuals_and_trains_as_uninterrupted(killed):
    base = killed["base"]
    reader = checkpoint(base / "killed", 4)
    run_worker(2, "train", "--model-dir", base / "killed", "--max-steps", 6, out=base / "resumed_out")
    start, got = start_dumps(base / "resumed_out", 2), load_dumps(str(base / "resumed_out"), 2)
    want = load_dumps(str(base / "straight_out"), 2)
    for r in range(2):
        assert int(start[r]["global_step"]) == 4
        res = residuals(start[r])
        assert res, sorted(start[r])
        for name, value in res.items():
            np.testing.assert_array_equal(
                value, reader.get_tensor(name + "/by_rank")[r], err_msg="rank %d %s" % (r, name)
            )
        assert int(got[r]["global_step"]) == 6
        np.testing.assert_array_equal(got[r]["w"], want[r]["w"], err_msg="rank %d w" % r)
        for name, value in residuals(want[r]).items():
            np.testing.assert_array_equal(residuals(got[r])[name], value, err_msg="rank %d %s" % (r, name))
        for name in ("user", "item"):
            assert_tables_equal(table_of(got[r], name), table_of(want[r], name), "rank %d %s" % (r, name))


def test_residuals_at_another_rank_count(killed, tmp_path):
    """2 ranks -> 1: one rank sends its whole gradient (no residuals): the saved ones are dropped, with a warning.
    1 rank -> 2: the checkpoint holds none: every rank starts at zero, with a warning, and the 2-rank job's own
    checkpoints then hold each rank's."""
    model_dir = tmp_path / "m"
    shutil.copytree(killed["base"] / "killed", model_dir)  # at step 4, or 6 once the restart test ran
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    step = int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])
    text = run_worker(1, "train", "--model-dir", model_dir, "--max-steps", step + 1, out=tmp_path / "one")
    assert "holds the Top-K residuals of" in text and "they are dropped" in text, text[-4000:]
    (one,) = load_dumps(str(tmp_path / "one"), 1)
    assert int(one["global_step"]) == step + 1 and not residuals(one), sorted(one)
    text = run_worker(2, "train", "--model-dir", model_dir, "--max-steps", step + 3, out=tmp_path / "two")
    assert "holds no per-rank Top-K residuals" in text and "start at zero" in text, text[-4000:]
    start = start_dumps(tmp_path / "two", 2)
    for r in range(2):
        assert int(start[r]["global_step"]) == step + 1
        assert residuals(start[r]), sorted(start[r])
        for name, value in residuals(start[r]).items():
            assert not value.any(), (r, name, value)
    reader = checkpoint(model_dir, step + 3)
    end = load_dumps(str(tmp_path / "two"), 2)
    for name in residuals(end[0]):
        for r in range(2):
            np.testing.assert_array_equal(reader.get_tensor(name + "/by_rank")[r], residuals(end[r])[name])


def test_restore_takes_the_own_row_or_the_mean_of_another_rank_count(tmp_path):
    """One process (rank 0 of 1): a checkpoint of 1 rank gives row 0; one of 3 ranks gives the mean of the rows."""
    out = run_code(
        """
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import residual_checkpoint
        tfe_hvd.init()
        rows = np.arange(12, dtype=np.float32).reshape(3, 2, 2) ** 2
        for saved in (rows[:1], rows):
            prefix = "%s/ckpt%d" % (DIR, len(saved))
            with tf.Graph().as_default():
                plain = tf.compat.v1.get_variable("w/r", initializer=saved.mean(axis=0))
                by_rank = tf.compat.v1.get_variable("w/r/by_rank", initializer=saved)
                with tf.compat.v1.Session() as s:
                    s.run(tf.compat.v1.global_variables_initializer())
                    tf.compat.v1.train.Saver([plain, by_rank]).save(s, prefix)
            with tf.Graph().as_default():
                v = tf.compat.v1.get_variable("w/r", initializer=tf.zeros([2, 2]))
                saver = tf.compat.v1.train.Saver([residual_checkpoint.RankResidualSaveable(v)])
                with tf.compat.v1.Session() as s:
                    saver.restore(s, prefix)
                    print(len(saved), s.run(v).ravel().tolist())
        print("mean", rows.mean(axis=0).ravel().tolist())
    """.replace(
            "DIR", repr(str(tmp_path))
        )
    ).splitlines()
    assert out[0] == "1 [0.0, 1.0, 4.0, 9.0]", out
    assert out[1] == "3 " + out[2][len("mean ") :], out


def test_install_saver_replaces_only_the_default_saver(tmp_path):
    """The Estimator's default Saver (deferred, no var_list) is replaced by one with the per-rank saveables and the
    same retention; a Saver the user built is left alone, with a warning."""
    out = run_code(
        """
        import logging
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import residual_checkpoint
        from tensorflow_ext.horovod.config import TOPK_RESIDUALS
        tfe_hvd.init()
        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record: warnings.append(record.getMessage())
        tf.get_logger().addHandler(handler)

        def graph(saver=None):
            g = tf.Graph()
            with g.as_default():
                w = tf.compat.v1.get_variable("w", initializer=tf.ones([3]))
                r = tf.compat.v1.get_variable("w/r", initializer=tf.zeros([3]), trainable=False)
                tf.compat.v1.add_to_collection(TOPK_RESIDUALS, r)
                if saver == "default":
                    tf.compat.v1.add_to_collection(
                        tf.compat.v1.GraphKeys.SAVERS,
                        tf.compat.v1.train.Saver(sharded=True, max_to_keep=7, defer_build=True),
                    )
                elif saver == "own":
                    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, tf.compat.v1.train.Saver([w, r]))
            return g

        for kind in (None, "default", "own"):
            g = graph(kind)
            before = g.get_collection(tf.compat.v1.GraphKeys.SAVERS)
            savers = residual_checkpoint.install_saver(g, None)
            (saver,) = g.get_collection(tf.compat.v1.GraphKeys.SAVERS)
            with g.as_default(), tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                path = saver.save(s, "%s/ckpt_%s" % (DIR, kind))
            keys = sorted(tf.train.load_checkpoint(path).get_variable_to_shape_map())
            print(kind, len(savers.saveables), savers.save_saver, saver in before, saver.saver_def.max_to_keep, keys)
        print("warned", any("has its own Saver" in w for w in warnings))
    """.replace(
            "DIR", repr(str(tmp_path))
        )
    ).splitlines()
    assert out == [
        "None 1 None False 5 ['w', 'w/r', 'w/r/by_rank']",
        "default 1 None False 7 ['w', 'w/r', 'w/r/by_rank']",
        "own 0 None True 5 ['w', 'w/r']",
        "warned True",
    ], out
