"""`rescore`: read experience Parquet, score task groups, write scored Parquet.

    rescore --input 'PATH_OR_GLOB' --output DIR --strategy NAME [--set key=value ...]
            [--config FILE.yaml] [beam options...]
    rescore sample --output DIR [--rows N]      # write sample experience to try it on
    rescore report OUTPUT_DIR [--to DIR]        # report.html and charts of a finished run
    rescore show OUTPUT [--batches]             # rows, batches, runs, pending input (pipelines/show.py)
    rescore strategies [NAME]                   # strategies, or one's parameters and defaults
    rescore configs                             # the shipped run configs (--config NAME)

The flow, one step per line of `build`:
    plan (footers, schemas; before the pipeline) -> ReadExperiences -> ScoreGroups
    (GroupByKey on a bucket of (batch, task)) -> PlanCopies (with duplication; GroupByKey on
    batch) -> WriteScored (GroupByKey on read unit, rows read back where they are) -> Finalize
    (metrics.json, then _SUCCESS).
Exit status: 0 success, 1 the pipeline failed, 2 bad configuration or input.
"""

from __future__ import annotations

import gc
import sys

if __name__ == "__main__":  # `python -m rescore`: no collections during the imports (see cli)
    gc.disable()

import hashlib
import json
import logging
import os
import re
import signal
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)

from rescore import errors
from rescore.errors import ConfigError, RejectBudgetExceeded
from rescore.pipelines import __version__, incremental
from rescore.pipelines.config import DEFAULT_RUNNER, RunConfig, local_buckets, parse_args, usage
from rescore.pipelines.progress import Progress
from rescore.pipelines.wording import plural, process_seconds
from rescore.transforms import device as devices
from rescore.transforms import fault_injection
from rescore.transforms.files import lock as output_lock
from rescore.transforms.files import ownership, progress_marks, storage
from rescore.transforms.files.layout import FILTERED_FILES, METRICS, SUCCESS, staging_dir
from rescore.transforms.input_plan import InputPlan, plan_input
from rescore.transforms.unit_store import Prefetch, UnitStoreHandle, start_prefetch
from rescore.transforms.unit_threads import resolve_threads

if TYPE_CHECKING:
    from rescore.transforms.strategies import StrategyChain

log = logging.getLogger("rescore")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
INTERRUPTED = "rescore: interrupted; this run published nothing (an earlier finished run in the output is left as it was)"


USER_ERRORS = errors.USER_ERRORS


def build(
    p: beam.Pipeline, plan: InputPlan, scoring: StrategyChain, cfg: RunConfig, run_info: dict,
    unit_store: UnitStoreHandle | None = None,
) -> UnitStoreHandle:
    """The whole job: read -> score -> plan copies -> write -> finalize. `unit_store`: the run's
    prefetch, unit cache and slice decoders, and the finalize step's document
    (transforms/unit_store.py); None: a new one (no prefetch). Returns it: the launcher closes
    it when the run ends."""
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
        unit_store = UnitStoreHandle(cfg.unit_cache_mb, cfg.read_ahead_mb)
    units = p
    if cfg.models.enabled:  # per row, before any shuffle: side files joined wherever a unit is read
        from rescore.transforms.models import ComputeModelColumns

        units = p | "ComputeModelColumns" >> ComputeModelColumns(
            plan, cfg.models, staging_dir(cfg.output), settings, context=run_info["models"]["context"]
        )
    read = units | "ReadExperiences" >> ReadExperiences(
        plan, settings, needs=scoring.needs, keep_units=_one_process(p.options), progress=progress,
        unit_store=unit_store,
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


SAMPLER_PERIOD_MS = 20
"""The longest sleep of Beam's state sampler in an in-process run (Beam's default: 200 ms)."""


def shorten_sampler_period() -> None:
    """Beam's state sampler, one thread per bundle that times each step for the msec counters,
    sleeps up to 200 ms between samples, and every bundle's end joins it: about 0.1 s of an idle
    core at the end of each long bundle (a 1,024,000-row run waited 0.22 s in all, 0.05 s with
    20 ms). Beam reads the period from a default argument; this lowers that default to
    SAMPLER_PERIOD_MS, for the bundles this process runs. Only the timing figures get finer;
    nothing where Beam's signature is not the one this was written for."""
    try:
        from apache_beam.runners.worker import statesampler

        init = statesampler.StateSampler.__init__
        if init.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,):
            init.__defaults__ = (SAMPLER_PERIOD_MS,)
    except (ImportError, AttributeError):  # pragma: no cover - another Beam
        pass


