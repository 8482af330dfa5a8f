"""The follower's rules on an updates directory, against a model that applies by the version rule of the live ops.

`FakeModel` applies an update the way a live model does (update_format's version rule: stale, gap, applied; another
model refused; a damaged bundle refused), from the manifest and a one-line stand-in for the bundle, so these tests
check the follower's order, gap, resync and refusal decisions alone. test_follow_bad_input.py and
test_live_atomic.py run the same rules against real exports and trainer-written updates.
"""

import os
import shutil
import threading
import time
import uuid

import pytest
import tensorflow as tf

from tensorflow_ext.serving import update_format
from tensorflow_ext.serving.follow import MAX_RETRIES
from tensorflow_ext.serving.follow import SUMMARY_TAGS
from tensorflow_ext.serving.follow import Follower

import tensorflow_ext as tf_ext

MODEL = "ctr"
BUNDLE_OK = "bundle ok"


class FakeModel(object):
    """A live model's version rule over updates written by `write_update`; records every apply it is asked for."""

    model_name = MODEL

    def __init__(self, version, before_apply=None):
        self._version = version
        self._lock = threading.Lock()
        self.calls = []  # the update directories' names, in the order apply was called
        self.closed = False
        self.before_apply = before_apply  # called with the path before an apply (another applier, in a test)
        self.failures = {}  # directory name -> the errors its next applies raise, in order (a test's faults)

    def version(self):
        return self._version

    def apply(self, path):
        if self.before_apply is not None:
            self.before_apply(path)
        with self._lock:
            self.calls.append(os.path.basename(path))
            if self.failures.get(os.path.basename(path)):
                raise self.failures[os.path.basename(path)].pop(0)
            manifest = update_format.read_manifest(path)
            with open(os.path.join(path, "update.index")) as f:
                if f.read() != BUNDLE_OK:
                    raise tf.errors.DataLossError(None, None, "the bundle %s is corrupt" % path)
            if manifest["model_name"] != MODEL:
                raise tf.errors.InvalidArgumentError(
                    None, None, "update for model '%s', this model is '%s'" % (manifest["model_name"], MODEL)
                )
            v = self._version
            if manifest["to_step"] <= v:
                return v, False
            if manifest["kind"] == update_format.KIND_DELTA and manifest["from_step"] > v:
                raise tf.errors.FailedPreconditionError(None, None, "gap at %d" % v)
            self._version = manifest["to_step"]
            return self._version, True

    def predict(self, feeds, signature="serving_default"):
        return {"echo": feeds}, self._version

    def close(self):
        self.closed = True


def write_update(
    updates_dir, kind, from_step, to_step, model_name=MODEL, bundle=BUNDLE_OK, created_unix=None, dir_name=None
):
    """Publishes an update directory (`dir_name`, default the chain's update at to_step) as a trainer does: a
    temporary directory renamed when complete."""
    os.makedirs(updates_dir, exist_ok=True)
    tmp = os.path.join(updates_dir, update_format.TMP_PREFIX + uuid.uuid4().hex)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "update.index"), "w") as f:
        f.write(bundle)
    update_format.write_manifest(
        tmp,
        dict(
            format=update_format.FORMAT_VERSION,
            model_name=model_name,
            kind=kind,
            from_step=from_step,
            to_step=to_step,
            layout=update_format.layout([update_format.table_entry("emb/part_0", 4)]),
            created_unix=time.time() if created_unix is None else created_unix,
            keys=3,
            removed=0,
        ),
    )
    path = os.path.join(updates_dir, dir_name or update_format.update_dir_name(to_step))
    os.rename(tmp, path)
    return path


def delta(d, a, b, **kw):
    return write_update(d, update_format.KIND_DELTA, a, b, **kw)


def full(d, b, **kw):
    return write_update(d, update_format.KIND_FULL, 0, b, **kw)


