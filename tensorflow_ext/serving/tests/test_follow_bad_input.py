"""Bad serving updates reach a real live model through the follower: each is refused (or waited for) by name, the
previous version keeps serving whole, and the follower goes on with the good updates.

The export is `live_fixtures`' model (2 embeddings x 2 shards + a dense variable, every value telling its version),
exported at version 10; the updates are written by hand so that each is exactly the bad input a test needs. After
every step a request for every key must decode to one version, the expected one (`served`).
"""

import os
import shutil
import threading

import pytest

from tensorflow_ext.embedding.tests.conftest import session_config
from tensorflow_ext.serving import update_format
from tensorflow_ext.serving.follow import Follower
from tensorflow_ext.serving.follow import ServedModel
from tensorflow_ext.serving.tests import live_fixtures as fx

V0 = 10


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return fx.export_live(tmp_path_factory.mktemp("live"), V0)


class Events(list):
    def __call__(self, kind, message):
        self.append((kind, message))

    def kinds(self):
        return [k for k, _ in self]


@pytest.fixture
def model(export):
    m = ServedModel(export, config=session_config())
    yield m
    m.close()


def _follower(model, updates_dir, **kw):
    events = Events()
    return Follower(model, updates_dir, start=False, on_event=events, **kw), events


def served(follower):
    """The one version a request for every key reads (asserting it reads one), checked against the model's."""
    outputs, version = follower.predict(fx.feeds(), with_version=True)
    versions = fx.versions_of(outputs)
    assert versions == [version] and int(outputs["version"]) == version, (versions, version, outputs["version"])
    return version


def test_the_export_serves_its_checkpoints_version(model):
    assert model.model_name == fx.MODEL
    tables, dense = update_format.parse_layout(model.layout)
    assert tables == {"item/part_0": 3, "item/part_1": 3, "user/part_0": 4, "user/part_1": 4}
    assert dense == {"w": ("float32", (4,))}
    assert model.version() == V0


def test_a_foreign_model_is_refused_naming_both(model, tmp_path):
    d = str(tmp_path / "u")
    fx.delta(d, model.layout, V0, 12, model_name="other_model")
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert served(follower) == V0
    assert events.kinds() == ["refused"]
    message = events[0][1]
    assert message.startswith("refused %s (version %d keeps serving): InvalidArgumentError: " % (_name(12), V0))
    assert message.endswith("update for model 'other_model', this model is '%s'" % fx.MODEL), message
    fx.full(d, model.layout, 14)  # the trainer's next full update serves
    assert follower.poll_once() == 1
    assert served(follower) == 14
    assert follower.stats["refused"] == 1


def test_another_layout_is_refused_naming_the_lines(model, tmp_path):
    d = str(tmp_path / "u")
    other = model.layout.replace("table user/part_0 4", "table user/part_0 5")
    assert other != model.layout
    fx.delta(d, other, V0, 12)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert served(follower) == V0
    message = follower.stats["last_error"]
    assert message.startswith("refused %s (version %d keeps serving): InvalidArgumentError: " % (_name(12), V0))
    assert "the model has 'table user/part_0 4', the update has 'table user/part_0 5'" in message, message


def test_a_layout_with_more_lines_than_the_model_reads_applies(model, tmp_path):
    # The trainer may write variables and tables the served graph does not read.
    d = str(tmp_path / "u")
    more = update_format.layout(model.layout.splitlines() + [update_format.dense_entry("bias", "float32", [2])])
    fx.delta(d, more, V0, 12)
    follower, _ = _follower(model, d)
    assert follower.poll_once() == 1
    assert served(follower) == 12


