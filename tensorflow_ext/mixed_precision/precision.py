"""Compute-dtype scopes: write a model once, build it in half or full precision.

A model function is written against :func:`compute_dtype` (or simply against
the dtype of its inputs) and built inside :func:`precision_scope`. Inside the
scope every trainable floating-point variable obtained through
``tf.compat.v1.get_variable`` (this includes ``tf.compat.v1.layers``) is
created as a float32 *master* variable and returned cast to the compute dtype,
so the half-precision and the float32 builds share the same variables and the
optimizer always updates float32 values.

:func:`build_switched` builds the model twice, once per dtype, as the two
branches of one ``tf.cond``: the precision is chosen per ``session.run`` by a
boolean tensor (normally read from a variable that the switching policy
updates).

Resources captured by both branches (the table handles of dynamic
embeddings, for example) get a gradient that is live whichever branch ran:
see :func:`_cond_switch_grad`.
"""

import contextlib
import threading

import tensorflow as tf

from tensorflow_ext.tf_compat import internals

__all__ = [
    "HALF_DTYPES",
    "build_switched",
    "cast_compute",
    "compute_dtype",
    "is_half",
    "no_cast",
    "precision_scope",
]

HALF_DTYPES = (tf.float16, tf.bfloat16)
_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)

_local = threading.local()


def _stack():
    if not hasattr(_local, "dtypes"):
        _local.dtypes = []
        _local.no_cast = 0
    return _local.dtypes


def _as_float_dtype(dtype):
    dtype = tf.as_dtype(dtype)
    if dtype not in (tf.float16, tf.bfloat16, tf.float32):
        raise ValueError("compute dtype must be float16, bfloat16 or float32, got %s" % dtype.name)
    return dtype


def compute_dtype():
    """Returns the compute dtype of the innermost :func:`precision_scope`.

    Returns:
      A ``tf.DType``: ``tf.float16``, ``tf.bfloat16`` or ``tf.float32``
      (float32 outside any scope).
    """
    stack = _stack()
    return stack[-1] if stack else tf.float32


def is_half():
    """Returns True when the current compute dtype is float16 or bfloat16.

    Returns:
      A Python bool.
    """
    return compute_dtype() in HALF_DTYPES


def cast_compute(x):
    """Casts floating-point tensors to the current compute dtype.

    Non-floating tensors (ids, masks) and ``None`` pass through unchanged.
    Use it on model inputs and on the outputs of lookups into float32 tables
    (e.g. dynamic embeddings, which stay float32): the gradient of the cast
    flows back to the table as float32 (``IndexedSlices`` stay sparse).

    Args:
      x: a ``tf.Tensor``, ``tf.Variable``, ``tf.IndexedSlices`` or a nested
        structure (list/tuple/dict) of them.

    Returns:
      The same structure with floating-point tensors cast to
      :func:`compute_dtype`.
    """
    dtype = compute_dtype()

    def _cast(t):
        if t is None:
            return None
        if isinstance(t, tf.IndexedSlices):
            if t.values.dtype.base_dtype in _FLOAT_DTYPES and t.values.dtype.base_dtype != dtype:
                return tf.IndexedSlices(tf.cast(t.values, dtype), t.indices, t.dense_shape)
            return t
        if not tf.is_tensor(t) and not isinstance(t, tf.Variable):
            t = tf.convert_to_tensor(t)
        if t.dtype.base_dtype in _FLOAT_DTYPES and t.dtype.base_dtype != dtype:
            return tf.cast(t, dtype)
        return t

    return tf.nest.map_structure(_cast, x, expand_composites=False)


@contextlib.contextmanager
def no_cast():
    """Variables obtained inside this context are returned as float32 masters.

    Use it for large tables read through a lookup (cast the lookup result with
    :func:`cast_compute` instead of casting the whole table every step).

    Yields:
      None.
    """
    _stack()
    _local.no_cast += 1
    try:
        yield
    finally:
        _local.no_cast -= 1


