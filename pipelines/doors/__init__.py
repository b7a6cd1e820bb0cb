"""The doors: each kind of input Rescore reads (pipelines/doors/base.py says what a door is).

A new door is a module beside these whose DOOR implements `Door`, and one line in BUILT_IN;
or, from outside Rescore, `register(DOOR)` before the command runs (docs/architecture.md).
"""

from rescore.pipelines.doors import parquet, trinity_sql, verl_rollouts
from rescore.pipelines.doors.base import (
    INPUT_FORMATS,
    Door,
    by_name,
    declared_in,
    door_for,
    doors,
    input_format_help,
    option_fields,
    option_names,
    option_problem,
    register,
    reserve,
    sample_format_help,
    sample_formats,
    sample_output_help,
    staged_doors,
    unregister,
)

BUILT_IN = (parquet.DOOR, trinity_sql.DOOR, verl_rollouts.DOOR)
"""The doors that ship with Rescore, in the order --input-format and `rescore sample --format` list them."""

for _door in BUILT_IN:
    register(_door)

__all__ = ["INPUT_FORMATS", "BUILT_IN", "Door", "by_name", "declared_in", "door_for", "doors", "input_format_help",
           "option_fields", "option_names", "option_problem", "register", "reserve", "sample_format_help",
           "sample_formats", "sample_output_help", "staged_doors", "unregister"]
