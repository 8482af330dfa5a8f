"""The public names of tensorflow_ext and its user-facing modules stay exactly these.

A module's public names are its ``__all__`` where it defines one, else its attributes that do not start with ``_``
and are not modules (submodules come and go with internal moves; the names users call must not). The names are read
in a fresh interpreter, so no other test's imports add or hide any. Every ``__all__`` name must also resolve: a
listed name that raises on access is as broken for users as a missing one.

A change here is a change of the public API: it needs a reason of its own, not a refactoring.
"""

import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXPECTED = {
    "tensorflow_ext": (
        "DynamicEmbedding DynamicEmbeddingOptimizer GraphKeys HashTable RowwiseAdagradOptimizer TieredStorage "
        "__version__ "
        "distribute dynamic_embedding "
        "embedding embedding_lookup embedding_lookup_sparse errors examples feature_column "
        "get_dynamic_embedding graph horovod mixed_precision safe_embedding_lookup_sparse serving table "
        "tf_compat tfra utils xla"
    ).split(),
    "tensorflow_ext.embedding": (
        "BloomAdmission CountAdmission DeltaCheckpointSaverListener DynamicEmbedding DynamicEmbeddingShard "
        "DynamicEmbeddingSlot EvictionHook EvictionPolicy EvictionSaverListener ExportedEmbedding GraphKeys "
        "HashPartition InitSpec ShardSaveable add_summaries delta_checkpoints dense_variables "
        "embedding_lookup embedding_lookup_sparse evict get_dynamic_embedding get_dynamic_embeddings "
        "restore_values_only restrict safe_embedding_lookup_sparse string_to_key supported_optimizers "
        "warm_start_from_checkpoint warm_start_op"
    ).split(),
    "tensorflow_ext.distribute": ("WorkQueue").split(),
    "tensorflow_ext.serving": (
        "Follower ServedModel ServingUpdateHook ServingUpdateListener ServingUpdateWriter apply_update export_rows "
        "follow freeze_for_serving freezing in_saved_model_export served_version"
    ).split(),
    "tensorflow_ext.horovod": (
        "Average BroadcastGlobalVariablesHook Compression DistributedOptimizer ModelParallel Sum allreduce "
        "barrier broadcast_global_variables checkpoint estimator export_saved_model get_dynamic_embedding "
        "init input_shard local_rank local_size owner_of parallelism_scope rank run_config shard_input_fn "
        "shutdown single_process size synchronized_next training_hooks"
    ).split(),
    "tensorflow_ext.tfra": (
        "DynamicEmbeddingOptimizer FrequencyRestrictPolicy GraphKeys ModelMode TimestampRestrictPolicy "
        "Variable default_partition_fn embedding_lookup embedding_lookup_sparse embedding_lookup_unique "
        "enable_inference_mode enable_train_mode get_model_mode get_variable restrict "
        "safe_embedding_lookup_sparse"
    ).split(),
    "tensorflow_ext.mixed_precision": (
        "DynamicLossScale FULL HALF HALF_DTYPES LossScaleConfig MODES MixedPrecision MixedPrecisionHealthHook "
        "MixedPrecisionLoggingHook MixedPrecisionOptimizer NoTrainingProgressError PolicyConfig REASONS "
        "SwitchingPolicy build_in build_switched cast_compute compute_dtype graph_step initial_state is_half "
        "no_cast precision_scope reference_loss_scale_step reference_step"
    ).split(),
    "tensorflow_ext.graph": ("ENV_VAR OPTIMIZER_NAME enable_optimizations optimizations_enabled pass_stats").split(),
    "tensorflow_ext.xla": ("BUCKETS_COLLECTION CompileStatsHook compile_bucketed default_buckets enabled").split(),
    "tensorflow_ext.table": ("HashTable").split(),
    "tensorflow_ext.dynamic_embedding": (
        "DynamicEmbeddingOptimizer FrequencyRestrictPolicy GraphKeys ModelMode TimestampRestrictPolicy "
        "Variable default_partition_fn embedding_lookup embedding_lookup_sparse embedding_lookup_unique "
        "enable_inference_mode enable_train_mode get_model_mode get_variable restrict "
        "safe_embedding_lookup_sparse"
    ).split(),
    "tensorflow_ext.errors": ("NotProvidedError OpLibraryNotFoundError TfExtError VersionMismatchError").split(),
}

# Run in a fresh interpreter: {module: {"names": public names, "unresolved": __all__ names that do not resolve}}.
_READ_NAMES = textwrap.dedent(
    """
    import importlib, json, sys, types

    found = {}
    for name in json.loads(sys.argv[1]):
        module = importlib.import_module(name)
        listed = getattr(module, "__all__", None)
        if listed is None:
            names = [n for n in dir(module) if not n.startswith("_")
                     and not isinstance(getattr(module, n), types.ModuleType)]
            unresolved = []
        else:
            names = list(listed)
            unresolved = [n for n in names if not hasattr(module, n)]
        found[name] = {"names": sorted(names), "unresolved": unresolved}
    print("PUBLIC_NAMES=" + json.dumps(found))
    """
)


def test_public_names_are_unchanged():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run(
        [sys.executable, "-c", _READ_NAMES, json.dumps(list(EXPECTED))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("PUBLIC_NAMES=")][-1]
    found = json.loads(line[len("PUBLIC_NAMES=") :])
    problems = []
    for module, expected in EXPECTED.items():
        names = found[module]["names"]
        missing = sorted(set(expected) - set(names))
        added = sorted(set(names) - set(expected))
        if missing or added:
            problems.append("%s: missing %s, added %s" % (module, missing, added))
        if found[module]["unresolved"]:
            problems.append("%s: listed in __all__ but not resolvable: %s" % (module, found[module]["unresolved"]))
    assert not problems, "the public API changed:\n  " + "\n  ".join(problems)
