"""The light half of the off-policy correction (transforms/strategies/offpolicy.py): verl's
threshold strings parsed and the cross-parameter rules, without torch, so option parsing stays
light (catalog.py's check calls it)."""

from __future__ import annotations

import math  # noqa: F401

from rescore.transforms.strategies.registry import ConfigError

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
