"""The follower: a live SavedModel that applies a trainer's serving updates, in order, while it serves.

    follower = tf_ext.serving.follow("/models/ctr/1", "/updates/ctr")   # loads, then polls in a thread
    outputs = follower.predict({"ids": [[3, 17]]})                    # serving_default, numpy outputs
    follower.wait_for_version(1200, timeout=60.0)
    follower.close()

or, as a serving process with a small HTTP endpoint:

    python -m tensorflow_ext.serving.follow --saved_model /models/ctr/1 --updates /updates/ctr --port 8501

The SavedModel must be updatable (exported inside `freeze_for_serving(live_model=...)`): it carries the signatures
`tf_ext_apply_update` (input update_dir, outputs version and applied) and `tf_ext_served_version` (output version),
which is all the follower uses besides `update_format`. Any other process holding the same session may apply updates
too: the model serializes appliers and applies each update at most once.

What the follower does with the updates directory (a listing every `poll_secs`, no file notifications):

* Every complete update of the chain newer than the served version (`update-<to_step>`, see `update_format`) is
  applied in order. Updates at or below the served version are stale and never read. A delta costs the model the
  memory of its changed rows.
* A delta that starts past the served version is a gap (so is a follower whose version is older than the oldest
  delta kept): the follower applies the newest full update past its version, a full snapshot (`full-<to_step>`) or
  a full update of the chain (a resync, counted), then the chain after it; if there is none, it waits for the missing
  updates (`stats["waiting"]` says which) and applies nothing after the gap. Snapshots are read for resyncs only, and
  only beside the chain's update of their step (a snapshot without it is another run's leftover). A
  full update rebuilds every table beside the served one: while it applies the model needs about twice the memory
  of its tables, as a reload of the SavedModel does; the chain's deltas never do.
* An update that cannot be applied is refused: a manifest that is missing, not JSON, of another format or whose
  to_step is not its directory's name (a snapshot that is not full); a bundle that is truncated or corrupt
  (TensorFlow's CRC check); another model or a layout that lacks the model's lines (the model's own check). It is
  logged and counted, the previous version keeps serving, and it is not read again unless its directory changes
  (its files, sizes or times). The deltas after it wait for a full update.
* An apply that fails with any other error (ResourceExhausted, Unavailable, Internal, an OSError: what may pass) is
  tried again at the next polls, up to `MAX_RETRIES` times (`stats["retries"]` counts the retries,
  `stats["retrying"]` says which update waits for one), and refused after that. Nothing after it is applied
  meanwhile.

`stats` (a dict): version, applied, stale (applied by another applier first), refused, resyncs, retries, polls,
waiting (the gap message, or None), retrying (the failure an update waits to be retried after, or None), last_error,
last_apply_seconds (the last apply's duration), lag_seconds (from the served update's creation, by the trainer's
clock, to when it was served). With `summary_dir`, the served version, lag and
counts go to TensorBoard as the scalars in `SUMMARY_TAGS` (step: the served version) after each poll that changed
them.

Requests and versions: `predict` runs one Session.run that also fetches the served version, and the model pins one
version per run, so the outputs and the version returned are of the same version, all tables, shards and dense
variables included.

This module is callable: `tf_ext.serving.follow(...)` is `follow(...)` below, however the module was imported.
"""

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
import types

import numpy as np
import tensorflow as tf

from tensorflow_ext.serving import update_format
from tensorflow_ext.serving.served_model import DEFAULT_SIGNATURE
from tensorflow_ext.serving.served_model import ServedModel
from tensorflow_ext.serving.served_model import op_message as _op_message

__all__ = [
    "Follower",
    "MAX_RETRIES",
    "SUMMARY_TAGS",
    "ServedModel",
    "follow",
    "main",
]

# How many times an apply that failed with an error that may pass is tried again (at the next polls) before the
# update is refused.
MAX_RETRIES = 3

