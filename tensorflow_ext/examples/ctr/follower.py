"""The follower of ``--serve_live``: a child process serving the live export over HTTP, and this job's client of it.

The child is the library's command (``python -m tensorflow_ext.serving.follow --saved_model DIR --updates DIR
--port 0``): it loads the start-of-day export, applies the serving updates the trainer writes, and answers
``POST /v1/models/default:predict`` (``{"inputs": {...}}`` -> ``{"outputs": {...}, "version": v}``) and
``GET /v1/models/default`` (the served version and the follower's counters). The port it bound is read from its
first lines on stderr; its other lines are kept (the last ones name what went wrong if it stops) and echoed with a
``ctr: follower: `` prefix under ``--verbose``.
"""

import collections
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from tensorflow_ext.examples.ctr import log

# The follower's announcement of its address, e.g. "... http://127.0.0.1:43123/v1/models/default ..." or "port 43123".
_PORT_RE = re.compile(r"https?://[^\s/:]+:(\d+)|\bport[ =:]+(\d+)")
# How long a request may take before the job gives up on the follower (a guard against a hung child, not a timing).
_REQUEST_TIMEOUT_SECS = 300.0
# How often the job asks the follower for its version while it waits for one (each ask is one small GET).
_VERSION_POLL_SECS = 0.05


class FollowerError(RuntimeError):
    """The follower process failed, stopped, or answered with an error (the message holds its last lines)."""


class FollowerProcess(object):
    """Starts the follower command on a live export and talks to it over HTTP.

    Args:
      saved_model: the live (updatable) SavedModel to serve.
      updates_dir: the directory the trainer writes serving updates into.
      poll_secs: how often the follower lists ``updates_dir``.
      verbose: echo the follower's lines (``ctr: follower: ...``).
      start_timeout: seconds to wait for the follower to load the model and bind its port.

    Raises:
      FollowerError: the process exited, or did not announce its port within ``start_timeout``.
    """

    def __init__(self, saved_model, updates_dir, poll_secs, verbose=False, start_timeout=600.0):
        command = [
            sys.executable,
            "-m",
            "tensorflow_ext.serving.follow",
            "--saved_model",
            saved_model,
            "--updates",
            updates_dir,
            "--poll_secs",
            repr(float(poll_secs)),
            "--port",
            "0",
        ]
        env = dict(os.environ)
        # The child imports this tensorflow_ext (a source checkout or the installed package alike).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
        self._verbose = verbose
        self._lines = collections.deque(maxlen=40)
        self._port = None
        self._announced = threading.Event()  # set when the port is known, or when the child's stderr ends
        self._proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            universal_newlines=True,
        )
        self._reader = threading.Thread(target=self._read_stderr, name="ctr-follower-stderr", daemon=True)
        self._reader.start()
        if not self._announced.wait(start_timeout) or self._port is None:
            if self._announced.is_set():  # its stderr ended without a port: it is stopping
                try:
                    self._proc.wait(30)
                except subprocess.TimeoutExpired:
                    pass
            exited = self._proc.poll() is not None
            why = self._last_lines()
            self.close()
            raise FollowerError(
                "the follower (%s) %s%s"
                % (
                    " ".join(command[1:]),
                    "stopped before serving" if exited else "did not start serving within %.0f s" % start_timeout,
                    why,
                )
            )
        self.url = "http://127.0.0.1:%d/v1/models/default" % self._port

    @property
    def pid(self):
        return self._proc.pid

    def _read_stderr(self):
        for line in self._proc.stderr:
            line = line.rstrip("\n")
            self._lines.append(line)
            if self._verbose:
                log.say("follower: %s", line)
            if self._port is None:
                m = _PORT_RE.search(line)
                if m:
                    self._port = int(m.group(1) or m.group(2))
                    self._announced.set()
        self._announced.set()

    def _last_lines(self):
        code = self._proc.poll()
        lines = "\n".join(list(self._lines)[-15:])
        return "%s; its last lines:\n%s" % (
            "" if code is None else " (it exited with code %d)" % code,
            lines or "(none)",
        )

    def _request(self, url, body=None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_SECS) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:2000]
            raise FollowerError("the follower answered %s %s: %s" % (e.code, url, detail)) from None
        except (urllib.error.URLError, OSError) as e:
            raise FollowerError("no answer from the follower at %s: %s%s" % (url, e, self._last_lines())) from None

    def status(self):
        """The follower's status: ``{"version": v, "stats": {...}, ...}`` as its GET answers it."""
        return self._request(self.url)

    def predict(self, features):
        """``(probabilities float32 [n], version)``: the served model's predictions and the version that made them.

        Args:
          features: the serving signature's inputs, a dict of ``[n]`` numpy arrays by key.
        """
        inputs = {key: np.asarray(value).tolist() for key, value in features.items()}
        answer = self._request(self.url + ":predict", {"inputs": inputs})
        return np.asarray(answer["outputs"]["probability"], np.float32), int(answer["version"])

    def wait_for_version(self, version, timeout):
        """Waits until the follower serves ``version`` or a later one; returns its status then.

        Raises:
          FollowerError: the follower stopped, or still served an older version after ``timeout`` seconds (the
            message names the version it served and its last error).
        """
        deadline = time.time() + timeout
        while True:
            status = self.status()
            if int(status["version"]) >= version:
                return status
            if time.time() > deadline:
                raise FollowerError(
                    "the follower still serves version %d %.0f s after the trainer's last update (version %d); "
                    "its status: %s" % (int(status["version"]), timeout, version, json.dumps(status, sort_keys=True))
                )
            time.sleep(_VERSION_POLL_SECS)

    def close(self):
        """Stops the follower process (SIGTERM, then SIGKILL after 30 s) and returns its exit code."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(10)
        return self._proc.returncode
