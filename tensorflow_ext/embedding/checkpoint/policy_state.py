"""Checkpointing of admission and eviction state: restored exactly when the checkpoint holds it, started empty
(with a log line) when it does not.

A feature-admission policy (`CountAdmission`'s table of waiting keys, `BloomAdmission`'s counters, the admitted-keys
counter) and an eviction policy (the evicted-keys counter) keep state that is saved with the model, under the same
checkpoint tensor names as ever:

  <embedding>/admission_counts-{keys,values,versions,freqs}   CountAdmission's waiting keys
  <embedding>_admission/admitted                               keys admitted so far (int64)
  <embedding>_admission/bloom_counters                         BloomAdmission's counters (int32 [num_counters])
  <embedding>_eviction/evicted                                 keys evicted so far (int64)

A model often gets a policy after it was trained without one, and restarts from its earlier checkpoint: that
checkpoint has none of these tensors, and the Saver's RestoreV2 fails on a missing tensor. So each piece of state is
saved by a SaveableObject of its own (`PolicyStateSaveable`, in `GraphKeys.SAVEABLE_OBJECTS`), whose restore reads its
tensors itself with `TfExtCheckpointReadOptional`: a checkpoint that holds them restores them exactly, one that lacks
them leaves the state empty (no waiting key, zero counters) and prints a line saying so on stderr.

The variables among this state stay in `GLOBAL_VARIABLES` (initializers, `report_uninitialized_variables`, Horovod's
broadcast see them as before); the Saver's default list (`tf.compat.v1.train.Saver()` with no var_list, and so
MonitoredTrainingSession's, Estimator's and the SavedModel builder's savers) leaves them to their saveable (tf_compat
patch "saver_default_var_list"). A Saver given an explicit var_list of variables saves them as plain variables, as
TensorFlow does.
"""

import sys

import tensorflow as tf

from tensorflow_ext.embedding import export_mode
from tensorflow_ext.embedding.checkpoint import restore as restore_lib
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils import loader

__all__ = ["PolicyStateSaveable", "claimed_variables"]


