"""Thin wrappers of the live serving model's ops (`TfExtLive*`, serving/kernels/live_model_kernels.cc).

A live model holds versions of a served model: one table per frozen table slot and one tensor per dense slot, at one
version (the trainer's global step). A request pins the current version once (`pin`) and reads every table
(`find`), dense value (`dense`) and the version (`version`) from that pin, so it sees all of them at one version
while updates apply. `check_update` and `apply` take a serving update's tensors (update_format.py) and follow its
version rule: a stale update changes nothing, a gap is refused (FailedPrecondition), another model or layout is
refused (InvalidArgument).

Every op that takes the model also takes its start inputs (`tables`: the frozen table handles, `dense`: the dense
values the served graph reads, `global_step`: [] or [the global step read]): the first one to run starts the model
from them (version 0); later runs ignore them. Table slot i is tables[i], dense slot j is dense[j]; `layout` (the
model's layout lines, update_format.layout) must describe the same table dims and dense dtypes and shapes.

The export rewrite (`tensorflow_ext.serving.live`) builds these ops; tests and tools may call them directly.
"""

from tensorflow_ext.utils import loader

__all__ = [
    "STATS_FIELDS",
    "apply",
    "check_update",
    "dense",
    "find",
    "model_handle",
    "pin",
    "stats",
    "version",
]

# The fields of `stats` (an int64 [8] tensor), in order.
STATS_FIELDS = (
    "version",
    "applies",
    "stale",
    "refused",
    "live_keys",
    "overlay_keys",
    "memory_bytes",
    "compactions",
)


def model_handle(model_name, layout, container="", shared_name="", name=None):
    """A `TfExtLiveModelHandle`: the live model's resource (created, not started, when it first runs)."""
    return loader.load_ops().tf_ext_live_model_handle(
        model_name=model_name, layout=layout, container=container, shared_name=shared_name, name=name
    )


def pin(model, tables, dense, global_step=(), name=None):
    """The request's version (a scalar variant): every read from it sees one version."""
    return loader.load_ops().tf_ext_live_pin(model, list(tables), list(dense), list(global_step), name=name)


def find(pin_, keys, default_value, slot, dim, name=None):
    """(values [*keys.shape, dim], found [*keys.shape]) of table slot `slot`, as `TfExtFrozenTableFind` returns."""
    return loader.load_ops().tf_ext_live_find(pin_, keys, default_value, slot=slot, dim=dim, name=name)


def dense(pin_, slot, dtype, shape, name=None):
    """The value of dense slot `slot` at the pinned version."""
    return loader.load_ops().tf_ext_live_dense(pin_, slot=slot, dtype=dtype, shape=shape, name=name)


def version(pin_, name=None):
    """The pinned version (int64 scalar)."""
    return loader.load_ops().tf_ext_live_version(pin_, name=name)


def check_update(model, tables, dense_, global_step, model_name, layout, kind, from_step, to_step, name=None):
    """Whether an update with this metadata applies (False: stale); an error when it is refused."""
    return loader.load_ops().tf_ext_live_check_update(
        model, list(tables), list(dense_), list(global_step), model_name, layout, kind, from_step, to_step, name=name
    )


def apply(
    model,
    tables,
    dense_in,
    global_step,
    model_name,
    layout,
    kind,
    from_step,
    to_step,
    keys,
    values,
    removed,
    dense_,
    name=None,
):
    """Applies an update (serialized with other appliers): (version, applied); a stale update changes nothing.

    `keys`, `values`, `removed`: one tensor per table slot ([n] int64, [n, dim] float32, [m] int64); `dense_`: one
    value per dense slot (its dtype and shape).
    """
    return loader.load_ops().tf_ext_live_apply(
        model,
        list(tables),
        list(dense_in),
        list(global_step),
        model_name,
        layout,
        kind,
        from_step,
        to_step,
        list(keys),
        list(values),
        list(removed),
        list(dense_),
        name=name,
    )


def stats(model, name=None):
    """An int64 [8] tensor: the fields of STATS_FIELDS (version -1 before the model starts)."""
    return loader.load_ops().tf_ext_live_stats(model, name=name)