def _in_process(cfg: RunConfig, options: PipelineOptions) -> bool:
    """The job runs in this process (_one_process), on files as they are (no model stage), and
    is not a dry run."""
    return _one_process(options) and not options.view_as(TestOptions).dry_run and not cfg.models.enabled


def _file_needs(needs: tuple[str, ...], computed: tuple[str, ...]) -> tuple[str, ...]:
    """The columns the input files must have: what the strategies need, less what a model
    computes; a need for NAME_original of a computed NAME (rollout_correction's behaviour
    log-probs under --logprob-model) is a need for the input's NAME."""
    out = []
    for name in needs:
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
        prefetch = start_prefetch(cfg.inputs, shard_rows=cfg.shard_rows, threads=resolve_threads(cfg.io_threads))
    unit_store = UnitStoreHandle(cfg.unit_cache_mb, cfg.read_ahead_mb, prefetch=prefetch)
    from rescore.transforms.strategies import build_chain  # imports torch

    scoring = build_chain(cfg.strategies, cfg.params)
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
        if warning in skipped and not cfg.quiet and cfg.wait and not options.view_as(TestOptions).dry_run:
            continue  # the summary lists it ("skipped file"): once, not twice in two formats
        log.warning(warning)
    if not cfg.buckets_chosen and _in_process(cfg, options):
        cfg = replace(cfg, buckets=local_buckets(plan.num_rows))
    if not options.view_as(TestOptions).dry_run:
        prepare_output(cfg.output, plan, cfg.overwrite)
    run_info = {
        "rescore_version": __version__,
        "strategy": scoring.name,
        "algorithm": cfg.algorithm,
        "params": scoring.params,
        # The models decide the scores too: with a model flag they are part of the hash.
        "config_hash": config_hash(
            scoring.name, {**scoring.params, "models": models_info} if models_info else scoring.params, cfg.algorithm
        ),
        "input": cfg.inputs,
        "output": cfg.output,
        "buckets": cfg.buckets,
        "shard_rows": cfg.shard_rows,
        "max_reject_fraction": cfg.max_reject_fraction,
        "max_group_rows": cfg.max_group_rows,
        "device": cfg.device,
        "keep_filtered": cfg.keep_filtered,
        "audit_columns": cfg.audit_columns,
        **({"models": models_info} if models_info else {}),
        **(extra_info or {}),
    }
    p = beam.Pipeline(options=options)
    build(p, plan, scoring, cfg, run_info, unit_store)
    return p, plan, run_info, unit_store


def run(argv: list[str] | None = None, *, prefetch: Prefetch | None = None) -> dict[str, Any]:
    """Run the job; returns the metrics.json document. Raises on failure.

    With Beam's --dry_run=True (Dataflow) the job graph is built and not submitted; the result
    is {"dry_run": True, "job": the runner's job object, ...}. With --no-wait the job is
    submitted and {"submitted": True, ...} returned. With --incremental, see
    pipelines/incremental.py; {"nothing_new": True, ...} when every input file is scored.
    `prefetch`: the first read units the command started decoding (pipelines/early.py).
    """
    cfg = parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.getLogger().setLevel(cfg.log_level)
    fault_injection.refresh()  # tests only: a no-op unless they armed a fault
    from rescore.pipelines import sources  # Trinity SQL buffers, verl rollout dumps

    ownership.check_output_path(cfg.output)
    if prefetch is not None and (cfg.incremental or sources.wanted(cfg)):
        prefetch.close()  # pipelines/early.py starts none for these runs: nothing would take it
        prefetch = None
    if PipelineOptions(cfg.beam_args).view_as(TestOptions).dry_run and not sources.wanted(cfg):
        return _run_incremental(cfg) if cfg.incremental else _run_once(cfg, prefetch=prefetch)
    with output_lock.acquire(cfg.output, cfg.wait_for_lock):  # one run at a time per output
        if sources.wanted(cfg):
            return sources.run(cfg, _run_once)
        if cfg.incremental:
            return _run_incremental(cfg)
        return _run_once(cfg, prefetch=prefetch)


