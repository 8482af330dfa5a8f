"""Feature columns backed by dynamic embeddings (``tf_ext.feature_column``).

Two constructors, both returning a dense feature column that works with the TF1
``tf.compat.v1.feature_column.input_layer`` (the Estimator way) and with the v2
feature-column plumbing (``FeatureTransformationCache`` / ``StateManager``, e.g.
``DenseFeatures``):

* :func:`categorical_column_with_dynamic_embedding` reads raw ids (int64 or
  string) of one feature and embeds them in a dynamic embedding: there is no
  vocabulary, no ``num_buckets`` and no hash collisions; every id seen in
  training gets its own row.
* :func:`embedding_column` backs any TF categorical column
  (``categorical_column_with_identity``, ``..._with_hash_bucket``,
  ``..._with_vocabulary_list``, ``weighted_categorical_column``, ...) with a
  dynamic embedding instead of a ``[num_buckets, dim]`` variable, so only the
  buckets that occur hold memory.

Example (inside an Estimator ``model_fn``)::

    import tensorflow_ext as tf_ext
    cols = [tf_ext.feature_column.categorical_column_with_dynamic_embedding(
                "C%d" % i, dim=8) for i in range(1, 27)]
    net = tf.compat.v1.feature_column.input_layer(features, cols)  # [batch, 26 * 8]
    ...
    train_op = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss, global_step)

Semantics (those of TF's categorical columns and ``embedding_column``, except
that every raw integer id is a key):

* Input may be a ``SparseTensor`` or a dense ``Tensor`` of ids (rank 1 is
  expanded to ``[batch, 1]``).
* Raw ids (:func:`categorical_column_with_dynamic_embedding`): every integer is
  an id, negative ones included (signed 64-bit hashed ids are negative half
  the time). A missing value is an entry left out of the ``SparseTensor`` (as
  ``tf.io.VarLenFeature`` parsing gives); for dense integer input padded with
  a marker, name it with ``ignore_value=`` (e.g. ``-1``). For string ids the
  empty string ``""`` is missing, in sparse and dense input.
* Ids of a TF categorical column (:func:`embedding_column`) follow TF: dense
  input drops ``-1`` / ``""``, and negative bucket ids (e.g. out-of-vocabulary
  ids of a vocabulary column with ``default_value=-1``) are dropped with their
  weights.
* Each example's ids are pooled with ``combiner`` (``"mean"``, ``"sqrtn"`` or
  ``"sum"``); an example with no valid id gets a zero vector (the safe lookup,
  ``use_safe_embedding_lookup=True``, as in TF).
* The table is created with ``tf_ext.get_dynamic_embedding("embedding_weights",
  ...)`` under the current variable scope; ``input_layer`` opens a scope named
  after the column (``<key>_embedding`` by default), so the table's name is e.g.
  ``input_layer/C1_embedding/embedding_weights``. Building the same columns
  again under a ``variable_scope(..., reuse=True)`` (or ``AUTO_REUSE``) reuses
  the tables.
* String ids are handed to the dynamic embedding as strings; it maps them to
  int64 keys by its documented 64-bit fingerprint.
* Tables are trained by stock ``tf.compat.v1.train`` optimizers, saved by the
  Estimator's ``Saver`` and, in eval/predict graphs, only read (unknown ids get
  the initializer's default, no key is inserted).

Not supported (raise ``ValueError``): sequence categorical columns.
"""

import collections
import math

import numpy as np
import tensorflow as tf

from tensorflow_ext.tf_compat import internals

__all__ = [
    "DynamicEmbeddingColumn",
    "DynamicIdColumn",
    "categorical_column_with_dynamic_embedding",
    "embedding_column",
]

_EMBEDDING_NAME = "embedding_weights"
# TF's categorical columns come in a v1 and a v2 class; a column may be either (or both, as ours are).
_CATEGORICAL_COLUMNS = (internals.CategoricalColumn, internals.CategoricalColumnV1)
_SEQUENCE_COLUMNS = (internals.SequenceCategoricalColumn, internals.SequenceCategoricalColumnV1)


