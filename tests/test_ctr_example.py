"""The CTR example (python -m tensorflow_ext.examples.ctr) in --quick mode, in subprocesses."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PREFIX = ["-m", "tensorflow_ext.examples.ctr"]


def _run_ctr(*args, timeout=900):
    """Runs the example as a user does; returns (JSON summary, stderr, stdout).

    timeout: a guard against a hang only, never what decides pass or fail (a --quick run takes about 40 s on a busy
    2-core machine, and a loaded CI machine may take several times as long).
    """
    env = dict(os.environ, PYTHONPATH=REPO)
    # What a user sees by default: no TF logging settings inherited from the test run.
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    proc = subprocess.run(
        [sys.executable] + _PREFIX + list(args),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
        universal_newlines=True,
    )
    assert proc.returncode == 0, "ctr failed:\nSTDOUT:\n%s\nSTDERR:\n%s" % (proc.stdout[-3000:], proc.stderr[-6000:])
    lines = [l for l in proc.stdout.splitlines() if l.strip()]
    summary = json.loads(lines[-1])
    return summary, proc.stderr, proc.stdout


def _scalar_series(model_dir, tag):
    """[(step, value)] of a scalar summary in the training event files of model_dir."""
    import tensorflow as tf

    out = []
    for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    out.append((event.step, value.simple_value))
    return sorted(out)


def _events(model_dir):
    return glob.glob(os.path.join(model_dir, "**", "events.out.tfevents.*"), recursive=True)


def test_quick_synthetic_trains_then_continues(tmp_path):
    model_dir = str(tmp_path / "ctr")
    s1, log, out = _run_ctr("--quick", "--model_dir", model_dir)
    assert s1["model"] == "deepfm" and s1["data"] == "synthetic"
    assert s1["start_step"] == 0 and s1["global_step"] == s1["steps"] > 0
    assert s1["auc"] > 0.6, s1
    assert s1["auc"] <= s1["oracle_auc"] + 0.02, s1
    assert s1["steps_per_sec"] > 0
    # The default output is the example's own: progress, eval metrics, where things went,
    # the JSON summary; none of TensorFlow's deprecation warnings or INFO log.
    lines = [l for l in (log + out).splitlines() if l.strip()]
    assert len(lines) < 25, "\n".join(lines)
    assert not [l for l in lines if "deprecat" in l.lower()], "\n".join(lines)
    assert not [l for l in lines if "WARNING" in l or "INFO:" in l], "\n".join(lines)
    assert out.strip().count("\n") == 0  # stdout: the JSON summary only
    progress = [l for l in lines if l.startswith("ctr: step ")]
    assert len(progress) == 2, "\n".join(lines)  # --quick: 100 steps, every 50
    assert "loss" in progress[-1] and "steps/s" in progress[-1] and "table keys" in progress[-1]
    assert "ctr: eval: AUC %.4f" % s1["auc"] in log
    assert "ctr: checkpoint: %s" % s1["checkpoint"] in log
    assert "tensorboard --logdir %s" % model_dir in log
    # Summaries and checkpoints are written.
    assert glob.glob(os.path.join(model_dir, "model.ckpt-%d.index" % s1["global_step"]))
    assert _events(model_dir) and glob.glob(os.path.join(model_dir, "eval", "events.*"))
    assert len(s1["table_sizes"]) == 26, s1["table_sizes"]
    assert s1["total_keys"] == sum(s1["table_sizes"].values()) > 1000
    # The checkpoint holds the tables (keys, values, optimizer slots).
    import tensorflow as tf

    ckpt = dict(tf.train.list_variables(model_dir))
    prefix = "embeddings/input_layer/C1_emb/embedding_weights/part_0"
    assert ckpt[prefix + "-keys"] == [s1["table_sizes"]["C1_emb"]]
    assert ckpt[prefix + "-slots"] == [s1["table_sizes"]["C1_emb"], 5]  # Adagrad, dim 4 + 1
    # The library's summaries (tf_ext.embedding.add_summaries) are in the training events.
    table = "tf_ext/embeddings/input_layer/C1_emb/embedding_weights/"
    sizes = _scalar_series(model_dir, table + "size")
    mems = dict(_scalar_series(model_dir, table + "memory_bytes"))
    per_key = dict(_scalar_series(model_dir, table + "bytes_per_key"))
    assert len(sizes) >= 2, sizes
    assert all(a[1] <= b[1] for a, b in zip(sizes, sizes[1:])), sizes  # tables only grow
    assert 0 < sizes[-1][1] <= s1["table_sizes"]["C1_emb"]
    for step, size in sizes:
        assert mems[step] >= size * (8 + 4 * 5), (step, size, mems[step])  # key + 5 floats
        if size:
            assert per_key[step] == pytest.approx(mems[step] / size, rel=1e-3)

    # Day two: same model_dir -> continues from the checkpoint on new data.
    s2, log2, out2 = _run_ctr("--quick", "--model_dir", model_dir, "--quiet", "--steps", "30", "--eval_steps", "3")
    assert "ctr:" not in log2 and "deprecat" not in log2.lower()  # --quiet: only the JSON
    assert out2.strip().count("\n") == 0
    assert s2["start_step"] == s1["global_step"]
    assert s2["global_step"] == s1["global_step"] + s2["steps"]
    assert s2["auc"] > 0.6, s2
    # 30 fresh steps alone would make far fewer keys than the 100 restored ones.
    assert s2["total_keys"] >= s1["total_keys"]


def test_refuses_checkpoint_of_another_shape(tmp_path):
    from tensorflow_ext.examples.ctr import checkpoints

    cfg = dict(model="deepfm", dim=4, hidden="64,32", optimizer="adagrad", num_shards=1, string_ids=False)
    checkpoints.check_model_dir_config(str(tmp_path), cfg, has_checkpoint=False)
    checkpoints.check_model_dir_config(str(tmp_path), dict(cfg), has_checkpoint=True)  # same: fine
    with pytest.raises(SystemExit, match=r"--dim 4 \(checkpoint\) vs 6 \(now\)"):
        checkpoints.check_model_dir_config(str(tmp_path), dict(cfg, dim=6), has_checkpoint=True)
    # Without a checkpoint, any shape may start over in the directory.
    checkpoints.check_model_dir_config(str(tmp_path), dict(cfg, dim=6), has_checkpoint=False)


def test_tsv_data(tmp_path):
    from tensorflow_ext.examples import synthetic

    path = str(tmp_path / "day0.tsv")
    synthetic.CriteoLikeStream(seed=3, max_ids=5000).write_tsv(path, 2000)
    with open(path) as f:
        first = f.readline().rstrip("\n").split("\t")
    assert len(first) == 40 and first[0] in ("0", "1")
    s, log, _ = _run_ctr(
        "--quick", "--verbose", "--data", path, "--model_dir", str(tmp_path / "m"), "--batch_size", "256"
    )
    # --verbose gives TensorFlow's own logs back, deprecation warnings included.
    assert "is deprecated" in log and "INFO:tensorflow:" in log, log[-3000:]
    assert "ctr: eval: AUC" in log
    assert s["model"] == "deepfm" and s["data"] == path
    # ~90% of 2000 lines for training in batches of 256.
    assert 6 <= s["global_step"] <= 8, s
    assert 0.0 <= s["auc"] <= 1.0 and np.isfinite(s["logloss"])
    assert len(s["table_sizes"]) == 26
    assert s["total_keys"] > 1000


def test_wide_deep_model_fn_in_process():
    """The Wide&Deep model_fn (52 tables: 26 wide dim-1, 26 deep), here with Ftrl."""
    import tensorflow as tf
    from tensorflow_ext.embedding import creation
    from tensorflow_ext.examples import ctr, synthetic

    params = dict(
        model="wide_deep",
        dim=2,
        hidden_units=[8],
        optimizer="ftrl",
        learning_rate=0.05,
        num_shards=1,
        string_ids=False,
        init_stddev=0.05,
        log_every=1000,
        batch_size=64,
    )
    with tf.Graph().as_default():
        ds = synthetic.CriteoLikeStream(max_ids=1000).dataset(64, 4)
        features, labels = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        spec = ctr.model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, params)
        embs = creation.get_dynamic_embeddings()
        assert len(embs) == 52
        assert sorted(e.dim for e in embs) == [1] * 26 + [2] * 26
        total = tf.add_n([e.size() for e in embs])
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=spec.training_hooks) as sess:
            losses = [sess.run([spec.train_op, spec.loss])[1] for _ in range(3)]
            keys = sess.run(total)
    assert np.all(np.isfinite(losses)) and keys > 100


def test_flags():
    from tensorflow_ext.examples import ctr

    a = ctr.parse_args(["--quick"])
    assert a.steps == 100 and a.model == "deepfm" and a.optimizer == "adagrad"
    assert a.learning_rate == 0.5 and a.hidden_units == [64, 32]
    a = ctr.parse_args(["--optimizer", "adam", "--hidden", "8,4", "--steps", "7"])
    assert a.learning_rate == 0.001 and a.hidden_units == [8, 4] and a.steps == 7
    for bad in (
        ["--data", "/nonexistent/*.tsv"],
        ["--model", "lr"],
        ["--hidden", "a,b"],
        ["--batch_size", "0"],
        ["--quiet", "--verbose"],
    ):
        with pytest.raises(SystemExit) as e:
            ctr.parse_args(bad)
        assert e.value.code == 2


def test_row_storage_flags(capsys):
    from tensorflow_ext.examples import ctr

    a = ctr.parse_args([])
    assert (a.value_dtype, a.slot_dtype, a.rounding) == ("float32", "float32", None)
    assert (a.serve_dtype, a.serve_frozen, a.served_auc) == (None, False, False)  # the export: as the tables
    a = ctr.parse_args(
        ["--value_dtype", "bfloat16", "--slot_dtype", "same", "--rounding", "nearest", "--optimizer", "rowwise_adagrad"]
    )
    assert (a.value_dtype, a.slot_dtype, a.rounding, a.optimizer) == ("bfloat16", "same", "nearest", "rowwise_adagrad")
    assert a.learning_rate == 0.5
    a = ctr.parse_args(["--serve_dtype", "int8", "--serve_frozen", "--served_auc"])
    assert (a.serve_dtype, a.serve_frozen, a.served_auc) == ("int8", True, True)
    for bad, message in (
        (["--value_dtype", "int8"], "invalid choice: 'int8'"),
        (["--slot_dtype", "bfloat16"], "invalid choice: 'bfloat16'"),
        (["--serve_dtype", "int4"], "invalid choice: 'int4'"),
        (["--rounding", "nearest"], "--rounding applies to compact rows"),
        (["--static_buckets", "100", "--value_dtype", "float16"], "not --static_buckets"),
        (["--static_buckets", "100", "--serve_dtype", "int8"], "not --static_buckets"),
        (["--no_export", "--served_auc"], "not with --no_export"),
        (["--no_export", "--serve_dtype", "bfloat16"], "not with --no_export"),
    ):
        with pytest.raises(SystemExit) as e:
            ctr.parse_args(bad)
        assert e.value.code == 2
        assert message in capsys.readouterr().err, bad


def test_quick_bf16_rowwise_adagrad_trains_and_int8_export_serves(tmp_path):
    """bf16 rows + row-wise Adagrad train (AUC, falling loss, one accumulator per row in the checkpoint); the
    frozen int8 export loads in a fresh session and serves about the trained model's AUC."""
    model_dir = str(tmp_path / "ctr")
    s, log, _ = _run_ctr(
        "--quick",
        "--model_dir",
        model_dir,
        "--value_dtype",
        "bfloat16",
        "--optimizer",
        "rowwise_adagrad",
        "--serve_frozen",
        "--serve_dtype",
        "int8",
        "--served_auc",
    )
    assert (s["value_dtype"], s["optimizer"], s["serve_dtype"], s["serve_frozen"]) == (
        "bfloat16",
        "rowwise_adagrad",
        "int8",
        True,
    )
    assert s["auc"] > 0.6, s
    losses = [v for _, v in _scalar_series(model_dir, "loss")]
    assert len(losses) >= 2 and np.mean(losses[-2:]) < losses[0] - 0.05, losses
    import tensorflow as tf

    ckpt = dict(tf.train.list_variables(model_dir))
    prefix = "embeddings/input_layer/C1_emb/embedding_weights/part_0"
    assert ckpt[prefix + "-slots"] == [s["table_sizes"]["C1_emb"], 1]  # one accumulator per row
    assert s["table_bytes_per_key"] == pytest.approx(s["table_bytes"] / s["total_keys"], abs=0.1)
    assert "B/key" in log and "bfloat16 rows" in log
    # The export serves (int8 rows: a few bits of each weight lost) about the AUC the trained tables give.
    assert s["served_examples"] == 5 * 512
    assert abs(s["served_auc"] - s["auc"]) < 0.02, s
    assert "ctr: served AUC %.4f" % s["served_auc"] in log