def _master_getter(getter, name, *args, **kwargs):
    """Variable-scope custom getter: float32 storage, compute-dtype reads."""
    requested = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    trainable = kwargs.get("trainable", True)
    trainable = True if trainable is None else trainable
    want = compute_dtype()
    floating = requested.base_dtype in (tf.float16, tf.bfloat16, tf.float32)
    if floating:
        kwargs["dtype"] = tf.float32
    # Variables (and their initializers) must not live inside a tf.cond
    # branch: lift their creation out of any control-flow context.
    with tf.compat.v1.init_scope():
        var = getter(name, *args, **kwargs)
    if floating and trainable and not getattr(_local, "no_cast", 0) and var.dtype.base_dtype != want:
        return tf.cast(var, want)
    return var


@contextlib.contextmanager
def precision_scope(dtype):
    """Builds the enclosed model code with ``dtype`` as compute dtype.

    Inside the scope, ``tf.compat.v1.get_variable`` (and the layers built on
    it) creates float32 master variables, reused (``AUTO_REUSE``) when the
    same model is built again in another dtype, and returns trainable floating
    variables cast to ``dtype``. Variables are created outside any control-flow
    context, so the scope can be used inside ``tf.cond`` branches.

    Args:
      dtype: ``tf.float16``, ``tf.bfloat16`` or ``tf.float32`` (or their
        names).

    Yields:
      The compute dtype (a ``tf.DType``).

    Raises:
      ValueError: if ``dtype`` is not one of the three supported dtypes.
    """
    dtype = _as_float_dtype(dtype)
    scope = tf.compat.v1.get_variable_scope()
    stack = _stack()
    with tf.compat.v1.variable_scope(
        scope, custom_getter=_master_getter, reuse=tf.compat.v1.AUTO_REUSE, auxiliary_name_scope=False
    ):
        stack.append(dtype)
        try:
            yield dtype
        finally:
            stack.pop()


def _to_float32(outputs):
    def _cast(t):
        if tf.is_tensor(t) and t.dtype.base_dtype in (tf.float16, tf.bfloat16):
            return tf.cast(t, tf.float32)
        return t

    return tf.nest.map_structure(_cast, outputs)


def build_in(dtype, model_fn, *args, **kwargs):
    """Builds ``model_fn(*args, **kwargs)`` once in ``dtype``.

    Floating inputs are cast to ``dtype``; floating half outputs are cast back
    to float32.

    Args:
      dtype: the compute dtype.
      model_fn: a function of tensors returning a nested structure of tensors.
      *args: positional inputs of ``model_fn``.
      **kwargs: keyword inputs of ``model_fn`` (passed unchanged).

    Returns:
      ``model_fn``'s outputs, floating ones as float32.
    """
    with precision_scope(dtype):
        return _to_float32(model_fn(*cast_compute(list(args)), **kwargs))


_COND_SWITCH_GRAD = "TfExtMixedPrecisionCondSwitch"


def _static_dense_shape(grad):
    """The constant dense_shape of an ``IndexedSlices`` as a numpy array, or None."""
    if grad.dense_shape is None:
        return None
    return tf.get_static_value(grad.dense_shape)


def _zero_grad_of_other_branch(op, ctxt, taken):
    """An empty gradient like ``taken`` that is live exactly when the other branch runs.

    Built like TF's zeros for the untaken output of a cond Switch: guarded by
    ``Switch(op.inputs[0], pred)[other branch]``, so it is dead whenever that
    input is dead (nested conds) or the other branch is not taken.

    Returns:
      An empty ``IndexedSlices`` (no rows; same dtypes, row shape and
      dense_shape as ``taken``) or a zeros tensor of ``taken``'s static shape;
      None when the shapes needed are not statically known.
    """
    other = internals.control_flow_ops.switch(op.inputs[0], ctxt.pred)[1 - ctxt.branch]
    pivot = tf.identity(other)
    with tf.control_dependencies([pivot]):
        if isinstance(taken, tf.IndexedSlices):
            dense_shape = _static_dense_shape(taken)
            if taken.dense_shape is not None and dense_shape is None:
                return None
            row_shape = taken.values.shape[1:]
            if not row_shape.is_fully_defined() and dense_shape is not None:
                row_shape = tf.TensorShape(dense_shape[1:])
            if not row_shape.is_fully_defined():
                return None
            return tf.IndexedSlices(
                tf.zeros([0] + row_shape.as_list(), taken.values.dtype),
                tf.zeros([0], taken.indices.dtype),
                None if dense_shape is None else tf.constant(dense_shape, taken.dense_shape.dtype),
            )
        if not taken.shape.is_fully_defined():
            return None
        return tf.zeros(taken.shape, taken.dtype)


