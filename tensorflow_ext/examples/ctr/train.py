"""One run of the CTR example: train, evaluate, export, and the run's summary.

A run continues from the latest checkpoint in ``--model_dir`` (global step, dense weights, tables and optimizer
slots); on the synthetic stream it starts at the batch after the last one trained, so it sees new data. Under
``--distributed`` (horovodrun) every rank trains on its own batches; rank 0 writes checkpoints and summaries, then
evaluates and exports alone, from the checkpoint (which holds every key), and returns the summary; the other ranks
return None. With ``--serve_live`` the run is a live-serving day (:mod:`live`): a follower process serves the
start-of-day export and applies the serving updates the trainer writes, and the summary's ``live`` entry reports
the served AUC over the day.
"""

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from tensorflow_ext.examples.ctr import checkpoints
from tensorflow_ext.examples.ctr import data
from tensorflow_ext.examples.ctr import live
from tensorflow_ext.examples.ctr import log
from tensorflow_ext.examples.ctr import model
from tensorflow_ext.examples.ctr import progress
from tensorflow_ext.examples.ctr import served
from tensorflow_ext.examples import synthetic


@dataclasses.dataclass(frozen=True)
class _Job:
    """This process's place in the run: its rank, where the run starts, and what it trains on."""

    hvd: object  # tensorflow_ext.horovod under --distributed, else None
    rank: int
    num_ranks: int
    start_step: int  # the global step of the checkpoint the run continues from (0: from scratch)
    start_batches: int  # the synthetic stream's first batch for this run (the batches all runs so far consumed)
    stream: object  # the synthetic stream; None with --data
    string_ids: bool  # ids are strings (--data) rather than int64
    source: str  # "synthetic" or the training files
    tier_path: str  # the tiered tables' store root (--memory_budget), else None
    temporary_tier_path: bool  # tier_path is this run's temporary directory (removed at the end)


def run(args):
    """Trains and evaluates; returns the summary dict (also printed as JSON by main).

    Args:
      args: parsed flags (see :func:`tensorflow_ext.examples.ctr.flags.parse_args`).

    Returns:
      A dict with ``auc``, ``loss``, ``logloss``, ``global_step``, ``steps``,
      ``steps_per_sec``, ``table_sizes``, ``total_keys``, ``table_bytes_per_key``, ``export_dir``
      (``served_auc`` with --served_auc, ``live`` with --serve_live), ...;
      None on ranks other than 0 of a distributed run (rank 0 evaluates and exports).
    """
    t_start = time.time()
    job = _start(args)
    try:
        return _run(args, job, t_start)
    finally:
        if job.temporary_tier_path:
            shutil.rmtree(job.tier_path, ignore_errors=True)


def _run(args, job, t_start):
    """`run` once the job has started: train, evaluate, export, summarize."""
    config = _run_config(args, job)
    estimator = tf.estimator.Estimator(model_fn=model.model_fn, config=config, params=_model_params(args, job))
    train_input_fn, eval_input_fn, eval_clock = data.input_fns(args, job.stream, job.start_batches, job.num_ranks)
    if not args.quiet and job.rank == 0:
        _announce(args, job)
    day = live.LiveDay(args, job, estimator, train_input_fn) if args.serve_live else None
    try:
        return _run_day(args, job, t_start, estimator, config, (train_input_fn, eval_input_fn, eval_clock), day)
    finally:
        if day is not None:
            day.close()


