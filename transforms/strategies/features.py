"""What a stage needs from a row, as objects. A stage's `needs` (and `needs_after`, `needs_in`)
is a tuple of:

- a column name (str): an input column every file must have, read as it is (light column x.NAME
  where it is a scalar);
- OptionalColumn(NAME) / NullableColumn(NAME) (rescore/needs.py): a number column that may be
  missing / null, read as float64 with NaN;
- a Feature: light columns computed from a read unit's valid rows where they are read (before
  the shuffle). The stage's own module defines its Feature as a frozen dataclass holding what
  the computation depends on (the stage itself, a parameter): hashable, picklable (Beam pickles
  the read with it) and equal exactly where the computation is the same (a chain lists a
  feature once). Its `light(rows)` returns {NAME: values}; the row layer (rows/keys.py) writes
  each as light column x.NAME. The row layer knows no stage: it calls `light`.
- WHOLE_BATCH: no column; every row of a batch goes to one shuffle bucket.

The features today: repetition.NgramRepeat, reinforce_pp.DiscountSums, offpolicy.CorrectionMasks,
token_baseline.PathVariance and ClipBSums, shaping.KLSums, filters.TaskHistory.

No torch, no numpy: option parsing imports it too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rescore.needs import NullableColumn, OptionalColumn  # noqa: F401  (re-exported: what stages name)

if TYPE_CHECKING:
    import numpy as np

    from rescore.transforms.strategies.flat import TokenColumn


class FeatureRows(Protocol):
    """The valid rows of one read unit as a Feature reads them (rows/unit_rows.py builds it): the
    WrittenRows view of their input columns (strategies/base.py) and what validation measured."""

    names: tuple[str, ...]
    num_rows: int

    def scalar(self, name: str) -> np.ndarray:
        """(n,) a scalar column."""

    def tokens(self, name: str) -> TokenColumn:
        """A list column, flat."""

    def response(self) -> tuple[np.ndarray, np.ndarray]:
        """(response lengths (n,) int64, flat 0/1 action mask (T,) float64), WrittenRows.response."""

    def response_lengths(self) -> np.ndarray:
        """(n,) int64 each row's response length as validation measured it."""

    def action_values(self) -> np.ndarray | None:
        """(T,) float64 the flat 0/1 action_mask values of the rows, or None without an
        action_mask column (every response token is an action token)."""

    def task_history(self, path: str) -> np.ndarray:
        """(n,) float64 the pass rate of each row's task in the `rescore task-stats` output at
        `path`, matched by the task's exact value (NaN: the task is not in the table)."""


class Feature:
    """Light columns a stage computes from a read unit's valid rows (see the module doc).
    Subclasses are frozen dataclasses defined in the stage's module."""

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray | TokenColumn]:
        """{NAME: (n,) values or a TokenColumn of n rows}: light columns x.NAME (float64, or
        list<float64> for a TokenColumn, which then crosses the shuffle as a token feature)."""
        raise NotImplementedError(type(self).__name__)


@dataclass(frozen=True)
class WholeBatch(Feature):
    """A need with no column: every row of a batch goes to one shuffle bucket (a stage whose
    statistics pool a whole batch, e.g. gigpo with anchor_scope batch)."""

    def light(self, rows: FeatureRows) -> dict:
        return {}


WHOLE_BATCH = WholeBatch()
