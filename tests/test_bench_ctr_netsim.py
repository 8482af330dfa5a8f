"""tools/bench_ctr_netsim.py's pure-Python parts (no root, no namespaces): its arguments, the CTR command of each
method, the result table, and the per-rank environment tools/netsim.py gives the ranks (horovodrun's)."""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


@pytest.fixture(scope="module")
def tools():
    sys.path.insert(0, TOOLS)
    try:
        import bench_ctr_netsim  # pylint: disable=import-outside-toplevel
        import netsim  # pylint: disable=import-outside-toplevel

        yield bench_ctr_netsim, netsim
    finally:
        sys.path.remove(TOOLS)


def test_default_methods_and_sizes(tools):
    bench, _ = tools
    a = bench.parse_args(["netsim"])
    assert a.rates == ["100mbit", "1gbit"] and a.per_node == 1
    # 2D reduces inside a node first: only listed with several ranks per node.
    assert a.methods == ["plain", "fp16", "bf16", "topk1", "topk1_fp16", "auto"]
    assert (a.steps, a.batch_size, a.untimed_steps) == (60, 512, 10)
    a = bench.parse_args(["netsim", "--per_node", "2", "--quick", "--steps", "9"])
    assert a.methods[-1] == "2d" and len(a.methods) == 7
    assert (a.steps, a.batch_size, a.untimed_steps) == (9, 128, 4)  # a flag given wins over --quick's size