def test_a_gap_waits_for_the_missing_update_then_a_later_gap_resyncs_from_a_full_update(model, tmp_path):
    d = str(tmp_path / "u")
    hold = str(tmp_path / "held_back")
    os.makedirs(hold)
    fx.delta(d, model.layout, 12, 14)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert served(follower) == V0
    assert "served version 10; the next update" in follower.stats["waiting"]
    assert "from step 12 to 14" in follower.stats["waiting"]
    fx.delta(d, model.layout, V0, 12)  # the missing one arrives
    assert follower.poll_once() == 2
    assert served(follower) == 14 and follower.stats["waiting"] is None

    fx.delta(d, model.layout, 16, 18)  # 14 -> 16 never comes
    assert follower.poll_once() == 0
    assert served(follower) == 14
    fx.full(d, model.layout, 20)
    fx.delta(d, model.layout, 20, 22)
    assert follower.poll_once() == 2
    assert served(follower) == 22
    stats = follower.stats
    assert (stats["applied"], stats["resyncs"], stats["refused"], stats["waiting"]) == (4, 1, 0, None)
    assert events.kinds() == ["gap", "applied", "applied", "gap", "resync", "applied"]


def test_a_follower_behind_the_oldest_delta_resyncs_from_the_newest_snapshot(model, tmp_path):
    # The trainer's keep deleted the updates from V0 on; snapshots are beside the chain at 14 and 16.
    d = str(tmp_path / "u")
    fx.delta(d, model.layout, 12, 14)
    fx.snapshot(d, model.layout, 14)
    fx.delta(d, model.layout, 14, 16)
    fx.snapshot(d, model.layout, 16)
    fx.delta(d, model.layout, 16, 18)
    follower, events = _follower(model, d)
    assert follower.poll_once() == 2
    assert served(follower) == 18
    assert events.kinds() == ["resync", "applied"]
    assert update_format.snapshot_dir_name(16) in events[0][1] and _name(18) in events[1][1]
    # A follower the chain can take applies its deltas, never a snapshot.
    fx.delta(d, model.layout, 18, 20)
    fx.snapshot(d, model.layout, 20)
    fx.delta(d, model.layout, 20, 22)
    assert follower.poll_once() == 2
    assert served(follower) == 22
    assert events.kinds()[2:] == ["applied", "applied"] and follower.stats["resyncs"] == 1
    assert [_name(20), _name(22)] == [m.split(" ")[0] for _, m in events[2:]]


