"""Scoring strategies: pure torch functions over grouped rows, registered by their spec name.

Importing this package registers every strategy. Use `chain_of(names, params)` for a run's
composition of stages, or `create(name, params)` for one strategy.
"""

from rescore.transforms.strategies import baselines, chord, distill, estimators, filters, gigpo, grpo, jsd, reinforce_pp, selection, step_wise  # noqa: F401  (register)
from rescore.transforms.strategies.base import (
    ADVANTAGE,
    DUPLICATE,
    FILTER,
    GroupedRows,
    Scores,
    Strategy,
)
from rescore.transforms.strategies.chain import ChainScores, StrategyChain, build_chain, chain_of
from rescore.transforms.strategies.registry import ConfigError, create, names, spec

__all__ = [
    "ADVANTAGE",
    "DUPLICATE",
    "FILTER",
    "ConfigError",
    "GroupedRows",
    "ChainScores",
    "Scores",
    "StrategyChain",
    "Strategy",
    "build_chain",
    "create",
    "names",
    "chain_of",
    "spec",
]
