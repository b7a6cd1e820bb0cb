"""The two ways a stage asks for an input column beyond reading it as it is: as a number that
may be missing (OptionalColumn) or null (NullableColumn). The schema check (schemas/) and the
read (transforms/rows/keys.py) understand them; the strategies name them in `needs`
(transforms/strategies/features.py says what else a need can be). Plain frozen dataclasses:
hashable, picklable, equal where their columns are; no numpy, no pyarrow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptionalColumn:
    """The number column `name` where a file has it: light column x.NAME, float64, NaN where
    the file has no such column or the row holds a null (a missing value, never 0)."""

    name: str


@dataclass(frozen=True)
class NullableColumn:
    """The number column `name`, which every file must have (the schema check); a null crosses
    as NaN (a value that abstains, e.g. normalize_then_sum's reward columns)."""

    name: str


def column_of(need: object) -> str | None:
    """The input column a need reads: a column name itself, an OptionalColumn's or a
    NullableColumn's name; None for a need computed from the columns (a Feature) or a marker."""
    if isinstance(need, str):
        return need
    if isinstance(need, (OptionalColumn, NullableColumn)):
        return need.name
    return None


def required_column(need: object) -> str | None:
    """The input column every file must have for this need: a column name, or a
    NullableColumn's name; None otherwise (an OptionalColumn is used where present)."""
    if isinstance(need, str):
        return need
    if isinstance(need, NullableColumn):
        return need.name
    return None
