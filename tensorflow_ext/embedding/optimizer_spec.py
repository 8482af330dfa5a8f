"""What tensorflow_ext knows about each optimizer that trains dynamic embeddings, in one place.

For every supported `tf.compat.v1.train` optimizer (and tf_ext's own, `tensorflow_ext.optimizers`): the fused op that updates a table (or None: the generic
read-modify-write path), the op's hyper-parameter inputs in op order, its bool flag attrs and how the optimizer
sets them, and the optimizer's slots in row order with TF's initial values. The raw op wrappers
(`embedding_ops.sparse_apply`) and the optimizer integration (`optimizers.py`) both read this table; a test checks
it against the registered op definitions of the op library (the C++ side: kernels/optimizer_functors.h).

A row of a trained table is `[embedding (dim) | slot 0 | slot 1 | ...]`, slots in the order below, each `dim` columns
wide (one value per embedding column) or, for a row-wise slot (`Slot.rowwise`), one column (one value per row).
"""

import collections

import tensorflow as tf

from tensorflow_ext.optimizers import rowwise_adagrad

__all__ = ["Slot", "Flag", "OptimizerSpec", "SPECS", "FUSED", "by_name", "for_optimizer"]

# Inputs every fused apply op has before its hyper-parameters, and after them; attrs it has before its flags.
APPLY_LEADING_INPUTS = ("table_handle", "keys", "grad")
APPLY_TRAILING_INPUTS = ("step",)
APPLY_ATTRS = ("dim", "slot_offset")


class Slot(collections.namedtuple("Slot", ("name", "initial", "only_if", "rowwise"))):
    """One slot: a block of slot columns in each row.

    Attributes:
      name: the slot's name (as TF's `optimizer.get_slot_names()` reports it).
      initial: TF's initial value of the slot: a float, or a function of the optimizer returning one.
      only_if: the flag that must be on for the optimizer to keep this slot, or None (always kept).
      rowwise: False: `dim` columns (one value per embedding column); True: one column (one value per row).
    """

    def __new__(cls, name, initial=0.0, only_if=None, rowwise=False):
        return super(Slot, cls).__new__(cls, name, initial, only_if, bool(rowwise))

    def initial_value(self, optimizer):
        """TF's initial value of the slot for `optimizer` (a float)."""
        return float(self.initial(optimizer) if callable(self.initial) else self.initial)

    def width(self, dim):
        """The slot's columns in a row of an embedding of `dim` columns: 1 if row-wise, else dim."""
        return 1 if self.rowwise else int(dim)


class Flag(collections.namedtuple("Flag", ("name", "of_optimizer"))):
    """A bool attr of a fused apply op.

    Attributes:
      name: the attr name.
      of_optimizer: function of the optimizer returning the attr's value.
    """


class OptimizerSpec(
    collections.namedtuple("OptimizerSpec", ("name", "optimizer_class", "op_name", "hypers", "flags", "slots"))
):
    """How one optimizer trains a dynamic embedding.

    Attributes:
      name: short name ("Adam"), the key of `by_name` and of `embedding_ops.sparse_apply`.
      optimizer_class: the optimizer class (subclasses are trained alike).
      op_name: the fused op (``TfExtEmbeddingSparseApply<name>``), or None: generic path only.
      hypers: the fused op's float hyper-parameter inputs, in op order (between grad and step).
      flags: tuple of `Flag`, the fused op's bool attrs in op order (after dim and slot_offset).
      slots: tuple of `Slot` in row order.
    """

    @property
    def fused(self):
        """True if a fused op updates the table."""
        return self.op_name is not None

    def flag_values(self, optimizer):
        """{flag name: bool} as `optimizer` sets them."""
        return collections.OrderedDict((f.name, bool(f.of_optimizer(optimizer))) for f in self.flags)

    def slot_names(self, flags=None):
        """The slot names kept with the given flags (a dict; flags not given are off), in row order."""
        flags = flags or {}
        unknown = sorted(set(flags) - {f.name for f in self.flags})
        if unknown:
            raise ValueError(
                "%s has no flag %s (flags: %s)"
                % (self.name, ", ".join(map(repr, unknown)), [f.name for f in self.flags])
            )
        return tuple(s.name for s in self.slots if s.only_if is None or flags.get(s.only_if))

    def slots_of(self, optimizer):
        """[(slot name, TF's initial value)] that `optimizer` keeps, in row order."""
        return [(s.name, s.initial_value(optimizer)) for s in self._kept_slots(optimizer)]

    def slot_widths(self, optimizer, dim):
        """[columns of each slot that `optimizer` keeps] in a row of `dim` embedding columns, in row order."""
        return [s.width(dim) for s in self._kept_slots(optimizer)]

    def _kept_slots(self, optimizer):
        names = set(self.slot_names(self.flag_values(optimizer)))
        return [s for s in self.slots if s.name in names]


