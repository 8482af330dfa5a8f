"""The CTR example's command line: its flags, their defaults and the checks on them.

:func:`parse_args` returns an ``argparse.Namespace`` in which every flag has its value (``--quick`` picks small
defaults for the flags not given) plus the values derived from them (``hidden_units``, ``train_files``,
``eval_files``). Bad values stop the program with argparse's usage error (exit code 2). This module does not
import TensorFlow.
"""

import argparse
import glob
import os
import tempfile

from tensorflow_ext.table import tiered

DEFAULT_MODEL_DIR = os.path.join(tempfile.gettempdir(), "tf_ext_ctr_model")

# Defaults: a run on a 2-core machine takes ~2-4 minutes; --quick is for tests.
_DEFAULTS = dict(
    steps=3000,
    batch_size=1024,
    eval_steps=20,
    dim=8,
    hidden="256,128",
    max_ids=2**22,
    log_every=100,
    update_secs=10.0,
    live_eval_secs=30.0,
    live_eval_batches=4,
)
_QUICK = dict(
    steps=100,
    batch_size=512,
    eval_steps=5,
    dim=4,
    hidden="64,32",
    max_ids=2**20,
    log_every=50,
    update_secs=2.0,
    live_eval_secs=4.0,
    live_eval_batches=2,
)

_DISTRIBUTED = ("model_parallel", "data_parallel")
_DISTRIBUTED_SAVE_STEPS = 1000

_OPTIMIZERS = ("adagrad", "rowwise_adagrad", "adam", "ftrl", "sgd", "momentum", "rmsprop")
_DEFAULT_LR = {
    "adagrad": 0.5,
    "rowwise_adagrad": 0.5,
    "adam": 0.001,
    "ftrl": 0.05,
    "sgd": 0.5,
    "momentum": 0.05,
    "rmsprop": 0.001,
}

# How the tables store their rows (training) and the serving export's rows: TensorFlow dtype names.
VALUE_DTYPES = ("float32", "bfloat16", "float16")
SERVE_DTYPES = VALUE_DTYPES + ("int8",)

# The flags of live serving (--serve_live): given without it, they are refused.
_LIVE_FLAGS = ("update_secs", "live_eval_secs", "live_eval_batches", "updates_dir", "poll_secs")

# --compression: DistributedOptimizer's names (tensorflow_ext.horovod.Compression).
COMPRESSIONS = ("none", "fp16", "bf16", "auto")

# How --distributed reduces the dense gradients: given without it, they are refused.
_ALLREDUCE_FLAGS = ("compression", "topk_ratio", "node_size")

# Flags that count things: each must be >= 1 when given.
_POSITIVE_FLAGS = (
    "batch_size",
    "dim",
    "num_shards",
    "log_every",
    "epochs",
    "save_checkpoints_steps",
    "days",
    "admission",
    "bloom_counters",
    "capacity",
    "evict_every",
    "static_buckets",
    "live_eval_batches",
    "node_size",
    "untimed_steps",
)


def parse_args(argv=None):
    """Parses the command line.

    Args:
      argv: argument list without the program name (default ``sys.argv[1:]``).

    Returns:
      An ``argparse.Namespace`` with every default filled in (``--quick`` picks
      small defaults for flags not given).
    """
    parser = argparse.ArgumentParser(
        prog="python -m tensorflow_ext.examples.ctr",
        description="DeepFM / Wide&Deep CTR Estimator with tf_ext dynamic embeddings.",
    )
    # --help lists the flags in this order: the job, its sizes, the row storage, the memory and disk tiers, the run,
    # the feature lifecycle, live serving, the process.
    for add_flags in (
        _add_job_flags,
        _add_size_flags,
        _add_storage_flags,
        _add_tier_flags,
        _add_run_flags,
        _add_lifecycle_flags,
        _add_live_flags,
        _add_process_flags,
    ):
        add_flags(parser)
    args = parser.parse_args(argv)
    _fill_defaults(parser, args)
    _check(parser, args)
    if args.data:
        args.train_files = _expand(args.data)
        if not args.train_files:
            parser.error("--data %r matches no file" % args.data)
        args.eval_files = _expand(args.eval_data) if args.eval_data else None
        if args.eval_data and not args.eval_files:
            parser.error("--eval_data %r matches no file" % args.eval_data)
    return args


