"""Work queues for parameter-server training: input slices handed to the workers as they finish their last one.

    import tensorflow_ext as tf_ext

    queue = tf_ext.distribute.WorkQueue(["data/part-%05d" % i for i in range(256)], num_epochs=2)
    dataset = queue.dataset().flat_map(tf.data.TFRecordDataset).map(parse).batch(512)

With asynchronous parameter-server training each worker steps at its own pace. Sharding the input statically (worker
i reads files i, i + N, ...) makes the epoch as long as its slowest worker; a work queue instead hands the next
slice to whichever worker finished its own, so a slow worker reads less and a fast one more (DeepRec's WorkQueue).

Contract
  * The queue lives on one task (`device`, by default the first ps task of TF_CONFIG's cluster) as a resource of the
    op library (`TfExtWorkQueue*` ops, tensorflow_ext/distribute/kernels/). It hands out `num_epochs` passes over
    `slices`, each pass in an order drawn from `seed` (or in the given order without `shuffle`); every worker that
    builds the queue with the same arguments shares it.
  * A worker (`worker`, by default TF_CONFIG's "<task type>:<index>") holds one slice at a time. Its reader
    (`dataset()`) asks for the next slice when the one before is read through, and that is what marks it done.
  * Once nothing is left to hand out, a worker whose reader asks waits while other workers still hold slices (one of
    them may stop and its slice come back) and its dataset ends once every slice of every pass is done.
  * A worker keeps a lease on its slice, renewed every `lease_secs / 4` by its reader's thread. A worker that stops
    renewing for `lease_secs` (killed, hung, cut off) loses the slice to the next worker that asks. A worker that
    starts again under the same name gets back first the slice it held (before its lease ran out), and never a
    slice that was done.
  * The queue's progress is in the checkpoint (`<name>-digest`, `<name>-done`): a restore marks done what was done
    when it was saved (slices held then are handed out again); a checkpoint written before the graph had the queue,
    or by a queue of other slices, passes or seed, restores it afresh. The chief fills the queue (its init op runs
    `initializer`, or the restore): workers wait for it as for the variables (the queue is a shared resource,
    checked by the Scaffold's ready op).
  * Delivery is at least once: a slice read by a worker that then stops before asking for the next one is read
    again in full by another, and the batches a reader has read ahead (an explicit prefetch) when its worker stops
    are lost with it. The reader turns off tf.data's injected prefetch for its pipeline, whose autotuned buffer
    could read whole slices ahead.

Reading: read each slice with `flat_map` (or any transformation that finishes one slice before it asks for the
next); `interleave` over slices would ask for several slices at once, and a worker holds one. Parallel reads within
a slice (e.g. `TFRecordDataset(..., num_parallel_reads=)`) are fine.

Running: the reader's thread is a `tf.compat.v1.train.QueueRunner` in the graph's QUEUE_RUNNERS collection, started
by MonitoredSession, MonitoredTrainingSession and Estimator. A plain Session runs `initializer`,
`tf.compat.v1.train.start_queue_runners` and an initializable iterator's initializer (the dataset holds stateful
queues: a one-shot iterator cannot capture them).

Limitations: one reader per queue in a graph (one worker, one slice at a time); a graph imported from a MetaGraph
cannot run the reader (its thread is Python: build the input pipeline in Python).
"""

import collections
import itertools
import json
import os
import sys
import threading
import time

import tensorflow as tf

from tensorflow_ext.embedding import export_mode
from tensorflow_ext.embedding.checkpoint import restore as restore_lib
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils import loader

__all__ = ["WorkQueue"]

# TfExtWorkQueueTake's status output.
_TAKEN, _WAIT, _FINISHED = 0, 1, 2
# The longest wait between two asks while other workers hold the last slices, and the finest renewal interval.
_POLL_SECS = 0.25

_Take = collections.namedtuple("_Take", "status slice epoch slice_index wait_secs")


def _tf_config():
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError as e:
        raise ValueError("TF_CONFIG is not JSON (%s): %r" % (e, os.environ.get("TF_CONFIG"))) from None


