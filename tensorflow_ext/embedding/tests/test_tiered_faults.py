"""Faults and bad input of tiered embeddings (`tf_ext.TieredStorage`), each scenario in fresh processes.

A full disk mid-training (and space freed again), a trainer killed with SIGKILL, missing, foreign and corrupt store
directories, two processes on one store path (refused) and two tables of one process (the second gets a private
directory), a memory budget smaller than one
batch, unwritable paths, int8 rows, and a machine without the system's RocksDB library. Every process is
`tiered_fault_worker.py` (beside this file), a small Adagrad model on a stream of ids that keeps bringing new keys (so
a small memory tier demotes every step) and old ones (so rows come back from disk); it records what it raised in a
JSON result instead of crashing. The reference of every restored or continued state is the same model in memory (no
tiers), trained over the same steps: tiered training is bit-identical to it.

The disk-full and read-only cases mount a tmpfs (the missing-library case an empty file over the library) in a
private mount namespace of the worker (`unshare -m` as root, else `unshare -rm`, in a user namespace): nothing
outside the worker sees the mount.
"""

import json
import os
import select
import shlex
import signal
import subprocess
import sys

import numpy as np
import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
_WORKER = os.path.join(_HERE, "tiered_fault_worker.py")
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
_GUARD_S = 600  # a guard against hangs only

# The model of most scenarios: 8 columns + Adagrad's 8, 96 new keys and 32 old ones a step. A 48 KiB memory tier
# per shard holds a few hundred rows, so after a few steps most keys live on disk.
_MODEL = dict(dim=8, num_shards=1, new=96, old=32)
_MEMORY = 48 << 10
_TABLE = "'emb/part_0'"  # how errors name the table of the embedding's first shard


def _shard_dir(root, num_shards=1, shard=0, name="emb"):
    """The store directory of one shard of embedding `name` under the TieredStorage path `root`."""
    return os.path.join(root, name, "shard_%d_of_%d" % (shard, num_shards))


def _worker_argv(cfg):
    return [sys.executable, _WORKER, json.dumps(cfg)]


