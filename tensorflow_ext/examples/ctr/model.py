"""The CTR example's model: DeepFM or Wide&Deep on dynamic embeddings, as an Estimator ``model_fn``.

Each of the 26 categorical fields is one table (``tf_ext.feature_column.categorical_column_with_dynamic_embedding``;
with ``static_buckets``, the baseline: a static hashed ``embedding_column``), read through
``tf.compat.v1.feature_column.input_layer``; the tables store their rows as float32 or, compact, as bfloat16 or
float16 (``value_dtype``, optionally the optimizer's slots too). One optimizer (a stock ``tf.compat.v1.train`` one, or
``tf_ext.RowwiseAdagradOptimizer``) trains the tables and the dense weights (Horovod's ``DistributedOptimizer``
around it under ``--distributed``). The evaluation graph only
reads the tables (unseen ids are not inserted), and reports each table's key count as a metric.
"""

import tensorflow as tf

from tensorflow_ext import embedding
from tensorflow_ext.embedding import feature_column
from tensorflow_ext.examples import synthetic
from tensorflow_ext.examples.ctr import progress
from tensorflow_ext.examples.ctr import tiers
from tensorflow_ext.optimizers import RowwiseAdagradOptimizer


def model_fn(features, labels, mode, params):
    """DeepFM or Wide&Deep on dynamic embeddings (an Estimator ``model_fn``).

    With ``params["distributed"] == "model_parallel"`` (under horovodrun) its tables are
    model-parallel; with any ``distributed`` the optimizer is Horovod's (tf_ext's
    ``DistributedOptimizer``).

    Args:
      features: dict with ``C1..C26`` (int64 ids, -1 missing; or strings, "" missing)
        and ``I1..I13`` (float, log counts).
      labels: float 0/1 ``[batch]`` (None in PREDICT).
      mode: a ``tf.estimator.ModeKeys``.
      params: dict with ``model``, ``dim``, ``hidden_units``, ``optimizer``,
        ``learning_rate``, ``num_shards``, ``string_ids``, ``init_stddev``,
        ``log_every``, ``batch_size`` (optional: ``distributed``, ``progress``, the
        row storage: ``value_dtype`` (a dtype name, default "float32"), ``slot_dtype``
        ("float32" or "same"), ``rounding``, and the tiers: ``memory_budget`` (bytes for
        all tables, None: in memory), ``tier_path``, ``disk_budget``, ``tier_policy``,
        ``cardinalities`` (see :func:`tiers.storages`)).

    Returns:
      A ``tf.estimator.EstimatorSpec``.
    """
    if params.get("distributed") == "model_parallel":
        with _horovod_module().parallelism_scope("model"):
            return _model_fn(features, labels, mode, params)
    return _model_fn(features, labels, mode, params)


def _horovod_module():
    """``tensorflow_ext.horovod`` (only for --distributed: plain runs never import Horovod)."""
    import tensorflow_ext.horovod as hvd  # pylint: disable=g-import-not-at-top

    return hvd


def _model_fn(features, labels, mode, params):
    dense = tf.compat.v1.feature_column.input_layer(features, _dense_columns())  # [B, 13]
    if params["model"] == "deepfm":
        logits = _deepfm_logits(features, dense, params)
    else:
        logits = _wide_deep_logits(features, dense, params)
    logits = tf.squeeze(logits, axis=1)
    probs = tf.sigmoid(logits)

    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"probability": probs, "logit": logits})

    labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
    per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    loss = tf.reduce_mean(per_example)
    tables = _dynamic_tables()
    total_keys = tf.add_n(list(tables.values())) if tables else tf.constant(0, tf.int64)
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = _eval_metrics(labels, probs, per_example, tables, total_keys)
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    prefetch = tiers.prefetch_op(features, _field_embeddings())
    return _train_spec(mode, loss, labels, probs, logits, total_keys, params, prefetch)


def _deepfm_logits(features, dense, params):
    """DeepFM: first-order weights + factorization machine + MLP, all on one table per field; ``[B, 1]``."""
    num_fields = synthetic.NUM_CATEGORICAL
    dim = params["dim"]
    # One table per field holds [first-order weight | FM/deep vector] side by side,
    # so one probe per id serves all three parts of the model.
    with tf.compat.v1.variable_scope("embeddings"):
        emb = tf.compat.v1.feature_column.input_layer(features, _categorical_columns(params, dim + 1, "emb"))
    emb = tf.reshape(emb, [-1, num_fields, dim + 1])
    # tf.split rather than slicing: its gradient is one concat, where a slice's (StridedSliceGrad, strided
    # writes into a zeroed [B, fields, dim + 1]) cost ~1.5 ms of a ~10 ms training step, same values.
    first, vecs = tf.split(emb, [1, dim], axis=2)
    first_order = tf.reduce_sum(first, axis=[1, 2], keepdims=False)[:, None]
    sum_v = tf.reduce_sum(vecs, axis=1)
    fm = 0.5 * tf.reduce_sum(tf.square(sum_v) - tf.reduce_sum(tf.square(vecs), axis=1), axis=1, keepdims=True)
    with tf.compat.v1.variable_scope("deep"):
        deep = _mlp(tf.concat([tf.reshape(vecs, [-1, num_fields * dim]), dense], 1), params["hidden_units"])
    with tf.compat.v1.variable_scope("linear"):
        dense_linear = _dense(dense, 1, "dense")
    return first_order + fm + deep + dense_linear


