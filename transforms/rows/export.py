"""What `rescore export` takes from scored rows: SFT rows and DPO pairs, and the one outcome of
every row (no Beam: a finished output's scored rows, read whole, in one process).

Every scored row gets exactly one outcome:
    exported      in the export (an SFT row, or the chosen or rejected side of a pair)
    not_chosen    its group's rule did not pick it
    tie           (dpo) its group has no strict best and worst under the tie rule
    below_margin  (dpo) its group's best - worst is below --min-margin
    duplicate     the same prompt and response tokens (sft), or the same prompt, chosen and
                  rejected tokens (dpo), were exported already, whatever the task id: identity
                  is the content, never an id or a hash; a dpo group whose chosen and rejected
                  responses are the same tokens is a duplicate too (a pair of one response)
    copy          a row duplication made (copy_index > 0): not a new sample
Groups are (batch, task); within a group, rows are ranked by the value (reward or score)
descending, ties by (run, step) ascending, so the choice never depends on file order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

OUTCOMES = ("exported", "not_chosen", "tie", "below_margin", "duplicate", "copy")
NEEDED = ("batch", "task", "run", "reward", "tokens", "prompt_length")


@dataclass(frozen=True)
class SftRule:
    rule: str  # "top_k", "threshold", "raft"
    by: str = "reward"
    k: int = 1
    threshold: float | None = None


@dataclass(frozen=True)
class DpoRule:
    by: str = "reward"
    min_margin: float = 0.0
    ties: str = "first"  # "first": lowest (run, step) among equal values; "skip": skip the group


def _groups(table: pa.Table, by: str):
    """(row order, group starts) with rows sorted by (batch, task, value desc, run, step), copies
    left out; and the indices of the copies."""
    n = table.num_rows
    copy = np.zeros(n, dtype=bool)
    if "copy_index" in table.column_names:
        copy = np.asarray(pc.fill_null(pc.greater(table["copy_index"], 0), False).to_numpy(zero_copy_only=False), dtype=bool)
    idx = np.flatnonzero(~copy)
    step = table["step"].to_numpy(zero_copy_only=False) if "step" in table.column_names else np.zeros(n, dtype=np.int64)
    value = np.asarray(pc.cast(table[by], pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    task = table["task"].to_pylist()
    batch = table["batch"].to_numpy(zero_copy_only=False)
    run = table["run"].to_numpy(zero_copy_only=False)
    order = sorted(idx.tolist(), key=lambda i: (batch[i], _task_key(task[i]), -value[i], run[i], step[i]))
    starts = [j for j, i in enumerate(order) if j == 0 or (batch[i], task[i]) != (batch[order[j - 1]], task[order[j - 1]])]
    return order, starts + [len(order)], np.flatnonzero(copy), value, task


def _task_key(t: Any) -> tuple:
    return (isinstance(t, str), t)


def _responses(table: pa.Table) -> tuple[list, list]:
    tokens = table["tokens"].to_pylist()
    plen = table["prompt_length"].to_pylist()
    return [t[:p] for t, p in zip(tokens, plen)], [t[p:] for t, p in zip(tokens, plen)]


def select_sft(table: pa.Table, rule: SftRule) -> tuple[list[int], np.ndarray]:
    """(indices of the exported rows, in group order; the outcome index of every row)."""
    outcome = np.full(table.num_rows, OUTCOMES.index("not_chosen"), dtype=np.int8)
    order, starts, copies, value, task = _groups(table, rule.by)
    outcome[copies] = OUTCOMES.index("copy")
    reward = np.asarray(pc.cast(table["reward"], pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    prompts, responses = _responses(table)
    seen: set = set()
    exported = []
    for a, b in zip(starts[:-1], starts[1:]):
        rows = order[a:b]
        if rule.rule == "top_k":
            chosen = rows[: rule.k]
        elif rule.rule == "threshold":
            chosen = [i for i in rows if value[i] >= rule.threshold]
        else:  # raft: Rescore's raft strategy with top_only: the group's top reward, above the threshold
            top = max(reward[i] for i in rows)
            chosen = [i for i in rows if reward[i] == top and reward[i] > (rule.threshold or 0.0)]
        for i in chosen:
            key = (tuple(prompts[i]), tuple(responses[i]))
            if key in seen:
                outcome[i] = OUTCOMES.index("duplicate")
                continue
            seen.add(key)
            outcome[i] = OUTCOMES.index("exported")
            exported.append(i)
    return exported, outcome


def select_dpo(table: pa.Table, rule: DpoRule) -> tuple[list[tuple[int, int]], np.ndarray]:
    """([(chosen row, rejected row)] in group order; the outcome index of every row)."""
    outcome = np.full(table.num_rows, OUTCOMES.index("not_chosen"), dtype=np.int8)
    order, starts, copies, value, task = _groups(table, rule.by)
    outcome[copies] = OUTCOMES.index("copy")
    prompts, responses = _responses(table)
    seen: set = set()
    pairs = []
    for a, b in zip(starts[:-1], starts[1:]):
        rows = order[a:b]
        best, worst = rows[0], rows[-1]
        if len(rows) < 2 or value[best] == value[worst]:
            outcome[rows] = OUTCOMES.index("tie")
            continue
        if rule.ties == "skip" and (value[rows[1]] == value[best] or value[rows[-2]] == value[worst]):
            outcome[rows] = OUTCOMES.index("tie")
            continue
        if rule.ties == "first":  # the lowest (run, step) among the rows sharing the worst value
            worst = next(i for i in rows if value[i] == value[worst])
        if value[best] - value[worst] < rule.min_margin:
            outcome[rows] = OUTCOMES.index("below_margin")
            continue
        key = (tuple(prompts[best]), tuple(responses[best]), tuple(responses[worst]))
        if key in seen or responses[best] == responses[worst]:
            outcome[[best, worst]] = OUTCOMES.index("duplicate")
            continue
        seen.add(key)
        outcome[[best, worst]] = OUTCOMES.index("exported")
        pairs.append((best, worst))
    return pairs, outcome


def counts(outcome: np.ndarray) -> dict[str, int]:
    c = Counter(outcome.tolist())
    return {name: int(c.get(i, 0)) for i, name in enumerate(OUTCOMES)}


_IDS = pa.list_(pa.int64())


def _type(table: pa.Table, name: str, default: pa.DataType = pa.int64()) -> pa.DataType:
    return table.schema.field(name).type if name in table.column_names else default


def sft_schema(table: pa.Table, text: bool) -> pa.Schema:
    """The columns of sft.parquet, whatever rows there are (none included): ids typed as the
    source's, text or token ids."""
    prompt = pa.string() if text else _IDS
    fields = [("prompt", prompt), ("completion", prompt), ("input_ids", _IDS), ("completion_mask", pa.list_(pa.int8())),
              ("prompt_ids", _IDS), ("completion_ids", _IDS), ("batch", _type(table, "batch")),
              ("task", _type(table, "task")), ("run", _type(table, "run")), ("step", _type(table, "step")),
              ("reward", pa.float64())]
    if "score" in table.column_names:
        fields.append(("score", pa.float64()))
    return pa.schema(fields)


