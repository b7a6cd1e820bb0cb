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
    # The spec's zero spread: equal values have mean exactly that value (sum(6 x 0.1) / 6 is not).
    if max(xs) == min(xs):
        return xs[0]
    return sum(xs) / len(xs)


def _std(xs):
    if max(xs) == min(xs):
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _grpo(x, mean, den, eps):
    """(x - mean) / (den + eps); exactly 0 where the std used is 0 (spec: zero spread)."""
    return 0.0 if den == 0 else (x - mean) / (den + eps)


def _mean_logprob(row: dict) -> float:
    mask = _response_mask(row)
    picked = [lp for lp, m in zip(row["logprobs"], mask) if m == 1.0]
    return sum(picked) / len(picked) if picked else -math.inf


def _rid(row: dict) -> tuple:
    return (row["batch"], row["task"], row["run"], row.get("step", 0))


def _valid_rows(rows: list[dict], rejected: dict, needs_logprobs: bool, needs_expert: bool = False) -> list[dict]:
    """Rows that pass validation and whose id is unique; records the others in `rejected`."""
    valid = []
    for row in rows:
        reason = _bad_reason(row, needs_logprobs)
        if reason is None and needs_expert and row.get("expert") is None:
            reason = "null_value"
        if reason:
            rejected[_rid(row)] = reason
        else:
            valid.append(row)
    seen = defaultdict(int)
    for row in valid:
        seen[_rid(row)] += 1
    for row in valid:
        if seen[_rid(row)] > 1:
            rejected[_rid(row)] = "duplicate_id"
    return [row for row in valid if seen[_rid(row)] == 1]


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

    rid = _rid
    out = {"scored": {}, "filtered": set(), "rejected": {}}
    valid = _valid_rows(rows, out["rejected"], needs_logprobs)

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
            score = _grpo(reward, mean, denominator, epsilon)
            out["scored"][rid(row)] = (score, [score * m for m in _response_mask(row)])
    return out


# --- every strategy and their composition ------------------------------------------------------

DEFAULTS = {
    "grpo": {"epsilon": 1e-6, "std_cal_level": "group", "std_threshold": None, "rank_penalty": None},
    "correct_bias": {"epsilon": 1e-6, "rank_penalty": 0.25},
    "opmd": {"opmd_baseline": "mean", "tau": 1.0},
    "asymre": {"baseline_shift": -0.1},
    "step_wise_grpo": {"epsilon": 1e-6, "enable_step_norm": False, "std_cal_level": "group", "std_threshold": None},
    "dr_grpo": {},
    "rloo": {},
    "maxrl": {"epsilon": 1e-6},
    "flash_reinforce": {},
    "normalize": {"mean_level": "batch", "mean_leave1out": False, "std_level": "batch", "std_unbiased": True, "eps": 1e-5,
                  "std_of": "centered", "weighting": "row"},
    "reinforce_plus_plus_baseline": {},
    "raft": {"reward_threshold": 0.0, "top_only": True, "weight": 1.0},
    "constant": {"weight": 1.0},
    "mix_chord": {"epsilon": 1e-6, "mu_warmup_steps": 0, "mu_decay_steps": 0, "mu_peak": 0.1, "mu_valley": 0.1,
                  "enable_phi_function": True},
    "reward_variance": {"variance_threshold": 0.0},
    "duplicate_informative": {"variance_threshold": 0.0, "seed": 0},
}
FILTERS, DUPLICATORS = {"reward_variance"}, {"duplicate_informative"}


def _pvar(xs):
    if max(xs) == min(xs):
        return 0.0
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / len(xs)


def _stats(xs):
    return (0.0, 1.0) if len(xs) == 1 else (_mean(xs), _std(xs))


def _informative(members, threshold):
    return len(members) >= 2 and _pvar([float(r["reward"]) for r in members]) > threshold


def _last_steps(members):
    """{run: reward of the row with the largest step}, {run: number of steps}."""
    last, steps = {}, defaultdict(int)
    for r in members:
        steps[r["run"]] += 1
        if r["run"] not in last or r.get("step", 0) > last[r["run"]][0]:
            last[r["run"]] = (r.get("step", 0), float(r["reward"]))
    return {k: v[1] for k, v in last.items()}, steps


def _mu(step, warmup, decay, peak, valley):
    if step < warmup:
        return step / warmup * peak
    if step >= warmup + decay:
        return valley
    return (peak - valley) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / decay)) + valley


