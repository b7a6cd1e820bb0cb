"""Scoring strategies: pure torch functions over grouped rows, registered by their spec name.

Importing this package registers every strategy. Use `create(name, params)` to get one.
"""

from transforms.strategies import grpo  # noqa: F401  (registers grpo, correct_bias)
from transforms.strategies.base import GroupedRows, Scores, Strategy
from transforms.strategies.registry import ConfigError, create, names, spec

__all__ = ["ConfigError", "GroupedRows", "Scores", "Strategy", "create", "names", "spec"]
