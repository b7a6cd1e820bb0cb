"""The response-length rule, in one place: a row's response is its action tokens, counted from
`action_mask`, else `logprobs`, else `tokens` minus `prompt_length` (the input contract,
docs/input.md; validation checks that every present list agrees). The token columns
(`rows/tokens.py`), what strategies read of the written rows (`rows/strategy_columns.py`) and
`rescore report`'s length chart all count it here. Arrow and numpy only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from rescore.schemas.lists import flat_list

LIST_SOURCES = ("action_mask", "logprobs")
"""Lists with one value per response token, in the order the rule prefers them."""
TOKEN_SOURCE = ("tokens", "prompt_length")
"""Without those lists: the response is tokens[prompt_length:]."""


def response_length_columns(names) -> list[str]:
    """The columns the rule reads for a table with columns `names` ([] when it has none)."""
    for name in LIST_SOURCES:
        if name in names:
            return [name]
    return list(TOKEN_SOURCE) if all(n in names for n in TOKEN_SOURCE) else []


def response_lengths(table: pa.Table) -> tuple[np.ndarray, Any]:
    """(response lengths (n,) int64, the flat action_mask values or None) of `table`'s rows; a
    null list counts as empty, a null prompt_length as 0; all 0 for a table without any of the
    columns (see response_length_columns)."""
    columns = response_length_columns(table.column_names)
    if columns == ["action_mask"]:
        fl = flat_list(table["action_mask"])
        return fl.lengths, fl.values.to_numpy(zero_copy_only=False)
    if columns == ["logprobs"]:
        return flat_list(table["logprobs"]).lengths, None
    if columns:
        prompt = table["prompt_length"]
        if prompt.null_count:
            prompt = prompt.fill_null(0)
        return flat_list(table["tokens"]).lengths - prompt.to_numpy(zero_copy_only=False).astype(np.int64), None
    return np.zeros(table.num_rows, dtype=np.int64), None
