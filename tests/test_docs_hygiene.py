"""docs/*.md and README.md speak to users: no tracker numbers, no files or machines outside the repository."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (what, pattern): each names something a reader of the repository cannot follow.
FORBIDDEN = [
    ("an issue number", re.compile(r"\bissues?\s*(?:#\s*)?\d+", re.I)),
    ("a reference file that is not in the repository", re.compile(r"\bANCHORS\b")),
    ("a path outside the repository", re.compile(r"(?<![\w.-])shared/")),
    ("a machine readers do not have", re.compile(r"\blent\s+GPU", re.I)),
]


def _pages():
    pages = [os.path.join(ROOT, "README.md")]
    pages += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [p for p in pages if os.path.exists(p)]


def find_violations(text):
    """[(line number, what, matched text)] for every forbidden mention in text."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN:
            for m in pattern.finditer(line):
                found.append((number, what, m.group(0)))
    return found


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Targets (issue 2): find", ["issue 2"]),
        ("see Issue #14 and issues 3", ["Issue #14", "issues 3"]),
        ("Reference (shared/ANCHORS.md, quiet)", ["ANCHORS", "shared/"]),
        ("the lent GPU machine has no TensorFlow", ["lent GPU"]),
        # Ordinary words stay allowed.
        ("a known issue with shared libraries; anchors in HTML; /usr/shared_objects/x", []),
    ],
)
def test_detector(text, expected):
    assert sorted(m for _, _, m in find_violations(text)) == sorted(expected)


def test_pages_exist():
    names = [os.path.relpath(p, ROOT) for p in _pages()]
    assert "README.md" in names and len(names) > 3, names


@pytest.mark.parametrize("path", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_page_speaks_to_users(path):
    with open(path, encoding="utf-8") as f:
        found = find_violations(f.read())
    assert not found, "%s mentions:\n%s" % (
        os.path.relpath(path, ROOT),
        "\n".join("  line %d: %s (%r)" % (n, what, m) for n, what, m in found),
    )
