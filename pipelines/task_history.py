"""pass_rate_band's history (`--set pass_rate_band.task_stats=PATH`), resolved by the launcher.

The filter asks for each row's task pass rate (its need, a filters.TaskHistory of PATH); the
table behind PATH is read here, once, before any work, and its numbers (rows/task_stats.py
TaskPassRates) go to the read step, which matches each row's task against them. The strategies
never touch a file, and no worker reads the table: a missing, unreadable or ambiguous table is
exit 2, one line, before anything is read or written.
"""

from __future__ import annotations

import os

from rescore.errors import ConfigError, first_line
from rescore.transforms.files.layout import task_stats_table
from rescore.transforms.rows.task_stats import TaskPassRates
from rescore.transforms.strategies.filters import TaskHistory


def resolve(scoring) -> dict[str, TaskPassRates]:
    """{PATH: its TaskPassRates} for every task-history need (filters.TaskHistory) of the run's
    stages (a StrategyChain); {} where no stage has one. ConfigError (naming the stage) where a
    table is missing, unreadable or lists a task twice."""
    found: dict[str, TaskPassRates] = {}
    for need in scoring.needs:  # what the read step is asked for
        if isinstance(need, TaskHistory) and need.path not in found:
            stage = next((s.name for s in scoring.stages if need in getattr(s, "needs", ())), "pass_rate_band")
            found[need.path] = read(need.path, stage)
    return found


def read(path: str, stage: str) -> TaskPassRates:
    """The task pass rates of the `rescore task-stats` output at `path` (its directory, an
    incremental table's view, or task_stats.parquet itself; an object store's URL as pyarrow
    reads it)."""
    import pyarrow.parquet as pq

    table_path = task_stats_table(path)
    if "://" not in path and not os.path.isfile(table_path):
        raise ConfigError(f"{stage}: task_stats {path!r} is not a `rescore task-stats` output (no task_stats.parquet)")
    try:
        return TaskPassRates.of(pq.read_table(table_path, columns=["task", "pass_rate"]), table_path)
    except ValueError as e:  # a task listed twice; pyarrow's ArrowInvalid (a column missing, not Parquet) is one too
        raise ConfigError(f"{stage}: task_stats {path!r}: {first_line(e)}") from None
    except OSError as e:
        raise ConfigError(f"{stage}: task_stats {path!r} cannot be read ({first_line(e)})") from None