class _Api(
    collections.namedtuple("_Api", ("get_dynamic_embedding", "embedding_lookup_sparse", "safe_embedding_lookup_sparse"))
):
    """The dynamic embedding functions the columns call (one place to get them)."""


def _api():
    """Returns the dynamic embedding API the columns build on.

    Imported lazily so that importing this module does not load the op library
    (and so that there is no import cycle with ``tensorflow_ext.embedding``).

    Returns:
      An ``_Api`` tuple of ``get_dynamic_embedding``,
      ``embedding_lookup_sparse`` and ``safe_embedding_lookup_sparse``.
    """
    from tensorflow_ext.embedding import lookup as _lookup  # pylint: disable=g-import-not-at-top
    from tensorflow_ext.embedding import creation as _creation  # pylint: disable=g-import-not-at-top

    return _Api(_creation.get_dynamic_embedding, _lookup.embedding_lookup_sparse, _lookup.safe_embedding_lookup_sparse)


def _default_initializer(dim):
    # TF's embedding_column default: truncated normal with stddev 1/sqrt(dim).
    return tf.compat.v1.truncated_normal_initializer(mean=0.0, stddev=1.0 / math.sqrt(dim))


def _check_dim(dim):
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError("dim must be a positive int, got %r." % (dim,))


def _check_combiner(combiner):
    from tensorflow_ext.embedding import lookup as _lookup  # pylint: disable=g-import-not-at-top

    if combiner not in _lookup.COMBINERS:
        raise ValueError("combiner must be one of %s, got %r." % (_lookup.COMBINERS, combiner))


def _check_num_shards(num_shards):
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError("num_shards must be a positive int, got %r." % (num_shards,))


def _drop_empty_strings(sp_ids):
    """Removes the missing-value marker of string ids, ``""``, from ``sp_ids``."""
    return tf.sparse.retain(sp_ids, tf.not_equal(sp_ids.values, ""))


def _drop_negative_bucket_ids(sp_ids, sp_weights):
    """Removes negative ids (and their weights) of a TF categorical column.

    TF's bucket ids are in ``[0, num_buckets)``; -1 marks a missing or
    out-of-vocabulary value, which TF's embedding lookups drop.
    """
    keep = tf.greater_equal(sp_ids.values, 0)
    sp_ids = tf.sparse.retain(sp_ids, keep)
    if sp_weights is not None:
        sp_weights = tf.sparse.retain(sp_weights, keep)
    return sp_ids, sp_weights


def _dense_to_sparse(ids, ignore_value):
    """A dense ``Tensor`` of ids as a ``SparseTensor``, without the ``ignore_value`` cells.

    ``ignore_value=None`` keeps every cell (every integer is an id).
    """
    if ignore_value is not None:
        return internals.to_sparse_input_and_drop_ignore_values(ids, ignore_value)
    with tf.name_scope("to_sparse_input"):
        ids = tf.convert_to_tensor(ids)
        indices = tf.where(tf.ones_like(ids, dtype=tf.bool))  # row-major, as reshape below
        return tf.SparseTensor(indices, tf.reshape(ids, [-1]), tf.shape(ids, out_type=tf.int64))


