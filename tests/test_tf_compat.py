"""The patches of TensorFlow internals, caller probes and graph edits (tensorflow_ext/tf_compat/): each is listed,
guarded and tested."""

import ast
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext import tf_compat
from tensorflow_ext.tf_compat import graph_edits

tf.compat.v1.disable_v2_behavior()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ = tf_ext.embedding  # importing the embedding package installs its patches


def _test_functions(path):
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_every_patch_is_documented_installed_and_has_a_test():
    patches = tf_compat.patches()
    assert patches, "no patch registered"
    # Among them the patches registered outside tf_compat by the embedding layer (the Saver-build mode of
    # embedding/export_mode.py, the default var list of embedding/tf_patches.py).
    assert {p.name for p in patches} >= {"saver_build_mode", "saver_restore_build_mode", "saver_default_var_list"}
    for p in patches:
        assert p.installed, p
        assert len(p.why) > 60, "%s: say what it replaces and why" % p.name
        path, func = p.test.split("::")
        assert func in _test_functions(path), "%s names a missing test %s" % (p.name, p.test)
        assert tf_compat.original(p.name) is not None
        # The original is TF's: the replacement wraps it, it does not replace TF's behaviour for other objects.
        assert tf_compat.original(p.name) is not getattr(p._owner_object(), p.attr)  # pylint: disable=protected-access


def test_guard_refuses_a_tensorflow_it_was_not_written_for(monkeypatch):
    patch = tf_compat.Patch(
        "probe",
        "tensorflow.python.training.optimizer",
        "Optimizer",
        "get_slot",
        why="probe",
        test="-",
        make=lambda orig: orig,
        tf_versions=("2.15.0", "2.16.0"),
    )
    monkeypatch.setattr(tf, "__version__", "2.17.0")
    with pytest.raises(tf_compat.PatchError, match=r"probe.*2\.17\.0"):
        patch.check_guard()


def test_guard_refuses_a_moved_target():
    patch = tf_compat.Patch(
        "moved",
        "tensorflow.python.training.optimizer",
        "Optimizer",
        "no_such_method",
        why="probe",
        test="-",
        make=lambda orig: orig,
    )
    with pytest.raises(tf_compat.PatchError, match="no_such_method is missing"):
        patch.install()


def test_optimizer_get_slot_of_a_shard():
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5], tf.int64)) * dense)
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        train = opt.minimize(loss)
        slot = opt.get_slot(emb.shards[0], "momentum")
        assert isinstance(slot, tf_ext.embedding.DynamicEmbeddingSlot)
        assert isinstance(opt.get_slot(dense, "momentum"), tf.Variable)  # dense variables: TF's own answer
        values = slot.lookup(tf.constant([5, 6], tf.int64))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(values)
    np.testing.assert_allclose(got, [[1.0, 1.0], [0.0, 0.0]])  # gradient 1 (dense = 1); key 6 was never trained


def test_optimizer_get_slot_names_include_embedding_slots():
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2)
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        opt.minimize(tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64))))
        assert opt.get_slot_names() == ["m", "v"]
        assert tf.compat.v1.train.AdamOptimizer(0.1).get_slot_names() == []


def test_moving_average_refuses_shards_with_advice():
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2)
        ema = tf.compat.v1.train.ExponentialMovingAverage(0.9)
        with pytest.raises(TypeError, match="dense_variables"):
            ema.apply(emb.shards)
        v = tf.compat.v1.get_variable("v", initializer=1.0)
        assert ema.apply([v]) is not None  # dense variables: TF's own behaviour


def test_replica_device_setter_places_tables_on_ps():
    with tf.Graph().as_default():
        setter = tf.compat.v1.train.replica_device_setter(ps_tasks=2, ps_device="/job:ps", worker_device="/job:w")
        with tf.compat.v1.device(setter):
            emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=2)
            dense = tf.compat.v1.get_variable("d", [1])
        assert [s.device for s in emb.shards] == ["/job:ps/task:0", "/job:ps/task:1"]
        assert dense.device.startswith("/job:ps")  # TF's own placement unchanged


