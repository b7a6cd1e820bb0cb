"""Issue 14: each strategy's parameters are declared once (in its family module); defaults, checks,
errors and the resolved params (which the config hash covers) derive from that declaration;
optional capabilities are explicit protocols."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from rescore.transforms.strategies import ConfigError, chain_of, create, names, spec
from rescore.transforms.strategies.base import (
    AddsColumns,
    BatchStatistics,
    DropsGroups,
    ExplainsDrops,
    ExplainsScores,
    MasksRows,
    Strategy,
    TokenLevel,
)
from rescore.transforms.strategies.function_estimator import FunctionEstimator
from rescore.transforms.strategies.grpo import GRPOParams
from rescore.transforms.strategies.hashing import mix64, string_key
from rescore.transforms.strategies.registry import StrategyParams, register

# The resolved parameters of every strategy with nothing set, in order, as they were before the
# declarations moved into catalog.py (and then into the family modules): metrics.json and config_hash record exactly these.
# (gigpo's anchor_scope was added by issue 31: its default pools anchors over the batch as
# Trinity does, which changed results, so the hash must change with it.)
RESOLVED_DEFAULTS = {
    "asymre": {"baseline_shift": -0.1},
    "clipb": {"epsilon": 1e-06, "mu": 2.5},
    "constant": {"weight": 1.0},
    "correct_bias": {"epsilon": 1e-06, "rank_penalty": 0.25},
    "dr_grpo": {},
    "duplicate_informative": {"variance_threshold": 0.0, "seed": 0},
    "dynamic_filtering": {"dynamic_filtering_reward_range": [0.0, 1.0], "metric": "reward"},
    "dapo_dynamic_sampling": {"metric_key": "accuracy", "correct_threshold": 0.0},
    # issue 31: dynamic_sampling is Trinity's DAPO filter now (was an alias of filter_groups)
    "dynamic_sampling": {"metric_key": "accuracy", "correct_threshold": 0.0},
    "filter_groups": {"metric": "acc"},
    "gdpo": {"epsilon": 1e-06, "norm_adv_by_std_in_grpo": True, "gdpo_reward_keys": [], "gdpo_reward_weights": None},
    "gigpo": {"omega": 1.0, "gamma": 1.0, "fnorm": "none", "epsilon": 1e-06, "step_reward_key": "step_reward", "env_state_hash_key": "env_state_hash", "anchor_scope": "batch"},
    "flash_reinforce": {},
    "gpg": {"epsilon": 1e-06, "f_norm": 1.0, "alpha": 1.0},
    "grpo": {"epsilon": 1e-06, "std_cal_level": "group", "std_threshold": None, "rank_penalty": None},
    "grpo_passk": {"epsilon": 1e-06, "norm_adv_by_std_in_grpo": True},
    "jsd": {"lambda_coef": 0.5, "kl_coef": 1.0, "temperature": 1.0, "chunk_size": None},
    "mask_response_truncated": {"truncate_status_key": "truncate_status", "drop": False},
    "mask_truncated_completions": {"truncate_status_key": "truncate_status", "drop": False},
    "maxrl": {"epsilon": 1e-06},
    "mix_chord": {"epsilon": 1e-06, "mu_warmup_steps": 0, "mu_decay_steps": 0, "mu_peak": 0.1, "mu_valley": 0.1, "enable_phi_function": True},
    "normalize": {"mean_level": "batch", "mean_leave1out": False, "std_level": "batch", "std_unbiased": True, "eps": 1e-05, "std_of": "centered", "weighting": "row"},
    "normalize_then_sum": {"reward_keys": [], "reward_weights": None, "epsilon": 0.0001},
    "ngram_repetition_filter": {"rep_len": 10, "max_ratio": 0.5},
    "on_policy_distill": {"kl_coef": 1.0},
    "opmd": {"opmd_baseline": "mean", "tau": 1.0},
    "kl_penalty": {"kl_penalty": "kl", "kl_coef": 0.001, "ref_logprobs": "ref_logprobs"},
    "opo": {"epsilon": 1e-06},
    "optimal_token_baseline": {"handle_zero_tail": True, "epsilon": 1e-08, "rollout_is_weights": False},
    "pass_rate_band": {"lo": 0.0, "hi": 1.0, "threshold": 1.0, "task_stats": None, "unseen": "keep"},
    "raft": {"reward_threshold": 0.0, "top_only": True, "weight": 1.0},
    "rec": {"epsilon": 1e-06, "std_normalize": False, "drop": None, "seed": 0},
    "reinforce": {},
    "reinforce_plus_plus": {"gamma": 1.0},
    "tir_optimal_token_baseline": {"handle_zero_tail": True, "epsilon": 1e-08, "rollout_is_weights": False},
    "reinforce_plus_plus_baseline": {},
    "reinforceplusplus": {"gamma": 1.0},
    "remax": {"reward_baselines": "reward_baselines"},
    "reward_filter": {"threshold": 0.0},
    "reward_std_filter": {"threshold": 0.0},
    "reward_variance": {"variance_threshold": 0.0},
    "rloo": {},
    "step_wise_grpo": {"epsilon": 1e-06, "enable_step_norm": False, "std_cal_level": "group", "std_threshold": None},
    "zero_variance_filter": {"zero_variance_filter_tol": 1e-06},
    "reward_shaping": {"stats_key": None, "op_type": "add", "weight": 1.0, "scale": 1.0, "bias": 0.0, "clip_min": None, "clip_max": None},
    "dapo_overlong_penalty": {"max_resp_len": 20480, "overlong_buffer_len": 4096, "penalty_factor": 1.0},
    "truncated_reward": {"truncate_status_key": "truncate_status", "value": 0.0, "mode": "set"},
    "reward_sum": {"reward_keys": ["reward"], "reward_weights": None},
    "group_filter": {"function": None, "columns": []},
}

# rollout_correction (issue 32) and its framework presets: the neutral defaults, then each
# preset's own (verl RolloutCorrectionConfig classmethods, TRL, SkyRL, OpenRLHF defaults).
_CORRECTION = {
    "behaviour_logprobs": "logprobs_original", "rollout_is": None, "rollout_is_threshold": "2.0", "rollout_rs": None,
    "rollout_rs_threshold": None, "rollout_is_batch_normalize": False, "vllm_importance_sampling_mode": None, "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None, "off_policy_mask_threshold": None, "tis_ratio_type": None,
    "token_tis_ratio_clip_high": 2.0, "sequence_tis_ratio_clip_high": 5.0, "sequence_mask_metric": None,
    "geo_mask_high": 1.01, "geo_mask_low": 0.99, "product_mask_high": 2.0, "product_mask_low": 0.5,
    "outlier_token_is_threshold_low": None, "outlier_token_is_threshold_high": None, "token_mask_is_threshold_low": None,
    "token_mask_is_threshold_high": None, "is_correction_level": "off", "is_correction_mode": "mask",
    "is_correction_gating": "ratio", "is_correction_threshold": [0.5, 5.0], "max_staleness": None,
    "current_model_version": None, "model_version_key": "model_version",
}
_GEO = {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"}
_K3 = {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"}
_TOKEN, _SEQ = {"rollout_is": "token"}, {"rollout_is": "sequence"}
for _name, _over in {
    "rollout_correction": {}, "decoupled_token_is": _TOKEN, "decoupled_seq_is": _SEQ,
    "decoupled_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
    "decoupled_seq_is_rs": {**_SEQ, "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.0"},
    "decoupled_geo_rs": _GEO, "decoupled_geo_rs_seq_tis": {**_SEQ, **_GEO}, "decoupled_geo_rs_token_tis": {**_TOKEN, **_GEO},
    "decoupled_k3_rs": _K3, "decoupled_k3_rs_seq_tis": {**_SEQ, **_K3}, "decoupled_k3_rs_token_tis": {**_TOKEN, **_K3},
    "bypass_ppo_clip_geo_rs": _GEO, "bypass_ppo_clip_k3_rs": _K3, "bypass_pg_is": _SEQ,
    "bypass_pg_token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}, "bypass_pg_geo_rs": _GEO,
    "bypass_pg_geo_rs_seq_tis": {**_SEQ, **_GEO}, "bypass_pg_geo_rs_token_tis": {**_TOKEN, **_GEO},
    "trl_sequence_mask": {"vllm_importance_sampling_mode": "sequence_mask"},
    "trl_sequence_truncate": {"vllm_importance_sampling_mode": "sequence_truncate"},
    "trl_token_mask": {"vllm_importance_sampling_mode": "token_mask"},
    "trl_token_truncate": {"vllm_importance_sampling_mode": "token_truncate"},
    "skyrl_geometric_mask": {"sequence_mask_metric": "geometric"}, "skyrl_product_mask": {"sequence_mask_metric": "product"},
    "skyrl_token_tis": {"tis_ratio_type": "token"}, "skyrl_sequence_tis": {"tis_ratio_type": "sequence"},
    "openrlhf_token_mask": {"is_correction_level": "token"}, "openrlhf_seq_mask": {"is_correction_level": "seq"},
}.items():
    RESOLVED_DEFAULTS[_name] = {**_CORRECTION, **_over}


def test_resolved_defaults_are_unchanged_in_value_and_order():
    # Every strategy that shipped keeps its name and its resolved defaults (the config hash of
    # earlier runs); a new one is pinned by its own tests, so adding one does not touch this list.
    assert set(RESOLVED_DEFAULTS) <= set(names())
    for name, expected in RESOLVED_DEFAULTS.items():
        s = create(name)
        assert list(s.params.items()) == list(expected.items()), name
        assert s.name == name and s.kind == spec(name).kind
        assert isinstance(s, Strategy) and isinstance(s, spec(name).params)
        assert not s.batch_level or isinstance(s, BatchStatistics), name


def test_spec_defaults_are_the_declared_fields():
    assert spec("grpo").defaults == {f.name: f.default for f in dataclasses.fields(GRPOParams) if f.name not in ("name", "kind")}
    assert spec("dynamic_filtering").defaults == {"dynamic_filtering_reward_range": [0.0, 1.0], "metric": "reward"}
    assert spec("rloo").defaults == {"normalize_advantages": False}  # listed, though left out of params at its default
    assert create("rloo", {"normalize_advantages": True}).params == {"normalize_advantages": True}
    assert spec("grpo").describe().splitlines() == [
        "epsilon: float = 1e-06",
        "std_cal_level: group|batch = 'group'",
        "std_threshold: float or null = None",
        "rank_penalty: float or null = None",
    ]


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("grpo", {"epsilon": "small"}, "grpo: parameter 'epsilon' must be a number, got 'small'"),
        ("grpo", {"epsilon": -1}, "grpo: parameter 'epsilon' must be >= 0.0, got -1.0"),
        ("grpo", {"std_threshold": "x"}, "grpo: parameter 'std_threshold' must be a number or null, got 'x'"),
        ("rec", {"drop": "all"}, "rec: parameter 'drop' must be one of balance, got 'all'"),
        ("rec", {"seed": 1.5}, "rec: parameter 'seed' must be an integer, got 1.5"),
        ("rec", {"seed": -1}, "rec: parameter 'seed' must be >= 0, got -1"),
        ("raft", {"top_only": "yes"}, "raft: parameter 'top_only' must be true or false, got 'yes'"),
        ("remax", {"reward_baselines": ""}, "remax: parameter 'reward_baselines' must be a column name, got ''"),
        ("opmd", {"tau": 0}, "opmd: parameter 'tau' must be > 0, got 0"),
        ("gpg", {"f_norm": 0}, "gpg: parameter 'f_norm' must not be 0"),
        ("mix_chord", {"mu_peak": 1.5}, "mix_chord: parameter 'mu_peak' must be between 0 and 1, got 1.5"),
        ("reinforceplusplus", {"gamma": 2}, "reinforceplusplus: parameter 'gamma' must be between 0 and 1, got 2.0"),
        ("jsd", {"chunk_size": 0}, "jsd: parameter 'chunk_size' must be >= 1, got 0"),
        ("gigpo", {"env_state_hash_key": None}, "gigpo: parameter 'env_state_hash_key' must name the anchor-state column"),
        ("gigpo", {"step_reward_key": 3}, "gigpo: parameter 'step_reward_key' must be a column name, got 3"),
        ("gdpo", {"gdpo_reward_keys": ["a", "a"]}, "gdpo: parameter 'gdpo_reward_keys' names a column twice: ['a', 'a']"),
        ("gdpo", {"gdpo_reward_keys": 3}, "gdpo: parameter 'gdpo_reward_keys' must be a list of column names, got 3"),
        ("gdpo", {"gdpo_reward_keys": ["a", "b"], "gdpo_reward_weights": [1]}, "gdpo: 'gdpo_reward_weights' has 1 weights for 2 reward columns"),
        ("dynamic_filtering", {"dynamic_filtering_reward_range": [1, 0]}, "dynamic_filtering: 'dynamic_filtering_reward_range' needs low < high, got [1.0, 0.0]"),
        ("dynamic_filtering", {"dynamic_filtering_reward_range": 1}, "dynamic_filtering: parameter 'dynamic_filtering_reward_range' must be [low, high], got 1"),
        ("clipb", {"mu": -1}, "clipb: parameter 'mu' must be >= 0.0, got -1.0"),
        ("optimal_token_baseline", {"handle_zero_tail": "yes"}, "optimal_token_baseline: parameter 'handle_zero_tail' must be true or false, got 'yes'"),
        ("tir_optimal_token_baseline", {"epsilon": -1}, "tir_optimal_token_baseline: parameter 'epsilon' must be >= 0.0, got -1.0"),
        ("grpo", {"tau": 1}, "unknown parameter 'tau' for strategy 'grpo'; valid parameters: epsilon, rank_penalty, std_cal_level, std_threshold"),
    ],
)
def test_checks_come_from_the_declaration(name, params, message):
    with pytest.raises(ConfigError) as err:
        create(name, params)
    assert str(err.value) == message


def test_values_are_normalised_as_declared():
    assert create("rec", {"drop": "none", "std_normalize": None}).params == RESOLVED_DEFAULTS["rec"]
    assert create("gdpo", {"gdpo_reward_keys": "a, b", "gdpo_reward_weights": [1, 2]}).params["gdpo_reward_keys"] == ["a", "b"]
    assert create("gdpo", {"gdpo_reward_keys": "a, b"}).needs == ("a", "b")
    assert create("jsd", {"chunk_size": 4.0}).params["chunk_size"] == 4
    assert create("grpo", {"epsilon": 0}).params["epsilon"] == 0.0


def test_a_declaration_needs_checkable_types_and_a_free_name():
    with pytest.raises(ValueError, match="already registered"):
        register("grpo", kind="advantage", implementation="grpo:GRPO", summary="")(GRPOParams)
    with pytest.raises(ValueError, match="kind must be one of"):
        register("new_one", kind="advantage_ish", implementation="grpo:GRPO", summary="")
    with pytest.raises(TypeError, match="immutable"):

        @dataclasses.dataclass(frozen=True)
        class Bad(StrategyParams):
            keys: tuple = dataclasses.field(default_factory=tuple)
            weights: list = __import__("rescore.transforms.strategies.registry", fromlist=["param"]).param([1.0])


def test_a_declaration_that_lost_its_dataclass_decorator_is_refused_at_registration():
    """A merge once dropped `@dataclass(frozen=True)` above a parameters class: the strategy
    registered with no parameters at all, and `--set rep_len=...` was refused as unknown."""
    from rescore.transforms.strategies.registry import param, unregister

    class NoLongerADataclass(StrategyParams):
        rep_len: int = param(10, minimum=1)

    class Filter(NoLongerADataclass):
        pass

    with pytest.raises(TypeError, match=r"NoLongerADataclass declares rep_len with param\(\) but is not a @dataclass"):
        register("lost_decorator", kind="filter", summary="")(Filter)
    unregister("lost_decorator")
    assert "lost_decorator" not in names()


def test_capabilities_are_declared_protocols():
    assert {n for n in names() if isinstance(create(n), TokenLevel)} == {
        "jsd", "on_policy_distill", "reinforceplusplus", "reinforce_plus_plus", "optimal_token_baseline",
        "tir_optimal_token_baseline", "clipb",
    }
    assert {n for n in names() if isinstance(create(n), AddsColumns)} == {"mix_chord"}
    assert {n for n in names() if isinstance(create(n), MasksRows)} == {"mask_response_truncated", "mask_truncated_completions"}
    assert create("mask_response_truncated").masks and not create("mask_response_truncated", {"drop": True}).masks
    assert chain_of("mask_response_truncated,grpo").masking is not None
    assert chain_of("mask_response_truncated,grpo", {"drop": True}).masking is None
    assert chain_of("jsd").token_level and not chain_of("grpo").token_level
    functions = {n for n in names() if not isinstance(spec(n).implementation, str) and issubclass(spec(n).factory, FunctionEstimator)}
    assert "dr_grpo" in functions  # an estimator declared as one function explains its scores by the group mean
    assert {n for n in names() if isinstance(create(n), ExplainsScores)} == {
        "asymre", "correct_bias", "gpg", "grpo", "grpo_passk", "opmd", "opo", "rec", "reinforce",
        "reinforce_plus_plus_baseline", "remax", "rloo", "step_wise_grpo", "maxrl", "normalize",
    } | functions  # the others' audit baseline is null
    assert {n for n in names() if isinstance(create(n), ExplainsDrops)} >= {
        "reward_variance", "duplicate_informative", "grpo", "step_wise_grpo", "raft", "filter_groups",
        "dynamic_filtering", "mask_response_truncated",
    }
    dropping = {n for n in names() if isinstance(create(n), DropsGroups)}
    assert dropping == {"grpo", "correct_bias", "step_wise_grpo"}
    assert create("grpo").dropped_groups_metric is None
    assert create("grpo", {"std_threshold": 0.1}).dropped_groups_metric == "std_threshold_skipped"
    assert chain_of("reward_variance,step_wise_grpo", {"std_threshold": 0}).stage_metrics == [
        ("filter", "reward_variance", {"variance_threshold": 0.0}, None),
        ("advantage", "step_wise_grpo", RESOLVED_DEFAULTS["step_wise_grpo"] | {"std_threshold": 0.0}, "std_threshold_skipped"),
    ]


def test_the_math_hashes_strings_as_the_row_layer_does():
    from rescore.transforms.rows.keys import task_hash

    texts = ["response_truncated", "", "é", "normal"]
    assert [string_key(t) for t in texts] == task_hash(pa.array(texts)).view(np.int64).tolist()
    ints = np.array([0, 1, -5, 2**40], dtype=np.int64)
    assert mix64(ints.view(np.uint64)).tolist() == task_hash(pa.array(ints)).tolist()
