"""Every change tensorflow_ext makes to TensorFlow's own Python objects, in one place.

TensorFlow 2.15's TF1 API has no hook for a few things dynamic embeddings need (an optimizer's slots that live in a
table row, a moving average that cannot shadow a table). Where TF offers a public hook, tensorflow_ext uses it
(`tf.register_tensor_conversion_function`, gradient registration, wrapping); what is left is listed here. Each
entry says what it replaces, why, the TensorFlow versions it was written and tested against, and the test that
checks it (tests/test_tf_compat.py checks every entry).

Patches are installed by `install(name)` when the subsystem that needs them is imported. Installing checks the
guard first: the TensorFlow version must be in the tested range and the replaced attribute must exist and still
be TF's original; otherwise it raises `PatchError` naming the patch, instead of silently changing behaviour of a
TensorFlow it was not written for.
"""

import importlib
import sys
import weakref

import tensorflow as tf
import threading

from tensorflow_ext import errors
from tensorflow_ext import version as _version

__all__ = [
    "CallerProbe",
    "Patch",
    "PatchError",
    "install",
    "is_installed",
    "mark_id_feed",
    "ops_held_by_open_sessions",
    "original",
    "patches",
    "probe",
    "probes",
    "register",
    "register_probe",
]


class PatchError(errors.TfExtError, RuntimeError):
    """A patch cannot be installed on this TensorFlow (its target moved or changed)."""


class Patch(object):
    """One replaced attribute of a TensorFlow module or class.

    Attributes:
      name: short unique name (used by `install`, `is_installed`, tests).
      module: dotted module path of the owner (``tensorflow.python.training.optimizer``).
      owner: attribute path of the owner inside the module ('' for the module itself, else a class name).
      attr: the replaced attribute.
      why: what the replacement does and why TF offers no hook for it.
      tf_versions: (min inclusive, max exclusive) TF versions it was written and tested against.
      test: the test that checks the patched behaviour.
      make: callable(original) -> replacement.
    """

    def __init__(self, name, module, owner, attr, why, test, make, tf_versions=None):
        self.name = name
        self.module = module
        self.owner = owner
        self.attr = attr
        self.why = why
        self.test = test
        self.make = make
        self.tf_versions = tf_versions or (_version.MIN_TF_VERSION, _version.MAX_TF_VERSION_EXCLUSIVE)
        self.original = None
        self.installed = False

    @property
    def target(self):
        """The dotted path of the replaced attribute."""
        return ".".join(p for p in (self.module, self.owner, self.attr) if p)

    def _owner_object(self):
        obj = importlib.import_module(self.module)
        for part in filter(None, self.owner.split(".")):
            obj = getattr(obj, part)
        return obj

    def check_guard(self):
        """Raises PatchError unless TF's version is in range and the target exists."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from tensorflow_ext.utils import loader  # pylint: disable=import-outside-toplevel

        lo, hi = (loader._release(v) for v in self.tf_versions)  # pylint: disable=protected-access
        if not lo <= loader._release(tf.__version__) < hi:  # pylint: disable=protected-access
            raise PatchError(
                "tensorflow_ext patch %r (%s) was written for TensorFlow [%s, %s), not %s"
                % (self.name, self.target, self.tf_versions[0], self.tf_versions[1], tf.__version__)
            )
        try:
            owner = self._owner_object()
        except (ImportError, AttributeError) as e:
            raise PatchError(
                "tensorflow_ext patch %r: %s is missing in TensorFlow %s (%s)"
                % (self.name, self.target, tf.__version__, e)
            ) from e
        if not hasattr(owner, self.attr):
            raise PatchError(
                "tensorflow_ext patch %r: %s is missing in TensorFlow %s" % (self.name, self.target, tf.__version__)
            )
        return owner

    def displaced(self):
        """True if the patch was installed but the attribute now holds none of its replacements (another library
        replaced it since)."""
        if not self.installed:
            return False
        current = getattr(self._owner_object(), self.attr, None)
        return getattr(current, _TAG, None) != self.name

    def install(self):
        owner = self.check_guard()
        self.original = getattr(owner, self.attr)
        replacement = self.make(self.original)
        try:
            setattr(replacement, _TAG, self.name)  # recognised by displaced(), whichever of ours is in place
        except AttributeError:
            pass
        if getattr(replacement, "__doc__", None) is None:
            try:
                replacement.__doc__ = getattr(self.original, "__doc__", None)
            except AttributeError:
                pass
        setattr(owner, self.attr, replacement)
        self.installed = True

    def __repr__(self):
        return "<tf_compat.Patch %s -> %s (TF %s..%s)>" % (
            self.name,
            self.target,
            self.tf_versions[0],
            self.tf_versions[1],
        )


_lock = threading.RLock()
_PATCHES = {}
_TAG = "_tf_ext_patch"  # attribute naming the patch on each replacement function


def register(name, module, owner, attr, why, test, tf_versions=None):
    """Decorator: registers `make(original) -> replacement` as the patch `name` (not installed yet).

    Args:
      name: unique patch name.
      module, owner, attr: the replaced attribute (see `Patch`).
      why: one paragraph: what and why.
      test: "path::test_name" of the test that checks it.
      tf_versions: optional (min, max exclusive) TF versions; default: the supported range.

    Returns:
      The decorator; it returns `make` unchanged.
    """

    def deco(make):
        with _lock:
            if name in _PATCHES:
                raise ValueError("tf_compat patch %r registered twice" % name)
            _PATCHES[name] = Patch(name, module, owner, attr, why, test, make, tf_versions)
        return make

    return deco


def install(*names):
    """Installs the named patches (idempotent; each checks its guard first).

    Raises:
      KeyError: an unknown patch name.
      PatchError: a guard failed.
    """
    with _lock:
        for name in names:
            patch = _PATCHES[name]
            if not patch.installed:
                patch.install()


def reinstall_if_displaced(name):
    """Installs patch `name` again, on top of what is there now, if another library replaced it since.

    For a patch whose replacement may safely wrap another replacement of the same attribute (handling its own
    objects and passing everything else on): TFRA replaces optimizer._get_processor when it is imported, without
    calling ours, which would leave dynamic embeddings untrainable. Logs a warning naming the other function's
    module when it does.

    Returns:
      True if the patch was installed again.
    """
    with _lock:
        patch = _PATCHES[name]
        if not patch.displaced():
            return False
        current = getattr(patch._owner_object(), patch.attr)  # pylint: disable=protected-access
        tf.compat.v1.logging.warning(
            "tensorflow_ext: %s was replaced after tensorflow_ext patched it (by %s); patching it again on top of "
            "that replacement" % (patch.target, getattr(current, "__module__", "?"))
        )
        patch.install()
        return True


def patches():
    """The registered patches (a new list, in registration order)."""
    with _lock:
        return list(_PATCHES.values())


def is_installed(name):
    """True if the patch `name` is installed."""
    with _lock:
        return name in _PATCHES and _PATCHES[name].installed


def original(name):
    """The attribute patch `name` replaced (None before install): TF's, or after `reinstall_if_displaced` the
    other library's replacement that it wraps."""
    with _lock:
        return _PATCHES[name].original


