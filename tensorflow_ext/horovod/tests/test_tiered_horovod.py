"""Tiered storage under Horovod: a model-parallel embedding whose rows mostly live on disk (each rank its own
store, under `<path>/rank_<r>/`) trains on 2 ranks bit for bit like the same embedding all in memory, and its
checkpoint (gathered from both tiers of every rank) restores into new tiered embeddings exactly (tiered_worker.py)."""

import os
import re

import pytest

from tensorflow_ext.horovod.tests.test_horovod import horovodrun

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "tiered_worker.py")


@pytest.mark.parametrize(
    "optimizer,flavour,value_dtype", [("Adam", "lookup", "float32"), ("Adagrad", "sparse", "bfloat16")]
)
def test_model_parallel_tiered_trains_like_in_memory(tmp_path, optimizer, flavour, value_dtype):
    root = str(tmp_path / "tiers")
    code, out = horovodrun(2, WORKER, optimizer, flavour, value_dtype, root)
    assert code == 0, out[-6000:]
    keys = {}
    for r in range(2):
        m = re.search(r"RANK %d OK keys=(\d+) disk_keys=(\d+)" % r, out)
        assert m, out[-6000:]
        keys[r] = int(m.group(1))
    # Each rank holds its own keys: two stores, neither holding the whole table.
    assert sorted(os.listdir(root)) == ["rank_0", "rank_1"]
    assert min(keys.values()) > 0
