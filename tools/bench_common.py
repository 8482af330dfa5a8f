"""Shared helpers for the benchmarks in tools/ (TF1 graph mode, peers side by side).

Not part of the package: nothing under tensorflow_ext/ imports this.
"""

import ctypes
import gc
import json
import os
import platform
import random
import sys
import time
import warnings

# TF 2.15 warns about every tf.compat.v1.layers call etc.; the benchmarks' output stays readable.
warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    # A source checkout with a built op library (development builds copy the .so into
    # tensorflow_ext/) wins; otherwise an installed wheel, if any, is found first.
    if os.path.exists(os.path.join(REPO_ROOT, "tensorflow_ext", "_tf_ext_ops.so")):
        sys.path.insert(0, REPO_ROOT)
    else:
        sys.path.append(REPO_ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")
tf.compat.v1.disable_v2_behavior()
# TFRA 0.7.2's optimizer patch needs resource variables in graph mode (PLATFORM.md);
# turning them on for every backend keeps the variables of all variants alike.
tf.compat.v1.enable_resource_variables()
tf.get_logger().setLevel("ERROR")


def log(msg):
    print(msg, flush=True)


# --------------------------------------------------------------------------- sessions


def add_session_args(parser):
    """The thread-count options every benchmark's sessions share (--intra_op 2, --inter_op 1 by default)."""
    parser.add_argument("--intra_op", "--intra-op", type=int, default=2, help="intra-op threads of every session")
    parser.add_argument("--inter_op", "--inter-op", type=int, default=1, help="inter-op threads of every session")


def session_config(intra=2, inter=1):
    return tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=intra,
        inter_op_parallelism_threads=inter,
        allow_soft_placement=True,
    )


def start_session(graph, config):
    """A session on `graph` whose variables, local variables and tables are initialized."""
    with graph.as_default():
        init = [
            tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
            tf.compat.v1.tables_initializer(),
        ]
    sess = tf.compat.v1.Session(graph=graph, config=config)
    sess.run(init)
    return sess


# --------------------------------------------------------------------------- timing


def time_call(fn, *args, **kwargs):
    """Seconds one call of fn(*args, **kwargs) takes (wall clock)."""
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def interleaved(items, rounds, seed):
    """Yields (round, item) for `rounds` rounds over all `items`, reshuffled each round.

    The variants under comparison take turns, so that the noise of a shared machine hits them alike.
    """
    rnd = random.Random(seed)
    for r in range(rounds):
        order = list(items)
        rnd.shuffle(order)
        for item in order:
            yield r, item


def summary_ms(seconds):
    """Median, 10th and 90th percentile (ms) and count of a list of step times in seconds."""
    ms = np.asarray(seconds, np.float64) * 1e3
    return {
        "median_ms": float(np.median(ms)),
        "p10_ms": float(np.percentile(ms, 10)),
        "p90_ms": float(np.percentile(ms, 90)),
        "n": int(len(ms)),
    }


# --------------------------------------------------------------------------- peers


def import_tfra():
    """Returns (dynamic_embedding module, None) or (None, reason)."""
    try:
        import logging

        logging.getLogger("tensorflow").setLevel(logging.ERROR)
        from tensorflow_recommenders_addons import dynamic_embedding as de
        import tensorflow_recommenders_addons as tfra

        return de, None, tfra.__version__
    except Exception as e:  # pragma: no cover - depends on the environment
        return (
            None,
            "TFRA not importable (%s: %s); install with "
            "`pip install -r requirements-bench.txt --no-deps`" % (type(e).__name__, e),
            None,
        )


def _ours_unavailable(e):
    so = os.path.join(REPO_ROOT, "tensorflow_ext", "_tf_ext_ops.so")
    hint = "" if os.path.exists(so) else " (no %s: run `make build`)" % os.path.relpath(so, REPO_ROOT)
    return "tensorflow_ext not importable%s: %s: %s" % (hint, type(e).__name__, e)


def import_ours_table():
    """Returns (table_ops module, None) or (None, reason)."""
    try:
        from tensorflow_ext.table import table_ops
    except Exception as e:
        return None, _ours_unavailable(e)
    return table_ops, None


def import_ours_embedding():
    """Returns (tensorflow_ext module, None) or (None, reason) for the dynamic-embedding API."""
    try:
        import tensorflow_ext as tf_ext

        tf_ext.embedding  # imported lazily: fail here, not inside a variant
    except Exception as e:
        return None, _ours_unavailable(e)
    return tf_ext, None


def available(classes_by_name, names):
    """The classes (backends, variants) of `names` that can run here; each has unavailable_reason() and label.

    Returns:
      (classes, skipped: {name: reason}, labels: {name: label}).
    """
    classes, skipped, labels = [], {}, {}
    for name in names:
        cls = classes_by_name[name]
        reason = cls.unavailable_reason()
        if reason:
            log("skipping %s: %s" % (name, reason))
            skipped[name] = reason
        else:
            classes.append(cls)
            labels[name] = cls.label
    return classes, skipped, labels


# --------------------------------------------------------------------------- memory


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def trim_heap():
    """Returns freed heap pages to the OS so that RSS reflects live data."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


# --------------------------------------------------------------------------- reporting


def machine_info():
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "cpus": os.cpu_count(),
        "loadavg": load,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def finish(out, text, json_path):
    """Prints the report `text` and the load average at start and end, and writes `out` as JSON to json_path."""
    info = out["machine"]
    info["loadavg_end"] = machine_info()["loadavg"]
    print()
    print(text)
    print("\nload average start %s, end %s; wall %.0fs" % (info["loadavg"], info["loadavg_end"], out["wall_s"]))
    write_json(json_path, out)
    return out


def write_json(path, obj):
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote %s" % path)


def fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float) and not np.isfinite(x):
        return "-"
    return ("%%.%df" % nd) % x
