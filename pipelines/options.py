"""Every option of a run, declared once, and what is generated from the declarations: the
parser (`--help`), the --config YAML keys and their type checks, each option's value from flag
over YAML over default, and the options pipelines/early.py may prefetch a run with.

The declarations are the fields of `RunConfig`: the launcher's own options here, and the ones
the Beam steps read in its base class, transforms/settings.py's `StepSettings` (the steps import
that, never this); the options only one door reads are declared the same way on that door
(pipelines/doors/: `Door.options`) and collected from the door registry, just before
--input-format, wherever the run options are listed. A field's type is its check where every
value of the type is valid (a YAML `overwrite: "false"` is refused, not true); `check` adds the
rest. Nothing here imports Beam,
YAML or the strategies (early.py reads the table before the `rescore` command imports them).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import Field, dataclass, field, fields
from typing import Any

from rescore.errors import ConfigError
from rescore.pipelines import doors
from rescore.pipelines.model_flags import MODEL_FLAGS, MODEL_GROUP
from rescore.transforms.rows.model_columns import ModelOptions
from rescore.transforms.settings import (
    StepSettings,
    flags_of,
    one_of,
    option,
    options,
    spec,
    value_type,
    yaml_key,
)

INPUT_FORMATS = doors.INPUT_FORMATS
"""--input-format's choices: the registered doors' (pipelines/doors/), read at each use."""
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_PROGRESS_SECONDS = 15.0


def _strategy_help() -> str:
    from rescore.transforms.strategies.registry import names

    return ("a strategy, or a filter,advantage,duplicate chain after any reward shaping, e.g. "
            f"reward_variance,grpo,duplicate_informative (`rescore strategies` lists all {len(names())})")


def _algorithm_help() -> str:
    from rescore.transforms.strategies import algorithms

    return f"instead of --strategy: a Trinity-RFT algorithm's strategies, one of {', '.join(algorithms.names())}"


def _seconds(flag: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):  # also NaN
        return f"{flag} must be a number of seconds >= 0, got {value!r}"
    return None


MIN_PROGRESS_SECONDS = 0.1
"""The shortest interval between progress lines (a smaller one, 1e-320, printed a line per loop)."""


def _interval(flag: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < float("inf"):
        return f"{flag} must be a number of seconds > 0, got {value!r}"
    if value < MIN_PROGRESS_SECONDS:
        return f"{flag} must be at least {MIN_PROGRESS_SECONDS:g} seconds, got {value!r}"
    return None


def _input_paths(key: str, value: Any) -> str | None:
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        return None
    return f"{key!r} must be a path or a list of paths, got {value!r}"


def _mapping(key: str, value: Any) -> str | None:
    return None if isinstance(value or {}, dict) else f"{key!r} must be a mapping"


@dataclass(frozen=True, kw_only=True)
class RunConfig(StepSettings):
    """A run's options: flags over the --config YAML over the defaults (config.parse_args).
    The fields of StepSettings (transforms/settings.py) are the ones the steps read."""

    inputs: list[str] = option(
        flags=("--input",), dest="input", yaml="input", repeat=True, yaml_check=_input_paths, plain=True, metavar="PATH_OR_GLOB",
        help="input Parquet path, directory or glob (repeatable)",
    )
    output: str = option(plain=True, metavar="DIR", help="output directory")
    strategies: list[str] = option(
        flags=("--strategy",), dest="strategy", yaml="strategy", repeat=True, plain=True, metavar="NAME", help=_strategy_help,
    )
    algorithm: str | None = option(None, plain=True, metavar="NAME", help=_algorithm_help)
    group_filter: str | None = option(
        None, yaml=None, metavar="MODULE:FUNCTION",
        help="your function over each task group's rows: True keeps it (the run's filter stage; docs/strategies.md)",
    )
    params: dict[str, Any] = option(
        flags=("--set",), dest="set", yaml="params", repeat=True, metavar="KEY=VALUE", yaml_check=_mapping, plain=True,
        help="strategy parameter, KEY or STRATEGY.KEY (JSON value)",
    )
    config: str | None = option(
        None, yaml=None, metavar="FILE_OR_NAME",
        help="YAML run config: a file, or the name of a shipped one (`rescore configs` lists them)",
    )
    overwrite: bool = option(False, plain=True, help="replace a finished run in --output")
    skip_bad_files: bool = option(
        False, plain=True,
        help="leave out unreadable or contract-breaking input files instead of stopping (listed in metrics.json)",
    )
    incremental: bool = option(
        False,
        help="keep OUTPUT as a Delta Lake table and rescore only the batches new, changed or deleted input touches (docs/runners.md)",
    )
    run_name: str | None = option(
        None, yaml=None,
        help="with --incremental: the run's name, one path component [A-Za-z0-9][A-Za-z0-9._=+-]* (default run=YYYYMMDDTHHMMSS, UTC)",
    )
    wait: bool = option(
        True, flags=("--no-wait", "--no_wait"), dest="no_wait", yaml=None,
        help="submit to a remote runner and return without waiting (Flex Templates)",
    )
    input_format: str = option(
        "parquet", choices=INPUT_FORMATS, check=lambda flag, v: one_of(flag, v, tuple(INPUT_FORMATS), "input format"),
        help=doors.input_format_help,
    )
    output_db: str | None = option(
        None, metavar="URL", help="also write the scored experience as a Trinity-RFT buffer into this SQLAlchemy database URL",
    )
    output_table: str | None = option(None, metavar="NAME", help="with --output-db: the buffer name to write")
    wait_for_lock: float = option(
        0.0, metavar="SECONDS", check=_seconds, plain=True,
        help="when another run is writing the same --output, wait up to SECONDS for it (default 0: refuse at once)",
    )
    shared_filesystem: bool = option(
        False, plain=True,
        help="local --input/--output paths are on a filesystem every worker of a Flink, Spark, Dask or portable "
        "cluster mounts at the same path (else such a run is refused: docs/runners.md)",
    )
    quiet: bool = option(False, yaml=None, plain=True, help="no summary on stderr")
    log_level: str = option(
        "WARNING", yaml=None, choices=LOG_LEVELS, plain=True,
        help="WARNING (default): a failure is one `rescore: error:` line, Rescore's warnings come after a successful run, "
        "Beam's logs are not shown; INFO streams the log (Beam's and its workers' too) and prints the plan; DEBUG also the traceback",
    )
    progress_seconds: float = option(
        DEFAULT_PROGRESS_SECONDS, metavar="SECONDS", check=_interval, env="RESCORE_PROGRESS_SECONDS", plain=True,
        help=f"where stderr is not a terminal: seconds between progress lines (default {DEFAULT_PROGRESS_SECONDS:g}; "
        "the environment's RESCORE_PROGRESS_SECONDS sets the default)",
    )
    models: ModelOptions = option(
        default_factory=ModelOptions, flags=None,
        help="mapping of model-stage settings: teacher_model, reward_model, reward_fn, ... (docs/models.md)",
    )
    """The model stage's options are ModelOptions' fields, --help's last group (pipelines/model_flags.py)."""
    beam_args: list[str] = option(
        default_factory=list, flags=None, yaml="pipeline_options", yaml_check=_mapping,
        help="mapping of Beam pipeline options",
    )
    """Every argument that is not a Rescore flag, after the YAML's pipeline_options."""
    buckets_chosen: bool = False
    """--buckets (or the config's `buckets`) was given: no local default replaces it."""
    door_options: dict[str, Any] = field(default_factory=dict)
    """The doors' own options (pipelines/doors/: `Door.options`), {field name: value}: every
    registered door's, each read as an attribute of the run (`cfg.input_table`)."""

    def __getattr__(self, name: str) -> Any:
        """A door's option (`cfg.input_table`), where no field of the run has the name."""
        door_options = self.__dict__.get("door_options") or {}  # (unpickling: no fields yet)
        if name in door_options:
            return door_options[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


COMMON_OPTIONS = ("inputs", "output", "strategies", "algorithm", "params", "config", "overwrite", "quiet")
"""--help's first group: what a first run needs."""
DOOR_OPTIONS = "(the doors' options)"
"""In HELP_GROUPS: where every door's options go (pipelines/doors/), in registration order."""
HELP_GROUPS = (
    ("what the output carries", ("group_filter", "keep_filtered", "audit_columns")),
    ("other inputs and outputs", (DOOR_OPTIONS, "input_format", "output_db", "output_table", "incremental", "run_name")),
    ("bad input, failures and other runs", ("skip_bad_files", "max_reject_fraction", "max_group_rows", "wait_for_lock")),
    ("runners, devices and performance",
     ("wait", "shared_filesystem", "device", "accelerator", "buckets", "shard_rows", "io_threads", "unit_cache_mb",
      "read_ahead_mb", "memory_mb")),
    ("messages", ("log_level", "progress_seconds")),
)
"""--help's headings after the common options, and the options under each (by field name); an
option in none of them is listed under OTHER_GROUP, so none is ever left out."""
OTHER_GROUP = "other options"


def help_groups() -> list[tuple[str, list[str]]]:
    """HELP_GROUPS with DOOR_OPTIONS replaced by the registered doors' option names."""
    doors_own = [f.name for f in doors.option_fields()]
    return [(title, [n for name in names for n in (doors_own if name == DOOR_OPTIONS else [name])])
            for title, names in HELP_GROUPS]


def with_doors(run_fields: list[Field]) -> list[Field]:
    """`run_fields` with every door's options (pipelines/doors/) just before --input-format, the
    option that picks a door."""
    at = next(i for i, f in enumerate(run_fields) if f.name == "input_format")
    return [*run_fields[:at], *doors.option_fields(), *run_fields[at:]]


def table() -> list[Field]:
    """Every run option in --help's order: the launcher's (the doors' among them), then the
    steps' (StepSettings)."""
    steps = {f.name for f in fields(StepSettings)}
    return with_doors([f for f in options(RunConfig) if f.name not in steps]) + options(StepSettings)


def declared_in(f: Field) -> type:
    """The class whose annotation is `f`'s type: a door's options class, or RunConfig."""
    return doors.declared_in(f) or RunConfig


def _reserve_run_names() -> None:
    """Tell the door registry the names the run's own options take (a door's may not clash)."""
    whose = "the run option {!r} (pipelines/options.py)"
    taken = {("field", f.name): whose.format(f.name) for f in fields(RunConfig)}
    taken.update({name: whose.format(f.name) for f in options(RunConfig) for name in doors.option_names(f)})
    taken.update({(kind, name): whose.format(f.name) for f in MODEL_FLAGS  # `models:` holds their YAML keys
                  for kind, name in doors.option_names(f) if kind in ("flag", "dest")})
    taken.update({("flag", "-h"): "--help", ("flag", "--help"): "--help", ("dest", "help"): "--help"})
    doors.reserve(taken)


_reserve_run_names()


def config_keys() -> dict[str, str]:
    """{YAML key: help} of every option a --config file may set."""
    return {yaml_key(f): _help(f) for f in table() if yaml_key(f)}


def dest(f: Field) -> str:
    return spec(f).dest or f.name


def _help(f: Field) -> str:
    text = spec(f).help
    return text() if callable(text) else text


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit; a ConfigError keeps the one-line contract
        raise ConfigError(message)


COMMANDS = """commands:
  rescore --input PATH_OR_GLOB --output DIR --strategy NAME [--set KEY=VALUE ...]
                                          score experience (rescore --help: every option)
  rescore --input PATH_OR_GLOB --output DIR --algorithm NAME [--set KEY=VALUE ...]
                                          the same with a Trinity-RFT algorithm's strategies
  rescore sample --output DIR [--batches N] [--tasks N] [--runs N] [--steps N]
                                          write sample experience to try it on
  rescore report OUTPUT_DIR [--to DIR] [--solved-at X]
                                          report.html and charts of a finished run or a table
  rescore show OUTPUT_DIR [--batches]     rows, batches, runs and pending input of an output
  rescore task-stats --input SOURCE --output DIR [--threshold X] [--k 1,4,8]
                                          per-task pass rates, pass@k, Beta posterior
  rescore export OUTPUT_DIR --output DIR --format sft|dpo
                                          SFT rows or DPO pairs for the next run
  rescore strategies [NAME]               the strategies, or one's parameters and defaults
  rescore configs                         the run configs that ship with Rescore (--config NAME)"""
"""The command list: what a bare `rescore` prints (README.md's "Usage" shows the same lines)."""

USAGE = ("rescore --input PATH_OR_GLOB --output DIR (--strategy NAME | --algorithm NAME) [options] [Beam options]\n"
         "       rescore COMMAND ...   (a bare `rescore` lists the commands)")


def usage() -> str:
    """What a bare `rescore` prints: the command list."""
    return (f"usage: rescore COMMAND ...\n\n{COMMANDS}\n\nEvery option of a run: rescore --help; a command's: "
            "rescore COMMAND --help; docs: README.md and docs/")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help's option lines: each flag once, in its dashed form (`--skip-bad-files`; the
    underscore spelling Beam's options use, `--skip_bad_files`, is accepted too)."""

    def _format_action_invocation(self, action):
        if not action.option_strings:
            return super()._format_action_invocation(action)
        if action.option_strings[0] == "-h":
            return ", ".join(action.option_strings)
        first = action.option_strings[0]
        if action.nargs == 0:
            return first
        return f"{first} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


def _add(group, f: Field, cls: type | None = None, helps: bool = True) -> None:
    o = spec(f)
    names = flags_of(f)
    if not names:
        return
    kind = value_type(cls or declared_in(f), f)
    how: dict[str, Any] = {"dest": dest(f), "help": _help(f) if helps else None}
    if o.repeat:
        how["action"] = "append"
    elif kind is bool:
        how.update(action="store_true", default=None)
    elif o.parse or kind in (int, float):
        how["type"] = o.parse or kind
    if o.choices:
        how["choices"] = list(o.choices)
    if o.metavar:
        how["metavar"] = o.metavar
    group.add_argument(*names, **how)


def parser(*, helps: bool = True) -> argparse.ArgumentParser:
    """The `rescore` run command's parser, from the table and the model stage's options
    (ModelOptions, pipelines/model_flags.py). --help lists the common options first, then the
    rest under headings (HELP_GROUPS), the model stage's last. `helps=False`: the same parser
    without the help texts some options compute (the strategy names, which import the
    strategies): pipelines/early.py parses with it before those imports."""
    p = _Parser(
        prog="rescore",
        usage=USAGE,
        description=f"Rescore logged RL experience: Parquet in, scored Parquet out.\n\n{COMMANDS}",
        formatter_class=_HelpFormatter,
        epilog="Any other --option is passed to Beam (e.g. --runner, --direct_num_workers); a misspelt one is an error.",
        allow_abbrev=False,
    )
    p._optionals.title = "common options"
    by_name = {f.name: f for f in table()}
    for name in COMMON_OPTIONS:
        _add(p, by_name.pop(name), helps=helps)
    for title, names in help_groups():
        group = p.add_argument_group(title)
        for name in names:
            if name in by_name:
                _add(group, by_name.pop(name), helps=helps)
    if by_name:
        group = p.add_argument_group(OTHER_GROUP)
        for f in by_name.values():
            _add(group, f, helps=helps)
    group = p.add_argument_group(MODEL_GROUP)
    for f in MODEL_FLAGS:
        _add(group, f, ModelOptions, helps=helps)
    return p


# --- --config YAML: the keys and the type of each value ----------------------------------------


def _kind(value: Any) -> str:
    return "null" if value is None else {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _type_problem(kind: type, key: str, value: Any) -> str | None:
    if kind is bool and not isinstance(value, bool):
        return f"{key!r} must be true or false, got {value!r} ({_kind(value)})"
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{key!r} must be an integer, got {value!r} ({_kind(value)})"
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"{key!r} must be a number, got {value!r} ({_kind(value)})"
    if kind is str and not isinstance(value, str):
        return f"{key!r} must be a string, got {value!r} ({_kind(value)})"
    return None


def check_config(path: str, data: dict[str, Any]) -> None:
    """The keys of a --config mapping, and each value's type: `overwrite: "false"` (a string) is
    an error, not true."""
    by_key = {yaml_key(f): f for f in table() if yaml_key(f)}
    unknown = sorted(set(data) - set(by_key))
    if unknown:
        raise ConfigError(f"config {path}: unknown key {unknown[0]!r}; valid keys: {', '.join(by_key)}")
    for key, f in by_key.items():  # the mappings first: params, pipeline_options
        if spec(f).yaml_check is _mapping and _mapping(key, data.get(key)):
            raise ConfigError(f"config {path}: {_mapping(key, data.get(key))}")
    for key, value in data.items():
        f = by_key[key]
        check = spec(f).yaml_check
        problem = check(key, value) if check not in (None, _mapping) else _type_problem(value_type(declared_in(f), f), key, value)
        if problem:
            raise ConfigError(f"config {path}: {problem}")


# --- one option's value: flag over YAML over default --------------------------------------------


def env_default(f: Field) -> Any:
    """The default an environment variable sets (`Option.env`), checked like the flag; None
    where it is unset. The only place these variables are read."""
    name = spec(f).env
    text = os.environ.get(name, "").strip() if name else ""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = text
    problem = spec(f).check(name, value) if spec(f).check else None
    if problem:
        raise ConfigError(problem)
    return value


ARROW_DECAY_ENV = "RESCORE_ARROW_DECAY_MS"
MAX_ARROW_DECAY_MS = 86_400_000
"""The longest jemalloc decay RESCORE_ARROW_DECAY_MS may set: a day (-1 keeps freed pages for ever)."""


def arrow_decay_ms(default: int) -> int:
    """RESCORE_ARROW_DECAY_MS (pipelines/cli.py sets Arrow's jemalloc decay from it), checked like
    a flag: a whole number from -1 (never hand pages back) to MAX_ARROW_DECAY_MS; ConfigError
    otherwise (a value past a C ssize_t would reach jemalloc as an OverflowError traceback)."""
    text = os.environ.get(ARROW_DECAY_ENV, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{ARROW_DECAY_ENV} must be a whole number of milliseconds (-1: never), got {text!r}") from None
    if not -1 <= value <= MAX_ARROW_DECAY_MS:
        raise ConfigError(
            f"{ARROW_DECAY_ENV} must be -1 (never) or 0 to {MAX_ARROW_DECAY_MS:,} milliseconds (a day), got {text!r}"
        )
    return value


def value_of(f: Field, args: argparse.Namespace, config: dict[str, Any]) -> tuple[Any, bool]:
    """(the option's checked value, whether the command line or the YAML gave it)."""
    o = spec(f)
    kind = value_type(declared_in(f), f)
    flag = getattr(args, dest(f), None) if flags_of(f) else None
    from_yaml = config.get(yaml_key(f)) if yaml_key(f) else None
    value = (flag or from_yaml) if kind is str else (flag if flag is not None else from_yaml)
    given = value is not None
    if not given:
        value = env_default(f)
        if value is None:
            value = f.default
    if o.check:
        problem = o.check(flags_of(f)[0] if flags_of(f) else f.name, value)
        if problem:
            raise ConfigError(problem)
    if value is None:
        return None, given
    if kind is bool:
        return bool(value), given
    if kind is float:
        return float(value), given
    if kind is str:
        return (str(value) if value else None) if f.default is None else str(value), given
    return value, given
