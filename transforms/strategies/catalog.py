"""Every strategy by registry name: its kind, one-line summary and parameters, declared once.

Each declaration is a frozen dataclass whose fields are the reference's parameter names with
the reference's defaults (registry.py derives the checks, the errors and the listings from it);
`implementation` names the class in this package that does the math, a subclass of the
declaration imported only when the strategy is created. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rescore.transforms.strategies.registry import (
    ADVANTAGE,
    DUPLICATE,
    FILTER,
    SHAPE,
    Column,
    Path,
    ConfigError,
    StrategyParams,
    param,
    register,
)

# --- GRPO family (grpo.py, step_wise.py) ------------------------------------------------------


@register(
    "grpo",
    kind=ADVANTAGE,
    implementation="grpo:GRPO",
    summary="(r - mean(G)) / (std + epsilon), group or batch std, optional threshold and rank penalty",
)
@dataclass(frozen=True)
class GRPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    std_cal_level: Literal["group", "batch"] = "group"
    std_threshold: float | None = param(None, minimum=0.0)
    rank_penalty: float | None = None


@register(
    "correct_bias",
    kind=ADVANTAGE,
    implementation="grpo:CorrectBias",
    summary="GRPO on rank-bias-corrected rewards (arXiv 2506.02355); needs logprobs",
)
@dataclass(frozen=True)
class CorrectBiasParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    rank_penalty: float = 0.25


@register(
    "step_wise_grpo",
    kind=ADVANTAGE,
    implementation="step_wise:StepWiseGRPO",
    summary="multi-step runs: GRPO over each run's last-step reward, broadcast to all its steps",
)
@dataclass(frozen=True)
class StepWiseGRPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    enable_step_norm: bool = False
    std_cal_level: Literal["group", "batch"] = "group"
    std_threshold: float | None = param(None, minimum=0.0)


# --- group baselines without std normalisation (baselines.py) ---------------------------------


@register(
    "opmd",
    kind=ADVANTAGE,
    implementation="baselines:OPMD",
    summary="r - b, b = group mean or tau * logavgexp(r / tau); no std normalisation",
)
@dataclass(frozen=True)
class OPMDParams(StrategyParams):
    opmd_baseline: Literal["mean", "logavgexp"] = "mean"
    tau: float = param(1.0, positive=True)


@register(
    "asymre",
    kind=ADVANTAGE,
    implementation="baselines:AsymRE",
    summary="r - (mean(G) + baseline_shift) (asymmetric REINFORCE)",
)
@dataclass(frozen=True)
class AsymREParams(StrategyParams):
    baseline_shift: float = -0.1


@register("dr_grpo", kind=ADVANTAGE, implementation="baselines:DrGRPO", summary="r - mean(G) (GRPO without the std division)")
@dataclass(frozen=True)
class DrGRPOParams(StrategyParams):
    pass


@register(
    "rloo",
    kind=ADVANTAGE,
    implementation="baselines:RLOO",
    summary="leave-one-out baseline: (r - mean(G)) * n / (n - 1); TRL's normalize_advantages whitens over the batch",
)
@dataclass(frozen=True)
class RLOOParams(StrategyParams):
    normalize_advantages: bool = param(False, hidden_at_default=True)


@register(
    "reinforce_plus_plus_baseline",
    kind=ADVANTAGE,
    implementation="baselines:ReinforcePlusPlusBaseline",
    summary="r - mean(G), then whitened over the batch weighted by action tokens (REINFORCE++)",
)
@dataclass(frozen=True)
class ReinforcePlusPlusBaselineParams(StrategyParams):
    pass


# --- REINFORCE++ with discounted token returns (reinforce_pp.py) ------------------------------


@register(
    "reinforceplusplus",
    kind=ADVANTAGE,
    implementation="reinforce_pp:TrinityReinforcePlusPlus",
    summary="REINFORCE++ (Trinity): discounted token returns (gamma), whitened over the batch's action tokens",
)
@register(
    "reinforce_plus_plus",
    kind=ADVANTAGE,
    implementation="reinforce_pp:VerlReinforcePlusPlus",
    summary="REINFORCE++ (verl): discounted returns over action tokens (gamma), whitened over the batch",
)
@dataclass(frozen=True)
class ReinforcePlusPlusParams(StrategyParams):
    gamma: float = param(1.0, minimum=0.0, between=(0.0, 1.0))


# --- per-position baselines from the model stage's token statistics (token_baseline.py) ------


@register(
    "optimal_token_baseline",
    kind=ADVANTAGE,
    implementation="token_baseline:OptimalTokenBaseline",
    summary="G_t - B_t, B_t per group and position weighted by the path variance (verl); needs logprobs and sum_pi_squared",
)
@register(
    "tir_optimal_token_baseline",
    kind=ADVANTAGE,
    implementation="token_baseline:TIROptimalTokenBaseline",
    summary="optimal_token_baseline over each row's action tokens only (verl's multi-turn variant)",
)
@dataclass(frozen=True)
class OptimalTokenBaselineParams(StrategyParams):
    handle_zero_tail: bool = True
    epsilon: float = param(1e-8, minimum=0.0)
    rollout_is_weights: bool = False


@register(
    "clipb",
    kind=ADVANTAGE,
    implementation="token_baseline:ClipB",
    summary="GRPO advantages; negative-advantage tokens whose p(H + log p) is mu batch stds below its mean leave the action mask (Trinity); needs logprobs and entropy",
)
@dataclass(frozen=True)
class ClipBParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    mu: float = param(2.5, minimum=0.0)


# --- outcome-reward estimators (estimators.py) ------------------------------------------------


@register("reinforce", kind=ADVANTAGE, implementation="estimators:Reinforce", summary="the raw reward r (Trinity `reinforce`; the TOPR preset)")
@dataclass(frozen=True)
class ReinforceParams(StrategyParams):
    pass


@register(
    "rec",
    kind=ADVANTAGE,
    implementation="estimators:REC",
    summary="r - mean, optionally / (std + epsilon), with drop=balance of surplus below-mean rows (Trinity `rec`)",
)
@dataclass(frozen=True)
class RECParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    std_normalize: bool = param(False, null=False)
    drop: Literal["balance"] | None = None
    seed: int = param(0, minimum=0)


@register("opo", kind=ADVANTAGE, implementation="estimators:OPO", summary="r - length-weighted group mean (verl `opo`, arXiv 2505.23585)")
@dataclass(frozen=True)
class OPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)


@register(
    "grpo_passk",
    kind=ADVANTAGE,
    implementation="estimators:GRPOPassK",
    summary="only the group's best row scores (r_max - r_second) [/ (std + epsilon)] (verl `grpo_passk`)",
)
@dataclass(frozen=True)
class GRPOPassKParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    norm_adv_by_std_in_grpo: bool = True


@register(
    "gpg",
    kind=ADVANTAGE,
    implementation="estimators:GPG",
    summary="alpha * (r - mean(G)) / f_norm, alpha = batch rows / rows with r != 0 (verl `gpg`)",
)
@dataclass(frozen=True)
class GPGParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    f_norm: float = param(1.0, nonzero=True)
    alpha: float = 1.0


@register(
    "gdpo",
    kind=ADVANTAGE,
    implementation="estimators:GDPO",
    summary="GRPO per reward column, weighted sum, whitened over the batch by tokens (verl `gdpo`)",
)
@dataclass(frozen=True)
class GDPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    norm_adv_by_std_in_grpo: bool = True
    gdpo_reward_keys: tuple[Column, ...] = ()
    gdpo_reward_weights: tuple[float, ...] | None = None

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        weights, columns = values["gdpo_reward_weights"], max(len(values["gdpo_reward_keys"]), 1)
        if weights is not None and len(weights) != columns:
            raise ConfigError(f"{strategy}: 'gdpo_reward_weights' has {len(weights)} weights for {columns} reward columns")


@register(
    "remax",
    kind=ADVANTAGE,
    implementation="estimators:ReMax",
    summary="r - the greedy response's reward, read from a column (verl / Trinity `remax`)",
)
@dataclass(frozen=True)
class ReMaxParams(StrategyParams):
    reward_baselines: Column = "reward_baselines"


# --- teacher and loss-weight strategies (chord.py, distill.py, jsd.py) ------------------------


@register(
    "mix_chord",
    kind=ADVANTAGE,
    implementation="chord:MixChord",
    summary="CHORD: mu schedule, loss weights (mu expert / 1 - mu others), GRPO for non-expert rows, phi token weights",
)
@dataclass(frozen=True)
class MixChordParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)
    mu_warmup_steps: int = param(0, minimum=0)
    mu_decay_steps: int = param(0, minimum=0)
    mu_peak: float = param(0.1, between=(0.0, 1.0))
    mu_valley: float = param(0.1, between=(0.0, 1.0))
    enable_phi_function: bool = True


@register(
    "on_policy_distill",
    kind=ADVANTAGE,
    implementation="distill:OnPolicyDistill",
    summary="token-level kl_coef * (teacher_logprobs - logprobs); needs logprobs and teacher_logprobs",
)
@dataclass(frozen=True)
class OnPolicyDistillParams(StrategyParams):
    kl_coef: float = 1.0


@register(
    "jsd",
    kind=ADVANTAGE,
    implementation="jsd:JSD",
    summary="token-level -kl_coef * JSD(teacher, logprobs) (Trinity `jsd`); needs logprobs and teacher_logprobs",
)
@dataclass(frozen=True)
class JSDParams(StrategyParams):
    lambda_coef: float = param(0.5, minimum=0.0, between=(0.0, 1.0))
    kl_coef: float = 1.0
    temperature: float = param(1.0, positive=True)
    chunk_size: int | None = param(None, minimum=1)
    """Trinity's chunk_size only bounds GPU memory; the result does not depend on it."""


