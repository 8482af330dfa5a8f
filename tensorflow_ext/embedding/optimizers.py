"""Stock `tf.compat.v1.train` optimizers train dynamic embeddings, unwrapped.

Importing `tensorflow_ext.embedding` teaches `tf.compat.v1.train.Optimizer`
about dynamic embedding shards through three patches registered from
`tensorflow_ext.embedding.tf_patches` with `tensorflow_ext.tf_compat` (each
entry there says what it replaces and why):

* `optimizer._get_processor` returns, for a shard, a processor whose target is
  the shard's table handle (so `compute_gradients` differentiates the loss
  w.r.t. the handle and gets an `IndexedSlices` of int64 keys) and whose
  update applies the optimizer to the table.
* `Optimizer.apply_gradients` (the base implementation every stock optimizer
  uses) is wrapped: when some variables are shards, the optimizer's
  `_create_slots` sees only the dense variables, and each shard gets the
  optimizer's slot columns appended to its rows instead, with TF's initial
  slot values; then TF's own apply_gradients runs unchanged (one `_prepare`,
  one `_finish` -- so Adam's beta powers advance once per step -- and one
  global_step increment), calling our update for the shards.
* `Optimizer.compute_gradients` accepts `DynamicEmbedding`s in var_list
  (expanded to their shards).

Keras optimizers' `minimize` / `apply_gradients` are patched too, to refuse
dynamic embeddings with an error that names the optimizers to use.

Per shard update: the gradient's duplicate keys are summed (`tf.unique` +
`unsorted_segment_sum`, as TF does for dense variables) unless its indices are
the unique keys of a single lookup (the usual case: one `embedding_lookup` of
a one-shard embedding yields IndexedSlices whose indices are the output of
TfExtEmbeddingLookupIds, already unique and summed), then one fused op
(`TfExtEmbeddingSparseApply*`) updates embedding and slots with one probe per
key, for GradientDescent, Momentum (incl. Nesterov), Adagrad, Adam, Ftrl
(incl. l1/l2/shrinkage/beta), RMSProp (incl. centered) and tf_ext's
RowwiseAdagrad (its accumulator is one column per row). AdagradDA,
Adadelta, ProximalAdagrad and ProximalGradientDescent (and every optimizer
with TF_EXT_EMBEDDING_FORCE_GENERIC=1) use the generic path: read the rows'
embedding and slot columns (`TfExtTableFind`), apply TF's sparse formula
in-graph, write them back (`TfExtTableInsert`).

Adam differs from TF1's dense Adam on rows absent from a step: the dense
optimizer decays m and v (and moves the row) of every row every step; a
dynamic embedding only updates the rows of the batch (like LazyAdam).
"""

import abc
import contextlib
import sys
import threading
import weakref

import tensorflow as tf

from tensorflow_ext.embedding import _ops
from tensorflow_ext.embedding import embedding_ops
from tensorflow_ext.embedding import eviction
from tensorflow_ext.embedding import optimizer_spec
from tensorflow_ext.embedding import shard as shard_lib
from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.optimizers import rowwise_adagrad
from tensorflow_ext.utils import loader

__all__ = ["supported_optimizers", "slot_names"]

_Shard = shard_lib.DynamicEmbeddingShard


def _f32(x):
    x = tf.convert_to_tensor(x)
    return x if x.dtype == tf.float32 else tf.cast(x, tf.float32)


class _Handler(abc.ABC):
    """How one optimizer trains a dynamic embedding: the code part (its data -- fused op, hyper-parameter names,
    flags, slots -- is its optimizer_spec.OptimizerSpec)."""

    def create_non_slots(self, opt, dense_vars, shards):
        pass

    def hypers(self, opt):
        """{name: float32 tensor} of the fused op's hyper-parameters (the names of the spec's `hypers`)."""
        return {}

    @abc.abstractmethod
    def generic(self, opt, var, slots, grad):
        """TF's sparse formula: returns (new var, [new slots]); var and grad [n, dim] f32, each slot [n, its width]."""


class _GradientDescent(_Handler):

    def hypers(self, opt):
        return {"lr": _f32(opt._learning_rate_tensor)}

    def generic(self, opt, var, slots, grad):
        return var + (-grad) * self.hypers(opt)["lr"], []