def dpo_schema(table: pa.Table, text: bool) -> pa.Schema:
    """The columns of dpo.parquet, whatever pairs there are (none included)."""
    side = pa.string() if text else _IDS
    return pa.schema([
        ("prompt", side), ("chosen", side), ("rejected", side), ("prompt_ids", _IDS), ("chosen_ids", _IDS),
        ("rejected_ids", _IDS), ("batch", _type(table, "batch")), ("task", _type(table, "task")),
        ("chosen_run", _type(table, "run")), ("rejected_run", _type(table, "run")),
        ("chosen_step", _type(table, "step")), ("rejected_step", _type(table, "step")),
        ("chosen_reward", pa.float64()), ("rejected_reward", pa.float64()),
        ("chosen_score", pa.float64()), ("rejected_score", pa.float64()), ("margin", pa.float64()),
    ])


def _completion_masks(sub: pa.Table, prompts: list, completions: list) -> list[list[int]]:
    """0 over the prompt, then the row's action_mask over the completion (1 where the model
    generated the token; tool and environment tokens are 0, so SFT never trains on them), all
    ones where the row has none."""
    actions = sub["action_mask"].to_pylist() if "action_mask" in sub.column_names else [None] * sub.num_rows
    masks = []
    for p, c, action in zip(prompts, completions, actions):
        if action is None:
            action = [1] * len(c)
        elif len(action) != len(c):
            from rescore.errors import InputError

            raise InputError(f"a scored row's action_mask has {len(action)} values for {len(c)} response tokens")
        elif any(v not in (0, 1) for v in action):
            from rescore.errors import InputError

            raise InputError("a scored row's action_mask holds a value other than 0 and 1")
        masks.append([0] * len(p) + [int(v) for v in action])
    return masks


