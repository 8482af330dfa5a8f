"""Build macros of tensorflow_ext: custom_op_library, cuda_library, and copts helpers.

  load("//tensorflow_ext:tensorflow_ext.bzl", "custom_op_library", "cuda_library", "tf_ext_copts", "if_cuda")

Kernel libraries of a subsystem are cc_library targets with `copts = tf_ext_copts()` and
`deps = ["@local_config_tf//:tf_header_lib"]`; //tensorflow_ext:_tf_ext_ops.so links them all (alwayslink = 1).
CUDA sources (*.cu.cc) go through cuda_library (nvcc via a genrule); they are compiled only with --config=cuda
(which sets --define=using_cuda=true and --define=cuda_archs=80,90) and skipped otherwise.
"""

load("@local_config_tf//:tf_config.bzl", "TF_CXX_FLAGS")
load("@local_config_cuda//:cuda_config.bzl", "HAS_CUDA", "NVCC_PATH")

_USING_CUDA = "//tensorflow_ext:using_cuda"

def if_cuda(if_true, if_false = []):
    """select() on --config=cuda."""
    return select({
        _USING_CUDA: if_true,
        "//conditions:default": if_false,
    })

def tf_ext_copts():
    """Compiler flags for any C++ source that includes TensorFlow headers."""
    return TF_CXX_FLAGS + [
        "-pthread",
        "-fPIC",
        "-Wno-unused-result",
        "-Wno-unknown-pragmas",
        "-Wno-ignored-attributes",
    ] + if_cuda(["-DGOOGLE_CUDA=1"])

def _incompatible_without_cuda():
    return select({
        _USING_CUDA: [],
        "//conditions:default": ["@platforms//:incompatible"],
    })

def cuda_library(name, srcs, hdrs = [], deps = [], extra_hdrs = [], copts = [], include_tf = False, visibility = None, **kwargs):
    """CUDA sources compiled by nvcc (through a genrule) into a static library, wrapped as cc_library `name`.

    Only built with --config=cuda: without it the targets are incompatible (skipped by `bazel build //...`), so
    depend on them through if_cuda(). Objects are PIC (they go into shared op libraries) and link the static
    CUDA runtime. `deps` are cc_library deps for the C++ side (headers, other libs). nvcc sees only the files
    the genrule lists: headers of other packages it includes go in `extra_hdrs` (file or filegroup labels,
    e.g. //tensorflow_ext/table/core:base_headers), with their cc_library in `deps`.
    """
    nvcc = NVCC_PATH if HAS_CUDA else "nvcc"
    tf_flags = []
    extra_srcs = []
    if include_tf:
        tf_flags = ["-Iexternal/local_config_tf/include", "-Iexternal/local_config_cuda"]
        extra_srcs = ["@local_config_tf//:tf_headers_files"]
    flags = " ".join(
        [
            "-x cu",
            "-O3",
            "-Xcompiler -fPIC",
            "-DGOOGLE_CUDA=1",
            "--expt-relaxed-constexpr",
            "-I.",
            "-I$(GENDIR)",
        ] + TF_CXX_FLAGS + tf_flags + copts,
    )
    cmds = [
        "set -e",
        "TMP=$$(mktemp -d)",
        "trap 'rm -rf $$TMP' EXIT",
        "GENCODE=''",
        "for a in $$(echo '$(cuda_archs)' | tr ',' ' '); do GENCODE=\"$$GENCODE -gencode arch=compute_$$a,code=sm_$$a\"; done",
    ]
    for i, src in enumerate(srcs):
        cmds.append("'%s' -c %s $$GENCODE $(location %s) -o $$TMP/%d.o" % (nvcc, flags, src, i))
    cmds.append("ar rcs $@ $$TMP/*.o")

    # .lo: Bazel links it whole-archive (alwayslink), so extern "C" entry points and kernels are kept.
    lib = "lib%s_cuda.lo" % name
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + extra_hdrs + extra_srcs,
        outs = [lib],
        cmd = "; ".join(cmds),
        message = "nvcc %s" % name,
        target_compatible_with = _incompatible_without_cuda(),
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [lib],
        hdrs = hdrs,
        deps = deps + [
            "@local_config_cuda//:cuda_headers",
            "@local_config_cuda//:cudart_static",
        ],
        alwayslink = 1,
        linkstatic = 1,
        target_compatible_with = _incompatible_without_cuda(),
        visibility = visibility,
        **kwargs
    )

def custom_op_library(name, srcs = [], deps = [], cuda_srcs = [], cuda_hdrs = [], cuda_deps = [], copts = [], linkopts = [], **kwargs):
    """A TensorFlow custom-op shared library (cc_binary linkshared) against @local_config_tf.

    cuda_srcs (*.cu.cc) are compiled by nvcc with --config=cuda (and skipped otherwise), as are the
    cuda_library targets in cuda_deps; with --config=cuda everything is also compiled with -DGOOGLE_CUDA=1.
    """
    gpu_deps = list(cuda_deps)
    if cuda_srcs:
        base = name[:-3] if name.endswith(".so") else name
        cuda_library(
            name = base + "_gpu",
            srcs = cuda_srcs,
            hdrs = cuda_hdrs,
            include_tf = True,
        )
        gpu_deps.append(":" + base + "_gpu")

    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + [
            "@local_config_tf//:tf_header_lib",
            "@local_config_tf//:libtensorflow_framework",
        ] + if_cuda(gpu_deps + ["@local_config_cuda//:cuda_headers"]),
        copts = copts + tf_ext_copts(),
        # TF is loaded before us anyway; the rpath lets a plain dlopen of the installed .so find TF's framework too.
        linkopts = linkopts + ["-pthread", "-Wl,-rpath,$$ORIGIN/../tensorflow"],
        linkshared = 1,
        linkstatic = 1,
        **kwargs
    )