# ---------------------------------------------------------------------------------------------------------------
# Caller probes: where TF gives no hook to tell *who* asks (the Saver building a restore, a SavedModel export), the
# asking TF functions are recognised on the Python stack. Each probe names the TF functions it looks for; its guard
# checks that they still exist in the tested TF versions, so a TF that renames them fails loudly, not silently.


class CallerProbe(object):
    """Recognises calls made (directly or not) from some functions of one TensorFlow module.

    Attributes:
      name: short unique name.
      module: dotted module path of the functions (``tensorflow.python.training.saver``).
      functions: qualified names inside the module (``BaseSaverBuilder.restore_op``).
      why: what the caller's identity decides and why TF offers no hook for it.
      test: the test that checks it.
      max_depth: frames searched above the probing function (None: the whole stack).
    """

    def __init__(self, name, module, functions, why, test, max_depth=None):
        self.name = name
        self.module = module
        self.functions = tuple(functions)
        self.why = why
        self.test = test
        self.max_depth = max_depth
        self._codes = None

    def check_guard(self):
        """Resolves the functions (once); raises PatchError if one is missing or TF's version is out of range."""
        if self._codes is not None:
            return
        lo, hi = (_release(v) for v in (_version.MIN_TF_VERSION, _version.MAX_TF_VERSION_EXCLUSIVE))
        if not lo <= _release(tf.__version__) < hi:
            raise PatchError(
                "tensorflow_ext caller probe %r was written for TensorFlow [%s, %s), not %s"
                % (self.name, _version.MIN_TF_VERSION, _version.MAX_TF_VERSION_EXCLUSIVE, tf.__version__)
            )
        codes = set()
        module = importlib.import_module(self.module)
        for qualname in self.functions:
            obj = module
            try:
                for part in qualname.split("."):
                    obj = getattr(obj, part)
            except AttributeError as e:
                raise PatchError(
                    "tensorflow_ext caller probe %r: %s.%s is missing in TensorFlow %s"
                    % (self.name, self.module, qualname, tf.__version__)
                ) from e
            codes.add(getattr(obj, "__code__", None) or obj.__func__.__code__)
        self._codes = frozenset(codes)

    def active(self):
        """True when the current call comes from one of the functions (within max_depth frames of the caller)."""
        self.check_guard()
        frame = sys._getframe(2)  # pylint: disable=protected-access
        depth = 0
        while frame is not None and (self.max_depth is None or depth < self.max_depth):
            if frame.f_code in self._codes:
                return True
            frame = frame.f_back
            depth += 1
        return False


