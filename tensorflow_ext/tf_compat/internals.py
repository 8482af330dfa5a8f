"""The one place where tensorflow_ext reads TensorFlow's internal modules and private members.

TensorFlow 2.15's public API (``tf.*``, ``tf.compat.v1.*``, ``tf.raw_ops``) covers most of what tensorflow_ext
builds; what it does not cover is read through the names below, each with what it is used for and why no public
API serves. Every other module of the package imports these names from here instead of importing
``tensorflow.python`` or reading a private member of a TensorFlow object (tests/test_source_rules.py checks), so a
TensorFlow upgrade has one list to review.

Contract:
  - Reads only. Changes of objects TensorFlow already built go through `tf_compat.graph_edits`; replaced
    attributes of TF modules and classes through tf_compat's patches. Both are registries with guards and tests.
  - A name here is exactly TensorFlow's object (no wrapper changes its behaviour), except the small functions that
    each read one private member and say which.
  - A name whose public equivalent exists and behaves the same does not belong here: use the public one.
"""

# pylint: disable=protected-access

import tensorflow as tf
from tensorflow.python.feature_column import feature_column as _feature_column_v1
from tensorflow.python.feature_column import feature_column_v2 as _feature_column_v2
from tensorflow.python.framework import ops
from tensorflow.python.ops import control_flow_grad as _control_flow_grad
from tensorflow.python.ops import control_flow_ops
from tensorflow.python.ops import lookup_ops
from tensorflow.python.ops import resources
from tensorflow.python.ops import variable_scope as _variable_scope
from tensorflow.python.training import checkpoint_utils as _checkpoint_utils
from tensorflow.python.training import slot_creator
from tensorflow.python.training.saving import saveable_object
from tensorflow.python.util import function_utils
from tensorflow.python.util import nest
from tensorflow.python.util import object_identity

__all__ = [
    "CategoricalColumn",
    "CategoricalColumnV1",
    "DenseColumn",
    "DenseColumnV1",
    "SequenceCategoricalColumn",
    "SequenceCategoricalColumnV1",
    "checkpoint_filename",
    "control_flow_context",
    "control_flow_ops",
    "default_saver_settings",
    "feature_column_scope_name",
    "function_utils",
    "lookup_ops",
    "nest",
    "object_identity",
    "ops",
    "resources",
    "saveable_object",
    "saved_model_builder_meta_graphs",
    "saver_checkpoints_with_time",
    "slot_creator",
    "state_manager_trainable",
    "switch_grad",
    "to_sparse_input_and_drop_ignore_values",
    "variable_store_has",
]

# ---------------------------------------------------------------------------------------------- modules
#
# ops: `ops.colocate_with` places a table's ops with its handle. The public tf.compat.v1.colocate_with is the same
#   function wrapped in a deprecation notice that TF logs on first use (the examples' output stays clean of it).
# saveable_object: `SaveableObject` and `SaveSpec`, the TF1 Saver's interface for state that is not a variable
#   (table shards, policy state). TF exports no public base class for it.
# lookup_ops: `LookupInterface`, the base class that makes tf_ext.HashTable a lookup table to TF (resource
#   tracking, `tf.compat.v1.tables_initializer`). TF exports its tables, not their base class.
# resources: `register_resource` adds a warm start's import op to the shared resources, whose initialisation the
#   default Scaffold's init_op runs and whose readiness its ready checks ask; no public API registers a resource.
# control_flow_ops: `switch`, `merge` and `CondContext`, with which mixed precision's gradient of a tf.cond switch
#   routes a resource variable's gradient; tf.raw_ops.Switch/Merge take no IndexedSlices and CondContext has no
#   public name.
# slot_creator: `create_zeros_slot` makes an optimizer slot variable colocated with and named after its variable,
#   as TF's own optimizers do; the TF1 Optimizer's public API creates slots only through its private methods.
# function_utils: `fn_args`, the argument names of a function, functools.partial or callable object, read the way
#   tf.estimator reads an input_fn's (a bound method's self and a partial's bound arguments dropped); TF exports no
#   equivalent.
# object_identity: `Reference`, the hashable reference a tf.Variable's `ref()` returns; a shard's `ref()` returns
#   one so that code keying dicts by variable reference takes shards too. The class has no public name.
# nest: `flatten_dict_items`, which tf.nest does not export.

