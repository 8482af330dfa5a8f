"""A model given an admission or eviction policy restarts from a checkpoint saved without it (the policy's state
starts empty, with a log line); a checkpoint that holds the state restores it exactly; a model without the policy
restores a checkpoint that holds it."""

import json
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding.tests.conftest import run_fresh

# One model, with or without policies (POLICIES: "none" or "all"): embedding "user" (CountAdmission and an
# EvictionPolicy) and "item" (BloomAdmission). Prints its state as JSON on the last line.
_MODEL = """
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import tensorflow_ext as tf_ext
E = tf_ext.embedding
policies = POLICIES == "all"
gs = tf.compat.v1.train.get_or_create_global_step()
user = tf_ext.get_dynamic_embedding(
    "user", 4, num_shards=2,
    admission=E.CountAdmission(min_count=2) if policies else None,
    eviction=E.EvictionPolicy(steps_to_live=1) if policies else None)
item = tf_ext.get_dynamic_embedding(
    "item", 4, admission=E.BloomAdmission(min_count=2, num_counters=64) if policies else None)
ids = tf.compat.v1.placeholder(tf.int64, [None])
loss = tf.reduce_sum(tf_ext.embedding_lookup(user, ids) ** 2) + tf.reduce_sum(tf_ext.embedding_lookup(item, ids) ** 2)
train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=gs)
evict = E.evict(user) if policies else tf.no_op()
saver = tf.compat.v1.train.Saver()

def state(sess):
    out = {}
    for emb in (user, item):
        keys, values = sess.run(emb.export()[:2])
        order = np.argsort(keys)
        out[emb.name] = [keys[order].tolist(), np.round(values[order], 6).tolist()]
    if policies:
        pending = user.admission_state["table"].export(full_rows=True)
        pk, pv = sess.run(pending[:2])
        order = np.argsort(pk)
        out["pending"] = [pk[order].tolist(), pv[order].ravel().tolist()]
        out["admitted"] = sess.run([user.admission_state["admitted"], item.admission_state["admitted"]]).copy()
        out["admitted"] = [int(x) for x in out["admitted"]]
        out["evicted"] = int(sess.run(user.eviction_state["evicted"]))
        out["counters"] = sess.run(item.admission_state["counters"]).tolist()
    return out
"""


def _run_model(tmp_path, policies, body):
    code = _MODEL.replace("POLICIES", repr(policies)) + textwrap.dedent(body)
    out, err = run_fresh(code, tmp_path, with_stderr=True)
    states = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return (states[0] if len(states) == 1 else states), err


def test_policy_added_to_a_model_restores_its_checkpoint_with_empty_state(tmp_path):
    ckpt = str(tmp_path / "day1" / "model")
    saved, _ = _run_model(
        tmp_path,
        "none",
        """
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2, 3], [1, 2, 4]):
                sess.run(train, {ids: batch})
            saver.save(sess, %r)
            print(json.dumps(state(sess)))
        """
        % ckpt,
    )
    assert saved["user"][0] == [1, 2, 3, 4]

    # The same model with policies, restored in a new process: the rows as saved, the policies' state empty.
    ckpt2 = str(tmp_path / "day2" / "model")
    (restored, trained), err = _run_model(
        tmp_path,
        "all",
        """
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, %r)
            restored = state(sess)
            # Training goes on under the policies: key 9 waits for its second sighting, known keys train.
            sess.run(train, {ids: [1, 9]})
            assert sess.run(user.size()) == 4, sess.run(user.size())
            sess.run(train, {ids: [5, 6, 9]})
            sess.run(train, {ids: [5, 9]})  # 9 is admitted (in the second lookup), then 5
            sess.run(evict)
            sess.run(train, {ids: [7, 8, 5]})
            saver.save(sess, %r)
            print(json.dumps(restored))
            print(json.dumps(state(sess)))
        """
        % (ckpt, ckpt2),
    )
    assert restored["user"] == saved["user"] and restored["item"] == saved["item"]
    assert restored["pending"] == [[], []]
    assert restored["admitted"] == [0, 0] and restored["evicted"] == 0
    assert restored["counters"] == [0] * 64
    for what in (
        "admission counts of dynamic embedding user (user/admission_counts-*)",
        "admitted-keys counter of dynamic embedding user (user_admission/admitted)",
        "evicted-keys counter of dynamic embedding user (user_eviction/evicted)",
        "admitted-keys counter of dynamic embedding item (item_admission/admitted)",
        "BloomAdmission counters of dynamic embedding item (item_admission/bloom_counters)",
    ):
        assert "has no " + what in err, err[-3000:]
    assert "the state starts empty" in err
    # Training went on under the policies from there.
    assert 9 in trained["user"][0] and trained["admitted"][0] > 0 and trained["evicted"] > 0