def _advantage(name, p, groups, batch_of):
    """{id: (score, token_scale)} for kept rows; dropped ids are absent."""
    out = {}

    def rid(r):
        return (r["batch"], r["task"], r["run"], r.get("step", 0))

    # Batch statistics over every row this stage sees.
    by_batch = defaultdict(list)
    for key, members in groups.items():
        by_batch[batch_of[key]].append(members)
    batch_std, whiten = {}, {}
    for b, gs in by_batch.items():
        if name == "step_wise_grpo":
            values = [v for m in gs for v in _last_steps(m)[0].values()]
        else:
            values = [float(r["reward"]) for m in gs for r in m]
        batch_std[b] = _std(values) if len(values) > 1 else 1.0
        if name == "reinforce_plus_plus_baseline":
            pairs = []
            for m in gs:
                mean = _stats([float(r["reward"]) for r in m])[0]
                pairs += [(float(r["reward"]) - mean, sum(_response_mask(r))) for r in m]
            total = sum(w for _, w in pairs)
            mu = sum(s * w for s, w in pairs) / total if total > 0 else 0.0
            var = sum(w * (s - mu) ** 2 for s, w in pairs) / (total - 1) if total > 1 else 0.0
            weighted = {s for s, w in pairs if w > 0}
            if len(weighted) == 1:  # zero spread: mu is that value, var exactly 0
                mu, var = weighted.pop(), 0.0
            whiten[b] = (mu, var)

    for key, members in groups.items():
        b = batch_of[key]
        rewards = [float(r["reward"]) for r in members]
        n = len(members)
        if name in ("grpo", "correct_bias"):
            eps = p["epsilon"]
            if p.get("rank_penalty") is not None:
                keyed = sorted(range(n), key=lambda i: (_mean_logprob(members[i]), i))
                rank = [0] * n
                for pos, i in enumerate(keyed):
                    rank[i] = pos
                rewards = [r * (1 - rank[i] / n * p["rank_penalty"]) for i, r in enumerate(rewards)]
            mean, std = _stats(rewards)
            if p.get("std_threshold") is not None and (n == 1 or std <= p["std_threshold"]):
                continue
            den = batch_std[b] if p.get("std_cal_level") == "batch" else std
            for r, x in zip(members, rewards):
                out[rid(r)] = (_grpo(x, mean, den, eps), 1.0)
        elif name == "step_wise_grpo":
            last, steps = _last_steps(members)
            runs = sorted(last)
            outcome = [last[k] for k in runs]
            mean, std = _stats(outcome)
            if p["std_threshold"] is not None and (len(runs) == 1 or std <= p["std_threshold"]):
                continue
            den = batch_std[b] if p["std_cal_level"] == "batch" else std
            for r in members:
                score = _grpo(last[r["run"]], mean, den, p["epsilon"])
                out[rid(r)] = (score, 1.0 / steps[r["run"]] if p["enable_step_norm"] else 1.0)
        elif name == "opmd":
            if n == 1:
                base = 0.0
            elif p["opmd_baseline"] == "mean" or max(rewards) == min(rewards):
                base = _mean(rewards)  # logavgexp of equal rewards is that reward
            else:
                tau = p["tau"]
                top = max(x / tau for x in rewards)
                base = tau * (top + math.log(sum(math.exp(x / tau - top) for x in rewards)) - math.log(n))
            for r, x in zip(members, rewards):
                out[rid(r)] = (x - base, 1.0)
        elif name == "asymre":
            base = 0.0 if n == 1 else _mean(rewards) + p["baseline_shift"]
            for r, x in zip(members, rewards):
                out[rid(r)] = (x - base, 1.0)
        elif name == "dr_grpo":
            base = 0.0 if n == 1 else _mean(rewards)
            for r, x in zip(members, rewards):
                out[rid(r)] = (x - base, 1.0)
        elif name == "rloo":
            for i, (r, x) in enumerate(zip(members, rewards)):
                others = rewards[:i] + rewards[i + 1:]
                out[rid(r)] = ((x - _mean(others)) if others else x, 1.0)
        elif name == "reinforce_plus_plus_baseline":
            mean = 0.0 if n == 1 else _mean(rewards)
            mu, var = whiten[b]
            for r, x in zip(members, rewards):
                out[rid(r)] = ((x - mean - mu) / math.sqrt(var + 1e-8), 1.0)
        elif name == "raft":
            top = max(rewards)
            for r, x in zip(members, rewards):
                if (not p["top_only"] or x == top) and (p["reward_threshold"] is None or x > p["reward_threshold"]):
                    out[rid(r)] = (p["weight"], 1.0)
        elif name == "constant":
            for r in members:
                out[rid(r)] = (p["weight"], 1.0)
        elif name == "mix_chord":
            usual = [(r, x) for r, x in zip(members, rewards) if not r["expert"]]
            if usual:
                mean, std = _stats([x for _, x in usual])
                for r, x in usual:
                    out[rid(r)] = (_grpo(x, mean, std, p["epsilon"]), 1.0)
            for r in members:
                if r["expert"]:
                    out[rid(r)] = (0.0, 1.0)
        elif name == "maxrl":
            mean = _mean(rewards)
            for r, x in zip(members, rewards):
                out[rid(r)] = ((x - mean) / (mean + p["epsilon"]) if n > 1 else x, 1.0)
        elif name == "flash_reinforce":
            values = [float(r["reward"]) for m in by_batch[b] for r in m]
            mean = values[0] if len(set(values)) == 1 else _mean(values)
            for r, x in zip(members, rewards):
                out[rid(r)] = (x - mean, 1.0)
        elif name == "normalize":  # row weights, no leave-one-out: the plain formula
            pool = [float(r["reward"]) for m in by_batch[b] for r in m]
            ddof = 1 if p["std_unbiased"] else 0
            level_mean = {"group": _mean(rewards) if len(set(rewards)) > 1 else rewards[0],
                          "batch": _mean(pool) if len(set(pool)) > 1 else pool[0], "none": 0.0}[p["mean_level"]]

            def centered(xs, m):
                return [x - m for x in xs]

            if p["std_level"] == "none":
                s, eps = 1.0, 0.0
            else:
                if p["std_level"] == "group":
                    res = centered(rewards, level_mean)
                else:  # batch: the residuals of every group of the batch about their own level's mean
                    res = []
                    for m in by_batch[b]:
                        xs = [float(r["reward"]) for r in m]
                        own = {"group": _mean(xs) if len(set(xs)) > 1 else xs[0], "batch": level_mean, "none": 0.0}[p["mean_level"]]
                        res += centered(xs, own)
                s = math.sqrt(sum(x * x for x in res) / (len(res) - ddof)) if len(res) > ddof else 1.0
                eps = p["eps"]
            for r, x in zip(members, rewards):
                out[rid(r)] = ((x - level_mean) / (s + eps), 1.0)
        else:  # pragma: no cover
            raise ValueError(name)
    return out


