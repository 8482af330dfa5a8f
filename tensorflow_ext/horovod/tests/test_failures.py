"""Failures under horovodrun end the job with a clear error in bounded time, never a hang.

A rank that dies, ranks that built different models, uneven input, and a checkpoint schedule that cannot be
synchronized.
"""

import glob
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tensorflow_ext.horovod.tests.test_horovod import HOROVODRUN
from tensorflow_ext.horovod.tests.test_horovod import ROOT
from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "estimator_worker.py")
BOUND_S = 120  # a job must end within this after its failure shows (it takes seconds; a hang takes forever)


def timed_horovodrun(ranks, script, *args, since, cwd=None):
    """horovodrun(ranks, script, *args), its output streamed; returns (returncode, output, elapsed).

    elapsed: seconds from the first output line that contains `since` (the failure the job must end after) to the
    end of the job; None when no line contains it. It leaves out the ranks' start-up (importing TensorFlow, building
    the model), which a busy machine stretches at will; the run as a whole is guarded by TIMEOUT_S against a hang.
    """
    cmd = [HOROVODRUN, "-np", str(ranks), "--gloo", "-H", "localhost:%d" % ranks, sys.executable, script]
    proc = subprocess.Popen(
        cmd + [str(a) for a in args],
        env=_env(),
        cwd=cwd or ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, seen = [], []

    def read():
        for line in proc.stdout:
            if not seen and since in line:
                seen.append(time.monotonic())
            lines.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        code = proc.wait(timeout=TIMEOUT_S)
        ended = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join()
    return code, "".join(lines), (ended - seen[0]) if seen else None


def timed_run(ranks, *args, since):
    return timed_horovodrun(ranks, WORKER, *args, since=since)


def test_a_rank_that_dies_stops_the_job(tmp_path):
    """Rank 1 exits with status 3 after step 3: horovodrun ends the job with a non-zero status, quickly."""
    code, out, elapsed = timed_run(
        2, "train", "--model-dir", tmp_path / "m", "--max-steps", 50, "--die-at-step", 3, since="RANK 1 EXITS AT STEP"
    )
    assert "RANK 1 EXITS AT STEP 3" in out, out[-4000:]
    assert code != 0, out[-4000:]
    assert "Exit code: 3" in out, out[-4000:]
    assert elapsed < BOUND_S, elapsed
    print("job ended %.1f s after rank 1 exited" % elapsed)


def test_ranks_with_different_models_fail_before_the_first_step(tmp_path):
    """The Estimator hooks compare the ranks' configurations before any step or checkpoint collective. One job whose
    rank 1 differs in three ways: the message names each."""
    expected = [
        "dynamic embedding 'user': dim differs across ranks: rank 0: 4, rank 1: 8",
        "dynamic embedding 'user': optimizer slots differs across ranks: rank 0: "
        "AdagradOptimizer[accumulator], rank 1: AdamOptimizer[m,v]",
        "dynamic embedding 'user': parallelism differs across ranks: rank 0: model(2 ranks), rank 1: data",
    ]
    code, out, elapsed = timed_run(
        2,
        "train",
        "--model-dir",
        tmp_path / "m",
        "--max-steps",
        4,
        "--rank1",
        "dim=8,optimizer=Adam,parallelism=data",
        since="the ranks built different models",
    )
    assert code != 0, out[-4000:]
    assert "the ranks built different models" in out, out[-6000:]
    for problem in expected:
        assert problem in out, (problem, out[-6000:])
    assert "TRAINED" not in out and not os.path.exists(tmp_path / "m" / "checkpoint"), out[-4000:]
    assert elapsed < BOUND_S, elapsed


def test_mismatch_is_caught_in_the_step_without_hooks(tmp_path):
    """A plain Session (no hooks, no broadcast): the check runs before the step's first collective."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd
        tfe_hvd.init()
        dim = 4 if tfe_hvd.rank() == 0 else 6
        emb = tfe_hvd.get_dynamic_embedding("e", dim, parallelism="model", initializer=0.1)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2, 3], tf.int64)))
        train = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1)).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            try:
                sess.run(train)
                print("NOT CAUGHT", flush=True)
            except tf.errors.InvalidArgumentError as e:
                print("CAUGHT %d: %s" % (tfe_hvd.rank(), " ".join(e.message.splitlines())), flush=True)
    """
        )
    )
    code, out, elapsed = timed_horovodrun(2, str(script), cwd=str(tmp_path), since="CAUGHT")
    assert code == 0, out[-4000:]
    for r in (0, 1):
        assert "CAUGHT %d" % r in out, out[-4000:]
    assert "dynamic embedding 'e': dim differs across ranks: rank 0: 4, rank 1: 6" in out, out[-4000:]
    assert elapsed < BOUND_S, elapsed