class DynamicIdColumn(
    *_CATEGORICAL_COLUMNS, collections.namedtuple("DynamicIdColumn", ("key", "dtype", "ignore_value"), defaults=(None,))
):
    """A categorical column of raw ids, with no vocabulary and no bucket count.

    Made by :func:`categorical_column_with_dynamic_embedding` as the source of a
    :class:`DynamicEmbeddingColumn`. Its ids are the feature's own values
    (int64, or strings). Every integer is an id, negative ones included; string
    ids drop ``""`` (missing), and dense integer input drops ``ignore_value``
    when one is set. It has no ``num_buckets``: columns that need one
    (``indicator_column``, ``linear_model``) cannot use it.

    Attributes:
      key: the feature name (a key of the features dict).
      dtype: ``tf.int64`` (integer inputs are cast to it) or ``tf.string``.
      ignore_value: for integer ids, the value that marks missing cells of
        dense input, or None (every cell is an id). Always None for strings.
    """

    @property
    def _is_v2_column(self):
        return True

    @property
    def name(self):
        """The feature key."""
        return self.key

    @property
    def parse_example_spec(self):
        """``{key: VarLenFeature(dtype)}``."""
        return {self.key: tf.io.VarLenFeature(self.dtype)}

    @property
    def _parse_example_spec(self):
        return self.parse_example_spec

    @property
    def num_buckets(self):
        """Not available: the ids of a dynamic embedding are unbounded.

        Raises:
          ValueError: always.
        """
        raise ValueError(
            "Column %r holds raw ids for a dynamic embedding and has no num_buckets; use it "
            "through tf_ext.feature_column.categorical_column_with_dynamic_embedding." % self.key
        )

    @property
    def _num_buckets(self):
        return self.num_buckets

    def _transform_input_tensor(self, input_tensor):
        if not isinstance(input_tensor, tf.SparseTensor):
            input_tensor = tf.convert_to_tensor(input_tensor)
        if self.dtype == tf.string:
            if input_tensor.dtype != tf.string:
                raise ValueError(
                    "Column %r has dtype string but its input has dtype %s." % (self.key, input_tensor.dtype.name)
                )
            if not isinstance(input_tensor, tf.SparseTensor):
                input_tensor = _dense_to_sparse(input_tensor, "")
            return _drop_empty_strings(input_tensor)
        if not input_tensor.dtype.is_integer:
            raise ValueError(
                "Column %r has dtype %s but its input has dtype %s; integer ids expected."
                % (self.key, self.dtype.name, input_tensor.dtype.name)
            )
        sp_ids = input_tensor
        if not isinstance(sp_ids, tf.SparseTensor):
            sp_ids = _dense_to_sparse(sp_ids, self.ignore_value)
        if sp_ids.dtype != tf.int64:
            sp_ids = tf.SparseTensor(sp_ids.indices, tf.cast(sp_ids.values, tf.int64), sp_ids.dense_shape)
        return sp_ids

    def transform_feature(self, transformation_cache, state_manager):
        """Reads the feature and returns its ids with missing values removed.

        Dense input is converted to a ``SparseTensor`` (dropping the cells
        equal to ``ignore_value``, if set); integer ids are cast to int64 and
        all kept, negative ones included; empty strings are dropped.

        Args:
          transformation_cache: a ``FeatureTransformationCache`` holding the
            raw feature under ``key``.
          state_manager: a ``StateManager`` or None (unused by this column,
            passed on to the cache).

        Returns:
          A ``SparseTensor`` of ids (int64, or string for string columns).

        Raises:
          ValueError: the input's dtype does not match the column's (string
            column with non-string input, or integer column with non-integer
            input).
        """
        return self._transform_input_tensor(transformation_cache.get(self.key, state_manager))

    def _transform_feature(self, inputs):
        return self._transform_input_tensor(inputs.get(self.key))

    def get_sparse_tensors(self, transformation_cache, state_manager):
        """Returns the column's ids, unweighted (v2 plumbing).

        Args:
          transformation_cache: a ``FeatureTransformationCache``; the ids are
            the cached output of :meth:`transform_feature`.
          state_manager: a ``StateManager`` or None (passed on to the cache).

        Returns:
          ``CategoricalColumn.IdWeightPair(ids, None)`` where ``ids`` is the
          ``SparseTensor`` of :meth:`transform_feature`.
        """
        return internals.CategoricalColumn.IdWeightPair(transformation_cache.get(self, state_manager), None)

    def _get_sparse_tensors(self, inputs, weight_collections=None, trainable=None):
        del weight_collections, trainable
        return internals.CategoricalColumn.IdWeightPair(inputs.get(self), None)

    @property
    def parents(self):
        """The feature key."""
        return [self.key]


