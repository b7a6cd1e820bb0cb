"""The job: build and run the pipeline for every mode, from one run description (RunConfig).

    run_job(cfg) -> the metrics.json document; {"dry_run": True, ...} with Beam's --dry_run=True,
                    {"submitted": True, ...} with --no-wait, {"nothing_new": True, ...} when an
                    incremental run finds every input file scored

Every mode is the same three moves: prepare the input and output (its door), build() and run
the one pipeline (_run_built: dry run, --no-wait, progress, the published run checked), publish:
- one-shot: Parquet files as they are; Finalize publishes (metrics.json, then _SUCCESS);
- SQL buffer or verl dump (pipelines/sources.py): staged as Parquet read units into
  OUTPUT/_source/ first; with --output-db the scored rows are written to a buffer after;
- incremental (pipelines/incremental.py): the batches new, changed or deleted input touches,
  scored into a work directory, then committed to the Delta table in one commit.
The output lock (transforms/files/lock.py) is held around all of it (not for a dry run).
The command line (`rescore ...`: options, one-line errors, exit status) is pipelines/cli.py.

The flow, one step per line of `build`:
    plan (footers, schemas; before the pipeline) -> ReadExperiences -> ScoreGroups
    (GroupByKey on a bucket of (batch, task)) -> PlanCopies (with duplication; GroupByKey on
    batch) -> WriteScored (GroupByKey on read unit, rows read back where they are) -> Finalize
    (metrics.json, then _SUCCESS).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)

from rescore.errors import ConfigError, RejectBudgetExceeded, first_line
from rescore.pipelines import __version__, flink_job, incremental, sources, task_history
from rescore.pipelines.config import DEFAULT_RUNNER, RunConfig, local_buckets
from rescore.pipelines.progress import Progress
from rescore.transforms import device as devices
from rescore.transforms import fault_injection
from rescore.transforms.files import lock as output_lock
from rescore.transforms.files import ownership, progress_marks, storage, stores
from rescore.transforms.files.layout import METRICS, SUCCESS, staging_dir
from rescore.transforms.input_plan import InputPlan, plan_input
from rescore.transforms.unit_store import Prefetch, UnitStoreHandle, start_prefetch
from rescore.transforms.unit_threads import resolve_threads

if TYPE_CHECKING:
    from rescore.transforms.strategies import StrategyChain

log = logging.getLogger("rescore")


def build(
    p: beam.Pipeline, plan: InputPlan, scoring: StrategyChain, cfg: RunConfig, run_info: dict,
    unit_store: UnitStoreHandle | None = None, task_history: dict | None = None,
) -> UnitStoreHandle:
    """The whole job: read -> score -> plan copies -> write -> finalize. `unit_store`: the run's
    prefetch, unit cache and slice decoders, and the finalize step's document
    (transforms/unit_store.py); None: a new one (no prefetch). Returns it: the launcher closes
    it when the run ends. `task_history`: the task-stats tables the stages match rows against
    (pipelines/task_history.py resolve), read before any work."""
    # The shells are imported here, not with this module: they load torch, which option
    # parsing, --help and a bad command line never need.
    from rescore.transforms.copies import PlanCopies
    from rescore.transforms.finalize import Finalize
    from rescore.transforms.read import ReadExperiences
    from rescore.transforms.score import ScoreGroups
    from rescore.transforms.strategies import DUPLICATE
    from rescore.transforms.write import WriteScored

    from rescore.transforms.settings import step_settings

    settings = step_settings(cfg)  # the run options the steps read: one frozen object
    progress = progress_marks.progress_dir(staging_dir(cfg.output))  # what pipelines/progress.py counts
    if unit_store is None:
        unit_store = UnitStoreHandle(cfg.unit_cache_mb, cfg.read_ahead_mb, memory_mb=cfg.memory_mb)
    units = p
    if cfg.models.enabled:  # per row, before any shuffle: side files joined wherever a unit is read
        from rescore.transforms.models import ComputeModelColumns

        units = p | "ComputeModelColumns" >> ComputeModelColumns(
            plan, cfg.models, staging_dir(cfg.output), settings, context=run_info["models"]["context"]
        )
    read = units | "ReadExperiences" >> ReadExperiences(
        plan, settings, needs=scoring.needs, keep_units=_one_process(p.options), progress=progress,
        unit_store=unit_store, task_history=task_history,
    )
    scored = read.light | "ScoreGroups" >> ScoreGroups(scoring, settings, progress=progress)
    copies = None  # no duplicate stage: no copy plans
    if scoring.duplicates:
        copies = scored.copy_groups | "PlanCopies" >> PlanCopies(seed=scoring.stage(DUPLICATE).seed)
    every_row = (scored.outcomes, read.rejected) | "EveryRow" >> beam.Flatten()
    written = every_row | "WriteScored" >> WriteScored(
        plan, cfg.output, scoring, copies, settings, file_metadata=file_metadata(run_info), unit_store=unit_store,
    )
    p | "Finalize" >> Finalize(
        plan, cfg.output, run_info, scoring, settings, written=written, group_metrics=scored.group_metrics, copies=copies,
        unit_store=unit_store,
    )
    return unit_store


def config_hash(strategy: str, params: dict, algorithm: str | None) -> str:
    """sha256 of what decides the scores: the strategies, their parameters (defaults filled in)
    and the algorithm preset, canonical JSON."""
    canonical = json.dumps({"strategy": strategy, "params": params, "algorithm": algorithm}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def file_metadata(run_info: dict[str, Any]) -> dict[str, str]:
    """Key-value metadata in every output Parquet file: how its rows were scored."""
    return {
        "rescore.version": run_info["rescore_version"],
        "rescore.strategy": run_info["strategy"],
        "rescore.algorithm": run_info["algorithm"] or "",
        "rescore.params": json.dumps(run_info["params"], sort_keys=True),
        "rescore.config_hash": run_info["config_hash"],
    }


def prepare_output(output: str, plan: InputPlan, overwrite: bool) -> None:
    """Refuse an input directory or a finished run; clear what a failed run of ours left behind
    (never a file Rescore did not write; see transforms/files/ownership.py)."""
    ownership.check_not_input(output, plan.files)
    ownership.prepare(output, overwrite)


def _check_local_device(cfg: RunConfig, options: PipelineOptions) -> None:
    """--device cuda fails before anything runs where the job runs on this machine; a remote
    runner's workers check for themselves when they start (the launcher may have no GPU)."""
    runner = options.view_as(StandardOptions).runner or DEFAULT_RUNNER
    if cfg.device == "cuda" and runner in devices.LOCAL_RUNNERS:
        try:
            devices.resolve("cuda")
        except devices.DeviceError as e:
            raise ConfigError(str(e)) from None


