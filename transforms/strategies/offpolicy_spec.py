"""The light half of the off-policy correction (transforms/strategies/offpolicy.py): the
declaration of `rollout_correction` and of the frameworks' presets of it, verl's threshold
strings parsed and the cross-parameter rules, without torch, so option parsing stays light."""

from __future__ import annotations

import dataclasses
import math  # noqa: F401
import typing
from dataclasses import dataclass
from typing import Any, Literal

from rescore.transforms.strategies.registry import (
    FILTER,
    Column,
    ConfigError,
    StrategyParams,
    param,
    register,
)

VERL_RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)


# --- parsing verl's threshold strings ---------------------------------------------------------


def parse_is_threshold(spec: str) -> tuple[float, float | None]:
    """verl's rollout_is_threshold: "U" -> (U, None) (TIS), "L_U" -> (U, L) (IcePop)."""
    spec = str(spec).strip()
    if "_" in spec:
        low, high = spec.split("_", 1)
        upper, lower = float(high), float(low)
    else:
        upper, lower = float(spec), None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold {spec!r} needs 0 < lower <= upper")
    return upper, lower


def parse_rs(options: str, spec: str | None) -> list[tuple[str, float | None, float]]:
    """verl's rollout_rs and rollout_rs_threshold: [(option, lower or None, upper)], k1 options
    with ratio bounds (a single "U" means lower 1/U), the others an upper bound only."""
    names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
    if not names:
        raise ValueError("rollout_rs names no option")
    for name in names:
        if name not in VERL_RS_OPTIONS:
            raise ValueError(f"rollout_rs option {name!r} is not one of {', '.join(VERL_RS_OPTIONS)}")
    if spec is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold")
    specs = [s.strip() for s in str(spec).split(",") if s.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"rollout_rs_threshold needs one threshold or one per option ({len(names)})")
    specs = specs * len(names) if len(specs) == 1 else specs
    out = []
    for name, s in zip(names, specs):
        if name.endswith("k1"):
            low, high = s.split("_", 1) if "_" in s else (str(1.0 / float(s)), s)
            lower, upper = float(low), float(high)
            if lower <= 0 or upper <= 0 or lower > upper:
                raise ValueError(f"rollout_rs_threshold {s!r} for {name} needs 0 < lower <= upper")
            out.append((name, lower, upper))
        else:
            if "_" in s:
                raise ValueError(f"rollout_rs_threshold for {name} takes an upper bound only, got {s!r}")
            upper = float(s)
            if upper <= 0:
                raise ValueError(f"rollout_rs_threshold for {name} must be > 0, got {s!r}")
            out.append((name, None, upper))
    return out


def check(p: dict, strategy: str) -> None:
    """The cross-parameter rules (called by the declaration's check)."""
    behaviour = p["behaviour_logprobs"]
    if behaviour == "logprobs" or not behaviour.endswith(("logprobs", "logprobs_original")):
        raise ConfigError(
            f"{strategy}: behaviour_logprobs names the behaviour policy's log-prob column, ending in 'logprobs'"
            f" or 'logprobs_original' and not 'logprobs' itself, got {behaviour!r}"
        )
    sources = [
        n
        for n, on in (
            ("rollout_is", p["rollout_is"] is not None),
            ("vllm_importance_sampling_mode", p["vllm_importance_sampling_mode"] is not None),
            ("tis_ratio_type", p["tis_ratio_type"] is not None),
            ("is_correction_level", p["is_correction_level"] != "off"),
        )
        if on
    ]
    if len(sources) > 1:
        raise ConfigError(f"{strategy}: one source of importance weights at a time, got {' and '.join(sources)}")
    if p["rollout_is_batch_normalize"] and p["rollout_is"] is None:
        raise ConfigError(f"{strategy}: rollout_is_batch_normalize scales verl's rollout_is weights; set rollout_is (token or sequence)")
    try:
        if p["rollout_is"] is not None:
            parse_is_threshold(p["rollout_is_threshold"])
        if p["rollout_rs"] is not None:
            parse_rs(p["rollout_rs"], p["rollout_rs_threshold"])
    except ValueError as e:
        raise ConfigError(f"{strategy}: {e}") from None
    if p["is_correction_level"] != "off":
        low, high = p["is_correction_threshold"]
        if not low <= high:
            raise ConfigError(f"{strategy}: is_correction_threshold needs low <= high, got {[low, high]}")
        if p["is_correction_mode"] == "clip" and (p["is_correction_level"] == "seq" or p["is_correction_gating"] != "ratio"):
            raise ConfigError(f"{strategy}: is_correction_mode=clip needs is_correction_level=token and is_correction_gating=ratio")


# --- the declarations (the math: offpolicy.py) ---------------------------------------------


