"""The import graph of the tensorflow_ext package, read from the AST of its modules (nothing is imported).

Contract:
  - A module is every ``.py`` file under ``tensorflow_ext/`` outside ``tests`` folders (tests may import anything and
    are no node of the graph); ``pkg/__init__.py`` is the module ``pkg``.
  - Every import statement counts, at module level and inside functions or classes, and so does
    ``importlib.import_module("<literal>")``. Relative imports are resolved against the importing module's package.
  - ``from pkg import name`` imports the module ``pkg.name`` when that is a module of the package, else ``pkg``; a
    target that is not a module is reduced to its longest enclosing module. Imports of other packages are kept
    apart (``external``) with their full dotted name (which may name a member rather than a module).
  - Layers (``LAYERS``, bottom to top) are the package's dependency order: a module may import its own layer or one
    below. ``layer_of`` maps every module to exactly one layer.

Run it (``python tools/import_graph.py``) to print the layers, the internal edges grouped by the importer's layer
(upward edges marked), the ``tensorflow.python`` imports, and the import cycles (strongly connected components).
tests/test_source_rules.py checks the same graph against the house rules.
"""

import ast
import collections
import dataclasses
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tensorflow_ext"

# Modules the build writes into the package (git-ignored): a node of the graph whether or not this tree was built.
GENERATED_MODULES = frozenset({"tensorflow_ext._build_info"})

# (layer name, module prefixes), bottom to top. A prefix matches the module itself and its submodules; the package's
# own __init__ (the lazy loader of every subsystem) is the top.
LAYERS = (
    (
        "L0 base",
        ("tensorflow_ext.errors", "tensorflow_ext.version", "tensorflow_ext.utils", "tensorflow_ext._build_info"),
    ),
    ("L1 tf_compat", ("tensorflow_ext.tf_compat",)),
    ("L2 table, optimizers", ("tensorflow_ext.table", "tensorflow_ext.optimizers")),
    ("L3 embedding", ("tensorflow_ext.embedding",)),
    (
        "L4 integrations",
        (
            "tensorflow_ext.serving",
            "tensorflow_ext.horovod",
            "tensorflow_ext.distribute",
            "tensorflow_ext.graph",
            "tensorflow_ext.xla",
            "tensorflow_ext.mixed_precision",
            "tensorflow_ext.tfra",
            "tensorflow_ext.dynamic_embedding",
        ),
    ),
    ("L5 examples", ("tensorflow_ext.examples",)),
    ("top", ("tensorflow_ext",)),
)


@dataclasses.dataclass(frozen=True)
class Import:
    """One import in ``importer``: ``target`` is a package module (internal) or a dotted external name."""

    importer: str
    target: str
    lineno: int
    in_function: bool


@dataclasses.dataclass
class ImportGraph:
    """``modules``: module -> path relative to ROOT; ``internal``/``external``: the imports, in source order."""

    modules: dict
    internal: list
    external: list

    def edges(self):
        """{importer: set of imported package modules}, without self-imports."""
        out = collections.defaultdict(set)
        for imp in self.internal:
            if imp.target != imp.importer:
                out[imp.importer].add(imp.target)
        return out


def package_modules(root=ROOT, package=PACKAGE):
    """{dotted module name: path relative to root} of every module of the package outside tests folders."""
    modules = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, package)):
        dirnames[:] = sorted(d for d in dirnames if d != "tests" and not d.startswith((".", "__")))
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, filename), root)
            name = rel[: -len(".py")].replace(os.sep, ".")
            if name.endswith(".__init__"):
                name = name[: -len(".__init__")]
            if name not in GENERATED_MODULES:
                modules[name] = rel
    return modules


def _enclosing_module(name, modules):
    while name and name not in modules and name not in GENERATED_MODULES:
        name = name.rpartition(".")[0]
    return name


def _is_package(module, modules):
    return modules[module].endswith("__init__.py")


def imported_names(tree, module, modules):
    """[(dotted name, lineno, in_function)] of every import in tree (a module's AST), relative ones resolved."""
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (child.level - 1)])
                    base = base + "." + child.module if child.module else base
                else:
                    base = child.module
                for alias in child.names:
                    candidate = base + "." + alias.name
                    is_module = candidate in modules or candidate in GENERATED_MODULES or not base.startswith(PACKAGE)
                    found.append((candidate if is_module and alias.name != "*" else base, child.lineno, in_function))
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == "import_module"
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                found.append((child.args[0].value, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def build(root=ROOT):
    """The ImportGraph of the package under root."""
    modules = package_modules(root)
    internal, external = [], []
    for module, path in modules.items():
        with open(os.path.join(root, path), encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        for name, lineno, in_function in imported_names(tree, module, modules):
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                internal.append(Import(module, _enclosing_module(name, modules), lineno, in_function))
            else:
                external.append(Import(module, name, lineno, in_function))
    return ImportGraph(modules, internal, external)


def layer_of(module):
    """Index into LAYERS of the module's layer (the longest matching prefix wins)."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise ValueError("%s is in no layer of tools/import_graph.py LAYERS" % module)
    return best


def upward_imports(graph):
    """The internal imports whose target sits in a higher layer than the importer."""
    return [imp for imp in graph.internal if layer_of(imp.target) > layer_of(imp.importer)]


def strongly_connected_components(edges):
    """Tarjan's algorithm, iteratively: the components (sorted lists) of more than one node, or with a self-loop."""
    nodes = sorted(set(edges) | {t for targets in edges.values() for t in targets})
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(edges.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    components.append(sorted(component))
    return sorted(components)


def report(graph):
    """The printed form: layers with their modules, edges by layer, tensorflow.python imports, cycles."""
    lines = []
    edges = graph.edges()
    by_layer = collections.defaultdict(list)
    for module in sorted(set(graph.modules) | GENERATED_MODULES):
        by_layer[layer_of(module)].append(module)
    for index, (name, _) in enumerate(LAYERS):
        lines.append("== %s (%d modules)" % (name, len(by_layer[index])))
        for module in by_layer[index]:
            targets = sorted(edges.get(module, ()), key=lambda t: (layer_of(t), t))
            marked = ["%s%s" % (t, " [UP]" if layer_of(t) > index else "") for t in targets]
            lines.append("  %s -> %s" % (module, ", ".join(marked) if marked else "(nothing internal)"))
    upward = sorted({(imp.importer, imp.target) for imp in upward_imports(graph)})
    lines.append("== upward imports (importer -> higher layer): %d" % len(upward))
    lines.extend("  %s -> %s" % pair for pair in upward)
    tf_python = sorted(
        {(imp.importer, imp.target) for imp in graph.external if imp.target.startswith("tensorflow.python")}
    )
    lines.append("== tensorflow.python imports: %d" % len(tf_python))
    lines.extend("  %s -> %s" % pair for pair in tf_python)
    cycles = strongly_connected_components(edges)
    lines.append("== import cycles (strongly connected components): %d" % len(cycles))
    lines.extend("  %d modules: %s" % (len(c), ", ".join(c)) for c in cycles)
    return "\n".join(lines)


def main():
    print(report(build()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
