"""A dynamic embedding is a frozen config, its shards and one state object built at creation."""

import dataclasses
import pickle

import pytest
import tensorflow as tf

import tensorflow_ext as tf_ext
from tensorflow_ext.embedding import admission
from tensorflow_ext.embedding import creation
from tensorflow_ext.embedding import distribution
from tensorflow_ext.embedding import eviction


def test_the_config_is_a_checked_frozen_value(graph):
    with tf.compat.v1.variable_scope("tower"):
        emb = tf_ext.get_dynamic_embedding("user", 4, devices=["/cpu:0", "/cpu:0"], initial_capacity=3)
    config = emb.config
    assert (config.name, config.dim, config.num_shards, config.devices) == ("tower/user", 4, 2, ("/cpu:0", "/cpu:0"))
    assert config.shard_capacity == 2  # 3 keys over 2 shards, rounded up
    assert emb.initializer is config.initializer and config.initializer.seeds() == config.initializer.seeds()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dim = 8
    # The do-nothing defaults: no policy state, and the public properties say "none".
    assert config.admission == admission.ADMIT_EVERY_KEY and emb.admission is None and emb.admission_state is None
    assert config.eviction == eviction.NEVER_EVICT and emb.eviction is None and emb.eviction_state is None
    assert config.distribution == distribution.SINGLE_PROCESS and emb.distribution is None
    assert emb.state.admission == {} and emb.state.eviction == {}


def test_policies_are_values_and_the_embedding_has_no_setters(graph):
    count = tf_ext.embedding.CountAdmission(2, default_value=0.5)
    assert count == tf_ext.embedding.CountAdmission(2, default_value=0.5) != tf_ext.embedding.CountAdmission(2)
    assert hash(count) == hash(tf_ext.embedding.CountAdmission(2, default_value=0.5))
    assert pickle.loads(pickle.dumps(count)) == count
    bloom = tf_ext.embedding.BloomAdmission(3, num_counters=64)
    assert pickle.loads(pickle.dumps(bloom)) == bloom != tf_ext.embedding.BloomAdmission(3, num_counters=128)
    with pytest.raises(AttributeError, match="cannot be changed"):
        count.min_count = 3
    policy = tf_ext.embedding.EvictionPolicy(capacity=10)
    emb = tf_ext.get_dynamic_embedding("e", 2, admission=count, eviction=policy)
    assert emb.admission is count and emb.eviction is policy
    assert sorted(emb.state.admission) == ["admitted", "table"] and sorted(emb.state.eviction) == ["evicted"]
    for setter in ("set_admission", "set_eviction"):
        assert not hasattr(emb, setter)
    with pytest.raises(AttributeError):
        emb.distribution = distribution.SINGLE_PROCESS


def test_restore_values_only_is_a_state_change(graph):
    emb = tf_ext.get_dynamic_embedding("e", 2)
    assert emb.state.restores_slots
    tf_ext.embedding.restore_values_only([emb])
    assert not emb.state.restores_slots


def test_creation_hooks_shape_new_embeddings_and_cannot_change_reused_ones(graph):
    seen = []

    def untrainable(config):
        seen.append(config.name)
        return dataclasses.replace(config, trainable=False)

    with tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE):
        with creation.creation_hook(untrainable):
            emb = tf_ext.get_dynamic_embedding("e", 2)
        assert not emb.trainable and emb.shards[0] not in tf.compat.v1.trainable_variables()
        assert tf_ext.get_dynamic_embedding("e", 2) is emb  # no hook: reused as it is
        with creation.creation_hook(lambda config: config):
            assert tf_ext.get_dynamic_embedding("e", 2) is emb
        with creation.creation_hook(lambda config: dataclasses.replace(config, distribution=object())):
            with pytest.raises(ValueError, match="Trying to share dynamic embedding s/e with distribution"):
                tf_ext.get_dynamic_embedding("e", 2)
    assert seen == ["s/e"]


def test_reusing_by_name_ignores_the_variable_scopes_partitioner_and_initializer(graph):
    # The scope's defaults shape a new embedding only: reusing one by name in a scope with a size-based partitioner
    # (which needs initial_capacity) or an initializer that does not fit returns it, as before.
    sized = tf.compat.v1.variable_axis_size_partitioner(max_shard_bytes=1 << 10)
    with tf.compat.v1.variable_scope("s", partitioner=sized):
        emb = tf_ext.get_dynamic_embedding("e", 4, initial_capacity=100)
    with tf.compat.v1.variable_scope("s", partitioner=sized, initializer=[1.0, 2.0], reuse=True):
        assert tf_ext.get_dynamic_embedding("e", 4) is emb
        with pytest.raises(ValueError, match="depends on the table's size"):
            tf_ext.get_dynamic_embedding("e", 4, partitioner=sized)  # passed by the caller: checked