def test_stream_progress_records_follow_the_checkpoints(tmp_path):
    """The stream position recorded with each checkpoint: a record written for a save that a kill interrupted (no
    index file) is never read back (the restart resumes from the checkpoint before it, whose record is kept) and goes
    at the next save; records of checkpoints the Saver deleted go after the save."""
    from tensorflow_ext.examples.ctr import checkpoints

    d = str(tmp_path)

    def checkpoint(step):
        open(os.path.join(d, "model.ckpt-%d.index" % step), "w").close()

    first = checkpoints.StreamProgressListener(d, 0, 0, 2, 64)  # 2 ranks from the start
    first.before_save(None, 4)
    checkpoint(4)
    first.after_save(None, 4)
    first.before_save(None, 8)  # killed here: checkpoint 8 never written
    assert checkpoints.read_progress(d) == {
        4: dict(batches=8, ranks=2, batch_size=64),
        8: dict(batches=16, ranks=2, batch_size=64),
    }
    assert checkpoints.resume_batches(d, 4, 1) == 8  # the restart (1 rank) continues after batch 7
    second = checkpoints.StreamProgressListener(d, 4, 8, 1, 64)
    second.before_save(None, 8)  # step 8 again, at 1 rank: 4 batches later
    checkpoint(8)
    os.remove(os.path.join(d, "model.ckpt-4.index"))  # the Saver's max_to_keep
    second.after_save(None, 8)
    assert {s: r["batches"] for s, r in checkpoints.read_progress(d).items()} == {8: 12}
    second.before_save(None, 10)  # killed again
    assert checkpoints.resume_batches(d, 8, 2) == 12
    checkpoints.StreamProgressListener(d, 8, 12, 2, 64).before_save(None, 12)
    assert {s: r["batches"] for s, r in checkpoints.read_progress(d).items()} == {8: 12, 12: 20}  # 10's record is gone
    assert not [f for f in os.listdir(d) if f.endswith(".tmp")]


