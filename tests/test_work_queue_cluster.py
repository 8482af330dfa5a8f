"""tf_ext.distribute.WorkQueue across processes: a ps task holds the queue, workers read it, one is killed.

Fresh processes on loopback ports, each with its own TF_CONFIG (the queue's device and each worker's name come from
it): a ps task (which also fills the queue, as the chief's init op would) and workers that read the queue through
`WorkQueue.dataset()` in a MonitoredTrainingSession and log every record they read. Slice "sNN" holds the records
"sNN/0" .. "sNN/3". A worker told to hold its k-th slice stops after that slice's first record until the test lets
it go (or kills it): the slow worker, or the worker that dies holding a slice. Last, the user's path: an Estimator's
chief and worker (train_and_evaluate) read one epoch through the queue, whose progress the checkpoint keeps.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import tensorflow as tf
from loopback import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Guards against a hang only (each wait is for a condition, never a duration).
HANG_S = 300
RECORDS_PER_SLICE = 4

_SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys, time
    import tensorflow as tf
    import tensorflow_ext as tf_ext

    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
    OUT, NUM_SLICES, LEASE, RECORDS, HOLD_AT = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = "%s%d" % (task["type"], task["index"])
    cluster = tf.train.ClusterSpec(json.loads(os.environ["TF_CONFIG"])["cluster"])
    server = tf.distribute.Server(cluster, job_name=task["type"], task_index=task["index"])


    def path(f):
      return os.path.join(OUT, f)


    def wait_for(f):
      deadline = time.time() + 280  # a guard against a hang only
      while not os.path.exists(path(f)):
        if time.time() > deadline:
          raise RuntimeError("timed out waiting for " + f)
        time.sleep(0.02)


    queue = tf_ext.distribute.WorkQueue(["s%02d" % i for i in range(NUM_SLICES)], lease_secs=LEASE, seed=11)
    if task["type"] == "ps":
      # (Device filters: the session needs this task only, not the workers, which are not up yet.)
      with tf.compat.v1.Session(server.target, config=tf.compat.v1.ConfigProto(device_filters=["/job:ps"])) as sess:
        sess.run(queue.initializer)  # what the chief's init op runs
      open(path("queue_ready"), "w").close()
      server.join()

    records = queue.dataset().flat_map(
        lambda s: tf.data.Dataset.range(RECORDS).map(lambda i: tf.strings.join([s, tf.strings.as_string(i)], "/")))
    it = tf.compat.v1.data.make_initializable_iterator(records)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, it.initializer)
    record = it.get_next()
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % task["index"]])
    slices_started = 0
    with open(path(name + ".records"), "a") as log, tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=False, config=config, log_step_count_steps=None) as sess:
      while not sess.should_stop():
        r = sess.run(record).decode()
        log.write(r + "\n")
        log.flush()
        if r.endswith("/0"):
          slices_started += 1
          if slices_started == HOLD_AT:
            open(path(name + "_holding"), "w").close()
            wait_for(name + "_release")
    open(path(name + "_ended"), "w").close()
    """
)