def _default_device():
    """The first ps task of TF_CONFIG's cluster, or None (the current device scope) without one."""
    if _tf_config().get("cluster", {}).get("ps"):
        return "/job:ps/task:0/device:CPU:0"
    return None


def _default_worker(local_device):
    """TF_CONFIG's "<type>:<index>", else the job and task of the reader's device, else "local"."""
    task = _tf_config().get("task")
    if task and "type" in task:
        return "%s:%d" % (task["type"], int(task.get("index", 0)))
    spec = tf.DeviceSpec.from_string(local_device or "")
    if spec.job:
        return "%s:%d" % (spec.job, spec.task or 0)
    return "local"


class WorkQueue:
    """A queue of input slices shared by the workers of a parameter-server job (see the module docstring).

    Args:
      slices: the work, a non-empty list of non-empty strings (file names, record ranges: what the workers'
        readers take).
      num_epochs: passes over `slices` (an int >= 1).
      shuffle: each pass in an order drawn from (`seed`, pass); False: in the given order.
      seed: an int, the same in every process.
      lease_secs: seconds a worker keeps its slice without renewing it (its reader renews every lease_secs / 4).
      worker: this process's name among the workers (a restarted worker must reuse it); default from TF_CONFIG
        ("chief:0", "worker:3"), else from the reader's device ("/job:worker/task:3": "worker:3"), else "local".
      device: the task that holds the queue; default the first ps task of TF_CONFIG's cluster, else the current
        device scope (a cluster without TF_CONFIG: pass it, e.g. "/job:ps/task:0").
      name: the queue's name: its ops' name scope, its name on the task that holds it (made unique in the graph, so
        build the queues of a job in the same order in every process) and its checkpoint tensors' prefix.

    Raises:
      ValueError, TypeError: a bad argument (the message names it).
      RuntimeError: eager execution (work queues are for TF1 graph mode).
    """

    def __init__(
        self, slices, num_epochs=1, shuffle=True, seed=0, lease_secs=60.0, worker=None, device=None, name="work_queue"
    ):
        if tf.executing_eagerly():
            raise RuntimeError(
                "tf_ext.distribute.WorkQueue builds TF1 graph ops: call tf.compat.v1.disable_v2_behavior()"
            )
        self._slices = _check_slices(slices)
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 1:
            raise ValueError("num_epochs must be an int >= 1, got %r" % (num_epochs,))
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError("seed must be an int, got %r" % (seed,))
        if not isinstance(lease_secs, (int, float)) or isinstance(lease_secs, bool) or not 0 < lease_secs < 1e9:
            raise ValueError("lease_secs must be a positive number of seconds, got %r" % (lease_secs,))
        if worker is not None and (not isinstance(worker, str) or not worker):
            raise ValueError("worker must be a non-empty string, got %r" % (worker,))
        self._num_epochs = num_epochs
        self._shuffle = bool(shuffle)
        self._seed = seed
        self._lease_secs = float(lease_secs)
        self._worker = worker
        self._device = device if device is not None else _default_device()
        self._reader = None
        ops = loader.load_ops()
        graph = tf.compat.v1.get_default_graph()
        # The name is the queue's identity on its task: absolute, so that every process's graph gives the same one.
        with graph.name_scope(None), graph.name_scope(name) as scope, tf.device(self._device):
            self._name = scope.rstrip("/")
            self._handle = ops.tf_ext_work_queue_handle(shared_name=self._name, name="handle")
            self._slices_tensor = tf.constant(self._slices, tf.string, name="slices")
            self._create = self._reset(tf.constant("", tf.string), tf.zeros([0], tf.int8), name="create").op
            self._is_initialized = ops.tf_ext_work_queue_is_initialized(self._handle, name="is_initialized")
            self._counts = ops.tf_ext_work_queue_counts(self._handle, name="counts")
        # The chief's init op fills it, and no worker starts before it is filled (the Scaffold's ready op).
        internals.resources.register_resource(self._handle, self._create, self._is_initialized)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, _QueueSaveable(self))

    @property
    def name(self):
        return self._name

    @property
    def device(self):
        """The device of the queue's ops (the task that holds it)."""
        return self._handle.device

    @property
    def initializer(self):
        """The op that fills the queue afresh (every slice pending). The chief's init op runs it (the queue is a
        shared resource: the Scaffold's default init op initializes those); a plain Session runs it itself."""
        return self._create

    @property
    def slices(self):
        return list(self._slices)

    @property
    def num_epochs(self):
        return self._num_epochs

    def progress(self):
        """A dict of int64 scalar tensors: the queue's "items" (slices x epochs), and how many are "done", "held"
        by a worker and "pending"."""
        return {k: self._counts[i] for i, k in enumerate(("items", "done", "held", "pending"))}

    def dataset(self):
        """This worker's slices: a `tf.data.Dataset` of scalar strings, one slice at a time.

        The dataset asks the queue for a slice when it needs one and ends once every slice of every pass is done.
        Read each slice with `flat_map` (the module docstring says why). Its thread (a QueueRunner in the graph)
        must run: MonitoredSession and Estimator start it, a plain Session needs
        `tf.compat.v1.train.start_queue_runners(sess)`.

        Raises:
          ValueError: called twice for this queue (a worker has one reader).
        """
        if self._reader is not None:
            raise ValueError(
                "WorkQueue %r already has a reader in this graph: a worker holds one slice at a time, so it reads "
                "the queue through one dataset" % self._name
            )
        self._reader = _Reader(self)
        return self._reader.dataset

    # ---- for the reader and the saveable ----------------------------------------------------------------------

    def _reset(self, restored_digest, restored_done, name):
        return loader.load_ops().tf_ext_work_queue_reset(
            self._handle,
            self._slices_tensor,
            restored_digest,
            restored_done,
            num_epochs=self._num_epochs,
            shuffle=self._shuffle,
            seed=self._seed,
            lease_secs=self._lease_secs,
            name=name,
        )

    def _remote(self):
        """The scope of ops that run on the queue's task."""
        return tf.device(self._handle.device)