def rescore_plan(rows: list[dict], stages: list[str], params: dict | None = None) -> dict:
    """The spec applied to `rows` with stages (filter, advantage, duplicate) in order.

    Returns {"scored": {id: (score or None, advantages or None, row)}, "filtered": set(ids),
    "rejected": {id: category}, "informative": {group key: [ids]}, "before": {batch: rows}}.
    `params` keys are `name` or `stage.name`.
    """
    p = {s: dict(DEFAULTS[s]) for s in stages}
    for key, value in (params or {}).items():
        stage, _, name = key.rpartition(".")
        stage = stage or next(s for s in stages if name in DEFAULTS[s])
        p[stage][name] = value
    adv = next((s for s in stages if s not in FILTERS | DUPLICATORS), None)
    needs_logprobs = adv is not None and p[adv].get("rank_penalty") is not None

    rid = _rid
    out = {"scored": {}, "filtered": set(), "rejected": {}, "informative": {}, "before": defaultdict(int)}
    valid = _valid_rows(rows, out["rejected"], needs_logprobs, needs_expert=adv == "mix_chord")

    groups = defaultdict(list)
    for row in valid:
        groups[(row["batch"], row["task"])].append(row)
        out["before"][row["batch"]] += 1
    for members in groups.values():
        members.sort(key=lambda r: (r["run"], r.get("step", 0)))
    batch_of = {k: k[0] for k in groups}

    kept = dict(groups)
    for f in [s for s in stages if s in FILTERS]:
        kept = {k: m for k, m in kept.items() if _informative(m, p[f]["variance_threshold"])}
    scores = None
    if adv is not None:
        scores = _advantage(adv, p[adv], kept, batch_of)
        kept = {k: [r for r in m if rid(r) in scores] for k, m in kept.items()}
        kept = {k: m for k, m in kept.items() if m}
    for d in [s for s in stages if s in DUPLICATORS]:
        kept = {k: m for k, m in kept.items() if _informative(m, p[d]["variance_threshold"])}
        out["informative"] = {k: [rid(r) for r in m] for k, m in kept.items()}

    written = {rid(r) for m in kept.values() for r in m}
    for row in valid:
        i = rid(row)
        if i not in written:
            out["filtered"].add(i)
            continue
        if scores is None:
            out["scored"][i] = (None, None, row)
        else:
            score, scale = scores[i]
            out["scored"][i] = (score, [score * scale * m for m in _response_mask(row)], row)
    if adv == "mix_chord":
        q = p[adv]
        for i, (score, advantages, row) in out["scored"].items():
            mu = _mu(row["batch"], q["mu_warmup_steps"], q["mu_decay_steps"], q["mu_peak"], q["mu_valley"])
            row["_mu"] = mu
            row["_loss_weight"] = mu if row["expert"] else 1 - mu
            row["_phi"] = [math.exp(x) * (1 - math.exp(x)) for x in row["logprobs"]]
    return out
