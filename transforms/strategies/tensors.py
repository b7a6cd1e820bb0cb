"""`torch` as the strategy modules use it: imported where the math first runs, not where a
module is imported.

Each family module declares its strategies beside their math (registry.py); option parsing,
`--help` and `rescore strategies` import every family to read those declarations and must not
load torch (about a second of start-up; tests/pipelines/test_startup.py). So a family module
writes `from rescore.transforms.strategies.tensors import torch` and `Tensor` in annotations
only; the first attribute read (`torch.where`) imports torch. `registry.create` reads one
before it returns a strategy, so a created strategy has its math loaded.
"""

from __future__ import annotations

import importlib
from typing import Any


class _Deferred:
    """A module imported on first attribute access (importlib's lock makes that thread-safe);
    each attribute is then kept on the handle, so later reads cost a plain attribute lookup."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<deferred module {self._name!r}>"


torch: Any = _Deferred("torch")