def test_warm_start_patches_handle_shards_and_leave_variables_to_tf(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.0)
        dense = tf.compat.v1.get_variable("d", initializer=[3.0, 4.0])
        ins = emb.insert(tf.constant([7, -8], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0]]))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(ins)
            tf.compat.v1.train.Saver().save(sess, ckpt)
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.0, num_shards=3)  # resharded
        dense = tf.compat.v1.get_variable("d", initializer=[0.0, 0.0])
        tf.compat.v1.train.warm_start(ckpt, vars_to_warm_start=".*")
        rows = tf_ext.embedding_lookup(emb, tf.constant([7, -8, 9], tf.int64), is_training=False)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(tf_ext.embedding.warm_start_op())
            got_rows, got_dense = sess.run([rows, dense])
    np.testing.assert_allclose(got_rows, [[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(got_dense, [3.0, 4.0])  # TF's own warm start of the variable


def test_optimizer_get_processor_targets_the_shard_handle():
    from tensorflow.python.training import optimizer as optimizer_lib  # pylint: disable=import-outside-toplevel

    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
        shard = emb.shards[0]
        assert optimizer_lib._get_processor(shard).target() is shard.handle  # pylint: disable=protected-access
        original = tf_compat.original("optimizer_get_processor")
        assert type(optimizer_lib._get_processor(dense)) is type(original(dense))  # pylint: disable=protected-access
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5, 7, 5], tf.int64)) * dense)
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)
        ((grad, var),) = opt.compute_gradients(loss, var_list=[shard])
        assert var is shard and isinstance(grad, tf.IndexedSlices)
        train = opt.apply_gradients([(grad, var)])  # the processor's update: the table rows change
        rows = tf_ext.embedding_lookup(emb, tf.constant([5, 7], tf.int64), is_training=False)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(rows)
    np.testing.assert_allclose(got, [[0.0, 0.0], [0.5, 0.5]])  # key 5 twice: 1 - 0.5 * 2; key 7: 1 - 0.5


def test_a_library_replacing_the_processor_later_does_not_break_training(monkeypatch):
    """Another library that replaces optimizer._get_processor without chaining to ours (as TFRA does when it is
    imported) must not leave dynamic embeddings untrainable: the next embedding created patches again, on top of
    that library's function, which keeps handling everything else."""
    from tensorflow.python.training import optimizer as optimizer_lib  # pylint: disable=import-outside-toplevel

    seen = []
    tf_processor = tf_compat.original("optimizer_get_processor")

    def other_library_get_processor(v):  # knows TF's variables only, like TF's own function
        seen.append(v)
        return tf_processor(v)

    patch = {p.name: p for p in tf_compat.patches()}["optimizer_get_processor"]
    assert patch.installed and not patch.displaced()
    # Restored after the test, with the attribute: the patch as it was.
    monkeypatch.setattr(patch, "original", patch.original)
    monkeypatch.setattr(optimizer_lib, "_get_processor", other_library_get_processor)
    assert patch.displaced()
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5, 7, 5], tf.int64)) * dense)
        train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        rows = tf_ext.embedding_lookup(emb, tf.constant([5, 7], tf.int64), is_training=False)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(rows)
    np.testing.assert_allclose(got, [[0.0, 0.0], [0.5, 0.5]])
    assert seen and all(v is dense for v in seen)  # the other library's function still serves TF's variables
    assert not patch.displaced() and patch.original is other_library_get_processor


def test_an_earlier_replacement_of_ours_is_not_displaced(monkeypatch):
    """Restoring one of our own earlier replacements (as a test's monkeypatch undo does after a re-install) is not a
    displacement: nothing gets wrapped twice."""
    from tensorflow.python.training import optimizer as optimizer_lib  # pylint: disable=import-outside-toplevel

    patch = {p.name: p for p in tf_compat.patches()}["optimizer_get_processor"]
    ours_before = optimizer_lib._get_processor  # pylint: disable=protected-access
    tf_processor = tf_compat.original("optimizer_get_processor")
    monkeypatch.setattr(patch, "original", patch.original)
    monkeypatch.setattr(optimizer_lib, "_get_processor", lambda v: tf_processor(v))
    assert tf_compat.reinstall_if_displaced("optimizer_get_processor")  # on top of the other function
    monkeypatch.setattr(optimizer_lib, "_get_processor", ours_before)  # an earlier replacement of ours comes back
    assert not patch.displaced()
    assert not tf_compat.reinstall_if_displaced("optimizer_get_processor")
    assert optimizer_lib._get_processor is ours_before  # pylint: disable=protected-access


