"""Input that is not experience Parquet, and a Trinity-RFT buffer as a second output.

    rescore --input sqlite:///buffer.db --input-table experience --output DIR --algorithm grpo \\
            [--output-db sqlite:///scored.db --output-table experience]
    rescore --input 'rollouts/*.jsonl' --input-format verl-rollouts --output DIR --strategy grpo

The flow (pipelines/job.py: run_job): `staged` (the run's door, pipelines/doors/, reads its
rows in a Beam job of its own: id ranges of the buffer, or dump files, in parallel, written as
Parquet into OUTPUT/_source/) -> the usual job on those files (unchanged: the same read units,
validation, scoring, output and _SUCCESS) -> with --output-db, `publish_buffer` (a Beam job
inserts the scored rows into staging tables, then one transaction renames them to the buffer's
name) -> OUTPUT/_source/ is removed (also after a failure). The door's options, the strategy,
its parameters and the output directory are checked before anything is staged;
OUTPUT/_source/ is Rescore's only where it holds the SOURCE_MARK file Rescore writes when it
creates it (otherwise exit 2, nothing deleted). A failed buffer write drops its staging tables
and withdraws the run's _SUCCESS. docs/trainers.md says why the input is staged as Parquet and
in what order the outputs are published; docs/architecture.md what staging costs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, TestOptions

from rescore.errors import ConfigError
from rescore.pipelines import doors
from rescore.pipelines.config import RunConfig
from rescore.transforms.files import ownership, storage
from rescore.transforms.files.layout import SCORED_FILES, SOURCE_DIR, SOURCE_MARK, SUCCESS

log = logging.getLogger("rescore")


def wanted(cfg: RunConfig) -> bool:
    """Does this run need this module (rather than plain Parquet in, Parquet out)?"""
    return doors.door_for(cfg).staged or bool(cfg.output_db)


def _check(cfg: RunConfig, door: doors.Door) -> None:
    """The run's door first (its own options), then what every staged door or buffer output needs."""
    door.check(cfg)
    staged = doors.staged_doors()
    if cfg.incremental:
        raise ConfigError(f"--incremental tracks Parquet input files; it does not combine with "
                          f"{', '.join(d.chosen_by for d in staged)} or --output-db")
    options = PipelineOptions(cfg.beam_args)
    if options.view_as(TestOptions).dry_run or not cfg.wait:
        raise ConfigError(f"{' and '.join(d.what for d in staged)} are staged before the job runs: --dry_run and "
                          "--no-wait do not apply")
    if storage.exists(storage.join(cfg.output, SUCCESS)) and not cfg.overwrite:
        raise ConfigError(f"{cfg.output} already holds a finished run (_SUCCESS); pass --overwrite to replace it")
    if cfg.output_db and door.no_tokens:
        raise ConfigError(f"--output-db writes Trinity experiences, which need token ids; {door.no_tokens}")


def _run_pipeline(cfg: RunConfig, build: Callable[[beam.Pipeline], Any]) -> None:
    p = beam.Pipeline(options=PipelineOptions(cfg.beam_args))
    build(p)
    p.run().wait_until_finish()


def _entries(path: str) -> list[str]:
    """Every name in `path` (locally dotfiles and folders too: nothing is overlooked)."""
    if storage.is_local(path):
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
    return [p.rsplit("/", 1)[-1] for p in storage.list_dir(path, "*")]


def _check_source(path: str) -> None:
    """OUTPUT/_source/ holding files without SOURCE_MARK is the user's: refused (exit 2)."""
    if storage.is_local(path) and os.path.lexists(path) and not os.path.isdir(path):
        raise ownership.OutputError(f"--output {path} is a file Rescore did not write; it stages its input there: move it away")
    names = _entries(path)
    if names and SOURCE_MARK not in names:
        raise ownership.OutputError(
            f"--output {path} exists and holds {names[0]!r}, which Rescore did not write; Rescore stages "
            "its input there and deletes only its own files: move that directory away"
        )


def _claim_source(path: str) -> None:
    """Make OUTPUT/_source/ an empty directory of ours, marked with SOURCE_MARK."""
    _check_source(path)
    if _entries(path):  # left by a killed run of ours
        _remove_source(path)
    storage.write_text(storage.join(path, SOURCE_MARK), "staged input of a Rescore run; removed when the run ends\n")


def _remove_source(path: str) -> None:
    """Delete OUTPUT/_source/ (ours: claimed by _claim_source)."""
    storage.delete(storage.list_dir(path, "*"))
    if storage.is_local(path):
        try:
            os.rmdir(path)
        except OSError:
            pass


