"""Updatable ("live") SavedModels: a served model that applies the trainer's serving updates in place.

A SavedModel exported inside `freeze_for_serving(live_model="<model name>")` (by `Estimator.export_saved_model` or
a `tf.compat.v1.saved_model.Builder`) serves its frozen tables and the variables its signatures read through one
C++ live model (`TfExtLive*` ops, tensorflow_ext/serving/kernels/live_model_kernels.cc):

* Every request runs ONE `TfExtLivePin`, which takes the model's current version (an immutable set of every table
  shard and dense value); each lookup (`TfExtLiveFind`), variable read (`TfExtLiveDense`) and `served_version()`
  (`TfExtLiveVersion`) of the request reads that pin, so a request never sees two versions. The first pin builds
  version 0 from the restored frozen tables and variables, at the checkpoint's global step.
* The signature `tf_ext_apply_update` (input `update_dir`: a serving update's directory, see `update_format`;
  outputs `version`, `applied`) applies one update: `TfExtLiveCheckUpdate` refuses another model or layout (naming
  both) and a gap, and says whether the update is stale; then the update's tensors are read and `TfExtLiveApply`
  publishes the new version with one pointer swap. `tf_ext_served_version` (no input, output `version`) tells the
  version served. Any runtime that loads the SavedModel with tensorflow_ext's ops can apply updates.

How the export is made (the `live_model_*` patches of the Builder's `add_meta_graph_and_variables` and
`add_meta_graph`, which Estimator.export_saved_model calls too), while the scope is active in the exporting thread:

1. Before TF's export: the closure of the signatures' outputs (inputs and control inputs, transitively) is walked
   for its reads of served state: `TfExtFrozenTableFind` of a frozen table handle (a table slot per shard, named by
   the shard), `ReadVariableOp` of a `VarHandleOp` or any read of a `VariableV2`'s ref output (a dense slot per
   variable), the global step and `served_version()` (the version). Reads the live model cannot redirect are
   refused by name (a dynamic embedding's plain table, a variable read through ResourceGather, a lookup inside a
   tf.cond or while loop).
   The live ops are added to the graph (name scope `tf_ext_live`, new reads for the pin's inputs) with the two
   signatures; the existing ops and their edges are left as they are (the export's session already ran them).
2. TF's export writes the variables and appends the MetaGraphDef.
3. After it: in that MetaGraphDef only, every node of the closure (and every signature output) that read a find,
   a variable or the version now reads the live op instead (GraphDef input strings; output indexes kept: a find's
   rows and found flags are the live find's outputs 0 and 1).

The model's layout (`update_format` layout lines: `table <shard> <dim>` per table slot, `dense <variable> <dtype>
<shape>` per dense slot) is the handle's attr; an update applies only when its layout holds every one of those lines.
So every variable the signatures read (the global step aside) must be in the trainer's updates: a
`ServingUpdateWriter` writes every global variable of the training graph but the global step, tf_ext's own and
slots (batch normalization's moving statistics included), and others named in its `dense_variables`.
"""

import os
import threading
import uuid

import tensorflow as tf

from tensorflow_ext import tf_compat
from tensorflow_ext.embedding import export_mode
from tensorflow_ext.embedding import state as state_lib
from tensorflow_ext.serving import update_format
from tensorflow_ext.tf_compat import internals
from tensorflow_ext.utils import loader

__all__ = [
    "APPLY_SIGNATURE",
    "APPLY_UPDATE_DIR",
    "SERVED_VERSION_COLLECTION",
    "VERSION_SIGNATURE",
    "apply_update",
    "served_version",
]

APPLY_SIGNATURE = "tf_ext_apply_update"
APPLY_UPDATE_DIR = "update_dir"  # the apply signature's input: the update's directory (string scalar)
VERSION_SIGNATURE = "tf_ext_served_version"
# The graph collection of the `served_version()` tensors (the export redirects their readers to the live version).
SERVED_VERSION_COLLECTION = "tf_ext_served_version"
# The graph collection of the last live export's apply tensors [update_dir, version, applied]: `apply_update`
# finds them in a graph the TF1 loader imported without its MetaGraphDef at hand.
_APPLY_COLLECTION = "tf_ext_live_apply"
_SCOPE = "tf_ext_live"

