"""House rules of the source tree, checked on the AST of every module (no TensorFlow import).

In the manner of tensorflow/addons' source-code test, each rule is a function of the source and has an allowlist of
today's exceptions, each with a reason: what must happen to remove it, or why it stays. An allowlist entry that no
longer matches anything fails the test too, so the lists only shrink: remove an entry when its violation is gone.

  1. Layers (tools/import_graph.py LAYERS, bottom to top): a module of the package imports only modules of its own
     layer or below, whether at module level or inside a function.
  2. No import cycle among the package's modules: every strongly connected component of the import graph
     (tools/import_graph.py, tests excluded) is a single module.
  3. TensorFlow internals are read only in tensorflow_ext/tf_compat/ (internals.py names each read and why no public
     API serves): elsewhere in the package no ``tensorflow.python`` import and no private member of an object or
     module that tensorflow_ext does not define (``x._name``, ``getattr(x, "_name")``, ``tf.__internal__``). A
     private name counts as the package's (bound in the package outside tf_compat) by its receiver: on ``self``,
     ``cls`` or an imported package module any name the package binds; on any other object a name bound in one of
     the package's class bodies, or one the reading module binds itself (``foreign_private_members``). A TF private
     member that happens to share such a name goes unseen. Tests and tools may reach into TensorFlow to check it and
     are not covered.
  4. A source file of the package, tools/ or tests/ over MAX_LINES lines has a stated reason.

Run ``python tools/import_graph.py`` to see the graph these rules read.
"""

import ast
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", os.path.join(ROOT, "tools", "import_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ig = _load_import_graph()

TF_COMPAT = "tensorflow_ext.tf_compat"
MAX_LINES = 800
SOURCE_DIRS = ("tensorflow_ext", "tools", "tests")
SOURCE_SUFFIXES = (".py", ".cc", ".h", ".cu", ".cuh", ".sh", ".bzl")

# Rule 1: {(importer, imported module in a higher layer): reason}.
LAYER_EXCEPTIONS = {}

# Rule 2: {module in an import cycle: reason}.
CYCLE_EXCEPTIONS = {}

# Rule 3: {module or (module, target): reason}; a target is a ``tensorflow.python`` module or a private member
# (``._name``). A module entry covers every private member read in that module, never a ``tensorflow.python`` import.
TF_INTERNALS_EXCEPTIONS = {
    # Kept: the per-optimizer knowledge lives beside each update formula, and a string-keyed accessor in
    # tf_compat would only hide the same reads from this check.
    "tensorflow_ext.embedding.optimizers": "the fused sparse updates read each stock TF1 optimizer's "
    "hyper-parameters where TF keeps them (private fields set in __init__ and _prepare: _learning_rate_tensor, "
    "_beta1_t, _l1_regularization_strength, ...) and make Adam's beta powers with its private helpers "
    "(_create_non_slot_variable, _get_beta_accumulators), as TF's own apply does; TF1 optimizers have no public "
    "getters",
    "tensorflow_ext.embedding.optimizer_spec": "each optimizer's flags and slot initial values are read from the "
    "stock TF1 optimizer's private fields (_use_nesterov, _centered, _initial_accumulator_value, ...), which TF1 "
    "optimizers expose through no public getter; tests check the specs against TF's op definitions",
    # Kept: TF1 has no other way to write an optimizer.
    "tensorflow_ext.optimizers.rowwise_adagrad": "a tf.compat.v1.train.Optimizer subclass uses the base class's "
    "subclass API as TF's own optimizers do: its slot factory (_get_or_make_slot_with_initializer) and the "
    "use_locking it keeps (_use_locking)",
}