def _run_day(args, job, t_start, estimator, config, input_fns, day):
    """`_run` once the Estimator is built: train (beside the live day's follower, if any), evaluate, export."""
    train_input_fn, eval_input_fn, eval_clock = input_fns
    hook, train_seconds = _train(args, job, estimator, config, train_input_fn, day.start() if day else [])
    if job.rank != 0:
        return None
    metrics, eval_seconds, export_dir = _evaluate_and_export(args, job, estimator, eval_input_fn)
    summary = _summary(args, job, metrics, hook, train_seconds, eval_seconds)
    if job.stream is not None:
        summary["oracle_auc"] = round(job.stream.oracle_auc(args.eval_steps, args.batch_size, clock=eval_clock), 4)
    summary["checkpoint"] = tf.train.latest_checkpoint(args.model_dir)
    summary["checkpoint_bytes"] = checkpoints.checkpoint_bytes(summary["checkpoint"])
    summary["table_bytes"] = hook.final_bytes if hook else None
    summary["table_bytes_per_key"] = (
        round(summary["table_bytes"] / summary["total_keys"], 1)
        if summary["table_bytes"] and summary["total_keys"]
        else None
    )
    summary.update(checkpoints.lifecycle_counts(summary["checkpoint"]))
    summary["export_dir"] = export_dir
    summary["serve_dtype"] = None if args.no_export else (args.serve_dtype or args.value_dtype)
    summary["serve_frozen"] = None if args.no_export else args.serve_frozen
    if args.served_auc:
        auc, examples = served.served_auc(export_dir, eval_input_fn)
        summary["served_auc"], summary["served_examples"] = round(auc, 6), examples
    summary.update(_tier_summary(args, hook))
    summary["event_files"] = len(checkpoints.event_files(args.model_dir))
    if day is not None:
        summary["live"] = day.finish(summary["global_step"], export_dir)
    summary["wall_seconds"] = round(time.time() - t_start, 1)
    return summary


def _start(args):
    """Joins the ranks (--distributed), prepares --model_dir, finds where the run starts and checks its flags."""
    hvd, rank, num_ranks = None, 0, 1
    if args.distributed:
        # Here, not at the top: plain runs never import Horovod.
        import tensorflow_ext.horovod as hvd  # pylint: disable=g-import-not-at-top

        # The 2D allreduce's process sets are registered at init (Horovod's Gloo backend makes them there).
        hvd.init(node_size=args.node_size)
        rank, num_ranks = hvd.rank(), hvd.size()
    if rank == 0:
        if args.fresh and os.path.isdir(args.model_dir):
            shutil.rmtree(args.model_dir)
        os.makedirs(args.model_dir, exist_ok=True)
    if hvd is not None:
        hvd.barrier()  # the others read model_dir once rank 0 has prepared it
    start_step = checkpoints.checkpoint_step(args.model_dir)
    # The stream's batch where this run starts: the batches consumed so far, at whatever rank counts they were.
    start_batches = 0 if args.data else checkpoints.resume_batches(args.model_dir, start_step, num_ranks)
    stream, string_ids, source = data.training_source(args, num_ranks)
    if rank == 0:
        checkpoints.check_model_dir_config(
            args.model_dir,
            dict(
                model=args.model,
                dim=args.dim,
                hidden=",".join(map(str, args.hidden_units)),
                optimizer=args.optimizer,
                num_shards=args.num_shards,
                string_ids=string_ids,
                static_buckets=args.static_buckets,
            ),
            has_checkpoint=start_step > 0 or tf.train.latest_checkpoint(args.model_dir) is not None,
        )
    if hvd is not None:
        hvd.barrier()  # a refused model_dir stops rank 0 here; the others then fail at this barrier
    tier_path, temporary = args.tier_path, False
    if args.memory_budget and tier_path is None:
        tier_path, temporary = tempfile.mkdtemp(prefix="tf_ext_ctr_tiers_"), True
    return _Job(hvd, rank, num_ranks, start_step, start_batches, stream, string_ids, source, tier_path, temporary)


def _model_params(args, job):
    """The Estimator's ``params``: what :func:`model.model_fn` reads."""
    return dict(
        model=args.model,
        dim=args.dim,
        hidden_units=args.hidden_units,
        optimizer=args.optimizer,
        learning_rate=args.learning_rate,
        num_shards=args.num_shards,
        string_ids=job.string_ids,
        init_stddev=0.05,
        admission=args.admission,
        bloom_counters=args.bloom_counters,
        capacity=args.capacity,
        steps_to_live=args.steps_to_live,
        evict_every=args.evict_every,
        static_buckets=args.static_buckets,
        value_dtype=args.value_dtype,
        slot_dtype=args.slot_dtype,
        rounding=args.rounding,
        log_every=args.log_every,
        batch_size=args.batch_size,
        progress=not args.quiet and job.rank == 0,
        distributed=args.distributed,
        num_ranks=job.num_ranks,
        memory_budget=args.memory_budget,
        disk_budget=args.disk_budget,
        tier_path=job.tier_path,
        tier_policy=args.tier_policy,
        allreduce=_allreduce_settings(args),
        untimed_steps=args.untimed_steps,
        # The id space of each field: how much of the memory budget each table may need (tiers.storages).
        cardinalities=job.stream.cardinalities if job.stream is not None else synthetic.CRITEO_CARDINALITIES,
    )