# Errors that say the update itself cannot apply: another model or layout, bad shapes (InvalidArgument), a gap
# (FailedPrecondition), a damaged or missing file (DataLoss, NotFound, OutOfRange: a bundle shorter than its index
# says), a bad manifest (update_format.UpdateFormatError, a ValueError). Trying the same bytes again fails the same
# way: refused at once. Any other error (no memory, a file system that is unavailable, an internal error) may pass.
_PERMANENT_ERRORS = (
    tf.errors.InvalidArgumentError,
    tf.errors.FailedPreconditionError,
    tf.errors.DataLossError,
    tf.errors.NotFoundError,
    tf.errors.OutOfRangeError,
    ValueError,
)
_RETRY = object()  # _apply's result for an update to try again at the next poll

# TensorBoard scalars a follower with a summary_dir writes: tag -> the stats field it holds.
SUMMARY_TAGS = {
    "tf_ext/serving/version": "version",
    "tf_ext/serving/lag_seconds": "lag_seconds",
    "tf_ext/serving/last_apply_seconds": "last_apply_seconds",
    "tf_ext/serving/updates_applied": "applied",
    "tf_ext/serving/updates_stale": "stale",
    "tf_ext/serving/updates_refused": "refused",
    "tf_ext/serving/resyncs": "resyncs",
    "tf_ext/serving/update_retries": "retries",
}


def _fingerprint(path):
    """What identifies a directory's contents: its inode, time, and each entry's name, size and time (None: gone)."""
    try:
        st = os.stat(path)
        entries = []
        for entry in os.scandir(path):
            est = entry.stat(follow_symlinks=False)
            entries.append((entry.name, est.st_size, est.st_mtime_ns))
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, tuple(sorted(entries)))


def _log_event(kind, message):
    if kind in ("refused", "gap", "error", "retry"):
        tf.compat.v1.logging.warning("serving follower: %s", message)
    else:
        tf.compat.v1.logging.info("serving follower: %s", message)


