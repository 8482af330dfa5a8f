"""The follower as a serving process: `python -m tensorflow_ext.serving.follow` in a fresh process, fed by a real
trainer (`ServingUpdateWriter`) in this one, answering predictions over HTTP; and `--once`'s exit status.

The model is `live_fixtures`' (2 embeddings x 2 shards + a dense variable). The trainer trains every row and the
variable to the values of its next global step (plain SGD at learning rate 1 on a loss whose gradient is the row
minus its target: the new row is the target exactly), so every prediction decodes to the global step it reflects.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import tensorflow as tf

from tensorflow_ext.embedding.tests.conftest import session_config
from tensorflow_ext.serving import update_format
from tensorflow_ext.serving.follow import ServedModel
from tensorflow_ext.serving.tests import live_fixtures as fx
from tensorflow_ext.serving.updates import ServingUpdateWriter

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HANG_S = 300  # every wait below times out only against a hang
V0 = 10


class Trainer(object):
    """A training session whose every step sets each row and w to the values of the global step after it."""

    def __init__(self, updates_dir):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.step = tf.compat.v1.train.get_or_create_global_step()
            _, _, w, user_rows, item_rows = fx.model(tf.constant(fx.KEYS["user"]), tf.constant(fx.KEYS["item"]))
            next_step = tf.cast(self.step.read_value() + 1, tf.float32) * 1024.0  # read before the step's increment
            loss = 0.0
            for got, low in (
                (user_rows, fx.value(0, "user", fx.KEYS["user"], fx.DIMS["user"])),
                (item_rows, fx.value(0, "item", fx.KEYS["item"], fx.DIMS["item"])),
                (w, fx.w_value(0)),
            ):
                loss += tf.reduce_sum(got * tf.stop_gradient(got - (next_step + low)))
            self.train = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(loss, global_step=self.step)
            self.writer = ServingUpdateWriter(updates_dir, model_name=fx.MODEL, full_every=100)
            self.saver = tf.compat.v1.train.Saver()
            self.sess = tf.compat.v1.Session(config=session_config())
            self.sess.run(tf.compat.v1.global_variables_initializer())

    def train_to(self, step):
        while self.sess.run(self.step) < step:
            self.sess.run(self.train)

    def close(self):
        self.sess.close()


def _http(port, path, body=None):
    """(status code, JSON body) of a GET (body None) or POST."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data)
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _predict(port):
    """The version of one HTTP prediction of every key, checked to be the one its values decode to."""
    inputs = {k: v.tolist() for k, v in fx.feeds().items()}
    code, body = _http(port, "/v1/models/default:predict", {"inputs": inputs})
    assert code == 200, body
    outputs = {k: np.asarray(v, np.float32) for k, v in body["outputs"].items()}
    assert fx.versions_of(outputs) == [body["version"]] and outputs["version"] == body["version"], body["version"]
    return body["version"]


def _wait_for_version(port, proc, version):
    deadline = time.monotonic() + HANG_S
    while True:
        code, status = _http(port, "/v1/models/default")
        assert code == 200, status
        if status["version"] >= version:
            return status
        assert proc.poll() is None, "the follower process exited with %s" % proc.returncode
        assert time.monotonic() < deadline, ("the served version did not reach %d (hang guard)" % version, status)
        time.sleep(0.05)  # pacing between status requests, not synchronisation: the loop waits for the version


def _follow_command(export, updates_dir, *flags):
    command = [sys.executable, "-m", "tensorflow_ext.serving.follow", "--saved_model", export, "--updates", updates_dir]
    return command + list(flags)


