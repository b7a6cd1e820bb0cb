"""The model-stage flags (--teacher-model, --reward-model, --reward-fn, --logprob-model, ...)
and their YAML counterpart (`models:` in --config), parsed into ModelOptions."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from rescore.errors import ConfigError
from rescore.transforms.rows.model_columns import DEFAULT_REWARD_FN_TIMEOUT, ModelOptions
from rescore.transforms.settings import value_type

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelFlag:
    """One model-stage option: `key` is its ModelOptions field (whose type is its type) and its
    key under the YAML `models:`; `flag` its command-line flag (also with underscores)."""

    key: str
    flag: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None
    """argparse's type=, where the field's type is not enough."""

    @property
    def flags(self) -> tuple[str, ...]:
        name = self.flag[2:]
        return (self.flag, "--" + name.replace("-", "_")) if "-" in name else (self.flag,)

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def kind(self) -> type:
        return value_type(ModelOptions, {f.name: f for f in fields(ModelOptions)}[self.key])


def _seconds(text: str) -> float:
    """--reward-fn-timeout's value: a finite number of seconds >= 0 (argparse's own message
    otherwise, which the CLI prints as its one error line)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number of seconds >= 0 (0: no limit), got {text!r}") from None
    if not (0.0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expects a number of seconds >= 0 (0: no limit), got {text!r}")
    return value


MODEL_FLAGS = (
    ModelFlag("teacher_model", "--teacher-model", "Hugging Face causal LM directory: fills teacher_logprobs", metavar="DIR"),
    ModelFlag("logprob_model", "--logprob-model", "Hugging Face causal LM directory: fills logprobs (the input's kept as logprobs_original)", metavar="DIR"),
    ModelFlag("entropy", "--entropy", "with --logprob-model: also write per-token entropy (same forward pass)"),
    ModelFlag("sum_pi_squared", "--sum-pi-squared", "with --logprob-model: also write per-token sum_pi_squared, the sum over the vocabulary of p^2 (same forward pass)"),
    ModelFlag("ref_model", "--ref-model", "Hugging Face causal LM directory: fills ref_logprobs (the reference policy, for KL)", metavar="DIR"),
    ModelFlag("reward_model", "--reward-model", "Hugging Face sequence-classification reward model: replaces reward (kept as reward_original)", metavar="DIR"),
    ModelFlag("reward_fn", "--reward-fn", "Python verifier over prompt/response text or tokens: replaces reward (kept as reward_original)", metavar="MODULE:FUNCTION"),
    ModelFlag("reward_fn_timeout", "--reward-fn-timeout", f"with --reward-fn: seconds one verifier call may take before its row is rejected "
              f"(default {DEFAULT_REWARD_FN_TIMEOUT:g}; 0: no limit, the verifier runs in the worker's own process)", metavar="SECONDS", parse=_seconds),
    ModelFlag("tokenizer", "--tokenizer", "Hugging Face tokenizer directory, for a --reward-fn that takes text", metavar="DIR"),
    ModelFlag("dtype", "--model-dtype", "model weights' dtype (default auto: bfloat16/float16 on a GPU, float32 on CPU)", choices=DTYPES),
    ModelFlag("batch_size", "--model-batch-size", "rows per model batch (default 16)"),
    ModelFlag("batch_tokens", "--model-batch-tokens", "tokens per model batch instead of a row count (default 0: off)"),
    ModelFlag("padding_side", "--model-padding-side", "padding of model batches (default right; results do not depend on it)", choices=("right", "left")),
    ModelFlag("accelerator", "--model-accelerator", "accelerator resource hint for the model stage only, e.g. 'type:nvidia-l4;count:1;install-nvidia-driver'", metavar="SPEC"),
)
"""The model stage's options, in --help's order: ModelOptions' fields, each given by its flag or
its key under `models:` in a --config file."""
YAML_KEYS = {m.key: m.kind for m in MODEL_FLAGS}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model stage (needs the [models] extra; see docs/models.md)")
    for m in MODEL_FLAGS:
        how: dict[str, Any] = {"help": m.help}
        if m.kind is bool:
            how.update(action="store_true", default=None)
        elif m.parse or m.kind in (int, float):
            how["type"] = m.parse or m.kind
        if m.metavar:
            how["metavar"] = m.metavar
        if m.choices:
            how["choices"] = m.choices
        g.add_argument(*m.flags, **how)


def model_options(args: argparse.Namespace, config: Any) -> ModelOptions:
    """Flags over the YAML `models:` mapping over the defaults."""
    if not isinstance(config or {}, dict):
        raise ConfigError("config 'models' must be a mapping")
    config = dict(config or {})
    unknown = sorted(set(config) - set(YAML_KEYS))
    if unknown:
        raise ConfigError(f"config 'models': unknown key {unknown[0]!r}; valid keys: {', '.join(YAML_KEYS)}")
    flags = {m.key: getattr(args, m.dest) for m in MODEL_FLAGS}
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
