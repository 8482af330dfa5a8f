"""How a 16-bit wire buffer (fp16, or bf16 as uint16 bit patterns) is summed across ranks.

Two ways exist on Horovod's Gloo backend (`allreduce._Reducer`):

* **ring**: Horovod's own allreduce in fp16 (Horovod has no bf16 reduction). Gloo's ring allreduce sends in both
  directions of every link at once and overlaps its sums with the transfers. It sums pairwise in fp16: every
  partial sum is rounded to fp16, in the ring's order (which differs between the elements of a buffer), so with
  more than 2 ranks a partial sum above 65504 becomes inf even where the total would not be. Stock Horovod 0.28.1
  converts each fp16 element in software before adding (its vendored Gloo never compiles its F16C loops); the
  Horovod that `make horovod` builds has them (third_party/horovod/gloo_f16c.patch), which makes this the fastest
  way to reduce fp16 (docs/benchmarks.md, "16-bit reduction").
* **bytes**: one alltoall of the buffer's slices, every rank's slice summed in float32 in rank order and rounded
  once (`compression_ops.sum_parts`, a vectorised kernel of the op library), one allgather of the summed slices.
  The same bytes cross the links as in the ring, but Gloo's alltoall and allgather keep a link busy for about as
  long as the float32 ring does on a shaped link, so the bytes saved pay less. The sum is at least as accurate as
  the ring's: one rounding to the wire dtype per element; only a total beyond the wire's range (65504 for fp16) is
  inf.

With 2 ranks the two give the same bits (the ring also rounds its one sum once). bf16 always goes as bytes. fp16
goes by the ring when the installed Horovod carries the F16C patch (its version has the local label
`+tfext.f16c...`), else as bytes (the scalar fp16 sum costs more CPU than the bytes way's longer link time on a busy
machine). `TF_EXT_HVD_FP16_REDUCTION` (ring or bytes) overrides this when a graph is built, to compare the two;
every rank must build its graph with the same value (the two ways run different collectives;
`DistributedOptimizer`'s settings check refuses ranks that differ before the first exchange, naming both values).

In both ways Inf and NaN stay non-finite (a sum with an Inf or NaN operand is Inf or NaN), so a mixed-precision
"skip the step when a gradient is not finite" still sees them.
"""

import importlib.metadata
import os

import tensorflow as tf

__all__ = [
    "F16C_LABEL",
    "FP16_REDUCTION_ENV",
    "FP16_REDUCTIONS",
    "default_fp16_reduction",
    "fp16_reduction",
    "gloo_sums_fp16_vectorised",
    "reduced_as_bytes",
]

FP16_REDUCTIONS = ("ring", "bytes")
FP16_REDUCTION_ENV = "TF_EXT_HVD_FP16_REDUCTION"
# The local version label `make horovod` gives the Horovod it builds with third_party/horovod/gloo_f16c.patch.
F16C_LABEL = "tfext.f16c"


def gloo_sums_fp16_vectorised(version=None):
    """Whether the installed Horovod (or the version string `version`) is the build with Gloo's F16C fp16 sums."""
    if version is None:
        try:
            version = importlib.metadata.version("horovod")
        except importlib.metadata.PackageNotFoundError:
            return False
    _, _, local = version.partition("+")
    return local == F16C_LABEL or local.startswith(F16C_LABEL + ".")


def default_fp16_reduction():
    """ring where Horovod's Gloo sums fp16 with F16C, else bytes."""
    return "ring" if gloo_sums_fp16_vectorised() else "bytes"


def fp16_reduction():
    """The way fp16 buffers are summed: `TF_EXT_HVD_FP16_REDUCTION` when set, else `default_fp16_reduction()`.

    Raises:
      ValueError: the variable holds something other than ring or bytes (named with its value).
    """
    value = os.environ.get(FP16_REDUCTION_ENV, "").strip().lower()
    if not value:
        return default_fp16_reduction()
    if value not in FP16_REDUCTIONS:
        raise ValueError(
            "environment variable %s=%r: expected one of %s"
            % (FP16_REDUCTION_ENV, os.environ[FP16_REDUCTION_ENV], ", ".join(FP16_REDUCTIONS))
        )
    return value


def reduced_as_bytes(wire16, dtype):
    """Whether a buffer of gradients of `dtype` with 16-bit wire `wire16` (None, tf.float16 or tf.bfloat16) is
    summed as bytes (alltoall, float32 sum, allgather) rather than by Horovod's allreduce."""
    if wire16 is None or not dtype.is_floating:
        return False
    if wire16 == tf.bfloat16:
        return True
    return fp16_reduction() == "bytes"