class _Momentum(_Handler):

    def hypers(self, opt):
        return {"lr": _f32(opt._learning_rate_tensor), "momentum": _f32(opt._momentum_tensor)}

    def generic(self, opt, var, slots, grad):
        h = self.hypers(opt)
        lr, mom = h["lr"], h["momentum"]
        accum = slots[0] * mom + grad
        if opt._use_nesterov:
            var = var - (lr * grad + lr * mom * accum)
        else:
            var = var - lr * accum
        return var, [accum]


class _Adagrad(_Handler):

    def hypers(self, opt):
        return {"lr": _f32(opt._learning_rate_tensor)}

    def generic(self, opt, var, slots, grad):
        lr = self.hypers(opt)["lr"]
        accum = slots[0] + grad * grad
        return var - lr * grad * tf.math.rsqrt(accum), [accum]


class _RowwiseAdagrad(_Handler):

    def hypers(self, opt):
        return {"lr": _f32(opt._learning_rate_tensor)}

    def generic(self, opt, var, slots, grad):
        accumulator, delta = rowwise_adagrad.rowwise_update(self.hypers(opt)["lr"], slots[0][:, 0], grad)
        return var - delta, [tf.expand_dims(accumulator, 1)]


class _Adam(_Handler):

    def create_non_slots(self, opt, dense_vars, shards):
        # TF's _create_slots makes beta1_power/beta2_power colocated with the first
        # dense variable; with only dynamic embeddings, colocate with a shard.
        first = min(dense_vars, key=lambda v: v.name) if dense_vars else min(shards, key=lambda s: s.name)
        opt._create_non_slot_variable(initial_value=opt._beta1, name="beta1_power", colocate_with=first)
        opt._create_non_slot_variable(initial_value=opt._beta2, name="beta2_power", colocate_with=first)

    def hypers(self, opt):
        beta1_power, beta2_power = opt._get_beta_accumulators()
        return {
            "beta1_power": _f32(beta1_power),
            "beta2_power": _f32(beta2_power),
            "lr": _f32(opt._lr_t),
            "beta1": _f32(opt._beta1_t),
            "beta2": _f32(opt._beta2_t),
            "epsilon": _f32(opt._epsilon_t),
        }

    def generic(self, opt, var, slots, grad):
        h = self.hypers(opt)
        beta1, beta2 = h["beta1"], h["beta2"]
        lr_t = h["lr"] * tf.sqrt(1 - h["beta2_power"]) / (1 - h["beta1_power"])
        m = slots[0] * beta1 + grad * (1 - beta1)
        v = slots[1] * beta2 + (grad * grad) * (1 - beta2)
        return var - lr_t * m / (tf.sqrt(v) + h["epsilon"]), [m, v]


class _Ftrl(_Handler):

    def _shrinkage(self, opt):
        # TF1 picks SparseApplyFtrl (no shrinkage) when the python value is <= 0.
        value = opt._l2_shrinkage_regularization_strength
        if isinstance(value, (int, float)) and value <= 0.0:
            return tf.constant(0.0, tf.float32)
        return _f32(opt._l2_shrinkage_regularization_strength_tensor)

    def hypers(self, opt):
        return {
            "lr": _f32(opt._learning_rate_tensor),
            "l1": _f32(opt._l1_regularization_strength_tensor),
            "l2": _f32(opt._adjusted_l2_regularization_strength_tensor),
            "l2_shrinkage": self._shrinkage(opt),
            "lr_power": _f32(opt._learning_rate_power_tensor),
        }

    def generic(self, opt, var, slots, grad):
        h = self.hypers(opt)
        lr, l1, l2, shrink, lr_power = h["lr"], h["l1"], h["l2"], h["l2_shrinkage"], h["lr_power"]
        accum, linear = slots
        g = grad + 2.0 * shrink * var
        new_accum = accum + grad * grad
        sigma = (tf.pow(new_accum, -lr_power) - tf.pow(accum, -lr_power)) / lr
        linear = linear + g - sigma * var
        quadratic = tf.pow(new_accum, -lr_power) / lr + 2.0 * l2
        new_var = (tf.clip_by_value(linear, -l1, l1) - linear) / quadratic
        return new_var, [new_accum, linear]


