"""The pieces of tensorflow_ext.horovod's Estimator support that one process can check (run in a fresh process:
importing tensorflow_ext.horovod changes seed defaults for the whole process)."""

import subprocess
import sys
import textwrap

from tensorflow_ext.horovod.tests.test_horovod import TIMEOUT_S
from tensorflow_ext.horovod.tests.test_horovod import _env


def run(code):
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    return r.stdout


def test_describe_mismatch_names_each_difference():
    out = run(
        """
        from tensorflow_ext.horovod.consistency import describe_mismatch
        a = "dynamic embedding 'u'\\tdim=8\\tparallelism=model(2 ranks)\\nvariable 'w'\\tshape=[8, 1]\\tdtype=float32"
        b = "dynamic embedding 'u'\\tdim=16\\tparallelism=model(2 ranks)\\nvariable 'w'\\tshape=[16, 1]\\tdtype=float32"
        c = "dynamic embedding 'u'\\tdim=8\\tparallelism=model(2 ranks)\\nvariable 'w'\\tshape=[8, 1]\\tdtype=float32"
        print(describe_mismatch([a, b, c]))
        print(describe_mismatch([a, "variable 'w'\\tshape=[8, 1]\\tdtype=float32"]))
        print(repr(describe_mismatch([a, a])))
    """
    ).splitlines()
    assert out[0] == (
        "dynamic embedding 'u': dim differs across ranks: rank 0: 8, rank 1: 16, rank 2: 8; "
        "variable 'w': shape differs across ranks: rank 0: [8, 1], rank 1: [16, 1], rank 2: [8, 1]"
    )
    assert out[1] == "dynamic embedding 'u' exists on rank 0 but not on rank 1"
    assert out[2] == "''"


def test_the_model_check_covers_every_setting_that_changes_the_collectives(tmp_path):
    """Admission and eviction policies, variables that are broadcast but not trained, the checkpoint schedule of the
    training hooks and the gradient reduction (compression) are all in what the ranks compare."""
    out = run(
        """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import consistency
        tfe_hvd.init()

        def lines(admission, eviction, compression, save_steps):
            with tf.Graph().as_default() as g:
                gs = tf.compat.v1.train.get_or_create_global_step()
                emb = tfe_hvd.get_dynamic_embedding(
                    "user", 4, parallelism="model", initializer=0.1, admission=admission, eviction=eviction
                )
                loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64)))
                opt = tfe_hvd.DistributedOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1), compression=compression)
                opt.minimize(loss, global_step=gs)
                tfe_hvd.training_hooks(model_dir=MODEL_DIR, save_checkpoints_steps=save_steps)[0].begin()
                return "\\n".join(consistency.config_lines(g))

        a = lines(None, None, None, 20)
        b = lines(
            tf_ext.embedding.CountAdmission(2),
            tf_ext.embedding.EvictionPolicy(capacity=100),
            tfe_hvd.Compression.bf16,
            30,
        )
        for problem in consistency.describe_mismatch([a, b]).split("; "):
            print(problem)
    """.replace(
            "MODEL_DIR", repr(str(tmp_path / "m"))
        )
    ).splitlines()
    assert (
        "dynamic embedding 'user': admission differs across ranks: rank 0: none, rank 1: CountAdmission(min_count=2)"
        in out
    ), out
    assert (
        "dynamic embedding 'user': eviction differs across ranks: rank 0: none, rank 1: EvictionPolicy(capacity=100)"
        in out
    ), out
    assert "variable 'user_admission/admitted' exists on rank 1 but not on rank 0" in out, out
    assert "checkpoint schedule: save_checkpoints_steps differs across ranks: rank 0: 20, rank 1: 30" in out, out
    assert (
        "DistributedOptimizer 'DistributedAdagradOptimizer': compression differs across ranks: rank 0: none, rank 1: bf16"
        in out
    ), out


