"""Each new estimator against the reference's own function (verl 0.9.1, Trinity-RFT 0.6.0).

The references come from their wheels (tests/refs.py); without them the tests skip with the
reason. Our side runs the real scoring path without Beam: validation, light rows, sorting,
batch statistics from sorted values, the plan, and the token output. Random batches have
groups of 1..64 rows, ties, all-equal groups and action masks with zeros; tolerance 1e-5
relative (1e-6 absolute where the reference computes in float32).

Intentional differences, excluded here and pinned in test_estimators_units.py:
- groups of one row in `rec` (Trinity raises NameError) and `grpo_passk` (verl raises);
- `remax` at masked positions (the references leave r - 0 there; our advantages are masked);
- `gigpo` with `anchor_scope: task` keeps anchors within the task group (the data of
  test_gigpo_matches_trinity gives each task its own state hashes, where both agree); the
  default `batch` pools them across tasks as Trinity does (test_gigpo_pooled_anchors_...).
"""

from __future__ import annotations

import random
import types

import numpy as np
import pyarrow as pa
import pytest
import torch

import refs
from rescore.schemas.validation import check_rows
from rescore.transforms.rows.keys import light_rows
from rescore.transforms.rows.groups import sort_rows, to_grouped_rows
from rescore.transforms.rows import strategy_columns
from rescore.transforms.strategies import chain_of
from rescore.transforms.strategies.estimators import rec_scores, row_keys


@pytest.fixture(scope="module")
def ref():
    try:
        return refs.load()
    except refs.RefsUnavailable as e:
        pytest.skip(str(e))


# --- data --------------------------------------------------------------------------------------


def random_batches(seed: int, *, batches: int = 3, min_group: int = 1, multi_turn: bool = True, steps: bool = False) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for b in range(batches):
        for t in range(rng.randint(1, 6)):
            size = rng.choice([min_group, 2, 3, 5, 8, 16, 64, rng.randint(max(min_group, 1), 64)])
            kind = rng.random()
            equal = rng.choice([0.0, 1.0, 0.1, 2.5])
            for run in rng.sample(range(100), size):
                for step in sorted(rng.sample(range(6), rng.randint(1, 3))) if steps else [0]:
                    if kind < 0.2:
                        reward = equal  # all-equal group
                    elif kind < 0.6:
                        reward = float(rng.choice([0, 1]))  # ties
                    else:
                        reward = rng.uniform(-2, 3)
                    length = rng.randint(1, 9)
                    mask = [int(rng.random() > 0.25) if multi_turn else 1 for _ in range(length)]
                    logprobs = [-rng.random() * 3 for _ in range(length)]
                    rows.append(
                        {
                            "batch": b,
                            "task": t,
                            "run": run,
                            "step": step,
                            "reward": reward,
                            "logprobs": logprobs,
                            "teacher_logprobs": [min(0.0, x + rng.uniform(-1, 1)) for x in logprobs],  # log-probs: <= 0
                            "action_mask": mask,
                            "acc": float(rng.random() > 0.5) if kind >= 0.2 else 1.0,
                            "fmt": rng.choice([0.0, 0.5, 1.0]),
                            "reward_baselines": rng.uniform(-1, 1),
                            "env_state_hash": f"t{t}-s{rng.randint(0, 3)}",
                            "step_reward": rng.choice([0.0, 1.0, rng.uniform(-1, 1)]),
                        }
                    )
    rng.shuffle(rows)
    return rows


SCHEMA = pa.schema(
    [
        ("batch", pa.int64()),
        ("task", pa.int64()),
        ("run", pa.int64()),
        ("step", pa.int64()),
        ("reward", pa.float64()),
        ("logprobs", pa.list_(pa.float32())),
        ("teacher_logprobs", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.int8())),
        ("acc", pa.float64()),
        ("fmt", pa.float64()),
        ("reward_baselines", pa.float64()),
        ("env_state_hash", pa.string()),
        ("step_reward", pa.float64()),
    ]
)


