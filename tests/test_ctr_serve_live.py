"""The CTR example's live-serving mode (python -m tensorflow_ext.examples.ctr --serve_live), tiny, in subprocesses.

Two live days on one model_dir: the first starts from the initialized model, the second from the first day's final
checkpoint. Each day the trainer writes serving updates that a follower process (the library's CLI) applies to the
start-of-day export while the job scores held-out slices through its HTTP endpoint.
"""

import os

import pytest

from tensorflow_ext.examples.ctr import flags
from tests.test_ctr_example import _run_ctr

_LIVE = ["--quick", "--serve_live", "--update_secs", "1", "--live_eval_secs", "2", "--poll_secs", "0.2"]


def _check_day(summary, log, start_step):
    live = summary["live"]
    steps = summary["global_step"] - start_step
    assert steps > 0 and summary["start_step"] == start_step, summary
    assert live["daily_version"] == start_step
    points = live["points"]
    # The first point is scored before the first step: the follower serves the daily export itself, so both
    # models are the same one.
    first = points[0]
    assert first["step"] == start_step and first["served_version"] == start_step, points
    assert first["live_auc"] == first["daily_auc"], first
    # The served version only moves forward, never past the trainer's step at the time.
    versions = [p["served_version"] for p in points] + [live["final"]["served_version"]]
    assert versions == sorted(versions), points
    assert all(start_step <= p["served_version"] <= p["step"] for p in points), points
    # At the end of the day the follower serves the trainer's last update, and its predictions are the end-of-day
    # export's (the trained model, exported from the final checkpoint).
    final = live["final"]
    assert final["served_version"] == final["step"] == summary["global_step"], final
    assert live["max_abs_diff_vs_export"] is not None and live["max_abs_diff_vs_export"] <= 1e-6, live
    updates = live["updates"]
    assert updates["written"] >= 1 and updates["failed"] == 0, updates
    assert live["follower"]["version"] == summary["global_step"], live["follower"]
    assert live["follower"]["stats"]["refused"] == 0, live["follower"]
    lines = [l for l in log.splitlines() if l.startswith("ctr: live: ")]
    assert len(lines) == len(points) + 3, log  # the start, each point, the end of the day, the counts
    return live


def test_serve_live_two_days(tmp_path):
    model_dir = str(tmp_path / "ctr")
    s1, log1, _ = _run_ctr(*_LIVE, "--model_dir", model_dir)
    live1 = _check_day(s1, log1, 0)
    # Day one starts from the initialized model: the live model, updated all day, is far better than the daily
    # export at the end of the day.
    assert live1["final"]["live_auc"] > live1["final"]["daily_auc"] + 0.05, live1["final"]
    # Day two: yesterday's final checkpoint is exported at the start; the first update continues from it (a delta
    # from the day's first step; no full update is needed).
    s2, log2, _ = _run_ctr(*_LIVE, "--model_dir", model_dir)
    live2 = _check_day(s2, log2, s1["global_step"])
    assert live2["updates"]["full"] == 0 and live2["follower"]["stats"]["resyncs"] == 0, live2
    assert live2["final"]["live_auc"] >= live2["final"]["daily_auc"], live2["final"]
    print("day 1: %s\nday 2: %s" % (live1["final"], live2["final"]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--update_secs", "3"], "--update_secs describe live serving: give --serve_live too"),
        (["--serve_live", "--days", "2"], "--serve_live does not run with --days"),
        (["--serve_live", "--data", __file__], "--serve_live does not run with --data"),
        (["--serve_live", "--no_export"], "--serve_live does not run with --no_export"),
        (["--serve_live", "--update_secs", "0"], "--update_secs: must be > 0"),
    ],
)
def test_serve_live_flags_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_live_flag_defaults():
    args = flags.parse_args(["--serve_live", "--model_dir", "/tmp/m"])
    assert (args.update_secs, args.live_eval_secs, args.live_eval_batches, args.poll_secs) == (10.0, 30.0, 4, 1.0)
    assert args.updates_dir == os.path.join("/tmp/m", "serving_updates")
    quick = flags.parse_args(["--serve_live", "--quick"])
    assert (quick.update_secs, quick.live_eval_secs, quick.live_eval_batches) == (2.0, 4.0, 2)
    plain = flags.parse_args([])
    assert (plain.update_secs, plain.updates_dir, plain.poll_secs) == (None, None, None)