# --- multi-step agents (gigpo.py) --------------------------------------------------------------


@register(
    "gigpo",
    kind=ADVANTAGE,
    implementation="gigpo:GiGPO",
    summary="multi-step: episode advantage + omega * step advantage within anchor-state groups (Trinity `gigpo`)",
)
@dataclass(frozen=True)
class GiGPOParams(StrategyParams):
    omega: float = 1.0
    gamma: float = param(1.0, minimum=0.0)
    fnorm: Literal["std", "none"] = "none"
    epsilon: float = param(1e-6, minimum=0.0)
    step_reward_key: Column | None = "step_reward"
    env_state_hash_key: Column = param("env_state_hash", none_message="must name the anchor-state column")
    anchor_scope: Literal["batch", "task"] = "batch"
    """batch: anchor states pooled over the whole batch, across tasks (Trinity); task: within
    each task group (the paper's step groups)."""


# --- the variance filter and duplication (variance.py); RAFT and constant (weights.py) --------


@register(
    "reward_variance",
    kind=FILTER,
    implementation="variance:RewardVariance",
    summary="drop groups with fewer than 2 rows or reward variance (ddof=0) <= variance_threshold",
)
@dataclass(frozen=True)
class RewardVarianceParams(StrategyParams):
    variance_threshold: float = 0.0


