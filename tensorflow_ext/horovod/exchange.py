"""The exchanges of model-parallel lookups, one per embedding or fused: one alltoall of keys for every model-parallel
embedding of a step, one of rows back, one of the rows' gradients.

A model-parallel lookup (`ModelParallel.lookup_unique`) builds its own exchange: an alltoall of its keys to their
owners, one of the owners' rows back and, as that alltoall's gradient, one of the rows' gradients to the owners.
A model with E model-parallel embeddings thus runs 3E collectives per step; Horovod negotiates each in its
background thread (a cycle of HOROVOD_CYCLE_TIME, 1 ms by default, plus a round trip between the ranks) and runs
each as two Gloo exchanges (the split sizes, then the data), and the E exchanges of one stage reach Horovod at
different times, so one stage can span several cycles.

`fuse` (called by `DistributedOptimizer.compute_gradients` with the loss, before the gradients are built) replaces
the exchanges of every model-parallel lookup that the loss depends on with three collectives for all of them:

* keys: each rank sends each rank one buffer: a header with the number of keys of each embedding (E int64), then
  the keys of the first embedding, of the second, ...;
* rows: each owner sends each rank one flat buffer: that rank's rows of the first embedding, of the second, ...:
  float32 values, or where some embedding stores its rows in 2 bytes (`refs.HALF_STORAGES`) uint16 units (a
  2-byte value is one unit, a float32 value two: the bits travel unchanged);
* gradients (the rows' exchange is differentiable): the rows' gradients in float32, packed the same way, to the
  owners.

Each embedding's keys, rows and gradients arrive in the order its own exchange delivers them (from each rank in
rank order), so the lookups' results, the gradients and the updates are bit for bit those of the per-embedding
exchanges. How: each lookup builds its own exchange and passes what it receives through two Identity ops (the
keys, the rows); `fuse` builds the fused exchange from the same inputs and feeds those Identity ops from it
(a graph edit of their input). The per-embedding collectives stay in the graph, unused: a step does not run them.

The gradients' exchange starts as soon as the embeddings' gradients exist: on its way it reads the gradients that
GATE_OP (the optimizers' default gate_gradients) would hold back until the dense layers' weight gradients are
computed (see `_bypass_gradient_gates`).

Not fused (their own exchange stays): a lookup the loss does not depend on (an eval tower in the training graph),
one inside a tf.cond or while loop, one whose graph an open Session already holds; lookups of different process
sets are fused separately. A lookup whose keys or owner-side rows depend on another lookup's results (ids read from
an embedding) is fused in a later group than that lookup. Setting TF_EXT_HVD_FUSED_EXCHANGES=0 keeps every lookup's
own exchange; the ranks must agree (the model check compares it).
"""

import dataclasses
import os
import weakref

import tensorflow as tf

from tensorflow_ext import tf_compat
from tensorflow_ext.horovod import _hvd
from tensorflow_ext.horovod import consistency
from tensorflow_ext.tf_compat import graph_edits
from tensorflow_ext.tf_compat import internals

__all__ = ["ENV_FUSED", "Exchange", "fuse", "fused_enabled", "record"]

ENV_FUSED = "TF_EXT_HVD_FUSED_EXCHANGES"

# graph -> _GraphExchanges (weak: they go with the graph).
_graphs = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class Exchange(object):
    """One model-parallel lookup's exchange, as `ModelParallel.lookup_unique` builds it.

    Attributes:
      name: the lookup's collective name prefix (the embedding's name).
      process_set: the Horovod process set.
      num_ranks: its size.
      send: int64 [n]: this rank's unique keys, grouped by owner rank in rank order (after the model check).
      splits: int32 [N]: how many of `send` go to each rank.
      keys_received: the Identity op whose input is the keys this rank received (from each rank in rank order).
      rows: float32 [m, width]: the rows of the received keys, in their order (the owner's side).
      width: the columns of `rows` (python int).
      wire_dtype: the 2-byte dtype the rows travel in, or None (float32).
      rows_received: the Identity op whose input is the rows of `send` this rank received, float32 [n, width].
    """

    name: str
    process_set: object
    num_ranks: int
    send: tf.Tensor
    splits: tf.Tensor
    keys_received: tf.Operation
    rows: tf.Tensor
    width: int
    wire_dtype: object
    rows_received: tf.Operation
    fused: bool = False


class _GraphExchanges(object):
    def __init__(self):
        self.exchanges = []
        self.groups = 0  # fused groups built so far: numbers the fused collectives' names