class _RMSProp(_Handler):

    def hypers(self, opt):
        return {
            "lr": _f32(opt._learning_rate_tensor),
            "rho": _f32(opt._decay_tensor),
            "momentum": _f32(opt._momentum_tensor),
            "epsilon": _f32(opt._epsilon_tensor),
        }

    def generic(self, opt, var, slots, grad):
        h = self.hypers(opt)
        lr, rho, momentum, eps = h["lr"], h["rho"], h["momentum"], h["epsilon"]
        ms = slots[0] * rho + grad * grad * (1 - rho)
        if opt._centered:
            mg = slots[2] * rho + grad * (1 - rho)
            denom = ms - mg * mg + eps
        else:
            denom = ms + eps
        mom = slots[1] * momentum + tf.math.rsqrt(denom) * lr * grad
        new_slots = [ms, mom] + ([mg] if opt._centered else [])
        return var - mom, new_slots


class _AdagradDA(_Handler):

    def generic(self, opt, var, slots, grad):
        lr = _f32(opt._learning_rate_tensor)
        l1 = _f32(opt._l1_regularization_strength)
        l2 = _f32(opt._l2_regularization_strength)
        gs = _f32(opt._global_step_on_worker)
        ga = slots[0] + grad
        da = slots[1] + grad * grad
        gs_lr = gs * lr
        if isinstance(opt._l1_regularization_strength, (int, float)) and opt._l1_regularization_strength <= 0:
            new_var = -1.0 * (ga / gs) / (l2 + tf.sqrt(da) / gs_lr)
        else:
            new_var = -1.0 * tf.sign(ga) * tf.maximum(tf.abs(ga) / gs - l1, 0.0) / (l2 + tf.sqrt(da) / gs_lr)
        return new_var, [ga, da]


class _Adadelta(_Handler):

    def generic(self, opt, var, slots, grad):
        lr, rho, eps = _f32(opt._lr_t), _f32(opt._rho_t), _f32(opt._epsilon_t)
        accum = slots[0] * rho + grad * grad * (1 - rho)
        update = tf.sqrt(slots[1] + eps) * tf.math.rsqrt(accum + eps) * grad
        accum_update = slots[1] * rho + update * update * (1 - rho)
        return var - update * lr, [accum, accum_update]


def _proximal(var, grad, lr, l1, l2, l1_python):
    prox = var - grad * lr
    if isinstance(l1_python, (int, float)) and l1_python <= 0:
        return prox / (1.0 + l2 * lr)
    return tf.sign(prox) * tf.maximum(tf.abs(prox) - lr * l1, 0.0) / (1.0 + l2 * lr)


class _ProximalAdagrad(_Handler):

    def generic(self, opt, var, slots, grad):
        lr = _f32(opt._learning_rate_tensor)
        accum = slots[0] + grad * grad
        lr_t = lr * tf.math.rsqrt(accum)
        return _proximal(
            var,
            grad,
            lr_t,
            _f32(opt._l1_regularization_strength_tensor),
            _f32(opt._l2_regularization_strength_tensor),
            opt._l1_regularization_strength,
        ), [accum]


class _ProximalGradientDescent(_Handler):

    def generic(self, opt, var, slots, grad):
        lr = _f32(opt._learning_rate_tensor)
        return (
            _proximal(
                var,
                grad,
                lr,
                _f32(opt._l1_regularization_strength_tensor),
                _f32(opt._l2_regularization_strength_tensor),
                opt._l1_regularization_strength,
            ),
            [],
        )


# By optimizer_spec name: one handler per spec.
_HANDLERS = {
    "GradientDescent": _GradientDescent(),
    "Momentum": _Momentum(),
    "Adagrad": _Adagrad(),
    "AdagradDA": _AdagradDA(),
    "Adam": _Adam(),
    "Ftrl": _Ftrl(),
    "RMSProp": _RMSProp(),
    "RowwiseAdagrad": _RowwiseAdagrad(),
    "Adadelta": _Adadelta(),
    "ProximalAdagrad": _ProximalAdagrad(),
    "ProximalGradientDescent": _ProximalGradientDescent(),
}