@register(
    "duplicate_informative",
    kind=DUPLICATE,
    implementation="variance:DuplicateInformative",
    summary="reward_variance, then copy kept groups until the batch has its rows again (POLARIS)",
)
@dataclass(frozen=True)
class DuplicateInformativeParams(StrategyParams):
    variance_threshold: float = 0.0
    seed: int = param(0, minimum=0)
    min_replace_ratio: float | None = param(None, between=(0.0, 1.0), hidden_at_default=True)
    """POLARIS / SkyRL `replace`: a batch is rebalanced only where its informative groups are
    more than min_replace_ratio of the groups reaching this stage; otherwise the batch is kept
    whole, uncopied. None: always rebalanced (a batch without an informative group writes nothing)."""


@register(
    "raft",
    kind=ADVANTAGE,
    implementation="weights:RAFT",
    summary="keep rows with the top reward of their group and reward > reward_threshold; score = weight",
)
@dataclass(frozen=True)
class RAFTParams(StrategyParams):
    reward_threshold: float | None = 0.0
    top_only: bool = True
    weight: float = 1.0


@register("constant", kind=ADVANTAGE, implementation="weights:Constant", summary="every row scores `weight` (SFT pass-through)")
@dataclass(frozen=True)
class ConstantParams(StrategyParams):
    weight: float = 1.0


