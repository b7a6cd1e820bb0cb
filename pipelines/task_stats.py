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
import os
import shutil
import sys
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from rescore.errors import ConfigError, InputError
from rescore.transforms.files.layout import DELTA_LOG, SCORED_FILES, SUCCESS
from rescore.transforms.rows import task_stats as ts

STATS_JSON = "task_stats.json"
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
        if os.path.isdir(source) and (os.path.isdir(os.path.join(source, DELTA_LOG)) or os.path.exists(os.path.join(source, SUCCESS))):
            found = _output_files(source)
        elif os.path.isdir(source):
            if os.path.exists(os.path.join(source, "_staging")) or glob.glob(os.path.join(glob.escape(source), SCORED_FILES)):
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
            schema = pq.read_schema(f)
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
    bad = [a for a in beam_args if not a.startswith("--")]
    if bad:
        raise ConfigError(f"unexpected argument {bad[0]!r}")
    ks = _ks(args.k)
    if not 0 <= args.lamb <= 1:
        raise ConfigError(f"--lamb must be between 0 and 1, got {args.lamb}")
    if args.beta_m is not None and not args.beta_m > 0:
        raise ConfigError(f"--beta-m must be > 0, got {args.beta_m}")
    if args.threshold != args.threshold:
        raise ConfigError("--threshold must be a number")
    out = args.output
    if "://" in out:
        raise ConfigError("rescore task-stats writes a local --output")
    if os.path.exists(os.path.join(out, SUCCESS)) and not args.overwrite:
        raise ConfigError(f"{out} already holds finished task statistics; pass --overwrite to replace them")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--output {out} is a file")
    band = _band(args.band, args.prompt_list)
    files = resolve_inputs(args.input)
    task_type = _task_type(files)

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from rescore.transforms.task_stats import SKIPPED, TASK_STATS_FILE, GROUP_STATS_FILE, ComputeTaskStats

    try:
        options = PipelineOptions(beam_args)
        options.get_all_options(retain_unknown_options=False)
    except (SystemExit, Exception) as e:  # noqa: BLE001  (argparse inside Beam exits)
        raise ConfigError(f"bad Beam pipeline option in {' '.join(beam_args)}") from e
    staging = os.path.abspath(os.path.join(out, STAGING))
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
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
    rows = sum(pq.read_metadata(f).num_rows for f in files)
    doc = {
        "inputs": args.input, "input_files": len(files), "threshold": args.threshold, "ks": list(ks),
        "lamb": args.lamb, "beta_m": args.beta_m, "rows_read": rows, "rows_skipped": skipped,
        "tasks": tasks, "groups": groups, "output": out,
    }
    with open(os.path.join(staging, STATS_JSON), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    publish(staging, out, [TASK_STATS_FILE, GROUP_STATS_FILE, STATS_JSON])
    if band is not None:
        doc["prompt_list"] = {"path": args.prompt_list, "tasks": write_prompt_list(
            os.path.join(out, TASK_STATS_FILE), args.prompt_list, *band)}
    return doc


def _band(text: str | None, prompt_list: str | None) -> tuple[float, float] | None:
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
    return lo, hi


def write_prompt_list(table_path: str, path: str, lo: float, hi: float) -> int:
    """The ids of the tasks with lo < pass_rate < hi, one per line, written to a temporary file
    beside `path` and renamed over it (never half-written). Returns how many."""
    import pyarrow.compute as pc

    table = pq.read_table(table_path, columns=["task", "pass_rate"])
    kept = table.filter(pc.and_(pc.greater(table["pass_rate"], lo), pc.less(table["pass_rate"], hi)))["task"].to_pylist()
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(f"{t}\n" for t in kept)
    os.replace(tmp, path)
    return len(kept)


def publish(staging: str, out: str, names: list[str]) -> None:
    """Move the staged files in (each rename atomic), then _SUCCESS last; an earlier _SUCCESS
    goes first, so a reader never sees a mix of two runs under _SUCCESS."""
    success = os.path.join(out, SUCCESS)
    if os.path.exists(success):
        os.remove(success)
    for name in names:
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    shutil.rmtree(staging, ignore_errors=True)
    with open(success, "w"):
        pass


def main(argv: list[str]) -> int:
    try:
        doc = run(argv)
    except (ConfigError, InputError) as e:
        print(f"rescore: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if "--quiet" not in argv:
        print(f"rescore: task statistics of {doc['tasks']:,} tasks ({doc['groups']:,} task-batch groups, "
              f"{doc['rows_read'] - doc['rows_skipped']:,} rows; {doc['rows_skipped']:,} without a usable reward) "
              f"-> {doc['output']}", file=sys.stderr)
        if "prompt_list" in doc:
            print(f"rescore: {doc['prompt_list']['tasks']:,} tasks inside the band -> {doc['prompt_list']['path']}", file=sys.stderr)
    return 0