class PolicyStateSaveable(internals.saveable_object.SaveableObject):
    """Saves some state of an embedding's admission or eviction policy; its restore tolerates a checkpoint without it.

    Either one variable (`variable`, saved under its own name, started from its initial value when absent) or a
    `tensorflow_ext.table.HashTable` (`table`, saved as `<name>-keys`, `-values`, `-versions`, `-freqs` like
    `HashTable`'s own saveable, started empty when absent).

    While the Saver builds its restore, `specs` holds one tensor the checkpoint of the embedding always has (its first
    shard's `-num_shards`, the anchor): the Saver reads it, and `restore` reads the policy's tensors itself from the
    prefix of that read.

    Args:
      name: the saveable's name: the variable's or the table's op name (a MetaGraph records SAVEABLE_OBJECTS by name).
      embedding: the `DynamicEmbedding` whose policy owns the state.
      what: a few words for the log line ("CountAdmission's waiting keys").
      variable: the variable saved, or None.
      table: the HashTable saved, or None.
      zeros: for a variable, callable() -> its empty value (built only where the checkpoint lacks it).
    """

    def __init__(self, name, embedding, what, variable=None, table=None, zeros=None):
        if (variable is None) == (table is None):
            raise ValueError("PolicyStateSaveable saves one variable or one table")
        self._embedding = embedding
        self._what = what
        self.variable = variable
        self.table = table
        self._zeros = zeros
        self._anchor_name = embedding.shards[0].name + "-num_shards"
        self._anchor = None
        with tf.control_dependencies(None):
            if table is not None:
                keys, values, versions, freqs = table.export(full_rows=True)
                tensors = [(keys, "-keys"), (values, "-values"), (versions, "-versions"), (freqs, "-freqs")]
                specs = [internals.saveable_object.SaveSpec(t, "", name + suffix) for t, suffix in tensors]
                op = table.resource_handle
            else:
                specs = [
                    internals.saveable_object.SaveSpec(variable.read_value, "", name, variable.dtype, variable.device)
                ]
                op = variable
        self._full_specs = specs
        super().__init__(op, specs, name)

    @property
    def variables(self):
        """The variables this saveable saves (the Saver's default list leaves them out)."""
        return [] if self.variable is None else [self.variable]

    @property
    def specs(self):
        saver_build = export_mode.saver_build()
        if saver_build is not None and saver_build.restoring:
            return [self._anchor_spec()]
        return self._full_specs

    @specs.setter
    def specs(self, value):
        self._full_specs = value

    @property
    def device(self):
        return self._full_specs[0].device

    def _anchor_spec(self):
        if self._anchor is None:
            self._anchor = internals.saveable_object.SaveSpec(
                lambda: tf.constant(0, tf.int64), "", self._anchor_name, tf.int64, "/device:CPU:0"
            )
        return self._anchor

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        prefix = restore_lib.checkpoint_source(restored_tensors[0])[0] if len(restored_tensors) == 1 else None
        if prefix is None:
            # Not the Saver's restore (all tensors given): restore them as they are.
            return self._assign(restored_tensors, tf.constant(True))
        reads = []
        with tf.name_scope(self.name.replace("/", "_") + "_restore"):
            for spec in self._full_specs:
                with tf.control_dependencies(None), internals.ops.colocate_with(prefix.op, ignore_existing=True):
                    reads.append(
                        loader.load_ops().tf_ext_checkpoint_read_optional(
                            prefix, tensor_name=spec.name, dtype=spec.dtype, name="read_optional"
                        )
                    )
            values = [v for v, _ in reads]
            found = reads[0][1]
            checks = [
                tf.debugging.Assert(
                    tf.equal(f, found),
                    [
                        "Checkpoint",
                        prefix,
                        "holds %s but not %s (a damaged checkpoint?): restore another checkpoint"
                        % (self._full_specs[0].name, spec.name),
                    ],
                )
                for (_, f), spec in zip(reads[1:], self._full_specs[1:])
            ]
            with tf.control_dependencies(checks):
                found = tf.identity(found)
            return self._assign(values, found, prefix)

    def _log_absent(self, prefix):
        names = self.name + "-*" if self.table is not None else self.name
        return tf.print(
            "tf_ext: checkpoint",
            prefix,
            "has no %s of dynamic embedding %s (%s): it was saved before the embedding had this policy; the state "
            "starts empty." % (self._what, self._embedding.name, names),
            output_stream=sys.stderr,
        )

    def _logged(self, prefix):
        with tf.control_dependencies([self._log_absent(prefix)]):
            return tf.constant(False)

    def _assign(self, values, found, prefix=None):
        with internals.ops.colocate_with(self.op, ignore_existing=True):
            if self.table is not None:
                # An absent tensor reads as [0] elements: importing those (clear_first) leaves the table empty.
                keys, rows, versions, freqs = values
                rows = tf.reshape(rows, [-1, self.table.width])
                imported = self.table.import_(keys, rows, versions, freqs, clear_first=True, full_rows=True)
                if prefix is None:
                    return imported
                logged = tf.cond(found, lambda: tf.constant(True), lambda: self._logged(prefix))
                return tf.group(imported, logged)
            var = self.variable
            shape = var.shape.as_list()

            def restored():
                value = values[0]
                check = tf.debugging.Assert(
                    tf.reduce_all(tf.equal(tf.shape(value, out_type=tf.int64), tf.constant(shape, tf.int64))),
                    [
                        "Checkpoint tensor %s has shape" % self._full_specs[0].name,
                        tf.shape(value),
                        "but variable %s (%s of dynamic embedding %s) has shape %s here: build the policy with the "
                        "settings it was saved with, or restore another checkpoint"
                        % (var.op.name, self._what, self._embedding.name, shape),
                    ],
                )
                with tf.control_dependencies([check]):
                    value = tf.reshape(value, shape)
                with tf.control_dependencies([tf.compat.v1.assign(var, value)]):
                    return tf.constant(True)

            if prefix is None:
                return restored().op

            def absent():
                with tf.control_dependencies([self._log_absent(prefix)]):
                    assigned = tf.compat.v1.assign(var, self._zeros())
                with tf.control_dependencies([assigned]):
                    return tf.constant(False)

            return tf.cond(found, restored, absent).op


def claimed_variables(graph):
    """ids of the variables of `graph` that a `PolicyStateSaveable` saves (the Saver's default list leaves them)."""
    claimed = set()
    for s in graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
        if isinstance(s, PolicyStateSaveable):
            claimed.update(id(v) for v in s.variables)
    return claimed


def register(saveable):
    """Adds `saveable` to the default graph's SAVEABLE_OBJECTS; returns it."""
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return saveable


def saved_counter(emb, name, collection, what):
    """A new int64 scalar variable `name` (in the current variable scope and device) that counts something for a
    policy of `emb`: 0 at first, not trainable, in `GLOBAL_VARIABLES` and `collection`, and saved by a
    `PolicyStateSaveable` of its own (`what` names it in the log line), so a checkpoint written before the embedding
    had the policy restores it at 0. Called by the policies' `build`."""
    counter = tf.compat.v1.get_variable(
        name,
        [],
        tf.int64,
        initializer=tf.compat.v1.zeros_initializer(),
        trainable=False,
        collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, collection],
    )
    register(PolicyStateSaveable(counter.op.name, emb, what, variable=counter, zeros=lambda: tf.zeros([], tf.int64)))
    return counter
