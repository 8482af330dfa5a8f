"""tensorflow_ext (tf_ext): dynamic embeddings and a fast hash-table engine for TensorFlow 2.15 in TF1 graph mode.

    import tensorflow_ext as tf_ext
    table = tf_ext.HashTable(...)
    emb = tf_ext.get_dynamic_embedding("user", dim=16)
    big = tf_ext.get_dynamic_embedding("item", dim=32, storage=tf_ext.TieredStorage("2GB", "/mnt/ssd/tiers"))

`import tensorflow_ext` registers the library's ops and kernels with TensorFlow (it imports TensorFlow and loads
``_tf_ext_ops.so``), so a process that only imports the package can load a SavedModel or a MetaGraph that holds
tf_ext tables, or serve them as a parameter-server task. The Python API modules are imported lazily (PEP 562): the
first use of a public name imports its submodule.
"""

import importlib as _importlib
import os as _os
import sys as _sys

from tensorflow_ext import errors
from tensorflow_ext.version import __version__

# public name -> (candidate modules, attribute or None for the module itself)
_LAZY = {
    "HashTable": (("tensorflow_ext.table.table_ops",), "HashTable"),
    "TieredStorage": (("tensorflow_ext.table.tiered",), "TieredStorage"),
    "get_dynamic_embedding": (("tensorflow_ext.embedding",), "get_dynamic_embedding"),
    "embedding_lookup": (("tensorflow_ext.embedding",), "embedding_lookup"),
    "embedding_lookup_sparse": (("tensorflow_ext.embedding",), "embedding_lookup_sparse"),
    "safe_embedding_lookup_sparse": (("tensorflow_ext.embedding",), "safe_embedding_lookup_sparse"),
    "DynamicEmbedding": (("tensorflow_ext.embedding",), "DynamicEmbedding"),
    "GraphKeys": (("tensorflow_ext.embedding",), "GraphKeys"),
    "feature_column": (("tensorflow_ext.embedding.feature_column",), None),
    "mixed_precision": (("tensorflow_ext.mixed_precision",), None),
    "table": (("tensorflow_ext.table",), None),
    "embedding": (("tensorflow_ext.embedding",), None),
    "serving": (("tensorflow_ext.serving",), None),
    "graph": (("tensorflow_ext.graph",), None),
    "utils": (("tensorflow_ext.utils",), None),
    "tfra": (("tensorflow_ext.tfra",), None),
    "dynamic_embedding": (("tensorflow_ext.dynamic_embedding",), None),  # TFRA's module name (`import ... as tfra`)
    "horovod": (("tensorflow_ext.horovod",), None),
    "distribute": (("tensorflow_ext.distribute",), None),
    "tf_compat": (("tensorflow_ext.tf_compat",), None),
    "xla": (("tensorflow_ext.xla",), None),
    "DynamicEmbeddingOptimizer": (("tensorflow_ext.tfra",), "DynamicEmbeddingOptimizer"),
    "RowwiseAdagradOptimizer": (("tensorflow_ext.optimizers",), "RowwiseAdagradOptimizer"),
    "examples": (("tensorflow_ext.examples",), None),
}

__all__ = ["__version__", "errors"] + sorted(_LAZY)


def _installed_tf_version():
    """tf.__version__ if TF is imported, else the installed distribution's version (no TF import: fast)."""
    tf = _sys.modules.get("tensorflow")
    if tf is not None and getattr(tf, "__version__", None):
        return tf.__version__
    from importlib import metadata  # pylint: disable=import-outside-toplevel

    for dist in (
        "tensorflow",
        "tensorflow-cpu",
        "tensorflow-gpu",
        "tensorflow-intel",
        "tensorflow-aarch64",
        "tf-nightly",
        "tf-nightly-cpu",
    ):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _check_tf_at_import():
    if _os.environ.get("TF_EXT_SKIP_VERSION_CHECK") == "1":
        return
    installed = _installed_tf_version()
    if installed is None:
        raise ImportError(
            "tensorflow_ext needs TensorFlow 2.15.x: `pip install tensorflow-cpu==2.15.1` " "(or tensorflow==2.15.1)"
        )
    from tensorflow_ext.utils import loader  # pylint: disable=import-outside-toplevel

    loader.check_tf_version(installed)


_check_tf_at_import()


