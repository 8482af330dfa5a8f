"""XLA compilation of the dense part of recommender models without needless recompiles (`compile_bucketed`)."""

from tensorflow_ext.xla.bucketing import BUCKETS_COLLECTION
from tensorflow_ext.xla.bucketing import CompileStatsHook
from tensorflow_ext.xla.bucketing import compile_bucketed
from tensorflow_ext.xla.bucketing import default_buckets
from tensorflow_ext.xla.bucketing import enabled

__all__ = ["BUCKETS_COLLECTION", "CompileStatsHook", "compile_bucketed", "default_buckets", "enabled"]