class _Cluster:
    """The processes of one test: ps0 and the workers, started with TF_CONFIG, logs in tmp_path."""

    def __init__(self, tmp_path, num_slices, lease_secs, num_workers):
        self.dir = tmp_path
        self.script = tmp_path / "reader.py"
        self.script.write_text(_SCRIPT)
        ports = free_ports(1 + num_workers)
        self.cluster = {"ps": ["127.0.0.1:%d" % ports[0]], "worker": ["127.0.0.1:%d" % p for p in ports[1:]]}
        self.args = [str(num_slices), str(lease_secs), str(RECORDS_PER_SLICE)]
        self.procs = {}
        self._runs = {}

    def start(self, task_type, index, hold_at=0):
        name = "%s%d" % (task_type, index)
        run = self._runs[name] = self._runs.get(name, 0) + 1
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1", CUDA_VISIBLE_DEVICES="")
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["TF_CONFIG"] = json.dumps({"cluster": self.cluster, "task": {"type": task_type, "index": index}})
        with open(self.dir / ("%s.%d.log" % (name, run)), "w") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(self.script), str(self.dir)] + self.args + [str(hold_at)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def logs(self):
        out = []
        for f in sorted(os.listdir(self.dir)):
            if f.endswith(".log"):
                out.append("---- %s:\n%s" % (f, (self.dir / f).read_text()[-3000:]))
        return "\n".join(out)

    def wait_for(self, what, cond):
        deadline = time.monotonic() + HANG_S
        while not cond():
            for name, p in self.procs.items():
                assert p.poll() in (None, 0, -signal.SIGKILL), "%s exited with %s\n%s" % (name, p.poll(), self.logs())
            assert time.monotonic() < deadline, "timed out waiting for %s\n%s" % (what, self.logs())
            time.sleep(0.05)

    def exists(self, f):
        return (self.dir / f).exists()

    def records(self, name):
        path = self.dir / (name + ".records")
        return path.read_text().split() if path.exists() else []

    def kill(self, name):
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def _slices(records):
    return sorted({r.split("/")[0] for r in records})


def test_a_slow_worker_holds_no_one_up_and_a_killed_workers_slice_goes_to_another(tmp_path):
    c = _Cluster(tmp_path, num_slices=12, lease_secs=2, num_workers=2)
    try:
        c.start("ps", 0)
        c.wait_for("the queue", lambda: c.exists("queue_ready"))
        c.start("worker", 0, hold_at=2)  # the slow worker: stops in its second slice
        c.wait_for("worker0 to hold its second slice", lambda: c.exists("worker0_holding"))
        c.start("worker", 1)
        # The other worker reads every slice but the one worker0 holds, and waits for that one.
        c.wait_for("worker1's 10 slices", lambda: len(c.records("worker1")) == 10 * RECORDS_PER_SLICE)
        w0, w1 = c.records("worker0"), c.records("worker1")
        held = w0[-1].split("/")[0]
        assert len(w0) == RECORDS_PER_SLICE + 1 and w0[-1].endswith("/0"), w0
        assert sorted(_slices(w0) + _slices(w1)) == ["s%02d" % i for i in range(12)]
        assert not c.exists("worker1_ended")  # its dataset has not ended: a slice is still out
        # worker0 dies holding its slice: its lease runs out and worker1 reads the slice in full.
        c.kill("worker0")
        c.wait_for("worker1 to end", lambda: c.exists("worker1_ended"))
        assert c.procs["worker1"].wait(HANG_S) == 0, c.logs()
        w1 = c.records("worker1")
        assert len(w1) == 11 * RECORDS_PER_SLICE and _slices(w1[-RECORDS_PER_SLICE:]) == [held], w1
        # Every record was read once, but the first record of the killed worker's slice, read twice.
        everything = sorted(w0 + w1)
        expected = sorted(["s%02d/%d" % (i, j) for i in range(12) for j in range(RECORDS_PER_SLICE)] + [held + "/0"])
        assert everything == expected
        ps_log = (tmp_path / "ps0.1.log").read_text()
        assert "worker 'worker:0' did not renew its lease in time" in ps_log, ps_log[-3000:]
    finally:
        c.close()


def test_a_restarted_worker_resumes_with_the_slice_it_held_and_skips_the_finished_ones(tmp_path):
    c = _Cluster(tmp_path, num_slices=8, lease_secs=600, num_workers=1)
    try:
        c.start("ps", 0)
        c.wait_for("the queue", lambda: c.exists("queue_ready"))
        c.start("worker", 0, hold_at=4)
        c.wait_for("worker0 to hold its fourth slice", lambda: c.exists("worker0_holding"))
        first_run = c.records("worker0")
        assert len(first_run) == 3 * RECORDS_PER_SLICE + 1
        held = first_run[-1].split("/")[0]
        c.kill("worker0")
        c.start("worker", 0)  # the same task again (TF_CONFIG): the same worker name
        c.wait_for("worker0 to end", lambda: c.exists("worker0_ended"))
        assert c.procs["worker0"].wait(HANG_S) == 0, c.logs()
        second_run = c.records("worker0")[len(first_run) :]
        # It reads first the slice it held (in full), then the four it never had; none of the three it finished.
        assert second_run[:RECORDS_PER_SLICE] == ["%s/%d" % (held, j) for j in range(RECORDS_PER_SLICE)]
        assert len(second_run) == 5 * RECORDS_PER_SLICE
        assert not set(_slices(first_run[: 3 * RECORDS_PER_SLICE])) & set(_slices(second_run))
        assert sorted(_slices(first_run) + _slices(second_run[RECORDS_PER_SLICE:])) == ["s%02d" % i for i in range(8)]
        assert "worker 'worker:0' started again" in (tmp_path / "ps0.1.log").read_text()
    finally:
        c.close()


_ESTIMATOR_SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    import tensorflow as tf
    import tensorflow_ext as tf_ext

    tf.compat.v1.disable_v2_behavior()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
    task = json.loads(os.environ["TF_CONFIG"])["task"]


    def input_fn():
      # 20 slices of 50 ids: 100 batches of 10 in the epoch, shared by the chief and the worker.
      queue = tf_ext.distribute.WorkQueue(["%d" % i for i in range(20)], lease_secs=60)
      def read(s):
        start = tf.strings.to_number(s, tf.int64) * 50
        return tf.data.Dataset.range(start, start + 50)
      return queue.dataset().flat_map(read).map(lambda i: ({"id": i}, tf.cast(i % 2, tf.float32))).batch(10)


    def model_fn(features, labels, mode):
      emb = tf_ext.get_dynamic_embedding("emb", 4, initializer=tf.compat.v1.zeros_initializer())
      logits = tf.reduce_sum(tf_ext.embedding_lookup(emb, features["id"]), 1)
      loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
      step = tf.compat.v1.train.get_global_step()
      train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=step)
      return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)


    class Count(tf.compat.v1.train.SessionRunHook):
      steps = 0
      def after_run(self, run_context, run_values):
        Count.steps += 1


    config = tf.compat.v1.ConfigProto()
    if task["type"] != "ps":
      config.device_filters.extend(["/job:ps", "/job:%s/task:%d" % (task["type"], task["index"])])
    est = tf.estimator.Estimator(
        model_fn, config=tf.estimator.RunConfig(model_dir=sys.argv[1], session_config=config, save_checkpoints_steps=30))
    tf.estimator.train_and_evaluate(est, tf.estimator.TrainSpec(input_fn, hooks=[Count()]), tf.estimator.EvalSpec(input_fn))
    print("RESULT " + json.dumps({"steps": Count.steps, "global_step": int(est.get_variable_value("global_step"))}))
    """
)


def test_estimator_chief_and_worker_train_one_epoch_and_a_restarted_chief_finds_it_done(tmp_path):
    script = tmp_path / "estimator.py"
    script.write_text(_ESTIMATOR_SCRIPT)
    model_dir = str(tmp_path / "model")
    ps, chief, worker = ["127.0.0.1:%d" % p for p in free_ports(3)]
    cluster = {"ps": [ps], "chief": [chief], "worker": [worker]}
    procs = {}

    def start(task_type, run=1):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": 0}})
        log = tmp_path / ("%s.%d.log" % (task_type, run))
        with open(log, "w") as f:
            procs[task_type] = subprocess.Popen(
                [sys.executable, str(script), model_dir], env=env, stdout=f, stderr=subprocess.STDOUT
            )
        return log

    def result(task_type, log):
        try:
            rc = procs[task_type].wait(HANG_S)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        assert rc == 0, "%s: %s\n%s" % (task_type, rc, log.read_text()[-4000:])
        lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
        return json.loads(lines[-1][len("RESULT ") :])

    try:
        start("ps")
        chief_log, worker_log = start("chief"), start("worker")
        first, other = result("chief", chief_log), result("worker", worker_log)
        # 100 batches in the epoch, each trained once by one of them (the Estimator's worker starts late: it may
        # get few of them), and the checkpoint at the end holds the epoch as done.
        assert first["steps"] + other["steps"] == 100 == first["global_step"], (first, other)
        reader = tf.compat.v1.train.NewCheckpointReader(tf.train.latest_checkpoint(model_dir))
        assert reader.get_tensor("global_step") == 100
        assert reader.get_tensor("work_queue-done").tolist() == [1] * 20
        # The chief again (the ps task still up): it restores the queue with its epoch done and trains nothing.
        again = result("chief", start("chief", run=2))
        assert again == {"steps": 0, "global_step": 100}, again
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
