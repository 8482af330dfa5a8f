"""The patches of TensorFlow that teach it about dynamic embeddings, registered with `tf_compat`'s machinery.

TensorFlow 2.15's TF1 optimizers, moving averages, warm start and Saver default list know only TF's variables; a
dynamic embedding's shard is a hash table whose optimizer slots are columns of its rows. Each patch below replaces
one TensorFlow attribute with a function that handles shards and embeddings and hands everything else to TF's
original unchanged; each entry says what it replaces, why TF has no hook for it, and the test that checks it
(tests/test_tf_compat.py checks every entry of `tf_compat.patches()`).

Importing this module registers the patches; `install()` (called when `tensorflow_ext.embedding` is imported)
installs them, together with the embedding-independent patches of `tf_compat` that the embedding layer relies on
(sessions: which ops they hold, float ids fed to them; restore errors). This module sits at the top of the
embedding layer: it imports the modules whose objects the patches handle, and none of them imports it.
"""

import importlib.util

import tensorflow as tf

from tensorflow_ext import tf_compat
from tensorflow_ext.embedding import optimizers
from tensorflow_ext.embedding import shard as shard_lib
from tensorflow_ext.embedding import shard_lookups
from tensorflow_ext.embedding import variable
from tensorflow_ext.embedding.checkpoint import policy_state
from tensorflow_ext.embedding.checkpoint import warm_start
from tensorflow_ext.embedding.layout import DynamicEmbeddingSlot
from tensorflow_ext.embedding.state import GraphKeys

__all__ = ["install"]

# Installed by install(): without them tf.compat.v1.train optimizers cannot train a dynamic embedding, and a
# Saver, warm start or moving average would mishandle its shards.
_PATCHES = (
    "optimizer_get_processor",
    "optimizer_compute_gradients",
    "optimizer_apply_gradients",
    "optimizer_get_slot",
    "optimizer_get_slot_names",
    "moving_average_apply",
    "warm_start_grouped_variables",
    "warm_start_var_info",
    "init_from_checkpoint",
    "saver_default_var_list",
    "session_extend_graph",
    "session_run_feeds",
    "saver_restore_error",
)
# Advisory (they only make an error clearer): skipped with a warning where the installed Keras lacks their target.
_KERAS_PATCHES = (
    "keras_optimizer_minimize",
    "keras_optimizer_apply_gradients",
    "keras_legacy_optimizer_minimize",
    "keras_legacy_optimizer_apply_gradients",
)


def install():
    """Installs the patches the embedding layer needs (idempotent).

    The Keras guards are advisory (they only give a clearer error): one that does not fit the installed Keras
    (e.g. Keras 3, which has no legacy optimizers) is skipped with a warning.

    Raises:
      tf_compat.PatchError: a patched TF attribute moved (another TensorFlow than the supported ones).
    """
    tf_compat.install(*_PATCHES)
    if importlib.util.find_spec("keras") is None:  # no Keras, no Keras optimizer to guard
        return
    for name in _KERAS_PATCHES:
        try:
            tf_compat.install(name)
        except tf_compat.PatchError as e:
            tf.compat.v1.logging.warning(
                "tensorflow_ext: Keras optimizers will not refuse dynamic embeddings with a clear error (the "
                "installed Keras does not have what the guard patches: %s); train dynamic embeddings with "
                "tf.compat.v1.train optimizers" % e
            )


def _is_shard(value):
    return isinstance(value, shard_lib.DynamicEmbeddingShard)


def _is_embedding(value):
    return isinstance(value, variable.DynamicEmbedding)


# ---- slots, moving averages -----------------------------------------------------------------------------------


@tf_compat.register(
    "optimizer_get_slot",
    "tensorflow.python.training.optimizer",
    "Optimizer",
    "get_slot",
    why="A dynamic embedding's optimizer slots are columns of its table rows, not variables, so TF's get_slot "
    "finds nothing and returns None (code reading slots then silently skips the embedding). For a shard the "
    "replacement returns a DynamicEmbeddingSlot (a view of those columns, usable as a tensor); TF's "
    "Optimizer has no hook for slots that are not variables.",
    test="tests/test_tf_compat.py::test_optimizer_get_slot_of_a_shard",
)
def _make_get_slot(original):

    def get_slot(self, var, name):
        if _is_shard(var):
            group = var.slot_group(self)
            if group is not None and name in group.slot_names:
                return DynamicEmbeddingSlot(var, self, name)
            return None
        return original(self, var, name)

    return get_slot


