"""pass_rate_band on hand-made groups: the open band's edges, per group and from a task-stats
table (a task missing from it kept or dropped by `unseen`); the table read by the launcher
(pipelines/task_history.py), never by the strategy."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rescore.errors import ConfigError as RunConfigError
from rescore.pipelines import task_history
from rescore.transforms.rows.keys import task_hash
from rescore.transforms.rows.task_stats import history_rates
from rescore.transforms.strategies.filters import TASK_HISTORY_COLUMN
from rescore.transforms.strategies import ConfigError, chain_of, create
from rescore.transforms.strategies.base import GroupedRows


def _rows(groups, task_stats=None):
    """groups: [(task, [rewards])] -> GroupedRows, one batch; with `task_stats`, each row's
    task pass rate from that table as the row layer matches it (rows/task_stats.py)."""
    reward = [r for _, rs in groups for r in rs]
    sizes = [len(rs) for _, rs in groups]
    tasks = pa.array([t for t, rs in groups for _ in rs], pa.int64())
    n = len(reward)
    return GroupedRows(
        reward=torch.tensor(reward, dtype=torch.float64), offsets=torch.tensor(np.concatenate([[0], np.cumsum(sizes)])),
        batch=torch.zeros(n, dtype=torch.int64), run=torch.arange(n), step=torch.zeros(n, dtype=torch.int64),
        action_tokens=torch.ones(n, dtype=torch.int64), task_key=torch.as_tensor(task_hash(tasks).view(np.int64)),
        columns={} if task_stats is None else {TASK_HISTORY_COLUMN: torch.as_tensor(
            history_rates(tasks, task_history.read(task_stats, "pass_rate_band")))})


GROUPS = [(1, [1, 0, 0, 0]), (2, [1, 1, 0, 0]), (3, [1, 1, 1, 0]), (4, [1, 1, 1, 1]), (5, [0.5, 0.5, 0.5, 0.5])]


def test_per_group_band_is_open_at_both_ends():
    keep = create("pass_rate_band", {"lo": 0.25, "hi": 0.75}).score(_rows(GROUPS), None).keep
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 12  # p = 0.25, 0.5, 0.75, 1, 0
    keep = create("pass_rate_band", {"lo": 0.0, "hi": 1.0, "threshold": 0.5}).score(_rows(GROUPS), None).keep
    assert keep.tolist() == [True] * 12 + [False] * 8  # p = 0.25, 0.5, 0.75 kept; 1 and 1 (0.5 >= 0.5) dropped


@pytest.mark.parametrize("unseen", ["keep", "drop"])
def test_history_band_reads_the_table(tmp_path, unseen):
    pq.write_table(pa.table({"task": pa.array([1, 2, 3, 4], pa.int64()), "pass_rate": [0.9, 0.5, 0.1, 0.3]}),
                   tmp_path / "task_stats.parquet")
    s = create("pass_rate_band", {"lo": 0.2, "hi": 0.6, "task_stats": str(tmp_path), "unseen": unseen})
    keep = s.score(_rows(GROUPS, str(tmp_path)), None).keep.tolist()
    assert keep == [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4 + [unseen == "keep"] * 4


def test_bad_bands_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="lo < hi"):
        create("pass_rate_band", {"lo": 0.5, "hi": 0.5})
    with pytest.raises(ConfigError, match="between 0 and 1"):
        create("pass_rate_band", {"hi": 1.5})


def test_the_launcher_reads_the_table_before_the_run(tmp_path):
    """The strategy only names the table (creating it touches no file); the launcher resolves
    the chain's task-history needs (filters.TaskHistory) into numbers, or refuses the run in one line."""
    missing = chain_of("pass_rate_band,grpo", {"pass_rate_band.task_stats": str(tmp_path / "nowhere")})
    assert missing.stage("filter").task_stats == str(tmp_path / "nowhere")
    with pytest.raises(RunConfigError, match=r"^pass_rate_band: task_stats '.*nowhere' is not a `rescore task-stats` output"):
        task_history.resolve(missing)
    assert task_history.resolve(chain_of("pass_rate_band,grpo", {})) == {}

    pq.write_table(pa.table({"task": ["a", "b", "a"], "pass_rate": [0.1, 0.2, 0.3]}), tmp_path / "task_stats.parquet")
    twice = chain_of("pass_rate_band", {"task_stats": str(tmp_path)})
    with pytest.raises(RunConfigError, match=r"^pass_rate_band: task_stats '.*': .*task 'a' is listed more than once"):
        task_history.resolve(twice)
    pq.write_table(pa.table({"task": ["b", "a"], "pass_rate": [0.2, None]}), tmp_path / "task_stats.parquet")
    (path, history), = task_history.resolve(twice).items()
    assert path == str(tmp_path) and history.tasks.to_pylist() == ["b", "a"]
    rates = history_rates(pa.array(["a", "c", "b", "b"]), history)
    assert np.isnan(rates[0]) and np.isnan(rates[1]) and rates[2:].tolist() == [0.2, 0.2]
    (tmp_path / "task_stats.parquet").write_bytes(b"not parquet")
    with pytest.raises(RunConfigError, match=r"^pass_rate_band: task_stats '.*': "):
        task_history.resolve(twice)
