"""duplicate_informative's min_replace_ratio (POLARIS's `replace` dynamic sampling, as SkyRL's
handle_replace_sampling runs it): a batch is rebalanced only where its informative groups are
more than min_replace_ratio of its groups; otherwise it is kept whole and not copied."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch

import refs
from rescore.transforms.strategies import chain_of
from rescore.transforms.strategies.base import GroupedRows
from rescore.transforms.strategies.features import WHOLE_BATCH


def grouped(batches: list[list[list[float]]]) -> GroupedRows:
    """Rows of groups of rewards, batch by batch."""
    reward, offsets, batch = [], [0], []
    for b, groups in enumerate(batches):
        for g in groups:
            reward += g
            batch += [b] * len(g)
            offsets.append(offsets[-1] + len(g))
    n = len(reward)
    i64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return GroupedRows(reward=torch.tensor(reward, dtype=torch.float64), offsets=i64(offsets), batch=i64(batch),
                       run=i64(list(range(n))), step=i64([0] * n), action_tokens=i64([1] * n))


# batch 0: 2 informative of 4 groups (0.5); batch 1: 1 of 4 (0.25); batch 2: none
BATCHES = [
    [[0.0, 1.0], [1.0, 1.0], [0.0, 0.5], [0.0, 0.0]],
    [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.5, 0.5]],
    [[1.0, 1.0], [0.0, 0.0]],
]


def test_min_replace_ratio_by_hand():
    rows = grouped(BATCHES)
    plain = chain_of("duplicate_informative").score(rows)
    assert plain.keep.tolist() == [True, True, False, False, True, True, False, False] + [True, True] + [False] * 6 + [False] * 4
    assert plain.informative.tolist() == [True, False, True, False, True, False, False, False, False, False]
    # 0.3: batch 0 (2 > 1.2) and batch 1 (1 > 1.2? no) -> batch 1 and batch 2 (0 > 0.6? no) kept whole
    s = chain_of("duplicate_informative", {"min_replace_ratio": 0.3}).score(rows)
    assert s.keep.tolist() == [True, True, False, False, True, True, False, False] + [True] * 8 + [True] * 4
    assert s.informative.tolist() == [True, False, True, False] + [False] * 6
    # 0.5: batch 0 has 2 = 0.5 * 4, not more: kept whole too
    s = chain_of("duplicate_informative", {"min_replace_ratio": 0.5}).score(rows)
    assert s.keep.all() and not s.informative.any()
    # 0: replace wherever one group is informative; a batch with none is kept whole
    s = chain_of("duplicate_informative", {"min_replace_ratio": 0.0}).score(rows)
    assert s.keep.tolist()[:16] == plain.keep.tolist()[:16] and s.keep.tolist()[16:] == [True] * 4
    assert s.informative.tolist() == plain.informative.tolist()


def test_needs_and_params():
    assert chain_of("grpo,duplicate_informative").needs == ()
    assert WHOLE_BATCH in chain_of("grpo,duplicate_informative", {"min_replace_ratio": 0.3}).needs
    assert chain_of("duplicate_informative").params == {"duplicate_informative": {"variance_threshold": 0.0, "seed": 0}}
    from rescore.errors import ConfigError

    with pytest.raises(ConfigError, match="between 0 and 1"):
        chain_of("duplicate_informative", {"min_replace_ratio": 1.5})


@pytest.fixture(scope="module")
def skyrl_replace():
    try:
        src = refs._extra_unpacked("skyrl")
    except refs.RefsUnavailable as e:
        pytest.skip(str(e))
    from collections import defaultdict

    ns = {"np": np, "defaultdict": defaultdict, "List": list, "Dict": dict, "Any": object, "Tuple": tuple,
          "GeneratorOutput": dict, "logger": types.SimpleNamespace(info=lambda *a: None, warning=lambda *a: None),
          "slice_generator_output": lambda out, idx: {k: [v[i] for i in idx] for k, v in out.items()},
          "__name__": "_ref_skyrl_replace"}
    out = refs._extract(refs._find(src, "skyrl/train/utils/trainer_utils.py"), {"handle_replace_sampling", "get_bad_sample_replacements"}, ns)
    return out["handle_replace_sampling"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.8])
def test_replace_decision_matches_skyrl(skyrl_replace, seed, ratio):
    rng = random.Random(seed)
    n = 4  # SkyRL's n_samples_per_prompt: groups of equal size
    batches = [[[rng.choice([0.0, 1.0]) if rng.random() < 0.6 else 1.0 for _ in range(n)] for _ in range(rng.randint(1, 6))] for _ in range(4)]
    s = chain_of("duplicate_informative", {"min_replace_ratio": ratio}).score(grouped(batches))
    at = 0
    for groups in batches:
        rewards = [r for g in groups for r in g]
        uids = [f"g{i}" for i, g in enumerate(groups) for _ in g]
        _, replaced_uids, keep_sampling = skyrl_replace({"rewards": rewards}, uids, {"n_samples_per_prompt": n, "min_replace_ratio": ratio})
        keep = s.keep[at : at + len(rewards)].tolist()
        at += len(rewards)
        bad = {u for u, g in zip((f"g{i}" for i in range(len(groups))), groups) if len(set(g)) == 1}
        if keep_sampling:  # SkyRL keeps the batch as it is (and samples again): we keep it whole, uncopied
            assert all(keep)
        else:  # SkyRL replaces every bad group: we drop them (and copy the good ones)
            assert keep == [u not in bad for u in uids]
            assert not bad & set(replaced_uids)