@tf_compat.register(
    "optimizer_get_slot_names",
    "tensorflow.python.training.optimizer",
    "Optimizer",
    "get_slot_names",
    why="TF lists the slot names of the slot variables it created; an optimizer that trains only dynamic "
    "embeddings created none. The replacement adds the slot names it keeps in the rows of the default graph's "
    "dynamic embeddings.",
    test="tests/test_tf_compat.py::test_optimizer_get_slot_names_include_embedding_slots",
)
def _make_get_slot_names(original):

    def get_slot_names(self):
        names = set(original(self))
        for shard in tf.compat.v1.get_default_graph().get_collection(GraphKeys.DYNAMIC_EMBEDDINGS):
            group = shard.slot_group(self) if _is_shard(shard) else None
            if group is not None:
                names.update(group.slot_names)
        return sorted(names)

    return get_slot_names


@tf_compat.register(
    "moving_average_apply",
    "tensorflow.python.training.moving_averages",
    "ExponentialMovingAverage",
    "apply",
    why="ExponentialMovingAverage.apply(tf.compat.v1.trainable_variables()) would build a shadow of a dynamic "
    "embedding shard from the rows one step read, a meaningless average. The replacement refuses shards with "
    "an error that says how to average the dense variables only.",
    test="tests/test_tf_compat.py::test_moving_average_refuses_shards_with_advice",
)
def _make_ema_apply(original):

    def apply(self, var_list=None):
        shards = [v for v in (var_list or []) if _is_shard(v)]
        if shards:
            names = ", ".join(s.name for s in shards[:3]) + (", ..." if len(shards) > 3 else "")
            raise TypeError(
                "ExponentialMovingAverage cannot average dynamic embedding shards (%s): a table has no fixed set "
                "of rows to shadow. Average the dense variables only, e.g. "
                "ema.apply(tf_ext.embedding.dense_variables(tf.compat.v1.trainable_variables()))." % names
            )
        return original(self, var_list)

    return apply


# ---- warm start -----------------------------------------------------------------------------------------------


