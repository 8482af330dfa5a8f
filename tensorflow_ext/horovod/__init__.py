"""Training dynamic-embedding models with Horovod (`horovodrun`), in TF1 graph mode.

    import tensorflow_ext as tf_ext
    import tensorflow_ext.horovod as tfe_hvd

    tfe_hvd.init()
    user = tfe_hvd.get_dynamic_embedding("user", 16, parallelism="model")   # each rank holds 1/N of the keys
    item = tf_ext.get_dynamic_embedding("item", 16)                          # a full replica on every rank
    ...
    opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.05))
    train_op = opt.minimize(loss, global_step=gs)
    hooks = [tfe_hvd.BroadcastGlobalVariablesHook(0)]

Importing this module needs Horovod (`make horovod` in a source checkout); `import tensorflow_ext` alone never
does. Importing it also makes embeddings created afterwards without a seed derive their initializer seeds from
their names, so every rank draws the same initial row for a key.
"""

from tensorflow_ext.horovod import _hvd

_hvd_module = _hvd.require_horovod()

from tensorflow_ext.embedding import initializers as _initializers  # noqa: E402
from tensorflow_ext.horovod.embedding import ModelParallel  # noqa: E402
from tensorflow_ext.horovod.embedding import get_dynamic_embedding  # noqa: E402
from tensorflow_ext.horovod.embedding import owner_of  # noqa: E402
from tensorflow_ext.horovod.optimizer import DistributedOptimizer  # noqa: E402

_initializers.require_deterministic_seeds(True)

# Horovod's own names that users of this module need (one import for both).
init = _hvd_module.init
shutdown = _hvd_module.shutdown
rank = _hvd_module.rank
size = _hvd_module.size
local_rank = _hvd_module.local_rank
local_size = _hvd_module.local_size
Compression = _hvd_module.Compression
Average = _hvd_module.Average
Sum = _hvd_module.Sum
BroadcastGlobalVariablesHook = _hvd_module.BroadcastGlobalVariablesHook
broadcast_global_variables = _hvd_module.broadcast_global_variables

__all__ = [
    "Average", "BroadcastGlobalVariablesHook", "Compression", "DistributedOptimizer", "ModelParallel", "Sum",
    "broadcast_global_variables", "get_dynamic_embedding", "init", "local_rank", "local_size", "owner_of", "rank",
    "shutdown", "size",
]
