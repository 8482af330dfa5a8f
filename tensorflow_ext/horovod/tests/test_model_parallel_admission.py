"""Admission on model-parallel embeddings under horovodrun: pooled lookups leave the ids not admitted out, as in one
process (each key's owner counts it and sends back whether it has a row with the row), also for rows stored in
bf16 (the row travels as 2-byte values, whether it has a row beside it)."""

import json
import textwrap

import pytest

from tensorflow_ext.horovod.tests.test_horovod import horovodrun

WORKER = textwrap.dedent(
    """
    import json
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()
    import tensorflow_ext as tf_ext
    import tensorflow_ext.horovod as tfe_hvd

    tfe_hvd.init()
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = tfe_hvd.get_dynamic_embedding(
        "user", 2, parallelism="model", initializer=0.5,
        admission=tf_ext.embedding.CountAdmission(2, default_value=0.25), value_dtype=VALUE_DTYPE,
    )
    # Example 0: ids 1 and 3; example 1: id 3 only. Keys 1, 2 (owned by either rank) are trained twice: admitted.
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 3, 3], tf.int64), [2, 2])
    train_ids = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([1, 2], tf.int64), [1, 2])
    pooled_train = tf_ext.safe_embedding_lookup_sparse(emb, train_ids, None, combiner="mean")
    opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.0))
    train = opt.minimize(tf.reduce_sum(pooled_train), global_step=gs)
    got = {}
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got["first"] = sess.run([pooled_train, train])[0].tolist()  # nothing admitted: an empty example
        sess.run(train)
        for name, fn in (("sparse", tf_ext.embedding_lookup_sparse), ("safe", tf_ext.safe_embedding_lookup_sparse)):
            got[name] = sess.run(fn(emb, sp, None, combiner="mean", is_training=False)).tolist()
    print("RANK %d RESULT %s" % (tfe_hvd.rank(), json.dumps(got)), flush=True)
    """
)


@pytest.mark.parametrize("value_dtype", ["float32", "bfloat16"])
def test_model_parallel_pooling_leaves_not_admitted_ids_out(tmp_path, value_dtype):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("VALUE_DTYPE", repr(value_dtype)))
    code, out = horovodrun(2, str(script))
    assert code == 0, out[-6000:]
    results = [line.split(" RESULT ", 1)[1] for line in out.splitlines() if " RESULT " in line]
    assert len(results) == 2, out[-6000:]
    for text in results:
        got = json.loads(text)
        assert got["first"] == [[0.0, 0.0]], got  # not [0.25, 0.25]: the default rows are not pooled
        # Example 0: id 1's row alone (3 waits: not in the mean's denominator); example 1: none left, zeros.
        assert got["sparse"] == [[0.5, 0.5], [0.0, 0.0]], got
        assert got["safe"] == [[0.5, 0.5], [0.0, 0.0]], got
