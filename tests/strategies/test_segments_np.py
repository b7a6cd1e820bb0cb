"""The numpy group math (segments_np.py, grpo_np.py) against the torch math it stands in for,
bit for bit, on random groups: sizes 1..64, ties, all-equal groups, values near 1e300, -0.0,
NaN-free inputs of any scale, a batch std, a std threshold."""

import numpy as np
import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from rescore.transforms.strategies import grpo, grpo_np, segments, segments_np

SETTINGS = settings(max_examples=25, deadline=None)


def _torch_sqrt(values):
    """torch's own float64 sqrt on the CPU (MKL's vdSqrt where torch has MKL)."""
    return torch.sqrt(torch.from_numpy(np.ascontiguousarray(values))).numpy()


_values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),  # any scale, 1e300 and subnormals included
    st.floats(min_value=-1e300, max_value=1e300).map(lambda x: x if abs(x) > 1e290 else x * 1e-290),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.1, 1e300, -1e300, 5e-324]),
    st.integers(-3, 3).map(float),  # ties
)


@st.composite
def _groups(draw):
    sizes = draw(st.lists(st.integers(1, 64), min_size=1, max_size=10))
    values = []
    for size in sizes:
        if draw(st.booleans()):  # an all-equal group
            values += [draw(_values)] * size
        else:
            values += draw(st.lists(_values, min_size=size, max_size=size))
    return np.array(values, dtype=np.float64), np.array([0, *np.cumsum(sizes)], dtype=np.int64)


def _same(a, b):
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # bits: -0.0 and NaN payloads too


def _t(x):
    return torch.from_numpy(x)


@SETTINGS
@given(_groups())
def test_group_statistics_equal_the_torch_math_bit_for_bit(data):
    values, offsets = data
    note(f"values {[v.hex() for v in values.tolist()]} offsets {offsets.tolist()}")
    _same(segments_np.segment_sum(values, offsets), segments.segment_sum(_t(values), _t(offsets)).numpy())
    _same(segments_np.zero_spread(values, offsets), segments.zero_spread(_t(values), _t(offsets)).numpy())
    for mine, theirs in zip(segments_np.mean_and_std(values, offsets), segments.mean_and_std(_t(values), _t(offsets))):
        _same(mine, theirs.numpy())
    for mine, theirs in zip(segments_np.group_stats(values, offsets), segments.group_stats(_t(values), _t(offsets))):
        _same(mine, theirs.numpy())
    _same(np.float64(segments_np.std_of(values)), np.float64(float(segments.std_of(_t(values)))))


@SETTINGS
@given(_groups(), st.sampled_from([0.0, 1e-6, 0.5]), st.sampled_from([None, 0.0, 0.3]), st.booleans())
def test_grpo_scores_equal_the_torch_math_bit_for_bit(data, epsilon, threshold, with_batch_std):
    values, offsets = data
    batch_std = np.where(np.arange(len(values)) % 3 == 0, 0.0, 0.25 + np.arange(len(values)) % 7) if with_batch_std else None
    mine = grpo_np.grpo_scores(values, offsets, epsilon=epsilon, batch_std=batch_std, std_threshold=threshold)
    theirs = grpo.grpo_scores(_t(values), _t(offsets), epsilon=epsilon,
                              batch_std=None if batch_std is None else _t(batch_std), std_threshold=threshold)
    _same(mine.score, theirs.score.numpy())
    _same(mine.keep, theirs.keep.numpy())
    _same(mine.group_mean, theirs.group_mean.numpy())
    _same(mine.group_std, theirs.group_std.numpy())


def test_the_sum_is_sequential_as_torch_adds_not_pairwise():
    # must be able to fail: numpy's pairwise sum of these 12 values gives 8.0, the sequential 1.0
    values = np.array([1e16] + [1.0] * 9 + [-1e16, 1.0])
    offsets = np.array([0, 12, 12])  # and an empty group: 0.0
    assert float(np.add.reduceat(values, [0])[0]) == 8.0
    _same(segments_np.segment_sum(values, offsets), np.array([1.0, 0.0]))
    _same(segments_np.segment_sum(values, offsets), segments.segment_sum(_t(values), _t(offsets)).numpy())


def test_the_std_takes_ieees_square_root_on_both_paths(monkeypatch):
    """torch's float64 sqrt on the CPU is not correctly rounded (MKL's vdSqrt): on this value it
    is one ulp from IEEE's. segments.py takes the std's square root from numpy
    (`segments.ieee_sqrt`), so the torch path's std equals the numpy path's, bit for bit, even
    here; with torch's own sqrt it would not."""
    monkeypatch.setattr(segments_np, "SQRT", np.sqrt)
    var = np.array([float.fromhex("0x1.7679360091895p-7")])
    assert segments.ieee_sqrt(torch.from_numpy(var)).numpy()[0] == np.sqrt(var)[0]
    values = np.zeros(147)
    values[106] = -float.fromhex("0x1.7e43c8800759cp+996")
    values[145:] = -values[106]
    offsets = np.array([0, 147])
    mine = segments_np.mean_and_std(values, offsets)[1]
    theirs = segments.mean_and_std(torch.from_numpy(values), torch.from_numpy(offsets))[1].numpy()
    _same(mine, theirs)
    if _torch_sqrt(var)[0] == np.sqrt(var)[0]:
        pytest.skip("this machine's torch sqrt rounds this value as IEEE does (no MKL)")
    monkeypatch.setattr(segments, "ieee_sqrt", torch.sqrt)
    mkl = segments.mean_and_std(torch.from_numpy(values), torch.from_numpy(offsets))[1].numpy()
    assert abs(mine[0] - mkl[0]) == np.spacing(mkl[0])


@pytest.mark.parametrize("sizes", [[1], [8] * 5, [3, 64, 1, 17, 2]])
def test_spec_values_and_conventions(sizes):
    offsets = np.array([0, *np.cumsum(sizes)])
    reward = np.arange(offsets[-1], dtype=np.float64) % 5
    got = grpo_np.grpo_scores(reward, offsets, epsilon=1e-6)
    for g, (a, b) in enumerate(zip(offsets[:-1], offsets[1:])):
        r = reward[a:b]
        if len(r) == 1:  # a group of one: mean 0, std 1 (Trinity-RFT)
            assert got.group_mean[g] == 0.0 and got.group_std[g] == 1.0
            assert got.score[a] == r[0] / (1 + 1e-6)
        else:
            np.testing.assert_allclose(got.score[a:b], (r - r.mean()) / (r.std(ddof=1) + 1e-6), rtol=1e-12)
    assert got.keep.all()
