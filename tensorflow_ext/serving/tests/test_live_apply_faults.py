"""The live model's apply under failures no check foresees, and the memory an apply takes for dense values.

Failures: the model's tests-only fault (TF_EXT_LIVE_MODEL_TEST_THROW, a std::runtime_error thrown where the model
starts, builds a version or compacts a shard) must come out as an error status with nothing published, or, for a
compaction after the update was published, as a shard left uncompacted; never as an exception through the kernel
(which would end the process). Each case runs in a fresh process, so that a failure kills that process only.

Memory: an update's dense values, restored from its bundle by the apply signature, become the new version's without
a copy. Peak resident memory during the apply is measured (VmHWM, reset through /proc/self/clear_refs) around a
256 MiB dense variable: a copy would add as much again.
"""

import json

import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import run_fresh
from tensorflow_ext.embedding.tests.conftest import session_config
from tensorflow_ext.serving import update_format

_PRELUDE = """
import json, os
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
from tensorflow_ext.serving.served_model import op_message
from tensorflow_ext.serving.tests.test_live_ops import LiveGraph, _probe

rng = np.random.default_rng(7)
probe = _probe(rng)
g = LiveGraph()
g.restore(rng, n=(40, 30))
result = {}

def update(n, start=0):
    keys = [list(range(2000 + start, 2000 + start + n))] * 2
    values = [rng.standard_normal((n, d)).astype(np.float32) for d in (3, 2)]
    return keys, values, [[], []], rng.standard_normal((2, 3)).astype(np.float32)

def error_of(fn):
    try:
        fn()
    except tf.errors.OpError as e:
        return [type(e).__name__, op_message(e)]
    return None
"""


def _fresh(code, tmp_path):
    """The `result` dict that `code` (after _PRELUDE) fills, run in a fresh process."""
    out = run_fresh(_PRELUDE + code + "\nprint('RESULT', json.dumps(result))", tmp_path)
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


def test_a_failure_starting_the_model_fails_the_op_and_the_next_op_starts_it(tmp_path):
    result = _fresh(
        """
os.environ["TF_EXT_LIVE_MODEL_TEST_THROW"] = "start"
result["error"] = error_of(lambda: g.session.run(g.version))
result["stats_version"] = int(g.session.run(g.stats)[0])
del os.environ["TF_EXT_LIVE_MODEL_TEST_THROW"]
g.check_reads(probe)
result["started"] = int(g.session.run(g.version))
""",
        tmp_path,
    )
    assert result["error"] == [
        "InternalError",
        "live model 'ctr': starting it failed: a failure injected at 'start' (TF_EXT_LIVE_MODEL_TEST_THROW)",
    ]
    assert result["stats_version"] == -1  # not started
    assert result["started"] == 100


def test_a_failure_building_a_version_fails_the_apply_and_publishes_nothing(tmp_path):
    result = _fresh(
        """
g.check_reads(probe)
os.environ["TF_EXT_LIVE_MODEL_TEST_THROW"] = "build"
result["error"] = error_of(lambda: g.session.run(g.apply, g.update_feeds("delta", 100, 107, *update(5))))
stats = g.check_reads(probe)  # the version before, whole
result["refused"], result["applies"] = int(stats["refused"]), int(stats["applies"])
del os.environ["TF_EXT_LIVE_MODEL_TEST_THROW"]
result["then"] = [int(x) for x in g.apply_update("delta", 100, 107, *update(5))]
g.check_reads(probe)
""",
        tmp_path,
    )
    assert result["error"] == [
        "InternalError",
        "table slot 0: applying 5 rows and 0 removed keys failed: a failure injected at 'build' "
        "(TF_EXT_LIVE_MODEL_TEST_THROW)",
    ]
    assert (result["refused"], result["applies"]) == (1, 0)
    assert result["then"] == [107, 1]


