"""The tensorflow_ext wheel. Run through python/build_pip_pkg.sh (bazel build //:build_pip_pkg), which stages the
package (Python files, _tf_ext_ops.so, _tf_ext_rocksdb_store.so, _build_info.py) next to this file."""

import os

from setuptools import Distribution, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

_version = {}
with open(os.path.join(HERE, "tensorflow_ext", "version.py")) as f:
    exec(f.read(), _version)  # pylint: disable=exec-used

long_description = ""
if os.path.exists(os.path.join(HERE, "README.md")):
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        long_description = f.read()


class BinaryDistribution(Distribution):
    """The wheel carries a compiled op library: platform- and Python-specific tag (cp311-cp311-linux_x86_64)."""

    def has_ext_modules(self):
        return True

    def is_pure(self):
        return False


setup(
    name="tensorflow_ext",
    version=_version["__version__"],
    description="Dynamic embeddings and a fast hash-table engine for TensorFlow 2.15 (TF1 graph mode)",
    long_description=long_description,
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tensorflow_ext", "tensorflow_ext.*"]),
    # _tf_ext_rocksdb_store.so (tiered storage) needs the system's librocksdb.so.7.8 (Debian/Ubuntu: apt-get install
    # librocksdb7.8) only when a tiered table is created; the package imports without it.
    package_data={"tensorflow_ext": ["_tf_ext_ops.so", "_tf_ext_rocksdb_store.so", "_build_info.py"]},
    include_package_data=True,
    # No TensorFlow requirement on purpose: tensorflow-cpu==2.15.1 and tensorflow==2.15.1 (CUDA) both work, and
    # tensorflow_ext checks the installed version at import (errors.VersionMismatchError).
    install_requires=["numpy>=1.23,<2"],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.15,<2.16", "tensorflow-estimator>=2.15,<2.16"],
        "gpu": ["tensorflow>=2.15,<2.16", "tensorflow-estimator>=2.15,<2.16"],
    },
    python_requires=">=3.9",
    distclass=BinaryDistribution,
    zip_safe=False,
    license="Apache-2.0",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: C++",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