def snapshot(d, b, kind=update_format.KIND_FULL, **kw):
    """A full snapshot beside the chain (`full-<b>`)."""
    return write_update(d, kind, 0, b, dir_name=update_format.snapshot_dir_name(b), **kw)


def name(step):
    return update_format.update_dir_name(step)


def snapshot_name(step):
    return update_format.snapshot_dir_name(step)


class Events(list):
    """An on_event recorder: [(kind, message)]."""

    def __call__(self, kind, message):
        self.append((kind, message))

    def kinds(self):
        return [k for k, _ in self]


def _follower(model, updates_dir, **kw):
    events = Events()
    return Follower(model, updates_dir, start=False, on_event=events, **kw), events


def test_applies_the_new_updates_in_order_and_never_reads_the_old_ones(tmp_path):
    d = str(tmp_path / "updates")
    delta(d, 0, 5)  # the export's version already reflects it
    full(d, 3)
    delta(d, 5, 8)
    delta(d, 8, 12)
    full(d, 15)
    os.makedirs(os.path.join(d, update_format.TMP_PREFIX + "half-written"))  # a temporary is never listed
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 3
    assert model.calls == [name(8), name(12), name(15)]
    stats = follower.stats
    assert (stats["version"], stats["applied"], stats["stale"], stats["refused"], stats["resyncs"]) == (15, 3, 0, 0, 0)
    assert stats["waiting"] is None and stats["last_error"] is None
    assert events.kinds() == ["applied"] * 3
    assert follower.version == 15
    assert follower.poll_once() == 0  # nothing new: nothing read
    assert model.calls == [name(8), name(12), name(15)]
    assert follower.stats["polls"] == 2
    follower.close()
    assert model.closed


def test_a_follower_started_before_any_update_serves_the_export_then_follows(tmp_path):
    d = str(tmp_path / "not_yet")
    model = FakeModel(7)
    follower, _ = _follower(model, d)
    assert follower.poll_once() == 0
    assert follower.version == 7 and follower.stats["last_error"] is None
    delta(d, 7, 9)
    assert follower.poll_once() == 1
    assert follower.version == 9 and model.calls == [name(9)]
    follower.close()


def test_a_gap_applies_nothing_until_the_missing_update_arrives(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 9, 12)
    delta(d, 12, 13)
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert model.calls == []  # a gap is not even tried
    stats = follower.stats
    assert stats["version"] == 5 and stats["refused"] == 0
    assert stats["waiting"] == (
        "served version 5; the next update %s holds the changes from step 9 to 12: waiting for the updates before "
        "it or a full update" % name(12)
    )
    assert stats["last_error"] == stats["waiting"]
    assert follower.poll_once() == 0
    assert events.kinds() == ["gap"]  # said once while the gap stays the same
    delta(d, 5, 9)
    assert follower.poll_once() == 3
    assert model.calls == [name(9), name(12), name(13)]
    assert follower.stats["waiting"] is None and follower.version == 13
    follower.close()


def test_a_gap_resyncs_from_the_newest_full_update_past_it(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 9, 12)  # gap at 5
    full(d, 14)
    delta(d, 14, 15)
    full(d, 16)
    delta(d, 16, 20)
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 2
    assert model.calls == [name(16), name(20)]
    stats = follower.stats
    assert (stats["version"], stats["applied"], stats["resyncs"], stats["refused"]) == (20, 2, 1, 0)
    assert stats["waiting"] is None
    assert events.kinds() == ["resync", "applied"]
    follower.close()


