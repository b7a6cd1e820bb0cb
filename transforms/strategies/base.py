"""What every strategy sees and returns, and the optional capabilities it may declare.
Pure torch/numpy; no Beam, no Arrow here.

A strategy scores many task groups at once. Its input rows are sorted by
(batch, task, run, step), so each group is a contiguous segment described by `offsets`.

Strategies come in three kinds, applied in this order when a run composes them
(see transforms/strategies/chain.py): a `filter` drops whole groups, an `advantage` strategy
scores the rows that are left (and may drop groups itself, e.g. `std_threshold`), a
`duplicate` strategy drops uninformative groups and marks the rest for copying.

Every strategy is a `Strategy`. Beyond that, a strategy may have these capabilities, each a
runtime-checkable protocol that the chain and the row layer test with `isinstance`:

    BatchStatistics needs statistics over the whole batch first (batch std, whitening); its
                    `batch_level` says whether its parameters ask for them
    TokenLevel      computes per-token advantages itself, from the written rows' token columns
                    (on_policy_distill, jsd, reinforceplusplus)
    AddsColumns     writes extra output columns (mix_chord: mu, loss_weight, sft_token_weights)
    MasksRows       a filter whose flagged rows keep their place in the group statistics but
                    train on nothing: advantages 0 and an all-zero action_mask
                    (mask_response_truncated)
    ExplainsScores  explains its scores in the audit columns (baseline, group and batch std)
    ExplainsDrops   says why it dropped a row (--keep-filtered's filter_reason)
    CorrectsTokens  rewrites action_mask and adds is_weights where rows are written (rollout_correction)
    ClipsTokens     an advantage stage that removes tokens from the written action_mask (clipb)
    Shapes          a `shape` stage: returns new per-row rewards before any other stage
                    (reward_shaping, dapo_overlong_penalty; chain.py)
    DropsGroups     names the metrics.json counter of the whole groups it drops, besides
                    filtered_groups (grpo's std_threshold: std_threshold_skipped)

The row layer (transforms/rows/strategy_columns.py) reads the Arrow columns these need into
numpy (`WrittenRows`) and turns what they return back into Arrow.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rescore.transforms.strategies.registry import ADVANTAGE, DUPLICATE, FILTER, KINDS, SHAPE  # noqa: F401  (re-exported)
from rescore.transforms.strategies.flat import TokenColumn  # noqa: F401  (re-exported: defined numpy-only, for the read path)
from rescore.transforms.strategies.segments import segment_sum
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class GroupedRows:
    """The light columns of n rows in G task groups, sorted by (batch, task, run, step).

    Shapes: every per-row tensor is (n,); `offsets` is (G + 1,) int64 with group g in rows
    offsets[g]:offsets[g + 1]. Rewards are float64 so that group statistics do not depend on
    summation order at float32 precision.
    """

    reward: Tensor
    """(n,) float64 scalar reward."""
    offsets: Tensor
    """(G + 1,) int64 group boundaries."""
    batch: Tensor
    """(n,) int64 batch id of the row."""
    run: Tensor
    """(n,) int64 run id."""
    step: Tensor
    """(n,) int64 step id (0 for single-step data)."""
    action_tokens: Tensor
    """(n,) int64 number of action tokens (sum of action_mask)."""
    mean_logprob: Tensor | None = None
    """(n,) float64 mean of logprobs over action tokens (-inf without action tokens); only
    present when the strategy asked for logprobs."""
    expert: Tensor | None = None
    """(n,) bool, the `expert` column; only present when the strategy asked for it."""
    response_length: Tensor | None = None
    """(n,) int64 response tokens (action or not); None where the caller did not provide it."""
    last_action: Tensor | None = None
    """(n,) bool: the last response token is an action token (the outcome reward's token)."""
    task_key: Tensor | None = None
    """(n,) int64 fixed hash of the row's task id (seeds per-group randomness)."""
    columns: Mapping[str, Tensor] = field(default_factory=dict)
    """Scalar input columns the strategy needs, by name: (n,) float64 values, or int64 hashes
    for string columns."""
    token_columns: Mapping[str, TokenColumn] = field(default_factory=dict)
    """Per-row token features that crossed the shuffle, by name (a Feature in a strategy's needs
    whose light column is a list, e.g. optimal_token_baseline's path variance), as numpy."""

    @property
    def num_rows(self) -> int:
        return int(self.reward.shape[0])

    @property
    def num_groups(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def sizes(self) -> Tensor:
        """(G,) int64 rows per group."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def group_batch(self) -> Tensor:
        """(G,) int64 batch id of each group."""
        return self.batch[self.offsets[:-1]]

    def select(self, keep: Tensor) -> GroupedRows:
        """The rows where `keep` (n,) is set, still sorted; groups left empty disappear."""
        if bool(keep.all()):
            return self
        counts = segment_sum(keep, self.offsets)
        counts = counts[counts > 0]
        offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=keep.device)
        torch.cumsum(counts, 0, out=offsets[1:])

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[keep]

        return replace(
            self,
            reward=self.reward[keep],
            offsets=offsets,
            batch=self.batch[keep],
            run=self.run[keep],
            step=self.step[keep],
            action_tokens=self.action_tokens[keep],
            mean_logprob=pick(self.mean_logprob),
            expert=pick(self.expert),
            response_length=pick(self.response_length),
            last_action=pick(self.last_action),
            task_key=pick(self.task_key),
            columns={k: v[keep] for k, v in self.columns.items()},
            token_columns={k: v.select(keep.cpu().numpy()) for k, v in self.token_columns.items()},
        )


@dataclass(frozen=True)
class Scores:
    """A strategy's answer for GroupedRows.

    `score` is the scalar advantage of each row (None where the strategy computes none, e.g. a
    filter); the token-level advantages are `score * token_scale * action_mask`.
    """

    score: Tensor | None
    """(n,) float64 scalar advantage, or None."""
    keep: Tensor
    """(n,) bool: False where the row is filtered out (dropped, not rejected)."""
    group_mean: Tensor
    """(G,) float64 reward mean of the group as the strategy used it (metrics)."""
    group_std: Tensor
    """(G,) float64 reward std of the group as the strategy used it (metrics)."""
    token_scale: Tensor | None = None
    """(n,) float64 per-row factor applied to every token, or None for 1."""
    row_tokens: TokenColumn | None = None
    """Per-row token values that go back to each row's writer with its score (a TokenLevel
    strategy's `token_values` receives them: optimal_token_baseline's per-position baseline),
    or None."""


@runtime_checkable
class Strategy(Protocol):
    """A scoring strategy with its parameters bound (a subclass of its parameters' declaration)."""

    name: str
    kind: str
    """FILTER, ADVANTAGE or DUPLICATE."""

    @property
    def params(self) -> Mapping[str, Any]:
        """The resolved parameters, as metrics.json and the config hash record them."""

    @property
    def needs(self) -> tuple[str, ...]:
        """Optional input columns this strategy cannot work without (e.g. ('logprobs',))."""

    @property
    def batch_level(self) -> bool:
        """True when scores need statistics over the whole batch (across task groups) first:
        the strategy is then a BatchStatistics too."""

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        """Score every row. `batch_stats` is (n, k) float64, the batch_stats of each row's
        batch, when batch_level is set, else None."""


# --- what the written rows offer, as numpy (the row layer reads it from Arrow) ----------------


class WrittenRows(Protocol):
    """The input columns of the n rows being written (after any copies), as numpy."""

    names: Collection[str]
    """The input's column names."""
    num_rows: int

    def scalar(self, name: str) -> np.ndarray:
        """(n,) a scalar column (batch int64, reward float64, expert bool, ...)."""

    def tokens(self, name: str) -> TokenColumn:
        """A list column (logprobs, teacher_logprobs, action_mask), flat."""

    def response(self) -> tuple[np.ndarray, np.ndarray]:
        """(response lengths (n,) int64, flat 0/1 action mask (T,) float64) as the contract
        defines them: from action_mask, else logprobs, else tokens - prompt_length; the mask is
        all ones without an action_mask column."""


@dataclass(frozen=True)
class OutputColumn:
    """An extra output column a strategy writes: float32 per row, or list<float32> per token."""

    name: str
    per_token: bool = False


# --- optional capabilities ---------------------------------------------------------------------


@runtime_checkable
class BatchStatistics(Protocol):
    """Scores from statistics over the whole batch (batch std, whitening); used when the
    strategy's `batch_level` is set for its parameters."""

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        """(batch ids (k,), values (k,), weights (k,)) that the per-batch statistics are
        computed from."""

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """The statistics of one batch from all its values and weights, sorted by
        (value, weight) so that the result never depends on arrival order. The arrays may be
        empty (a filter stage dropped every group of the batch): return finite placeholders
        then; no row of such a batch is scored."""


@runtime_checkable
class TokenLevel(Protocol):
    """Computes its token advantages itself when a row is written; `score()` leaves what the
    token step needs (e.g. 1 / sigma as the score and mu as the token scale)."""

    def token_values(self, rows: WrittenRows, score: np.ndarray, row_value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat token advantages (T,) over the response tokens, already masked; per-row
        score (n,)). `score` and `row_value` (n,) are what score() left (score, score *
        token_scale). A strategy whose score() returns `Scores.row_tokens` also takes them
        as `row_tokens=` (a TokenColumn over these rows)."""


@runtime_checkable
class AddsColumns(Protocol):
    """Writes extra output columns beside the scores."""

    def output_columns(self, input_names: Collection[str]) -> list[OutputColumn]:
        """The columns it adds for an input with these column names."""

    def output_values(self, rows: WrittenRows, columns: list[OutputColumn]) -> list[np.ndarray | TokenColumn]:
        """Their values for the written rows: (n,) per row, a TokenColumn per token."""


@runtime_checkable
class MasksRows(Protocol):
    """A filter that flags rows which keep their place (and their weight in the group
    statistics) but train on nothing: advantages 0 and, where the input has one, an
    all-zero action_mask (as Trinity zeroes it before the advantage step)."""

    mask_column: str
    """The input column that flags a row."""
    mask_status: str
    """The string value that flags a row; a numeric or bool column flags it with non-zero."""

    @property
    def masks(self) -> bool:
        """False when the flagged rows are dropped instead (they never reach the writer)."""

    def masked(self, rows: GroupedRows) -> Tensor | None:
        """(n,) bool the rows whose advantages are zeroed, or None."""


@runtime_checkable
class CorrectsTokens(Protocol):
    """Rewrites the written rows' action mask and adds per-token importance weights (the
    off-policy correction, rollout_correction): rejected tokens are zeroed in `action_mask`
    (the input's kept as `action_mask_original`), so their advantages are 0."""

    def correction_columns(self, input_names: Collection[str]) -> list[OutputColumn]:
        """The per-token columns it adds (is_weights)."""

    def token_correction(self, rows: WrittenRows, advantage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat weights (T,), flat corrected 0/1 mask (T,)) over the response tokens; `advantage`
        (n,) is each row's scalar advantage."""


@runtime_checkable
class ClipsTokens(Protocol):
    """An advantage stage that removes tokens from the written rows' action mask (clipb): the
    removed tokens get advantage 0 and the input's mask is kept as `action_mask_original`."""

    def token_mask(self, rows: WrittenRows, score: np.ndarray, row_tokens: TokenColumn | None) -> np.ndarray:
        """(T,) the flat 0/1 mask to write over the response tokens; `score` (n,) and
        `row_tokens` are what score() left for these rows."""


@runtime_checkable
class ExplainsScores(Protocol):
    """Explains its scores in the audit columns (--audit-columns; ScoreExplanation gives the
    defaults): what it subtracted from each reward, and the group and batch std it used."""

    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        """(n,) float64 what it subtracted from each row's reward, NaN where nothing applies;
        `group_mean` (n,) is the group mean it reported, per row."""

    def audit_group_std(self, rows: GroupedRows, group_std: np.ndarray) -> np.ndarray:
        """(n,) float64 the group std to report; `group_std` (n,) is the one it returned."""

    def audit_batch_std(self, batch_stats: Tensor) -> np.ndarray | None:
        """(n,) float64 the batch std it divided by (batch_level only), or None."""


def audit_rows(rows: GroupedRows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(reward (n,) float64, offsets (G + 1,) int64, group of each row (n,), its group's size
    (n,)) as numpy, for the audit explanations."""
    reward = rows.reward.detach().cpu().numpy().astype(np.float64)
    offsets = rows.offsets.detach().cpu().numpy().astype(np.int64)
    g = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    return reward, offsets, g, np.diff(offsets)[g]


class ScoreExplanation:
    """ExplainsScores defaults: the group mean as the baseline, the returned group std, no
    batch std. A strategy overrides what differs."""

    audit_rows = staticmethod(audit_rows)

    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        return group_mean.copy()

    def audit_group_std(self, rows: GroupedRows, group_std: np.ndarray) -> np.ndarray:
        return group_std

    def audit_batch_std(self, batch_stats: Tensor) -> np.ndarray | None:
        return None


@runtime_checkable
class ExplainsDrops(Protocol):
    """Says why it dropped each row it dropped (--keep-filtered's filter_reason column)."""

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        """One reason per row index in `dropped`, e.g. "reward_variance: var 0 <= 0".
        `reached` (n,) bool: the rows this stage saw; `group_std` (G,) float64: the std the
        advantage stage used."""


def group_reasons(g: np.ndarray, dropped: np.ndarray, reason) -> list[str]:
    """`reason(group)` for each dropped row, computed once per group."""
    text = {int(i): reason(int(i)) for i in np.unique(g[dropped])}
    return [text[i] for i in g[dropped]]


@runtime_checkable
class DropsGroups(Protocol):
    """Names the metrics.json counter of the whole groups it drops, besides filtered_groups."""

    @property
    def dropped_groups_metric(self) -> str | None:
        """The counter's name, or None when this configuration drops no group of its own."""


@runtime_checkable
class Shapes(Protocol):
    """A reward-shaping stage (kind SHAPE): new rewards for the rows, which every later stage
    and statistic sees instead of the input's (written as `reward`, the input's as
    `reward_original`)."""

    def shape(self, rows: GroupedRows) -> Tensor:
        """(n,) float64 the shaped reward of each row; `rows.reward` is what the shaping stages
        before this one left."""