class Follower(object):
    """Applies the new serving updates of a directory to a model, in order, in a background thread or on demand.

    See the module's docstring for the rules (order, gaps and resyncs, refusals). Use `follow()` to load a
    SavedModel and follow; this class also takes any model with the `ServedModel` methods (version, apply, predict,
    close).

    Args:
      model: a `ServedModel` (closed by `close()`).
      updates_dir: the directory the trainer writes updates into (need not exist yet).
      poll_secs: seconds between listings in the background thread.
      start: start the background thread now (else call `start()` or `poll_once()`).
      summary_dir: a directory for TensorBoard scalars (`SUMMARY_TAGS`), or None.
      on_event: a callable (kind, message) told of each "applied", "stale", "resync", "refused", "gap", "retry" and
        "error"; default: TensorFlow's logging (warnings for refusals, gaps, retries and errors).
    """

    def __init__(self, model, updates_dir, poll_secs=1.0, start=True, summary_dir=None, on_event=None):
        if not poll_secs > 0:
            raise ValueError("poll_secs must be > 0, got %r" % (poll_secs,))
        self._model = model
        self._updates_dir = updates_dir
        self._poll_secs = float(poll_secs)
        self._on_event = _log_event if on_event is None else on_event
        self._poll_lock = threading.Lock()  # one poll at a time (the background thread and poll_once callers)
        self._cond = threading.Condition()  # guards _stats and _closed; notified when a poll ends
        self._stop = threading.Event()
        self._closed = False
        self._thread = None
        self._refused = {}  # update directory -> its fingerprint when refused
        self._failures = {}  # update directory -> the transient failures of its applies, since its last success
        self._stats = dict(
            version=model.version(),
            applied=0,
            stale=0,
            refused=0,
            resyncs=0,
            retries=0,
            polls=0,
            waiting=None,
            retrying=None,
            last_error=None,
            last_apply_seconds=None,
            lag_seconds=None,
        )
        self._summary_writer = None
        self._summarized = None
        if summary_dir is not None:
            with tf.Graph().as_default():  # a v1 FileWriter refuses to be made while executing eagerly
                self._summary_writer = tf.compat.v1.summary.FileWriter(summary_dir)
            self._write_summaries()
        if start:
            self.start()

    @property
    def model(self):
        return self._model

    @property
    def session(self):
        """The model's Session (a `ServedModel`'s)."""
        return self._model.session

    @property
    def updates_dir(self):
        return self._updates_dir

    @property
    def version(self):
        """The served version now (read from the model: another applier may have moved it)."""
        with self._cond:
            if self._closed:
                return self._stats["version"]
        return self._model.version()

    @property
    def stats(self):
        """A copy of the counters (see the module's docstring)."""
        with self._cond:
            return dict(self._stats)

    def start(self):
        """Starts the background thread (polls now, then every poll_secs). A second call does nothing."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the follower of %s is closed" % self._updates_dir)
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="tf_ext_serving_follower", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as e:  # pylint: disable=broad-except  (keep serving; the error is reported)
                if self._stop.is_set():
                    break
                self._error("polling %s failed: %r" % (self._updates_dir, e))
            self._stop.wait(self._poll_secs)

    def predict(self, feeds, signature=DEFAULT_SIGNATURE, with_version=False):
        """The model's outputs for `feeds` ({output key: numpy}); with_version: (outputs, version of this request)."""
        outputs, version = self._model.predict(feeds, signature)
        return (outputs, version) if with_version else outputs

    def wait_for_version(self, version, timeout=None):
        """Blocks until a poll of this follower has seen the served version reach `version`, the follower closes,
        or `timeout` seconds pass. Returns whether the version was reached."""
        with self._cond:
            self._cond.wait_for(lambda: self._stats["version"] >= version or self._closed, timeout)
            return self._stats["version"] >= version

    def poll_once(self):
        """Lists the updates directory and applies what is new (see the module's docstring). Returns the number of
        updates applied."""
        with self._poll_lock:
            if self._stop.is_set() and threading.current_thread() is not self._thread:
                raise RuntimeError("the follower of %s is closed" % self._updates_dir)
            try:
                return self._poll()
            finally:
                with self._cond:
                    self._stats["polls"] += 1
                    self._cond.notify_all()
                self._write_summaries()

    def _poll(self):
        version = self._model.version()
        self._set(version=version)
        found = update_format.list_updates(self._updates_dir)
        snapshots = update_format.list_snapshots(self._updates_dir)
        present = {path for _, path in found + snapshots}
        # A snapshot is published after the chain's update of its step, and deleted after it: one without that
        # update is left over from another run (its chain deleted) and is never read.
        chain_steps = {step for step, _ in found}
        snapshots = [(step, path) for step, path in snapshots if step in chain_steps]
        for path in [p for p in self._refused if p not in present]:
            del self._refused[path]  # gone: a new directory of that name is a new update
        for path in [p for p in self._failures if p not in present]:
            del self._failures[path]
        pending = []  # (to_step, path, manifest) newer than the served version, in order
        for step, path in found:
            if step <= version or self._still_refused(path):
                continue
            manifest = self._read_manifest(path, step, version)
            if manifest is not None:
                pending.append((step, path, manifest))

        applied = 0
        waiting = retrying = None
        tried = set()  # each update is tried at most once per poll
        while True:
            ready = [(s, p, m) for s, p, m in pending if s > version and p not in self._refused and p not in tried]
            if not ready:
                break
            step, path, manifest = ready[0]
            resync = manifest["kind"] == update_format.KIND_DELTA and manifest["from_step"] > version
            if resync:
                full = self._newest_full(ready, snapshots, version, tried)
                if full is None:
                    waiting = (
                        "served version %d; the next update %s holds the changes from step %d to %d: waiting for "
                        "the updates before it or a full update"
                        % (version, os.path.basename(path), manifest["from_step"], step)
                    )
                    break
                step, path, manifest = full
            tried.add(path)
            result = self._apply(path, manifest, version, resync)
            if result is _RETRY:  # the updates after it need it: none is tried before the next poll
                retrying = self.stats["last_error"]
                break
            if result is not None:
                version = max(version, result[0])
                applied += int(result[1])
        with self._cond:
            previous = self._stats["waiting"]
            self._stats["waiting"] = waiting
            self._stats["retrying"] = retrying
            if waiting is not None and waiting != previous:
                self._stats["last_error"] = waiting
        if waiting is not None and waiting != previous:
            self._on_event("gap", waiting)
        return applied

    def _newest_full(self, ready, snapshots, version, tried):
        """(to_step, path, manifest) of the newest full update past `version` that is not refused: a full update of
        the chain (`ready`, read) or a snapshot (its manifest read now, refused if bad); None if there is none."""
        candidates = [(s, 1, p, m) for s, p, m in ready if m["kind"] == update_format.KIND_FULL]
        candidates += [(s, 0, p, None) for s, p in snapshots if s > version and p not in tried]
        for step, _, path, manifest in sorted(candidates, reverse=True):  # at one step, the chain's first
            if manifest is None:
                if self._still_refused(path):
                    continue
                manifest = self._read_manifest(path, step, version, snapshot=True)
                if manifest is None:
                    continue
            return step, path, manifest
        return None

    def _read_manifest(self, path, step, version, snapshot=False):
        """The manifest of the update (or snapshot) at `path`, named for `step`; None: refused (bad)."""
        try:
            manifest = update_format.read_manifest(path)
            if manifest["to_step"] != step:
                raise update_format.UpdateFormatError(
                    "serving update %s: its manifest's to_step is %d, its name says %d"
                    % (path, manifest["to_step"], step)
                )
            if snapshot and manifest["kind"] != update_format.KIND_FULL:
                raise update_format.UpdateFormatError(
                    "serving update %s: a snapshot must be a full update, its manifest says kind %r"
                    % (path, manifest["kind"])
                )
        except update_format.UpdateFormatError as e:
            self._refuse(path, str(e), version)
            return None
        return manifest

    def _apply(self, path, manifest, version, resync):
        """Applies one update; returns (the served version after it, whether it applied), None: refused, or _RETRY:
        failed with an error that may pass (tried again at the next poll)."""
        name = os.path.basename(path)
        failures = self._failures.get(path, 0)
        if failures:
            with self._cond:
                self._stats["retries"] += 1
        start = time.monotonic()
        try:
            new_version, applied = self._model.apply(path)
        except (tf.errors.OpError, OSError, ValueError) as e:
            message = "%s: %s" % (type(e).__name__, _op_message(e))
            failures += 1
            if isinstance(e, _PERMANENT_ERRORS) or failures > MAX_RETRIES:
                self._failures.pop(path, None)
                if failures > 1:
                    message = "failed %d times, the last time with %s" % (failures, message)
                self._refuse(path, message, version)
                return None
            self._failures[path] = failures
            message = "%s failed (version %d keeps serving; tried again at the next poll, retry %d of %d): %s" % (
                name,
                version,
                failures,
                MAX_RETRIES,
                message,
            )
            with self._cond:
                self._stats["last_error"] = message
            self._on_event("retry", message)
            return _RETRY
        self._failures.pop(path, None)
        seconds = time.monotonic() - start
        if not applied:
            with self._cond:
                self._stats["stale"] += 1
                self._stats["version"] = new_version
            self._on_event("stale", "%s is stale: served version %d already reflects it" % (name, new_version))
            return new_version, False
        with self._cond:
            self._stats["applied"] += 1
            self._stats["resyncs"] += int(resync)
            self._stats["version"] = new_version
            self._stats["last_apply_seconds"] = seconds
            self._stats["lag_seconds"] = max(0.0, time.time() - float(manifest["created_unix"]))
            self._cond.notify_all()
        what = "%s update from step %d to %d" % (manifest["kind"], manifest["from_step"], manifest["to_step"])
        self._on_event(
            "resync" if resync else "applied",
            "%s%s (%s, %d keys, %d removed) in %.3f s: serving version %d"
            % (
                "resync past a gap: " if resync else "",
                name,
                what,
                manifest["keys"],
                manifest["removed"],
                seconds,
                new_version,
            ),
        )
        return new_version, True

    def _still_refused(self, path):
        if path not in self._refused:
            return False
        if self._refused[path] == _fingerprint(path):
            return True
        del self._refused[path]  # the directory changed: read it again
        return False

    def _refuse(self, path, message, version):
        self._refused[path] = _fingerprint(path)
        message = "refused %s (version %d keeps serving): %s" % (os.path.basename(path), version, message)
        with self._cond:
            self._stats["refused"] += 1
            self._stats["last_error"] = message
        self._on_event("refused", message)

    def _error(self, message):
        with self._cond:
            repeated = self._stats["last_error"] == message
            self._stats["last_error"] = message
        if not repeated:  # a lasting failure (an unreadable directory) is said once, not at every poll
            self._on_event("error", message)

    def _set(self, **fields):
        with self._cond:
            self._stats.update(fields)
            self._cond.notify_all()

    def _write_summaries(self):
        if self._summary_writer is None:
            return
        stats = self.stats
        values = {tag: stats[field] for tag, field in SUMMARY_TAGS.items() if stats[field] is not None}
        if values == self._summarized:
            return
        self._summarized = values
        summary = tf.compat.v1.Summary(
            value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=float(v)) for tag, v in sorted(values.items())]
        )
        self._summary_writer.add_summary(summary, global_step=stats["version"])
        self._summary_writer.flush()

    def close(self):
        """Stops the background thread (after the apply in progress), flushes the summaries, closes the model."""
        with self._cond:
            if self._closed:
                return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._poll_lock:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._summary_writer is not None:
                self._summary_writer.close()
            self._model.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def follow(
    saved_model_dir,
    updates_dir,
    poll_secs=1.0,
    start=True,
    summary_dir=None,
    tags=("serve",),
    config=None,
    on_event=None,
):
    """Loads an updatable SavedModel and follows a trainer's serving updates (see the module's docstring).

    Args:
      saved_model_dir: the export (made inside `freeze_for_serving(live_model=...)`).
      updates_dir: the trainer's updates directory (`ServingUpdateWriter`'s); it need not exist yet.
      poll_secs: seconds between listings.
      start: start polling in a background thread now.
      summary_dir: a directory for TensorBoard scalars, or None.
      tags: the MetaGraph's tags.
      config: an optional `tf.compat.v1.ConfigProto` for the Session.
      on_event: see `Follower`.

    Returns:
      A `Follower` (close it to stop and free the model).

    Raises:
      ValueError: the SavedModel is not updatable.
    """
    return Follower(
        ServedModel(saved_model_dir, tags, config),
        updates_dir,
        poll_secs=poll_secs,
        start=start,
        summary_dir=summary_dir,
        on_event=on_event,
    )


