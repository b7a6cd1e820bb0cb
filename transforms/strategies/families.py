"""Which family module declares each shipped strategy, so that a run imports its own.

Importing every family (catalog.py) registers all 77 strategies and takes ~0.13 s of one core
at every start-up, on the launcher's critical path; a run needs only the families of the
strategies it names. `spec(name)` (registry.py) imports `FAMILIES`' module for `name` alone;
`names()`, `rescore strategies`, the docs and an unknown name import them all, as before.
tests/strategies/test_families.py checks this table against what each family registers, so
a strategy added to a family without its line here fails there, saying which line to add.
"""

from __future__ import annotations

import importlib
import sys

PACKAGE = "rescore.transforms.strategies"

FAMILIES: dict[str, tuple[str, ...]] = {
    "baselines": ("asymre", "dr_grpo", "opmd", "reinforce_plus_plus_baseline", "rloo"),
    "chord": ("mix_chord",),
    "distill": ("on_policy_distill",),
    "estimators": ("gdpo", "gpg", "grpo_passk", "opo", "rec", "reinforce", "remax"),
    "filters": (
        "dapo_dynamic_sampling", "dynamic_filtering", "dynamic_sampling", "filter_groups", "mask_response_truncated",
        "mask_truncated_completions", "pass_rate_band", "reward_filter", "reward_std_filter", "zero_variance_filter",
    ),
    "gigpo": ("gigpo",),
    "grpo": ("correct_bias", "grpo"),
    "jsd": ("jsd",),
    "multi_reward": ("normalize_then_sum",),
    "normalize": ("flash_reinforce", "maxrl", "normalize"),
    "offpolicy_spec": (
        "bypass_pg_geo_rs", "bypass_pg_geo_rs_seq_tis", "bypass_pg_geo_rs_token_tis", "bypass_pg_is",
        "bypass_pg_token_icepop", "bypass_ppo_clip_geo_rs", "bypass_ppo_clip_k3_rs", "decoupled_geo_rs",
        "decoupled_geo_rs_seq_tis", "decoupled_geo_rs_token_tis", "decoupled_k3_rs", "decoupled_k3_rs_seq_tis",
        "decoupled_k3_rs_token_tis", "decoupled_seq_is", "decoupled_seq_is_rs", "decoupled_token_icepop",
        "decoupled_token_is", "openrlhf_seq_mask", "openrlhf_token_mask", "rollout_correction", "skyrl_geometric_mask",
        "skyrl_product_mask", "skyrl_sequence_tis", "skyrl_token_tis", "trl_sequence_mask", "trl_sequence_truncate",
        "trl_token_mask", "trl_token_truncate",
    ),
    "reinforce_pp": ("reinforce_plus_plus", "reinforceplusplus"),
    "repetition": ("ngram_repetition_filter",),
    "shaping": ("dapo_overlong_penalty", "kl_penalty", "reward_shaping", "reward_sum", "truncated_reward"),
    "step_wise": ("step_wise_grpo",),
    "token_baseline": ("clipb", "optimal_token_baseline", "tir_optimal_token_baseline"),
    "user_filter": ("group_filter",),
    "variance": ("duplicate_informative", "reward_variance"),
    "weights": ("constant", "raft"),
}
"""Each family module and the strategies it declares (`@register` in its body)."""

FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}


def load(name: str) -> bool:
    """Import the family that declares strategy `name` (False: no shipped family does)."""
    family = FAMILY_OF.get(name)
    if family is not None:
        importlib.import_module(f"{PACKAGE}.{family}")
    return family is not None


def loading(name: str) -> bool:
    """The family that declares `name` is imported or being imported (its module exists)."""
    family = FAMILY_OF.get(name)
    return family is None or f"{PACKAGE}.{family}" in sys.modules


def load_all() -> None:
    """Import every family: every shipped strategy registered."""
    for family in FAMILIES:
        importlib.import_module(f"{PACKAGE}.{family}")