def _add_job_flags(p):
    """What is trained, where it is kept, and on which data."""
    p.add_argument(
        "--model",
        choices=("deepfm", "wide_deep"),
        default="deepfm",
        help="model: DeepFM (first order + FM + MLP on shared embeddings) or "
        "Wide&Deep (linear on per-id weights + MLP on embeddings). Default deepfm.",
    )
    p.add_argument(
        "--model_dir",
        default=DEFAULT_MODEL_DIR,
        help="checkpoints and TensorBoard summaries; re-running continues from its " "checkpoint. Default %(default)s.",
    )
    p.add_argument("--fresh", action="store_true", help="delete --model_dir first (start from scratch).")
    p.add_argument(
        "--data",
        default=None,
        help="Criteo-format TSV training files (comma-separated globs) instead of the " "synthetic stream.",
    )
    p.add_argument(
        "--eval_data",
        default=None,
        help="TSV evaluation files. Default with --data: a 1/10 hash-split of --data " "held out from training.",
    )
    p.add_argument("--epochs", type=int, default=1, help="passes over --data (default 1).")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny run for tests (%s)." % ", ".join("%s=%s" % kv for kv in sorted(_QUICK.items())),
    )


def _add_size_flags(p):
    """Steps, batches, the model's sizes and its optimizer."""
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps in this run (default %d; %d with --quick; with --data: "
        "until the data is exhausted)." % (_DEFAULTS["steps"], _QUICK["steps"]),
    )
    p.add_argument(
        "--batch_size", type=int, default=None, help="examples per step (default %d)." % _DEFAULTS["batch_size"]
    )
    p.add_argument(
        "--eval_steps",
        type=int,
        default=None,
        help="evaluation batches (default %d; with --data: all eval data)." % _DEFAULTS["eval_steps"],
    )
    p.add_argument("--dim", type=int, default=None, help="embedding width per field (default %d)." % _DEFAULTS["dim"])
    p.add_argument(
        "--hidden", default=None, help="MLP hidden sizes, comma-separated (default %s)." % _DEFAULTS["hidden"]
    )
    p.add_argument(
        "--optimizer",
        choices=_OPTIMIZERS,
        default="adagrad",
        help="stock tf.compat.v1.train optimizer for all variables and tables " "(default adagrad).",
    )
    p.add_argument(
        "--learning_rate",
        type=float,
        default=None,
        help="default: %s." % ", ".join("%s %g" % kv for kv in sorted(_DEFAULT_LR.items())),
    )
    p.add_argument("--num_shards", type=int, default=1, help="shards per table (default 1).")


def _add_storage_flags(p):
    """How the tables store their rows, and how the serving export stores them."""
    p.add_argument(
        "--value_dtype",
        choices=VALUE_DTYPES,
        default="float32",
        help="how the tables store the embedding columns (lookups return float32 either way; optimizer math is "
        "float32, rounded back to this dtype). Default float32.",
    )
    p.add_argument(
        "--slot_dtype",
        choices=("float32", "same"),
        default="float32",
        help="how the tables store the optimizer's slot columns: float32, or the same dtype as --value_dtype. "
        "Default float32.",
    )
    p.add_argument(
        "--rounding",
        choices=("nearest", "stochastic"),
        default=None,
        help="how a compact table rounds the rows an optimizer writes (default: the library's).",
    )
    p.add_argument(
        "--serve_dtype",
        choices=SERVE_DTYPES,
        default=None,
        help="how the serving export stores the embedding rows: float32, bfloat16, float16, or int8 (8 bits per "
        "column with a per-row scale and bias). Default: as the tables store them (--value_dtype).",
    )
    p.add_argument(
        "--serve_frozen",
        action="store_true",
        help="export read-only frozen tables (tf_ext.serving.freeze_for_serving) instead of plain ones.",
    )
    p.add_argument(
        "--served_auc",
        action="store_true",
        help="after the export, load it in a fresh session and report its AUC on the evaluation data "
        "(summary: served_auc).",
    )


def _bytes_flag(flag):
    """An argparse type: a size in bytes, a number or a string with a unit ("1.5GB", "512MiB")."""

    def parse(value):
        try:
            return tiered.parse_bytes(value, flag)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "bytes"  # argparse's "invalid bytes value" message
    return parse