def fused_enabled():
    """Whether `fuse` fuses (TF_EXT_HVD_FUSED_EXCHANGES, default 1).

    Raises:
      ValueError: the variable is set to something other than 0/1/true/false.
    """
    value = os.environ.get(ENV_FUSED, "1").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("%s must be 0 or 1, got %r" % (ENV_FUSED, os.environ.get(ENV_FUSED)))


def record(exchange):
    """Registers a lookup's exchange with its graph (for `fuse`)."""
    graph = exchange.send.graph
    _graphs.setdefault(graph, _GraphExchanges()).exchanges.append(exchange)


def _ancestors(ops, stop=None):
    """The ops that `ops` depend on (data and control inputs), `ops` included; the search does not go past an op
    in `stop` (which is included)."""
    seen = set()
    todo = list(ops)
    while todo:
        op = todo.pop()
        if op in seen:
            continue
        seen.add(op)
        if stop is not None and op in stop and op not in ops:
            continue
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def _fusable(ex):
    ops = [ex.send.op, ex.rows.op, ex.keys_received, ex.rows_received]
    if any(internals.control_flow_context(op) is not None for op in ops):
        return False
    # A Session that holds the ops would ignore the new inputs (tf_compat.held_by_an_open_session).
    return not any(tf_compat.held_by_an_open_session(op) for op in ops)


def fuse(loss):
    """Fuses the exchanges of the model-parallel lookups that `loss` depends on (see the module docstring).

    Call it before building the gradients of `loss`. Lookups fused already, or built after the call, keep what
    they have.

    Args:
      loss: a tensor (or a list of tensors, or anything else: then nothing is fused).

    Returns:
      The number of fused groups built (0 when there was nothing to fuse or fusion is off).
    """
    losses = [
        t for t in (loss if isinstance(loss, (list, tuple)) else [loss]) if isinstance(t, (tf.Tensor, tf.Variable))
    ]
    if not losses:
        return 0
    graph = losses[0].graph
    state = _graphs.get(graph)
    if state is None:
        return 0
    pending = [ex for ex in state.exchanges if not ex.fused]
    if not pending:
        return 0
    enabled = fused_enabled()
    # Every rank must build the same collectives: a rank that fuses and one that does not would wait for each
    # other's collectives forever. The model check compares the setting before the first collective.
    consistency.declare("model-parallel exchanges", [(ENV_FUSED, int(enabled))], graph)
    if not enabled:
        return 0
    needed = _ancestors([t.op for t in losses])
    candidates = [ex for ex in pending if ex.rows_received in needed and _fusable(ex)]
    if not candidates:
        return 0
    # Waves: a lookup whose keys or owner-side rows depend on what another lookup received must be fused after it
    # (in one group, its keys would wait for rows that wait for its keys).
    outputs = {}
    for i, ex in enumerate(candidates):
        outputs[ex.keys_received] = i
        outputs[ex.rows_received] = i
    wave = [None] * len(candidates)
    depends = []
    for ex in candidates:
        up = _ancestors([ex.send.op, ex.rows.op], stop=set(outputs))
        own = (ex.keys_received, ex.rows_received)
        depends.append(sorted({outputs[op] for op in up if op in outputs and op not in own}))

    def wave_of(i):
        if wave[i] is None:
            wave[i] = 1 + max([wave_of(j) for j in depends[i]] or [-1])
        return wave[i]

    for i in range(len(candidates)):
        wave_of(i)
    groups = {}
    for i, ex in enumerate(candidates):
        groups.setdefault((wave[i], id(ex.process_set)), []).append(ex)
    built = 0
    for key in sorted(groups, key=lambda k: (k[0], min(candidates.index(ex) for ex in groups[k]))):
        group = groups[key]
        with graph.as_default(), tf.control_dependencies(None), tf.name_scope("tf_ext_fused_lookups_%d" % state.groups):
            _build(group, "tf_ext_fused_lookups_%d" % state.groups)
        state.groups += 1
        built += 1
        for ex in group:
            ex.fused = True
    return built


# ----------------------------------------------------------------------------------------------------- buffers