class DynamicEmbeddingColumn(
    internals.DenseColumn,
    internals.DenseColumnV1,
    collections.namedtuple(
        "DynamicEmbeddingColumn",
        (
            "categorical_column",
            "dimension",
            "combiner",
            "initializer",
            "num_shards",
            "devices",
            "trainable",
            "use_safe_embedding_lookup",
            "max_norm",
            "column_name",
            "embedding_kwargs",
        ),
    ),
):
    """A dense column: a categorical column's ids embedded in a dynamic embedding.

    Made by :func:`categorical_column_with_dynamic_embedding` and
    :func:`embedding_column`; see there. ``embedding_kwargs`` is a tuple of
    ``(name, value)`` pairs passed on to ``tf_ext.get_dynamic_embedding``.

    Attributes:
      categorical_column: the source of the ids (a :class:`DynamicIdColumn`
        or any TF categorical column).
      dimension: the embedding width (positive int).
      combiner: ``"mean"``, ``"sqrtn"`` or ``"sum"``.
      initializer: the initializer (or constant) of new keys' rows.
      num_shards: number of table shards.
      devices: tuple of device strings, one per shard, or None.
      trainable: whether optimizers train the table.
      use_safe_embedding_lookup: whether ``safe_embedding_lookup_sparse`` is
        used.
      max_norm: l2 clipping norm of the embeddings before pooling, or None.
      column_name: the explicit column name, or None (see :attr:`name`).
      embedding_kwargs: sorted tuple of ``(name, value)`` pairs for
        ``tf_ext.get_dynamic_embedding``.
    """

    @property
    def _is_v2_column(self):
        return bool(getattr(self.categorical_column, "_is_v2_column", False))

    @property
    def name(self):
        """``<categorical column name>_embedding`` unless a name was given."""
        if self.column_name:
            return self.column_name
        return "%s_embedding" % self.categorical_column.name

    @property
    def key_dtype(self):
        """The dtype of the table's keys: ``tf.string`` for string raw ids, else ``tf.int64``."""
        if isinstance(self.categorical_column, DynamicIdColumn) and self.categorical_column.dtype == tf.string:
            return tf.string
        return tf.int64

    @property
    def parse_example_spec(self):
        """The categorical column's parse spec."""
        return self.categorical_column.parse_example_spec

    @property
    def _parse_example_spec(self):
        return self.categorical_column._parse_example_spec  # pylint: disable=protected-access

    def transform_feature(self, transformation_cache, state_manager):
        """Transforms the underlying categorical column (v2 plumbing).

        Args:
          transformation_cache: a ``FeatureTransformationCache``.
          state_manager: a ``StateManager`` or None (passed on to the cache).

        Returns:
          The categorical column's transformed feature (as cached by
          ``transformation_cache``), normally a ``SparseTensor`` of ids.
        """
        return transformation_cache.get(self.categorical_column, state_manager)

    def _transform_feature(self, inputs):
        return inputs.get(self.categorical_column)

    @property
    def variable_shape(self):
        """``TensorShape([dimension])``."""
        return tf.TensorShape([self.dimension])

    @property
    def _variable_shape(self):
        return self.variable_shape

    @property
    def parents(self):
        """The categorical column."""
        return [self.categorical_column]

    # ------------------------------------------------------------------ tables

    def _make_embedding(self, trainable=True):
        """Creates (or, under reuse, gets) the table in the current variable scope.

        Args:
          trainable: whether the caller wants the table trained (ANDed with the
            column's ``trainable``).

        Returns:
          The ``DynamicEmbedding``.
        """
        kwargs = dict(self.embedding_kwargs or ())
        if self.devices is not None:
            kwargs["devices"] = list(self.devices)
        return _api().get_dynamic_embedding(
            _EMBEDDING_NAME,
            dim=self.dimension,
            key_dtype=self.key_dtype,
            initializer=self.initializer,
            num_shards=self.num_shards,
            trainable=bool(self.trainable and (trainable is None or trainable)),
            **kwargs,
        )

    def create_state(self, state_manager):
        """Creates the dynamic embedding (v2 plumbing: ``DenseFeatures.build``).

        Args:
          state_manager: the layer's ``StateManager``; the table is registered
            with it as the resource ``"embedding_weights"``.
        """
        emb = self._make_embedding(trainable=internals.state_manager_trainable(state_manager))
        state_manager.add_resource(self, _EMBEDDING_NAME, emb)

    def _embedding_for_v2(self, state_manager):
        if state_manager is not None:
            try:
                if state_manager.has_resource(self, _EMBEDDING_NAME):
                    return state_manager.get_resource(self, _EMBEDDING_NAME)
            except NotImplementedError:
                # TF's base StateManager has no resource registry: fall through
                # and create the table under the variable scope.
                pass
        # No state manager (or create_state was not called): make the table under
        # the current variable scope, in a sub-scope named after the column.
        with tf.compat.v1.variable_scope(internals.feature_column_scope_name(self)):
            return self._make_embedding()

    # ------------------------------------------------------------------ lookup

    def _pool(self, sparse_tensors, embedding):
        sp_ids = sparse_tensors.id_tensor
        sp_weights = sparse_tensors.weight_tensor
        if not isinstance(self.categorical_column, DynamicIdColumn):
            # TF's bucket ids: -1 is missing / out of vocabulary (the raw ids of a
            # DynamicIdColumn are all keys and are not filtered here).
            if sp_ids.dtype == tf.string:
                sp_ids = _drop_empty_strings(sp_ids)
            else:
                sp_ids, sp_weights = _drop_negative_bucket_ids(sp_ids, sp_weights)
        api = _api()
        rank = tf.compat.dimension_value(sp_ids.dense_shape.get_shape()[0])
        with tf.name_scope("%s_weights" % self.name):
            if self.use_safe_embedding_lookup or rank is None or rank > 2:
                return api.safe_embedding_lookup_sparse(
                    embedding, sp_ids, sp_weights, combiner=self.combiner, max_norm=self.max_norm
                )
            return api.embedding_lookup_sparse(
                embedding, sp_ids, sp_weights, combiner=self.combiner, max_norm=self.max_norm
            )

    def get_dense_tensor(self, transformation_cache, state_manager):
        """Returns the pooled embeddings, ``[batch, dimension]`` (v2 plumbing).

        Args:
          transformation_cache: a ``FeatureTransformationCache``.
          state_manager: a ``StateManager`` or None (then the table is made
            under the current variable scope, in a sub-scope named after the
            column).

        Returns:
          A float32 ``Tensor`` ``[batch, dimension]``.

        Raises:
          ValueError: the categorical column is a sequence column.
        """
        self._check_not_sequence()
        sparse_tensors = self.categorical_column.get_sparse_tensors(transformation_cache, state_manager)
        return self._pool(sparse_tensors, self._embedding_for_v2(state_manager))

    def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
        """v1 plumbing (``input_layer``): the table goes in the current variable scope.

        Args:
          inputs: a ``_LazyBuilder``.
          weight_collections: unused: tables live in tf_ext's own collection
            (and in ``TRAINABLE_VARIABLES`` when trainable), not in variable
            collections.
          trainable: whether to train the table (ANDed with the column's).

        Returns:
          A float32 ``Tensor`` ``[batch, dimension]``.

        Raises:
          ValueError: the categorical column is a sequence column.
        """
        del weight_collections
        self._check_not_sequence()
        sparse_tensors = self.categorical_column._get_sparse_tensors(inputs)  # pylint: disable=protected-access
        return self._pool(sparse_tensors, self._make_embedding(trainable=trainable))

    def _check_not_sequence(self):
        if isinstance(self.categorical_column, _SEQUENCE_COLUMNS):
            raise ValueError(
                "Column %s: sequence categorical columns are not supported by dynamic " "embedding columns." % self.name
            )