# ---------------------------------------------------------------------------------------------- feature columns
#
# A tf_ext feature column must be an instance of TF's categorical / dense column base classes, v2 and v1 both
# (tf.compat.v1.feature_column.input_layer, linear_model and the v2 DenseFeatures check isinstance against them).
# TF exports the concrete columns, not these bases (the v2 DenseColumn only under tf.__internal__).
CategoricalColumn = _feature_column_v2.CategoricalColumn
SequenceCategoricalColumn = _feature_column_v2.SequenceCategoricalColumn
DenseColumn = _feature_column_v2.DenseColumn
CategoricalColumnV1 = _feature_column_v1._CategoricalColumn
SequenceCategoricalColumnV1 = _feature_column_v1._SequenceCategoricalColumn
DenseColumnV1 = _feature_column_v1._DenseColumn

# Dense ids -> SparseTensor without the ignore value's cells, exactly as TF's own categorical columns convert
# their input (same op names, same defaults for the ignore value); TF does not export it.
to_sparse_input_and_drop_ignore_values = _feature_column_v2._to_sparse_input_and_drop_ignore_values


def feature_column_scope_name(column):
    """The variable scope name of a v1 feature column (its private ``_var_scope_name``, which defaults to its name
    and which column subclasses may override): where TF's own columns create their variables."""
    return column._var_scope_name


def state_manager_trainable(state_manager):
    """Whether the variables a v2 feature column creates through `state_manager` are trainable by default: the
    private ``_trainable`` of TF's StateManager implementation (True for a state manager without one). The
    StateManager API passes it only to `create_variable`, not to a column that creates a resource."""
    return getattr(state_manager, "_trainable", True)


# ---------------------------------------------------------------------------------------------- graph and training


def control_flow_context(op_or_graph):
    """The control flow context (a `control_flow_ops.CondContext`, a while context or None) an op was built in,
    or a graph is building in now: the private ``_get_control_flow_context`` of Operation and Graph. No public
    API tells whether an op is inside a tf.cond branch."""
    return op_or_graph._get_control_flow_context()


# TF's gradient of the Switch op (registered for "Switch"); mixed precision's own switch gradient hands every case
# it does not change back to it. Registered gradients have no public lookup.
switch_grad = _control_flow_grad._SwitchGrad


def variable_store_has(name):
    """Whether the current graph's default variable store (tf.compat.v1.get_variable's) holds a variable `name`.
    get_dynamic_embedding refuses a name that a variable already has. The store is private (``_vars`` of
    ``variable_scope._get_default_variable_store()``); no public API lists its names without creating one."""
    return name in getattr(_variable_scope._get_default_variable_store(), "_vars", {})


def default_saver_settings(saver):
    """The retention settings of a TF1 Saver that saves the graph's default list and is not built yet (the Saver an
    Estimator puts in SAVERS), as Saver keyword arguments; None for any other Saver. Reads its private
    ``_var_list``, ``_is_built``, ``_sharded``, ``_max_to_keep`` and ``_keep_checkpoint_every_n_hours``: the
    Horovod training hooks replace that Saver by one that saves each rank's Top-K residuals with the same
    retention, and a Saver exposes neither its variable list nor its settings."""
    if (
        not isinstance(saver, tf.compat.v1.train.Saver)
        or saver._var_list is not None
        or saver._is_built
        or not saver._sharded
    ):
        return None
    return dict(max_to_keep=saver._max_to_keep, keep_checkpoint_every_n_hours=saver._keep_checkpoint_every_n_hours)


def checkpoint_filename(ckpt_dir_or_file):
    """The checkpoint path of a checkpoint directory or file, as TF's warm start resolves it (the latest
    checkpoint of a directory); TF's `checkpoint_utils._get_checkpoint_filename`, which is not exported."""
    return _checkpoint_utils._get_checkpoint_filename(ckpt_dir_or_file)


def saver_checkpoints_with_time(saver):
    """[(path, time)] of the checkpoints a tf.compat.v1.train.Saver keeps, oldest first. The public
    `Saver.last_checkpoints` has the paths only, and `set_last_checkpoints_with_time` needs the times back."""
    return list(saver._last_checkpoints)


# ---------------------------------------------------------------------------------------------- SavedModel export


def saved_model_builder_meta_graphs(builder):
    """The MetaGraphDefs a `tf.compat.v1.saved_model.Builder` has added so far, in order: the repeated field
    ``meta_graphs`` of its private ``_saved_model`` (the SavedModel proto its `save()` writes). An updatable export
    (tensorflow_ext/serving/live.py) edits the graph of the one its `add_meta_graph*` call just appended, so that
    the signatures' nodes read the live model; the Builder has no hook between exporting a meta graph and keeping
    it. The entries are protobuf messages: changes to them go into the SavedModel that `save()` writes."""
    return builder._saved_model.meta_graphs
