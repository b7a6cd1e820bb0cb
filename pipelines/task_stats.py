"""`rescore task-stats`: how hard each task is, across every batch and run it was seen in.

    rescore task-stats --input SOURCE [--input SOURCE ...] --output DIR
                       [--threshold 1.0] [--k 1,4,8] [--lamb 0.2] [--beta-m M] [--overwrite]
                       [--band LO,HI --prompt-list FILE] [beam options...]

SOURCE is experience Parquet (a file, a directory of *.parquet, or a glob), or a finished
Rescore output (a one-shot directory or an incremental Delta table: its current scored rows).
DIR receives, published together with _SUCCESS last:

    task_stats.parquet         one row per task (docs/output.md, "Task statistics")
    task_batch_stats.parquet   one row per (task, batch) group
    task_stats.json            the parameters, the inputs, row counts

With --band LO,HI and --prompt-list FILE, the ids of the tasks whose pass rate p over their
whole history has LO < p < HI are also written to FILE, one per line in task order (the next
run's prompt list; the same band as the `pass_rate_band` filter with `task_stats`).

A subcommand rather than a flag of the scoring run: the statistics are wanted over ALL logged
experience (every run's input, or several outputs), not only over one run's input, and over the
input before any filter drops the all-solved and none-solved groups they are meant to find.

Every statistic is exact whatever the number of workers (transforms/rows/task_stats.py). The
statistics are computed by a Beam pipeline (transforms/task_stats.py); the pipeline options
given (--runner, --direct_num_workers, ...) go to Beam. DIR and the input must be local paths.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import sys
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from rescore.errors import RUN_FAILURES, ConfigError, InputError, LockBusy, last_line
from rescore.transforms.files import storage
from rescore.transforms.files.layout import TASK_STATS_JSON, Kind, other_output, other_output_message
from rescore.transforms.files.layout import DELTA_LOG, LOCK, SCORED_FILES, SUCCESS
from rescore.transforms.files.layout import STAGING as RUN_STAGING
from rescore.transforms.files.layout import TASK_BATCH_STATS, TASK_STATS, TASK_STATS_VIEW
from rescore.transforms.rows import task_stats as ts

STATS_JSON = TASK_STATS_JSON
STAGING = "_staging-task-stats"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rescore task-stats", description=__doc__.split("\n\n")[0], allow_abbrev=False,
                epilog="Any other --option is passed to Beam (e.g. --direct_num_workers).")
    p.add_argument("--input", action="append", required=True,
                   help="experience Parquet (file, directory, glob) or a finished Rescore output (repeatable)")
    p.add_argument("--output", required=True, help="directory for task_stats.parquet and task_batch_stats.parquet")
    p.add_argument("--threshold", type=float, default=ts.DEFAULT_THRESHOLD,
                   help="a row passes at reward >= THRESHOLD (default 1)")
    p.add_argument("--k", default=",".join(map(str, ts.DEFAULT_KS)), help="pass@k for these k (default 1,4,8)")
    p.add_argument("--lamb", type=float, default=ts.DEFAULT_LAMB,
                   help="Trinity's Beta estimator discount of the history, 0 <= lamb <= 1 (default 0.2)")
    p.add_argument("--beta-m", "--beta_m", type=float, default=None,
                   help="Trinity's m (samples per update); default: each group's rows")
    p.add_argument("--overwrite", action="store_true", help="replace finished task statistics in --output")
    p.add_argument("--band", help="LO,HI: with --prompt-list, the tasks with LO < pass rate < HI")
    p.add_argument("--prompt-list", "--prompt_list", help="write the ids of the tasks inside --band here, one per line")
    p.add_argument("--quiet", action="store_true", help="no summary line")
    p.add_argument("--wait-for-lock", "--wait_for_lock", type=float, default=0.0, metavar="SECONDS",
                   help="when another run or export is writing --output, wait up to SECONDS for it (default 0: refuse at once)")
    p.add_argument("--shared-filesystem", "--shared_filesystem", action="store_true",
                   help="local --input/--output paths are on a filesystem every worker of a Flink, Spark, Dask or "
                        "portable cluster mounts at the same path (else such a run is refused, as the run command does)")
    p.add_argument("--incremental", action="store_true",
                   help="keep --output as a Delta Lake table of task-batch groups; rescan only the batches new, "
                        "changed or deleted input files touch (docs/curating.md)")
    return p


def _ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        raise ConfigError(f"--k takes whole numbers separated by commas, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise ConfigError(f"--k takes whole numbers >= 1, got {text!r}")
    return ks


def _output_files(path: str) -> list[str]:
    """The current scored files of a finished Rescore output."""
    if os.path.isdir(os.path.join(path, DELTA_LOG)):
        from deltalake import DeltaTable

        dt = DeltaTable(os.path.abspath(path))
        if dt.protocol().reader_features or dt.metadata().partition_columns:
            raise InputError(f"{path}: a Delta table with reader features or partitions; read it with delta-rs first")
        return sorted(unquote(u[len("file://"):] if u.startswith("file://") else u) for u in dt.file_uris())
    return sorted(glob.glob(os.path.join(glob.escape(path), SCORED_FILES)))


def resolve_inputs(sources: list[str]) -> list[str]:
    """Every Parquet file the sources name, once each, sorted; InputError where one names none."""
    files: list[str] = []
    for source in sources:
        if "://" in source:  # an object store (pipelines/load.py)
            from rescore.pipelines.load import OutputError, input_files

            try:
                found = input_files(source)
            except OutputError as e:
                raise InputError(str(e)) from None
            if not found:
                raise InputError(f"--input {source} matches no Parquet file")
            files += found
            continue
        if os.path.isdir(source) and (os.path.isdir(os.path.join(source, DELTA_LOG)) or os.path.exists(os.path.join(source, SUCCESS))):
            found = _output_files(source)
        elif os.path.isdir(source):
            if os.path.exists(os.path.join(source, RUN_STAGING)) or glob.glob(os.path.join(glob.escape(source), SCORED_FILES)):
                raise InputError(f"{source} is not a finished Rescore output (no _SUCCESS, no Delta table)")
            found = sorted(glob.glob(os.path.join(glob.escape(source), "*.parquet")))
        else:
            found = sorted(f for f in glob.glob(source) if os.path.isfile(f))
        if not found and not (os.path.isdir(source) and os.path.exists(os.path.join(source, SUCCESS))):
            raise InputError(f"--input {source} matches no Parquet file")
        files += found
    return sorted(set(files))


def _task_type(files: list[str]) -> pa.DataType:
    seen: dict[str, str] = {}
    for f in files:
        try:
            schema = storage.open_parquet(f).schema_arrow
        except Exception as e:  # noqa: BLE001
            raise InputError(f"{f}: not a readable Parquet file ({type(e).__name__})") from None
        missing = [c for c in ts.ID_COLUMNS if c not in schema.names]
        if missing:
            raise InputError(f"{f}: missing column(s) {', '.join(missing)} (task-stats needs {', '.join(ts.ID_COLUMNS)})")
        t = schema.field("task").type
        kind = "string" if pa.types.is_string(t) or pa.types.is_large_string(t) else "int64" if pa.types.is_integer(t) else str(t)
        if kind not in ("string", "int64"):
            raise InputError(f"{f}: task must be an integer or a string, found {t}")
        seen.setdefault(kind, f)
    if len(seen) > 1:
        raise InputError(f"task is a string in {seen['string']} and an integer in {seen['int64']}")
    return pa.string() if "string" in seen else pa.int64()


def run(argv: list[str]) -> dict:
    args, beam_args = _parser().parse_known_args(argv)
    ks = _ks(args.k)
    if not 0 <= args.lamb <= 1:
        raise ConfigError(f"--lamb must be between 0 and 1, got {args.lamb}")
    if args.beta_m is not None and not 0 < args.beta_m < math.inf:
        raise ConfigError(f"--beta-m must be a finite number > 0, got {args.beta_m}")
    if not math.isfinite(args.threshold):  # task_stats.json is strict JSON: no NaN, no Infinity
        raise ConfigError(f"--threshold must be a finite number, got {args.threshold}")
    if not 0 <= args.wait_for_lock < math.inf:
        raise ConfigError(f"--wait-for-lock must be a number of seconds >= 0, got {args.wait_for_lock}")
    out = args.output
    from rescore.pipelines import command_output

    command_output.refuse_bucket(out, "--output", "task-stats")
    from rescore.pipelines.beam_args import pipeline_args

    # The run command's parser of runner arguments, and its cluster-path refusal (one for every command).
    beam_args = pipeline_args(beam_args, inputs=args.input, output=out, shared_filesystem=args.shared_filesystem,
                              log_level="WARNING")
    band = _band(args.band, args.prompt_list, args.input, out)
    if args.incremental:
        command_output.claim_table(out, "--output", sources=args.input)
    elif os.path.isdir(os.path.join(out, DELTA_LOG)):
        raise ConfigError(f"{out} is an incremental task-stats table: pass --incremental")
    else:  # checked before the lock creates anything (and again under it)
        found = other_output(os.listdir(out), Kind.TASK_STATS) if "://" not in out and os.path.isdir(out) else None
        if found:  # never mixed into (nor, with --overwrite, over) another command's output: name it
            raise ConfigError(other_output_message(out, found))
        command_output.claim(out, "--output", command_output.TASK_STATS_NAMES, sources=args.input, overwrite=args.overwrite,
                             what="task statistics", legacy=(STATS_JSON, ("input_files", "rows_read", "tasks")))
    from rescore.transforms.files import lock

    with lock.acquire(out, args.wait_for_lock):  # one run at a time per output (a second one: exit 2, naming the holder)
        return _run_locked(args, ks, beam_args, band, out)


def _run_locked(args, ks: tuple[int, ...], beam_args: list[str], band, out: str) -> dict:
    from rescore.pipelines import command_output
    from rescore.transforms.files import ownership

    if args.incremental:
        doc = run_incremental(args, ks, beam_args)
        if band is not None:
            doc["prompt_list"] = {"path": args.prompt_list, "tasks": write_prompt_list(
                os.path.join(out, TASK_STATS_VIEW, TASK_STATS), args.prompt_list, *band)}
        return doc
    if os.path.isdir(os.path.join(out, DELTA_LOG)):
        raise ConfigError(f"{out} is an incremental task-stats table: pass --incremental")
    command_output.claim(out, "--output", command_output.TASK_STATS_NAMES, sources=args.input, overwrite=args.overwrite,
                         what="task statistics", legacy=(STATS_JSON, ("input_files", "rows_read", "tasks")))
    files = resolve_inputs(args.input)
    ownership.check_not_input(out, files)
    if band is not None and os.path.realpath(args.prompt_list) in {os.path.realpath(f) for f in files}:
        raise ConfigError(f"--prompt-list {args.prompt_list} is an input file")
    task_type = _task_type(files)

    import apache_beam as beam

    from rescore.transforms.task_stats import SKIPPED, TASK_STATS_FILE, GROUP_STATS_FILE, ComputeTaskStats

    options = _pipeline_options(beam_args)
    staging = os.path.abspath(command_output.stage(out, STAGING))
    with beam.Pipeline(options=options) as p:
        _ = (p | "Files" >> beam.Create(files)
             | "ComputeTaskStats" >> ComputeTaskStats(staging, task_type, args.threshold, ks, args.lamb, args.beta_m))
    for name in (TASK_STATS_FILE, GROUP_STATS_FILE):
        if not os.path.exists(os.path.join(staging, name)):  # no usable row at all: empty tables
            schema = (ts.task_schema if name == TASK_STATS_FILE else ts.group_schema)(task_type, ks)
            pq.write_table(schema.empty_table(), os.path.join(staging, name))
    skipped_path = os.path.join(staging, SKIPPED)
    skipped = int(open(skipped_path).read()) if os.path.exists(skipped_path) else 0
    tasks = pq.read_metadata(os.path.join(staging, TASK_STATS_FILE)).num_rows
    groups = pq.read_metadata(os.path.join(staging, GROUP_STATS_FILE)).num_rows
    rows = sum(storage.open_parquet(f).metadata.num_rows for f in files)
    doc = {
        "inputs": args.input, "input_files": len(files), "threshold": args.threshold, "ks": list(ks),
        "lamb": args.lamb, "beta_m": args.beta_m, "rows_read": rows, "rows_skipped": skipped,
        "tasks": tasks, "groups": groups, "output": out,
    }
    with open(os.path.join(staging, STATS_JSON), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True, allow_nan=False)
    command_output.publish(staging, out, [TASK_STATS_FILE, GROUP_STATS_FILE, STATS_JSON])
    if band is not None:
        doc["prompt_list"] = {"path": args.prompt_list, "tasks": write_prompt_list(
            os.path.join(out, TASK_STATS_FILE), args.prompt_list, *band)}
    return doc


def _band(text: str | None, prompt_list: str | None, inputs: list[str], out: str) -> tuple[float, float] | None:
    """(LO, HI) of --band, and --prompt-list checked as a file this command may write, before any
    work: not a directory, not under a file, not in a place it cannot create or write, not an input
    nor inside the --output it publishes (exit 2, one line)."""
    if (text is None) != (prompt_list is None):
        raise ConfigError("--band and --prompt-list go together")
    if text is None:
        return None
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"--band takes LO,HI (two numbers), got {text!r}") from None
    if not 0 <= lo < hi <= 1:
        raise ConfigError(f"--band needs 0 <= LO < HI <= 1, got {text!r}")
    from rescore.pipelines import command_output
    from rescore.transforms.files.layout import LEDGER
    from rescore.transforms.files.ownership import creation_problem

    flag = f"--prompt-list {prompt_list}"
    if "://" in prompt_list:
        raise ConfigError(f"{flag}: the prompt list is a local file")
    if os.path.isdir(prompt_list):
        raise ConfigError(f"{flag} is a directory, not a file")
    if os.path.lexists(prompt_list) and not os.path.exists(prompt_list):
        raise ConfigError(f"{flag} is a symlink to a path that does not exist")
    if not os.path.exists(prompt_list):
        problem = creation_problem(prompt_list)
        if problem:
            raise ConfigError(f"{flag}: {problem}")
    elif not os.access(os.path.dirname(os.path.abspath(prompt_list)), os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: its directory is not writable")
    real = os.path.realpath(prompt_list)
    if os.path.dirname(real) == os.path.realpath(out) and os.path.basename(real) in (
            *command_output.TASK_STATS_NAMES, SUCCESS, LEDGER, DELTA_LOG, TASK_STATS_VIEW):
        raise ConfigError(f"{flag} is one of the files task-stats publishes in --output {out}")
    if any(os.path.realpath(i) == real for i in inputs):
        raise ConfigError(f"{flag} is an input")
    return lo, hi


def write_prompt_list(table_path: str, path: str, lo: float, hi: float) -> int:
    """The ids of the tasks with lo < pass_rate < hi, one per line, written to a temporary file
    beside `path` and renamed over it (never half-written). Returns how many."""
    import pyarrow.compute as pc

    table = pq.read_table(table_path, columns=["task", "pass_rate"])
    kept = table.filter(pc.and_(pc.greater(table["pass_rate"], lo), pc.less(table["pass_rate"], hi)))["task"].to_pylist()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(f"{t}\n" for t in kept)
    os.replace(tmp, path)
    return len(kept)


STATE_KEY = "rescore.task_stats"


def _pipeline_options(beam_args: list[str]):
    from apache_beam.options.pipeline_options import PipelineOptions

    try:
        options = PipelineOptions(beam_args)
        options.get_all_options(retain_unknown_options=False)
    except (SystemExit, Exception) as e:  # noqa: BLE001  (argparse inside Beam exits)
        raise ConfigError(f"bad Beam pipeline option in {' '.join(beam_args)}") from e
    return options


def _table_state(out: str) -> tuple[int | None, dict | None]:
    """(version, the latest commit's task-stats state) of an incremental table, (None, None)
    where there is no table yet."""
    if not os.path.isdir(os.path.join(out, DELTA_LOG)):
        if os.path.exists(out) and [n for n in os.listdir(out) if n != LOCK]:  # the output lock is ours
            raise ConfigError(f"{out} is not empty and not an incremental task-stats table; pick another --output")
        return None, None
    from deltalake import DeltaTable

    from rescore.transforms.files.delta_table import commits

    dt = DeltaTable(os.path.abspath(out))
    for commit in commits(out, dt):
        if STATE_KEY in commit:
            return dt.version(), json.loads(commit[STATE_KEY])
    raise ConfigError(f"{out} is a Delta table that `rescore task-stats --incremental` did not write")


def run_incremental(args, ks: tuple[int, ...], beam_args: list[str]) -> dict:
    """Rescan the batches that new, changed or deleted input files touch; replace their group
    rows in the Delta table in one commit (against the version read, never retried); then
    rewrite the per-task view _task_stats/task_stats.parquet from the table's exact state."""
    from rescore.transforms.files.selection import file_batches, list_inputs

    out = args.output
    params = {"threshold": args.threshold, "ks": list(ks), "lamb": args.lamb, "beta_m": args.beta_m}
    patterns = []
    for source in args.input:
        if os.path.isdir(source) and (os.path.isdir(os.path.join(source, DELTA_LOG)) or os.path.exists(os.path.join(source, SUCCESS))):
            raise ConfigError("--incremental reads experience Parquet (files, directories, globs), not a Rescore output")
        patterns.append(os.path.join(source, "*.parquet") if os.path.isdir(source) else source)
    version, state = _table_state(out)
    rebuild = state is not None and state["params"] != params
    if rebuild and not args.overwrite:
        raise ConfigError(f"{out} was built with {json.dumps(state['params'], sort_keys=True)}; pass --overwrite to rebuild it with these parameters")
    files = list_inputs(patterns)
    task_type = _task_type([f.path for f in files])
    old = {} if state is None or rebuild else state["files"]
    current = {f.key: f for f in files}
    batches_of: dict[str, list[int]] = {}
    touched: set[int] = set()
    for f in files:
        entry = old.get(f.key)
        if entry is not None and f.same_content(entry):
            batches_of[f.key] = entry["batches"]
            continue
        batches_of[f.key] = file_batches(f.path, f.metadata)
        touched |= set(batches_of[f.key])
        if entry is not None:
            touched |= set(entry["batches"])
    for key, entry in old.items():
        if key not in current:
            touched |= set(entry["batches"])
    new_state = {"params": params, "files": {
        k: {"size": f.size, "mtime": f.mtime, "footer": f.footer, "batches": batches_of[k]} for k, f in current.items()}}
    doc = {"output": out, "incremental": True, "input_files": len(files), "batches_rescanned": sorted(touched),
           "threshold": args.threshold, "ks": list(ks), "lamb": args.lamb, "beta_m": args.beta_m}
    if state is not None and not rebuild and not touched and new_state == state:
        doc.update(nothing_new=True, version=version, **_task_view_counts(out))
        return doc
    readers = sorted(current[k].path for k in current if set(batches_of[k]) & touched)
    import apache_beam as beam

    from rescore.transforms.task_stats import GROUP_STATS_FILE, SKIPPED, ComputeTaskStats

    options = _pipeline_options(beam_args)
    staging = os.path.abspath(os.path.join(out, TASK_STATS_VIEW, f"_staging-{os.getpid()}"))
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    if readers:
        with beam.Pipeline(options=options) as p:
            _ = (p | "Files" >> beam.Create(readers)
                 | "ComputeTaskStats" >> ComputeTaskStats(staging, task_type, args.threshold, ks, args.lamb, args.beta_m,
                                                          batches=frozenset(touched)))
    schema = ts.group_schema(task_type, ks, exact=True)
    group_path = os.path.join(staging, GROUP_STATS_FILE)
    groups = pq.read_table(group_path).cast(schema) if os.path.exists(group_path) else schema.empty_table()
    skipped_path = os.path.join(staging, SKIPPED)
    skipped = int(open(skipped_path).read()) if os.path.exists(skipped_path) else 0
    version = _commit(out, version, state is None, rebuild, touched, groups, new_state)
    shutil.rmtree(staging, ignore_errors=True)
    doc.update(version=version, rows_skipped=skipped, groups_rescanned=groups.num_rows, **write_task_view(out, ks, args.lamb, args.beta_m, task_type))
    return doc


def _commit(out: str, version: int | None, create: bool, rebuild: bool, touched: set[int], groups: pa.Table, state: dict) -> int:
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(state, separators=(",", ":"))}, max_commit_retries=0)
    uri = os.path.abspath(out)
    try:
        if create:
            write_deltalake(uri, groups, mode="error", commit_properties=props)
        else:
            dt = DeltaTable(uri, version=version)
            if rebuild:
                write_deltalake(dt, groups, mode="overwrite", schema_mode="overwrite", commit_properties=props)
            elif not touched:
                write_deltalake(dt, groups, mode="append", commit_properties=props)
            else:
                write_deltalake(dt, groups, mode="overwrite", predicate=f"batch IN ({', '.join(map(str, sorted(touched)))})",
                                commit_properties=props)
    except CommitFailedError:
        from rescore.errors import ConflictError

        raise ConflictError(f"another run committed to {out} while this one ran; this run published nothing: run it again") from None
    return DeltaTable(uri).version()


