"""What a door is (`Door`), and the registry of doors.

A door is one kind of input: Parquet files, a Trinity-RFT SQL buffer, verl rollout dumps. It
declares its name, how a run picks it (an `--input-format` value, or options of its own), the
run options only it reads (declared on the door with `option()`, as every run option is), what
it checks before any work, how it reads its rows as read units
(Parquet files in OUTPUT/_source/) and how `rescore sample --format NAME` writes sample
experience in its format. Everything the rest of Rescore says about doors (`--input-format`'s
choices and help, `rescore sample --format`'s choices, the one-line refusals naming the doors,
which door a run reads through, the doors' flags, YAML keys and --help lines) is derived from
this registry: adding a door, options and all, is one module under pipelines/doors/ and one line
in pipelines/doors/__init__.py (docs/architecture.md).

Nothing here imports Beam, torch or YAML: pipelines/options.py reads the registry when the
parser is built, before the `rescore` command imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rescore.transforms.settings import flags_of, spec, value_type, yaml_key

if TYPE_CHECKING:
    import argparse

    import pyarrow as pa


class RunView(Protocol):
    """What a door reads of a run's settings (pipelines/options.py: RunConfig, which imports this
    module: the door sees the run through this view, never the class). Each door's own options
    are attributes too, by field name (`cfg.input_table`: RunConfig.door_options)."""

    inputs: list[str]
    input_format: str
    shard_rows: int

RunPipeline = Callable[[Callable[[Any], Any]], None]
"""Runs a Beam pipeline that `build(pipeline)` fills, with the run's Beam options, and waits."""


@runtime_checkable
class Door(Protocol):
    """One kind of input (see the module doc)."""

    name: str
    """The door's name: metrics.json's `source.format`, `rescore sample --format NAME`."""
    input_format: str | None
    """The `--input-format` value that picks this door; None: its own options pick it (`selects`)."""
    what: str
    """What it reads, in the plural, for messages: "SQL buffers", "verl dumps"."""
    chosen_by: str
    """The flag(s) a user picks it with, for messages: "--input-table", "--input-format verl-rollouts"."""
    help: str
    """Its words in --input-format's help, after its name: "verl trainer.rollout_data_dir {step}.jsonl files"."""
    sample_what: str
    """`rescore sample --format`'s help for it: "verl rollout dumps ({step}.jsonl)"."""
    sample_output: str
    """What `rescore sample --output` names in its format: "the SQLite file", "a directory"."""
    options: type | None
    """The run options only this door reads: a frozen dataclass whose fields are declared with
    `option()` (transforms/settings.py), as RunConfig's are (flags, YAML key, type, default, help,
    check); None where it has none. The parser, --help (before --input-format), the --config keys
    and RunConfig (`cfg.NAME`) take them from here; a name another door or a run option has
    already is refused when the door registers."""
    staged: bool
    """True: `read` writes its rows as Parquet read units before the job; False: the job reads --input as it is."""
    no_tokens: str | None
    """Why its rows cannot be written to a Trinity buffer (--output-db), or None where they can."""

    def selects(self, cfg: RunView) -> bool:
        """Does this run read through this door? (Doors without an input_format are asked first.)"""

    def option_problem(self, values: Mapping[str, Any]) -> str | None:
        """When the options are parsed: the first problem of this door's options with the others."""

    def check(self, cfg: RunView) -> None:
        """Before any work: ConfigError (one line) where this door cannot read `cfg.inputs`."""

    def read(self, cfg: RunView, directory: str, run: RunPipeline) -> tuple[list[str], dict[str, Any]]:
        """Write the rows as Parquet read units into `directory` (a Beam job that `run` runs):
        (the files written, what metrics.json says of the source)."""

    def shown_inputs(self, cfg: RunView, source: Mapping[str, Any]) -> list[str]:
        """What metrics.json names as the run's input (what the user gave, a password hidden)."""

    def write_sample(self, table: pa.Table, output: str, args: argparse.Namespace) -> str:
        """`rescore sample --format NAME`: the sample rows in this door's format at `output`;
        returns the line printed. FileExistsError or ConfigError: exit 2 with that line."""


_DOORS: list[Door] = []


_RUN_NAMES: dict[tuple[str, str], str] = {}
"""What the run's own options take (pipelines/options.py: `reserve`), {(kind, name): whose}."""


def register(door: Door) -> Door:
    """Add a door (after the built-in ones); its name, --input-format value and the names of its
    options (field, flags, argparse dest, YAML key, environment variable) must be new."""
    if not isinstance(door, Door):
        raise TypeError(f"{door!r} is not a Door (pipelines/doors/base.py)")
    for other in _DOORS:
        if other.name == door.name or (door.input_format and other.input_format == door.input_format):
            raise ValueError(f"a door named {door.name!r} (or read with --input-format {door.input_format}) exists")
    _refuse_clashes(door, _taken())
    _DOORS.append(door)
    return door


def reserve(names: Mapping[tuple[str, str], str]) -> None:
    """The names the run's own options take, {(kind, name): whose} with kind one of "field",
    "flag", "dest", "yaml", "env" (pipelines/options.py calls it once, when RunConfig is
    declared): a door registered before (the built-in ones) or after may not take one."""
    _RUN_NAMES.update(names)
    for door in _DOORS:
        _refuse_clashes(door, _taken(but=door))


