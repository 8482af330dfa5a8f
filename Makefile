# tensorflow_ext: every set-up step from a fresh Debian/Ubuntu machine (root or sudo).
#   make demo    venv + bazel + Horovod + build + install the wheel into .venv, then run the CTR example
#   make test    format checks (black, clang-format), venv + bazel + Horovod + build, C++ core tests, pytest
#   make bench   table benchmark (tools/bench_table.py; BENCH_ARGS=--quick for a short run)
#   make cuda    compile the CUDA table + ctypes harness with nvcc (build/cuda/libtfext_gpu_table.so)
#   make cuda-tf compile the table ops' DEVICE_GPU kernels (build/cuda/_tf_ext_gpu_ops.so) and check they register
# Everything is idempotent: a second run only redoes what changed.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT       := $(abspath .)
PYTHON     ?= python3
VENV       := $(ROOT)/.venv
VPY        := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.tf_ext_requirements.stamp
SUDO       := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_GET    := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get
BAZEL      ?= bazel
# Repository rules read the interpreter from $PYTHON_BIN_PATH; the stamp (the installed TF dist-info) makes
# @local_config_tf re-run when TensorFlow changes in the venv.
TF_STAMP    = $(shell ls -d $(VENV)/lib/python3*/site-packages/tensorflow*.dist-info 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ',')
BAZEL_FLAGS = --repo_env=PYTHON_BIN_PATH=$(VPY) --repo_env=TF_EXT_TF_STAMP=$(TF_STAMP)
NVCC       ?= $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
CUDA_ARCHS ?= 80 90
BENCH_ARGS ?=
PYTEST_ARGS ?=
OPS_SO     := tensorflow_ext/_tf_ext_ops.so
# The RocksDB plugin of tiered storage (loaded by the op library on first use; links the system's librocksdb).
STORE_SO   := tensorflow_ext/_tf_ext_rocksdb_store.so
BUILD_INFO := tensorflow_ext/_build_info.py
# The CUDA table's harness (nvcc: the table with the embedding layer's initializers and optimizer steps on it) and
# the CPU core it compares with (host C++).
GPU_SRCS   := tensorflow_ext/embedding/kernels/gpu/gpu_table_harness.cu.cc tensorflow_ext/table/core/hash_table.cc
# Headers the CUDA sources include: the table's, the core's header-only base, the embedding layer's GPU operations
# and the row and optimizer math they share with the CPU kernels.
GPU_HDRS   := $(wildcard tensorflow_ext/table/gpu/*.h tensorflow_ext/table/core/*.h \
                tensorflow_ext/embedding/kernels/gpu/*.h) \
              tensorflow_ext/embedding/kernels/optimizer_functors.h tensorflow_ext/embedding/kernels/row_initializer.h
# Every C++ and CUDA source (*.h, *.cc, *.cu.cc): one format, .clang-format at the root.
CC_FORMAT_SRCS = $(shell find tensorflow_ext -name '*.h' -o -name '*.cc' | sort)
CLANG_FORMAT ?= clang-format
GPU_LIB    := build/cuda/libtfext_gpu_table.so
# The table ops' DEVICE_GPU kernels, for a CUDA build of TensorFlow (compiled against the venv's TF headers).
TF_GPU_SRC := tensorflow_ext/table/gpu/gpu_table_kernels.cu.cc
TF_GPU_LIB := build/cuda/_tf_ext_gpu_ops.so
# Horovod (distributed training, tensorflow_ext.horovod): built once from source with Gloo against the venv's
# TensorFlow and cached as a wheel outside the tree, so later runs on the machine only install it.
# The sdist is patched before the build: third_party/horovod/gloo_f16c.patch compiles the F16C loops of the vendored
# Gloo, which otherwise sums fp16 with a software conversion per element, and fixes its float16 comparison (which
# made an assignment drop some sums) (tensorflow_ext.horovod.wire16 reduces fp16
# through Horovod's allreduce when it finds this build: the version's local label +tfext.f16c.<patch hash>). The
# label keys the wheel cache and the venv's stamp, so a changed patch rebuilds and reinstalls Horovod.
HVD_VERSION := 0.28.1
HVD_PATCHES := $(sort $(wildcard third_party/horovod/*.patch))
HVD_LABEL  := tfext.f16c.$(shell cat $(HVD_PATCHES) | sha256sum | cut -c1-12)
WHEEL_CACHE ?= $(HOME)/.cache/tf_ext_wheels
HVD_WHEEL_GLOB := $(WHEEL_CACHE)/horovod-$(HVD_VERSION)+$(HVD_LABEL)-*.whl
HVD_STAMP  := $(VENV)/.tf_ext_horovod_$(HVD_VERSION)+$(HVD_LABEL).stamp
HVD_ENV    := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
              HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO

.PHONY: help venv horovod bazel rocksdb clang-format build wheel test test-cc test-py format-check-cc demo bench cuda cuda-tf cuda-bazel \
        clean

help:
	@sed -n '2,7p' Makefile | sed 's/^# *//'

# ---------------------------------------------------------------- environment
venv: $(VENV_STAMP)

$(VENV_STAMP): requirements.txt
	@if ! $(PYTHON) -m venv --help >/dev/null 2>&1 || ! $(PYTHON) -c 'import ensurepip' >/dev/null 2>&1; then \
	  echo "== installing python3-venv"; $(APT_GET) update -qq && $(APT_GET) install -y -qq python3-venv python3-pip; fi
	@[ -x $(VPY) ] || { echo "== creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "== installing pinned requirements into $(VENV)"
	$(VPY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

horovod: $(HVD_STAMP)

# Needs the system cmake (a pip-installed cmake 4 breaks Horovod's bundled Gloo), a C++ compiler and Python headers.
$(HVD_STAMP): $(VENV_STAMP) $(HVD_PATCHES)
	@if ! ls $(HVD_WHEEL_GLOB) >/dev/null 2>&1; then \
	  if [ ! -x /usr/bin/cmake ] || ! command -v g++ >/dev/null 2>&1 || \
	     [ ! -f /usr/include/python3.11/Python.h ]; then \
	    echo "== installing cmake, g++ and python3-dev for the Horovod build"; \
	    $(APT_GET) update -qq && $(APT_GET) install -y -qq cmake g++ python3-dev; fi; \
	  echo "== building Horovod $(HVD_VERSION)+$(HVD_LABEL) with Gloo (once per machine, a few minutes) into $(WHEEL_CACHE)"; \
	  src=$$(mktemp -d); trap 'rm -rf "$$src"' EXIT; \
	  $(VPY) -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d $$src horovod==$(HVD_VERSION); \
	  tar xzf $$src/horovod-$(HVD_VERSION).tar.gz -C $$src; \
	  for p in $(HVD_PATCHES); do (cd $$src/horovod-$(HVD_VERSION) && git apply -p1 $(ROOT)/$$p); done; \
	  mkdir -p $(WHEEL_CACHE); \
	  cd $$src/horovod-$(HVD_VERSION) && PATH=/usr/bin:$$PATH $(HVD_ENV) HOROVOD_LOCAL_VERSION=$(HVD_LABEL) \
	    MAKEFLAGS=-j$$(nproc) $(VPY) -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
	    -w $(WHEEL_CACHE) .; \
	fi
	$(VPY) -m pip install -q --disable-pip-version-check $(HVD_WHEEL_GLOB)
	$(VPY) -c "import horovod.tensorflow"
	@touch $@

bazel:
	@if ! command -v $(BAZEL) >/dev/null 2>&1 || [ ! -f /usr/share/bazel/tools/platforms/BUILD ]; then \
	  echo "== installing Debian's bazel-bootstrap + bazel-platforms"; \
	  $(APT_GET) update -qq && $(APT_GET) install -y -qq bazel-bootstrap bazel-platforms; \
	fi

# Tiered storage's cold store builds against Debian's RocksDB 7.8 (headers + librocksdb.so; the runtime package
# librocksdb7.8 comes with it).
rocksdb:
	@if [ ! -f /usr/include/rocksdb/db.h ] || [ ! -e /usr/lib/x86_64-linux-gnu/librocksdb.so ]; then \
	  echo "== installing Debian's librocksdb-dev"; \
	  $(APT_GET) update -qq && $(APT_GET) install -y -qq librocksdb-dev; \
	fi

clang-format:
	@if ! command -v $(CLANG_FORMAT) >/dev/null 2>&1; then \
	  echo "== installing Debian's clang-format"; \
	  $(APT_GET) update -qq && $(APT_GET) install -y -qq clang-format; \
	fi

# ---------------------------------------------------------------- build
# The op library, the RocksDB store plugin + the wheel (dist/), and in-tree copies of both .so and _build_info.py for
# pytest from the root; the C++ serving check programs stay in bazel-bin/ (tensorflow_ext/serving/cc).
build: venv bazel rocksdb
	$(BAZEL) build $(BAZEL_FLAGS) //:build_pip_pkg //tensorflow_ext:_tf_ext_ops.so \
	  //tensorflow_ext/table/tiered:_tf_ext_rocksdb_store.so //tensorflow_ext/serving/cc:all
	@install -m 0755 bazel-bin/tensorflow_ext/_tf_ext_ops.so $(OPS_SO)
	@install -m 0755 bazel-bin/tensorflow_ext/table/tiered/_tf_ext_rocksdb_store.so $(STORE_SO)
	@install -m 0644 bazel-bin/tensorflow_ext/gen/_build_info.py $(BUILD_INFO)
	@mkdir -p dist && rm -f dist/tensorflow_ext-*.whl
	@PYTHON_BIN_PATH=$(VPY) bazel-bin/build_pip_pkg $(ROOT)/dist

wheel: build

# ---------------------------------------------------------------- format (one formatter per language)
.PHONY: format format-check-py
format-check-py: venv
	$(VPY) -m black --check --quiet tensorflow_ext tests tools python || \
	  { echo "Python files need formatting: run make format"; exit 1; }

format: venv
	$(VPY) -m black --quiet tensorflow_ext tests tools python

# ---------------------------------------------------------------- tests
test: format-check-py format-check-cc build test-cc cuda-ci horovod test-py

# C++ and CUDA sources must be formatted as .clang-format says (fix with: clang-format -i <files>).
format-check-cc: clang-format
	$(CLANG_FORMAT) --dry-run --Werror $(CC_FORMAT_SRCS)
	@echo "== C++ format: $(words $(CC_FORMAT_SRCS)) files clean"

# C++ unit tests (every cc_test under tensorflow_ext/; CUDA targets are skipped). The table core's tests run
# twice: optimized (:hash_table_test) and with its debug checks on (:hash_table_debugchecks_test).
test-cc: build
	$(BAZEL) test $(BAZEL_FLAGS) $$($(BAZEL) query --noshow_progress $(BAZEL_FLAGS) 'tests(//tensorflow_ext/...)')

# Two pytest workers (pytest-xdist; a test file stays on one worker): most tests are single-threaded graph
# building, so the machine's second core halves the suite's time.
PYTEST_WORKERS ?= 2
test-py: build horovod
	$(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tensorflow_ext tests

# CI: compile the CUDA sources where nvcc exists (nothing runs on a GPU there).
.PHONY: cuda-ci
cuda-ci:
	@if [ -n "$(NVCC)" ]; then $(MAKE) --no-print-directory cuda cuda-tf cuda-bazel; else echo "== nvcc not found: CUDA compile skipped"; fi

# ---------------------------------------------------------------- main job, benchmarks
demo: build horovod
	$(VPY) -m pip install -q --disable-pip-version-check --no-deps --force-reinstall dist/tensorflow_ext-*.whl
	@# From a neutral directory, so the installed wheel (not the source tree) is what runs.
	cd /tmp && TF_CPP_MIN_LOG_LEVEL=1 $(VPY) -m tensorflow_ext.examples.ctr

bench: build
	$(VPY) tools/bench_table.py $(BENCH_ARGS)

# ---------------------------------------------------------------- CUDA
# nvcc directly: the GPU table + extern "C" harness for tools/gpu/test_gpu_table.py (sm_80, sm_90).
cuda: $(GPU_LIB)

$(GPU_LIB): $(GPU_SRCS) $(GPU_HDRS)
	@[ -n "$(NVCC)" ] || { echo "nvcc not found (install the CUDA toolkit or set NVCC=...)"; exit 1; }
	@mkdir -p $(dir $@)
	@# --fmad=false: no fused multiply-add, so the device computes initial rows and optimizer updates with the
	@# same roundings as the CPU kernels.
	$(CXX) -std=c++17 -O3 -fPIC -pthread -I$(ROOT) -c -o $(dir $@)hash_table.o $(word 2,$(GPU_SRCS))
	$(NVCC) -std=c++17 -O3 --fmad=false -Werror all-warnings -Xcompiler -fPIC -Xcompiler -pthread -I$(ROOT) \
	  $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) -c -o $(dir $@)harness.o \
	  -x cu $(word 1,$(GPU_SRCS))
	$(NVCC) -shared -Xcompiler -pthread -o $@ $(dir $@)harness.o $(dir $@)hash_table.o
	@echo "== built $@ (test on a GPU machine: python tools/gpu/test_gpu_table.py --lib $@)"

# The DEVICE_GPU kernels of the table ops (needs the venv's TensorFlow for headers and the built op library for the
# check): compiled against the CPU wheel's headers, loaded into it and checked to register (they run only with a
# CUDA build of TensorFlow on a GPU).
.PHONY: cuda-tf
cuda-tf: $(TF_GPU_LIB)

$(TF_GPU_LIB): $(TF_GPU_SRC) $(GPU_HDRS) tensorflow_ext/table/kernels/column_range.h | build
	@[ -n "$(NVCC)" ] || { echo "nvcc not found (install the CUDA toolkit or set NVCC=...)"; exit 1; }
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 --fmad=false -Werror all-warnings -Xcompiler -fPIC -Xcompiler -pthread \
	  -DGOOGLE_CUDA=1 --expt-relaxed-constexpr -I$(ROOT) \
	  $$($(VPY) -c "import tensorflow as tf; print(' '.join(f.replace('-I', '-isystem ', 1) if f.startswith('-I') else f for f in tf.sysconfig.get_compile_flags() if not f.startswith('--std')))") \
	  $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) -c -o $(dir $@)gpu_table_kernels.o -x cu $(TF_GPU_SRC)
	$(NVCC) -shared -Xcompiler -pthread -o $@ $(dir $@)gpu_table_kernels.o \
	  $$($(VPY) -c "import tensorflow as tf; print(' '.join(tf.sysconfig.get_link_flags()))")
	$(VPY) tools/gpu/check_tf_gpu_kernels.py --lib $@

# The same through Bazel's --config=cuda (nvcc genrules, static cudart). The op library does not link the CUDA
# table (no kernel calls it), so there is no CUDA build of the op library to make.
cuda-bazel: bazel venv
	$(BAZEL) build $(BAZEL_FLAGS) --config=cuda //tensorflow_ext/table/gpu:all //tensorflow_ext/embedding/kernels/gpu:all

clean:
	-$(BAZEL) clean
	rm -rf dist build $(OPS_SO) $(STORE_SO) $(BUILD_INFO)