def _register_ops_at_import():
    """Loads the op library now: TF needs the op defs and kernels before it reads a graph that uses them.

    Without this, `tf.saved_model.load`, `import_meta_graph` and a `tf.distribute.Server` ps task fail with
    "Op type not registered 'TfExtTableHandle'" in a process that imported tensorflow_ext but built no tf_ext op.
    The gradient functions of the lookup ops are registered too (continuing training from an imported MetaGraph).
    """
    from tensorflow_ext.utils import loader  # pylint: disable=import-outside-toplevel

    loader.load_ops()
    _importlib.import_module("tensorflow_ext.embedding.embedding_ops")
    # replica_device_setters created from now on place tf_ext tables on parameter servers.
    _importlib.import_module("tensorflow_ext.tf_compat").install("replica_device_setter_ps_ops")


_register_ops_at_import()


def _tfra_attribute(embedding, name):
    """`embedding.<name>` for a name `DynamicEmbedding` does not define: tensorflow_ext.tfra's answer."""
    return _importlib.import_module("tensorflow_ext.tfra").embedding_attribute(embedding, name)


def _answer_tfra_attributes_on_embeddings():
    """Makes `emb.upsert`, `emb.lookup`, `emb.restrict`, `emb.clear`, ... (TFRA's `Variable` attributes) work on every
    `DynamicEmbedding`: the embedding layer sends the names it does not define to `_tfra_attribute`, which imports
    tensorflow_ext.tfra when first asked. The package root registers it because the embedding layer may not import
    the TFRA module above it."""
    _importlib.import_module("tensorflow_ext.embedding.variable").resolve_other_attributes_with(_tfra_attribute)


_answer_tfra_attributes_on_embeddings()


# TFRA's top-level names that tensorflow_ext does not provide: asking for one imports tensorflow_ext.tfra, whose
# _TOP_LEVEL_INSTEAD says what to use instead. Any other unknown name raises AttributeError without importing
# anything (hasattr(tf_ext, name) has no side effects). Kept equal to tfra._TOP_LEVEL_INSTEAD's keys (a test checks).
_TFRA_NAMES = frozenset(
    (
        "Checkpoint CuckooHashTable CuckooHashTableConfig CuckooHashTableCreator DECheckpoint DEHvdModelCheckpoint "
        "DEHvdSaver DEResourceVariable DistributedVariableWrapper FileSystemSaver HkvEvictStrategy HkvHashTable "
        "HkvHashTableConfig HkvHashTableCreator KVCreator ModelMode RedisTable RedisTableConfig RedisTableCreator "
        "RestrictPolicy ShadowVariable TrainableWrapper Variable WarmStartHook callbacks create_slots data_flow "
        "embedding_lookup_unique embedding_variable enable_inference_mode enable_train_mode get_model_mode "
        "get_variable keras layers math models patch_on_tf patch_on_tf_save_restore ragged_embedding_ops "
        "register_all restrict_policy shadow_ops train trainable_wrapper_filter warm_start"
    ).split()
)


def __getattr__(name):
    spec = _LAZY.get(name)
    if spec is None and name in _TFRA_NAMES:
        tfra = _importlib.import_module("tensorflow_ext.tfra")
        instead = tfra._TOP_LEVEL_INSTEAD  # pylint: disable=protected-access  (a TFRA name: say what to use instead)
        if name in instead:
            raise AttributeError("tensorflow_ext.%s is not provided: %s" % (name, instead[name]))
    if spec is None:
        raise AttributeError("module 'tensorflow_ext' has no attribute %r" % name)
    modules, attr = spec
    missing = []
    for modname in modules:
        try:
            module = _importlib.import_module(modname)
        except ModuleNotFoundError as e:
            # Only swallow "this very module does not exist (yet)"; real import errors inside it propagate.
            if e.name is not None and (modname == e.name or modname.startswith(e.name + ".")):
                missing.append(modname)
                continue
            raise
        value = module if attr is None else getattr(module, attr, None)
        if value is None:
            missing.append("%s.%s" % (modname, attr))
            continue
        globals()[name] = value  # cache: later accesses skip __getattr__
        return value
    raise AttributeError(
        "tensorflow_ext.%s is not available in this build (looked for %s)" % (name, ", ".join(missing))
    )


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
