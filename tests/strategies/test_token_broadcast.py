"""The token broadcast on the host (numpy) gives torch's float32 values bit for bit; under a zero mask it is +0.0."""

import numpy as np
import pytest
import torch

from rescore.transforms.strategies.tokens import token_advantages, token_advantages_host


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("mask_dtype", [np.int8, np.bool_, np.int32, np.float32, None])
def test_host_broadcast_is_torch_bit_for_bit(mask_dtype):
    rng = np.random.default_rng(7)
    n = 500
    lengths = rng.integers(0, 40, n).astype(np.int64)
    lengths[::17] = 0  # empty responses
    row_value = rng.normal(0, 3, n)
    row_value[::5] *= -1e-30  # tiny negatives: float32 rounding and -0.0 times a 0 mask
    row_value[::7] = 0.0
    mask = None if mask_dtype is None else (rng.random(int(lengths.sum())) < 0.8).astype(mask_dtype)
    want = token_advantages(
        torch.from_numpy(row_value), torch.from_numpy(lengths), None if mask is None else torch.from_numpy(mask)
    ).numpy()
    got = token_advantages_host(row_value, lengths, mask)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(_bits(got), _bits(want))
    if mask is not None:
        assert not np.signbit(got[mask == 0]).any()  # masked tokens are +0.0, never -0.0


def test_host_broadcast_values():
    got = token_advantages_host(np.array([0.5, -2.0]), np.array([2, 3]), np.array([1, 0, 1, 1, 0], np.int8))
    assert got.tolist() == [0.5, 0.0, -2.0, -2.0, 0.0]


def test_zero_mask_gives_positive_zero():
    from rescore.transforms.strategies.tokens import token_advantages

    out = token_advantages(torch.tensor([-1.5, 2.0], dtype=torch.float64), torch.tensor([3, 2]), torch.tensor([0, 1, 0, 0, 1]))
    assert out.tolist() == [0.0, -1.5, 0.0, 0.0, 2.0]
    assert not torch.signbit(out[[0, 2, 3]]).any()  # +0.0, never -0.0