def _check_parquet_sink(cfg: RunConfig) -> None:
    """Plain Parquet in, buffer out: the input must carry token ids (checked before the run)."""
    from rescore.transforms.rows import trinity_rows

    files = sorted({p for pattern in cfg.inputs for p, _ in storage.match(pattern)})
    for path in files:  # every file: one without token ids would fail the insert after the run
        try:
            schema = storage.open_parquet(path).schema_arrow
        except Exception:  # noqa: BLE001  (an unreadable file is the input check's to report)
            continue
        try:
            trinity_rows.sink_columns(schema)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None


def _write_buffer(cfg: RunConfig) -> dict[str, Any]:
    from rescore.transforms import sql_buffer, sql_database
    from rescore.transforms.rows import trinity_rows

    files = sorted(storage.list_dir(cfg.output, SCORED_FILES))
    placed, first_id = [], 1
    columns: list[str] | None = None
    for path in files:
        pf = storage.open_parquet(path)
        try:
            found = trinity_rows.sink_columns(pf.schema_arrow)  # every file (checked before the run too)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        columns = (columns or []) + [c for c in found if c not in (columns or [])]
        if pf.metadata.num_rows:
            placed.append((path, first_id))
            first_id += pf.metadata.num_rows
    token = sql_database.new_token()
    try:
        sql_database.prepare_staging(cfg.output_db, cfg.output_table, token)
        if placed:
            _run_pipeline(cfg, lambda p: p | "WriteBuffer" >> sql_buffer.InsertScored(
                placed, cfg.output_db, cfg.output_table, token, columns or []))
        else:
            log.warning("no scored rows: the buffer %s is written empty", cfg.output_table)
        rows = sql_database.commit_staging(cfg.output_db, cfg.output_table, token, cfg.overwrite)
    finally:  # committed: renamed away, nothing to drop; failed: no staging table is left
        try:
            sql_database.drop_staging(cfg.output_db, cfg.output_table, token)
        except Exception as e:  # noqa: BLE001  (the write's own error is the one to report)
            log.warning("could not drop the staging tables of %s: %s", cfg.output_table, e)
    if rows != first_id - 1:  # pragma: no cover - the commit counts what the workers inserted
        raise RuntimeError(f"buffer {cfg.output_table} holds {rows} rows, the scored files {first_id - 1}")
    return {"url": sql_database.safe_url(cfg.output_db), "table": cfg.output_table, "rows": rows}


def _withdraw_success(output: str) -> None:
    """The buffer write failed after the Parquet output was published: that output no longer
    claims success (its files stay, Rescore's by the ledger; the next run clears them)."""
    storage.delete([p for p in [storage.join(output, SUCCESS)] if storage.exists(p)])
    ledger = ownership.read_ledger(output)
    if ledger is not None:
        ownership.write_ledger(output, [n for n in ledger if n != SUCCESS])


@contextmanager
def staged(cfg: RunConfig) -> Iterator[tuple[RunConfig, dict[str, Any]]]:
    """Check the run, then stage its input if it is not Parquet: yields the settings the job
    runs with (its input: the staged files) and what metrics.json says of the source; the
    staged files are removed when the job is done (also after a failure)."""
    door = doors.door_for(cfg)
    _check(cfg, door)
    from rescore.transforms.strategies import build_chain  # torch: only where a source is staged

    from rescore.pipelines import task_history

    # a bad strategy, parameter or task-stats table: exit 2 before anything is staged
    task_history.resolve(build_chain(cfg.strategies, cfg.params))
    if cfg.output_db:
        from rescore.transforms import sql_database

        sql_database.check_sink(cfg.output_db, cfg.output_table, cfg.overwrite)
        if not door.staged:
            _check_parquet_sink(cfg)
    inner, info = cfg, {}
    staging = storage.join(cfg.output, SOURCE_DIR)
    claimed = False
    try:
        if door.staged:
            # The output is checked (a finished run, foreign files) before anything is staged.
            _check_source(staging)
            ownership.prepare(cfg.output, cfg.overwrite)
            _claim_source(staging)
            claimed = True
            _, source = door.read(cfg, staging, lambda build: _run_pipeline(cfg, build))
            inner = replace(cfg, inputs=[storage.join(staging, "*.parquet")])
            # metrics.json names what the user gave (the URL, password hidden), not OUTPUT/_source/
            info = {"source": source, "input": door.shown_inputs(cfg, source)}
        yield inner, info
    finally:
        if claimed:
            _remove_source(staging)


def publish_buffer(cfg: RunConfig) -> dict[str, Any]:
    """--output-db, after the Parquet output is published: the scored rows written to the
    buffer in one transaction; a failed write withdraws the run's _SUCCESS."""
    try:
        return _write_buffer(cfg)
    except BaseException as e:
        _withdraw_success(cfg.output)
        if isinstance(e, ConfigError):
            raise ConfigError(f"{e}; the scored Parquet files in {cfg.output} are left without _SUCCESS") from None
        raise


__all__ = ["staged", "publish_buffer", "wanted"]
