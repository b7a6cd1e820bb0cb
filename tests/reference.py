"""A slow, obviously-correct reference: plain Python loops over row dicts, float64 math.

Written from ../shared/spec/strategies.md and contract.md, sharing no code with the package, so
the pipeline tests compare two independent implementations.
"""

from __future__ import annotations

import math
from collections import defaultdict


def _bad_reason(row: dict, needs_logprobs: bool) -> str | None:
    for key in ("batch", "task", "run", "step", "reward"):
        if key in row and row[key] is None:
            return "null_value"
    r = float(row["reward"])
    if math.isnan(r) or math.isinf(r):
        return "bad_reward"
    lengths = []
    for key in ("action_mask", "logprobs"):
        if key in row:
            if row[key] is None:
                return "null_value"
            lengths.append(len(row[key]))
    if "tokens" in row:
        if row["tokens"] is None or row.get("prompt_length") is None:
            return "null_value"
        if not 0 <= row["prompt_length"] <= len(row["tokens"]):
            return "bad_prompt_length"
        lengths.append(len(row["tokens"]) - row["prompt_length"])
    if len(set(lengths)) > 1:
        return "length_mismatch"
    if "action_mask" in row and any(int(m) not in (0, 1) for m in row["action_mask"]):
        return "bad_action_mask"
    if needs_logprobs and any(math.isnan(x) for x in row["logprobs"]):
        return "bad_logprobs"
    return None


def _response_mask(row: dict) -> list[float]:
    if "action_mask" in row:
        return [float(m) for m in row["action_mask"]]
    if "logprobs" in row:
        return [1.0] * len(row["logprobs"])
    if "tokens" in row:
        return [1.0] * (len(row["tokens"]) - row["prompt_length"])
    return []


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _mean_logprob(row: dict) -> float:
    mask = _response_mask(row)
    picked = [lp for lp, m in zip(row["logprobs"], mask) if m == 1.0]
    return sum(picked) / len(picked) if picked else -math.inf


def rescore(rows: list[dict], strategy: str, params: dict | None = None) -> dict:
    """Return {"scored": {id: (score, advantages)}, "filtered": set(ids), "rejected": {id: category}}.

    id = (batch, task, run, step). strategy: "grpo" or "correct_bias".
    """
    params = dict(params or {})
    epsilon = params.get("epsilon", 1e-6)
    if strategy == "correct_bias":
        rank_penalty = params.get("rank_penalty", 0.25)
        std_cal_level, std_threshold = "group", None
    else:
        rank_penalty = params.get("rank_penalty")
        std_cal_level = params.get("std_cal_level", "group")
        std_threshold = params.get("std_threshold")
    needs_logprobs = rank_penalty is not None

    def rid(row):
        return (row["batch"], row["task"], row["run"], row.get("step", 0))

    out = {"scored": {}, "filtered": set(), "rejected": {}}
    valid = []
    for row in rows:
        reason = _bad_reason(row, needs_logprobs)
        if reason:
            out["rejected"][rid(row)] = reason
        else:
            valid.append(row)
    seen = defaultdict(int)
    for row in valid:
        seen[rid(row)] += 1
    for row in valid:
        if seen[rid(row)] > 1:
            out["rejected"][rid(row)] = "duplicate_id"
    valid = [row for row in valid if seen[rid(row)] == 1]

    groups = defaultdict(list)
    batch_rewards = defaultdict(list)
    for row in valid:
        groups[(row["batch"], row["task"])].append(row)
        batch_rewards[row["batch"]].append(float(row["reward"]))
    batch_std = {b: (_std(rs) if len(rs) > 1 else 1.0) for b, rs in batch_rewards.items()}

    for (batch, _), members in groups.items():
        members.sort(key=lambda r: (r["run"], r.get("step", 0)))
        n = len(members)
        rewards = [float(r["reward"]) for r in members]
        if rank_penalty is not None:
            keyed = sorted(range(n), key=lambda i: (_mean_logprob(members[i]), i))
            rank = [0] * n
            for position, i in enumerate(keyed):
                rank[i] = position
            rewards = [r * (1 - rank[i] / n * rank_penalty) for i, r in enumerate(rewards)]
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = _mean(rewards), _std(rewards)
        dropped = std_threshold is not None and (n == 1 or std <= std_threshold)
        denominator = batch_std[batch] if std_cal_level == "batch" else std
        for row, reward in zip(members, rewards):
            if dropped:
                out["filtered"].add(rid(row))
                continue
            score = (reward - mean) / (denominator + epsilon)
            out["scored"][rid(row)] = (score, [score * m for m in _response_mask(row)])
    return out
