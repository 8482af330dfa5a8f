"""Checkpoints of the Top-K residuals: every rank saves its own residuals and gets its own back on restart.

A Top-K residual (`DistributedOptimizer(topk_ratio=...)`) is the part of a rank's gradients that the rank has not
sent yet: each rank's is its own. Only rank 0 writes the checkpoint, so a plain Saver writes rank 0's residuals and a
restarted job would resume every rank from them. With the training hooks (`tensorflow_ext.horovod.estimator`) the
checkpoint holds every rank's instead:

* **Save**: per residual variable `<name>`, the save gathers every rank's residual (`hvd.allgather`, collective: the
  other ranks join rank 0's saves through `checkpoint.gather_op`, as for model-parallel embeddings) and writes
  `<name>/by_rank` ([ranks, *shape], row r is rank r's) and `<name>` (their mean: what one process resumes from,
  so a plain Saver of the same graph still restores the checkpoint).
* **Restore**: at the same rank count each rank assigns its own row. At another rank count every rank starts from
  the mean of the saved rows (a warning says so): with `op=Average` the ranks' averaged gradient still receives
  exactly the update the saved ranks owed (the mean of their residuals), now spread over the new ranks. One rank
  keeps no residuals (it sends whole gradients): the saved ones are dropped, with a warning. Residuals that a
  checkpoint lacks (one rank wrote it, or Top-K was off) start at zero, with a warning.

`install_saver` puts a Saver that does this in the graph's SAVERS collection, where the Estimator's Scaffold and
rank 0's CheckpointSaverHook take it from; the training hooks call it in `begin`.
"""

import weakref

import tensorflow as tf

from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod.config import TOPK_RESIDUALS
from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.tf_compat import internals

__all__ = [
    "BY_RANK_SUFFIX",
    "RankResidualSaveable",
    "Savers",
    "install_saver",
    "residual_saveables",
    "saved_rank_count",
]

BY_RANK_SUFFIX = "/by_rank"

# graph -> [RankResidualSaveable] (built once per graph by install_saver).
_saveables = weakref.WeakKeyDictionary()


class RankResidualSaveable(internals.saveable_object.SaveableObject):
    """The saveable of one Top-K residual variable (see the module docstring).

    Args:
      var: the residual variable (in TOPK_RESIDUALS).
    """

    def __init__(self, var):
        hvd = _hvd.require_horovod()
        name = var.op.name
        self._var = var
        with tf.control_dependencies(None), tf.compat.v1.name_scope(None), tf.device(var.device):
            with tf.name_scope(name.replace("/", "_") + "_gather_for_checkpoint"):
                # Horovod matches collectives by name; the name must not depend on the scope that builds it.
                gathered = hvd.allgather(
                    tf.expand_dims(var.read_value(), 0),
                    name="tf_ext_checkpoint_residual_" + name.replace("/", "_"),
                    ignore_name_scope=True,
                )
                mean = tf.reduce_mean(gathered, axis=0)
        self.gathered = gathered
        specs = [
            internals.saveable_object.SaveSpec(mean, "", name),
            internals.saveable_object.SaveSpec(gathered, "", name + BY_RANK_SUFFIX),
        ]
        super().__init__(var, specs, name)

    @property
    def variable(self):
        return self._var

    def restore(self, restored_tensors, restored_shapes):
        del restored_shapes
        hvd = _hvd.require_horovod()
        _, by_rank = restored_tensors
        same_count = tf.equal(tf.shape(by_rank)[0], hvd.size())
        value = tf.cond(same_count, lambda: tf.gather(by_rank, hvd.rank()), lambda: tf.reduce_mean(by_rank, axis=0))
        return self._var.assign(tf.reshape(value, tf.shape(self._var)), read_value=False)


def residual_saveables(graph=None):
    """The `RankResidualSaveable`s `install_saver` built for `graph` (empty when it built none)."""
    graph = graph or tf.compat.v1.get_default_graph()
    return list(_saveables.get(graph, ()))


def _checkpoint_shapes(checkpoint_path):
    return tf.train.load_checkpoint(checkpoint_path).get_variable_to_shape_map() if checkpoint_path else {}


def saved_rank_count(checkpoint_path, names):
    """How many ranks' residuals a checkpoint holds, read from its `<name>/by_rank` shapes.

    Args:
      checkpoint_path: a checkpoint prefix (None: no checkpoint).
      names: the residual variables' names.

    Returns:
      None without a checkpoint; 0 when it lacks the `/by_rank` entry of one of `names` (written by a plain Saver,
      by one rank, or without Top-K); else the number of ranks that wrote it.
    """
    if not checkpoint_path:
        return None
    shapes = _checkpoint_shapes(checkpoint_path)
    counts = {shapes[n + BY_RANK_SUFFIX][0] for n in names if n + BY_RANK_SUFFIX in shapes}
    if len(counts) != 1 or any(n + BY_RANK_SUFFIX not in shapes for n in names):
        return 0
    return counts.pop()


