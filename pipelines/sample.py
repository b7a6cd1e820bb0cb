"""`rescore sample`: write deterministic sample experience Parquet to try Rescore on.

    rescore sample --output data/sample [--batches 4] [--tasks 16] [--runs 8] [--steps 1]
                   [--files 2] [--row-group-rows 1000] [--string-tasks] [--seed 0]
    rescore sample --format trinity-sql --output buffer.db [--table experience] [...]
    rescore sample --format verl-rollouts --output rollouts/ [...]
    rescore sample --output data/reused --logged-by models/student   # docs/offpolicy.md

Rows are shuffled and spread over several files and row groups, as logged experience is.

`--logged-by DIR` writes the same rows with `logprobs` as a rollout engine serving the causal LM
DIR would have logged them (needs the [models] extra): DIR's own log-probs of each response
token, off by the engine's numerics (a little noise per token), and one row in ten sampled by an
older checkpoint (its tokens drift by 0.005 to 0.05 nats each). Refreshing `logprobs` under DIR
(`--logprob-model DIR`) then gives importance ratios near 1 for most rows and far from 1 for the
stale ones: what docs/offpolicy.md's correction keeps and rejects. Every other column is the
default sample's.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pyarrow as pa

from rescore.errors import ConfigError
from rescore.pipelines import doors


def make_experience(
    *,
    batches: int = 4,
    tasks: int = 16,
    runs: int = 8,
    steps: int = 1,
    response_tokens: tuple[int, int] = (16, 48),
    prompt_tokens: tuple[int, int] = (8, 24),
    string_tasks: bool = False,
    seed: int = 0,
) -> pa.Table:
    """One row per (batch, task, run, step), shuffled. Rewards mix 0/1 correctness with
    partial credit; about one task in five has the same reward for every run (zero std)."""
    rng = np.random.default_rng(seed)
    b, t, r, s = (a.ravel() for a in np.meshgrid(np.arange(batches), np.arange(tasks), np.arange(runs), np.arange(steps), indexing="ij"))
    n = len(b)
    difficulty = rng.random((batches, tasks))
    constant = rng.random((batches, tasks)) < 0.2
    reward = (rng.random(n) < difficulty[b, t]).astype(np.float64) + 0.25 * rng.integers(0, 3, n)
    reward = np.where(constant[b, t], 1.0, reward)
    response = rng.integers(response_tokens[0], response_tokens[1] + 1, n)
    prompt = rng.integers(prompt_tokens[0], prompt_tokens[1] + 1, n)

    def lists(lengths, values):
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

    total = response + prompt
    tokens = lists(total, rng.integers(0, 32000, int(total.sum())).astype(np.int64))
    logprobs = lists(response, (-rng.exponential(0.7, int(response.sum()))).astype(np.float32))
    # Multi-turn style masks: a few environment tokens (0) inside some responses.
    mask = rng.random(int(response.sum())) > 0.05
    action_mask = lists(response, mask)
    task = np.array([f"task-{i:04d}" for i in t]) if string_tasks else t.astype(np.int64)
    table = pa.table(
        {
            "batch": b.astype(np.int64),
            "task": task,
            "run": r.astype(np.int64),
            "step": s.astype(np.int64),
            "reward": reward,
            "tokens": tokens,
            "prompt_length": prompt.astype(np.int64),
            "logprobs": logprobs,
            "action_mask": action_mask,
            "source": pa.array([f"sample-{seed}"] * n),
        }
    )
    return table.take(pa.array(rng.permutation(n)))


ENGINE_NOISE = 0.001
"""Std of the per-token log-prob noise of --logged-by (the engine's numerics against the
trainer's): a row's mean log ratio stays well inside verl's geometric bounds [0.999, 1.001]."""
STALE_SHARE = 0.1
STALE_DRIFT = (0.005, 0.05)
"""--logged-by: the share of rows an older checkpoint sampled, and the range of their per-token
log-prob drift (either sign): outside those bounds."""


def logged_by(table: pa.Table, model_dir: str, *, seed: int = 0, batch_rows: int = 32) -> pa.Table:
    """`table` with `logprobs` as a rollout engine serving `model_dir` would have logged them
    (module doc): the model's log-probs of the response tokens (transforms/inference.py, the
    model stage's function, float32 on the CPU), plus ENGINE_NOISE per token, plus a drift on
    STALE_SHARE of the rows. Deterministic for a seed."""
    import torch

    from rescore.transforms.inference import load_causal_lm, response_logprobs

    model = load_causal_lm(model_dir, torch.device("cpu"), torch.float32)
    tokens = table.column("tokens").to_pylist()
    prompts = table.column("prompt_length").to_numpy()
    values: list[np.ndarray] = []
    for start in range(0, len(tokens), batch_rows):
        rows = [np.asarray(t, dtype=np.int64) for t in tokens[start:start + batch_rows]]
        values += response_logprobs(model, rows, prompts[start:start + batch_rows])
    rng = np.random.default_rng([seed, 1])  # its own stream: the other columns stay the default sample's
    stale = rng.random(len(values)) < STALE_SHARE
    drift = rng.uniform(*STALE_DRIFT, len(values)) * rng.choice([-1.0, 1.0], len(values))
    logged = [(v + rng.normal(0.0, ENGINE_NOISE, len(v)) + (drift[i] if stale[i] else 0.0)).astype(np.float32)
              for i, v in enumerate(values)]
    column = pa.array(logged, type=table.schema.field("logprobs").type)
    return table.set_column(table.schema.get_field_index("logprobs"), "logprobs", column)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rescore sample", description="Write sample experience Parquet.")
    p.add_argument("--output", required=True, help=doors.sample_output_help())
    p.add_argument("--format", choices=doors.sample_formats(), default="parquet", help=doors.sample_format_help())
    p.add_argument("--table", default="experience", help="trinity-sql: the buffer (table) name")
    p.add_argument("--overwrite", action="store_true", help="trinity-sql: replace an existing database file")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--tasks", type=int, default=16, help="tasks per batch")
    p.add_argument("--runs", type=int, default=8, help="runs (rollouts) per task")
    p.add_argument("--steps", type=int, default=1, help="steps per run")
    p.add_argument("--files", type=int, default=2)
    p.add_argument("--row-group-rows", type=int, default=100)
    p.add_argument("--string-tasks", action="store_true", help="string task ids instead of integers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logged-by", metavar="DIR",
                   help="logprobs as a rollout engine serving the causal LM DIR logged them: DIR's log-probs with a "
                        "little noise, one row in ten from an older checkpoint (docs/offpolicy.md; needs the [models] extra)")
    a = p.parse_args(argv)
    table = make_experience(
        batches=a.batches, tasks=a.tasks, runs=a.runs, steps=a.steps, string_tasks=a.string_tasks, seed=a.seed
    )
    if a.logged_by:
        from rescore.transforms.inference import check_model_dir

        try:
            check_model_dir(a.logged_by, "--logged-by")
            table = logged_by(table, a.logged_by, seed=a.seed)
        except (ConfigError, ImportError) as e:
            print(f"rescore: error: {e}", file=sys.stderr)
            return 2
    try:
        message = doors.by_name(a.format).write_sample(table, a.output, a)
    except (FileExistsError, ConfigError) as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return 2
    print(message, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
