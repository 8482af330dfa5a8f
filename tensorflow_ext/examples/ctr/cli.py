"""The CTR example's command: flags, the run (or the days), then the report lines and the JSON summary.

Output: progress lines, the evaluation metrics, where the checkpoint and the summaries went (stderr, ``ctr: ``
lines), then the one-line JSON summary as the last (and only) line on stdout. TensorFlow's own Python-side chatter
is off for the run unless ``--verbose``; ``--quiet`` leaves only warnings, errors and the JSON line.
"""

import json
import sys

import tensorflow as tf

from tensorflow_ext.examples.ctr import days
from tensorflow_ext.examples.ctr import flags
from tensorflow_ext.examples.ctr import log
from tensorflow_ext.examples.ctr import train


def main(argv=None):
    """Entry point: parses flags, runs, prints the one-line JSON summary last.

    Args:
      argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
      0.
    """
    args = flags.parse_args(argv)
    with log.tf_chatter(args.verbose):
        tf.compat.v1.disable_v2_behavior()
        tf.compat.v1.enable_resource_variables()
        summary = days.run_days(args) if args.days else train.run(args)
    if summary is None:  # a distributed run's other ranks: rank 0 reports
        return 0
    if not args.quiet:
        if args.days:
            log.say("per day (AUC on the next day's data; counts so far):\n%s", days.days_table(summary["days"]))
            if summary["plot"]:
                log.say("plot: %s", summary["plot"])
        _report(summary, args)
    sys.stdout.flush()
    print(json.dumps(summary, sort_keys=False))
    sys.stdout.flush()
    return 0


def _report(summary, args):
    """Prints the evaluation metrics and where the checkpoint and summaries went."""
    steps_per_sec = summary["steps_per_sec"]
    log.say(
        "trained %d steps in %.1f s%s; global step %d",
        summary["steps"],
        summary["train_seconds"],
        " (%.1f steps/s, %d examples/s)" % (steps_per_sec, summary["examples_per_sec"]) if steps_per_sec else "",
        summary["global_step"],
    )
    oracle = summary.get("oracle_auc")
    log.say(
        "eval: AUC %.4f%s, logloss %.4f, label mean %.4f, prediction mean %.4f",
        summary["auc"],
        " (oracle %.4f)" % oracle if oracle is not None else "",
        summary["logloss"],
        summary["label_mean"],
        summary["prediction_mean"],
    )
    log.say(
        "tables: %d keys in %d tables, %s (%s B/key; %s rows)",
        summary["total_keys"],
        len(summary["table_sizes"]),
        log.mib(summary["table_bytes"] or 0),
        "%.0f" % summary["table_bytes_per_key"] if summary["table_bytes_per_key"] else "-",
        summary["value_dtype"],
    )
    tiers = summary.get("tiers")
    if tiers:
        log.say(
            "tiers%s: %d keys in memory (%s of a %s budget), %d on disk (%s), hit rate %s, %.1f cold reads/step, "
            "%d demotions, %d keys dropped",
            " of rank 0's tables" if summary["distributed"] else "",
            tiers["memory_keys"],
            log.mib(tiers["memory_bytes"]),
            log.mib(summary["memory_budget"]),
            tiers["disk_keys"],
            log.mib(tiers["disk_bytes"]),
            "%.4f" % tiers["hit_rate"] if tiers["hit_rate"] is not None else "-",
            tiers["cold_reads_per_step"],
            tiers["demotions"],
            tiers["dropped"],
        )
    log.say("checkpoint: %s", summary["checkpoint"])
    if summary["export_dir"]:
        log.say(
            "serving SavedModel (%s%s rows): %s",
            "frozen, " if summary["serve_frozen"] else "",
            summary["serve_dtype"],
            summary["export_dir"],
        )
    if "served_auc" in summary:
        log.say(
            "served AUC %.4f (the export, on %d evaluation examples)", summary["served_auc"], summary["served_examples"]
        )
    log.say("TensorBoard summaries (training, and eval/): tensorboard --logdir %s", args.model_dir)
    log.say("done in %.1f s", summary["wall_seconds"])