def test_policy_state_in_a_checkpoint_restores_exactly_in_a_new_process(tmp_path):
    ckpt = str(tmp_path / "model")
    saved, _ = _run_model(
        tmp_path,
        "all",
        """
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for batch in ([1, 2, 3], [1, 2, 3], [1, 5, 6], [1, 5, 7]):
                sess.run(train, {ids: batch})
            sess.run(evict)  # 2 and 3 (not trained since step 2)
            sess.run(train, {ids: [8, 9, 2]})
            saver.save(sess, %r)
            print(json.dumps(state(sess)))
        """
        % ckpt,
    )
    assert saved["pending"][0] and saved["evicted"] > 0 and all(saved["admitted"]) and any(saved["counters"])
    restored, err = _run_model(
        tmp_path,
        "all",
        """
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, %r)
            print(json.dumps(state(sess)))
        """
        % ckpt,
    )
    assert restored == saved
    assert "has no" not in err


def test_checkpoint_with_policy_state_restores_into_a_model_without_the_policy(tmp_path):
    def build(with_policy):
        kw = dict(admission=tf_ext.embedding.CountAdmission(min_count=1)) if with_policy else {}
        if with_policy:
            kw["eviction"] = tf_ext.embedding.EvictionPolicy(steps_to_live=100)
        emb = tf_ext.get_dynamic_embedding("user", 2, initializer=0.5, **kw)
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([3, 4], tf.int64)))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        return emb, train, tf.compat.v1.train.Saver()

    with tf.Graph().as_default():
        emb, train, saver = build(True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            saver.save(sess, str(tmp_path / "model"))
            want = sess.run(emb.lookup(tf.constant([3, 4], tf.int64)))
    with tf.Graph().as_default():
        emb, train, saver = build(False)
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, str(tmp_path / "model"))
            np.testing.assert_allclose(sess.run(emb.lookup(tf.constant([3, 4], tf.int64))), want)


def test_bloom_counters_of_another_size_are_refused_with_a_clear_error(tmp_path):
    def build(num_counters):
        emb = tf_ext.get_dynamic_embedding(
            "user", 2, admission=tf_ext.embedding.BloomAdmission(min_count=2, num_counters=num_counters)
        )
        loss = tf.reduce_sum(tf_ext.embedding_lookup(emb, tf.constant([3, 4], tf.int64)))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        return train, tf.compat.v1.train.Saver()

    with tf.Graph().as_default():
        train, saver = build(64)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            saver.save(sess, str(tmp_path / "model"))
    with tf.Graph().as_default():
        _, saver = build(128)
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)user_admission/bloom_counters has shape.*"):
                saver.restore(sess, str(tmp_path / "model"))


