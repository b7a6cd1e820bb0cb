"""Scoring strategies: pure torch/numpy functions over grouped rows, registered by their spec name.

Each family module declares its strategies beside their math (registry.py `register`);
`names()`/`spec()` import them all (catalog.py) on first use, without torch, so option parsing,
`--help` and parameter checks stay light. Torch loads when a strategy is created or a
torch-side name below (GroupedRows, StrategyChain, ...) is first used.
Use `chain_of(names, params)` for a run's composition of stages, or `create(name, params)` for
one strategy.
"""

import importlib

from rescore.transforms.strategies.registry import ADVANTAGE, DUPLICATE, FILTER, ConfigError, create, names, spec

_LAZY = {
    "GroupedRows": "base",
    "Scores": "base",
    "Strategy": "base",
    "ChainScores": "chain",
    "StrategyChain": "chain",
    "build_chain": "chain",
    "chain_of": "chain",
}

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


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