def _in_mount_namespace(setup, argv):
    """argv run by a shell in a private mount namespace after the shell commands `setup` (its mounts)."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    return unshare + ["sh", "-c", "set -e; %s; exec %s" % (setup, " ".join(shlex.quote(a) for a in argv))]


def _run(tmp_path, cfg, tag, wrap=None):
    """Runs the worker with cfg in a fresh process (argv wrapped by `wrap`, if given); returns its result."""
    cfg = dict(cfg, result=str(tmp_path / ("%s.json" % tag)), out_dir=str(tmp_path))
    argv = _worker_argv(cfg)
    proc = subprocess.run(wrap(argv) if wrap else argv, capture_output=True, text=True, env=_ENV, timeout=_GUARD_S)
    assert proc.returncode == 0, "%s: worker failed (%d):\n%s\n%s" % (
        tag,
        proc.returncode,
        proc.stdout[-3000:],
        proc.stderr[-6000:],
    )
    with open(cfg["result"]) as f:
        return json.load(f)


def _state(tmp_path, step):
    with np.load(str(tmp_path / ("state_%d.npz" % step))) as z:
        return dict(z)


def _reference(tmp_path, steps, model=_MODEL):
    """The in-memory model trained to each step of `steps`: {step: state}."""
    ref = tmp_path / "ref"
    ref.mkdir(exist_ok=True)
    result = _run(ref, dict(model, tier=None, steps=max(steps), dump_at=sorted(steps)), "reference")
    assert result["error"] is None, result
    return {s: _state(ref, s) for s in steps}


def _assert_same_state(got, want, what):
    assert sorted(got) == sorted(want), what
    assert got["keys"].size == want["keys"].size, "%s: %d keys, expected %d" % (
        what,
        got["keys"].size,
        want["keys"].size,
    )
    for name in sorted(want):
        np.testing.assert_array_equal(got[name], want[name], err_msg="%s: %s" % (what, name))


def _tier(path, memory_bytes=_MEMORY, **kwargs):
    return dict(memory_bytes=memory_bytes, path=str(path), **kwargs)


def _stat(result, name):
    """A tier statistic summed over the shards."""
    return int(np.sum(result["stats"][name]))


def _spawn_with_ready_pipe(tmp_path, cfg, tag, stdin=None):
    """Starts the worker with a pipe on which it reports readiness; returns (proc, read end, result path)."""
    r, w = os.pipe()
    cfg = dict(cfg, ready_fd=w, result=str(tmp_path / ("%s.json" % tag)), out_dir=str(tmp_path))
    proc = subprocess.Popen(
        _worker_argv(cfg),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_ENV,
        pass_fds=(w,),
    )
    os.close(w)  # the child holds the only write end: EOF if it dies before reporting
    return proc, r, cfg["result"]


def _read_ready(proc, r):
    """Blocks until the worker writes its READY line (or closes the pipe by dying); returns the line."""
    ready, _, _ = select.select([r], [], [], _GUARD_S)
    line = os.read(r, 100) if ready else b""
    if not line.startswith(b"READY"):
        proc.kill()
        out, err = proc.communicate()
        pytest.fail("worker did not report readiness (%r):\n%s\n%s" % (line, out[-2000:], err[-6000:].decode()))
    return line.decode().split()


# --- a full disk --------------------------------------------------------------------------------------------------


def test_disk_full_mid_training_fails_the_step_keeps_every_row_and_the_last_checkpoint_has_every_key(tmp_path):
    # The store sits on a 4 MiB tmpfs; each step demotes ~300 KiB of rows, so the first flush of the store's memtable
    # finds the disk full. Checkpoints go to the real disk every 5 steps. The step that cannot write is a
    # ResourceExhaustedError naming the store's path. The latest checkpoint restores, in fresh processes, into an
    # in-memory embedding and into a tiered one on a healthy disk, each with exactly the keys, rows, slots and
    # metadata of the in-memory model trained to that step. And the trainer itself lost no row: a save right after
    # the failure holds every key of the in-memory model at the step before the failed one, with its row and slots
    # (the failed step may have added its new keys and counted a lookup, but applied no update), and no other key.
    disk = tmp_path / "disk"
    disk.mkdir()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model = dict(_MODEL, dim=32, new=1024, old=256)
    cfg = dict(model, tier=_tier(disk / "store", 1 << 20), ckpt_dir=str(ckpt), save_every=5, steps=2000)
    mount = "mount -t tmpfs -o size=4m tmpfs %s" % shlex.quote(str(disk))
    result = _run(
        tmp_path, dict(cfg, save_after_error=True), "full", wrap=lambda argv: _in_mount_namespace(mount, argv)
    )
    error = result["error"]
    assert error is not None, "the 4 MiB disk never filled in 2000 steps: %s" % result
    assert error["class"] == "ResourceExhaustedError", error
    assert error["stage"] == "train", error
    assert _shard_dir(str(disk / "store")) in error["message"], error
    assert "no space left on device" in error["message"].lower(), error
    assert result["saved"], "no checkpoint before the disk filled: %s" % result
    last = result["saved"][-1]
    assert last <= error["step"], (last, error)
    refs = _reference(tmp_path, sorted({last, error["step"]}), model)
    want = refs[last]

    for tier, tag in ((None, "restored_in_memory"), (_tier(tmp_path / "healthy"), "restored_tiered")):
        out = tmp_path / tag
        out.mkdir()
        got = _run(out, dict(model, tier=tier, ckpt_dir=str(ckpt), restore=True, steps=0, dump_at=[last]), tag)
        assert got["error"] is None, got
        _assert_same_state(_state(out, last), want, tag)
    assert _stat(got, "disk_keys") > 0, got  # the tiered restore put most rows on disk

    # The save after the failure, against the in-memory model at the step that failed.
    out = tmp_path / "after_error"
    out.mkdir()
    restore_from = str(ckpt / "after_error")
    got = _run(out, dict(model, tier=None, restore=True, restore_from=restore_from, dump_restored=True), "after")
    assert got["error"] is None, got
    after = dict(np.load(str(out / "state_restored.npz")))
    before = refs[error["step"]]
    held = np.isin(after["keys"], before["keys"])
    np.testing.assert_array_equal(after["keys"][held], before["keys"])
    np.testing.assert_array_equal(after["values"][held], before["values"])
    np.testing.assert_array_equal(after["slots"][held], before["slots"])
    extra = after["keys"][~held]
    assert np.isin(extra, np.asarray(result["error_ids"], np.int64)).all(), extra


def test_training_goes_on_once_space_is_freed(tmp_path):
    # The store's disk has 8 MiB free when training starts (a 56 MiB ballast file on a 64 MiB tmpfs): the first flush
    # of the store's memtable fails, and so does the step. The trainer then deletes the ballast and runs the step
    # again, as a job would after an operator freed space: training goes on to step 100 with no other error, and
    # ends with the rows, slots and metadata of the in-memory model, except that the keys of the step that failed
    # may count one more lookup (the failed step's lookup had run).
    disk = tmp_path / "disk"
    disk.mkdir()
    model = dict(_MODEL, dim=32, new=1024, old=256)
    ballast = disk / "ballast"
    cfg = dict(model, tier=_tier(disk / "store", 1 << 20), steps=100, dump_at=[100], ballast=str(ballast))
    mount = "mount -t tmpfs -o size=64m tmpfs %s; dd if=/dev/zero of=%s bs=1M count=56 status=none" % (
        shlex.quote(str(disk)),
        shlex.quote(str(ballast)),
    )
    result = _run(tmp_path, cfg, "freed", wrap=lambda argv: _in_mount_namespace(mount, argv))
    first = result.get("first_error")
    assert first is not None, "the disk never filled: %s" % result
    assert first["class"] == "ResourceExhaustedError", first
    assert _shard_dir(str(disk / "store")) in first["message"], first
    assert result["error"] is None and result["step"] == 100, result
    assert _stat(result, "disk_keys") > 0, result["stats"]
    want = _reference(tmp_path, [100], model)[100]
    got = _state(tmp_path, 100)
    failed = np.isin(want["keys"], np.asarray(result["first_error_ids"], np.int64))
    extra = got["freqs"].astype(np.int64) - want["freqs"].astype(np.int64)
    assert set(np.unique(extra[failed])) <= {0, 1}, np.unique(extra[failed])
    assert not extra[~failed].any()
    got["freqs"] = want["freqs"]
    _assert_same_state(got, want, "trained on after the disk filled and space came back")


# --- a trainer killed ---------------------------------------------------------------------------------------------


def _train_and_kill(tmp_path, cfg, save_at, kill_after):
    """Runs a tiered trainer that saves after step save_at and is killed with SIGKILL once it has finished step
    kill_after (it trains on meanwhile: its next steps and demotions are in flight)."""
    killed = tmp_path / "killed"
    killed.mkdir()
    cfg = dict(cfg, save_at=[save_at], ready_after=kill_after, steps=100000)
    proc, r, _ = _spawn_with_ready_pipe(killed, cfg, "killed")
    try:
        assert _read_ready(proc, r) == ["READY", str(kill_after)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=_GUARD_S)
    finally:
        os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    assert os.path.exists(os.path.join(cfg["ckpt_dir"], "model-%d.index" % save_at)), os.listdir(cfg["ckpt_dir"])


def _left_databases(shard):
    """The database directories (db-<n>) in a store directory: a store that closed removed its own."""
    return sorted(n for n in os.listdir(shard) if n.startswith("db-"))


@pytest.mark.parametrize("num_shards", [1, 2])
def test_sigkill_mid_training_then_restart_from_the_checkpoint_loses_nothing(tmp_path, num_shards):
    # A tiered trainer saves at step 10, trains on (demoting every step) and is killed with SIGKILL after step 13.
    # The store directories it leaves are ours (marked, with their databases): a restart on the same path wipes
    # them, restores step 10 with every key of the in-memory model at step 10, and trains on to step 16 exactly as
    # that model does.
    store = tmp_path / "store"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model = dict(_MODEL, num_shards=num_shards)
    cfg = dict(model, tier=_tier(store, _MEMORY * num_shards), ckpt_dir=str(ckpt))
    _train_and_kill(tmp_path, cfg, save_at=10, kill_after=13)
    shards = [_shard_dir(str(store), num_shards, i) for i in range(num_shards)]
    for shard in shards:
        assert "TF_EXT_TIER_STORE" in os.listdir(shard), os.listdir(shard)
        assert _left_databases(shard), os.listdir(shard)

    want = _reference(tmp_path, [10, 16], model)
    restart = tmp_path / "restart"
    restart.mkdir()
    got = _run(restart, dict(cfg, restore=True, steps=16, dump_at=[10, 16]), "restart")
    assert got["error"] is None, got
    _assert_same_state(_state(restart, 10), want[10], "restored at step 10")
    _assert_same_state(_state(restart, 16), want[16], "trained on to step 16")
    assert _stat(got, "disk_keys") > 0 and _stat(got, "cold_reads") > 0, got["stats"]
    for shard in shards:  # the killed trainer's databases went with the wipe
        assert _left_databases(shard) == [], os.listdir(shard)


# --- store directories --------------------------------------------------------------------------------------------


def test_missing_store_directory_is_created_with_its_parents(tmp_path):
    root = tmp_path / "a" / "b" / "c"
    want = _reference(tmp_path, [8])
    got = _run(tmp_path, dict(_MODEL, tier=_tier(root), steps=8, dump_at=[8]), "created")
    assert got["error"] is None, got
    assert "TF_EXT_TIER_STORE" in os.listdir(_shard_dir(str(root)))
    assert _stat(got, "disk_keys") > 0 and _stat(got, "demotions") > 0, got["stats"]
    _assert_same_state(_state(tmp_path, 8), want[8], "trained in a created store directory")


def test_foreign_directory_is_refused_naming_the_path_and_its_files_are_untouched(tmp_path):
    # A directory with files of someone else (no marker of ours) where a shard's store would go: the table is not
    # created, the error names the directory, and every file stays as it was.
    root = tmp_path / "store"
    foreign = _shard_dir(str(root))
    os.makedirs(os.path.join(foreign, "sub"))
    files = {"notes.txt": b"keep me\n", "000001.sst": b"not ours", os.path.join("sub", "CURRENT"): b"MANIFEST-9\n"}
    for name, data in files.items():
        with open(os.path.join(foreign, name), "wb") as f:
            f.write(data)
    before = {name: os.stat(os.path.join(foreign, name)) for name in files}
    got = _run(tmp_path, dict(_MODEL, tier=_tier(root), steps=2), "foreign")
    error = got["error"]
    assert error is not None, got
    assert error["class"] == "FailedPreconditionError", error
    assert foreign in error["message"] and _TABLE in error["message"], error
    assert "not a tf_ext tier store" in error["message"], error
    assert error["step"] in (None, 0), error  # refused at creation: nothing trained
    assert sorted(os.listdir(foreign)) == sorted(["notes.txt", "000001.sst", "sub"])
    assert os.listdir(os.path.join(foreign, "sub")) == ["CURRENT"]
    for name, data in files.items():
        path = os.path.join(foreign, name)
        with open(path, "rb") as f:
            assert f.read() == data, name
        assert os.stat(path).st_mtime_ns == before[name].st_mtime_ns, name


def test_corrupt_store_directory_is_wiped_and_rebuilt_from_the_checkpoint(tmp_path):
    # A trainer saves at step 6 and is killed after step 8, leaving its (marked) store directory. Every file of its
    # database is then overwritten with garbage, and garbage table and manifest files are added. A restart on the
    # same path wipes the directory, restores step 6 and trains on to step 12 exactly as the in-memory model does.
    store = tmp_path / "store"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = dict(_MODEL, tier=_tier(store), ckpt_dir=str(ckpt))
    _train_and_kill(tmp_path, cfg, save_at=6, kill_after=8)
    shard = _shard_dir(str(store))
    garbage = b"\x00garbage\xff" * 100
    corrupted = []
    for db in _left_databases(shard):
        for name in os.listdir(os.path.join(shard, db)):
            with open(os.path.join(shard, db, name), "wb") as f:
                f.write(garbage)
            corrupted.append(name)
        for name in ("000999.sst", "MANIFEST-000999"):
            with open(os.path.join(shard, db, name), "wb") as f:
                f.write(garbage)
    assert "CURRENT" in corrupted and any(n.startswith("MANIFEST") for n in corrupted), corrupted
    with open(os.path.join(shard, "000998.sst"), "wb") as f:
        f.write(garbage)

    want = _reference(tmp_path, [6, 12])
    restart = tmp_path / "restart"
    restart.mkdir()
    got = _run(restart, dict(cfg, restore=True, steps=12, dump_at=[6, 12]), "restart")
    assert got["error"] is None, got
    _assert_same_state(_state(restart, 6), want[6], "restored over a corrupt store")
    _assert_same_state(_state(restart, 12), want[12], "trained on over a corrupt store")
    assert _stat(got, "disk_keys") > 0 and _stat(got, "cold_reads") > 0, got["stats"]
    assert sorted(os.listdir(shard)) == ["TF_EXT_TIER_STORE", "TF_EXT_TIER_STORE.lock"], os.listdir(shard)


# --- one store path, two users ------------------------------------------------------------------------------------


def test_second_process_on_one_path_is_refused_until_the_first_closes(tmp_path):
    # Process A trains a step and holds its store open; process B on the same path is refused with an error naming
    # the path and A's pid, and A's store is unharmed (A trains no further but closes cleanly). Once A has exited,
    # process C opens the path.
    store = tmp_path / "store"
    cfg = dict(_MODEL, tier=_tier(store), steps=2)
    holder_dir = tmp_path / "holder"
    holder_dir.mkdir()
    holder, r, holder_result = _spawn_with_ready_pipe(holder_dir, dict(cfg, hold=True), "holder", subprocess.PIPE)
    try:
        ready = _read_ready(holder, r)
        assert ready == ["READY", str(holder.pid)], ready
        second = _run(tmp_path, cfg, "second")
        _, err = holder.communicate(input=b"", timeout=_GUARD_S)  # EOF on its stdin: A closes its store, exits
    finally:
        os.close(r)
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, err[-6000:]
    with open(holder_result) as f:
        held = json.load(f)
    assert held["error"] is None and held["step"] == 1, held
    error = second["error"]
    assert error is not None, second
    assert error["class"] == "FailedPreconditionError", error
    assert _shard_dir(str(store)) in error["message"] and _TABLE in error["message"], error
    assert str(holder.pid) in error["message"], error
    assert error["step"] in (None, 0), error
    third = _run(tmp_path, cfg, "third")
    assert third["error"] is None and third["step"] == 2, third


def test_second_table_in_one_process_on_one_path_gets_a_private_directory_deleted_when_it_closes(tmp_path):
    # Two sessions of one process, each with its own table of the same embedding on the same path (as an evaluation
    # graph beside training): the second keeps its disk tier in the sibling directory shard_0_of_1.1, deleted when
    # its session is, and trains like the in-memory model; the first keeps its directory and trains on, unharmed.
    # A 16 KiB memory tier holds ~100 rows: both tables demote and read rows back from disk.
    # (A second PROCESS on the path is still refused: test_second_process_on_one_path_is_refused_until_the_first_closes.)
    store = tmp_path / "store"
    cfg = dict(_MODEL, tier=_tier(store, memory_bytes=16 << 10), steps=3, twin=True, twin_steps=3, dump_at=[4])
    got = _run(tmp_path, cfg, "twin")
    assert got["error"] is None and got["twin_error"] is None, got
    assert got["step"] == 4, got
    assert got["twin_dirs_open"] == ["shard_0_of_1", "shard_0_of_1.1"], got
    assert got["twin_dirs_closed"] == ["shard_0_of_1"], got
    assert sorted(os.listdir(str(store / "emb"))) == ["shard_0_of_1"]
    want = _reference(tmp_path, [3, 4])
    _assert_same_state(dict(np.load(str(tmp_path / "twin_state_3.npz"))), want[3], "the second table, steps 0-2")
    _assert_same_state(_state(tmp_path, 4), want[4], "the first table, steps 0-3 around the second")
    for stats, which in ((got["twin_stats"], "second"), (got["stats"], "first")):
        assert np.sum(stats["disk_keys"]) > 0 and np.sum(stats["cold_reads"]) > 0, (which, stats)


# --- bad configuration --------------------------------------------------------------------------------------------


def test_memory_budget_smaller_than_one_batch_is_a_clear_error_that_changes_nothing(tmp_path):
    # 4096 distinct keys in one batch, a 64 KiB budget of a few hundred rows: the step fails with an error naming the
    # budget and the batch's rows, inserts nothing, and a batch that fits then trains.
    memory = 64 << 10
    cfg = dict(_MODEL, new=4096, old=0, tier=_tier(tmp_path / "store", memory_bytes=memory), steps=1, retry_new=64)
    got = _run(tmp_path, cfg, "small")
    error = got["error"]
    assert error is not None, got
    assert error["class"] == "InvalidArgumentError", error
    assert "memory_bytes=%d" % memory in error["message"] and _TABLE in error["message"], error
    assert "4096 rows" in error["message"], error
    assert got["size_after_retry"] == 64, got


@pytest.mark.parametrize("case", ["under_a_file", "read_only_mount", "read_only_existing_directory"])
def test_unwritable_path_is_an_error_at_creation_naming_it(tmp_path, case):
    # Root writes anywhere whatever the permission bits, so "unwritable" is a path below a regular file, or a
    # read-only filesystem (a tmpfs mounted read-only in the worker's mount namespace) with or without the shard's
    # directory already there.
    wrap = None
    if case == "under_a_file":
        (tmp_path / "file").write_bytes(b"a file, not a directory")
        root = tmp_path / "file" / "store"
    else:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        root = mnt / "store"
        if case == "read_only_mount":
            setup = "mount -t tmpfs -o ro,size=1m tmpfs %s" % shlex.quote(str(mnt))
        else:
            quoted = shlex.quote(str(mnt))
            setup = "mount -t tmpfs -o size=1m tmpfs %s && mkdir -p %s && mount -o remount,ro %s" % (
                quoted,
                shlex.quote(_shard_dir(str(root))),
                quoted,
            )
        wrap = lambda argv: _in_mount_namespace(setup, argv)  # noqa: E731
    got = _run(tmp_path, dict(_MODEL, tier=_tier(root), steps=2), case, wrap=wrap)
    error = got["error"]
    assert error is not None, got
    assert error["step"] in (None, 0), error  # at creation: nothing trained
    assert error["class"] in ("FailedPreconditionError", "PermissionDeniedError", "InternalError"), error
    path = _shard_dir(str(root)) if case == "read_only_existing_directory" else str(root)
    assert path in error["message"] and _TABLE in error["message"], error


def test_int8_rows_are_refused_for_tiered_storage(tmp_path):
    # int8 rows are a serving format (re-quantizing a row that comes back from disk is not exact): an int8 embedding
    # with tiered storage is refused when built, and so is a tiered embedding built for an int8 export.
    got = _run(tmp_path, dict(_MODEL, tier=_tier(tmp_path / "a"), value_dtype="int8", steps=1), "value_dtype")
    error = got["error"]
    assert error is not None and error["class"] == "ValueError" and error["stage"] == "build", got
    assert "int8" in error["message"], error
    cfg = dict(_MODEL, tier=_tier(tmp_path / "b"), export_rows="int8", train=False, steps=1)
    got = _run(tmp_path, cfg, "export_rows")
    error = got["error"]
    assert error is not None, got
    assert error["class"] in ("ValueError", "InvalidArgumentError"), error
    assert "int8" in error["message"] and "tier" in error["message"].lower(), error
    assert not os.path.exists(str(tmp_path / "b" / "emb")), "a refused table made its store directory"


def test_without_the_system_rocksdb_library_only_tiered_storage_fails_naming_the_package(tmp_path):
    # A machine that never installed librocksdb: the library is hidden (an empty file bind-mounted over it in the
    # worker's mount namespace). tensorflow_ext imports and in-memory embeddings train; a tiered one fails at
    # creation with an error naming the package to install.
    plugin = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "_tf_ext_rocksdb_store.so")
    ldd = subprocess.run(["ldd", plugin], capture_output=True, text=True, check=True).stdout
    library = [line.split("=>")[1].split()[0] for line in ldd.splitlines() if "librocksdb" in line]
    assert len(library) == 1, ldd
    hide = "mount --bind /dev/null %s" % shlex.quote(os.path.realpath(library[0]))
    wrap = lambda argv: _in_mount_namespace(hide, argv)  # noqa: E731
    got = _run(tmp_path, dict(_MODEL, tier=None, steps=2), "in_memory", wrap=wrap)
    assert got["error"] is None and got["step"] == 2, got
    got = _run(tmp_path, dict(_MODEL, tier=_tier(tmp_path / "store"), steps=2), "tiered", wrap=wrap)
    error = got["error"]
    assert error is not None, got
    assert error["class"] == "FailedPreconditionError", error
    assert error["step"] in (None, 0), error
    assert "apt-get install librocksdb7.8" in error["message"], error