# --- filters users ask for (filters.py) --------------------------------------------------------


@register(
    "filter_groups",
    kind=FILTER,
    implementation="filters:FilterGroups",
    summary="verl's DAPO filter_groups: drop groups of 2+ rows whose `metric` column has no spread",
)
@dataclass(frozen=True)
class FilterGroupsParams(StrategyParams):
    metric: Column = "acc"


@register(
    "dapo_dynamic_sampling",
    kind=FILTER,
    implementation="filters:DAPODynamicSampling",
    summary="DAPO dynamic sampling (Trinity): keep groups of 2+ rows with 0 < #(metric > correct_threshold) < n",
)
@register(
    "dynamic_sampling",
    kind=FILTER,
    implementation="filters:DAPODynamicSampling",
    summary="DAPO dynamic sampling (Trinity): keep groups of 2+ rows with 0 < #(metric > correct_threshold) < n",
)
@dataclass(frozen=True)
class DAPODynamicSamplingParams(StrategyParams):
    metric_key: Column = "accuracy"
    """The metric column; where the input has no such column, or a row's value is null, the
    row's reward (Trinity: exp.metrics[metric_key], else exp.reward)."""
    correct_threshold: float = 0.0


@register(
    "dynamic_filtering",
    kind=FILTER,
    implementation="filters:DynamicFiltering",
    summary="OpenRLHF dynamic filtering: keep groups whose mean `metric` lies strictly inside the range",
)
@dataclass(frozen=True)
class DynamicFilteringParams(StrategyParams):
    dynamic_filtering_reward_range: tuple[float, float] = (0.0, 1.0)
    metric: Column = "reward"

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        low, high = values["dynamic_filtering_reward_range"]
        if not low < high:
            raise ConfigError(f"{strategy}: 'dynamic_filtering_reward_range' needs low < high, got {[low, high]}")


@register(
    "mask_response_truncated",
    kind=FILTER,
    implementation="filters:MaskResponseTruncated",
    summary="truncated responses (truncate_status): advantages 0 and action_mask zeroed, or dropped with drop=true",
)
@register(
    "mask_truncated_completions",
    kind=FILTER,
    implementation="filters:MaskResponseTruncated",
    summary="truncated responses (truncate_status): advantages 0 and action_mask zeroed, or dropped with drop=true",
)
@dataclass(frozen=True)
class MaskResponseTruncatedParams(StrategyParams):
    truncate_status_key: Column = "truncate_status"
    drop: bool = False


@register(
    "pass_rate_band",
    kind=FILTER,
    implementation="filters:PassRateBand",
    summary="keep tasks whose pass rate (share of rows with reward >= threshold) lies strictly inside (lo, hi): "
    "the group's, or the task's whole history from a `rescore task-stats` table (task_stats)",
)
@dataclass(frozen=True)
class PassRateBandParams(StrategyParams):
    lo: float = param(0.0, between=(0.0, 1.0))
    hi: float = param(1.0, between=(0.0, 1.0))
    threshold: float = 1.0
    task_stats: Path | None = None
    unseen: Literal["keep", "drop"] = "keep"

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if not values["lo"] < values["hi"]:
            raise ConfigError(f"{strategy}: needs lo < hi, got lo={values['lo']!r}, hi={values['hi']!r}")
        # task_stats names a table; the launcher reads it before the run (pipelines/task_history.py)

# --- the normalisation family, MaxRL, FlashREINFORCE (normalize.py) ----------------------------


