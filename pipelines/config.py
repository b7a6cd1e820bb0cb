"""Command line and YAML config -> a RunConfig plus the Beam pipeline arguments.

Precedence: command-line flags > --config YAML > defaults. Anything that is not a Rescore flag
must be a Beam pipeline option; a typo fails instead of being dropped silently.

The options are declared once (pipelines/options.py, transforms/settings.py); the YAML files are
pipelines/config_files.py, the Beam arguments pipelines/beam_args.py. Here: the run's options
from the three, and the rules across options (the strategies, the sources, the model stage).
"""

from __future__ import annotations

import json
from typing import Any

from rescore.errors import ConfigError
from rescore.pipelines import doors
from rescore.pipelines.beam_args import (  # noqa: F401  (DEFAULT_RUNNER, prism_binary: imported from here)
    DEFAULT_RUNNER,
    _check_beam_args,
    _check_paths_reach_workers,
    _check_runner_extra,
    _with_default_runner,
    _with_flink_options,
    _absolute_for_workers,
    _with_worker_log_level,
    pipeline_args,
    prism_binary,
)
from rescore.pipelines.config_files import load_yaml, pipeline_option_flags, shipped_configs  # noqa: F401
from rescore.pipelines.model_flags import model_options
from rescore.pipelines.options import RunConfig, usage, value_of, with_doors  # noqa: F401  (usage: imported from here)
from rescore.pipelines.options import parser as _parser
from rescore.transforms.files.layout import table_name_problem
from rescore.transforms.settings import DEFAULT_BUCKETS, LOCAL_BUCKET_ROWS, options
from rescore.transforms.strategies import algorithms, names


def parse_value(text: str) -> Any:
    """JSON where it parses ('1e-7', 'null', 'true'), else the string itself ('batch')."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _names(value: Any, where: str) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{where} must be a strategy name or a list of names, got {item!r}")
        out += [n.strip() for n in item.split(",") if n.strip()]
    return out


def _strategies(args, config: dict[str, Any], params: dict[str, Any]) -> tuple[list[str], str | None, dict[str, Any]]:
    """(stage names, algorithm preset or None, parameters) from flags over the YAML config.

    A flag replaces its YAML counterpart: --strategy drops a YAML algorithm and vice versa.
    """
    strategy = _names(args.strategy, "--strategy") if args.strategy else None
    algorithm = args.algorithm
    if strategy and algorithm:
        raise ConfigError("pass --strategy or --algorithm, not both")
    if not strategy and not algorithm:
        if config.get("strategy") and config.get("algorithm"):
            raise ConfigError("the config sets both 'strategy' and 'algorithm'; keep one")
        strategy = _names(config["strategy"], "config 'strategy'") if config.get("strategy") else None
        algorithm = config.get("algorithm")
    if algorithm:
        preset = algorithms.preset(str(algorithm))
        return list(preset.strategies), str(algorithm), {**preset.params, **params}
    if not strategy:
        raise ConfigError(
            f"no strategy: pass --strategy NAME or --algorithm NAME (`rescore strategies` lists all {len(names())})"
        )
    return strategy, None, params


def _with_group_filter(strategies: list[str], params: dict[str, Any], function: str) -> tuple[list[str], dict[str, Any]]:
    """--group-filter MODULE:FUNCTION as the chain's filter stage (`group_filter`), after any
    reward shaping; one filter per run, so a chain that has one already is refused."""
    from rescore.transforms.strategies.registry import FILTER, SHAPE, spec

    kinds = [spec(n).kind for n in strategies]
    if FILTER in kinds:
        raise ConfigError(
            f"--group-filter is the run's filter stage, and the chain already has one ({strategies[kinds.index(FILTER)]})"
        )
    at = sum(1 for k in kinds if k == SHAPE)
    return [*strategies[:at], "group_filter", *strategies[at:]], {**params, "group_filter.function": function}


BY_HAND = frozenset({"inputs", "output", "strategies", "algorithm", "params", "wait", "models", "beam_args"})
"""The options parse_args works out itself (rules across options, a flag that is the opposite of
its value); every other option's value is its flag over its YAML key over its default
(options.value_of), checked as its declaration says."""


def parse_args(argv: list[str]) -> RunConfig:
    # The help texts (the strategy names: every family imported) only where help is asked for
    args, rest = _parser(helps=any(a == "--help" or a.startswith("-h") for a in argv)).parse_known_args(argv)
    config = load_yaml(args.config) if args.config else {}
    # Every option is known before anything else is checked: a misspelt flag (`--stratgy grpo`)
    # is named as such, not reported as the missing option it was meant to be.
    beam_args = pipeline_option_flags(config.get("pipeline_options") or {}) + rest
    _check_beam_args(beam_args)

    params = dict(config.get("params") or {})
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        params[key.strip()] = parse_value(value)

    inputs = args.input or config.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    output = args.output or config.get("output")
    if not inputs:
        raise ConfigError("no input: pass --input PATH_OR_GLOB (or 'input:' in --config)")
    if not output:
        raise ConfigError("no output: pass --output DIR (or 'output:' in --config)")
    strategies, algorithm, params = _strategies(args, config, params)

    values, given = {}, set()
    for f in with_doors(options(RunConfig)):  # the steps' options first
        if f.name not in BY_HAND:
            values[f.name], was_given = value_of(f, args, config)
            if was_given:
                given.add(f.name)
    if values["group_filter"]:
        strategies, params = _with_group_filter(strategies, params, values["group_filter"])
    if bool(values["output_db"]) != bool(values["output_table"]):
        raise ConfigError("--output-db URL and --output-table NAME go together")
    if values["output_table"] and table_name_problem(values["output_table"]):  # nothing a user types is ever SQL
        raise ConfigError(table_name_problem(values["output_table"]))
    door_problem = doors.option_problem(values)  # a door's options with the others (pipelines/doors/)
    if door_problem:
        raise ConfigError(door_problem)

    beam_args = pipeline_args(beam_args, inputs=[str(i) for i in inputs], output=str(output), input_table=values["input_table"],
                              shared_filesystem=values["shared_filesystem"], log_level=values["log_level"])
    inputs, output = _absolute_for_workers(beam_args, [str(i) for i in inputs], str(output))
    door_options = {f.name: values.pop(f.name) for f in doors.option_fields()}
    cfg = RunConfig(
        **values,
        door_options=door_options,
        inputs=inputs,
        output=output,
        strategies=strategies,
        params=params,
        algorithm=algorithm,
        buckets_chosen="buckets" in given,
        wait=not args.no_wait,
        beam_args=beam_args,
        models=model_options(args, config.get("models")),
    )
    if cfg.incremental and cfg.models.enabled:  # the model stage is not wired into incremental runs
        flags = [f"--{k.replace('_', '-')}" for k in ("teacher_model", "logprob_model", "reward_model", "reward_fn")
                 if getattr(cfg.models, k)]
        raise ConfigError(f"{' and '.join(flags)} cannot be used with --incremental (the model stage runs only in one-shot runs); drop --incremental to run the model stage (docs/models.md)")
    if cfg.run_name and not cfg.incremental:
        raise ConfigError("--run-name names an --incremental run; pass --incremental or drop --run-name")
    return cfg


def local_buckets(rows: int) -> int:
    """The default bucket count of an in-process run of `rows` rows."""
    return min(DEFAULT_BUCKETS, max(8, -(-rows // LOCAL_BUCKET_ROWS)))

