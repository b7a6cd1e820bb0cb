"""Deterministic benchmark experience: `python benchmarks/generate.py --rows 200000 --out FILE [--multi-step]`.

Single-step: 64 tasks x 8 runs per batch; multi-step: 64 tasks x 8 runs x 1-5 steps per batch.
Responses of 200-312 tokens (`--response-tokens LOW HIGH`: LOW to HIGH - 1; reasoning-model
responses, e.g. `--rows 24576 --response-tokens 2048 6144`) after prompts of 50-150, float32 logprobs, int8 action masks (about
10 % zeros), rewards in [0, 1) with an eighth of the groups all equal. Rows are shuffled over the
whole file; row groups hold 16,384 rows. The same arguments always give the same file.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 16_384
TASKS, RUNS = 64, 8


def ids(rows: int, multi_step: bool, rng: np.random.Generator):
    """(batch, task, run, step) of every row, in a shuffled order."""
    if not multi_step:
        i = np.arange(rows, dtype=np.int64)
        batch, task, run, step = i // (TASKS * RUNS), i // RUNS % TASKS, i % RUNS, np.zeros(rows, np.int64)
    else:
        steps = rng.integers(1, 6, rows)  # more runs than needed; cut at `rows` rows
        run_id = np.repeat(np.arange(rows, dtype=np.int64), steps)[:rows]
        step = np.concatenate([np.arange(s) for s in steps])[:rows]
        batch, task, run = run_id // (TASKS * RUNS), run_id // RUNS % TASKS, run_id % RUNS
    order = rng.permutation(rows)
    return batch[order], task[order], run[order], step[order]


def rewards(batch, task, run, rng):
    flat = (task % 8 == 0)  # an eighth of the groups: every run has the same reward
    base = rng.random(len(batch))
    return np.where(flat, 0.5, base)


RESPONSE_TOKENS = (200, 313)


def generate(
    rows: int, path: str, multi_step: bool = False, seed: int = 0, row_group_rows: int = ROW_GROUP,
    response_tokens: tuple[int, int] = RESPONSE_TOKENS,
) -> str:
    """Write the experience to `path`; `row_group_rows` regroups the same rows (default 16,384);
    `response_tokens`: (low, high) response lengths, low to high - 1 tokens."""
    rng = np.random.default_rng(seed)
    batch, task, run, step = ids(rows, multi_step, rng)
    reward = rewards(batch, task, run, rng)
    schema = pa.schema([
        ("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("step", pa.int64()), ("reward", pa.float64()),
        ("tokens", pa.list_(pa.int32())), ("prompt_length", pa.int64()), ("logprobs", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.int8())),
    ])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, schema) as writer:
        for start in range(0, rows, ROW_GROUP):
            stop = min(rows, start + ROW_GROUP)
            n = stop - start
            response = rng.integers(response_tokens[0], response_tokens[1], n)
            prompt = rng.integers(50, 151, n)
            total = response + prompt
            tok_off = np.concatenate([[0], np.cumsum(total)]).astype(np.int32)
            resp_off = np.concatenate([[0], np.cumsum(response)]).astype(np.int32)
            tokens = pa.ListArray.from_arrays(pa.array(tok_off), pa.array(rng.integers(0, 150_000, tok_off[-1], dtype=np.int32)))
            logprobs = pa.ListArray.from_arrays(pa.array(resp_off), pa.array(-rng.random(resp_off[-1], dtype=np.float32) * 3))
            mask = pa.ListArray.from_arrays(pa.array(resp_off), pa.array((rng.random(resp_off[-1]) > 0.1).astype(np.int8)))
            table = pa.table(
                [batch[start:stop], task[start:stop], run[start:stop], step[start:stop], reward[start:stop],
                 tokens, prompt.astype(np.int64), logprobs, mask],
                schema=schema,
            )
            writer.write_table(table, row_group_size=ROW_GROUP)
    if row_group_rows != ROW_GROUP:  # the same rows (the generator draws per 16k block), regrouped
        pq.write_table(pq.read_table(tmp), tmp + ".regrouped", row_group_size=row_group_rows)
        os.replace(tmp + ".regrouped", tmp)
    os.replace(tmp, path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--multi-step", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row-group-rows", type=int, default=ROW_GROUP, help="rows per row group (default 16384)")
    ap.add_argument("--response-tokens", type=int, nargs=2, default=RESPONSE_TOKENS, metavar=("LOW", "HIGH"),
                    help="response lengths from LOW to HIGH - 1 tokens (default 200 313)")
    args = ap.parse_args(argv)
    generate(args.rows, args.out, args.multi_step, args.seed, args.row_group_rows, tuple(args.response_tokens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
