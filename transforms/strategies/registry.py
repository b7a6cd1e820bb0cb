"""Strategies by registry name: each one's parameters declared once, and the checks derived
from them. Light on purpose: no torch, numpy, pyarrow or Beam here, so option parsing and
`--help` can list and validate strategies without loading the math.

A strategy is declared in its family's module, beside its math: its parameters one frozen
dataclass, and the class that does the math, a subclass of it, registered under the reference's
name with its kind and a one-line summary:

    @dataclass(frozen=True)
    class ClipBParams(StrategyParams):
        epsilon: float = param(1e-6, minimum=0.0, help="added to the std of the GRPO advantage")
        mu: float = param(2.5, minimum=0.0, help="a negative-advantage token leaves the mask when ...")


    @register("clipb", kind=ADVANTAGE, summary="GRPO advantages; negative-advantage tokens ...")
    class ClipB(ClipBParams):
        ...

(An estimator that is one function over per-row inputs is declared by its signature instead:
function_estimator.py.) The field types say what a value may be (`float`, `int`, `bool`,
`Literal[...]` for a choice, `Column` for an input column name, `X | None` where null is
allowed, tuples for lists); `param()` gives the meaning (`help=`, required: `register` refuses
a parameter without it) and adds bounds. Defaults, validation, the one-line errors, `--help`,
`rescore strategies NAME` and the docs tables (pipelines/strategy_docs.py) all come from that
one declaration, so `self.mu` is the checked value. The family modules import torch only on
first use (tensors.py): listing and checking strategies loads none of the math's libraries but
numpy.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field

from rescore.transforms.strategies import families
from typing import Any, Literal, NewType

from rescore.errors import ConfigError  # noqa: F401  (strategies raise it; defined in rescore/errors.py)
from rescore.transforms.strategies.features import WHOLE_BATCH  # noqa: F401  (a need: features.py; gigpo, variance)


FILTER, ADVANTAGE, DUPLICATE = "filter", "advantage", "duplicate"
KINDS = (FILTER, ADVANTAGE, DUPLICATE)
"""The kinds that drop rows, in chain order (at most one of each per run)."""
SHAPE = "shape"
"""Reward shaping: runs first, before any filter or statistic, and returns new per-row rewards
(chain.py); several shaping strategies chain in the order given."""


Column = NewType("Column", str)
Path = NewType("Path", str)
"""A parameter naming a file or directory (a non-empty string)."""
"""A parameter that names an input column (a non-empty string)."""


@dataclass(frozen=True)
class StrategyParams:
    """Base of every strategy's parameter declaration. `name` and `kind` are set by `create()`
    from the registry entry (one declaration may be registered under two names)."""

    _: KW_ONLY
    name: str = ""
    kind: str = ""

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        """Checks that span parameters, over the checked values; raise ConfigError."""

    @property
    def params(self) -> dict[str, Any]:
        """The resolved parameters as run configs and metrics.json record them (lists as lists)."""
        out = {}
        for f in parameter_fields(type(self)):
            value = getattr(self, f.name)
            if f.metadata.get("hidden_at_default") and value == f.default:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def param(
    default: Any,
    *,
    minimum: float | None = None,
    between: tuple[float, float] | None = None,
    positive: bool = False,
    nonzero: bool = False,
    null: Any = dataclasses.MISSING,
    none_message: str | None = None,
    hidden_at_default: bool = False,
    help: str = "",
) -> Any:
    """A parameter field with its meaning and bounds beyond its type.

    help: what the parameter means, one sentence or a few, kept on one line (required:
    `register` refuses a parameter without it; docs/strategies.md's parameter tables and
    `rescore strategies NAME` print it); minimum: value >= minimum; between: lo <= value <= hi;
    positive: value > 0; nonzero: value != 0; null: what an explicit null means for a field
    that does not allow None;
    none_message: the error for null on a required column; hidden_at_default: left out of the
    resolved params at its default (added later: earlier runs' config hashes stay the same).
    """
    if not isinstance(help, str):
        raise TypeError(f"a parameter's help is a string (what it means), not {help!r}")
    meta = {
        "minimum": minimum,
        "between": between,
        "positive": positive,
        "nonzero": nonzero,
        "null": null,
        "none_message": none_message,
        "hidden_at_default": hidden_at_default,
        "help": " ".join(help.split()),  # one line: a newline (or U+2028) never ends a table row
    }
    if isinstance(default, (list, dict)):
        raise TypeError("parameter defaults must be immutable (use a tuple)")
    return field(default=default, metadata=meta)


def parameter_fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """The declared parameters of a StrategyParams class, in declaration order."""
    return tuple(f for f in dataclasses.fields(cls) if f.name not in ("name", "kind"))


def help_text(f: dataclasses.Field) -> str:
    """A parameter's meaning as its `param(help=...)` declares it ('' where it has none)."""
    return f.metadata.get("help", "") if f.metadata else ""


def _require_help(name: str, params: type) -> None:
    """Refuse a declaration with a parameter whose meaning is not declared: the docs' parameter
    tables and `rescore strategies NAME` are written from it."""
    missing = [f.name for f in parameter_fields(params) if not help_text(f)]
    if missing:
        raise TypeError(
            f"strategy {name!r}: parameter {missing[0]!r} has no help; declare it as "
            f"{missing[0]}: TYPE = param(DEFAULT, help=\"what it means\")"
        )


@dataclass(frozen=True)
class StrategySpec:
    name: str
    kind: str
    params: type[StrategyParams]
    implementation: str | Callable[..., Any]
    """The class that does the math (a subclass of `params`), or 'module:Name' under
    rescore.transforms.strategies for a declaration whose math lives elsewhere (a preset)."""
    summary: str

    @property
    def defaults(self) -> dict[str, Any]:
        return {f.name: list(f.default) if isinstance(f.default, tuple) else f.default for f in parameter_fields(self.params)}

    @property
    def factory(self) -> Callable[..., Any]:
        if not isinstance(self.implementation, str):
            return self.implementation
        module, _, cls = self.implementation.partition(":")
        return getattr(importlib.import_module(f"rescore.transforms.strategies.{module}"), cls)

    def describe(self) -> str:
        """One line per parameter, `name: type = default`, for --help and the docs."""
        hints = _hints(self.params)
        return "\n".join(f"{f.name}: {_type_name(hints[f.name])} = {f.default!r}" for f in parameter_fields(self.params))

    def parameters(self) -> list[tuple[str, str, Any, str]]:
        """(name, type and bounds as text, default, help) of each parameter, in declaration
        order: the docs' parameter tables (pipelines/strategy_docs.py)."""
        hints = _hints(self.params)
        return [(f.name, _type_name(hints[f.name]) + _bounds_text(f.metadata), f.default, help_text(f)) for f in parameter_fields(self.params)]


_REGISTRY: dict[str, StrategySpec] = {}
FAMILIES = "rescore.transforms.strategies.catalog"
"""The module whose import registers every shipped strategy (each family module registers its
own); `names()` imports it on first use, `spec(name)` only the family of `name` (families.py),
so importing this package (or strategies/features.py from the row layer) loads no family and no
numpy."""


def _registry() -> dict[str, StrategySpec]:
    """Every registered strategy, the shipped families' included."""
    importlib.import_module(FAMILIES)
    return _REGISTRY


def register(name: str, *, kind: str, summary: str, implementation: str | None = None):
    """Decorator on a strategy's class: register it under `name` (as verl's `register_adv_est`).

    The class subclasses its parameters' frozen dataclass (a StrategyParams); that dataclass's
    typed fields are the declaration. Without a class of its own (a framework's preset of
    another strategy), decorate the dataclass and name the math as `implementation`
    ('module:Name'). Refuses a name that is already taken, so two declarations cannot silently
    shadow each other.
    """
    if kind not in (SHAPE, *KINDS):
        raise ValueError(f"strategy {name!r}: kind must be one of {', '.join((SHAPE, *KINDS))}")

    def wrap(cls):
        if not families.loading(name):  # a shipped name declared elsewhere: its family first, then refused
            families.load(name)
        if name in _REGISTRY:
            raise ValueError(f"strategy {name!r} is already registered")
        params = declaration(cls)
        _hints(params)  # a declaration whose types do not resolve fails here, at import
        _require_help(name, params)
        _REGISTRY[name] = StrategySpec(name, kind, params, implementation or cls, summary)
        return cls

    return wrap


def unregister(name: str) -> None:
    """Forget the strategy `name` (one a test or a plugin registered for a while)."""
    _REGISTRY.pop(name, None)


def declaration(cls: type) -> type[StrategyParams]:
    """The parameters' dataclass of a strategy class: the nearest StrategyParams dataclass it is
    or derives from."""
    for c in cls.__mro__:
        if "__dataclass_fields__" in c.__dict__ and issubclass(c, StrategyParams):
            return c
        # `x: int = param(...)` on a class that lost its @dataclass(frozen=True) leaves a Field
        # where the parameter should be: the strategy would register without it (a merge did that).
        undeclared = [k for k, v in vars(c).items() if isinstance(v, dataclasses.Field)]
        if undeclared:
            raise TypeError(f"{c.__name__} declares {', '.join(undeclared)} with param() but is not a @dataclass(frozen=True)")
    raise TypeError(f"{cls.__name__} is not a StrategyParams dataclass nor derived from one")


def names() -> list[str]:
    return sorted(_registry())


def close_match(name: str, choices) -> str | None:
    """The choice `name` most likely meant (close_matches' first), or None when nothing is close."""
    hints = close_matches(name, choices, n=1)
    return hints[0] if hints else None


def close_matches(name: str, choices, n: int = 3) -> list[str]:
    """Up to `n` choices `name` may have meant, nearest first: the same but for case alone when
    there is one (`GRPO`), else the closest by difflib, ignoring case."""
    by_lower = {c.lower(): c for c in choices}
    if name.lower() in by_lower:
        return [by_lower[name.lower()]]
    return [by_lower[h] for h in difflib.get_close_matches(name.lower(), list(by_lower), n=n)]


def did_you_mean(hints: list[str]) -> str:
    """' (did you mean 'a'?)', ' (did you mean 'a', 'b' or 'c'?)', or '' for no hint."""
    if not hints:
        return ""
    quoted = [repr(h) for h in hints]
    return f" (did you mean {quoted[0] if len(quoted) == 1 else ', '.join(quoted[:-1]) + ' or ' + quoted[-1]}?)"


def spec(name: str) -> StrategySpec:
    """The strategy `name`; an unknown name is a ConfigError naming the nearest ones (never all
    of them: `rescore strategies` lists those)."""
    if name not in _REGISTRY:
        families.load(name)  # the family that declares it (families.py), not every family
    if name not in _REGISTRY and name not in _registry():
        raise ConfigError(
            f"unknown strategy {name!r}{did_you_mean(close_matches(name, names()))}; "
            f"`rescore strategies` lists all {len(_REGISTRY)}"
        )
    return _REGISTRY[name]


def resolve(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checked parameters of strategy `name`: `params` over its defaults. Needs no torch."""
    s = spec(name)
    params = dict(params or {})
    unknown = sorted(set(params) - set(s.defaults))
    if unknown:
        valid = ", ".join(sorted(s.defaults)) or "(none)"
        hint = close_match(unknown[0], s.defaults)
        did_you_mean = f" (did you mean {hint!r}?)" if hint else ""
        raise ConfigError(f"unknown parameter {unknown[0]!r} for strategy {name!r}{did_you_mean}; valid parameters: {valid}")
    hints = _hints(s.params)
    values = {}
    for f in parameter_fields(s.params):
        value = params.get(f.name, f.default)
        values[f.name] = _checked(name, f.name, value, hints[f.name], f.metadata)
    s.params.check(values, name)
    return values


def create(name: str, params: Mapping[str, Any] | None = None, *, load_math: bool = True):
    """The strategy `name` with `params` over its defaults. Raises ConfigError on anything off.
    `load_math`: import torch now (False: where it is first used; a run on numpy never does)."""
    values = resolve(name, params)
    s = spec(name)
    if load_math:
        importlib.import_module("torch")  # the math's library, loaded with the strategy (tensors.py)
    return s.factory(**values, name=name, kind=s.kind)


# --- checks derived from the field types ------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def _type_name(hint: Any) -> str:
    inner, optional = _optional(hint)
    if typing.get_origin(inner) is Literal:
        text = "|".join(str(a) for a in typing.get_args(inner))
    elif inner is Column:
        text = "column"
    elif inner is Path:
        text = "path"
    elif typing.get_origin(inner) is tuple:
        text = "list"
    else:
        text = getattr(inner, "__name__", str(inner))
    return text + (" or null" if optional else "")


def _bounds_text(meta: Mapping[str, Any]) -> str:
    """The bounds `param()` adds, as text: ', >= 0', ', in [0, 1]', ', > 0', ', != 0'."""
    parts = []
    if meta.get("minimum") is not None:
        parts.append(f">= {meta['minimum']:g}")
    if meta.get("between") is not None:
        parts.append(f"in [{meta['between'][0]:g}, {meta['between'][1]:g}]")
    if meta.get("positive"):
        parts.append("> 0")
    if meta.get("nonzero"):
        parts.append("!= 0")
    return "".join(f", {p}" for p in parts)


def _checked(strategy: str, key: str, value: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    inner, optional = _optional(hint)
    if value is None and not optional and meta.get("null", dataclasses.MISSING) is not dataclasses.MISSING:
        value = meta["null"]
    if typing.get_origin(inner) is Literal:
        if optional and value in (None, "none", "null"):
            return None
        return choice(strategy, key, value, typing.get_args(inner))
    if inner is Column:
        if value is None and meta.get("none_message"):
            raise ConfigError(f"{strategy}: parameter {key!r} {meta['none_message']}")
        if value is None and optional:
            return None
        return column(strategy, key, value)
    if inner is Path:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{strategy}: parameter {key!r} must be a path, got {value!r}")
        return value
    if inner is bool:
        return flag(strategy, key, value)
    if inner is str:  # free text another check reads (verl's "0.999_1.001" thresholds)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            raise ConfigError(f"{strategy}: parameter {key!r} must be a string or a number, got {value!r}")
        return str(value).strip()
    if inner is int:
        if value is None and optional:
            return None
        return integer(strategy, key, value, minimum=meta.get("minimum"))
    if inner is float:
        checked = number(strategy, key, value, minimum=meta.get("minimum"), optional=optional)
        return checked if checked is None else _bounded(strategy, key, checked, value, meta)
    if typing.get_origin(inner) is tuple:
        if value is None and optional:
            return None
        return _sequence(strategy, key, value, typing.get_args(inner))
    raise TypeError(f"{strategy}: parameter {key!r} has a type the registry cannot check: {hint!r}")


def _bounded(strategy: str, key: str, value: float, given: Any, meta: Mapping[str, Any]) -> float:
    """`value` (the float of `given`) within the field's bounds."""
    between = meta.get("between")
    if between is not None and not between[0] <= value <= between[1]:
        raise ConfigError(f"{strategy}: parameter {key!r} must be between {between[0]:g} and {between[1]:g}, got {value!r}")
    if meta.get("positive") and value <= 0:
        raise ConfigError(f"{strategy}: parameter {key!r} must be > 0, got {given!r}")
    if meta.get("nonzero") and value == 0:
        raise ConfigError(f"{strategy}: parameter {key!r} must not be 0")
    return value


def _sequence(strategy: str, key: str, value: Any, args: tuple) -> tuple:
    """A list parameter: `tuple[X, ...]` of any length, or `tuple[X, Y]` of that length."""
    if args and args[-1] is Ellipsis:
        item = args[0]
        if item is Column:
            if isinstance(value, str):  # --set gdpo_reward_keys=a,b
                value = [k.strip() for k in value.split(",") if k.strip()]
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{strategy}: parameter {key!r} must be a list of column names, got {value!r}")
            keys = tuple(column(strategy, key, k) for k in value)
            if len(set(keys)) != len(keys):
                raise ConfigError(f"{strategy}: parameter {key!r} names a column twice: {list(keys)}")
            return keys
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{strategy}: parameter {key!r} must be a list of numbers, got {value!r}")
        return tuple(number(strategy, key, v) for v in value)
    if not isinstance(value, (list, tuple)) or len(value) != len(args):
        raise ConfigError(f"{strategy}: parameter {key!r} must be [low, high], got {value!r}")
    return tuple(number(strategy, key, v) for v in value)


# --- one-value checks (the wording of every parameter error) ---------------------------------


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


def column(strategy: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{strategy}: parameter {key!r} must be a column name, got {value!r}")
    return value