# --- our side: the real scoring path without Beam ----------------------------------------------


def ours(strategy: str, params: dict, rows: list[dict]) -> list[np.ndarray]:
    """Token advantages (float64 before the float32 cast) of each input row, in input order."""
    plan = chain_of(strategy, params)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    check = check_rows(table, needs=plan.needs)
    assert check.ok.all(), check.reasons[~check.ok][:3]
    light = light_rows(0, table, check, task_type=pa.int64(), needs=plan.needs)
    light, dups = sort_rows(light)
    assert dups.num_rows == 0
    grouped = to_grouped_rows(light, torch.device("cpu"))
    stats = None
    if plan.batch_level:
        batch, values, weights = (t.numpy() for t in plan.batch_values(grouped))
        per_batch = {}
        for b in np.unique(batch):
            v, w = values[batch == b], weights[batch == b]
            order = np.lexsort((w, v))
            per_batch[int(b)] = plan.batch_stats(v[order], w[order])
        stats = torch.tensor([per_batch[int(b)] for b in light["batch"].to_numpy()], dtype=torch.float64)
    s = plan.score(grouped, stats)
    order = light["row"].to_numpy()
    dropped = set(order[~s.keep.numpy()].tolist())
    score = np.zeros(len(rows))
    scale = np.ones(len(rows))
    score[order] = s.score.numpy()
    if s.token_scale is not None:
        scale[order] = s.token_scale.numpy()
    if plan.token_level:
        flat, _ = strategy_columns.token_values(plan, table, score, score * scale)
        lengths = [len(r["action_mask"]) for r in rows]
        out = list(np.split(np.asarray(flat, np.float64), np.cumsum(lengths)[:-1]))
    else:
        out = [score[i] * scale[i] * np.asarray(r["action_mask"], np.float64) for i, r in enumerate(rows)]
    # Rows a stage dropped: None (the callers comparing with a reference drop nothing).
    return [None if i in dropped else a for i, a in enumerate(out)]


# --- the references' side ----------------------------------------------------------------------


def padded(rows: list[dict], dtype=torch.float64):
    """(token_level_rewards, response_mask, lengths) as Trinity's to_data_proto lays them out:
    right-padded responses, the reward on the last response token."""
    width = max(len(r["action_mask"]) for r in rows)
    rewards = torch.zeros(len(rows), width, dtype=dtype)
    mask = torch.zeros(len(rows), width, dtype=dtype)
    for i, r in enumerate(rows):
        n = len(r["action_mask"])
        rewards[i, n - 1] = r["reward"]
        mask[i, :n] = torch.tensor(r["action_mask"], dtype=dtype)
    return rewards, mask


