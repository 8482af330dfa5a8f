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

With an Estimator: `tfe_hvd.run_config`, `tfe_hvd.shard_input_fn`, `tfe_hvd.training_hooks` and
`tfe_hvd.export_saved_model` (see `tensorflow_ext.horovod.estimator`; docs/distributed.md).

Importing this module needs Horovod (`make horovod` in a source checkout); `import tensorflow_ext` alone never
does. Importing it also makes embeddings created afterwards without a seed derive their initializer seeds from
their names, so every rank draws the same initial row for a key.
"""

from tensorflow_ext.horovod import _hvd

_hvd_module = _hvd.require_horovod()

import tensorflow as _tf  # noqa: E402

from tensorflow_ext.embedding import initializers as _initializers  # noqa: E402
from tensorflow_ext.horovod import allreduce  # noqa: E402
from tensorflow_ext.horovod import checkpoint  # noqa: E402
from tensorflow_ext.horovod import consistency as _consistency  # noqa: E402
from tensorflow_ext.horovod import estimator  # noqa: E402
from tensorflow_ext.horovod.embedding import ModelParallel  # noqa: E402
from tensorflow_ext.horovod.embedding import get_dynamic_embedding  # noqa: E402
from tensorflow_ext.horovod.embedding import owner_of  # noqa: E402
from tensorflow_ext.horovod.embedding import parallelism_scope  # noqa: E402
from tensorflow_ext.horovod.embedding import single_process  # noqa: E402
from tensorflow_ext.horovod.estimator import export_saved_model  # noqa: E402
from tensorflow_ext.horovod.estimator import run_config  # noqa: E402
from tensorflow_ext.horovod.estimator import shard_input_fn  # noqa: E402
from tensorflow_ext.horovod.estimator import training_hooks  # noqa: E402
from tensorflow_ext.horovod.input import input_shard  # noqa: E402
from tensorflow_ext.horovod.input import synchronized_next  # noqa: E402
from tensorflow_ext.horovod.optimizer import DistributedOptimizer  # noqa: E402

_initializers.require_deterministic_seeds(True)


def broadcast_global_variables(root_rank):
    """Horovod's `broadcast_global_variables`, run after the check that every rank built the same model.

    Run it once after initializing (or restoring) the variables, before the first step. The Top-K residuals of
    `DistributedOptimizer(topk_ratio=...)` are each rank's own and are not broadcast.

    Args:
      root_rank: the rank whose values are broadcast.

    Returns:
      An op.
    """
    residuals = set(id(v) for v in _tf.compat.v1.get_collection(allreduce.TOPK_RESIDUALS))
    variables = [v for v in _tf.compat.v1.global_variables() if id(v) not in residuals]
    if _hvd_module.size() == 1:
        return _hvd_module.broadcast_variables(variables, root_rank)
    with _tf.control_dependencies([_consistency.check_op()]):
        return _hvd_module.broadcast_variables(variables, root_rank)


def barrier():
    """Returns when every rank has called it (e.g. after rank 0 prepared a directory the others read).

    Runs one small allreduce in a graph and session of its own, so it can be called anywhere outside a session.
    """
    if _hvd_module.size() == 1:
        return
    with _tf.Graph().as_default():
        # Fed, not constant: TF would fold a constant input on one rank and skip the collective.
        token = _tf.compat.v1.placeholder(_tf.int32, [1])
        with _tf.compat.v1.Session() as session:
            session.run(_hvd_module.allreduce(token, op=_hvd_module.Sum, name="tf_ext_barrier"), {token: [1]})


class BroadcastGlobalVariablesHook(_hvd_module.BroadcastGlobalVariablesHook):
    """Horovod's hook, broadcasting with `broadcast_global_variables` above (after the model check).

    `training_hooks()` does this too; use this hook with a MonitoredTrainingSession that does not use them.
    """

    def begin(self):
        if not self.bcast_op or self.bcast_op.graph != _tf.compat.v1.get_default_graph():
            with _tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)


# Horovod's own names that users of this module need (one import for both). `init` is Horovod's, registering the
# process sets of the 2D allreduce when asked to (`init(node_size=...)`); `Compression` adds bf16.
init = allreduce.init
shutdown = _hvd_module.shutdown
rank = _hvd_module.rank
size = _hvd_module.size
local_rank = _hvd_module.local_rank
local_size = _hvd_module.local_size
Compression = allreduce.Compression
Average = _hvd_module.Average
Sum = _hvd_module.Sum

__all__ = [
    "Average",
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedOptimizer",
    "ModelParallel",
    "Sum",
    "allreduce",
    "barrier",
    "broadcast_global_variables",
    "checkpoint",
    "estimator",
    "export_saved_model",
    "get_dynamic_embedding",
    "init",
    "input_shard",
    "local_rank",
    "local_size",
    "owner_of",
    "parallelism_scope",
    "rank",
    "run_config",
    "shard_input_fn",
    "shutdown",
    "single_process",
    "size",
    "synchronized_next",
    "training_hooks",
]
