"""Repetition in a response's tokens: the `ngram_repetition_filter` (row-level).

    ratio = (n-grams - distinct n-grams) / n-grams   over the response's token n-grams
          (the share of n-gram occurrences that repeat an earlier one); 0 for a response
          shorter than n tokens
    the filter drops a row whose ratio > max_ratio

The ratio is computed where the row is read (the need NgramRepeat(N): the tokens never cross
the shuffle) by `ngram_repeat_ratio`, numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores
from rescore.transforms.strategies.features import Feature, FeatureRows
from rescore.transforms.strategies.hashing import mix64
from rescore.transforms.strategies.registry import FILTER, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats

if TYPE_CHECKING:
    from torch import Tensor


def ngram_repeat_ratio(tokens: np.ndarray, offsets: np.ndarray, n: int) -> np.ndarray:
    """(rows,) float64 the repeat ratio of each row's tokens[offsets[i]:offsets[i + 1]]."""
    rows = len(offsets) - 1
    lengths = np.diff(offsets)
    counts = np.maximum(lengths - n + 1, 0)
    out = np.zeros(rows, dtype=np.float64)
    if counts.sum() == 0:
        return out
    row_of = np.repeat(np.arange(rows), counts)
    # start of each n-gram: offsets[row] + its index within the row
    first = np.repeat(offsets[:-1], counts)
    within = np.arange(len(row_of)) - np.repeat(np.cumsum(counts) - counts, counts)
    starts = first + within
    tok = np.asarray(tokens, dtype=np.int64).view(np.uint64)
    h = np.zeros(len(starts), dtype=np.uint64)
    for k in range(n):
        h = mix64(h ^ tok[starts + k])
    pairs = np.unique(np.stack([row_of.astype(np.uint64), h], axis=1), axis=0)
    distinct = np.bincount(pairs[:, 0].astype(np.int64), minlength=rows)
    has = counts > 0
    out[has] = (counts[has] - distinct[has]) / counts[has]
    return out


@dataclass(frozen=True)
class NgramRepeat(Feature):
    """Need: light column x.ngram_repeat_N, the repeat ratio of each row's response tokens
    (the last response-length tokens of `tokens`)."""

    n: int

    @property
    def column(self) -> str:
        return f"ngram_repeat_{self.n}"

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray]:
        tokens = rows.tokens("tokens")
        values = np.asarray(tokens.values, dtype=np.int64)
        token_offsets = np.asarray(tokens.offsets, dtype=np.int64)
        ends = token_offsets[1:]
        starts = ends - np.minimum(np.asarray(rows.response_lengths(), dtype=np.int64), np.diff(token_offsets))
        lengths = ends - starts
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return {self.column: ngram_repeat_ratio(values[index], offsets, self.n)}


@dataclass(frozen=True)
class NgramRepetitionFilterParams(StrategyParams):
    rep_len: int = param(10, minimum=1, help="n, the length of the token n-grams counted")
    max_ratio: float = param(0.5, between=(0.0, 1.0), help="drop a row whose share of repeated n-grams is > max_ratio")


@register("ngram_repetition_filter", kind=FILTER, summary="row-level: drop responses whose share of repeated token n-grams (rep_len) > max_ratio; needs tokens")
class NgramRepetitionFilter(NgramRepetitionFilterParams):
    batch_level = False

    @property
    def column(self) -> str:
        return NgramRepeat(self.rep_len).column

    @property
    def needs(self) -> tuple:
        return ("tokens", NgramRepeat(self.rep_len))

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        ratio = rows.columns[self.column]
        return Scores(None, ratio <= self.max_ratio, *group_stats(rows.reward, rows.offsets))

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        ratio = rows.columns[self.column].detach().cpu().numpy()
        return [f"{self.name}: {self.rep_len}-gram repeat ratio {ratio[i]:.4g} > {self.max_ratio:g}" for i in dropped]
