"""The light-row features a strategy names in `needs` and the light columns they become, declared
once: the strategies build their needs from these, the row layer (transforms/rows/keys.py)
computes the columns where a row is read. No torch, no numpy: option parsing imports it too.

A need is a column name, or one of these prefixes followed by its parameters; the light
column `x.NAME` (rows/keys.py EXTRA_PREFIX) carries a feature's value across the shuffle."""

from __future__ import annotations

OPTIONAL_FEATURE = "@optional:"
"""Need `@optional:NAME`: the number column NAME where a file has it (x.NAME; NaN where the file
has no such column or the row has a null: a missing value, never 0)."""
NULLABLE_FEATURE = "@nullable:"
"""Need `@nullable:NAME`: the number column NAME, which every file must have (the schema check);
a null crosses as NaN (a value that abstains, e.g. normalize_then_sum's reward columns)."""
NGRAM_FEATURE = "@ngram_repeat:"
"""Need `@ngram_repeat:N`: light column x.ngram_repeat_N, the share of the response's token
N-grams that repeat an earlier one (transforms/strategies/repetition.py)."""
OFFPOLICY_FEATURE = "@offpolicy:"
"""Need `@offpolicy:NAME:PARAMS-JSON`: light columns x.offpolicy_kept (tokens the rejection
masks leave) and x.offpolicy_reason (REASONS index of the first mask that emptied the row,
transforms/strategies/offpolicy.py)."""
DISCOUNT_FEATURE = "@discount:"
"""Need `@discount:GAMMA:MODE` (REINFORCE++ with Trinity's discounting, gamma != 1): light
columns DISCOUNT_COLUMNS, the sums over action tokens of c_t and c_t^2
(transforms/strategies/reinforce_pp.py)."""
DISCOUNT_COLUMNS = ("discount_a", "discount_b")
"""The light columns of a DISCOUNT_FEATURE need: sum of c_t, sum of c_t^2 over a row's action tokens."""
TOKEN_BASELINE_FEATURE = "@token_baseline:"
"""Need `@token_baseline:JSON` (needs_after of transforms/strategies/token_baseline.py): light
columns x.otb_path_variance (list<float64>, a token feature that crosses the shuffle), x.otb_last
and x.otb_bad."""
CLIPB_FEATURE = "@clipb:"
"""Need `@clipb:JSON` (ClipB.needs_after): light columns x.clipb_s, x.clipb_s2 (sums over action
tokens of p (H + log p) and its square) and x.clipb_bad (transforms/strategies/token_baseline.py)."""
KL_FEATURE = "@kl_sum:"
"""Need `@kl_sum:JSON` ({"stage": [NAME, PARAMS], "correction": null}): light column x.kl_sum,
each row's sum over action tokens of the KL estimate between logprobs and ref_logprobs
(transforms/strategies/shaping.py)."""

TASK_HISTORY_FEATURE = "@task_history:"
"""Need `@task_history:PATH` (pass_rate_band with task_stats): light column x.task_history_pass_rate,
the pass rate of the row's task in the `rescore task-stats` output at PATH, matched by the task's
exact value (NaN: the task is not in the table; rows/task_stats.py history_rates)."""
TASK_HISTORY_COLUMN = "task_history_pass_rate"


def ngram_column(n: int) -> str:
    """The light column of need `@ngram_repeat:N`."""
    return f"ngram_repeat_{n}"


def discount_need(gamma: float, mode: str) -> str:
    """The need `@discount:GAMMA:MODE` (gamma as repr, so the float crosses exactly)."""
    return f"{DISCOUNT_FEATURE}{gamma!r}:{mode}"


def discount_params(need: str) -> tuple[float, str]:
    """(gamma, mode) of a need made by discount_need."""
    gamma, mode = need[len(DISCOUNT_FEATURE) :].split(":")
    return float(gamma), mode
