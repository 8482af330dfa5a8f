"""tools/bench_serving_updates.py end to end at a tiny size: every phase runs and its figures are consistent."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_serving_updates_tiny(tmp_path):
    out = tmp_path / "bench.json"
    num_updates = 2
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "bench_serving_updates.py"), "--quick", "--scale", "0.002"]
        + ["--changed_keys", "600", "--removed_keys", "20", "--num_updates", str(num_updates), "--update_every", "1"]
        + ["--steady_secs", "1", "--clients", "2", "--batch", "16", "--rounds", "1", "--json", str(out)],
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    writes = result["writes"]
    # The trainer restarted from the checkpoint at step 1000 writes deltas from it, one step each.
    assert [w["to_step"] for w in writes] == [1001, 1002] and {w["kind"] for w in writes} == {"delta"}, writes
    assert all(w["keys"] == w["changed"] and w["removed"] > 0 for w in writes), writes
    serve = {run["variant"]: run for run in result["serve"]}
    assert set(serve) == {"idle", "steady", "updates"}
    # Published deltas are served; without any, the export's own version is.
    assert serve["idle"]["served_version"] == serve["updates"]["served_version"] == 1002
    assert serve["steady"]["served_version"] == 1000 and serve["steady"]["freshness"] == []
    for variant in ("idle", "updates"):
        fresh = serve[variant]["freshness"]
        assert len(fresh) == num_updates and all(f["freshness_s"] >= f["publish_to_visible_s"] > 0 for f in fresh)
        assert serve[variant]["follower_stats"]["refused"] == 0, serve[variant]
    for variant in ("steady", "updates"):
        assert serve[variant]["requests"] > 0 and serve[variant]["p99_ms"] >= serve[variant]["p50_ms"] > 0
    assert serve["idle"]["requests"] == 0
    (reload,) = result["reload"]
    assert reload["rss_max"] >= reload["rss_steady"] > 0
    apply = {run["form"]: run for run in result["apply"]}
    assert set(apply) == {"live", "plain"}
    # Both forms applied the same (second) delta and then answer a request alike.
    assert apply["live"]["keys"] == apply["plain"]["keys"] == writes[1]["keys"]
    assert apply["live"]["max_abs_diff_live_vs_plain"] <= 1e-6, apply
    assert all(run["mkeys_per_s"] > 0 for run in apply.values())
    assert all(run["rss_peak"] >= run["rss_before"] > 0 for run in apply.values()), apply
    # The live model's counters are read around its applies (the plain form has none).
    assert apply["live"]["live_after"] and apply["plain"]["live_after"] is None, apply
