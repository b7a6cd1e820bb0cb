"""The model-stage flags (--teacher-model, --reward-model, --reward-fn, --logprob-model, ...)
and their YAML counterpart (`models:` in --config), parsed into ModelOptions."""

from __future__ import annotations

import argparse
from typing import Any

from rescore.errors import ConfigError
from rescore.transforms.rows.model_columns import DEFAULT_REWARD_FN_TIMEOUT, ModelOptions

DTYPES = ("auto", "float32", "bfloat16", "float16")
YAML_KEYS = {
    "teacher_model": str, "logprob_model": str, "reward_model": str, "reward_fn": str, "tokenizer": str,
    "dtype": str, "batch_size": int, "batch_tokens": int, "padding_side": str, "accelerator": str,
    "reward_fn_timeout": float,
    "entropy": bool, "sum_pi_squared": bool, "ref_model": str,
}


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model stage (needs the [models] extra; see docs/models.md)")
    g.add_argument("--teacher-model", "--teacher_model", metavar="DIR", help="Hugging Face causal LM directory: fills teacher_logprobs")
    g.add_argument("--logprob-model", "--logprob_model", metavar="DIR", help="Hugging Face causal LM directory: fills logprobs (the input's kept as logprobs_original)")
    g.add_argument("--entropy", action="store_true", default=None, help="with --logprob-model: also write per-token entropy (same forward pass)")
    g.add_argument("--sum-pi-squared", "--sum_pi_squared", action="store_true", default=None, help="with --logprob-model: also write per-token sum_pi_squared, the sum over the vocabulary of p^2 (same forward pass)")
    g.add_argument("--ref-model", "--ref_model", metavar="DIR", help="Hugging Face causal LM directory: fills ref_logprobs (the reference policy, for KL)")
    g.add_argument("--reward-model", "--reward_model", metavar="DIR", help="Hugging Face sequence-classification reward model: replaces reward (kept as reward_original)")
    g.add_argument("--reward-fn", "--reward_fn", metavar="MODULE:FUNCTION", help="Python verifier over prompt/response text or tokens: replaces reward (kept as reward_original)")
    g.add_argument("--reward-fn-timeout", "--reward_fn_timeout", metavar="SECONDS", type=_seconds,
                   help=f"with --reward-fn: seconds one verifier call may take before its row is rejected "
                        f"(default {DEFAULT_REWARD_FN_TIMEOUT:g}; 0: no limit, the verifier runs in the worker's own process)")
    g.add_argument("--tokenizer", metavar="DIR", help="Hugging Face tokenizer directory, for a --reward-fn that takes text")
    g.add_argument("--model-dtype", "--model_dtype", choices=DTYPES, help="model weights' dtype (default auto: bfloat16/float16 on a GPU, float32 on CPU)")
    g.add_argument("--model-batch-size", "--model_batch_size", type=int, help="rows per model batch (default 16)")
    g.add_argument("--model-batch-tokens", "--model_batch_tokens", type=int, help="tokens per model batch instead of a row count (default 0: off)")
    g.add_argument("--model-padding-side", "--model_padding_side", choices=("right", "left"), help="padding of model batches (default right; results do not depend on it)")
    g.add_argument("--model-accelerator", "--model_accelerator", metavar="SPEC", help="accelerator resource hint for the model stage only, e.g. 'type:nvidia-l4;count:1;install-nvidia-driver'")


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


def model_options(args: argparse.Namespace, config: Any) -> ModelOptions:
    """Flags over the YAML `models:` mapping over the defaults."""
    if not isinstance(config or {}, dict):
        raise ConfigError("config 'models' must be a mapping")
    config = dict(config or {})
    unknown = sorted(set(config) - set(YAML_KEYS))
    if unknown:
        raise ConfigError(f"config 'models': unknown key {unknown[0]!r}; valid keys: {', '.join(YAML_KEYS)}")
    flags = {
        "teacher_model": args.teacher_model, "logprob_model": args.logprob_model, "reward_model": args.reward_model,
        "reward_fn": args.reward_fn, "tokenizer": args.tokenizer, "dtype": args.model_dtype,
        "batch_size": args.model_batch_size, "batch_tokens": args.model_batch_tokens,
        "padding_side": args.model_padding_side, "accelerator": args.model_accelerator,
        "reward_fn_timeout": args.reward_fn_timeout,
        "entropy": args.entropy, "sum_pi_squared": args.sum_pi_squared, "ref_model": args.ref_model,
    }
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
