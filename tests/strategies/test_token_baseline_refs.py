"""optimal_token_baseline (and its TIR variant) and clip_B against verl 0.9.1's and Trinity-RFT
0.6.0's own functions (tests/refs.py): random groups with masked tokens, empty and long
responses, a group of one, groups with one longest row (the zero tail) and tied longest rows;
advantages and kept tokens to 1e-5 relative."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from refs import ref  # noqa: F401  (the fixture)
from rescore.transforms.strategies.token_baseline_math import (
    clipb_keep,
    clipb_scores,
    clipb_signal,
    clipb_stats,
    optimal_token_baseline,
    outcome_token_rewards,
)

RTOL = 1e-5


def padded(seed: int, *, groups: int = 6, size: int = 4):
    """(lengths (n,), mask, logprobs, sum_pi_squared, is_weights, entropy (n, T) float64,
    reward (n,), group ids (n,)): lengths 0..30 with one 120, ~25% masked tokens, a group of one."""
    g = torch.Generator().manual_seed(seed)
    index = np.concatenate([np.repeat(np.arange(groups), size), [groups]])  # last: a group of one
    n = len(index)
    lengths = torch.randint(0, 31, (n,), generator=g)
    lengths[0], lengths[1] = 120, 0
    lengths[size] = lengths[size + 1] = 25  # a tied longest pair in group 1
    lengths[size + 2] = lengths[size + 3] = 10
    t = int(lengths.max())
    valid = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).double()
    mask = valid * (torch.rand(n, t, generator=g) > 0.25).double()
    mask[:, 0] = valid[:, 0]
    probs = torch.softmax(torch.randn(n, t, 8, generator=g, dtype=torch.float64) * 2, dim=-1)
    picked = torch.randint(0, 8, (n, t, 1), generator=g)
    logprobs = torch.log(torch.gather(probs, -1, picked).squeeze(-1)) * valid
    spp = (probs**2).sum(-1) * valid
    entropy = -(probs * torch.log(probs)).sum(-1) * valid
    is_weights = torch.exp(torch.randn(n, t, generator=g, dtype=torch.float64) * 0.2).clamp(max=2.0) * valid
    reward = torch.randint(0, 2, (n,), generator=g).double()
    reward[::5] = torch.randn(len(reward[::5]), generator=g, dtype=torch.float64)
    return lengths.numpy(), mask, logprobs, spp, is_weights, entropy, reward.numpy(), index


def flat(x: torch.Tensor, lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([x[i, : int(n)].numpy() for i, n in enumerate(lengths)]) if len(lengths) else np.zeros(0)


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def token_level_rewards(reward: np.ndarray, lengths: np.ndarray, t: int) -> torch.Tensor:
    out = torch.zeros(len(reward), t, dtype=torch.float64)
    for i, n in enumerate(lengths):
        if n:
            out[i, int(n) - 1] = reward[i]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tir", [False, True])
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("zero_tail", [True, False])
def test_optimal_token_baseline_equals_verl(ref, seed, tir, with_is, zero_tail):
    lengths, mask, lp, spp, isw, _, reward, index = padded(seed)
    fn = ref.verl.compute_multi_turn_optimal_token_baseline_advantage if tir else ref.verl.compute_optimal_token_baseline_advantage
    want, want_returns = fn(
        token_level_rewards(reward, lengths, mask.shape[1]),
        mask,
        index,
        lp,
        spp,
        rollout_is_weights=isw if with_is else None,
        handle_zero_tail=zero_tail,
    )
    offsets = offsets_of(lengths)
    got, got_returns = optimal_token_baseline(
        outcome_token_rewards(reward, offsets),
        flat(mask, lengths),
        offsets,
        index,
        flat(lp, lengths),
        flat(spp, lengths),
        flat(isw, lengths) if with_is else None,
        handle_zero_tail=zero_tail,
        tir=tir,
    )
    np.testing.assert_allclose(got, flat(want, lengths), rtol=RTOL, atol=1e-9)
    np.testing.assert_allclose(got_returns * flat(mask, lengths), flat(want_returns * mask, lengths), rtol=RTOL, atol=1e-12)
    # padding beyond each row stays zero in verl: nothing is lost by the flat layout
    assert float((want * (1 - (torch.arange(mask.shape[1]) < torch.as_tensor(lengths).unsqueeze(1)).double())).abs().sum()) == 0.0


def test_optimal_token_baseline_zero_tail_closed_form():
    """Rows of 4 and 2 tokens, rewards 1 and 0: past position 2 only the long row is left, so its
    own baseline there is W / (W + eps) ~ 1 (advantage ~ 0); the zero tail makes it 0 (advantage 1)."""
    lp = np.log(np.full(6, 0.5))
    spp = np.full(6, 0.4)
    offsets, group = np.array([0, 4, 6]), np.array([3, 3])
    rewards = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    on, returns = optimal_token_baseline(rewards, np.ones(6), offsets, group, lp, spp, handle_zero_tail=True)
    off, _ = optimal_token_baseline(rewards, np.ones(6), offsets, group, lp, spp, handle_zero_tail=False)
    np.testing.assert_array_equal(returns, [1, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(on[2:4], [1.0, 1.0])
    np.testing.assert_allclose(off[2:4], [0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(on[:2], off[:2])
    w = 1 - 2 * 0.5 + 0.4  # per token
    # positions 0 and 1: both rows, W_t = (t + 1) w each; B = (1 * W + 0 * W) / (2 W + eps)
    np.testing.assert_allclose(on[:2], 1 - np.array([w, 2 * w]) / (np.array([2 * w, 4 * w]) + 1e-8), rtol=1e-12)
    np.testing.assert_allclose(on[4:], -np.array([w, 2 * w]) / (np.array([2 * w, 4 * w]) + 1e-8), rtol=1e-12)


def test_optimal_token_baseline_closed_form_two_rows():
    """Two one-token rows: B = (r1 w1 + r2 w2) / (w1 + w2 + eps)."""
    lp = np.log(np.array([0.5, 0.25]))
    spp = np.array([0.5, 0.3])
    w = 1 - 2 * np.exp(lp) + spp
    reward = np.array([1.0, 0.0])
    got, _ = optimal_token_baseline(reward, np.ones(2), np.array([0, 1, 2]), np.array([7, 7]), lp, spp)
    b = (reward * w).sum() / (w.sum() + 1e-8)
    np.testing.assert_allclose(got, reward - b, rtol=1e-12)


def _trinity_clipb(ref, reward, mask, index, lp, entropy, mu):
    fn = ref.trinity.ClipBAdvantageFn(mu=mu)
    t = mask.shape[1]
    exps = ref.DataProto(
        {
            "token_level_rewards": token_level_rewards(reward, np.full(len(reward), t), t).float(),
            "response_mask": mask.float(),
            "rollout_log_probs": lp.float(),
            "entropys": entropy.float(),
        },
        {"uid": index},
    )
    out, metrics = fn(exps)
    return out.batch["advantages"], out.batch["response_mask"], metrics


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("mu", [2.5, 0.5])
def test_clipb_equals_trinity(ref, seed, mu):
    lengths, mask, lp, _, _, entropy, reward, index = padded(seed)
    # Trinity's reward is the sum of token rewards: put it where rescore's row reward is
    want_adv, want_mask, metrics = _trinity_clipb(ref, reward, mask, index, lp, entropy, mu)
    offsets = offsets_of(lengths)
    m = flat(mask, lengths)
    scores = clipb_scores(reward, index)
    row = np.repeat(np.arange(len(lengths)), lengths)
    adv = scores[row] * m
    np.testing.assert_allclose(adv, flat(want_adv.double(), lengths), rtol=RTOL, atol=1e-6)
    signal = clipb_signal(flat(lp, lengths), flat(entropy, lengths))
    es, var_s = clipb_stats(signal, m)
    np.testing.assert_allclose([es, var_s], [metrics["ES"], metrics["varS"]], rtol=1e-4)
    keep = clipb_keep(adv, signal, es, var_s, mu)
    got_mask = m * keep
    np.testing.assert_array_equal(got_mask, flat(want_mask.double(), lengths))
    assert (got_mask != m).any() or mu == 2.5  # mu = 0.5 clips some negative tokens
    # positive-advantage tokens are never removed
    assert (got_mask[(adv > 0)] == m[(adv > 0)]).all()
