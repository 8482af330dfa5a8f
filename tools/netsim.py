"""A simulated two-node network on one machine (root), and ranks started on it without ssh.

`setup(rate)` makes two network namespaces ("nodes") joined by a veth pair whose both ends are shaped with
`tc qdisc ... root tbf rate R` (no netem needed); `teardown()` removes them (safe to call when nothing is set up).
Ranks of one node talk over the namespace's local route (unshaped); ranks of different nodes cross the shaped link.

`run_ranks` (called inside the first namespace, where the rendezvous server must listen) starts Horovod's Gloo
rendezvous server itself and each rank with `ip netns exec` and the environment that horovodrun would give it
(`rank_env`: HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*, HOROVOD_HOSTNAME, HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT,
HOROVOD_GLOO_IFACE, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo). The namespaces, devices and addresses
have fixed names: one such network at a time on a machine (benchmarks take /tmp/tfext_bench.lock around it), or one
more per other set of names that a tool picks with `use_names`.
"""

import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = ("tfe_bench_n0", "tfe_bench_n1")
DEV = ("tfe_bench_v0", "tfe_bench_v1")
IPS = ("10.233.0.1", "10.233.0.2")
HOSTNAMES = ("tfe-bench-node0", "tfe-bench-node1")


def use_names(ns, dev, ips, hostnames):
    """Gives this process's network other fixed names (namespaces, veth ends, addresses, host names: two of each), so
    that a tool's network can exist beside the default one. Call it before anything else here, in every process that
    uses this module (the driver that calls `run_ranks` too)."""
    global NS, DEV, IPS, HOSTNAMES  # pylint: disable=global-statement
    NS, DEV, IPS, HOSTNAMES = tuple(ns), tuple(dev), tuple(ips), tuple(hostnames)


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def teardown():
    for ns in NS:
        sh("ip", "netns", "del", ns, check=False)
        sh("rm", "-rf", "/etc/netns/" + ns, check=False)
    try:
        os.rmdir("/etc/netns")  # only when empty (nothing else uses it)
    except OSError:
        pass


def setup(rate):
    """The two namespaces and the link between them at `rate` (a tc rate: "100mbit", "1gbit", ...)."""
    teardown()
    for ns, ip, host in zip(NS, IPS, HOSTNAMES):
        sh("ip", "netns", "add", ns)
        # `ip netns exec` shows /etc/netns/<ns>/hosts as /etc/hosts. Horovod 0.28.1 builds the Gloo communicators of
        # process sets on the address of the host name (it ignores HOROVOD_GLOO_IFACE there), so each rank gets the
        # node's host name (a UTS namespace) and the name resolves to the node's address.
        os.makedirs("/etc/netns/" + ns, exist_ok=True)
        with open("/etc/netns/%s/hosts" % ns, "w") as f:
            f.write(
                "127.0.0.1 localhost\n%s %s\n%s %s\n" % (ip, host, IPS[1 - NS.index(ns)], HOSTNAMES[1 - NS.index(ns)])
            )
    sh("ip", "link", "add", DEV[0], "type", "veth", "peer", "name", DEV[1])
    for ns, dev, ip in zip(NS, DEV, IPS):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Token bucket on each end's egress: the link's rate in both directions. Burst >= rate/HZ, latency bounds
        # the queue.
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", "1mb" if rate.startswith("10g") else "256kb", "latency", "20ms")  # fmt: skip


def link_bytes():
    """(sent, received): the bytes the first node's end of the link has sent to the second node and received from it
    since `setup`."""
    out = sh("ip", "-n", NS[0], "-s", "-j", "link", "show", "dev", DEV[0]).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


def plan(per_node):
    """Horovod's slot assignments for `per_node` ranks on each of the two nodes (rank order: node 0's first)."""
    from horovod.runner.common.util.hosts import get_host_assignments  # pylint: disable=import-outside-toplevel
    from horovod.runner.common.util.hosts import parse_hosts  # pylint: disable=import-outside-toplevel

    hosts = parse_hosts(",".join("%s:%d" % (ip, per_node) for ip in IPS))
    return get_host_assignments(hosts, per_node * len(IPS))


def rank_env(slot, port, base=None):
    """The environment of the rank of `slot` (a Horovod SlotInfo), as horovodrun would set it, on top of `base`
    (default os.environ); the rendezvous server listens on the first node's address at `port`."""
    node = IPS.index(slot.hostname)
    return dict(
        os.environ if base is None else base,
        PYTHONPATH=ROOT,
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        HOROVOD_HOSTNAME=slot.hostname,
        HOROVOD_RANK=str(slot.rank),
        HOROVOD_SIZE=str(slot.size),
        HOROVOD_LOCAL_RANK=str(slot.local_rank),
        HOROVOD_LOCAL_SIZE=str(slot.local_size),
        HOROVOD_CROSS_RANK=str(slot.cross_rank),
        HOROVOD_CROSS_SIZE=str(slot.cross_size),
        HOROVOD_GLOO_RENDEZVOUS_ADDR=IPS[0],
        HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
        HOROVOD_GLOO_IFACE=DEV[node],
        HOROVOD_CONTROLLER="gloo",
        HOROVOD_CPU_OPERATIONS="gloo",
    )


def rank_command(slot, argv):
    """`argv` run in the namespace of `slot`'s node, under the node's host name (its own UTS namespace)."""
    node = IPS.index(slot.hostname)
    cmd = ["ip", "netns", "exec", NS[node], "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"']
    return cmd + [HOSTNAMES[node]] + list(argv)


def run_ranks(per_node, argv, out_dir, env=None):
    """Runs `argv` as 2 x per_node ranks with a rendezvous server of its own; waits for all of them.

    Call inside the first namespace. Rank r's stdout and stderr go to `out_dir`/rank<r>.log. `env`: variables set on
    top of each rank's `rank_env` (e.g. another PYTHONPATH).

    Returns:
      The ranks' exit codes, in rank order.
    """
    from horovod.runner.http.http_server import RendezvousServer  # pylint: disable=import-outside-toplevel

    slots = plan(per_node)
    server = RendezvousServer()
    port = server.start()
    server.init(slots)
    procs = []
    try:
        for slot in slots:
            log = open(os.path.join(out_dir, "rank%d.log" % slot.rank), "w")
            p = subprocess.Popen(
                rank_command(slot, argv),
                env=dict(rank_env(slot, port), **(env or {})),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            procs.append((p, log))
        return [p.wait() for p, _ in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
        server.stop()


def rank_logs(out_dir, ranks, tail=4000):
    """The last `tail` characters of each rank's log, for an error message."""
    parts = []
    for r in range(ranks):
        with open(os.path.join(out_dir, "rank%d.log" % r)) as f:
            parts.append("--- rank %d\n%s" % (r, f.read()[-tail:]))
    return "".join(parts)
