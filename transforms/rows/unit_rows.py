"""Input rows as the strategies read them, as numpy: `ArrowRows` (the WrittenRows view of a table,
strategies/base.py) and `UnitRows` (a read unit's valid rows with what validation measured: the
FeatureRows a stage's Feature computes its light columns from, strategies/features.py). Arrow
and numpy only (no torch: the read path imports it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rescore.schemas.lists import flat_list
from rescore.transforms.rows.response import response_lengths
from rescore.transforms.rows.task_stats import TaskPassRates, history_rates
from rescore.transforms.strategies.flat import TokenColumn


class ArrowRows:
    """A table's rows as the `WrittenRows` numpy view a strategy reads."""

    def __init__(self, table: pa.Table):
        self._table = table
        self.names = table.column_names
        self.num_rows = table.num_rows

    def scalar(self, name: str) -> np.ndarray:
        return self._table[name].to_numpy(zero_copy_only=False)

    def tokens(self, name: str) -> TokenColumn:
        fl = flat_list(self._table[name])
        return TokenColumn(fl.offsets, fl.values.to_numpy(zero_copy_only=False))

    def response(self) -> tuple[np.ndarray, np.ndarray]:
        lengths, mask = response_lengths(self._table)
        if mask is not None:
            return lengths, np.asarray(mask, dtype=np.float64)
        return lengths, np.ones(int(lengths.sum()), dtype=np.float64)


class UnitRows(ArrowRows):
    """The valid rows of one read unit, as a Feature reads them (FeatureRows): `valid` (the
    rows), their response lengths as validation measured them, the flat action_mask values
    (None without an action_mask column), their task ids (as the light rows carry them) and the
    task-stats tables the launcher read (by path)."""

    def __init__(self, valid: pa.Table, response_length: np.ndarray, mask_raw: np.ndarray | None, task: pa.Array,
                 task_history: dict[str, TaskPassRates] | None = None):
        super().__init__(valid)
        self._response_length = response_length
        self._mask_raw = mask_raw
        self._mask_values = None
        self._task = task
        self._task_history = task_history or {}

    def response_lengths(self) -> np.ndarray:
        return self._response_length

    def action_values(self) -> np.ndarray | None:
        if self._mask_raw is not None and self._mask_values is None:
            self._mask_values = np.asarray(self._mask_raw, dtype=np.float64)
        return self._mask_values

    def task_history(self, path: str) -> np.ndarray:
        """Each row's task pass rate in the `rescore task-stats` table at `path` (NaN: not
        there), from the numbers the launcher read before the run (pipelines/task_history.py):
        no read step opens the file."""
        if path not in self._task_history:
            raise ValueError(f"task_stats {path!r}: the launcher resolves the table before the run (pipelines/task_history.py)")
        return history_rates(self._task, self._task_history[path])