def test_optimizer_compute_gradients_expands_dynamic_embeddings():
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2, num_shards=3)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2, 3, 4], tf.int64)) * dense)
        pairs = tf.compat.v1.train.AdagradOptimizer(0.1).compute_gradients(loss, var_list=[emb, dense])
        assert [v for _, v in pairs] == list(emb.shards) + [dense]
        assert all(isinstance(g, tf.IndexedSlices) for g, _ in pairs[:3])
        assert isinstance(pairs[3][0], tf.Tensor)  # TF's own gradient of the dense variable


def test_optimizer_apply_gradients_keeps_slots_in_rows():
    with tf.Graph().as_default() as g:
        step = tf.compat.v1.train.get_or_create_global_step()
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
        dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5], tf.int64)) * dense)
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        train = opt.minimize(loss, global_step=step)
        assert "_create_slots" not in vars(opt)  # the per-call override is gone
        # TF made slot variables for the dense variable only; the shard's m and v are columns of its rows.
        slot_vars = sorted(v.op.name for v in tf.compat.v1.global_variables() if v.op.name.startswith("d/"))
        assert slot_vars == ["d/Adam", "d/Adam_1"]
        assert list(emb.shards[0].slot_group(opt).slot_names) == ["m", "v"]
        m = opt.get_slot(emb.shards[0], "m").lookup(tf.constant([5], tf.int64))
        beta1_power, _ = opt._get_beta_accumulators()  # pylint: disable=protected-access
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            sess.run(train)
            got_m, got_power, got_step = sess.run([m, beta1_power, step])
    # m of key 5: gradient = d, which Adam moves from 1 to 0.9 in step 1: m = 0.1, then 0.9 * 0.1 + 0.1 * 0.9.
    np.testing.assert_allclose(got_m, [[0.18, 0.18]], rtol=1e-5)
    np.testing.assert_allclose(got_power, 0.9**3, rtol=1e-6)  # advanced once per step
    assert got_step == 2


@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: tf.keras.optimizers.SGD(0.1), lambda: tf.keras.optimizers.legacy.SGD(0.1)],
    ids=["keras", "legacy"],
)
def test_keras_optimizers_refuse_dynamic_embeddings(make_optimizer):
    with tf.Graph().as_default():
        emb = tf_ext.get_dynamic_embedding("e", 2)
        loss_fn = lambda: tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1], tf.int64)))  # noqa: E731
        opt = make_optimizer()
        with pytest.raises(TypeError, match="cannot train dynamic embedding e.*tf.compat.v1.train"):
            opt.minimize(loss_fn, var_list=[emb])
        grads = tf.gradients(loss_fn(), [s.handle for s in emb.shards])
        with pytest.raises(TypeError, match="cannot train dynamic embedding e/part_0"):
            opt.apply_gradients(zip(grads, emb.shards))
        dense = tf.Variable([1.0, 2.0])
        opt.minimize(lambda: tf.reduce_sum(dense**2), var_list=[dense])  # dense variables: Keras's own way


def test_every_caller_probe_resolves_and_has_a_test():
    probes = tf_compat.probes()
    assert {p.name for p in probes} >= {"saved_model_export", "estimator_export"}
    for p in probes:
        p.check_guard()  # the TF functions it recognises exist in this TensorFlow
        assert len(p.why) > 60, "%s: say what the caller decides and why" % p.name
        path, func = p.test.split("::")
        assert func in _test_functions(path), "%s names a missing test %s" % (p.name, p.test)


def test_caller_probe_recognises_its_callers_only():
    import json  # pylint: disable=import-outside-toplevel

    probe = tf_compat.CallerProbe("json_decode", "json.decoder", ("JSONDecoder.raw_decode",), why="-", test="-")
    seen = []

    def hook(obj):
        seen.append(probe.active())  # called by json's decoder
        return obj

    json.loads('{"a": 1}', object_hook=hook)
    assert seen == [True]
    assert not probe.active()  # called by this test


def test_caller_probe_guard_refuses_a_renamed_function(monkeypatch):
    probe = tf_compat.CallerProbe(
        "renamed", "tensorflow.python.training.saver", ("BaseSaverBuilder.no_such_method",), why="-", test="-"
    )
    with pytest.raises(tf_compat.PatchError, match="renamed.*no_such_method"):
        probe.active()
    other = tf_compat.CallerProbe(
        "old_tf", "tensorflow.python.training.saver", ("BaseSaverBuilder.restore_op",), why="-", test="-"
    )
    monkeypatch.setattr(tf, "__version__", "2.17.0")
    with pytest.raises(tf_compat.PatchError, match=r"old_tf.*2\.17\.0"):
        other.check_guard()