def _run_incremental(cfg: RunConfig) -> dict[str, Any]:
    """Batch-level incremental rescoring into a Delta Lake table (pipelines/incremental.py)."""
    return incremental.run(cfg)


def _run_once(cfg: RunConfig, extra_info: dict[str, Any] | None = None, *, prefetch: Prefetch | None = None) -> dict[str, Any]:
    unit_store = None
    try:
        p, plan, run_info, unit_store = build_job(cfg, extra_info, prefetch=prefetch)
        return _run_built(cfg, p, plan, run_info, unit_store)
    finally:  # what the read step did not take, cached units, decoders this run left open
        if unit_store is not None:
            unit_store.close()
        elif prefetch is not None:
            prefetch.close()


def _run_built(
    cfg: RunConfig, p: beam.Pipeline, plan: InputPlan, run_info: dict[str, Any], unit_store: UnitStoreHandle
) -> dict[str, Any]:
    if p.options.view_as(TestOptions).dry_run:
        return {**run_info, "dry_run": True, "job": getattr(p.run(), "job", None)}
    if not cfg.wait and p.options.view_as(StandardOptions).runner not in devices.LOCAL_RUNNERS:
        result = p.run()
        return {**run_info, "submitted": True, "job_id": getattr(result, "job_id", lambda: None)()}
    if _one_process(p.options):
        shorten_sampler_period()
    try:
        with Progress(cfg.output, len(plan.units), plan.num_rows, len(plan.files), enabled=not cfg.quiet,
                      interval=cfg.progress_seconds):
            p.run().wait_until_finish()
    except BaseException:
        progress_marks.clear(staging_dir(cfg.output))  # the marks only count a run in progress
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
            f"{doc['failed']}; the rejected rows and metrics.json are in {cfg.output}, no _SUCCESS was written"
        )
    if not storage.exists(success):
        raise RuntimeError(f"the pipeline finished but {success} was not written")
    return doc


def _published_file(output: str) -> tuple[dict[str, Any], str]:
    """(metrics.json's document, its path) as the finalize step published it in OUTPUT (or, for
    a failed run beside a finished one, OUTPUT/_failed); ({}, path) where there is none."""
    for metrics in (storage.join(output, ownership.FAILED, METRICS), storage.join(output, METRICS)):
        if storage.exists(metrics):
            return json.loads(storage.read_text(metrics)), metrics
    return {}, metrics


def _summary(doc: dict[str, Any], seconds: float) -> str:
    t = doc["totals"]
    rate = t["rows_read"] / seconds if seconds > 0 else 0.0
    reasons = ", ".join(f"{k} {v:,}" for k, v in t["reject_reasons"].items())
    lines = [
        f"rescore: {doc['strategy']} done -> {doc['output']}",
        f"  rows read        {t['rows_read']:>12,}",
        f"  rows written     {t['rows_written']:>12,}"
        + (f"  ({t['rows_written_original']:,} originals + {t['rows_duplicated']:,} copies)" if t["rows_duplicated"] else ""),
        f"  rows duplicated  {t['rows_duplicated']:>12,}",
        f"  rows filtered    {t['rows_filtered']:>12,}  (dropped by the strategy"
        + (f"; kept in {FILTERED_FILES})" if doc.get("keep_filtered") else ", not written)"),
        f"  rows rejected    {t['rows_rejected']:>12,}" + (f"  ({reasons})" if reasons else ""),
        f"  groups           {t['groups']:>12,}  ({t['groups_filtered']:,} filtered, {t['groups_duplicated']:,} copies)",
        f"  batches          {len([b for b in doc['batches'] if b['batch'] is not None]):>12,}",
        f"  wall time        {seconds:>11.1f}s  ({rate:,.0f} rows/s)",
    ]
    for skipped in doc.get("skipped_files", []):
        lines.append(f"  skipped file     {skipped['reason']}")
    return "\n".join(lines)


