"""optimizer_spec (the one Python table of optimizers) against the op library's op defs and TF's own optimizers."""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

import tensorflow_ext as tf_ext

from tensorflow_ext.embedding import embedding_ops
from tensorflow_ext.embedding import optimizer_spec
from tensorflow_ext.embedding import optimizers
from tensorflow_ext.utils import loader

_train = tf.compat.v1.train

# One instance of every supported optimizer, with non-default settings where they change slots, initial values
# or flags.
_OPTIMIZERS = {
    "GradientDescent": lambda: _train.GradientDescentOptimizer(0.1),
    "Momentum": lambda: _train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "Adagrad": lambda: _train.AdagradOptimizer(0.1, initial_accumulator_value=0.3),
    "Adam": lambda: _train.AdamOptimizer(0.1),
    "Ftrl": lambda: _train.FtrlOptimizer(0.1, initial_accumulator_value=0.2, l2_shrinkage_regularization_strength=0.1),
    "RMSProp": lambda: _train.RMSPropOptimizer(0.1, momentum=0.5, centered=True),
    "AdagradDA": lambda: _train.AdagradDAOptimizer(
        0.1, tf.compat.v1.train.get_or_create_global_step(), initial_gradient_squared_accumulator_value=0.4
    ),
    "Adadelta": lambda: _train.AdadeltaOptimizer(0.1),
    "ProximalAdagrad": lambda: _train.ProximalAdagradOptimizer(0.1, initial_accumulator_value=0.6),
    "ProximalGradientDescent": lambda: _train.ProximalGradientDescentOptimizer(0.1),
    "RowwiseAdagrad": lambda: tf_ext.RowwiseAdagradOptimizer(0.1, initial_accumulator_value=0.4),
}


def _op_def(name):
    loader.load_ops()
    op_def = op_def_registry.get(name)
    assert op_def is not None, "op %s is not registered" % name
    return op_def


def test_every_spec_has_an_optimizer_to_check():
    assert sorted(_OPTIMIZERS) == sorted(s.name for s in optimizer_spec.SPECS)
    assert optimizers.supported_optimizers() == [s.optimizer_class for s in optimizer_spec.SPECS]


@pytest.mark.parametrize("spec", optimizer_spec.FUSED, ids=lambda s: s.name)
def test_spec_matches_the_registered_op_def(spec):
    op_def = _op_def(spec.op_name)
    inputs = [a.name for a in op_def.input_arg]
    assert inputs == list(optimizer_spec.APPLY_LEADING_INPUTS + spec.hypers + optimizer_spec.APPLY_TRAILING_INPUTS)
    hyper_types = {a.name: a.type for a in op_def.input_arg if a.name in spec.hypers}
    assert set(hyper_types.values()) == {tf.float32.as_datatype_enum}
    attrs = [a.name for a in op_def.attr]
    assert attrs == list(optimizer_spec.APPLY_ATTRS) + [f.name for f in spec.flags]
    for attr in op_def.attr:
        if attr.name in {f.name for f in spec.flags}:
            assert attr.type == "bool" and attr.default_value.b is False, attr


def test_every_fused_apply_op_of_the_library_has_a_spec():
    ops = loader.load_ops()
    apply_ops = [n for n in dir(ops) if n.startswith("TfExtEmbeddingSparseApply")]
    registered = sorted(n for n in apply_ops if not n.endswith("Multi"))
    assert registered, "no TfExtEmbeddingSparseApply* op in the library"
    assert registered == sorted(s.op_name for s in optimizer_spec.FUSED)
    # Each has its multi-table variant (what the graph passes fuse N of them into), and no other op is there.
    assert sorted(n for n in apply_ops if n.endswith("Multi")) == [n + "Multi" for n in registered]


