"""The hand-written script Rescore must not be much slower than: one process, pyarrow + numpy +
polars, the whole table in memory, one output file with the same added columns.

    python benchmarks/baseline.py IN.parquet OUT.parquet [--strategy grpo|step_wise_grpo]

grpo: score = (r - mean(G)) / (std(G) + 1e-6), G = (batch, task), a group of one: r / (1 + 1e-6).
step_wise_grpo: the same over each run's last step (largest step), broadcast to all its steps.
advantages = returns = score * action_mask (float32).
"""

import argparse

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

EPS = 1e-6


def grpo(keys: pl.DataFrame) -> np.ndarray:
    stats = keys.group_by(["batch", "task"]).agg(
        pl.col("reward").mean().alias("m"), pl.col("reward").std().alias("s"), pl.len().alias("n")
    )
    df = keys.join(stats, on=["batch", "task"], how="left").sort("i")
    n = df["n"].to_numpy()
    m = np.where(n == 1, 0.0, df["m"].to_numpy())
    s = np.where(n == 1, 1.0, df["s"].fill_null(1.0).to_numpy())
    return (df["reward"].to_numpy() - m) / (s + EPS)


def step_wise_grpo(keys: pl.DataFrame) -> np.ndarray:
    last = keys.sort("step").group_by(["batch", "task", "run"]).agg(pl.col("reward").last().alias("r"))
    stats = last.group_by(["batch", "task"]).agg(
        pl.col("r").mean().alias("m"), pl.col("r").std().alias("s"), pl.len().alias("n")
    )
    last = last.join(stats, on=["batch", "task"], how="left")
    n = last["n"].to_numpy()
    m = np.where(n == 1, 0.0, last["m"].to_numpy())
    s = np.where(n == 1, 1.0, last["s"].fill_null(1.0).to_numpy())
    last = last.with_columns(pl.Series("score", (last["r"].to_numpy() - m) / (s + EPS)))
    df = keys.join(last.select(["batch", "task", "run", "score"]), on=["batch", "task", "run"], how="left").sort("i")
    return df["score"].to_numpy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--strategy", default="grpo", choices=["grpo", "step_wise_grpo"])
    args = ap.parse_args()
    table = pq.read_table(args.input)
    keys = pl.from_arrow(table.select(["batch", "task", "run", "step", "reward"])).with_row_index("i")
    score = (grpo if args.strategy == "grpo" else step_wise_grpo)(keys)
    mask = table["action_mask"].combine_chunks()
    lengths = pc.list_value_length(mask).to_numpy()
    values = np.repeat(score.astype(np.float32), lengths) * mask.flatten().to_numpy().astype(np.float32)
    advantages = pa.ListArray.from_arrays(mask.offsets, pa.array(values))
    table = table.append_column("advantages", advantages).append_column("returns", advantages)
    table = table.append_column("score", pa.array(score.astype(np.float32)))
    pq.write_table(table, args.output)


if __name__ == "__main__":
    main()