def test_the_model_check_compares_the_storage_dtype():
    """Ranks whose embedding stores rows in other dtypes would send rows of other sizes through the lookup's
    alltoall: the check names the difference."""
    out = run(
        """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd
        from tensorflow_ext.horovod import consistency
        tfe_hvd.init()

        def lines(value_dtype, **storage):
            with tf.Graph().as_default() as g:
                emb = tfe_hvd.get_dynamic_embedding(
                    "user", 4, parallelism="model", initializer=0.1, value_dtype=value_dtype, **storage
                )
                tf_ext.embedding_lookup(emb, tf.constant([1, 2], tf.int64))
                return "\\n".join(consistency.config_lines(g))

        print(consistency.describe_mismatch([lines(tf.float32), lines(tf.bfloat16)]))
        # Replicas that round updates otherwise, or store slots otherwise, drift apart.
        print(consistency.describe_mismatch([lines(tf.bfloat16), lines(tf.bfloat16, rounding="nearest")]))
        print(consistency.describe_mismatch([lines(tf.bfloat16), lines(tf.bfloat16, slot_dtype=tf.bfloat16)]))
    """
    ).splitlines()
    assert out == [
        "dynamic embedding 'user': value_dtype differs across ranks: rank 0: float32, rank 1: bfloat16; "
        "dynamic embedding 'user': rounding differs across ranks: rank 0: nearest, rank 1: stochastic",
        "dynamic embedding 'user': rounding differs across ranks: rank 0: stochastic, rank 1: nearest",
        "dynamic embedding 'user': slot_dtype differs across ranks: rank 0: float32, rank 1: bfloat16",
    ], out


def test_synchronized_input_flags_the_last_element():
    """Each element carries whether another follows; empty, one-element and ragged last batches."""
    out = run(
        """
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        from tensorflow_ext.horovod import input as inp
        for n in (0, 1, 5):
            ds = tf.data.Dataset.from_tensor_slices((
                {"ids": np.arange(3 * n, dtype=np.int64).reshape(n, 3), "s": np.array(["x"] * n)},
                np.arange(n, dtype=np.float32))).batch(2)
            flagged = inp._with_has_next(ds)
            assert flagged.element_spec[0][0]["ids"].shape.as_list() == [None, 3]
            nxt = tf.compat.v1.data.make_one_shot_iterator(flagged).get_next()
            got = []
            with tf.compat.v1.Session() as s:
                try:
                    while True:
                        (features, labels), has_next = s.run(nxt)
                        got.append((features["ids"][:, 0].tolist(), labels.tolist(), bool(has_next)))
                except tf.errors.OutOfRangeError:
                    pass
            print(n, got)
    """
    ).splitlines()
    assert out == [
        "0 []",
        "1 [([0], [0.0], False)]",
        "5 [([0, 3], [0.0, 1.0], True), ([6, 9], [2.0, 3.0], True), ([12], [4.0], False)]",
    ]