@pytest.mark.parametrize("spec", optimizer_spec.FUSED, ids=lambda s: s.name)
def test_typed_wrappers_take_the_spec_hyper_parameters_and_flags(spec):
    wrapper = {
        "GradientDescent": embedding_ops.sparse_apply_gradient_descent,
        "Momentum": embedding_ops.sparse_apply_momentum,
        "Adagrad": embedding_ops.sparse_apply_adagrad,
        "Adam": embedding_ops.sparse_apply_adam,
        "Ftrl": embedding_ops.sparse_apply_ftrl,
        "RMSProp": embedding_ops.sparse_apply_rmsprop,
        "RowwiseAdagrad": embedding_ops.sparse_apply_rowwise_adagrad,
    }[spec.name]
    params = set(inspect.signature(wrapper).parameters)
    common = {"table_handle", "keys", "grad", "step", "dim", "slot_offset", "name"}
    assert params - common == set(spec.hypers) | {f.name for f in spec.flags}


@pytest.mark.parametrize("name", sorted(_OPTIMIZERS))
def test_slots_and_initial_values_are_tfs(name):
    """The spec's slots of an optimizer are the ones TF makes for a dense variable, with TF's initial values; a
    row-wise slot (one column in an embedding's rows) is one value per row of the dense variable."""
    with tf.Graph().as_default():
        opt = _OPTIMIZERS[name]()
        spec = optimizer_spec.for_optimizer(opt)
        assert spec.name == name
        var = tf.compat.v1.get_variable("v", initializer=tf.ones([3, 2]))
        opt.minimize(tf.reduce_sum(var))
        tf_slots = sorted(opt.get_slot_names())
        ours = spec.slots_of(opt)
        assert sorted(n for n, _ in ours) == tf_slots
        widths = spec.slot_widths(opt, 2)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for (slot_name, initial), width in zip(ours, widths):
                np.testing.assert_allclose(
                    sess.run(opt.get_slot(var, slot_name).initialized_value()),
                    np.full([3, 2] if width == 2 else [3], initial, np.float32),
                    err_msg=slot_name,
                )


@pytest.mark.parametrize("spec", optimizer_spec.FUSED, ids=lambda s: s.name)
def test_handler_hyper_parameters_are_the_spec_ones(spec):
    with tf.Graph().as_default():
        opt = _OPTIMIZERS[spec.name]()
        var = tf.compat.v1.get_variable("v", initializer=tf.ones([3, 2]))
        opt.minimize(tf.reduce_sum(var))  # creates the optimizer's hyper-parameter tensors
        got_spec, handler = optimizers.handler_for(opt)
        assert got_spec is spec
        assert sorted(handler.hypers(opt)) == sorted(spec.hypers)


def test_flags_follow_the_optimizer():
    with tf.Graph().as_default():
        assert optimizer_spec.for_optimizer(_OPTIMIZERS["Momentum"]()).flag_values(_OPTIMIZERS["Momentum"]()) == {
            "use_nesterov": True
        }
        plain = _train.RMSPropOptimizer(0.1)
        spec = optimizer_spec.for_optimizer(plain)
        assert spec.flag_values(plain) == {"centered": False}
        assert spec.slot_names(spec.flag_values(plain)) == ("rms", "momentum")
        assert embedding_ops.num_slots("RMSProp", centered=True) == 3
        assert embedding_ops.num_slots("Adam") == 2


def test_slot_widths_are_dim_or_one_column_for_a_rowwise_slot():
    with tf.Graph().as_default():
        rowwise, adam = _OPTIMIZERS["RowwiseAdagrad"](), _OPTIMIZERS["Adam"]()
        assert optimizer_spec.for_optimizer(rowwise).slot_widths(rowwise, 16) == [1]
        assert optimizer_spec.for_optimizer(adam).slot_widths(adam, 16) == [16, 16]
        assert [s.name for s in optimizer_spec.SPECS if any(slot.rowwise for slot in s.slots)] == ["RowwiseAdagrad"]


def test_unknown_optimizers_and_flags_are_named():
    with pytest.raises(ValueError, match=r"optimizer must be one of .*'Adam'.*got 'Adamax'"):
        embedding_ops.sparse_apply("Adamax", None, [1], [[1.0]], {})
    with pytest.raises(ValueError, match="no flag 'centered'"):
        embedding_ops.num_slots("Momentum", centered=True)
    with pytest.raises(TypeError, match="cannot train dynamic embeddings.*AdamOptimizer"):
        optimizer_spec.for_optimizer(object())