def _allreduce_settings(args):
    """DistributedOptimizer's arguments for the dense gradients' reduction: only the flags given (the library's
    defaults and TF_EXT_HVD_* overrides hold for the others)."""
    settings = {}
    for name in ("compression", "topk_ratio", "node_size"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    return settings


def _allreduce_details(args):
    """The announce line's details of the dense gradients' reduction ("" when none is chosen)."""
    settings = _allreduce_settings(args)
    if not settings:
        return ""
    return ", dense gradients: %s" % " ".join("%s=%s" % kv for kv in sorted(settings.items()))


def _run_config(args, job):
    """The Estimator's RunConfig: seed, checkpoint and summary schedule, session options (graph passes, threads)."""
    session_config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if args.graph_passes:
        from tensorflow_ext import graph as graph_passes  # pylint: disable=g-import-not-at-top

        graph_passes.enable_optimizations(session_config)
    if args.threads:
        session_config.intra_op_parallelism_threads = args.threads
        session_config.inter_op_parallelism_threads = args.threads
    schedule = dict(save_checkpoints_steps=args.save_checkpoints_steps, save_checkpoints_secs=None)
    if args.save_checkpoints_steps is None:
        schedule = dict(save_checkpoints_steps=None, save_checkpoints_secs=args.save_checkpoints_secs)
    common = dict(
        tf_random_seed=args.seed + job.start_step,
        save_summary_steps=max(1, min(100, args.log_every)),
        keep_checkpoint_max=2,
        log_step_count_steps=args.log_every,
        session_config=session_config,
        **schedule,
    )
    if job.hvd is not None:
        # Rank 0 writes checkpoints and summaries; the others only restore (and join model-parallel saves).
        return job.hvd.run_config(args.model_dir, **common)
    return tf.estimator.RunConfig(model_dir=args.model_dir, **common)


def _announce(args, job):
    """The run's first line: what trains on what, from which step, with which sizes."""
    log.say(
        "%s on %s%s, %s steps from global step %d (batch %d, dim %d, %s lr %g, %s rows%s%s), model_dir %s",
        args.model,
        job.source,
        (
            " (%s, %d ranks; batch per rank%s)" % (args.distributed, job.num_ranks, _allreduce_details(args))
            if job.hvd
            else ""
        ),
        args.steps if args.steps is not None else "all",
        job.start_step,
        args.batch_size,
        args.dim,
        args.optimizer,
        args.learning_rate,
        args.value_dtype,
        _compact_details(args),
        _tier_details(args, job),
        args.model_dir,
    )


def _tier_details(args, job):
    """The announce line's details of tiered tables ("" in memory)."""
    if not args.memory_budget:
        return ""
    return ", tiered: memory budget %s, disk %s, %s, stores in %s%s" % (
        log.mib(args.memory_budget),
        log.mib(args.disk_budget) if args.disk_budget else "unbounded",
        args.tier_policy,
        job.tier_path,
        "" if data.prefetches(args) else ", no prefetch",
    )


def _tier_summary(args, hook):
    """The summary's tier fields: the budgets and what the tiers held and did in training (None in memory)."""
    stats = hook.final_tier_stats if hook is not None and args.memory_budget else None
    out = {
        "memory_budget": args.memory_budget,
        "disk_budget": args.disk_budget,
        "tier_policy": args.tier_policy if args.memory_budget else None,
        "tier_prefetch": data.prefetches(args) if args.memory_budget else None,
    }
    if stats is None:
        out["tiers"] = None
        return out
    lookups = stats["lookups"]
    out["tiers"] = dict(
        stats,
        hit_rate=round(1.0 - stats["cold_reads"] / float(lookups), 6) if lookups else None,
        cold_reads_per_step=round(stats["cold_reads"] / float(max(hook.steps, 1)), 1),
    )
    return out


def _compact_details(args):
    """The announce line's details of compact rows: slot storage and rounding ("" for float32 rows)."""
    if args.value_dtype == "float32":
        return ""
    slots = args.value_dtype if args.slot_dtype == "same" else "float32"
    return ", %s slots, %s rounding" % (slots, args.rounding or "default")


def _train(args, job, estimator, config, train_input_fn, hooks):
    """Trains for --steps (None: until the data ends) with `hooks` (the live day's, if any) beside the model's;
    returns (the run's progress hook, training seconds)."""
    progress.ProgressHook.last = None
    t_train = time.time()
    # Rank 0 (the rank that writes checkpoints) records the stream position of each one.
    listeners = []
    if job.stream is not None and job.rank == 0 and (args.save_checkpoints_steps or args.save_checkpoints_secs):
        listeners.append(
            checkpoints.StreamProgressListener(
                args.model_dir, job.start_step, job.start_batches, job.num_ranks, args.batch_size
            )
        )
    if args.steps is None or args.steps > 0:
        if job.hvd is not None:
            estimator.train(
                job.hvd.shard_input_fn(train_input_fn),
                steps=args.steps,
                hooks=job.hvd.training_hooks(config) + list(hooks),
                saving_listeners=listeners,
            )
        else:
            estimator.train(train_input_fn, steps=args.steps, hooks=hooks, saving_listeners=listeners)
    return progress.ProgressHook.last, time.time() - t_train


def _evaluate_and_export(args, job, estimator, eval_input_fn):
    """Evaluates and exports the serving SavedModel (rank 0); returns (metrics, eval seconds, export dir or None)."""
    # Distributed: rank 0 evaluates and exports alone, from the checkpoint (which holds every key), with a
    # graph built as one process.
    one_process = job.hvd.single_process if job.hvd is not None else contextlib.nullcontext
    t_eval = time.time()
    with one_process():
        metrics = estimator.evaluate(eval_input_fn, steps=args.eval_steps)
    eval_seconds = time.time() - t_eval
    export_dir = None
    if not args.no_export:
        with one_process(), served.export_context(args.serve_dtype, args.serve_frozen):
            export_dir = estimator.export_saved_model(args.export_dir, data.serving_input_fn(job.string_ids)).decode()
    return metrics, eval_seconds, export_dir


def _summary(args, job, metrics, hook, train_seconds, eval_seconds):
    """The summary's metrics, throughput and sizes (the caller adds what the run left on disk)."""
    table_sizes = {}
    for k, v in metrics.items():
        if k.startswith("table_keys/") and k != "table_keys/total":
            table_sizes[k[len("table_keys/") :]] = int(v)
    steps_per_sec = hook.steps_per_sec() if hook else None
    global_step = int(metrics["global_step"])
    synthetic = job.stream is not None
    return {
        "model": args.model,
        "data": job.source,
        "optimizer": args.optimizer,
        "value_dtype": args.value_dtype,
        "slot_dtype": args.slot_dtype,
        "rounding": args.rounding,
        "auc": round(float(metrics["auc"]), 4),
        "logloss": round(float(metrics["logloss"]), 4),
        "loss": round(float(np.mean(hook.losses[-args.log_every :])), 4) if hook and hook.losses else None,
        "global_step": global_step,
        "start_step": job.start_step,
        # Batches of the synthetic stream: this run trained on [first_batch, next_batch).
        "first_batch": job.start_batches if synthetic else None,
        "next_batch": job.start_batches + (global_step - job.start_step) * job.num_ranks if synthetic else None,
        "steps": hook.steps if hook else 0,
        "batch_size": args.batch_size,
        "steps_per_sec": round(steps_per_sec, 2) if steps_per_sec else None,
        "examples_per_sec": round(steps_per_sec * args.batch_size * job.num_ranks) if steps_per_sec else None,
        "untimed_steps": args.untimed_steps,
        "ranks": job.num_ranks,
        "distributed": args.distributed,
        "compression": args.compression,
        "topk_ratio": args.topk_ratio,
        "node_size": args.node_size,
        "compression_choices": hook.compression_choices if hook else None,
        "total_keys": int(metrics.get("table_keys/total", 0)),
        "table_sizes": table_sizes,
        "label_mean": round(float(metrics["label_mean"]), 4),
        "prediction_mean": round(float(metrics["prediction_mean"]), 4),
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "model_dir": args.model_dir,
    }
