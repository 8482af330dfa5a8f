"""Input for Horovod training: a shard per rank, and an end of data that every rank agrees on.

Ranks train in lockstep: every step runs the same collectives on every rank. A rank whose input ends first would
leave the others waiting in a collective that it never runs. `synchronized_next` prevents that: each element
carries whether the rank has another one after it (a one-element lookahead), the ranks combine that flag with an
allreduce in the same step, and the training hooks (`tensorflow_ext.horovod.estimator.training_hooks`) stop every
rank after the step in which the first rank read its last element. All ranks run the same number of steps: that
of the shortest shard (the longer shards' extra elements are not read).
"""

import weakref

import tensorflow as tf

from tensorflow_ext.horovod import _hvd

__all__ = ["input_shard", "synchronized_next", "all_have_next"]

HAS_NEXT_NAME = "tf_ext_input_has_next"

# graph -> list of bool tensors: "every rank has another element", one per synchronized_next.
_ends = weakref.WeakKeyDictionary()


def input_shard(dataset, process_set=None):
    """This rank's shard of a dataset: elements rank, rank + N, rank + 2N, ... (`dataset.shard(N, rank)`).

    Shard before batching when the per-rank batch should be the batch size; shard after batching to give each
    rank whole batches. Shards of a dataset whose length is not a multiple of N differ by one element; read them
    with `synchronized_next` (or `shard_input_fn` for an Estimator) so that every rank stops at the same step.

    Args:
      dataset: a `tf.data.Dataset`.
      process_set: Horovod process set (default: all ranks).

    Returns:
      A `tf.data.Dataset`.

    Raises:
      TypeError: `dataset` is not a `tf.data.Dataset`.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError("input_shard needs a tf.data.Dataset, got %s" % type(dataset).__name__)
    hvd = _hvd.require_horovod()
    process_set = process_set if process_set is not None else hvd.global_process_set
    return dataset.shard(process_set.size(), process_set.rank())


def _zeros(spec):
    if not isinstance(spec, tf.TensorSpec):
        raise TypeError(
            "synchronized_next reads datasets of dense tensors; got an element of type %s (%s). "
            "Convert sparse or ragged features to dense tensors in the dataset (or to SparseTensor "
            "after synchronized_next)." % (type(spec).__name__, spec)
        )
    shape = [d if d is not None else 0 for d in spec.shape.as_list()] if spec.shape.rank is not None else []
    if spec.dtype == tf.string:
        return tf.fill(shape, "")
    return tf.zeros(shape, spec.dtype)


def _with_has_next(dataset):
    """(element, has_next) for every element, has_next False on the last one (a one-element lookahead)."""
    spec = dataset.element_spec
    zeros = tf.nest.map_structure(_zeros, spec)
    real = tf.data.Dataset.zip((dataset, tf.data.Dataset.from_tensors(True).repeat()))
    # A sentinel after the last element tells the scan that the previous element was the last one.
    stream = real.concatenate(tf.data.Dataset.from_tensors((zeros, False)))

    def step(state, item):
        previous, have_previous = state
        element, is_real = item
        return (element, True), (previous, is_real, have_previous)

    pairs = stream.scan((zeros, False), step)
    return pairs.filter(lambda previous, has_next, valid: valid).map(
        lambda previous, has_next, valid: (previous, has_next)
    )


def synchronized_next(dataset, process_set=None, name=None):
    """The next element of `dataset`, with an end of input that all ranks agree on.

    Builds an initializable iterator (its initializer is in `GraphKeys.TABLE_INITIALIZERS`, so
    MonitoredTrainingSession and Estimator run it; in a plain Session run `tf.compat.v1.tables_initializer()`)
    and an allreduce, run in each step by the training hooks, of "this rank has another element". The hooks stop
    every rank after the step in which some rank read its last element. Every rank must have at least one element.

    Args:
      dataset: a `tf.data.Dataset` of dense tensors (this rank's shard).
      process_set: Horovod process set (default: all ranks).
      name: optional name scope.

    Returns:
      The element's tensors (the dataset's structure).

    Raises:
      TypeError: not a dataset, or elements that are not dense tensors.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError("synchronized_next needs a tf.data.Dataset, got %s" % type(dataset).__name__)
    hvd = _hvd.require_horovod()
    process_set = process_set if process_set is not None else hvd.global_process_set
    graph = tf.compat.v1.get_default_graph()
    ends = _ends.setdefault(graph, [])
    with tf.name_scope(name or "synchronized_next"):
        iterator = tf.compat.v1.data.make_initializable_iterator(_with_has_next(dataset))
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, iterator.initializer)
        element, has_next = iterator.get_next()
        count = hvd.allreduce(
            tf.reshape(tf.cast(has_next, tf.int32), [1]),
            op=hvd.Sum,
            process_set=process_set,
            name=HAS_NEXT_NAME + ("_%d" % len(ends) if ends else ""),
        )
        ends.append(tf.equal(count[0], process_set.size()))
    return element


def all_have_next(graph=None):
    """A bool tensor: every rank has another element in every `synchronized_next` of the graph (None if none).

    Fetch it in the same `session.run` as the training step (it reads the step's elements); the training hooks do.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    ends = _ends.get(graph)
    if not ends:
        return None
    if len(ends) == 1:
        return ends[0]
    with graph.as_default():
        return tf.reduce_all(tf.stack(ends))
