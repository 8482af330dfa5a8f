"""What a shard's saveable gives each Saver: full specs to a training Saver's save, the specs every checkpoint has to
its restore, lean specs to a SavedModel export's Saver; decided for the thread that builds the Saver, so a thread
that reads the specs meanwhile still gets the full ones."""

import threading

import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.tf_compat import internals

FULL, RESTORE, LEAN = 7, 6, 3  # keys..num_shards + layout record; without the record; keys, values, num_shards


class _Spy(internals.saveable_object.SaveableObject):
    """A saveable that, each time a Saver reads its specs, records how many specs the shard's saveable gives in this
    thread and in another thread at that moment."""

    def __init__(self, graph, shard_saveable):
        self._graph = graph
        self._shard_saveable = shard_saveable
        self.seen = []
        tensor = tf.constant(0, tf.int64)
        super().__init__(tensor, [internals.saveable_object.SaveSpec(tensor, "", "spy")], "spy")

    @property
    def specs(self):
        other = []

        def _read():
            with self._graph.as_default():
                other.append(len(self._shard_saveable.specs))

        thread = threading.Thread(target=_read)
        thread.start()
        thread.join()
        self.seen.append((len(self._shard_saveable.specs), other[0]))
        return self._specs

    @specs.setter
    def specs(self, value):
        self._specs = value

    def restore(self, restored_tensors, restored_shapes):
        return tf.no_op()


def _graph_with_spy():
    graph = tf.Graph()
    with graph.as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=1)
        tf.compat.v1.train.AdagradOptimizer(0.1).minimize(tf.reduce_sum(tf_ext.embedding_lookup(emb, [1, 2])))
        saveable = emb.saveables[0]
        assert len(saveable.specs) == FULL  # built here, in the graph's thread
        spy = _Spy(graph, saveable)
    return graph, saveable, spy


def test_a_training_saver_asks_full_specs_to_save_and_the_common_ones_to_restore_in_its_thread_only():
    graph, saveable, spy = _graph_with_spy()
    with graph.as_default():
        tf.compat.v1.train.Saver(var_list=[spy, saveable])
    assert {here for here, _ in spy.seen} == {FULL, RESTORE}  # save build, then restore build
    assert {other for _, other in spy.seen} == {FULL}


@pytest.mark.parametrize("frozen", [False, True])
def test_a_saved_model_export_saver_asks_lean_specs_in_its_thread_only(tmp_path, frozen):
    graph = tf.Graph()
    with graph.as_default():
        if frozen:
            with tf_ext.serving.freeze_for_serving():
                emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=1)
        else:
            emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=1)
        saveable = emb.saveables[0]
        assert len(saveable.specs) == (LEAN if frozen else FULL)
        spy = _Spy(graph, saveable)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, spy)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.tables_initializer())
            builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "export"))
            builder.add_meta_graph_and_variables(sess, ["serve"])
    assert spy.seen and {here for here, _ in spy.seen} == {LEAN}
    assert {other for _, other in spy.seen} == {LEAN if frozen else FULL}


def test_the_export_is_recognised_once_per_saver_build_and_only_where_a_shard_asks(monkeypatch):
    from tensorflow_ext.embedding import export_mode  # pylint: disable=import-outside-toplevel

    calls = []
    recognise = export_mode.in_saved_model_export
    monkeypatch.setattr(export_mode, "in_saved_model_export", lambda: calls.append(1) or recognise())
    with tf.Graph().as_default():
        dense = tf.compat.v1.get_variable("dense", [2])
        tf.compat.v1.train.Saver(var_list=[dense])  # no dynamic embedding: no look at the call stack
        assert calls == []
        emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=2)
        tf.compat.v1.train.Saver(var_list=[dense] + emb.saveables)  # save and restore build, two shards
        assert calls == [1]