def supported_optimizers():
    """The `tf.compat.v1.train` optimizer classes that train dynamic embeddings."""
    return [spec.optimizer_class for spec in optimizer_spec.SPECS]


def handler_for(opt):
    """(spec, handler) of optimizer `opt` (TypeError if it cannot train dynamic embeddings)."""
    spec = optimizer_spec.for_optimizer(opt)
    return spec, _HANDLERS[spec.name]


def slot_names(optimizer):
    """The slot names `optimizer` keeps in a dynamic embedding's rows."""
    return [name for name, _ in optimizer_spec.for_optimizer(optimizer).slots_of(optimizer)]


# ---- per-shard update ----------------------------------------------------------


def _dedup(grad, shard):
    if not isinstance(grad, tf.IndexedSlices):
        raise TypeError(
            "The gradient of dynamic embedding shard %s must be IndexedSlices of keys (as computed by "
            "tf.gradients through tf_ext lookups), got a %s" % (shard.name, type(grad).__name__)
        )
    keys = tf.cast(grad.indices, tf.int64)
    values = tf.reshape(_f32(grad.values), [-1, shard.dim])
    if shard.lookups.keys_are_unique(grad.indices):
        return keys, values  # the gradient of one lookup: its keys are unique already
    unique, idx = tf.unique(keys, out_idx=tf.int32)
    summed = tf.math.unsorted_segment_sum(values, idx, tf.size(unique))
    return unique, summed


def _check_replicas_draw_alike(shard, spec):
    """Under multi-process Horovod, a key inserted from another rank's gradient must get the same random row on
    every rank: that needs fixed seeds (a silent divergence of the replicas otherwise)."""
    hvd = sys.modules.get("horovod.tensorflow")
    try:
        multi = hvd is not None and hvd.is_initialized() and hvd.size() > 1
    except (ValueError, RuntimeError):
        multi = False
    if not multi or (spec.kind == "constant"):
        return
    if not spec.in_kernel or spec.seeds() == (0, 0):
        raise ValueError(
            "dynamic embedding %s is trained by %d Horovod processes, but its initializer (%s) would draw a different "
            "initial row for a new key in each process, so the replicas would diverge. Import tensorflow_ext.horovod "
            "before creating the embedding (it derives fixed seeds from the name), give the initializer a seed, or use "
            "a TF random/constant initializer (not a custom callable)."
            % (shard.embedding.name, hvd.size(), spec.description or spec.kind)
        )


def _insert_missing_keys(shard, keys, step):
    """Inserts the keys absent from `shard` with their initial rows (as a training lookup does)."""
    spec = shard.embedding.initializer
    _check_replicas_draw_alike(shard, spec)
    with tf.name_scope("insert_missing"):
        if spec.in_kernel:
            rows = loader.load_ops().tf_ext_embedding_lookup(
                shard.handle, keys, step, dim=shard.dim, insert_missing=True, count=False, **spec.kernel_attrs()
            )
            return rows.op
        return shard.table.find_or_insert(keys, spec.make_rows(tf.size(keys), shard.dim), step, count=False).op


# ---- per-call state of the apply_gradients patch (tf_patches): per thread, never on the optimizer ------------

_calls = threading.local()  # .stack: [(optimizer, create_slots, step, in-step eviction state)], innermost call last
_dispatch_lock = threading.Lock()
_dispatchers = {}  # id(optimizer) -> (calls in flight, the _SlotsDispatch installed on it)


class _SlotsDispatch(object):
    """The `_create_slots` of an optimizer while apply_gradients calls with shards are in flight: the calling
    thread's innermost call's version, else what the optimizer had before (its class's method)."""

    def __init__(self, opt, previous):
        self._opt_ref = weakref.ref(opt)
        self.previous = previous  # the instance attribute it replaced, or None

    def original(self):
        opt = self._opt_ref()
        return self.previous if self.previous is not None else type(opt)._create_slots.__get__(opt)

    def __call__(self, var_list):
        call = _current_call(self._opt_ref())
        if call is None:
            return self.original()(var_list)
        return call[1](var_list)


