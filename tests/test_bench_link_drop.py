"""tools/bench_link_drop.py's pure-Python parts (no root, no namespaces): its options, the commands that drop and
restore the link, and what it reports from the ranks' logs (continued with a stall, failed with an error, hung)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


@pytest.fixture(scope="module")
def tools():
    sys.path.insert(0, TOOLS)
    try:
        import bench_link_drop  # pylint: disable=import-outside-toplevel
        import netsim  # pylint: disable=import-outside-toplevel

        yield bench_link_drop, netsim
    finally:
        sys.path.remove(TOOLS)


def test_drop_options(tools, capsys):
    bench, _ = tools
    a = bench.parse_args(["--drop_at", "8", "--drop_for", "30", "--method", "topk1"])
    assert (a.mode, a.drop_at, a.drop_for, a.drop_mode, a.method) == ("run", 8.0, 30.0, "tbf", "topk1")
    for bad in (["--drop_for", "0"], ["--drop_at", "-1"], ["--drop_for", "x"], ["--drop_for", "60", "--bound_s", "30"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    err = capsys.readouterr().err
    assert "must be a number of seconds > 0, got '0'" in err and "got 'x'" in err, err
    assert "--bound_s (30) must exceed --drop_for (60)" in err, err


def test_drop_commands_change_both_ends_and_restore_the_rate(tools):
    bench, netsim = tools
    down = bench.drop_commands("1gbit", "tbf", down=True)
    up = bench.drop_commands("1gbit", "tbf", down=False)
    assert [c[2] for c in down] == list(netsim.NS) and [c[c.index("dev") + 1] for c in up] == list(netsim.DEV)
    for c in down:
        assert c[:4] == ["tc", "-n", c[2], "qdisc"] and c[4] == "change" and c[c.index("rate") + 1] == "1kbit", c
    for c in up:
        assert c[c.index("rate") + 1] == "1gbit" and c[c.index("burst") + 1] == "256kb", c
    assert bench.drop_commands("10gbit", "tbf", down=False)[0][-3] == "1mb"
    assert bench.drop_commands("1gbit", "down", down=True) == [
        ["ip", "-n", netsim.NS[0], "link", "set", netsim.DEV[0], "down"],
        ["ip", "-n", netsim.NS[1], "link", "set", netsim.DEV[1], "down"],
    ]
    assert bench.drop_commands("1gbit", "down", down=False)[1][-1] == "up"


def _log(steps, tail=""):
    return (
        "\n".join(["rank start", "noise STEP 9 9"] + ["STEP %d %.3f" % (i + 1, t) for i, t in enumerate(steps)]) + tail
    )


def test_a_rank_that_continued(tools):
    bench, _ = tools
    # Steps every 0.1 s, a 4.2 s gap across the drop (100.0 .. 103.0), then steps again.
    steps = [98.0 + 0.1 * i for i in range(20)] + [104.1, 104.2, 104.3]
    s = bench.summarize(bench.parse_rank_log(_log(steps, "\nDONE 104.400 steps=23\n")), 100.0, 103.0)
    assert s["outcome"] == "continued" and s["steps"] == 23 and s["steps_after"] == 3, s
    assert s["stall_s"] == pytest.approx(104.1 - 99.9, abs=0.01), s
    assert "error" not in s


def test_a_rank_that_failed_and_one_that_hung(tools):
    bench, _ = tools
    fail = "\nFAILED 131.500 step=12 UnknownError: Gloo timed out after 30 s: [../gloo/transport/tcp/pair.cc:598]\n"
    s = bench.summarize(bench.parse_rank_log(_log([99.0 + 0.1 * i for i in range(12)], fail)), 100.0, 130.0)
    assert s["outcome"] == "failed" and s["failed_after_s"] == 31.5 and s["steps_after"] == 0, s
    assert s["error"].startswith("UnknownError: Gloo timed out after 30 s"), s
    assert s["stall_s"] == pytest.approx(131.5 - 100.1, abs=0.01), s
    hung = bench.summarize(bench.parse_rank_log(_log([99.5, 99.6])), 100.0, 130.0)
    assert hung["outcome"] == "hung" and hung["stall_s"] is None and hung["steps_after"] == 0, hung