def _pack(parts, counts, units_per_item, num_ranks):
    """One buffer of E per-embedding buffers, regrouped per destination rank.

    Args:
      parts: E 1-D tensors of one dtype; part e holds embedding e's items for rank 0, then for rank 1, ...; each
        item `units_per_item[e]` elements.
      counts: int32 [N, E]: items of embedding e for rank i.
      units_per_item: E python ints.
      num_ranks: N.

    Returns:
      (buffer, splits): buffer 1-D: for rank 0 embedding 0's items, embedding 1's, ..., then for rank 1, ...;
      splits: int32 [N], the elements for each rank.
    """
    n = num_ranks
    lengths = tf.cast(counts, tf.int64) * tf.constant(units_per_item, tf.int64)  # [N, E]
    # Block copies (split, then one concat in the new order) rather than a gather through an index per element.
    pieces = [tf.split(p, lengths[:, j], num=n) for j, p in enumerate(parts)]
    buffer = tf.concat([pieces[j][i] for i in range(n) for j in range(len(parts))], 0)
    return buffer, tf.cast(tf.reduce_sum(lengths, 1), tf.int32)


def _unpack(buffer, counts, units_per_item, num_ranks):
    """The per-embedding buffers of a received buffer that `_pack` built on each rank.

    Args:
      buffer: 1-D: from rank 0 embedding 0's items, embedding 1's, ..., then from rank 1, ...
      counts: int32 or int64 [N, E]: items of embedding e from rank i.
      units_per_item: E python ints.
      num_ranks: N.

    Returns:
      E 1-D tensors: embedding e's items from rank 0, then from rank 1, ...
    """
    n, e = num_ranks, len(units_per_item)
    lengths = tf.cast(counts, tf.int64) * tf.constant(units_per_item, tf.int64)  # [N, E]
    pieces = tf.split(buffer, tf.reshape(lengths, [-1]), num=n * e)
    return [tf.concat(pieces[j::e], 0) for j in range(e)]


def _as_units(rows, wire_dtype, unit):
    """float32 rows [m, w] as a flat buffer of `unit` (float32 or uint16) elements."""
    if unit == tf.float32:
        return tf.reshape(rows, [-1])
    if wire_dtype is not None:  # a 2-byte value per unit (see embedding._send_rows_back)
        return tf.reshape(tf.bitcast(tf.cast(rows, wire_dtype), tf.uint16), [-1])
    return tf.reshape(tf.bitcast(rows, tf.uint16), [-1])  # a float32 value as two units, bits unchanged


def _from_units(flat, width, wire_dtype, unit):
    """The float32 rows [-1, width] of a flat buffer that `_as_units` built."""
    if unit == tf.float32:
        return tf.reshape(flat, [-1, width])
    if wire_dtype is not None:
        return tf.reshape(tf.cast(tf.bitcast(flat, wire_dtype), tf.float32), [-1, width])
    return tf.reshape(tf.bitcast(tf.reshape(flat, [-1, 2]), tf.float32), [-1, width])


def _units_per_row(ex, unit):
    return ex.width * (2 if unit == tf.uint16 and ex.wire_dtype is None else 1)


# -------------------------------------------------------------------------------------------- fused exchanges


def _build(group, name):
    """Builds the fused exchange of `group` (E >= 2 exchanges of one process set) and feeds their Identity ops."""
    hvd = _hvd.require_horovod()
    process_set = group[0].process_set
    n, e = group[0].num_ranks, len(group)
    # Keys: a header (this rank's key counts per embedding) then the keys, per destination rank.
    counts = tf.stack([ex.splits for ex in group], axis=1)  # [N, E]: keys of embedding e for rank i
    header = tf.reshape(tf.cast(counts, tf.int64), [-1])  # rank i's header at [i*E, (i+1)*E)
    with_header = tf.concat([tf.fill([n, 1], e), counts], 1)
    send, send_splits = _pack([header] + [ex.send for ex in group], with_header, [1] * (e + 1), n)
    received, received_splits = hvd.alltoall(
        consistency.gate(send), splits=send_splits, process_set=process_set, name=name + "_keys"
    )
    from_rank = tf.cumsum(tf.cast(received_splits, tf.int64), exclusive=True)
    headers = tf.gather(received, tf.expand_dims(from_rank, 1) + tf.range(e, dtype=tf.int64))  # [N, E]
    received_counts = tf.cast(headers, tf.int32)  # keys of embedding e from rank i
    keys = _unpack(received, tf.concat([tf.fill([n, 1], e), received_counts], 1), [1] * (e + 1), n)[1:]
    for ex, k in zip(group, keys):
        graph_edits.update_input(ex.keys_received, 0, k)
    # Rows back, and their gradients to the owners.
    rows = _exchange_rows(group, counts, received_counts, process_set, name)
    for ex, r in zip(group, rows):
        r.set_shape([None, ex.width])
        graph_edits.update_input(ex.rows_received, 0, r)