def _check_slices(slices):
    if isinstance(slices, (str, bytes)) or not hasattr(slices, "__iter__"):
        raise TypeError("slices must be a list of strings, got %r" % (slices,))
    out = []
    for i, s in enumerate(slices):
        if isinstance(s, bytes):
            s = s.decode("utf-8")
        if not isinstance(s, str):
            raise TypeError("slice %d must be a string, got %r" % (i, s))
        if not s:
            raise ValueError("slice %d is an empty string (an empty string is what ends a worker's slices)" % i)
        out.append(s)
    if not out:
        raise ValueError("slices must not be empty")
    return out


class _Reader:
    """A worker's reader of a queue: the dataset of its slices and the threads that ask the queue for them.

    The dataset's map function puts a request (0) in `requests` and waits on `slices`; the asking thread answers
    each request with the queue's next slice for this worker ("" once every slice is done, which ends the dataset).
    A second thread renews the worker's lease meanwhile and, when the coordinator stops, wakes the asking thread
    with a request of its own (its run's id): the local queues are never closed, so a session that MonitoredSession
    creates again (after losing a ps task) reads through them as before.
    """

    def __init__(self, queue):
        ops = loader.load_ops()
        with tf.name_scope(queue.name + "_reader"):
            self.worker = queue._worker or _default_worker(tf.no_op(name="device_probe").device)
            # Named by queue and worker on the task that runs them: two workers' readers on one task stay apart.
            shared = "%s_reader/%s/" % (queue.name, self.worker)
            # Room for the dataset's request and the stop requests of runs that ended before reading theirs.
            self._requests = tf.queue.FIFOQueue(
                16, [tf.int64], shapes=[[]], shared_name=shared + "requests", name="requests"
            )
            self._slices = tf.queue.FIFOQueue(1, [tf.string], shapes=[[]], shared_name=shared + "slices", name="slices")
            self.take_request = self._requests.dequeue(name="take_request")
            self.stop_id = tf.compat.v1.placeholder(tf.int64, [], name="stop_id")
            self.put_stop = self._requests.enqueue(self.stop_id, name="put_stop")
            self.answer = tf.compat.v1.placeholder(tf.string, [], name="answer")
            self.put_answer = self._slices.enqueue(self.answer, name="put_answer")
            with queue._remote():
                worker = tf.constant(self.worker, tf.string, name="worker")
                self.take_first, self.take_next = (
                    _Take(*ops.tf_ext_work_queue_take(queue._handle, worker, tf.constant(finished), name=name))
                    for finished, name in ((False, "take_first"), (True, "take_next"))
                )
                self.renew = ops.tf_ext_work_queue_renew(queue._handle, worker, name="renew")
            # What a QueueRunner thread restored from a MetaGraph would run: its threads are ours, in Python.
            guard = tf.raw_ops.Assert(
                condition=tf.constant(False),
                data=[
                    "the reader of tf_ext work queue %r cannot run from a graph imported from a MetaGraph: build the "
                    "input pipeline in Python (WorkQueue(...).dataset())" % queue.name
                ],
                name="imported_reader_guard",
            )
        self.lease_secs = queue._lease_secs
        self.queue_name = queue.name
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS, _Runner(self, self._slices, guard))

        requests, slices = self._requests, self._slices

        def ask(_):
            with tf.control_dependencies([requests.enqueue(tf.constant(0, tf.int64))]):
                return slices.dequeue()

        # Sequential map: the next request goes out only when flat_map has read the slice before it through. No
        # injected prefetch (the options hold for the whole pipeline built on this dataset): its autotuned buffer
        # could read whole slices ahead, which would count as done and be lost with a worker that stops.
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False
        self.dataset = (
            tf.compat.v1.data.Dataset.from_tensors(tf.constant(0, tf.int32))
            .repeat()
            .map(ask)
            .take_while(lambda s: tf.strings.length(s) > 0)
            .with_options(options)
        )


