"""Training batches from a scored output: `ScoredBatches`, a torch `IterableDataset`.

    from rescore.torch import ScoredBatches
    for batch in ScoredBatches("out/sample", batch_size=8):
        batch["input_ids"], batch["attention_mask"], batch["response_mask"], batch["advantages"]

It reads any Rescore output with `rescore.load_scored` (a one-shot directory under `_SUCCESS`, or
an `--incremental` Delta table) and yields padded tensors, one dict per batch, named as the
trainers name them (docs/training.md):

layout="verl" (default), the tensors of verl's `DataProto.batch`:
    prompts         [B, P] int64   prompt tokens, LEFT-padded with `pad_token_id`
    responses       [B, R] int64   response tokens, right-padded
    input_ids       [B, P+R]       prompts then responses
    attention_mask  [B, P+R] int64 1 on every real token, 0 on padding
    position_ids    [B, P+R] int64 cumsum(attention_mask) - 1, clipped at 0 (verl's)
    response_mask   [B, R] int64   the row's action_mask (1 where the model generated the token;
                                   all ones without one), 0 on padding
    advantages      [B, R] float32 Rescore's token advantages, 0 on padding
    returns         [B, R] float32
    old_log_probs   [B, R] float32 the logged behaviour log-probs (see `old_log_probs` below)
    score           [B]    float32 the row's scalar score

layout="trl", the keys TRL 1.16's GRPO-family trainers build in `_generate_and_score_completions`
and read in `_compute_loss`, with TRL's own meaning:
    prompt_ids, prompt_mask            [B, P] left-padded
    completion_ids                     [B, R] right-padded
    completion_mask                    [B, R] int64: 1 on EVERY real completion token (tool and
                                       observation tokens included: TRL concatenates it with
                                       prompt_mask as the forward pass's attention mask), 0 on padding
    tool_mask                          [B, R] int64: the row's action_mask (1 where the model
                                       generated the token, 0 on tool/environment tokens; all ones
                                       without one), padded with 1 as TRL pads it; TRL's loss mask
                                       is completion_mask * tool_mask
    advantages                         [B, R] float32: Rescore's token advantages, 0 on padding
                                       (TRL takes [B] or [B, T]; a token-level estimator's values
                                       stay per token)
    num_items_in_batch                 [] int64: the loss tokens of this batch,
                                       (completion_mask * tool_mask).sum(), which TRL's dapo/cispo/
                                       vespo losses divide by (TRL sums it over processes: with
                                       several ranks, all-reduce it the same way)
    old_per_token_logps                [B, R] float32 (see `old_log_probs` below)

old_log_probs (verl's `old_log_probs`, TRL's `old_per_token_logps`): None (default) gives them in
EVERY batch where the output has a `logprobs` column, and in none where it has not; a column with
some rows null is refused when the loader is made (ValueError, one line), since a key present in
some batches and missing from others breaks a trainer mid-epoch. True requires them, False leaves
them out. Non-finite advantages, returns or log-probs are refused the same way (ValueError).

Every batch also carries `batch`, `task`, `run`, `step` (and `copy_index` where there is one)
as lists, so a row can be traced back to its experience. Rows come in the order load_scored
returns them; shuffle=True permutes them with a generator seeded by (seed, epoch)
(`set_epoch`), the same permutation on every machine. Under a DataLoader with workers, worker
k of n yields batches k, k+n, ... of the same sequence, so every row comes once.

This module imports torch; rescore.load_scored does not.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["ScoredBatches", "LAYOUTS"]

LAYOUTS = ("verl", "trl")
_IDS = ("batch", "task", "run", "step", "copy_index")


class ScoredBatches(IterableDataset):
    """Padded training batches of a scored output (see the module docstring for the tensors)."""

    def __init__(
        self,
        source: str | pa.Table,
        batch_size: int = 8,
        *,
        layout: str = "verl",
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        pad_token_id: int = 0,
        prompt_length: int | None = None,
        response_length: int | None = None,
        storage_options: dict | None = None,
        old_log_probs: bool | None = None,
    ):
        """source: an output path (read with rescore.load_scored) or its table. prompt_length /
        response_length: pad every batch to these widths (verl's fixed data.max_prompt_length /
        max_response_length); a longer row is an error. Default: the longest in each batch."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if isinstance(source, pa.Table):
            table = source
        else:
            from rescore import load_scored

            table = load_scored(source, storage_options=storage_options)
        missing = [c for c in ("tokens", "prompt_length", "advantages") if c not in table.column_names]
        if missing:
            raise ValueError(
                f"the scored rows have no {', '.join(missing)} column: training batches need the token ids "
                f"(tokens, prompt_length) of the experience (columns: {', '.join(table.column_names)})"
            )
        for column in ("tokens", "prompt_length"):
            if table[column].null_count:
                raise ValueError(f"{table[column].null_count} scored rows have no {column}: training batches need every row's tokens")
        if old_log_probs is None:
            old_log_probs = "logprobs" in table.column_names
            if old_log_probs and table["logprobs"].null_count:
                raise ValueError(
                    f"{table['logprobs'].null_count} of {table.num_rows} scored rows have no logprobs, so old log-probs "
                    "cannot be in every batch: pass old_log_probs=False to leave them out"
                )
        elif old_log_probs and ("logprobs" not in table.column_names or table["logprobs"].null_count):
            missing = table.num_rows if "logprobs" not in table.column_names else table["logprobs"].null_count
            raise ValueError(f"old_log_probs=True, but {missing} of {table.num_rows} scored rows have no logprobs")
        self.old_log_probs = bool(old_log_probs)
        self._table = table
        self.batch_size = batch_size
        self.layout = layout
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.pad_token_id = pad_token_id
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.epoch = 0

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    def __len__(self) -> int:
        """Batches in one pass (all workers together)."""
        n = self._table.num_rows
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently each epoch (seeded by (seed, epoch)), as DistributedSampler does."""
        self.epoch = epoch

    def order(self) -> np.ndarray:
        """The row indices of one pass, in the order they are batched."""
        n = self._table.num_rows
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        order = self.order()
        starts = range(0, len(order), self.batch_size)
        info = get_worker_info()
        k, n = (0, 1) if info is None else (info.id, info.num_workers)
        for i, start in enumerate(starts):
            if i % n != k:
                continue
            rows = order[start:start + self.batch_size]
            if self.drop_last and len(rows) < self.batch_size:
                return
            yield self.collate(self._table.take(pa.array(rows, pa.int64())))

    def collate(self, rows: pa.Table) -> dict[str, Any]:
        """One padded batch of these rows (in this order)."""
        tokens = _lists(rows["tokens"], np.int64)
        prompt_lengths = rows["prompt_length"].to_numpy(zero_copy_only=False).astype(np.int64)
        prompts = [t[:p] for t, p in zip(tokens, prompt_lengths)]
        responses = [t[p:] for t, p in zip(tokens, prompt_lengths)]
        if any(p < 0 or p > len(t) for t, p in zip(tokens, prompt_lengths)):
            raise ValueError("a scored row has a prompt_length outside its tokens")
        P = _width(prompts, self.prompt_length, "prompt")
        R = _width(responses, self.response_length, "response")
        B = rows.num_rows
        prompt_ids = np.full((B, P), self.pad_token_id, np.int64)
        prompt_mask = np.zeros((B, P), np.int64)
        response_ids = np.full((B, R), self.pad_token_id, np.int64)
        response_valid = np.zeros((B, R), np.int64)
        for b, (p, r) in enumerate(zip(prompts, responses)):
            if len(p):
                prompt_ids[b, P - len(p):] = p
                prompt_mask[b, P - len(p):] = 1
            response_ids[b, :len(r)] = r
            response_valid[b, :len(r)] = 1
        lengths = [len(r) for r in responses]
        if "action_mask" in rows.column_names and rows["action_mask"].null_count < B:
            action = _padded(rows["action_mask"], lengths, R, np.int64, fill=1, name="action_mask")
            if np.any((action != 0) & (action != 1)):
                raise ValueError("a scored row's action_mask holds a value other than 0 and 1")
        else:
            action = response_valid.copy()
        response_mask = action * response_valid
        advantages = _finite(_padded(rows["advantages"], lengths, R, np.float32, name="advantages"), "advantages")
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf: refused by _finite
            score = _finite(rows["score"].to_numpy(zero_copy_only=False).astype(np.float32), "score") if "score" in rows.column_names \
                else np.zeros(B, np.float32)
        logprobs = None
        if self.old_log_probs:
            logprobs = torch.from_numpy(_finite(_padded(rows["logprobs"], lengths, R, np.float32, name="logprobs"), "logprobs"))
        ids = {c: rows[c].to_pylist() for c in _IDS if c in rows.column_names}
        if self.layout == "trl":
            tool_mask = np.where(response_valid == 1, action, 1)  # TRL pads its tool_mask with 1
            out = {
                "prompt_ids": torch.from_numpy(prompt_ids),
                "prompt_mask": torch.from_numpy(prompt_mask),
                "completion_ids": torch.from_numpy(response_ids),
                "completion_mask": torch.from_numpy(response_valid),
                "tool_mask": torch.from_numpy(tool_mask),
                "advantages": torch.from_numpy(advantages),
                "num_items_in_batch": torch.tensor(int((response_valid * tool_mask).sum()), dtype=torch.int64),
            }
            if logprobs is not None:
                out["old_per_token_logps"] = logprobs
            return {**out, **ids}
        attention_mask = np.concatenate([prompt_mask, response_valid], axis=1)
        out = {
            "prompts": torch.from_numpy(prompt_ids),
            "responses": torch.from_numpy(response_ids),
            "input_ids": torch.from_numpy(np.concatenate([prompt_ids, response_ids], axis=1)),
            "attention_mask": torch.from_numpy(attention_mask),
            "position_ids": torch.from_numpy(np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)),
            "response_mask": torch.from_numpy(response_mask),
            "advantages": torch.from_numpy(advantages),
            "returns": torch.from_numpy(
                _finite(_padded(rows["returns"], lengths, R, np.float32, name="returns"), "returns")
                if "returns" in rows.column_names else advantages.copy()
            ),
            "score": torch.from_numpy(score),
        }
        if logprobs is not None:
            out["old_log_probs"] = logprobs
        return {**out, **ids}


def _lists(column: pa.ChunkedArray, dtype) -> list[np.ndarray]:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: inf, refused by _finite
        values = pc.list_flatten(array).to_numpy(zero_copy_only=False).astype(dtype)
    offsets = np.asarray(pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    bounds = np.concatenate([[0], np.cumsum(offsets)])
    return [values[bounds[i]:bounds[i + 1]] for i in range(len(offsets))]


def _padded(column: pa.ChunkedArray, lengths: list[int], width: int, dtype, fill=0, name: str = "list") -> np.ndarray:
    """[B, width] of the lists, each checked against its row's response length; a null list is
    `fill` over the response."""
    out = np.zeros((len(lengths), width), dtype)
    for b, (values, null) in enumerate(zip(_lists(column, dtype), column.is_null().to_pylist())):
        if null:
            out[b, :lengths[b]] = fill
            continue
        if len(values) != lengths[b]:
            raise ValueError(
                f"a scored row's {name} has {len(values)} values "
                f"for {lengths[b]} response tokens"
            )
        out[b, :len(values)] = values
    return out


def _finite(values: np.ndarray, name: str) -> np.ndarray:
    if not np.isfinite(values).all():
        raise ValueError(f"a scored row's {name} holds a value that is not a finite float32 (NaN, infinite or beyond ±3.4e38)")
    return values


def _width(lists: list[np.ndarray], fixed: int | None, what: str) -> int:
    longest = max((len(x) for x in lists), default=0)
    if fixed is None:
        return longest
    if longest > fixed:
        raise ValueError(f"a {what} has {longest} tokens, more than {what}_length={fixed}")
    return fixed