class _HeldLogs(logging.Handler):
    """Log records (Rescore's warnings, Beam's ERROR log of a failing step, Python warnings) held
    until the run ends: written to stderr after a success, dropped after a failure, whose one
    `rescore: error:` line says what went wrong. Beam's own records (its workers' logs, which a
    multi-process run relays to this process) are dropped after a success too: they are about
    Beam, not the run. --log-level INFO or DEBUG writes everything as it comes."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def flush_to(self, stream) -> None:
        for record in self.records:
            if record.name.split(".")[0] == "apache_beam":
                continue  # Beam's own records and its workers' (--log-level INFO or DEBUG shows them)
            try:
                stream.write(self.format(record) + "\n")
            except Exception:  # noqa: BLE001  (a log line must never fail the run)
                pass
        self.records.clear()


def _one_line(text: str) -> str:
    """A message as one line, whatever it quotes (a path may hold a newline)."""
    return " ".join(text.splitlines()) if text else text


def _log_level(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a in ("--log-level", "--log_level") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(("--log-level=", "--log_level=")):
            return a.split("=", 1)[1]
    return "WARNING"


def _no_foreign_errors(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR or record.name.split(".")[0] in ("rescore", "pipelines", "transforms", "schemas")


def main(argv: list[str] | None = None, *, from_process: bool | None = None, prefetch: Prefetch | None = None) -> int:
    """The command; `from_process` (default: argv is None, the command line) makes the summary's
    wall time count the process's start-up too; `prefetch`: see run()."""
    started = time.monotonic()
    from_process = argv is None if from_process is None else from_process
    argv = list(sys.argv[1:] if argv is None else argv)
    level = _log_level(argv)
    if argv[:1] in (["sample"], ["report"]) or level in ("DEBUG", "INFO"):
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
        if level == "INFO":  # Beam's ERROR log of a failed step repeats the error line, with a traceback
            for handler in logging.getLogger().handlers:
                handler.addFilter(_no_foreign_errors)
        return _main(argv, None, started, from_process, prefetch)
    held = _HeldLogs()
    root = logging.getLogger()
    root.addHandler(held)
    logging.captureWarnings(True)
    try:
        code = _main(argv, held, started, from_process, prefetch)
    finally:
        root.removeHandler(held)
        logging.captureWarnings(False)
    return code