_run_ids = itertools.count(1)


class _Runner(tf.compat.v1.train.QueueRunner):
    """The reader's threads, started with the QueueRunners of the graph (`create_threads`)."""

    def __init__(self, reader, slices_queue, guard):
        super().__init__(queue=slices_queue, enqueue_ops=[guard])
        self._r = reader

    def create_threads(self, sess, coord=None, daemon=False, start=False):
        coord = coord if coord is not None else tf.compat.v1.train.Coordinator()
        run = _Run(self._r, sess, coord, next(_run_ids))
        name = "tf_ext work queue %s: " % self._r.queue_name
        threads = [
            threading.Thread(target=run.ask, daemon=daemon, name=name + "ask"),
            threading.Thread(target=run.keep, daemon=daemon, name=name + "lease"),
        ]
        for t in threads:
            coord.register_thread(t)
            if start:
                t.start()
        return threads


class _Run:
    """One session's run of a reader: `ask` answers the dataset's requests, `keep` renews the lease and stops it."""

    def __init__(self, reader, sess, coord, run_id):
        self._r = reader
        self._sess = sess
        self._coord = coord
        self._id = run_id
        self._holding = False  # written by `ask`, read by `keep`

    def ask(self):
        r, sess, coord = self._r, self._sess, self._coord
        first = True  # the first ask puts back what this worker held before it (re)started
        finished = False
        try:
            while True:
                request = sess.run(r.take_request)
                if request == self._id:
                    return  # `keep` saw the coordinator stop
                if request != 0 or coord.should_stop():
                    continue  # the stop request of an earlier run
                answer = b""
                while not finished:
                    took = sess.run(r.take_first if first else r.take_next)
                    first = False
                    if took.status == _TAKEN:
                        answer = took.slice
                        self._holding = True
                        break
                    self._holding = False
                    if took.status == _FINISHED:
                        finished = True
                    elif coord.wait_for_stop(min(_POLL_SECS, max(0.01, float(took.wait_secs)))):
                        return
                sess.run(r.put_answer, {r.answer: answer})
        except Exception as e:  # pylint: disable=broad-except
            self._stopped_by(e)

    def keep(self):
        r, sess, coord = self._r, self._sess, self._coord
        try:
            while not coord.wait_for_stop(max(_POLL_SECS, r.lease_secs / 4.0)):
                if self._holding and not sess.run(r.renew):
                    self._holding = False
                    print(
                        "tf_ext work queue %r: worker %r lost its slice (its lease of %g s ran out): another worker "
                        "reads it again" % (r.queue_name, r.worker, r.lease_secs),
                        file=sys.stderr,
                    )
            sess.run(r.put_stop, {r.stop_id: self._id})
        except Exception as e:  # pylint: disable=broad-except
            self._stopped_by(e)

    def _stopped_by(self, e):
        # A session closing under the threads ends them quietly; anything else stops the training with the error.
        if self._coord.should_stop() or _session_closed(e):
            return
        self._coord.request_stop(e)


