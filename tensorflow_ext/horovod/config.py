"""The settings of the dense allreduce (`DistributedOptimizer`'s arguments, each overridden by its environment
variable) and the compressors they name. `allreduce` reduces by them; nothing here builds a graph.

The environment overrides the arguments: `TF_EXT_HVD_COMPRESSION` (none, fp16, bf16, auto), `TF_EXT_HVD_HIERARCHICAL`
(0/1), `TF_EXT_HVD_NODE_SIZE`, `TF_EXT_HVD_TOPK_RATIO` (a number in (0, 1], or "none"),
`TF_EXT_HVD_TOPK_MIN_ELEMENTS`, `TF_EXT_HVD_TOPK_WARMUP_STEPS`, `TF_EXT_HVD_TOPK_MOMENTUM`,
`TF_EXT_HVD_TOPK_CLIP_NORM`, `TF_EXT_HVD_TOPK_RATIO_WARMUP_STEPS`, `TF_EXT_HVD_TOPK_FLUSH_STEPS`,
`TF_EXT_HVD_FUSION_BYTES`, `TF_EXT_HVD_INTRA_NODE`
(auto, shm, gloo: the 2D allreduce's stages inside a node), `TF_EXT_HVD_SHM_TIMEOUT_S`.
"""

import os

import numpy as np
import tensorflow as tf

from tensorflow_ext.horovod import _hvd

__all__ = [
    "AutoCompressor",
    "BF16Compressor",
    "Compression",
    "Config",
    "DEFAULT_FUSION_BYTES",
    "DEFAULT_SHM_TIMEOUT_S",
    "DEFAULT_TOPK_MIN_ELEMENTS",
    "ENV_PREFIX",
    "FP16Compressor",
    "INTRA_NODE_MODES",
    "NoneCompressor",
    "TOPK_RESIDUALS",
    "env_value",
    "parse_bool",
    "parse_int",
    "resolve_config",
]

DEFAULT_FUSION_BYTES = 64 << 20
DEFAULT_TOPK_MIN_ELEMENTS = 1024

# How the 2D allreduce reduces inside a node (`shm_allreduce`): "shm" through shared memory (the node's ranks share
# a host), "gloo" with Horovod's collectives on the node's process set, "auto" shm where the node's ranks share a
# host, else gloo.
INTRA_NODE_MODES = ("auto", "shm", "gloo")

# Seconds a rank waits at a shared-memory barrier for the other ranks of its node before the step fails naming the
# missing ones: longer than any legitimate skew between a node's ranks (a checkpoint that one rank writes alone).
DEFAULT_SHM_TIMEOUT_S = 600.0

# Graph collection of the Top-K residual variables (per-rank state: saved and restored, never broadcast).
TOPK_RESIDUALS = "tf_ext_topk_residuals"

ENV_PREFIX = "TF_EXT_HVD_"


class NoneCompressor(object):
    """No compression (the default)."""

    name = "none"
    wire_dtype = None

    @staticmethod
    def compress(tensor):
        """Returns (tensor, None)."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns tensor."""
        del ctx
        return tensor


class _CastCompressor(object):
    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        """Casts a floating tensor to the 16-bit type; returns (compressed, original dtype)."""
        if tensor.dtype.is_floating and tensor.dtype != cls.wire_dtype:
            return tf.cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Casts back to the dtype the tensor had before `compress`."""
        return tf.cast(tensor, ctx) if tensor.dtype != ctx else tensor


class FP16Compressor(_CastCompressor):
    """IEEE half precision on the wire: 10-bit mantissa, largest finite value 65504 (larger sums become inf)."""

    name = "fp16"
    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """bfloat16 on the wire: float32's range, 7-bit mantissa (summed in float32 on the receiving rank)."""

    name = "bf16"
    wire_dtype = tf.bfloat16


class AutoCompressor(object):
    """Chosen per fused buffer by measuring the link and the compression cost before the first step: plain, fp16,
    bf16, or Top-K when `topk_ratio` is given (`tensorflow_ext.horovod.auto_compression`)."""

    name = "auto"
    wire_dtype = None