def _add_tier_flags(p):
    """Tiered storage: a memory budget for the tables, the rest of their rows on disk."""
    p.add_argument(
        "--memory_budget",
        type=_bytes_flag("--memory_budget"),
        default=None,
        help="tiered tables: at most this many bytes of table rows in memory (all tables of this process together, "
        "e.g. 1.5GB or 512MiB), the others on disk under --tier_path (tf_ext.TieredStorage). Training gives the "
        "same results as in memory. Default: every row in memory.",
    )
    p.add_argument(
        "--tier_path",
        default=None,
        help="with --memory_budget: the directory of the tables' disk stores (wiped when a table opens them: they "
        "are caches of the checkpoint). Default: a new temporary directory, removed at the end of the run.",
    )
    p.add_argument(
        "--disk_budget",
        type=_bytes_flag("--disk_budget"),
        default=None,
        help="with --memory_budget: cap of the disk stores (all tables together); keys beyond it are dropped, "
        "least recently used first (with --tier_policy lfu: least frequently). Default: unbounded.",
    )
    p.add_argument(
        "--tier_policy",
        choices=tiered.POLICIES,
        default="lru",
        help="with --memory_budget: which rows leave memory (and a capped disk) first: lru (least recently "
        "updated, default) or lfu (least frequently looked up).",
    )
    p.add_argument(
        "--no_prefetch",
        action="store_true",
        help="with --memory_budget: do not prefetch the next batch's ids from disk while a step runs (the input "
        "pipeline pairs each batch with the next one's ids; off under --distributed).",
    )


def _add_run_flags(p):
    """The synthetic stream, logging, checkpoints, distribution and the serving export."""
    p.add_argument(
        "--max_ids",
        type=int,
        default=None,
        help="synthetic: id space per field, caps Criteo's cardinalities " "(default 2^22).",
    )
    p.add_argument("--zipf", type=float, default=1.1, help="synthetic: Zipf exponent of id frequencies (default 1.1).")
    p.add_argument(
        "--seed", type=int, default=0, help="synthetic: seed of the hidden model and the draws; also the TF seed."
    )
    p.add_argument(
        "--log_every",
        type=int,
        default=None,
        help="log loss, steps/s and table keys every N steps (default %d)." % _DEFAULTS["log_every"],
    )
    p.add_argument(
        "--save_checkpoints_secs",
        type=int,
        default=120,
        help="checkpoint period in seconds; one is always written at the end " "(default 120).",
    )
    p.add_argument(
        "--save_checkpoints_steps",
        type=int,
        default=None,
        help="checkpoint every N steps instead of --save_checkpoints_secs (with --distributed the default is %d: "
        "model-parallel tables are saved by all ranks together, at the same step)." % _DISTRIBUTED_SAVE_STEPS,
    )
    p.add_argument(
        "--distributed",
        choices=_DISTRIBUTED,
        default=None,
        help="train under horovodrun: model_parallel (each rank holds 1/N of every table's keys) or data_parallel "
        "(each rank holds full replicas). --batch_size is per rank.",
    )
    _add_allreduce_flags(p)
    p.add_argument(
        "--untimed_steps",
        type=int,
        default=1,
        help="the first N training steps are left out of steps/s and examples/s (graph warm-up; under "
        "--distributed also the first collectives and compression='auto''s measurement). Default 1.",
    )
    p.add_argument(
        "--export_dir",
        default=None,
        help="where the serving SavedModel goes (default: <model_dir>/export; a timestamped directory inside).",
    )
    p.add_argument("--no_export", action="store_true", help="skip the SavedModel export.")


def _add_allreduce_flags(p):
    """How --distributed reduces the dense gradients (tensorflow_ext.horovod.DistributedOptimizer's arguments)."""
    p.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default=None,
        help="with --distributed: the dense gradients' wire format: none (float32), fp16, bf16, or auto (per fused "
        "buffer the fastest of these, and of Top-K with --topk_ratio, measured before the first step). Default: "
        "the library's (none, or TF_EXT_HVD_COMPRESSION).",
    )
    p.add_argument(
        "--topk_ratio",
        type=float,
        default=None,
        help="with --distributed: Top-K: each rank sends this fraction (0 < r <= 1) of each dense gradient's "
        "largest entries and keeps the rest as a residual for the next steps. Default: off.",
    )
    p.add_argument(
        "--node_size",
        type=int,
        default=None,
        help="with --distributed: 2D allreduce: reduce inside each node of N ranks first, then across nodes "
        "(N divides the number of ranks; not with --compression auto). Default: off.",
    )


