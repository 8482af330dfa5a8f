"""tf.estimator.train_and_evaluate with a tiered embedding, in a fresh process (tiered_estimator_worker.py).

Local train_and_evaluate evaluates and exports a SavedModel after every checkpoint while the training session still
holds its tables: each evaluation and export builds the model again in a session of its own and restores the
checkpoint, so a tiered embedding has a second table per shard in the process, on the store path training holds.
Such a table keeps its store in a private sibling directory (<shard dir>.1) that it deletes when it closes. The
reference is the same Estimator with the embedding in memory: training on tiers is exact, so every evaluation's
metrics, the predictions and the exported model's outputs are equal, bit for bit.
"""

import json
import os
import re
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_WORKER = os.path.join(_HERE, "tiered_estimator_worker.py")
_GUARD_S = 600  # a guard against hangs only
_SHARDS = ["shard_0_of_2", "shard_1_of_2"]


def _train_and_evaluate(tmp_path, tag, tier):
    """Runs the worker in a fresh process (TF's INFO log on); returns (its result, its stderr)."""
    result = tmp_path / ("%s.json" % tag)
    cfg = dict(model_dir=str(tmp_path / tag), tier=tier, steps=30, every=10, result=str(result))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    proc = subprocess.run(
        [sys.executable, _WORKER, json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=_GUARD_S
    )
    assert proc.returncode == 0, "%s: worker failed (%d):\n%s\n%s" % (
        tag,
        proc.returncode,
        proc.stdout[-3000:],
        proc.stderr[-6000:],
    )
    with open(str(result)) as f:
        return json.load(f), proc.stderr


def test_train_and_evaluate_with_a_tiered_embedding_evaluates_like_the_model_in_memory(tmp_path):
    want, _ = _train_and_evaluate(tmp_path, "memory", None)
    root = tmp_path / "tiers"
    # 64 KB over 2 shards holds ~300 of a shard's ~900 trained rows: most live on disk, in training and evaluation.
    got, log = _train_and_evaluate(tmp_path, "tiered", dict(memory_bytes="64KB", path=str(root)))

    assert sorted(want["evals"]) == ["10", "20", "30"], want["evals"]
    assert sorted(got["evals"]) == sorted(want["evals"]), got["evals"]
    for step, metrics in sorted(want["evals"].items()):
        tiered = dict(got["evals"][step])
        # The evaluation's own tables had rows on disk and read them back.
        assert tiered.pop("tier_disk_keys") > 0 and tiered.pop("tier_cold_reads") > 0, (step, got["evals"][step])
        assert tiered == metrics, "evaluation at step %s: tiered %s, in memory %s" % (step, tiered, metrics)
    assert got["predictions"] == want["predictions"]
    assert got["exports"] == want["exports"] == 3, (got["exports"], want["exports"])
    assert got["served"] == want["served"]

    # Each evaluation ran beside training (which kept its directories) in private siblings; all are gone at the end.
    siblings = sorted(_SHARDS + [s + ".1" for s in _SHARDS])
    assert got["eval_dirs"] == [[10, siblings], [20, siblings], [30, siblings]], got["eval_dirs"]
    assert got["final_dirs"] == _SHARDS, got["final_dirs"]
    assert sorted(os.listdir(str(root / "ids"))) == _SHARDS

    # Each second table logged once, naming the directory asked for and the one it took: one per shard for each
    # evaluation and each export.
    lines = [line for line in log.splitlines() if "held by another table of this process" in line]
    for shard in _SHARDS:
        path = os.path.join(str(root), "ids", shard)
        named = [line for line in lines if re.search(re.escape(path) + r" .*" + re.escape(path + ".1") + r" ", line)]
        assert len(named) == len(want["evals"]) + want["exports"], "\n".join(lines)