def test_every_graph_edit_is_documented_guarded_and_has_a_test():
    edits = graph_edits.edits()
    assert {e.name for e in edits} >= {"op_attr", "op_control_input", "optimizer_create_slots", "deprecation_warnings"}
    for e in edits:
        e.check_guard()  # the private member it uses exists in this TensorFlow
        assert len(e.why) > 60, "%s: say what it edits and why no public API does it" % e.name
        path, func = e.test.split("::")
        assert func in _test_functions(path), "%s names a missing test %s" % (e.name, e.test)


def test_graph_edit_guard_refuses_a_missing_member_or_another_tensorflow(monkeypatch):
    gone = graph_edits.GraphEdit("gone", "tensorflow.python.framework.ops", "Operation._no_such_member", "-", "-")
    with pytest.raises(tf_compat.PatchError, match="gone.*_no_such_member"):
        gone.check_guard()
    other = graph_edits.GraphEdit("old_tf", "tensorflow.python.framework.ops", "Operation._set_attr", "-", "-")
    monkeypatch.setattr(tf, "__version__", "2.17.0")
    with pytest.raises(tf_compat.PatchError, match=r"old_tf.*2\.17\.0"):
        other.check_guard()


def test_an_optimizer_built_after_a_session_ran_the_graph_is_refused():
    """A Session holds the ops of the graph it ran; TF ignores later edits of those ops (the table layout an
    optimizer's slots extend, a lookup turning inserting), logging only a warning. The optimizer is refused instead,
    with the cause and the fix on the first line; a Session opened after closing the old one is fine."""
    with tf.Graph().as_default() as g:
        emb = tf_ext.get_dynamic_embedding("e", 2, initializer=0.5)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64), is_training=True))
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(loss)  # creates the table, without Adam's slot columns
            assert tf_compat.ops_held_by_open_sessions(g) >= emb.shards[0].handle.op._id  # pylint: disable=W0212
            with pytest.raises(ValueError) as info:
                tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
            first_line = str(info.value).splitlines()[0]
            assert first_line.startswith("AdamOptimizer is built after a Session ran the graph of dynamic embedding e")
            assert "before the first session.run" in first_line
        assert tf_compat.ops_held_by_open_sessions(g) == 0  # closed
        train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            assert sess.run(emb.size()) == 2


