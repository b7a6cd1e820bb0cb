"""verl rollout dumps (`trainer.rollout_data_dir`) as experience rows.

verl's trainer (`RayPPOTrainer._dump_generations`) writes one `{global_step}.jsonl` per training
step, one line per response: {"input": prompt text, "output": response text, "score": float,
"step": int, ["gts": ground truth,] plus any reward_extra_info keys}. There are no token ids,
no log-probs and no task ids: the prompt text is the task.

A line becomes a row with
    batch  = step                  (verl's training step: the batch it was generated for)
    task   = sha1(input)[:16]      (the group: every response to the same prompt in that step)
    run    = the response's index among that prompt's responses in the file (file order)
    step   = 0                     (verl dumps single-turn responses)
    reward = score
and `input`, `output`, `gts` (JSON text unless a string), `extra` (the other keys as JSON),
`source_file`, `source_line` passed through. A line that is not JSON or lacks a field gets a
`source_error` and is rejected with it.
"""

from __future__ import annotations

import hashlib
import json
import os

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from rescore.transforms.files import storage

FORMAT = "verl-rollouts"
KNOWN = ("input", "output", "score", "step", "gts")

SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64()),
        pa.field("task", pa.string()),
        pa.field("run", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("input", pa.string()),
        pa.field("output", pa.string()),
        pa.field("gts", pa.string()),
        pa.field("extra", pa.string()),
        pa.field("source_file", pa.string()),
        pa.field("source_line", pa.int64()),
        pa.field("source_error", pa.string()),
    ]
)


def task_id(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:16]


def _error(path: str, number: int, reason: str) -> dict:
    row = {f.name: None for f in SCHEMA}
    row.update(source_file=path, source_line=number, source_error=reason)
    return row


def parse_lines(path: str, lines) -> pa.Table:
    """The rows of one dump file (`lines`: its text lines, numbered from 1)."""
    rows = []
    runs: dict[tuple[int, str], int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as e:
            rows.append(_error(path, number, f"bad_json: line {number} is not JSON ({str(e).splitlines()[0][:120]})"))
            continue
        if not isinstance(entry, dict):
            rows.append(_error(path, number, f"bad_json: line {number} is not a JSON object"))
            continue
        missing = [k for k in ("input", "output", "score", "step") if k not in entry]
        if missing:
            rows.append(_error(path, number, f"missing_field: line {number} has no {missing[0]!r}"))
            continue
        score, step, prompt = entry["score"], entry["step"], entry["input"]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            rows.append(_error(path, number, f"bad_reward: line {number} score is {score!r}, not a number"))
            continue
        if isinstance(step, bool) or not isinstance(step, int):
            rows.append(_error(path, number, f"bad_step: line {number} step is {step!r}, not an integer"))
            continue
        if not isinstance(prompt, str):
            prompt = json.dumps(prompt, sort_keys=True)
        output = entry["output"] if isinstance(entry["output"], str) else json.dumps(entry["output"])
        key = (step, prompt)
        run = runs.get(key, 0)
        runs[key] = run + 1
        gts = entry.get("gts")
        extra = {k: v for k, v in entry.items() if k not in KNOWN}
        rows.append(
            {
                "batch": step,
                "task": task_id(prompt),
                "run": run,
                "step": 0,
                "reward": float(score),
                "input": prompt,
                "output": output,
                "gts": gts if gts is None or isinstance(gts, str) else json.dumps(gts, default=str),
                "extra": json.dumps(extra, sort_keys=True, default=str) if extra else None,
                "source_file": path,
                "source_line": number,
                "source_error": None,
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def read_file(path: str) -> pa.Table:
    if storage.is_local(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_lines(path, f.read().splitlines())
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as f:
        return parse_lines(path, f.read().decode("utf-8", errors="replace").splitlines())


def staged_name(path: str) -> str:
    base = os.path.basename(path).rsplit(".", 1)[0]
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    return f"verl-{base}-{digest}.parquet"


class _StageFile(beam.DoFn):
    def __init__(self, directory: str):
        self._directory = directory

    def process(self, path: str):
        table = read_file(path)
        if not table.num_rows:
            return
        out = storage.join(self._directory, staged_name(path))
        storage.write_parquet(table, out)
        yield out


class StageRollouts(beam.PTransform):
    """verl dump files -> one Parquet file each in `directory` (paths out)."""

    def __init__(self, files: list[str], directory: str):
        super().__init__()
        self._files, self._directory = files, directory

    def expand(self, pbegin):
        return (
            pbegin
            | "DumpFiles" >> beam.Create(self._files)
            | "Spread" >> beam.Reshuffle()
            | "ParseStage" >> beam.ParDo(_StageFile(self._directory))
        )
