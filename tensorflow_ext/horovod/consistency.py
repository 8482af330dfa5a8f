"""The check that every rank built the same model: embedding and variable configurations compared across ranks.

Horovod matches collectives by name and assumes the ranks send tensors of matching shapes. Ranks that built
different models (another `dim`, another optimizer, one rank model-parallel and another data-parallel, a missing
embedding) would otherwise hang in a collective that some rank never runs, or fail deep inside Horovod with a shape
mismatch. Instead, every collective that tensorflow_ext builds (model-parallel lookups, the gradient exchange of
`DistributedOptimizer`) runs after this check, and the training hooks run it before the first step:

1. each rank's configuration is summarised as text, one line per dynamic embedding (dim, key, value and slot dtypes,
   rounding, shards, parallelism, initializer and its seeds, optimizer slot columns, admission and eviction policies), per dense
   variable that is trained or broadcast (shape, dtype), and per setting that decides which collectives run
   (`declare`: the checkpoint schedule of the training hooks, the gradient reduction of `DistributedOptimizer`
   with its compression); its 64-bit fingerprint is allgathered (one small collective);
2. when the fingerprints differ, the texts themselves are allgathered and the step fails on every rank with an
   `InvalidArgumentError` whose message names each embedding or variable that differs and how, e.g.
   ``dynamic embedding 'user': dim differs across ranks: rank 0: 8, rank 1: 16`` or
   ``checkpoint schedule: save_checkpoints_steps differs across ranks: rank 0: 20, rank 1: 30``.

The comparison runs once per graph and process: at the first step (or the training hooks' check), on every rank at
once; once it passed, later steps skip its collective.

The fingerprint is the graph's configuration when the graph was last built into (`refresh`, called by the lookups,
`DistributedOptimizer.apply_gradients` and the training hooks), so it includes optimizer slots added after the
first lookup.
"""

import hashlib
import sys
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tensorflow_ext.embedding import creation
from tensorflow_ext.embedding import shard as shard_lib
from tensorflow_ext.horovod import _hvd
from tensorflow_ext.tf_compat import graph_edits

__all__ = ["check_op", "config_lines", "declare", "describe_mismatch", "gate", "refresh"]

CHECK_NAME = "tf_ext_config_check"

# graph -> _Check (weak: a graph's check goes with the graph).
_checks = weakref.WeakKeyDictionary()

# graph -> {what: [(field, value), ...]}: the settings declared for the check (see declare).
_settings = weakref.WeakKeyDictionary()

# Collections whose variables are each rank's own (not broadcast): the Top-K residuals of DistributedOptimizer.
_RANK_LOCAL_COLLECTIONS = ("tf_ext_topk_residuals",)  # allreduce.TOPK_RESIDUALS (allreduce imports this module)


def declare(what, fields, graph=None):
    """Adds a setting that every rank must share to the check of `graph` (replacing an earlier one of that name).

    For settings that decide which collectives a step or a save runs but that are not part of the graph's
    variables, e.g. the checkpoint schedule (every rank joins rank 0's saves of model-parallel embeddings).

    Args:
      what: the setting's name, as the error names it (e.g. "checkpoint schedule").
      fields: list of (field, value) pairs; values are compared as text.
      graph: a `tf.Graph` (default: the default graph).
    """
    graph = graph or tf.compat.v1.get_default_graph()
    _settings.setdefault(graph, {})[what] = [(str(k), str(v)) for k, v in fields]
    refresh(graph)


