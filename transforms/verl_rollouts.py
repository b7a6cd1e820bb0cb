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
`source_file`, `source_line` passed through. Lines are split on "\n" only (a trailing "\r" is
dropped): U+2028, U+2029, U+0085 and the other characters `str.splitlines` breaks on are legal
inside verl's `ensure_ascii=False` JSON strings. A line that is not valid UTF-8, not JSON (or
cut short at the end of the file), not an object, lacks a field, has a field of the wrong type
or holds a lone surrogate escape gets a `source_error` and is rejected with it: one bad line is
one rejected row, never a failed run.
"""

from __future__ import annotations

import hashlib
import json
import os

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from rescore.errors import LineError, first_line
from rescore.transforms.files import storage

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


INT64 = (-(2**63), 2**63 - 1)
JSON_SPACE = b" \t\r"
"""JSON's whitespace besides the newline: a line holding only these is blank (skipped)."""


def _error(path: str, number: int, reason: str) -> dict:
    row = {f.name: None for f in SCHEMA}
    row.update(source_file=path, source_line=number, source_error=reason)
    return row


def split_lines(data: bytes):
    """(number, line bytes, terminated) for each line of a dump, split on b"\n" only.

    verl writes `json.dumps(entry, ensure_ascii=False) + "\n"`: U+2028, U+2029, U+0085 and the
    other characters `str.splitlines` breaks on (\x0b \x0c \x1c-\x1e) are legal inside a JSON
    string and never end a line. A trailing b"\r" (a file passed through Windows) is dropped;
    `terminated` is False for a last line without its newline (a dump cut short)."""
    parts = data.split(b"\n")
    last = parts.pop()  # b"" when the file ends with a newline
    for number, part in enumerate(parts, start=1):
        yield number, part.removesuffix(b"\r"), True
    if last:
        yield len(parts) + 1, last.removesuffix(b"\r"), False


def _text(raw: bytes, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LineError(f"bad_utf8: line {number} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})") from None


def _unencodable(value) -> bool:
    """Does a parsed JSON value hold a lone surrogate (a "\\ud800" escape) anywhere? Such text
    has no UTF-8 form: it cannot be written, hashed or compared with what verl meant."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _as_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def parse_line(path: str, number: int, raw: bytes, terminated: bool = True) -> dict:
    """One line as a row (SCHEMA's columns without `run`), or a rejected row with its reason.
    Never raises for any bytes: a line is data, never code (json only, no eval or pickle)."""
    truncated = LineError(f"truncated_line: line {number}, the last, has no newline and is not complete JSON "
                        "(a dump cut short)")
    try:
        try:
            text = _text(raw, number)
        except LineError:
            if not terminated:
                raise truncated from None
            raise
        if number == 1:
            text = text.removeprefix("\ufeff")  # a byte order mark some editors add
        try:
            entry = json.loads(text)
        except RecursionError:
            raise LineError(f"bad_json: line {number} is nested too deeply") from None
        except ValueError as e:
            if not terminated:
                raise truncated from None
            raise LineError(f"bad_json: line {number} is not JSON ({first_line(e, limit=120)})") from None
        if not isinstance(entry, dict):
            raise LineError(f"bad_json: line {number} is a JSON {type(entry).__name__}, not an object")
        missing = [k for k in ("input", "output", "score", "step") if k not in entry]
        if missing:
            raise LineError(f"missing_field: line {number} has no {missing[0]!r}")
        if _unencodable(entry):
            raise LineError(f"bad_text: line {number} holds a lone surrogate escape (e.g. \"\\ud800\"), which no UTF-8 text can hold")
        score, step, prompt = entry["score"], entry["step"], entry["input"]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise LineError(f"bad_reward: line {number} score is {_short(score)}, not a number")
        try:
            reward = float(score)
        except OverflowError:
            raise LineError(f"bad_reward: line {number} score {_short(score)} is beyond the range of a float") from None
        if isinstance(step, bool) or not isinstance(step, int):
            raise LineError(f"bad_step: line {number} step is {_short(step)}, not an integer")
        if not INT64[0] <= step <= INT64[1]:
            raise LineError(f"bad_step: line {number} step {_short(step)} is beyond the int64 range")
        prompt = _as_text(prompt)
        gts = entry.get("gts")
        extra = {k: v for k, v in entry.items() if k not in KNOWN}
        return {
            "batch": step,
            "task": task_id(prompt),
            "run": None,
            "step": 0,
            "reward": reward,
            "input": prompt,
            "output": entry["output"] if isinstance(entry["output"], str) else json.dumps(entry["output"]),
            "gts": gts if gts is None or isinstance(gts, str) else json.dumps(gts, default=str),
            "extra": json.dumps(extra, sort_keys=True, default=str) if extra else None,
            "source_file": path,
            "source_line": number,
            "source_error": None,
        }
    except LineError as e:
        return _error(path, number, str(e))
    except RecursionError:
        return _error(path, number, f"bad_json: line {number} is nested too deeply")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_lines(path: str, lines) -> pa.Table:
    """The rows of one dump file. `lines`: its bytes, or (number, line bytes, terminated)
    triples (`split_lines`). Every line that is not blank gives exactly one row."""
    if isinstance(lines, (bytes, bytearray)):
        lines = split_lines(bytes(lines))
    rows = []
    runs: dict[tuple[int, str], int] = {}
    for number, raw, terminated in lines:
        if not raw.strip(JSON_SPACE):
            continue
        row = parse_line(path, number, raw, terminated)
        if row["source_error"] is None:
            key = (row["batch"], row["input"])
            row["run"] = runs.get(key, 0)
            runs[key] = row["run"] + 1
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def read_file(path: str) -> pa.Table:
    if storage.is_local(path):
        with open(path, "rb") as f:
            return parse_lines(path, f.read())
    with FileSystems.open(path, compression_type=CompressionTypes.AUTO) as f:
        return parse_lines(path, f.read())


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