@register(
    "normalize",
    kind=ADVANTAGE,
    implementation="normalize:Normalize",
    summary="(r - mean) / (std + eps): mean over group / batch / leave-one-out / none, std over group / batch / none (AReaL NormConfig)",
)
@dataclass(frozen=True)
class NormalizeParams(StrategyParams):
    mean_level: Literal["group", "batch", "none"] = "batch"
    mean_leave1out: bool = False
    std_level: Literal["group", "batch", "none"] = "batch"
    std_unbiased: bool = True
    eps: float = param(1e-5, minimum=0.0)
    std_of: Literal["centered", "reward"] = "centered"
    """centered: the std of r - mean as used, about 0 (AReaL); reward: the std of the raw
    rewards at that level about their own mean (TRL's scale_rewards=batch)."""
    weighting: Literal["row", "token"] = "row"
    """token: every statistic weights a row by its action tokens (AReaL's loss_mask)."""

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if values["mean_leave1out"] and values["weighting"] == "token":
            raise ConfigError(f"{strategy}: 'mean_leave1out' needs weighting=row (a token-weighted leave-one-out mean is not defined)")
        if values["mean_leave1out"] and values["mean_level"] == "none":
            raise ConfigError(f"{strategy}: 'mean_leave1out' needs mean_level group or batch")


@register(
    "maxrl",
    kind=ADVANTAGE,
    implementation="normalize:MaxRL",
    summary="(r - mean(G)) / (mean(G) + epsilon); a group of one row keeps r (SkyRL `maxrl`)",
)
@dataclass(frozen=True)
class MaxRLParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0)


@register(
    "flash_reinforce",
    kind=ADVANTAGE,
    implementation="normalize:FlashReinforce",
    summary="r - the batch's mean reward, no whitening (OpenRLHF `flash_reinforce`)",
)
@dataclass(frozen=True)
class FlashReinforceParams(StrategyParams):
    pass


# --- multi-reward aggregation (multi_reward.py) --------------------------------------------------


@register(
    "normalize_then_sum",
    kind=ADVANTAGE,
    implementation="multi_reward:NormalizeThenSum",
    summary="per reward column: (x - mean(G)) / (std(G) + epsilon), nulls abstaining; weighted sum; whitened over the batch (TRL)",
)
@dataclass(frozen=True)
class NormalizeThenSumParams(StrategyParams):
    reward_keys: tuple[Column, ...] = ()
    """The reward columns (a null abstains); none: the `reward` column alone."""
    reward_weights: tuple[float, ...] | None = None
    epsilon: float = param(1e-4, minimum=0.0)

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        keys, weights = values["reward_keys"], values["reward_weights"]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"{strategy}: 'reward_keys' names a column twice")
        if weights is not None and len(weights) != max(len(keys), 1):
            raise ConfigError(f"{strategy}: 'reward_weights' has {len(weights)} weights for {max(len(keys), 1)} reward columns")


# --- more filters (filters.py) -------------------------------------------------------------------


@register(
    "reward_filter",
    kind=FILTER,
    implementation="filters:RewardFilter",
    summary="row-level: keep rows with reward >= threshold (Trinity `reward_filter`)",
)
@dataclass(frozen=True)
class RewardFilterParams(StrategyParams):
    threshold: float = 0.0


@register(
    "reward_std_filter",
    kind=FILTER,
    implementation="filters:RewardSTDFilter",
    summary="drop groups with fewer than 2 rows or reward std (ddof=0) <= threshold (Trinity `reward_std_filter`)",
)
@dataclass(frozen=True)
class RewardSTDFilterParams(StrategyParams):
    threshold: float = 0.0


@register(
    "zero_variance_filter",
    kind=FILTER,
    implementation="filters:ZeroVarianceFilter",
    summary="drop groups with 2+ live rows (action tokens > 0) whose rewards lie within tol (SkyRL)",
)
@dataclass(frozen=True)
class ZeroVarianceFilterParams(StrategyParams):
    zero_variance_filter_tol: float = param(1e-6, minimum=0.0)


@register(
    "ngram_repetition_filter",
    kind=FILTER,
    implementation="repetition:NgramRepetitionFilter",
    summary="row-level: drop responses whose share of repeated token n-grams (rep_len) > max_ratio; needs tokens",
)
@dataclass(frozen=True)
class NgramRepetitionFilterParams(StrategyParams):
    rep_len: int = param(10, minimum=1)
    max_ratio: float = param(0.5, between=(0.0, 1.0))


# --- off-policy (rollout) correction (offpolicy.py) -------------------------------------------


@register(
    "rollout_correction",
    kind=FILTER,
    implementation="offpolicy:RolloutCorrection",
    summary="importance weights (is_weights) and rejection masks between logprobs and the behaviour log-probs; rows left no token are dropped",
)
@dataclass(frozen=True)
class RolloutCorrectionParams(StrategyParams):
    behaviour_logprobs: Column = "logprobs_original"
    # verl 0.9.1 (rollout_corr_helper.py)
    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: str = "2.0"
    rollout_rs: str | None = None
    rollout_rs_threshold: str | None = None
    rollout_is_batch_normalize: bool = False
    # TRL 1.16.0 (GRPOTrainer)
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] | None = None
    vllm_importance_sampling_clip_max: float | None = param(3.0, positive=True)
    vllm_importance_sampling_clip_min: float | None = param(None, minimum=0.0)
    off_policy_mask_threshold: float | None = param(None, minimum=0.0)
    # SkyRL (off_policy_correction_utils.py)
    tis_ratio_type: Literal["token", "sequence"] | None = None
    token_tis_ratio_clip_high: float = param(2.0, positive=True)
    sequence_tis_ratio_clip_high: float = param(5.0, positive=True)
    sequence_mask_metric: Literal["geometric", "product"] | None = None
    geo_mask_high: float = param(1.01, positive=True)
    geo_mask_low: float = param(0.99, minimum=0.0)
    product_mask_high: float = param(2.0, positive=True)
    product_mask_low: float = param(0.5, minimum=0.0)
    outlier_token_is_threshold_low: float | None = param(None, minimum=0.0)
    outlier_token_is_threshold_high: float | None = param(None, minimum=0.0)
    token_mask_is_threshold_low: float | None = param(None, minimum=0.0)
    token_mask_is_threshold_high: float | None = param(None, minimum=0.0)
    # OpenRLHF 0.11.2 (PolicyLoss is_correction_*)
    is_correction_level: Literal["off", "token", "seq"] = "off"
    is_correction_mode: Literal["mask", "clip"] = "mask"
    is_correction_gating: Literal["ratio", "binary_kl", "tv"] = "ratio"
    is_correction_threshold: tuple[float, float] = (0.5, 5.0)
    # staleness (Trinity's model_version)
    max_staleness: int | None = param(None, minimum=0)
    current_model_version: int | None = None
    model_version_key: Column = "model_version"

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        from rescore.transforms.strategies.offpolicy_spec import check

        check(values, strategy)


def _correction_preset(name: str, summary: str, **defaults: Any) -> None:
    """Register `name`: rollout_correction with these defaults (a framework's preset)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(RolloutCorrectionParams)
    fields = []
    for f in dataclasses.fields(RolloutCorrectionParams):
        if f.name in defaults:
            fields.append((f.name, hints[f.name], dataclasses.field(default=defaults[f.name], metadata=f.metadata)))
    cls = dataclasses.make_dataclass(
        "".join(p.title() for p in name.split("_")) + "Params", fields, bases=(RolloutCorrectionParams,), frozen=True
    )
    cls.__module__ = __name__
    register(name, kind=FILTER, implementation="offpolicy:preset", summary=summary)(cls)


_GEO = {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"}
_K3 = {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"}
# verl 0.9.1 RolloutCorrectionConfig presets (decoupled_* and bypass_* give the same weights and
# masks; they differ in verl's loss only)
for _name, _defaults in {
    "decoupled_token_is": {"rollout_is": "token", "rollout_is_threshold": "2.0"},
    "decoupled_seq_is": {"rollout_is": "sequence", "rollout_is_threshold": "2.0"},
    "decoupled_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "decoupled_seq_is_rs": {"rollout_is": "sequence", "rollout_is_threshold": "2.0", "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"},
    "decoupled_geo_rs": _GEO,
    "decoupled_geo_rs_seq_tis": {"rollout_is": "sequence", "rollout_is_threshold": "2.0", **_GEO},
    "decoupled_geo_rs_token_tis": {"rollout_is": "token", "rollout_is_threshold": "2.0", **_GEO},
    "decoupled_k3_rs": _K3,
    "decoupled_k3_rs_seq_tis": {"rollout_is": "sequence", "rollout_is_threshold": "2.0", **_K3},
    "decoupled_k3_rs_token_tis": {"rollout_is": "token", "rollout_is_threshold": "2.0", **_K3},
    "bypass_ppo_clip_geo_rs": _GEO,
    "bypass_ppo_clip_k3_rs": _K3,
    "bypass_pg_is": {"rollout_is": "sequence", "rollout_is_threshold": "2.0"},
    "bypass_pg_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "bypass_pg_geo_rs": _GEO,
    "bypass_pg_geo_rs_seq_tis": {"rollout_is": "sequence", "rollout_is_threshold": "2.0", **_GEO},
    "bypass_pg_geo_rs_token_tis": {"rollout_is": "token", "rollout_is_threshold": "2.0", **_GEO},
}.items():
    _correction_preset(_name, f"verl RolloutCorrectionConfig.{_name}() as a rollout_correction preset", **_defaults)
# TRL 1.16.0 GRPOConfig: vllm_importance_sampling_mode (default sequence_mask, C_max 3, no C_min)
for _mode in ("sequence_mask", "sequence_truncate", "token_mask", "token_truncate"):
    _correction_preset(
        f"trl_{_mode}", f"TRL GRPOTrainer vllm_importance_sampling_mode={_mode} (clip_max 3.0)", vllm_importance_sampling_mode=_mode
    )
# SkyRL off_policy_correction defaults
_correction_preset("skyrl_geometric_mask", "SkyRL sequence_mask_metric=geometric, rows outside [0.99, 1.01]", sequence_mask_metric="geometric")
_correction_preset("skyrl_product_mask", "SkyRL sequence_mask_metric=product, rows outside [0.5, 2.0]", sequence_mask_metric="product")
_correction_preset("skyrl_token_tis", "SkyRL tis_ratio_type=token (clip 2.0)", tis_ratio_type="token")
_correction_preset("skyrl_sequence_tis", "SkyRL tis_ratio_type=sequence (clip 5.0)", tis_ratio_type="sequence")
# OpenRLHF 0.11.2 is_correction (mask mode, ratio gate, [0.5, 5.0])
_correction_preset("openrlhf_token_mask", "OpenRLHF is_correction_level=token (ICEPOP, [0.5, 5.0])", is_correction_level="token")
_correction_preset("openrlhf_seq_mask", "OpenRLHF is_correction_level=seq (geometric-mean ratio in [0.5, 5.0])", is_correction_level="seq")


# --- reward shaping, before any filter or statistic (shaping.py) ---------------------------------


@register(
    "reward_shaping",
    kind=SHAPE,
    implementation="shaping:RewardShaping",
    summary="r <- clip(scale * (r op weight * column) + bias, clip_min, clip_max); op add|sub|mul|div (Trinity RewardShapingMapper)",
)
@dataclass(frozen=True)
class RewardShapingParams(StrategyParams):
    stats_key: Column | None = None
    """Trinity's column operation: the number column it applies (a missing or null value leaves
    the reward as it is, as Trinity skips a missing info key); none: no column operation."""
    op_type: Literal["add", "sub", "mul", "div"] = "add"
    weight: float = 1.0
    scale: float = 1.0
    bias: float = 0.0
    clip_min: float | None = None
    clip_max: float | None = None

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        low, high = values["clip_min"], values["clip_max"]
        if low is not None and high is not None and not low <= high:
            raise ConfigError(f"{strategy}: needs clip_min <= clip_max, got {low!r} > {high!r}")


@register(
    "dapo_overlong_penalty",
    kind=SHAPE,
    implementation="shaping:DAPOOverlongPenalty",
    summary="r <- r + min(0, (max_resp_len - overlong_buffer_len - length) / overlong_buffer_len) * penalty_factor, "
    "at least -penalty_factor (DAPO soft overlong punishment)",
)
@dataclass(frozen=True)
class DAPOOverlongPenaltyParams(StrategyParams):
    max_resp_len: int = param(20480, minimum=1)
    """The generation's maximum response length in tokens (DAPO: 16384 expected + 4096 buffer)."""
    overlong_buffer_len: int = param(4096, minimum=1)
    penalty_factor: float = param(1.0, minimum=0.0)

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if not values["max_resp_len"] >= values["overlong_buffer_len"]:
            raise ConfigError(
                f"{strategy}: needs max_resp_len >= overlong_buffer_len, got {values['max_resp_len']} < {values['overlong_buffer_len']}"
            )


@register(
    "kl_penalty",
    kind=SHAPE,
    implementation="shaping:KLPenalty",
    summary="r <- r - kl_coef * sum over action tokens of kl(logprobs, ref_logprobs) (verl's use_kl_in_reward, fixed coefficient)",
)
@dataclass(frozen=True)
class KLPenaltyParams(StrategyParams):
    kl_penalty: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "kl"
    kl_coef: float = param(0.001, minimum=0.0)
    ref_logprobs: Column = "ref_logprobs"

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if not values["ref_logprobs"].endswith("ref_logprobs"):
            raise ConfigError(f"{strategy}: ref_logprobs names the reference model's log-prob column, ending in 'ref_logprobs', got {values['ref_logprobs']!r}")


@register(
    "truncated_reward",
    kind=SHAPE,
    implementation="shaping:TruncatedReward",
    summary="truncated responses (truncate_status) get reward `value` (mode=set, ProRL/SkyRL/AReaL: 0) or r + value (mode=add)",
)
@dataclass(frozen=True)
class TruncatedRewardParams(StrategyParams):
    truncate_status_key: Column = "truncate_status"
    value: float = 0.0
    mode: Literal["set", "add"] = "set"


@register(
    "reward_sum",
    kind=SHAPE,
    implementation="shaping:RewardSum",
    summary="r <- sum_k w_k * column_k over named reward columns (weights default 1)",
)
@dataclass(frozen=True)
class RewardSumParams(StrategyParams):
    reward_keys: tuple[Column, ...] = ("reward",)
    """The number columns summed (`reward` may be one of them); a null rejects the row."""
    reward_weights: tuple[float, ...] | None = None

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        keys, weights = values["reward_keys"], values["reward_weights"]
        if not keys:
            raise ConfigError(f"{strategy}: 'reward_keys' names no column")
        if weights is not None and len(weights) != len(keys):
            raise ConfigError(f"{strategy}: 'reward_weights' has {len(weights)} weights for {len(keys)} reward columns")


# --- a user's group filter (user_filter.py) ------------------------------------------------------

GROUP_FILTER_FLAG = "--group-filter"


@register(
    "group_filter",
    kind=FILTER,
    implementation="user_filter:GroupFilter",
    summary="a user function MODULE:FUNCTION over each group's rows returns keep (or (keep, reason)); --group-filter",
)
@dataclass(frozen=True)
class GroupFilterParams(StrategyParams):
    function: str | None = None
    """MODULE:FUNCTION, imported where the run starts (a bad one: exit 2) and on each worker;
    none keeps every group."""
    columns: tuple[Column, ...] = ()
    """Number columns passed to the function besides the ids and the reward (a null crosses as NaN)."""

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if values["function"] is not None:
            from rescore.user_code import load_function  # the run's start: a bad spec is exit 2 here

            load_function(values["function"], GROUP_FILTER_FLAG)