def _main(argv: list[str], held: _HeldLogs | None, started: float, from_process: bool, prefetch: Prefetch | None = None) -> int:
    """The command; with `held`, log records are written only after a success."""
    if argv[:1] == ["sample"]:
        from rescore.pipelines import sample

        return sample.main(argv[1:])
    if argv[:1] == ["report"]:
        from rescore.pipelines import report

        return report.main(argv[1:])
    if not argv:
        print(usage(), file=sys.stderr)
        return EXIT_CONFIG
    if argv[:1] == ["show"]:
        from rescore.pipelines import show

        return show.main(argv[1:])
    if argv[:1] == ["task-stats"]:
        from rescore.pipelines import task_stats

        return task_stats.main(argv[1:])
    if argv[:1] == ["export"]:
        from rescore.pipelines import export

        return export.main(argv[1:])
    if argv[:1] in (["strategies"], ["configs"]):
        from rescore.pipelines import listings

        try:
            return getattr(listings, argv[0])(argv[1:])
        except BrokenPipeError:  # `rescore strategies | head`
            sys.stdout = open(os.devnull, "w")
            return EXIT_OK
    quiet = "--quiet" in argv
    try:
        doc = run(argv, prefetch=prefetch)
    except USER_ERRORS as e:
        print(f"rescore: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_CONFIG
    except errors.RUN_FAILURES as e:
        print(f"rescore: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:  # a pipeline failure: one line here, the traceback at DEBUG
        log.debug("pipeline failed", exc_info=True)
        last = [line for line in str(e).strip().splitlines() if line.strip()]
        print(f"rescore: error: pipeline failed: {last[-1] if last else type(e).__name__}", file=sys.stderr)
        return EXIT_FAILED
    if held is not None:
        held.flush_to(sys.stderr)
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
            print(_summary(doc, process_seconds() if from_process else time.monotonic() - started), file=sys.stderr)
        if doc.get("incremental", {}).get("summary"):
            print(doc["incremental"]["summary"], file=sys.stderr)
    return EXIT_OK


def _interrupt(signum, frame):
    """Ctrl-C or SIGTERM: stop now, not after the running steps (which may take minutes).

    Stopping anywhere is safe (output is staged and _SUCCESS comes last, as with kill -9); the
    output lock goes with the process."""
    try:
        sys.stderr.write(INTERRUPTED + "\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_FAILED)


def _main_with_one_line_stderr(argv: list[str], prefetch: Prefetch | None = None) -> int:
    """main() with file descriptor 2 sent to a temporary file while it runs, and sys.stderr kept
    on the real stderr: what other processes and libraries write there directly (Beam's worker
    processes log their tracebacks to the stderr they inherit) is shown after a success and
    dropped after a failure, whose one `rescore: error:` line says what went wrong. Beam's workers
    (the multi-process runner) write their logs there, tens of lines a run: after a success only
    what is not a worker's log line is shown (--log-level INFO or DEBUG streams it all)."""
    import tempfile

    sys.stderr.flush()
    real = os.dup(2)
    spill = tempfile.TemporaryFile()
    os.dup2(spill.fileno(), 2)
    sys.stderr = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    code = main(argv, from_process=True, prefetch=prefetch)
    sys.stderr.flush()
    if code == EXIT_OK:
        spill.seek(0)
        extra = _without_worker_logs(spill.read())
        if extra:
            os.write(real, extra)
    return code


_WORKER_LOG = re.compile(
    rb"^(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL|[IWEF]\d{4} )\S*|\S+ (?:DEBUG|INFO|WARNING|ERROR):apache_beam|"
    rb".*apache_beam[./]|.*(?:sdk_worker|worker_pool_main|grpc|absl)\b)"
)


_EXCEPTION_LINE = re.compile(rb"^[\w.]+(?:Error|Exception|Exit|Interrupt|Warning)\b")


def _without_worker_logs(text: bytes) -> bytes:
    """What other processes wrote to stderr, less Beam's worker processes' log lines (Python
    logging's `LEVEL:name:message`, gRPC's and absl's `I0101 ...`, lines naming Beam's modules)
    and the tracebacks under them."""
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        if _WORKER_LOG.match(line):
            skipping = True
            continue
        if skipping and (line[:1] in (b" ", b"\t") or line.startswith((b"Traceback", b"During handling"))
                         or _EXCEPTION_LINE.match(line)):
            continue
        skipping = False
        kept.append(line)
    return b"".join(kept)


def cli(prefetch: Prefetch | None = None) -> None:
    """The command line: main(), then exit without the interpreter's teardown. `prefetch`: the
    first read units pipelines/cli.py started decoding before it imported this module.

    Importing Beam and torch builds about a million Python objects. The entry points import
    them with the garbage collector off (a collection then finds nothing to free) and freeze
    them, so later collections skip them; at exit, tearing them down would take ~1 s on a
    2-core machine, after every output is already renamed into place and flushed.
    """
    gc.freeze()
    gc.enable()
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's kill: the same one line as Ctrl-C
    argv = sys.argv[1:]
    if argv[:1] in (["sample"], ["report"]) or _log_level(argv) in ("DEBUG", "INFO"):
        code = main(argv, from_process=True, prefetch=prefetch)
    else:
        code = _main_with_one_line_stderr(argv, prefetch)
    if "apache_beam.runners.portability.job_server" in sys.modules:
        # A portable runner (Flink's, Spark's) started a job server JVM and registered its stop
        # with atexit; os._exit skips atexit, which left one JVM behind per run.
        import atexit

        atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    cli()