def _initial_accumulator(opt):
    return opt._initial_accumulator_value  # pylint: disable=protected-access


_train = tf.compat.v1.train

# pylint: disable=protected-access
SPECS = (
    OptimizerSpec(
        "GradientDescent",
        _train.GradientDescentOptimizer,
        "TfExtEmbeddingSparseApplyGradientDescent",
        hypers=("lr",),
        flags=(),
        slots=(),
    ),
    OptimizerSpec(
        "Momentum",
        _train.MomentumOptimizer,
        "TfExtEmbeddingSparseApplyMomentum",
        hypers=("lr", "momentum"),
        flags=(Flag("use_nesterov", lambda opt: opt._use_nesterov),),
        slots=(Slot("momentum"),),
    ),
    OptimizerSpec(
        "Adagrad",
        _train.AdagradOptimizer,
        "TfExtEmbeddingSparseApplyAdagrad",
        hypers=("lr",),
        flags=(),
        slots=(Slot("accumulator", _initial_accumulator),),
    ),
    OptimizerSpec(
        "Adam",
        _train.AdamOptimizer,
        "TfExtEmbeddingSparseApplyAdam",
        hypers=("beta1_power", "beta2_power", "lr", "beta1", "beta2", "epsilon"),
        flags=(),
        slots=(Slot("m"), Slot("v")),
    ),
    # TF1's FtrlOptimizer has no multiply_linear_by_lr (TF2's Keras Ftrl does): always off.
    OptimizerSpec(
        "Ftrl",
        _train.FtrlOptimizer,
        "TfExtEmbeddingSparseApplyFtrl",
        hypers=("lr", "l1", "l2", "l2_shrinkage", "lr_power"),
        flags=(Flag("multiply_linear_by_lr", lambda opt: False),),
        slots=(Slot("accum", _initial_accumulator), Slot("linear")),
    ),
    # TF1's RMSPropOptimizer starts "rms" at 1 (ones_initializer).
    OptimizerSpec(
        "RMSProp",
        _train.RMSPropOptimizer,
        "TfExtEmbeddingSparseApplyRMSProp",
        hypers=("lr", "rho", "momentum", "epsilon"),
        flags=(Flag("centered", lambda opt: opt._centered),),
        slots=(Slot("rms", 1.0), Slot("momentum"), Slot("mg", only_if="centered")),
    ),
    OptimizerSpec(
        "RowwiseAdagrad",
        rowwise_adagrad.RowwiseAdagradOptimizer,
        "TfExtEmbeddingSparseApplyRowwiseAdagrad",
        hypers=("lr",),
        flags=(),
        slots=(Slot("accumulator", _initial_accumulator, rowwise=True),),
    ),
    OptimizerSpec(
        "AdagradDA",
        _train.AdagradDAOptimizer,
        None,
        hypers=(),
        flags=(),
        slots=(
            Slot("gradient_accumulator"),
            Slot("gradient_squared_accumulator", lambda opt: opt._initial_gradient_squared_accumulator_value),
        ),
    ),
    OptimizerSpec(
        "Adadelta", _train.AdadeltaOptimizer, None, hypers=(), flags=(), slots=(Slot("accum"), Slot("accum_update"))
    ),
    OptimizerSpec(
        "ProximalAdagrad",
        _train.ProximalAdagradOptimizer,
        None,
        hypers=(),
        flags=(),
        slots=(Slot("accumulator", _initial_accumulator),),
    ),
    OptimizerSpec(
        "ProximalGradientDescent", _train.ProximalGradientDescentOptimizer, None, hypers=(), flags=(), slots=()
    ),
)
# pylint: enable=protected-access

FUSED = tuple(s for s in SPECS if s.fused)
_BY_NAME = {s.name: s for s in SPECS}
_BY_CLASS = {s.optimizer_class: s for s in SPECS}


def by_name(name, fused=False):
    """The spec called `name` ("Adam").

    Args:
      name: a spec name.
      fused: require a fused op.

    Raises:
      ValueError: no such (fused) optimizer.
    """
    spec = _BY_NAME.get(name)
    if spec is None or (fused and not spec.fused):
        names = [s.name for s in (FUSED if fused else SPECS)]
        raise ValueError("optimizer must be one of %s, got %r" % (names, name))
    return spec


def for_optimizer(optimizer):
    """The spec of a `tf.compat.v1.train` optimizer instance (looked up along its class's MRO).

    Raises:
      TypeError: the optimizer cannot train dynamic embeddings.
    """
    for cls in type(optimizer).__mro__:
        spec = _BY_CLASS.get(cls)
        if spec is not None:
            return spec
    get_name = getattr(optimizer, "get_name", None)
    raise TypeError(
        "Optimizer %s (%s) cannot train dynamic embeddings; supported: %s"
        % (
            get_name() if callable(get_name) else optimizer,
            type(optimizer).__name__,
            ", ".join(s.optimizer_class.__name__ for s in SPECS),
        )
    )
