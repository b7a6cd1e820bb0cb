"""`--algorithm NAME`: the strategies and defaults a user of a Trinity-RFT algorithm expects.

The names are those of Trinity-RFT's AlgorithmType table (trinity/algorithm/algorithm.py).
Algorithms whose advantages need a critic, the trainer's live model or paired data cannot be
computed from logged experience; they fail with a message saying what would be needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rescore.transforms.strategies.registry import ConfigError


@dataclass(frozen=True)
class Preset:
    strategies: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


PRESETS: dict[str, Preset] = {
    "grpo": Preset(("grpo",), note="GRPO group advantages"),
    "grpo_verl": Preset(("grpo",), note="GRPO advantages computed in the trainer (compute_advantage_in_trainer): the trainer recomputes them"),
    "dapo": Preset(
        ("dapo_dynamic_sampling", "grpo"),
        note="Trinity's DAPO dynamic sampling (keep groups with 0 < correct < n, metric 'accuracy', else the reward), then GRPO; its clipping lives in the trainer",
    ),
    "cispo": Preset(("grpo",), note="GRPO advantages; the CISPO loss lives in the trainer"),
    "gspo": Preset(("grpo",), note="GRPO advantages; the GSPO loss lives in the trainer"),
    "sapo": Preset(("grpo",), note="GRPO advantages; the SAPO loss lives in the trainer"),
    "mix": Preset(("grpo",), note="GRPO advantages for the mixed-data loss"),
    "opmd": Preset(("opmd",), note="OPMD baseline (group mean)"),
    "sppo": Preset(("opmd",), note="Trinity-RFT's sPPO uses the OPMD advantage"),
    "asymre": Preset(("asymre",), note="AsymRE, baseline shift -0.1"),
    "multi_step_grpo": Preset(("step_wise_grpo",), note="step-wise GRPO over multi-step runs"),
    "rloo": Preset(("rloo",), note="leave-one-out baseline"),
    "reinforceplusplus": Preset(("reinforceplusplus",), note="REINFORCE++: discounted token returns (gamma 1), whitened over the batch"),
    "reinforce_plus_plus": Preset(("reinforce_plus_plus",), note="not a Trinity-RFT name: verl's adv_estimator of that name (observation tokens skipped when discounting)"),
    "topr": Preset(("reinforce",), note="TOPR's advantage is the raw reward; its truncated importance weights live in the trainer's loss"),
    "rec": Preset(("rec",), note="REC advantage (r - mean); its importance weights live in the trainer's loss"),
    "gigpo": Preset(
        ("gigpo",),
        {"omega": 1.0, "gamma": 1.0, "fnorm": "none", "epsilon": 1e-6, "anchor_scope": "batch"},
        note="episode + anchor-state step advantages, anchors pooled over the batch as Trinity does; needs an env_state_hash column",
    ),
    "raft": Preset(("raft",), note="keep each group's top-reward rows with reward > 0, weight 1"),
    "sft": Preset(("constant",), note="every row passes with weight 1"),
    "cpt": Preset(("constant",), note="continued pre-training: an SFT loss, every row passes with weight 1"),
    "mix_chord": Preset(("mix_chord",), note="CHORD mu schedule, loss weights and phi token weights"),
    "on_policy_distill": Preset(("on_policy_distill",), note="token advantages teacher_logprobs - logprobs; needs a teacher_logprobs column"),
    "jsd": Preset(("jsd",), {"kl_coef": 1.0, "lambda_coef": 0.5}, note="token advantages -JSD(teacher, logprobs); needs a teacher_logprobs column"),
}

UNSUPPORTED: dict[str, str] = {
    "ppo": "its advantages come from a learned critic (GAE over value estimates), which logged experience does not contain; compute them in the trainer",
    "dpo": "it trains on chosen/rejected pairs with the trainer's live and reference models; there is no per-row advantage to compute",
}

COMPUTED_IN_TRAINER = frozenset({"ppo", "reinforceplusplus", "rloo", "on_policy_distill", "jsd", "grpo_verl"})
"""Trinity-RFT 0.6.0 algorithms with compute_advantage_in_trainer = True: the trainer recomputes
the advantages from the rewards, so rescored advantages are for other trainers or for analysis."""


def names() -> list[str]:
    return sorted(PRESETS)


def preset(name: str) -> Preset:
    if name in UNSUPPORTED:
        raise ConfigError(f"algorithm {name!r} cannot be rescored offline: {UNSUPPORTED[name]}")
    if name not in PRESETS:
        from rescore.transforms.strategies.registry import close_match

        hint = close_match(name, [*PRESETS, *UNSUPPORTED])
        did_you_mean = f" (did you mean {hint!r}?)" if hint else ""
        raise ConfigError(f"unknown algorithm {name!r}{did_you_mean}; valid algorithms: {', '.join(names())}")
    return PRESETS[name]