class _FollowModule(types.ModuleType):
    """This module, callable as `follow()`.

    `tf_ext.serving.follow` names both this module (`python -m tensorflow_ext.serving.follow`) and the function.
    Importing a submodule sets its package's attribute to the module, so whichever import came last would win;
    making the module callable gives `tf_ext.serving.follow(...)` one meaning in every import order.
    """

    def __call__(self, *args, **kwargs):
        return follow(*args, **kwargs)


sys.modules[__name__].__class__ = _FollowModule


# ---------------------------------------------------------------------------------------------------- the command


def _json_value(value):
    value = np.asarray(value)
    if value.dtype.kind in ("S", "O"):
        return np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else b, otypes=[object])(
            value
        ).tolist()
    return value.tolist()


class _Handler(http.server.BaseHTTPRequestHandler):
    """POST /v1/models/default:predict ({"inputs": {...}, "signature_name": optional}) and GET /v1/models/default."""

    MODEL_PATH = "/v1/models/default"

    def _send(self, code, body):
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # pylint: disable=invalid-name
        if self.path != self.MODEL_PATH:
            self._send(
                404,
                {"error": "no such path %r; GET %s or POST %s:predict" % (self.path, self.MODEL_PATH, self.MODEL_PATH)},
            )
            return
        follower = self.server.follower
        stats = follower.stats
        self._send(200, {"version": follower.version, "model_name": follower.model.model_name, "stats": stats})

    def do_POST(self):  # pylint: disable=invalid-name
        if self.path != self.MODEL_PATH + ":predict":
            self._send(404, {"error": "no such path %r; POST %s:predict" % (self.path, self.MODEL_PATH)})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            request = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(request, dict) or "inputs" not in request:
                raise ValueError('the request must be a JSON object {"inputs": ...}, got %.200r' % (request,))
            signature = request.get("signature_name", DEFAULT_SIGNATURE)
            outputs, version = self.server.follower.predict(request["inputs"], signature, with_version=True)
        except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
            self._send(400, {"error": _op_message(e)})
            return
        except Exception as e:  # pylint: disable=broad-except  (the server keeps serving)
            self._send(500, {"error": "%s: %s" % (type(e).__name__, _op_message(e))})
            return
        self._send(200, {"outputs": {k: _json_value(v) for k, v in outputs.items()}, "version": version})

    def log_message(self, *args):  # one line per request would drown the progress lines
        pass


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m tensorflow_ext.serving.follow",
        description="Serve an updatable SavedModel and apply a trainer's serving updates to it as they come.",
    )
    parser.add_argument("--saved_model", required=True, help="the export (made with freeze_for_serving(live_model=))")
    parser.add_argument("--updates", required=True, help="the trainer's serving updates directory")
    parser.add_argument("--poll_secs", type=float, default=1.0, help="seconds between listings (default 1)")
    parser.add_argument("--port", type=int, default=None, help="serve HTTP on this port (0: any free port, printed)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)")
    parser.add_argument("--once", action="store_true", help="apply the updates there now and exit (no serving)")
    parser.add_argument("--summary_dir", default=None, help="write TensorBoard scalars (version, lag, counts) here")
    parser.add_argument("--tags", default="serve", help="the MetaGraph's tags, comma-separated (default serve)")
    args = parser.parse_args(argv)
    if args.once and args.port is not None:
        parser.error("--once applies and exits: it serves nothing, drop --port")
    if not args.poll_secs > 0:
        parser.error("--poll_secs must be > 0, got %r" % args.poll_secs)
    return args