# Reads of a resource variable that return no value (nothing to redirect).
_VARIABLE_METADATA_OPS = ("VariableShape", "VarIsInitializedOp")
_REF_VARIABLE_OPS = ("VariableV2", "Variable")

_state = threading.local()


def served_version(name="served_version"):
    """The version the request is served at: an int64 scalar tensor, usable in a model_fn or a signature.

    In a live export (`freeze_for_serving(live_model=...)`) it is the live model's version that the request's
    lookups and variable reads see: the trainer's global step of the last applied update, or the checkpoint's
    global step before any. Elsewhere (training, a plain export) it is the graph's global step, or 0 in a graph
    without one.

    Returns:
      int64 scalar Tensor.
    """
    graph = tf.compat.v1.get_default_graph()
    step = tf.compat.v1.train.get_global_step(graph)
    with tf.control_dependencies(None):
        value = tf.constant(0, tf.int64) if step is None else tf.cast(step.read_value(), tf.int64)
    version = tf.identity(value, name=name)
    graph.add_to_collection(SERVED_VERSION_COLLECTION, version)
    return version


def apply_update(sess, update_dir, meta_graph_def=None):
    """Applies the serving update in `update_dir` to the live model that `sess` serves (a loaded live export).

    Runs the export's `tf_ext_apply_update` signature: a stale update (already reflected in the served version)
    changes nothing; a newer one is applied whole or not at all.

    Args:
      sess: the Session the SavedModel was loaded into (TF1 loader).
      update_dir: an update's directory (`update_format.update_dir_name`), holding its tensor bundle.
      meta_graph_def: the MetaGraphDef the loader returned; None: the graph's own record of the last live export.

    Returns:
      (version, applied): the version served after the call (int), and whether the update changed it (bool).

    Raises:
      ValueError: not an updatable SavedModel (no apply signature).
      tf.errors.InvalidArgumentError: an update of another model or layout (the message names both).
      tf.errors.FailedPreconditionError: a gap (the update needs a version the model does not serve).
      tf.errors.NotFoundError, tf.errors.DataLossError: a missing, truncated or corrupt update.
    """
    if meta_graph_def is not None:
        signature = meta_graph_def.signature_def.get(APPLY_SIGNATURE)
        if signature is None:
            raise ValueError(
                "the MetaGraphDef has no signature %r (signatures: %s): it is not an updatable SavedModel; export it "
                "inside tf_ext.serving.freeze_for_serving(live_model=...)"
                % (APPLY_SIGNATURE, sorted(meta_graph_def.signature_def))
            )
        feed = signature.inputs[APPLY_UPDATE_DIR].name
        fetches = [signature.outputs["version"].name, signature.outputs["applied"].name]
    else:
        tensors = sess.graph.get_collection(_APPLY_COLLECTION)
        if len(tensors) != 3:
            raise ValueError(
                "the graph of this Session holds no live export (collection %r: %d tensors): load an updatable "
                "SavedModel (exported inside tf_ext.serving.freeze_for_serving(live_model=...)), or pass its "
                "meta_graph_def" % (_APPLY_COLLECTION, len(tensors))
            )
        feed, fetches = tensors[0], tensors[1:]
    version, applied = sess.run(fetches, {feed: os.fspath(update_dir)})
    return int(version), bool(applied)


# ---------------------------------------------------------------------------------------------- the export


class _Reads(object):
    """The served state that the closure of a graph's signatures reads, by slot.

    Attributes:
      tables: [(shard name, TfExtFrozenTableHandle op, dim)], table slot order (sorted by shard name).
      finds: [(TfExtFrozenTableFind op, table slot)].
      variables: [(variable name, variable op, tf.DType, shape list)], dense slot order (sorted by name).
      dense_reads: {tensor name: dense slot}: the tensors whose readers in the closure read the slot instead (a
        ReadVariableOp's value, a ref variable's output).
      version_reads: tensor names whose readers read the version (`served_version()`, the global step's reads).
      global_step: the global step variable's op, or None.
    """

    def __init__(self):
        self.tables = []
        self.finds = []
        self.variables = []
        self.dense_reads = {}
        self.version_reads = []
        self.global_step = None

    def layout(self):
        """The live model's layout text (update_format's lines)."""
        entries = [update_format.table_entry(name, dim) for name, _, dim in self.tables]
        entries += [update_format.dense_entry(name, dtype.name, shape) for name, _, dtype, shape in self.variables]
        return update_format.layout(entries)


