"""Dynamic embeddings for TF1 graph mode (``tf_ext.get_dynamic_embedding``).

    import tensorflow as tf
    import tensorflow_ext as tf_ext
    tf.compat.v1.disable_v2_behavior()

    emb = tf_ext.get_dynamic_embedding("user_emb", dim=16)
    vecs = tf_ext.embedding_lookup(emb, ids)                 # ids of any rank
    loss = ...
    train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss)   # stock optimizer

Importing this package patches ``tf.compat.v1.train.Optimizer`` so that stock
optimizers train dynamic embeddings (see optimizers.py and tf_patches.py).
docs/embedding.md has the concepts and examples.
"""

from tensorflow_ext.embedding.initializers import InitSpec
from tensorflow_ext.embedding.lookup import embedding_lookup
from tensorflow_ext.embedding.lookup import embedding_lookup_sparse
from tensorflow_ext.embedding.lookup import safe_embedding_lookup_sparse
from tensorflow_ext.embedding.optimizers import supported_optimizers
from tensorflow_ext.embedding.checkpoint.save import ShardSaveable
from tensorflow_ext.embedding.checkpoint.restore import restore_values_only
from tensorflow_ext.embedding.variable import DynamicEmbedding
from tensorflow_ext.embedding.variable import DynamicEmbeddingShard
from tensorflow_ext.embedding.layout import DynamicEmbeddingSlot
from tensorflow_ext.embedding.keys import HashPartition
from tensorflow_ext.embedding.variable import ExportedEmbedding
from tensorflow_ext.embedding.variable import GraphKeys
from tensorflow_ext.embedding.creation import dense_variables
from tensorflow_ext.embedding.creation import get_dynamic_embedding
from tensorflow_ext.embedding.creation import get_dynamic_embeddings
from tensorflow_ext.embedding.keys import string_to_key

from tensorflow_ext.embedding.checkpoint.warm_start import warm_start_from_checkpoint
from tensorflow_ext.embedding.checkpoint.warm_start import warm_start_op

from tensorflow_ext.embedding import tf_patches as _tf_patches

_tf_patches.install()

from tensorflow_ext.embedding.eviction import EvictionHook
from tensorflow_ext.embedding.eviction import EvictionPolicy
from tensorflow_ext.embedding.eviction import EvictionSaverListener
from tensorflow_ext.embedding.eviction import evict
from tensorflow_ext.embedding.eviction import restrict

from tensorflow_ext.embedding.summaries import add_summaries
from tensorflow_ext.embedding.admission import BloomAdmission
from tensorflow_ext.embedding.admission import CountAdmission
from tensorflow_ext.embedding.checkpoint.delta import DeltaCheckpointSaverListener
from tensorflow_ext.embedding.checkpoint.delta import delta_checkpoints

__all__ = [
    "BloomAdmission",
    "CountAdmission",
    "DeltaCheckpointSaverListener",
    "DynamicEmbedding",
    "DynamicEmbeddingShard",
    "DynamicEmbeddingSlot",
    "EvictionHook",
    "EvictionPolicy",
    "EvictionSaverListener",
    "ExportedEmbedding",
    "GraphKeys",
    "HashPartition",
    "InitSpec",
    "ShardSaveable",
    "add_summaries",
    "delta_checkpoints",
    "dense_variables",
    "embedding_lookup",
    "embedding_lookup_sparse",
    "evict",
    "get_dynamic_embedding",
    "get_dynamic_embeddings",
    "restore_values_only",
    "restrict",
    "safe_embedding_lookup_sparse",
    "string_to_key",
    "supported_optimizers",
    "warm_start_from_checkpoint",
    "warm_start_op",
]