_ESTIMATOR = """
import json, sys
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import tensorflow_ext as tf_ext
E = tf_ext.embedding
policies = POLICIES == "all"

def input_fn():
    ids = tf.constant([[1, 2], [1, 3], [4, 5], [1, 6], [7, 8], [1, 9]], tf.int64) + OFFSET
    return tf.data.Dataset.from_tensor_slices(({"ids": ids}, tf.ones([6, 1]))).batch(2).repeat()

def model_fn(features, labels, mode):
    user = tf_ext.get_dynamic_embedding(
        "user", 4,
        admission=E.CountAdmission(min_count=2) if policies else None,
        eviction=E.EvictionPolicy(steps_to_live=1000) if policies else None)
    logits = tf.reduce_sum(tf_ext.embedding_lookup(user, tf.reshape(features["ids"], [-1])), axis=1)
    loss = tf.reduce_mean((tf.reshape(logits, [-1, 2])[:, :1] - labels) ** 2)
    train = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

class Report(tf.compat.v1.train.SessionRunHook):
    def begin(self):
        user = E.get_dynamic_embeddings()[0]
        self.tensors = [user.size()]
        if policies:
            self.tensors += [user.admission_state["table"].size(), user.admission_state["admitted"],
                             user.eviction_state["evicted"]]
    def after_create_session(self, session, coord):
        print("RESTORED", json.dumps([int(x) for x in session.run(self.tensors)]))
    def end(self, session):
        print("END", json.dumps([int(x) for x in session.run(self.tensors)]))

est = tf.estimator.Estimator(model_fn, model_dir=MODEL_DIR,
                             config=tf.estimator.RunConfig(save_checkpoints_steps=2, log_step_count_steps=1000))
listeners = [E.delta_checkpoints(full_every=3)] if DELTA else []
est.train(input_fn, steps=STEPS, hooks=[Report()], saving_listeners=listeners)
"""


def _latest_kind(tmp_path):
    """ "full" or "delta": what the model_dir's latest checkpoint is for embedding user."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "model_dir")))
    names = reader.get_variable_to_dtype_map()
    if "user/part_0-delta" not in names:
        return "full"
    record = reader.get_tensor("user/part_0-delta").decode()
    return [line for line in record.split("\n") if line.startswith("kind=")][0][len("kind=") :]


def _estimator_day(tmp_path, policies, steps, offset, delta):
    code = (
        _ESTIMATOR.replace("POLICIES", repr(policies))
        .replace("DELTA", repr(delta))
        .replace("OFFSET", str(offset))
        .replace("MODEL_DIR", repr(str(tmp_path / "model_dir")))
        .replace("STEPS", str(steps))
    )
    out, err = run_fresh(code, tmp_path, with_stderr=True)
    lines = dict(l.split(" ", 1) for l in out.splitlines() if l.startswith(("RESTORED ", "END ")))
    return json.loads(lines["RESTORED"]), json.loads(lines["END"]), err


@pytest.mark.parametrize("delta", [False, True], ids=["full", "delta_checkpoints"])
def test_estimator_restarts_with_policies_added_from_its_checkpoint(tmp_path, delta):
    # Day 1 without policies; day 2 adds them and warm-restarts from day 1's checkpoint; day 3 restores day 2's
    # state exactly; day 4 drops the policies again. With delta checkpoints, each day restores a delta (saves at
    # the start, every 2nd step and the end; every 3rd save and the first of a run full).
    # Each day brings new keys (ids + 100 after day 1).
    _, day1, _ = _estimator_day(tmp_path, "none", 3, 0, delta)
    assert _latest_kind(tmp_path) == ("delta" if delta else "full")
    assert day1[0] > 0
    restored, day2, err = _estimator_day(tmp_path, "all", 3, 100, delta)
    assert _latest_kind(tmp_path) == ("delta" if delta else "full")
    assert restored == [day1[0], 0, 0, 0]
    assert "has no admission counts of dynamic embedding user" in err, err[-3000:]
    assert "has no evicted-keys counter of dynamic embedding user" in err
    assert day2[1] > 0 and day2[2] > 0  # keys waiting, keys admitted
    restored, day3, err = _estimator_day(tmp_path, "all", 1, 100, delta)
    assert restored == day2
    assert "has no" not in err
    restored, _, _ = _estimator_day(tmp_path, "none", 1, 0, delta)
    assert restored == [day3[0]]