def _wide_deep_logits(features, dense, params):
    """Wide&Deep: a linear model on per-id weights (dim-1 tables) + an MLP on embeddings (dim tables); ``[B, 1]``."""
    with tf.compat.v1.variable_scope("wide"):
        wide_ids = tf.compat.v1.feature_column.input_layer(features, _categorical_columns(params, 1, "wide"))
        wide = tf.reduce_sum(wide_ids, axis=1, keepdims=True) + _dense(dense, 1, "dense")
    with tf.compat.v1.variable_scope("deep"):
        emb = tf.compat.v1.feature_column.input_layer(features, _categorical_columns(params, params["dim"], "emb"))
        deep = _mlp(tf.concat([emb, dense], 1), params["hidden_units"])
    return wide + deep


def _dense(x, units, name, activation=None):
    """A fully connected layer from plain variables (keras-free)."""
    with tf.compat.v1.variable_scope(name):
        w = tf.compat.v1.get_variable(
            "kernel", [x.shape[-1], units], initializer=tf.compat.v1.glorot_uniform_initializer()
        )
        b = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
        y = tf.matmul(x, w) + b
        return activation(y) if activation is not None else y


def _mlp(x, hidden_units):
    for i, units in enumerate(hidden_units):
        x = _dense(x, units, "hidden_%d" % i, tf.nn.relu)
    return _dense(x, 1, "logit")


def _policies(params):
    """get_dynamic_embedding's admission= and eviction= from the flags (new objects per graph)."""
    out = {}
    if params.get("admission"):
        if params.get("bloom_counters"):
            out["admission"] = embedding.BloomAdmission(params["admission"], num_counters=params["bloom_counters"])
        else:
            out["admission"] = embedding.CountAdmission(params["admission"])
    if params.get("capacity") or params.get("steps_to_live") is not None:
        out["eviction"] = embedding.EvictionPolicy(
            capacity=params.get("capacity"),
            steps_to_live=params.get("steps_to_live"),
            every_n_steps=params.get("evict_every"),
        )
    return out


def _categorical_columns(params, dim, suffix):
    init = tf.compat.v1.truncated_normal_initializer(0.0, params["init_stddev"])
    dtype = tf.string if params["string_ids"] else tf.int64
    if params.get("static_buckets"):
        # The baseline: a static [buckets, dim] variable per field, ids hashed into buckets (collisions share a row).
        tf_fc = tf.compat.v1.feature_column
        return [
            tf_fc.embedding_column(
                tf_fc.categorical_column_with_hash_bucket(key, params["static_buckets"], dtype=dtype),
                dim,
                combiner="sum",
                initializer=init,
            )
            for key in synthetic.CATEGORICAL_KEYS
        ]
    # Integer ids come dense, with -1 for a missing value (strings: "", always missing).
    ignore = None if params["string_ids"] else -1
    storages = tiers.storages(params) or {}
    return [
        feature_column.categorical_column_with_dynamic_embedding(
            key,
            dim,
            dtype=dtype,
            initializer=init,
            combiner="sum",
            num_shards=params["num_shards"],
            name="%s_%s" % (key, suffix),
            ignore_value=ignore,
            **_policies(params),
            **_row_storage(params),
            **_tier(storages, "%s_%s" % (key, suffix)),
        )
        for key in synthetic.CATEGORICAL_KEYS
    ]


def _tier(storages, column_name):
    """The column's storage= (its tf_ext.TieredStorage) with --memory_budget; none otherwise."""
    storage = storages.get(column_name)
    return {} if storage is None else {"storage": storage}


def _field_embeddings():
    """``{field key: [the DynamicEmbeddings of its tables]}`` of the current graph (a table's name holds its
    column's, ``<key>_<suffix>``)."""
    out = {}
    for emb in embedding.get_dynamic_embeddings():
        for key in synthetic.CATEGORICAL_KEYS:
            if any(part.startswith(key + "_") for part in emb.name.split("/")):
                out.setdefault(key, []).append(emb)
    return out


def _row_storage(params):
    """The feature columns' value_dtype=, slot_dtype= and rounding= from the flags; none of them for float32 rows
    (the library's defaults)."""
    value_dtype = params.get("value_dtype", "float32")
    if value_dtype == "float32":
        return {}
    out = {"value_dtype": tf.as_dtype(value_dtype)}
    if params.get("slot_dtype") == "same":
        out["slot_dtype"] = out["value_dtype"]
    if params.get("rounding"):
        out["rounding"] = params["rounding"]
    return out