@register(
    "rollout_correction",
    kind=FILTER,
    implementation="offpolicy:RolloutCorrection",
    summary="importance weights (is_weights) and rejection masks between logprobs and the behaviour log-probs; rows left no token are dropped",
)
@dataclass(frozen=True)
class RolloutCorrectionParams(StrategyParams):
    behaviour_logprobs: Column = param(
        "logprobs_original",
        help="the behaviour (rollout) log-probs column, pi_rollout; must end in `logprobs` or `logprobs_original`",
    )
    # verl 0.9.1 (rollout_corr_helper.py)
    rollout_is: Literal["token", "sequence"] | None = param(
        None,
        help="verl: `token`: w_t = exp(clamp(log r_t, ±20)); `sequence`: w = exp(clamp(seq_sum(log r), ±20))",
    )
    rollout_is_threshold: str = param("2.0", help="verl: `\"U\"`: w = min(w, U) (TIS); `\"L_U\"`: w = 0 outside [L, U] (IcePop)")
    rollout_rs: str | None = param(
        None,
        help="verl: comma list of `token_k1/k2/k3`, `seq_sum_k1/k2/k3`, `seq_mean_k1/k2/k3`, `seq_max_k2/k3` (log "
             "r clamped to ±20); every option must pass",
    )
    rollout_rs_threshold: str | None = param(
        None,
        help="verl: k1: keep log L <= stat <= log U (`\"L_U\"`, a single `\"U\"` means L = 1/U), k2/k3: keep stat <= "
             "U; one threshold for all options or one each",
    )
    rollout_is_batch_normalize: bool = param(
        False,
        help="verl: with `rollout_is`, the weights divided by their batch mean (token level: sum over every action"
             " token of the batch of w m / (sum of m + 1e-8); sequence level: the mean over the batch's rows with"
             " action tokens of each row's mean weight), left as they are where that mean is <= 1e-8. The mean is"
             " over the input mask of every row of the batch (rows the rejection drops included), as verl computes"
             " it before the rejection; each row sends its two sums as batch statistics, so the divisor is exact"
             " over any split of the batch",
    )
    # TRL 1.16.0 (GRPOTrainer)
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] | None = param(
        None,
        help="TRL: rho = exp(m log r) per token or exp(sum_t m_t log r_t) per row (no clamp); truncate: clamp(rho,"
             " C_min, C_max); mask: rho = 0 outside [C_min, C_max]",
    )
    vllm_importance_sampling_clip_max: float | None = param(3.0, positive=True, help="TRL: C_max")
    vllm_importance_sampling_clip_min: float | None = param(None, minimum=0.0, help="TRL: C_min (null: no lower bound)")
    off_policy_mask_threshold: float | None = param(
        None, minimum=0.0,
        help="TRL / DeepSeek-V3.2: δ; a row whose advantage is < 0 and whose mean_t m_t (behaviour_t - logprobs_t)"
             " > δ gets an all-zero `action_mask` where it is written",
    )
    # SkyRL (off_policy_correction_utils.py)
    tis_ratio_type: Literal["token", "sequence"] | None = param(
        None,
        help="SkyRL: `token`: min(exp(clamp(log r_t, ±20)), cap); `sequence`: min(exp(clamp(seq_sum log r)), cap)",
    )
    token_tis_ratio_clip_high: float = param(2.0, positive=True, help="SkyRL: the cap of the token TIS ratio")
    sequence_tis_ratio_clip_high: float = param(5.0, positive=True, help="SkyRL: the cap of the sequence TIS ratio")
    sequence_mask_metric: Literal["geometric", "product"] | None = param(
        None,
        help="SkyRL: `geometric`: exp(clamp(seq_mean(log r))), `product`: exp(clamp(seq_sum(log r))); outside "
             "[low, high] rejects the row",
    )
    geo_mask_high: float = param(1.01, positive=True, help="SkyRL: upper bound of the geometric sequence mask")
    geo_mask_low: float = param(0.99, minimum=0.0, help="SkyRL: lower bound of the geometric sequence mask")
    product_mask_high: float = param(2.0, positive=True, help="SkyRL: upper bound of the product sequence mask")
    product_mask_low: float = param(0.5, minimum=0.0, help="SkyRL: lower bound of the product sequence mask")
    outlier_token_is_threshold_low: float | None = param(
        None, minimum=0.0,
        help="SkyRL: a row with any action token's exp(clamp(log r)) below it is rejected",
    )
    outlier_token_is_threshold_high: float | None = param(
        None, minimum=0.0,
        help="SkyRL: a row with any action token's exp(clamp(log r)) above it is rejected",
    )
    token_mask_is_threshold_low: float | None = param(
        None, minimum=0.0,
        help="SkyRL: tokens whose exp(clamp(log r)) is below it are rejected",
    )
    token_mask_is_threshold_high: float | None = param(
        None, minimum=0.0,
        help="SkyRL: tokens whose exp(clamp(log r)) is above it are rejected",
    )
    # OpenRLHF 0.11.2 (PolicyLoss is_correction_*)
    is_correction_level: Literal["off", "token", "seq"] = param(
        "off",
        help="OpenRLHF: the statistic per `token` or per row (`seq`: the ratio's geometric mean, a divergence's "
             "mean); `off`: none",
    )
    is_correction_mode: Literal["mask", "clip"] = param(
        "mask",
        help="OpenRLHF: `mask`: units outside the threshold rejected, survivors weigh exp(log r_t); `clip` (token "
             "ratio only): w = clamp(r, low, high)",
    )
    is_correction_gating: Literal["ratio", "binary_kl", "tv"] = param(
        "ratio",
        help="OpenRLHF: ratio exp(log r), binary KL p log(p/q) + (1-p) log((1-p)/(1-q)) or TV abs(p - q), p = "
             "exp(behaviour), q = exp(logprobs) clamped to [1e-6, 1 - 1e-6]",
    )
    is_correction_threshold: tuple[float, float] = param((0.5, 5.0), help="OpenRLHF: [low, high] of the gate")
    # staleness (Trinity's model_version)
    max_staleness: int | None = param(
        None, minimum=0,
        help="Trinity: rows whose `model_version` < current_model_version - max_staleness are dropped"
             " (`NAME: model_version 3 is more than max_staleness 2 behind 7`)",
    )
    current_model_version: int | None = param(None, help="Trinity: the version max_staleness counts back from")
    model_version_key: Column = param("model_version", help="Trinity: the column holding each row's model version")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        check(values, strategy)


def _correction_preset(name: str, summary: str, **defaults: Any) -> None:
    """Register `name`: rollout_correction with these defaults (a framework's preset)."""
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
