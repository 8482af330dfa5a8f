"""The op library loader: clear errors for a TF version mismatch, a missing library, an ABI mismatch."""

import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext import errors
from tensorflow_ext.utils import loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh_loader(monkeypatch):
    """Makes load_ops() try again (TF keeps a loaded library loaded; our module cache is what we reset)."""
    monkeypatch.setattr(loader, "_ops", None)
    yield loader


def test_version_mismatch_names_both_versions(fresh_loader, monkeypatch):
    monkeypatch.setattr(loader, "built_tf_version", lambda: "2.15.0-fake")
    with pytest.raises(errors.VersionMismatchError) as e:
        loader.load_ops()
    msg = str(e.value)
    assert "2.15.0-fake" in msg and tf.__version__ in msg, msg
    assert e.value.installed == tf.__version__ and e.value.expected == "2.15.0-fake"
    assert isinstance(e.value, ImportError)  # callers catching ImportError keep working


def test_recorded_build_version_is_checked(monkeypatch):
    class FakeBuildInfo:
        TF_VERSION = "9.9.9"

    monkeypatch.setattr(loader, "build_info", lambda: FakeBuildInfo)
    with pytest.raises(errors.VersionMismatchError, match=r"built against TensorFlow 9\.9\.9.*TensorFlow 2\.15"):
        loader.check_tf_version("2.15.1")


def test_unsupported_tf_version_names_both():
    with pytest.raises(errors.VersionMismatchError) as e:
        loader.check_tf_version("2.16.1")
    assert "2.16.1" in str(e.value) and "2.15" in str(e.value)
    with pytest.raises(errors.VersionMismatchError):
        loader.check_tf_version("2.14.0")


def test_supported_versions_pass(monkeypatch):
    monkeypatch.setattr(loader, "built_tf_version", lambda: None)
    for v in ("2.15.0", "2.15.1", "2.15.1+cpu"):
        assert loader.check_tf_version(v) == v


def test_installed_version_matches_build():
    built = loader.built_tf_version()
    assert built is not None, "tensorflow_ext/_build_info.py not written (run `make build`)"
    assert built == tf.__version__


def test_missing_library_gives_clear_error(fresh_loader, monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "built_tf_version", lambda: None)
    monkeypatch.setenv("TF_EXT_OPS_PATH", str(tmp_path / "_tf_ext_ops.so"))
    with pytest.raises(errors.OpLibraryNotFoundError, match="make build"):
        loader.load_ops()


def test_undefined_symbol_becomes_version_mismatch(fresh_loader, monkeypatch, tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx is not None, "no C++ compiler on PATH (`make build` needs one too)"
    src = tmp_path / "bad.cc"
    src.write_text(
        'extern "C" void tf_ext_symbol_from_another_tf_build();\n'
        'extern "C" void tf_ext_bad_entry() { tf_ext_symbol_from_another_tf_build(); }\n'
    )
    lib = tmp_path / "_tf_ext_ops.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    monkeypatch.setattr(loader, "built_tf_version", lambda: None)
    monkeypatch.setenv("TF_EXT_OPS_PATH", str(lib))
    with pytest.raises(errors.VersionMismatchError) as e:
        loader.load_ops()
    msg = str(e.value)
    assert tf.__version__ in msg and "undefined symbol" in msg, msg


def test_import_checks_tf_version_in_subprocess(tmp_path):
    """A TF outside 2.15.x fails at `import tensorflow_ext`, naming both versions (simulated with a fake module)."""
    fake = tmp_path / "fake_tf"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text("__version__ = '2.16.1'\n")
    code = "import tensorflow, tensorflow_ext\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), ROOT]))
    env.pop("TF_EXT_SKIP_VERSION_CHECK", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "VersionMismatchError" in r.stderr and "2.16.1" in r.stderr and "2.15" in r.stderr, r.stderr


def test_lazy_public_api():
    assert tf_ext.__version__
    assert "HashTable" in dir(tf_ext)
    with pytest.raises(AttributeError):
        tf_ext.no_such_name  # pylint: disable=pointless-statement
