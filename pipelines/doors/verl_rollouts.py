"""The verl rollout dump door: the `{step}.jsonl` files verl's `trainer.rollout_data_dir` holds.

    rescore --input 'rollouts/*.jsonl' --input-format verl-rollouts --output DIR --strategy grpo
    rescore sample --format verl-rollouts --output rollouts/

A Beam job parses each dump file into one Parquet read unit (transforms/verl_rollouts.py, which
says what a line becomes and when it is rejected). The dumps hold text and scores only, no
token ids: they cannot be written to a Trinity buffer (--output-db).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from rescore.errors import InputError

FORMAT = "verl-rollouts"


class VerlRolloutsDoor:
    name = FORMAT
    input_format = FORMAT
    what = "verl dumps"
    chosen_by = f"--input-format {FORMAT}"
    help = "verl trainer.rollout_data_dir {step}.jsonl files"
    sample_what = "verl rollout dumps ({step}.jsonl)"
    sample_output = "a directory"
    options = None
    staged = True
    no_tokens = "verl rollout dumps hold text only"

    def selects(self, cfg) -> bool:
        return cfg.input_format == self.input_format

    def option_problem(self, values: Mapping[str, Any]) -> str | None:
        return None

    def check(self, cfg) -> None:
        """The files are matched when they are read (`dump_files`): a glob may match none yet."""

    def read(self, cfg, directory: str, run) -> tuple[list[str], dict[str, Any]]:
        from rescore.transforms import verl_rollouts
        from rescore.transforms.files import storage

        files = dump_files(cfg.inputs)
        run(lambda p: p | "StageRollouts" >> verl_rollouts.StageRollouts(files, directory))
        staged = storage.list_dir(directory, "*.parquet")
        if not staged:
            raise InputError(f"the {len(files)} verl rollout files hold no lines")
        return staged, {"format": self.name, "files": len(files)}

    def shown_inputs(self, cfg, source: Mapping[str, Any]) -> list[str]:
        return list(cfg.inputs)

    def write_sample(self, table, output: str, args) -> str:
        return write_verl_rollouts(table, output)


def dump_files(inputs: list[str]) -> list[str]:
    """Every dump file the --input patterns name (a directory: its *.jsonl), sorted; InputError
    where a pattern matches none."""
    from rescore.transforms.files import storage

    files: list[str] = []
    for pattern in inputs:
        if storage.is_local(pattern) and not any(c in pattern for c in "*?[") and not pattern.endswith(".jsonl"):
            pattern = storage.join(pattern, "*.jsonl")  # a dump directory
        found = [p for p, _ in storage.match(pattern)]
        if not found:
            raise InputError(f"no verl rollout files match {pattern!r}")
        files += found
    return sorted(set(files))


def write_verl_rollouts(table, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    by_step: dict[int, list[str]] = {}
    for row in table.to_pylist():
        step = int(row["batch"]) + 1  # verl counts training steps from 1
        entry = {
            "input": f"Question {row['task']}: what is {row['task']} + {row['batch']}?",
            "output": f"Answer {row['run']}: {len(row['logprobs'])} tokens of reasoning",
            "score": row["reward"],
            "step": step,
            "acc": float(row["reward"] >= 1.0),
        }
        by_step.setdefault(step, []).append(json.dumps(entry))
    for step, lines in by_step.items():
        with open(os.path.join(directory, f"{step}.jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return f"wrote {sum(map(len, by_step.values()))} rollouts to {len(by_step)} files in {directory}"


DOOR = VerlRolloutsDoor()