def test_a_corrupt_update_is_refused_once_and_read_again_only_when_its_directory_changes(tmp_path):
    d = str(tmp_path / "u")
    bad = delta(d, 5, 9, bundle="garbage")
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    stats = follower.stats
    assert stats["refused"] == 1 and stats["version"] == 5
    assert (
        "refused %s (version 5 keeps serving): DataLossError: the bundle %s is corrupt" % (name(9), bad)
        == stats["last_error"]
    )
    delta(d, 9, 12)
    assert follower.poll_once() == 0  # update-9 not read again; update-12 waits for it
    assert model.calls == [name(9)]
    assert follower.stats["refused"] == 1
    assert "from step 9 to 12" in follower.stats["waiting"]
    with open(os.path.join(bad, "update.index"), "w") as f:  # the trainer rewrote it
        f.write(BUNDLE_OK)
    assert follower.poll_once() == 2
    assert model.calls == [name(9), name(9), name(12)]
    assert follower.version == 12 and follower.stats["refused"] == 1
    assert events.kinds() == ["refused", "gap", "applied", "applied"]
    follower.close()


def test_a_refused_update_that_is_replaced_by_a_new_directory_is_read_again(tmp_path):
    d = str(tmp_path / "u")
    bad = delta(d, 5, 9, model_name="other")
    model = FakeModel(5)
    follower, _ = _follower(model, d)
    assert follower.poll_once() == 0
    assert "update for model 'other', this model is 'ctr'" in follower.stats["last_error"]
    shutil.rmtree(bad)
    assert follower.poll_once() == 0
    delta(d, 5, 9)
    assert follower.poll_once() == 1
    assert model.calls == [name(9), name(9)] and follower.version == 9
    follower.close()


def test_a_foreign_update_is_refused_and_a_later_full_update_serves(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 5, 9, model_name="other")
    delta(d, 9, 12)
    full(d, 14)
    delta(d, 14, 15)
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 2
    assert model.calls == [name(9), name(14), name(15)]  # update-12 is past the refused one: skipped by the resync
    stats = follower.stats
    assert (stats["version"], stats["refused"], stats["resyncs"], stats["applied"]) == (15, 1, 1, 2)
    assert events.kinds() == ["refused", "resync", "applied"]
    assert "update for model 'other', this model is 'ctr'" in events[0][1]
    follower.close()


@pytest.mark.parametrize(
    "manifest, message",
    [
        ("{not json", "cannot read MANIFEST.json"),
        ('{"format": 1}', "manifest field 'model_name' must be str, got None"),
        (None, "cannot read MANIFEST.json"),
        ("to_step", "its manifest's to_step is 11, its name says 9"),
    ],
)
def test_a_bad_manifest_is_refused_without_applying(tmp_path, manifest, message):
    d = str(tmp_path / "u")
    path = delta(d, 5, 9)
    manifest_path = os.path.join(path, update_format.MANIFEST_NAME)
    if manifest is None:
        os.remove(manifest_path)
    elif manifest == "to_step":  # an update under another update's name
        os.remove(manifest_path)
        other = delta(str(tmp_path / "other"), 5, 11)
        shutil.copy(os.path.join(other, update_format.MANIFEST_NAME), manifest_path)
    else:
        with open(manifest_path, "w") as f:
            f.write(manifest)
    model = FakeModel(5)
    follower, _ = _follower(model, d)
    assert follower.poll_once() == 0
    assert model.calls == []
    assert follower.stats["refused"] == 1 and follower.version == 5
    assert message in follower.stats["last_error"] and name(9) in follower.stats["last_error"]
    assert follower.poll_once() == 0 and follower.stats["refused"] == 1  # not read again
    full(d, 10)
    assert follower.poll_once() == 1 and follower.version == 10
    follower.close()


def test_an_update_another_applier_applied_first_is_stale(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 5, 9)
    delta(d, 9, 12)
    model = FakeModel(5)
    other = {"done": False}

    def another_applier(path):  # applies update-9 and update-12 just before the follower's first apply
        if not other["done"]:
            other["done"] = True
            model.apply(os.path.join(d, name(9)))
            model.apply(os.path.join(d, name(12)))

    model.before_apply = another_applier
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    stats = follower.stats
    assert (stats["version"], stats["applied"], stats["stale"], stats["refused"]) == (12, 0, 1, 0)
    assert events.kinds() == ["stale"]  # update-12 is below the version the stale apply returned: not tried
    follower.close()


