"""Serving updates, the trainer's side (`tensorflow_ext.serving.updates`): what each update holds, against the
trainer's own tables and variables, when it is full, its atomicity, failures, `keep`, and the hook and listener.

The reference follower (`updates_worker.replay`) applies the updates of a directory in order to dicts; at every
update it must equal the trainer's tables and dense variables at that update's step. Scenarios that need a process
of their own (a private tmpfs for a full disk, a SIGKILL in the middle of a write) run `updates_worker.py`.
"""

import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.checkpoint import format as ckpt_format
from tensorflow_ext.embedding.tests.conftest import run_fresh
from tensorflow_ext.serving import update_format as uf
from tensorflow_ext.serving import updates
from tensorflow_ext.serving.tests import updates_worker as worker

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "updates_worker.py")
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
_GUARD_S = 300  # a guard against hangs only


def _session():
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
    return tf.compat.v1.Session(config=config)


def _paths(updates_dir):
    return [path for _, path in uf.list_updates(updates_dir)]


def _versions(sess, emb):
    """{shard name: {key: version}}."""
    out = {}
    for shard in emb.shards:
        keys, _, versions, _ = sess.run(shard.table.export())
        out[shard.name] = dict(zip(keys.tolist(), versions.tolist()))
    return out


def _entries(manifest):
    return uf.parse_layout(manifest["layout"])


