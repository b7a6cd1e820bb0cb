"""Strategies by registry name, with their defaults and parameter checks."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rescore.errors import ConfigError  # noqa: F401  (strategies raise it; defined in rescore/errors.py)
from rescore.transforms.strategies.base import Strategy


@dataclass(frozen=True)
class StrategySpec:
    name: str
    kind: str
    factory: Callable[..., Strategy]
    defaults: Mapping[str, Any]
    summary: str


_REGISTRY: dict[str, StrategySpec] = {}


def register(name: str, *, kind: str, defaults: Mapping[str, Any], summary: str):
    """Class or function decorator: register `factory(**params) -> Strategy` under `name`.

    Refuses a name that is already taken, so two modules cannot silently shadow each other.
    """

    def wrap(factory):
        if name in _REGISTRY:
            raise ValueError(f"strategy {name!r} is already registered")
        _REGISTRY[name] = StrategySpec(name, kind, factory, dict(defaults), summary)
        return factory

    return wrap


def names() -> list[str]:
    return sorted(_REGISTRY)


def spec(name: str) -> StrategySpec:
    if name not in _REGISTRY:
        hint = difflib.get_close_matches(name, names(), n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"unknown strategy {name!r}{did_you_mean}; valid strategies: {', '.join(names())}")
    return _REGISTRY[name]


def create(name: str, params: Mapping[str, Any] | None = None) -> Strategy:
    """The strategy `name` with `params` over its defaults. Raises ConfigError on anything off."""
    s = spec(name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(s.defaults))
    if unknown:
        valid = ", ".join(sorted(s.defaults)) or "(none)"
        raise ConfigError(f"unknown parameter {unknown[0]!r} for strategy {name!r}; valid parameters: {valid}")
    return s.factory(**{**s.defaults, **params})


# --- parameter checks shared by the strategy modules ---------------------------------------


def number(strategy: str, key: str, value: Any, *, minimum: float | None = None, optional: bool = False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number or null" if optional else "a number"
        raise ConfigError(f"{strategy}: parameter {key!r} must be {kind}, got {value!r}")
    value = float(value)
    if value != value or (minimum is not None and value < minimum):
        raise ConfigError(f"{strategy}: parameter {key!r} must be >= {minimum}, got {value!r}")
    return value


def integer(strategy: str, key: str, value: Any, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise ConfigError(f"{strategy}: parameter {key!r} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{strategy}: parameter {key!r} must be >= {minimum}, got {value!r}")
    return value


def choice(strategy: str, key: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ConfigError(
            f"{strategy}: parameter {key!r} must be one of {', '.join(options)}, got {value!r}"
        )
    return value


def flag(strategy: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{strategy}: parameter {key!r} must be true or false, got {value!r}")
    return value
