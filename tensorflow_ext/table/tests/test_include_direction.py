"""The table layer's C++ does not reach up into the embedding layer.

The table (tensorflow_ext/table: the CPU core, its TF kernels, the CUDA table) sits below the embedding layer: the
embedding kernels include the table's headers and pass their initializers and optimizer steps to it as callbacks
(the CPU core) or functors (the CUDA table), never the other way round. This reads every C++ source and BUILD file
under tensorflow_ext/table as text (no compiler, no Bazel) and fails on an #include of a header under
tensorflow_ext/embedding/ or a Bazel label in //tensorflow_ext/embedding.
"""

import os
import re

_TABLE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(os.path.dirname(_TABLE))
_EMBEDDING = os.path.join(_ROOT, "tensorflow_ext", "embedding")

_CC_SUFFIXES = (".h", ".cc", ".cu", ".cuh")  # .cu.cc ends in .cc
# Every #include, conditional ones too (the CUDA table's includes depend on __CUDACC__).
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_EMBEDDING_LABEL = re.compile(r'"(?:@[^"/]*)?//tensorflow_ext/embedding[/:"]')


def _table_files(suffixes):
    for dirpath, _, names in os.walk(_TABLE):
        for name in sorted(names):
            if name.endswith(suffixes):
                yield os.path.join(dirpath, name)


def _resolves_into_embedding(source, included):
    """Whether `included` (as written in `source`) names a file under tensorflow_ext/embedding/: a path from the
    repository root (the project's style) or one relative to the including file."""
    candidates = [os.path.join(_ROOT, included), os.path.join(os.path.dirname(source), included)]
    return any(os.path.normpath(c).startswith(_EMBEDDING + os.sep) for c in candidates)


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_table_sources_include_no_embedding_header():
    sources = list(_table_files(_CC_SUFFIXES))
    includes = {path: _INCLUDE.findall(_read(path)) for path in sources}
    # The scan sees the table's sources and their includes (a moved tree or a broken pattern would pass vacuously).
    assert len(sources) >= 20, sources
    assert "tensorflow_ext/table/core/hash_table.h" in includes[os.path.join(_TABLE, "core", "hash_table.cc")]
    upward = [
        "%s includes %s" % (os.path.relpath(path, _ROOT), inc)
        for path, incs in includes.items()
        for inc in incs
        if _resolves_into_embedding(path, inc)
    ]
    assert not upward, (
        "the table layer must not include the embedding layer's headers (pass initializers and updates in as "
        "callbacks or functors instead):\n" + "\n".join(upward)
    )


def test_table_build_files_depend_on_no_embedding_target():
    build_files = list(_table_files(("BUILD", "BUILD.bazel")))
    assert len(build_files) >= 3, build_files
    upward = [
        "%s: %s" % (os.path.relpath(path, _ROOT), line.strip())
        for path in build_files
        for line in _read(path).splitlines()
        if _EMBEDDING_LABEL.search(line) and not line.lstrip().startswith("#")
    ]
    assert not upward, "the table layer's Bazel targets must not depend on the embedding layer:\n" + "\n".join(upward)


def test_the_check_catches_an_upward_include():
    """The patterns match the forms an upward include or dependency takes."""
    source = os.path.join(_TABLE, "gpu", "bucket_table.h")
    text = '#include "tensorflow_ext/embedding/kernels/row_initializer.h"\n#  include <x.h>\n'
    assert _INCLUDE.findall(text) == ["tensorflow_ext/embedding/kernels/row_initializer.h", "x.h"]
    assert _resolves_into_embedding(source, "tensorflow_ext/embedding/kernels/row_initializer.h")
    assert _resolves_into_embedding(source, "../../embedding/kernels/optimizer_functors.h")
    assert not _resolves_into_embedding(source, "tensorflow_ext/table/core/mix.h")
    assert not _resolves_into_embedding(source, "cooperative_groups.h")
    assert _EMBEDDING_LABEL.search('        "//tensorflow_ext/embedding/kernels:embedding_math",')
    assert _EMBEDDING_LABEL.search('    deps = ["//tensorflow_ext/embedding"],')
    assert not _EMBEDDING_LABEL.search('        "//tensorflow_ext/table/core:base",')
