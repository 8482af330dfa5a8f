"""The CTR example's training progress: a session hook that prints and keeps the run's throughput and loss.

Throughput is measured after the first ``untimed_steps`` steps (default 1: the first step warms the graph up); the
hook also keeps the tables' final key count and bytes for the run's summary. With tiered tables each progress line
also says what the tiers hold and did over the logging period: memory and disk MiB, the hit rate (keys found in
memory), cold reads per step (keys read back from disk), demotions per second (keys moved to disk) and the keys
dropped off a capped disk so far.
"""

import time

import numpy as np
import tensorflow as tf

from tensorflow_ext.examples.ctr import log
from tensorflow_ext.examples.ctr import tiers


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Prints step, loss, steps/s, examples/s, table keys and bytes (and bytes per key); keeps the run's
    throughput."""

    # The last instance made in this process (the Estimator builds the hook inside
    # model_fn), read by the run for its summary.
    last = None

    def __init__(
        self,
        loss,
        total_keys,
        total_bytes,
        global_step,
        every_n,
        batch_size,
        show=True,
        tables_where="",
        tier_stats=None,
        untimed_steps=1,
    ):
        self._loss = loss
        self._tier_stats = tier_stats  # int64 [10] of every tiered table, summed (tiers.stats_tensor), or None
        self.final_tier_stats = None  # {field: int} at the end of training
        self._window_tier_stats = None
        self._keys = total_keys
        self._bytes = total_bytes
        self._show = show
        self._step = global_step
        self._every = max(1, int(every_n))
        self._batch = batch_size
        self._where = (" " + tables_where) if tables_where else ""
        self._untimed = max(1, int(untimed_steps))  # steps before the throughput's clock starts
        self.compression_choices = None  # set by the model under --distributed --compression auto
        self.steps = 0
        self.losses = []
        self.first_step_time = None
        self.last_time = None
        self.final_keys = None
        self.final_bytes = None
        self.final_step = None
        ProgressHook.last = self

    def begin(self):
        self._window_start = None
        self._window_steps = 0

    def before_run(self, run_context):
        fetches = {"loss": self._loss, "step": self._step}
        if (self.steps + 1) % self._every == 0:
            fetches["keys"] = self._keys
            fetches["bytes"] = self._bytes
            if self._tier_stats is not None:
                fetches["tier_stats"] = self._tier_stats
        # The tier counters at the start of the first logging period.
        if self._tier_stats is not None and self._window_tier_stats is None:
            fetches["tier_stats"] = self._tier_stats
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        now = time.time()
        r = run_values.results
        self.steps += 1
        self.losses.append(float(r["loss"]))
        self.final_step = int(r["step"]) + 1
        if self.first_step_time is None and self.steps >= self._untimed:
            # Throughput is measured after the untimed steps (graph warm-up).
            self.first_step_time = now
            self._window_start = now
            self._window_steps = 0
        elif self._window_start is not None:
            self._window_steps += 1
        self.last_time = now
        tier_stats = tiers.stats_dict(r["tier_stats"]) if "tier_stats" in r else None
        if tier_stats is not None and self._window_tier_stats is None:
            self._window_tier_stats = tier_stats
            tier_stats = None if "keys" not in r else tier_stats
        if "keys" in r:
            self.final_keys = int(r["keys"])
            self.final_bytes = int(r["bytes"])
            self._log_window(now, tier_stats)
            self._window_start = now
            self._window_steps = 0
            if tier_stats is not None:
                self._window_tier_stats = tier_stats
                self.final_tier_stats = tier_stats

    def _log_window(self, now, tier_stats=None):
        """The progress line of the logging period that ends now."""
        dt = now - self._window_start if self._window_start is not None else 0.0  # None: still untimed
        rate = self._window_steps / dt if dt > 0 else float("nan")
        if not self._show:
            return
        tiers = self._tier_line(tier_stats, dt)
        if tiers:
            # The bytes are the memory tiers': per key of the memory tiers (in the tier part), not of all keys.
            tables = "%d table keys%s; %s" % (self.final_keys, self._where, tiers)
        else:
            tables = "%d table keys (%s, %.0f B/key)%s" % (
                self.final_keys,
                log.mib(self.final_bytes),
                self.final_bytes / float(max(self.final_keys, 1)),
                self._where,
            )
        log.say(
            "step %d: loss %.4f (mean of last %d: %.4f), %.1f steps/s, %.0f examples/s, %s",
            self.final_step,
            self.losses[-1],
            min(len(self.losses), self._every),
            float(np.mean(self.losses[-self._every :])),
            rate,
            rate * self._batch,
            tables,
        )

    def _tier_line(self, stats, seconds):
        """The tiers' part of a progress line: what they hold now and did since the previous line ("" untiered)."""
        if stats is None or self._window_tier_stats is None:
            return ""
        before = self._window_tier_stats
        delta = {k: stats[k] - before[k] for k in ("lookups", "cold_reads", "demotions")}
        hit_rate = 1.0 - delta["cold_reads"] / float(delta["lookups"]) if delta["lookups"] else float("nan")
        return (
            "tiers: %d keys in memory (%s, %.0f B/key), %d on disk (%s), hit rate %.4f, %.1f cold reads/step, "
            "%.0f demotions/s, %d dropped"
            % (
                stats["memory_keys"],
                log.mib(stats["memory_bytes"]),
                stats["memory_bytes"] / float(max(stats["memory_keys"], 1)),
                stats["disk_keys"],
                log.mib(stats["disk_bytes"]),
                hit_rate,
                delta["cold_reads"] / float(max(self._window_steps, 1)),
                delta["demotions"] / seconds if seconds > 0 else float("nan"),
                stats["dropped"],
            )
        )

    def end(self, session):
        # The tables as training left them (also for runs shorter than one logging period).
        self.final_keys, self.final_bytes = (int(v) for v in session.run([self._keys, self._bytes]))
        if self._tier_stats is not None:
            self.final_tier_stats = tiers.stats_dict(session.run(self._tier_stats))

    def steps_per_sec(self):
        """Steps per second over the run, excluding the untimed steps (None without a timed step)."""
        if self.first_step_time is None or self.last_time <= self.first_step_time:
            return None
        return (self.steps - self._untimed) / (self.last_time - self.first_step_time)
