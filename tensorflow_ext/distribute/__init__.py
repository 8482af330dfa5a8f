"""tf_ext.distribute: parameter-server training helpers.

    queue = tf_ext.distribute.WorkQueue(files, num_epochs=2)   # on the first ps task, shared by every worker
    dataset = queue.dataset().flat_map(tf.data.TFRecordDataset)

`WorkQueue` hands input slices to the workers as they finish their last one, so a slow worker does not hold the
epoch; its progress is kept on the parameter server and in checkpoints (tensorflow_ext/distribute/work_queue.py).
"""

from tensorflow_ext.distribute.work_queue import WorkQueue

__all__ = ["WorkQueue"]