class Compression(object):
    """Compression of dense gradients in `DistributedOptimizer` (like Horovod's `Compression`, plus bf16 and auto)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    auto = AutoCompressor


_BY_NAME = {"none": NoneCompressor, "fp16": FP16Compressor, "bf16": BF16Compressor, "auto": AutoCompressor}


def _compressor(value):
    """Our compressor for `value`: one of ours, Horovod's none/fp16, or a name; None for anything else."""
    hvd = _hvd.require_horovod()
    if value is None:
        return NoneCompressor
    if isinstance(value, str):
        return _BY_NAME.get(value.strip().lower())
    if value in (NoneCompressor, FP16Compressor, BF16Compressor, AutoCompressor):
        return value
    if value is hvd.Compression.none:
        return NoneCompressor
    if value is hvd.Compression.fp16:
        return FP16Compressor
    return None


class Config(object):
    """The resolved settings of the dense allreduce (arguments, then the environment's overrides).

    Attributes:
      compression: NoneCompressor, FP16Compressor or BF16Compressor.
      horovod_compression: the `compression` argument as given when it is a Horovod compressor (the per-tensor
        Horovod path passes it on unchanged), else None.
      hierarchical: bool.
      node_size: int or None (None: Horovod's local_size).
      topk_ratio: float in (0, 1] or None.
      topk_min_elements: int.
      topk_warmup_steps: int.
      topk_momentum: float in [0, 1): Top-K's momentum correction (0: off).
      topk_clip_norm: float > 0 or None: Top-K's local gradient clipping (global norm, divided by sqrt(ranks)).
      topk_ratio_warmup_steps: int: steps over which Top-K's ratio falls from 25% to topk_ratio (0: off).
      topk_flush_steps: int: every this many steps Top-K is dense and clears the residuals (0: never).
      fusion_bytes: int.
      explicit_compression: True when our compression was asked for (argument of ours, or the environment).
      intra_node: "auto", "shm" or "gloo" (the 2D allreduce's stages inside a node; see `shm_allreduce`).
      shm_timeout_s: float, the longest wait at a shared-memory barrier (TF_EXT_HVD_SHM_TIMEOUT_S only).
    """

    def __init__(self):
        self.compression = NoneCompressor
        self.horovod_compression = None
        self.hierarchical = False
        self.node_size = None
        self.topk_ratio = None
        self.topk_min_elements = DEFAULT_TOPK_MIN_ELEMENTS
        self.topk_warmup_steps = 0
        self.topk_momentum = 0.0
        self.topk_clip_norm = None
        self.topk_ratio_warmup_steps = 0
        self.topk_flush_steps = 0
        self.fusion_bytes = DEFAULT_FUSION_BYTES
        self.explicit_compression = False
        self.intra_node = "auto"
        self.shm_timeout_s = DEFAULT_SHM_TIMEOUT_S

    @property
    def accelerated(self):
        """True when gradients go through this module (else Horovod's per-tensor allreduce, as before)."""
        return self.explicit_compression or self.hierarchical or self.topk_ratio is not None

    # Every setting a rank resolves, in the order the repr and the cross-rank settings check show them.
    SETTING_FIELDS = (
        "compression",
        "hierarchical",
        "node_size",
        "topk_ratio",
        "topk_min_elements",
        "topk_warmup_steps",
        "topk_momentum",
        "topk_clip_norm",
        "topk_ratio_warmup_steps",
        "topk_flush_steps",
        "fusion_bytes",
        "intra_node",
    )

    def __repr__(self):
        values = {name: getattr(self, name) for name in self.SETTING_FIELDS}
        values["compression"] = self.compression.name
        return "Config(%s)" % ", ".join("%s=%s" % (name, values[name]) for name in self.SETTING_FIELDS)


def env_value(name):
    value = os.environ.get(ENV_PREFIX + name)
    return None if value is None or value.strip() == "" else value.strip()


def parse_bool(name, value):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("%s must be a boolean (0/1, true/false), got %r" % (name, value))


def parse_int(name, value, minimum):
    try:
        out = int(str(value).strip()) if not isinstance(value, int) or isinstance(value, bool) else value
    except ValueError:
        raise ValueError("%s must be an integer >= %d, got %r" % (name, minimum, value)) from None
    if isinstance(value, bool) or out < minimum:
        raise ValueError("%s must be an integer >= %d, got %r" % (name, minimum, value))
    return out


