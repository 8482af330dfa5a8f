"""Table inputs at the edges of the documented ranges, and bad input: clear errors, never a crash.

Huge initial capacities and running out of memory are tested in fresh child processes: the
failure they guard against is the whole process aborting (or its memory blowing up).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_ext.table.table_ops import HashTable, MAX_CAPACITY

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

InvalidArgument = tf.errors.InvalidArgumentError


_CHILD_PRELUDE = """
import json, resource
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import tensorflow_ext as tf_ext
from tensorflow_ext.table.table_ops import MAX_CAPACITY

def rss_mib():
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024.0
"""


def _run_child(code, timeout=300):
    """Runs _CHILD_PRELUDE + `code` in a fresh python; returns (returncode, the JSON it printed last, stderr)."""
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD_PRELUDE + textwrap.dedent(code)],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr[-3000:]


def test_huge_initial_capacity_creates_small_working_tables():
    # Any capacity in the documented range [0, 2^40] is a hint: the table is created without
    # aborting and without touching memory for keys that have not arrived, and it works.
    code = """
  config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
  out = {}
  with tf.Graph().as_default(), tf.compat.v1.Session(config=config) as sess:
    sess.run(tf.constant(0))  # the session's own memory, before any table
    base = rss_mib()
    keys = np.arange(-500, 4500, 7, dtype=np.int64) * 1000003
    vals = np.stack([keys % 97, -(keys % 13)], 1).astype(np.float32)
    for capacity in (2**36, MAX_CAPACITY):
      table = tf_ext.HashTable(dim=2, initial_capacity=capacity, name="t%d" % capacity.bit_length())
      sess.run(table.insert(keys, vals))
      found = sess.run(table.find(np.concatenate([keys, [123456789]]), default_value=-1.0))
      out[str(capacity)] = {
          "ok": bool(np.array_equal(found[:-1], vals)) and found[-1].tolist() == [-1.0, -1.0],
          "size": int(sess.run(table.size())),
          "rss_growth_mib": rss_mib() - base}
    emb = tf_ext.get_dynamic_embedding("emb", 4, initializer=0.5, num_shards=2, initial_capacity=MAX_CAPACITY)
    rows = sess.run(tf_ext.embedding_lookup(emb, tf.constant([1, 2, 3], tf.int64)))
    out["embedding_ok"] = bool(np.all(rows == 0.5))
    out["rss_growth_mib"] = rss_mib() - base
  print(json.dumps(out))
  """
    rc, out, err = _run_child(code)
    assert rc == 0, "child failed (rc %d): %s" % (rc, err)
    for capacity in (2**36, MAX_CAPACITY):
        assert out[str(capacity)]["ok"], out
        assert out[str(capacity)]["size"] == len(range(-500, 4500, 7)), out
    assert out["embedding_ok"], out
    # Before the fix: 2^36 aborted the process, 2^30 alone took 16 GiB.
    assert out["rss_growth_mib"] < 256, out


def test_out_of_memory_is_resource_exhausted_and_table_stays_usable():
    # Address space limited in the child: the growing table runs out of memory. The op fails
    # with ResourceExhausted naming the problem; the process goes on and the table still works.
    code = """
  batch = 1 << 18
  config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
  out = {"error": None}
  with tf.Graph().as_default(), tf.compat.v1.Session(config=config) as sess:
    # One shard: index growth needs large blocks, the table's allocations dominate.
    table = tf_ext.HashTable(dim=1, shard_bits=0, huge_pages=False)
    start = tf.compat.v1.placeholder(tf.int64, [])
    insert = table.insert(tf.range(start, start + batch), tf.ones([batch, 1]))
    probe = tf.range(0, batch, dtype=tf.int64)
    find = table.find(probe, default_value=-1.0)
    size = table.size()
    sess.run(insert, {start: 0})
    with open("/proc/self/status") as f:
      vm_kib = [int(l.split()[1]) for l in f if l.startswith("VmSize:")][0]
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_kib * 1024 + (200 << 20), hard))
    inserted = batch
    try:
      for b in range(1, 400):
        sess.run(insert, {start: b * batch})
        inserted += batch
    except tf.errors.ResourceExhaustedError as e:
      out["error"] = e.message
    out["inserted"] = inserted
    out["size"] = int(sess.run(size))
    out["first_batch_ok"] = bool(np.all(sess.run(find) == 1.0))
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    sess.run(insert, {start: inserted + batch})  # usable once memory is back
    out["size_after"] = int(sess.run(size))
  print(json.dumps(out))
  """
    rc, out, err = _run_child(code)
    assert rc == 0, "child failed (rc %d): %s" % (rc, err)
    assert out["error"] is not None, out
    assert "tf_ext table insert ran out of memory" in out["error"], out
    assert "table is still usable" in out["error"], out
    assert out["inserted"] <= out["size"] <= out["inserted"] + (1 << 18), out
    assert out["first_batch_ok"], out
    assert out["size_after"] >= out["size"] + (1 << 18), out


def test_nan_column_default_shared_by_two_ops(graph):
    # NaN never equals itself: the layout check of the handle op must still see equal layouts.
    nan = float("nan")
    a = HashTable(dim=2, width=3, column_defaults=[0.0, 0.0, nan], shared_name="nan_table")
    b = HashTable(dim=2, width=3, column_defaults=[0.0, 0.0, nan], shared_name="nan_table")
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(a.insert([1, 2], [[1.0, 2.0], [3.0, 4.0]]))
        rows = sess.run(b.find([2, 1, 9], default_value=-1.0, cols=3))
        assert np.array_equal(rows[:2, :2], [[3.0, 4.0], [1.0, 2.0]])
        assert np.all(np.isnan(rows[:2, 2]))  # the NaN default of the column insert did not provide
        assert np.array_equal(rows[2], [-1.0, -1.0, -1.0])
        # Another layout is still refused, naming both.
        c = HashTable(dim=2, width=3, column_defaults=[0.0, 0.0, 1.0], shared_name="nan_table")
        with pytest.raises(tf.errors.FailedPreconditionError, match="already exists with layout"):
            sess.run(c.size())


@pytest.mark.parametrize("method", ["insert", "accumulate", "find_or_insert"])
def test_step_must_be_an_integer(graph, method):
    table = HashTable(dim=1)
    op = getattr(table, method)
    with pytest.raises(InvalidArgument, match=r"step must be an integer scalar, got 1\.5"):
        op([1], [[1.0]], step=1.5)
    with pytest.raises(InvalidArgument, match="step must be an integer scalar, got True"):
        op([1], [[1.0]], step=True)
    with pytest.raises(InvalidArgument, match="step must be an integer scalar, got a float32 tensor"):
        op([1], [[1.0]], step=tf.constant(2.0))
    # Integers of any kind still work.
    with tf.compat.v1.Session(graph=graph) as sess:
        for step in (3, np.int32(4), tf.constant(5, tf.int32)):
            sess.run(op([1], [[1.0]], step=step))
        _, _, versions, _ = sess.run(table.export())
        assert versions.tolist() == [5]


def test_evict_bounds_must_be_integers(graph):
    table = HashTable(dim=1)
    with pytest.raises(InvalidArgument, match=r"min_version must be an integer scalar, got 0\.5"):
        table.evict(min_version=0.5)
    with pytest.raises(InvalidArgument, match="min_frequency must be an integer scalar, got 'x'"):
        table.evict(min_frequency="x")


def test_import_rejects_keys_that_are_not_a_vector(graph):
    table = HashTable(dim=1)
    with pytest.raises(ValueError, match=r"keys must be a vector \[n\].*got shape \(2, 2\)"):
        table.import_([[1, 2], [3, 4]], [[1.0], [2.0], [3.0], [4.0]])
    with pytest.raises(ValueError, match=r"keys must be a vector \[n\].*got shape \(\)"):
        table.import_(7, [[1.0]])
    # Unknown rank: the kernel says the same at run time, and the table is left as it was.
    keys = tf.compat.v1.placeholder(tf.int64)
    imp = table.import_(keys, tf.ones([4, 1]))
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(table.insert([9], [[9.0]]))
        with pytest.raises(InvalidArgument, match=r"import: keys must be a vector \[n\].*got shape \[2,2\]"):
            sess.run(imp, {keys: [[1, 2], [3, 4]]})
        assert sess.run(table.size()) == 1
        sess.run(imp, {keys: [1, 2, 3, 4]})  # a vector imports
        assert sorted(sess.run(table.export())[0].tolist()) == [1, 2, 3, 4]