def option_fields(door: Door | None = None) -> list[Field]:
    """The option fields of `door`, or of every door in registration order."""
    if door is None:
        return [f for d in _DOORS for f in option_fields(d)]
    return list(fields(door.options)) if door.options is not None else []


def declared_in(f: Field) -> type | None:
    """The door options class that declares the field `f`, or None (a run option)."""
    for door in _DOORS:
        if door.options is not None and any(f is g for g in fields(door.options)):
            return door.options
    return None


def option_names(f: Field) -> list[tuple[str, str]]:
    """The names one option field takes: (kind, name) for its field name, argparse dest, flags,
    YAML key and environment variable."""
    o = spec(f)
    names = [("field", f.name), ("dest", (o.dest if o else None) or f.name)]
    names += [("flag", flag) for flag in flags_of(f)]
    if yaml_key(f):
        names.append(("yaml", yaml_key(f)))
    if o is not None and o.env:
        names.append(("env", o.env))
    return names


def _taken(but: Door | None = None) -> dict[tuple[str, str], str]:
    """{(kind, name): whose} of the registered doors' options (less `but`'s) and the run's."""
    taken = dict(_RUN_NAMES)
    for door in _DOORS:
        if door is not but:
            taken.update({name: f"the door {door.name!r}" for f in option_fields(door) for name in option_names(f)})
    return taken


_KINDS = {"field": "the option", "dest": "the argparse dest", "flag": "the flag", "yaml": "the --config key",
          "env": "the environment variable"}


def _refuse_clashes(door: Door, taken: Mapping[tuple[str, str], str]) -> None:
    """ValueError (one line) where `door.options` is not a frozen dataclass of options with
    defaults, or takes a name `taken` has."""
    where = f"door {door.name!r}: its options"
    if door.options is None:
        return
    if not (isinstance(door.options, type) and is_dataclass(door.options) and door.options.__dataclass_params__.frozen):
        raise ValueError(f"{where} must be a @dataclass(frozen=True) class of option() fields, got {door.options!r}")
    for f in fields(door.options):
        if spec(f) is None:
            raise ValueError(f"{where}: the field {f.name!r} is not declared with option() (transforms/settings.py)")
        if f.default is MISSING and f.default_factory is MISSING:
            raise ValueError(f"{where}: the option {f.name!r} needs a default (a run that does not give it reads that)")
        value_type(door.options, f)  # its type annotation resolves (a NameError here, not at parse time)
        for kind, name in option_names(f):
            if (kind, name) in taken:
                raise ValueError(f"door {door.name!r}: its option {f.name!r} takes {_KINDS[kind]} {name!r}, "
                                 f"which {taken[kind, name]} has already")
        taken = {**taken, **{name: f"its option {f.name!r}" for name in option_names(f)}}  # two of its own


def unregister(name: str) -> None:
    """Remove the door `name` (tests that register a door of their own)."""
    _DOORS[:] = [d for d in _DOORS if d.name != name]


def doors() -> tuple[Door, ...]:
    """Every door, in registration order (the built-in ones first)."""
    return tuple(_DOORS)


def by_name(name: str) -> Door:
    for door in _DOORS:
        if door.name == name:
            return door
    raise KeyError(name)


class _InputFormats(Sequence):
    """The --input-format values, read from the registry at each use (a door registered after
    pipelines/options.py was imported is a choice too)."""

    def __getitem__(self, index):
        return tuple(d.input_format for d in _DOORS if d.input_format)[index]

    def __len__(self) -> int:
        return sum(1 for d in _DOORS if d.input_format)

    def __repr__(self) -> str:
        return repr(tuple(self))


INPUT_FORMATS: Sequence[str] = _InputFormats()
"""--input-format's choices: each door's `input_format`, in registration order ("parquet" first)."""


def input_format_help() -> str:
    """--input-format's help: "parquet (default) or verl-rollouts (verl ... files)"."""
    parts = [f"{d.input_format} ({d.help})" for d in _DOORS if d.input_format]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


def sample_formats() -> tuple[str, ...]:
    """`rescore sample --format`'s choices: every door's name."""
    return tuple(d.name for d in _DOORS)


def sample_format_help() -> str:
    """`rescore sample --format`'s help: "parquet files, a Trinity-RFT SQLite experience buffer, or ..."."""
    parts = [d.sample_what for d in _DOORS]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])}, or {parts[-1]}"


def sample_output_help() -> str:
    """`rescore sample --output`'s help: the first door's (Parquet's) words, the others' in brackets."""
    first, *others = _DOORS
    return f"{first.sample_output} ({'; '.join(f'{d.name}: {d.sample_output}' for d in others)})" if others else first.sample_output


def staged_doors() -> tuple[Door, ...]:
    """The doors whose rows are staged as Parquet read units before the job."""
    return tuple(d for d in _DOORS if d.staged)


def door_for(cfg: RunView) -> Door:
    """The door a run reads through: the first door picked by its own options (`selects`), else
    the one --input-format names."""
    for door in sorted(_DOORS, key=lambda d: d.input_format is not None):  # stable: registration order
        if door.selects(cfg):
            return door
    raise ValueError(f"internal error: no door reads --input-format {cfg.input_format!r}")


def option_problem(values: Mapping[str, Any]) -> str | None:
    """The first door's problem with the parsed options (pipelines/config.py), or None."""
    for door in _DOORS:
        problem = door.option_problem(values)
        if problem:
            return problem
    return None