def _exchange_rows(group, counts, received_counts, process_set, name):
    """The rows each rank receives for its keys, per embedding (float32 [n_e, width_e]); differentiable: the rows'
    gradients reach the owners in one alltoall of float32 values.

    Args:
      group: the exchanges.
      counts: int32 [N, E]: keys this rank sent to rank i for embedding e (the rows it receives from i).
      received_counts: int32 [N, E]: keys this rank received from rank i for embedding e (the rows it sends to i).
    """
    hvd = _hvd.require_horovod()
    n = group[0].num_ranks
    unit = tf.float32 if all(ex.wire_dtype is None for ex in group) else tf.uint16
    units = [_units_per_row(ex, unit) for ex in group]
    widths = [ex.width for ex in group]

    @tf.custom_gradient
    def exchange(*rows):
        send, splits = _pack(
            [_as_units(r, ex.wire_dtype, unit) for r, ex in zip(rows, group)], received_counts, units, n
        )
        received, _ = hvd.alltoall(send, splits=splits, process_set=process_set, name=name + "_rows")
        parts = _unpack(received, counts, units, n)
        out = [_from_units(p, ex.width, ex.wire_dtype, unit) for p, ex in zip(parts, group)]

        def grad(*upstream):
            # The gradient of each received row goes back to the rank that sent it, float32 whatever the rows'
            # wire dtype (the owner's update gets the gradients the ranks computed, unrounded).
            upstream = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(o) for g, o in zip(upstream, out)]
            _bypass_gradient_gates(upstream)
            flat = [tf.reshape(g, [-1]) for g in upstream]
            send_grad, grad_splits = _pack(flat, counts, widths, n)
            received_grad, _ = hvd.alltoall(
                send_grad, splits=grad_splits, process_set=process_set, name=name + "_row_gradients"
            )
            return [tf.reshape(p, [-1, w]) for p, w in zip(_unpack(received_grad, received_counts, widths, n), widths)]

        return out, grad

    return exchange(*[ex.rows for ex in group])


def _is_gradient_gate(op, scope):
    """Whether `op` is one of the Identity ops with which tf.gradients (gate_gradients=GATE_OP, the optimizers'
    default) makes the gradients of an op's inputs wait for all of them: <scope>/.../tuple/control_dependency[_k],
    behind the NoOp .../tuple/group_deps."""
    if op.type != "Identity" or not op.name.startswith(scope + "/"):
        return False
    parent, _, last = op.name.rpartition("/")
    if not (parent.endswith("/tuple") and (last == "control_dependency" or last.startswith("control_dependency_"))):
        return False
    return [c.name for c in op.control_inputs] == [parent + "/group_deps"]


def _bypass_gradient_gates(tensors):
    """Lets the gradients of the embeddings' rows, `tensors`, be computed without waiting for the gradients that
    GATE_OP groups with the ones on their way.

    With gate_gradients=GATE_OP (the default of `Optimizer.compute_gradients`), tf.gradients passes the gradients of
    each op's inputs through `tuple`: each waits until all of them are computed. The gradient of a dense layer's
    input thus waits for the gradient of its weights, and the rows' gradient exchange, at the end of the backward
    pass, for the weight gradients of every layer above the embeddings. Here each op on the way to `tensors` that
    reads such a gated gradient reads it ungated instead (a graph edit of its input); the values are the same. The
    gate's other readers keep it: a weight's gradient is still used (reduced, applied) only after the input's
    gradient was computed, which is what GATE_OP guards (an update in place must not change what another gradient
    of the same op reads).
    """
    ops = [t.op for t in tensors]
    # tf.gradients' name scope ("gradients", "gradients_1", ..., maybe inside the caller's): only its gates.
    parts = tf.compat.v1.get_default_graph().get_name_scope().split("/")
    ends = [i for i, p in enumerate(parts) if p == "gradients" or p.startswith("gradients_")]
    if not ends:
        return
    scope = "/".join(parts[: ends[0] + 1])
    seen = set()
    while ops:
        op = ops.pop()
        if op in seen or not op.name.startswith(scope + "/"):
            continue
        seen.add(op)
        for index, tensor in enumerate(list(op.inputs)):
            source = tensor.op
            if _is_gradient_gate(source, scope):
                graph_edits.update_input(op, index, source.inputs[0])
                source = source.inputs[0].op
            ops.append(source)
