"""Test inputs: irregular random experience as row dicts, and writers for Parquet layouts."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_INT_TASK = pa.schema(
    [
        ("batch", pa.int64()),
        ("task", pa.int64()),
        ("run", pa.int64()),
        ("step", pa.int64()),
        ("reward", pa.float64()),
        ("tokens", pa.list_(pa.int64())),
        ("prompt_length", pa.int64()),
        ("logprobs", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.bool_())),
        ("note", pa.string()),
    ]
)


def random_rows(seed: int, *, batches: int = 3, max_tasks: int = 9, max_runs: int = 7, string_tasks: bool = False) -> list[dict]:
    """Groups of 1..max_runs rows, some with equal rewards, some with tied mean logprobs."""
    rng = random.Random(seed)
    rows = []
    for batch in range(batches):
        for t in range(rng.randint(1, max_tasks)):
            task = f"q{seed}-{t}" if string_tasks else t * 7 + 3
            n = rng.choice([1, 2, 3, 4, 5, 6, max_runs])
            kind = rng.random()
            for run in rng.sample(range(50), n):
                if kind < 0.2:
                    reward = 0.5  # zero-std group
                else:
                    reward = rng.choice([0.0, 1.0, rng.uniform(-2, 3)])
                length = rng.randint(0, 9)
                prompt = rng.randint(0, 5)
                tie = kind > 0.8  # equal logprobs: rank ties resolved by (run, step)
                logprobs = [-0.5 if tie else -rng.random() * 3 for _ in range(length)]
                mask = [rng.random() > 0.2 for _ in range(length)]
                rows.append(
                    {
                        "batch": batch,
                        "task": task,
                        "run": run,
                        "step": 0,
                        "reward": reward,
                        "tokens": [rng.randint(0, 1000) for _ in range(prompt + length)],
                        "prompt_length": prompt,
                        "logprobs": logprobs,
                        "action_mask": mask,
                        "note": f"row-{batch}-{t}-{run}",
                    }
                )
    rng.shuffle(rows)
    return rows


def write_parquet(rows: list[dict], directory: str, *, files: int = 3, row_group_size: int = 7, schema: pa.Schema | None = None) -> str:
    """Spread rows over `files` files with small row groups; returns a glob for them."""
    os.makedirs(directory, exist_ok=True)
    if schema is None:
        schema = SCHEMA_INT_TASK
        if rows and isinstance(rows[0]["task"], str):
            schema = schema.set(schema.get_field_index("task"), pa.field("task", pa.string()))
    per_file = -(-len(rows) // files)
    for i in range(files):
        chunk = rows[i * per_file : (i + 1) * per_file]
        table = pa.Table.from_pylist(chunk, schema=schema)
        pq.write_table(table, os.path.join(directory, f"part-{i}.parquet"), row_group_size=row_group_size)
    return os.path.join(directory, "*.parquet")


def read_output(directory: str, kind: str = "scored") -> pa.Table:
    paths = sorted(p for p in os.listdir(directory) if p.startswith(kind + "-") and p.endswith(".parquet"))
    tables = [pq.read_table(os.path.join(directory, p)) for p in paths]
    return pa.concat_tables(tables) if tables else None


def by_id(table: pa.Table) -> dict:
    return {(r["batch"], r["task"], r["run"], r.get("step", 0)): r for r in table.to_pylist()} if table is not None else {}


SCHEMA_MULTI_STEP = pa.schema(
    [
        ("batch", pa.int64()),
        ("task", pa.int64()),
        ("run", pa.int64()),
        ("step", pa.int64()),
        ("reward", pa.float64()),
        ("logprobs", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.int8())),
        ("expert", pa.bool_()),
    ]
)


def multi_step_rows(seed: int, *, batches: int = 3, max_tasks: int = 8, max_runs: int = 6) -> list[dict]:
    """Multi-step runs of 1-5 steps (steps not numbered 0..k-1: gaps), random action masks,
    ties, flat groups and single-run groups; about a tenth of the rows are expert rows."""
    rng = random.Random(seed)
    rows = []
    for batch in range(batches):
        for t in range(rng.randint(1, max_tasks)):
            kind = rng.random()
            for run in rng.sample(range(40), rng.choice([1, 2, 3, 4, max_runs])):
                steps = sorted(rng.sample(range(10), rng.randint(1, 5)))
                for step in steps:
                    length = rng.randint(0, 8)
                    reward = 1.0 if kind < 0.2 else rng.choice([0.0, 1.0, round(rng.uniform(-1, 2), 3)])
                    rows.append(
                        {
                            "batch": batch + 2,
                            "task": t * 5 + 1,
                            "run": run,
                            "step": step,
                            "reward": reward,
                            "logprobs": [-rng.random() * 4 for _ in range(length)],
                            "action_mask": [int(rng.random() > 0.3) for _ in range(length)],
                            "expert": rng.random() < 0.1,
                        }
                    )
    rng.shuffle(rows)
    return rows
