"""Runs the ```python blocks of docs/*.md and README.md whose first line is `# doctest: run`.

Each block runs alone in a fresh interpreter (cwd: a temporary directory, the repository on PYTHONPATH), so a
block must be self-contained. Blocks without that first line are illustrations and are not run.
"""

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = "# doctest: run"
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def collect_blocks():
    blocks = []
    files = [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    )
    for path in files:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in _FENCE.finditer(text):
            code = m.group(1)
            if code.lstrip("\n").splitlines()[:1] == [MARKER]:
                line = text.count("\n", 0, m.start()) + 1
                blocks.append(pytest.param(code, id="%s:%d" % (os.path.relpath(path, ROOT), line)))
    return blocks


BLOCKS = collect_blocks()


def test_marker_parsing():
    text = "x\n```python\n# doctest: run\nprint(1)\n```\n```python\nprint(2)\n```\n"
    found = [m.group(1) for m in _FENCE.finditer(text) if m.group(1).splitlines()[:1] == [MARKER]]
    assert found == ["# doctest: run\nprint(1)\n"]


@pytest.mark.parametrize("code", BLOCKS)
def test_doc_block(code, tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, "block failed:\n%s\n--- stdout\n%s\n--- stderr\n%s" % (code, r.stdout, r.stderr[-4000:])


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_docs_page_is_linked_from_the_index_and_links_resolve():
    pages = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    with open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8") as f:
        index = f.read()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert "docs/index.md" in f.read()
    assert [p for p in pages if p != "index.md" and "(%s)" % p not in index] == []
    broken = []
    for path in [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", p) for p in pages]:
        with open(path, encoding="utf-8") as f:
            for target in _LINK.findall(f.read()):
                if "://" not in target and not os.path.exists(os.path.join(os.path.dirname(path), target)):
                    broken.append("%s -> %s" % (os.path.relpath(path, ROOT), target))
    assert broken == []


def test_readme_quick_start_is_run():
    assert any("README.md" in p.id for p in BLOCKS), [p.id for p in BLOCKS]
