"""`--incremental`: what a scheduled run scores, and how its rows are committed. The batch is the
unit of work; the output is a Delta Lake table (transforms/files/delta_table.py):

    OUTPUT/                        the table: the current scored rows, its _delta_log/ whose
                                   Rescore commits carry the bookkeeping (input files, their
                                   fingerprints and batches)
      _rescore.lock                the output lock every run holds (transforms/files/lock.py)
      _rescore/runs/RUN/           a run's work: metrics.json and rejected-*.parquet are kept

A run (pipelines/job.py: run_job runs `prepare`, the job's one pipeline, then `publish`;
see docs/runners.md):
1. lists the input and identifies each file by its canonical location (real path, normalised
   URL) and a content fingerprint (size, mtime, sha256 of the Parquet footer), reading each
   footer once (transforms/files/selection.py: list_inputs);
2. compares with the bookkeeping of the table's last Rescore commit: new, changed and deleted
   files; the batches they hold (or held) are the *touched* batches (from the footer's `batch`
   statistics where a row group holds one batch, else from the `batch` column itself);
3. scores every touched batch from ALL current input files that hold rows of it (only the row
   groups whose statistics can hold a touched batch are read), with the one-shot pipeline,
   into _rescore/runs/RUN/;
4. replaces the touched batches' rows in ONE Delta commit (replace-where `batch IN (...)`),
   together with the new bookkeeping; the commit is made against the table version the run
   started from and is never retried, so a concurrent commit makes it fail cleanly.

Before the commit the table is unchanged (readers see the previous version); after it they
see the new one; there is no state in between. A killed run leaves at most an unreferenced
work directory and unreferenced data files, which the next run removes or ignores.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from rescore.errors import ConfigError, ConflictError  # noqa: F401  (ConflictError: its old name here)
from rescore.pipelines.config import RunConfig
from rescore.transforms import fault_injection
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage, store_options
from rescore.transforms.files.delta_table import (
    State,
    check_table_path,
    check_table_types,
    commit,
    is_table,
    load_state,
    open_table,
    rows_after,
    table_uri,
)
from rescore.transforms.files.layout import INCREMENTAL_WORK, METRICS, SCORED_FILES, STAGING, SUCCESS
from rescore.transforms.files.selection import InputFile, Selection, batch_ranges, canonical, list_inputs, row_group_may_hold, select
from rescore.transforms.input_plan import InputPlan, file_units, plan_input

log = logging.getLogger("rescore")

RUN_PREFIX = "run="
WORK = INCREMENTAL_WORK
RUN_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,127}"
"""--run-name: one path component: letters, digits and . _ = + -, starting with a letter or
digit, at most 128 characters, and never `..` (so never a path, never absolute)."""
UNPUBLISHED = "nothing was committed"
"""What a failed incremental run left undone (the job's failure messages end with it)."""


def check_run_name(name: str) -> str:
    if not re.fullmatch(RUN_NAME_PATTERN, name) or ".." in name:
        raise ConfigError(
            f"--run-name {name!r} must be one path component matching {RUN_NAME_PATTERN} "
            "(letters, digits, . _ = + -; no '/', no '..')"
        )
    return name


def run_name(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{RUN_PREFIX}{now.strftime('%Y%m%dT%H%M%S')}"


def work_dir(output: str, name: str | None = None) -> str:
    return storage.join(output, WORK, "runs", name) if name else storage.join(output, WORK, "runs")


def _clean_work(output: str, state: State) -> None:
    """Remove what killed runs left: work directories of runs never committed, and the scored
    files of committed runs (their rows live in the table). Local and object-store outputs."""
    root = work_dir(output)
    committed = {r["run"] for r in state.runs}
    for name in storage.child_names(root):
        path = storage.join(root, name)
        if name not in committed:
            log.info("removing %s, the work of a run that never committed", path)
            storage.delete([path])
        else:
            storage.delete([storage.join(path, n) for n in storage.child_names(path)
                            if fnmatch.fnmatch(n, SCORED_FILES) or n == STAGING])


def restrict(plan: InputPlan, touched: set[int], shard_rows: int, whole: set[str], metadata: dict[str, Any]) -> InputPlan:
    """The plan with only the row groups that can hold a touched batch (files in `whole`, the
    new and changed ones, are read whole so that every rejected row of them is reported), from
    the footers already read (`metadata`: path -> FileMetaData)."""
    planned = {u.path: u.fingerprint for u in plan.units}  # taken when the run listed its input
    units: list = []
    for path in plan.files:
        meta = metadata.get(path)
        if path in whole:
            pf = storage.open_parquet(path, metadata=meta)
            counts = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        else:
            counts = row_group_may_hold(path, touched, meta)
        units += file_units(path, counts, shard_rows, first=len(units), fingerprint=planned.get(path))
    return replace(plan, units=tuple(units))


def _scored_reader(work: str, touched: set[int], schema: pa.Schema):
    """The staged scored rows of touched batches, streamed; and a counter of rows passed."""
    import pyarrow.compute as pc

    paths = storage.list_dir(work, SCORED_FILES)
    keep = pa.array(sorted(touched), pa.int64())
    counted = {"rows": 0}
    if paths:
        schema = storage.open_parquet(paths[0]).schema_arrow
    schema = schema.remove_metadata()

    def batches():
        for path in paths:
            for rb in storage.open_parquet(path).iter_batches(batch_size=65536):
                rb = rb.filter(pc.is_in(rb.column("batch"), value_set=keep))
                if rb.num_rows:
                    counted["rows"] += rb.num_rows
                    yield pa.RecordBatch.from_arrays(rb.columns, schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches()), counted


def _check_unchanged(planned: dict, files: list[InputFile]) -> None:
    """Before the commit: every file the run read is still the one it planned from, and the one
    its bookkeeping records (size and footer as listed); else InputChanged (exit 1, nothing
    committed)."""
    listed = {f.path: f for f in files}
    for path, fp in planned.items():
        fingerprints.verify(path, fp)
        f = listed.get(path)
        if f is not None and (fp.stat[0], fp.footer) != (f.size, f.footer):
            raise fingerprints.InputChanged(
                f"{path} changed while the run was reading it (it differs from when the run listed it); "
                "nothing was committed: rerun once the input is complete"
            )


def _next_state(state: State, chosen: Selection, files: list[InputFile], name: str, chash: str, strategy: str,
                inputs: list[str], info: dict, rebuild: bool) -> State:
    entries = {} if rebuild else {k: v for k, v in state.files.items() if k not in chosen.deleted}
    for f in files:
        if f.key in chosen.batches:
            entries[f.key] = {
                "size": f.size, "mtime": f.mtime, "footer": f.footer, "run": name,
                "batches": batch_ranges(chosen.batches[f.key]),
            }
    run_doc = {
        "run": name, "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **{k: info[k] for k in ("new_files", "changed_files", "deleted_files", "batches_rescored", "source_files")},
    }
    return State(None, chash, strategy, list(inputs), entries, [*state.runs, run_doc])


# --- the run: prepare (before the pipeline), publish (after it) -------------------------------


def table_options(cfg: RunConfig) -> dict | None:
    """delta-rs's storage options for the run's table: from the Beam arguments and the
    environment the run's filesystems use (transforms/files/store_options.py)."""
    if storage.is_local(cfg.output):
        return None
    return store_options.delta_options(cfg.output, cfg.beam_args)


def check_store(cfg: RunConfig) -> None:
    """An S3 configuration whose Delta commits cannot be atomic: exit 2, one line, before the
    run writes anything (its lock included)."""
    if not storage.is_local(cfg.output):
        store_options.check_settings(cfg.output, store_options.delta_options(cfg.output, cfg.beam_args))


def check(cfg: RunConfig, scoring) -> None:
    """What an incremental run refuses before it looks at its input (exit 2, one line)."""
    if cfg.run_name:
        check_run_name(cfg.run_name)
    if not cfg.wait:
        raise ConfigError("--incremental waits for the run to finish before it commits it; drop --no-wait")
    stage = scoring.correction
    if stage is not None and stage.max_staleness is not None and stage.current_model_version is None:
        # the newest version of the whole input is not what an incremental run reads
        raise ConfigError(f"{stage.name}: max_staleness with --incremental needs current_model_version (the newest version is measured over one-shot input only)")
    check_table_path(cfg.output, ConfigError)  # before anything is written there
    if storage.is_local(cfg.output) and os.path.isfile(cfg.output):
        raise ConfigError(f"--output {cfg.output} is a file; incremental output is a directory (a Delta table)")
    so = table_options(cfg)
    check_store(cfg)
    if not is_table(cfg.output, so) and storage.exists(storage.join(cfg.output, SUCCESS)):
        raise ConfigError(
            f"{cfg.output} holds a one-shot run (_SUCCESS); an incremental table needs a directory of its own"
        )


@dataclass
class Increment:
    """One incremental run, worked out before its pipeline: what it scores and what it commits."""

    cfg: RunConfig
    """the run's settings, writing into its work directory (`output` is the work directory)"""
    table: str
    """the table (the user's --output)"""
    name: str
    state: State
    """the bookkeeping the run started from (the commit is made against its version)"""
    chosen: Selection
    files: list[InputFile]
    sources: list[InputFile]
    """the input files the pipeline reads (none: only deleted files, whose rows are removed)"""
    plan: InputPlan | None
    info: dict[str, Any]
    """the run's `incremental` entry of metrics.json"""
    chash: str
    strategy: str
    rebuild: bool
    storage_options: dict | None = None
    """delta-rs's storage options for the table (table_options)"""


def prepare(cfg: RunConfig, scoring, chash: str, *, dry_run: bool = False) -> Increment | dict[str, Any]:
    """Read the table's bookkeeping and the input (each footer once), choose what to score, plan
    it; or {"nothing_new": True, "message": ...}. A dry run writes nothing (the work of killed
    runs is left, the work directory not made)."""
    name = cfg.run_name or run_name()
    so = table_options(cfg)
    state = load_state(cfg.output, storage_options=so)
    fault_injection.maybe_kill_at("locked")
    rebuild = bool(cfg.overwrite)
    if state.config_hash and state.config_hash != chash and not rebuild:
        raise ConfigError(
            f"{cfg.output} was scored with strategy {state.strategy} (config {state.config_hash[:12]}); this run's "
            f"strategy or parameters differ ({scoring.name}, config {chash[:12]}): pass --overwrite to rescore "
            "every batch with them, or use another --output"
        )
    used = {r["run"] for r in state.runs}
    if name in used and cfg.run_name:
        raise ConfigError(f"{cfg.output} already has a run named {name}; pick another --run-name")
    base, k = name, 1
    while name in used:  # two runs within one second
        name, k = f"{base}-{k}", k + 1
    if not dry_run:
        _clean_work(cfg.output, state)
    files = list_inputs(cfg.inputs)
    out_real = canonical(table_uri(cfg.output)).rstrip("/") + "/"
    for f in files:
        if f.key.startswith(out_real):
            raise ConfigError(f"input file {f.path} lies inside --output {cfg.output}; write to a directory of its own")
    chosen = select(files, state, rebuild=rebuild, skip_bad_files=cfg.skip_bad_files)
    for f in chosen.changed:
        log.warning("%s changed since it was scored; its batches are scored again", f.path)
    for key in chosen.deleted:
        log.warning("%s is gone since it was scored; its rows are removed (its batches are scored again from the other files)", key)
    if chosen.nothing_new and not rebuild:
        return {
            "nothing_new": True, "input_files": len(files), "output": cfg.output,
            "strategy": scoring.name, "table_version": state.version,
            "message": (
                f"nothing new to score: all {len(files)} input files are already scored in {cfg.output} "
                f"(table version {state.version})"
            ),
        }

    fault_injection.maybe_kill_at("planned")
    work = work_dir(cfg.output, name)
    if not dry_run:
        storage.delete([work])
    whole = {f.path for f in chosen.new + chosen.changed}
    sources = [f for f in files if f in chosen.sources or f.path in whole]
    info = {
        "run": name,
        "table_version_before": state.version,
        "new_files": len(chosen.new),
        "changed_files": len(chosen.changed),
        "deleted_files": len(chosen.deleted),
        "already_scored": len(files) - len(chosen.new) - len(chosen.changed),
        "batches_rescored": len(chosen.touched),
        "source_files": len(sources),
    }
    plan = None
    if sources:
        if not rebuild and state.version is not None:
            check_table_types(cfg.output, [(f.path, f.schema) for f in sources if f.schema is not None], storage_options=so)
        plan = plan_input([f.path for f in sources], needs=scoring.needs, shard_rows=cfg.shard_rows,
                          skip_bad_files=cfg.skip_bad_files,
                          footers={f.path: (f.fingerprint, f.metadata) for f in sources if f.fingerprint is not None})
        for warning in plan.warnings:
            log.warning(warning)
        plan = restrict(plan, chosen.touched, cfg.shard_rows, whole, {f.path: f.metadata for f in sources})
    return Increment(replace(cfg, output=work, incremental=False), cfg.output, name, state, chosen, files, sources,
                     plan, info, chash, scoring.name, rebuild, so)


def publish(run: Increment, doc: dict[str, Any]) -> dict[str, Any]:
    """Commit what the pipeline staged in the work directory (`doc`: its metrics.json; {} when
    no pipeline ran): the touched batches' rows and the new bookkeeping in ONE Delta commit."""
    from rescore.schemas import output_schema

    output, work, chosen = run.table, run.cfg.output, run.chosen
    if run.plan is not None:
        schema = output_schema(run.plan.schema)  # used only when no row is left to commit
    else:  # only deleted files, and no other file holds their batches: remove their rows
        schema = pa.schema(open_table(output, storage_options=run.storage_options).schema().to_arrow())
    fault_injection.maybe_kill_at("before_commit")
    planned = {u.path: u.fingerprint for u in run.plan.units if u.fingerprint is not None} if run.plan else {}
    _check_unchanged(planned, run.files)
    new_state = _next_state(run.state, chosen, run.files, run.name, run.chash, run.strategy, run.cfg.inputs, run.info,
                            run.rebuild)
    new_state.rows = rows_after(output, run.state, storage.list_dir(work, SCORED_FILES), chosen.touched, run.rebuild,
                                run.storage_options)
    data, counted = _scored_reader(work, chosen.touched, schema)
    version = commit(output, run.state, new_state, chosen.touched, data, rebuild=run.rebuild,
                     storage_options=run.storage_options)
    fault_injection.maybe_kill_at("after_commit")
    storage.delete(storage.list_dir(work, SCORED_FILES))
    info = run.info
    info.update({"table_version": version, "rows_committed": counted["rows"]})
    if doc:
        storage.write_text(storage.join(work, METRICS), json.dumps({**doc, "incremental": info}, indent=2) + "\n")
        doc["output"] = output
        doc["incremental"] = info
    else:
        doc = {"incremental": info, "output": output, "strategy": run.strategy, "deleted_only": True}
    info["summary"] = (
        f"rescore: committed table version {version} of {output}: {len(chosen.touched):,} batches replaced "
        f"({counted['rows']:,} rows) from {len(run.sources)} input files; {len(chosen.new)} new, "
        f"{len(chosen.changed)} changed, {len(chosen.deleted)} deleted"
        + (f"; filtered rows kept in {work}/filtered-*.parquet (not in the table)" if run.cfg.keep_filtered and run.sources else "")
    )
    return doc