def _one_process(options: PipelineOptions) -> bool:
    """Every step runs in this process: the default local runner, in memory or on threads."""
    runner = options.view_as(StandardOptions).runner or DEFAULT_RUNNER
    return runner in devices.LOCAL_RUNNERS and options.view_as(DirectOptions).direct_running_mode in ("in_memory", "multi_threading")


def _in_process(cfg: RunConfig, options: PipelineOptions) -> bool:
    """The job runs in this process (_one_process), on files as they are (no model stage), and
    is not a dry run."""
    return _one_process(options) and not _dry_run(options) and not cfg.models.enabled


def _file_needs(needs: tuple, computed: tuple[str, ...]) -> tuple:
    """The columns the input files must have: what the strategies need, less what a model
    computes; a need for NAME_original of a computed NAME (rollout_correction's behaviour
    log-probs under --logprob-model) is a need for the input's NAME."""
    out = []
    for name in needs:
        if not isinstance(name, str):  # an OptionalColumn, NullableColumn or computed feature
            out.append(name)
            continue
        base = name.removesuffix("_original")
        if name != base and base in computed:
            out.append(base)
        elif name not in computed:
            out.append(name)
    return tuple(dict.fromkeys(out))


def _with_newest_model_version(scoring, plan: InputPlan, cfg: RunConfig):
    """A rollout_correction with max_staleness but no current_model_version measures staleness
    from the newest model_version in the input: read here, one column, on the launcher, and
    recorded in the resolved params (metrics.json, config hash)."""
    stage = scoring.correction
    if stage is None or stage.max_staleness is None or stage.current_model_version is not None:
        return scoring
    import pyarrow.compute as pc

    from rescore.transforms.files.row_group_slices import SliceDecoders
    from rescore.transforms.strategies import build_chain
    from rescore.transforms.unit_read import read_unit

    newest = None
    slices = SliceDecoders()  # the units in order: a sliced row group's column decoded once
    for unit in plan.units:
        table = read_unit(unit, [stage.model_version_key], slices=slices)
        if stage.model_version_key not in table.column_names:
            continue
        top = pc.max(table[stage.model_version_key]).as_py()
        if top is not None:
            newest = top if newest is None else max(newest, top)
    if newest is None:
        raise ConfigError(f"{stage.name}: max_staleness needs a {stage.model_version_key!r} value in the input, or current_model_version")
    return build_chain(cfg.strategies, {**cfg.params, f"{stage.name}.current_model_version": int(newest)})