def test_apply_gradients_keeps_per_call_state_per_call(monkeypatch):
    """Two threads build two graphs with one optimizer object: one call is held inside TF's apply_gradients (while
    it creates the slots, before TF's own per-instance _prepare) while the other is built whole. Each keeps its own
    slot creation and global step."""
    import threading  # pylint: disable=import-outside-toplevel

    from tensorflow_ext.embedding import shard_lookups  # pylint: disable=import-outside-toplevel
    from tensorflow_ext.embedding.shard import DynamicEmbeddingShard  # pylint: disable=import-outside-toplevel

    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    a_inside, b_done = threading.Event(), threading.Event()
    real_add = DynamicEmbeddingShard.add_slot_columns

    def held_add(shard, optimizer, names, inits, widths=None):
        if shard.embedding.name == "a":
            a_inside.set()
            assert b_done.wait(120), "the other graph was not built"
        return real_add(shard, optimizer, names, inits, widths)

    monkeypatch.setattr(DynamicEmbeddingShard, "add_slot_columns", held_add)
    built, failures = {}, []

    def build(name, wait_for=None, done=None):
        try:
            if wait_for is not None:
                assert wait_for.wait(120), "the first graph did not start"
            with tf.Graph().as_default() as g:
                step = tf.compat.v1.train.get_or_create_global_step()
                emb = tf_ext.get_dynamic_embedding(name, 2, initializer=1.0)
                dense = tf.compat.v1.get_variable("d", initializer=tf.ones([2]))
                loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5], tf.int64)) * dense)
                train = opt.minimize(loss, global_step=step)
                m = opt.get_slot(emb.shards[0], "m").lookup(tf.constant([5], tf.int64))
                built[name] = (g, emb, train, m, step)
        except Exception as e:  # pylint: disable=broad-except
            failures.append((name, e))
        finally:
            if done is not None:
                done.set()

    threads = [
        threading.Thread(target=build, args=("a",)),
        threading.Thread(target=build, args=("b", a_inside, b_done)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert "_create_slots" not in vars(opt)  # the per-call override is gone
    for name, (g, emb, train, m, step) in built.items():
        assert list(emb.shards[0].slot_group(opt).slot_names) == ["m", "v"]
        with g.as_default():
            slot_vars = sorted(v.op.name for v in tf.compat.v1.global_variables() if v.op.name.startswith("d/"))
        assert slot_vars == ["d/Adam", "d/Adam_1"], name
        # The shard update of each graph reads that graph's global step (not the other call's, nor none).
        (apply_op,) = [op for op in g.get_operations() if op.type == "TfExtEmbeddingSparseApplyAdam"]
        assert step.op in shard_lookups.ancestor_ops(list(apply_op.inputs)), name
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            sess.run(train)
            got_m, got_step = sess.run([m, step])
        np.testing.assert_allclose(got_m, [[0.18, 0.18]], rtol=1e-5)
        assert got_step == 2


def test_a_keras_without_the_guarded_optimizers_is_skipped_with_a_warning():
    """The Keras guards only make an error clearer: with a Keras that lacks what they patch (Keras 3 beside TF 2.15
    has no legacy optimizers), importing tensorflow_ext.embedding warns and works."""
    code = r"""
import keras.src.optimizers.legacy.optimizer_v2 as legacy
del legacy.OptimizerV2  # as in a Keras without legacy optimizers
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import tensorflow_ext as tf_ext
import tensorflow_ext.embedding
from tensorflow_ext import tf_compat
assert not tf_compat.is_installed("keras_legacy_optimizer_minimize")
assert not tf_compat.is_installed("keras_legacy_optimizer_apply_gradients")
assert tf_compat.is_installed("keras_optimizer_minimize") and tf_compat.is_installed("optimizer_apply_gradients")
with tf.Graph().as_default():
    emb = tf_ext.get_dynamic_embedding("e", 2, initializer=1.0)
    loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([5], tf.int64)))
    train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.compat.v1.Session() as sess:
        sess.run(train)
        assert sess.run(emb.size()) == 1
print("ok")
"""
    r = _run_fresh(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")
    assert "Keras optimizers will not refuse dynamic embeddings" in r.stderr
    assert "OptimizerV2" in r.stderr


def test_an_unknown_attribute_has_no_side_effects():
    """hasattr(tf_ext, name) for a name tensorflow_ext does not have imports nothing and patches nothing."""
    code = r"""
import sys
import tensorflow_ext as tf_ext
from tensorflow.python.training import optimizer
from tensorflow_ext import tf_compat
installed = [p.name for p in tf_compat.patches() if p.installed]
apply_gradients = optimizer.Optimizer.apply_gradients
modules = set(sys.modules)
assert not hasattr(tf_ext, "anything")
assert not hasattr(tf_ext, "embedding_lookup_v3")
assert set(sys.modules) == modules, sorted(set(sys.modules) - modules)
assert "tensorflow_ext.tfra" not in sys.modules
assert [p.name for p in tf_compat.patches() if p.installed] == installed
assert optimizer.Optimizer.apply_gradients is apply_gradients
try:
    tf_ext.Variable  # a TFRA name still says what to use instead
except AttributeError as e:
    assert "tf_ext.DynamicEmbedding" in str(e), e
else:
    raise AssertionError("tf_ext.Variable exists")
print("ok")
"""
    r = _run_fresh(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")


def test_every_tfra_name_gets_its_advice_from_the_top_level():
    """tensorflow_ext/__init__.py lists TFRA's top-level names (so other unknown names import nothing): the list
    must match tensorflow_ext.tfra._TOP_LEVEL_INSTEAD (add a new name to tensorflow_ext._TFRA_NAMES too)."""
    from tensorflow_ext import tfra  # pylint: disable=import-outside-toplevel

    assert set(tf_ext._TFRA_NAMES) == set(tfra._TOP_LEVEL_INSTEAD)  # pylint: disable=protected-access
    for name in sorted(tfra._TOP_LEVEL_INSTEAD):  # pylint: disable=protected-access
        with pytest.raises(AttributeError, match="tensorflow_ext.%s is not provided" % name):
            getattr(tf_ext, name)


def _run_fresh(code):
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