def _check_common(dim, combiner, num_shards, initializer, max_norm):
    _check_dim(dim)
    _check_combiner(combiner)
    _check_num_shards(num_shards)
    if initializer is not None and not callable(initializer) and not isinstance(initializer, (int, float)):
        raise ValueError("initializer must be a TF initializer, a callable or a number, got %r." % (initializer,))
    if max_norm is not None and (isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or max_norm <= 0):
        raise ValueError("max_norm must be None or a positive number, got %r." % (max_norm,))


def _make_column(
    categorical_column,
    dim,
    combiner,
    initializer,
    num_shards,
    name,
    devices,
    trainable,
    use_safe_embedding_lookup,
    max_norm,
    embedding_kwargs,
):
    """The DynamicEmbeddingColumn both constructors return (arguments checked by the caller)."""
    return DynamicEmbeddingColumn(
        categorical_column=categorical_column,
        dimension=dim,
        combiner=combiner,
        initializer=_default_initializer(dim) if initializer is None else initializer,
        num_shards=num_shards,
        devices=tuple(devices) if devices is not None else None,
        trainable=trainable,
        use_safe_embedding_lookup=use_safe_embedding_lookup,
        max_norm=max_norm,
        column_name=name,
        embedding_kwargs=tuple(sorted(embedding_kwargs.items())),
    )