@pytest.mark.parametrize("elements,rank1,steps", [(7, "", 3), (10, "elements=2", 1)])
def test_uneven_input_stops_every_rank_at_the_same_step(tmp_path, elements, rank1, steps):
    """Shards of 4 and 3 elements (or 5 and 1): every rank stops after the shortest shard, with a checkpoint."""
    args = ["train", "--model-dir", tmp_path / "m", "--elements", elements, "--out", tmp_path]
    if rank1:
        args += ["--rank1", rank1]
    # A rank left waiting in a collective would hang the job: horovodrun's TIMEOUT_S guards against that.
    code, out = horovodrun(2, WORKER, *[str(a) for a in args])
    assert code == 0, out[-6000:]
    for r in (0, 1):
        assert "RANK %d TRAINED step=%d" % (r, steps) in out, out[-4000:]
    assert os.path.exists(tmp_path / "m" / ("model.ckpt-%d.index" % steps))


def test_time_based_checkpoints_are_refused_with_model_parallel_embeddings(tmp_path):
    r = subprocess.run(
        [sys.executable, WORKER, "train", "--model-dir", str(tmp_path / "m"), "--max-steps", "2", "--save-secs", "30"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode != 0
    assert (
        "save_checkpoints_secs=30 cannot be used with model-parallel dynamic embeddings (user)" in r.stderr
        and "Use save_checkpoints_steps" in r.stderr
    ), r.stderr[-4000:]


def test_time_based_checkpoints_work_with_data_parallel_embeddings(tmp_path):
    args = ["train", "--model-dir", str(tmp_path / "m"), "--max-steps", "3", "--save-secs", "600"]
    code, out = horovodrun(2, WORKER, *args, "--parallelism", "data")
    assert code == 0, out[-6000:]
    assert "RANK 1 TRAINED step=3" in out
    assert os.path.exists(tmp_path / "m" / "model.ckpt-3.index")


def test_a_run_config_that_writes_on_every_rank_is_refused(tmp_path):
    """A plain RunConfig on rank 1 would write checkpoints and summaries there too: a clear error, not a race."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        tfe_hvd.init()
        try:
            tfe_hvd.training_hooks(tf.estimator.RunConfig("model", save_checkpoints_steps=10))
            print("RANK %d ACCEPTED" % tfe_hvd.rank(), flush=True)
        except ValueError as e:
            print("RANK %d REFUSED: %s" % (tfe_hvd.rank(), e), flush=True)
    """
        )
    )
    code, out = horovodrun(2, str(script), cwd=str(tmp_path))
    assert code == 0, out[-4000:]
    assert "RANK 0 ACCEPTED" in out, out[-4000:]
    assert (
        "RANK 1 REFUSED: training_hooks: the RunConfig of rank 1 writes checkpoints or summaries "
        "(save_checkpoints_steps=10, save_checkpoints_secs=None, save_summary_steps=100)"
    ) in out, out[-4000:]


def test_ranks_that_restore_different_checkpoints_are_stopped(tmp_path):
    """Rank 1 sees another model_dir (no shared filesystem): an error naming each rank's step, before training."""
    first = horovodrun(2, WORKER, "train", "--model-dir", str(tmp_path / "a"), "--max-steps", "2")
    assert first[0] == 0, first[1][-4000:]
    code, out, elapsed = timed_run(
        2,
        "train",
        "--model-dir",
        tmp_path / "a",
        "--rank1",
        "model_dir=%s" % (tmp_path / "b"),
        "--max-steps",
        4,
        since="ranks are at different global steps",
    )
    assert code != 0, out[-4000:]
    assert "ranks are at different global steps after restoring: rank 0: 2, rank 1: 0" in out, out[-4000:]
    assert "same model_dir" in out and "TRAINED" not in out, out[-4000:]
    assert elapsed < BOUND_S, elapsed


CTR_WORKER = os.path.join(HERE, "ctr_worker.py")
CTR_FLAGS = ["--distributed", "model_parallel", "--quick", "--fresh", "--steps", "4", "--batch_size", "64"]
CTR_FLAGS += ["--eval_steps", "1", "--no_export", "--quiet"]


def test_main_job_with_settings_on_one_rank_is_refused_before_the_first_step(tmp_path):
    """Settings that change the collectives, given to one rank only (admission, checkpoint cadence, compression):
    every rank stops with a message naming each of them and both values, before any step or checkpoint (each used to
    hang in a collective the other rank never ran). One job for the three: the message lists every difference."""
    model_dir = tmp_path / "m"
    rank1 = ["--save_checkpoints_steps", "20", "--rank1-env", "TF_EXT_HVD_COMPRESSION=fp16"]
    rank1 += ["--rank1", "--admission", "2", "--save_checkpoints_steps", "30"]
    code, out = horovodrun(2, CTR_WORKER, *CTR_FLAGS, "--model_dir", str(model_dir), *rank1)
    assert code != 0, out[-6000:]
    assert "the ranks built different models" in out, out[-6000:]
    for expected in (
        "admission differs across ranks: rank 0: none, rank 1: CountAdmission",
        "checkpoint schedule: save_checkpoints_steps differs across ranks: rank 0: 20, rank 1: 30",
        "compression differs across ranks: rank 0: none, rank 1: fp16",
    ):
        assert expected in out, (expected, out[-6000:])
    assert "<stdout>:{" not in out, out[-4000:]  # no summary: no rank trained
    assert not glob.glob(str(model_dir / "model.ckpt-*")), os.listdir(model_dir)