# Rule 4: {path relative to the repository root: reason}.
LONG_FILE_EXCEPTIONS = {
    "tensorflow_ext/table/core/hash_table.cc": "the table core's implementation behind hash_table.h (slabs, "
    "prefaulting, shards, growth, batch operations) in one translation unit, so that HashTable::Impl and its "
    "helpers stay file-local; the contract and design are in hash_table.h",
    "tensorflow_ext/table/core/hash_table_test.cc": "the table core's unit tests, one file that g++ alone builds "
    "and runs without TensorFlow or a test framework (see its header)",
    "tensorflow_ext/table/gpu/bucket_table.h": "the CUDA table's contract and the per-key code written once for "
    "the device and for the host emulation: both compile this one header",
    "tensorflow_ext/embedding/kernels/embedding_kernels.cc": "the CPU kernels of the lookup op family (dense, ids, "
    "multi-table, sparse and their gradients) sharing LookupBase and the row initializer; to split by op family "
    "if it grows",
    "tensorflow_ext/table/tiered/cold_store_test.cc": "the RocksDB store's tests, one binary sharing the plugin "
    "loading and the private tmpfs mounts of its full-disk and read-only cases; to split by theme if it grows",
    "tools/bench_tiered.py": "the tiered-storage benchmark's one script: the ctr-style training child, the main-job "
    "pair and the peers' variants (TFRA, its Redis table) share the runner, the batches and the report",
    "tensorflow_ext/embedding/tests/test_embedding_kernels.py": "tests of every embedding kernel against TF's own "
    "kernels, sharing one set of reference helpers; to split by op if it grows",
}


# ------------------------------------------------------------------------------------------------ the detectors


def _is_private(name):
    return name == "__internal__" or (name.startswith("_") and not (name.startswith("__") and name.endswith("__")))


def bindings(trees):
    """The names bound in the given module ASTs, by kind: {"module": module-level names, functions and classes;
    "class": names bound in class bodies (methods, nested classes, class attributes); "self": attributes assigned
    on self/cls}."""
    found = {"module": set(), "class": set(), "self": set()}

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if scope in found:
                    found[scope].add(child.name)
                visit(child, "class" if isinstance(child, ast.ClassDef) else "function")
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store) and scope in found:
                found[scope].add(child.id)
            elif (
                isinstance(child, ast.Attribute)
                and isinstance(child.ctx, ast.Store)
                and isinstance(child.value, ast.Name)
                and child.value.id in ("self", "cls")
            ):
                found["self"].add(child.attr)
            visit(child, scope)

    for tree in trees:
        visit(tree, "module")
    return found


def names_defined(trees):
    """Every name bound in the given module ASTs: functions, classes, module- and class-level names, attributes
    assigned on self/cls."""
    return set().union(*bindings(trees).values())


