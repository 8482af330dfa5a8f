"""docs/design.md draws the package as it is: its layer picture follows the layers the source rules check
(tools/import_graph.LAYERS, the one definition), and its layout names every module of the core folders."""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import import_graph  # noqa: E402  (tools/ is not a package)

# Folders whose every module the layout names one by one; the other subsystem folders are named as a whole.
DETAILED_FOLDERS = ("tensorflow_ext", "tensorflow_ext/tf_compat", "tensorflow_ext/table", "tensorflow_ext/embedding")


def _design():
    with open(os.path.join(ROOT, "docs", "design.md")) as f:
        return f.read()


def _code_block_after(text, heading):
    section = text.split(heading, 1)[1]
    return section.split("```", 2)[1]


def _short_name(module, graph):
    """What the docs call a module: `folder/` for a package, `file.py` for a module file."""
    path = graph.modules[module]
    if os.path.basename(path) == "__init__.py":
        return os.path.basename(os.path.dirname(path)) + "/"
    return os.path.basename(path)


def test_layer_picture_follows_the_checked_layers():
    graph = import_graph.build()
    picture = _code_block_after(_design(), "## Layers")
    labels = [line.split()[0] for line in picture.splitlines() if re.match(r"^\s+(L\d|top)\b", line)]
    expected = [name.split()[0] for name, _ in import_graph.LAYERS]
    assert labels == list(reversed(expected)), "the picture's layers, top to bottom, are not LAYERS reversed"
    for name, prefixes in import_graph.LAYERS:
        label = name.split()[0]
        block = re.split(r"\n\s+(?:L\d|top)\b", picture.split("\n  " + label, 1)[1])[0]
        for prefix in prefixes:
            if prefix == "tensorflow_ext" or prefix not in graph.modules or prefix.split(".")[-1].startswith("_"):
                continue
            short = _short_name(prefix, graph)
            assert short in block, "layer %s of the picture does not name %s" % (label, short)


def test_layout_names_every_module_of_the_core_folders():
    graph = import_graph.build()
    layout = _code_block_after(_design(), "## Layout")
    missing = []
    for module, path in sorted(graph.modules.items()):
        folder = os.path.dirname(path)
        name = os.path.basename(path)
        if name.startswith("_") and name != "__init__.py":
            continue  # private helpers (op-library switches, generated build info) are not part of the picture
        if folder in DETAILED_FOLDERS or folder.startswith("tensorflow_ext/embedding/"):
            wanted = _short_name(module, graph)
        else:
            wanted = os.path.basename(folder.split("tensorflow_ext/", 1)[1].split("/")[0]) + "/"
        if wanted not in layout:
            missing.append("%s (%s)" % (wanted, path))
    assert not missing, "docs/design.md's layout does not name: %s" % ", ".join(missing)