def _dense_columns():
    return [tf.compat.v1.feature_column.numeric_column(k) for k in synthetic.DENSE_KEYS]


def _dynamic_tables():
    """``{name: size tensor}`` for every dynamic embedding in the current graph."""
    return {emb.name: emb.size() for emb in embedding.get_dynamic_embeddings()}


def _total_table_bytes():
    """int64 scalar: bytes held by the embedding tables of the current graph (dynamic embeddings: their
    memory_bytes; static ones, --static_buckets: the variables and their optimizer slots)."""
    parts = [emb.memory_bytes() for emb in embedding.get_dynamic_embeddings()]
    static = sum(
        v.shape.num_elements() * v.dtype.size
        for v in tf.compat.v1.global_variables()
        if "embedding_weights" in v.op.name and v.shape.is_fully_defined()
    )
    if static:
        parts.append(tf.constant(static, tf.int64))
    return tf.add_n(parts) if parts else tf.constant(0, tf.int64)


def _short_table_name(name):
    # "embeddings/input_layer/C3_emb/embedding_weights" -> "C3_emb" (wide tables: "C3_wide")
    parts = [p for p in name.replace(":0", "").split("/") if p]
    keep = [p for p in parts if p not in ("embeddings", "wide", "deep", "embedding_weights", "input_layer")]
    return "/".join(keep) or name


def _eval_metrics(labels, probs, per_example, tables, total_keys):
    """The evaluation's metrics: AUC, log loss, label and prediction means, and the key count of every table."""
    metrics = {
        "auc": tf.compat.v1.metrics.auc(labels, probs, num_thresholds=2000, summation_method="careful_interpolation"),
        "logloss": tf.compat.v1.metrics.mean(per_example),
        "label_mean": tf.compat.v1.metrics.mean(labels),
        "prediction_mean": tf.compat.v1.metrics.mean(probs),
        "table_keys/total": (total_keys, tf.no_op()),
    }
    for name, size in sorted(tables.items()):
        metrics["table_keys/%s" % _short_table_name(name)] = (size, tf.no_op())
    return metrics


def _optimizer(params):
    """The optimizer named by ``params["optimizer"]``: a stock ``tf.compat.v1.train`` one, or
    ``tf_ext.RowwiseAdagradOptimizer`` (one accumulator per row); Horovod's around it if distributed."""
    lr = params["learning_rate"]
    name = params["optimizer"]
    if name == "adagrad":
        opt = tf.compat.v1.train.AdagradOptimizer(lr, initial_accumulator_value=0.1)
    elif name == "rowwise_adagrad":
        opt = RowwiseAdagradOptimizer(lr, initial_accumulator_value=0.1)
    elif name == "adam":
        opt = tf.compat.v1.train.AdamOptimizer(lr)
    elif name == "ftrl":
        opt = tf.compat.v1.train.FtrlOptimizer(lr)
    elif name == "sgd":
        opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
    elif name == "momentum":
        opt = tf.compat.v1.train.MomentumOptimizer(lr, 0.9)
    else:
        opt = tf.compat.v1.train.RMSPropOptimizer(lr)
    if params.get("distributed"):
        # How the dense gradients are reduced (--compression, --topk_ratio, --node_size): only those given, so the
        # library's defaults and its TF_EXT_HVD_* overrides hold otherwise.
        opt = _horovod_module().DistributedOptimizer(opt, **params.get("allreduce", {}))
    return opt


def _train_spec(mode, loss, labels, probs, logits, total_keys, params, prefetch=None):
    """The training spec: the optimizer's step (with the prefetch of the next batch's rows beside it, when tiered
    tables have one), the summaries, and the progress hook."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = _optimizer(params)
    train_op = optimizer.minimize(loss, global_step=global_step)
    if prefetch is not None:
        # No dependency between the two: the next batch's disk reads overlap this step's work.
        train_op = tf.group(train_op, prefetch, name="train_and_prefetch")

    # Per table: tf_ext/<table>/size, memory_bytes and bytes_per_key (and its tiers' when tiered).
    embedding.add_summaries()
    tf.compat.v1.summary.scalar("ctr/label_mean", tf.reduce_mean(labels))
    tf.compat.v1.summary.scalar("ctr/prediction_mean", tf.reduce_mean(probs))
    tf.compat.v1.summary.histogram("ctr/logits", logits)
    hook = progress.ProgressHook(
        loss,
        total_keys,
        _total_table_bytes(),
        global_step,
        params["log_every"],
        params["batch_size"] * params.get("num_ranks", 1),
        params.get("progress", True),
        "on rank 0" if params.get("distributed") == "model_parallel" else "",
        tier_stats=tiers.stats_tensor(),
        untimed_steps=params.get("untimed_steps", 1),
    )
    # compression="auto" chose per fused buffer while the graph was built (None for the other reductions).
    hook.compression_choices = getattr(optimizer, "compression_choices", None)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=[hook])