def _parse_choice(name, value, choices):
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text not in choices:
        raise ValueError("%s must be one of %s, got %r" % (name, ", ".join(choices), value))
    return text


def _parse_float(name, value, low, high, what):
    """A float in [low, high) (high None: no bound), or None for None / "none" / "off" where None is allowed."""
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in ("none", "off"):
        value = None
    if value is None:
        return None
    try:
        out = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        out = float("nan")
    if not (out >= low and (high is None or out < high)):
        raise ValueError("%s must be %s, got %r" % (name, what, value))
    return out


def _topk_settings(c, momentum, clip_norm, ratio_warmup_steps, flush_steps):
    """Top-K's Deep Gradient Compression settings (`topk`) into Config `c`, each overridden by its variable."""
    env = env_value("TOPK_MOMENTUM")
    name = ENV_PREFIX + "TOPK_MOMENTUM" if env is not None else "topk_momentum"
    value = _parse_float(name, env if env is not None else momentum, 0.0, 1.0, "a number in [0, 1)")
    c.topk_momentum = 0.0 if value is None else value
    env = env_value("TOPK_CLIP_NORM")
    name = ENV_PREFIX + "TOPK_CLIP_NORM" if env is not None else "topk_clip_norm"
    c.topk_clip_norm = _parse_float(name, env if env is not None else clip_norm, 0.0, None, "a number > 0 or None")
    if c.topk_clip_norm == 0.0:
        raise ValueError("%s must be a number > 0 or None, got %r" % (name, env if env is not None else clip_norm))
    for attr, arg in (("ratio_warmup_steps", ratio_warmup_steps), ("flush_steps", flush_steps)):
        env = env_value("TOPK_" + attr.upper())
        name = ENV_PREFIX + "TOPK_" + attr.upper() if env is not None else "topk_" + attr
        setattr(c, "topk_" + attr, parse_int(name, env if env is not None else arg, 0))


def parse_ratio(name, value):
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in ("none", "off"):
            return None
        try:
            value = float(value)
        except ValueError:
            raise ValueError("%s must be a number in (0, 1] or 'none', got %r" % (name, value)) from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError("%s must be a number in (0, 1] or None, got %r" % (name, value))
    value = float(value)
    if not (0.0 < value <= 1.0):
        raise ValueError(
            "%s must be in (0, 1] (the fraction of each gradient's entries that every rank sends), got %r"
            % (name, value)
        )
    return value


