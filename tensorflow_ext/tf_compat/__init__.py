"""The machinery through which tensorflow_ext changes TensorFlow's own Python objects, and its registries.

TensorFlow 2.15's TF1 API has no hook for a few things dynamic embeddings need (an optimizer's slots that live in a
table row, a moving average that cannot shadow a table). Where TF offers a public hook, tensorflow_ext uses it
(`tf.register_tensor_conversion_function`, gradient registration, wrapping); what is left is registered here:

* patches (`register`, `install`, `patches()`): replaced attributes of TF modules and classes. Each entry says
  what it replaces, why, the TensorFlow versions it was written and tested against, and the test that checks it
  (tests/test_tf_compat.py checks every entry). This module registers the patches that know nothing of
  embeddings (sessions, the Saver's restore errors, replica_device_setter); the embedding layer registers its own
  (embedding/tf_patches.py; the Saver-build modes in embedding/export_mode.py), so `patches()` lists them all
  once it is imported.
* caller probes (`register_probe`, `probe`): TF functions recognised on the Python stack, where TF gives no hook
  to tell who asks.
* `graph_edits`: the changes made to ops and objects TF already built, through their private members.
* `internals`: the reads of TensorFlow's internal modules and private members.

This package is layer 1: it imports TensorFlow and tensorflow_ext's layer 0 (errors, version, utils) only, never
a module above it, not even inside a function (tests/test_source_rules.py checks). Higher layers register their
patch bodies here; what this module itself knows of them is a name (the table op type it places on parameter
servers).

Patches are installed by `install(name)` when the subsystem that needs them is imported. Installing checks the
guard first: the TensorFlow version must be in the tested range and the replaced attribute must exist and still
be TF's original; otherwise it raises `PatchError` naming the patch, instead of silently changing behaviour of a
TensorFlow it was not written for.
"""

import importlib
import os
import sys
import threading
import weakref

import tensorflow as tf

from tensorflow_ext import errors
from tensorflow_ext import version as _version

__all__ = [
    "CallerProbe",
    "Patch",
    "PatchError",
    "SUPPORTED_TF_VERSIONS",
    "check_tf_version",
    "held_by_an_open_session",
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
    "resolve",
]


class PatchError(errors.TfExtError, RuntimeError):
    """A patch cannot be installed on this TensorFlow (its target moved or changed)."""


SUPPORTED_TF_VERSIONS = (_version.MIN_TF_VERSION, _version.MAX_TF_VERSION_EXCLUSIVE)


def check_tf_version(what, tf_versions=SUPPORTED_TF_VERSIONS):
    """Raises PatchError unless the running TensorFlow's version is in [tf_versions[0], tf_versions[1]).

    Args:
      what: the guarded entry, for the message (e.g. "patch 'optimizer_get_slot' (tensorflow...get_slot)").
      tf_versions: (min inclusive, max exclusive) versions it was written and tested against.
    """
    lo, hi = (_release(v) for v in tf_versions)
    if not lo <= _release(tf.__version__) < hi:
        raise PatchError(
            "tensorflow_ext %s was written for TensorFlow [%s, %s), not %s"
            % (what, tf_versions[0], tf_versions[1], tf.__version__)
        )


def resolve(module, path):
    """The object at the dotted attribute `path` ('' for the module itself) of the module named `module`.

    Raises:
      ImportError, AttributeError: it is missing.
    """
    obj = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def _release(version):
    from tensorflow_ext.utils import loader  # pylint: disable=import-outside-toplevel

    return loader._release(version)  # pylint: disable=protected-access


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
        self.tf_versions = tf_versions or SUPPORTED_TF_VERSIONS
        self.original = None
        self.installed = False

    @property
    def target(self):
        """The dotted path of the replaced attribute."""
        return ".".join(p for p in (self.module, self.owner, self.attr) if p)

    def _owner_object(self):
        return resolve(self.module, self.owner)

    def check_guard(self):
        """Raises PatchError unless TF's version is in range and the target exists."""
        check_tf_version("patch %r (%s)" % (self.name, self.target), self.tf_versions)
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
        code = getattr(replacement, "__code__", None)
        if code is not None:
            _REPLACEMENT_FRAMES.add((os.path.abspath(code.co_filename), code.co_name))
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
# (file, function name) of each installed replacement function: a frame of TF's call passing through a patch, not
# of tensorflow_ext building something of its own (see _built_by_tf_ext).
_REPLACEMENT_FRAMES = set()


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
# Caller probes: where TF gives no hook to tell *who* asks (a SavedModel export building its Saver), the asking TF
# functions are recognised on the Python stack. Each probe names the TF functions it looks for; its guard
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
        check_tf_version("caller probe %r" % self.name)
        codes = set()
        for qualname in self.functions:
            try:
                obj = resolve(self.module, qualname)
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
# The patches that know nothing of embeddings (the embedding layer's own are in tensorflow_ext/embedding/
# tf_patches.py). Each replacement handles tf_ext's cases and hands everything else to TF's original unchanged.


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


def held_by_an_open_session(op):
    """True if an open Session already holds `op` (TensorFlow would ignore a change of its attrs or control
    inputs; see `ops_held_by_open_sessions`)."""
    return op._id <= ops_held_by_open_sessions(op.graph)  # pylint: disable=protected-access


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
    from tensorflow_ext.tf_compat import internals  # pylint: disable=import-outside-toplevel

    for key, value in internals.nest.flatten_dict_items(feed_dict).items():
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
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TF_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__))
    for m in (tf, sys.modules.get("tensorflow.python"), sys.modules.get("keras"))
    if m is not None and getattr(m, "__file__", None)
)


def _built_by_tf_ext(op):
    """True if the innermost frame outside TensorFlow that created `op` is tensorflow_ext's (not its tests).

    A patch's replacement function that TF's own call passes through (the Saver's restore build, say) is not
    tensorflow_ext building the op: its frames are skipped like TensorFlow's.
    """
    for frame in reversed(list(getattr(op, "traceback", None) or [])):
        path = os.path.abspath(frame.filename)
        if path.startswith(_TF_DIRS) or (path, frame.name) in _REPLACEMENT_FRAMES:
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
