"""The SQL a data engineer writes instead of Rescore: DuckDB, one statement.

    python benchmarks/duckdb_script.py 'IN/*.parquet' OUT.parquet

The same GRPO as polars_script.py (unbiased std, a group of one scores r / (1 + 1e-6), an
all-equal group scores exactly 0), advantages = returns = score * action_mask (float32).
"""

import sys

import duckdb

SQL = """
COPY (
  WITH stats AS (
    SELECT *,
      count(*) OVER g AS n, avg(reward) OVER g AS m, stddev_samp(reward) OVER g AS s,
      max(reward) OVER g = min(reward) OVER g AS flat
    FROM read_parquet($source)
    WINDOW g AS (PARTITION BY batch, task)
  ), scored AS (
    SELECT * EXCLUDE (n, m, s, flat),
      CAST(CASE WHEN n = 1 THEN reward / (1 + 1e-6) WHEN flat THEN 0.0
                ELSE (reward - m) / (s + 1e-6) END AS FLOAT) AS score
    FROM stats
  )
  SELECT *, list_transform(action_mask, lambda x: CAST(x AS FLOAT) * score) AS advantages,
            list_transform(action_mask, lambda x: CAST(x AS FLOAT) * score) AS returns
  FROM scored
) TO '{target}' (FORMAT parquet)
"""


def main(source: str, target: str) -> None:
    duckdb.execute(SQL.replace("{target}", target.replace("'", "''")), {"source": source})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