def sft_table(table: pa.Table, rows: list[int], by: str, decode=None) -> pa.Table:
    """TRL SFTTrainer / verl SFT columns: prompt and completion (text with `decode`, else the
    token ids), input_ids and completion_mask (TRL's tokenized form, which its
    DataCollatorForLanguageModeling takes: 1 on the completion tokens the model generated, the
    row's action_mask), prompt_ids and completion_ids, with the row's ids, reward and score.
    No rows: an empty table with the same schema (sft_schema)."""
    schema = sft_schema(table, decode is not None)
    if not rows:
        return schema.empty_table()
    sub = table.take(pa.array(rows, pa.int64()))
    prompts, completions = _responses(sub)
    ids = _IDS
    columns: dict[str, Any] = {
        "prompt": [decode(p) for p in prompts] if decode is not None else pa.array(prompts, ids),
        "completion": [decode(c) for c in completions] if decode is not None else pa.array(completions, ids),
        "input_ids": pa.array([p + c for p, c in zip(prompts, completions)], ids),
        "completion_mask": pa.array(_completion_masks(sub, prompts, completions), pa.list_(pa.int8())),
        "prompt_ids": pa.array(prompts, ids),
        "completion_ids": pa.array(completions, ids),
        "batch": sub["batch"], "task": sub["task"], "run": sub["run"],
        "step": sub["step"] if "step" in sub.column_names else pa.array([0] * sub.num_rows, pa.int64()),
        "reward": pc.cast(sub["reward"], pa.float64()),
    }
    if "score" in sub.column_names:
        columns["score"] = pc.cast(sub["score"], pa.float64())
    return pa.table(columns).cast(schema)


def _values(t: pa.Table, name: str) -> pa.Array:
    return pc.cast(t[name], pa.float64()) if name in t.column_names else pa.nulls(t.num_rows, pa.float64())


def dpo_table(table: pa.Table, pairs: list[tuple[int, int]], by: str, decode=None) -> pa.Table:
    """TRL DPOTrainer columns: prompt, chosen, rejected (text with `decode`, else the token ids),
    prompt_ids, chosen_ids, rejected_ids (TRL's tokenized form, which its
    DataCollatorForPreference takes), with the margin (in `by`) and both rows' ids, rewards and
    scores. No pairs: an empty table with the same schema (dpo_schema)."""
    schema = dpo_schema(table, decode is not None)
    if not pairs:
        return schema.empty_table()
    chosen = table.take(pa.array([c for c, _ in pairs], pa.int64()))
    rejected = table.take(pa.array([r for _, r in pairs], pa.int64()))
    prompts, chosen_ids = _responses(chosen)
    _, rejected_ids = _responses(rejected)
    cv = np.asarray(_values(chosen, by).to_numpy(zero_copy_only=False), dtype=np.float64)
    rv = np.asarray(_values(rejected, by).to_numpy(zero_copy_only=False), dtype=np.float64)
    ids = _IDS
    text = decode is not None
    columns: dict[str, Any] = {
        "prompt": [decode(p) for p in prompts] if text else pa.array(prompts, ids),
        "chosen": [decode(c) for c in chosen_ids] if text else pa.array(chosen_ids, ids),
        "rejected": [decode(r) for r in rejected_ids] if text else pa.array(rejected_ids, ids),
        "prompt_ids": pa.array(prompts, ids), "chosen_ids": pa.array(chosen_ids, ids),
        "rejected_ids": pa.array(rejected_ids, ids),
        "batch": chosen["batch"], "task": chosen["task"],
        "chosen_run": chosen["run"], "rejected_run": rejected["run"],
        "chosen_step": chosen["step"] if "step" in chosen.column_names else pa.array([0] * len(pairs), pa.int64()),
        "rejected_step": rejected["step"] if "step" in rejected.column_names else pa.array([0] * len(pairs), pa.int64()),
        "chosen_reward": _values(chosen, "reward"), "rejected_reward": _values(rejected, "reward"),
        "chosen_score": _values(chosen, "score"), "rejected_score": _values(rejected, "score"),
        "margin": pa.array(cv - rv),
    }
    return pa.table(columns).cast(schema)
