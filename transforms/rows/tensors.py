"""Host arrays to torch tensors on the device the math runs on (what rows/groups.py and
rows/tokens.py hand to the strategies). Choosing that device (`--device`) is the Beam side's
job (transforms/device.py); torch is imported where a tensor is made, not with this module."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy array as a tensor on `device`: zero-copy on the CPU, one pinned-memory copy to a
    GPU."""
    import torch

    if not array.flags.writeable:  # Arrow hands out read-only views; torch warns on those
        array = array.copy()
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)