def write_task_view(out: str, ks: tuple[int, ...], lamb: float, beta_m: float | None, task_type: pa.DataType) -> dict:
    """_task_stats/task_stats.parquet (and task_batch_stats.parquet) of the table's current
    version, from its exact group state; written beside, renamed in (atomic), with the version."""
    from deltalake import DeltaTable

    from rescore.pipelines.load import load_scored

    version = DeltaTable(os.path.abspath(out)).version()
    groups = load_scored(out)
    by_task: dict = {}
    for row in groups.to_pylist():
        by_task.setdefault(row["task"], {})[row["batch"]] = ts.from_group_row(row)
    rows = sorted((ts.task_row(t, b, ks, lamb, beta_m) for t, b in by_task.items()), key=ts.sort_key)
    tasks = pa.Table.from_pylist(rows, schema=ts.task_schema(task_type, ks)).replace_schema_metadata(
        {"rescore.table_version": str(version)})
    group_view = groups.drop_columns([n for n, _ in ts.EXACT_COLUMNS])
    group_view = group_view.take(pa.array(sorted(range(group_view.num_rows), key=lambda i: ts.sort_key(
        {"task": group_view["task"][i].as_py(), "batch": group_view["batch"][i].as_py()})), pa.int64()))
    directory = os.path.join(out, TASK_STATS_VIEW)
    os.makedirs(directory, exist_ok=True)
    for name, table in ((TASK_BATCH_STATS, group_view), (TASK_STATS, tasks)):
        tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
        pq.write_table(table, tmp)
        os.replace(tmp, os.path.join(directory, name))
    return {"tasks": tasks.num_rows, "groups": groups.num_rows, "table_version": version}


