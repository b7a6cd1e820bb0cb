"""An advantage estimator declared as one function, as verl's `register_adv_est` does: its
keyword-only parameters, typed and with defaults, are its declaration.

    @estimator("dr_grpo", summary="r - mean(G) (GRPO without the std division)")
    def dr_grpo_scores(reward: Tensor, offsets: Tensor) -> Tensor:
        return reward - per_row(group_mean(reward, offsets), offsets)

The function takes the rewards of many task groups, (n,) float64 sorted by group, the group
boundaries `offsets`, (G + 1,) int64, and its parameters as keyword arguments (the checked
values), and returns each row's score, (n,) float64. Every row is kept; the metrics' group mean
and std and the audit columns' baseline (the group mean) are the shared segment reductions'
(`segments.group_stats`), as for every per-group estimator.

The parameters are checked as a dataclass declaration's fields are (registry.py): `float`,
`int`, `bool`, `Literal[...]`, `Column`, `X | None`, tuples; `param(default, minimum=...)` as
the default adds bounds (the decorator then puts the plain default back on the function, so a
unit test calls it as written); `check=` takes a rule
across parameters, `check(values, strategy)` raising ConfigError. A strategy that needs more
than the rewards (token columns, batch statistics, output columns, dropping rows) is a class
registered with `registry.register`.

The decorator returns the function as it was, with two attributes: `parameters` (the generated
frozen dataclass) and `strategy` (the class `create()` instantiates), both importable by name
so that a strategy pickles to the workers.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rescore.transforms.strategies.base import GroupedRows, ScoreExplanation, Scores
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, parameter_fields, register
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

INPUTS = ("reward", "offsets")
"""The estimator function's positional arguments, in order."""


class FunctionEstimator(ScoreExplanation):
    """The strategy around an estimator function: no batch statistics, every row kept."""

    needs: tuple[str, ...] = ()
    batch_level = False
    function: Callable[..., Tensor]

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        mean, std = group_stats(rows.reward, rows.offsets)
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        values = {f.name: getattr(self, f.name) for f in parameter_fields(type(self))}
        return Scores(score=self.function(rows.reward, rows.offsets, **values), keep=keep, group_mean=mean, group_std=std)


def estimator(name: str, *, summary: str, check: Callable[[dict[str, Any], str], None] | None = None):
    """Decorator on an estimator function: register it under `name` (an advantage strategy)."""

    def wrap(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        fn.parameters = _parameters(name, fn, check)
        fn.strategy = type(
            "".join(p.title() for p in fn.__name__.split("_")),
            (FunctionEstimator, fn.parameters),
            {"function": staticmethod(fn), "__module__": fn.__module__, "__qualname__": f"{fn.__qualname__}.strategy"},
        )
        register(name, kind=ADVANTAGE, summary=summary)(fn.strategy)
        return fn

    return wrap


def _parameters(name: str, fn: Callable[..., Any], check) -> type[StrategyParams]:
    """The frozen dataclass of `fn`'s keyword-only parameters (annotations and defaults)."""
    signature = inspect.signature(fn)
    positional = [p.name for p in signature.parameters.values() if p.kind is not p.KEYWORD_ONLY]
    if tuple(positional) != INPUTS:
        raise TypeError(f"estimator {name!r}: {fn.__name__} takes ({', '.join(INPUTS)}, *, parameters...), not ({', '.join(positional)})")
    fields = []
    for p in signature.parameters.values():
        if p.kind is not p.KEYWORD_ONLY:
            continue
        if p.default is p.empty or p.name not in fn.__annotations__:
            raise TypeError(f"estimator {name!r}: parameter {p.name!r} needs a type and a default")
        default = p.default if isinstance(p.default, dataclasses.Field) else param(p.default)
        fields.append((p.name, fn.__annotations__[p.name], default))
        fn.__kwdefaults__[p.name] = default.default  # called directly, the function gets the value
    namespace = {} if check is None else {"check": classmethod(lambda cls, values, strategy: check(values, strategy))}
    params = dataclasses.make_dataclass(
        "".join(p.title() for p in fn.__name__.split("_")) + "Params", fields, bases=(StrategyParams,), frozen=True, namespace=namespace
    )
    params.__module__ = fn.__module__  # the annotations are read in the function's module
    params.__qualname__ = f"{fn.__qualname__}.parameters"
    return params