@tf_compat.register(
    "warm_start_grouped_variables",
    "tensorflow.python.training.warm_starting_util",
    "",
    "_get_grouped_variables",
    why="tf.compat.v1.train.warm_start (and Estimator warm_start_from) select the variables to warm-start here; "
    "a dynamic embedding shard is not a variable TF can partition-group. The replacement groups the dense "
    "variables as TF does and adds each selected shard as its own entry (a stand-in object).",
    test="tests/test_tf_compat.py::test_warm_start_patches_handle_shards_and_leave_variables_to_tf",
)
def _make_grouped_variables(original):

    def _get_grouped_variables(vars_to_warm_start):
        graph = tf.compat.v1.get_default_graph()
        shards = warm_start.matching_shards(vars_to_warm_start, graph)
        coll = graph.get_collection_ref(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        saved = list(coll)
        coll[:] = [v for v in saved if not _is_shard(v)]
        try:
            arg = vars_to_warm_start
            if isinstance(arg, list) and not all(isinstance(v, str) for v in arg):
                arg = [v for v in arg if not _is_shard(v)]
            grouped = original(arg) if arg != [] else {}
        finally:
            coll[:] = saved
        for shard in shards:
            grouped[shard.name] = [warm_start.ShardTarget(shard)]
        return grouped

    return _get_grouped_variables


@tf_compat.register(
    "warm_start_var_info",
    "tensorflow.python.training.warm_starting_util",
    "",
    "_get_var_info",
    why="warm_start builds a VariableInfo (vocabulary remapping) per selected variable; a shard stand-in has no "
    "vocabulary. The replacement passes the stand-in through with its checkpoint name.",
    test="tests/test_tf_compat.py::test_warm_start_patches_handle_shards_and_leave_variables_to_tf",
)
def _make_var_info(original):

    def _get_var_info(var, prev_tensor_name=None):
        target = var[0] if isinstance(var, list) and len(var) == 1 else var
        if isinstance(target, warm_start.ShardTarget):
            return (prev_tensor_name or target.name), target
        return original(var, prev_tensor_name)

    return _get_var_info


@tf_compat.register(
    "init_from_checkpoint",
    "tensorflow.python.training.checkpoint_utils",
    "",
    "init_from_checkpoint",
    why="warm_start ends in init_from_checkpoint, which overrides variable initializers; a table has none. The "
    "replacement fills each shard stand-in from the previous embedding's checkpoint tensors (re-partitioned by "
    "key) when the model initializes, and passes every variable to TF's function.",
    test="tests/test_tf_compat.py::test_warm_start_patches_handle_shards_and_leave_variables_to_tf",
)
def _make_init_from_checkpoint(original):

    def init_from_checkpoint(ckpt_dir_or_file, assignment_map):
        rest = {}
        for prev_name, target in dict(assignment_map).items():
            if isinstance(target, warm_start.ShardTarget):
                warm_start.warm_start_shard(ckpt_dir_or_file, prev_name, target.shard)
            else:
                rest[prev_name] = target
        if rest or not assignment_map:
            return original(ckpt_dir_or_file, rest)
        return None

    return init_from_checkpoint


# ---- the Saver's default list ---------------------------------------------------------------------------------


@tf_compat.register(
    "saver_default_var_list",
    "tensorflow.python.ops.variables",
    "",
    "_all_saveable_objects",
    why="The state of an embedding's admission or eviction policy (the admitted- and evicted-keys counters, "
    "BloomAdmission's counters) is in variables, which the Saver restores with one RestoreV2 that fails on a tensor "
    "missing from the checkpoint; so a model given a policy could not restart from a checkpoint saved without one. "
    "These variables are saved by tensorflow_ext's own saveables (same tensor names), whose restore starts the state "
    "empty where the checkpoint lacks it; the replacement leaves them out of the Saver's default list (the global "
    "variables and SAVEABLE_OBJECTS, what Saver(), MonitoredTrainingSession, Estimator and the SavedModel builder "
    "save) so that they are not saved twice. Other variables and lists are TF's unchanged. TF has no hook for a "
    "variable's saveable in a TF1 Saver.",
    test="tensorflow_ext/embedding/tests/test_de_policy_checkpoint.py::"
    "test_policy_added_to_a_model_restores_its_checkpoint_with_empty_state",
)
def _make_all_saveable_objects(original):

    def _all_saveable_objects(scope=None):
        found = original(scope)
        claimed = policy_state.claimed_variables(tf.compat.v1.get_default_graph())
        if not claimed:
            return found
        return [x for x in found if id(x) not in claimed]

    return _all_saveable_objects


# ---- tf.compat.v1.train optimizers train dynamic embeddings; Keras optimizers refuse them --------------------


@tf_compat.register(
    "optimizer_get_processor",
    "tensorflow.python.training.optimizer",
    "",
    "_get_processor",
    why="TF1 optimizers reach a variable only through the processor _get_processor returns (its target() is what "
    "compute_gradients differentiates, its update_op what apply_gradients runs), and the function knows only TF's "
    "variable types. For a dynamic embedding shard the replacement returns a processor whose target is the table "
    "handle (so the gradient is an IndexedSlices of int64 keys) and whose update applies the optimizer to the "
    "table rows; every other variable gets TF's processor.",
    test="tests/test_tf_compat.py::test_optimizer_get_processor_targets_the_shard_handle",
)
def _make_get_processor(original):

    def _get_processor(v):
        if _is_shard(v):
            return optimizers.ShardProcessor(v)
        return original(v)

    return _get_processor


@tf_compat.register(
    "optimizer_compute_gradients",
    "tensorflow.python.training.optimizer",
    "Optimizer",
    "compute_gradients",
    why="compute_gradients (and minimize) take var_list as variables; a DynamicEmbedding is a group of shards, "
    "not a variable. The replacement expands each DynamicEmbedding in var_list into its shards and calls TF's "
    "compute_gradients unchanged.",
    test="tests/test_tf_compat.py::test_optimizer_compute_gradients_expands_dynamic_embeddings",
)
def _make_compute_gradients(original):

    def compute_gradients(self, loss, var_list=None, *args, **kwargs):
        if var_list is not None and not callable(loss):
            expanded = []
            for v in tf.nest.flatten(var_list):
                if _is_embedding(v):
                    expanded.extend(v.shards)
                else:
                    expanded.append(v)
            var_list = expanded
        return original(self, loss, var_list, *args, **kwargs)

    return compute_gradients


@tf_compat.register(
    "optimizer_apply_gradients",
    "tensorflow.python.training.optimizer",
    "Optimizer",
    "apply_gradients",
    why="TF's apply_gradients creates slots through self._create_slots(var_list), which would make a slot "
    "variable of a shard's shape; a dynamic embedding keeps its slots as columns of its table rows instead. When "
    "some variables are shards, the replacement overrides _create_slots on the optimizer instance while calls "
    "are in flight (TF has no hook for slots that are not variables), with a function that finds the calling "
    "thread's call (so graphs built at once with one optimizer keep their own state) and falls back to the "
    "class's: the call's version passes the dense variables to the class's _create_slots, appends the "
    "optimizer's slot columns (with TF's initial values) to each shard's rows and makes the optimizer's non-slot "
    "variables (Adam's beta powers) even without dense variables; the override is removed when the last call "
    "returns. TF's apply_gradients itself runs unchanged (one _prepare, one _finish, so Adam's beta powers "
    "advance once per step, one global_step increment). Then the find-only lookups the gradient flows through "
    "become inserting ones.",
    test="tests/test_tf_compat.py::test_optimizer_apply_gradients_keeps_slots_in_rows",
)
def _make_apply_gradients(original):

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **kwargs):
        grads_and_vars = tuple(grads_and_vars)
        shards, grads = [], []
        for g, v in grads_and_vars:
            if g is not None and _is_shard(v):
                grads.append(g)
                if v not in shards:
                    shards.append(v)
        if not shards:
            return original(self, grads_and_vars, global_step=global_step, name=name, **kwargs)
        spec, handler = optimizers.handler_for(self)
        slot_specs = spec.slots_of(self)
        names = [n for n, _ in slot_specs]
        inits = [v for _, v in slot_specs]
        # The lookups this gradient flows through turn inserting (see shard_lookups); refused before anything is
        # built if a Session already holds the graph (it would ignore the change).
        ancestors = shard_lookups.ancestor_ops(grads)
        for shard in shards:
            if names and shard.slot_group(self) is None and shard.layout.frozen_by is None:
                _refuse_layout_change_a_session_ignores(self, shard)  # (a frozen layout refuses it: its own error)
            shard.lookups.check_lookups_feeding(ancestors)
        orig_create_slots = optimizers.original_create_slots(self)

        def _create_slots(var_list):
            dense = [v for v in var_list if not _is_shard(v)]
            if dense:
                orig_create_slots(dense)
            for shard in shards:
                shard.add_slot_columns(self, names, inits, spec.slot_widths(self, shard.dim))
            handler.create_non_slots(self, dense, shards)

        step = global_step if global_step is not None else tf.compat.v1.train.get_global_step()
        # Per call (a thread may build another graph with the same optimizer meanwhile): TF's apply_gradients
        # finds this call's _create_slots and the shard updates this call's step.
        with optimizers.apply_call(self, _create_slots, step, shards):
            result = original(self, grads_and_vars, global_step=global_step, name=name, **kwargs)
        for shard in shards:
            shard.lookups.train_lookups_feeding(ancestors)
        return result

    return apply_gradients


