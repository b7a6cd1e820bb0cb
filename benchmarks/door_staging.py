"""What a door's staging costs: its staging job against decoding the same rows in one process.

    .venv/bin/python benchmarks/door_staging.py stage --door trinity-sql --input sqlite:///buffer.db --dir /tmp/staged
    .venv/bin/python benchmarks/door_staging.py decode --door trinity-sql --input sqlite:///buffer.db
    .venv/bin/python benchmarks/door_staging.py stage --door verl-rollouts --input rollouts/ --dir /tmp/staged

`stage` runs the door's `read` (pipelines/doors/): the Beam job that reads, decodes and writes
the rows as Parquet read units into --dir (an empty directory). `decode` reads and decodes the
same units in this process and writes nothing: what a door reading inside the one job would
do for each read of a unit. Time each as a whole process, in turn (docs/trainers.md has the
figures for 200,000 rows: `rescore sample --format trinity-sql|verl-rollouts --batches 25
--tasks 1000 --runs 8`). Prints one JSON line: the door, rows, files and seconds in the process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from types import SimpleNamespace


def measure(what: str, door_name: str, source: str, directory: str | None = None, *, table: str = "experience",
            shard_rows: int = 50_000) -> dict:
    from rescore.pipelines import doors

    door = doors.by_name(door_name)
    started = time.monotonic()
    cfg = SimpleNamespace(inputs=[source], input_table=table if door_name == "trinity-sql" else None,
                          input_format=door.input_format or "parquet", shard_rows=shard_rows)
    if what == "stage":
        import apache_beam as beam
        import pyarrow.parquet as pq

        def run(build):
            p = beam.Pipeline()
            build(p)
            p.run().wait_until_finish()

        files, _ = door.read(cfg, directory, run)
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    elif door_name == "trinity-sql":
        from rescore.transforms import sql_database

        plan = sql_database.plan_source(source, table, shard_rows)
        files = plan.ranges
        rows = sum(sql_database.read_range(source, table, lo, hi).num_rows for lo, hi in plan.ranges)
    else:
        from rescore.pipelines.doors.verl_rollouts import dump_files
        from rescore.transforms import verl_rollouts

        files = dump_files([source])
        rows = sum(verl_rollouts.read_file(f).num_rows for f in files)
    return {"what": what, "door": door_name, "rows": rows, "units": len(files), "seconds": round(time.monotonic() - started, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["stage", "decode"])
    ap.add_argument("--door", required=True, choices=["trinity-sql", "verl-rollouts"])
    ap.add_argument("--input", required=True, help="the database URL (trinity-sql) or the dump directory or glob")
    ap.add_argument("--table", default="experience", help="trinity-sql: the buffer name")
    ap.add_argument("--shard-rows", type=int, default=50_000, help="trinity-sql: rows per id range")
    ap.add_argument("--dir", help="stage: an empty directory for the staged Parquet files")
    a = ap.parse_args(argv)
    if a.what == "stage" and (not a.dir or (os.path.isdir(a.dir) and os.listdir(a.dir))):
        ap.error("stage needs --dir, an empty or new directory")
    if a.dir:
        os.makedirs(a.dir, exist_ok=True)
    print(json.dumps(measure(a.what, a.door, a.input, a.dir, table=a.table, shard_rows=a.shard_rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
