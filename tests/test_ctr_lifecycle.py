"""The CTR example's feature-lifecycle runs (--days, the policies, the static baseline), in subprocesses.

Apart from tests/test_ctr_example.py so that the two files run on different test workers.
"""

import glob
import os
import subprocess
import sys
import textwrap

from tests.test_ctr_example import _run_ctr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_days_with_admission_and_eviction_keep_memory_bounded(tmp_path):
    """--days: each day continues, evaluates on the next day and exports; with admission on every table, the keys
    held are the admitted ones minus the evicted ones; with a small capacity the tables stop growing."""
    model_dir = str(tmp_path / "days")
    s, log, _ = _run_ctr(
        "--quick",
        "--model_dir",
        model_dir,
        "--days",
        "3",
        "--steps",
        "20",
        "--eval_steps",
        "1",
        "--admission",
        "2",
        "--capacity",
        "400",
        "--evict_every",
        "10",
        timeout=1500,  # a guard against a hang only: about 150 s on a busy 2-core machine
    )
    days = s["days"]
    assert [d["day"] for d in days] == [1, 2, 3] and [d["global_step"] for d in days] == [20, 40, 60]
    for d in days:
        assert d["auc"] > 0.55, days
        # Every key in a table was admitted once; the evicted ones left.
        assert d["total_keys"] == d["admitted_keys"] - d["evicted_keys"] > 0, d
        # At most the capacity per table, plus the keys of the steps since the last eviction.
        assert d["total_keys"] <= 26 * 400 + 26 * 10 * 512, d
    assert days[-1]["evicted_keys"] > days[0]["evicted_keys"] > 0
    assert days[-1]["table_mib"] <= days[1]["table_mib"] * 1.1, days  # memory bounded across days
    assert os.path.isfile(s["plot"]) and s["plot"].endswith(".png")
    exports = sorted(glob.glob(os.path.join(model_dir, "export", "*", "saved_model.pb")))
    assert len(exports) == 3
    assert "per day" in log
    # The exports and the checkpoint's MetaGraph of a model with admission load in a fresh process.
    code = textwrap.dedent(
        """
        import sys
        import tensorflow as tf
        import tensorflow_ext
        tf.compat.v1.disable_v2_behavior()
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            tf.compat.v1.saved_model.load(sess, ["serve"], sys.argv[1])
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            ckpt = tf.train.latest_checkpoint(sys.argv[2])
            tf.compat.v1.train.import_meta_graph(ckpt + ".meta").restore(sess, ckpt)
        print("loaded")
        """
    )
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(exports[-1]), model_dir],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and "loaded" in r.stdout, r.stderr[-4000:]


def test_static_hashed_baseline(tmp_path):
    s, _, _ = _run_ctr(
        "--quick", "--model_dir", str(tmp_path / "static"), "--static_buckets", "5000", "--steps", "30", "--no_export"
    )
    assert s["total_keys"] == 0 and s["table_bytes"] == 26 * 5000 * 5 * 4 * 2  # [5000, dim + 1] and its accumulator
    assert s["auc"] > 0.55
