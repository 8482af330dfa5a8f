"""tensorflow_ext.horovod.shm_allreduce: the 2D allreduce's stages inside a node through shared memory, under
`horovodrun --gloo -np 4` with the four local ranks treated as 2 nodes x 2 (see shm_allreduce_worker.py)."""

import os
import subprocess
import sys
import textwrap

from tensorflow_ext.horovod.tests.test_horovod import HERE
from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env
from tensorflow_ext.horovod.tests.test_horovod import horovodrun

WORKER = os.path.join(HERE, "shm_allreduce_worker.py")


def test_shm_gives_the_gloo_bits_for_every_wire_and_leaves_no_segment():
    """float32, fp16 and bf16; one buffer, one per gradient (odd lengths) and several small ones per step, on one
    inter-op thread; three steps in one session: the bits of the Gloo path, close to numpy; a stale segment of a
    crashed job under the same name is replaced; nothing is left under /dev/shm."""
    code, out = horovodrun(4, WORKER, "main")
    assert code == 0, out[-8000:]
    for r in range(4):
        for what in ("SHM MATCHES GLOO", "STALE SEGMENT REPLACED"):
            assert "RANK %d %s OK" % (r, what) in out, (what, out[-8000:])


def test_a_rank_that_stops_before_the_barrier_fails_its_node_with_its_name(tmp_path):
    """Ranks 1 and 3 stop after the first step; ranks 0 and 2 fail the second one after TF_EXT_HVD_SHM_TIMEOUT_S
    seconds with an error naming the missing local rank (instead of hanging)."""
    for r in (1, 3):
        os.mkfifo(str(tmp_path / ("fifo%d" % r)))
    code, out = horovodrun(4, WORKER, "stuck", str(tmp_path))
    assert code == 0, out[-8000:]
    for r in (0, 2):
        assert "RANK %d TIMEOUT OK" % r in out, out[-8000:]


def test_intra_node_setting_is_parsed_and_checked():
    """intra_node and TF_EXT_HVD_INTRA_NODE / TF_EXT_HVD_SHM_TIMEOUT_S: values, errors naming the setting; "shm"
    where a node spans hosts is refused with the layout; the setting is part of the ranks' settings check."""
    code = textwrap.dedent(
        """
        import os
        import horovod.tensorflow as hvd
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import config, shm_allreduce
        hvd.init()
        assert config.resolve_config().intra_node == "auto"
        assert config.resolve_config(intra_node="GLOO").intra_node == "gloo"
        os.environ["TF_EXT_HVD_INTRA_NODE"] = "shm"
        assert config.resolve_config(intra_node="gloo").intra_node == "shm"
        os.environ["TF_EXT_HVD_INTRA_NODE"] = "nccl"
        try:
            config.resolve_config()
        except ValueError as e:
            print("ENV", e)
        del os.environ["TF_EXT_HVD_INTRA_NODE"]
        try:
            config.resolve_config(intra_node="mpi")
        except ValueError as e:
            print("ARG", e)
        os.environ["TF_EXT_HVD_SHM_TIMEOUT_S"] = "2.5"
        assert config.resolve_config().shm_timeout_s == 2.5
        os.environ["TF_EXT_HVD_SHM_TIMEOUT_S"] = "0"
        try:
            config.resolve_config()
        except ValueError as e:
            print("TIMEOUT", e)
        del os.environ["TF_EXT_HVD_SHM_TIMEOUT_S"]
        # One process (local_size 1): a node of 2 ranks cannot share this host.
        c = config.resolve_config(intra_node="auto")
        assert shm_allreduce.intra_node_mode(c, 2) == "gloo"
        try:
            shm_allreduce.intra_node_mode(config.resolve_config(intra_node="shm"), 2)
        except ValueError as e:
            print("LAYOUT", e)
        opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), intra_node="gloo")
        print("SETTINGS", dict(opt._reduction_settings())["intra_node"])
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert "TF_EXT_HVD_INTRA_NODE must be one of auto, shm, gloo, got 'nccl'" in lines["ENV"], r.stdout
    assert "intra_node must be one of auto, shm, gloo, got 'mpi'" in lines["ARG"], r.stdout
    assert "TF_EXT_HVD_SHM_TIMEOUT_S must be a number of seconds > 0, got '0'" in lines["TIMEOUT"], r.stdout
    assert "rank 0's node is ranks [0, 2) but its host holds ranks [0, 1)" in lines["LAYOUT"], r.stdout
    assert lines["SETTINGS"] == "gloo", r.stdout
