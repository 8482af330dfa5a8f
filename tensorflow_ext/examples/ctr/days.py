"""Day-by-day training (``--days N``): N runs in a row on a drifting synthetic stream, and the per-day table.

Each day is one :func:`train.run` that continues from yesterday's checkpoint, trains ``--steps`` on the day's data,
evaluates on the next day's data, evicts/admits by the policies and exports. The result is the last day's summary
with one row per day and a PNG plot (``<model_dir>/days.png``; none without matplotlib).
"""

import copy
import os

from tensorflow_ext.examples.ctr import log
from tensorflow_ext.examples.ctr import train

# The per-day row: its keys, in the table's column order, with their formats.
_DAY_FIELDS = (
    ("day", "%3d"),
    ("global_step", "%7d"),
    ("auc", "%6.4f"),
    ("oracle_auc", "%6.4f"),
    ("total_keys", "%9d"),
    ("table_mib", "%8.1f"),
    ("admitted_keys", "%9d"),
    ("evicted_keys", "%9d"),
    ("checkpoint_mib", "%8.1f"),
)


def run_days(args):
    """Day-by-day training (--days N): each day continues from yesterday's checkpoint on the drifting stream.

    Args:
      args: parsed flags with ``days``.

    Returns:
      The last day's summary dict with ``days`` (one dict per day: AUC on the next day's data, keys, table bytes,
      admitted and evicted keys so far, checkpoint bytes) and ``plot`` (the PNG path); None on ranks other than 0.
    """
    days = []
    last = None
    for d in range(args.days):
        day_args = copy.copy(args)
        day_args.fresh = args.fresh and d == 0
        last = train.run(day_args)
        if last is None:  # another rank of a distributed run
            continue
        days.append(_day_row(d + 1, last))
        if not args.quiet:
            log.say(
                "day %d: AUC %.4f on the next day (oracle %.4f), %d keys, %s, admitted %d, evicted %d",
                d + 1,
                last["auc"],
                last.get("oracle_auc", float("nan")),
                last["total_keys"],
                log.mib(last.get("table_bytes") or 0),
                last["admitted_keys"],
                last["evicted_keys"],
            )
    if last is None:
        return None
    last["days"] = days
    last["plot"] = _plot_days(days, os.path.join(args.model_dir, "days.png"))
    return last


def _day_row(day, summary):
    """The per-day row of a run's summary."""
    row = {k: summary.get(k) for k, _ in _DAY_FIELDS if k in summary}
    row["day"] = day
    row["table_mib"] = round((summary.get("table_bytes") or 0) / float(1 << 20), 2)
    row["checkpoint_mib"] = round(summary["checkpoint_bytes"] / float(1 << 20), 2)
    return row


def days_table(days):
    """The per-day rows as a text table (a header line, then one line per day)."""
    head = " ".join("%9s" % k.replace("_keys", "").replace("global_", "") for k, _ in _DAY_FIELDS)
    rows = [" ".join("%9s" % (fmt % day[k]) for k, fmt in _DAY_FIELDS) for day in days]
    return "\n".join([head] + rows)


def _plot_days(days, path):
    """AUC and table size per day as a PNG; returns its path (None without matplotlib)."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    x = [d["day"] for d in days]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(x, [d["auc"] for d in days], "o-", label="model (next day's data)")
    ax1.plot(x, [d["oracle_auc"] for d in days], "--", color="gray", label="oracle")
    ax1.set_xlabel("day")
    ax1.set_ylabel("AUC")
    ax1.legend()
    ax2.plot(x, [d["table_mib"] for d in days], "o-", label="table MiB")
    ax2.plot(x, [d["checkpoint_mib"] for d in days], "s-", label="checkpoint MiB")
    ax2.set_xlabel("day")
    ax2.set_ylabel("MiB")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
