"""The Parquet door (the default): experience Parquet files, read by the job as they are.

    rescore --input 'data/*.parquet' --output DIR --strategy grpo
    rescore sample --output data/sample [--files 2] [--row-group-rows 100]

Its files are the job's read units (transforms/input_plan.py): nothing is staged.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from typing import Any

from rescore.errors import ConfigError
from rescore.pipelines.wording import plural


class ParquetDoor:
    name = "parquet"
    input_format = "parquet"
    what = "Parquet files"
    chosen_by = "--input-format parquet"
    help = "default"
    sample_what = "parquet files"
    sample_output = "directory to write experience-*.parquet into"
    options = None
    staged = False
    no_tokens = None

    def selects(self, cfg) -> bool:
        return cfg.input_format == self.input_format

    def option_problem(self, values: Mapping[str, Any]) -> str | None:
        return None

    def check(self, cfg) -> None:
        """Nothing before the job: the input plan checks the files (transforms/input_plan.py)."""

    def read(self, cfg, directory, run):
        raise NotImplementedError("the job reads Parquet input as it is")

    def shown_inputs(self, cfg, source) -> list[str]:
        return list(cfg.inputs)

    def write_sample(self, table, output: str, args) -> str:
        if args.files < 1 or args.files > table.num_rows:
            raise ConfigError(f"--files must be between 1 and the {table.num_rows} rows, got {args.files}")
        paths = write_files(table, output, files=args.files, row_group_rows=args.row_group_rows)
        return f"wrote {plural(table.num_rows, 'row')} to {plural(len(paths), 'file')} in {output}"


def write_files(table, directory: str, *, files: int = 2, row_group_rows: int = 1000) -> list[str]:
    """`table` as `files` Parquet files experience-000.parquet, ... in `directory` (row groups of
    `row_group_rows`)."""
    import numpy as np
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    paths = []
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        path = os.path.join(directory, f"experience-{i:03d}.parquet")
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), path, row_group_size=row_group_rows)
        paths.append(path)
    # A rerun with fewer --files: the earlier run's extra experience-*.parquet would be read with
    # these (a glob over the directory matches them); only sample's own names are removed.
    for stale in sorted(glob.glob(os.path.join(directory, "experience-*.parquet"))):
        if stale not in paths and re.fullmatch(r"experience-\d{3,}\.parquet", os.path.basename(stale)):
            os.remove(stale)
    return paths


DOOR = ParquetDoor()
