"""Tiered storage of a dynamic embedding's tables: a bounded memory tier over an on-disk tier (`TieredStorage`).

    emb = tf_ext.get_dynamic_embedding(
        "user", dim=32, storage=tf_ext.TieredStorage(memory_bytes="1.5GB", path="/mnt/ssd/tiers"))

`TieredStorage` is a frozen value: the memory budget, the root directory of the stores, the disk cap and the policy
that picks which rows leave memory (and fall off disk) first. It is checked when built, every error naming the
argument and the value. `shard_tier` turns it into what one table shard gets (the ``tier`` of
`refs.MutableTableRef.create`, a `TieredStorage` too): its share of the budgets and its own store directory,

    <root>/<embedding name>/shard_<i>_of_<n>            (one process)
    <root>/rank_<r>/<embedding name>/shard_<i>_of_<n>   (a Horovod rank r: each process its own stores)

where `<root>` is the `TF_EXT_TIER_ROOT` environment variable when it is set (read when the graph is built) and
`path` otherwise; a relative root is made absolute against the current directory then. The shard's table records
that root too (`resolved_root`, the handle op's ``tier_root``): a process that creates the table with
`TF_EXT_TIER_ROOT` set puts the store under that root instead (a SavedModel served on another machine, a parameter
server task). Budgets are split evenly over the embedding's shards; they are per process (every Horovod rank has its
own budget).

A store directory is a cache of the table (the checkpoint is the source of truth): it is wiped when a table opens
it, a directory that is not a store is refused, and one process at a time holds it. docs/tiered_storage.md has the
concepts. This module does not import TensorFlow.
"""

import dataclasses
import math
import numbers
import os
import re
import sys

__all__ = ["ENV_ROOT", "POLICIES", "TieredStorage", "parse_bytes"]

# The environment variable that replaces every TieredStorage's path when a graph is built.
ENV_ROOT = "TF_EXT_TIER_ROOT"
# Which rows leave the memory tier (and the disk tier, at its cap) first: the least recently updated ("lru", by the
# per-key version, the step of the last update) or the least frequently looked up ("lfu", by the per-key frequency,
# then the version). The ops' `tier_policy` attr takes these names.
POLICIES = ("lru", "lfu")

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value, what):
    """A size in bytes, from an int or a string with a unit.

    Args:
      value: a number of bytes (an int, or a float such as 1.5e9 or 1.5 * 2**30), or a string: a number and an
        optional unit, decimal ("KB", "MB", "GB", "TB": powers of 1000) or binary ("KiB", "MiB", "GiB", "TiB": powers
        of 1024), case-insensitive, e.g. "1.5GB", "512 MiB", "4096". A fractional size is rounded down to whole
        bytes.
      what: how errors name the value (e.g. "TieredStorage memory_bytes").

    Returns:
      int >= 1.

    Raises:
      TypeError: neither a number nor a string (a bool included).
      ValueError: a string that is no size, an unknown unit, a size below one byte, or a number that is not finite.
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise TypeError(
            "%s must be a number of bytes or a string with a unit such as '512MB' or '1.5GiB', got %r" % (what, value)
        )
    if isinstance(value, str):
        m = _SIZE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                "%s must be a size such as '512MB', '1.5GB' or '2GiB' (units B, KB, MB, GB, TB in powers of 1000; "
                "KiB, MiB, GiB, TiB in powers of 1024), got %r" % (what, value)
            )
        size = math.floor(float(m.group(1)) * _UNITS[unit])
    elif isinstance(value, numbers.Integral):
        size = int(value)
    elif math.isfinite(value):
        size = math.floor(value)
    else:
        raise ValueError("%s must be a finite number of bytes, got %r" % (what, value))
    if size < 1:
        raise ValueError("%s must be at least 1 byte, got %r" % (what, value))
    return size


def _horovod_rank():
    """This process's Horovod rank when Horovod is imported and initialized, else None (no import of Horovod)."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        if not hvd.is_initialized():
            return None
        return int(hvd.rank())
    except Exception:  # pylint: disable=broad-except  (a Horovod that cannot answer is no Horovod run)
        return None