def per_batch(rows: list[dict]):
    for b in sorted({r["batch"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["batch"] == b]
        yield idx, [rows[i] for i in idx]


def unpad(adv: torch.Tensor, rows: list[dict]) -> list[np.ndarray]:
    return [adv[i, : len(r["action_mask"])].double().numpy() for i, r in enumerate(rows)]


def by_batch(fn, rows: list[dict]) -> list[np.ndarray]:
    out: list = [None] * len(rows)
    for idx, part in per_batch(rows):
        for i, a in zip(idx, fn(part)):
            out[i] = a
    return out


def uid(rows):
    return np.array([f"{r['batch']}/{r['task']}" for r in rows], dtype=object)


def experiences(ref, rows, *, info_keys=()):
    exps = []
    for r in rows:
        eid = ref.EID(batch=r["batch"], task=r["task"], run=r["run"], step=r["step"])
        info = {k: r[k] for k in info_keys}
        exps.append(ref.Experience(eid, r["reward"], torch.tensor(r["action_mask"], dtype=torch.bool), info))
    return exps


def assert_close(got: list[np.ndarray], want: list[np.ndarray], *, rtol=1e-5, atol=1e-6, masks=None, flat=()):
    """`flat`: rows of batches with zero spread. There the references' epsilon placement
    (masked_mean divides by sum(mask) + 1e-8, then by sqrt(var + 1e-8) with var ~ 0) leaves
    values up to ~1e-4; ours are exactly 0 (spec: zero spread is exact). Intentional."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if masks is not None:
            keep = np.asarray(masks[i], bool)
            g, w = g[keep], w[keep]
        if i in flat:
            assert not g.any(), f"row {i}: a zero-spread batch must score exactly 0, got {g}"
            np.testing.assert_allclose(w, 0.0, atol=1e-3, err_msg=f"row {i} (reference, zero-spread batch)")
            continue
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"row {i}")


def flat_batches(rows: list[dict], values=lambda r: r["reward"]) -> set[int]:
    """Rows whose batch has one value on every action token (zero spread over the batch)."""
    seen: dict = {}
    for r in rows:
        seen.setdefault(r["batch"], set())
        if any(r["action_mask"]):
            seen[r["batch"]].add(values(r))
    return {i for i, r in enumerate(rows) if len(seen[r["batch"]]) <= 1}


def zero_spread_batches(got: list[np.ndarray], want: list[np.ndarray], rows: list[dict]) -> set[int]:
    """Rows of batches where the whitening input has no spread: we score the whole batch 0,
    the reference's epsilon placement leaves |values| < 1e-3 (see assert_close)."""
    out = set()
    for _, idx in ((b, [i for i, r in enumerate(rows) if r["batch"] == b]) for b in {r["batch"] for r in rows}):
        if not any(got[i].any() for i in idx) and max(np.abs(want[i]).max(initial=0.0) for i in idx) < 1e-3:
            out.update(idx)
    return out


SEEDS = [0, 1, 2, 3]


# --- REINFORCE++ --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_reinforceplusplus_matches_trinity(ref, seed, gamma):
    rows = random_batches(seed)

    def trinity(part):
        rewards, mask = padded(part)
        data = ref.DataProto({"token_level_rewards": rewards, "response_mask": mask})
        out, _ = ref.trinity.REINFORCEPLUSPLUSAdvantageFn(gamma=gamma)(data)
        return unpad(out.batch["advantages"], part)

    flat = flat_batches(rows) if gamma == 1.0 else set()
    assert_close(ours("reinforceplusplus", {"gamma": gamma}, rows), by_batch(trinity, rows), atol=1e-9, flat=flat)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_reinforce_plus_plus_matches_verl(ref, seed, gamma):
    rows = random_batches(seed)

    def verl(part):
        rewards, mask = padded(part)
        adv, _ = ref.verl.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=types.SimpleNamespace(gamma=gamma))
        return unpad(adv, part)

    flat = flat_batches(rows, lambda r: r["reward"] * r["action_mask"][-1]) if gamma == 1.0 else set()
    assert_close(ours("reinforce_plus_plus", {"gamma": gamma}, rows), by_batch(verl, rows), atol=1e-9, flat=flat)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_baseline_matches_verl(ref, seed):
    rows = random_batches(seed)

    def verl(part):
        rewards, mask = padded(part)
        adv, _ = ref.verl.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uid(part))
        return unpad(adv, part)

    got, want = ours("reinforce_plus_plus_baseline", {}, rows), by_batch(verl, rows)
    assert_close(got, want, atol=1e-9, flat=zero_spread_batches(got, want, rows))


# --- Trinity group estimators ------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_matches_trinity(ref, seed):
    rows = random_batches(seed)
    exps, _ = ref.trinity.REINFORCEGroupAdvantage()(experiences(ref, rows))
    want = {(e.eid.batch, e.eid.task, e.eid.run, e.eid.step): e.advantages.double().numpy() for e in exps}
    assert_close(ours("reinforce", {}, rows), [want[(r["batch"], r["task"], r["run"], r["step"])] for r in rows])


