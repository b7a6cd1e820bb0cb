"""A tiny experience file for the Beam shell tests (tests/transforms/test_shell_*.py), and the
pipeline they run on: the in-process FnApiRunner, as the CLI uses locally."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.test_pipeline import TestPipeline

from data import SCHEMA_INT_TASK

# (batch, task, run, reward): batch 0 task 1 is informative, batch 0 task 2 has zero spread,
# batch 1 task 1 is informative, batch 1 task 3 has a null reward (rejected).
ROWS = [
    (0, 1, 0, 1.0), (0, 1, 1, 0.0), (0, 1, 2, 0.0), (0, 1, 3, 1.0),
    (0, 2, 0, 1.0), (0, 2, 1, 1.0),
    (1, 1, 0, 0.0), (1, 1, 1, 2.0),
    (1, 3, 0, None),
]
MASK = [True, True, False, True]
"""Every response: 4 tokens, 3 of them action tokens."""


def grpo(rewards: list[float], epsilon: float = 1e-6) -> list[float]:
    """The spec's GRPO score of each row of one group: (r - mean) / (unbiased std + epsilon)."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1)) if n > 1 else 1.0
    return [(r - mean) / (std + epsilon) if std > 0 else 0.0 for r in rewards]


def write_experience(directory, row_group_size: int = 4) -> str:
    """ROWS as one Parquet file in row groups of `row_group_size`; returns its path."""
    rows = [
        {
            "batch": b, "task": t, "run": r, "step": 0, "reward": reward, "tokens": [7, 1, 2, 3, 4],
            "prompt_length": 1, "logprobs": [-0.5] * 4, "action_mask": MASK, "note": f"{b}-{t}-{r}",
        }
        for b, t, r, reward in ROWS
    ]
    directory.mkdir(parents=True, exist_ok=True)
    path = str(directory / "experience.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA_INT_TASK), path, row_group_size=row_group_size)
    return path


def pipeline() -> TestPipeline:
    return TestPipeline(runner="FnApiRunner")


def gathered(fn):
    """A transform: the whole PCollection as one list, passed through `fn` (for equal_to)."""
    import apache_beam as beam

    return beam.combiners.ToList() | beam.Map(fn)


def light_table(unit: int, rows, *, first_row: int = 0) -> pa.Table:
    """Light rows (rows/keys.py: light_rows) of (batch, task, run, reward) rows, all valid."""
    from rescore.schemas import check_rows
    from rescore.transforms.rows.keys import light_rows

    table = pa.Table.from_pylist(
        [
            {"batch": b, "task": t, "run": r, "step": 0, "reward": reward, "tokens": [7, 1, 2, 3, 4],
             "prompt_length": 1, "logprobs": [-0.5] * 4, "action_mask": MASK, "note": ""}
            for b, t, r, reward in rows
        ],
        schema=SCHEMA_INT_TASK,
    )
    light = light_rows(unit, table, check_rows(table), task_type=pa.int64())
    return light.set_column(1, "row", pa.array([first_row + i for i in range(len(rows))], pa.int32()))


def response_length_reward(response_tokens) -> float:
    """A --reward-fn for the model stage's shell test: the response's length in tokens."""
    return float(len(response_tokens))
