"""The built wheel (dist/) installs on its own and works from a neutral directory."""

import glob
import os
import re
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY_TAG = "cp%d%d" % sys.version_info[:2]


def _version():
    ns = {}
    with open(os.path.join(ROOT, "tensorflow_ext", "version.py")) as f:
        exec(f.read(), ns)  # pylint: disable=exec-used
    return ns["__version__"]


@pytest.fixture(scope="module")
def wheel():
    wheels = sorted(glob.glob(os.path.join(ROOT, "dist", "tensorflow_ext-*.whl")), key=os.path.getmtime)
    if not wheels:
        pytest.fail("no wheel in dist/: run `make build` (`make test` does) first")
    return wheels[-1]


def test_wheel_name_and_contents(wheel):
    name = os.path.basename(wheel)
    assert re.fullmatch(
        r"tensorflow_ext-%s-%s-%s-linux_x86_64\.whl" % (re.escape(_version()), PY_TAG, PY_TAG), name
    ), name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [l for l in z.read(meta[0]).decode().splitlines() if l.startswith("Requires-Dist:")]
    for f in (
        "tensorflow_ext/__init__.py",
        "tensorflow_ext/_tf_ext_ops.so",
        "tensorflow_ext/_build_info.py",
        "tensorflow_ext/utils/loader.py",
        "tensorflow_ext/errors.py",
    ):
        assert f in names, f
    # Every package module of the source tree is shipped (tests excluded; files newer than the wheel are skipped).
    built_at = os.path.getmtime(wheel)
    for dirpath, _, files in os.walk(os.path.join(ROOT, "tensorflow_ext")):
        rel = os.path.relpath(dirpath, ROOT)
        if "/tests" in "/" + rel or "__pycache__" in rel:
            continue
        for f in files:
            if (
                f.endswith(".py")
                and not f.startswith("test_")
                and not f.endswith("_test.py")
                and f != "conftest.py"
                and os.path.getmtime(os.path.join(dirpath, f)) <= built_at
            ):
                assert os.path.join(rel, f) in names, os.path.join(rel, f)
    # No TensorFlow distribution is forced (tensorflow-cpu or tensorflow both work; checked at import).
    unconditional = [r for r in requires if "extra ==" not in r]
    assert not any(re.match(r"Requires-Dist: (tensorflow|tf-)", r) for r in unconditional), unconditional


_SMOKE = r"""
import os, sys
import tensorflow as tf
import tensorflow_ext as tf_ext
from tensorflow_ext.utils import loader
assert tf_ext.__file__.startswith(sys.argv[1]), tf_ext.__file__
tf.compat.v1.disable_v2_behavior()
ops = loader.load_ops()
with tf.compat.v1.Session() as sess:
    table = tf_ext.HashTable(dim=2)
    ins = table.insert(tf.constant([5, 6, 5], tf.int64), tf.constant([[1., 2.], [3., 4.], [5., 6.]]))
    sess.run(ins)
    out = sess.run(table.find(tf.constant([5, 7], tf.int64)))
    assert out.tolist() == [[5., 6.], [0., 0.]], out
    assert sess.run(table.size()) == 2
    print("OK table", out.tolist())
"""


def test_wheel_installs_and_runs_an_op(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(target),
            wheel,
        ],
        check=True,
    )
    neutral = tmp_path / "cwd"
    neutral.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_EXT_OPS_PATH", None)
    r = subprocess.run(
        [sys.executable, "-c", _SMOKE, str(target)],
        cwd=str(neutral),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout
