"""rollout_correction against the frameworks' own functions, imported from their wheels
(tests/refs_offpolicy.py): verl 0.9.1 rollout_corr_helper, TRL 1.16.0 GRPOTrainer, SkyRL 0.3.0
off_policy_correction_utils, OpenRLHF 0.11.2 PolicyLoss. Random rows with masked tokens, empty
and long responses, log ratios out to +-25 (past the +-20 safety clamp), and batches where every
row is rejected. Weights, masks and metrics to 1e-5 relative."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

import refs_offpolicy
from refs import RefsUnavailable
from rescore.transforms.strategies import registry
from rescore.transforms.strategies.offpolicy_correct import correct
from rescore.transforms.strategies.offpolicy_trl import off_policy_sequence_mask
from rescore.transforms.strategies.offpolicy_verl import (
    batch_normalize_factor,
    batch_normalize_terms,
    metric_terms,
    metrics_from_sums,
    offpolicy_metrics,
)

RTOL = 1e-5


def _ref(loader):
    try:
        return loader()
    except RefsUnavailable as e:
        pytest.skip(str(e))


def batch(seed: int, *, rows: int = 24, extreme: bool = True, scale: float = 0.3):
    """(logprobs, behaviour, mask) (B, T) float64: lengths 0..40 and one of 300, ~20% of the
    tokens masked, log ratios N(0, scale) with a few at +-25."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 41, (rows,), generator=g)
    lengths[0], lengths[1] = 300, 0
    t = int(lengths.max())
    pos = torch.arange(t).unsqueeze(0)
    valid = (pos < lengths.unsqueeze(1)).double()
    mask = valid * (torch.rand(rows, t, generator=g) > 0.2).double()
    behaviour = -torch.rand(rows, t, generator=g, dtype=torch.float64) * 4 * valid
    noise = torch.randn(rows, t, generator=g, dtype=torch.float64) * scale
    if extreme:
        spikes = torch.rand(rows, t, generator=g) < 0.01
        noise = torch.where(spikes, torch.sign(torch.randn(rows, t, generator=g, dtype=torch.float64)) * 25.0, noise)
    logprobs = (behaviour + noise) * valid
    return logprobs, behaviour, mask


def params(name: str = "rollout_correction", **values):
    return types.SimpleNamespace(**registry.resolve(name, values))


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.double(), b.double(), rtol=RTOL, atol=1e-9, equal_nan=False)


SEEDS = [0, 1, 2]

# --- verl -------------------------------------------------------------------------------------

VERL_IS = [("token", "2.0"), ("sequence", "2.0"), ("token", "0.5_5.0"), ("sequence", "0.5_5.0"), ("token", "1.2")]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level, threshold", VERL_IS)
def test_verl_weights(seed, level, threshold):
    verl = _ref(refs_offpolicy.verl)
    lp, bp, mask = batch(seed)
    ours = correct(params(rollout_is=level, rollout_is_threshold=threshold), lp, bp, mask)
    theirs, _ = verl.compute_rollout_correction_weights(lp - bp, mask, rollout_is=level, rollout_is_threshold=threshold)
    close(ours.weights, theirs * mask)
    close(ours.mask, mask)  # weights never reject


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level,threshold", [("token", "2.0"), ("sequence", "2.0"), ("token", "0.5_2.0"), ("sequence", "0.5_5.0")])
def test_batch_normalize_equals_verl(seed, level, threshold):
    """verl's rollout_is_batch_normalize from per-row terms summed in any split of the batch
    (as rows meet in a batch statistic): the same divisor and the same normalised weights."""
    verl = _ref(refs_offpolicy.verl)
    lp, bp, mask = batch(seed)
    theirs, metrics = verl.compute_rollout_correction_weights(
        lp - bp, mask, rollout_is=level, rollout_is_threshold=threshold, rollout_is_batch_normalize=True
    )
    weights = correct(params(rollout_is=level, rollout_is_threshold=threshold), lp, bp, mask).weights
    num, den = batch_normalize_terms(weights, mask, level)
    halves = [(float(num[:7].sum()) + float(num[7:].sum()), float(den[:7].sum()) + float(den[7:].sum()))]
    factor = batch_normalize_factor(*halves[0], level)
    assert math.isclose(factor, metrics["rollout_is_batch_norm_factor"], rel_tol=1e-5)
    assert factor != 1.0  # the weights really are rescaled
    close(weights / factor, theirs * mask)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("level,threshold", [("token", "2.0"), ("sequence", "2.0"), ("token", "0.5_2.0"), ("sequence", "0.5_5.0")])
def test_weight_statistics_equal_verl(seed, level, threshold):
    """metrics.json's rollout_is_mean / _std / _eff_sample_size / _ratio_fraction_high / _low
    from per-row terms summed over the batch: verl's compute_is_metrics, ratios out to +-25."""
    from rescore.transforms.strategies.offpolicy_spec import parse_is_threshold

    verl = _ref(refs_offpolicy.verl)
    lp, bp, mask = batch(seed)
    _, want = verl.compute_rollout_correction_weights(lp - bp, mask, rollout_is=level, rollout_is_threshold=threshold)
    weights = correct(params(rollout_is=level, rollout_is_threshold=threshold), lp, bp, mask).weights
    upper, lower = parse_is_threshold(threshold)
    terms = metric_terms(lp, bp, mask, weights, upper, level, lower)
    sums = {k: math.fsum(v.tolist()) for k, v in terms.items()}
    got = metrics_from_sums(sums, 0.0, 0.0)
    names = ("rollout_is_mean", "rollout_is_std", "rollout_is_eff_sample_size", "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low")
    for name in names:
        assert math.isclose(got[name], want[name], rel_tol=RTOL, abs_tol=1e-9), (name, got[name], want[name])
    assert got["rollout_is_ratio_fraction_high"] > 0 and got["rollout_is_ratio_fraction_low"] > 0


def test_batch_normalize_all_zero_weights_left_alone():
    """A batch whose weights are all zero (every token outside IcePop's band): divisor 1, as in verl."""
    mask = torch.ones(2, 3, dtype=torch.float64)
    num, den = batch_normalize_terms(torch.zeros(2, 3, dtype=torch.float64), mask, "token")
    assert batch_normalize_factor(float(num.sum()), float(den.sum()), "token") == 1.0
    with pytest.raises(ValueError):
        batch_normalize_terms(mask, mask, "geometric")


VERL_RS = [
    ("token_k1", "0.5_2.0"), ("token_k2", "0.5"), ("token_k3", "0.3"),
    ("seq_sum_k1", "0.01_100"), ("seq_sum_k2", "5.0"), ("seq_sum_k3", "8.0"),
    ("seq_mean_k1", "0.999_1.001"), ("seq_mean_k1", "1.3"), ("seq_mean_k2", "0.05"), ("seq_mean_k3", "0.01"),
    ("seq_max_k2", "2.0"), ("seq_max_k3", "3.0"),
    ("token_k1,seq_mean_k3", "0.5_2.0,0.05"), ("seq_sum_k1,seq_max_k2", "0.1_10,50"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("options, threshold", VERL_RS)
def test_verl_rejection(seed, options, threshold):
    verl = _ref(refs_offpolicy.verl)
    lp, bp, mask = batch(seed)
    ours = correct(params(rollout_rs=options, rollout_rs_threshold=threshold), lp, bp, mask)
    theirs, _ = verl.compute_rollout_rejection_mask(lp - bp, mask, rollout_rs=options, rollout_rs_threshold=threshold)
    assert torch.equal(ours.mask, theirs.double())
    emptied = (mask.sum(-1) > 0) & (ours.mask.sum(-1) == 0)
    assert torch.equal(ours.reason > 0, emptied)


VERL_PRESETS = [
    "decoupled_token_is", "decoupled_seq_is", "decoupled_token_icepop", "decoupled_seq_is_rs", "decoupled_geo_rs",
    "decoupled_geo_rs_seq_tis", "decoupled_geo_rs_token_tis", "decoupled_k3_rs", "decoupled_k3_rs_seq_tis",
    "decoupled_k3_rs_token_tis", "bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs", "bypass_pg_is", "bypass_pg_token_icepop",
    "bypass_pg_geo_rs", "bypass_pg_geo_rs_seq_tis", "bypass_pg_geo_rs_token_tis",
]


@pytest.mark.parametrize("preset", VERL_PRESETS)
def test_verl_presets(preset):
    """Each preset equals verl's RolloutCorrectionConfig.<preset>() through verl's own
    compute_rollout_correction_and_rejection_mask (the defaults read from the wheel's config)."""
    verl = _ref(refs_offpolicy.verl)
    cfg = _verl_preset(preset)
    lp, bp, mask = batch(7, scale=0.002)
    ours = correct(params(preset), lp, bp, mask)
    weights, new_mask, metrics = verl.compute_rollout_correction_and_rejection_mask(
        lp, bp, mask, rollout_is=cfg["rollout_is"], rollout_is_threshold=cfg["rollout_is_threshold"],
        rollout_rs=cfg["rollout_rs"], rollout_rs_threshold=cfg["rollout_rs_threshold"],
    )
    assert torch.equal(ours.mask, new_mask.double())
    close(ours.weights, mask if weights is None else weights.batch["rollout_is_weights"] * mask)
    for key, value in offpolicy_metrics(lp, bp, mask).items():
        assert math.isclose(value, metrics[f"rollout_corr/{key}"], rel_tol=RTOL, abs_tol=1e-9), key


def _verl_preset(name: str) -> dict:
    """The keyword arguments verl's classmethod `name` passes to RolloutCorrectionConfig, read
    from the wheel's source (its defaults filled in)."""
    import ast
    import os

    import refs

    path = os.path.join(refs._unpacked(), "verl/trainer/config/algorithm.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RolloutCorrectionConfig")
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    args = fn.args.args[1:]
    defaults = {a.arg: ast.literal_eval(d) for a, d in zip(args[len(args) - len(fn.args.defaults) :], fn.args.defaults)}
    call = next(n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "cls")
    out = {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": None, "rollout_rs_threshold": None}
    for kw in call.keywords:
        node = kw.value
        if isinstance(node, ast.Name):
            out[kw.arg] = defaults[node.id]
        elif isinstance(node, ast.JoinedStr):
            out[kw.arg] = "".join(str(defaults[v.value.id]) if isinstance(v, ast.FormattedValue) else v.value for v in node.values)
        else:
            out[kw.arg] = ast.literal_eval(node)
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_verl_offpolicy_metrics(seed):
    verl = _ref(refs_offpolicy.verl)
    lp, bp, mask = batch(seed, extreme=False)
    ours = offpolicy_metrics(lp, bp, mask)
    theirs = verl.compute_offpolicy_metrics(lp, bp, mask)
    assert set(ours) == set(theirs)
    for key in theirs:
        assert math.isclose(ours[key], theirs[key], rel_tol=RTOL, abs_tol=1e-9), key


# --- TRL --------------------------------------------------------------------------------------

TRL_MODES = [
    ("sequence_mask", None, 3.0), ("sequence_mask", 0.5, 3.0), ("sequence_truncate", None, 3.0), ("sequence_truncate", 0.2, 2.0),
    ("token_mask", None, 3.0), ("token_mask", 0.5, 2.0), ("token_truncate", None, 3.0), ("token_truncate", 0.5, 2.0),
    ("sequence_mask", 0.5, None),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode, clip_min, clip_max", TRL_MODES)
def test_trl_importance_sampling(seed, mode, clip_min, clip_max):
    trl = _ref(refs_offpolicy.trl)
    lp, bp, mask = batch(seed, scale=0.02)
    ours = correct(
        params(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max),
        lp, bp, mask,
    )
    owner = types.SimpleNamespace(
        vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max
    )
    theirs = trl.importance_sampling_ratio(owner, lp, bp, mask).expand_as(lp)
    close(ours.weights, theirs * mask)


def test_trl_default_preset_is_sequence_mask():
    p = params("trl_sequence_mask")
    assert (p.vllm_importance_sampling_mode, p.vllm_importance_sampling_clip_min, p.vllm_importance_sampling_clip_max) == ("sequence_mask", None, 3.0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("delta", [0.0, 0.01, 0.5])
def test_trl_off_policy_sequence_mask(seed, delta):
    trl = _ref(refs_offpolicy.trl)
    lp, bp, mask = batch(seed, scale=0.1)
    g = torch.Generator().manual_seed(seed)
    advantage = torch.randn(lp.shape[0], generator=g, dtype=torch.float64)
    advantage[2] = 0.0
    ours = off_policy_sequence_mask(lp, bp, mask, advantage, delta)
    theirs = trl.get_off_policy_mask(advantage.unsqueeze(-1), lp, bp, mask, delta)
    assert torch.equal(ours.double(), theirs.squeeze(-1))
    assert not bool(ours.all()) or delta == 0.5  # the cases do reject rows


# --- SkyRL ------------------------------------------------------------------------------------

SKYRL = [
    {"sequence_mask_metric": "geometric"},
    {"sequence_mask_metric": "product"},
    {"tis_ratio_type": "token"},
    {"tis_ratio_type": "sequence"},
    {"outlier_token_is_threshold_low": 0.2, "outlier_token_is_threshold_high": 5.0},
    {"outlier_token_is_threshold_high": 3.0},
    {"token_mask_is_threshold_low": 0.8, "token_mask_is_threshold_high": 1.25},
    {"tis_ratio_type": "sequence", "token_mask_is_threshold_low": 0.8, "token_mask_is_threshold_high": 1.25, "sequence_mask_metric": "geometric", "geo_mask_low": 0.98, "geo_mask_high": 1.02},
    {"tis_ratio_type": "token", "outlier_token_is_threshold_low": 0.01, "outlier_token_is_threshold_high": 100.0, "sequence_mask_metric": "product"},
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("config", SKYRL, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_skyrl(seed, config):
    sky = _ref(refs_offpolicy.skyrl)
    lp, bp, mask = batch(seed, scale=0.02)
    ours = correct(params(**config), lp, bp, mask)
    tis, _, loss_mask = sky.compute_off_policy_correction(lp, bp, mask, refs_offpolicy.skyrl_config(**config))
    assert torch.equal(ours.mask, loss_mask.double())
    close(ours.weights, mask if tis is None else tis.expand_as(lp) * mask)


def test_skyrl_presets():
    assert params("skyrl_geometric_mask").sequence_mask_metric == "geometric"
    assert (params("skyrl_geometric_mask").geo_mask_low, params("skyrl_geometric_mask").geo_mask_high) == (0.99, 1.01)
    assert params("skyrl_token_tis").token_tis_ratio_clip_high == 2.0


# --- OpenRLHF ---------------------------------------------------------------------------------

OPENRLHF = [
    ("token", "mask", "ratio", (0.5, 5.0)),
    ("seq", "mask", "ratio", (0.95, 1.05)),
    ("token", "clip", "ratio", (0.5, 2.0)),
    ("token", "mask", "binary_kl", (0.0, 0.01)),
    ("seq", "mask", "binary_kl", (0.0, 0.002)),
    ("token", "mask", "tv", (0.0, 0.05)),
    ("seq", "mask", "tv", (0.0, 0.02)),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level, mode, gating, threshold", OPENRLHF)
def test_openrlhf_gate(seed, level, mode, gating, threshold):
    """PolicyLoss with log_probs == old_log_probs and advantages -1: every per-token PPO term is
    1, so its per-token loss is the gate's coefficient."""
    PolicyLoss = _ref(refs_offpolicy.openrlhf)
    lp, bp, mask = batch(seed, scale=0.5, extreme=False)
    ours = correct(
        params(is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating, is_correction_threshold=list(threshold)),
        lp, bp, mask,
    )
    loss_fn = PolicyLoss(is_correction_level=level, is_correction_mode=mode, is_correction_gating=gating, is_correction_threshold=threshold)
    coef = loss_fn(lp, lp, -torch.ones_like(lp), action_mask=mask, rollout_log_probs=bp)[0]
    close(ours.weights, coef * mask)
    if mode == "mask":
        assert torch.equal(ours.mask, ((coef != 0) & (mask > 0)).double())
        assert bool((ours.mask < mask).any())  # the cases do gate tokens


# --- all rejected -----------------------------------------------------------------------------


def test_all_rejected_batch_has_every_row_emptied():
    verl = _ref(refs_offpolicy.verl)
    lp, bp, mask = batch(3, scale=1.0)
    ours = correct(params(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9999_1.0001"), lp, bp, mask)
    theirs, _ = verl.compute_rollout_rejection_mask(lp - bp, mask, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.9999_1.0001")
    assert torch.equal(ours.mask, theirs.double())
    assert float(ours.mask.sum()) == 0.0
    had = mask.sum(-1) > 0
    assert torch.equal(ours.reason > 0, had)
    assert bool((ours.reason[~had] == 0).all())  # an empty response is not "rejected"


def test_no_setting_changes_nothing():
    lp, bp, mask = batch(0)
    c = correct(params(), lp, bp, mask)
    assert torch.equal(c.weights, mask) and torch.equal(c.mask, mask)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"rollout_is": "token", "tis_ratio_type": "token"}, "one source of importance weights"),
        ({"rollout_rs": "seq_mean_k4", "rollout_rs_threshold": "1"}, "seq_mean_k4"),
        ({"rollout_rs": "seq_mean_k1"}, "rollout_rs_threshold"),
        ({"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.5_2"}, "upper bound only"),
        ({"rollout_is": "token", "rollout_is_threshold": "3_2"}, "lower <= upper"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"behaviour_logprobs": "logprobs"}, "behaviour_logprobs"),
        ({"is_correction_level": "seq", "is_correction_mode": "clip"}, "clip"),
    ],
)
def test_bad_settings_are_one_line_errors(values, message):
    with pytest.raises(registry.ConfigError, match=message) as e:
        registry.resolve("rollout_correction", values)
    assert "\n" not in str(e.value)


def test_sanity_numpy_free():
    assert np.isfinite(offpolicy_metrics(*batch(0, extreme=False))["chi2_token"])