def _current_call(opt):
    for call in reversed(getattr(_calls, "stack", ())):
        if call[0] is opt:
            return call
    return None


def original_create_slots(opt):
    """`opt`'s own `_create_slots` (not the dispatch an apply_gradients call in flight installed)."""
    current = vars(opt).get("_create_slots")
    if isinstance(current, _SlotsDispatch):
        return current.original()
    return opt._create_slots


@contextlib.contextmanager
def apply_call(opt, create_slots, step, shards=()):
    """The state of one apply_gradients call with shards: while it runs, in this thread, `opt._create_slots(...)`
    is `create_slots` and the shard updates use `step`. Other threads' calls with the same optimizer keep theirs.
    `shards`: the shards the call updates (the in-step eviction of an embedding runs once all of its are updated;
    see eviction.in_step_eviction)."""
    stack = _calls.__dict__.setdefault("stack", [])
    with _dispatch_lock:
        count, dispatch = _dispatchers.get(id(opt), (0, None))
        if count == 0:
            dispatch = _SlotsDispatch(opt, vars(opt).get("_create_slots"))
            graph_edits.set_create_slots(opt, dispatch)
        _dispatchers[id(opt)] = (count + 1, dispatch)
    stack.append((opt, create_slots, step, eviction.InStepEvictions(shards)))
    try:
        yield
    finally:
        stack.pop()
        with _dispatch_lock:
            count, dispatch = _dispatchers.pop(id(opt))
            if count > 1:
                _dispatchers[id(opt)] = (count - 1, dispatch)
            else:  # what the optimizer had before (None: its class's method)
                graph_edits.set_create_slots(opt, dispatch.previous)


def _step_for(opt, shard):
    call = _current_call(opt)
    step = call[2] if call is not None else None
    if step is None:
        if shard.layout.compact_cols and shard.layout.rounding == "stochastic":
            # Stochastic rounding draws its bits from (key, step, column): without a step every update of a key
            # would reuse the same bits, and updates smaller than half a rounding step would be lost for good.
            raise ValueError(
                "Dynamic embedding shard %r stores %s rows with stochastic rounding, which needs the training step: "
                "pass global_step=tf.compat.v1.train.get_or_create_global_step() to %s.minimize / "
                'apply_gradients, or create the embedding with rounding="nearest".'
                % (shard.name, shard.storage, type(opt).__name__)
            )
        return tf.constant(-1, tf.int64)
    return tf.cast(tf.convert_to_tensor(step), tf.int64)


def _apply_generic(handler, opt, shard, group, keys, grad, step):
    """Reads embedding + slot columns, applies the formula, writes them back."""
    dim = shard.dim
    nslots = len(group.slot_names)
    find = shard.table.find
    insert = shard.table.insert
    defaults = shard.column_defaults
    ends = [sum(group.slot_widths[: k + 1]) for k in range(nslots)]  # each slot's end in the group's columns
    contiguous = nslots == 0 or group.offset == dim
    # The reads wait for the gradient, and so for the step's lookups: a new key's row is inserted by its lookup, and a
    # read that ran first would find no row and update the column defaults instead of the key's initial row.
    with tf.control_dependencies([grad]):
        if contiguous:
            cols = dim + group.width
            rows, _ = find(keys, tf.constant(defaults[:cols], tf.float32), col_begin=0, cols=cols)
            var = rows[:, :dim]
            srows = rows[:, dim:]
        else:
            var, _ = find(keys, tf.constant(defaults[:dim], tf.float32), col_begin=0, cols=dim)
            srows, _ = find(
                keys,
                tf.constant(defaults[group.offset : group.offset + group.width], tf.float32),
                col_begin=group.offset,
                cols=group.width,
            )
    slots = [srows[:, end - width : end] for end, width in zip(ends, group.slot_widths)]
    new_var, new_slots = handler.generic(opt, var, slots, grad)
    if contiguous:
        return insert(
            keys,
            tf.concat([new_var] + list(new_slots), 1),
            step,
            col_begin=0,
            cols=dim + group.width,
            count=False,
        )
    w1 = insert(keys, new_var, step, col_begin=0, cols=dim, count=False)
    w2 = insert(keys, tf.concat(list(new_slots), 1), step, col_begin=group.offset, cols=group.width, count=False)
    return tf.group(w1, w2)