_PROBES = {}


def register_probe(name, module, functions, why, test, max_depth=None):
    """Registers the caller probe `name` (see `CallerProbe`); returns it."""
    with _lock:
        if name in _PROBES:
            raise ValueError("tf_compat caller probe %r registered twice" % name)
        probe = _PROBES[name] = CallerProbe(name, module, functions, why, test, max_depth)
    return probe


def probe(name):
    """The registered caller probe `name`."""
    return _PROBES[name]


def probes():
    """The registered caller probes (a new list)."""
    with _lock:
        return list(_PROBES.values())


def _release(version):
    from tensorflow_ext.utils import loader  # pylint: disable=import-outside-toplevel

    return loader._release(version)  # pylint: disable=protected-access


register_probe(
    "saver_restore_build",
    "tensorflow.python.training.saver",
    ("BaseSaverBuilder.restore_op", "BaseSaverBuilder._AddRestoreOps", "BulkSaverBuilder.bulk_restore"),
    why="A dynamic-embedding shard saves its row-layout record, but checkpoints written before the record existed "
    "lack it, and the Saver restores every spec in one RestoreV2 that fails on a missing tensor. While the Saver "
    "builds its restore, the shard's saveable leaves the record out of its specs and reads it itself, if present.",
    test="tensorflow_ext/embedding/tests/test_de_checkpoint_layout.py::"
    "test_old_checkpoint_without_layout_record_restores_with_a_warning",
    max_depth=4,
)

register_probe(
    "saved_model_export",
    "tensorflow.python.saved_model.builder_impl",
    (
        "_SavedModelBuilder.add_meta_graph_and_variables",
        "_SavedModelBuilder.add_meta_graph",
        "SavedModelBuilder.add_meta_graph_and_variables",
        "SavedModelBuilder.add_meta_graph",
    ),
    why="Savers built while a SavedModel is exported save lean inference tables (keys and embedding values only); "
    "TF's export builds an ordinary Saver with no hook to tell it apart from a training Saver.",
    test="tensorflow_ext/serving/tests/test_serving_export.py::test_saved_model_holds_embedding_columns_only",
)

register_probe(
    "estimator_export",
    "tensorflow_estimator.python.estimator.estimator",
    ("Estimator._add_meta_graph_for_mode",),
    why="As saved_model_export, for Estimator.export_saved_model (it builds its own Saver per mode).",
    test="tensorflow_ext/serving/tests/test_serving_export.py::test_saved_model_holds_embedding_columns_only",
)


# ---------------------------------------------------------------------------------------------------------------
# The patches. Each replacement handles tf_ext objects and hands everything else to TF's original unchanged.


def _is_shard(value):
    from tensorflow_ext.embedding import variable  # pylint: disable=import-outside-toplevel

    return isinstance(value, variable.DynamicEmbeddingShard)