def _task_view_counts(out: str) -> dict:
    path = os.path.join(out, TASK_STATS_VIEW, TASK_STATS)
    return {"tasks": pq.read_metadata(path).num_rows if os.path.exists(path) else 0}


def main(argv: list[str]) -> int:
    try:
        doc = run(argv)
    except (ConfigError, InputError, LockBusy) as e:
        print(f"rescore: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except RUN_FAILURES as e:
        print(f"rescore: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001  (a pipeline failure: one line; nothing was published)
        print(f"rescore: error: pipeline failed: {last_line(e)}", file=sys.stderr)
        return 1
    if "--quiet" not in argv and doc.get("incremental"):
        if doc.get("nothing_new"):
            print(f"rescore: nothing new for {doc['output']} (table version {doc['version']}): no input file is new, changed or gone",
                  file=sys.stderr)
        else:
            print(f"rescore: task statistics of {doc['tasks']:,} tasks ({doc['groups']:,} task-batch groups) -> {doc['output']} "
                  f"(table version {doc['table_version']}; rescanned {len(doc['batches_rescanned']):,} batches, "
                  f"{doc['groups_rescanned']:,} groups)", file=sys.stderr)
        if "prompt_list" in doc:
            print(f"rescore: {doc['prompt_list']['tasks']:,} tasks inside the band -> {doc['prompt_list']['path']}", file=sys.stderr)
    elif "--quiet" not in argv:
        print(f"rescore: task statistics of {doc['tasks']:,} tasks ({doc['groups']:,} task-batch groups, "
              f"{doc['rows_read'] - doc['rows_skipped']:,} rows; {doc['rows_skipped']:,} without a usable reward) "
              f"-> {doc['output']}", file=sys.stderr)
        if "prompt_list" in doc:
            print(f"rescore: {doc['prompt_list']['tasks']:,} tasks inside the band -> {doc['prompt_list']['path']}", file=sys.stderr)
    return 0