def config_lines(graph):
    """This process's configuration of `graph`: one line per embedding, per dense variable and per declared setting.

    Each line is ``<what> '<name>'`` followed by tab-separated ``field=value`` items.

    Args:
      graph: a `tf.Graph`.

    Returns:
      list of str.
    """
    lines = []
    for emb in creation.get_dynamic_embeddings(graph):
        dist = emb.distribution
        init = emb.initializer
        seeds = init.seeds() if hasattr(init, "seeds") else None
        groups = emb.shards[0].slot_groups
        fields = [
            ("dim", emb.dim),
            ("key_dtype", emb.key_dtype.name),
            # A model-parallel lookup sends rows in this dtype: every rank must store the same.
            ("value_dtype", emb.value_dtype.name),
            # How updates round into the rows (and the slots' storage): replicas that round alike stay equal.
            ("slot_dtype", emb.slot_dtype.name if emb.slot_dtype is not None else "float32"),
            ("rounding", emb.rounding),
            ("num_shards", emb.num_shards),
            ("parallelism", "model(%d ranks)" % dist.num_ranks() if dist is not None else "data"),
            ("initializer", "%r seeds=%s" % (init, seeds)),
            (
                "optimizer slots",
                ", ".join("%s[%s]" % (g.optimizer_class, ",".join(g.slot_names)) for g in groups) or "none",
            ),
            ("trainable", emb.trainable),
            # Admission adds variables (broadcast) and state (saved); eviction changes what every replica holds.
            ("admission", _policy(getattr(emb, "admission", None))),
            ("eviction", _policy(getattr(emb, "eviction", None))),
        ]
        lines.append("dynamic embedding '%s'\t" % emb.name + "\t".join("%s=%s" % f for f in fields))
    # Every dense variable that is trained or broadcast (broadcast_global_variables sends each global variable by
    # name: a variable on one rank only, e.g. a policy's counter, would leave the others waiting).
    rank_local = set(id(v) for c in _RANK_LOCAL_COLLECTIONS for v in graph.get_collection(c))
    seen = set()
    for collection in (tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
        for v in graph.get_collection(collection):
            if isinstance(v, shard_lib.DynamicEmbeddingShard) or id(v) in seen or id(v) in rank_local:
                continue
            seen.add(id(v))
            lines.append(
                "variable '%s'\tshape=%s\tdtype=%s"
                % (v.op.name, v.shape.as_list() if v.shape.rank is not None else None, v.dtype.base_dtype.name)
            )
    for what, fields in sorted(_settings.get(graph, {}).items()):
        lines.append("%s\t" % what + "\t".join("%s=%s" % f for f in fields))
    return lines


def _policy(policy):
    return "none" if policy is None else repr(policy)


def _parse(text):
    out = {}
    for line in text.splitlines():
        if not line:
            continue
        head, _, rest = line.partition("\t")
        out[head] = dict(item.split("=", 1) for item in rest.split("\t") if "=" in item)
    return out


def describe_mismatch(texts):
    """What differs between the ranks' configurations.

    Args:
      texts: list of str, rank r's `config_lines` joined by newlines at index r.

    Returns:
      str: one sentence per embedding/variable that differs (empty when all agree).
    """
    parsed = [_parse(t) for t in texts]
    ranks = list(range(len(texts)))
    heads = []
    for p in parsed:
        heads.extend(h for h in p if h not in heads)
    problems = []
    for head in heads:
        have = [r for r in ranks if head in parsed[r]]
        if len(have) != len(ranks):
            problems.append(
                "%s exists on rank%s %s but not on rank%s %s"
                % (
                    head,
                    "s" if len(have) > 1 else "",
                    ", ".join(map(str, have)),
                    "s" if len(ranks) - len(have) > 1 else "",
                    ", ".join(str(r) for r in ranks if r not in have),
                )
            )
            continue
        fields = []
        for p in (parsed[r][head] for r in ranks):
            fields.extend(f for f in p if f not in fields)
        for field in fields:
            values = [parsed[r][head].get(field) for r in ranks]
            if len(set(values)) > 1:
                problems.append(
                    "%s: %s differs across ranks: %s"
                    % (head, field, ", ".join("rank %d: %s" % (r, values[r]) for r in ranks))
                )
    return "; ".join(problems)


def _fingerprint(lines):
    digest = hashlib.sha256("\n".join(lines).encode("utf-8")).digest()
    return np.frombuffer(digest[:8], np.int64).reshape([1])


class _Check(object):
    """The check op of one graph and the constant holding this rank's fingerprint."""

    def __init__(self, graph):
        _hvd.require_horovod()
        self._graph_ref = weakref.ref(graph)
        self._passed = False
        with graph.as_default(), tf.control_dependencies(None), tf.compat.v1.name_scope(None):
            with tf.compat.v1.name_scope(CHECK_NAME + "/"):
                self.fingerprint = tf.constant(_fingerprint(config_lines(graph)), tf.int64, name="fingerprint")
                # The fingerprints are compared once per process and graph: the first run of any op behind the check
                # (a step, or the training hooks' check) runs the allgather on every rank at once, and once it passed,
                # the configuration of this graph cannot change on any rank, so later steps skip the collective. Every
                # rank takes the same branch: all of them pass the first check together.
                pending = tf.numpy_function(self._pending, [], tf.bool, stateful=True, name="pending")
                agree = tf.cond(pending, self._compare, lambda: tf.constant(True), name="compare_once")
                # Horovod's ops are not stateful, so Grappler turns a collective whose outputs reach only control edges
                # into a NoOp. The check ends in a stateful Assert, which keeps it (and its allgather) in every step.
                self.op = tf.debugging.Assert(
                    agree, ["tensorflow_ext.horovod configuration check failed"], name="check"
                )

    def _pending(self):
        return np.bool_(not self._passed)

    def _passed_now(self, agree):
        self._passed = self._passed or bool(agree)
        return agree

    def _compare(self):
        hvd = _hvd.require_horovod()
        # Horovod's ops are not stateful: with a constant input, TF's constant folding would run the allgather
        # while optimizing a graph (outside of any step, on one rank only).
        mine = _stateful_identity(self.fingerprint)
        everyone = hvd.allgather(mine, name=CHECK_NAME)
        same = tf.reduce_all(tf.equal(everyone, mine))
        agree = tf.cond(same, lambda: tf.constant(True), self._mismatch, name="agree")
        return tf.numpy_function(self._passed_now, [agree], tf.bool, stateful=True, name="passed")

    def _text_bytes(self):
        graph = self._graph_ref()
        text = "\n".join(config_lines(graph)) if graph is not None else ""
        return np.frombuffer(text.encode("utf-8"), np.uint8)

    def _mismatch(self):
        hvd = _hvd.require_horovod()
        mine = tf.numpy_function(self._text_bytes, [], tf.uint8, stateful=True, name="config_text")
        mine = tf.reshape(mine, [-1])
        texts = hvd.allgather(mine, name=CHECK_NAME + "_text")
        lengths = hvd.allgather(tf.reshape(tf.size(mine), [1]), name=CHECK_NAME + "_lengths")
        return tf.numpy_function(_raise_mismatch, [texts, lengths], tf.bool, stateful=True, name="raise_mismatch")

    def refresh(self):
        graph = self._graph_ref()
        value = tf.make_tensor_proto(_fingerprint(config_lines(graph)), tf.int64)
        # The constant was built with the configuration known at the first collective; later builds (optimizer slot
        # columns, more embeddings) update it before the graph runs.
        graph_edits.set_attr(self.fingerprint.op, "value", attr_value_pb2.AttrValue(tensor=value))


def _raise_mismatch(texts, lengths):
    out, start = [], 0
    for n in lengths:
        out.append(bytes(texts[start : start + int(n)]).decode("utf-8"))
        start += int(n)
    detail = describe_mismatch(out) or "the configurations differ (%s)" % " | ".join(out)
    message = (
        "tensorflow_ext.horovod: the ranks built different models, so their collectives cannot be "
        "matched: %s. Every rank must run the same model code with the same arguments (and the same TF_EXT_HVD_* "
        "environment overrides of DistributedOptimizer's reduction)." % detail
    )
    # Also written at once: when the job ends, the launcher stops the other ranks and may lose the end of their
    # output (the traceback with the error).
    print(message, file=sys.stderr, flush=True)
    raise ValueError(message)


def _get(graph):
    check = _checks.get(graph)
    if check is None:
        check = _checks[graph] = _Check(graph)
    return check


def check_op(graph=None):
    """The graph's configuration check op (built on first use), with its fingerprint refreshed.

    Args:
      graph: a `tf.Graph` (default: the default graph).

    Returns:
      An op; running it on every rank raises InvalidArgumentError when the ranks' configurations differ.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    check = _get(graph)
    check.refresh()
    return check.op


def refresh(graph=None):
    """Updates the fingerprint after the graph's configuration changed (no-op if no check was built)."""
    graph = graph or tf.compat.v1.get_default_graph()
    check = _checks.get(graph)
    if check is not None:
        check.refresh()


def gate(tensor):
    """`tensor`, available only after the configuration check ran (put it in front of every collective's input).

    Args:
      tensor: a tensor in the default graph.

    Returns:
      `tensor` passed through a stateful op with a control dependency on `check_op()`.
    """
    op = check_op(tensor.graph)
    with tf.control_dependencies([op]):
        # Stateful, so that TF's constant folding never runs the collective behind it while optimizing a graph
        # (ids from a tf.constant would otherwise make a model-parallel lookup's alltoall foldable).
        return _stateful_identity(tensor)


def _stateful_identity(tensor):
    """`tensor` through a Print that never prints: stateful (never constant-folded, never pruned), no copy."""
    return tf.raw_ops.Print(input=tensor, data=[], message="", first_n=0, summarize=0)