def _env():
    return dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def test_a_serving_process_follows_a_trainer_and_answers_over_http(tmp_path):
    updates_dir = str(tmp_path / "updates")
    trainer = Trainer(updates_dir)
    trainer.train_to(V0)
    ckpt = trainer.saver.save(trainer.sess, str(tmp_path / "ckpt" / "model"))
    export = fx.export_live(tmp_path, V0, ckpt=ckpt)
    trainer.writer.start(trainer.sess)  # the next update is a delta from the exported step
    stderr_path = str(tmp_path / "follow.stderr")
    summary_dir = str(tmp_path / "summaries")
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(
            _follow_command(export, updates_dir, "--port", "0", "--poll_secs", "0.05", "--summary_dir", summary_dir),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=_env(),
            cwd=str(tmp_path),
        )
    try:
        first_line = []
        reader = threading.Thread(target=lambda: first_line.append(proc.stdout.readline()))
        reader.start()
        reader.join(HANG_S)
        assert first_line and first_line[0].startswith("port "), (first_line, open(stderr_path).read()[-3000:])
        port = int(first_line[0].split()[1])

        code, status = _http(port, "/v1/models/default")
        assert code == 200 and status["version"] == V0 and status["model_name"] == fx.MODEL, status
        assert status["stats"]["applied"] == 0 and status["stats"]["waiting"] is None, status
        assert _predict(port) == V0

        trainer.train_to(12)
        manifest = trainer.writer.write(trainer.sess)
        assert (manifest["kind"], manifest["from_step"], manifest["to_step"]) == ("delta", V0, 12), manifest
        _wait_for_version(port, proc, 12)
        assert _predict(port) == 12

        trainer.train_to(15)
        manifest = trainer.writer.write(trainer.sess, full=True)
        # A delta in the chain and a full snapshot beside it: the follower applies the delta only.
        assert (manifest["kind"], manifest["from_step"], manifest["to_step"]) == ("delta", 12, 15), manifest
        assert trainer.writer.last_snapshot["to_step"] == 15
        assert os.path.isdir(os.path.join(updates_dir, update_format.snapshot_dir_name(15)))
        status = _wait_for_version(port, proc, 15)
        stats = status["stats"]
        assert (stats["applied"], stats["refused"], stats["resyncs"], stats["retries"]) == (2, 0, 0, 0), status
        assert _predict(port) == 15

        code, body = _http(port, "/v1/models/default:predict", {"instances": [1]})
        assert code == 400 and 'the request must be a JSON object {"inputs": ...}' in body["error"], body
        code, body = _http(port, "/v1/models/default:predict", {"inputs": {"user_ids": [1]}})
        assert code == 400 and "missing ['item_ids']" in body["error"], body
        code, body = _http(port, "/v1/models/other")
        assert code == 404, body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        trainer.close()
    err = open(stderr_path).read()
    assert "follow: loaded %s (model %s) at version %d" % (export, fx.MODEL, V0) in err, err[-3000:]
    assert "follow: %s (delta update from step 10 to 12" % update_format.update_dir_name(12) in err, err[-3000:]
    assert "follow: %s (delta update from step 12 to 15" % update_format.update_dir_name(15) in err, err[-3000:]
    assert update_format.snapshot_dir_name(15) not in err, err[-3000:]
    assert "follow: stopping at version 15" in err, err[-3000:]
    last = {}
    for path in sorted(os.listdir(summary_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(summary_dir, path)):
            for value in event.summary.value:
                last[value.tag] = value.simple_value
    assert last["tf_ext/serving/version"] == 15 and last["tf_ext/serving/updates_applied"] == 2, last


def test_once_applies_what_is_there_and_exits_nonzero_when_something_was_refused(tmp_path):
    export = fx.export_live(tmp_path, V0)
    layout = _layout(export)
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    fx.delta(good, layout, V0, 12)
    fx.full(good, layout, 14)
    broken = fx.delta(bad, layout, V0, 12)
    with open(fx.data_file(broken), "r+b") as f:
        f.truncate(8)
    fx.delta(bad, layout, 12, 14)
    results = {}
    for name, updates_dir in (("good", good), ("bad", bad)):
        results[name] = subprocess.run(
            _follow_command(export, updates_dir, "--once"),
            capture_output=True,
            text=True,
            env=_env(),
            timeout=HANG_S,
            cwd=str(tmp_path),
        )
    good_run, bad_run = results["good"], results["bad"]
    assert good_run.returncode == 0, good_run.stderr[-3000:]
    assert "follow: version 14, applied 2, stale 0, refused 0, resyncs 0\n" in good_run.stderr, good_run.stderr[-3000:]
    assert bad_run.returncode == 1, bad_run.stderr[-3000:]
    assert "follow: refused %s (version 10 keeps serving)" % update_format.update_dir_name(12) in bad_run.stderr
    assert "follow: version 10, applied 0, stale 0, refused 1, resyncs 0; served version 10" in bad_run.stderr


def _layout(export):
    model = ServedModel(export, config=session_config())
    try:
        return model.layout
    finally:
        model.close()
