"""The main job under horovodrun: `python -m tensorflow_ext.examples.ctr --distributed model_parallel|data_parallel`.

Both runs train on the same global batches (rank r reads batches r, r + N, ... of the stream), so model- and
data-parallel tables must end with the same keys and the model with the same quality; rank 0 evaluates and exports a
SavedModel that a plain process serves; a single process continues from the distributed checkpoint.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

FLAGS = ["--quick", "--fresh", "--steps", "16", "--batch_size", "256", "--eval_steps", "2", "--log_every", "8"]


def _summary(text, prefix=""):
    """The JSON summary line of a ctr run (under horovodrun: rank 0's stdout, prefixed "[0]<stdout>:")."""
    lines = [l[len(prefix) :] for l in text.splitlines() if l.startswith(prefix + "{")]
    assert len(lines) == 1, "expected one JSON summary, got %d:\n%s" % (
        len(lines),
        text[-4000:],
    )
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for mode in ("model_parallel", "data_parallel"):
        model_dir = str(tmp_path_factory.mktemp(mode))
        # The data-parallel run skips the export (the model-parallel one checks it).
        extra = ["--no_export"] if mode == "data_parallel" else []
        code, text = horovodrun(
            2, "-m", "tensorflow_ext.examples.ctr", "--distributed", mode, "--model_dir", model_dir, *FLAGS, *extra
        )
        assert code == 0, text[-6000:]
        # Only rank 0 reports; every other rank trains silently.
        assert "[1]<stdout>:{" not in text
        out[mode] = _summary(text, "[0]<stdout>:")
    return out


def test_both_parallelisms_train_the_same_model(runs):
    mp, dp = runs["model_parallel"], runs["data_parallel"]
    for s in (mp, dp):
        assert s["ranks"] == 2 and s["global_step"] == 16 and s["steps"] == 16
        assert s["auc"] > 0.58, s  # the hidden model is learnable (single process --quick: ~0.72 after 100 steps)
    assert mp["export_dir"] and os.path.isdir(mp["export_dir"]) and dp["export_dir"] is None
    # The same global batches: the same keys in every table (eval reads the full checkpoint on rank 0)...
    assert mp["table_sizes"] == dp["table_sizes"]
    assert mp["total_keys"] == dp["total_keys"] > 0
    # ...and the same trained model up to the order of float sums.
    assert abs(mp["auc"] - dp["auc"]) < 2e-3, (mp["auc"], dp["auc"])
    assert abs(mp["logloss"] - dp["logloss"]) < 2e-3, (mp["logloss"], dp["logloss"])


SERVE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import tensorflow_ext  # noqa: F401  (a plain import: no Horovod)
    from tensorflow_ext.examples import synthetic

    assert "horovod" not in sys.modules
    export_dir = sys.argv[1]
    stream = synthetic.CriteoLikeStream(seed=0, max_ids=2 ** 20)
    probs, labels = [], []
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        sig = meta.signature_def["serving_default"]
        for i in range(2):
            feats, y, _ = stream.batch(i, 256, "eval")
            feed = {}
            for k in synthetic.CATEGORICAL_KEYS:
                feed[sig.inputs[k].name] = feats[k]
            for k in synthetic.DENSE_KEYS:
                feed[sig.inputs[k].name] = synthetic.log_counts(feats[k])
            probs.append(sess.run(sig.outputs["probability"].name, feed))
            labels.append(y)
    p, y = np.concatenate(probs), np.concatenate(labels)
    order = np.argsort(p)
    ranks = np.empty(len(p)); ranks[order] = np.arange(1, len(p) + 1)
    pos = y > 0.5
    auc = (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())
    print(json.dumps({"auc": float(auc), "min": float(p.min()), "max": float(p.max())}))
    """
)


def test_export_serves_every_key_in_a_plain_process(runs):
    s = runs["model_parallel"]
    r = subprocess.run(
        [sys.executable, "-c", SERVE, s["export_dir"]],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    served = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0.0 < served["min"] <= served["max"] < 1.0
    # The evaluation's AUC over the same eval batches (its AUC is approximated over 2000 thresholds).
    assert abs(served["auc"] - s["auc"]) < 5e-3, (served, s["auc"])


def test_one_process_continues_a_model_parallel_checkpoint(runs):
    model_dir = runs["model_parallel"]["model_dir"]
    flags = ["--quick", "--steps", "4", "--batch_size", "256", "--eval_steps", "1", "--no_export", "--quiet"]
    r = subprocess.run(
        [sys.executable, "-m", "tensorflow_ext.examples.ctr", "--model_dir", model_dir] + flags,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    s = _summary(r.stdout)
    assert s["start_step"] == 16 and s["global_step"] == 20 and s["ranks"] == 1
    # Every key of the 2-rank table came back, and training only adds keys.
    assert s["total_keys"] >= runs["model_parallel"]["total_keys"]
    for table, size in runs["model_parallel"]["table_sizes"].items():
        assert s["table_sizes"][table] >= size, table


CTR_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctr_worker.py")


def _stream_starts(text):
    """{rank: (first batch, batches)} of the training input each rank built (ctr_worker.py's lines)."""
    out = {}
    for line in text.splitlines():
        if "STREAM start=" in line:
            rank = int(line.split("RANK ")[1].split()[0])
            out[rank] = (int(line.split("start=")[1].split()[0]), int(line.split("batches=")[1].split()[0]))
    return out


def test_restart_at_another_rank_count_continues_the_stream_exactly(tmp_path):
    """2 ranks, then 1, then 2 again: each run trains on the batches right after the last one trained.

    A global step is one batch per rank, so the position is the batches consumed (recorded with each checkpoint),
    not the restored step times the new rank count (which re-trained or skipped batches)."""
    model_dir = str(tmp_path / "m")
    flags = ["--quick", "--batch_size", "64", "--eval_steps", "1", "--no_export", "--quiet", "--model_dir", model_dir]
    flags += ["--save_checkpoints_steps", "4"]
    dist = ["--distributed", "model_parallel"]

    code, text = horovodrun(2, CTR_WORKER, *dist, *flags, "--fresh", "--steps", "6")
    assert code == 0, text[-6000:]
    assert _stream_starts(text) == {0: (0, 12), 1: (0, 12)}  # rank r trains batches r, r + 2, ... of [0, 12)
    first = _summary(text, "[0]<stdout>:")
    assert first["global_step"] == 6, first

    r = subprocess.run(
        [sys.executable, CTR_WORKER, *flags, "--steps", "5"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert r.returncode == 0, r.stderr[-6000:]
    assert _stream_starts(r.stdout) == {0: (12, 5)}  # not batch 6 (the step times 1 rank): 6-11 were trained
    second = _summary(r.stdout)
    assert (second["start_step"], second["global_step"], second["ranks"]) == (6, 11, 1), second
    assert (second["first_batch"], second["next_batch"]) == (12, 17), second

    code, text = horovodrun(2, CTR_WORKER, *dist, *flags, "--steps", "3")
    assert code == 0, text[-6000:]
    assert _stream_starts(text) == {0: (17, 6), 1: (17, 6)}  # not batch 22 (the step times 2 ranks): 17-21 skipped
    third = _summary(text, "[0]<stdout>:")
    assert (third["start_step"], third["global_step"], third["ranks"]) == (11, 14, 2), third
    assert (third["first_batch"], third["next_batch"]) == (17, 23), third
    # The record of the kept checkpoints (the Saver keeps 2): the step of each, with the batches consumed by then.
    with open(os.path.join(model_dir, "ctr_progress.json")) as f:
        progress = json.load(f)
    assert {s: p["batches"] for s, p in progress.items()} == {"11": 17, "14": 23}, progress
    assert (first["first_batch"], first["next_batch"]) == (0, 12), first