# Optimizers with a slot that decays toward zero and divides the step (Adam's v, RMSProp's ms): float16 slots flush
# a second moment below ~6e-8 to zero, and the next step divides by epsilon alone.
_NO_FLOAT16_SLOTS = ("Adam", "RMSProp")


def _apply_to_shard(opt, shard, grad):
    spec, handler = handler_for(opt)
    if spec.name in _NO_FLOAT16_SLOTS and shard.storage == "float16" and shard.layout.compact_slots:
        raise ValueError(
            "%s cannot train dynamic embedding shard %r with float16 slots (slot_dtype=tf.float16): its second "
            "moment underflows to zero in float16 (below ~6e-8) and the step then divides by epsilon alone. Use "
            "value_dtype=tf.bfloat16 (same range as float32) or slot_dtype=None." % (spec.name, shard.name)
        )
    group = shard.slot_group(opt)
    if group is None:  # apply_gradients registers the columns first; this covers direct processor calls
        slots = spec.slots_of(opt)
        group = shard.add_slot_columns(
            opt, [n for n, _ in slots], [v for _, v in slots], spec.slot_widths(opt, shard.dim)
        )
    with tf.name_scope("tf_ext_" + type(opt).__name__):
        keys, values = _dedup(grad, shard)
        step = _step_for(opt, shard)
        if not shard.lookups.keys_are_unique(grad.indices):
            # Keys that may not have been looked up here (another process's gradient, gathered by an allreduce):
            # give the missing ones their initializer row first, as a lookup would, not the column defaults, so
            # replicas that apply the same gradient stay identical.
            with tf.control_dependencies([_insert_missing_keys(shard, keys, step)]):
                keys = tf.identity(keys)
        if spec.fused and _ops.use_fused():
            return embedding_ops.sparse_apply(
                spec.name,
                shard.handle,
                keys,
                values,
                handler.hypers(opt),
                step=step,
                dim=shard.dim,
                slot_offset=group.offset,
                **spec.flag_values(opt),
            )
        _check_generic_rounding(spec, opt, shard)
        return _apply_generic(handler, opt, shard, group, keys, values, step)


def _check_generic_rounding(spec, opt, shard):
    """Refuses the generic path for a table that rounds updates stochastically: it writes the new rows back with an
    insert, which rounds compact columns to nearest, so updates smaller than half a step of the storage (a bfloat16
    weight's 0.2% to 0.4%) would be lost without a word."""
    layout = shard.layout
    if layout.compact_cols == 0 or layout.rounding != "stochastic":
        return
    why = (
        "TF_EXT_EMBEDDING_FORCE_GENERIC=1 (or force_generic) makes every optimizer take it"
        if spec.fused
        else "%s has no fused update" % type(opt).__name__
    )
    raise ValueError(
        "%s would update dynamic embedding %r (rows stored as %s, rounding='stochastic') through the generic path "
        "(%s), whose write back rounds to nearest, not stochastically: small updates would be lost. Train it with "
        "an optimizer that has a fused update (%s), or create the embedding with rounding='nearest'."
        % (
            type(opt).__name__,
            shard.embedding.name,
            layout.storage,
            why,
            ", ".join(s.name for s in optimizer_spec.FUSED),
        )
    )


class ShardProcessor(object):
    """`optimizer._get_processor` result for a DynamicEmbeddingShard."""

    def __init__(self, shard):
        self._v = shard

    def target(self):
        return self._v.handle

    def update_op(self, optimizer, g):
        # An embedding created with EvictionPolicy(every_n_steps=N) evicts in the training step, every N steps: each
        # shard's per-key criteria after its update, capacity once all of the call's shards of the embedding are.
        update = _apply_to_shard(optimizer, self._v, g)
        call = _current_call(optimizer)
        return eviction.in_step_eviction(self._v, update, None if call is None else call[3])
