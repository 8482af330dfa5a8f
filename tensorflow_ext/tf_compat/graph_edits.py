"""The edits tensorflow_ext makes to ops and objects TensorFlow already built, through their private members.

TensorFlow's public API builds an op with its final attrs and inputs and offers no way to change them later, yet
some of tensorflow_ext's graph building decides late what an op already in the graph must do (an optimizer built
after the lookups turns them inserting and widens the table's rows; a restore is gated after its ops exist).
Each such edit is a function here, registered with what it does, why no public API does it, the private TF member
it uses and the test that covers it; tests/test_tf_compat.py checks every entry, as it checks the patches.
Modules call these functions instead of touching the private members, so this file lists every such write
(reads of TensorFlow internals are in `internals`).

Guard: before its first use, an edit checks that the TensorFlow version is in the tested range and that the
private member it uses still exists, and raises `tf_compat.PatchError` naming the edit otherwise.

A Session that already holds an op ignores these edits (TensorFlow logs a warning only); callers refuse an edit
of such an op first (`tf_compat.held_by_an_open_session`).
"""

import contextlib
import functools
import threading

from tensorflow.python.util import deprecation as _deprecation

from tensorflow_ext import tf_compat

__all__ = [
    "GraphEdit",
    "add_control_input",
    "deprecation_warnings_silenced",
    "edits",
    "set_attr",
    "set_create_slots",
    "update_input",
]


class GraphEdit(object):
    """One kind of edit of an object TensorFlow built, made through a private member.

    Attributes:
      name: short unique name.
      module: dotted module path of the class whose private member the edit uses.
      member: attribute path of that member inside the module (``Operation._set_attr``).
      why: what the edit does, where tensorflow_ext needs it, and why no public API does it.
      test: "path::test_name" of the test that covers it.
    """

    def __init__(self, name, module, member, why, test):
        self.name = name
        self.module = module
        self.member = member
        self.why = why
        self.test = test
        self._checked = False

    def check_guard(self):
        """Raises PatchError unless TF's version is in range and the member exists (checked once)."""
        if self._checked:
            return
        tf_compat.check_tf_version("graph edit %r" % self.name)
        try:
            tf_compat.resolve(self.module, self.member)
        except (ImportError, AttributeError) as e:
            raise tf_compat.PatchError(
                "tensorflow_ext graph edit %r: %s.%s is missing in this TensorFlow (%s)"
                % (self.name, self.module, self.member, e)
            ) from e
        self._checked = True

    def __repr__(self):
        return "<tf_compat.GraphEdit %s via %s.%s>" % (self.name, self.module, self.member)


_lock = threading.Lock()
_EDITS = {}


def _register(name, module, member, why, test):
    """Decorator: registers the edit `name` (see `GraphEdit`); the function checks the guard before running."""

    def deco(fn):
        edit = GraphEdit(name, module, member, why, test)
        with _lock:
            if name in _EDITS:
                raise ValueError("tf_compat graph edit %r registered twice" % name)
            _EDITS[name] = edit

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            edit.check_guard()
            return fn(*args, **kwargs)

        return guarded

    return deco


def edits():
    """The registered graph edits (a new list, in registration order)."""
    with _lock:
        return list(_EDITS.values())


@_register(
    "op_attr",
    "tensorflow.python.framework.ops",
    "Operation._set_attr",
    why="Sets an attr of an op already in its graph. tensorflow_ext decides some attrs after building the op: a "
    "table handle's row width and column defaults grow when an optimizer adds its slot columns; a lookup built "
    "with is_training=None turns inserting (insert_missing), and the admission's training flag constant True, when "
    "an optimizer trains through it; the Horovod configuration fingerprint constant is refreshed when more of the "
    "model is built. TensorFlow builds an op with its final attrs and has no public API to change them.",
    test="tests/test_tf_compat.py::test_optimizer_apply_gradients_keeps_slots_in_rows",
)
def set_attr(op, name, attr_value):
    """Sets attr `name` of `op` to the AttrValue proto `attr_value`."""
    op._set_attr(name, attr_value)  # pylint: disable=protected-access


