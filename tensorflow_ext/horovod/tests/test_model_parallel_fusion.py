"""The fused exchange of a step's model-parallel lookups (tensorflow_ext.horovod.exchange): one alltoall of keys,
one of rows, one of gradients for all of them, bit for bit what each lookup's own exchange gives."""

import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.horovod import exchange
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

tf.compat.v1.disable_v2_behavior()

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fusion_worker.py")


def _run(tmp_path, monkeypatch, name, fused, *extra):
    out = tmp_path / name
    out.mkdir()
    monkeypatch.setenv(exchange.ENV_FUSED, "1" if fused else "0")
    code, log = horovodrun(2, WORKER, str(out), "3", *extra)
    assert code == 0, log[-6000:]
    alltoalls = {}
    for line in log.splitlines():
        if " ALLTOALLS " in line:
            rank = int(line.split("RANK ")[1].split()[0])
            alltoalls[rank] = line.split(" ALLTOALLS ")[1].split()
    assert sorted(alltoalls) == [0, 1], log[-6000:]
    return [dict(np.load(str(out / ("rank-%d.npz" % r)))) for r in range(2)], alltoalls, log


def test_fused_exchange_equals_per_embedding(tmp_path, monkeypatch):
    """Five model-parallel embeddings (dims 2-6, ids / sparse / admission lookups, one stored in bf16; two whose ids
    depend on another lookup's rows): fused, a training step runs 6 alltoalls (keys, rows, gradients for the first
    three, then for the two that wait on them) instead of 15, and every rank ends with the same rows, slots, dense
    weights, losses and eval rows, bit for bit, as with each lookup's own exchange; both match one process trained
    on the global batch. The fused exchanges wait only for what they need (see fusion_worker.check_dependencies)."""
    fused, fused_alltoalls, log = _run(tmp_path, monkeypatch, "fused", True, "1")
    for rank in range(2):
        assert "RANK %d MATCHES ONE PROCESS" % rank in log, log[-6000:]
        # The rows' exchange waits for no dense layer, the gradients' for no dense gradient or other collective.
        assert "RANK %d DEPENDENCIES OK" % rank in log, log[-6000:]
    own, own_alltoalls, _ = _run(tmp_path, monkeypatch, "own", False)
    for rank in range(2):
        names = fused_alltoalls[rank]
        assert len(names) == 6, names
        for group in ("tf_ext_fused_lookups_0", "tf_ext_fused_lookups_1"):
            for stage in ("_keys", "_rows", "_row_gradients"):
                assert sum(n.endswith(group + stage) for n in names) == 1, (group, stage, names)
        assert len(own_alltoalls[rank]) == 15, own_alltoalls[rank]
        assert sorted(fused[rank]) == sorted(own[rank])
        for key, want in own[rank].items():
            got = fused[rank][key]
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert got.tobytes() == want.tobytes(), "rank %d: %s differs" % (rank, key)
        assert len(fused[rank]["admit5/keys"]) > 0 and len(fused[rank]["after_b/keys"]) > 0


def test_ranks_that_fuse_differently_are_refused_by_the_model_check(tmp_path):
    """A rank that fuses and one that does not would wait for each other's collectives forever: the model check
    fails the first step on both, naming the setting."""
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
        import os, sys
        os.environ["TF_EXT_HVD_FUSED_EXCHANGES"] = "1" if os.environ["HOROVOD_RANK"] == "0" else "0"
        sys.argv = ["fusion_worker.py", sys.argv[1], "1"]
        from tensorflow_ext.horovod.tests import fusion_worker
        try:
            fusion_worker.main(sys.argv[1], 1, False)
        except Exception as e:  # InvalidArgumentError from the check's py_func
            print("REFUSED", os.environ["HOROVOD_RANK"], " ".join(str(e).split()), flush=True)
        """
        )
    )
    code, out = horovodrun(2, str(script), str(tmp_path))
    assert code == 0, out[-6000:]
    for rank in range(2):
        line = [x for x in out.splitlines() if ("REFUSED %d" % rank) in x]
        assert line, out[-6000:]
        assert "model-parallel exchanges" in line[0] and "TF_EXT_HVD_FUSED_EXCHANGES" in line[0], line[0]
        assert "rank 0: 1" in line[0] and "rank 1: 0" in line[0], line[0]


def _simulated_alltoall(buffers, splits):
    """What each of N ranks receives when rank i sends buffers[i] split by splits[i] (numpy)."""
    n = len(buffers)
    pieces = [np.split(b, np.cumsum(s)[:-1]) for b, s in zip(buffers, splits)]
    return [np.concatenate([pieces[src][dst] for src in range(n)]) for dst in range(n)]


def test_packed_rows_arrive_as_each_embeddings_own_alltoall_delivers_them():
    """3 simulated ranks, 3 embeddings (widths 2, 3, 1; one travelling as bf16 and two as float32 in one uint16
    buffer, and all-float32): what `_pack` sends and `_unpack` reads back equals, per embedding, the rows a
    separate alltoall would deliver (from each rank in rank order), bit for bit, with empty parts."""
    rng = np.random.RandomState(3)
    n, widths = 3, [2, 3, 1]
    # counts[r][i, e]: rows rank r sends rank i for embedding e
    counts = [rng.randint(0, 4, size=[n, len(widths)]).astype(np.int32) for _ in range(n)]
    counts[1][2, :] = 0
    rows = [
        [
            (
                rng.normal(size=[int(c[:, e].sum()), w]).astype(np.float32)
                if e != 1
                else rng.normal(size=[int(c[:, e].sum()), w]).astype(tf.bfloat16.as_numpy_dtype).astype(np.float32)
            )
            for e, w in enumerate(widths)
        ]
        for c in counts
    ]
    for wires in ([None, tf.bfloat16, None], [None, None, None]):
        unit = tf.float32 if all(w is None for w in wires) else tf.uint16
        upr = [w * (2 if unit == tf.uint16 and d is None else 1) for w, d in zip(widths, wires)]
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            packed = [
                exchange._pack([exchange._as_units(tf.constant(r), d, unit) for r, d in zip(rs, wires)], c, upr, n)
                for rs, c in zip(rows, counts)
            ]
            sent = sess.run(packed)
            received = _simulated_alltoall([b for b, _ in sent], [s for _, s in sent])
            for dst in range(n):
                from_counts = np.stack([counts[src][dst] for src in range(n)])  # [N, E]
                parts = exchange._unpack(tf.constant(received[dst]), tf.constant(from_counts), upr, n)
                got = sess.run([exchange._from_units(p, w, d, unit) for p, w, d in zip(parts, widths, wires)])
                for e in range(len(widths)):
                    want = np.concatenate(
                        [rows[src][e][counts[src][:dst, e].sum() : counts[src][: dst + 1, e].sum()] for src in range(n)]
                    )
                    assert got[e].tobytes() == want.tobytes(), (wires, dst, e)


def test_the_setting_is_parsed_strictly(monkeypatch):
    monkeypatch.setenv(exchange.ENV_FUSED, "0")
    assert not exchange.fused_enabled()
    monkeypatch.delenv(exchange.ENV_FUSED)
    assert exchange.fused_enabled()
    monkeypatch.setenv(exchange.ENV_FUSED, "maybe")
    with pytest.raises(ValueError, match="TF_EXT_HVD_FUSED_EXCHANGES must be 0 or 1, got 'maybe'"):
        exchange.fused_enabled()