@pytest.mark.parametrize(
    "damage, error",
    [
        ("truncated", "OutOfRangeError: Read less bytes than requested"),
        # The middle of the data file is in a user shard's values (after the item shards): nothing is applied.
        ("corrupt_middle", "DataLossError: TensorBundle at {} shard 0 (1552 bytes): Checksum does not match"),
        ("corrupt_last_byte", "DataLossError: TensorBundle at {} shard 0 (16 bytes): Checksum does not match"),
        ("index_truncated", "DataLossError: not an sstable (bad magic number)"),
    ],
)
def test_a_damaged_bundle_is_refused_and_nothing_of_it_is_served(model, tmp_path, damage, error):
    # The data file holds the tensors in name order: item shards, metadata, user shards, then w (its last bytes).
    d = str(tmp_path / "u")
    bad = fx.delta(d, model.layout, V0, 12)
    data = fx.data_file(bad)
    raw = bytearray(open(data, "rb").read())
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    elif damage == "corrupt_middle":
        raw[len(raw) // 2] ^= 0xFF
    elif damage == "corrupt_last_byte":
        raw[-1] ^= 0x01
    if damage == "index_truncated":
        index = update_format.bundle_prefix(bad) + ".index"
        raw_index = open(index, "rb").read()
        with open(index, "wb") as f:
            f.write(raw_index[: len(raw_index) - 7])
    else:
        with open(data, "wb") as f:
            f.write(bytes(raw))
    follower, events = _follower(model, d)
    assert follower.poll_once() == 0
    assert served(follower) == V0  # every table and w as before: nothing of the bad update
    assert events.kinds() == ["refused"]
    assert events[0][1].startswith("refused %s (version %d keeps serving): " % (_name(12), V0)), events[0][1]
    assert error.format(update_format.bundle_prefix(bad)) in events[0][1], events[0][1]
    assert follower.poll_once() == 0 and follower.stats["refused"] == 1  # not read again
    fx.delta(d, model.layout, 12, 14)  # after the refused one: waits for it or a full update
    assert follower.poll_once() == 0 and "from step 12 to 14" in follower.stats["waiting"]
    shutil.rmtree(bad)  # the trainer writes it again
    fx.delta(d, model.layout, V0, 12)
    assert follower.poll_once() == 2
    assert served(follower) == 14


@pytest.mark.parametrize("garbage", ["not json", "missing", "to_step"])
def test_a_bad_manifest_is_refused_before_the_bundle_is_read(model, tmp_path, garbage):
    d = str(tmp_path / "u")
    bad = fx.delta(d, model.layout, V0, 12)
    manifest = os.path.join(bad, update_format.MANIFEST_NAME)
    if garbage == "missing":
        os.remove(manifest)
    elif garbage == "not json":
        with open(manifest, "wb") as f:
            f.write(b"\x00\xff{garbage")
    follower, events = _follower(model, d)
    if garbage == "to_step":  # an update published under another update's name
        shutil.rmtree(bad)
        fx.delta(d, model.layout, V0, 13, name_step=12)
    assert follower.poll_once() == 0
    assert served(follower) == V0
    assert events.kinds() == ["refused"]
    assert _name(12) in events[0][1]
    fx.full(d, model.layout, 16)
    assert follower.poll_once() == 1
    assert served(follower) == 16


def test_a_follower_started_before_any_update(export, tmp_path):
    d = str(tmp_path / "updates")  # does not exist yet
    follower = Follower(ServedModel(export, config=session_config()), d, poll_secs=0.02)
    try:
        assert served(follower) == V0
        layout = follower.model.layout
        fx.delta(d, layout, V0, 12)
        assert follower.wait_for_version(12, timeout=300.0)  # guards against a hang only
        assert served(follower) == 12
        fx.delta(d, layout, 12, 15)
        assert follower.wait_for_version(15, timeout=300.0)
        assert served(follower) == 15
    finally:
        follower.close()
    assert follower.stats["applied"] == 2 and follower.stats["refused"] == 0


def test_two_appliers_at_once_apply_each_update_once(model, tmp_path):
    # Two followers of one model poll the same updates at the same moment, and a third thread applies them
    # directly: whatever the interleaving, each update is applied exactly once (the others find it stale), in
    # order, and the model ends at the last version with every value of it.
    d = str(tmp_path / "u")
    steps = [V0, 12, 14, 16, 18, 20, 22]
    paths = []
    for a, b in zip(steps, steps[1:]):
        paths.append(fx.full(d, model.layout, b) if b == 16 else fx.delta(d, model.layout, a, b))
    followers = [_follower(model, d)[0] for _ in range(2)]
    direct = dict(applied=0, stale=0)
    start = threading.Barrier(3)
    errors = []

    def poll(follower):
        try:
            start.wait()
            follower.poll_once()
        except Exception as e:  # pylint: disable=broad-except  (reported below)
            errors.append(repr(e))

    def apply_directly():
        try:
            start.wait()
            for path in paths:  # in order: each is applied here or was already (stale), never a gap
                _, applied = model.apply(path)
                direct["applied" if applied else "stale"] += 1
        except Exception as e:  # pylint: disable=broad-except
            errors.append(repr(e))

    threads = [threading.Thread(target=poll, args=(f,)) for f in followers] + [threading.Thread(target=apply_directly)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stats = [f.stats for f in followers]
    assert sum(s["applied"] for s in stats) + direct["applied"] == len(paths), (stats, direct)
    assert all(s["refused"] == 0 for s in stats), stats
    assert served(followers[0]) == 22 and model.version() == 22


def _name(step):
    return update_format.update_dir_name(step)
