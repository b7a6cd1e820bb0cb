"""The names of an output directory's files: the layout docs/output.md promises, in one place.

    OUTPUT/
      scored-UUUUU-of-NNNNN[-part-PPP].parquet   scored rows, one file (or parts) per read unit
      filtered-UUUUU-of-NNNNN.parquet            rows a filter stage dropped, with the reason
      rejected-UUUUU-of-NNNNN.parquet            rows rejected as bad input, with the reason
      metrics.json                               counts and statistics of the run
      _SUCCESS                                   written last: every row is accounted for
      _staging/                                  files of the run in progress (removed at the end)
      _failed/                                   a run over its reject budget beside a finished one
      _rescore_files.json                        the names Rescore published (what it owns)
      _rescore.lock                              the output lock (transforms/files/lock.py)
      _source/ with _RESCORE_SOURCE              staged input of a database or verl-dump run
      report.html, report-NAME.png               `rescore report`
    An --incremental output is a Delta table instead: _delta_log/, delta-rs data files and
    _rescore/ (its runs' work, pipelines/incremental.py; the table: transforms/files/delta_table.py).

Names only: nothing here touches storage, so even the output reader (`rescore.load_scored`, files/scored.py; no Beam) uses it.
"""

from __future__ import annotations

import enum

SUCCESS = "_SUCCESS"
METRICS = "metrics.json"
STAGING = "_staging"
FAILED = "_failed"
LEDGER = "_rescore_files.json"
LOCK = "_rescore.lock"
DELTA_LOG = "_delta_log"
INCREMENTAL_WORK = "_rescore"
SOURCE_DIR = "_source"
SOURCE_MARK = "_RESCORE_SOURCE"
"""Written by Rescore into OUTPUT/_source/ when it creates it: only then is the directory Rescore's."""

TASK_STATS = "task_stats.parquet"
TASK_BATCH_STATS = "task_batch_stats.parquet"
TASK_STATS_VIEW = "_task_stats"
"""An incremental task-stats table keeps its per-task view in OUTPUT/_task_stats/."""


def task_stats_table(path: str) -> str:
    """The task_stats.parquet of a `rescore task-stats` output: a directory, an incremental
    table (its _task_stats/task_stats.parquet) or the file itself."""
    import os

    if os.path.isdir(os.path.join(path, DELTA_LOG)):
        return os.path.join(path, TASK_STATS_VIEW, TASK_STATS)
    return os.path.join(path, TASK_STATS) if os.path.isdir(path) else path


TASK_STATS_JSON = "task_stats.json"
EXPORT_JSON = "export.json"
EXPORT_FILES = ("sft.parquet", "sft.jsonl", "dpo.parquet", "dpo.jsonl")


class Kind(enum.Enum):
    """The kinds of output Rescore's commands write, each in the words a refusal names it by."""

    SCORED = "a scored run (written by `rescore --output`)"
    TASK_STATS = "a task-stats output (written by `rescore task-stats`)"
    EXPORT = "an export (written by `rescore export`)"


def output_kind(names) -> Kind | None:
    """Which of Rescore's commands wrote the directory holding `names`, by the files only that
    command writes; None for none of them. An incremental table (_delta_log) is not one of these: each command says itself what it does with one."""
    names = set(names)
    if TASK_STATS_JSON in names or TASK_STATS in names or TASK_BATCH_STATS in names:
        return Kind.TASK_STATS
    if EXPORT_JSON in names or names & set(EXPORT_FILES):
        return Kind.EXPORT
    if LEDGER in names or (METRICS in names and SUCCESS in names and any(n.startswith("scored-") for n in names)):
        return Kind.SCORED  # its file list, or (written before the list existed) a finished run's files
    return None


def other_output(names, wanted: Kind) -> str | None:
    """The words for the output another Rescore command wrote into a directory holding `names`
    ("a task-stats output (written by `rescore task-stats`)"), where `wanted` is about to write
    there; None where the directory is none or `wanted`'s own."""
    kind = output_kind(names)
    return kind.value if kind is not None and kind != wanted else None


def other_output_message(directory: str, found: str) -> str:
    """The refusal for a command whose --output holds another command's output `found`."""
    return f"--output {directory} holds {found}: each command writes to a directory of its own; pick another --output"


SCORED_FILES = "scored-*.parquet"
FILTERED_FILES = "filtered-*.parquet"
REJECTED_FILES = "rejected-*.parquet"

REPORT_HTML = "report.html"
REPORT_CHARTS = "report-*.png"

DATA_NAMES = (SCORED_FILES, REJECTED_FILES, FILTERED_FILES)
"""Data files a run writes: one Rescore did not write would be read with the run's own."""
RUN_NAMES = (METRICS, SUCCESS, STAGING, FAILED)
REPORT_NAMES = (REPORT_HTML, REPORT_CHARTS)
"""What `rescore report` writes into an output (pipelines/report.py)."""
RESCORE_NAMES = (*DATA_NAMES, *RUN_NAMES, *REPORT_NAMES)
"""Names Rescore writes: in a directory Rescore does not own, any of them is a clash; in an
output from before the ledger existed, all of them are Rescore's."""


def scored_file(unit: int, units: int, part: int | None = None) -> str:
    """The scored rows of read unit `unit` (of `units`), or their part `part`."""
    return _data_file("scored", unit, units, "" if part is None else f"-part-{part:03d}")


def filtered_file(unit: int, units: int) -> str:
    return _data_file("filtered", unit, units)


def rejected_file(unit: int, units: int) -> str:
    return _data_file("rejected", unit, units)


def _data_file(kind: str, unit: int, units: int, suffix: str = "") -> str:
    return f"{kind}-{unit:05d}-of-{units:05d}{suffix}.parquet"


def report_chart(name: str) -> str:
    return f"report-{name}.png"


TABLE_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
"""--output-table: a Trinity buffer name Rescore writes (letters, digits, underscores, not
starting with a digit), the same rule on every database (transforms/sql_database.py)."""
TABLE_NAME_MAX = 58
"""PostgreSQL keeps 63 bytes of an identifier (NAMEDATALEN - 1) and truncates the rest; a
buffer is NAME and NAME_blob, so NAME has at most 63 - len("_blob") characters."""


def table_name_problem(table: object, flag: str = "--output-table") -> str | None:
    """Why `table` is not a buffer name Rescore writes (one line), or None."""
    import re

    if not isinstance(table, str) or not re.fullmatch(TABLE_NAME_PATTERN, table):
        return (
            f"{flag} {table!r} is not a table name Rescore writes: use letters, digits and underscores, "
            "not starting with a digit (e.g. experience_rescored)"
        )
    if len(table) > TABLE_NAME_MAX:
        return (
            f"{flag} {table!r} has {len(table)} characters, more than {TABLE_NAME_MAX}: the buffer is "
            f"{table}_blob too, and PostgreSQL keeps 63 bytes of a name"
        )
    return None


def staging_dir(output: str) -> str:
    from rescore.transforms.files import storage  # storage imports Beam; the names above do not

    return storage.join(output, STAGING)


def part_bounds(rows: int, shard_rows: int) -> list[int]:
    """Row boundaries of ceil(rows / shard_rows) consecutive parts of about equal size
    ([0, rows] for a single part): the output parts of a read unit, and the read units (slices) of
    a row group larger than --shard-rows (transforms/input_plan.file_units)."""
    parts = max(1, -(-rows // shard_rows))
    return [rows * k // parts for k in range(parts + 1)]
