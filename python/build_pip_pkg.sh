#!/usr/bin/env bash
# Builds the tensorflow_ext wheel from Bazel outputs:
#   bazel build //:build_pip_pkg && bazel-bin/build_pip_pkg <dist_dir>     (or: bazel run //:build_pip_pkg -- <dist_dir>)
# Stages setup.py, README.md, every Python file of tensorflow_ext/ (tests excluded), the op library, the RocksDB store
# plugin of tiered storage and _build_info.py in a temporary directory, then runs `setup.py bdist_wheel` with $PYTHON_BIN_PATH (default: the
# repository's .venv, else python3). Offline: needs only setuptools + wheel.
set -euo pipefail

usage() { echo "usage: $0 <dist_dir>" >&2; exit 2; }
[[ $# -eq 1 ]] || usage
DEST="$1"
if [[ "${DEST}" != /* ]]; then
  DEST="${BUILD_WORKING_DIRECTORY:-$PWD}/${DEST}"
fi

# Runfiles of the sh_binary (workspace name: tensorflow_ext).
if [[ -n "${RUNFILES_DIR:-}" && -d "${RUNFILES_DIR}/tensorflow_ext" ]]; then
  RUNFILES="${RUNFILES_DIR}/tensorflow_ext"
elif [[ -d "$0.runfiles/tensorflow_ext" ]]; then
  RUNFILES="$0.runfiles/tensorflow_ext"
elif [[ -f "python/setup.py" && -f "tensorflow_ext/_tf_ext_ops.so" ]]; then
  RUNFILES="$PWD"   # `bazel run` cwd, or a built source tree
else
  echo "build_pip_pkg: cannot find the runfiles; run bazel-bin/build_pip_pkg after bazel build //:build_pip_pkg" >&2
  exit 1
fi

# The source tree: runfiles are symlinks into it.
SRC_ROOT="$(cd "$(dirname "$(readlink -f "${RUNFILES}/python/setup.py")")/.." && pwd)"

PY="${PYTHON_BIN_PATH:-}"
if [[ -z "${PY}" ]]; then
  if [[ -x "${SRC_ROOT}/.venv/bin/python" ]]; then PY="${SRC_ROOT}/.venv/bin/python"; else PY="python3"; fi
fi

STAGE="$(mktemp -d -t tf_ext_pip.XXXXXX)"
trap 'rm -rf "${STAGE}"' EXIT

cp -L "${RUNFILES}/python/setup.py" "${RUNFILES}/python/MANIFEST.in" "${STAGE}/"
cp -L "${RUNFILES}/README.md" "${STAGE}/"

# Python sources straight from the source tree (a subpackage with its own BUILD file is still included).
(cd "${SRC_ROOT}" && find tensorflow_ext -name '*.py' \
    -not -path '*/tests/*' -not -name '*_test.py' -not -name 'test_*.py' \
    -not -name '_build_info.py' -not -path '*/__pycache__/*' -print0 \
  | xargs -0 cp --parents -t "${STAGE}/")

cp -L "${RUNFILES}/tensorflow_ext/_tf_ext_ops.so" "${STAGE}/tensorflow_ext/_tf_ext_ops.so"
chmod u+w "${STAGE}/tensorflow_ext/_tf_ext_ops.so"
# The plugin sits next to the op library, which loads it from there (bazel-bin has it under table/tiered/, a built
# source tree in tensorflow_ext/).
STORE_SO="${RUNFILES}/tensorflow_ext/table/tiered/_tf_ext_rocksdb_store.so"
[[ -f "${STORE_SO}" ]] || STORE_SO="${RUNFILES}/tensorflow_ext/_tf_ext_rocksdb_store.so"
cp -L "${STORE_SO}" "${STAGE}/tensorflow_ext/_tf_ext_rocksdb_store.so"
chmod u+w "${STAGE}/tensorflow_ext/_tf_ext_rocksdb_store.so"
cp -L "${RUNFILES}/tensorflow_ext/gen/_build_info.py" "${STAGE}/tensorflow_ext/_build_info.py"

mkdir -p "${DEST}"
(cd "${STAGE}" && "${PY}" setup.py -q bdist_wheel --dist-dir "${DEST}" >/dev/null 2>"${STAGE}/setup.log") || {
  cat "${STAGE}/setup.log" >&2
  exit 1
}
ls -1t "${DEST}"/tensorflow_ext-*.whl | head -n 1