def run_info(cfg: RunConfig, scoring: StrategyChain, *, models: dict[str, Any] | None = None,
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """How the run scores, as metrics.json and every output file's metadata record it (the one
    place this document is made, for every mode): the strategies with their resolved
    parameters, the config hash, the run's settings; `models`: the model stage's settings;
    `extra`: what a mode adds (a source, an incremental run's entry)."""
    return {
        "rescore_version": __version__,
        "strategy": scoring.name,
        "algorithm": cfg.algorithm,
        "params": scoring.params,
        # The models decide the scores too: with a model flag they are part of the hash.
        "config_hash": config_hash(scoring.name, {**scoring.params, "models": models} if models else scoring.params,
                                   cfg.algorithm),
        "input": cfg.inputs,
        "output": cfg.output,
        "buckets": cfg.buckets,
        "shard_rows": cfg.shard_rows,
        "max_reject_fraction": cfg.max_reject_fraction,
        "max_group_rows": cfg.max_group_rows,
        "device": cfg.device,
        "keep_filtered": cfg.keep_filtered,
        "audit_columns": cfg.audit_columns,
        **({"models": models} if models else {}),
        **(extra or {}),
    }


def build_job(
    cfg: RunConfig, extra_info: dict[str, Any] | None = None, *, prefetch: Prefetch | None = None
) -> tuple[beam.Pipeline, InputPlan, dict[str, Any], UnitStoreHandle]:
    """Plan the input, prepare the output and build the pipeline (not run). `prefetch`: the
    first units the command started decoding (pipelines/early.py), for the run's UnitStore.
    Returns the pipeline, the plan, run_info and the run's UnitStoreHandle (to close at the end)."""
    options = PipelineOptions(cfg.beam_args)
    if not _in_process(cfg, options):  # no read step in this process to take them
        if prefetch is not None:
            prefetch.close()
        prefetch = None
    elif prefetch is None:  # the first units decode while torch loads
        prefetch = start_prefetch(
            cfg.inputs, shard_rows=cfg.shard_rows, threads=resolve_threads(cfg.io_threads), memory_mb=cfg.memory_mb,
        )
    unit_store = UnitStoreHandle(cfg.unit_cache_mb, cfg.read_ahead_mb, prefetch=prefetch, memory_mb=cfg.memory_mb)
    from rescore.transforms import host_math
    from rescore.transforms.settings import step_settings
    from rescore.transforms.strategies import build_chain

    scoring = build_chain(cfg.strategies, cfg.params, load_math=False)
    if not host_math.on_host(host_math.eligible(scoring, step_settings(cfg)), cfg):
        import torch  # noqa: F401  (the math's library, loaded now, while the prefetch decodes)
    history = task_history.resolve(scoring)
    _check_local_device(cfg, options)
    computed = cfg.models.columns  # columns a model fills in need not be in the input files
    plan = plan_input(
        cfg.inputs, needs=_file_needs(scoring.needs, computed), shard_rows=cfg.shard_rows,
        skip_bad_files=cfg.skip_bad_files,
    )
    scoring = _with_newest_model_version(scoring, plan, cfg)
    models_info = None
    if cfg.models.enabled:
        from rescore.transforms.models import plan_with_models

        plan, context = plan_with_models(plan, cfg.models, staging_dir(cfg.output))
        models_info = {**{k: v for k, v in vars(cfg.models).items() if v is not None}, "columns": list(computed), "context": context}
    skipped = {f"skipping {reason}" for _, reason in plan.skipped}
    for warning in plan.warnings:
        if warning in skipped and not cfg.quiet and cfg.wait and not _dry_run(options):
            continue  # the summary lists it ("skipped file"): once, not twice in two formats
        log.warning(warning)
    if not cfg.buckets_chosen and _in_process(cfg, options):
        cfg = replace(cfg, buckets=local_buckets(plan.num_rows))
    if not _dry_run(options):
        prepare_output(cfg.output, plan, cfg.overwrite)
    info = run_info(cfg, scoring, models=models_info, extra=extra_info)
    p = beam.Pipeline(options=options)
    build(p, plan, scoring, cfg, info, unit_store, task_history=history)
    if prefetch is not None:  # built: every import made (the console script says so earlier)
        prefetch.imports_done()
    return p, plan, info, unit_store


def run_job(cfg: RunConfig, *, prefetch: Prefetch | None = None) -> dict[str, Any]:
    """Run the job `cfg` describes, in its mode (see the module doc); raises on failure.
    `prefetch`: the first read units the command started decoding (pipelines/early.py)."""
    fault_injection.refresh()  # tests only: a no-op unless they armed a fault
    ownership.check_output_path(cfg.output)
    stores.refuse_database_in_a_bucket(cfg.inputs, cfg.input_table)
    if not _dry_run(PipelineOptions(cfg.beam_args)):  # buckets there, credentials work: before any work
        stores.preflight(stores.run_paths(cfg.inputs, cfg.output, cfg.input_table), cfg.beam_args)
    door = sources.wanted(cfg)  # a Trinity SQL buffer or a verl dump in, or a buffer out
    if prefetch is not None and (cfg.incremental or door):
        prefetch.close()  # pipelines/early.py starts none for these runs: nothing would take it
        prefetch = None
    if cfg.incremental:  # an object store whose commits cannot be atomic: refused before the lock is taken
        incremental.check_store(cfg)
    if _dry_run(PipelineOptions(cfg.beam_args)) and not door:  # writes nothing: no lock
        return _run_incremental(cfg) if cfg.incremental else _run_once(cfg, prefetch=prefetch)
    with output_lock.acquire(cfg.output, cfg.wait_for_lock):  # one run at a time per output
        if door:
            return _run_from_source(cfg)
        if cfg.incremental:
            return _run_incremental(cfg)
        return _run_once(cfg, prefetch=prefetch)


def _dry_run(options: PipelineOptions) -> bool:
    """Beam's --dry_run=True: the job graph is built and not run."""
    return bool(options.view_as(TestOptions).dry_run)


def _run_once(cfg: RunConfig, extra_info: dict[str, Any] | None = None, *, prefetch: Prefetch | None = None) -> dict[str, Any]:
    """The input files as they are; Finalize publishes into the output directory."""
    unit_store = None
    try:
        p, plan, info, unit_store = build_job(cfg, extra_info, prefetch=prefetch)
        return _run_built(cfg, p, plan, info, unit_store)
    finally:  # what the read step did not take, cached units, decoders this run left open
        if unit_store is not None:
            unit_store.close()
        elif prefetch is not None:
            prefetch.close()


def _run_from_source(cfg: RunConfig) -> dict[str, Any]:
    """A SQL buffer or a verl dump staged as Parquet, the one-shot job on it; with --output-db,
    the scored rows written to a buffer after (pipelines/sources.py)."""
    with sources.staged(cfg) as (staged_cfg, source_info):
        doc = _run_once(staged_cfg, source_info)
        if cfg.output_db:
            doc["buffer"] = sources.publish_buffer(cfg)
    return doc


def _run_incremental(cfg: RunConfig) -> dict[str, Any]:
    """Batch-level incremental rescoring into a Delta Lake table (pipelines/incremental.py):
    prepare what to score, the one pipeline into the run's work directory, one commit."""
    from rescore.transforms.strategies import build_chain  # imports torch

    scoring = build_chain(cfg.strategies, cfg.params)
    history = task_history.resolve(scoring)
    incremental.check(cfg, scoring)
    options = PipelineOptions(cfg.beam_args)
    _check_local_device(cfg, options)
    chash = config_hash(scoring.name, scoring.params, cfg.algorithm)
    run = incremental.prepare(cfg, scoring, chash, dry_run=_dry_run(options))
    if isinstance(run, dict):  # nothing new to score
        return run
    doc: dict[str, Any] = {}
    info = run_info(run.cfg, scoring, extra={"incremental": run.info})
    if run.plan is not None:  # else only deleted files: their rows are removed, nothing is read
        p = beam.Pipeline(options=options)
        unit_store = build(p, run.plan, scoring, run.cfg, info, task_history=history)
        try:
            doc = _run_built(run.cfg, p, run.plan, info, unit_store, unpublished=incremental.UNPUBLISHED)
        finally:
            unit_store.close()
    if _dry_run(options):
        return {**info, **doc, "output": cfg.output, "dry_run": True}
    return incremental.publish(run, doc)


def _run_built(cfg: RunConfig, p: beam.Pipeline, plan: InputPlan, run_info: dict[str, Any], unit_store: UnitStoreHandle, *,
               unpublished: str = "no _SUCCESS was written") -> dict[str, Any]:
    """Run the built pipeline, every mode alike: a dry run builds the graph only, --no-wait on a
    remote runner submits and returns; otherwise wait, with progress, and return what the run
    published in cfg.output (its metrics.json), or raise why it published nothing
    (`unpublished` ends the message)."""
    if _dry_run(p.options):
        return {**run_info, "dry_run": True, "job": getattr(p.run(), "job", None)}
    if not cfg.wait and p.options.view_as(StandardOptions).runner not in devices.LOCAL_RUNNERS:
        result = p.run()
        return {**run_info, "submitted": True, "job_id": getattr(result, "job_id", lambda: None)()}
    on_flink = flink_job.on_cluster(p.options, cfg.output)  # None but on a Flink session cluster
    try:
        with flink_job.quiet_message_thread(), Progress(
            cfg.output, len(plan.units), plan.num_rows, len(plan.files), enabled=not cfg.quiet,
            interval=cfg.progress_seconds, detail=on_flink and on_flink.progress_detail,
        ):
            p.run().wait_until_finish()
    except BaseException as e:
        # A job server lost mid-run leaves its job running on the cluster, where it would publish
        # after this run reported its failure: cancel it first (pipelines/flink_job.py).
        cancelled = on_flink.cancel() if on_flink else ""
        progress_marks.clear(staging_dir(cfg.output))  # the marks only count a run in progress
        if cancelled:
            why = f"lost Beam's Flink job server ({_rpc_summary(e)})" if _is_rpc_error(e) else first_line(e)
            raise RuntimeError(f"{why}: {cancelled}; {unpublished}") from None
        raise
    success = storage.join(cfg.output, SUCCESS)
    failed_dir = storage.join(cfg.output, ownership.FAILED)  # a failed run beside a finished one
    # The finalize step leaves its document in the run's store where it ran in this process;
    # elsewhere (a remote or multi-process runner) the file it published is the one place both
    # reach, and reading it back is how the launcher learns the result.
    doc, where = unit_store.published() or _published_file(cfg.output)
    if doc.get("failed") and where == storage.join(failed_dir, METRICS):
        raise RejectBudgetExceeded(
            f"{doc['failed']}; the rejected rows and metrics.json are in {failed_dir}, the finished "
            f"earlier run in {cfg.output} was left as it was"
        )
    if doc.get("failed"):
        raise RejectBudgetExceeded(
            f"{doc['failed']}; the rejected rows and metrics.json are in {cfg.output}, {unpublished}"
        )
    if not storage.exists(success):
        raise RuntimeError(f"the pipeline finished but {success} was not written")
    return doc


def _is_rpc_error(e: BaseException) -> bool:
    import grpc

    return isinstance(e, grpc.RpcError)


def _rpc_summary(e: BaseException) -> str:
    """`UNAVAILABLE: Socket closed`, from a gRPC error."""
    code = getattr(e, "code", lambda: None)()
    details = (getattr(e, "details", lambda: "")() or "").splitlines()
    return ": ".join(x for x in (getattr(code, "name", None), details[0] if details else "") if x) or type(e).__name__


def _published_file(output: str) -> tuple[dict[str, Any], str]:
    """(metrics.json's document, its path) as the finalize step published it in OUTPUT (or, for
    a failed run beside a finished one, OUTPUT/_failed); ({}, path) where there is none."""
    for metrics in (storage.join(output, ownership.FAILED, METRICS), storage.join(output, METRICS)):
        if storage.exists(metrics):
            return json.loads(storage.read_text(metrics)), metrics
    return {}, metrics