def _session_closed(e):
    return isinstance(e, (tf.errors.CancelledError, RuntimeError)) and (
        isinstance(e, tf.errors.CancelledError) or "closed" in str(e).lower()
    )


class _QueueSaveable(internals.saveable_object.SaveableObject):
    """The queue's progress in checkpoints: `<name>-digest` (what the queue was built from) and `<name>-done`.

    A restore reads both with TfExtCheckpointReadOptional (a checkpoint written before the graph had the queue lacks
    them, and the Saver's RestoreV2 fails on a missing tensor): when the graph has a global step, the Saver's restore
    asks this saveable for the global step only (every training checkpoint has it) and the restore reads the
    queue's tensors from the same checkpoint itself.
    """

    def __init__(self, queue):
        self._queue = queue
        graph = queue._handle.graph
        with queue._remote(), graph.name_scope(None), graph.name_scope(queue.name + "/"):
            digest, done = loader.load_ops().tf_ext_work_queue_save(queue._handle, name="save")
        self._full_specs = [
            internals.saveable_object.SaveSpec(digest, "", queue.name + "-digest"),
            internals.saveable_object.SaveSpec(done, "", queue.name + "-done"),
        ]
        self._anchor = None
        super().__init__(queue._handle, self._full_specs, queue.name)

    @property
    def specs(self):
        build = export_mode.saver_build()
        if build is not None and build.restoring and self._anchor_spec() is not None:
            return [self._anchor]
        return self._full_specs

    @specs.setter
    def specs(self, value):
        self._full_specs = value

    @property
    def device(self):
        return self._queue.device

    def _anchor_spec(self):
        if self._anchor is None:
            step = tf.compat.v1.train.get_global_step(self._queue._handle.graph)
            if step is None:
                return None
            self._anchor = internals.saveable_object.SaveSpec(
                lambda: tf.constant(0, step.dtype), "", step.op.name, step.dtype, "/device:CPU:0"
            )
        return self._anchor

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        queue = self._queue
        with tf.name_scope(queue.name.replace("/", "_") + "_restore"):
            if len(restored_tensors) == 2:  # the queue's own tensors
                digest, done = restored_tensors
                with queue._remote():
                    return queue._reset(digest, done, name="reset").op
            prefix = restore_lib.checkpoint_source(restored_tensors[0])[0]
            if prefix is None:
                raise ValueError("the restore of work queue %r got no checkpoint to read from" % queue.name)
            reads = []
            with tf.control_dependencies(None), internals.ops.colocate_with(prefix.op, ignore_existing=True):
                for spec, dtype in zip(self._full_specs, (tf.string, tf.int8)):
                    reads.append(
                        loader.load_ops().tf_ext_checkpoint_read_optional(
                            prefix, tensor_name=spec.name, dtype=dtype, name="read_optional"
                        )
                    )
            (digest, found), (done, _) = reads
            digest = tf.cond(found, lambda: tf.reshape(digest, []), lambda: self._absent(prefix))
            done = tf.reshape(done, [-1])
            with queue._remote():
                return queue._reset(digest, done, name="reset").op

    def _absent(self, prefix):
        with tf.control_dependencies(
            [
                tf.print(
                    "tf_ext: checkpoint",
                    prefix,
                    "has no work queue %s (%s-digest): it was saved before the graph had the queue; every slice is "
                    "handed out afresh." % (self._queue.name, self._queue.name),
                    output_stream=sys.stderr,
                )
            ]
        ):
            return tf.constant("", tf.string)