@pytest.mark.parametrize(
    "argv,message",
    [
        (["netsim", "--methods", "2d"], "2d needs --per_node 2"),
        (["netsim", "--steps", "5", "--untimed_steps", "5"], r"--untimed_steps \(5\) must be below --steps \(5\)"),
        (["netsim", "--methods", "gzip"], "invalid choice: 'gzip'"),
        (["netsim", "--per_node", "3"], "invalid choice: 3"),
        (["netsim", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    ],
)
def test_refused_arguments(tools, capsys, argv, message):
    bench, _ = tools
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_ctr_command_per_method(tools):
    bench, _ = tools
    a = bench.parse_args(["netsim", "--per_node", "2", "--steps", "30", "--parallelism", "model_parallel"])
    plain = bench.ctr_argv(a, "plain", "/m")
    assert plain[:4] == ["-m", "tensorflow_ext.examples.ctr", "--distributed", "model_parallel"]
    flags = dict(zip(plain[4:], plain[5:]))
    assert flags["--model_dir"] == "/m" and flags["--steps"] == "30" and flags["--untimed_steps"] == "10"
    assert flags["--batch_size"] == "512" and flags["--seed"] == "0" and "--fresh" in plain
    assert flags["--log_every"] == "10"  # the summary's loss: the mean of the last 10 steps
    assert "--compression" not in plain and "--topk_ratio" not in plain
    # Each method adds only its own flags to the same job.
    assert bench.ctr_argv(a, "topk1_fp16", "/m")[len(plain) :] == ["--topk_ratio", "0.01", "--compression", "fp16"]
    assert bench.ctr_argv(a, "auto", "/m")[len(plain) :] == ["--compression", "auto", "--topk_ratio", "0.01"]
    assert bench.ctr_argv(a, "2d", "/m")[len(plain) :] == ["--node_size", "2"]
    # The CTR example accepts every command the tool builds.
    from tensorflow_ext.examples.ctr import flags as ctr_flags  # pylint: disable=import-outside-toplevel

    for m in bench.METHODS:
        parsed = ctr_flags.parse_args(bench.ctr_argv(a, m, "/m")[2:])
        assert parsed.steps == 30 and parsed.untimed_steps == 10
    assert ctr_flags.parse_args(bench.ctr_argv(a, "2d", "/m")[2:]).node_size == 2


def _summary(eps, auc, loss):
    return dict(examples_per_sec=eps, steps_per_sec=eps / 1024.0, auc=auc, logloss=0.5, loss=loss, ranks=2, steps=60,
                batch_size=512, compression_choices=None)  # fmt: skip


def test_results_and_table(tools):
    bench, _ = tools
    mb = 1000000
    runs = [
        bench.result("100mbit", "plain", _summary(1000, 0.71, 0.52), (3.0, 2.5, 2), (3.5, 2.6, 2), 30.04, (60 * mb, 0)),
        bench.result("100mbit", "fp16", _summary(1500, 0.70, None), (3.5, 2.6, 2), (4.0, 2.7, 2), 25.0, (0, 30 * mb)),
        bench.result(
            "100mbit", "plain", _summary(3000, 0.73, 0.50), (4.0, 2.7, 2), (5.0, 2.7, 2), 20.0, (6 * mb, 0), 1
        ),
        bench.result("100mbit", "plain", _summary(1200, 0.72, 0.51), (5.0, 2.7, 2), (6.0, 2.7, 2), 20.0, (0, 0), 2),
        bench.result("1gbit", "topk1", _summary(2000, 0.69, 0.5), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0), 20.0),
    ]
    assert runs[0]["examples"] == 60 * 512 * 2 and runs[0]["wall_s"] == 30.0 and runs[2]["round"] == 1
    assert (runs[0]["link_MB_sent"], runs[1]["link_MB_received"]) == (60.0, 30.0)
    lines = bench.table(runs).splitlines()
    assert lines[0].split()[:5] == ["link", "method", "examples/s", "range", "vs"]
    # Plain's three rounds: the median examples/s, their range, the mean AUC and loss, the largest MB per step, the
    # load from its first run's start to its last run's end, the summed wall time.
    assert lines[1].split() == ["100mbit", "plain", "1200", "1000-3000", "1.00x", "0.7200", "0.5000", "0.5100",
                                "1.000", "3.0->6.0", "70s"]  # fmt: skip
    # One round: no range; the ratio is to plain's median.
    assert lines[2].split() == ["100mbit", "fp16", "1500", "1.25x", "0.7000", "0.5000", "-", "0.500", "3.5->4.0", "25s"]
    # No plain run at that rate: no ratio.
    assert lines[3].split()[:4] == ["1gbit", "topk1", "2000", "-"]


def test_methods_take_turns_across_rounds(tools):
    bench, _ = tools
    methods = ["plain", "fp16", "topk1"]
    assert [bench.order(methods, i) for i in range(4)] == [
        ["plain", "fp16", "topk1"],
        ["fp16", "topk1", "plain"],
        ["topk1", "plain", "fp16"],
        ["plain", "fp16", "topk1"],
    ]
    assert bench.parse_args(["netsim", "--rounds", "3"]).rounds == 3


def test_summary_is_the_last_json_line(tools):
    bench, _ = tools
    text = 'ctr: step 4\n{"auc": 0.5}\nctr: done\n{"auc": 0.7}\nWARNING after\n'
    assert bench.summary_of(text) == {"auc": 0.7}
    with pytest.raises(ValueError, match="no JSON summary"):
        bench.summary_of("ctr: crashed\n")


@pytest.mark.parametrize("per_node", [1, 2])
def test_rank_environment_is_horovodruns(tools, per_node):
    _, netsim = tools
    slots = netsim.plan(per_node)
    assert [s.rank for s in slots] == list(range(2 * per_node))
    envs = [netsim.rank_env(s, 12345, base={"PATH": "/bin"}) for s in slots]
    for rank, (slot, env) in enumerate(zip(slots, envs)):
        node = rank // per_node  # node 0's ranks first
        assert env["PATH"] == "/bin" and env["PYTHONPATH"] == netsim.ROOT
        assert env["HOROVOD_RANK"] == str(rank) and env["HOROVOD_SIZE"] == str(2 * per_node)
        assert env["HOROVOD_LOCAL_RANK"] == str(rank % per_node) and env["HOROVOD_LOCAL_SIZE"] == str(per_node)
        assert env["HOROVOD_CROSS_RANK"] == str(node) and env["HOROVOD_CROSS_SIZE"] == "2"
        assert env["HOROVOD_HOSTNAME"] == netsim.IPS[node] and env["HOROVOD_GLOO_IFACE"] == netsim.DEV[node]
        # Every rank meets at the rendezvous server of the first node.
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == netsim.IPS[0]
        assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "12345"
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        # Started in its node's namespace under the node's host name.
        cmd = netsim.rank_command(slot, ["python", "x.py"])
        assert cmd[:4] == ["ip", "netns", "exec", netsim.NS[node]]
        assert cmd[-3:] == [netsim.HOSTNAMES[node], "python", "x.py"]
