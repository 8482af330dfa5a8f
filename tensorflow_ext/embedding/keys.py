"""Keys of dynamic embeddings: string fingerprints, the key hash, and the partition of keys into parts.

Every place that splits keys (the shards of one embedding in a process, the ranks of a model-parallel
embedding under Horovod, restore and warm start re-partitioning) uses `HashPartition`, so they agree on where a
key lives.
"""

import numpy as np
import tensorflow as tf

from tensorflow_ext.embedding import embedding_ops

__all__ = ["HashPartition", "hash_key_shard_ids", "hash_key_numpy", "string_to_key"]

_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def string_to_key(strings, name=None):
    """Maps strings to the int64 keys a string-keyed dynamic embedding stores.

    The key of a string is its 64-bit FarmHash fingerprint
    (``tf.fingerprint(..., method="farmhash64")``, the 8 bytes bitcast to int64).
    Distinct strings collide with probability ~n^2 / 2^65 (about 3e-8 for a
    billion strings). The mapping is stable across processes and versions of
    tensorflow_ext, so checkpoints of string embeddings hold these int64 keys.

    Args:
      strings: a string tensor of any shape.
      name: optional name scope.

    Returns:
      An int64 tensor of the same shape.
    """
    with tf.name_scope(name or "string_to_key"):
        strings = tf.convert_to_tensor(strings, dtype=tf.string)
        flat = tf.reshape(strings, [-1])
        fp = tf.fingerprint(flat, method="farmhash64")  # [n, 8] uint8
        keys = tf.bitcast(fp, tf.int64)  # [n]
        out = tf.reshape(keys, tf.shape(strings))
        out.set_shape(strings.shape)
        return out


def _u64(value):
    return tf.constant(np.uint64(value), tf.uint64)


def hash_key_shard_ids(keys, num_shards):
    """`HashKey(key) % num_shards` computed with TF ops (same result as the TfExtShardIndex op).

    HashKey is the table core's 64-bit mixer (the splitmix64 finalizer):
    z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb;
    z ^= z >> 31, on the key's bits as uint64.

    Args:
      keys: int64 tensor.
      num_shards: python int >= 1.

    Returns:
      int32 tensor of keys' shape.
    """
    z = tf.bitcast(keys, tf.uint64)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(30))) * _u64(_MIX1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(27))) * _u64(_MIX2)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(31)))
    return tf.cast(tf.math.floormod(z, _u64(num_shards)), tf.int32)


def hash_key_numpy(keys):
    """HashKey of int64 keys in numpy (uint64 array), for offline tools and tests."""
    z = np.asarray(keys, np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
        z = z ^ (z >> np.uint64(31))
    return z


class HashPartition(object):
    """Which of `num_parts` parts each int64 key belongs to: ``HashKey(key ^ salt) % num_parts``.

    One object per way of splitting keys: an embedding's shards use salt 0 (the TfExtShardIndex op); a
    model-parallel embedding's ranks use another salt, so the two splits are independent (with salt 0 for both,
    2 ranks x 2 shards would put every key of a rank in one of its shards).

    Args:
      num_parts: int >= 1.
      salt: int in [0, 2^64), XORed into the key before hashing.
    """

    def __init__(self, num_parts, salt=0):
        if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)) or num_parts < 1:
            raise ValueError("num_parts must be an int >= 1, got %r" % (num_parts,))
        self._num_parts = int(num_parts)
        self._salt = int(salt) & 0xFFFFFFFFFFFFFFFF

    @property
    def num_parts(self):
        """The number of parts."""
        return self._num_parts

    @property
    def salt(self):
        """The salt XORed into keys before hashing."""
        return self._salt

    def _salted(self, keys):
        if not self._salt:
            return keys
        return tf.bitwise.bitwise_xor(keys, tf.constant(np.uint64(self._salt).view(np.int64), tf.int64))

    def part_ids(self, keys):
        """The part of each key.

        Args:
          keys: int64 tensor of any shape.

        Returns:
          int32 tensor of keys' shape (zeros for one part).
        """
        keys = tf.convert_to_tensor(keys, tf.int64)
        if self._num_parts == 1:
            return tf.zeros_like(keys, dtype=tf.int32)
        if not self._salt:
            return embedding_ops.shard_index(keys, tf.constant(self._num_parts, tf.int32))
        return hash_key_shard_ids(self._salted(keys), self._num_parts)

    def part_ids_numpy(self, keys):
        """`part_ids` in numpy (int32 array)."""
        salted = np.asarray(keys, np.int64) ^ np.uint64(self._salt).view(np.int64)
        return (hash_key_numpy(salted) % np.uint64(self._num_parts)).astype(np.int32)

    def split(self, keys):
        """Splits int64 keys [n] by part.

        Args:
          keys: int64 vector.

        Returns:
          (list of num_parts key vectors, list of their positions in `keys`), or ([keys], None) for one part.
        """
        if self._num_parts == 1:
            return [keys], None
        ids = self.part_ids(keys)
        parts = tf.dynamic_partition(keys, ids, self._num_parts)
        positions = tf.dynamic_partition(tf.range(tf.size(keys)), ids, self._num_parts)
        return parts, positions

    @staticmethod
    def stitch(positions, values):
        """Inverse of `split` for per-part results (rows in the order of each part).

        Args:
          positions: the positions `split` returned (None for one part).
          values: list of per-part tensors.

        Returns:
          The values in the original key order.
        """
        return values[0] if positions is None else tf.dynamic_stitch(positions, values)

    def __eq__(self, other):
        return isinstance(other, HashPartition) and (other.num_parts, other.salt) == (self._num_parts, self._salt)

    def __hash__(self):
        return hash((self._num_parts, self._salt))

    def __repr__(self):
        return "HashPartition(num_parts=%d, salt=%#x)" % (self._num_parts, self._salt)