@_register(
    "op_control_input",
    "tensorflow.python.framework.ops",
    "Operation._add_control_input",
    why="Adds a control input to an op already in its graph. A Saver builds the restore's ops one saveable at a "
    "time, and no shard of an embedding may be imported before every shard's tensors are read and checked (a "
    "truncated or mismatched checkpoint changes no table); the restore also runs after its layout record is "
    "read, and a find-only lookup runs after its inserting twin once an optimizer trains through it. "
    "tf.control_dependencies applies only to ops built inside it; TensorFlow has no public API to add a control "
    "input later.",
    test="tensorflow_ext/embedding/tests/test_de_checkpoint_safety.py::"
    "test_truncated_data_file_is_an_error_and_changes_no_table",
)
def add_control_input(op, dependency):
    """Makes `op` run after the op `dependency`."""
    op._add_control_input(dependency)  # pylint: disable=protected-access


@_register(
    "op_input",
    "tensorflow.python.framework.ops",
    "Operation._update_input",
    why="Feeds an input of an op already in its graph from another tensor. Each model-parallel lookup builds its "
    "own alltoall exchange when it is called; when DistributedOptimizer later sees the loss, it builds one fused "
    "exchange for all of the step's lookups and feeds each lookup's Identity ops (keys and rows received) from it, "
    "before the gradients are built; the exchange's gradient then reads, on its way, the gradients that GATE_OP's "
    "tuple gates (it need not wait for the dense weight gradients). The lookups' results are already used by the "
    "model; TensorFlow has no public API to change an op's input after it is built.",
    test="tensorflow_ext/horovod/tests/test_model_parallel_fusion.py::test_fused_exchange_equals_per_embedding",
)
def update_input(op, index, tensor):
    """Makes input `index` of `op` the tensor `tensor` (same dtype)."""
    op._update_input(index, tensor)  # pylint: disable=protected-access


@_register(
    "optimizer_create_slots",
    "tensorflow.python.training.optimizer",
    "Optimizer._create_slots",
    why="Overrides, on one optimizer instance, the _create_slots that TF's apply_gradients calls, while "
    "apply_gradients calls with dynamic embedding shards are in flight: it passes the dense variables to the "
    "class's _create_slots and appends the optimizer's slot columns to the shards' rows instead of making slot "
    "variables of a shard's shape (see the optimizer_apply_gradients patch). TF's Optimizer has no hook for "
    "slots that are not variables.",
    test="tests/test_tf_compat.py::test_apply_gradients_keeps_per_call_state_per_call",
)
def set_create_slots(opt, create_slots):
    """Makes `create_slots` the `_create_slots` of the optimizer instance `opt`; None removes the instance's own
    (the class's method applies again)."""
    if create_slots is None:
        del opt._create_slots  # pylint: disable=protected-access
    else:
        opt._create_slots = create_slots  # pylint: disable=protected-access


@_register(
    "deprecation_warnings",
    "tensorflow.python.util.deprecation",
    "_PRINT_DEPRECATION_WARNINGS",
    why="Turns TensorFlow's deprecation warnings off for a block and back to what they were after it, also when "
    "it raises: the CTR example uses TF1 APIs on purpose (Estimator, feature columns), each of which logs a "
    "deprecation warning on first use, and keeps its output to its own lines unless --verbose. TF's only switch "
    "is this module flag; its deprecation.silence() is not exported and does not restore the flag after an "
    "exception.",
    test="tests/test_ctr_example.py::test_quiet_tf_logs_are_scoped_to_the_run",
)
@contextlib.contextmanager
def deprecation_warnings_silenced():
    """A context in which TensorFlow prints no deprecation warning; the previous setting comes back after."""
    previous = _deprecation._PRINT_DEPRECATION_WARNINGS  # pylint: disable=protected-access
    _deprecation._PRINT_DEPRECATION_WARNINGS = False  # pylint: disable=protected-access
    try:
        yield
    finally:
        _deprecation._PRINT_DEPRECATION_WARNINGS = previous  # pylint: disable=protected-access
