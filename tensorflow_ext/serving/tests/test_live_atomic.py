"""A request reads every table, shard and dense variable of a live model at one version, never a mix, while the
follower applies updates.

The model (`live_fixtures`): 2 embeddings x 2 shards + a dense variable; every update sets every row of every key
and the dense value to values that tell its version, so a response that mixed two versions (a shard or a table of
one, the rest of another; rows of one, the variable of another) decodes to two. 16 client threads request every key
in a loop while the main thread writes updates (deltas, every fourth a full one) and applies each with
`Follower.poll_once`.

Nothing depends on the machine's speed; the interleavings are forced by synchronisation, as in
embedding/tests/test_de_checkpoint_safety.py:
- the first apply waits until every client has completed a request (so each saw the export's version), and after the
  last apply returned every client makes one more request (so each sees the last version): at least two distinct
  versions are seen, by every client;
- each apply waits until QUIET requests ran entirely outside any apply since the previous one returned; those must
  read exactly the last version applied;
- applies go on (past APPLIES) until OVERLAPPED requests were in flight during an apply (MAX_APPLIES guards).
Every response must decode to one version, the version returned with it (the served version of the same run) and
its "version" output (`served_version()`); a request that started after an apply returned reads at least that
version, and each client's versions never go back.
"""

import threading

from tensorflow_ext.embedding.tests.conftest import session_config
from tensorflow_ext.serving.follow import Follower
from tensorflow_ext.serving.follow import ServedModel
from tensorflow_ext.serving.tests import live_fixtures as fx

V0 = 10
CLIENTS = 16
APPLIES = 12
QUIET = 2
OVERLAPPED = 16
MAX_APPLIES = 400
HANG_S = 300  # the waits time out only against a hang


def test_every_request_reads_one_version_while_updates_apply(tmp_path):
    mixed = {"user": fx.value(11, "user", fx.KEYS["user"], 4), "item": fx.value(12, "item", fx.KEYS["item"], 3)}
    assert fx.versions_of(dict(mixed, w=fx.w_value(11))) == [11, 12]  # what a mix would look like
    export = fx.export_live(tmp_path, V0)
    updates_dir = str(tmp_path / "updates")
    follower = Follower(
        ServedModel(export, config=session_config()), updates_dir, start=False, on_event=lambda kind, message: None
    )
    layout = follower.model.layout
    cond = threading.Condition()
    # applied: the version of the last apply that returned; started / finished: applies; quiet: requests since the
    # last apply returned that ran while no apply ran; ready: clients that completed their first request.
    clock = dict(applied=V0, started=0, finished=0, quiet=0, ready=0)
    stats = dict(requests=0, quiet=0, overlapped=0)
    wrong = dict(mixed=[], below_applied=[], backwards=[], quiet_not_last=[])
    seen = [[] for _ in range(CLIENTS)]
    done = threading.Event()
    errors = []

    def client(c):
        try:
            while True:
                final = done.is_set()
                with cond:
                    applied_before, finished_before = clock["applied"], clock["finished"]
                outputs, version = follower.predict(fx.feeds(), with_version=True)
                versions = fx.versions_of(outputs)
                with cond:
                    stats["requests"] += 1
                    if versions != [version] or int(outputs["version"]) != version:
                        wrong["mixed"].append((c, versions, version, int(outputs["version"])))
                    if version < applied_before:
                        wrong["below_applied"].append((c, version, applied_before))
                    if seen[c] and version < seen[c][-1]:
                        wrong["backwards"].append((c, seen[c][-1], version))
                    if clock["started"] > finished_before:  # an apply ran during part of this request
                        stats["overlapped"] += 1
                    else:  # no apply ran at any time during it: it reads the last one applied
                        stats["quiet"] += 1
                        clock["quiet"] += 1
                        if version != clock["applied"]:
                            wrong["quiet_not_last"].append((c, version, clock["applied"]))
                    if not seen[c]:
                        clock["ready"] += 1
                    seen[c].append(version)
                    cond.notify_all()
                if final:
                    return
        except Exception as e:  # pylint: disable=broad-except  (reported below)
            errors.append(repr(e))
            with cond:
                cond.notify_all()

    def wait_for(predicate, what):
        with cond:
            ok = cond.wait_for(lambda: predicate() or errors, timeout=HANG_S)
        assert not errors, errors
        assert ok, "%s (hang guard): %s" % (what, stats)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    versions = [V0]
    try:
        wait_for(lambda: clock["ready"] == CLIENTS, "the clients' first requests")
        k = 0
        while k < APPLIES or stats["overlapped"] < OVERLAPPED:
            assert k < MAX_APPLIES, ("no request overlapped an apply", stats)
            a, b = versions[-1], versions[-1] + 1 + k % 3
            if k % 4 == 3:
                fx.full(updates_dir, layout, b)
            else:
                fx.delta(updates_dir, layout, a, b)
            wait_for(lambda: clock["quiet"] >= QUIET, "quiet requests before apply %d" % k)
            with cond:
                clock["started"] += 1
            applied = follower.poll_once()
            with cond:
                clock["finished"] += 1
                clock["applied"] = b
                clock["quiet"] = 0
            assert applied == 1, follower.stats
            versions.append(b)
            k += 1
        wait_for(lambda: clock["quiet"] >= QUIET, "quiet requests after the last apply")
    finally:
        done.set()
        for t in threads:
            t.join()
        follower.close()
    assert not errors, errors
    print(stats, "applies", len(versions) - 1)
    assert wrong == dict(mixed=[], below_applied=[], backwards=[], quiet_not_last=[]), wrong
    assert stats["overlapped"] >= OVERLAPPED, stats
    assert stats["requests"] == stats["quiet"] + stats["overlapped"], stats
    for c in range(CLIENTS):  # every client saw the export's version first and the last one last
        assert seen[c][0] == V0 and seen[c][-1] == versions[-1], (c, seen[c][:3], seen[c][-3:])
        assert set(seen[c]) <= set(versions), (c, sorted(set(seen[c]) - set(versions)))
    final = follower.stats
    assert (final["version"], final["applied"], final["refused"], final["stale"]) == (
        versions[-1],
        len(versions) - 1,
        0,
        0,
    )