def test_bad_arguments_are_named():
    out = run(
        """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext.horovod as tfe_hvd
        tfe_hvd.init()
        def err(f, *a, **k):
            try:
                f(*a, **k)
            except (TypeError, ValueError) as e:
                print(type(e).__name__, e)
            else:
                print("NO ERROR")
        err(tfe_hvd.run_config, None)
        err(tfe_hvd.run_config, "/tmp/m", save_checkpoints_steps=10, save_checkpoints_secs=60)
        err(tfe_hvd.run_config, "/tmp/m", save_checkpoints_steps=None)
        err(tfe_hvd.training_hooks, tfe_hvd.run_config("/tmp/m"), model_dir="/tmp/m")
        err(tfe_hvd.input_shard, [1, 2])
        sparse = tf.data.Dataset.from_tensors(tf.SparseTensor([[0]], [1], [2]))
        err(tfe_hvd.synchronized_next, sparse)
        err(tfe_hvd.shard_input_fn(lambda: [1, 2]), "train", {}, None)
        c = tfe_hvd.run_config("/tmp/m", save_checkpoints_steps=5, keep_checkpoint_max=2)
        print(c.save_checkpoints_steps, c.save_checkpoints_secs, c.keep_checkpoint_max)
    """
    ).splitlines()
    assert out[0] == "ValueError run_config needs a model_dir that every rank can read (rank 0 writes it)"
    assert out[1].startswith("ValueError run_config: give one of save_checkpoints_steps and save_checkpoints_secs")
    assert out[2].startswith("ValueError run_config: give one of save_checkpoints_steps and save_checkpoints_secs")
    assert out[3] == "ValueError training_hooks: give config, or model_dir and the schedule, not both"
    assert out[4] == "TypeError input_shard needs a tf.data.Dataset, got list"
    assert out[5].startswith(
        "TypeError synchronized_next reads datasets of dense tensors; got an element of type " "SparseTensorSpec"
    ), out[5]
    assert out[6] == "TypeError shard_input_fn needs an input_fn that returns a tf.data.Dataset; <lambda> returned list"
    assert out[7] == "5 None 2"


def test_parallelism_scope_reaches_feature_column_tables():
    out = run(
        """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd
        tfe_hvd.init()
        fc = tf_ext.feature_column
        features = {"u": tf.constant([[1], [2]], tf.int64), "i": tf.constant([[3], [4]], tf.int64)}
        with tfe_hvd.parallelism_scope("model"):
            tf.compat.v1.feature_column.input_layer(features, [fc.categorical_column_with_dynamic_embedding("u", 4)])
            with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
                a = tf_ext.get_dynamic_embedding("a", 2)
        tf.compat.v1.feature_column.input_layer(features, [fc.categorical_column_with_dynamic_embedding("i", 4)])
        for emb in tf_ext.embedding.get_dynamic_embeddings():
            print(emb.name, emb.distribution.name if emb.distribution is not None else "data")
        try:
            with tfe_hvd.parallelism_scope("data"), tf.compat.v1.variable_scope("s", reuse=True):
                tf_ext.get_dynamic_embedding("a", 2)
        except ValueError as e:
            print("ValueError", e)
        try:
            tfe_hvd.parallelism_scope("pipeline").__enter__()
        except ValueError as e:
            print("ValueError", e)
        with tfe_hvd.single_process(), tfe_hvd.parallelism_scope("model"):
            b = tf_ext.get_dynamic_embedding("b", 2)
        print(b.name, b.distribution)
    """
    ).splitlines()
    assert out[0].endswith("u_embedding/embedding_weights model"), out
    assert out[1] == "s/a model", out
    assert out[2].endswith("i_embedding/embedding_weights data"), out
    assert out[3] == "ValueError dynamic embedding s/a is already model-parallel", out
    assert out[4] == "ValueError parallelism must be 'data' or 'model', got 'pipeline'", out
    assert out[5] == "b None", out


def test_a_data_parallel_embedding_cannot_become_model_parallel_when_reused():
    # Its lookups built so far read the local replica: turning it model-parallel afterwards would mix both kinds.
    out = run(
        """
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        import tensorflow_ext.horovod as tfe_hvd
        tfe_hvd.init()
        with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
            a = tf_ext.get_dynamic_embedding("a", 2)
            try:
                tfe_hvd.get_dynamic_embedding("a", 2, parallelism="model")
            except ValueError as e:
                print("ValueError", e)
            try:
                with tfe_hvd.parallelism_scope("model"):
                    tf_ext.get_dynamic_embedding("a", 2)
            except ValueError as e:
                print("ValueError", e)
            print(a.distribution)
    """
    ).splitlines()
    for line in out[:2]:
        assert line.startswith("ValueError Trying to share dynamic embedding s/a with distribution ModelParallel("), out
        assert line.endswith("cannot change an embedding that exists)"), out
    assert out[2] == "None", out
