"""`rescore`: read experience Parquet, score task groups, write scored Parquet.

    rescore --input 'PATH_OR_GLOB' --output DIR --strategy NAME [--set key=value ...]
            [--config FILE.yaml] [beam options...]
    rescore sample --output DIR [--rows N]      # write sample experience to try it on
    rescore report OUTPUT_DIR [--to DIR]        # report.html and charts of a finished run
    rescore show OUTPUT [--batches]             # rows, batches, runs, pending input (pipelines/show.py)

The flow, one step per line of `build`:
    plan (footers, schemas; before the pipeline) -> ReadExperiences -> ScoreGroups
    (GroupByKey on a bucket of (batch, task)) -> WriteScored (GroupByKey on read unit, rows
    read back where they are) -> finalize (metrics.json, then _SUCCESS).
Exit status: 0 success, 1 the pipeline failed, 2 bad configuration or input.
"""

from __future__ import annotations

import gc
import sys

if __name__ == "__main__":  # `python -m pipelines.rescore`: no collections during the imports (see cli)
    gc.disable()

import hashlib
import json
import logging
import os
import time
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    StandardOptions,
    TestOptions,
)

from pipelines import __version__, incremental
from pipelines.config import DEFAULT_RUNNER, RunConfig, parse_args
from pipelines.progress import Progress
from schemas import SchemaError
from transforms import device as devices
from transforms import storage
from transforms.read import InputError, InputPlan, ReadExperiences, plan_input
from transforms.score import ScoreGroups
from transforms.strategies import ConfigError, ScoringPlan, build_plan
from transforms.write import METRICS, STAGING, SUCCESS, WriteScored, finalize

log = logging.getLogger("rescore")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


class RejectBudgetExceeded(RuntimeError):
    """More rows were rejected than --max-reject-fraction allows."""
USER_ERRORS = (ConfigError, SchemaError, InputError)


def build(p: beam.Pipeline, plan: InputPlan, scoring: ScoringPlan, cfg: RunConfig, run_info: dict) -> None:
    light = p | "ReadExperiences" >> ReadExperiences(
        plan, needs=scoring.needs, buckets=cfg.buckets, threads=cfg.io_threads
    )
    records, group_metrics, copy_plans, copy_metrics = light.rows | "ScoreGroups" >> ScoreGroups(
        scoring, max_group_rows=cfg.max_group_rows, device=cfg.device, accelerator=cfg.accelerator
    )
    outcomes = (records, light.rejected) | "EveryRow" >> beam.Flatten()
    files, row_metrics = outcomes | "WriteScored" >> WriteScored(
        plan, cfg.output, scoring, copy_plans, device=cfg.device, accelerator=cfg.accelerator,
        file_metadata=file_metadata(run_info), threads=cfg.io_threads, shard_rows=cfg.shard_rows,
    )
    stages = [(s.kind, s.name, dict(s.params)) for s in scoring.stages]
    finalize(
        p, plan, cfg.output, run_info, stages, files, group_metrics, row_metrics, copy_metrics,
        max_reject_fraction=cfg.max_reject_fraction,
    )


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
    """Refuse to clobber a finished run; clear what a failed run left behind."""
    out_dir = os.path.abspath(output) if storage.is_local(output) else output.rstrip("/")
    for path in plan.files:
        parent = os.path.dirname(os.path.abspath(path)) if storage.is_local(path) else path.rsplit("/", 1)[0]
        if parent == out_dir:
            raise ConfigError(f"--output {output} holds input file {path}; write to a directory of its own")
    if storage.exists(storage.join(output, SUCCESS)):
        if not overwrite:
            raise ConfigError(f"{output} already holds a finished run (_SUCCESS); pass --overwrite to replace it")
        # _SUCCESS goes first, so no reader takes a half-replaced directory for finished.
        storage.delete([storage.join(output, SUCCESS)])
    stale = storage.list_dir(output, "scored-*.parquet") + storage.list_dir(output, "rejected-*.parquet")
    stale += [p for p in (storage.join(output, METRICS), storage.join(output, STAGING)) if storage.exists(p)]
    if stale:
        log.info("removing %d files of an earlier run from %s", len(stale), output)
        storage.delete(stale)


def _check_local_device(cfg: RunConfig, options: PipelineOptions) -> None:
    """--device cuda fails before anything runs where the job runs on this machine; a remote
    runner's workers check for themselves when they start (the launcher may have no GPU)."""
    runner = options.view_as(StandardOptions).runner or DEFAULT_RUNNER
    if cfg.device == "cuda" and runner in devices.LOCAL_RUNNERS:
        try:
            devices.resolve("cuda")
        except devices.DeviceError as e:
            raise ConfigError(str(e)) from None