def test_deltas_hold_exactly_the_rows_changed_and_the_keys_removed(tmp_path):
    udir = str(tmp_path / "updates")
    with tf.Graph().as_default():
        gs, emb, ids, train, remove_ids, remove, evict, _ = worker.build()
        writer = updates.ServingUpdateWriter(udir, model_name="ctr", full_every=100, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            start = worker.table_state(sess, emb)
            previous = start
            for interval in range(6):
                trained = set()
                for i in range(3):
                    b = worker.batch(interval * 3 + i, 12)
                    sess.run(train, {ids: b})
                    trained.update(b.tolist())
                present = sorted(k for rows in worker.table_state(sess, emb)[0].values() for k in rows)
                asked = [present[0], present[-1], 10**9]  # two keys and an absent one
                sess.run(remove, {remove_ids: asked})
                evicted = set()
                if interval % 2:
                    before = {k for rows in worker.table_state(sess, emb)[0].values() for k in rows}
                    sess.run(evict)
                    evicted = before - {k for rows in worker.table_state(sess, emb)[0].values() for k in rows}
                    assert evicted, "the eviction removed nothing: the test would not cover it"
                manifest = writer.write(sess)
                state = worker.table_state(sess, emb)
                versions = _versions(sess, emb)
                step = int(sess.run(gs))

                assert manifest["kind"] == uf.KIND_DELTA and manifest["model_name"] == "ctr"
                assert manifest["to_step"] == step and manifest["from_step"] == (interval * 3 if interval else 0)
                path = _paths(udir)[-1]
                assert os.path.basename(path) == uf.update_dir_name(step)
                got_manifest, tensors = worker.read_update(path)
                assert got_manifest == manifest
                tables, dense = _entries(manifest)
                assert tables == {s: worker.DIM for s in worker.SHARDS}
                # The model's dense variables only: no Adagrad slots, no global step, no tf_ext counters.
                assert dense == {"dense/b": ("float32", ()), "dense/w": ("float32", (worker.DIM, 1))}
                assert tensors[uf.META_MODEL_NAME] == b"ctr" and tensors[uf.META_TO_STEP] == step
                assert tensors[uf.META_KIND] == b"delta" and tensors[uf.META_FROM_STEP] == manifest["from_step"]
                all_removed = set()
                for shard in worker.SHARDS:
                    keys = tensors[uf.keys_name(shard)]
                    # Exactly the rows whose version is at least from_step: the keys trained since the last update.
                    want = sorted(k for k, v in versions[shard].items() if v >= manifest["from_step"])
                    assert sorted(keys.tolist()) == want, shard
                    assert set(want) == trained & set(state[0][shard]), shard
                    for k, row in zip(keys.tolist(), tensors[uf.values_name(shard)]):
                        np.testing.assert_array_equal(row, state[0][shard][k])
                    all_removed.update(tensors[uf.removed_name(shard)].tolist())
                gone = {k for rows in previous[0].values() for k in rows} | trained
                gone -= {k for rows in state[0].values() for k in rows}
                assert gone <= all_removed <= set(asked) | evicted, (gone, all_removed)
                for name, value in state[1].items():
                    np.testing.assert_array_equal(tensors[name], value, err_msg=name)
                assert manifest["keys"] == sum(len(tensors[uf.keys_name(s)]) for s in worker.SHARDS)
                # The updates so far, applied in order to the state at start, give the trainer's state.
                tables, dense, version = worker.replay(_paths(udir), *start)
                worker.assert_same_state((tables, dense), state)
                assert version == step
                previous = state
    assert writer.stats["written"] == 6 and writer.stats["full"] == 0 and writer.stats["failed"] == 0


def test_full_every_writes_snapshots_beside_a_chain_of_deltas_and_overflows_full_updates_into_it(tmp_path):
    udir = str(tmp_path / "updates")
    with tf.Graph().as_default():
        gs, emb, ids, train, remove_ids, remove, _, untracked = worker.build()
        writer = updates.ServingUpdateWriter(udir, full_every=3, max_removed_keys=2, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            start = worker.table_state(sess, emb)
            kinds, snapshot_steps = [], []

            def check_write(manifest):
                kinds.append(manifest["kind"])
                state = worker.table_state(sess, emb)
                _, tensors = worker.read_update(_paths(udir)[-1])
                if manifest["kind"] == uf.KIND_FULL:
                    assert manifest["from_step"] == 0 and manifest["removed"] == 0
                    for shard in worker.SHARDS:
                        assert sorted(tensors[uf.keys_name(shard)].tolist()) == sorted(state[0][shard])
                # The chain alone, from the state at start, gives the trainer's state.
                worker.assert_same_state(worker.replay(_paths(udir), *start)[:2], state)
                snapshot = writer.last_snapshot
                if snapshot is not None:
                    step = manifest["to_step"]
                    snapshot_steps.append(step)
                    path = os.path.join(udir, uf.snapshot_dir_name(step))
                    got, tensors = worker.read_update(path)
                    assert got == snapshot and tensors[uf.META_KIND] == b"full"
                    assert (snapshot["kind"], snapshot["from_step"], snapshot["to_step"]) == (uf.KIND_FULL, 0, step)
                    assert snapshot["layout"] == manifest["layout"] and snapshot["removed"] == 0
                    # The snapshot alone is the trainer's state: what a follower resyncs from.
                    worker.assert_same_state(worker.replay([path])[:2], state)

            def step_and_write(i, before=None):
                sess.run(train, {ids: worker.batch(i, 10)})
                if before is not None:
                    before()
                check_write(writer.write(sess))

            for i in range(5):
                step_and_write(i)
            # Three keys removed past a capacity of two: the log overflowed.
            some = sorted(worker.table_state(sess, emb)[0][worker.SHARDS[0]])[:3]
            step_and_write(5, lambda: sess.run(remove, {remove_ids: some}))
            step_and_write(6)
            step_and_write(7, lambda: sess.run(untracked))  # a write without a version
            step_and_write(8)
            step_and_write(9)
            assert writer.write(sess, full=True) is None  # the step did not advance: nothing new
            step_and_write(10)
            sess.run(train, {ids: worker.batch(11, 10)})
            check_write(writer.write(sess, full=True))
    full, delta = uf.KIND_FULL, uf.KIND_DELTA
    # The chain holds deltas but after the overflow (6th update) and the untracked write (8th): full updates there,
    # each starting a new count. The state at start counts as the first full one: every third update has a snapshot
    # beside it (3rd, 11th), and so has the update written with full=True (12th).
    assert kinds == [delta] * 5 + [full, delta, full] + [delta] * 4, kinds
    assert snapshot_steps == [3, 11, 12]
    assert [s for s, _ in uf.list_snapshots(udir)] == snapshot_steps
    assert [s for s, _ in uf.list_updates(udir)] == list(range(1, 13))
    stats = writer.stats
    assert (stats["written"], stats["full"], stats["snapshots"], stats["skipped"]) == (12, 2, 3, 1)


def test_a_snapshot_that_fails_is_written_at_the_next_update(tmp_path, monkeypatch):
    udir = str(tmp_path / "updates")
    arrivals = []

    def fail_the_third_bundle(stage, path):  # the 2nd update's snapshot's (after updates 1 and 2)
        if stage == "bundle_written":
            arrivals.append(path)
            if len(arrivals) == 3:
                raise OSError(28, "No space left on device (injected)", path)

    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = worker.build()
        writer = updates.ServingUpdateWriter(udir, full_every=2, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            monkeypatch.setattr(updates, "_test_hook", fail_the_third_bundle)
            snapshots = []
            for i in range(5):
                sess.run(train, {ids: worker.batch(i, 10)})
                manifest = writer.write(sess)
                assert manifest["kind"] == uf.KIND_DELTA and manifest["to_step"] == i + 1
                snapshots.append(writer.last_snapshot and writer.last_snapshot["to_step"])
                if i == 2:
                    at_3 = worker.table_state(sess, emb)
    # Due at the 2nd update, failed, written at the 3rd; the count starts again there.
    assert snapshots == [None, None, 3, None, 5]
    assert writer.stats["failed"] == 1 and writer.stats["snapshots"] == 2 and writer.stats["written"] == 5
    assert [s for s, _ in uf.list_snapshots(udir)] == [3, 5]
    assert [s for s, _ in uf.list_updates(udir)] == [1, 2, 3, 4, 5]
    assert not [n for n in os.listdir(udir) if n.startswith(uf.TMP_PREFIX)]
    worker.assert_same_state(worker.replay([os.path.join(udir, uf.snapshot_dir_name(3))])[:2], at_3)


def test_a_step_that_did_not_advance_writes_nothing_and_the_next_update_carries_its_removals(tmp_path):
    udir = str(tmp_path / "updates")
    with tf.Graph().as_default():
        gs, emb, ids, train, remove_ids, remove, _, _ = worker.build()
        writer = updates.ServingUpdateWriter(udir, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            assert writer.write(sess) is None  # nothing trained since the start
            sess.run(train, {ids: worker.batch(0, 10)})
            first = writer.write(sess)
            assert first["kind"] == uf.KIND_DELTA and first["to_step"] == 1
            key = sorted(worker.table_state(sess, emb)[0][worker.SHARDS[0]])[0]
            sess.run(remove, {remove_ids: [key]})
            assert writer.write(sess) is None
            assert [os.path.basename(p) for p in _paths(udir)] == [uf.update_dir_name(1)]
            sess.run(train, {ids: worker.batch(1, 10)})
            second = writer.write(sess)
            removed = worker.read_update(_paths(udir)[-1])[1][uf.removed_name(worker.SHARDS[0])]
            assert key in removed.tolist() and second["from_step"] == 1 and second["to_step"] == 2
    assert writer.stats["skipped"] == 2 and writer.stats["written"] == 2


def test_a_delta_checkpoint_and_a_serving_update_each_see_every_removal(tmp_path):
    udir = str(tmp_path / "updates")
    prefix = str(tmp_path / "ckpt" / "model.ckpt")

    def ckpt_removed(path):
        reader = tf.train.load_checkpoint(path)
        return {int(k) for s in worker.SHARDS for k in reader.get_tensor(s + ckpt_format.REMOVED_SUFFIX)}

    def update_removed():
        tensors = worker.read_update(_paths(udir)[-1])[1]
        return {int(k) for s in worker.SHARDS for k in tensors[uf.removed_name(s)]}

    with tf.Graph().as_default():
        gs, emb, ids, train, remove_ids, remove, _, _ = worker.build()
        listener = tf_ext.embedding.delta_checkpoints(full_every=100)
        saver = tf.compat.v1.train.Saver(max_to_keep=100)
        writer = updates.ServingUpdateWriter(udir, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            start = worker.table_state(sess, emb)
            listener.save(sess, saver, prefix, gs)
            step = 0

            def train_and_remove(n):
                nonlocal step
                sess.run(train, {ids: worker.batch(step, 16)})
                step += 1
                keys = sorted(k for rows in worker.table_state(sess, emb)[0].values() for k in rows)[:n]
                sess.run(remove, {remove_ids: keys})
                return set(keys)

            a = train_and_remove(2)
            ckpt = listener.save(sess, saver, prefix, gs)
            assert ckpt_removed(ckpt) == a
            b = train_and_remove(1)
            writer.write(sess)
            assert update_removed() == a | b  # the checkpoint's commit left the serving channel whole
            c = train_and_remove(2)
            ckpt = listener.save(sess, saver, prefix, gs)
            assert ckpt_removed(ckpt) == b | c
            d = train_and_remove(1)
            writer.write(sess)
            assert update_removed() == c | d
            final = worker.table_state(sess, emb)
            ckpt = listener.save(sess, saver, prefix, gs)
            assert ckpt_removed(ckpt) == d
        worker.assert_same_state(worker.replay(_paths(udir), *start)[:2], final)
    # The delta checkpoint chain still restores the table exactly.
    with tf.Graph().as_default():
        _, emb, *_ = worker.build()
        with _session() as sess:
            tf.compat.v1.train.Saver().restore(sess, ckpt)
            worker.assert_same_state(worker.table_state(sess, emb), final)


def test_a_failed_write_keeps_training_and_the_next_update_covers_its_steps(tmp_path):
    # The updates directory's parent is a file: every write fails until it becomes a directory.
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    udir = str(blocker / "updates")
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = worker.build()
        writer = updates.ServingUpdateWriter(udir, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            start = worker.table_state(sess, emb)
            for i in range(3):
                sess.run(train, {ids: worker.batch(i, 10)})
                assert writer.write(sess) is None
            assert writer.stats["failed"] == 3 and writer.stats["written"] == 0
            blocker.unlink()
            sess.run(train, {ids: worker.batch(3, 10)})
            manifest = writer.write(sess)
            assert manifest["kind"] == uf.KIND_DELTA and (manifest["from_step"], manifest["to_step"]) == (0, 4)
            worker.assert_same_state(worker.replay(_paths(udir), *start)[:2], worker.table_state(sess, emb))
    assert not [n for n in os.listdir(udir) if n.startswith(uf.TMP_PREFIX)]


def test_a_write_that_fails_after_reading_the_removal_log_keeps_the_removals_for_the_next_one(tmp_path, monkeypatch):
    # The failure comes after the session run that read the 'serving' log and wrote the bundle (as a full disk while
    # the manifest is written): the log must not be committed, so the next update still removes those keys.
    udir = str(tmp_path / "updates")

    def fail_once(stage, path):
        if stage == "bundle_written" and not failed:
            failed.append(path)
            raise OSError(28, "No space left on device (injected)", path)

    failed = []
    with tf.Graph().as_default():
        gs, emb, ids, train, remove_ids, remove, evict, _ = worker.build()
        writer = updates.ServingUpdateWriter(udir, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            start = worker.table_state(sess, emb)
            for i in range(3):
                sess.run(train, {ids: worker.batch(i, 12)})
            assert writer.write(sess)["kind"] == uf.KIND_DELTA
            present = sorted(k for rows in worker.table_state(sess, emb)[0].values() for k in rows)
            sess.run(remove, {remove_ids: present[:5]})
            before = {k for rows in worker.table_state(sess, emb)[0].values() for k in rows}
            for i in range(3, 6):
                sess.run(train, {ids: worker.batch(i, 12)})
            sess.run(evict)
            evicted = before - {k for rows in worker.table_state(sess, emb)[0].values() for k in rows}
            assert evicted, "the eviction removed nothing: the test would not cover it"
            monkeypatch.setattr(updates, "_test_hook", fail_once)
            assert writer.write(sess) is None and failed
            assert writer.stats["failed"] == 1 and not os.path.exists(failed[0])
            sess.run(train, {ids: worker.batch(6, 12)})
            manifest = writer.write(sess)
            assert (manifest["kind"], manifest["from_step"], manifest["to_step"]) == (uf.KIND_DELTA, 3, 7)
            _, tensors = worker.read_update(_paths(udir)[-1])
            removed = set(np.concatenate([tensors[uf.removed_name(s)] for s in worker.SHARDS]).tolist())
            assert set(present[:5]) | evicted <= removed
            worker.assert_same_state(worker.replay(_paths(udir), *start)[:2], worker.table_state(sess, emb))


def _in_mount_namespace(setup, argv):
    """argv run by a shell in a private mount namespace after the shell commands `setup` (as the tiered fault tests:
    nothing outside the worker sees the mount)."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    return unshare + ["sh", "-c", "set -e; %s; exec %s" % (setup, " ".join(shlex.quote(a) for a in argv))]


def test_a_full_disk_fails_the_update_not_training_and_the_next_one_covers_the_range(tmp_path):
    # The updates live on a 1 MiB tmpfs, 900 KiB of it a ballast file: the first update (a few rows) fits, the ones
    # after a 6000-id step (~200 KiB) do not. Training goes on; once the ballast is deleted the next update holds
    # every change since the last one written.
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    cfg = dict(
        updates_dir=str(disk / "updates"),
        out_dir=str(out),
        dim=8,
        steps=8,
        batch_sizes={"2": 6000},
        write_at=[0, 2, 3, 5, 7],
        free_at_step=3,
        free_path=str(disk / "ballast"),
    )
    setup = "mount -t tmpfs -o size=1m tmpfs %s; dd if=/dev/zero of=%s bs=1k count=900 status=none" % (
        shlex.quote(str(disk)),
        shlex.quote(str(disk / "ballast")),
    )
    argv = [sys.executable, _WORKER, json.dumps(cfg)]
    proc = subprocess.run(_in_mount_namespace(setup, argv), capture_output=True, text=True, env=_ENV, timeout=_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "No space left on device" in proc.stderr, proc.stderr[-6000:]
    with open(out / "result.json") as f:
        result = json.load(f)
    writes = result["writes"]
    assert result["global_step"] == 8
    assert writes[0]["to_step"] == 1 and writes[1] is None and writes[2] is None
    assert result["stats"]["failed"] == 2 and result["stats"]["written"] == 3
    assert (writes[3]["kind"], writes[3]["from_step"], writes[3]["to_step"]) == (uf.KIND_DELTA, 1, 6)
    assert writes[4]["from_step"] == 6
    # The tmpfs is gone with the worker's namespace: the worker listed it and replayed its updates at the end.
    assert result["listing"] == [uf.update_dir_name(s) for s in (1, 6, 8)]  # no temporary left
    assert result["replay_error"] is None, result["replay_error"]


def _run_until_paused(cfg):
    proc = subprocess.Popen(
        [sys.executable, _WORKER, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_ENV,
    )
    ready, _, _ = select.select([proc.stdout], [], [], _GUARD_S)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("READY"):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail("the worker did not pause (%r):\n%s" % (line, err.decode()[-6000:]))
    return proc, line.split()[1]


@pytest.mark.parametrize("stage", ["bundle_written", "manifest_written", "renamed"])
def test_a_writer_killed_mid_update_leaves_no_partial_update(tmp_path, stage):
    udir = tmp_path / "updates"
    out = tmp_path / "out"
    out.mkdir()
    cfg = dict(updates_dir=str(udir), out_dir=str(out), steps=3, write_at=[0, 1, 2], pause_at=[stage, 2])
    proc, path = _run_until_paused(cfg)
    try:
        assert os.path.isdir(path), path
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    published = [1, 2] if stage == "renamed" else [1]
    assert [step for step, _ in uf.list_updates(str(udir))] == published
    for step, update in uf.list_updates(str(udir)):
        manifest, tensors = worker.read_update(update)  # complete: its manifest and every tensor read back
        assert manifest["to_step"] == step and tensors[uf.META_TO_STEP] == step
        assert set(tensors) >= {uf.keys_name(s) for s in worker.SHARDS} | {"dense/w", "dense/b"}
    leftovers = [n for n in os.listdir(udir) if n.startswith(uf.TMP_PREFIX)]
    assert len(leftovers) == (0 if stage == "renamed" else 1)
    # The next writer on the directory deletes the leftover and continues past the newest update.
    with tf.Graph().as_default():
        _, emb, ids, train, *_ = worker.build()
        writer = updates.ServingUpdateWriter(str(udir), keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i in range(3):
                sess.run(train, {ids: worker.batch(i, 8)})
            manifest = writer.write(sess)
    assert manifest["to_step"] == 3 and manifest["kind"] == uf.KIND_FULL
    assert not [n for n in os.listdir(udir) if n.startswith(uf.TMP_PREFIX)]


def test_a_new_writer_deletes_snapshots_past_the_chain_and_temporaries(tmp_path):
    # An earlier run wrote update-1 to update-4, with snapshots beside update-2 and update-4; update-3 and update-4
    # were deleted (the job restarts from step 2): the snapshot at 4 is another run's state, under a name this run
    # would write.
    udir = tmp_path / "updates"
    with tf.Graph().as_default():
        _, _, ids, train, *_ = worker.build()
        writer = updates.ServingUpdateWriter(str(udir), full_every=2, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            for i in range(4):
                sess.run(train, {ids: worker.batch(i, 8)})
                writer.write(sess)
    assert [s for s, _ in uf.list_snapshots(str(udir))] == [2, 4]
    for step in (3, 4):
        shutil.rmtree(udir / uf.update_dir_name(step))
    (udir / (uf.TMP_PREFIX + "left")).mkdir()
    with tf.Graph().as_default():
        _, _, ids, train, *_ = worker.build()
        writer = updates.ServingUpdateWriter(str(udir), full_every=2, keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i in range(3):
                sess.run(train, {ids: worker.batch(i, 8)})
            manifest = writer.write(sess)
    assert manifest["to_step"] == 3 and manifest["kind"] == uf.KIND_FULL
    assert sorted(os.listdir(udir)) == [uf.snapshot_dir_name(2)] + [uf.update_dir_name(s) for s in (1, 2, 3)]


def test_keep_never_deletes_what_a_follower_needs(tmp_path):
    udir = str(tmp_path / "updates")
    with tf.Graph().as_default():
        gs, emb, ids, train, _, _, _, untracked = worker.build()
        writer = updates.ServingUpdateWriter(udir, full_every=3, keep=2)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            writer.start(sess)
            start = worker.table_state(sess, emb)
            written = []  # (to_step, kind, whether a snapshot is beside it)
            for i in range(11):
                sess.run(train, {ids: worker.batch(i, 10)})
                if i == 7:
                    sess.run(untracked)  # the 8th update is a full one of the chain
                manifest = writer.write(sess)
                written.append((manifest["to_step"], manifest["kind"], writer.last_snapshot is not None))
                state = worker.table_state(sess, emb)
                fulls = [s for s, kind, snap in written if kind == uf.KIND_FULL or snap]
                listed = [step for step, _ in uf.list_updates(udir)]
                snapshots = [step for step, _ in uf.list_snapshots(udir)]
                if not fulls:
                    assert listed == [s for s, _, _ in written] and not snapshots  # every delta may be needed
                    worker.assert_same_state(worker.replay(_paths(udir), *start)[:2], state)
                    continue
                # The newest `keep` updates, and every update from the newest full one on; the newest snapshot
                # only (none when the newest full one is in the chain).
                newest = fulls[-1]
                kept = [s for s, _, _ in written]
                kept = [s for j, s in enumerate(kept) if j >= len(kept) - 2 or s >= newest]
                assert listed == kept, (listed, written)
                assert snapshots == [s for s, _, snap in written if snap and s == newest], (snapshots, written)
                # A follower at any version resyncs from the newest full one, then applies the updates after it.
                full_path = os.path.join(udir, (uf.snapshot_dir_name if snapshots else uf.update_dir_name)(newest))
                after = [p for s, p in uf.list_updates(udir) if s > newest]
                worker.assert_same_state(worker.replay([full_path] + after)[:2], state)
    kinds = [(kind, snap) for _, kind, snap in written]
    delta, full = uf.KIND_DELTA, uf.KIND_FULL
    assert kinds == [(delta, False), (delta, False), (delta, True)] * 2 + [(delta, False), (full, False)] + [
        (delta, False),
        (delta, False),
        (delta, True),
    ], kinds


def _model_fn(features, labels, mode):
    del labels
    emb = tf_ext.get_dynamic_embedding(
        "user", worker.DIM, num_shards=2, initializer=tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=3)
    )
    x = tf.reduce_sum(tf_ext.embedding_lookup(emb, features["ids"]), axis=1)
    with tf.compat.v1.variable_scope("dense"):
        w = tf.compat.v1.get_variable("w", [worker.DIM, 1], initializer=tf.compat.v1.glorot_uniform_initializer(1))
        b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b - 1.0))
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


def _input_fn(seed):
    def input_fn():
        ids = np.random.RandomState(seed).randint(0, 200, size=(400, 3)).astype(np.int64)
        return tf.compat.v1.data.Dataset.from_tensor_slices({"ids": ids}).batch(4).map(lambda f: (f, tf.zeros([])))

    return input_fn


def _checkpoint_state(path):
    reader = tf.train.load_checkpoint(path)
    tables = {}
    for shard in worker.SHARDS:
        keys, values = reader.get_tensor(shard + "-keys"), reader.get_tensor(shard + "-values")
        tables[shard] = {int(k): v for k, v in zip(keys, values)}
    return (tables, {n: reader.get_tensor(n) for n in worker.DENSE}), int(reader.get_tensor("global_step"))


def test_the_hook_in_an_estimator_writes_increasing_updates_ending_at_the_final_checkpoint(tmp_path):
    udir = str(tmp_path / "updates")
    model_dir = str(tmp_path / "model")
    config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=5, session_config=_session_config())
    est = tf.estimator.Estimator(_model_fn, config=config)
    hook = updates.ServingUpdateHook(udir, every_steps=3, model_name="ctr", keep=None)
    est.train(_input_fn(0), steps=10, hooks=[hook])
    first_run = [step for step, _ in uf.list_updates(udir)]
    assert first_run == [3, 6, 9, 10], first_run
    state, step = _checkpoint_state(tf.train.latest_checkpoint(model_dir))
    assert step == 10
    worker.assert_same_state(worker.replay(_paths(udir))[:2], state)
    # A second train call restores step 10 (the newest update's): its first update is a delta from there.
    est.train(_input_fn(1), steps=7, hooks=[hook])
    listed = uf.list_updates(udir)
    steps = [s for s, _ in listed]
    assert steps == first_run + [13, 16, 17], steps
    assert uf.read_manifest(listed[4][1])["kind"] == uf.KIND_DELTA
    assert uf.read_manifest(listed[4][1])["from_step"] == 10
    state, step = _checkpoint_state(tf.train.latest_checkpoint(model_dir))
    assert step == 17
    tables, dense, version = worker.replay(_paths(udir))
    worker.assert_same_state((tables, dense), state)
    assert version == 17 and hook.writer.stats["failed"] == 0


def test_the_listener_writes_an_update_after_each_checkpoint(tmp_path):
    udir = str(tmp_path / "updates")
    model_dir = str(tmp_path / "model")
    config = tf.estimator.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=4, keep_checkpoint_max=20, session_config=_session_config()
    )
    est = tf.estimator.Estimator(_model_fn, config=config)
    listener = updates.ServingUpdateListener(udir, keep=None, summary_dir=str(tmp_path / "summaries"))
    est.train(_input_fn(0), steps=10, saving_listeners=[listener])
    checkpoints = tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths
    ckpt_steps = [int(p.rsplit("-", 1)[1]) for p in checkpoints]
    assert ckpt_steps == [0, 4, 8, 10]
    listed = uf.list_updates(udir)
    assert [s for s, _ in listed] == ckpt_steps
    # The first one starts the change log at the save at session creation (full, with no row yet); deltas after.
    assert [uf.read_manifest(p)["kind"] for _, p in listed] == ["full", "delta", "delta", "delta"]
    for path, (step, _) in zip(checkpoints, listed):
        state, ckpt_step = _checkpoint_state(path)
        assert ckpt_step == step
        upto = [p for s, p in listed if s <= step]
        worker.assert_same_state(worker.replay(upto)[:2], state)
    summaries = [
        (v.tag, v.simple_value)
        for path in tf.io.gfile.glob(str(tmp_path / "summaries" / "events.*"))
        for event in tf.compat.v1.train.summary_iterator(path)
        for v in event.summary.value
    ]
    assert ("tf_ext/serving_updates/written", 4.0) in summaries and ("tf_ext/serving_updates/failed", 0.0) in summaries


def _session_config():
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)


def test_bad_arguments(tmp_path):
    d = str(tmp_path)
    with pytest.raises(ValueError, match="full_every must be an int >= 1"):
        updates.ServingUpdateWriter(d, full_every=0)
    with pytest.raises(ValueError, match="keep must be an int >= 1 or None"):
        updates.ServingUpdateWriter(d, keep=0)
    with pytest.raises(ValueError, match="model_name must be a name without whitespace"):
        updates.ServingUpdateWriter(d, model_name="my model")
    with pytest.raises(ValueError, match="exactly one of every_secs and every_steps"):
        updates.ServingUpdateHook(d)
    with pytest.raises(ValueError, match="exactly one of every_secs and every_steps"):
        updates.ServingUpdateHook(d, every_secs=5, every_steps=10)
    with pytest.raises(TypeError, match="writer arguments"):
        updates.ServingUpdateHook(updates.ServingUpdateWriter(d), every_steps=1, keep=3)
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("user", 4)
        tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64))
        with pytest.raises(ValueError, match="the graph has no global step"):
            updates.ServingUpdateWriter(d)
    with tf.Graph().as_default():
        worker.build()
        with pytest.raises(ValueError, match="dense_variables names 'nope'"):
            updates.ServingUpdateWriter(d, dense_variables=["nope"])


class _FakeHorovod(object):
    """`horovod.tensorflow` as a rank other than 0 of an initialized job sees it."""

    @staticmethod
    def is_initialized():
        return True

    @staticmethod
    def rank():
        return 1


def test_only_horovod_rank_0_writes(tmp_path, monkeypatch):
    udir = tmp_path / "updates"
    with tf.Graph().as_default():
        gs, emb, ids, train, *_ = worker.build()
        writer = updates.ServingUpdateWriter(str(udir), keep=None)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            monkeypatch.setitem(sys.modules, "horovod.tensorflow", _FakeHorovod())
            writer.start(sess)
            sess.run(train, {ids: worker.batch(0, 8)})
            assert writer.write(sess) is None
            assert not udir.exists()
            # The serving channel was never started on this rank: its removals cost nothing.
            assert not sess.run(emb.shards[0].table.change_log(read_keys=False, channel=updates.SERVING_CHANNEL)[1])
            monkeypatch.delitem(sys.modules, "horovod.tensorflow")
            assert writer.write(sess)["to_step"] == 1


def test_a_model_parallel_embedding_is_refused(tmp_path):
    out = run_fresh(
        """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd
        tfe_hvd.init()
        tf.compat.v1.train.get_or_create_global_step()
        tfe_hvd.get_dynamic_embedding("m", 2, parallelism="model")
        try:
            tf_ext.serving.ServingUpdateWriter(%r)
        except ValueError as e:
            print("ValueError", e)
        """
        % str(tmp_path / "updates"),
        tmp_path,
    )
    assert "ValueError ServingUpdateWriter: dynamic embedding 'm' is model-parallel (ModelParallel)" in out, out