class Savers(object):
    """What `install_saver` set up.

    Attributes:
      saveables: the `RankResidualSaveable`s (their gathers are the save's collectives); empty when residuals are
        not saved per rank.
      save_saver: the Saver that rank 0 must save with when it is not the one in SAVERS (the latest checkpoint
        lacked per-rank residuals: SAVERS' Saver restores without them, this one saves them); None otherwise.
    """

    def __init__(self, saveables=(), save_saver=None):
        self.saveables = list(saveables)
        self.save_saver = save_saver


def install_saver(graph, model_dir, keep_checkpoint_max=5, keep_checkpoint_every_n_hours=10000.0):
    """Makes the graph's checkpoints hold every rank's Top-K residuals (see the module docstring).

    Builds the saveables (with their gathers) and puts a Saver of every global variable except the residuals, the
    SAVEABLE_OBJECTS and the saveables into the SAVERS collection, replacing the default Saver an Estimator put
    there (a Saver the user built is left alone, with a warning: the checkpoint then holds rank 0's residuals).
    When the latest checkpoint in `model_dir` holds no per-rank residuals (written by one rank, by a job without
    Top-K, or by a plain Saver), SAVERS gets a Saver that restores without them (each residual from its plain entry
    when there is one, as a plain Saver would, else left at zero) and `Savers.save_saver` saves them.
    Call it on every rank before the graph is finalized and before the Scaffold builds its Saver (a hook's `begin`).

    Args:
      graph: a `tf.Graph`.
      model_dir: where the job restores from.
      keep_checkpoint_max, keep_checkpoint_every_n_hours: the Savers' retention when SAVERS is empty (else the
        default Saver's).

    Returns:
      A `Savers`.
    """
    hvd = _hvd.require_horovod()
    residuals = graph.get_collection(TOPK_RESIDUALS)
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    if not residuals:
        dropped = sorted(k for k in _checkpoint_shapes(latest) if k.endswith(BY_RANK_SUFFIX))
        if dropped:
            tf.compat.v1.logging.warning(
                "tensorflow_ext.horovod: %s holds the Top-K residuals of %d variables (%s, ...), and this job keeps "
                "none (one rank, or Top-K off): they are dropped, the gradient the saved ranks had not sent yet "
                "with them",
                latest,
                len(dropped),
                dropped[0][: -len(BY_RANK_SUFFIX)],
            )
        return Savers()
    if graph in _saveables:
        raise ValueError("install_saver was already called for this graph")
    names = [v.op.name for v in residuals]
    savers = graph.get_collection_ref(tf.compat.v1.GraphKeys.SAVERS)
    settings = None
    if not savers:
        settings = dict(max_to_keep=keep_checkpoint_max, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours)
    elif len(savers) == 1:
        settings = internals.default_saver_settings(savers[0])
    if settings is None:
        tf.compat.v1.logging.warning(
            "tensorflow_ext.horovod: the graph has its own Saver; its checkpoints hold rank 0's Top-K residuals "
            "(%d variables), from which every rank resumes on restart",
            len(residuals),
        )
        _saveables[graph] = []
        return Savers()
    saved = saved_rank_count(latest, names)
    if saved and saved != hvd.size():
        tf.compat.v1.logging.warning(
            "tensorflow_ext.horovod: %s holds the Top-K residuals of %d ranks and this job has %d: every rank "
            "resumes from their mean (the averaged gradient keeps the update they still owed)",
            latest,
            saved,
            hvd.size(),
        )
    with graph.as_default():
        saveables = [RankResidualSaveable(v) for v in residuals]
        excluded = set(id(v) for v in residuals)
        others = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if id(v) not in excluded]
        others += graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
        per_rank = tf.compat.v1.train.Saver(
            var_list=others + saveables, sharded=True, save_relative_paths=True, **settings
        )
        save_saver = None
        if saved == 0:
            shapes = _checkpoint_shapes(latest)
            plain = [v for v in residuals if v.op.name in shapes]
            tf.compat.v1.logging.warning(
                "tensorflow_ext.horovod: %s holds no per-rank Top-K residuals: %s; this job's checkpoints hold "
                "each rank's",
                latest,
                (
                    "every rank resumes from the residuals it holds (rank 0's)"
                    if len(plain) == len(residuals)
                    else "residuals not in it start at zero"
                ),
            )
            restore_saver = tf.compat.v1.train.Saver(
                var_list=others + plain, sharded=True, save_relative_paths=True, **settings
            )
            # A restored session runs no initializer: the restore itself zeroes the residuals it does not read.
            restore_op = graph.get_operation_by_name(restore_saver.saver_def.restore_op_name)
            for v in residuals:
                if v.op.name not in shapes:
                    graph_edits.add_control_input(restore_op, v.initializer)
            save_saver, per_rank = per_rank, restore_saver
    del savers[:]
    savers.append(per_rank)
    _saveables[graph] = saveables
    return Savers(saveables, save_saver)