def build_job(cfg: RunConfig, extra_info: dict[str, Any] | None = None) -> tuple[beam.Pipeline, InputPlan, dict[str, Any]]:
    """Plan the input, prepare the output and build the pipeline (not run)."""
    scoring = build_plan(cfg.strategies, cfg.params)
    options = PipelineOptions(cfg.beam_args)
    _check_local_device(cfg, options)
    plan = plan_input(cfg.inputs, needs=scoring.needs, shard_rows=cfg.shard_rows, skip_bad_files=cfg.skip_bad_files)
    for warning in plan.warnings:
        log.warning(warning)
    if not options.view_as(TestOptions).dry_run:
        prepare_output(cfg.output, plan, cfg.overwrite)
    run_info = {
        "rescore_version": __version__,
        "strategy": scoring.name,
        "algorithm": cfg.algorithm,
        "params": scoring.params,
        "config_hash": config_hash(scoring.name, scoring.params, cfg.algorithm),
        "input": cfg.inputs,
        "output": cfg.output,
        "buckets": cfg.buckets,
        "shard_rows": cfg.shard_rows,
        "max_reject_fraction": cfg.max_reject_fraction,
        "max_group_rows": cfg.max_group_rows,
        "device": cfg.device,
        **(extra_info or {}),
    }
    p = beam.Pipeline(options=options)
    build(p, plan, scoring, cfg, run_info)
    return p, plan, run_info


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the job; returns the metrics.json document. Raises on failure.

    With Beam's --dry_run=True (Dataflow) the job graph is built and not submitted; the result
    is {"dry_run": True, "job": the runner's job object, ...}. With --no-wait the job is
    submitted and {"submitted": True, ...} returned. With --incremental, see
    pipelines/incremental.py; {"nothing_new": True, ...} when every input file is scored.
    """
    cfg = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.getLogger().setLevel(cfg.log_level)
    if cfg.incremental:
        return _run_incremental(cfg)
    return _run_once(cfg)


def _run_incremental(cfg: RunConfig) -> dict[str, Any]:
    """Batch-level incremental rescoring into a Delta Lake table (pipelines/incremental.py)."""
    return incremental.run(cfg)


def _run_once(cfg: RunConfig, extra_info: dict[str, Any] | None = None) -> dict[str, Any]:
    p, plan, run_info = build_job(cfg, extra_info)
    if p.options.view_as(TestOptions).dry_run:
        return {**run_info, "dry_run": True, "job": getattr(p.run(), "job", None)}
    if not cfg.wait and p.options.view_as(StandardOptions).runner not in devices.LOCAL_RUNNERS:
        result = p.run()
        return {**run_info, "submitted": True, "job_id": getattr(result, "job_id", lambda: None)()}
    with Progress(cfg.output, len(plan.units), plan.num_rows, len(plan.files), enabled=not cfg.quiet):
        p.run().wait_until_finish()
    success = storage.join(cfg.output, SUCCESS)
    metrics = storage.join(cfg.output, METRICS)
    doc = json.loads(storage.read_text(metrics)) if storage.exists(metrics) else {}
    if doc.get("failed"):
        raise RejectBudgetExceeded(
            f"{doc['failed']}; the rejected rows and metrics.json are in {cfg.output}, no _SUCCESS was written"
        )
    if not storage.exists(success):
        raise RuntimeError(f"the pipeline finished but {success} was not written")
    return doc


def _summary(doc: dict[str, Any], seconds: float) -> str:
    t = doc["totals"]
    rate = t["rows_read"] / seconds if seconds > 0 else 0.0
    reasons = ", ".join(f"{k} {v:,}" for k, v in t["reject_reasons"].items())
    lines = [
        f"rescore: {doc['strategy']} done -> {doc['output']}",
        f"  rows read        {t['rows_read']:>12,}",
        f"  rows written     {t['rows_written']:>12,}",
        f"  rows duplicated  {t['rows_duplicated']:>12,}",
        f"  rows filtered    {t['rows_filtered']:>12,}",
        f"  rows rejected    {t['rows_rejected']:>12,}" + (f"  ({reasons})" if reasons else ""),
        f"  groups           {t['groups']:>12,}  ({t['groups_filtered']:,} filtered, {t['groups_duplicated']:,} copies)",
        f"  batches          {len([b for b in doc['batches'] if b['batch'] is not None]):>12,}",
        f"  wall time        {seconds:>11.1f}s  ({rate:,.0f} rows/s)",
    ]
    for skipped in doc.get("skipped_files", []):
        lines.append(f"  skipped file     {skipped['reason']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    if argv[:1] == ["sample"]:
        from pipelines import sample

        return sample.main(argv[1:])
    if argv[:1] == ["report"]:
        from pipelines import report

        return report.main(argv[1:])
    if argv[:1] == ["show"]:
        from pipelines import show

        return show.main(argv[1:])
    quiet = "--quiet" in argv
    started = time.monotonic()
    try:
        doc = run(argv)
    except USER_ERRORS as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except (RejectBudgetExceeded, incremental.ConflictError) as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("rescore: interrupted; the output directory has no _SUCCESS", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # a pipeline failure: one line here, the traceback at DEBUG
        log.debug("pipeline failed", exc_info=True)
        last = [line for line in str(e).strip().splitlines() if line.strip()]
        print(f"rescore: error: pipeline failed: {last[-1] if last else type(e).__name__}", file=sys.stderr)
        return EXIT_FAILED
    if doc.get("dry_run"):
        if not quiet:
            print(f"rescore: dry run: the job graph for {doc['strategy']} was built and not submitted", file=sys.stderr)
        return EXIT_OK
    if doc.get("submitted"):
        if not quiet:
            print(f"rescore: submitted job {doc.get('job_id') or ''} -> {doc['output']} (not waiting)", file=sys.stderr)
        return EXIT_OK
    if doc.get("nothing_new"):
        if not quiet:
            print(f"rescore: {doc['message']}", file=sys.stderr)
        return EXIT_OK
    if not quiet:
        if "totals" in doc:
            print(_summary(doc, time.monotonic() - started), file=sys.stderr)
        if doc.get("incremental", {}).get("summary"):
            print(doc["incremental"]["summary"], file=sys.stderr)
    return EXIT_OK


def cli() -> None:
    """The command line: main(), then exit without the interpreter's teardown.

    Importing Beam and torch builds about a million Python objects. The entry points import
    them with the garbage collector off (a collection then finds nothing to free) and freeze
    them, so later collections skip them; at exit, tearing them down would take ~1 s on a
    2-core machine, after every output is already renamed into place and flushed.
    """
    gc.freeze()
    gc.enable()
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    cli()