def _add_lifecycle_flags(p):
    """Day-by-day training, admission and eviction, and the static-table baseline."""
    p.add_argument(
        "--days",
        type=int,
        default=None,
        help="day-by-day mode: N days of --steps each on a drifting stream; every day continues from yesterday's "
        "checkpoint, trains, evaluates on the next day's data, evicts/admits by the policies and exports; a table "
        "and a PNG plot (<model_dir>/days.png) at the end.",
    )
    p.add_argument(
        "--drift_per_day",
        type=float,
        default=20.0,
        help="synthetic, with --days or --serve_live: popularity ranks the ids move per day of --steps (new ids "
        "appear, old ones fade; default 20).",
    )
    p.add_argument(
        "--admission",
        type=int,
        default=None,
        help="admission policy: a key gets a row at its N-th training sighting (CountAdmission; default: off).",
    )
    p.add_argument(
        "--bloom_counters",
        type=int,
        default=None,
        help="with --admission: count in a counting Bloom filter of this many counters per table instead.",
    )
    p.add_argument("--capacity", type=int, default=None, help="eviction: at most N keys per table (most recent).")
    p.add_argument(
        "--steps_to_live", type=int, default=None, help="eviction: drop keys not trained in the last N steps."
    )
    p.add_argument(
        "--evict_every", type=int, default=100, help="with --capacity/--steps_to_live: evict every N steps (100)."
    )
    p.add_argument(
        "--static_buckets",
        type=int,
        default=None,
        help="baseline: static hashed tables of N buckets per field (tf.Variable, ids hashed into buckets) "
        "instead of dynamic embeddings.",
    )


def _positive_float(value):
    """An argparse type: a number of seconds > 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % (value,)) from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError("must be > 0, got %r" % (value,))
    return seconds


def _add_live_flags(p):
    """Live serving: the day's training streamed into a served model (live.py)."""
    p.add_argument(
        "--serve_live",
        action="store_true",
        help="live-serving mode: export the model at the start of the day as an updatable frozen SavedModel, serve "
        "it from a follower process (python -m tensorflow_ext.serving.follow) that applies the serving updates the "
        "trainer writes every --update_secs, and report the served AUC over the day beside the start-of-day "
        "export's (a model refreshed only by daily exports). The synthetic stream drifts by --drift_per_day over "
        "the run.",
    )
    p.add_argument(
        "--update_secs",
        type=_positive_float,
        default=None,
        help="with --serve_live: write a serving update every N seconds of training (default %g; %g with --quick)."
        % (_DEFAULTS["update_secs"], _QUICK["update_secs"]),
    )
    p.add_argument(
        "--live_eval_secs",
        type=_positive_float,
        default=None,
        help="with --serve_live: score the held-out slice every N seconds (default %g; %g with --quick)."
        % (_DEFAULTS["live_eval_secs"], _QUICK["live_eval_secs"]),
    )
    p.add_argument(
        "--live_eval_batches",
        type=int,
        default=None,
        help="with --serve_live: batches of --batch_size held-out examples in each scored slice (default %d; %d "
        "with --quick)." % (_DEFAULTS["live_eval_batches"], _QUICK["live_eval_batches"]),
    )
    p.add_argument(
        "--updates_dir",
        default=None,
        help="with --serve_live: where the trainer writes serving updates (default <model_dir>/serving_updates).",
    )
    p.add_argument(
        "--poll_secs",
        type=_positive_float,
        default=None,
        help="with --serve_live: how often the follower looks for new updates (default 1).",
    )


def _add_process_flags(p):
    """Graph passes, threads and how much is printed."""
    p.add_argument(
        "--graph_passes",
        action="store_true",
        help="run the sessions with tf_ext's graph passes (tf_ext.graph.enable_optimizations: the 26 per-table "
        "lookups and sparse updates fused into multi-table ops; same results).",
    )
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op and inter-op threads (default 0: TensorFlow's choice)."
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress lines: only warnings, errors and the JSON summary."
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="also TensorFlow's own logs: the Estimator's INFO log, deprecation "
        "warnings of the TF1 APIs, the C++ runtime's info lines.",
    )


def _fill_defaults(p, args):
    """The defaults that depend on other flags (--quick, --data, --optimizer, --model_dir, --distributed)."""
    defaults = _QUICK if args.quick else _DEFAULTS
    for k, v in defaults.items():
        if getattr(args, k) is None and not (args.data and k in ("steps", "eval_steps")):
            if k not in _LIVE_FLAGS or args.serve_live:
                setattr(args, k, v)
    if args.learning_rate is None:
        args.learning_rate = _DEFAULT_LR[args.optimizer]
    try:
        args.hidden_units = [int(h) for h in args.hidden.split(",") if h.strip()]
    except ValueError:
        p.error("--hidden must be comma-separated ints, got %r" % args.hidden)
    if args.export_dir is None:
        args.export_dir = os.path.join(args.model_dir, "export")
    if args.serve_live:
        if args.updates_dir is None:
            args.updates_dir = os.path.join(args.model_dir, "serving_updates")
        if args.poll_secs is None:
            args.poll_secs = 1.0
    if args.distributed and args.save_checkpoints_steps is None:
        args.save_checkpoints_steps = _DISTRIBUTED_SAVE_STEPS