def categorical_column_with_dynamic_embedding(
    key,
    dim,
    dtype=tf.int64,
    initializer=None,
    combiner="mean",
    num_shards=1,
    name=None,
    devices=None,
    trainable=True,
    use_safe_embedding_lookup=True,
    max_norm=None,
    ignore_value=None,
    **embedding_kwargs,
):
    """A dense column embedding the raw ids of feature ``key`` in a dynamic embedding.

    The feature's values (int ids or strings) are the table's keys: no
    vocabulary, no hash buckets, no collisions. Use the column directly in
    ``tf.compat.v1.feature_column.input_layer`` (or ``DenseFeatures``).

    Every integer is an id, negative ones included (signed 64-bit hashed ids
    are negative half the time). To mark a value missing, leave its entry out
    of the ``SparseTensor`` input (``tf.io.VarLenFeature`` parsing does), or,
    for dense integer input padded with a marker, pass that marker as
    ``ignore_value``. For string ids, ``""`` is missing.

    Args:
      key: the feature name (a key of the features dict).
      dim: embedding width (positive int).
      dtype: ``tf.int64`` (any integer input is cast) or ``tf.string``.
      initializer: a TF initializer or a constant for new keys' rows; each new
        key gets its own draw. Default: truncated normal, stddev ``1/sqrt(dim)``
        (as TF's ``embedding_column``).
      combiner: ``"mean"``, ``"sqrtn"`` or ``"sum"``: how an example's ids are
        pooled.
      num_shards: number of table shards (keys partitioned by hash).
      name: the column's name (also the variable scope of its table in
        ``input_layer``). Default ``"<key>_embedding"``.
      devices: optional list of devices, one per shard.
      trainable: whether optimizers train the table.
      use_safe_embedding_lookup: use ``safe_embedding_lookup_sparse`` (examples
        with no id get zeros). With False, ``embedding_lookup_sparse`` is used
        for rank-2 inputs: faster, but every example must have an id.
      max_norm: if set, embeddings are l2-clipped to this norm before pooling.
      ignore_value: integer ids only: the value that marks missing cells of
        dense input (e.g. ``-1`` for ids padded with -1); those cells are
        dropped. Default None: every cell is an id. ``SparseTensor`` entries
        are always ids.
      **embedding_kwargs: further keyword arguments of
        ``tf_ext.get_dynamic_embedding`` (e.g. ``initial_capacity``, or
        ``value_dtype=tf.bfloat16`` for half-precision rows; the column's
        output is float32 either way).

    Returns:
      A :class:`DynamicEmbeddingColumn`.

    Raises:
      ValueError: bad ``key``, ``dim``, ``dtype``, ``combiner``, ``num_shards``,
        ``initializer``, ``max_norm`` or ``ignore_value`` (not an int, or given
        for string ids).
    """
    if not isinstance(key, str) or not key:
        raise ValueError("key must be a non-empty string, got %r." % (key,))
    dtype = tf.as_dtype(dtype)
    if dtype != tf.string and not dtype.is_integer:
        raise ValueError("dtype must be an integer type or tf.string, got %s." % dtype.name)
    _check_common(dim, combiner, num_shards, initializer, max_norm)
    if ignore_value is not None:
        if dtype == tf.string:
            raise ValueError(
                'ignore_value applies to integer ids; string ids always treat "" as missing, '
                "got ignore_value=%r for string column %r." % (ignore_value, key)
            )
        if isinstance(ignore_value, bool) or not isinstance(ignore_value, (int, np.integer)):
            raise ValueError("ignore_value must be None or an int, got %r." % (ignore_value,))
        ignore_value = int(ignore_value)
    return _make_column(
        DynamicIdColumn(key=key, dtype=tf.string if dtype == tf.string else tf.int64, ignore_value=ignore_value),
        dim,
        combiner,
        initializer,
        num_shards,
        name,
        devices,
        trainable,
        use_safe_embedding_lookup,
        max_norm,
        embedding_kwargs,
    )