def _signature_tensors(signature_def_map, graph, which):
    """The tensors of the signatures' `which` ("inputs" or "outputs"), sparse and composite ones as components."""
    tensors = []
    for signature in signature_def_map.values():
        for info in getattr(signature, which).values():
            value = tf.compat.v1.saved_model.get_tensor_from_tensor_info(info, graph)
            tensors.extend(tf.nest.flatten(value, expand_composites=True))
    return tensors


def _closure(tensors):
    """The ops that computing `tensors` runs: their ops and, transitively, the ops of their inputs and control
    inputs."""
    seen = set()
    stack = [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def _input_is_ref(op, index):
    """True when input `index` of `op` is a ref argument of its op definition (the op writes or aliases it)."""
    start = 0
    for arg in op.op_def.input_arg:
        if arg.number_attr:
            count = op.get_attr(arg.number_attr)
        elif arg.type_list_attr:
            count = len(op.get_attr(arg.type_list_attr))
        else:
            count = 1
        if index < start + count:
            return arg.is_ref
        start += count
    return False


def _refuse(model_name, op, why):
    raise ValueError(
        "live model %r: %s (op %r, type %s). A live export (tf_ext.serving.freeze_for_serving(live_model=...)) "
        "serves frozen tables read by embedding lookups and variables read whole, outside tf.cond and while loops"
        % (model_name, why, op.name, op.type)
    )


def _table_name(handle_op):
    """A table's name: its handle's shared name (a shard's `<embedding>/part_<i>`), else the op's."""
    return handle_op.get_attr("shared_name").decode() or handle_op.name


def _variable_name(var_op):
    return var_op.name  # a variable's name is its op's, without ":0" (update_format.dense_name)


def _find_reads(graph, closure, model_name):
    """The `_Reads` of the ops in `closure`.

    Raises:
      ValueError: a read the live model cannot redirect, naming the op and the table or variable.
    """
    reads = _Reads()
    step = tf.compat.v1.train.get_global_step(graph)
    reads.global_step = None if step is None else step.op
    step_is_int64 = step is not None and step.dtype.base_dtype == tf.int64
    # The handles of dynamic embeddings' plain (trainable) shards: a live model updates frozen tables only. (Other
    # tables, a vocabulary's tf_ext.HashTable say, are no part of a serving update and are served as exported.)
    plain_shards = {
        shard.handle.op: shard.name
        for emb in state_lib.get_dynamic_embeddings(graph)
        for shard in emb.shards
        if shard.handle.op.type != "TfExtFrozenTableHandle"
    }
    tables, variables = {}, {}  # op -> what the slot needs
    dense_tensors = {}  # tensor name -> variable op
    for op in sorted(closure, key=lambda o: o.name):
        if op.type in ("TfExtFrozenTableFind", "ReadVariableOp") and internals.control_flow_context(op) is not None:
            what = "a lookup of a frozen table" if op.type == "TfExtFrozenTableFind" else "a variable read"
            _refuse(model_name, op, "%s inside a tf.cond or while loop" % what)
        for index, tensor in enumerate(op.inputs):
            source = tensor.op
            if source.type == "TfExtFrozenTableHandle":
                if op.type != "TfExtFrozenTableFind" or index != 0:
                    _refuse(model_name, op, "it reads the frozen table %r otherwise than by a lookup" % source.name)
                tables[source] = (_table_name(source), op.get_attr("dim"))
                reads.finds.append((op, source))
            elif source in plain_shards:
                _refuse(
                    model_name,
                    op,
                    "it reads the plain table %r of a dynamic embedding created outside freeze_for_serving, which a "
                    "live model does not update" % plain_shards[source],
                )
            elif source.type == "VarHandleOp":
                if op.type in _VARIABLE_METADATA_OPS:
                    continue
                if op.type != "ReadVariableOp":
                    _refuse(model_name, op, "it reads the variable %r otherwise than whole" % source.name)
                if source is reads.global_step:
                    if step_is_int64:
                        reads.version_reads.append(op.outputs[0].name)
                    continue
                variables[source] = None
                dense_tensors[op.outputs[0].name] = source
            elif source.type in _REF_VARIABLE_OPS:
                if _input_is_ref(op, index):
                    _refuse(model_name, op, "it writes or aliases the variable %r" % source.name)
                if source is reads.global_step:
                    if step_is_int64:
                        reads.version_reads.append(tensor.name)
                    continue
                variables[source] = None
                dense_tensors[tensor.name] = source
            elif op.type == "TfExtFrozenTableFind" and index == 0:
                _refuse(model_name, op, "a lookup of a frozen table whose handle comes through %r" % source.name)
    for version in graph.get_collection(SERVED_VERSION_COLLECTION):
        if version.op in closure:
            reads.version_reads.append(version.name)

    reads.tables = sorted(((name, op, dim) for op, (name, dim) in tables.items()), key=lambda t: t[0])
    names = [name for name, _, _ in reads.tables]
    if len(set(names)) != len(names):
        duplicate = sorted(n for n in names if names.count(n) > 1)[0]
        raise ValueError(
            "live model %r: two frozen tables are named %r: a table slot is named by its shard"
            % (model_name, duplicate)
        )
    slot_of_table = {op: slot for slot, (_, op, _) in enumerate(reads.tables)}
    reads.finds = [(find, slot_of_table[handle]) for find, handle in reads.finds]
    for var in variables:
        shape = tf.TensorShape(var.get_attr("shape"))
        if not shape.is_fully_defined():
            raise ValueError(
                "live model %r: the variable %r has shape %s: a live model's variables need a static shape (their "
                "layout line)" % (model_name, _variable_name(var), shape)
            )
        reads.variables.append(
            (_variable_name(var), var, tf.as_dtype(var.get_attr("dtype")).base_dtype, shape.as_list())
        )
    reads.variables.sort(key=lambda v: v[0])
    slot_of_variable = {op: slot for slot, (_, op, _, _) in enumerate(reads.variables)}
    reads.dense_reads = {name: slot_of_variable[var] for name, var in dense_tensors.items()}
    return reads


def _fresh_read(var_op, dtype):
    """A new read of the variable of `var_op` (for the pin: not a node the export redirects)."""
    if var_op.type == "VarHandleOp":
        return tf.raw_ops.ReadVariableOp(resource=var_op.outputs[0], dtype=dtype)
    return tf.identity(var_op.outputs[0])  # a ref variable: its value


class _LiveOps(object):
    """The live ops added to the exporting graph: {tensor name: live tensor} redirections and the signatures."""

    def __init__(self, redirect, signatures, apply_tensors):
        self.redirect = redirect
        self.signatures = signatures
        self.apply_tensors = apply_tensors


def _build_live_ops(graph, reads, model_name):
    """Adds the live model's ops for `reads` to `graph` (nothing existing changes); returns the `_LiveOps`."""
    ops = loader.load_ops()
    layout = reads.layout()
    tables, dense_variables = reads.tables, reads.variables
    dtypes = [dtype for _, _, dtype, _ in dense_variables]
    redirect = {}
    with graph.as_default(), tf.control_dependencies(None), tf.compat.v1.name_scope(None):
        with tf.compat.v1.name_scope(_SCOPE):
            # One live model per export: a shared name that no other export uses (in TF2, every signature function
            # finds the model by it; a TF1 Session's resources are its own anyway).
            model = ops.tf_ext_live_model_handle(
                model_name=model_name, layout=layout, shared_name="%s/%s/%s" % (_SCOPE, model_name, uuid.uuid4().hex)
            )
            handles = [op.outputs[0] for _, op, _ in tables]
            dense_in = [_fresh_read(var, dtype) for (_, var, dtype, _) in dense_variables]
            step = []
            if reads.global_step is not None:
                step_var = reads.global_step
                step_dtype = tf.as_dtype(step_var.get_attr("dtype")).base_dtype
                step = [tf.cast(_fresh_read(step_var, step_dtype), tf.int64)]
            state = dict(tables=handles, dense=dense_in, global_step=step)
            pin = ops.tf_ext_live_pin(model, name="pin", **state)
            for i, (find, slot) in enumerate(reads.finds):
                _, _, dim = tables[slot]
                live = ops.tf_ext_live_find(pin, find.inputs[1], find.inputs[2], slot=slot, dim=dim, name="find_%d" % i)
                redirect[find.outputs[0].name] = live[0]
                redirect[find.outputs[1].name] = live[1]
            dense = [
                ops.tf_ext_live_dense(pin, slot=slot, dtype=dtype, shape=shape, name="dense_%d" % slot)
                for slot, (_, _, dtype, shape) in enumerate(dense_variables)
            ]
            for name, slot in reads.dense_reads.items():
                redirect[name] = dense[slot]
            version = ops.tf_ext_live_version(pin, name="version")
            for name in reads.version_reads:
                redirect[name] = version

            # The apply subgraph: the update's metadata first (checked), its tensors only after the check passed.
            update_dir = tf.compat.v1.placeholder(tf.string, [], name=APPLY_UPDATE_DIR)
            prefix = tf.strings.join([update_dir, update_format.BUNDLE_NAME], separator="/")
            meta_dtypes = [tf.string, tf.string, tf.string, tf.int64, tf.int64]
            meta = tf.raw_ops.RestoreV2(
                prefix=prefix,
                tensor_names=list(update_format.META_NAMES),
                shape_and_slices=[""] * len(meta_dtypes),
                dtypes=meta_dtypes,
                name="restore_meta",
            )
            meta_args = dict(zip(("model_name", "layout", "kind", "from_step", "to_step"), meta))
            check = ops.tf_ext_live_check_update(model, name="check", **state, **meta_args)
            names, slot_dtypes = [], []
            for shard, _, _ in tables:
                names += [update_format.keys_name(shard), update_format.values_name(shard)]
                names.append(update_format.removed_name(shard))
                slot_dtypes += [tf.int64, tf.float32, tf.int64]
            names += [update_format.dense_name(name) for name, _, _, _ in dense_variables]
            slot_dtypes += dtypes
            with tf.control_dependencies([check]):
                restored = (
                    tf.raw_ops.RestoreV2(
                        prefix=prefix,
                        tensor_names=names,
                        shape_and_slices=[""] * len(names),
                        dtypes=slot_dtypes,
                        name="restore_update",
                    )
                    if names
                    else []
                )
            n = len(tables)
            new_version, applied = ops.tf_ext_live_apply(
                model,
                tables=handles,
                dense_in=dense_in,
                global_step=step,
                keys=list(restored[0 : 3 * n : 3]),
                values=list(restored[1 : 3 * n : 3]),
                removed=list(restored[2 : 3 * n : 3]),
                dense=list(restored[3 * n :]),
                name="apply",
                **meta_args,
            )
    predict = tf.compat.v1.saved_model.PREDICT_METHOD_NAME
    info = tf.compat.v1.saved_model.build_tensor_info
    signatures = {
        APPLY_SIGNATURE: tf.compat.v1.saved_model.build_signature_def(
            {APPLY_UPDATE_DIR: info(update_dir)}, {"version": info(new_version), "applied": info(applied)}, predict
        ),
        VERSION_SIGNATURE: tf.compat.v1.saved_model.build_signature_def({}, {"version": info(version)}, predict),
    }
    return _LiveOps({name: t.name for name, t in redirect.items()}, signatures, [update_dir, new_version, applied])


def _input_string(tensor_name):
    """A GraphDef input string of the tensor `op:index` ("op" for output 0)."""
    op, index = tensor_name.rsplit(":", 1)
    return op if index == "0" else tensor_name


def _redirect_meta_graph(meta_graph_def, closure_names, redirect, signature_keys):
    """Makes the closure's nodes, and the outputs of the signatures `signature_keys`, of `meta_graph_def` read the
    live tensors of `redirect` ({tensor name: live tensor name}) instead. Returns the number of inputs changed."""
    changed = 0
    for node in meta_graph_def.graph_def.node:
        if node.name not in closure_names:
            continue
        for i, name in enumerate(node.input):
            if name.startswith("^"):
                continue
            live = redirect.get(name if ":" in name else name + ":0")
            if live is not None:
                node.input[i] = _input_string(live)
                changed += 1
    for key in signature_keys:
        for info in meta_graph_def.signature_def[key].outputs.values():
            if info.name in redirect:
                info.name = redirect[info.name]
            for field in ("values_tensor_name", "indices_tensor_name", "dense_shape_tensor_name"):
                if getattr(info.coo_sparse, field) in redirect:
                    setattr(info.coo_sparse, field, redirect[getattr(info.coo_sparse, field)])
            for component in info.composite_tensor.components:
                if component.name in redirect:
                    component.name = redirect[component.name]
    return changed


def _export_live(original, builder, args, kwargs, map_index):
    """Runs TF's add_meta_graph* (`original`) as a live export of `export_mode.live_model_name()`."""
    model_name = export_mode.live_model_name()
    args = list(args)
    if len(args) > map_index:
        signature_def_map = args[map_index]
    else:
        signature_def_map = kwargs.get("signature_def_map")
    signature_def_map = dict(signature_def_map or {})
    for key in (APPLY_SIGNATURE, VERSION_SIGNATURE):
        if key in signature_def_map:
            raise ValueError(
                "live model %r: the export has its own signature %r: a live export adds it" % (model_name, key)
            )
    graph = tf.compat.v1.get_default_graph()
    outputs = _signature_tensors(signature_def_map, graph, "outputs")
    closure = _closure(outputs)
    reads = _find_reads(graph, closure, model_name)
    if reads.global_step is None:
        tf.compat.v1.logging.warning(
            "live model %r: the exported graph has no global step, so the export serves version 0 and applies no "
            "delta update until a full one (create the global step in the graph the Builder exports)" % model_name
        )
    live = _build_live_ops(graph, reads, model_name)
    graph.clear_collection(_APPLY_COLLECTION)
    for tensor in live.apply_tensors:
        graph.add_to_collection(_APPLY_COLLECTION, tensor)
    user_keys = sorted(signature_def_map)
    signature_def_map.update(live.signatures)
    if len(args) > map_index:
        args[map_index] = signature_def_map
    else:
        kwargs["signature_def_map"] = signature_def_map
    meta_graphs = internals.saved_model_builder_meta_graphs(builder)
    before = len(meta_graphs)
    result = original(builder, *args, **kwargs)
    if len(meta_graphs) != before + 1:
        raise tf_compat.PatchError(
            "tensorflow_ext live export: TensorFlow's %s added %d meta graphs, expected one"
            % (getattr(original, "__name__", "add_meta_graph"), len(meta_graphs) - before)
        )
    _redirect_meta_graph(meta_graphs[-1], {op.name for op in closure}, live.redirect, user_keys)
    return result


def _make_live_export(map_index):
    def make(original):
        def add_meta_graph(self, *args, **kwargs):
            if export_mode.live_model_name() is None or getattr(_state, "exporting", False):
                return original(self, *args, **kwargs)
            _state.exporting = True
            try:
                return _export_live(original, self, args, kwargs, map_index)
            finally:
                _state.exporting = False

        return add_meta_graph

    return make


_WHY = (
    "A SavedModel exported inside freeze_for_serving(live_model=...) is updatable: its signatures read the frozen "
    "tables and variables through one live model whose versions are swapped whole, and it gets the signatures "
    "tf_ext_apply_update and tf_ext_served_version. The replacement (only while that scope is active in the "
    "exporting thread; else TF's method unchanged) adds the live ops and the two signatures to the graph before "
    "TF's export, then redirects the signatures' nodes in the MetaGraphDef TF appended to read the live ops; the "
    "Python graph's existing ops keep their edges. TF's Builder has no hook to rewrite the graph it exports."
)
_TEST = "tensorflow_ext/serving/tests/test_live_export.py::test_live_exports_serve_the_frozen_predictions"

for _cls in ("_SavedModelBuilder", "SavedModelBuilder"):
    for _attr, _map_index in (("add_meta_graph_and_variables", 2), ("add_meta_graph", 1)):
        # (the v1 SavedModelBuilder overrides both methods without calling the base class's)
        tf_compat.register(
            "live_model_%s%s" % (_attr, "" if _cls == "_SavedModelBuilder" else "_v1"),
            "tensorflow.python.saved_model.builder_impl",
            _cls,
            _attr,
            why=_WHY,
            test=_TEST,
        )(_make_live_export(_map_index))

tf_compat.install(
    "live_model_add_meta_graph_and_variables",
    "live_model_add_meta_graph",
    "live_model_add_meta_graph_and_variables_v1",
    "live_model_add_meta_graph_v1",
)
