"""`group_filter` (`--group-filter MODULE:FUNCTION`): a user's function decides, group by group,
which task groups a run keeps.

The function is called once per group with one argument, a dict of numpy arrays over the group's
rows (sorted by run, step) as the filter stage sees them:

    batch           int, the group's batch
    task_key        int, a fixed 64-bit hash of the task id (the same in every run)
    run, step       (n,) int64
    reward          (n,) float64, after any reward shaping
    action_tokens   (n,) int64 action tokens of each row
    response_length (n,) int64 response tokens of each row
    NAME            (n,) float64 for each column in `columns` (a null is NaN)

and returns True to keep the group, False to drop it, or (keep, reason) to say why (the
--keep-filtered `filter_reason` is then `group_filter: REASON`). A function that raises, or
returns anything else, drops that group with the error as its reason; the run goes on. A spec
that does not import is refused where the run starts, like --reward-fn's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rescore.errors import first_line
from rescore.transforms.strategies.base import GroupedRows, Scores
from rescore.transforms.strategies.features import OptionalColumn
from rescore.transforms.strategies.registry import FILTER, Column, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats, per_row
from rescore.transforms.strategies.tensors import torch
from rescore.user_code import load_function

if TYPE_CHECKING:
    from torch import Tensor

GROUP_FILTER_FLAG = "--group-filter"

def load_group_filter(spec: str) -> Callable[[dict[str, Any]], Any]:
    """'package.module:function' -> the function; ConfigError (one line) otherwise (Python's
    module cache makes a second load a lookup)."""
    return load_function(spec, GROUP_FILTER_FLAG)


def group_decision(fn: Callable[[dict[str, Any]], Any], group: dict[str, Any]) -> tuple[bool, str | None]:
    """(keep, reason or None) of one group; the function's own errors drop the group."""
    try:
        result = fn(group)
    except Exception as e:
        return False, f"raised {type(e).__name__}: {first_line(e, blank='')}"[:300]
    reason = None
    if isinstance(result, tuple) and len(result) == 2 and (result[1] is None or isinstance(result[1], str)):
        result, reason = result
    if not isinstance(result, (bool, np.bool_)):
        return False, f"returned {type(result).__name__}, expected bool or (bool, reason)"
    return bool(result), reason


@dataclass(frozen=True)
class GroupFilterParams(StrategyParams):
    function: str | None = param(
        None,
        help="MODULE:FUNCTION, imported where the run starts (a bad one: exit 2) and on each worker; none keeps "
             "every group",
    )
    columns: tuple[Column, ...] = param(
        (),
        help="number columns passed to the function besides the ids and the reward (a null crosses as NaN)",
    )

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if values["function"] is not None:
            from rescore.user_code import load_function  # the run's start: a bad spec is exit 2 here

            load_function(values["function"], GROUP_FILTER_FLAG)


@register("group_filter", kind=FILTER, summary="a user function MODULE:FUNCTION over each group's rows returns keep (or (keep, reason)); --group-filter")
class GroupFilter(GroupFilterParams):
    batch_level = False

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(OptionalColumn(c) for c in self.columns)

    def _decide(self, rows: GroupedRows) -> tuple[np.ndarray, list[str | None]]:
        """(G,) keep and (G,) reasons of each group."""
        g_count = rows.num_groups
        if self.function is None:
            return np.ones(g_count, dtype=bool), [None] * g_count
        fn = load_group_filter(self.function)
        offsets = rows.offsets.cpu().numpy()
        arrays = {
            "run": rows.run, "step": rows.step, "reward": rows.reward, "action_tokens": rows.action_tokens,
            "response_length": rows.response_length if rows.response_length is not None else rows.action_tokens,
            **{c: rows.columns[c].to(torch.float64) for c in self.columns},
        }
        arrays = {k: v.cpu().numpy() for k, v in arrays.items()}
        batch = rows.batch.cpu().numpy()
        task = rows.task_key.cpu().numpy() if rows.task_key is not None else np.zeros(rows.num_rows, np.int64)
        keep = np.ones(g_count, dtype=bool)
        reasons: list[str | None] = [None] * g_count
        for g in range(g_count):
            lo, hi = int(offsets[g]), int(offsets[g + 1])
            group = {"batch": int(batch[lo]), "task_key": int(task[lo]), **{k: v[lo:hi].copy() for k, v in arrays.items()}}
            keep[g], reasons[g] = group_decision(fn, group)
        return keep, reasons

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep, _ = self._decide(rows)
        return Scores(None, per_row(torch.as_tensor(keep, device=rows.reward.device), rows.offsets), *group_stats(rows.reward, rows.offsets))

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, reasons = self._decide(rows)  # the function again, for the rows being explained
        g = np.repeat(np.arange(rows.num_groups), np.diff(rows.offsets.cpu().numpy()))
        return [f"{self.name}: {reasons[g[i]] or f'{self.function} dropped the group'}" for i in dropped]