def embedding_column(
    categorical_column,
    dim,
    combiner="mean",
    initializer=None,
    num_shards=1,
    name=None,
    devices=None,
    trainable=True,
    use_safe_embedding_lookup=True,
    max_norm=None,
    **embedding_kwargs,
):
    """Like ``tf.feature_column.embedding_column``, with a dynamic embedding as the table.

    The categorical column's integer ids (bucket ids of ``..._with_hash_bucket``,
    ids of ``..._with_identity``, indices of vocabulary columns, ...) are the
    table's keys, so only ids that occur hold a row. Weighted categorical
    columns pass their weights to the combiner.

    Args:
      categorical_column: a TF categorical column (v1 or v2), not a sequence
        column.
      dim: embedding width (positive int).
      combiner: ``"mean"``, ``"sqrtn"`` or ``"sum"``.
      initializer: a TF initializer or a constant. Default: truncated normal,
        stddev ``1/sqrt(dim)``.
      num_shards: number of table shards.
      name: the column's name. Default ``"<categorical column name>_embedding"``
        (the name TF's ``embedding_column`` has, so the two order alike in
        ``input_layer``).
      devices: optional list of devices, one per shard.
      trainable: whether optimizers train the table.
      use_safe_embedding_lookup: as in TF: prune invalid (negative) ids and give
        examples with no id a zero vector.
      max_norm: if set, embeddings are l2-clipped to this norm before pooling.
      **embedding_kwargs: further keyword arguments of
        ``tf_ext.get_dynamic_embedding`` (e.g. ``value_dtype=tf.bfloat16``
        for half-precision rows; the column's output is float32 either way).

    Returns:
      A :class:`DynamicEmbeddingColumn`.

    Raises:
      ValueError: ``categorical_column`` is not a categorical column or is a
        sequence column, or a bad ``dim``, ``combiner``, ``num_shards``,
        ``initializer`` or ``max_norm``.
    """
    if not isinstance(categorical_column, _CATEGORICAL_COLUMNS):
        raise ValueError("categorical_column must be a categorical column, got %r." % (categorical_column,))
    if isinstance(categorical_column, _SEQUENCE_COLUMNS):
        raise ValueError("sequence categorical columns are not supported: %r." % (categorical_column,))
    _check_common(dim, combiner, num_shards, initializer, max_norm)
    return _make_column(
        categorical_column,
        dim,
        combiner,
        initializer,
        num_shards,
        name,
        devices,
        trainable,
        use_safe_embedding_lookup,
        max_norm,
        embedding_kwargs,
    )