def test_quiet_tf_logs_are_scoped_to_the_run():
    """main() turns TF's deprecation warnings and INFO log off for its run only."""
    import tensorflow as tf
    from tensorflow.python.util import deprecation
    from tensorflow_ext.examples.ctr import log

    old = tf.compat.v1.logging.get_verbosity()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    try:
        with pytest.raises(RuntimeError):
            with log.tf_chatter(verbose=False):
                assert deprecation._PRINT_DEPRECATION_WARNINGS is False
                assert tf.compat.v1.logging.get_verbosity() == tf.compat.v1.logging.WARN
                raise RuntimeError("the run failed")
        assert deprecation._PRINT_DEPRECATION_WARNINGS is True
        assert tf.compat.v1.logging.get_verbosity() == tf.compat.v1.logging.INFO
        with log.tf_chatter(verbose=True):
            assert deprecation._PRINT_DEPRECATION_WARNINGS is True
    finally:
        tf.compat.v1.logging.set_verbosity(old)


@pytest.mark.parametrize("split", ["train", "eval"])
def test_synthetic_stream_is_deterministic(split):
    from tensorflow_ext.examples import synthetic

    s = synthetic.CriteoLikeStream(seed=7, max_ids=1000)
    f1, y1, l1 = s.batch(3, 64, split)
    f2, y2, l2 = s.batch(3, 64, split)
    for k in synthetic.CATEGORICAL_KEYS + synthetic.DENSE_KEYS:
        np.testing.assert_array_equal(f1[k], f2[k])
    np.testing.assert_array_equal(y1, y2)
    assert all(f1[k].max() < 1000 and f1[k].min() >= -1 for k in synthetic.CATEGORICAL_KEYS)
    other = s.batch(4, 64, split)[0]
    assert any((f1[k] != other[k]).any() for k in synthetic.CATEGORICAL_KEYS)


def test_synthetic_oracle_beats_chance():
    from tensorflow_ext.examples import synthetic

    s = synthetic.CriteoLikeStream(seed=0)
    assert s.oracle_auc(2, 2048) > 0.75
    assert synthetic.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