def _cond_switch_grad(op, *grads):
    """Gradient of the Switch ops of :func:`build_switched`'s ``tf.cond``.

    TF's own Switch gradient needs, for the output of the branch that did not
    run, a zero gradient that is live when that branch is skipped; the Merge
    of both then forwards whichever is live. It can build that zero for
    tensors and for resource variables (whose shape it can read), but not for
    other resources, such as the table handle of a dynamic embedding. There it
    merges the taken branch's gradient with itself, a gradient that is *dead*
    whenever the branch did not run. A resource captured by both branches
    gets two such gradients; their sum is dead on every step, and so is
    everything computed from it: the optimizer update, ``global_step`` and
    the policy update never run, without any error (TF only warns "Merge op
    has more than one valid input").

    Here the missing zero is an empty gradient (an ``IndexedSlices`` with no
    rows, or zeros of the static shape) guarded by the other branch, so the
    merged gradient is live on every step and is the taken branch's gradient
    or nothing. Every other case is TF's own gradient.

    Raises:
      ValueError: for such a resource whose gradient's shape is not
        statically known.
    """
    ctxt = internals.control_flow_context(op)
    if (
        isinstance(ctxt, internals.control_flow_ops.CondContext)
        and op.inputs[0].dtype == tf.resource
        and grads[1 - ctxt.branch] is None
        and grads[ctxt.branch] is not None
        and internals.control_flow_context(op.graph) is None
    ):
        taken = grads[ctxt.branch]
        zero = _zero_grad_of_other_branch(op, ctxt, taken)
        if zero is None:
            raise ValueError(
                "mixed precision: cannot build the gradient of resource %s captured in the "
                "precision tf.cond: the shape of its gradient (%s) is not statically known" % (op.inputs[0].name, taken)
            )
        pair = [zero, taken] if ctxt.branch == 1 else [taken, zero]
        return internals.control_flow_ops.merge(pair, name="cond_resource_grad")[0], None
    return internals.switch_grad(op, *grads)


try:
    tf.RegisterGradient(_COND_SWITCH_GRAD)(_cond_switch_grad)
except KeyError:  # registered already (module reloaded)
    pass


def build_switched(use_half, half_dtype, model_fn, *args, **kwargs):
    """Builds ``model_fn`` in half and in float32 precision inside one graph.

    The two builds share their float32 master variables and are the branches
    of ``tf.cond(use_half, ...)``: only the chosen branch runs in a step.

    Args:
      use_half: a scalar boolean tensor read once per step.
      half_dtype: ``tf.float16`` or ``tf.bfloat16``.
      model_fn: a function of tensors, written once; it may use
        :func:`compute_dtype` to pick dtypes of constants it creates.
      *args: tensors (or nested structures) passed to ``model_fn``; floating
        ones are cast to the branch's compute dtype.
      **kwargs: passed to ``model_fn`` unchanged.

    Returns:
      ``model_fn``'s outputs; floating outputs are float32 in both branches.

    Raises:
      ValueError: if ``half_dtype`` is not a half dtype.
    """
    half_dtype = tf.as_dtype(half_dtype)
    if half_dtype not in HALF_DTYPES:
        raise ValueError("half_dtype must be float16 or bfloat16, got %s" % half_dtype.name)
    # The Switch ops of captured tensors are created while the branches are
    # built; give them the gradient that stays live for resources too.
    graph = tf.compat.v1.get_default_graph()
    with graph.gradient_override_map({"Switch": _COND_SWITCH_GRAD}):
        return tf.compat.v1.cond(
            use_half,
            lambda: build_in(half_dtype, model_fn, *args, **kwargs),
            lambda: build_in(tf.float32, model_fn, *args, **kwargs),
            name="precision_switch",
        )