def _refuse_layout_change_a_session_ignores(opt, shard):
    """An optimizer with slots appends columns to the table's layout (attrs of its handle op), which a Session that
    already holds the graph ignores: its table keeps the old layout."""
    if tf_compat.held_by_an_open_session(shard.handle.op):
        raise ValueError(
            "%s is built after a Session ran the graph of dynamic embedding %s: build the optimizer (minimize / "
            "apply_gradients) before the first session.run, or open a new Session after building it (close the "
            "old one). The optimizer keeps its slots in the embedding's table rows, which changes the table's "
            "layout, and the Session that already holds the graph would keep the old layout (the table it "
            "created or will create has no slot columns)." % (type(opt).__name__, shard.embedding.name)
        )


def _refuse_embeddings(opt, variables):
    for v in variables:
        if _is_shard(v) or _is_embedding(v):
            raise TypeError(
                "Keras optimizer %s cannot train dynamic embedding %s: dynamic embeddings train with "
                "tf.compat.v1.train optimizers, e.g. tf.compat.v1.train.AdagradOptimizer, AdamOptimizer, "
                "FtrlOptimizer or GradientDescentOptimizer (all: tf_ext.embedding.supported_optimizers())"
                % (type(opt).__name__, v.name)
            )


def _make_keras_minimize(original):

    def minimize(self, loss, var_list, *args, **kwargs):
        if not callable(var_list):
            _refuse_embeddings(self, tf.nest.flatten(var_list))
        return original(self, loss, var_list, *args, **kwargs)

    return minimize


def _make_keras_apply_gradients(original):

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        _refuse_embeddings(self, [p[1] for p in grads_and_vars if isinstance(p, (tuple, list)) and len(p) == 2])
        return original(self, grads_and_vars, *args, **kwargs)

    return apply_gradients


_KERAS_WHY = (
    "Keras optimizers fail on a dynamic embedding deep inside Keras/TF (a tape without a gradient, or a missing "
    "attribute) with an error that does not say why. The replacement raises a TypeError naming the embedding "
    "and the tf.compat.v1.train optimizers that train it, and hands dense variables to Keras unchanged; Keras "
    "has no hook to validate var_list."
)
_KERAS_TEST = "tests/test_tf_compat.py::test_keras_optimizers_refuse_dynamic_embeddings"
for _name, _module, _owner in (
    ("keras_optimizer", "keras.src.optimizers.optimizer", "Optimizer"),
    ("keras_legacy_optimizer", "keras.src.optimizers.legacy.optimizer_v2", "OptimizerV2"),
):
    tf_compat.register(_name + "_minimize", _module, _owner, "minimize", why=_KERAS_WHY, test=_KERAS_TEST)(
        _make_keras_minimize
    )
    tf_compat.register(
        _name + "_apply_gradients", _module, _owner, "apply_gradients", why=_KERAS_WHY, test=_KERAS_TEST
    )(_make_keras_apply_gradients)
del _name, _module, _owner