def test_a_failure_compacting_leaves_the_update_applied_and_the_shard_uncompacted(tmp_path):
    # 20 new keys over a base of 40 (30): the overlays pass a quarter of their bases, a compaction is due.
    result = _fresh(
        """
os.environ["TF_EXT_LIVE_MODEL_TEST_THROW"] = "compact"
result["applied"] = [int(x) for x in g.apply_update("delta", 100, 107, *update(20))]
stats = g.check_reads(probe)  # the update's rows, from the overlay
result["after_failure"] = [int(stats["compactions"]), int(stats["overlay_keys"])]
del os.environ["TF_EXT_LIVE_MODEL_TEST_THROW"]
g.apply_update("delta", 107, 110, *update(3, start=100))
stats = g.check_reads(probe)
result["after_next"] = [int(stats["compactions"]), int(stats["overlay_keys"])]
""",
        tmp_path,
    )
    assert result["applied"] == [107, 1]
    assert result["after_failure"] == [0, 40]
    assert result["after_next"][0] == 2 and result["after_next"][1] == 0


def _dense_export(work, n):
    """A live export whose only served state is a float32 variable of n values (read whole), at global step 1."""
    export_dir = str(work / "export")
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        with tf_ext.serving.freeze_for_serving(live_model="dense"):
            step = tf.compat.v1.train.get_or_create_global_step()
            w = tf.compat.v1.get_variable("w", [n], initializer=tf.compat.v1.zeros_initializer())
            x = tf.compat.v1.placeholder(tf.int64, [None], name="x")
            outputs = {"picked": tf.gather(tf.identity(w), x), "version": tf_ext.serving.served_version()}
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step.assign(1))
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, outputs)
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()
    return export_dir


def _dense_update(work, n, to_step):
    """A delta update of the export (from step 1) setting w to to_step + arange(n)."""
    layout = update_format.layout([update_format.dense_entry("w", "float32", [n])])
    path = str(work / update_format.update_dir_name(to_step))
    with tf.Graph().as_default(), tf.compat.v1.Session(config=session_config()) as sess:
        tensors = {
            update_format.META_MODEL_NAME: tf.constant("dense"),
            update_format.META_LAYOUT: tf.constant(layout),
            update_format.META_KIND: tf.constant(update_format.KIND_DELTA),
            update_format.META_FROM_STEP: tf.constant(1, tf.int64),
            update_format.META_TO_STEP: tf.constant(to_step, tf.int64),
            "w": tf.range(n, dtype=tf.float32) + float(to_step),
        }
        names = sorted(tensors)
        save = tf.raw_ops.SaveV2(
            prefix=update_format.bundle_prefix(path),
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            tensors=[tensors[k] for k in names],
        )
        sess.run(save)
    return path


def test_an_updates_dense_values_are_taken_over_without_a_copy(tmp_path):
    n = 64 << 20  # 256 MiB of float32
    export = _dense_export(tmp_path, n)
    update = _dense_update(tmp_path, n, 9)
    out = run_fresh(
        """
        import json, re
        import numpy as np
        import tensorflow as tf
        tf.compat.v1.disable_v2_behavior()
        import tensorflow_ext as tf_ext
        from tensorflow_ext.serving.follow import ServedModel

        def kib(field):
            return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

        model = ServedModel(%r)
        picked, version = model.predict({"x": [0, 1000]})  # starts the model: version 1
        assert version == 1 and picked["picked"].tolist() == [0.0, 0.0], (version, picked)
        before = kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the resident size now
        applied = model.apply(%r)
        peak = kib("VmHWM")
        picked, version = model.predict({"x": [0, 1000]})
        print("RESULT", json.dumps(dict(applied=applied, version=version, picked=picked["picked"].tolist(),
                                        grew_kib=peak - before)))
        """
        % (export, update),
        tmp_path,
    )
    (line,) = [l for l in out.splitlines() if l.startswith("RESULT ")]
    result = json.loads(line[len("RESULT ") :])
    assert result["applied"] == [9, True] and result["version"] == 9
    assert result["picked"] == [9.0, 1009.0]
    size_kib = n * 4 // 1024
    # The restored tensor (one size) is all the apply adds; a copy of it would add a second one.
    assert result["grew_kib"] < size_kib * 3 // 2, (result["grew_kib"], size_kib)
    assert result["grew_kib"] > size_kib // 2, (result["grew_kib"], size_kib)  # the measure sees the restore