def main(argv=None):
    """The command: follows (and serves with --port) until SIGINT or SIGTERM; --once applies and exits.

    Progress lines go to stderr ("follow: ..."); with --port, stdout gets one line "port <n>" once serving.

    Returns:
      0; with --once, 1 when an update was refused, or a gap or a failed apply (one that may pass, see
      `MAX_RETRIES`) is left (nothing after it applied).
    """
    args = _parse_args(argv)

    def say(message):
        sys.stderr.write("follow: %s\n" % message)
        sys.stderr.flush()

    follower = None

    def on_event(kind, message):
        stats = follower.stats if follower is not None else None
        counts = (
            " [version %d, applied %d, refused %d]" % (stats["version"], stats["applied"], stats["refused"])
            if stats
            else ""
        )
        say("%s%s" % (message, counts))

    tags = tuple(t for t in args.tags.split(",") if t)
    follower = follow(
        args.saved_model,
        args.updates,
        poll_secs=args.poll_secs,
        start=False,
        summary_dir=args.summary_dir,
        tags=tags,
        on_event=on_event,
    )
    try:
        say(
            "loaded %s (model %s) at version %d; following %s"
            % (args.saved_model, follower.model.model_name, follower.version, args.updates)
        )
        if args.once:
            follower.poll_once()
            stats = follower.stats
            say(
                "version %d, applied %d, stale %d, refused %d, resyncs %d%s"
                % (
                    stats["version"],
                    stats["applied"],
                    stats["stale"],
                    stats["refused"],
                    stats["resyncs"],
                    "".join("; " + stats[k] for k in ("waiting", "retrying") if stats[k]),
                )
            )
            return 1 if stats["refused"] or stats["waiting"] or stats["retrying"] else 0
        stop = threading.Event()
        server = None
        if args.port is not None:
            server = http.server.ThreadingHTTPServer((args.host, args.port), _Handler)
            server.daemon_threads = True
            server.follower = follower

        def on_signal(signum, frame):  # pylint: disable=unused-argument
            stop.set()
            if server is not None:  # shutdown() waits for serve_forever(), which this (main) thread runs
                threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        follower.start()
        if server is not None:
            port = server.server_address[1]
            say("serving http://%s:%d%s" % (args.host, port, _Handler.MODEL_PATH))
            sys.stdout.write("port %d\n" % port)
            sys.stdout.flush()
            try:
                server.serve_forever()
            finally:
                server.server_close()
        else:
            stop.wait()
        say("stopping at version %d" % follower.stats["version"])
        return 0
    finally:
        follower.close()


if __name__ == "__main__":
    sys.exit(main())