def test_lag_is_from_the_updates_creation_to_when_it_was_served(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 5, 9, created_unix=time.time() - 100.0)
    follower, _ = _follower(FakeModel(5), d)
    follower.poll_once()
    stats = follower.stats
    assert stats["lag_seconds"] >= 100.0
    assert stats["last_apply_seconds"] >= 0.0
    follower.close()


def test_the_background_thread_follows_and_close_stops_it(tmp_path):
    d = str(tmp_path / "u")
    model = FakeModel(5)
    events = Events()
    follower = Follower(model, d, poll_secs=0.01, on_event=events)
    delta(d, 5, 9)
    assert follower.wait_for_version(9, timeout=120.0)  # the timeout guards against a hang only
    full(d, 20)
    assert follower.wait_for_version(20, timeout=120.0)
    follower.close()
    assert model.closed and follower.version == 20
    assert not follower.wait_for_version(21, timeout=120.0)  # closed: returns at once
    with pytest.raises(RuntimeError, match="closed"):
        follower.poll_once()
    follower.close()  # a second close does nothing


def test_summaries_hold_the_served_version_and_counts(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 5, 9)
    delta(d, 9, 12, model_name="other")
    full(d, 14)
    follower, _ = _follower(FakeModel(5), d, summary_dir=str(tmp_path / "summaries"))
    follower.poll_once()
    follower.close()
    last = {}
    steps = {}
    for path in sorted((tmp_path / "summaries").iterdir()):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                last[value.tag] = value.simple_value
                steps[value.tag] = event.step
    assert set(last) == set(SUMMARY_TAGS)
    assert last["tf_ext/serving/version"] == 14 and steps["tf_ext/serving/version"] == 14
    assert last["tf_ext/serving/updates_applied"] == 2
    assert last["tf_ext/serving/updates_refused"] == 1
    assert last["tf_ext/serving/resyncs"] == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="poll_secs must be > 0, got 0"):
        Follower(FakeModel(0), "/nonexistent", poll_secs=0, start=False)


def test_the_package_names_and_a_model_that_is_not_updatable(tmp_path):
    assert callable(tf_ext.serving.follow)  # the module is callable: the function
    assert tf_ext.serving.Follower is Follower
    assert tf_ext.serving.follow.Follower is Follower
    export = str(tmp_path / "plain")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        builder = tf.compat.v1.saved_model.Builder(export)
        signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": x * 2.0})
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    with pytest.raises(ValueError) as info:
        tf_ext.serving.follow(export, str(tmp_path / "updates"), start=False)
    assert str(info.value) == (
        "the SavedModel %s is not updatable: it has no tf_ext_apply_update or tf_ext_served_version signature "
        "(it has ['serving_default']); export it inside tf_ext.serving.freeze_for_serving(live_model=...)" % export
    )


def test_the_background_thread_survives_a_failing_listing(tmp_path):
    d = str(tmp_path / "u")
    with open(d, "w") as f:  # not a directory: listing it fails
        f.write("x")
    failed = threading.Event()
    events = Events()

    def on_event(kind, message):
        events(kind, message)
        if kind == "error":
            failed.set()

    follower = Follower(FakeModel(5), d, poll_secs=0.01, on_event=on_event)
    try:
        assert failed.wait(120.0)  # guards against a hang only
        assert "polling %s failed: NotADirectoryError" % d in follower.stats["last_error"]
        os.remove(d)
        delta(d, 5, 9)
        assert follower.wait_for_version(9, timeout=120.0)
    finally:
        follower.close()
    assert events.kinds().count("error") == 1  # said once however many polls failed
    assert events.kinds()[-1] == "applied"


