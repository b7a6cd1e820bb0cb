"""The model stage's options (--teacher-model, --reward-model, --reward-fn, --logprob-model, ...)
and their YAML counterpart (`models:` in --config), parsed into ModelOptions. They are declared
where the other run options are, with `option()`: ModelOptions' fields
(transforms/rows/model_columns.py); pipelines/options.py adds them to the parser as their own
--help group, and this module checks what a run gives them."""

from __future__ import annotations

import argparse
from dataclasses import Field
from typing import Any

from rescore.errors import ConfigError
from rescore.transforms.rows.model_columns import DEFAULT_REWARD_FN_TIMEOUT, DTYPES, ModelOptions
from rescore.transforms.settings import options, spec, value_type, yaml_key

MODEL_GROUP = "model stage (needs the [models] extra; see docs/models.md)"
"""--help's heading of the model stage's options, the last group."""
HELP_ORDER = (
    "teacher_model", "logprob_model", "entropy", "sum_pi_squared", "ref_model", "reward_model", "reward_fn",
    "reward_fn_timeout", "tokenizer", "dtype", "batch_size", "batch_tokens", "padding_side", "accelerator",
)
"""The model stage's options in --help's order (by field name): the log-prob pass's with it, then
the reward's, then the batching."""


def model_fields() -> list[Field]:
    """ModelOptions' option fields in --help's order (HELP_ORDER; a field it does not name comes last)."""
    by_name = {f.name: f for f in options(ModelOptions)}
    return [by_name.pop(n) for n in HELP_ORDER if n in by_name] + list(by_name.values())


MODEL_FLAGS = tuple(model_fields())
"""The model stage's option fields, in --help's order."""
YAML_KEYS = {yaml_key(f): value_type(ModelOptions, f) for f in MODEL_FLAGS}
"""{key under `models:`: its value type}."""


def model_options(args: argparse.Namespace, config: Any) -> ModelOptions:
    """Flags over the YAML `models:` mapping over the defaults."""
    if not isinstance(config or {}, dict):
        raise ConfigError("config 'models' must be a mapping")
    config = dict(config or {})
    unknown = sorted(set(config) - set(YAML_KEYS))
    if unknown:
        raise ConfigError(f"config 'models': unknown key {unknown[0]!r}; valid keys: {', '.join(YAML_KEYS)}")
    flags = {f.name: getattr(args, spec(f).dest or f.name) for f in MODEL_FLAGS}
    values = {k: v for k, v in config.items() if v is not None}
    values.update({k: v for k, v in flags.items() if v is not None})
    for key, value in values.items():
        kind = YAML_KEYS[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"models.{key} must be true or false, got {value!r}")
            continue
        ok = isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
        if not ok or isinstance(value, bool):
            what = {int: "an integer", float: "a number of seconds"}.get(kind, "a string")
            raise ConfigError(f"models.{key} must be {what}, got {value!r}")
    timeout = values.get("reward_fn_timeout")
    if timeout is not None:
        if not 0.0 <= float(timeout) < float("inf"):  # also NaN
            raise ConfigError(f"--reward-fn-timeout must be a number of seconds >= 0 (0: no limit), got {timeout!r}")
        if not values.get("reward_fn"):
            raise ConfigError("--reward-fn-timeout limits a --reward-fn verifier: pass --reward-fn MODULE:FUNCTION or drop it")
        values["reward_fn_timeout"] = float(timeout)
    elif values.get("reward_fn"):
        values["reward_fn_timeout"] = DEFAULT_REWARD_FN_TIMEOUT
    options = ModelOptions(**values)
    for flag, on in (("--entropy", options.entropy), ("--sum-pi-squared", options.sum_pi_squared)):
        if on and not options.logprob_model:
            raise ConfigError(f"{flag} comes from --logprob-model's forward pass: pass --logprob-model DIR too")
    if options.reward_model and options.reward_fn:
        raise ConfigError("pass --reward-model or --reward-fn, not both")
    if options.dtype not in DTYPES:
        raise ConfigError(f"--model-dtype must be one of {', '.join(DTYPES)}, got {options.dtype!r}")
    if options.padding_side not in ("right", "left"):
        raise ConfigError(f"--model-padding-side must be right or left, got {options.padding_side!r}")
    if options.batch_size < 1:
        raise ConfigError(f"--model-batch-size must be a positive integer, got {options.batch_size}")
    if options.batch_tokens < 0:
        raise ConfigError(f"--model-batch-tokens must be 0 (off) or a positive integer, got {options.batch_tokens}")
    return options
