"""An advantage estimator declared as one function, as verl's `register_adv_est` does: its
positional parameters name the inputs it reads, its keyword-only parameters, typed and with
defaults, are its declaration.

    @estimator("dr_grpo", summary="r - mean(G) (GRPO without the std division)")
    def dr_grpo_scores(reward: Tensor, offsets: Tensor) -> Tensor:
        return reward - per_row(group_mean(reward, offsets), offsets)

    @estimator("maxrl", summary="(r - mean(G)) / (mean(G) + epsilon) ...")
    def maxrl_scores(reward, offsets, *, epsilon: float = param(1e-6, minimum=0.0, help="added to ...")):
        ...

The positional parameters are fields of GroupedRows (base.py), passed as they are, in the
function's order: `reward` (n,) float64 and `offsets` (G + 1,) int64 (rows sorted by group,
group g in rows offsets[g]:offsets[g + 1]), and any of `batch`, `run`, `step`, `action_tokens`,
`response_length`, `last_action`, `task_key`, and `mean_logprob` (which makes the strategy need
the `logprobs` column) or `expert` (the `expert` column). Another name is refused where the
function registers. The keyword arguments are the checked parameter values; the function
returns each row's score, (n,) float64. Every row is kept; the metrics' group mean and std are
the shared segment reductions' (`segments.group_stats`), as for every per-group estimator.

The parameters are checked as a dataclass declaration's fields are (registry.py): `float`,
`int`, `bool`, `Literal[...]`, `Column`, `X | None`, tuples; the default is
`param(default, help="what it means", minimum=...)`: the help is required (the docs' parameter
table, `rescore strategies NAME`), the bounds optional (the decorator then puts the plain
default back on the function, so a unit test calls it as written). Decorator arguments, all
optional:

    check=     a rule across parameters, `check(values, strategy)` raising ConfigError
    needs=     input columns the strategy cannot work without, besides those its inputs imply
    baseline=  what --audit-columns writes as each row's `baseline` (what was subtracted from its
               reward; NaN where nothing was): a function whose positional parameters are named
               as the estimator's, plus `group_mean` ((n,) numpy, the group mean the metrics
               report, per row), and whose keyword-only parameters are some of the estimator's;
               it returns (n,) numpy or a tensor. Without it, the group mean.

What is not one function over per-row inputs stays a class registered with
`registry.register` (docs/architecture.md lists which and why): statistics over the whole batch,
token columns, output columns, dropping rows or explaining drops.

The decorator returns the function as it was, with two attributes: `parameters` (the generated
frozen dataclass) and `strategy` (the class `create()` instantiates), both importable by name
so that a strategy pickles to the workers.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, ScoreExplanation, Scores
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, parameter_fields, register
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

INPUTS = ("reward", "offsets", "batch", "run", "step", "action_tokens", "response_length", "last_action", "task_key", "mean_logprob", "expert")
"""The GroupedRows fields an estimator function may take as positional inputs."""
IMPLIED_NEEDS = {"mean_logprob": "logprobs", "expert": "expert"}
"""The input column an optional input comes from (the row layer reads it only when needed)."""
AUDIT_INPUTS = (*INPUTS, "group_mean")
"""A baseline function's inputs: the estimator's, and the reported group mean per row."""


class FunctionEstimator(ScoreExplanation):
    """The strategy around an estimator function: no batch statistics, every row kept."""

    needs: tuple[str, ...] = ()
    batch_level = False
    function: Callable[..., Tensor]
    inputs: tuple[str, ...] = ("reward", "offsets")
    baseline_function: Callable[..., Any] | None = None
    baseline_inputs: tuple[str, ...] = ()
    baseline_parameters: tuple[str, ...] = ()

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        mean, std = group_stats(rows.reward, rows.offsets)
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        values = {f.name: getattr(self, f.name) for f in parameter_fields(type(self))}
        score = self.function(*(getattr(rows, name) for name in self.inputs), **values)
        return Scores(score=score, keep=keep, group_mean=mean, group_std=std)

    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        if self.baseline_function is None:
            return super().audit_baseline(rows, group_mean)
        args = [group_mean if name == "group_mean" else getattr(rows, name) for name in self.baseline_inputs]
        out = self.baseline_function(*args, **{k: getattr(self, k) for k in self.baseline_parameters})
        if isinstance(out, torch.Tensor):
            out = out.detach().cpu().numpy()
        return np.asarray(out, dtype=np.float64)


def estimator(
    name: str,
    *,
    summary: str,
    check: Callable[[dict[str, Any], str], None] | None = None,
    needs: tuple[str, ...] = (),
    baseline: Callable[..., Any] | None = None,
):
    """Decorator on an estimator function: register it under `name` (an advantage strategy)."""

    def wrap(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        inputs = _inputs(name, fn, INPUTS)
        fn.parameters = _parameters(name, fn, check)
        declared = {f.name for f in parameter_fields(fn.parameters)}
        namespace = {
            "function": staticmethod(fn),
            "inputs": inputs,
            "needs": tuple(dict.fromkeys((*(IMPLIED_NEEDS[i] for i in inputs if i in IMPLIED_NEEDS), *needs))),
            "__module__": fn.__module__,
            "__qualname__": f"{fn.__qualname__}.strategy",
        }
        if baseline is not None:
            namespace["baseline_function"] = staticmethod(baseline)
            namespace["baseline_inputs"] = _inputs(name, baseline, AUDIT_INPUTS, needs_one=False)
            extra = [p for p in _keywords(baseline) if p not in declared]
            if extra:
                raise TypeError(f"estimator {name!r}: baseline {baseline.__name__} takes {extra[0]!r}, which is not one of its parameters")
            namespace["baseline_parameters"] = tuple(_keywords(baseline))
        fn.strategy = type("".join(p.title() for p in fn.__name__.split("_")), (FunctionEstimator, fn.parameters), namespace)
        register(name, kind=ADVANTAGE, summary=summary)(fn.strategy)
        return fn

    return wrap


def _keywords(fn: Callable[..., Any]) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]


def _inputs(name: str, fn: Callable[..., Any], allowed: tuple[str, ...], needs_one: bool = True) -> tuple[str, ...]:
    """`fn`'s positional parameters: the names of the inputs it reads, each one of `allowed`."""
    signature = inspect.signature(fn)
    bad = [p for p in signature.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if bad:
        raise TypeError(f"estimator {name!r}: {fn.__name__} takes named inputs and parameters, not {'*' if bad[0].kind is bad[0].VAR_POSITIONAL else '**'}{bad[0].name}")
    positional = tuple(p.name for p in signature.parameters.values() if p.kind is not p.KEYWORD_ONLY)
    unknown = [p for p in positional if p not in allowed]
    if unknown or (needs_one and not positional):
        what = f"{unknown[0]!r} is not an input" if unknown else "it reads no input"
        raise TypeError(f"estimator {name!r}: {fn.__name__} takes positional inputs named from {', '.join(allowed)} ({what})")
    return positional


def _parameters(name: str, fn: Callable[..., Any], check) -> type[StrategyParams]:
    """The frozen dataclass of `fn`'s keyword-only parameters (annotations and defaults)."""
    signature = inspect.signature(fn)
    # A function decorated before (registered again after `unregister`) has its plain defaults
    # back; its declaration's fields still hold the help and bounds.
    before = {f.name: f for f in dataclasses.fields(fn.parameters)} if isinstance(getattr(fn, "parameters", None), type) else {}
    fields = []
    for p in signature.parameters.values():
        if p.kind is not p.KEYWORD_ONLY:
            continue
        if p.default is p.empty or p.name not in fn.__annotations__:
            raise TypeError(f"estimator {name!r}: parameter {p.name!r} needs a type and a default")
        if isinstance(p.default, dataclasses.Field):
            default = p.default
        elif p.name in before:
            default = dataclasses.field(default=p.default, metadata=before[p.name].metadata)
        else:
            default = param(p.default)
        fields.append((p.name, fn.__annotations__[p.name], default))
        fn.__kwdefaults__[p.name] = default.default  # called directly, the function gets the value
    namespace = {} if check is None else {"check": classmethod(lambda cls, values, strategy: check(values, strategy))}
    params = dataclasses.make_dataclass(
        "".join(p.title() for p in fn.__name__.split("_")) + "Params", fields, bases=(StrategyParams,), frozen=True, namespace=namespace
    )
    params.__module__ = fn.__module__  # the annotations are read in the function's module
    params.__qualname__ = f"{fn.__qualname__}.parameters"
    return params