def test_snapshots_are_read_only_to_resync_a_model_the_chain_cannot_take(tmp_path):
    # The trainer's periodic full updates are snapshots beside a chain of deltas: a follower that the chain can take
    # applies deltas only (no table rebuilt); one older than the oldest delta resyncs from the newest snapshot.
    d = str(tmp_path / "u")
    delta(d, 5, 8)
    delta(d, 8, 10)
    snapshot(d, 10)
    delta(d, 10, 12)
    delta(d, 12, 14)
    snapshot(d, 14)
    delta(d, 14, 15)
    on_chain = FakeModel(5)
    follower, events = _follower(on_chain, d)
    assert follower.poll_once() == 5
    assert on_chain.calls == [name(8), name(10), name(12), name(14), name(15)]
    assert follower.stats["resyncs"] == 0 and events.kinds() == ["applied"] * 5
    follower.close()

    behind = FakeModel(3)  # the updates before step 5 were deleted (the trainer's keep)
    follower, events = _follower(behind, d)
    assert follower.poll_once() == 2
    assert behind.calls == [snapshot_name(14), name(15)]
    stats = follower.stats
    assert (stats["version"], stats["resyncs"], stats["applied"], stats["waiting"]) == (15, 1, 2, None)
    assert events.kinds() == ["resync", "applied"]
    assert events[0][1].startswith("resync past a gap: %s (full update from step 0 to 14" % snapshot_name(14))
    follower.close()


def test_a_gap_resyncs_from_the_newest_full_of_the_chain_and_the_snapshots(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 9, 12)  # a gap at 5
    full(d, 14)  # a full update of the chain (after an untracked write, say)
    delta(d, 14, 16)
    snapshot(d, 16)
    delta(d, 16, 18)
    snapshot(d, 11)  # older: never read
    model = FakeModel(5)
    follower, _ = _follower(model, d)
    assert follower.poll_once() == 2
    assert model.calls == [snapshot_name(16), name(18)]
    follower.close()
    # Past the snapshots, the chain's full update is the newest.
    d2 = str(tmp_path / "u2")
    delta(d2, 9, 12)
    snapshot(d2, 12)
    delta(d2, 12, 14)
    full(d2, 16)
    model = FakeModel(5)
    follower, _ = _follower(model, d2)
    assert follower.poll_once() == 1
    assert model.calls == [name(16)] and follower.stats["resyncs"] == 1
    follower.close()