def _check(p, args):
    """Refuses values out of range and flags that exclude each other."""
    for name in _POSITIVE_FLAGS:
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error("--%s must be >= 1" % name)
    if args.steps is not None and args.steps < 0:
        p.error("--steps must be >= 0")
    if args.steps_to_live is not None and args.steps_to_live < 0:
        p.error("--steps_to_live must be >= 0")
    if args.bloom_counters is not None and args.admission is None:
        p.error("--bloom_counters needs --admission")
    if args.static_buckets and (args.admission or args.capacity or args.steps_to_live is not None):
        p.error("--static_buckets (static tables) excludes the dynamic-embedding policies")
    if args.days and args.data:
        p.error("--days uses the synthetic stream (not --data)")
    if args.quiet and args.verbose:
        p.error("--quiet and --verbose exclude each other")
    _check_storage(p, args)
    _check_live(p, args)
    _check_allreduce(p, args)


def _check_allreduce(p, args):
    """Refuses the dense gradients' reduction flags without --distributed, and values the library would refuse."""
    if not args.distributed:
        given = ["--" + name for name in _ALLREDUCE_FLAGS if getattr(args, name) is not None]
        if given:
            p.error("%s describe how --distributed reduces gradients: give --distributed too" % ", ".join(given))
        return
    if args.topk_ratio is not None and not 0.0 < args.topk_ratio <= 1.0:
        p.error("--topk_ratio must be in (0, 1], got %r" % args.topk_ratio)
    if args.compression == "auto" and args.node_size:
        p.error("--compression auto chooses among the flat reductions: not with --node_size (2D)")


def _check_live(p, args):
    """Refuses live-serving flags without --serve_live, and --serve_live with what it does not support."""
    if not args.serve_live:
        given = ["--" + name for name in _LIVE_FLAGS if getattr(args, name) is not None]
        if given:
            p.error("%s describe live serving: give --serve_live too" % ", ".join(given))
        return
    # The mode scores slices of the synthetic stream at the trainer's clock, and runs one trainer process.
    for flag, value in (
        ("--data", args.data),
        ("--days", args.days),
        ("--distributed", args.distributed),
        ("--no_export", args.no_export),
        ("--static_buckets", args.static_buckets),
    ):
        if value:
            p.error("--serve_live does not run with %s (one process training on the synthetic stream)" % flag)


def _check_storage(p, args):
    """Refuses row-storage flags that do not apply to the run."""
    if args.static_buckets and (args.value_dtype != "float32" or args.slot_dtype != "float32" or args.rounding):
        p.error("--value_dtype, --slot_dtype and --rounding apply to dynamic embeddings, not --static_buckets")
    if args.rounding and args.value_dtype == "float32":
        p.error("--rounding applies to compact rows: give --value_dtype bfloat16 or float16")
    if args.no_export and (args.serve_dtype or args.serve_frozen or args.served_auc):
        p.error("--serve_dtype, --serve_frozen and --served_auc describe the export: not with --no_export")
    if args.static_buckets and (args.serve_dtype or args.serve_frozen):
        p.error("--serve_dtype and --serve_frozen apply to dynamic embeddings, not --static_buckets")
    _check_tiers(p, args)


def _check_tiers(p, args):
    """Refuses tier flags without --memory_budget, and tiers where they cannot be."""
    if args.memory_budget is None:
        given = [
            flag
            for flag, value in (
                ("--tier_path", args.tier_path),
                ("--disk_budget", args.disk_budget),
                ("--tier_policy", args.tier_policy != "lru"),
                ("--no_prefetch", args.no_prefetch),
            )
            if value
        ]
        if given:
            p.error("%s describe tiered tables: give --memory_budget too" % ", ".join(given))
        return
    if args.static_buckets:
        p.error("--memory_budget applies to dynamic embeddings, not --static_buckets")
    if args.serve_dtype == "int8" and not args.serve_frozen:
        p.error(
            "--memory_budget with --serve_dtype int8: int8 rows cannot be tiered; add --serve_frozen (an in-memory "
            "frozen export) or serve float32, bfloat16 or float16 rows"
        )


def _expand(patterns):
    """Comma-separated globs -> the files they match, sorted per glob (a name that globs to nothing but exists)."""
    files = []
    for pat in patterns.split(","):
        pat = pat.strip()
        if pat:
            files.extend(sorted(glob.glob(pat)) or ([pat] if os.path.isfile(pat) else []))
    return files