@register(
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
                from tensorflow_ext.embedding import variable  # pylint: disable=import-outside-toplevel

                return variable.DynamicEmbeddingSlot(var, self, name)
            return None
        return original(self, var, name)

    return get_slot


@register(
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
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from tensorflow_ext.embedding import variable  # pylint: disable=import-outside-toplevel

        for shard in tf.compat.v1.get_default_graph().get_collection(variable.GraphKeys.DYNAMIC_EMBEDDINGS):
            group = shard.slot_group(self) if _is_shard(shard) else None
            if group is not None:
                names.update(group.slot_names)
        return sorted(names)

    return get_slot_names


@register(
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


@register(
    "replica_device_setter_ps_ops",
    "tensorflow.python.training.device_setter",
    "",
    "STANDARD_PS_OPS",
    why="replica_device_setter puts an op on a parameter server only if its type is in STANDARD_PS_OPS (read "
    "when the setter is created); TF lists its own variable and table ops there and offers no registration. "
    "Adding TfExtTableHandle places dynamic embedding tables on ps tasks like variables. Installed at "
    "`import tensorflow_ext`, so setters created afterwards know it.",
    test="tests/test_tf_compat.py::test_replica_device_setter_places_tables_on_ps",
)
def _make_ps_ops(original):
    return tuple(original) + (("TfExtTableHandle",) if "TfExtTableHandle" not in original else ())


def _warm_start_lib():
    from tensorflow_ext.embedding.checkpoint import warm_start  # pylint: disable=import-outside-toplevel

    return warm_start


@register(
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
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        ws = _warm_start_lib()
        graph = tf.compat.v1.get_default_graph()
        shards = ws.matching_shards(vars_to_warm_start, graph)
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
            grouped[shard.name] = [ws.ShardTarget(shard)]
        return grouped

    return _get_grouped_variables


@register(
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
        ws = _warm_start_lib()
        target = var[0] if isinstance(var, list) and len(var) == 1 else var
        if isinstance(target, ws.ShardTarget):
            return (prev_tensor_name or target.name), target
        return original(var, prev_tensor_name)

    return _get_var_info


@register(
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
        ws = _warm_start_lib()
        rest = {}
        for prev_name, target in dict(assignment_map).items():
            if isinstance(target, ws.ShardTarget):
                ws.warm_start_shard(ckpt_dir_or_file, prev_name, target.shard)
            else:
                rest[prev_name] = target
        if rest or not assignment_map:
            return original(ckpt_dir_or_file, rest)
        return None

    return init_from_checkpoint


# ---- which ops a Session already holds ------------------------------------------------------------------------

_held = weakref.WeakKeyDictionary()  # graph -> WeakKeyDictionary(session -> last op id the session holds)


def ops_held_by_open_sessions(graph):
    """The largest op id (`op._id`) of `graph` that an open (not closed) Session holds, 0 if none holds it.

    A Session copies the graph's new ops when it runs; TensorFlow then ignores changes to the attrs or control
    inputs of the ops it holds (with only a log warning). Recorded by the `session_extend_graph` patch.
    """
    with _lock:
        sessions = _held.get(graph)
        if not sessions:
            return 0
        return max([last for sess, last in list(sessions.items()) if not getattr(sess, "_closed", False)] or [0])


@register(
    "session_extend_graph",
    "tensorflow.python.client.session",
    "BaseSession",
    "_extend_graph",
    why="A lookup of a dynamic embedding becomes an inserting one, and the table gets an optimizer's slot columns, "
    "by editing ops already in the graph when the optimizer is built; TensorFlow ignores such edits for a Session "
    "that already copied those ops (logging only a warning), so training would silently read find-only or fail "
    "on the table layout. The replacement runs TF's _extend_graph and records, per graph, the last op each "
    "Session holds, so that those edits are refused with an error saying what to do. TF offers no hook to learn "
    "which Sessions hold a graph.",
    test="tests/test_tf_compat.py::test_an_optimizer_built_after_a_session_ran_the_graph_is_refused",
)
def _make_extend_graph(original):

    def _extend_graph(self):
        graph = self._graph
        with graph._session_run_lock():  # pylint: disable=protected-access  (no op is added meanwhile)
            original(self)
            last = graph.version  # the id of its newest op
        with _lock:
            sessions = _held.get(graph)
            if sessions is None:
                sessions = _held[graph] = weakref.WeakKeyDictionary()
            sessions[self] = last

    return _extend_graph


# ---- integer ids fed as floats --------------------------------------------------------------------------------

_id_feeds = weakref.WeakKeyDictionary()  # graph -> {placeholder tensor name: what reads it (for the error)}
_PASS_THROUGH = ("Identity", "Reshape", "ExpandDims", "Squeeze", "Cast")


def mark_id_feed(ids, reader):
    """Records that the integer tensor `ids` holds the ids of `reader` (e.g. "dynamic embedding 'user'"): if it is a
    placeholder (possibly through reshapes and casts), a Session refuses float values fed to it."""
    t, hops = ids, 0
    while t.op.type in _PASS_THROUGH and t.op.inputs and hops < 8:
        t, hops = t.op.inputs[0], hops + 1
    if t.op.type not in ("Placeholder", "PlaceholderWithDefault") or not t.dtype.is_integer:
        return
    with _lock:
        feeds = _id_feeds.get(t.graph)
        if feeds is None:
            feeds = _id_feeds[t.graph] = {}
        feeds.setdefault(t.name, reader)


def _refuse_float_id_feeds(graph, feed_dict):
    feeds = _id_feeds.get(graph)
    if not feeds or not feed_dict:
        return
    import numpy as np  # pylint: disable=import-outside-toplevel
    from tensorflow.python.util import nest  # pylint: disable=import-outside-toplevel

    for key, value in nest.flatten_dict_items(feed_dict).items():
        if isinstance(key, tf.SparseTensor):
            key = key.values
            value = getattr(value, "values", value[1] if isinstance(value, (tuple, list)) and len(value) == 3 else None)
        name = key if isinstance(key, str) else getattr(key, "name", None)
        if name is None or value is None or name not in feeds or isinstance(value, tf.Tensor):
            continue
        try:
            kind = np.asarray(value).dtype.kind
        except Exception:  # pylint: disable=broad-except  (TF's own feed code reports what it cannot read)
            continue
        if kind in "fc":
            raise TypeError(
                "Float values fed to %s, the ids of %s: feed integer ids (e.g. ids.astype(np.int64)). TensorFlow "
                "would cast them to integers silently (1.7 becomes id 1), so lookups would read other keys' rows."
                % (name, feeds[name])
            )


@register(
    "session_run_feeds",
    "tensorflow.python.client.session",
    "BaseSession",
    "_run",
    why="A Session converts a fed value to the placeholder's dtype with numpy, so float ids fed to an int64 ids "
    "placeholder are truncated silently (1.7 becomes key 1) and the lookup reads or trains another key's row. The "
    "replacement refuses float values fed to placeholders that tf_ext lookups read as ids (marked when the lookup "
    "is built), then runs TF's _run unchanged; other feeds are not looked at. TF has no hook to validate feeds.",
    test="tensorflow_ext/embedding/tests/test_de_error_messages.py::test_float_ids_are_refused",
)
def _make_session_run(original):

    def _run(self, handle, fetches, feed_dict, options, run_metadata):
        _refuse_float_id_feeds(self._graph, feed_dict)
        return original(self, handle, fetches, feed_dict, options, run_metadata)

    return _run


# ---- restore errors raised by tensorflow_ext's own checks -------------------------------------------------------

# The tensorflow_ext package directory (this file is tensorflow_ext/tf_compat/__init__.py).
_PACKAGE_DIR = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))
_TF_DIRS = tuple(
    __import__("os").path.dirname(__import__("os").path.abspath(m.__file__))
    for m in (tf, sys.modules.get("tensorflow.python"), sys.modules.get("keras"))
    if m is not None and getattr(m, "__file__", None)
)


def _built_by_tf_ext(op):
    """True if the innermost frame outside TensorFlow that created `op` is tensorflow_ext's (not its tests)."""
    import os  # pylint: disable=import-outside-toplevel

    for frame in reversed(list(getattr(op, "traceback", None) or [])):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TF_DIRS):
            continue
        return path.startswith(_PACKAGE_DIR + os.sep) and os.sep + "tests" + os.sep not in path[len(_PACKAGE_DIR) :]
    return False


def restore_error_summary(err):
    """The message of a restore error raised by one of tensorflow_ext's checks (one paragraph), else None."""
    if getattr(err, "op", None) is None or not _built_by_tf_ext(err.op):
        return None
    message = err.message
    cut = message.find("\n\t [[")
    if cut >= 0:
        message = message[:cut]
    message = message.strip().split("\n\n")[-1].strip()  # after TF's "Graph execution error:" and node lines
    lines = [l for l in message.splitlines() if l.strip() and not l.startswith(("Detected at node", "Node:", "  "))]
    message = " ".join(l.strip() for l in lines)
    if message.startswith("assertion failed: "):
        message = message[len("assertion failed: ") :].strip()
        if message.startswith("[") and message.endswith("]"):
            message = message[1:-1]
        message = message.replace("] [", " ").replace(" .", ".")
    return message or None


@register(
    "saver_restore_error",
    "tensorflow.python.training.saver",
    "",
    "_wrap_restore_error_with_msg",
    why="Saver.restore puts a generic first line above any InvalidArgumentError or NotFoundError of the restore "
    "('Restoring from checkpoint failed. This is most likely due to a mismatch between the current graph and the "
    "graph from the checkpoint...'), also above tensorflow_ext's own checks that say exactly what is wrong and "
    "what to do (a checkpoint of another optimizer's row layout, a broken delta chain). For an error raised by an "
    "op tensorflow_ext built, the replacement puts that op's message first and keeps TF's text below it; other "
    "errors are TF's unchanged. TF has no hook for the restore error's message.",
    test="tensorflow_ext/embedding/tests/test_de_error_messages.py::"
    "test_a_restore_refused_for_another_layout_says_so_on_its_first_line",
)
def _make_wrap_restore_error(original):

    def _wrap_restore_error_with_msg(err, extra_verbiage):
        wrapped = original(err, extra_verbiage)
        summary = restore_error_summary(err)
        if summary is None:
            return wrapped
        return err.__class__(err.node_def, err.op, summary + "\n\n" + wrapped.message)

    return _wrap_restore_error_with_msg


@register(
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
        from tensorflow_ext.embedding.checkpoint import policy_state  # pylint: disable=import-outside-toplevel

        claimed = policy_state.claimed_variables(tf.compat.v1.get_default_graph())
        if not claimed:
            return found
        return [x for x in found if id(x) not in claimed]

    return _all_saveable_objects


# ---- tf.compat.v1.train optimizers train dynamic embeddings; Keras optimizers refuse them --------------------


def _optimizers():
    from tensorflow_ext.embedding import optimizers  # pylint: disable=import-outside-toplevel

    return optimizers


def _is_embedding(value):
    from tensorflow_ext.embedding import variable  # pylint: disable=import-outside-toplevel

    return isinstance(value, variable.DynamicEmbedding)


@register(
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
            return _optimizers().ShardProcessor(v)
        return original(v)

    return _get_processor


@register(
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


@register(
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
        opts = _optimizers()
        spec, handler = opts.handler_for(self)
        slot_specs = spec.slots_of(self)
        names = [n for n, _ in slot_specs]
        inits = [v for _, v in slot_specs]
        # The lookups this gradient flows through turn inserting (see shard_lookups); refused before anything is
        # built if a Session already holds the graph (it would ignore the change).
        from tensorflow_ext.embedding import shard_lookups  # pylint: disable=import-outside-toplevel

        ancestors = shard_lookups.ancestor_ops(grads)
        for shard in shards:
            if names and shard.slot_group(self) is None and shard.layout.frozen_by is None:
                _refuse_layout_change_a_session_ignores(self, shard)  # (a frozen layout refuses it: its own error)
            shard.lookups.check_lookups_feeding(ancestors)
        orig_create_slots = opts.original_create_slots(self)

        def _create_slots(var_list):
            dense = [v for v in var_list if not _is_shard(v)]
            if dense:
                orig_create_slots(dense)
            for shard in shards:
                shard.add_slot_columns(self, names, inits)
            handler.create_non_slots(self, dense, shards)

        step = global_step if global_step is not None else tf.compat.v1.train.get_global_step()
        # Per call (a thread may build another graph with the same optimizer meanwhile): TF's apply_gradients
        # finds this call's _create_slots and the shard updates this call's step.
        with opts.apply_call(self, _create_slots, step, shards):
            result = original(self, grads_and_vars, global_step=global_step, name=name, **kwargs)
        for shard in shards:
            shard.lookups.train_lookups_feeding(ancestors)
        return result

    return apply_gradients


def _refuse_layout_change_a_session_ignores(opt, shard):
    """An optimizer with slots appends columns to the table's layout (attrs of its handle op), which a Session that
    already holds the graph ignores: its table keeps the old layout."""
    if shard.handle.op._id <= ops_held_by_open_sessions(shard.handle.graph):  # pylint: disable=protected-access
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
    register(_name + "_minimize", _module, _owner, "minimize", why=_KERAS_WHY, test=_KERAS_TEST)(_make_keras_minimize)
    register(_name + "_apply_gradients", _module, _owner, "apply_gradients", why=_KERAS_WHY, test=_KERAS_TEST)(
        _make_keras_apply_gradients
    )
del _name, _module, _owner
