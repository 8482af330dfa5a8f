"""tf_ext's own TF1 optimizers (`tf.compat.v1.train.Optimizer` subclasses), usable like TF's on dense variables and on
dynamic embeddings (embedding/optimizer_spec.py names their fused ops).

  RowwiseAdagradOptimizer   Adagrad with one accumulator per row (rowwise_adagrad.py)
"""

from tensorflow_ext.optimizers.rowwise_adagrad import RowwiseAdagradOptimizer

__all__ = ["RowwiseAdagradOptimizer"]