def package_module_names(tree):
    """The names that tree binds to a module (or a member) of the package: ``import tensorflow_ext.x as y``,
    ``from tensorflow_ext... import y``, relative imports, ``y = importlib.import_module("tensorflow_ext...")``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname for a in node.names if a.asname and a.name.startswith(ig.PACKAGE))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(ig.PACKAGE)):
            names.update(a.asname or a.name for a in node.names)
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "import_module"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
            and str(node.value.args[0].value).startswith(ig.PACKAGE)
        ):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def foreign_private_members(tree, package):
    """[(lineno, "._name")] for each private member read or written in tree that tensorflow_ext does not define.

    package: `bindings` of the package's modules outside tf_compat (module names added to "module"). Which names
    count as the package's depends on the receiver: on ``self``/``cls`` or a package module this module imported,
    any name the package binds; on any other object (``graph._lock``, ``getattr(op, "_x")``) a name bound in a
    class body of the package, or one this module binds itself. A module-level name or an attribute that another
    module sets on its own objects is no licence to read TensorFlow's member of that name.
    """
    everything = set().union(*package.values())
    local = names_defined([tree])
    modules = package_module_names(tree)
    found = []
    for node in ast.walk(tree):
        name = receiver = None
        if isinstance(node, ast.Attribute):
            name, receiver = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, receiver = node.args[1].value, node.args[0]
        if name is None or not _is_private(name):
            continue
        ours = isinstance(receiver, ast.Name) and (receiver.id in ("self", "cls") or receiver.id in modules)
        if name not in (everything if ours else package["class"] | local):
            found.append((node.lineno, "." + name))
    return found


def _parse(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _outside_tf_compat(module):
    return module != TF_COMPAT and not module.startswith(TF_COMPAT + ".")


@pytest.fixture(scope="module")
def graph():
    return ig.build(ROOT)


def tf_internals_uses(graph):
    """{(module, target): first line} of every ``tensorflow.python`` import and foreign private member outside
    tf_compat."""
    trees = {m: _parse(p) for m, p in graph.modules.items()}
    package = bindings(t for m, t in trees.items() if _outside_tf_compat(m))
    package["module"] |= {m.rpartition(".")[2] for m in graph.modules}
    uses = {}
    for imp in graph.external:
        if _outside_tf_compat(imp.importer) and (
            imp.target == "tensorflow.python" or imp.target.startswith("tensorflow.python.")
        ):
            uses.setdefault((imp.importer, imp.target), imp.lineno)
    for module, tree in trees.items():
        if _outside_tf_compat(module):
            for lineno, member in foreign_private_members(tree, package):
                uses.setdefault((module, member), lineno)
    return uses


def _check(kind, found, exceptions, covers):
    """Fails on a violation no exception covers, and on an exception that covers no violation.

    found: {violation: its description}; covers(entry, violation): whether an allowlist entry covers a violation.
    """
    uncovered = sorted(v for v in found if not any(covers(e, v) for e in exceptions))
    stale = sorted((e for e in exceptions if not any(covers(e, v) for v in found)), key=str)
    problems = []
    if uncovered:
        problems.append("%s:\n    %s" % (kind, "\n    ".join(found[v] for v in uncovered)))
    if stale:
        problems.append(
            "allowlist entries that no longer match anything (remove them):\n    %s" % "\n    ".join(map(str, stale))
        )
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------ the rules


def test_layers(graph):
    found = {}
    for imp in ig.upward_imports(graph):
        found.setdefault(
            (imp.importer, imp.target),
            "%s:%d imports %s (%s imports %s)"
            % (
                graph.modules[imp.importer],
                imp.lineno,
                imp.target,
                ig.LAYERS[ig.layer_of(imp.importer)][0],
                ig.LAYERS[ig.layer_of(imp.target)][0],
            ),
        )
    _check("imports of a higher layer", found, LAYER_EXCEPTIONS, lambda e, v: e == v)


def test_no_import_cycles(graph):
    components = ig.strongly_connected_components(graph.edges())
    found = {m: "%s (in a cycle of %d: %s)" % (m, len(c), ", ".join(c)) for c in components for m in c}
    _check("modules in an import cycle", found, CYCLE_EXCEPTIONS, lambda e, v: e == v)


def test_tf_internals_only_in_tf_compat(graph):
    found = {
        (module, target): "%s:%d %s" % (graph.modules[module], lineno, target)
        for (module, target), lineno in tf_internals_uses(graph).items()
    }
    _check(
        "TensorFlow internals outside tensorflow_ext/tf_compat (read them through tf_compat.internals)",
        found,
        TF_INTERNALS_EXCEPTIONS,
        lambda e, v: e == v or (e == v[0] and v[1].startswith(".")),
    )


def _source_files():
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__", "bazel-")))
            for filename in sorted(filenames):
                if filename.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, filename), ROOT)


def test_long_files_have_a_reason():
    found = {}
    for path in _source_files():
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            found[path] = "%s: %d lines" % (path, lines)
    _check("files over %d lines without a stated reason" % MAX_LINES, found, LONG_FILE_EXCEPTIONS, lambda e, v: e == v)


def test_every_internals_name_is_used(graph):
    """tf_compat.internals lists the reads the package makes: a name nobody reads any more leaves the list."""
    internals = TF_COMPAT + ".internals"
    tree = _parse(graph.modules[internals])
    exported = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )
    used = set()
    for module, path in graph.modules.items():
        if module == internals:
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ImportFrom) and node.module == internals:
                used.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "internals":
                used.add(node.attr)
    assert not sorted(set(exported) - used), "tf_compat.internals names nobody reads: %s" % sorted(set(exported) - used)


def test_allowlist_entries_have_reasons():
    for exceptions in (LAYER_EXCEPTIONS, CYCLE_EXCEPTIONS, TF_INTERNALS_EXCEPTIONS, LONG_FILE_EXCEPTIONS):
        for entry, reason in exceptions.items():
            assert isinstance(reason, str) and len(reason.split()) >= 3, "give %r a reason" % (entry,)


# -------------------------------------------------------------------------------------------- the detectors' own tests


def _graph_of(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return ig.build(str(tmp_path))


def test_import_graph_reads_every_kind_of_import(tmp_path):
    g = _graph_of(
        tmp_path,
        {
            "tensorflow_ext/__init__.py": "",
            "tensorflow_ext/errors.py": "",
            "tensorflow_ext/table/__init__.py": "from . import table_ops\n",
            "tensorflow_ext/table/table_ops.py": "from ..errors import TfExtError\n",
            "tensorflow_ext/embedding/__init__.py": "",
            "tensorflow_ext/embedding/variable.py": (
                "import importlib\n"
                "from tensorflow_ext import table\n"
                "from tensorflow_ext.table import HashTable\n"
                "from tensorflow.python.framework import ops\n"
                "def f():\n"
                "    from tensorflow_ext import tfra\n"
                "    importlib.import_module('tensorflow_ext.embedding')\n"
            ),
            "tensorflow_ext/embedding/tests/test_x.py": "import tensorflow_ext.tfra\n",
            "tensorflow_ext/tfra.py": "from .embedding import variable\n",
        },
    )
    assert "tensorflow_ext.embedding.tests.test_x" not in g.modules
    edges = g.edges()
    assert edges["tensorflow_ext.table"] == {"tensorflow_ext.table.table_ops"}
    assert edges["tensorflow_ext.table.table_ops"] == {"tensorflow_ext.errors"}
    assert edges["tensorflow_ext.embedding.variable"] == {
        "tensorflow_ext.table",
        "tensorflow_ext.tfra",
        "tensorflow_ext.embedding",
    }
    in_function = {i.target for i in g.internal if i.in_function}
    assert in_function == {"tensorflow_ext.tfra", "tensorflow_ext.embedding"}
    assert [i.target for i in g.external if i.target.startswith("tensorflow.")] == ["tensorflow.python.framework.ops"]
    assert {(i.importer, i.target) for i in ig.upward_imports(g)} == {
        ("tensorflow_ext.embedding.variable", "tensorflow_ext.tfra")
    }
    assert ig.strongly_connected_components(edges) == [["tensorflow_ext.embedding.variable", "tensorflow_ext.tfra"]]


def test_strongly_connected_components():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    assert ig.strongly_connected_components(edges) == [["a", "b", "c"], ["e"]]


def test_every_module_has_a_layer(graph):
    for module in graph.modules:
        ig.layer_of(module)
    assert ig.LAYERS[ig.layer_of("tensorflow_ext")][0] == "top"
    assert ig.layer_of("tensorflow_ext.embedding.variable") > ig.layer_of("tensorflow_ext.table.table_ops")


def test_private_member_detector():
    ours = ast.parse(
        "_registry = {}\n"
        "class A:\n"
        "    _kind = 1\n"
        "    def __init__(self):\n"
        "        self._rows = 0\n"
        "    def _grow(self):\n"
        "        _local = 2\n"
    )
    package = bindings([ours])
    assert package == {"module": {"_registry", "A"}, "class": {"_kind", "__init__", "_grow"}, "self": {"_rows"}}
    assert names_defined([ours]) == {"_registry", "A", "_kind", "__init__", "_grow", "_rows"}
    code = ast.parse(
        "from tensorflow_ext.x import mod\n"
        "a._kind + a._grow() + self._rows + mod._registry\n"
        "op._set_attr('x', v)\n"
        "getattr(store, '_vars', {})\n"
        "tf.__internal__.x\n"
        "x.__class__, x.public\n"
        "a._local\n"
        "graph._rows, graph._registry\n"
    )
    assert sorted(m for _, m in foreign_private_members(code, package)) == [
        ".__internal__",
        "._local",
        "._registry",
        "._rows",
        "._set_attr",
        "._vars",
    ]
    # A module may read what it binds itself on its own objects.
    own = ast.parse("class B:\n    def __init__(self):\n        self._rows = 0\ndef f(b):\n    return b._rows\n")
    assert foreign_private_members(own, package) == []