@dataclasses.dataclass(frozen=True)
class TieredStorage(object):
    """Where a dynamic embedding's rows live: up to `memory_bytes` in memory, the rest on disk under `path`.

    Pass it as `tf_ext.get_dynamic_embedding(..., storage=TieredStorage(...))` (or to the feature columns and the
    TFRA module, which take the same `storage=`). Training is bit-identical to an all-in-memory embedding as long as
    no key falls off a capped disk tier.

    Attributes:
      memory_bytes: the memory tier's budget for the embedding in this process (all its shards together; each
        shard gets an even share): a number of bytes, or a string with a unit ("1.5GB", "512MiB"; see
        `parse_bytes`); kept as an int. Rows beyond it move to disk, least recently (or frequently) used first.
      path: the root directory of the embedding's stores (each shard a directory below it; created if missing).
        `TF_EXT_TIER_ROOT` replaces it when set (when the graph is built, and again when a process creates the
        tables).
      disk_bytes: the disk tier's cap (all shards together), as memory_bytes; None (default): unbounded. Keys
        beyond it fall off disk by `policy` and are gone (counted in the tier statistics).
      policy: "lru" (default: the rows least recently updated leave first) or "lfu" (the least frequently looked
        up, then the least recently updated).
      resolved_root: not an argument: None, except in what `shard_tier` returns, where it is the root directory
        (absolute) that `path` was resolved under. The table replaces that prefix of `path` with
        `TF_EXT_TIER_ROOT` if the variable is set in the process that creates the table.

    Raises:
      TypeError, ValueError: an argument of the wrong type or out of range (the message names it and the value).
    """

    memory_bytes: object
    path: object
    disk_bytes: object = None
    policy: str = "lru"
    resolved_root: object = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        memory = parse_bytes(self.memory_bytes, "TieredStorage memory_bytes")
        disk = None if self.disk_bytes is None else parse_bytes(self.disk_bytes, "TieredStorage disk_bytes")
        path = self.path
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if isinstance(path, bytes) or not isinstance(path, str):
            raise TypeError("TieredStorage path must be a directory name (a str or os.PathLike), got %r" % (path,))
        if not path:
            raise ValueError("TieredStorage path must be a non-empty directory name, got %r" % (path,))
        if "\0" in path:
            raise ValueError("TieredStorage path must not contain a NUL character, got %r" % (path,))
        if self.policy not in POLICIES:
            raise ValueError(
                "TieredStorage policy must be one of %s, got %r" % (", ".join(repr(p) for p in POLICIES), self.policy)
            )
        object.__setattr__(self, "memory_bytes", memory)
        object.__setattr__(self, "disk_bytes", disk)
        object.__setattr__(self, "path", path)

    def root(self):
        """The root directory the stores go under now: `TF_EXT_TIER_ROOT` if set (non-empty), else `path`; made
        absolute against the current directory."""
        return os.path.abspath(os.environ.get(ENV_ROOT) or self.path)

    def check_shards(self, embedding_name, num_shards):
        """Raises a ValueError naming the embedding when `num_shards` shards would get no memory (or disk) each."""
        for what, total in (("memory_bytes", self.memory_bytes), ("disk_bytes", self.disk_bytes)):
            if total is not None and total < num_shards:
                raise ValueError(
                    "storage of dynamic embedding %r: TieredStorage %s=%d is split over its %d shards, which leaves "
                    "less than one byte per shard: give at least %d bytes"
                    % (embedding_name, what, total, num_shards, num_shards)
                )

    def shard_directory(self, embedding_name, shard_index, num_shards, rank=None):
        """The store directory of one shard: `<root>[/rank_<r>]/<embedding name>/shard_<i>_of_<n>`.

        Args:
          embedding_name: the embedding's full name (its "/"-separated scopes become directories).
          shard_index, num_shards: the shard's place in the embedding.
          rank: the Horovod rank (each rank its own stores), or None: this process's rank if Horovod is initialized,
            else no rank directory. Pass -1 for no rank directory whatever the process is.

        Returns:
          An absolute path (str).
        """
        return _shard_directory(self.root(), embedding_name, shard_index, num_shards, rank)

    def shard_tier(self, embedding_name, shard_index, num_shards, rank=None):
        """What one shard's table gets (the ``tier`` argument of `refs.MutableTableRef.create`): a `TieredStorage`
        whose path is the shard's store directory and whose budgets are the shard's even share (rounded down).

        Args:
          embedding_name, shard_index, num_shards, rank: as for `shard_directory`.

        Returns:
          A `TieredStorage` (its path absolute, its `resolved_root` the root the path is under).

        Raises:
          ValueError: a budget smaller than one byte per shard.
        """
        self.check_shards(embedding_name, num_shards)
        root = self.root()
        shard = TieredStorage(
            memory_bytes=self.memory_bytes // num_shards,
            path=_shard_directory(root, embedding_name, shard_index, num_shards, rank),
            disk_bytes=None if self.disk_bytes is None else self.disk_bytes // num_shards,
            policy=self.policy,
        )
        object.__setattr__(shard, "resolved_root", root)
        return shard


def _shard_directory(root, embedding_name, shard_index, num_shards, rank):
    """`TieredStorage.shard_directory` under `root`."""
    if rank is None:
        rank = _horovod_rank()
    parts = [root]
    if rank is not None and rank >= 0:
        parts.append("rank_%d" % rank)
    parts.extend(p for p in embedding_name.split("/") if p)
    parts.append("shard_%d_of_%d" % (shard_index, num_shards))
    return os.path.join(*parts)