def test_a_bad_snapshot_is_refused_and_the_next_newest_full_one_serves(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 7, 10)  # a gap at 5
    snapshot(d, 10)
    delta(d, 10, 12)
    snapshot(d, 12, bundle="garbage")
    delta(d, 12, 14)
    snapshot(d, 14, kind=update_format.KIND_DELTA)  # not a full update: refused unread
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 3
    assert model.calls == [snapshot_name(12), snapshot_name(10), name(12), name(14)]
    stats = follower.stats
    assert (stats["version"], stats["refused"], stats["resyncs"]) == (14, 2, 1)
    assert events.kinds() == ["refused", "refused", "resync", "applied", "applied"]
    assert "%s: a snapshot must be a full update, its manifest says kind 'delta'" % snapshot_name(14) in events[0][1]
    assert "DataLossError: the bundle %s is corrupt" % os.path.join(d, snapshot_name(12)) in events[1][1]
    assert follower.poll_once() == 0 and follower.stats["refused"] == 2  # refused ones are not read again
    follower.close()


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.ResourceExhaustedError(None, None, "OOM when allocating the rows"),
        tf.errors.UnavailableError(None, None, "the file system is unavailable"),
        tf.errors.InternalError(None, None, "something failed inside"),
        OSError(5, "Input/output error"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_apply_failing_with_an_error_that_may_pass_is_tried_again_at_the_next_polls(tmp_path, error):
    d = str(tmp_path / "u")
    delta(d, 5, 9)
    delta(d, 9, 12)
    model = FakeModel(5)
    model.failures[name(9)] = [error, error]
    follower, events = _follower(model, d)
    message = "%s: %s" % (type(error).__name__, error.message if isinstance(error, tf.errors.OpError) else error)
    for retries in (0, 1):
        assert follower.poll_once() == 0
        assert model.calls == [name(9)] * (retries + 1)  # the update after it is not tried meanwhile
        stats = follower.stats
        assert (stats["version"], stats["refused"], stats["retries"]) == (5, 0, retries)
        assert (
            stats["retrying"]
            == stats["last_error"]
            == (
                "%s failed (version 5 keeps serving; tried again at the next poll, retry %d of %d): %s"
                % (name(9), retries + 1, MAX_RETRIES, message)
            )
        )
    assert follower.poll_once() == 2
    assert model.calls == [name(9)] * 3 + [name(12)]
    stats = follower.stats
    assert (stats["version"], stats["refused"], stats["retries"], stats["retrying"]) == (12, 0, 2, None)
    assert events.kinds() == ["retry", "retry", "applied", "applied"]
    follower.close()


def test_an_apply_that_keeps_failing_is_refused_after_the_retries(tmp_path):
    d = str(tmp_path / "u")
    delta(d, 5, 9)
    delta(d, 9, 12)
    model = FakeModel(5)
    model.failures[name(9)] = [tf.errors.InternalError(None, None, "failed inside (%d)" % i) for i in range(10)]
    follower, events = _follower(model, d)
    for _ in range(MAX_RETRIES + 1):
        assert follower.poll_once() == 0
    assert model.calls == [name(9)] * (MAX_RETRIES + 1)
    stats = follower.stats
    assert (stats["version"], stats["refused"], stats["retries"], stats["retrying"]) == (5, 1, MAX_RETRIES, None)
    assert events.kinds() == ["retry"] * MAX_RETRIES + ["refused", "gap"]
    assert events[MAX_RETRIES][1] == (
        "refused %s (version 5 keeps serving): failed %d times, the last time with InternalError: failed inside (%d)"
        % (name(9), MAX_RETRIES + 1, MAX_RETRIES)
    )
    assert follower.poll_once() == 0 and len(model.calls) == MAX_RETRIES + 1  # refused: not tried again
    full(d, 14)
    assert follower.poll_once() == 1 and follower.version == 14
    follower.close()


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.InvalidArgumentError(None, None, "bad shapes"),
        tf.errors.FailedPreconditionError(None, None, "a gap"),
        tf.errors.DataLossError(None, None, "checksum does not match"),
        tf.errors.NotFoundError(None, None, "no such file"),
        tf.errors.OutOfRangeError(None, None, "read less bytes than requested"),
        update_format.UpdateFormatError("not an update"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_apply_failing_with_an_error_of_the_update_itself_is_refused_at_once(tmp_path, error):
    d = str(tmp_path / "u")
    delta(d, 5, 9)
    model = FakeModel(5)
    model.failures[name(9)] = [error]
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert follower.poll_once() == 0
    assert model.calls == [name(9)]
    stats = follower.stats
    assert (stats["refused"], stats["retries"], stats["retrying"]) == (1, 0, None)
    assert events.kinds() == ["refused"]
    follower.close()


def test_a_snapshot_without_the_chains_update_of_its_step_is_never_read(tmp_path):
    # Left over from another run whose updates were deleted: it may hold any model state.
    d = str(tmp_path / "u")
    delta(d, 9, 12)  # a gap at 5
    snapshot(d, 14)
    model = FakeModel(5)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert model.calls == [] and "from step 9 to 12" in follower.stats["waiting"]
    delta(d, 12, 14)  # the chain's update of its step: the snapshot is the trainer's
    assert follower.poll_once() == 1
    assert model.calls == [snapshot_name(14)] and follower.stats["resyncs"] == 1
    follower.close()