def _trinity_rec(ref, rows, **kwargs):
    exps, _ = ref.trinity.RECGroupedAdvantage(**kwargs)(experiences(ref, rows))
    want = {(e.eid.batch, e.eid.task, e.eid.run, e.eid.step): e.advantages.double().numpy() for e in exps}
    return [want[(r["batch"], r["task"], r["run"], r["step"])] for r in rows]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("std_normalize", [False, True])
def test_rec_matches_trinity(ref, seed, std_normalize):
    # Groups of at least 2 rows: Trinity's REC fails on a group of one (NameError).
    rows = random_batches(seed, min_group=2)
    want = _trinity_rec(ref, rows, std_normalize=std_normalize)
    assert_close(ours("rec", {"std_normalize": std_normalize}, rows), want, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("std_normalize", [False, True])
def test_rec_drop_balance_matches_trinity_given_the_same_choice(ref, seed, std_normalize, monkeypatch):
    """Trinity draws the dropped rows with torch.randperm; we draw them from a hash of the row
    ids. Feeding Trinity our choice through its randperm, the rest must agree exactly."""
    rows = random_batches(seed, min_group=2)
    got = ours("rec", {"std_normalize": std_normalize, "drop": "balance"}, rows)
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault((r["batch"], r["task"]), []).append(i)
    module = ref.trinity._module_rec_advantage
    ours_drop = {}
    # Recompute our choice directly: the rows our pure function drops.
    plan = chain_of("rec", {"drop": "balance"})
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    check = check_rows(table, needs=plan.needs)
    light, _ = sort_rows(light_rows(0, table, check, task_type=pa.int64(), needs=plan.needs))
    grouped = to_grouped_rows(light, torch.device("cpu"))
    _, dropped_sorted, _, _ = rec_scores(
        grouped.reward, grouped.offsets, epsilon=1e-6, std_normalize=False, drop="balance", key=row_keys(grouped, 0)
    )
    for pos, flag in zip(light["row"].to_numpy(), dropped_sorted.numpy()):
        ours_drop[int(pos)] = bool(flag)
    perms = []
    for key, idx in groups.items():
        rewards = torch.tensor([rows[i]["reward"] for i in idx], dtype=torch.float32)
        neg = (~(rewards >= rewards.mean())).nonzero(as_tuple=True)[0].tolist()
        first = [k for k, j in enumerate(neg) if ours_drop[idx[j]]]
        rest = [k for k in range(len(neg)) if k not in first]
        if len(neg) > len(idx) - len(neg):
            perms.append(torch.tensor(first + rest, dtype=torch.long))
    fake = types.SimpleNamespace(**{k: getattr(torch, k) for k in ("tensor", "long", "bool", "ones", "mean", "std", "no_grad", "float32")})
    fake.randperm = lambda n: perms.pop(0)
    monkeypatch.setattr(module, "torch", fake)
    want = _trinity_rec(ref, rows, std_normalize=std_normalize, drop="balance")
    assert not perms
    assert_close(got, want, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("params", [{"lambda_coef": 0.5}, {"lambda_coef": 0.0}, {"lambda_coef": 1.0}, {"lambda_coef": 0.3, "kl_coef": 0.7, "temperature": 2.0}])
def test_jsd_matches_trinity(ref, seed, params):
    rows = random_batches(seed, batches=1)

    def trinity(part):
        _, mask = padded(part)
        width = mask.shape[1]
        student = torch.zeros_like(mask)
        teacher = torch.zeros_like(mask)
        for i, r in enumerate(part):
            n = len(r["action_mask"])
            student[i, :n] = torch.tensor(np.float32(r["logprobs"]), dtype=torch.float64)
            teacher[i, :n] = torch.tensor(np.float32(r["teacher_logprobs"]), dtype=torch.float64)
        assert width
        data = ref.DataProto({"old_log_probs": student, "teacher_logprobs": teacher, "response_mask": mask})
        out, _ = ref.trinity.JSDAdvantage(**params)(data)
        return unpad(out.batch["advantages"], part)

    assert_close(ours("jsd", params, rows), by_batch(trinity, rows), atol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_remax_matches_trinity_and_verl_on_action_tokens(ref, seed):
    rows = random_batches(seed)
    masks = [r["action_mask"] for r in rows]

    def trinity(part):
        rewards, mask = padded(part)
        base = torch.tensor([r["reward_baselines"] for r in part], dtype=torch.float64)
        data = ref.DataProto({"token_level_rewards": rewards, "response_mask": mask, "reward_baselines": base})
        out, _ = ref.trinity.REMAXAdvantageFn()(data)
        return unpad(out.batch["advantages"], part)

    def verl(part):
        rewards, mask = padded(part)
        base = torch.tensor([r["reward_baselines"] for r in part], dtype=torch.float64)
        adv, _ = ref.verl.compute_remax_outcome_advantage(rewards, base, mask)
        return unpad(adv, part)

    got = ours("remax", {}, rows)
    assert_close(got, by_batch(trinity, rows), atol=1e-9, masks=masks)
    assert_close(got, by_batch(verl, rows), atol=1e-9, masks=masks)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("params", [{}, {"fnorm": "std", "omega": 0.5, "gamma": 0.9}, {"step_reward_key": None, "gamma": 0.7}])
def test_gigpo_matches_trinity(ref, seed, params):
    """With the default step_reward_key the input's step_reward column is used (Trinity: the
    info key is present); step_reward_key=null is Trinity without the key (sparse fallback)."""
    rows = random_batches(seed, steps=True, multi_turn=False)

    def trinity(part):
        keys = ["env_state_hash"] + (["step_reward"] if params.get("step_reward_key", "step_reward") else [])
        fn = ref.trinity.GiGPOAdvantageFn(**{k: v for k, v in params.items() if k != "step_reward_key"})
        exps, _ = fn(experiences(ref, part, info_keys=keys))
        return [e.advantages.double().numpy() for e in exps]

    got, want = ours("gigpo", params, rows), by_batch(trinity, rows)
    if params.get("fnorm") == "std":
        # All-equal groups: Trinity's float32 mean leaves ~1e-9 spread and divides by it; ours
        # is exactly 0 (spec). Those groups are compared in test_estimators_units.py instead.
        equal = {}
        for r in rows:
            equal.setdefault((r["batch"], r["task"]), set()).add(r["reward"])
        keep = [i for i, r in enumerate(rows) if len(equal[(r["batch"], r["task"])]) > 1]
        got, want = [got[i] for i in keep], [want[i] for i in keep]
    assert_close(got, want, atol=1e-5)


def gigpo_batches(seed: int) -> list[dict]:
    """Multi-step runs whose anchor states repeat across the tasks of a batch, step rewards
    missing on some steps (null) and on every step of some runs, runs of one step, tasks of
    one run."""
    rng = random.Random(seed)
    rows = []
    for b in range(3):
        for t in range(rng.randint(1, 5)):
            for run in rng.sample(range(50), rng.choice([1, 1, 2, 3, 5])):
                kind = rng.random()  # < 0.3: no step reward on any step; else some missing
                for step in sorted(rng.sample(range(5), rng.choice([1, 1, 2, 3]))):
                    step_reward = None if kind < 0.3 or rng.random() < 0.3 else rng.choice([0.0, 1.0, rng.uniform(-1, 1)])
                    rows.append({
                        "batch": b, "task": t, "run": run, "step": step,
                        "reward": rng.choice([0.0, 1.0, rng.uniform(-2, 3)]), "logprobs": [-0.5, -0.5], "teacher_logprobs": [-0.5, -0.5],
                        "action_mask": [1, 1], "acc": 1.0, "fmt": 0.0, "reward_baselines": 0.0,
                        "env_state_hash": None if rng.random() < 0.1 else f"s{rng.randint(0, 3)}",
                        "step_reward": step_reward,
                    })
    rng.shuffle(rows)
    return rows


def trinity_gigpo(ref, rows: list[dict], params: dict) -> list[np.ndarray]:
    """Trinity's GiGPOAdvantageFn over each batch (one explore step); an info key only where
    the row has a value (a null is a missing key)."""

    def one_batch(part):
        exps = experiences(ref, part)
        for e, r in zip(exps, part):
            e.info = {k: r[k] for k in ("env_state_hash", "step_reward") if r[k] is not None}
        fn = ref.trinity.GiGPOAdvantageFn(**{k: v for k, v in params.items() if k not in ("step_reward_key", "anchor_scope")})
        out, _ = fn(exps)
        return [e.advantages.double().numpy() for e in out]

    return by_batch(one_batch, rows)


@pytest.mark.parametrize("seed", SEEDS + [4, 5, 6, 7])
@pytest.mark.parametrize("params", [{}, {"fnorm": "std", "omega": 0.5, "gamma": 0.9}, {"gamma": 0.7, "anchor_scope": "batch"}])
def test_gigpo_pooled_anchors_and_missing_step_rewards_match_trinity(ref, seed, params):
    """Anchors shared across tasks (pooled over the batch, the default) and null step rewards
    (a run with none falls back to its last-step reward; a missing step of a run with some is
    0), as Trinity's own GiGPOAdvantageFn computes them."""
    rows = gigpo_batches(seed)
    got, want = ours("gigpo", params, rows), trinity_gigpo(ref, rows, params)
    if params.get("fnorm") == "std":
        equal = {}
        for r in rows:
            equal.setdefault((r["batch"], r["task"]), set()).add(r["reward"])
        # Groups whose episode returns or anchor returns are all equal: Trinity's float32 mean
        # can leave ~1e-9 spread and divide by it (test_gigpo_all_equal_group_scores_exactly_zero).
        close = [i for i, (g, w) in enumerate(zip(got, want)) if np.all(np.abs(w) < 1e3)]
        got, want = [got[i] for i in close], [want[i] for i in close]
    assert_close(got, want, atol=1e-5)


def test_gigpo_one_step_run_without_step_reward_matches_trinity(ref):
    """The issue's cases: one row (reward 1, step_reward null) scores 1 / (1 + 1e-6); two
    one-step runs sharing an anchor keep their signs."""
    base = {"batch": 0, "step": 0, "logprobs": [-0.5], "teacher_logprobs": [-0.5], "action_mask": [1], "acc": 1.0,
            "fmt": 0.0, "reward_baselines": 0.0, "env_state_hash": "s", "step_reward": None}
    one = [{**base, "task": 0, "run": 0, "reward": 1.0}]
    got = ours("gigpo", {}, one)
    np.testing.assert_allclose(got[0], [0.999999], atol=1e-9)
    assert_close(got, trinity_gigpo(ref, one, {}), atol=1e-6)
    two = [{**base, "task": 0, "run": 0, "reward": 1.0}, {**base, "task": 0, "run": 1, "reward": 0.0}]
    got = ours("gigpo", {}, two)
    assert got[0][0] > 0 > got[1][0]
    assert_close(got, trinity_gigpo(ref, two, {}), atol=1e-6)
    got = ours("gigpo", {}, [{**r, "task": i} for i, r in enumerate(two)])  # one run per task, shared anchor
    assert_close(got, trinity_gigpo(ref, [{**r, "task": i} for i, r in enumerate(two)], {}), atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_gigpo_algorithm_preset_matches_trinity(ref, seed):
    from rescore.transforms.strategies import algorithms

    preset = algorithms.preset("gigpo")
    rows = gigpo_batches(seed)
    assert_close(ours(",".join(preset.strategies), dict(preset.params), rows), trinity_gigpo(ref, rows, {}), atol=1e-5)


# --- DAPO dynamic sampling (Trinity's experience operator) ------------------------------------


def dapo_rows(seed: int) -> list[dict]:
    """Groups of 1..8 rows; `accuracy` continuous, binary or null (then Trinity reads the
    reward), some groups all correct or all wrong."""
    rng = random.Random(seed)
    rows = []
    for b in range(3):
        for t in range(rng.randint(1, 8)):
            kind = rng.random()
            for run in range(rng.choice([1, 2, 3, 5, 8])):
                if kind < 0.2:
                    acc = 1.0
                elif kind < 0.35:
                    acc = 0.0
                elif kind < 0.6:
                    acc = float(rng.random() > 0.5)
                else:
                    acc = None if rng.random() < 0.3 else rng.uniform(-1, 1)
                rows.append({
                    "batch": b, "task": t, "run": run, "step": 0, "reward": rng.choice([0.0, 1.0, rng.uniform(-1, 2)]),
                    "logprobs": [-0.5], "teacher_logprobs": [-0.5], "action_mask": [1], "acc": acc, "fmt": 0.0,
                    "reward_baselines": 0.0, "env_state_hash": "s", "step_reward": 0.0,
                })
    rng.shuffle(rows)
    return rows


def trinity_dapo_kept(ref, rows: list[dict], **params) -> set[int]:
    """Indices of the rows Trinity's DAPODynamicSamplingFilter keeps, one explore step at a
    time; a row's `acc` is its experience metric (none where null)."""
    kept = set()
    for idx, part in per_batch(rows):
        exps = experiences(ref, part)
        for e, r in zip(exps, part):
            e.metrics = {} if r["acc"] is None else {"acc": r["acc"]}
        out, _ = ref.trinity.DAPODynamicSamplingFilter(metric_key="acc", **params).process(exps)
        kept |= {idx[exps.index(e)] for e in out}
    return kept


@pytest.mark.parametrize("seed", SEEDS + [4, 5, 6, 7])
@pytest.mark.parametrize("threshold", [0.0, 0.5, -0.2])
@pytest.mark.parametrize("name", ["dapo_dynamic_sampling", "dynamic_sampling"])
def test_dapo_dynamic_sampling_matches_trinity(ref, seed, threshold, name):
    rows = dapo_rows(seed)
    got = ours(f"{name},grpo", {"metric_key": "acc", "correct_threshold": threshold}, rows)
    kept = trinity_dapo_kept(ref, rows, correct_threshold=threshold)
    assert {i for i, a in enumerate(got) if a is not None} == kept
    assert 0 < len(kept) < len(rows)


@pytest.mark.parametrize("seed", SEEDS)
def test_algorithm_dapo_matches_trinity_filter_then_grpo(ref, seed):
    """The preset (metric 'accuracy': absent here, so the reward decides) keeps Trinity's rows,
    and scores them with Trinity's GRPO over what is left."""
    from rescore.transforms.strategies import algorithms

    preset = algorithms.preset("dapo")
    rows = dapo_rows(seed)
    got = ours(",".join(preset.strategies), dict(preset.params), rows)
    kept = set()
    for idx, part in per_batch(rows):
        exps = experiences(ref, part)
        out, _ = ref.trinity.DAPODynamicSamplingFilter().process(exps)
        kept |= {idx[exps.index(e)] for e in out}
        if out:
            scored, _ = ref.trinity.GRPOGroupedAdvantage()(out)
            for e in scored:
                i = idx[exps.index(e)]
                np.testing.assert_allclose(got[i], e.advantages.double().numpy(), rtol=1e-5, atol=1e-6)
    assert {i for i, a in enumerate(got) if a is not None} == kept


# --- verl group estimators ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_opo_matches_verl(ref, seed):
    rows = random_batches(seed)

    def verl(part):
        rewards, mask = padded(part)
        adv, _ = ref.verl.compute_opo_outcome_advantage(rewards, mask, uid(part))
        return unpad(adv, part)

    assert_close(ours("opo", {}, rows), by_batch(verl, rows), atol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_matches_verl(ref, seed, norm):
    # Groups of at least 2 rows: verl refuses a group of one (we score it 0).
    rows = random_batches(seed, min_group=2)

    def verl(part):
        rewards, mask = padded(part)
        adv, _ = ref.verl.compute_grpo_passk_outcome_advantage(rewards, mask, uid(part), config={"norm_adv_by_std_in_grpo": norm})
        return unpad(adv, part)

    assert_close(ours("grpo_passk", {"norm_adv_by_std_in_grpo": norm}, rows), by_batch(verl, rows), atol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("f_norm", [1.0, 2.5])
def test_gpg_matches_verl(ref, seed, f_norm):
    rows = random_batches(seed)

    def verl(part):
        rewards, mask = padded(part)
        adv, _ = ref.verl.compute_gpg_outcome_advantage(rewards, mask, uid(part), f_norm=f_norm)
        return unpad(adv, part)

    assert_close(ours("gpg", {"f_norm": f_norm}, rows), by_batch(verl, rows), atol=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "params",
    [
        {"gdpo_reward_keys": ["acc", "fmt"]},
        {"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [1.0, 0.25], "norm_adv_by_std_in_grpo": False},
        {},
    ],
)
def test_gdpo_matches_verl(ref, seed, params):
    rows = random_batches(seed)

    def verl(part):
        rewards, mask = padded(part)
        width = mask.shape[1]
        attention = torch.zeros(len(part), width, dtype=torch.int64)
        for i, r in enumerate(part):
            attention[i, : len(r["action_mask"])] = 1
        keys = params.get("gdpo_reward_keys")
        config = None
        if keys:
            config = {"gdpo_reward_keys": keys, "gdpo_reward_weights": params.get("gdpo_reward_weights")}
        adv, _ = ref.verl.compute_gdpo_outcome_advantage(
            rewards,
            mask,
            uid(part),
            norm_adv_by_std_in_grpo=params.get("norm_adv_by_std_in_grpo", True),
            config=config,
            non_tensor_batch={k: np.array([r[k] for r in part]) for k in ("acc", "fmt")},
            batch={"prompts": torch.zeros(len(part), 2), "attention_mask": torch.cat([torch.ones(len(part), 2, dtype=torch.int64), attention], 1)},
        )
        return unpad(adv, part)

    got, want = ours("gdpo", params, rows), by_batch(verl, rows)
    assert_close(got, want, atol=1e-5, flat=zero_spread_batches(got, want, rows))


def test_presets_cover_trinity_060_and_its_compute_in_trainer_flags(ref):
    """Every name of Trinity-RFT 0.6.0's ALGORITHM_TYPE resolves or is refused, and our list of
    algorithms whose advantages Trinity recomputes in the trainer is the wheel's."""
    import ast
    import os

    from rescore.transforms.strategies import ConfigError, algorithms

    src = os.path.join(refs.cache_dir(), "src", "trinity", "algorithm")
    init = ast.parse(open(os.path.join(src, "__init__.py"), encoding="utf-8").read())
    mapping = {}
    for node in ast.walk(init):
        if isinstance(node, ast.keyword) and node.arg == "default_mapping" and isinstance(node.value, ast.Dict):
            if any("AlgorithmType" in str(getattr(v, "value", "")) or ".algorithm.algorithm." in str(getattr(v, "value", "")) for v in node.value.values):
                mapping = {k.value: v.value.rsplit(".", 1)[1] for k, v in zip(node.value.keys, node.value.values)}
    assert len(mapping) >= 24, mapping
    classes = {}
    tree = ast.parse(open(os.path.join(src, "algorithm.py"), encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            flag = None
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", "") == "compute_advantage_in_trainer" and item.value is not None:
                    flag = item.value.value
            base = node.bases[0].id if node.bases and isinstance(node.bases[0], ast.Name) else None
            classes[node.name] = (flag, base)

    def in_trainer(cls):
        flag, base = classes[cls]
        return flag if flag is not None else in_trainer(base)

    assert {name for name, cls in mapping.items() if in_trainer(cls)} == set(algorithms.COMPUTED_IN_TRAINER)
    for name in mapping:
        try:
            algorithms.preset(name)
        except ConfigError as e:
            assert name in ("ppo", "dpo"), e