def resolve_config(
    compression=None,
    hierarchical=False,
    node_size=None,
    topk_ratio=None,
    topk_min_elements=DEFAULT_TOPK_MIN_ELEMENTS,
    topk_warmup_steps=0,
    fusion_bytes=DEFAULT_FUSION_BYTES,
    topk_momentum=0.0,
    topk_clip_norm=None,
    topk_ratio_warmup_steps=0,
    topk_flush_steps=0,
    intra_node="auto",
):
    """The settings from `DistributedOptimizer`'s arguments, each overridden by its `TF_EXT_HVD_*` variable.

    Args:
      compression: `Compression.none/fp16/bf16`, Horovod's `Compression.none/fp16`, a name, or None.
      hierarchical: bool: 2D allreduce.
      node_size: ranks per node for the 2D allreduce (None: Horovod's local_size). Giving it turns the 2D
        allreduce on.
      topk_ratio: None (off) or the fraction in (0, 1] of each large gradient's entries sent per step.
      topk_min_elements: gradients with fewer entries are reduced densely.
      topk_warmup_steps: dense steps before Top-K starts (needs the global step).
      fusion_bytes: the largest fused buffer in bytes (0: one buffer per gradient).
      topk_momentum, topk_clip_norm, topk_ratio_warmup_steps, topk_flush_steps: Top-K's momentum correction,
        local gradient clipping, ratio warm-up and dense flushes (`tensorflow_ext.horovod.topk`); off by default.
      intra_node: how the 2D allreduce reduces inside a node: "auto" (shared memory where the node's ranks share a
        host, else Horovod's collectives), "shm" (shared memory; an error where the node's ranks do not share a
        host) or "gloo" (Horovod's collectives on the node's process set).

    Returns:
      A `Config`.

    Raises:
      ValueError: a setting out of range or an unknown compression, naming the argument or variable.
    """
    c = Config()
    env = env_value("COMPRESSION")
    if env is not None:
        comp = _compressor(env)
        if comp is None:
            raise ValueError("%sCOMPRESSION must be one of none, fp16, bf16, auto, got %r" % (ENV_PREFIX, env))
        c.compression, c.explicit_compression = comp, comp is not NoneCompressor
    else:
        comp = _compressor(compression)
        hvd = _hvd.require_horovod()
        if comp is None and not isinstance(compression, str) and hasattr(compression, "compress"):
            # Another Horovod compressor: Horovod's per-tensor allreduce applies it, as in Horovod.
            c.horovod_compression = compression
        elif comp is None:
            raise ValueError(
                "compression must be tensorflow_ext.horovod.Compression.none, .fp16, .bf16 or .auto (or a "
                "Horovod compressor), got %r" % (compression,)
            )
        elif compression in (hvd.Compression.none, hvd.Compression.fp16):
            c.compression = comp
            c.horovod_compression = compression
        else:
            c.compression = comp
            c.explicit_compression = comp is not NoneCompressor
    c.hierarchical = parse_bool("hierarchical", hierarchical)
    if node_size is not None:
        c.node_size = parse_int("node_size", node_size, 1)
        c.hierarchical = True
    env = env_value("HIERARCHICAL")
    if env is not None:
        c.hierarchical = parse_bool(ENV_PREFIX + "HIERARCHICAL", env)
    env = env_value("NODE_SIZE")
    if env is not None:
        c.node_size = parse_int(ENV_PREFIX + "NODE_SIZE", env, 1)
        if env_value("HIERARCHICAL") is None:
            c.hierarchical = True
    env = env_value("TOPK_RATIO")
    c.topk_ratio = (
        parse_ratio(ENV_PREFIX + "TOPK_RATIO", env) if env is not None else parse_ratio("topk_ratio", topk_ratio)
    )
    env = env_value("TOPK_MIN_ELEMENTS")
    c.topk_min_elements = parse_int(
        ENV_PREFIX + "TOPK_MIN_ELEMENTS" if env is not None else "topk_min_elements",
        env if env is not None else topk_min_elements,
        1,
    )
    env = env_value("TOPK_WARMUP_STEPS")
    c.topk_warmup_steps = parse_int(
        ENV_PREFIX + "TOPK_WARMUP_STEPS" if env is not None else "topk_warmup_steps",
        env if env is not None else topk_warmup_steps,
        0,
    )
    _topk_settings(c, topk_momentum, topk_clip_norm, topk_ratio_warmup_steps, topk_flush_steps)
    env = env_value("FUSION_BYTES")
    c.fusion_bytes = parse_int(
        ENV_PREFIX + "FUSION_BYTES" if env is not None else "fusion_bytes",
        env if env is not None else fusion_bytes,
        0,
    )
    env = env_value("INTRA_NODE")
    c.intra_node = _parse_choice(
        ENV_PREFIX + "INTRA_NODE" if env is not None else "intra_node",
        env if env is not None else intra_node,
        INTRA_NODE_MODES,
    )
    env = env_value("SHM_TIMEOUT_S")
    if env is not None:
        try:
            c.shm_timeout_s = float(env)
        except ValueError:
            c.shm_timeout_s = float("nan")
        if not c.shm_timeout_s > 0:
            raise ValueError("%sSHM_TIMEOUT_S must be a number of seconds > 0, got %r" % (ENV_PREFIX, env))
    if c.explicit_compression or c.hierarchical or c.topk_ratio is not None:
        if c.horovod_compression is not None and _compressor(c.horovod_compression) is None:
            raise ValueError(
                "compression=%r is a Horovod compressor that the fused paths (hierarchical, topk_ratio) cannot "
                "apply; use tensorflow_ext.horovod.Compression.none, .fp16 or .bf16" % (c.horovod_compression,)
            )
        c.horovod_compression = None
    if c.compression is AutoCompressor and c.hierarchical:
        raise ValueError(
            "compression='auto' chooses among the flat reductions; it cannot be combined with the 2D allreduce "
            "(hierarchical=True or node_size=%s): choose the compression explicitly with hierarchical" % c.node_size
        )
    return c
