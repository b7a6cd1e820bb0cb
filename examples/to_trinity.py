"""Scored rows back to Trinity-RFT `Experience` fields (trinity/common/experience.py).

To hand the scores to Trinity's trainer directly, let Rescore write a Trinity SQL buffer
instead: `--output-db URL --output-table NAME` (docs/trainers.md).

    import polars as pl
    from rescore.examples.to_trinity import experience_kwargs
    rows = pl.read_parquet("out/scored-*.parquet").to_dicts()
    exps = [Experience(**experience_kwargs(r)) for r in rows]     # with trinity installed

Rescore's columns are Trinity's names already; the id columns go into `eid`, lists become
tensors inside Experience(), and the columns Experience has no field for (Rescore's `score`,
`copy_index`, `source_task`, CHORD's `mu`/`loss_weight`, anything passed through) go into
`info`, where Trinity's custom fields can pick them up.
"""

from __future__ import annotations

EID_FIELDS = ("batch", "task", "run", "step")
EXPERIENCE_FIELDS = ("tokens", "prompt_length", "logprobs", "reward", "advantages", "returns", "action_mask")


def experience_kwargs(row: dict) -> dict:
    """Keyword arguments for trinity.common.experience.Experience from one scored row."""
    kwargs = {"eid": {k: row[k] for k in EID_FIELDS if row.get(k) is not None}}
    for name in EXPERIENCE_FIELDS:
        if row.get(name) is not None:
            kwargs[name] = row[name]
    if "action_mask" in kwargs:
        kwargs["action_mask"] = [bool(m) for m in kwargs["action_mask"]]
    kwargs["info"] = {k: v for k, v in row.items() if k not in (*EID_FIELDS, *EXPERIENCE_FIELDS)}
    return kwargs
