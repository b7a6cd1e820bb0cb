"""The run options, declared once: each is a field of a frozen dataclass whose metadata says how
it is given (flags, --config YAML key, help, check). The settings the Beam steps take are
`StepSettings`; the entry points' own options extend it (pipelines/options.py: `RunConfig`),
and the parser, `--help`, the YAML checks and early.py's plain-run flags are generated from the
two (pipelines/options.py). A step gets one `StepSettings` (primitives only: it is pickled to the
workers) and reads its attributes; nothing here imports Beam or pipelines/.

To add an option the steps read: a field here, `option(default, help=...)` with a `check` where
not every value of its type is valid; the flag (`--name-with-dashes`, also `--name_with_underscores`),
the YAML key (the field's name) and the typed value come from the field. An option only the
launcher reads goes to pipelines/options.py the same way; one only a door reads, to the door's
options class (pipelines/doors/: `Door.options`).
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

DEFAULT_BUCKETS = 64
LOCAL_BUCKET_ROWS = 131072
"""In-process runs without --buckets: one bucket per this many rows, 8 to DEFAULT_BUCKETS. The
score step runs its buckets one after another there, so more buckets only add per-bucket
overhead (a 204,800-row run: 8 buckets ~6 % faster than 64); the scores do not depend on it."""
DEFAULT_SHARD_ROWS = 65536
DEFAULT_MAX_REJECT_FRACTION = 0.5
DEFAULT_MAX_GROUP_ROWS = 1_000_000
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Option:
    """How one run option is given (a field's metadata["option"]; see `option`)."""

    help: str | Callable[[], str]
    """--help's text; a function where it lists what is known only at parse time (strategy names)."""
    flags: tuple[str, ...] | None = ()
    """() : `--name-with-dashes` (and `--name_with_underscores` where the name has one); None :
    no flag of its own."""
    yaml: str | None = ""
    """The --config YAML key; "" : the field's name; None : the command line only."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    repeat: bool = False
    """The flag may be given more than once (argparse's action="append")."""
    check: Callable[[str, Any], str | None] | None = None
    """(flag, value) -> why the value is refused (one line), or None."""
    yaml_check: Callable[[str, Any], str | None] | None = None
    """(key, YAML value) -> why it is refused, where the field's type alone does not say."""
    env: str | None = None
    """An environment variable that sets the default (read in pipelines/options.py, only there)."""
    dest: str | None = None
    """argparse's dest, where it is not the field's name (--input -> `input`, the field `inputs`)."""
    plain: bool = False
    """A command line with it may still have its first read units decoded before Beam and
    torch import (pipelines/early.py): it changes neither what is read nor where."""
    parse: Callable[[str], Any] | None = None
    """argparse's type=, where the field's type is not enough (its ArgumentTypeError is the
    option's one error line)."""


def option(default: Any = MISSING, *, help: str | Callable[[], str], default_factory: Any = MISSING, **how) -> Any:
    """A field of a run option: its default and how it is given (Option's fields as keywords)."""
    return field(default=default, default_factory=default_factory, metadata={"option": Option(help=help, **how)})


def spec(f: Field) -> Option | None:
    """The field's Option, or None for a field that is not given by the user (derived)."""
    return f.metadata.get("option")


def flags_of(f: Field) -> tuple[str, ...]:
    o = spec(f)
    if o is None or o.flags is None:
        return ()
    if o.flags:
        return o.flags
    dashed = "--" + f.name.replace("_", "-")
    return (dashed,) if "_" not in f.name else (dashed, "--" + f.name)


def yaml_key(f: Field) -> str | None:
    o = spec(f)
    if o is None or o.yaml is None:
        return None
    return o.yaml or f.name


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def value_type(cls: type, f: Field) -> type:
    """The field's value type, less `| None` (int for `int | None`, list for `list[str]`)."""
    hint = _hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = kinds[0] if len(kinds) == 1 else hint
    return typing.get_origin(hint) or hint


def options(cls: type) -> list[Field]:
    """The fields of `cls` that are run options, in declaration order."""
    return [f for f in fields(cls) if spec(f) is not None]


# --- checks: (flag, value) -> the one-line reason it is refused, or None ----------------------


def positive_int(flag: str, value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return f"{flag} must be a positive integer, got {value!r}"
    return None


def _fraction(flag: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return f"{flag} must be a number from 0 to 1, got {value!r}"
    return None


def _threads(flag: str, value: Any) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return f"{flag} must be 0 (one per core) or a positive integer, got {value!r}"
    return None


def one_of(flag: str, value: Any, choices: tuple[str, ...], what: str) -> str | None:
    if value not in choices:
        return f"{what} must be one of {', '.join(choices)}, got {value!r}"
    return None


def seconds_arg(text: str) -> float:
    """A flag's value as a finite number of seconds >= 0 (an `Option.parse`): argparse's own
    one-line message otherwise."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number of seconds >= 0 (0: no limit), got {text!r}") from None
    if not (0.0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expects a number of seconds >= 0 (0: no limit), got {text!r}")
    return value


MAX_MEGABYTES = (1 << 43) - 1
"""The largest MB value a memory option takes: just under 2**63 bytes (more does not fit a byte count)."""


def megabytes(flag: str, value: Any) -> str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0.0 <= value < math.inf):
        return f"{flag} must be a number of MB >= 0 (0: off), got {value!r}"
    if value is not None and value > MAX_MEGABYTES:
        return f"{flag} must be at most {MAX_MEGABYTES:,} MB (8 EiB), got {value!r}"
    return None


def budget_megabytes(flag: str, value: Any) -> str | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0.0 < value < math.inf):
        return f"{flag} must be a number of MB > 0, got {value!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    """The run options the Beam steps read (ReadExperiences, ScoreGroups, WriteScored,
    Finalize, ComputeModelColumns), one frozen object pickled to every worker."""

    buckets: int = option(
        DEFAULT_BUCKETS, plain=True, check=positive_int,
        help=f"shuffle buckets (default {DEFAULT_BUCKETS}; in-process: one per {LOCAL_BUCKET_ROWS:,} rows, 8 to {DEFAULT_BUCKETS})",
    )
    shard_rows: int = option(
        DEFAULT_SHARD_ROWS, plain=True, check=positive_int,
        help=f"rows per read unit, the unit of work: each unit's scored rows are one output file, "
        f"an SQL buffer is read in id ranges of as many rows (default {DEFAULT_SHARD_ROWS}; docs/scaling.md)",
    )
    max_reject_fraction: float = option(
        DEFAULT_MAX_REJECT_FRACTION, plain=True, check=_fraction,
        help=f"fail (no _SUCCESS) when more than this fraction of rows is rejected (default {DEFAULT_MAX_REJECT_FRACTION})",
    )
    max_group_rows: int = option(
        DEFAULT_MAX_GROUP_ROWS, plain=True, check=positive_int,
        help=f"fail with a clear message when one task group has more rows (default {DEFAULT_MAX_GROUP_ROWS:,})",
    )
    io_threads: int = option(
        0, plain=True, check=_threads,
        help="read units each worker reads, validates or writes at once (default 0: one per core, at most 4)",
    )
    device: str = option(
        "auto", plain=True, choices=DEVICES, check=lambda flag, v: one_of(flag, v, DEVICES, "device"),
        help="where the torch math runs (default auto: cuda if torch sees a GPU)",
    )
    accelerator: str | None = option(
        None, metavar="SPEC",
        help="accelerator resource hint for the scoring and writing steps, e.g. 'type:nvidia-l4;count:1;install-nvidia-driver'",
    )
    keep_filtered: bool = option(
        False, plain=True, help="write the rows a filter drops to filtered-*.parquet, each with a filter_reason (stage, statistic, threshold)",
    )
    audit_columns: bool = option(
        False, plain=True, help="add to every scored row the numbers its score came from: group_size, group_reward_mean, "
        "group_reward_std, batch_reward_std, baseline",
    )
    unit_cache_mb: float | None = option(
        None, plain=True, metavar="MB", check=megabytes, env="RESCORE_UNIT_CACHE_MB",
        help="MB of decoded read units an in-process run keeps for its write step (default: 1/8 of memory, "
        "at most 3,072; 0: off; the environment's RESCORE_UNIT_CACHE_MB sets the default)",
    )
    read_ahead_mb: float | None = option(
        None, plain=True, metavar="MB", check=megabytes, env="RESCORE_READ_AHEAD_MB",
        help="MB the read-ahead may hold beyond --unit-cache-mb (default: a sixth of it; 0: off; "
        "the environment's RESCORE_READ_AHEAD_MB sets the default)",
    )
    memory_mb: float | None = option(
        None, plain=True, metavar="MB", check=budget_megabytes, env="RESCORE_MEMORY_MB",
        help="MB of memory each process of the run may use: read units in flight, --unit-cache-mb and "
        "--read-ahead-mb are fitted into it (slower, same output; default: no ceiling; "
        "the environment's RESCORE_MEMORY_MB sets the default)",
    )


def step_settings(run: StepSettings) -> StepSettings:
    """The StepSettings part of a run's options (a RunConfig is one): what the steps are given,
    without the launcher's own options (inputs, parameters, Beam arguments...)."""
    return StepSettings(**{f.name: getattr(run, f.name) for f in fields(StepSettings)})
